"""Learning a rate from 429s alone: no limit, no Remaining, perhaps not even a Retry-After.

Against the real throttling server on 127.0.0.1, on trio's mock clock, with
both sides on one wall clock (so HTTP-dates are exact): every start time and
request count asserted here is exact.
"""

from __future__ import annotations

import random
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from benchmarks.scenarios import max_ok_by
from fanout import EventKind, Kind, Registry, Runner, Scope, Status, ToolCall
from fanout._learning import RateLearner
from fanout.testing import ServerConfig, ThrottlingServer, serve_throttled

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

# The wall clock of server and client at trio time 0: a quarter past a whole second.
EPOCH = 1_700_000_000.25


@asynccontextmanager
async def api(
    config: ServerConfig, epoch: float = EPOCH
) -> AsyncIterator[tuple[ThrottlingServer, httpx.AsyncClient]]:
    """The server and a client on one wall clock, which reads ``epoch`` at trio time 0."""

    def wall() -> float:
        return epoch + trio.current_time()

    transport = fanout.FanoutTransport(wall_clock=wall)
    async with (
        serve_throttled(config, wall_clock=wall) as server,
        httpx.AsyncClient(
            transport=transport, base_url=server.url, headers={"x-api-key": "k"}
        ) as client,
    ):
        yield server, client


async def learn(
    config: ServerConfig, calls: int, scope: Scope | None = None, *, epoch: float = EPOCH
) -> tuple[ThrottlingServer, fanout.Turn]:
    """``calls`` fetches through ``scope`` (default: one told nothing), against ``config``."""
    scope = scope if scope is not None else Scope("key")
    async with api(config, epoch) as (server, client):
        registry = Registry()

        @registry.tool(kind=Kind.READS, scopes=[scope.name], timeout=600)
        async def fetch(n: int) -> str:
            response = await client.get(f"/items/{n}")
            response.raise_for_status()
            return f"item {n}"

        # Seeded backoff jitter: a run replays exactly, counterexamples included.
        runner = Runner(
            registry, scopes=[scope], inline_wait=None, turn_timeout=600, rng=random.Random(0)
        )
        turn = await runner.run_turn([ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(calls)])
    return server, turn


def shape(retry_after: Any) -> ServerConfig:
    """The benchmark's shape: 20/s, burst 10, 50 ms, no state headers."""
    return ServerConfig(rate=20, burst=10, latency=0.05, headers="none", retry_after=retry_after)


async def test_after_the_probe_the_rate_starts_slow_and_doubles_each_round_trip(
    autojump_clock: Any,
) -> None:
    """A slow start, as TCP's: the probe two wide, then one request per latency more with
    each success (3 per latency, 4, 5...), paced one at a time, never all at once."""
    server, _ = await learn(shape("absent"), 60)
    starts = server.starts()
    assert starts[:6] == pytest.approx([0.0, 0.0, 0.05, 0.0625, 0.075, 0.0875], abs=1e-9)
    # The first 429 finds the rate at its fastest, and the server's bucket drained by it
    # alone: one refused request, not a wave.
    refused = [r.start for r in server.records if r.status == 429]
    assert refused[0] == pytest.approx(0.146875, abs=1e-9)
    assert sum(1 for t in refused if t < refused[0] + 0.05) == 1


@pytest.mark.parametrize(
    ("retry_after", "later", "end"),
    [
        ("ms", [0.9745612103265691, 1.9994368057611982], 2.616507631049192),
        ("http-date", [1.6675835553815639], 2.8469241230891864),
        ("absent", [0.9745612103265686, 1.99943680576119], 2.6165076310491786),
    ],
)
async def test_no_numbers_at_all_costs_two_or_three_429s(
    autojump_clock: Any, retry_after: Any, later: list[float], end: float
) -> None:
    """60 calls against 20/s, burst 10, with no headers: every call answered ok.

    The first 429 ends the slow start; the second bounds the rate from above.
    Where no slower rate is ruled out, the rate grows towards the fastest that
    fits while learning has a 429 left, and spends it (not with HTTP-dates,
    whose 429s block until a whole second of the server's clock): 1.03 times
    the minimum of 2.55 s (1.12 with HTTP-dates). With a probe of one, two
    429s and 1.04 times.
    """
    server, turn = await learn(shape(retry_after), 60)
    assert all(r.status is Status.OK for r in turn.results)
    refused = [r.start for r in server.records if r.status == 429]
    assert refused == pytest.approx([0.146875, *later], abs=1e-9)
    assert server.count(status=200) == 60
    assert server.records[-1].end == pytest.approx(end, abs=1e-9)


