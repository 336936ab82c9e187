"""A call's first request that leaves late counts toward the scope's slack, before any answer."""

from __future__ import annotations

import itertools
import random
import unittest.mock
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import pytest
import trio
import trio.testing
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import fanout
from fanout import Kind, Registry, Runner, Scope, ToolCall
from fanout._admission import Shortfall, take_tokens
from fanout._budget import Budget
from fanout._learning import TOGETHER
from fanout.http import NotSentError, RateLimitInfo
from fanout.testing import RequestRecord, ServerConfig, ThrottlingServer, serve_throttled
from tests.clocks import replayable_run

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from fanout._bucket import Booking


async def test_a_tools_own_set_up_before_its_request_is_no_slack(autojump_clock: Any) -> None:
    """Requests leaving 20 ms after admission (each tool's own set-up): the slack stays
    nothing, and the call after the burst sends its request a token after the burst's
    first left, when the server, which refills from that first arrival, has its token:
    no 429, and no later. The scope sees each request leave (`ScopeFront.observe_send_lag`).
    Kept as slack, the set-up was paid again: that request went 0.12 s after the first."""
    async with (
        serve_throttled(ServerConfig(rate=10, burst=2, latency=0.5)) as server,
        fanout.http_client(base_url=server.url) as client,
    ):
        reg = Registry()
        started: list[float] = []

        @reg.tool(kind=Kind.READS, scopes=["api"])
        async def fetch(n: int) -> str:
            await trio.sleep(0.02)  # the tool's own set-up before its request
            started.append(trio.current_time())
            return (await client.get(f"/items/{n}")).text

        scope = Scope("api", rate=10, burst=2)
        runner = Runner(reg, scopes=[scope], inline_wait=None)
        calls = [ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(3)]
        turn = await runner.run_turn(calls)
    assert [r.status for r in turn.results] == [fanout.Status.OK] * 3
    assert scope.statistics().slack == pytest.approx(0.0, abs=1e-12)
    # The server's bucket stays full until the burst's first request reaches it, and its
    # next token comes 0.1 s later: the call after the burst is admitted then (the first
    # request owes the refill its set-up cost the server), and sends after its own.
    assert started[2] - started[0] == pytest.approx(0.12)
    assert server.count(status=429) == 0


async def test_a_configured_slack_is_kept() -> None:
    """slack= given by the user is not replaced by a measurement."""
    scope = Scope("api", rate=10, burst=2, slack=0.0)
    scope.observe_send_lag(0.5)
    assert scope.statistics().slack == 0.0


@attrs.frozen
class _LateRun:
    """A turn whose tools each sent their requests late, and what the server saw."""

    server: ThrottlingServer
    turn: fanout.Turn
    began: float  # when the turn was run


async def _late_turn(
    config: ServerConfig,
    scope: Scope,
    calls: int,
    leave: Callable[[int], float],
    transport: httpx.AsyncBaseTransport | None = None,
    *,
    then: Callable[[int], Sequence[float]] = lambda n: (),
    timeout: float = 30.0,
) -> _LateRun:
    """``calls`` calls through ``scope`` against a throttling server of ``config``, the
    tool of call ``n`` sending its first request ``leave(n)`` s after it starts (its own
    set-up), and one more after each wait in ``then(n)``, through ``transport`` if given."""
    async with (
        serve_throttled(config) as server,
        fanout.http_client(transport, base_url=server.url) as client,
    ):
        reg = Registry()

        @reg.tool(kind=Kind.READS, scopes=[scope.name], timeout=timeout)
        async def fetch(n: int) -> str:
            await trio.sleep(leave(n))
            text = (await client.get(f"/items/{n}")).raise_for_status().text
            for i, wait in enumerate(then(n), start=1):
                await trio.sleep(wait)
                (await client.get(f"/items/{n}", params={"i": i})).raise_for_status()
            return text

        runner = Runner(reg, scopes=[scope], inline_wait=None)
        began = trio.current_time()
        turn = await runner.run_turn([ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(calls)])
    return _LateRun(server, turn, began)


async def test_calls_admitted_after_the_probe_answered_count_their_own_lag(
    autojump_clock: Any,
) -> None:
    """A learning scope's probe opens a burst; the calls its answer lets start are not
    part of that burst, so their lag counts from their own admission, not the probe's.

    Counted from the probe, each would have "left" a latency late: a slack of a whole
    latency, which at 5/s holds back a token: of the four the server's Remaining
    allowed after a probe of one, three started at once and one an answer later.
    (Each probe's count is read with the other as maybe not yet counted: read alone,
    the first's "4 left" let a fourth out, and it was refused.)"""
    config = ServerConfig(rate=5, burst=5, latency=0.05, headers="draft")
    scope = Scope("api")
    run = await _late_turn(config, scope, 8, lambda _: 0.005)  # the tool's own set-up
    assert [r.status for r in run.turn.results] == [fanout.Status.OK] * 8
    assert scope.statistics().slack == pytest.approx(0.005)
    starts = [round(t - run.began, 9) for t in run.server.starts()]
    assert starts[:5] == [0.005] * 2 + [0.005 + 0.05 + 0.005] * 3  # the probe, then three
    assert run.server.count(status=429) == 0


class _SlowOnTheWayIn(httpx.AsyncBaseTransport):
    """Each request reaches the server a random 0 to ``spread`` s after it leaves: on a
    busy machine, a request counted as sent is written to its socket some ms later."""

    def __init__(self, spread: float, seed: int) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._spread = spread
        self._rng = random.Random(seed)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await trio.sleep(self._rng.uniform(0.0, self._spread))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.mark.parametrize("told", [True, False])
@pytest.mark.parametrize("spread", [0.01, 0.02])
@pytest.mark.parametrize("seed", range(4))
async def test_requests_reaching_the_server_out_of_step_draw_no_429(
    autojump_clock: Any, told: bool, spread: float, seed: int
) -> None:
    """Issue 13's 200 calls at 50/s, burst 20, 16 in flight, 100 ms, each request reaching
    the server up to ``spread`` after it left. Paced from when they left, one that got
    there quicker than the burst's first came early by the difference: told the limits,
    a 429 in 6 of these 8 runs. The spread of how long requests take to reach their
    headers (`ScopeFront.observe_write_lag`) is the slack now: none.

    Learning, a 429 in 5 of 8, and in 2 with that slack alone: requests sent within
    the spread before an answered one were counted as come before it (in real time,
    four sent within 12 ms before one that got there 20 ms sooner made a refill bound
    53.9/s against 50/s); they are now counted as maybe after it, as those sent within
    5 ms were. Over seeds 0-15 at both spreads, 6 runs of 32 still drew one 429 (10
    without that count): the rate measured over seconds ended a few thousandths over
    the server's. Every refill bound's span is now widened by twice the spread seen
    (a few samples see less than the whole): none of the 32."""
    config = ServerConfig(rate=50, burst=20, latency=0.1, max_in_flight=16, headers="draft")
    async with (
        serve_throttled(config) as server,
        fanout.http_client(_SlowOnTheWayIn(spread, seed), base_url=server.url) as client,
    ):
        reg = Registry()

        @reg.tool(kind=Kind.READS, scopes=["api"])
        async def fetch(n: int) -> str:
            (await client.get(f"/items/{n}")).raise_for_status()
            return "ok"

        rate, burst = (50, 20) if told else (None, None)
        scope = Scope("api", rate=rate, burst=burst, max_concurrency=16)
        runner = Runner(reg, scopes=[scope], inline_wait=None)
        turn = await runner.run_turn([ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(200)])
    assert [r.status for r in turn.results] == [fanout.Status.OK] * 200
    assert server.count(status=429) == 0
    # The minimum is (200 - 20) / 50 + 0.1 = 3.7 s.
    assert max(r.end for r in server.records) < 3.7 + 0.1


