"""Pacing against the throttling server: as early as the server allows, never earlier.

Every test runs client and server in one ``trio.run`` on a MockClock, so each
start time is exact: the calls the schedule can finish by their deadline are
answered ok, none late, and jitter in the server's answers does not delay
what it admits on arrival.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
import fanout.httpx2 as fanout_httpx2
from benchmarks.scenarios import FULL, earliest_starts, max_ok_by, min_makespan
from fanout import Kind, Registry, Runner, Scope, ServerCount, Status, TokenBucket, ToolCall
from fanout._learning import TOGETHER
from fanout.testing import ServerConfig, ThrottlingServer, serve_throttled
from tests.test_bucket import start_now

if TYPE_CHECKING:
    from collections.abc import Callable


async def _turn(
    config: ServerConfig,
    scope: Scope,
    calls: int,
    *,
    deadline: float = 120.0,
    make_client: Callable[..., Any] = fanout.http_client,
    wall_clock: Callable[[], float] = time.time,
) -> tuple[fanout.Turn, ThrottlingServer, float]:
    """``calls`` fetches through ``scope`` against a server of ``config`` (with a
    client of httpx's shape, and the server's clock for dates); the turn's result,
    the server, and when it began."""
    async with (
        serve_throttled(config, wall_clock=wall_clock) as server,
        make_client(base_url=server.url) as client,
    ):
        reg = Registry()

        @reg.tool(kind=Kind.READS, scopes=[scope.name], timeout=deadline)
        async def fetch(n: int) -> str:
            response = await client.get(f"/items/{n}")
            response.raise_for_status()
            return response.text

        runner = Runner(reg, scopes=[scope], inline_wait=None, turn_timeout=deadline)
        began = trio.current_time()
        turn = await runner.run_turn([ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(calls)])
    return turn, server, began


def _answered(turn: fanout.Turn) -> list[float]:
    return [e.time for e in turn.trace if e.kind is fanout.EventKind.ANSWERED]


def _ok(turn: fanout.Turn) -> int:
    return sum(r.status is Status.OK for r in turn.results)


async def test_every_call_the_schedule_can_finish_by_its_deadline_is_sent(
    autojump_clock: Any,
) -> None:
    """40 calls, 10/s with a burst of 10, 100 ms each, 2 s deadlines: the schedule can
    finish 29, the last started at 1.9 s and answered at 2.0 s. Each is sent by its
    token, in order; the rest are answered at once, and nothing is answered late.

    The burst's answers all opened connections, so until a call over a reused one
    answers, 0.1 s may be a late first arrival rather than the server's latency: the
    requests at 0.2 and 0.3 reuse connections and wait for that worst case (the one
    at 0.1 opened a connection of its own). The answer at 0.4 shows the latency,
    and the schedule is back on its tokens, but for ``TOGETHER``: the burst, over new
    connections, may have been read that late while the server's bucket stayed full
    (`fanout._window.Arrivals.latest_read`). The 29th token, at 1.9, ends past the
    deadline by as much."""
    config = ServerConfig(rate=10, burst=10, latency=0.1, headers="draft")
    turn, server, began = await _turn(config, Scope("api", rate=10, burst=10), 40, deadline=2.0)
    starts = [round(start - began, 9) for start in server.starts()]
    held = [round(at, 9) for at in (0.1 + TOGETHER, 0.3, 0.4, 0.4 + TOGETHER)]
    paced = [round(0.1 * k + TOGETHER, 9) for k in range(5, 19)]
    assert starts == [0.0] * 10 + held + paced
    assert server.count(status=429) == 0
    # The one whose token came at 1.9 would end past the deadline, and is not sent.
    assert _ok(turn) == 28
    assert max(_answered(turn)) - began <= 2.0


async def test_jitter_in_the_answers_does_not_delay_what_the_server_admits_on_arrival(
    autojump_clock: Any,
) -> None:
    """The server admits a request when it arrives and jitters only its answer (0-100 ms
    here): the slack is not how widely the answers spread, nor how late the burst's
    earliest answer came beyond what the server's own time varies by, and every start
    after the first warm answers is on its token, but for what the wire's count owes
    once: the burst's earliest answer less the quickest warm call, taken as a late read
    (`WireCount.owe_late_arrival`), and 5 ms, and the 5 ms the burst's first request
    owed before any answer (`ScopeFront._new_connection_read_late`); 36 ms here, 1.4% of
    the turn (11 ms of it from the first warm answers on)."""
    config = ServerConfig(rate=20, burst=10, latency=0.05, jitter=0.1, headers="draft")
    scope = Scope("api", rate=20, burst=10)
    turn, server, began = await _turn(config, scope, 60)
    assert _ok(turn) == 60
    assert server.count(status=429) == 0
    records = server.records
    # The burst's earliest answer, less the fastest warm call seen while it was the
    # latest burst, was 26 ms here, and the slack until the warm answers, spread over
    # 98 ms, showed the server's time varies by more: a burst's answer later than the
    # fastest by less than that says nothing of a late arrival (`_observe_arrival`).
    assert scope.statistics().slack == pytest.approx(0.0, abs=1e-9)
    earliest = min(r.end for r in records[:10]) - began
    ideal = earliest_starts(60, rate=20, burst=10, latency=0.05)
    late = [start - began - token for start, token in zip(server.starts(), ideal, strict=True)]
    # Until a call over a reused connection answers, such a
    # request waits for the worst case: the burst's earliest answer, all of it a late
    # first arrival. Then every start is on its token again, but for what the wire
    # owes: no warm call is quicker than the server's least latency. The first warm
    # answers, slow ones, show a read under a ms late, and answers varying by more
    # than 5 ms: that much is owed at once (the server reads a burst a few ms apart,
    # `WireCount.owe_late_arrival`), the rest as quicker warm calls come.
    assert max(late[:16]) <= earliest + 1e-9
    assert max(late[16:]) <= earliest - 0.05 + 0.005 + TOGETHER + 1e-9
    assert all(0.01 - 1e-9 <= x <= 0.011 for x in late[16:27])
    assert min(late) >= -1e-9


async def test_a_call_held_through_a_429_is_no_sample_of_the_burst_s_arrival(
    autojump_clock: Any,
) -> None:
    """A burst's first call is refused before any of the burst answered (another
    client spent the tokens), and the server says wait 0.5 s. The call answered after
    that wait went out on a later token: its answer says nothing of how late the burst
    reached the server. Read as the burst's first answer, the wait became the slack,
    and every burst after it began paused 0.5 s."""
    scope = Scope("api", rate=10, burst=10)
    booking = await scope.reserve(1.0, 0.0)
    assert booking is not None
    assert await scope.confirm(booking)
    await trio.sleep(0.001)
    await scope.on_throttled(0.5, sent_at=0.0)
    scope.observe_call(0.001, ok=False)
    await trio.sleep(0.5)
    again = await scope.reserve(1.0, 0.0)
    assert again is not None
    assert await scope.confirm(again)
    await trio.sleep(0.05)
    scope.observe_call(0.05, ok=True)
    assert scope.statistics().slack == 0.0


def test_a_floored_count_does_not_pull_the_schedule_later() -> None:
    """Remaining is floored: 0 may mean 0.9 tokens. A bucket that agrees with the server
    up to that token is not synced down, so the next start does not move at each answer."""

    async def main() -> None:
        bucket = TokenBucket(10.0, 10.0)
        start_now(bucket, 10)  # ten start at once
        await trio.sleep(0.15)  # 1.5 tokens back; the answer to a request sent at 0.1
        assert bucket.sync(ServerCount(0.0, elapsed=0.05)) is False
        assert bucket.wait_for(1.0) == 0.0
        # A server that surely has less (another client spent it) still wins.
        assert bucket.sync(ServerCount(0.0, started_since=1.0)) is True
        assert bucket.wait_for(1.0) == pytest.approx(0.2)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_surplus_is_adopted_without_assuming_a_refill() -> None:
    """The server counted when the request arrived, which may have been late (a slow
    first connection): only the count itself is sure, not a refill since sending."""

    async def main() -> None:
        bucket = TokenBucket(10.0, 10.0)
        start_now(bucket, 10)  # ten start at once
        await trio.sleep(0.05)
        assert bucket.sync(ServerCount(3.0, elapsed=0.05)) is True
        assert bucket.statistics().tokens == pytest.approx(3.0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=25, deadline=None)
@given(
    rate=st.sampled_from([2.0, 5.0, 10.0, 20.0]),
    burst=st.integers(1, 10),
    latency=st.sampled_from([0.01, 0.05, 0.1, 0.25]),
    deadline=st.sampled_from([0.5, 1.0, 2.0]),
    calls=st.integers(1, 40),
)
def test_fanout_finishes_what_the_schedule_can_and_nothing_late(
    rate: float, burst: int, latency: float, deadline: float, calls: int
) -> None:
    """For any limits and deadline, told the limits, fanout answers ok all but at most
    one of the calls the optimal schedule can finish (the one that would end exactly
    at the deadline, where the deadline wins the tie), causes no 429, and answers
    every call by its deadline."""
    can = max_ok_by(deadline, calls, rate=rate, burst=burst, latency=latency)

    async def main() -> None:
        config = ServerConfig(rate=rate, burst=burst, latency=latency, headers="draft")
        scope = Scope("api", rate=rate, burst=burst)
        turn, server, began = await _turn(config, scope, calls, deadline=deadline)
        assert _ok(turn) >= can - 1
        assert server.count(status=429) == 0
        assert max(_answered(turn)) - began <= deadline + 1e-9

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_a_scope_told_its_concurrency_probes_with_that_many_calls(
    autojump_clock: Any,
) -> None:
    """No rate, 4 in flight: the probe is 4 calls at once, so no latency is spent
    learning that there is no rate. The server states nothing, so a slow start
    follows; the server took the probe's four at once, so the slow start's bucket
    holds four, and each wave goes whole as its slots free: 2.0 s, the minimum.
    (Paced one at a time at eight per latency, each wave after the probe spread
    over 0.075 s, and every slot kept its offset to the end: 2.075 s.)"""
    config = ServerConfig(rate=None, max_in_flight=4, latency=0.2, headers="draft")
    turn, server, began = await _turn(config, Scope("api", max_concurrency=4), 40)
    assert _ok(turn) == 40
    assert server.count(status=503) == 0
    starts = [round(start - began, 9) for start in server.starts()]
    assert starts == [round(0.2 * (i // 4), 9) for i in range(40)]


async def test_below_a_wider_cap_the_wave_after_the_probe_is_paced(
    autojump_clock: Any,
) -> None:
    """Told a cap of 12, the probe is four wide, and the server (23.6/s, a burst of
    four, no numbers) admits them. The wave after it is paced, not sent whole: the
    cap would let eight more go before the first 429 came back. (Sent four at once,
    three were refused together, which spent learning's 429s at once, and the rest
    crawled at 6/s: 8.4 s for 49 calls, against 4.3 s paced.)"""
    config = ServerConfig(
        rate=23.64361363675002, burst=4, latency=0.08001188267837449,
        jitter=0.040005941339187244, max_in_flight=12, headers="none", reset="next", seed=2,
    )  # fmt: skip
    turn, server, began = await _turn(config, Scope("api", max_concurrency=12), 49)
    assert _ok(turn) == 49
    assert server.count(status=429) <= 2
    starts = [round(start - began, 9) for start in server.starts()]
    assert starts[:4] == [0.0] * 4
    assert starts[4] < starts[5] < starts[6]  # one at a time after the probe


async def test_a_wide_probe_costs_one_429_of_learning_s_three_and_counts_its_own_requests(
    autojump_clock: Any,
) -> None:
    """A server with a burst of one refuses three of the four probes, one congestion
    event, and learning may spend two more finding the rate; a burst of four
    admits them all, and its first answer's Remaining (3) is read as what is left
    after the other three probes too, so the calls after the probe wait for tokens
    instead of being refused."""
    one = ServerConfig(rate=4, burst=1, latency=0.1, headers="draft")
    turn, server, _ = await _turn(one, Scope("api", max_concurrency=4), 8)
    assert _ok(turn) == 8
    assert server.count(status=429) <= 3 + 2
    four = ServerConfig(rate=4, burst=4, latency=0.1, headers="draft")
    turn, server, began = await _turn(four, Scope("api", max_concurrency=4), 12)
    assert _ok(turn) == 12
    first = server.records[:6]
    assert [r.status for r in first] == [200] * 6
    assert [r.start - began for r in first[:4]] == [0.0] * 4
    assert first[4].start - began >= 0.25  # one token a quarter second after the four


async def test_the_jitter_rows_minimum_is_met_by_the_optimal_schedule(
    autojump_clock: Any,
) -> None:
    """The benchmark's minimum with jitter is exact: requests sent at the optimal
    schedule's starts finish exactly then, and none is refused."""
    scenario = next(s for s in FULL if s.name == "jitter")
    config = ServerConfig(
        rate=scenario.rate, burst=scenario.burst, latency=scenario.latency,
        jitter=scenario.jitter, seed=scenario.seed,
    )  # fmt: skip
    starts = earliest_starts(
        scenario.calls, rate=scenario.rate, burst=scenario.burst, latency=scenario.latency
    )
    async with serve_throttled(config) as server, fanout.http_client(base_url=server.url) as client:
        began = trio.current_time()

        async def send(at: float) -> None:
            await trio.sleep_until(began + at)
            (await client.get("/")).raise_for_status()

        async with trio.open_nursery() as nursery:
            for at in starts:
                nursery.start_soon(send, at)
    assert trio.current_time() - began == pytest.approx(scenario.min_makespan, abs=1e-9)
    assert scenario.min_makespan > min_makespan(
        scenario.calls, rate=scenario.rate, burst=scenario.burst, latency=scenario.latency
    )