@pytest.mark.parametrize(("latency", "before"), [(0.1, 7.61), (0.3, 18.28)])
async def test_bare_429s_a_round_trip_long_are_learned_without_a_crawl(
    autojump_clock: Any, latency: float, before: float
) -> None:
    """10/s, burst 10, no headers, 50 calls, answers a round trip long: the second 429 came
    while the first's round trip was out, and the fit made then (missing those requests)
    said "at most 1.6/s". The fit made once they answered said up to 13/s, but the rate
    only ever came down to it, and grew by a sixtieth a second: ``before`` seconds, where
    the minimum is 4.05 s plus the latency. Now the answered fit stands, and the rate
    grows towards its fastest while a 429 is left to spend."""
    config = ServerConfig(rate=10, burst=10, latency=latency, headers="none", retry_after="absent")
    server, turn = await learn(config, 50)
    assert all(r.status is Status.OK for r in turn.results)
    assert server.count(status=429) <= 3
    minimum = (50 - 10) / 10 + latency
    makespan = max(r.end for r in server.records)
    assert makespan <= 1.2 * minimum < before


async def test_an_http_date_wait_ends_at_the_servers_next_second(autojump_clock: Any) -> None:
    """Read against the server's clock, not its Date's whole second: the wait ends on time.

    The server's clock reads a quarter past at t=0; the 429 at 0.208 says
    "retry at the next whole second", which is t=0.75 (a Date alone would
    have said a whole second from 0.208).
    """
    server, _ = await learn(shape("http-date"), 60)
    refused = next(r.start for r in server.records if r.status == 429)
    after = min(t for t in server.starts() if t > refused)
    assert after == pytest.approx(0.75, abs=1e-6)  # epoch-sized floats: a microsecond


def _bare_429s(rate: float, burst: int, latency: float, calls: int) -> None:
    """``calls`` through a scope told nothing, against a token bucket that states no
    headers and no Retry-After: at most three 429s, none failed."""

    async def main() -> tuple[ThrottlingServer, fanout.Turn]:
        config = ServerConfig(
            rate=rate, burst=burst, latency=latency, headers="none", retry_after="absent"
        )
        return await learn(config, calls)

    server, turn = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert server.count(status=429) <= 3
    assert all(r.status is Status.OK for r in turn.results)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    rate=st.floats(5, 50),
    burst=st.integers(1, 25),
    latency=st.floats(0.01, 0.2),
    calls=st.integers(20, 60),
)
def test_learning_from_bare_429s_draws_at_most_three(
    rate: float, burst: int, latency: float, calls: int
) -> None:
    """Any token bucket in range, no headers, no Retry-After: at most three 429s, none
    failed. The same twelve each run, so that CI is repeatable; what a random draw
    found beyond them is pinned below."""
    _bare_429s(rate, burst, latency, calls)


@pytest.mark.xfail(
    strict=True,
    reason="open: a slow start that spends a deep burst (20 at 5/s) guesses a burst's "
    "worth a second after its first 429, four times the rate; two more 429s follow, "
    "read as a window that shut, and its reopening is paced too fast: a fourth",
)
def test_a_deep_slow_bucket_stating_nothing_draws_a_fourth() -> None:
    """Found by a random draw in the clean-clone CI run (the property above was not
    derandomized then); the code of the two sessions before draws it too: 429s at
    0.207, 0.257, 0.376 and 1.351 s, every call ok."""
    _bare_429s(5.0, 20, 0.0546875, 27)