class _LateOnTheWay(httpx.AsyncBaseTransport):
    """The request for item ``n`` reaches the server ``inbound[n]`` s after it leaves, and
    its answer the client ``outbound[n]`` s after the server sends it."""

    def __init__(self, inbound: dict[int, float], outbound: dict[int, float]) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._inbound, self._outbound = inbound, outbound

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        n = int(request.url.path.rsplit("/", 1)[1])
        await trio.sleep(self._inbound.get(n, 0.0))
        response = await self._inner.handle_async_request(request)
        await trio.sleep(self._outbound.get(n, 0.0))
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_request_counted_before_one_that_left_earlier_is_not_taken_for_uncounted(
    autojump_clock: Any,
) -> None:
    """8 calls against 5/s, burst 5, 50 ms, learning. After the probe's two, three leave
    0.4 ms apart, and the first of them reaches the server 1 ms late: it is counted last
    (0 left), after the two that left after it (2 and 1 left). Its count, read with those
    two as started since, put the bucket two tokens under the server's, and the sixth call
    went at 0.65 s for 0.25 s (in real time: 0.46 s for 0.26 s, one run in six). Their
    own answers, read first, show they were counted before it: a count higher than its
    own by more than the refill between them."""
    async with (
        serve_throttled(ServerConfig(rate=5, burst=5, latency=0.05, headers="draft")) as server,
        fanout.http_client(_LateOnTheWay({2: 0.001}, {}), base_url=server.url) as client,
    ):
        reg = Registry()
        leaves = {3: 0.0004, 4: 0.0008}  # after the first of the three

        @reg.tool(kind=Kind.READS, scopes=["api"])
        async def fetch(n: int) -> str:
            await trio.sleep(leaves.get(n, 0.0))
            return (await client.get(f"/items/{n}")).text

        began = trio.current_time()
        runner = Runner(reg, scopes=[Scope("api")], inline_wait=None)
        turn = await runner.run_turn([ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(8)])
    assert [r.status for r in turn.results] == [fanout.Status.OK] * 8
    assert server.count(status=429) == 0
    starts = [round(t - began, 9) for t in server.starts()]
    assert starts[2:5] == [0.0504, 0.0508, 0.051]  # counted as 2, 1 and 0 left
    assert starts[5] == pytest.approx(0.2508)  # its token at 0.2, and the first burst's slack


@pytest.mark.parametrize(
    ("told", "next_token"), [(True, 0.2), (False, 0.25)], ids=["told", "learned"]
)
async def test_a_count_is_not_synced_down_by_a_request_that_may_have_been_counted_first(
    autojump_clock: Any, told: bool, next_token: float
) -> None:
    """5/s, burst 5: two at 0, then three that leave 1.4 and 1.1 ms apart from 0.06 s, and
    reach the server out of step: the second first (2 left), then the first (1 left).
    The first's answer is read before the second's, so nothing yet shows that the second
    was counted before it. Taken for one started since, it synced the bucket a token under
    the server's (the most the server could have, 0.33, was less than the bucket's 0.63):
    the next token came at 0.46 s for 0.2 s (learning: 0.25 s, the probe's round trip not
    yet a proven refill). In real time, eight calls against a learned 5/s: the sixth went
    at 0.48 s for 0.27 s, one full benchmark run in four. It left within how much later one
    request may reach the server than another, so it may have been counted first, and it
    is not taken off the most the server can have."""
    scope = Scope("api", rate=5, burst=5, slack=0.0) if told else Scope("api")
    began = trio.current_time()
    for _ in range(2):
        booking = await scope.reserve(1, 10)
        assert booking is not None
        assert await scope.confirm(booking)
    if not told:  # learned from the probe's answers: 5 a second, 4 and 3 left
        await trio.sleep(0.05)
        for remaining in (4, 3):
            info = RateLimitInfo(limit=5, remaining=remaining, reset_after=1)
            await scope.observe_headers(info, sent_at=began)
        await trio.sleep(0.01)
    else:
        await trio.sleep(0.06)
    first = trio.current_time()
    for gap in (0.0, 0.0014, 0.0011):
        await trio.sleep(gap)
        booking = await scope.reserve(1, 10)
        assert booking is not None
        assert booking.wait == 0
        assert await scope.confirm(booking)
    await trio.sleep(0.0654)
    await scope.observe_headers(RateLimitInfo(limit=5, remaining=1, reset_after=1), sent_at=first)
    booking = await scope.reserve(1, 10)
    assert booking is not None
    assert booking.start - began == pytest.approx(next_token)


@attrs.frozen
class _Synced:
    """A count the bucket took in, when, and what the bucket was told."""

    at: float
    count: fanout.ServerCount
    rate: float
    burst: float


def _server_tokens(
    records: list[RequestRecord], started: list[float], rate: float, burst: float, at: float
) -> float:
    """What the server's bucket holds at ``at``, less the requests started by then that it
    has not counted yet (they will draw it down): what a count read then can say it has."""
    tokens, last = float(burst), 0.0
    for record in sorted(records, key=lambda r: r.start):
        if record.start > at:
            break
        tokens = min(burst, tokens + rate * (record.start - last)) - (record.status == 200)
        last = record.start
    uncounted = sum(1 for s in started if s <= at) - sum(1 for r in records if r.start <= at)
    return min(burst, tokens + rate * (at - last)) - uncounted


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    rate=st.sampled_from([5.0, 10.0, 20.0, 50.0]),
    burst=st.integers(2, 8),
    calls=st.integers(3, 16),
    # Less apart on the way in than ``TOGETHER``, and any order on the way back.
    inbound=st.lists(st.sampled_from([0.0, 0.0005, 0.001, 0.002, 0.004]), min_size=16),
    outbound=st.lists(st.sampled_from([0.0, 0.001, 0.003, 0.01, 0.02]), min_size=16),
    leaves=st.lists(st.sampled_from([0.0, 0.0004, 0.0011, 0.003, 0.02, 0.07, 0.15]), min_size=16),
)
def test_a_count_bounds_the_server_from_both_sides_in_any_order(
    rate: float,
    burst: int,
    calls: int,
    inbound: list[float],
    outbound: list[float],
    leaves: list[float],
) -> None:
    """A told scope, requests that reach the server in another order than they left (by
    less than ``TOGETHER``) and answers that come back in any order: every count the
    bucket takes in says the server holds at most ``at_most`` and at least ``at_least``
    tokens, and it does, less what started and is not counted yet. Below ``at_most``,
    the bucket is synced under the server (a start later than it needed); above
    ``at_least``, it is raised over it (a 429).

    Tools send their requests up to 150 ms after their calls were admitted: a sibling's
    count read meanwhile took the server for having counted them, and broke
    ``at_least`` (1 against 0.25: a told 5/s bucket raised a token over the server's).
    No 429 is asserted: a request 0.5 ms slower on its way in, unseen by any answer
    yet, meets a refill boundary 0.5 ms late (what no client can see; the slack is
    sized from what it can), and a burst whose requests all leave late is the strict
    expected failure below."""
    synced: list[_Synced] = []
    sync = fanout._bucket.TokenBucket.sync

    def recording(bucket: fanout._bucket.TokenBucket, count: fanout.ServerCount) -> bool:
        assert bucket.rate is not None
        synced.append(_Synced(trio.current_time(), count, bucket.rate, bucket.burst))
        return sync(bucket, count)

    started: list[float] = []

    async def main() -> list[RequestRecord]:
        config = ServerConfig(rate=rate, burst=burst, latency=0.05, headers="draft")
        transport = _LateOnTheWay(dict(enumerate(inbound)), dict(enumerate(outbound)))
        async with (
            serve_throttled(config) as server,
            fanout.http_client(transport, base_url=server.url) as client,
        ):
            reg = Registry()

            @reg.tool(kind=Kind.READS, scopes=["api"])
            async def fetch(n: int) -> str:
                started.append(trio.current_time())  # its token taken, on its way
                await trio.sleep(leaves[n])
                return (await client.get(f"/items/{n}")).text

            runner = Runner(reg, scopes=[Scope("api", rate=rate, burst=burst)], inline_wait=None)
            calls_ = [ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(calls)]
            turn = await runner.run_turn(calls_)
        assert all(r.status is fanout.Status.OK for r in turn.results)  # retried if refused
        return server.records

    with unittest.mock.patch.object(fanout._bucket.TokenBucket, "sync", recording):
        records = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    for s in synced:
        has = _server_tokens(records, started, s.rate, s.burst, s.at)
        assert s.count.at_least(s.burst) <= has + 1e-9
        assert s.count.at_most(s.rate, s.burst) >= has - 1e-9


