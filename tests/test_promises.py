"""Regression tests for the ways promises 1 and 2 were seen to break, one repro each."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import trio

import fanout
from fanout import Kind, Registry, Run, Runner, Status, ToolCall
from fanout.idempotency import (
    Claim,
    MemoryIdempotencyStore,
    ReadCache,
    StoredAnswer,
    idempotency_key,
)
from tests.unwinding import slow_to_unwind


def body(result: fanout.ToolResult) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(result.content)
    return parsed


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")

    def __repr__(self) -> str:
        raise RuntimeError("no")


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise ValueError("__str__ raised")


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ({1: "a", "b": 2}, '{"1":"a","b":2}'),
        ({(1, 2): "t", "k": 0}, '{"(1, 2)":"t","k":0}'),
        ({None: 1, "x": 2}, '{"null":1,"x":2}'),
        ([Unprintable()], '["<unprintable Unprintable>"]'),
        ({"f": math.inf, "n": math.nan}, '{"f":"Infinity","n":"NaN"}'),
        ("lone \ud800 surrogate", "lone \ufffd surrogate"),
        (frozenset({3, 1, 2}), "[1,2,3]"),
    ],
)
async def test_hostile_output_is_an_ok_answer_of_valid_json(
    output: Any, expected: str, autojump_clock: Any
) -> None:
    """Mixed keys, tuple keys, unprintables, NaN, surrogates: an ok answer, siblings intact."""
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def hostile() -> Any:
        return output

    @reg.tool(kind=Kind.READS)
    async def sibling() -> str:
        return "fine"

    turn = await Runner(reg).run_turn([ToolCall("a", "hostile"), ToolCall("b", "sibling")])
    first, second = turn.results
    assert (first.status, first.content) == (Status.OK, expected)
    assert (second.status, second.content) == (Status.OK, "fine")


async def test_sync_tool_returning_unserialisable_output_is_answered() -> None:
    """A sync tool's self-containing output is an error answer; an object is its text.

    Real time: worker threads would let an autojumping clock skip to the deadline.
    """
    reg = Registry()

    @reg.tool(kind=Kind.PURE)
    def loop() -> Any:
        looped: list[Any] = []
        looped.append(looped)
        return looped

    @reg.tool(kind=Kind.PURE)
    def thing() -> Any:
        return object.__new__(Unprintable)

    turn = await Runner(reg).run_turn([ToolCall("a", "loop"), ToolCall("b", "thing")])
    looped, text = turn.results
    assert looped.status is Status.ERROR
    assert "contains itself" in body(looped)["message"]
    assert (text.status, text.content) == (Status.OK, '"<unprintable Unprintable>"')


async def test_exception_whose_str_raises_is_described_by_its_type(autojump_clock: Any) -> None:
    """A tool raising an exception that cannot be printed is answered error, named by type."""
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def bad() -> str:
        raise UnprintableError()

    (result,) = (await Runner(reg).run_turn([ToolCall("a", "bad")])).results
    assert result.status is Status.ERROR
    assert body(result)["message"].startswith("UnprintableError")


async def test_tool_raising_base_exceptions_does_not_crash_the_turn(autojump_clock: Any) -> None:
    """SystemExit and a group of errors from a tool are that call's error answers."""
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def exits() -> str:
        raise SystemExit(3)

    @reg.tool(kind=Kind.READS)
    async def group() -> str:
        raise ExceptionGroup("two", [ValueError("a"), KeyError("b")])

    turn = await Runner(reg).run_turn([ToolCall("a", "exits"), ToolCall("b", "group")])
    assert [r.status for r in turn.results] == [Status.ERROR, Status.ERROR]
    assert body(turn.results[0])["message"].startswith("SystemExit")


@pytest.mark.parametrize("wait", [-1, -1e-9])
async def test_negative_retry_after_retries_at_once(wait: float, autojump_clock: Any) -> None:
    """RateLimitedError(retry_after<0) means "now": the retry is made at once, no crash."""
    reg = Registry()
    attempts: list[float] = []

    @reg.tool(kind=Kind.READS)
    async def flaky() -> str:
        attempts.append(trio.current_time())
        if len(attempts) == 1:
            raise fanout.RateLimitedError(retry_after=wait)
        return "ok"

    (result,) = (await Runner(reg).run_turn([ToolCall("a", "flaky")])).results
    assert result.status is Status.OK
    assert attempts == [0.0, 0.0]