def test_admissions_after_a_429_prove_a_floor() -> None:
    """The n-th admission t seconds after a 429 proves rate >= (n - 1) / t, whatever the burst."""
    learner = RateLearner()
    learner.on_success(began=0.0, latency=0.05)  # the probe
    learner.on_throttled(40.0, now=0.1, wait=0.0, sent_at=0.1, started=3.0)
    for k in range(1, 6):
        learner.on_success(began=0.1 + 0.1 * k, latency=0.05)
    assert learner.floor == pytest.approx(4 / 0.5)


def test_admissions_sent_before_a_429_was_read_prove_no_floor() -> None:
    """A 429 read 46 ms after its request left (over a new connection): the ten sent after
    it over warm ones may have reached the server first, while its bucket still held
    tokens. Counted from when the 429's request left, they proved 136/s against 50/s,
    and the scope was paced over the server's rate to the end, a 429 a second. Counted
    only from when the 429 was read, they prove nothing; one sent after proves its share."""
    learner = RateLearner()
    learner.on_success(began=0.0, latency=0.1)
    learner.on_throttled(200.0, now=0.746, wait=0.5, sent_at=0.7, started=40.0)
    for k in range(1, 11):
        learner.on_success(began=0.7 + 0.004 * k, latency=0.1)
    assert learner.floor == 0.0
    for k in range(5):
        learner.on_success(began=1.5 + 0.01 * k, latency=0.1, late=0.05)
    # The fifth proves four tokens since the 429, its span widened by twice the spread.
    assert learner.floor == pytest.approx(4 / (1.54 - 0.7 + 2 * 0.05))


def test_429s_out_before_the_first_was_read_spend_one_of_learnings_three() -> None:
    """A slow start at 230/s against a bucket of 50/s: three requests were out when the
    first 429 came back, and drew three. Counted as three of the 429s learning may spend,
    they left it none: the rate was the slowest any bucket fitted, 6.9/s, grown e-fold a
    minute, and 200 calls took 2.4 times the fastest. They are one overshoot, spending one."""
    learner = RateLearner()
    learner.on_success(began=0.0, latency=0.1)
    learner.on_throttled(230.0, now=0.633, wait=0.4, sent_at=0.633, started=64.0)
    learner.on_throttled(230.0, now=0.637, wait=0.4, sent_at=0.6285, started=64.0)
    learner.on_throttled(230.0, now=0.639, wait=0.4, sent_at=0.619, started=64.0)
    assert learner.refusals == 3
    assert learner.spent == 1
    learner.on_throttled(230.0, now=2.0, wait=0.4, sent_at=1.99, started=90.0)
    assert learner.spent == 2  # sent after the event's first 429 was read: news


def test_429s_of_requests_sent_before_the_last_one_are_the_same_event() -> None:
    """A wave of 429s from one burst decreases the rate once, not once per 429."""
    learner = RateLearner()
    learner.on_success(began=0.0, latency=0.05)
    learner.on_throttled(40.0, now=0.1, wait=0.0, sent_at=0.1, started=9.0)
    after_one = learner.rate
    learner.on_throttled(40.0, now=0.101, wait=0.0, sent_at=0.099, started=9.0)
    assert learner.rate == after_one == 8.0  # 9 admitted, less one the refill paid: 8 a second


def test_stated_numbers_keep_the_aimd_of_before() -> None:
    """A server that states a limit is learned from its numbers: a 429 there is AIMD's decrease."""
    learner = RateLearner()
    assert learner.from_headers(10, 1.0)
    learner.on_throttled(10.0, now=1.0, wait=1.0, sent_at=1.0, started=12.0)
    assert learner.rate == 8.0


