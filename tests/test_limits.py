"""Limits and budgets through the runner: rate, concurrency, retries, shedding, quotas."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from fanout import Kind, Registry, RetryBudget, RetryPolicy, Runner, Scope, Status, ToolCall

from .downstream import FakeAPI, max_in_window


def body(result: fanout.ToolResult) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(result.content)
    return parsed


def api_registry(
    api: FakeAPI, *, scopes: tuple[str, ...] = ("key",), timeout: float = 10
) -> Registry:
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=scopes, timeout=timeout)
    async def fetch(n: int) -> str:
        return await api.request()

    return reg


def fetches(n: int) -> list[ToolCall]:
    return [ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(n)]


async def test_throttled_fan_out_with_known_limits_sends_one_request_per_call(
    autojump_clock: Any,
) -> None:
    """3 through, then one per 0.2 s: calls 4 and 5 wait invisibly, no 429 is ever caused."""
    api = FakeAPI(rate=5, burst=3, retry_after=0.2)
    runner = Runner(api_registry(api), scopes=[Scope("key", rate=5, burst=3)])
    turn = await runner.run_turn(fetches(5))
    assert api.starts == [0, 0, 0, pytest.approx(0.2), pytest.approx(0.4)]
    assert api.starts[3] - api.starts[2] >= 0.2 - 1e-9
    assert api.throttled == []
    assert api.requests == 5
    assert all(r.status is Status.OK for r in turn.results)


async def test_unknown_limits_obey_retry_after_and_stay_invisible(autojump_clock: Any) -> None:
    """With no rate configured, 429s block the scope; retries wait Retry-After, inline."""
    api = FakeAPI(rate=5, burst=3, retry_after=0.2)
    runner = Runner(api_registry(api), rng=random.Random(1))
    turn = await runner.run_turn(fetches(5))
    assert all(r.status is Status.OK for r in turn.results)
    assert len(api.throttled) == 1
    # Nothing started inside the wait the server gave.
    refused = api.throttled[0]
    assert all(t >= refused + 0.2 - 1e-9 for t in api.starts if t > refused)
    waits = [e for e in turn.trace if e.kind is fanout.EventKind.RETRY_SCHEDULED]
    assert {e.wait for e in waits} == {0.2}


async def test_retry_after_beyond_the_budget_is_answered_not_slept(autojump_clock: Any) -> None:
    """A server wait longer than the call's remaining budget: rate_limited now, no retry sent."""
    api = FakeAPI(rate=0.1, burst=1, retry_after=30)
    runner = Runner(api_registry(api, timeout=5), inline_wait=None)
    turn = await runner.run_turn(fetches(2))
    first, second = turn.results
    assert first.status is Status.OK
    assert second.status is Status.RATE_LIMITED
    assert second.retry_after_ms == 30_000
    assert "past the call's deadline" in body(second)["message"]
    assert body(second)["started"] is True
    assert trio.current_time() == 0
    assert api.requests == 2


async def test_long_wait_is_surfaced_even_when_the_budget_allows(autojump_clock: Any) -> None:
    """A token wait above the inline threshold is answered rate_limited with retry_after_ms."""
    api = FakeAPI(rate=100, burst=100)
    runner = Runner(api_registry(api), scopes=[Scope("key", rate=0.25, burst=1)], inline_wait=2)
    turn = await runner.run_turn(fetches(2))
    assert turn.results[0].status is Status.OK
    later = turn.results[1]
    assert later.status is Status.RATE_LIMITED
    assert later.retry_after_ms == 4000
    assert later.scope == "key"
    assert body(later)["started"] is False
    assert body(later)["hint"].startswith("re-issue the same call after retry_after_ms")
    assert api.requests == 1


async def test_patient_runner_waits_as_long_as_the_budget_allows(autojump_clock: Any) -> None:
    """inline_wait=None: batch work sleeps any wait that fits the call's budget."""
    api = FakeAPI(rate=100, burst=100)
    runner = Runner(api_registry(api), scopes=[Scope("key", rate=0.25, burst=1)], inline_wait=None)
    turn = await runner.run_turn(fetches(3))
    assert [r.status for r in turn.results] == [Status.OK, Status.OK, Status.OK]
    assert api.starts == [0, 4, 8]