async def _four_calls_told_5_per_s(leaves: dict[int, float]) -> tuple[list[float], int]:
    """Four calls through a scope told 5/s, burst 2, the tool of call ``n`` sending its
    request ``leaves[n]`` s after it starts: when the server took each, and its 429s.
    Every call is answered ok (a refused one is retried)."""
    config = ServerConfig(rate=5, burst=2, latency=0.05, headers="draft")
    run = await _late_turn(config, Scope("api", rate=5, burst=2), 4, lambda n: leaves.get(n, 0.0))
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    return [round(t, 9) for t in run.server.starts()], run.server.count(status=429)


async def test_a_count_leaves_out_a_request_its_tool_has_not_sent_yet(
    autojump_clock: Any,
) -> None:
    """5/s, burst 2, told: of the burst's two calls, one sends at 0.02 s and one at 0.07 s
    (its tool's own set-up). The first's answer, read at 0.07 s, says 1 left: the
    server has not counted the second yet. Read as the server's own, it raised the
    bucket a token over the server's, a third call went at once and was refused, and
    waited out a second (1.07 s). The second is taken off (``attempt_began``), and,
    leaving after the first was sent, counted as started since (``Outgoing.sent_late``): the
    third goes at its token, 0.2 s, and what the burst's first request owes (it reached
    the server 0.02 s late) and the slack: the set-ups varied by 0.05 s. The fourth goes
    a token later, and the slack grew to 0.07 s as the third sent at once."""
    starts, refused = await _four_calls_told_5_per_s({0: 0.07, 1: 0.02})
    assert refused == 0
    assert starts == [0.02, 0.07, 0.27, 0.49]


async def test_a_tool_that_sends_long_after_its_admission_draws_no_429(
    autojump_clock: Any,
) -> None:
    """5/s, burst 2, told. Both calls of the burst take 0.3 s before sending their
    request; a third call goes at its token, 0.2 s, and finds the server full (2 left 1).
    At 0.3 s the two arrive: the server has refilled only since the third, and holds 1.5
    tokens. Counted at admission, the scope let both go, and the second was refused and
    waited out a whole second (1.6 s). Counted as they leave (`_departure_wait`), the
    second waits for its token, 0.1 s, and ``TOGETHER`` more: the third call's request,
    over a new connection, took the full bucket and may have been read that late; and,
    held by the count of the wire, it leaves the slack after that token, up to
    ``TOGETHER`` (`ScopeFront.wire_wait`). Nothing is refused."""
    starts, refused = await _four_calls_told_5_per_s({0: 0.3, 1: 0.3})
    assert refused == 0
    assert starts[:3] == [0.2, 0.3, round(0.4 + 2 * TOGETHER, 9)]


async def test_a_wait_for_a_token_as_the_request_leaves_is_an_event(
    autojump_clock: Any,
) -> None:
    """The operator sees the wait at the wire as any other wait for tokens: one
    ``token_wait`` of 0.1 s on the scope, for the burst's second request, as it leaves,
    and one of twice ``TOGETHER`` as its headers then leave (the wire's count owes that
    much more, and keeps the slack after it, as above)."""
    config = ServerConfig(rate=5, burst=2, latency=0.05, headers="draft")
    leaves = {0: 0.3, 1: 0.3}
    run = await _late_turn(config, Scope("api", rate=5, burst=2), 4, lambda n: leaves.get(n, 0.0))
    started: dict[str | None, float] = {}
    at_the_wire = []  # waits for tokens once the call had started
    for e in run.turn.trace:
        if e.kind is fanout.EventKind.STARTED:
            started[e.call_id] = e.time
        elif e.kind is fanout.EventKind.TOKEN_WAIT and e.call_id in started:
            at_the_wire.append((e.call_id, round(e.time - run.began, 9), e.wait, e.scope))
    call = at_the_wire[0][0]
    assert at_the_wire == [
        (call, 0.3, pytest.approx(0.1), "api"),
        (call, 0.4, pytest.approx(2 * TOGETHER), "api"),
    ]
    assert at_the_wire[0][0] in ("c0", "c1")  # one of the burst's two


class _SlowToConnect(httpx.AsyncBaseTransport):
    """Real connections to the server, the first ones each taking ``delays`` to open (in
    the order they are opened): ten opened at once are slower than one alone."""

    def __init__(self, delays: Sequence[float]) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._delays = iter(delays)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        theirs = request.extensions.get("trace")

        async def trace(event: str, info: dict[str, Any]) -> None:
            if event == "connection.connect_tcp.complete":
                await trio.sleep(next(self._delays, 0.0))
            if theirs is not None:
                await theirs(event, info)

        request.extensions["trace"] = trace
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    rate=st.sampled_from([2.0, 5.0, 10.0, 20.0]),
    burst=st.sampled_from([1, 2, 3, 5]),
    cap=st.sampled_from([None, None, 2, 4]),
    calls=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 1.2]),
            st.sampled_from([1, 1, 2, 3]),  # requests
            st.sampled_from([0.0, 0.02, 0.2]),  # between them
        ),
        min_size=3, max_size=9,
    ),
    connects=st.lists(st.sampled_from([0.0, 0.002, 0.006, 0.02]), max_size=9),
)  # fmt: skip
def test_tools_that_set_up_before_sending_draw_no_429_from_a_told_bucket(
    rate: float, burst: int, cap: int | None, calls: list[tuple[float, int, float]],
    connects: list[float],
) -> None:  # fmt: skip
    """Any told token bucket (and in-flight cap), tools that each take their own time
    before sending each of their requests, and connections that each take their own time
    to open: requests leave in another order than their calls were admitted, and the
    server never refuses one. (The scope books a call's token at admission; the server
    takes it as the request arrives, and stays full, refilling nothing, until the first
    one does.)"""

    async def main() -> _LateRun:
        config = ServerConfig(
            rate=rate, burst=burst, latency=0.05, headers="draft", max_in_flight=cap
        )
        scope = Scope("api", rate=rate, burst=burst, max_concurrency=cap)
        return await _late_turn(
            config, scope, len(calls), lambda n: calls[n][0], _SlowToConnect(connects),
            then=lambda n: [calls[n][2]] * (calls[n][1] - 1), timeout=600,
        )  # fmt: skip

    run = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert run.server.count(status=429) == run.server.count(status=503) == 0
    assert all(r.status is fanout.Status.OK for r in run.turn.results)


async def test_a_burst_slow_to_open_its_connections_owes_the_refill_it_lost(
    autojump_clock: Any,
) -> None:
    """Told 20/s with a burst of 10, tools that set up for 0.1 s: the burst's ten
    requests reach the wire together and open their connections for 6 ms, the eleventh
    opens its own at once. The server's bucket stays full until the burst arrives and
    refills from then, so the eleventh, counted a token after the burst reached the
    wire, came 0.88 of a token after the server took it in: a 429, in every real-time
    run. The request that took the full bucket owes the refill as it leaves: the
    eleventh leaves a token after the burst did, and ``TOGETHER``, as late as a server
    may read one new connection after another (0.161 s)."""
    config = ServerConfig(rate=20, burst=10, latency=0.05, headers="draft")
    run = await _late_turn(
        config, Scope("api", rate=20, burst=10), 14, lambda _: 0.1,
        transport=_SlowToConnect([0.006] * 10),
    )  # fmt: skip
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    starts = [round(start - run.began, 9) for start in run.server.starts()]
    assert starts[:11] == [0.106] * 10 + [round(0.156 + TOGETHER, 9)]