# A real-time run against the benchmark's HTTP-date row (20/s, burst 10, 50 ms, no state
# headers) that drew a fourth 429: the requests' send times and statuses up to its third,
# and the first request after it.
_TRACE_TO_THIRD_429 = [
    (0.009, 200), (0.063, 200), (0.097, 200), (0.122, 200), (0.142, 200), (0.158, 200),
    (0.173, 200), (0.185, 200), (0.196, 200), (0.206, 200), (0.215, 200), (0.223, 200),
    (0.231, 200), (0.241, 200), (0.248, 429), (0.253, 429), (0.737, 200), (0.815, 200),
    (0.88, 200), (0.938, 200), (1.04, 200), (1.087, 200), (1.131, 200), (1.171, 200),
    (1.209, 200), (1.245, 200), (1.278, 200), (1.31, 200), (1.34, 200), (1.368, 200),
    (1.395, 200), (1.422, 200), (1.445, 200), (1.469, 200), (1.491, 200), (1.513, 200),
    (1.533, 200), (1.553, 200), (1.573, 200), (1.591, 200), (1.609, 200), (1.627, 429),
    (1.736, 200),  # the first request after the third 429's wait; its answer refits
]  # fmt: skip


def test_once_three_429s_are_spent_the_rate_is_only_what_the_answers_prove() -> None:
    """Replayed to its third 429 (two in the first event, one in the second) and the
    first answer after it, learning settles at or below the server's 20/s: the answers
    bound it from both sides, and with three 429s spent it takes the slowest rate they
    fit. (In the run, requests went out at 27 to 29/s before that answer and drew a fourth.)"""
    learner = RateLearner()
    latency = 0.05
    started = 0.0
    reports: list[tuple[float, float, int]] = []  # (when it is known, sent, status)
    for sent, status in _TRACE_TO_THIRD_429:
        reports.append((sent + (latency if status == 200 else 0.003), sent, status))
    for now, sent, status in sorted(reports):
        if status == 200:
            started += 1
            learner.on_success(began=sent, latency=latency)
        else:
            learner.on_throttled(30.0, now=now, wait=0.5, sent_at=sent, started=started)
    assert learner.rate is not None
    assert learner.rate <= 20.0


# A real-time run against 50/s with a burst of 20, stating only HTTP-date waits, 100 ms:
# when each request admitted was sent (ms), to the first answers after its second 429's
# refit (-1: a 429 read then), and its three 429s (sent, read, the rate sending, requests
# started, and those out, in ms).
_SENT_TO_A_WIDE_FIT = [
    0, 2, 109, 137, 164, 191, 298, 290, 251, 418, 428, 440, 423, 465, 468, 477, 487, 498,
    508, 520, 555, 586, 616, 641, 664, 664, 675, 725, 757, 790, 823, 842, 863, 878, 901,
    905, 943, 967, 991, 988, 986, 985, 985, 995, 1012, 1049, 1070, 1071, 1082, 1072, 1118,
    1159, 1188, 1218, 1254, 1282, 1309, 1335, 1360, 1377, 1375, 1374, 1375, 1380, 1382,
    1386, 1385, 1388, 1398, 1392, 1426, 1429, 1432, 1435, 1437, 1446, 1439, 1457, 1459,
    1462, 1481, 1464, 1503, 1533, 1565, -1, -1, 1588, 1599, -1, 1627, 1642, 1644, 1665, 1683,
    1711, 1975, 2348, 2421, 2478, 2536, 2593, 2653, 2708, 2770, 2828, 2890,
]  # fmt: skip
_WIDE_FIT_429S = [
    (1678.8, 1691.8, 67.0, 91.0, [1598.9, 1626.5, 1641.8, 1643.5, 1664.6]),
    (1682.9, 1696.7, 67.0, 91.0, [1598.9, 1626.5, 1641.8, 1643.5, 1664.6]),
    (1720.4, 1724.9, 68.0, 93.0, [1626.5, 1641.8, 1643.5, 1664.6, 1683.2, 1710.6]),
]  # fmt: skip