@settings(max_examples=60, deadline=None)
@given(
    rate=st.sampled_from([1.0, 2.0, 5.0, 8.0]),
    burst=st.integers(1, 5),
    cap=st.integers(1, 4),
    calls=st.integers(1, 25),
    latency=st.sampled_from([0.0, 0.1, 0.5, 1.5]),
)
def test_starts_never_exceed_burst_plus_rate_times_window(
    rate: float, burst: int, cap: int, calls: int, latency: float
) -> None:
    """Over any window T, starts <= burst + rate*T, and in-flight never exceeds the cap."""
    api = FakeAPI(rate=1000, burst=1000, latency=latency)
    runner = Runner(
        api_registry(api, timeout=1000),
        scopes=[Scope("key", rate=rate, burst=burst, max_concurrency=cap, max_waiters=None)],
        inline_wait=None,
        turn_timeout=1000,
    )

    async def main() -> None:
        await runner.run_turn(fetches(calls))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(api.starts) == calls
    for window in (0.1, 0.5, 1.0, 2.5, 10.0):
        assert max_in_window(api.starts, window) <= burst + rate * window + 1e-9
    assert api.peak_in_flight <= cap


async def test_two_tools_on_one_key_share_its_bucket(autojump_clock: Any) -> None:
    """One API key's limit is shared by every tool using it; another key is independent."""
    api = FakeAPI(rate=1000, burst=1000)
    reg = Registry()
    for name, key in (("search", "key-a"), ("lookup", "key-a"), ("other", "key-b")):

        async def tool(n: int) -> str:
            return await api.request()

        reg.add(tool, name=name, kind=Kind.READS, scopes=[key])
    runner = Runner(reg, scopes=[Scope("key-a", rate=1, burst=1), Scope("key-b", rate=1, burst=1)])
    turn = await runner.run_turn(
        [
            ToolCall("s", "search", {"n": 1}),
            ToolCall("l", "lookup", {"n": 2}),
            ToolCall("o", "other", {"n": 3}),
        ]
    )
    started = {e.call_id: e.time for e in turn.trace if e.kind is fanout.EventKind.STARTED}
    assert sorted(started.values()) == [0, 0, 1]
    assert started["o"] == 0
    assert {started["s"], started["l"]} == {0, 1}


async def test_full_jitter_spreads_a_retry_wave(autojump_clock: Any) -> None:
    """Twenty calls failing together retry at distinct instants in every quarter of [0, 1] s."""
    attempts: dict[str, int] = {}
    retry_starts: list[float] = []
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def flaky(n: int) -> str:
        attempts[str(n)] = attempts.get(str(n), 0) + 1
        if attempts[str(n)] == 1:
            raise fanout.TransientError("connection reset")
        retry_starts.append(trio.current_time())
        return "ok"

    policy = RetryPolicy(attempts=2, base=1.0, cap=1.0, jitter="full")
    runner = Runner(reg, retry=policy, rng=random.Random(7))
    turn = await runner.run_turn([ToolCall(f"c{i}", "flaky", {"n": i}) for i in range(20)])
    assert all(r.status is Status.OK for r in turn.results)
    assert len(set(retry_starts)) == 20
    assert all(0 <= t <= 1.0 for t in retry_starts)
    assert {int(t * 4) for t in retry_starts} == {0, 1, 2, 3}


@pytest.mark.parametrize(("jitter", "low", "high"), [("equal", 0.5, 1.0), ("none", 1.0, 1.0)])
def test_equal_and_no_jitter_bounds(jitter: Any, low: float, high: float) -> None:
    """Equal jitter stays in [ceiling/2, ceiling]; none is the ceiling itself."""
    policy = RetryPolicy(base=0.5, cap=10, jitter=jitter)
    rng = random.Random(3)
    waits = [policy.backoff(1, rng) for _ in range(200)]
    assert all(low <= w <= high for w in waits)