async def test_a_request_overtaken_on_its_way_waits_for_a_token_as_it_reaches_the_wire(
    autojump_clock: Any,
) -> None:
    """Told a bucket of one at 5/s: the first call's request opens a connection for 0.3 s,
    the second call, admitted at 0.2 and setting up for 0.05 s, opens its own in 2 ms and
    reaches the server first, at 0.252. Counted as they passed the gate (at 0 and 0.25,
    a token apart), both went, and the first, arriving at 0.3, found the bucket the
    second had just emptied: a 429 and a second's wait. Counted as they reach the wire
    (`ScopeFront.wire_wait`), the first waits there for the next token, and ``TOGETHER``
    (the second, over a new connection, took the full bucket and may be read that late),
    and the slack after it, up to ``TOGETHER``: 0.462."""
    config = ServerConfig(rate=5, burst=1, latency=0.05, headers="draft")
    set_ups = [0.0, 0.05]
    run = await _late_turn(
        config, Scope("api", rate=5, burst=1), 2, set_ups.__getitem__,
        transport=_SlowToConnect([0.3, 0.002]),
    )  # fmt: skip
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    starts = [round(start - run.began, 9) for start in run.server.starts()]
    assert starts == [0.252, round(0.452 + 2 * TOGETHER, 9)]


async def test_a_calls_later_request_is_a_departure_its_told_window_counts(
    autojump_clock: Any,
) -> None:
    """Told one per 0.1 s (a sliding log): the second call sends two requests, at 0.1 s
    and, charged as the first is answered, at 0.25; the first call's tool sets up until
    0.27. Only a call's first request was counted as it left, so the window saw room at
    0.27 beside the request of 0.1 alone: a 429, and a second's wait. The later request
    counts as it leaves too (`ScopeFront.request_left`), and the first call waits for
    the next window, with its slack."""
    config = ServerConfig(rate=10, burst=1, latency=0.05, headers="draft", model="sliding")
    set_ups = [0.27, 0.0]
    run = await _late_turn(
        config, Scope("api", limit=1, per=0.1), 2, set_ups.__getitem__,
        then=lambda n: [0.0] if n == 1 else [],
    )  # fmt: skip
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    assert [r.path for r in run.server.records] == ["/items/1", "/items/1?i=1", "/items/0"]
    assert [round(start - run.began, 9) for start in run.server.starts()] == [0.1, 0.25, 0.4]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    window=st.booleans(),
    rate=st.sampled_from([1.0, 2.0, 5.0, 10.0, 20.0]),
    burst=st.sampled_from([1, 1, 2, 3, 5]),
    cap=st.sampled_from([None, None, 2, 4]),
    calls=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 1.2]),
            st.sampled_from([1, 1, 2]),  # requests
            st.sampled_from([0.0, 0.02, 0.2]),  # between them
        ),
        min_size=3, max_size=12,
    ),
    connects=st.lists(st.sampled_from([0.0, 0.002, 0.006, 0.02, 0.3]), max_size=9),
    timeout=st.sampled_from([0.4, 0.8, 1.3, 2.0, 600.0]),
)  # fmt: skip
def test_requests_that_reach_the_wire_out_of_order_draw_no_429_within_any_budget(
    window: bool, rate: float, burst: int, cap: int | None,
    calls: list[tuple[float, int, float]], connects: list[float], timeout: float,
) -> None:  # fmt: skip
    """Any told token bucket or sliding log (and in-flight cap), tools that set up for
    their own time before each of their requests, connections that take their own time
    to open (a TLS handshake: up to 0.3 s), and budgets from tight to none: requests
    reach the server in another order than they were admitted, and than they reached
    the HTTP layer, and some cannot afford their wait as they leave. The server never
    refuses one; every call is answered once, none past its deadline, and a call
    answered ``rate_limited`` says how long to wait. Before, 12 of 150 such drawn turns
    drew a 429: a request overtaken while its connection opened, a call's later request
    no window counted as it left, a wait at the gate that a late first request grew
    after it was booked."""

    async def main() -> _LateRun:
        model = "sliding" if window else "bucket"
        config = ServerConfig(
            rate=rate, burst=burst, latency=0.05, headers="draft", max_in_flight=cap, model=model
        )
        scope = (
            Scope("api", limit=burst, per=burst / rate, max_concurrency=cap)
            if window
            else Scope("api", rate=rate, burst=burst, max_concurrency=cap)
        )
        return await _late_turn(
            config, scope, len(calls), lambda n: calls[n][0], _SlowToConnect(connects),
            then=lambda n: [calls[n][2]] * (calls[n][1] - 1), timeout=timeout,
        )  # fmt: skip

    run = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert run.server.count(status=429) == run.server.count(status=503) == 0
    assert sorted(r.tool_use_id for r in run.turn.results) == sorted(
        f"c{i}" for i in range(len(calls))
    )
    answered = [e.time - run.began for e in run.turn.trace if e.kind is fanout.EventKind.ANSWERED]
    assert len(answered) == len(calls)
    assert max(answered) <= timeout + 1e-9
    for result in run.turn.results:
        assert result.status in (
            fanout.Status.OK,
            fanout.Status.RATE_LIMITED,
            fanout.Status.TIMED_OUT,
        )
        if result.status is fanout.Status.RATE_LIMITED:
            assert result.retry_after_ms is not None


async def test_a_request_held_before_its_headers_takes_its_token_as_it_leaves(
    autojump_clock: Any,
) -> None:
    """Told 10/s with a burst of one, tools that set up for 0.1 s: before a warm answer
    shows how fast the server answers, a request over a reused connection is held for the
    worst case (`ScopeFront.warm_hold`), after the told bucket counted it as leaving.
    Counted before its hold, one held 50 ms was followed by the next 50 ms after it
    reached the server, and a 429; it takes its token when its hold ends now. Each
    request reaches the server a token after the one before it at least. Once a warm
    answer is in, each call starts its set-up before its token (`admission_lead`), and
    the turn ends by 3.6 s (3.35-3.55 as the calls' order falls, 3.05 at the fastest;
    5.95-6.0 when each call started at its token and its request owed the refill its
    set-up cost the server; 8.75 with the set-up kept as slack)."""
    config = ServerConfig(rate=10, burst=1, latency=0.05, headers="draft")
    run = await _late_turn(config, Scope("api", rate=10, burst=1), 30, lambda _: 0.1)
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    starts = run.server.starts()
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(starts))
    assert max(r.end for r in run.server.records) - run.began <= 3.6 + 1e-9


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    rate=st.sampled_from([10.0, 50.0, 200.0]),
    calls=st.integers(100, 300),
    latency=st.sampled_from([0.005, 0.02, 0.1]),
    set_ups=st.sampled_from([(0.0, 0.002), (0.0, 0.005, 0.01), (0.0, 0.03), (0.001,)]),
    seed=st.integers(0, 2**16),
)
def test_a_deep_queue_on_a_bucket_of_one_is_moved_not_booked_again(
    rate: float, calls: int, latency: float, set_ups: tuple[float, ...], seed: int
) -> None:
    """Hundreds of calls queued on a told bucket of one, their tools setting up for
    different times: every request slower on its way out than the quickest leaves late
    and owes the refill it cost a full server (`ScopeFront.headers_left`). The bookings
    ahead move later in place (`TokenBucket.owe`), so no call books more than about
    once, none is refused, and the queue goes a token and the slack apart. (Each debt
    once voided every booking ahead: 200 calls at 50/s booked 16,346 times, each late
    request waking every holder, and 300 calls at 10/s took 43.3 s for 38.9.)"""
    draw = random.Random(seed)
    leaves = [draw.choice(set_ups) for _ in range(calls)]

    async def main() -> tuple[_LateRun, fanout.ScopeStatistics]:
        config = ServerConfig(rate=rate, burst=1, latency=latency, headers="draft")
        scope = Scope("api", rate=rate, burst=1)
        run = await _late_turn(config, scope, calls, leaves.__getitem__, timeout=600)
        return run, scope.statistics()

    run, statistics = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert run.server.count(status=429) == 0
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert statistics.bucket.reserved <= 2 * calls
    span = run.server.starts()[-1] - run.began
    assert span <= (calls - 1) * (1 / rate + statistics.slack) + 0.2


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    model=st.sampled_from(["bucket", "fixed", "sliding"]),
    rate=st.sampled_from([2.0, 5.0, 10.0, 20.0, 50.0]),
    burst=st.sampled_from([1, 2, 5, 10, 20]),
    latency=st.sampled_from([0.01, 0.05, 0.2]),
    calls=st.integers(2, 40),
    set_up=st.sampled_from([0.0, 0.005, 0.02, 0.1, 0.3]),
)
def test_a_set_up_every_call_takes_alike_is_owed_not_kept_as_slack(
    model: str, rate: float, burst: int, latency: float, calls: int, set_up: float
) -> None:
    """Any told bucket or window whose tools all take ``set_up`` before they send: the
    server refuses nothing and the slack stays nothing, the set-up being seen as each
    request leaves. Kept as the slack (the time since the burst began), it was paid
    again at every burst: 60 calls at 50/s with a burst of 20 and 0.3 s took 1.26x the
    fastest, 1.12x; a burst of one at 10/s with 0.1 s took 2.87x, 1.95x.

    A bucket's last ten requests reach the server at its rate: each call starts its
    set-up that much before its token (`ScopeFront.admission_lead`). Started at its
    token, a request of a burst of one owed the refill its set-up cost a full server,
    and the next token came that much later: 0.2 s apart at 10/s with 0.1 s (1.08x
    the fastest now, 1.95x then)."""

    async def main() -> tuple[_LateRun, float]:
        config = ServerConfig(rate=rate, burst=burst, latency=latency, headers="draft", model=model)
        if model == "bucket":
            scope = Scope("api", rate=rate, burst=burst)
        else:
            scope = Scope("api", limit=burst, per=burst / rate)
        run = await _late_turn(config, scope, calls, lambda _: set_up, timeout=600)
        return run, scope.statistics().slack

    run, slack = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert run.server.count(status=429) == 0
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert slack == pytest.approx(0.0, abs=1e-9)
    last = run.server.starts()[-10:]
    if model == "bucket" and calls >= burst + 20:
        assert last[-1] - last[0] <= 9 / rate + 1e-9