@pytest.mark.xfail(
    strict=True,
    reason="open: a fit as wide as 2-50/s settles at 17/s and grows e-fold a minute; grown "
    "e-fold each half second while a 429 is left, three pinned learning runs drew a fourth",
)
def test_a_fit_as_wide_as_a_deep_burst_allows_grows_while_a_429_is_left() -> None:
    """Replayed to the first answers after its refit, the run's answers fit any bucket
    from about 2/s to 50/s: a deep burst spent slowly explains them. Settled towards the
    slow end (eight times the slowest, 17/s) and grown e-fold a minute, the scope was
    paced at 17-19/s to the end, 2.4 times the fastest, with a 429 left to spend. A band
    that wide proves little of its slowest, and should grow towards the fastest that fits
    while a 429 is left to spend."""
    learner = RateLearner()
    refusals = iter(_WIDE_FIT_429S)
    rates: list[float] = []
    for sent in _SENT_TO_A_WIDE_FIT:
        if sent < 0:
            at, now, sending, started, out = next(refusals)
            learner.on_throttled(
                sending, now=now / 1000, wait=0.0, sent_at=at / 1000, started=started,
                pending=[p / 1000 for p in out],
            )  # fmt: skip
            continue
        learner.on_success(began=sent / 1000, latency=0.105, wave=2.0, late=0.1)
        if sent >= 1975:  # the refit's answer, and those after it
            assert learner.rate is not None
            rates.append(learner.rate)
    assert learner.spent == 2
    assert rates[-1] >= 1.5 * rates[0]
    assert max(rates) <= 50.1  # the fastest rate that fits


async def test_a_wide_probe_that_draws_three_429s_does_not_slow_the_scope_to_a_crawl(
    autojump_clock: Any,
) -> None:
    """Told a cap of 15, learning probes four wide into a 40/s server with a burst of one:
    three 429s at once. The first answers fit rates down to 0.09/s but bound nothing; taken
    as the rate, that slowed the scope to one request in 10 s and shed 14 of 72 calls as
    past their deadline. The three are one congestion event: counted as three, they spent
    all learning may, and the rate grew no further than admissions proved: 35.6 s for
    what takes 1.9 s. Counted once, every call is answered ok within three times that,
    and learning spends at most its other two."""
    config = ServerConfig(
        rate=39.95, burst=1, latency=0.07, headers="x", retry_after="ms", max_in_flight=15
    )
    began = trio.current_time()
    server, turn = await learn(config, 72, Scope("api", max_concurrency=15))
    assert all(r.status is Status.OK for r in turn.results)
    assert server.count(status=429) <= 3 + 2
    fastest = 71 / 39.95 + 0.07
    assert trio.current_time() - began <= 3 * fastest


@pytest.mark.parametrize("phase", [k / 10 for k in range(10)])
@pytest.mark.parametrize("jitter", [0.0, 0.01])
def test_an_http_date_wait_draws_two_429s_wherever_the_servers_second_falls(
    phase: float, jitter: float
) -> None:
    """The benchmark's HTTP-date row at every tenth of the server's second: each rounded-up
    wait is honoured, the rate is learned in two 429s (three at one phase, where the
    third is the one learning may spend growing), and every call is answered ok.
    (Twice in real time this row drew a storm of 18 and 55 429s that no mock-clock run
    reproduced; this holds the line where the phase of the dates could matter.)"""

    async def main() -> tuple[ThrottlingServer, fanout.Turn]:
        config = attrs.evolve(shape("http-date"), jitter=jitter)
        return await learn(config, 60, epoch=1_700_000_000.0 + phase)

    server, turn = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert all(r.status is Status.OK for r in turn.results)
    assert server.count(status=429) in (2, 3)


async def test_a_fit_that_rules_out_no_slower_rate_still_settles_the_growth(
    autojump_clock: Any,
) -> None:
    """7/s, burst 9, 195 ms, no numbers at all: after the second 429 every rate down to the
    slowest tried fits, so the rate is half the fastest that fits (2.4/s). Growing from
    there e-fold each half second, as before any fit, it reached 12/s and drew two more
    429s; settled as a fit bounded both ways is, it draws none."""
    config = ServerConfig(
        rate=7.0, burst=9, latency=0.1953125, headers="none", retry_after="absent"
    )
    server, turn = await learn(config, 29)
    assert all(r.status is Status.OK for r in turn.results)
    assert [round(r.start, 4) for r in server.records if r.status == 429] == [0.5968, 0.6801]


