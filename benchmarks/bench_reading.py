"""What reading each answer costs a scope, as the bookings it remembers grow.

Every answer is read against what started since its request left, and a
scope remembers a minute of bookings to say so. A turn of N calls, one
request each, eight in flight, through a scope told a rate it never
reaches, against a server that states its count in every answer; beside
it, the same requests from a semaphore loop, on the same server. The
client's CPU per call, the median of a few runs: if reading grew with what
is remembered, fanout's share would grow with N.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import TYPE_CHECKING

import attrs
import httpx
import trio

import fanout

from .harness import fresh_key, run_server

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

__all__ = ["ReadingCost", "measure_reading", "reading_markdown"]

# A server that counts, far above what one client sends, and says so in every answer.
_COUNTING = ["--rate", "1000000", "--burst", "1000000", "--headers", "draft", "--latency", "0"]
_IN_FLIGHT = 8


@attrs.frozen
class ReadingCost:
    """Client CPU per call at one turn size: a semaphore loop, and fanout through a scope."""

    calls: int
    semaphore_us: float
    fanout_us: float

    @property
    def ratio(self) -> float:
        return self.fanout_us / self.semaphore_us


async def _semaphore_loop(url: str, calls: int) -> None:
    headers = {"x-api-key": fresh_key("semaphore")}
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        gate = trio.Semaphore(_IN_FLIGHT)

        async def fetch(n: int) -> None:
            async with gate:
                (await client.get(f"/items/{n}")).raise_for_status()

        async with trio.open_nursery() as nursery:
            for n in range(calls):
                nursery.start_soon(fetch, n)


async def _through_a_scope(url: str, calls: int) -> None:
    headers = {"x-api-key": fresh_key("fanout")}
    scope = fanout.Scope("api", rate=1_000_000, burst=1_000_000, max_concurrency=_IN_FLIGHT)
    registry = fanout.Registry()
    async with fanout.http_client(base_url=url, headers=headers) as client:

        @registry.tool(kind=fanout.Kind.READS, scopes=["api"], timeout=None)
        async def fetch(n: int) -> str:
            (await client.get(f"/items/{n}")).raise_for_status()
            return "ok"

        runner = fanout.Runner(
            registry, scopes=[scope], inline_wait=None, turn_timeout=600, trace=False
        )
        turn = await runner.run_turn(
            [fanout.ToolCall(f"c{n}", "fetch", {"n": n}) for n in range(calls)]
        )
    assert all(r.status is fanout.Status.OK for r in turn.results), turn.results[0]


async def _cpu_per_call(run: Callable[[str, int], Awaitable[None]], url: str, calls: int) -> float:
    began = time.process_time()
    await run(url, calls)
    return (time.process_time() - began) / calls * 1e6


async def measure_reading(
    *,
    sizes: Sequence[int] = (1_000, 4_000),
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[ReadingCost]:
    """The median run of each, interleaved, at each turn size."""
    rows = []
    async with run_server(_COUNTING) as url:
        await _semaphore_loop(url, _IN_FLIGHT)  # the server's first answers, before measuring
        for calls in sizes:
            plain, scoped = [], []
            for _ in range(repeats):
                plain.append(await _cpu_per_call(_semaphore_loop, url, calls))
                scoped.append(await _cpu_per_call(_through_a_scope, url, calls))
            row = ReadingCost(calls, statistics.median(plain), statistics.median(scoped))
            rows.append(row)
            if progress is not None:
                progress(
                    f"{calls:,} calls: semaphore {row.semaphore_us:,.0f} us, "
                    f"fanout {row.fanout_us:,.0f} us of client CPU a call ({row.ratio:.2f}x)"
                )
    return rows


def reading_markdown(rows: Sequence[ReadingCost]) -> str:
    """The table for ``http.md`` and the summary."""
    lines = [
        f"One request a call, {_IN_FLIGHT} in flight, against a server that states its count "
        "in every answer: a semaphore loop, and fanout through a scope told a rate it never "
        "reaches; client CPU per call, the median of the runs.",
        "",
        "| calls | semaphore loop | fanout, through a scope | ratio |",
        "| ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r.calls:,} | {r.semaphore_us:,.0f} µs | {r.fanout_us:,.0f} µs | {r.ratio:.2f}x |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    trio.run(functools.partial(measure_reading, progress=print))
