"""The deadline watcher: each action at its time, in order, and a late addition wakes it."""

from __future__ import annotations

import collections
import gc
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from fanout import EventKind, Kind, Registry, Runner, Status, ToolCall
from fanout._collector import FULL_PASSES, LONGEST_HOLD
from fanout._deadlines import Deadlines
from tests.unwinding import slow_to_unwind


async def test_each_action_runs_at_its_time_and_watch_returns_at_the_last(
    autojump_clock: Any,
) -> None:
    """Actions run at their exact times, ties in the order added; watch ends at ``last``."""
    deadlines = Deadlines()
    ran: list[tuple[str, float]] = []
    for name, when in (("b", 2.0), ("a", 1.0), ("c", 2.0), ("late", 9.0)):
        deadlines.add(when, lambda name=name: ran.append((name, trio.current_time())))
    await deadlines.watch(5.0)
    assert ran == [("a", 1.0), ("b", 2.0), ("c", 2.0)]
    assert trio.current_time() == 5.0


async def test_a_deadline_added_while_watching_wakes_the_watcher(autojump_clock: Any) -> None:
    """An earlier deadline added mid-sleep is acted on at its time, not at the later one."""
    deadlines = Deadlines()
    ran: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deadlines.watch, 10.0)
        await trio.sleep(1)
        deadlines.add(3.0, lambda: ran.append(trio.current_time()))
    assert ran == [3.0]
    assert trio.current_time() == 10.0


async def test_an_action_runs_before_any_task_its_deadline_wakes(autojump_clock: Any) -> None:
    """Due actions run in trio's pass over deadlines, before every task that pass wakes.

    Trio runs a batch of woken tasks forwards or backwards at random, so a
    watcher woken like any task would come after some sleepers in about
    half the rounds.
    """

    async def sleeper(due: float, acted: list[float], seen: list[bool]) -> None:
        await trio.sleep_until(due)
        seen.append(bool(acted))

    for round_ in range(10):
        deadlines = Deadlines()
        acted: list[float] = []
        seen: list[bool] = []
        due = trio.current_time() + 3.0
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(sleeper, due, acted, seen)
            deadlines.add(due, lambda acted=acted: acted.append(trio.current_time()))
            nursery.start_soon(deadlines.watch, due + 1.0)
        assert acted == [due], round_
        assert seen == [True] * 5, round_


async def test_an_action_that_raises_fails_the_watcher_not_trio(autojump_clock: Any) -> None:
    """An action raising inside trio's pass is raised in the watcher's task, at its time."""
    deadlines = Deadlines()

    def broken() -> None:
        raise ValueError("broken action")

    deadlines.add(2.0, broken)
    with pytest.raises(ValueError, match="broken action"):
        await deadlines.watch(5.0)
    assert trio.current_time() == 2.0


async def test_actions_run_with_the_collector_paused_then_left_as_it_was(
    autojump_clock: Any,
) -> None:
    """Due actions run with the cyclic collector off; after them it is on again, unless it
    was off before."""
    seen: list[bool] = []
    for collecting in (True, False):
        (gc.enable if collecting else gc.disable)()
        try:
            deadlines = Deadlines()
            deadlines.add(trio.current_time() + 1, lambda: seen.append(gc.isenabled()))
            await deadlines.watch(trio.current_time() + 2)
            assert gc.isenabled() is collecting
        finally:
            gc.enable()
    assert seen == [False, False]


_STEP = 0.01  # seconds between looks at the collector


def _held() -> bool:
    return gc.get_threshold()[2] > 1_000_000


def _stretches(looks: list[tuple[float, bool]]) -> list[tuple[float, float]]:
    """The held stretches, each (first look held, first look free after it)."""
    stretches, since = [], None
    for at, held in looks:
        if held and since is None:
            since = at
        elif not held and since is not None:
            stretches.append((since, at))
            since = None
    assert since is None, "still held after the watcher left"
    return stretches


