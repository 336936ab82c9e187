"""What fanout costs per call, against a bare trio nursery running the same coroutines.

The tool is a no-op coroutine, so everything measured is bookkeeping: the
nursery runs ``results[i] = await noop(i)`` for every call; fanout runs the
same coroutine as a registered ``pure`` tool with no scopes and no timeout,
and answers every call. The calls are built before the clock starts (that is
the adapter's work, done once per model message either way).

Time is the median of a few fresh ``trio.run``s, measured inside the run with
``time.perf_counter`` around the turn alone. Memory is ``tracemalloc``'s peak
during the turn, in a separate run (tracing slows everything down, so it
never shares a run with a timing).
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from typing import TYPE_CHECKING, Any

import attrs
import trio

import fanout

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

__all__ = ["CONFIGS", "OverheadReport", "measure_overhead"]


async def noop(n: int) -> str:
    """The tool: returns at once, so only the runtime around it is measured."""
    return "ok"


class NoOp:
    """An instrument that receives every event and does nothing with it."""

    def on_event(self, event: fanout.Event) -> None:
        pass


def _registry() -> fanout.Registry:
    registry = fanout.Registry()
    registry.add(noop, kind=fanout.Kind.PURE, timeout=None)
    return registry


def _calls(n: int) -> list[fanout.ToolCall]:
    """The turn's calls as the adapters build them: each knows its position in the message."""
    return [fanout.ToolCall(f"c{i}", "noop", {"n": i}, i) for i in range(n)]


async def _bare(n: int) -> Callable[[], Awaitable[None]]:
    results: list[str | None] = [None] * n

    async def one(i: int) -> None:
        results[i] = await noop(i)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)

    return run


def _fanout(trace: bool, instruments: Sequence[fanout.Instrument] = ()) -> Callable[[int], Any]:
    async def prepare(n: int) -> Callable[[], Awaitable[None]]:
        runner = fanout.Runner(_registry(), trace=trace, instruments=instruments, turn_timeout=3600)
        calls = _calls(n)

        async def run() -> None:
            turn = await runner.run_turn(calls)
            assert len(turn.results) == n

        return run

    return prepare


# name -> (label, builder). The builder runs inside trio and returns the timed coroutine.
CONFIGS: dict[str, tuple[str, Callable[[int], Any]]] = {
    "bare": ("bare trio nursery", _bare),
    "fanout_off": ("fanout, trace=False", _fanout(trace=False)),
    "fanout_trace": ("fanout, default (trace on)", _fanout(trace=True)),
    "fanout_noop": ("fanout, trace=False + NoOp instrument", _fanout(False, [NoOp()])),
}


def _time_once(config: str, n: int) -> float:
    """Seconds for one turn of ``n`` calls, in a fresh trio.run."""
    build = CONFIGS[config][1]
    elapsed = 0.0

    async def main() -> None:
        nonlocal elapsed
        run = await build(n)
        gc.collect()
        start = time.perf_counter()
        await run()
        elapsed = time.perf_counter() - start

    trio.run(main)
    return elapsed


def _peak_memory(config: str, n: int) -> int:
    """tracemalloc's peak (bytes) while one turn of ``n`` calls runs."""
    build = CONFIGS[config][1]
    peak = 0

    async def main() -> None:
        nonlocal peak
        run = await build(n)
        gc.collect()
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            await run()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    trio.run(main)
    return peak


@attrs.frozen
class Timing:
    """One configuration at one size: median seconds over ``repeats`` runs."""

    config: str
    calls: int
    seconds: float
    repeats: int

    @property
    def us_per_call(self) -> float:
        return self.seconds / self.calls * 1e6


@attrs.frozen
class OverheadReport:
    headline_calls: int
    timings: list[Timing]
    memory: dict[str, int]  # config -> peak bytes at headline_calls
    sizes: list[int]

    def timing(self, config: str, calls: int) -> Timing:
        return next(t for t in self.timings if t.config == config and t.calls == calls)

    def ratio(self, config: str, calls: int | None = None) -> float:
        n = self.headline_calls if calls is None else calls
        return self.timing(config, n).seconds / self.timing("bare", n).seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "headline_calls": self.headline_calls,
            "sizes": self.sizes,
            "timings": [{**attrs.asdict(t), "us_per_call": t.us_per_call} for t in self.timings],
            "memory_peak_bytes": self.memory,
            "ratios_to_bare": [
                {"config": t.config, "calls": t.calls, "ratio": self.ratio(t.config, t.calls)}
                for t in self.timings
                if t.config != "bare"
            ],
        }


def measure_overhead(
    *,
    headline: int = 10_000,
    sizes: Sequence[int] = (1_000, 10_000, 50_000, 100_000),
    repeats: int = 5,
) -> OverheadReport:
    """Every configuration at the headline size (``repeats`` runs); bare and the
    default at every size for the growth curve (fewer runs for the large ones)."""
    timings: list[Timing] = []
    for n in sorted({headline, *sizes}):
        configs = list(CONFIGS) if n == headline else ["bare", "fanout_trace"]
        runs = repeats if n <= headline else max(1, repeats // 3)
        for config in configs:
            seconds = statistics.median(_time_once(config, n) for _ in range(runs))
            timings.append(Timing(config, n, seconds, runs))
    memory = {config: _peak_memory(config, headline) for config in CONFIGS}
    return OverheadReport(headline, timings, memory, sorted({headline, *sizes}))
