"""The HTTP layer's own throughput: is fanout's transport ever the bottleneck?

200 concurrent calls, each sending requests back to back, against an
unthrottled server in its own process. Arrangements, side by side:

* plain httpx, one shared client with httpx's default pool (no fanout at all);
* fanout's transport over one default pool;
* fanout's transport over one pool that keeps 200 connections alive;
* four clients, each fanout's transport over one pool, calls spread over them;
* ``fanout.http_client()``: one client whose transport spreads requests over four
  pools (the default).

httpx's default pool keeps only 20 idle connections, so 200 concurrent
requests churn through new connections; the question is which arrangement
keeps the layer out of the way at that concurrency.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

import attrs
import httpx
import trio

import fanout

from .harness import run_server

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["HttpThroughput", "measure_http"]

_POOL_200 = httpx.Limits(max_connections=200, max_keepalive_connections=200)


@attrs.frozen
class HttpThroughput:
    """Requests a second through one arrangement, and the client CPU each one cost.

    The server is one Python process, so requests a second are capped by it
    for every arrangement; the client's CPU per request is what tells the
    layers apart: it says how many requests a second the client side could
    carry on one core.
    """

    arrangement: str
    requests: int
    seconds: float
    cpu_seconds: float

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_seconds / self.requests * 1e6


def _clients(url: str, how: str) -> list[httpx.AsyncClient]:
    def through(**options: object) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=url, transport=fanout.FanoutTransport(**options))

    if how == "httpx, one pool":
        return [httpx.AsyncClient(base_url=url)]
    if how == "fanout, one pool":
        return [through(pools=1)]
    if how == "fanout, one pool keeping 200 alive":
        return [through(pools=1, limits=_POOL_200)]
    if how == "fanout, 4 clients of one pool":
        return [through(pools=1) for _ in range(4)]
    return [fanout.http_client(base_url=url)]


ARRANGEMENTS = (
    "httpx, one pool",
    "fanout, one pool",
    "fanout, one pool keeping 200 alive",
    "fanout, 4 clients of one pool",
    "fanout.http_client() (4 pools)",
)


async def _through_fanout(clients: Sequence[httpx.AsyncClient], calls: int, per_call: int) -> int:
    registry = fanout.Registry()
    sent = 0

    @registry.tool(kind=fanout.Kind.READS, timeout=None)
    async def fetch(n: int) -> str:
        nonlocal sent
        client = clients[n % len(clients)]
        for _ in range(per_call):
            (await client.get(f"/items/{n}")).raise_for_status()
            sent += 1
        return "done"

    runner = fanout.Runner(registry, inline_wait=None, turn_timeout=600, trace=False)
    turn = await runner.run_turn(
        [fanout.ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(calls)]
    )
    assert all(r.status is fanout.Status.OK for r in turn.results), turn.results[0]
    return sent


async def _plain(clients: Sequence[httpx.AsyncClient], calls: int, per_call: int) -> int:
    sent = 0

    async def fetch(n: int) -> None:
        nonlocal sent
        for _ in range(per_call):
            (await clients[0].get(f"/items/{n}")).raise_for_status()
            sent += 1

    async with trio.open_nursery() as nursery:
        for i in range(calls):
            nursery.start_soon(fetch, i)
    return sent


async def _once(url: str, how: str, calls: int, per_call: int) -> HttpThroughput:
    clients = _clients(url, how)
    try:
        run = _plain if how.startswith("httpx") else _through_fanout
        # Warm up as measured: one request per call, so every pool has opened what
        # the measured run will use (one request outside a call warmed only the
        # first of four pools, and the three cold ones opened fifty connections
        # each, which httpcore then scans at every request: twice the CPU).
        await run(clients, calls, 1)
        began, cpu = time.perf_counter(), time.process_time()
        sent = await run(clients, calls, per_call)
        return HttpThroughput(how, sent, time.perf_counter() - began, time.process_time() - cpu)
    finally:
        for client in clients:
            await client.aclose()


async def measure_http(
    *,
    calls: int = 200,
    per_call: int = 10,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[HttpThroughput]:
    """The median run (by client CPU per request) of each arrangement, interleaved."""
    runs: dict[str, list[HttpThroughput]] = {how: [] for how in ARRANGEMENTS}
    async with run_server(["--rate", "none", "--latency", "0"]) as url:
        for _ in range(repeats):
            for how in ARRANGEMENTS:
                runs[how].append(await _once(url, how, calls, per_call))
    results = []
    for how, measured in runs.items():
        ordered = sorted(measured, key=lambda r: r.cpu_us_per_request)
        results.append(ordered[len(ordered) // 2])
        if progress is not None:
            row = results[-1]
            progress(
                f"{how}: {row.per_second:,.0f} requests/s, "
                f"{row.cpu_us_per_request:,.0f} us of client CPU per request"
            )
    return results


def http_markdown(rows: Sequence[HttpThroughput], *, calls: int = 200) -> str:
    """The table for ``http.md`` and the summary."""
    lines = [
        f"{calls} concurrent calls sending requests back to back to an unthrottled server "
        "in its own process; the median of the runs by client CPU per request.",
        "",
        "| arrangement | requests/s | client CPU per request |",
        "| --- | ---: | ---: |",
    ]
    lines += [
        f"| {r.arrangement} | {r.per_second:,.0f} | {r.cpu_us_per_request:,.0f} µs |" for r in rows
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    trio.run(functools.partial(measure_http, progress=print))