@settings(max_examples=60, deadline=None)
@given(
    before=st.lists(st.integers(1, 1200), max_size=12),
    during=st.lists(st.tuples(st.integers(0, 1100), st.integers(1, 150)), max_size=6),
    last=st.integers(1, 1300),
)
def test_full_passes_are_held_off_ahead_of_each_deadline_and_never_for_long(
    before: list[int],
    during: list[tuple[int, int]],
    last: int,
) -> None:
    """Deadlines at any times, some added while the watcher waits (how far ahead, drawn):
    the collector's full passes are held at every deadline from a lead before it, but
    where a hold ran its full length just before (then they run for as long again);
    never held but within a lead of a deadline; never longer than a hold may last; and
    free again once the watcher has left. Times in hundredths of a second; a look at the
    instant a deadline was added may come before the watcher has seen it."""
    lead = 0.3
    end = last / 100
    # Each deadline, and when the watcher was told of it.
    due = [(t / 100, 0.0) for t in before] + [((a + b) / 100, a / 100) for a, b in during]
    due = [(when, told) for when, told in [*due, (end, 0.0)] if when <= end]
    looks: list[tuple[float, bool]] = []

    async def main() -> None:
        deadlines = Deadlines()
        for when in before:
            deadlines.add(when / 100, lambda: None)

        async def add_later() -> None:
            for at, ahead in sorted(during):
                await trio.sleep_until(at / 100)
                deadlines.add((at + ahead) / 100, lambda: None)

        async def look() -> None:
            while True:
                looks.append((trio.current_time(), _held()))
                await trio.sleep(_STEP)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(look)
            nursery.start_soon(add_later)
            await deadlines.watch(end)
            await trio.sleep(_STEP)
            nursery.cancel_scope.cancel()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FULL_PASSES, "_took", collections.deque([lead / 1.5]))
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert not _held()
    stretches = _stretches(looks)
    for since, until in stretches:
        assert until - since <= LONGEST_HOLD + _STEP + 1e-9
    free_after_full = [
        (until, until + (until - since))
        for since, until in stretches
        if until - since >= LONGEST_HOLD - _STEP
    ]
    for at, held in looks:
        pending = [(d, told) for d, told in due if told <= at]
        near = any(d - lead - 1e-9 <= at <= d + 1e-9 for d, _ in pending)
        if held:
            assert near, (at, pending)
        elif near and any(max(d - lead, told) + _STEP <= at < d - 1e-9 for d, told in pending):
            assert any(lo - _STEP <= at <= hi + _STEP for lo, hi in free_after_full), at


async def _cancelled_by_actions(last: float) -> list[int]:
    """Twenty scopes, each cancelled by an action due at 1 s, the watcher leaving at
    ``last``: how many were cancelled by the end of the pass that ran the actions. All of
    them are a moment later."""
    deadlines = Deadlines()
    scopes = [trio.CancelScope() for _ in range(20)]
    in_pass: list[int] = []

    def expire(scope: trio.CancelScope) -> None:
        deadlines.cancel_soon(scope)
        if scope is scopes[-1]:
            in_pass.append(sum(s.cancel_called for s in scopes))

    for scope in scopes:
        deadlines.add(1.0, lambda scope=scope: expire(scope))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deadlines.watch, last)
        await trio.sleep(1.001)
        assert all(s.cancel_called for s in scopes)
    return in_pass


async def test_what_actions_cancel_is_cancelled_a_few_a_batch_and_all_on_leaving(
    autojump_clock: Any,
) -> None:
    """Twenty calls due at once: their actions cancel eight before the next batch runs,
    then eight a batch; a watcher that leaves at that moment cancels the rest at once."""
    assert await _cancelled_by_actions(5.0) == [8]
    assert await _cancelled_by_actions(1.0) == [8]