async def test_cancel_while_holding_a_slot_gives_the_slot_back(autojump_clock: Any) -> None:
    """A call cancelled mid-flight releases its slot; the scope shows nothing in flight."""
    scope = Scope("key", max_concurrency=1)
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["key"])
    async def slow() -> str:
        await trio.sleep(10)
        return "done"

    runner = Runner(reg, scopes=[scope])
    with trio.move_on_after(1):
        await runner.run_turn([ToolCall("a", "slow", {})])
    assert scope.statistics().in_flight == 0
    turn = await runner.run_turn([ToolCall("b", "slow", {})])
    assert turn.results[0].status is Status.OK


async def test_cancel_while_waiting_for_a_token_refunds_it(autojump_clock: Any) -> None:
    """A call cancelled during its token wait hands the token back: the bucket is as before."""
    scope = Scope("key", rate=1, burst=1)
    api = FakeAPI(rate=1000, burst=1000)
    runner = Runner(api_registry(api), scopes=[scope])
    await runner.run_turn(fetches(1))
    with trio.move_on_after(0.5):
        await runner.run_turn([ToolCall("w", "fetch", {"n": 9})])
    stats = scope.statistics()
    assert stats.bucket.refunded == 1
    assert stats.waiting == 0
    assert scope.bucket.wait_for() == pytest.approx(0.5)
    assert api.requests == 1


async def test_shedding_answers_the_excess_at_once_with_an_honest_estimate(
    autojump_clock: Any,
) -> None:
    """Beyond max_waiters a call is answered now; re-issued at the hinted time it is admitted."""
    scope = Scope("key", max_concurrency=1, max_waiters=2)
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["key"])
    async def work(n: int) -> str:
        await trio.sleep(1)
        return f"done {n}"

    runner = Runner(reg, scopes=[scope], inline_wait=None)
    turn = await runner.run_turn([ToolCall(f"c{i}", "work", {"n": i}) for i in range(5)])
    statuses = [r.status for r in turn.results]
    assert statuses.count(Status.OK) == 3
    shed = [r for r in turn.results if r.status is Status.RATE_LIMITED]
    assert len(shed) == 2
    for result in shed:
        assert body(result)["started"] is False
        assert "full queue" in body(result)["message"]
    shed_events = [e for e in turn.trace if e.kind is fanout.EventKind.SHED]
    assert [e.time for e in shed_events] == [0, 0]
    assert trio.current_time() == 3
    # The estimate is when the queue ahead drains: one running and two waiting, 1 s each.
    assert {r.retry_after_ms for r in shed} == {3000}

    # Re-issue when told, against a fresh queue in the same state: admitted, not shed.
    again = await runner.run_turn([ToolCall(f"d{i}", "work", {"n": i}) for i in range(3)])
    assert [r.status for r in again.results] == [Status.OK] * 3


async def test_quota_exhaustion_stops_that_scope_only(autojump_clock: Any) -> None:
    """After a quota error, calls on that scope are answered at once; other scopes go on."""
    sent: list[str] = []
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["metered"])
    async def metered(n: int) -> str:
        sent.append(f"metered {n}")
        raise fanout.QuotaExhaustedError("monthly quota used up", reset_after=7200)

    @reg.tool(kind=Kind.READS, scopes=["free"])
    async def free(n: int) -> str:
        sent.append(f"free {n}")
        return "ok"

    hooks: list[fanout.Event] = []

    class Watch:
        def on_event(self, event: fanout.Event) -> None:
            if event.kind is fanout.EventKind.SCOPE_EXHAUSTED:
                hooks.append(event)

    runner = Runner(reg, instruments=[Watch()])
    first = await runner.run_turn([ToolCall("m1", "metered", {"n": 1})])
    assert first.results[0].status is Status.QUOTA_EXHAUSTED
    assert [e.scope for e in hooks] == ["metered"]
    second = await runner.run_turn(
        [ToolCall("m2", "metered", {"n": 2}), ToolCall("f1", "free", {"n": 1})]
    )
    assert [r.status for r in second.results] == [Status.QUOTA_EXHAUSTED, Status.OK]
    assert second.results[0].retry_after_ms == 7_200_000
    assert sent == ["metered 1", "free 1"]
    await trio.sleep(7200)
    third = await runner.run_turn([ToolCall("m3", "metered", {"n": 3})])
    assert sent[-1] == "metered 3"
    assert third.results[0].status is Status.QUOTA_EXHAUSTED


