"""Deadline precision: how late does a turn of hung tools come back, in real time?

Every turn holds calls that never finish on their own: async tools that sleep
forever, and one sync tool stuck in a worker thread (``time.sleep``), which
trio abandons at the deadline. The turn's deadline is its only way out. We
measure, per turn, ``return time - turn.deadline``, and per call how late its
answer was written, in two settings:

* **concurrent**: all turns started together on one runner: the deadline
  fires for every one of them at once, the worst case for the scheduler;
* **sequential**: one turn after another: the precision of a single deadline
  on an idle event loop.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

import fanout

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["DeadlineReport", "ScaleCase", "measure_deadlines", "measure_scale", "scale_markdown"]


def _runner(timeout: float) -> fanout.Runner:
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS, timeout=None)
    async def hang(n: int) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    @registry.tool(kind=fanout.Kind.READS, timeout=None)
    def hang_in_thread(n: int) -> str:
        time.sleep(1.0)  # a sync tool that ignores everything; trio abandons its thread
        return "too late"

    return fanout.Runner(registry, turn_timeout=timeout, max_threads=1_000)


def _calls(turn: int, hung: int) -> list[fanout.ToolCall]:
    calls = [fanout.ToolCall(f"t{turn}-c{i}", "hang", {"n": i}) for i in range(hung)]
    calls.append(fanout.ToolCall(f"t{turn}-sync", "hang_in_thread", {"n": 0}))
    return calls


def _percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile by nearest rank."""
    data = sorted(values)
    return data[min(len(data) - 1, max(0, round(q / 100 * (len(data) - 1))))]


@attrs.frozen
class Lateness:
    """How late turns returned and answers were written, in seconds past the deadline."""

    mode: str
    turns: int
    calls_per_turn: int
    timeout: float
    turn_late: list[float]
    answer_late_max: float
    all_timed_out: bool

    def percentile(self, q: float) -> float:
        return _percentile(self.turn_late, q)

    def summary(self) -> dict[str, float]:
        return {
            "p50": self.percentile(50),
            "p99": self.percentile(99),
            "max": max(self.turn_late),
            "mean": statistics.fmean(self.turn_late),
        }


@attrs.frozen
class DeadlineReport:
    results: list[Lateness]

    def to_json(self) -> dict[str, Any]:
        return {
            "results": [
                {
                    **{k: v for k, v in attrs.asdict(r).items() if k != "turn_late"},
                    "late_seconds": r.summary(),
                    "turn_late": r.turn_late,
                }
                for r in self.results
            ]
        }


async def _one_turn(
    runner: fanout.Runner, index: int, hung: int, lateness: list[float], answers: list[float]
) -> bool:
    turn = runner.turn(_calls(index, hung))
    await turn.run()
    returned = trio.current_time()
    lateness.append(returned - turn.deadline)
    answers.extend(
        e.time - turn.deadline for e in turn.trace if e.kind is fanout.EventKind.ANSWERED
    )
    return all(r.status is fanout.Status.TIMED_OUT for r in turn.results)


async def _concurrent(turns: int, hung: int, timeout: float) -> Lateness:
    runner = _runner(timeout)
    late: list[float] = []
    answers: list[float] = []
    verdicts: list[bool] = []

    async def one(index: int) -> None:
        verdicts.append(await _one_turn(runner, index, hung, late, answers))

    async with trio.open_nursery() as nursery:
        for index in range(turns):
            nursery.start_soon(one, index)
    return Lateness("concurrent", turns, hung + 1, timeout, late, max(answers), all(verdicts))


async def _sequential(turns: int, hung: int, timeout: float) -> Lateness:
    runner = _runner(timeout)
    late: list[float] = []
    answers: list[float] = []
    verdicts = [await _one_turn(runner, index, hung, late, answers) for index in range(turns)]
    return Lateness("sequential", turns, hung + 1, timeout, late, max(answers), all(verdicts))


def measure_deadlines(
    *,
    turns: int = 200,
    hung: int = 4,
    concurrent_timeout: float = 0.2,
    sequential_timeout: float = 0.05,
) -> DeadlineReport:
    """Both settings; each turn has ``hung`` async calls and one sync call, all hung."""

    async def main() -> DeadlineReport:
        concurrent = await _concurrent(turns, hung, concurrent_timeout)
        sequential = await _sequential(turns, hung, sequential_timeout)
        return DeadlineReport([concurrent, sequential])

    return trio.run(main)


# --- at scale: 100 to 10,000 hung calls of three kinds, each answered at its deadline ---


_HANG_SERVER = """
import sys, trio

async def main():
    async def handler(stream):
        async with stream:
            await trio.sleep_forever()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=65535)
    print(listeners[0].socket.getsockname()[1], flush=True)
    await trio.serve_listeners(handler, listeners)

trio.run(main)
"""


