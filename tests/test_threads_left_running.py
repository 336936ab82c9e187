"""A sync tool cut off by its timeout is answered then, and its thread left to finish: the
call's work has not ended, and the promises on writes hold until it has.

Real time and real threads (a worker thread's end is the thing under test), each turn
bounded to well under a second. Hypothesis draws the turn: sync reads and writes, how
long each runs past its timeout or not, the write policy, and whether the runner is open.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from fanout import Kind, Registry, Runner, ToolCall

TIMEOUT = 0.05  # each tool's own; a tool that runs longer is answered, its thread left


class Inside:
    """Which tools are inside their bodies right now, and every overlap the promises forbid."""

    def __init__(self, *, writes_together: bool) -> None:
        self.lock = threading.Lock()
        self.now: list[str] = []
        self.overlaps: list[tuple[str, list[str]]] = []
        self.writes_together = writes_together

    def enter(self, who: str) -> None:
        with self.lock:
            others = list(self.now)
            if who.startswith("w"):
                clash = [o for o in others if o.startswith("r") or not self.writes_together]
            else:
                clash = [o for o in others if o.startswith("w")]
            if clash:
                self.overlaps.append((who, clash))
            self.now.append(who)

    def leave(self, who: str) -> None:
        with self.lock:
            self.now.remove(who)


def _registry(inside: Inside, runs: dict[str, float]) -> Registry:
    """``read`` and ``write``, each inside its body for as long as ``runs`` says."""

    def body(name: str) -> str:
        inside.enter(name)
        try:
            time.sleep(runs[name])
            return name
        finally:
            inside.leave(name)

    registry = Registry()
    registry.add(body, name="read", kind=Kind.READS, timeout=TIMEOUT)
    registry.add(body, name="write", kind=Kind.MUTATING, timeout=TIMEOUT)
    return registry


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    reads=st.lists(st.sampled_from([0.0, 0.15]), max_size=3),
    writes=st.lists(st.sampled_from([0.0, 0.15]), min_size=1, max_size=3),
    mutating=st.sampled_from(["serial", "parallel"]),
    hosted=st.booleans(),
)
def test_no_write_runs_beside_a_thread_left_running(
    reads: list[float], writes: list[float], mutating: Any, hosted: bool
) -> None:
    """Writes start once every read of the turn has ended, and under ``serial`` once the
    write before has, thread and all, though each was answered at its own timeout.
    (Taken as ended when answered, a write ran while a read's thread still read, and the
    next serial write while the one before still wrote.)"""
    inside = Inside(writes_together=mutating == "parallel")
    runs = {f"r{i}": run for i, run in enumerate(reads)}
    runs |= {f"w{i}": run for i, run in enumerate(writes)}
    calls = [ToolCall(f"c-{name}", "read" if name[0] == "r" else "write", {"name": name})
             for name in runs]  # fmt: skip
    runner = Runner(_registry(inside, runs), mutating=mutating, turn_timeout=5)

    async def main() -> fanout.Turn:
        if hosted:
            async with runner:
                return await runner.run_turn(calls)
        return await runner.run_turn(calls)

    turn = trio.run(main)
    time.sleep(0.2)  # every thread left running has ended
    assert inside.overlaps == []
    assert [r.tool_use_id for r in turn.results] == [c.id for c in calls]


def test_a_cached_read_is_not_served_from_before_a_write_whose_thread_ended_late() -> None:
    """A write cut off at its timeout goes on in its thread and changes what a read would
    say; a read cached while it ran was served after it had ended."""
    price = {"value": 100}
    registry = Registry()

    @registry.tool(kind=Kind.READS, cache_ttl=60)
    def get_price() -> int:
        return price["value"]

    @registry.tool(kind=Kind.MUTATING, timeout=TIMEOUT)
    def set_price(value: int) -> str:
        time.sleep(0.3)
        price["value"] = value
        return "set"

    runner = Runner(registry)
    run = fanout.Run()

    async def main() -> list[str]:
        seen = []
        await runner.run_turn([ToolCall("a", "set_price", {"value": 120})], run=run)
        turn = await runner.run_turn([ToolCall("b", "get_price", {})], run=run)
        seen.append(turn.results[0].content)  # while the write's thread still runs
        await trio.sleep(0.5)  # it has ended
        turn = await runner.run_turn([ToolCall("c", "get_price", {})], run=run)
        seen.append(turn.results[0].content)
        return seen

    assert trio.run(main) == ["100", "120"]


def test_a_sync_write_answered_at_its_timeout_keeps_what_its_thread_returned() -> None:
    """Its thread left to finish, the write took effect: its claim is held until then,
    and what it returned is what a re-issue in the run is given. (The claim was let go
    as the write was answered: the re-issue during the thread ran it beside it, and one
    after ran it again, three charges for one.)"""
    charges: list[float] = []
    registry = Registry()

    @registry.tool(kind=Kind.MUTATING, timeout=TIMEOUT)
    def charge(amount: float) -> str:
        charges.append(amount)
        time.sleep(0.3)
        return f"charged {amount}"

    runner = Runner(registry)
    run = fanout.Run("conversation", claim_lease=1.0)
    call = {"amount": 9.99}

    async def main() -> list[fanout.ToolResult]:
        first = await runner.run_turn([ToolCall("a", "charge", call)], run=run)
        during = await runner.run_turn([ToolCall("b", "charge", call)], run=run)
        await trio.sleep(0.5)  # the first thread has returned
        after = await runner.run_turn([ToolCall("c", "charge", call)], run=run)
        return [first.results[0], during.results[0], after.results[0]]

    first, during, after = trio.run(main)
    assert charges == [9.99]
    assert first.status is fanout.Status.TIMED_OUT
    assert during.status is not fanout.Status.OK  # it waited for the claim, and ran nothing
    assert (after.status, after.content) == (fanout.Status.OK, "charged 9.99")