@pytest.mark.parametrize(
    "signal",
    [
        fanout.RateLimitedError(retry_after=1e308),
        fanout.QuotaExhaustedError(reset_after=1e306),
        fanout.QuotaExhaustedError(reset_after=math.inf),
    ],
)
async def test_absurd_waits_are_capped_at_a_week(
    signal: fanout.ToolSignal, autojump_clock: Any
) -> None:
    """A wait of 1e308 s exhausts the quota, answered with retry_after_ms capped at a week."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def spent() -> str:
        raise signal

    (result,) = (await Runner(reg).run_turn([ToolCall("a", "spent")])).results
    assert result.status is Status.QUOTA_EXHAUSTED
    assert result.retry_after_ms == 7 * 24 * 3600 * 1000


async def test_retry_not_sent_when_latency_says_it_would_end_late(autojump_clock: Any) -> None:
    """0.5 s left after the backoff, calls take 0.8 s: the retry is not sent."""
    reg = Registry()
    attempts: list[float] = []

    @reg.tool(kind=Kind.READS, scopes=["api"], timeout=1.4)
    async def slow_then_throttled() -> str:
        attempts.append(trio.current_time())
        await trio.sleep(0.8)
        raise fanout.RateLimitedError(retry_after=0.1)

    (result,) = (await Runner(reg).run_turn([ToolCall("a", "slow_then_throttled")])).results
    assert attempts == [0.0]
    assert result.status is Status.RATE_LIMITED
    assert "would end past its deadline" in body(result)["message"]
    assert trio.current_time() == 0.8


class FailingStore(MemoryIdempotencyStore):
    async def claim(self, key: str, *, lease: float) -> Claim:
        raise fanout.LimiterUnavailableError("Redis port closed")


class HangingStore(MemoryIdempotencyStore):
    async def claim(self, key: str, *, lease: float) -> Claim:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


class SlowSettlingStore(MemoryIdempotencyStore):
    async def finish(self, key: str, answer: StoredAnswer, *, ttl: float) -> None:
        await trio.sleep(10)


def _write_registry(ran: list[str], *, timeout: float = 5.0) -> Registry:
    reg = Registry()

    @reg.tool(kind=Kind.MUTATING, timeout=timeout)
    async def write(key: str) -> str:
        ran.append(key)
        await trio.sleep(1)
        return f"wrote {key}"

    return reg


async def test_store_that_fails_refuses_the_write(autojump_clock: Any) -> None:
    """claim raising LimiterUnavailableError: the write is refused, not run, nothing escapes."""
    ran: list[str] = []
    turn = await Runner(_write_registry(ran)).run_turn(
        [ToolCall("w", "write", {"key": "k"})], run=Run(store=FailingStore())
    )
    (result,) = turn.results
    assert result.status is Status.REFUSED
    assert body(result)["started"] is False
    assert ran == []


async def test_store_that_hangs_times_the_write_out_at_its_deadline(autojump_clock: Any) -> None:
    """claim never answering: the write is answered timed_out at its own deadline, not run."""
    ran: list[str] = []
    turn = await Runner(_write_registry(ran, timeout=2)).run_turn(
        [ToolCall("w", "write", {"key": "k"})], run=Run(store=HangingStore())
    )
    assert turn.results[0].status is Status.TIMED_OUT
    assert ran == []
    assert trio.current_time() == 2


async def test_slow_store_never_holds_the_turn_past_its_deadline(autojump_clock: Any) -> None:
    """Settling a write's answer is bounded by the call's deadline, shielded or not."""
    ran: list[str] = []
    runner = Runner(_write_registry(ran), turn_timeout=3)
    turn = await runner.run_turn(
        [ToolCall("w", "write", {"key": "k"})], run=Run(store=SlowSettlingStore())
    )
    assert turn.results[0].status is Status.OK
    assert trio.current_time() == 2.0  # the write took 1 s; settling got at most 1 s more


async def test_claim_of_a_dead_holder_lapses_with_its_lease(autojump_clock: Any) -> None:
    """A claimant that died never renews: the key is free within its lease, not a day."""
    ran: list[str] = []
    run = Run(claim_lease=3.0)
    key = idempotency_key(run.run_id, "write", {"key": "k"})
    await run.store.claim(key, lease=3.0)  # a process that then died
    runner = Runner(_write_registry(ran, timeout=10), inline_wait=None)
    turn = await runner.run_turn([ToolCall("w", "write", {"key": "k"})], run=run)
    assert turn.results[0].status is Status.OK
    assert ran == ["k"]
    assert 3.0 <= trio.current_time() <= 5.0


async def test_a_long_write_keeps_its_claim_by_renewing_it(autojump_clock: Any) -> None:
    """A write running past its lease still holds its key: an identical call waits for it."""
    ran: list[str] = []
    reg = Registry()

    @reg.tool(kind=Kind.MUTATING, timeout=None)
    async def long_write(key: str) -> str:
        ran.append(key)
        await trio.sleep(10)
        return "done"

    run = Run(claim_lease=1.0)
    runner = Runner(reg, inline_wait=None)
    turns: list[fanout.Turn] = []

    async def play(call_id: str) -> None:
        turns.append(
            await runner.run_turn([ToolCall(call_id, "long_write", {"key": "k"})], run=run)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(play, "first")
        await trio.sleep(0.5)
        nursery.start_soon(play, "second")
    assert ran == ["k"]
    assert [t.results[0].content for t in turns] == ["done", "done"]


async def test_no_tool_body_runs_once_siblings_are_cancelled(autojump_clock: Any) -> None:
    """cancel_siblings triggered before phase 1 (bad arguments): no body runs, started false."""
    reg = Registry()
    ran: list[str] = []

    @reg.tool(kind=Kind.READS)
    async def free() -> str:
        ran.append("free")
        await trio.sleep(1)
        return "ran"

    runner = Runner(reg, on_failure="cancel_siblings")
    turn = await runner.run_turn([ToolCall("bad", "free", "{not json"), ToolCall("a", "free")])
    bad, other = turn.results
    assert bad.status is Status.ERROR
    assert other.status is Status.CANCELLED
    assert body(other)["started"] is False
    assert ran == []


async def test_no_tool_body_runs_once_the_caller_cancelled(autojump_clock: Any) -> None:
    """A turn run inside an already-cancelled scope runs no body and says the caller cancelled."""
    reg = Registry()
    ran: list[str] = []

    @reg.tool(kind=Kind.READS)
    async def free() -> str:
        ran.append("free")
        return "ran"

    turn = Runner(reg).turn([ToolCall("a", "free")])
    with trio.CancelScope() as scope:
        scope.cancel()
        await turn.run()
    assert ran == []
    assert turn.results[0].status is Status.CANCELLED
    assert body(turn.results[0])["message"] == "the caller cancelled the turn"
    assert body(turn.results[0])["started"] is False


async def test_a_failure_inside_fanout_is_answered_not_blamed_on_the_caller(
    autojump_clock: Any,
) -> None:
    """A run whose cache breaks: a write, which drops the cache as it starts, is answered
    error naming fanout, and its sibling is fine. A read whose answer the cache cannot
    keep is answered with the tool's own answer, given before fanout went to keep it."""

    class BrokenCache(ReadCache):
        def put(self, key: str, tool: str, content: str, ttl: float, *, since: int = -1) -> None:
            raise OSError("disk full")

        def invalidate(self, tools: Any) -> int:
            raise OSError("disk full")

    reg = Registry()

    @reg.tool(kind=Kind.READS, cache_ttl=60)
    async def cached() -> str:
        return "value"

    @reg.tool(kind=Kind.MUTATING)
    async def write() -> str:
        return "written"

    @reg.tool(kind=Kind.READS)
    async def plain() -> str:
        return "fine"

    run = Run()
    run.cache = BrokenCache()
    calls = [ToolCall("w", "write"), ToolCall("a", "cached"), ToolCall("b", "plain")]
    turn = await Runner(reg).run_turn(calls, run=run)
    broken, kept, fine = turn.results
    assert broken.status is Status.ERROR
    assert "fanout failed while handling this call (OSError: disk full)" in body(broken)["message"]
    assert body(broken)["started"] is False
    assert (kept.status, kept.content) == (Status.OK, "value")
    assert fine.status is Status.OK


