"""Admission's promise 2 at a full scope: a slot wait ends at the budget, and the call says why.

Each call waits for a slot only as long as its budget allows: the inline
threshold (``rate_limited``, with a drain estimate to retry after) or, when
it is patient, its own deadline (``timed_out``); either way it was never
sent. A call on several scopes takes its tokens on all of them as it starts,
and an answer's counts go to the scope told the limit they state. Times are
exact, on the mock clock.
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from fanout import EventKind, FanoutTransport, Kind, Registry, Runner, Scope, Status, ToolCall
from fanout.testing import ServerConfig, serve_throttled


def _registry(started: list[tuple[str, float]]) -> Registry:
    registry = Registry()

    @registry.tool(kind=Kind.READS, scopes=["api"], timeout=2)
    async def hold(name: str, seconds: float) -> str:
        started.append((name, trio.current_time()))
        await trio.sleep(seconds)
        return name

    return registry


def _calls() -> list[ToolCall]:
    return [
        ToolCall("first", "hold", {"name": "first", "seconds": 1.5}),
        ToolCall("second", "hold", {"name": "second", "seconds": 0}),
    ]


async def test_a_slot_wait_past_the_inline_threshold_is_answered_rate_limited(
    autojump_clock: Any,
) -> None:
    """One slot, held 1.5 s: the second call waits 0.5 s (the inline threshold), is answered
    rate_limited with a time to retry, and never starts."""
    started: list[tuple[str, float]] = []
    scope = Scope("api", max_concurrency=1, learn=False)
    runner = Runner(_registry(started), scopes=[scope], inline_wait=0.5)
    turn = await runner.run_turn(_calls())
    first, second = turn.results
    assert first.status is Status.OK
    assert (second.status, second.scope) == (Status.RATE_LIMITED, "api")
    assert second.retry_after_ms is not None
    body = json.loads(second.content)
    assert body["message"] == "no slot on scope 'api' came free within 0.5s; the call was not sent"
    assert body["started"] is False
    answered = {e.call_id: e.time for e in turn.trace if e.kind.value == "answered"}
    assert answered == {"second": 0.5, "first": 1.5}
    assert started == [("first", 0.0)]
    assert scope.statistics().in_flight == 0


async def test_a_patient_call_waits_for_the_slot_within_its_deadline(autojump_clock: Any) -> None:
    """inline_wait=None: the second call waits for the slot (up to its own 2 s deadline); the
    first frees it at 1.5 s, and the second starts then."""
    started: list[tuple[str, float]] = []
    scope = Scope("api", max_concurrency=1, learn=False)
    runner = Runner(_registry(started), scopes=[scope], inline_wait=None)
    turn = await runner.run_turn(_calls())
    assert [r.status for r in turn.results] == [Status.OK, Status.OK]
    assert started == [("first", 0.0), ("second", 1.5)]


def test_a_slot_wait_cut_by_the_deadline_has_one_answer_on_every_run() -> None:
    """The slot wait and the turn's deadline watcher wake at the same instant, in an order trio
    picks at random: the answer is the deadline's, the same on every run, in either nursery."""

    async def play(hosted: bool) -> tuple[str, ...]:
        started: list[tuple[str, float]] = []
        scope = Scope("api", max_concurrency=1, learn=False)
        runner = Runner(_registry(started), scopes=[scope], inline_wait=None)
        calls = [ToolCall("first", "hold", {"name": "first", "seconds": 3}), _calls()[1]]
        if hosted:
            async with runner:
                turn = await runner.run_turn(calls)
        else:
            turn = await runner.run_turn(calls)
        assert started == [("first", 0.0)]
        return tuple(result.content for result in turn.results)

    answers = {
        trio.run(play, hosted, clock=trio.testing.MockClock(autojump_threshold=0))
        for hosted in (False, True)
        for _ in range(12)
    }
    assert len(answers) == 1
    (first, second) = (json.loads(content) for content in answers.pop())
    assert first["status"] == second["status"] == "timed_out"
    assert (second["message"], second["started"]) == ("the call's own timeout of 2s passed", False)