@pytest.mark.parametrize("model", ["sliding", "fixed"])
async def test_a_told_windows_calls_start_their_set_up_ahead_of_its_tokens(
    autojump_clock: Any, model: str
) -> None:
    """Told 4 per 0.4 s, tools that set up for 0.1 s before they send: once a call has shown
    how long its tool takes to hand its request on, each call starts that much before its
    token (`ScopeFront.admission_lead`), and every window's requests reach the server as
    it opens. (The first window's, over new connections, hold their tokens a window from
    their answers, 0.15 s; a window of four keeps to the four connections it opened.)
    Started at their tokens, every window waited out the set-up: 0.65, 1.15, 1.65 s,
    each 0.5 s after the one before."""
    config = ServerConfig(rate=10, burst=4, latency=0.05, headers="draft", model=model)
    scope = Scope("api", limit=4, per=0.4)
    run = await _late_turn(config, scope, 16, lambda _: 0.1)
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    starts = [round(start - run.began, 9) for start in run.server.starts()]
    assert starts == [at for at in (0.1, 0.55, 0.95, 1.35) for _ in range(4)]
    assert scope.statistics().slack == 0.0


async def test_a_told_window_keeps_to_the_connections_it_opened(autojump_clock: Any) -> None:
    """Told one per 50 ms, answers in 50 ms, and the server reads each new connection's
    first request 100 ms late; through `fanout.http_client`'s four pools. Once the first
    answers are in, every request reaches the server exactly a window after the one
    before: each goes over a connection left open, whichever pool holds it, and the
    window's margin leaves out how much later than the others the new connections'
    round trips came (a request over one holds its own token for that).

    Sent through the pool its call's place in the turn named, every few calls a request
    found that pool's connection busy and opened one, read 100 ms late, and the window
    paced the calls after it from there; with the new connections' round trips in the
    margin (up to 5 ms), every request went 55 ms after the one before: the last
    reached the server at 1.73 s, where 1.55 s is the least (1.60 s now; the first
    answers cost up to 0.2 s, as trio happens to order the tasks their answers wake)."""
    config = ServerConfig(
        rate=20, burst=1, latency=0.05, headers="draft", model="sliding", connect_delay=0.1
    )
    scope = Scope("api", limit=1, per=0.05)
    run = await _late_turn(config, scope, 30, lambda _: 0.0)
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    starts = [start - run.began for start in run.server.starts()]
    assert [b - a for a, b in itertools.pairwise(starts[4:])] == pytest.approx([0.05] * 25)
    assert starts[-1] <= 1.75 + 1e-9


async def test_a_request_that_set_up_past_its_window_waits_for_the_next_as_it_leaves(
    autojump_clock: Any,
) -> None:
    """Told one per 0.1 s (a sliding log): the sixth call to run sets up for 0.25 s, the
    others send as they are admitted. Admitted at 0.55 s, it leaves at 0.8, inside the
    window the call admitted at 0.75 took: counted from its admission, it went then, drew
    a 429 and a second's wait, and its set-up, kept as slack, paced the rest 0.35 s
    apart. It waits for the next window as it leaves now, and the slack the set-up adds
    is no more than the quickest round trip, 0.05 s. The first call opens a connection
    and holds its token a window from its answer; every later request goes over that
    connection (`fanout._pools`: through the four pools by each call's place in the
    turn, the first four opened their own, each held so: 0.15 s later throughout), but
    the set-up call's, which opens its own: the request after it goes ``TOGETHER`` later,
    as late as a server may take in one new connection after another."""
    set_ups = itertools.chain([0.0] * 5, [0.25])
    config = ServerConfig(rate=10, burst=1, latency=0.05, headers="draft", model="sliding")
    scope = Scope("api", limit=1, per=0.1)
    run = await _late_turn(config, scope, 10, lambda _: next(set_ups, 0.0))
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    starts = [round(start - run.began, 9) for start in run.server.starts()]
    paced = [round(at + TOGETHER, 9) for at in (1.05, 1.2)]
    assert starts == [0.0, 0.15, 0.25, 0.35, 0.45, 0.65, 0.75, 0.9, *paced]
    assert scope.statistics().slack == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("scope", "model", "retry_after_ms"),
    [
        (Scope("api", limit=1, per=1.0), "sliding", 950),
        (Scope("api", rate=1, burst=1), "bucket", 900),
    ],
    ids=["window", "bucket"],
)
async def test_a_request_that_cannot_afford_its_wait_as_it_leaves_is_not_sent(
    autojump_clock: Any, scope: Scope, model: str, retry_after_ms: int
) -> None:
    """Told one per second (a sliding log, or a bucket of one), each call with 1.6 s: the
    first call's tool sets up for 1.2 s, the second, admitted at 1.0, for 0.3. The first
    left at 1.2, so the second, leaving at 1.3, has room only at 2.25 (the log keeps
    its slack) or a token at 2.2, past its deadline: it is answered ``rate_limited``
    then and there, with that wait, and the server never sees it. Counted from its
    admission, the window's went, and drew a 429 with a second's wait; the bucket's
    slept to its deadline, and was answered ``timed_out``."""
    set_ups = iter([1.2, 0.3])
    config = ServerConfig(rate=1, burst=1, latency=0.05, headers="draft", model=model)
    run = await _late_turn(config, scope, 2, lambda _: next(set_ups), timeout=1.6)
    first, second = sorted(run.turn.results, key=lambda r: r.status is fanout.Status.OK)[::-1]
    assert first.status is fanout.Status.OK
    assert second.status is fanout.Status.RATE_LIMITED
    assert second.retry_after_ms == retry_after_ms
    answered = [e.time - run.began for e in run.turn.trace if e.call_id == second.tool_use_id
                and e.kind is fanout.EventKind.ANSWERED]  # fmt: skip
    assert answered == [pytest.approx(1.3)]
    assert [round(start - run.began, 9) for start in run.server.starts()] == [1.2]