@pytest.mark.parametrize(("latency", "refusals", "within"), [(0.05, 3, 1.2), (0.3, 3, 2.0)])
async def test_a_rate_refused_with_503s_and_no_numbers_is_learned_as_bare_429s(
    autojump_clock: Any, latency: float, refusals: int, within: float
) -> None:
    """10/s, burst 10, no headers, 50 calls, refusing with 503 as nginx's limit_req does by
    default: learned as from bare 429s, every call ok.

    At 300 ms it is slow still (1.88 times the minimum, against 1.15 with 429s): the
    first 503, read as a cap, is not one of the rate's, and the two that are bound a fit
    from both sides, which leans slow and grows slowly (growing it quickly while a 429 is
    left failed a call on another server).

    Before, a 503 with no wait was read as a cap or the server's overload, never as the
    rate, and logged as an admission (its attempt "went fine"): at 50 ms the slow start
    never ended, 51 requests were refused and 36 of 50 calls failed; at 300 ms 7 were
    refused, lowering a "cap" of 9 one at a time. The first 503 is still read as a cap (a
    server's in-flight cap refuses so too; the cap, 5 or 9 here, does not bind at 10/s):
    at 50 ms it is one more refusal than bare 429s draw.
    """
    config = ServerConfig(
        rate=10, burst=10, latency=latency, headers="none", retry_after="absent",
        rate_status=503,
    )  # fmt: skip
    server, turn = await learn(config, 50)
    assert all(r.status is Status.OK for r in turn.results)
    assert server.count(status=503) == refusals
    minimum = (50 - 10) / 10 + latency
    assert max(r.end for r in server.records) <= within * minimum


def test_a_probe_that_left_late_does_not_double_the_next_wait() -> None:
    """A window of 8 per 2 s shut after its run: probed at 1.05 s, refused. That probe left
    54 ms late (behind a Redis round trip), and counted from its answer the window had been
    shut 12 ms longer than a probe at 2.1 s was away: the next was put at 4.2 s, and the turn
    took 15.5 s for 6. Counted to the probe as planned, the next is at 2.1 s."""
    learner = RateLearner()
    for sent in [0.0, 0.003, 0.031, 0.041, 0.048, 0.058, 0.070, 0.088]:
        learner.on_success(began=sent, latency=0.02)
    for sent in [0.096, 0.108, 0.111]:
        learner.on_throttled(8.0, now=sent + 0.02, wait=None, sent_at=sent, started=8.0)
    assert learner.closed_until == pytest.approx(1.05)
    learner.on_throttled(1.0, now=1.125, wait=None, sent_at=1.104, started=8.0)
    assert learner.closed_until == pytest.approx(2.1)


def test_a_wait_stated_as_already_come_is_no_window_that_states_nothing() -> None:
    """Three 429s in a row after a run, each with a ``Retry-After`` HTTP-date truncated to
    the second going on (a wait of 0): the server states its waits, so it is no window
    that shut without a word. Taken for one, a bucket of 50/s with a burst of 20 was
    paced as a shut window at 7.5/s to the end of the turn (16 times the fastest)."""
    stated, silent = RateLearner(), RateLearner()
    for learner, wait in ((stated, 0.0), (silent, None)):
        for sent in [0.0, 0.003, 0.031, 0.041, 0.048, 0.058, 0.070, 0.088]:
            learner.on_success(began=sent, latency=0.02)
        for sent in [0.096, 0.108, 0.111]:
            learner.on_throttled(8.0, now=sent + 0.02, wait=wait, sent_at=sent, started=8.0)
    assert silent.closed_until is not None
    assert stated.closed_until is None
    assert stated.rate is not None
    assert stated.rate > 1.0