# -- a call on several scopes ---------------------------------------------------------


@attrs.frozen
class _Told:
    """A scope as told: a bucket (``rate``, ``burst``) or a window (``limit`` per ``per``)."""

    name: str
    rate: float | None = None
    burst: int | None = None
    limit: int | None = None
    per: float | None = None

    def scope(self) -> Scope:
        if self.limit is not None:
            return Scope(self.name, limit=self.limit, per=self.per)
        return Scope(self.name, rate=self.rate, burst=self.burst)

    def most_between(self, span: float) -> float:
        """The most starts this scope allows in a closed interval ``span`` long."""
        if self.limit is not None:
            assert self.per is not None
            return self.limit * (math.floor(span / self.per + 1e-9) + 1)
        assert self.rate is not None
        assert self.burst is not None
        return self.burst + self.rate * span


def _toward(started: list[float], told: _Told) -> None:
    """Every interval of the starts holds no more than ``told`` allows."""
    started = sorted(started)
    for i, first in enumerate(started):
        for j in range(i, len(started)):
            assert j - i + 1 <= told.most_between(started[j] - first) + 1e-6, (told, i, j)


async def _started_on(
    scopes: list[_Told], calls: int | list[str], cap: int | None = None
) -> list[float] | dict[str, list[float]]:
    """When each call started: ``calls`` of a tool on every scope, or one call of each
    tool named in ``calls`` ("both", or a scope's name: that scope alone), then by scope.
    ``cap``: the first scope's ``max_concurrency``."""
    registry = Registry()
    names = [told.name for told in scopes]
    tools = {"both": names, **{name: [name] for name in names}}
    for tool, on in tools.items():

        @registry.tool(name=tool, kind=Kind.READS, scopes=on, timeout=None)
        async def fetch(n: int) -> str:
            await trio.sleep(0.05)
            return "done"

    built = [told.scope() for told in scopes]
    if cap is not None:
        built[0] = attrs.evolve(built[0], max_concurrency=cap)
    runner = Runner(registry, scopes=built, inline_wait=None, turn_timeout=600)
    kinds = ["both"] * calls if isinstance(calls, int) else calls
    turn = await runner.run_turn(
        [ToolCall(f"c{i}", kind, {"n": i}) for i, kind in enumerate(kinds)]
    )
    assert all(result.status is Status.OK for result in turn.results)
    started = {e.call_id: e.time for e in turn.trace if e.kind is EventKind.STARTED}
    if isinstance(calls, int):
        return list(started.values())
    return {
        name: [started[f"c{i}"] for i, kind in enumerate(kinds) if kind in ("both", name)]
        for name in names
    }


_BUCKETS = st.builds(
    _Told, st.just("bucket"), rate=st.sampled_from([2.0, 5.0, 10.0, 20.0]),
    burst=st.integers(1, 12),
)  # fmt: skip
_WINDOWS = st.builds(
    _Told, st.just("window"), limit=st.integers(1, 30), per=st.sampled_from([0.5, 1.0, 2.0, 4.0])
)