@contextlib.asynccontextmanager
async def _hang_forever_server() -> AsyncIterator[int]:
    """A loopback server, in its own process, that accepts every connection and never answers.

    Its own process, so that accepting ten thousand connections does not
    compete with the client for the event loop being measured.
    """
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", _HANG_SERVER], stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            line += await process.stdout.receive_some(64)
        yield int(line)
    finally:
        process.kill()
        await process.wait()


def _scale_registry(kind: str, client: Any) -> fanout.Registry:
    registry = fanout.Registry()
    if kind == "sleep":

        @registry.tool(kind=fanout.Kind.READS, timeout=None, name="hung")
        async def sleeper(n: int) -> str:
            await trio.sleep_forever()
            raise AssertionError("unreachable")

    elif kind == "sync":

        @registry.tool(kind=fanout.Kind.READS, timeout=None, name="hung")
        def blocked(n: int) -> str:
            time.sleep(3.0)  # trio abandons the thread at the deadline
            return "too late"

    else:

        @registry.tool(kind=fanout.Kind.READS, timeout=None, name="hung")
        async def request(n: int) -> str:
            response = await client.get(f"/{n}")
            return str(response.text)

    return registry


@attrs.frozen
class ScaleCase:
    """One turn of ``calls`` hung calls of ``kind``; lateness in seconds past its deadline."""

    kind: str
    calls: int
    hosted: bool
    timeout: float
    turn_late: float
    answer_late: list[float]
    started: int
    all_timed_out: bool

    def answers(self, q: float) -> float:
        return _percentile(self.answer_late, q)


async def _scale_case(kind: str, calls: int, hosted: bool, timeout: float) -> ScaleCase:
    async with _hang_forever_server() as port:
        client = fanout.http_client(base_url=f"http://127.0.0.1:{port}", timeout=None)
        runner = fanout.Runner(
            _scale_registry(kind, client), turn_timeout=timeout, max_threads=max(1, calls)
        )
        turn = runner.turn([fanout.ToolCall(f"c{i}", "hung", {"n": i}) for i in range(calls)])
        if hosted:
            async with runner:
                await turn.run()
                returned = trio.current_time()
        else:
            await turn.run()
            returned = trio.current_time()
        await client.aclose()
    answered = [e.time - turn.deadline for e in turn.trace if e.kind is fanout.EventKind.ANSWERED]
    started = sum(1 for e in turn.trace if e.kind is fanout.EventKind.STARTED)
    return ScaleCase(
        kind, calls, hosted, timeout, returned - turn.deadline, answered, started,
        all(r.status is fanout.Status.TIMED_OUT for r in turn.results),
    )  # fmt: skip


def _raise_file_limit(wanted: int) -> None:
    """Hung HTTP calls hold two descriptors each (client and server side)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def measure_scale(
    sizes: tuple[int, ...] = (100, 1_000, 10_000),
    kinds: tuple[str, ...] = ("sleep", "sync", "http"),
) -> list[ScaleCase]:
    """Every kind at every size, in the turn's own nursery and in an open runner.

    Worker threads are capped at 1,000 (sync tools run at most 1,000 at once),
    and the turn's deadline grows with the size, so that every call has
    started when it fires: the measure is of stopping, not of starting.
    """
    _raise_file_limit(2 * max(sizes) + 1_000)
    cases = []
    for kind in kinds:
        for calls in sizes:
            if kind == "sync" and calls > 1_000:
                continue
            timeout = 2.0 + calls / 1_000
            for hosted in (False, True):
                cases.append(trio.run(_scale_case, kind, calls, hosted, timeout))
    return cases


def scale_markdown(cases: list[ScaleCase]) -> str:
    """The table the README quotes: lateness of the turn and of its answers, in ms."""
    lines = [
        "| tool | calls | runner | turn returned | answers p50 | p99 | max | started "
        "| all timed_out |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for case in cases:
        lines.append(
            f"| {case.kind} | {case.calls:,} | {'open' if case.hosted else 'not open'} "
            f"| {case.turn_late * 1000:.1f} ms | {case.answers(50) * 1000:.1f} ms "
            f"| {case.answers(99) * 1000:.1f} ms | {max(case.answer_late) * 1000:.1f} ms "
            f"| {case.started:,} | {'yes' if case.all_timed_out else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import pathlib

    results = measure_scale()
    text = (
        "# Deadlines at scale\n\n"
        "`python -m benchmarks.bench_deadline`: one turn of N hung calls, real time. "
        "'turn returned': how long after its deadline `turn.run()` returned; 'answers': "
        "how long after it each call's answer was written.\n\n" + scale_markdown(results)
    )
    out = pathlib.Path(__file__).parent / "results" / "deadline_scale.md"
    out.write_text(text)
    print(text)