async def test_a_call_on_a_learning_scope_shut_past_its_deadline_is_answered_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every answer a 429 with ``Retry-After: 30``: the probe's two calls are refused, and
    the third, queued behind them with a 10 s timeout, cannot start before the server's
    wait ends. It is answered ``rate_limited`` at once with that wait: no rise of a
    learned rate brings a token sooner. (Waited for a rise, it was answered
    ``timed_out`` at its timeout.)"""

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "30"})

    registry = Registry()
    async with fanout.http_client(httpx.MockTransport(refuse), base_url="http://api") as client:

        @registry.tool(kind=Kind.READS, scopes=["api"], timeout=10)
        async def get(i: int) -> str:
            return (await client.get(f"/x/{i}")).text

        began = trio.current_time()
        turn = await Runner(registry, inline_wait=None).run_turn(
            [ToolCall(f"c{i}", "get", {"i": i}) for i in range(3)]
        )
    answered = {e.call_id: e.time - began for e in turn.trace if e.kind is EventKind.ANSWERED}
    assert [r.status for r in turn.results] == [Status.RATE_LIMITED] * 3
    assert answered["c2"] < 0.1
    assert turn.results[2].retry_after_ms is not None
    assert turn.results[2].retry_after_ms >= 29_000


async def test_a_wait_that_cannot_fit_on_a_learning_scope_is_answered_before_the_deadline(
    autojump_clock: Any,
) -> None:
    """Bare 429s teach a scope a slow rate; a later call's token comes after its deadline.
    With no latency known, the last moment it could start was the deadline itself, where
    the deadline answered it ``timed_out``, its wait unsaid: it is answered
    ``rate_limited`` with the wait a moment before."""
    registry = Registry()

    @registry.tool(kind=Kind.READS, timeout=1.5, scopes=["api"])
    async def throttled(x: int) -> str:
        raise fanout.RateLimitedError("429", retry_after=0.2)

    @registry.tool(kind=Kind.READS, timeout=1.5, scopes=["api"])
    async def lookup(x: int) -> str:
        return "found"

    runner = Runner(registry, turn_timeout=5)
    await runner.run_turn([ToolCall("t", "throttled", {"x": 0})])
    await trio.sleep(30)
    began = trio.current_time()
    turn = await runner.run_turn(
        [ToolCall("a", "lookup", {"x": 1}), ToolCall("b", "lookup", {"x": 2})]
    )
    first, second = turn.results
    assert first.status is Status.OK
    assert second.status is Status.RATE_LIMITED
    assert second.retry_after_ms is not None
    assert second.retry_after_ms > 0
    (answered,) = [e.time for e in turn.trace if e.kind is EventKind.ANSWERED and e.call_id == "b"]
    assert answered < began + 1.5


async def learn_under(
    config: ServerConfig, calls: int, deadline: float
) -> tuple[ThrottlingServer, fanout.Turn, dict[str | None, float]]:
    """``calls`` fetches, each under ``deadline``, through a scope told nothing; the server,
    the turn, and when each call was answered, from the turn's start."""
    async with api(config) as (server, client):
        registry = Registry()

        @registry.tool(kind=Kind.READS, scopes=["key"], timeout=deadline)
        async def fetch(n: int) -> str:
            (await client.get(f"/items/{n}")).raise_for_status()
            return f"item {n}"

        began = trio.current_time()
        runner = Runner(registry, scopes=[Scope("key")], inline_wait=None, rng=random.Random(0))
        turn = await runner.run_turn([ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(calls)])
    answered = {e.call_id: e.time - began for e in turn.trace if e.kind is EventKind.ANSWERED}
    return server, turn, answered