async def test_calls_due_one_after_another_are_answered_while_others_unwind(
    autojump_clock: Any,
) -> None:
    """200 hung calls, each timing out 2 ms after the one before, whose unwinding takes 4
    ms of the process (closing a socket in a pool of hundreds, say). Each is answered
    within a batch of eight unwindings of its deadline. Cancelled as they came due,
    each pass's calls unwound in one batch, through which twice as many came due: the
    last answers came 0.25 s late (0.3-0.5 s with a thousand hung HTTP calls against a
    server that never answers, in real time)."""
    tools = Registry()
    for i in range(200):

        @tools.tool(name=f"t{i}", kind=Kind.READS, timeout=0.1 + 0.002 * i)
        async def hang() -> str:
            try:
                await trio.sleep_forever()
            finally:
                autojump_clock.jump(0.004)  # unwinding that holds the process
            raise AssertionError("unreachable")

    runner = Runner(tools, turn_timeout=30)
    began = trio.current_time()
    turn = await runner.run_turn([ToolCall(f"c{i}", f"t{i}", {}) for i in range(200)])
    assert all(r.status is Status.TIMED_OUT for r in turn.results)
    answered = {e.call_id: e.time for e in turn.trace if e.kind is EventKind.ANSWERED}
    late = [answered[f"c{i}"] - (began + 0.1 + 0.002 * i) for i in range(200)]
    assert min(late) >= 0.0
    assert max(late) <= 0.004 * 8 + 0.004 + 1e-9


class _AnsweredAt:
    def __init__(self) -> None:
        self.at: dict[str, tuple[float, Status | None]] = {}

    def on_event(self, event: Any) -> None:
        if event.kind is EventKind.ANSWERED:
            self.at[event.call_id] = (event.time, event.status)


@pytest.mark.parametrize("opened", [False, True])
async def test_a_caller_cancelling_has_every_call_answered_at_once(
    autojump_clock: Any, opened: bool
) -> None:
    """The caller cancels at 0.1 s; a tool takes 5 s to unwind. Its call is answered
    "cancelled" then, not when it has unwound (at 5.1 s, 4.1 s past the turn's deadline,
    in a runner not opened: `turn.results` said "not finished" meanwhile)."""
    reg, answered = Registry(), _AnsweredAt()
    slow_to_unwind(reg, 5, name="slow")
    runner = Runner(reg, turn_timeout=1, instruments=[answered])
    seen: list[str] = []

    async def cancelled_turn() -> float:
        turn = runner.turn([ToolCall("c1", "slow", {})])
        began = trio.current_time()

        async def look() -> None:
            await trio.sleep(1.5)
            seen.append(turn.results[0].content)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(look)
            with trio.move_on_after(0.1):
                await turn.run()
        return began

    if opened:
        async with runner:
            began = await cancelled_turn()
    else:
        began = await cancelled_turn()
    assert answered.at["c1"] == (pytest.approx(began + 0.1), Status.CANCELLED)
    assert "the caller cancelled the turn" in seen[0]


async def test_a_call_still_being_written_is_answered_at_the_deadline(
    autojump_clock: Any,
) -> None:
    """A streamed call whose block never ends is answered ``timed_out`` at the turn's
    deadline, beside a running read that takes 3 s to unwind (it was answered as the
    turn ended, 3 s late, in a runner not opened)."""
    reg, answered = Registry(), _AnsweredAt()
    slow_to_unwind(reg, 3, name="slow")

    def block(i: int, call_id: str, pieces: str) -> list[dict[str, Any]]:
        return [
            {"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": call_id, "name": "slow", "input": {}}},
            {"type": "content_block_delta", "index": i,
             "delta": {"type": "input_json_delta", "partial_json": pieces}},
        ]  # fmt: skip

    async def stream() -> Any:
        yield {"type": "message_start", "message": {"id": "m", "role": "assistant"}}
        for event in [*block(0, "A", '{"n": 1}'), {"type": "content_block_stop", "index": 0}]:
            yield event
        for event in block(1, "B", '{"n": '):
            yield event
        await trio.sleep(100)  # the model is still writing B
        yield {"type": "content_block_stop", "index": 1}

    runner = Runner(reg, turn_timeout=1, instruments=[answered])
    began = trio.current_time()
    turn = await runner.run_stream(stream(), fanout.AnthropicStream())
    assert [r.status for r in turn.results] == [Status.TIMED_OUT, Status.TIMED_OUT]
    assert answered.at["A"] == (pytest.approx(began + 1), Status.TIMED_OUT)
    assert answered.at["B"] == (pytest.approx(began + 1), Status.TIMED_OUT)
