"""One call's life: what the runner makes of what a tool raises, attempt by attempt."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from fanout import Kind, Registry, RetryPolicy, Runner, Status, ToolCall
from tests.unwinding import slow_to_unwind


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


_CUT_OFF_BY = ("own timeout", "turn deadline", "idle timeout", "caller", "sibling")


def _cut_off_then_quick(by: str, cut_at: float, unwind: float) -> Runner:
    """A runner whose ``slow`` read (scope ``api``, one at a time) is cut off at ``cut_at``
    by ``by`` and takes ``unwind`` seconds to stop; ``quick`` takes 0.1 s there."""
    registry = Registry()
    options: dict[str, Any] = {"timeout": None}
    if by == "own timeout":
        options = {"timeout": cut_at}
    elif by == "idle timeout":
        options = {"timeout": None, "idle_timeout": cut_at}
    slow_to_unwind(registry, unwind, name="slow", scopes=["api"], **options)

    @registry.tool(kind=Kind.READS)
    async def fails() -> str:
        await trio.sleep(cut_at)
        raise KeyError("no such record")

    @registry.tool(kind=Kind.READS, scopes=["api"], timeout=3)
    async def quick(n: int) -> str:
        await trio.sleep(0.1)
        return f"quick {n}"

    on_failure = "cancel_siblings" if by == "sibling" else "continue"
    turn_timeout = cut_at if by == "turn deadline" else 60
    api = fanout.Scope("api", max_concurrency=1, learn=False)
    return Runner(registry, scopes=[api], on_failure=on_failure, turn_timeout=turn_timeout)


@settings(max_examples=40, deadline=None)
@given(
    by=st.sampled_from(_CUT_OFF_BY),
    cut_at=st.sampled_from([0.5, 1.0, 1.5]),
    unwind=st.sampled_from([0.0, 0.3, 2.0, 5.0, 40.0]),
    quick_calls=st.integers(1, 4),
)
def test_a_cut_off_calls_unwinding_is_no_latency_and_sheds_no_later_call(
    by: str, cut_at: float, unwind: float, quick_calls: int
) -> None:
    """A call cut off at ``cut_at`` shows its scope's calls take at least that long, however
    long it takes to unwind after; the later calls there are answered as if it had stopped
    at once. (Counted to the end of its unwinding, a read 5 s in closing after its 1 s
    timeout made the latency 6 s, and a 0.1 s call queued behind another under a 3 s
    timeout was shed, "a queue that needs about 6.000s to drain".)"""

    async def main(unwind: float) -> tuple[float | None, list[tuple[Status, str]]]:
        runner = _cut_off_then_quick(by, cut_at, unwind)
        calls = [ToolCall("s", "slow", {})]
        if by == "sibling":
            calls.append(ToolCall("f", "fails", {}))
        turn = runner.turn(calls)
        with trio.move_on_after(cut_at if by == "caller" else math.inf):
            await turn.run()
        assert turn.results[0].status is not Status.OK
        latency = runner.scope("api").expected_latency()
        later = await runner.run_turn(
            [ToolCall(f"q{i}", "quick", {"n": i}) for i in range(quick_calls)]
        )
        return latency, [(r.status, r.content) for r in later.results]

    def play(unwind: float) -> tuple[float | None, list[tuple[Status, str]]]:
        return trio.run(main, unwind, clock=trio.testing.MockClock(autojump_threshold=0))

    latency, answers = play(unwind)
    assert latency == cut_at
    assert answers == play(0.0)[1]


@settings(max_examples=20, deadline=None)
@given(
    idle=st.booleans(),
    unwind=st.sampled_from([0.0, 0.5, 5.0, 50.0]),
    quick_calls=st.integers(1, 4),
)
def test_calls_behind_a_cut_off_probe_go_when_it_is_cut_off_not_when_it_has_unwound(
    idle: bool, unwind: float, quick_calls: int
) -> None:
    """A learning scope's first calls probe it and the rest wait; probes cut off at 1 s
    (their own or idle timeout) let the rest go then, however long they unwind. (Let go
    only as the probes had unwound, 0.1 s calls under a 3 s timeout behind probes 5 s in
    closing were answered "no slot on scope 'api' came free within 2s", retry at once.)"""
    registry = Registry()
    cut = {"timeout": None, "idle_timeout": 1.0} if idle else {"timeout": 1.0}
    slow_to_unwind(registry, unwind, name="slow", scopes=["api"], **cut)

    @registry.tool(kind=Kind.READS, scopes=["api"], timeout=3)
    async def quick(n: int) -> str:
        await trio.sleep(0.1)
        return f"quick {n}"

    async def main() -> fanout.Turn:
        probes = [ToolCall(f"s{i}", "slow", {"n": i}) for i in range(2)]
        rest = [ToolCall(f"q{i}", "quick", {"n": i}) for i in range(quick_calls)]
        return await Runner(registry, turn_timeout=60).run_turn(probes + rest)

    turn = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [r.status for r in turn.results[:2]] == [Status.TIMED_OUT] * 2
    assert [r.content for r in turn.results[2:]] == [f"quick {i}" for i in range(quick_calls)]
    started = [e.time for e in turn.trace if e.kind is fanout.EventKind.STARTED]
    assert started[2:] == [1.0] * quick_calls


class _HungThenSlowToClose(httpx.AsyncBaseTransport):
    """A server's first ``hung`` requests never answer, and each takes ``closing`` seconds,
    shielded, to let go once cancelled; the rest are answered in 0.1 s."""

    def __init__(self, hung: int, closing: float) -> None:
        self.hung, self.closing = hung, closing

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.hung -= 1
        if self.hung >= 0:
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(self.closing)
        await trio.sleep(0.1)
        return httpx.Response(200, text=request.url.path)


@pytest.mark.parametrize("closing", [0.5, 5.0])
async def test_requests_slow_to_close_after_their_timeout_hold_no_later_call(
    closing: float, autojump_clock: Any
) -> None:
    """Behind two requests cut off at their 1 s timeout that take ``closing`` seconds to let
    go, a learning scope sends the rest at 1 s, and its latency is no longer than a call
    took until it was cut off. (Held until the two had let go, the rest were answered
    "no slot on scope 'api' came free within 2s", and the latency was 6 s.)"""
    client = fanout.http_client(_HungThenSlowToClose(hung=2, closing=closing))
    registry = Registry()

    @registry.tool(kind=Kind.READS, scopes=["api"], timeout=1)
    async def hangs(n: int) -> str:
        return (await client.get(f"http://api.test/hangs/{n}")).text

    @registry.tool(kind=Kind.READS, scopes=["api"], timeout=3)
    async def quick(n: int) -> str:
        return (await client.get(f"http://api.test/quick/{n}")).text

    calls = [ToolCall(f"h{i}", "hangs", {"n": i}) for i in range(2)]
    calls += [ToolCall(f"q{i}", "quick", {"n": i}) for i in range(3)]
    runner = Runner(registry, turn_timeout=60)
    turn = await runner.run_turn(calls)
    assert [r.status for r in turn.results[:2]] == [Status.TIMED_OUT] * 2
    assert [r.content for r in turn.results[2:]] == [f"/quick/{i}" for i in range(3)]
    started = [e.time for e in turn.trace if e.kind is fanout.EventKind.STARTED]
    assert started == [0.0, 0.0, 1.0, 1.0, 1.0]
    latency = runner.scope("api").expected_latency()
    assert latency is not None
    assert latency <= 1.0


class _LearnsBadly(fanout.Scope):
    """A scope of yours whose ``observe_call`` raises ``SystemExit`` (a metrics export
    that calls ``sys.exit`` on failure)."""

    def observe_call(self, seconds: float, **kwargs: Any) -> None:
        raise SystemExit(f"export of a {seconds:g}s call failed")


@pytest.mark.parametrize("hangs", [False, True])
async def test_a_scope_failing_to_observe_a_call_costs_no_call_its_answer(
    hangs: bool, autojump_clock: Any
) -> None:
    """A scope whose ``observe_call`` raises even ``SystemExit``, as the call ends or as
    its deadline cuts it off, leaves the call its own answer and its sibling theirs.
    (Raised on, it turned a write that had returned into "fanout failed ... not
    finished".)"""
    registry = Registry()

    @registry.tool(kind=Kind.MUTATING, scopes=["api"], timeout=1)
    async def write() -> str:
        if hangs:
            await trio.sleep_forever()
        return "written"

    @registry.tool(kind=Kind.READS, timeout=None)
    async def sibling() -> str:
        await trio.sleep(2)
        return "read"

    runner = Runner(registry, scopes=[_LearnsBadly("api", learn=False)])
    turn = await runner.run_turn([ToolCall("w", "write"), ToolCall("r", "sibling")])
    written, read = turn.results
    if hangs:
        assert written.status is Status.TIMED_OUT
        assert "own timeout of 1s passed" in json.loads(written.content)["message"]
    else:
        assert (written.status, written.content) == (Status.OK, "written")
    assert (read.status, read.content) == (Status.OK, "read")