async def test_server_wait_beyond_the_horizon_is_an_exhausted_quota(autojump_clock: Any) -> None:
    """A Retry-After of hours marks the scope exhausted instead of being retried."""
    api = FakeAPI(rate=1, burst=1, retry_after=5 * 3600)
    runner = Runner(api_registry(api), scopes=[Scope("key", quota_horizon=3600)])
    turn = await runner.run_turn(fetches(3))
    assert [r.status for r in turn.results] == [
        Status.OK,
        Status.QUOTA_EXHAUSTED,
        Status.QUOTA_EXHAUSTED,
    ]
    assert api.requests <= 3


async def test_retries_stay_within_the_retry_budget(autojump_clock: Any) -> None:
    """Against a downstream that always fails, retries are bounded by floor + ratio * requests."""
    sent: list[float] = []
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["key"])
    async def down(n: int) -> str:
        sent.append(trio.current_time())
        raise fanout.TransientError("503 Service Unavailable")

    scope = Scope("key", retry_budget=RetryBudget(ratio=0.1, floor=2, window=60))
    runner = Runner(reg, scopes=[scope], retry=RetryPolicy(attempts=5, base=0.01))
    turn = await runner.run_turn([ToolCall(f"c{i}", "down", {"n": i}) for i in range(20)])
    stats = scope.statistics()
    assert stats.retries <= 2 + 0.1 * stats.requests
    assert len(sent) == 20 + stats.retries
    refused = [r for r in turn.results if "retry budget" in body(r)["message"]]
    assert refused
    assert all(body(r)["started"] is True for r in turn.results)


async def test_cost_larger_than_the_burst_is_refused_clearly(autojump_clock: Any) -> None:
    """A call that could never fit the bucket is refused at once, not left waiting forever."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["llm"], cost=lambda args: float(args["tokens"]))
    async def summarise(tokens: int) -> str:
        return "summary"

    runner = Runner(reg, scopes=[Scope("llm", rate=100, burst=1000)])
    turn = await runner.run_turn(
        [
            ToolCall("small", "summarise", {"tokens": 600}),
            ToolCall("huge", "summarise", {"tokens": 5000}),
        ]
    )
    small, huge = turn.results
    assert small.status is Status.OK
    assert huge.status is Status.REFUSED
    assert "can never start" in body(huge)["message"]


async def test_weighted_calls_draw_down_the_bucket_by_cost(autojump_clock: Any) -> None:
    """Two calls of cost 600 on a burst of 1000 at 100/s: the second waits 2 s."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["llm"], cost=600)
    async def summarise(n: int) -> str:
        return "summary"

    runner = Runner(reg, scopes=[Scope("llm", rate=100, burst=1000)])
    turn = await runner.run_turn([ToolCall(f"s{i}", "summarise", {"n": i}) for i in range(2)])
    started = [e.time for e in turn.trace if e.kind is fanout.EventKind.STARTED]
    assert started == [0, 2]


