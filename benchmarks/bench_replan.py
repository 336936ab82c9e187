"""Requests a re-planning agent saves with a run's cache and single-flight.

A model that re-plans re-issues reads: every step here asks for ``reads``
lookups, half of them repeats of the previous step's and one asked twice in
the same step. Two set-ups run the same steps against a counting tool:

* **no run**: every turn is a run of its own and the tool has no cache TTL,
  so only same-turn duplicates are coalesced (fanout always does that);
* **one run with a cache**: the conversation's turns share a ``fanout.Run``
  and the tool declares ``cache_ttl``, so a repeat within the TTL is answered
  from the cache.

Virtual time (trio's MockClock): each step takes one simulated second, so the
cache's TTL is meaningful and the run takes no real time.
"""

from __future__ import annotations

import functools
import random

import attrs
import trio
import trio.testing

import fanout

__all__ = ["ReplanReport", "measure_replan", "replan_markdown"]


@attrs.frozen
class ReplanReport:
    steps: int
    reads_per_step: int
    asked: int
    executed_without_run: int
    executed_with_run: int

    @property
    def saved(self) -> float:
        return 1 - self.executed_with_run / self.executed_without_run


def _plan(steps: int, reads: int, seed: int) -> list[list[int]]:
    """Each step's lookups: half repeated from the last step, one asked twice, the rest new."""
    rng = random.Random(seed)
    fresh = iter(range(10**9))
    plan: list[list[int]] = []
    for step in range(steps):
        repeated = rng.sample(plan[-1], reads // 2) if step else []
        new = [next(fresh) for _ in range(reads - len(repeated) - 1)]
        asked = repeated + new
        asked.append(rng.choice(asked))  # the same lookup twice in one turn
        plan.append(asked)
    return plan


async def _play(plan: list[list[int]], *, with_run: bool) -> int:
    executed = 0
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS, cache_ttl=300 if with_run else None)
    async def lookup(record: int) -> str:
        nonlocal executed
        executed += 1
        await trio.sleep(0.05)
        return f"record {record}"

    runner = fanout.Runner(registry, trace=False)
    run = fanout.Run() if with_run else None
    for step, records in enumerate(plan):
        calls = [
            fanout.ToolCall(f"s{step}c{i}", "lookup", {"record": r}) for i, r in enumerate(records)
        ]
        turn = await runner.run_turn(calls, run=run)
        assert all(r.status is fanout.Status.OK for r in turn.results)
        await trio.sleep(1)  # the model thinks
    return executed


def measure_replan(*, steps: int = 20, reads: int = 10, seed: int = 1) -> ReplanReport:
    plan = _plan(steps, reads, seed)

    def play(with_run: bool) -> int:
        clock = trio.testing.MockClock(autojump_threshold=0)
        return trio.run(functools.partial(_play, plan, with_run=with_run), clock=clock)

    return ReplanReport(
        steps=steps,
        reads_per_step=reads,
        asked=sum(len(records) for records in plan),
        executed_without_run=play(False),
        executed_with_run=play(True),
    )


def replan_markdown(report: ReplanReport) -> str:
    return (
        f"{report.steps} steps of {report.reads_per_step} reads each: half of every step's "
        "reads repeat the previous step's, and one read is asked twice in the same step.\n\n"
        "| set-up | reads asked | tool executions |\n| --- | ---: | ---: |\n"
        f"| no run (same-turn coalescing only) | {report.asked} | "
        f"{report.executed_without_run} |\n"
        f"| one run, cache_ttl=300 | {report.asked} | {report.executed_with_run} |\n\n"
        f"Requests saved by the run: {report.saved:.0%}.\n"
    )


if __name__ == "__main__":
    print(replan_markdown(measure_replan()))