async def test_a_request_that_does_not_leave_gives_its_buckets_token_back(
    autojump_clock: Any,
) -> None:
    """Told a bucket of one at 1/s. A request takes it, a second is refused as it waits
    for the next token (its call cannot afford the second), and a third, cancelled half
    way through its wait: neither reached the server, so a fourth waits only for the
    token the first left, 0.5 s after the third gave up, not two tokens more."""
    scope = Scope("api", rate=1, burst=1)
    waits: list[float] = []

    def refuse(wait: float) -> None:
        raise NotSentError("cannot afford it", status=fanout.Status.RATE_LIMITED)

    began = trio.current_time()
    await scope.request_leaving(began)
    with pytest.raises(NotSentError):
        await scope.request_leaving(began, refuse)
    with trio.move_on_after(0.5):
        await scope.request_leaving(began, waits.append)
    await scope.request_leaving(began, waits.append)
    assert waits == [pytest.approx(1.0), pytest.approx(0.5)]
    assert trio.current_time() - began == pytest.approx(1.0)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(
    model=st.sampled_from(["fixed", "sliding"]),
    rate=st.sampled_from([2.0, 5.0, 10.0, 20.0, 50.0]),
    limit=st.sampled_from([1, 1, 2, 3, 5, 10]),
    latency=st.sampled_from([0.01, 0.05, 0.2]),
    cap=st.sampled_from([None, 4]),
    jitter=st.sampled_from([0.0, 0.0, 0.01, 0.05]),
    headers=st.sampled_from(["draft", "ietf", "x", "none"]),
    retry_after=st.sampled_from(["seconds", "ms", "http-date", "absent"]),
    phase=st.sampled_from([0.0, 0.3, 0.7]),
    set_ups=st.lists(st.sampled_from([0.0, 0.005, 0.02, 0.1, 0.3]), min_size=3, max_size=40),
)
def test_tools_that_set_up_for_any_time_draw_no_429_from_a_told_window(
    model: str, rate: float, limit: int, latency: float, cap: int | None, jitter: float,
    headers: str, retry_after: str, phase: float, set_ups: list[float],
) -> None:  # fmt: skip
    """Any told fixed window (met at any phase) or sliding log, in any header style,
    answering with any jitter, each tool setting up for its own time before it sends
    (in the order calls are admitted): no 429, every call ok, each request counted from
    when it left (`SlidingLog.departure_wait`), and the slack no more than a round trip
    and its jitter. Counted from their admissions, 16 of 100 such turns without jitter
    drew a 429 (a call admitted a window after one still setting up sent first), 29 of
    150 with it, and the spread of the set-ups widened the window: its slack, as long
    as the longest set-up."""

    async def main() -> tuple[_LateRun, float]:
        order = itertools.chain(set_ups, itertools.repeat(0.0))
        config = ServerConfig(
            rate=rate, burst=limit, latency=latency, headers=headers, model=model,
            max_in_flight=cap, jitter=jitter, retry_after=retry_after,
            window_phase=phase if model == "fixed" else 0.0,
        )  # fmt: skip
        scope = Scope("api", limit=limit, per=limit / rate, max_concurrency=cap)
        run = await _late_turn(config, scope, len(set_ups), lambda _: next(order), timeout=600)
        return run, scope.statistics().slack

    run, slack = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert run.server.count(status=429) + run.server.count(status=503) == 0
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert slack <= latency + jitter + 1e-9


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    rate=st.sampled_from([2.0, 5.0, 10.0, 20.0, 50.0]),
    latency=st.sampled_from([0.005, 0.02, 0.05, 0.12]),
    calls=st.integers(4, 14),
    leaves=st.lists(st.sampled_from([0.0, 0.0003, 0.001, 0.002, 0.004, 0.009]), min_size=14),
)
def test_a_paced_burst_of_one_whose_requests_leave_late_draws_no_429(
    rate: float, latency: float, calls: int, leaves: list[float]
) -> None:
    """A told burst of one: every call takes the bucket just as it fills again, so each
    request that leaves late (its tool's own set-up, a process slow to wake it) costs
    the server that much refill, and a request after it that leaves on time reaches an
    empty bucket. Each call here sends its request its own few ms after admission. In
    real time, against 50/s, such requests (woken 0.9-2.3 ms late) drew a 429, and a
    second's wait, every three or four requests. Each booking that takes a full bucket
    now keeps the slack after it, and a request later than that owes the rest
    (`ScopeFront.headers_left`): no 429, and no request sooner than a token after the
    one before it."""

    async def main() -> None:
        config = ServerConfig(rate=rate, burst=1, latency=latency, headers="draft")
        run = await _late_turn(config, Scope("api", rate=rate, burst=1), calls, leaves.__getitem__)
        assert all(r.status is fanout.Status.OK for r in run.turn.results)
        assert run.server.count(status=429) == 0
        starts = run.server.starts()
        assert all(b - a >= 1 / rate - 1e-9 for a, b in itertools.pairwise(starts))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class _HeldAfterLeaving(httpx.AsyncBaseTransport):
    """The ``k``-th request to come through reaches the server ``inbound[k]`` s after its
    headers leave, as the client sees them leave: a server slow to read it, a busy
    network. Nothing on the client's side can measure it."""

    def __init__(self, inbound: dict[int, float]) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._inbound = inbound
        self._through = itertools.count()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        n = next(self._through)
        told = request.extensions.get("trace")

        async def trace(event: str, info: dict[str, Any]) -> None:
            if told is not None:
                await told(event, info)
            if event.endswith(".send_request_headers.started"):
                await trio.sleep(self._inbound.get(n, 0.0))

        request.extensions["trace"] = trace
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.mark.parametrize(
    ("scope", "config", "late", "starts"),
    [
        (
            Scope("api", rate=20, burst=1),
            ServerConfig(rate=20, burst=1, latency=0.05, headers="draft"),
            3, [0.0, 0.055, 0.11, 0.194, 0.244, 0.294],
        ),
        (
            Scope("api", limit=1, per=0.05),
            ServerConfig(rate=20, burst=1, latency=0.05, headers="draft", model="sliding"),
            2, [0.0, 0.1, 0.234, 0.284, 0.334, 0.384],
        ),
    ],
    ids=["bucket", "window"],
)  # fmt: skip
async def test_a_request_written_late_is_counted_from_when_it_was_written(
    autojump_clock: Any, scope: Scope, config: ServerConfig, late: int, starts: list[float]
) -> None:
    """A told bucket of one at 20/s, and a told sliding log of one per 50 ms, answered in
    50 ms: one request's headers take 34 ms to write after it took its token (in real
    time, a full garbage collection in between), so the server counts it that much
    later (0.194 s; 0.234 s). Counted from when its headers began, the next one left a
    token or a window after that, reached the server 16 ms after it, long before any
    answer could say so, and was refused. The bucket, full until the late request
    arrived, lost that refill, which it hears once the headers are written
    (`ScopeFront.wire_written`); the log holds its token a window from then
    (`SlidingLog.written`): the next waits for either.

    The bucket's first two requests open connections (the second is handed on as the
    first answer comes), and each, which a server may read up to ``TOGETHER`` later than
    its round trips show, holds the next that much more: 0.055 and 0.11 s. The log's
    first request, before any answer over a connection already open, may have been
    read as late as its whole round trip (`ScopeFront._window_read_late`): the second
    goes a window after that answer; the late one opens a connection of its own and
    leaves as late again (0.2 s). Its round trip counts from when
    its headers were written: from when they began, 34 ms slower than the others, it
    widened the log's margin, how much round trips vary, and every window after it by
    as much (0.084 s apart, not 0.05).

    (The write is held for less than a token's time: held longer, the next request
    leaves before it is written, and no count sees it yet: README, still missed.)"""
    run = await _late_turn(
        config, scope, 6, lambda _: 0.0, transport=_HeldAfterLeaving({late: 0.034})
    )
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    assert [round(start - run.began, 9) for start in run.server.starts()] == starts