@pytest.mark.parametrize(
    ("latency", "deadline", "retry_after", "fewest"),
    [
        (0.05, 1.5, "absent", 29),
        (0.1, 1.55, "absent", 30),
        (0.2, 1.65, "absent", 28),
        (0.05, 1.5, "ms", 29),
    ],
)
async def test_calls_that_would_miss_their_deadline_press_a_rate_learned_from_bare_429s(
    autojump_clock: Any, latency: float, deadline: float, retry_after: Any, fewest: int
) -> None:
    """Bare 429s (no counts, no wait, or one in ms) from 20/s with a burst of 2, 40 calls
    under deadlines that let 31 finish (the last of them started on its token to end at
    its deadline: told, 30). The slow start's 429 dropped the rate to a guess, 2/s, which
    grew e-fold each half second while the calls waited for it to rise, and most were
    answered at their last moment: 10, 17, 22 and 10 ok. Pressed by their need, the rate
    goes to it, up to half the pace refused, then up to the fastest rate that fits, each
    429 one of the three learning spends: 28-30 ok, none answered late, none sent that
    cannot end in time. (Rising under them as they booked, the rate had 19 calls answered
    at once as waiting longer than inline.)"""
    config = ServerConfig(
        rate=20, burst=2, latency=latency, headers="none", retry_after=retry_after
    )
    assert max_ok_by(deadline, 40, rate=20, burst=2, latency=latency) == 31
    server, turn, answered = await learn_under(config, 40, deadline)
    ok = sum(r.status is Status.OK for r in turn.results)
    assert ok >= fewest
    assert max(answered.values()) <= deadline
    assert all(r.status in (Status.OK, Status.RATE_LIMITED) for r in turn.results)
    assert server.count(status=200) == ok
    assert server.count(status=429) <= 3


def test_a_rate_is_pressed_only_after_a_429_and_where_its_wait_is_short() -> None:
    """The slow start is not pressed (nothing refused yet bounds it), nor a rate whose
    429s state a wait of a second: one more would shut the calls out for most of the
    time they have (`RateLearner.press`)."""
    for wait, pressed in ((None, True), (0.05, True), (1.0, False)):
        learner = RateLearner()
        for sent in [0.0, 0.0, 0.05]:
            learner.on_success(began=sent, latency=0.05)
        assert not learner.press(30.0, now=0.06, spare=1.4)
        learner.on_throttled(80.0, now=0.0625, wait=wait, sent_at=0.0625, started=3.0)
        rate = learner.rate
        assert rate is not None
        assert learner.press(30.0, now=0.0625, spare=1.4) is pressed
        assert learner.rate == (30.0 if pressed else rate)


async def test_a_deep_bucket_stating_only_dated_waits_is_found_at_the_second_429(
    autojump_clock: Any,
) -> None:
    """200 calls against 50/s with a burst of 20, whose 429s state only an HTTP-date (each
    blocks the scope up to a whole second of the server's clock): the second 429 bounds the
    rate to 49-51/s, and the scope keeps to it. Fitted at rates 10% apart, no rate fitted
    that narrow band: the rate was halved to 60/s from 120/s, grew, and a third 429 blocked
    the scope for 0.9 s (4.69 s, 1.27 times the fastest)."""
    config = ServerConfig(rate=50, burst=20, latency=0.1, headers="none", retry_after="http-date")
    server, turn = await learn(config, 200)
    assert all(r.status is Status.OK for r in turn.results)
    assert server.count(status=429) <= 2
    fastest = (200 - 20) / 50 + 0.1
    assert server.records[-1].end <= 1.1 * fastest


@pytest.mark.parametrize("seed", range(5))
def test_a_deep_bucket_met_over_slow_new_connections_is_learned_without_a_crawl(
    seed: int,
) -> None:
    """The same row where each new connection takes 30-50 ms to open and answers 100-120
    ms: a slow start's requests reach the server out of the order they left in, as they do
    in real time. Before, 1.6-1.9 times the fastest at three of these five seeds: a 429
    overtaken by admissions sent after it fitted only 130/s or no bucket at all, the
    admissions "proved" 136/s, or three 429s of one overshoot spent all learning may
    and left the slowest fit, 7/s. Now 1.22-1.31 times."""

    async def main() -> tuple[ThrottlingServer, fanout.Turn]:
        config = ServerConfig(
            rate=50, burst=20, latency=0.1, jitter=0.02, connect_delay=0.03,
            connect_jitter=0.02, headers="none", retry_after="http-date", seed=seed,
        )  # fmt: skip
        return await learn(config, 200)

    server, turn = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert all(r.status is Status.OK for r in turn.results)
    fastest = (200 - 20) / 50 + 0.1
    assert max(record.end for record in server.records) <= 1.35 * fastest
