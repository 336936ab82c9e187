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

import statistics
import time
from typing import Any

import attrs
import trio

import fanout

__all__ = ["DeadlineReport", "measure_deadlines"]


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
        data = sorted(self.turn_late)
        index = min(len(data) - 1, max(0, round(q / 100 * (len(data) - 1))))
        return data[index]

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