async def test_one_request_slow_on_its_way_out_costs_its_own_lateness_alone(
    autojump_clock: Any,
) -> None:
    """Told a bucket of one at 20/s: the third request takes 30 ms from the HTTP layer to
    its headers (in real time, a garbage collection on its way). The next request waits
    a token after it really left (on the wire, `ScopeFront.wire_wait`), and the rest
    follow a token apart. Kept as a margin, that one spread paced every later request
    30 ms longer, for the scope's life (1.47-1.50x the minimum in one real-time run in
    twenty). (The second waits ``TOGETHER`` more: the first, over a new connection, took
    the full bucket, and may be read that late.)"""
    config = ServerConfig(rate=20, burst=1, latency=0.05, headers="draft")
    scope = Scope("api", rate=20, burst=1)
    run = await _late_turn(config, scope, 8, lambda _: 0.0, transport=_LateOnTheWay({2: 0.03}, {}))
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    starts = [round(start - run.began, 9) for start in run.server.starts()]
    assert starts == [0.0, round(0.05 + TOGETHER, 9), 0.13, 0.18, 0.23, 0.28, 0.33, 0.38]
    assert scope.statistics().slack == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("model", ["sliding", "fixed"])
async def test_one_request_slow_on_its_way_out_holds_a_told_window_its_own_lateness_alone(
    autojump_clock: Any, model: Any
) -> None:
    """Told 2 per 100 ms: the second request takes 30 ms from the HTTP layer to its
    headers. The window counts each request from when it left (`SlidingLog.left`), so
    the third goes a window after the first, the fourth a window after the second really
    left, and so on: no margin is kept for the way to the headers, neither as how much
    it varied nor in the round trips, which are timed from the headers
    (`Lags.margin`). Kept as a margin, that one spread held every later
    window 30 ms longer (in real time, twenty requests waking together took up to 60 ms
    to reach their headers, and 200 calls at 20 per 0.4 s took 1.13-1.19x the minimum;
    with tools that set up for 20 ms first, 1.12-1.13x, 1.08-1.10x without)."""
    config = ServerConfig(rate=20, burst=2, latency=0.01, model=model, headers="draft")
    scope = Scope("api", limit=2, per=0.1)
    run = await _late_turn(config, scope, 6, lambda _: 0.0, transport=_LateOnTheWay({1: 0.03}, {}))
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    starts = [round(start - run.began, 9) for start in run.server.starts()]
    # A fixed window forgets the second as it ends, and the answers say so: the fourth
    # goes as the third's answer shows room, not a window after the second.
    second = 0.03 if model == "sliding" else 0.01
    assert starts == pytest.approx([0.0, 0.03, 0.1, 0.1 + second, 0.2, 0.2 + second])
    assert scope.statistics().slack == pytest.approx(0.0, abs=1e-9)


_SLACK = 0.004  # how much the first two calls' set-ups differ: the slack the rest is measured by


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    rate=st.sampled_from([5.0, 20.0, 50.0]),
    latency=st.sampled_from([0.0, 0.02]),
    calls=st.integers(3, 12),
    leaves=st.lists(st.sampled_from([0.0, 0.001, 0.003, _SLACK]), min_size=10, max_size=10),
    inbound=st.lists(st.sampled_from([0.0, 0.001, 0.003, _SLACK]), min_size=10, max_size=10),
)
def test_a_paced_burst_of_one_keeps_its_slack_for_the_way_to_the_server(
    rate: float, latency: float, calls: int, leaves: list[float], inbound: list[float]
) -> None:
    """A told burst of one whose requests leave late (each tool's own set-up, the first
    tool's ``_SLACK`` and the second's none), and from the third on reach the server up
    to ``_SLACK`` later than they left, which nothing here can see. The lateness the
    scope sees is owed whole; how much it varies (a busy process, which the server is
    taken to be as slow to read) is the slack kept after each full bucket, for the way
    in: no 429, and each request reaches the server a token after the one before it at
    least. (A set-up every call takes alike is no measure of the way in, and is not
    kept: `test_a_tools_own_set_up_before_its_request_is_no_slack`.)

    Before, a request that left up to the slack late owed nothing (the slack was its
    allowance), and one on time after it left exactly a token later: 3 ms late, then 3
    ms on the way in, and the next drew a 429. Told a bucket of one at 20/s, in real
    time, 5 of 35 runs drew one, and a second's wait. And a request held before any
    warm answer (`ScopeFront.warm_hold`, with 20 ms answers) took the slack kept after
    its own fill for tokens spent, and owed the hold less it: 1 ms slower on its way
    in, and the next drew a 429."""

    async def main() -> None:
        config = ServerConfig(rate=rate, burst=1, latency=latency, headers="draft")
        way_in = _HeldAfterLeaving(dict(enumerate(inbound, 2)))
        scope = Scope("api", rate=rate, burst=1)
        set_ups = iter([_SLACK, 0.0, *leaves])  # in the order the tools run
        run = await _late_turn(config, scope, calls, lambda _: next(set_ups), way_in)
        assert all(r.status is fanout.Status.OK for r in run.turn.results)
        assert run.server.count(status=429) == 0
        starts = run.server.starts()
        assert all(b - a >= 1 / rate - 1e-9 for a, b in itertools.pairwise(starts))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_a_booking_woken_late_widens_the_slack(autojump_clock: Any) -> None:
    """A burst of one: the second call's token is due at 0.25 s and its holder is woken
    10 ms later (a busy loop), as admission tells the scope (`take_tokens`). The
    server's bucket, full from 0.25 s, loses that refill: the slack takes it at once,
    and the next token comes 10 ms later too."""
    scope = Scope("api", rate=4, burst=1)
    first = await scope.reserve(1.0, 10.0)
    assert first is not None
    assert await scope.confirm(first)
    second = await scope.reserve(1.0, 10.0)
    assert second is not None
    assert second.start == 0.25
    await trio.sleep(0.26)
    assert await scope.confirm(second)
    assert second.took_full
    scope.observe_wake_lag(trio.current_time() - second.start)
    assert scope.statistics().slack == pytest.approx(0.01)
    third = await scope.reserve(1.0, 10.0)
    assert third is not None
    assert third.start == pytest.approx(0.51)


async def test_a_request_that_leaves_past_its_slack_owes_the_rest(autojump_clock: Any) -> None:
    """A burst of one, told 4/s: a call whose request reaches the wire 50 ms after its token
    (a connection's handshake) owes the server's lost refill, up to its own token, and the
    booking after it moves back by as much. One that leaves on time owes nothing."""
    scope = Scope("api", rate=4, burst=1, slack=0.0)
    first = await scope.reserve(1.0, 10.0)
    assert first is not None
    assert await scope.confirm(first)
    admitted = trio.current_time()
    second = await scope.reserve(1.0, 10.0)
    assert second is not None
    assert second.start == 0.25
    scope.headers_left(admitted)  # on time
    assert await scope.wait_for(1.0) == 0.5
    await trio.sleep(0.25)
    assert await scope.confirm(second)
    await trio.sleep(0.05)
    scope.headers_left(0.25)
    assert await scope.wait_for(1.0) == pytest.approx(0.25)  # due at 0.55, not 0.5
    await trio.sleep(1.0)
    third = await scope.reserve(1.0, 10.0)
    assert third is not None
    assert await scope.confirm(third)
    await trio.sleep(2.0)  # 2 s late: owes one token, its own, not eight
    scope.headers_left(1.3)
    assert await scope.wait_for(1.0) == pytest.approx(0.25)