async def test_answers_are_written_at_the_deadline_not_after_unwinding(
    autojump_clock: Any,
) -> None:
    """A call whose unwinding takes 5 s is answered at its deadline; the turn waits for it."""
    reg = Registry()
    slow_to_unwind(reg, 5, name="slow_to_stop", timeout=1)

    turn = await Runner(reg, turn_timeout=10).run_turn([ToolCall("a", "slow_to_stop")])
    (answered,) = [e for e in turn.trace if e.kind is fanout.EventKind.ANSWERED]
    assert answered.time == 1.0
    assert turn.results[0].status is Status.TIMED_OUT


@pytest.mark.parametrize("timeout", [0, -1, math.nan, -math.inf, math.inf, "2", True])
def test_per_turn_timeout_is_validated(timeout: Any) -> None:
    """Runner.turn(timeout=...) fails closed like Runner(turn_timeout=...)."""
    with pytest.raises(fanout.ConfigurationError):
        Runner(Registry()).turn([], timeout=timeout)


async def test_mixed_type_argument_keys_are_answered(autojump_clock: Any) -> None:
    """A call whose arguments mix key types builds a turn and gets an error answer."""
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def t(x: int = 0) -> str:
        return "ok"

    turn = await Runner(reg).run_turn([ToolCall("a", "t", {1: "a", "x": 2})])
    assert turn.results[0].status is Status.ERROR


