"""One call's life: what the runner makes of what a tool raises, attempt by attempt."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

import fanout
from fanout import Kind, Registry, RetryPolicy, Runner, Status, ToolCall


def _runner(fn: Any) -> Runner:
    registry = Registry()
    registry.add(fn, name="tool", kind=Kind.READS, retry=RetryPolicy(attempts=3))
    return Runner(registry)


async def test_a_signal_of_the_tools_own_kind_is_an_error_and_not_retried(
    autojump_clock: Any,
) -> None:
    """A bare ToolSignal (no known meaning) is answered error once, with its words."""
    attempts: list[float] = []

    async def tool() -> str:
        attempts.append(trio.current_time())
        raise fanout.ToolSignal("upstream said something odd")

    turn = await _runner(tool).run_turn([ToolCall("a", "tool", {})])
    body = json.loads(turn.results[0].content)
    assert (turn.results[0].status, body["message"]) == (
        Status.ERROR, "ToolSignal: upstream said something odd",
    )  # fmt: skip
    assert attempts == [0.0]


async def test_a_base_exception_group_from_a_tool_is_its_error_not_the_turns(
    autojump_clock: Any,
) -> None:
    """A group holding SystemExit and an error is the call's error answer; the turn goes on."""

    async def tool() -> str:
        raise BaseExceptionGroup("mixed", [SystemExit(2), ValueError("bad row")])

    turn = await _runner(tool).run_turn([ToolCall("a", "tool", {})])
    body = json.loads(turn.results[0].content)
    assert (turn.results[0].status, body["started"]) == (Status.ERROR, True)
    assert body["message"].startswith("BaseExceptionGroup: mixed")


async def test_a_transient_error_is_retried_until_the_attempts_run_out(
    autojump_clock: Any,
) -> None:
    """TransientError is retried with backoff; the last attempt's answer says it gave up."""
    attempts: list[float] = []

    async def tool() -> str:
        attempts.append(trio.current_time())
        raise fanout.TransientError("connection reset")

    turn = await _runner(tool).run_turn([ToolCall("a", "tool", {})])
    body = json.loads(turn.results[0].content)
    assert turn.results[0].status is Status.ERROR
    assert body["message"] == "TransientError: connection reset; gave up after 3 attempts"
    assert len(attempts) == 3
    assert attempts == sorted(set(attempts))  # each retry after a backoff, never at once


def test_current_call_outside_a_tool_says_so() -> None:
    """current_call() with no tool running is a FanoutError that says where it was used."""
    with pytest.raises(fanout.FanoutError, match="outside a tool run by fanout"):
        fanout.current_call()


async def test_a_spent_quota_is_answered_at_once_with_its_reset(autojump_clock: Any) -> None:
    """QuotaExhaustedError is not retried: quota_exhausted now, retry_after_ms its reset."""
    attempts: list[float] = []
    signal = fanout.QuotaExhaustedError("monthly quota spent", reset_after=90.0)

    async def tool() -> str:
        attempts.append(trio.current_time())
        raise signal

    turn = await _runner(tool).run_turn([ToolCall("a", "tool", {})])
    assert signal.reset_after == 90.0
    assert (turn.results[0].status, turn.results[0].retry_after_ms) == (
        Status.QUOTA_EXHAUSTED, 90_000,
    )  # fmt: skip
    assert attempts == [0.0]


async def test_a_tool_whose_cleanup_fails_as_its_deadline_cuts_it_is_timed_out(
    autojump_clock: Any,
) -> None:
    """Cut off at its deadline, a tool's task raises an error from its cleanup: trio groups it
    with the cancellation, the cancellation wins, and the call is answered timed_out at 1 s."""

    async def tool() -> str:
        async def child() -> None:
            try:
                await trio.sleep_forever()
            finally:
                raise ValueError("cleanup failed")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
            await trio.sleep_forever()
        return "unreachable"

    registry = Registry()
    registry.add(tool, name="tool", kind=Kind.READS, timeout=1)
    turn = await Runner(registry).run_turn([ToolCall("a", "tool", {})])
    assert turn.results[0].status is Status.TIMED_OUT
    assert trio.current_time() == 1.0