async def test_acquisition_order_is_global_so_crossed_scopes_cannot_deadlock(
    autojump_clock: Any,
) -> None:
    """Tools declaring two scopes in opposite orders still all finish."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["a", "b"])
    async def ab(n: int) -> str:
        await trio.sleep(1)
        return "ab"

    @reg.tool(kind=Kind.READS, scopes=["b", "a"])
    async def ba(n: int) -> str:
        await trio.sleep(1)
        return "ba"

    scopes = [Scope("a", max_concurrency=1), Scope("b", max_concurrency=1)]
    runner = Runner(reg, scopes=scopes, inline_wait=None)
    calls = [ToolCall(f"c{i}", "ab" if i % 2 else "ba", {"n": i}) for i in range(6)]
    turn = await runner.run_turn(calls)
    assert all(r.status is Status.OK for r in turn.results)
    assert trio.current_time() == 6


def test_littles_law_sizes_the_concurrency_cap() -> None:
    """10 req/s at 400 ms keeps 4 in flight."""
    assert fanout.concurrency_for(rate=10, latency=0.4) == 4
    assert fanout.concurrency_for(rate=50, latency=0.05) == 3
    assert fanout.concurrency_for(rate=1, latency=0.01) == 1
    with pytest.raises(fanout.ConfigurationError):
        fanout.concurrency_for(rate=0, latency=1)


async def test_unreachable_limiter_fails_closed(autojump_clock: Any) -> None:
    """A limiter that raises LimiterUnavailableError answers rate_limited; the tool never runs."""
    ran: list[int] = []

    class DownScope(Scope):
        async def reserve(self, cost: float, max_wait: float) -> float | None:
            raise fanout.LimiterUnavailableError("redis did not answer within 0.25s")

    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["shared"])
    async def fetch(n: int) -> str:
        ran.append(n)
        return "ok"

    runner = Runner(reg, scopes=[DownScope("shared")])
    turn = await runner.run_turn([ToolCall("a", "fetch", {"n": 1})])
    (result,) = turn.results
    assert result.status is Status.REFUSED
    assert result.scope == "limiter unavailable"
    assert body(result)["started"] is False
    assert ran == []


async def test_free_slot_is_taken_even_with_no_time_to_wait(autojump_clock: Any) -> None:
    """inline_wait=0 still admits a call whose slot and token are free right now."""
    api = FakeAPI(rate=1000, burst=1000)
    scope = Scope("key", rate=10, burst=1, max_concurrency=1)
    runner = Runner(api_registry(api), scopes=[scope], inline_wait=0)
    turn = await runner.run_turn(fetches(2))
    assert [r.status for r in turn.results] == [Status.OK, Status.RATE_LIMITED]
    assert api.requests == 1


async def test_a_call_that_would_finish_past_its_deadline_is_not_sent(autojump_clock: Any) -> None:
    """Calls take 1 s; one whose token comes too late to finish in time is answered, not sent."""
    api = FakeAPI(rate=1000, burst=1000, latency=1.0)
    runner = Runner(api_registry(api, timeout=2.5), scopes=[Scope("key", rate=1, burst=1)])
    first = await runner.run_turn(fetches(1))
    assert first.results[0].status is Status.OK
    turn = await runner.run_turn(fetches(3))
    statuses = [r.status for r in turn.results]
    # The turn starts at 1 s with deadlines at 3.5 s; tokens come at 1, 2 and 3 s, and a
    # call started at 3 s would end at 4 s.
    assert statuses == [Status.OK, Status.OK, Status.RATE_LIMITED]
    assert "would end past its deadline" in body(turn.results[2])["message"]
    assert api.starts == [0, 1, 2]


async def test_a_told_call_whose_token_comes_too_late_for_any_call_seen_is_not_sent(
    autojump_clock: Any,
) -> None:
    """Told 10/s (burst 10), calls of 0.12 s, 2 s deadlines: at t=0 no latency is known, so
    the 29th call books its token for 1.9 s. By then every call seen took 0.12 s, and one
    sent at 1.9 s would be cut off at 2.0 s: it is answered at 1.9 s instead, never sent."""
    api = FakeAPI(rate=1000, burst=1000, latency=0.12)
    runner = Runner(api_registry(api, timeout=2), scopes=[Scope("key", rate=10, burst=10)])
    turn = await runner.run_turn(fetches(30))
    statuses = [r.status for r in turn.results]
    assert statuses == [Status.OK] * 28 + [Status.RATE_LIMITED] * 2
    assert api.starts == [0] * 10 + [pytest.approx(0.1 * k) for k in range(1, 19)]
    answered = {e.call_id: e.time for e in turn.trace if e.kind.value == "answered"}
    assert answered["c28"] == pytest.approx(1.9)
    assert body(turn.results[28])["message"] == (
        "scope 'key' allows this call now, but the quickest call there took 0.120s and it "
        "would end past its deadline; the call was not sent"
    )
    assert answered["c29"] == 0  # its token, at 2.0 s, is past the deadline