@pytest.mark.parametrize("library", ["httpx", "httpx2"])
async def test_a_slow_first_connection_draws_no_429_and_loses_no_token(
    autojump_clock: Any, library: str
) -> None:
    """The first request of every new connection reaches the server 100 ms late. The
    burst of 10 opens 10 connections, so the server refills from 0.1 s and answers
    all ten at 0.15 s: that looks like a slower server, not a late arrival, until a
    call over a reused connection answers. Requests over reused connections wait for
    the worst case meanwhile (0.15 s, all of it a late arrival); the first of their
    answers shows the 0.1 s the arrival was late, and the requests booked before it
    owe that refill on the wire, and 5 ms more as a margin for the way in
    (`WireCount.owe_late_arrival`). The slack keeps none of it: a request over a
    reused connection is read as it leaves, and one that opens a connection owes
    the 0.1 s on the wire itself (`wire_written`). The first request the wire's count
    holds leaves the slack after its token, up to 5 ms (`ScopeFront.wire_wait`): 5 ms
    more. The makespan is the least any client could have and those 10 ms, with no
    429. (Both libraries' connection pools say when a request opens a connection.)"""
    config = ServerConfig(rate=20, burst=10, latency=0.05, connect_delay=0.1, headers="draft")
    scope = Scope("api", rate=20, burst=10)
    if library == "httpx":
        turn, server, began = await _turn(config, scope, 60)
    else:
        turn, server, began = await _turn(config, scope, 60, make_client=fanout_httpx2.http_client)
    assert _ok(turn) == 60
    assert server.count(status=429) == 0
    starts = [round(start - began, 9) for start in server.starts()]
    held = [0.35, 0.4]
    assert starts == [0.1] * 10 + [0.15, 0.2, 0.25] + held + [
        round(0.41 + 0.05 * k, 9) for k in range(45)
    ]
    assert scope.statistics().slack == pytest.approx(0.0)
    assert max(r.end for r in server.records) - began == pytest.approx(
        0.1 + min_makespan(60, rate=20, burst=10, latency=0.05) + 0.01
    )