@pytest.mark.parametrize(
    "options",
    [{"ratio": -5}, {"floor": -1}, {"window": math.nan}, {"window": 0}, {"ratio": math.inf}],
)
def test_retry_budget_rejects_impossible_values(options: dict[str, float]) -> None:
    """RetryBudget's numbers fail closed with ConfigurationError."""
    with pytest.raises(fanout.ConfigurationError):
        fanout.RetryBudget(**options)


def test_every_exception_fanout_raises_is_a_fanout_error() -> None:
    """A turn run twice raises UsageError, under the one exception root."""
    assert issubclass(fanout.UsageError, fanout.FanoutError)

    async def main() -> None:
        turn = Runner(Registry()).turn([])
        await turn.run()
        with pytest.raises(fanout.FanoutError):
            await turn.run()

    trio.run(main)


async def test_an_open_runner_returns_the_turn_before_calls_finish_unwinding(
    autojump_clock: Any,
) -> None:
    """With `async with runner`, a turn returns at its deadline; unwinding ends in the runner."""
    reg = Registry()
    slow_to_unwind(reg, 5, name="slow_to_stop", timeout=None)

    async with Runner(reg, turn_timeout=2) as runner:
        turn = await runner.run_turn(
            [ToolCall(f"c{i}", "slow_to_stop", {"n": i}) for i in range(3)]
        )
        returned = trio.current_time()
    closed = trio.current_time()
    assert returned == 2.0
    assert closed == 7.0
    assert [r.status for r in turn.results] == [Status.TIMED_OUT] * 3
    assert {e.time for e in turn.trace if e.kind is fanout.EventKind.ANSWERED} == {2.0}


async def test_an_open_runner_still_answers_a_cancelling_caller(autojump_clock: Any) -> None:
    """The caller cancelling a turn of an open runner gets every call answered, cancelled."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, timeout=None)
    async def hang(n: int) -> str:
        await trio.sleep_forever()
        return "unreachable"

    async with Runner(reg, turn_timeout=10) as runner:
        turn = runner.turn([ToolCall(f"c{i}", "hang", {"n": i}) for i in range(3)])
        with trio.move_on_after(1):
            await turn.run()
    assert trio.current_time() == 1.0
    assert [body(r)["message"] for r in turn.results] == ["the caller cancelled the turn"] * 3