@pytest.mark.parametrize("seed", [0, 2, 6])
async def test_answers_that_vary_in_time_are_no_late_arrival(
    autojump_clock: Any, seed: int
) -> None:
    """Told a bucket of one at 20/s, against a server whose answers take 50 to 90 ms (its
    work varies; in real time, an independent server's body held back 40 ms by Nagle's
    algorithm). From the fourth on, requests go over connections already open, seen
    leaving on the wire, and reach the server as they leave: a slow answer says how long
    the server took, not that its request arrived late; nor, beyond how much the warm
    answers vary, does a slow answer to a request that opened a connection.

    Taken for late first arrivals, the slow answers became the slack, kept after every
    request: the last of the 30 left at 2.09, 2.40 and 2.26 s with these seeds (1.45 s
    at the least; 1.5x in real time). Now the slack comes back to (almost) nothing as
    warm answers show how much the server's time varies, the bookings ahead book
    again sooner, and the last requests leave a token apart: 1.50-1.54 s. (With the
    first, cold answers taken for lateness until then, 1.55-1.79 s.) One of them may
    leave a few ms later, where a quicker warm call shows the first burst may have
    been read that much later, and the wire's count owes it (`WireCount.owe_late_arrival`)."""
    config = ServerConfig(rate=20, burst=1, latency=0.05, jitter=0.04, seed=seed)
    scope = Scope("api", rate=20, burst=1)
    run = await _late_turn(config, scope, 30, lambda _: 0.0)
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
    assert run.server.count(status=429) == 0
    starts = [start - run.began for start in run.server.starts()]
    assert all(b - a >= 0.05 - 1e-9 for a, b in itertools.pairwise(starts))
    assert starts[-1] - starts[-6] == pytest.approx(0.25, abs=0.01)
    assert starts[-1] < 29 * 0.05 + 0.15
    assert scope.statistics().slack < 0.001


class _CountedConfirms:
    """A scope whose confirmations are counted: a loop that never lets time move fails."""

    def __init__(self, scope: Scope) -> None:
        self.scope, self.confirms = scope, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scope, name)

    async def confirm(self, booking: Booking) -> bool:
        self.confirms += 1
        assert self.confirms < 100, "confirmed again and again, time never moving"
        return await self.scope.confirm(booking)


async def test_a_waiting_call_follows_its_booking_as_it_moves_and_is_judged_again(
    autojump_clock: Any,
) -> None:
    """A told bucket of one at 4/s: a call waits for its token at 0.25 s; meanwhile a
    late request owes half a token (`TokenBucket.owe`), and another a whole one. The
    call wakes at 0.25, sleeps on to where its booking moved, 0.375, then to 0.625,
    and starts there, booked once. A second call, whose deadline the move passes,
    is answered short then, its tokens handed back, and never starts late."""
    scope = Scope("api", rate=4, burst=1)
    first = await scope.reserve(1.0, 10.0)
    assert first is not None
    assert await scope.confirm(first)

    async def owe(at: float, tokens: float) -> None:
        await trio.sleep_until(at)
        scope.bucket.owe(tokens)

    async def take(deadline: float) -> tuple[float, object]:
        budget = Budget(deadline)
        shortfall = await take_tokens(
            [scope], 1.0, budget=budget, patience=budget.patience(), on_wait=lambda *_: None
        )
        return trio.current_time(), shortfall

    async with trio.open_nursery() as nursery:
        nursery.start_soon(owe, 0.1, 0.5)
        nursery.start_soon(owe, 0.3, 1.0)
        assert await take(10.0) == (0.625, None)
    assert scope.statistics().bucket.reserved == 2  # the first call's, and this one's once

    async with trio.open_nursery() as nursery:
        nursery.start_soon(owe, 0.7, 2.0)  # the next token, due at 0.875, moves to 1.375
        ended, shortfall = await take(1.2)
    assert isinstance(shortfall, Shortfall)
    assert ended < 1.2
    assert scope.bucket.wait_for(1.0) == pytest.approx(1.375 - trio.current_time())


async def test_a_call_starts_ahead_of_its_token_but_never_inside_a_block(
    autojump_clock: Any,
) -> None:
    """Told one a second with a burst of one, a warm answer in, and a call whose request
    got to its headers 0.2 s after it started: a call waiting for a token starts 0.2 s
    before it (`ScopeFront.admission_lead`), but none starts inside a block (a 429's
    wait). Woken 0.2 s before a block's end, a booking was refused there, booked again
    for the block's end, found no wait left before its lead, and was refused again at
    once, the mock clock never moving."""
    scope = Scope("api", rate=1, burst=1)
    scope.observe_call(0.05, ok=True)  # a warm answer
    scope.headers_left(-0.2)  # a call admitted at -0.2 s sends its first request now
    assert scope.admission_lead() == pytest.approx(0.2)
    counted = _CountedConfirms(scope)
    budget = Budget(60.0)

    async def admit() -> float:
        shortfall = await take_tokens(
            [counted], 1.0, budget=budget, patience=budget.patience(),
            on_wait=lambda *_: None, admits=lambda _: None,
        )  # fmt: skip
        assert shortfall is None
        return trio.current_time()

    await scope.block_until(5.0)
    assert scope.admission_lead() == 0.0
    assert await admit() == 5.0  # the block's end, where its token is
    assert await admit() == pytest.approx(5.8)  # its token at 6, less the lead
    assert counted.confirms == 2


async def test_a_call_that_slept_for_another_scopes_token_did_not_wake_late(
    autojump_clock: Any,
) -> None:
    """A call on two told scopes, a burst of one at 10/s and one at 1/s: the second call
    sleeps a second for the slower scope's token, its token on the faster due 0.9 s
    before it woke. That is no late wake-up (`ScopeFront.observe_wake_lag`): the faster
    scope's slack stays nothing. Measured from that token, it was 0.9 s, and every call
    of the faster scope alone then paused that long after its token."""
    fast, slow = Scope("fast", rate=10, burst=1), Scope("slow", rate=1, burst=1)
    budget = Budget(60.0)
    for _ in range(2):
        shortfall = await take_tokens(
            [fast, slow], 1.0, budget=budget, patience=budget.patience(),
            on_wait=lambda *_: None,
        )  # fmt: skip
        assert shortfall is None
    assert trio.current_time() == 1.0
    assert fast.statistics().slack == 0.0


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    model=st.sampled_from(["bucket", "sliding", "fixed"]),
    rate=st.sampled_from([5.0, 10.0, 20.0, 50.0]),
    burst=st.integers(1, 4),
    latency=st.sampled_from([0.01, 0.05, 0.12]),
    uneven=st.sampled_from([0.001, 0.003, 0.0045]),
    seed=st.integers(0, 1_000),
    calls=st.integers(4, 16),
    set_up=st.sampled_from([0.0, 0.02, 0.1]),
)
def test_a_server_taking_in_new_connections_unevenly_draws_no_429(
    model: str, rate: float, burst: int, latency: float, uneven: float, seed: int,
    calls: int, set_up: float,
) -> None:  # fmt: skip
    """Any told token bucket, sliding log or fixed window whose server reads each new
    connection's first request up to a few ms later than another's (``connect_jitter``),
    which no round trip shows: no 429, every call ok. Before any answer every request
    opens a connection, and one read late left the next, sent a token after it, to
    reach a bucket too soon (a bucket of one at 20/s read 0-3 ms unevenly drew a 429
    in 40 of 40 seeded turns); after it, the one cold round trip showed no unevenness,
    and a request over a new connection read 0.9 ms later than the first was followed
    inside its window (one per 20 ms, tools setting up for 20 ms, read 0-1 ms
    unevenly: a 429 in 10 of 40). Windows longer than the first round trip: shorter,
    the second request may leave before any answer (README, still missed)."""
    assume(model == "bucket" or latency + uneven < burst / rate)

    async def main() -> _LateRun:
        config = ServerConfig(
            rate=rate, burst=burst, latency=latency, headers="draft", model=model,
            connect_jitter=uneven, seed=seed,
        )  # fmt: skip
        if model == "bucket":
            scope = Scope("api", rate=rate, burst=burst)
        else:
            scope = Scope("api", limit=burst, per=burst / rate)
        return await _late_turn(config, scope, calls, lambda _: set_up, timeout=600)

    run = replayable_run(main, seed=seed)  # trio's order of wake-ups, seeded too
    assert run.server.count(status=429) == 0
    assert all(r.status is fanout.Status.OK for r in run.turn.results)