@settings(max_examples=40, deadline=None)
@given(bucket=_BUCKETS, window=_WINDOWS, calls=st.integers(1, 60))
def test_a_call_on_a_bucket_and_a_window_keeps_within_both(
    bucket: _Told, window: _Told, calls: int
) -> None:
    """Each call takes its tokens on both scopes as it starts: no interval of the starts
    holds more than either scope allows. (A call took its bucket token when it booked
    it and started when the window let it: beside a window of 25 per 4 s, a bucket of 10
    let eleven go at once, and 47 started in 4.6 s.)"""
    started = trio.run(
        _started_on, [bucket, window], calls, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert isinstance(started, list)
    _toward(started, bucket)
    _toward(started, window)


@settings(max_examples=40, deadline=None)
@given(
    bucket=_BUCKETS, window=_WINDOWS, cap=st.none() | st.integers(1, 3),
    kinds=st.lists(st.sampled_from(["both", "bucket", "window"]), min_size=1, max_size=24),
)  # fmt: skip
def test_calls_on_either_scope_or_both_keep_within_each(
    bucket: _Told, window: _Told, cap: int | None, kinds: list[str]
) -> None:
    """Calls on the bucket alone, the window alone or both, under a cap on the bucket:
    each scope's starts keep to its limits. (A call whose window booking was voided after
    its bucket token was confirmed booked the window again, and started later than the
    bucket counted it: a bucket of one started two at once.)"""
    started = trio.run(
        _started_on, [bucket, window], kinds, cap,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )  # fmt: skip
    assert isinstance(started, dict)
    _toward(started["bucket"], bucket)
    _toward(started["window"], window)


async def test_a_call_on_a_bucket_and_a_window_goes_when_both_allow(autojump_clock: Any) -> None:
    """10/s with a burst of 10 and 25 per 4 s: 25 by 1.5 s, the window's next 25 from
    4.1 s, the last 10 from 8.1 s. (Booked on both at once, a call whose window token a
    log dropped was booked again on both, at the back of the bucket's line: 18.4 s.)"""
    began = trio.current_time()
    times = await _started_on([_Told("k", 10, 10), _Told("k-win", limit=25, per=4)], 60)
    assert isinstance(times, list)
    started = [round(t - began, 6) for t in times]
    assert started[:25] == [0.0] * 10 + [round(0.1 * k, 6) for k in range(1, 16)]
    assert 4.0 <= started[25] <= 4.1
    assert max(started) <= 9.0


async def test_a_call_on_no_scope_may_send_a_second_request(autojump_clock: Any) -> None:
    """A tool with no scopes whose call sends two requests (a Digest challenge's round
    trip) is answered ok: the second request's charge on no scope is none, not a
    ``ValueError`` from an empty comparison of its tokens."""
    client = httpx.AsyncClient(
        transport=FanoutTransport(httpx.MockTransport(lambda _: httpx.Response(200, text="x"))),
        base_url="http://api.test",
    )
    registry = Registry()

    @registry.tool(kind=Kind.READS)
    async def two() -> str:
        await client.get("/a")
        await client.get("/b")
        return "both"

    turn = await Runner(registry).run_turn([ToolCall("c1", "two", {})])
    assert (turn.results[0].status, turn.results[0].content) == (Status.OK, "both")


async def test_an_answer_s_counts_go_to_the_scope_told_the_limit_it_states(
    autojump_clock: Any,
) -> None:
    """A server enforcing 10/s with a burst of 10 states ``Limit: 10`` on every answer; a
    call on that bucket and on a window of 25 per 4 s gives the counts to the bucket
    alone. Taken in by both, the window's limit became 10 and each ``Remaining: 0`` spent
    it (3.1-3.6x the fastest against a server enforcing both)."""
    config = ServerConfig(rate=10, burst=10, latency=0.05, headers="draft")
    bucket, window = Scope("k", rate=10, burst=10), Scope("k-win", limit=25, per=4)
    async with serve_throttled(config) as server:
        client = fanout.http_client(base_url=server.url)
        registry = Registry()

        @registry.tool(kind=Kind.READS, scopes=["k", "k-win"], timeout=None)
        async def fetch(n: int) -> str:
            response = await client.get(f"/items/{n}")
            response.raise_for_status()
            return "done"

        runner = Runner(registry, scopes=[bucket, window], inline_wait=None, turn_timeout=60)
        turn = await runner.run_turn([ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(30)])
        await client.aclose()
    assert all(r.status is Status.OK for r in turn.results)
    assert server.count(status=429) == 0
    assert window.statistics().bucket.burst == 25
    started = sorted(server.starts())
    assert started[24] == pytest.approx(1.5, abs=0.02)  # 10 at once, then 10/s
    assert started[25] >= 4.0  # the window's next
