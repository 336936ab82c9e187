"""Progress reports and idle timeouts of native tools, on a mock clock."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from fanout import EventKind, Kind, Registry, Runner, Status, ToolCall
from tests.unwinding import slow_to_unwind


def body(result: fanout.ToolResult) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(result.content)
    return parsed


def progress_times(turn: fanout.Turn) -> list[float]:
    return [e.time for e in turn.trace if e.kind is EventKind.PROGRESS]


def stepping_registry(*, idle_timeout: float | None, timeout: float | None) -> Registry:
    """One tool that sleeps each gap in turn and reports progress after each."""
    registry = Registry()

    @registry.tool(kind=Kind.READS, timeout=timeout, idle_timeout=idle_timeout)
    async def steps(gaps: list[float]) -> str:
        context = fanout.current_call()
        for done, gap in enumerate(gaps, start=1):
            await trio.sleep(gap)
            context.report_progress(done, len(gaps), f"step {done}")
        return "done"

    return registry


async def test_progress_becomes_events(autojump_clock: Any) -> None:
    """Each report is a PROGRESS event with its numbers and message, at its own time."""
    registry = stepping_registry(idle_timeout=None, timeout=None)
    turn = await Runner(registry).run_turn([ToolCall("a", "steps", {"gaps": [1, 2]})])
    [result] = turn.results
    assert result.status is Status.OK
    events = [e for e in turn.trace if e.kind is EventKind.PROGRESS]
    assert [(e.time, e.call_id, e.tool, e.attempt) for e in events] == [
        (1.0, "a", "steps", 1),
        (3.0, "a", "steps", 1),
    ]
    assert events[1].detail == {"progress": 2, "total": 2, "message": "step 2"}


async def test_progress_without_a_message_says_only_its_numbers(autojump_clock: Any) -> None:
    """A report with no message is an event of its numbers alone (no empty message)."""
    registry = Registry()

    @registry.tool(kind=Kind.READS)
    async def quiet() -> str:
        fanout.current_call().report_progress(0.5)
        return "done"

    turn = await Runner(registry).run_turn([ToolCall("q", "quiet", {})])
    [event] = [e for e in turn.trace if e.kind is EventKind.PROGRESS]
    assert event.detail == {"progress": 0.5, "total": None}


async def test_instruments_see_progress_without_a_trace(autojump_clock: Any) -> None:
    """An instrument receives each PROGRESS event even when the runner keeps no trace."""
    seen: list[fanout.Event] = []

    class Collect:
        def on_event(self, event: fanout.Event) -> None:
            seen.append(event)

    registry = stepping_registry(idle_timeout=None, timeout=None)
    runner = Runner(registry, instruments=[Collect()], trace=False)
    turn = await runner.run_turn([ToolCall("a", "steps", {"gaps": [1, 1, 1]})])
    assert turn.trace == ()
    assert [e.time for e in seen if e.kind is EventKind.PROGRESS] == [1.0, 2.0, 3.0]


async def test_progress_keeps_a_slow_tool_alive(autojump_clock: Any) -> None:
    """A tool quiet for less than its idle_timeout between reports runs far past it."""
    registry = stepping_registry(idle_timeout=2, timeout=None)
    turn = await Runner(registry).run_turn([ToolCall("a", "steps", {"gaps": [1.5] * 6})])
    assert turn.results[0].status is Status.OK
    assert trio.current_time() == 9.0


async def test_a_quiet_tool_is_stopped_as_idle(autojump_clock: Any) -> None:
    """No report for idle_timeout: timed_out exactly then, started, saying it was idle."""
    registry = stepping_registry(idle_timeout=2, timeout=None)
    turn = await Runner(registry).run_turn([ToolCall("a", "steps", {"gaps": [1, 1, 5]})])
    [result] = turn.results
    answered = [e.time for e in turn.trace if e.kind is EventKind.ANSWERED]
    assert (result.status, answered) == (Status.TIMED_OUT, [4.0])
    assert body(result)["started"] is True
    assert "idle_timeout" in body(result)["message"]


async def test_the_hard_deadline_caps_an_idle_timeout(autojump_clock: Any) -> None:
    """Progress never extends a call: it ends at its own timeout, answered as such."""
    registry = stepping_registry(idle_timeout=2, timeout=3)
    turn = await Runner(registry).run_turn([ToolCall("a", "steps", {"gaps": [1.5, 10]})])
    [result] = turn.results
    assert trio.current_time() == 3.0
    assert result.status is Status.TIMED_OUT
    assert "own timeout of 3s" in body(result)["message"]


async def test_a_sync_tool_reports_from_its_thread() -> None:
    """report_progress from a worker thread reaches the trace (in real time, as threads run)."""
    registry = Registry()

    @registry.tool(kind=Kind.READS, idle_timeout=5)
    def crunch() -> str:
        fanout.current_call().report_progress(1, None, "halfway")
        return "crunched"

    turn = await Runner(registry).run_turn([ToolCall("a", "crunch", {})])
    assert turn.results[0].content == "crunched"
    [event] = [e for e in turn.trace if e.kind is EventKind.PROGRESS]
    assert event.detail == {"progress": 1, "total": None, "message": "halfway"}


async def test_progress_messages_are_scrubbed(autojump_clock: Any) -> None:
    """A credential in a progress message never reaches the trace."""
    registry = Registry()

    @registry.tool(kind=Kind.READS)
    async def leaky() -> str:
        fanout.current_call().report_progress(1, message="using sk-ant-api03-abcdefghijklmnop")
        return "ok"

    turn = await Runner(registry).run_turn([ToolCall("a", "leaky", {})])
    [event] = [e for e in turn.trace if e.kind is EventKind.PROGRESS]
    assert "abcdefghijklmnop" not in event.detail["message"]


def test_idle_timeout_must_be_positive() -> None:
    """A zero, negative or NaN idle_timeout is a ConfigurationError at registration."""
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(fanout.ConfigurationError):
            Registry().add(lambda: None, name="t", idle_timeout=bad)


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.integers(0, 6), max_size=6),
    idle=st.integers(1, 5),
    timeout=st.integers(1, 20),
)
def test_idle_and_deadline_decide_the_end(gaps: list[int], idle: int, timeout: int) -> None:
    """Whatever the gaps, the call ends at the first of: done, idle expiry, hard deadline.

    Idle and deadline sit half a second off the integer gaps, so no two
    events share an instant.
    """
    idle_timeout, hard = idle + 0.5, timeout + 0.25
    registry = stepping_registry(idle_timeout=idle_timeout, timeout=hard)
    last_report, done_at, idle_at = 0.0, float(sum(gaps)), float("inf")
    for gap in gaps:
        if gap > idle_timeout:
            idle_at = last_report + idle_timeout
            break
        last_report += gap
    end = min(done_at, idle_at, hard)

    async def main() -> fanout.Turn:
        return await Runner(registry).run_turn([ToolCall("a", "steps", {"gaps": gaps})])

    turn = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    [result] = turn.results
    answered = [e.time for e in turn.trace if e.kind is EventKind.ANSWERED]
    assert answered == [end]
    if end == done_at:
        assert result.status is Status.OK
    else:
        assert result.status is Status.TIMED_OUT
        assert ("idle_timeout" in body(result)["message"]) is (end == idle_at)
    assert all(t <= end for t in progress_times(turn))


async def test_an_idle_call_is_answered_as_it_goes_idle_not_once_it_has_unwound(
    autojump_clock: Any,
) -> None:
    """A quiet tool whose cleanup takes 3 s: answered idle at 1.0 s, and an open runner's
    turn returns then, as one cut off by its own timeout does (it was answered at 4.0 s)."""
    reg = Registry()
    slow_to_unwind(reg, 3, name="stubborn", timeout=10, idle_timeout=1)

    async with Runner(reg) as runner:
        turn = await runner.run_turn([ToolCall("s", "stubborn", {})])
        assert trio.current_time() == 1.0
    (answered,) = [e for e in turn.trace if e.kind is EventKind.ANSWERED]
    assert answered.time == 1.0
    body = json.loads(turn.results[0].content)
    assert (body["status"], body["started"]) == ("timed_out", True)
    assert "idle" in body["message"]
