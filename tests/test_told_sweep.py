"""Told the server's limits, against any server: no 429, no 503, within 5% of the fastest.

Issue 13's target for a scope configured as the README says (the benchmark's
``configured_scope``) is checked here against servers Hypothesis draws: any
model the throttling server has (a token bucket whose Reset means "until
full" or "until the next token", a fixed window, a sliding log, an in-flight
cap with no rate), any numbers, an in-flight cap or none, latency jitter,
any header style and Retry-After format, and sometimes a deadline on every
call. Client and server run in one ``trio.run`` on a MockClock, so every
time compared is exact.

The fastest any client could finish is ``optimal``: every request started
at the earliest instant the server's limiter and in-flight cap allow, given
when the earlier ones *end*. With jitter the k-th request the server admits
takes ``L + u_k``, ``u_k`` its k-th draw whatever the request, so starting
each as early as allowed ends each as early as possible, and that schedule
is exact. A client cannot know the draws, but it needs not: it meets the
rate by its tokens and the cap by waiting for answers, which is all the
schedule does. (The benchmark's ``min_makespan`` takes the least latency
for every request; with jitter that is a bound no client can reach, by up
to the jitter. ``optimal`` is checked against it, and against the
benchmark's other formulas, where they are exact.)

What no client can do, and what is allowed for it:

* Until a request over a reused connection is answered, no client can tell
  a server that takes L to answer from one that read the burst's requests L
  late (a slow first connection, ``connect_delay``) and counts from then. A
  client safe against both waits out the worst case once: the makespan may
  exceed 1.05x the fastest by the fastest schedule's first answer, and under
  a deadline the calls after the first answers are counted as if that much
  later (``can_finish``).
* Under a deadline with jitter, a client is sure only of the calls that end
  in time with the slowest answers (``can_finish``).

Known misses, left out of the bounds they break (and asserted otherwise):

* A window (fixed or sliding) whose answers jitter: round trips cannot tell
  a late arrival from a slow answer, so each answer holds its token as much
  longer as its trip took beyond the quickest, and where answers may come
  after their tokens could be taken again (jitter near the window or
  longer), the log keeps how much all of them vary as its margin, in every
  window (a real server takes a burst's requests in a few ms apart, and
  without that margin the real-time sliding row drew 429s): 1.1-4x the
  fastest, the most at a limit of one.
* A slow first connection: where waiting out the worst case would cost a
  server whose first arrival was not late a token or more
  (``ScopeFront.warm_hold``), a request over a reused connection leaves at
  once and draws a 429 if the first arrival was late after all; at a burst
  of one, a request over a new connection arrives late at a bucket that was
  just full, and can draw one too. Only every call answered ok without a
  deadline, none late and no 503 are asserted there.
"""

from __future__ import annotations

import functools
import math
import random
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from benchmarks.scenarios import Scenario, jittered_makespan, min_makespan
from benchmarks.strategies import configured_scope
from fanout import Scope, Status
from fanout._learning import TOGETHER
from fanout._throttle_server import parse_command_line
from fanout.testing import ServerConfig, ThrottlingServer
from tests.clocks import replayable_run, ticking_clock
from tests.test_learning_no_numbers import learn
from tests.test_learning_sweep import Server
from tests.test_learning_sweep import fastest as fastest_learned
from tests.test_pacing import _turn

if TYPE_CHECKING:
    from collections.abc import Callable

# The wall clock of server and client at trio time 0, so HTTP-dates are exact.
EPOCH = 1_700_000_000.25
_EPS = 1e-9
_TIE = 1e-6  # an answer this close to its deadline ends with it


def wall() -> float:
    return EPOCH + trio.current_time()


def optimal(s: Scenario) -> list[float]:
    """When each request of the fastest schedule ends, from the server's first arrival."""
    draws = random.Random(s.seed)
    window = s.burst / s.rate
    starts: list[float] = []
    ends: list[float] = []
    tokens, updated = float(s.burst), 0.0
    for i in range(s.calls):
        t = starts[-1] if starts else 0.0
        cap = s.max_in_flight
        if cap is not None and i >= cap:
            t = max(t, sorted(ends)[i - cap])  # i - cap + 1 of the earlier ones have ended
        if s.model == "sliding" and i >= s.burst:
            t = max(t, starts[i - s.burst] + window)
        elif s.model == "fixed":
            opened = math.floor(t / window + _EPS) * window
            if sum(1 for start in starts if start >= opened - _EPS) >= s.burst:
                t = opened + window
        elif s.model == "bucket":
            tokens = min(float(s.burst), tokens + (t - updated) * s.rate)
            updated = t
            if tokens < 1.0 - 1e-12:
                t += (1.0 - tokens) / s.rate
                tokens, updated = 1.0, t
            tokens -= 1.0
        starts.append(t)
        ends.append(t + s.latency + (draws.uniform(0, s.jitter) if s.jitter else 0.0))
    return ends


def fastest(s: Scenario) -> float:
    """The least makespan any client could have (module docstring)."""
    return s.connect_delay + max(optimal(s), default=0.0)


def can_finish(s: Scenario) -> int:
    """How many calls a client can be sure to answer ok by the deadline.

    With jitter, the fastest schedule's count rests on draws no client knows: one
    that sends a call on the hope of a quick answer has it cut off at the deadline
    when the answer is slow. A client can be sure of the calls that finish even if
    every answer takes the longest, ``latency + jitter``, and if every call after
    the first answers waits out a late first arrival (module docstring).
    """
    assert s.deadline is not None
    ends = optimal(attrs.evolve(s, latency=s.latency + s.jitter, jitter=0.0))
    first = ends[0]
    late = [end + (s.connect_delay + first if end > first + _EPS else 0.0) for end in ends]
    # One that would end exactly at the deadline is not counted: the deadline wins the tie.
    return sum(1 for end in late if s.connect_delay + end < s.deadline - _TIE)


@attrs.frozen
class Outcome:
    """What a run of the told scope did, as the server and the turn saw it."""

    server: ThrottlingServer
    turn: fanout.Turn
    makespan: float
    latest: float  # the last answer, from the turn's start


async def run_told(s: Scenario) -> Outcome:
    """The scenario's calls through ``configured_scope``, against the benchmark's server,
    from a client like the benchmark's (no pool limit), both on one wall clock."""
    _, config = parse_command_line(s.server_args())
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)

    def client(**options: Any) -> httpx.AsyncClient:
        inner = httpx.AsyncHTTPTransport(limits=limits)
        return httpx.AsyncClient(
            transport=fanout.FanoutTransport(inner, wall_clock=wall), **options
        )

    deadline = s.deadline if s.deadline is not None else 600.0
    turn, server, began = await _turn(
        config, configured_scope(s), s.calls, deadline=deadline, make_client=client, wall_clock=wall
    )
    makespan = trio.current_time() - began
    answered = [e.time - began for e in turn.trace if e.kind is fanout.EventKind.ANSWERED]
    return Outcome(server, turn, makespan, max(answered))


def run(s: Scenario, clock: trio.testing.MockClock | None = None) -> Outcome:
    """``s``'s turn on a MockClock, or on ``clock``, replayable (`tests.clocks`)."""
    return replayable_run(run_told, s, seed=s.seed, clock=clock)


def _grid(low: int, high: int, per: int) -> st.SearchStrategy[float]:
    """Numbers ``k / per`` that survive the server's command line (``%g``) exactly."""
    return st.integers(low, high).map(lambda k: k / per)


@st.composite
def servers(draw: Callable[..., Any], *, connect_delay: bool = False) -> Scenario:
    """A server of any model and numbers, and the calls sent to it; with ``connect_delay``,
    one whose first request on each connection arrives late."""
    model = draw(st.sampled_from(["bucket-full", "bucket-next", "fixed", "sliding", "concurrency"]))
    cap = draw(st.none() | st.integers(1, 16))
    if model == "concurrency" and cap is None:
        cap = draw(st.integers(1, 16))
    scenario = Scenario(
        name="drawn",
        title="a drawn server",
        calls=draw(st.integers(1, 60)),
        rate=draw(_grid(5, 500, 10)),
        burst=draw(st.integers(1, 20)),
        latency=draw(_grid(1, 100, 200)),
        max_in_flight=cap,
        retry_after=draw(st.sampled_from(["seconds", "ms", "http-date", "absent"])),
        model="bucket" if model.startswith("bucket") else model,
        reset="next" if model == "bucket-next" else "full",
        headers=draw(st.sampled_from(["draft", "ietf", "x", "none"])),
        jitter=draw(st.just(0.0) | _grid(1, 40, 200)),
        connect_delay=draw(_grid(1, 40, 200)) if connect_delay else 0.0,
        seed=draw(st.integers(0, 1000)),
    )
    if draw(st.booleans()):
        # A deadline anywhere from a fifth of the fastest run to a little past it.
        share = draw(_grid(2, 12, 10))
        scenario = attrs.evolve(scenario, deadline=round(share * fastest(scenario), 3) or 0.001)
    return scenario


def _first_answer(s: Scenario) -> float:
    """When the fastest schedule's first answer comes: what a late first arrival may cost."""
    return s.connect_delay + optimal(s)[0]


def _known_window_miss(s: Scenario) -> bool:
    """A window server whose answers jitter (module docstring)."""
    return s.model in ("fixed", "sliding") and s.jitter > 0


@settings(max_examples=60, deadline=None, derandomize=True)
@given(s=servers())
def test_a_told_scope_meets_the_target_on_any_server(s: Scenario) -> None:
    """Told the limits, fanout draws no 429 and no 503 from any server and answers every
    call ok, within 1.05x the fastest possible makespan and one first answer (what waiting
    out a possibly late first arrival costs); under a deadline it answers ok every call
    that can surely finish before it, and none after it.

    The same 60 servers each run, so that CI is repeatable; what a wider
    random search finds beyond them is pinned below."""
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    assert outcome.server.count(status=503) == 0
    ok = sum(r.status is Status.OK for r in outcome.turn.results)
    if s.deadline is None:
        assert ok == s.calls
        if not _known_window_miss(s):
            assert outcome.makespan <= 1.05 * fastest(s) + _first_answer(s) + _EPS
    else:
        if not _known_window_miss(s):
            assert ok >= can_finish(s)
        assert outcome.latest <= s.deadline + _EPS


@settings(max_examples=40, deadline=None, derandomize=True)
@given(s=servers(), tick=st.sampled_from([1e-6, 5e-6, 2e-5]))
def test_a_told_scope_draws_no_429_as_time_moves_on(s: Scenario, tick: float) -> None:
    """As above, on a clock later at every reading, as real time is (`tests.clocks`): no
    429 and no 503, every call answered, none after its deadline but for the readings
    answering takes (the benchmark allows real time 10 ms). The makespan is the clock's:
    a turn reads it thousands of times."""
    outcome = run(s, ticking_clock(tick))
    assert outcome.server.count(status=429) == 0
    assert outcome.server.count(status=503) == 0
    assert len(outcome.turn.results) == s.calls
    if s.deadline is None:
        assert all(r.status is Status.OK for r in outcome.turn.results)
    else:
        assert outcome.latest <= s.deadline + 1000 * tick


def test_requests_held_together_keep_the_slack_where_they_begin_a_burst() -> None:
    """38.3/s with a burst of 12 whose Reset is its next token, 360 ms answers, on a clock
    later at every reading. Held until a warm answer could show how late the first
    arrival was (`warm_hold`), twelve requests left together, over 0.4 ms, into a
    server full again, which refills from the first of them to arrive. The next
    request, a token after the group by the client's schedule, came 20 us early and
    drew a 429 (at every tick and scheduler seed tried). Where a held group begins a
    burst, the slack is kept, as at any burst's start."""
    s = Scenario(
        name="repro", title="", calls=58, rate=38.3, burst=12, latency=0.36,
        retry_after="seconds", headers="draft", reset="next", seed=710,
    )  # fmt: skip
    outcome = run(s, ticking_clock(5e-6))
    assert outcome.server.count(status=429) == 0
    assert all(r.status is Status.OK for r in outcome.turn.results)
    assert outcome.makespan <= 1.05 * fastest(s)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(s=servers(connect_delay=True))
def test_after_a_slow_first_connection_every_call_is_still_answered_in_time(
    s: Scenario,
) -> None:
    """A server that reads each connection's first request late: fanout may draw a 429
    where its bucket cannot spare waiting out the worst case (module docstring), but it
    draws no 503, answers every call ok without a deadline, and none after its deadline."""
    outcome = run(s)
    assert outcome.server.count(status=503) == 0
    if s.deadline is None:
        assert all(r.status is Status.OK for r in outcome.turn.results)
    else:
        assert outcome.latest <= s.deadline + _EPS


@settings(max_examples=100, deadline=None, derandomize=True)
@given(s=servers(connect_delay=True))
def test_the_fastest_schedule_agrees_with_the_benchmarks_formulas(s: Scenario) -> None:
    """Where the benchmark's minimum is exact (a bucket without jitter, or without a cap;
    windows without either; a cap alone without jitter) it is ``fastest``; elsewhere it is
    a lower bound of it."""
    s = attrs.evolve(s, deadline=None)
    exact = fastest(s)
    assert s.min_makespan <= exact + _EPS
    capped = s.max_in_flight is not None
    if s.model == "bucket" and not s.jitter:
        formula = min_makespan(
            s.calls, rate=s.rate, burst=s.burst, latency=s.latency, concurrency=s.max_in_flight
        )
        assert exact == pytest.approx(s.connect_delay + formula, abs=_EPS)
    if s.model == "bucket" and s.jitter and not capped:
        drawn = jittered_makespan(
            s.calls, rate=s.rate, burst=s.burst, latency=s.latency, jitter=s.jitter, seed=s.seed
        )
        assert exact == pytest.approx(s.connect_delay + drawn, abs=_EPS)
    if not s.jitter and (s.model == "concurrency" or not capped) and s.model != "bucket":
        assert exact == pytest.approx(s.min_makespan, abs=_EPS)


# -- counterexamples the sweep found, pinned exactly ---------------------------------


def test_a_429_before_any_warm_answer_shows_the_first_arrival_was_late() -> None:
    """48.6/s, burst 12, 215 ms, and the server reads each connection's first request 145
    ms late. Holding the requests over reused connections would have cost a server whose
    arrivals were on time a token or more, so they left at once: each reached the bucket
    ahead of the late arrivals' refill and was refused, eight in a row, and a call gave up
    after three. The first refusal shows the worst case was the case: the slack takes it,
    and that 429 is the only one (until a warm answer measures the true lag)."""
    s = Scenario(
        name="repro", title="", calls=33, rate=48.6, burst=12, latency=0.215,
        retry_after="ms", reset="next", headers="none", connect_delay=0.145, seed=300,
    )  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) == 1
    assert all(r.status is Status.OK for r in outcome.turn.results)
    assert outcome.makespan <= 1.05 * fastest(s) + _first_answer(s)


# Issue 13's 20 calls at 10/s, burst 5, 50 ms, answers jittering 1-2 ms; then servers
# drawn with slow first connections where the code before drew a 429.
_READ_LATE = [(20, 10, 5, 0.05, 0.1, jitter, seed, "draft") for jitter in (0.001, 0.002)
              for seed in range(3)] + [
    (20, 5, 5, 0.05, 0.2, 0.001, 9, "draft"),
    (40, 10, 10, 0.2, 0.1, 0.001, 11, "draft"),
    (40, 10, 10, 0.02, 0.1, 0.003, 27, "x"),
    (40, 5, 5, 0.2, 0.2, 0.001, 46, "x"),
    (20, 10, 2, 0.05, 0.03, 0.001, 58, "draft"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("calls", "rate", "burst", "latency", "connect_delay", "jitter", "seed", "headers"),
    _READ_LATE,
)
def test_a_burst_a_warm_answer_shows_was_read_late_is_owed_on_the_wire(
    calls: int, rate: float, burst: int, latency: float, connect_delay: float,
    jitter: float, seed: int, headers: Any,
) -> None:  # fmt: skip
    """The server reads each connection's first request late. Two requests held for
    the worst case (`warm_hold`) left after one booked behind them that a warm answer
    had let go at once; the wire counted the burst as arriving when it left, a token
    early, and the last held one drew a 429: the first six cases (the issue's 20
    calls at 10/s with a 100 ms late read), 1.42x each, and one run in three in real
    time against a server written apart; the rest, drawn, 1.03-1.49x (of 80 drawn,
    51 drew one before, 33 now: the rest are the known miss, a hold that would cost
    a token or more, module docstring). The warm answer shows how late the burst
    was read: the wire owes that refill, and the held request waits for its token."""
    s = Scenario(
        name="repro", title="", calls=calls, rate=rate, burst=burst, latency=latency,
        connect_delay=connect_delay, jitter=jitter, seed=seed, headers=headers,
    )  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    assert all(r.status is Status.OK for r in outcome.turn.results)
    assert outcome.makespan <= 1.05 * fastest(s) + s.connect_delay


@pytest.mark.parametrize("connect_delay", [0.001, 0.0025, 0.005])
@pytest.mark.parametrize(
    ("rate", "burst", "calls"), [(10, 5, 20), (20, 10, 60), (50, 20, 100), (5, 5, 8)]
)
def test_a_burst_read_a_few_ms_late_is_owed_on_the_wire(
    connect_delay: float, rate: float, burst: int, calls: int
) -> None:
    """Issue 13's rows against a server that reads each new connection's first request a
    few ms late (a threaded server starting a thread for it): the burst went over new
    connections and was read that late, the paced requests after it over warm ones on
    the wire's count, which took the burst as read when it left. A read under 5 ms late
    was owed nothing, and each of these twelve servers drew a 429 (1.2-2.2x the
    fastest); against the server written apart, which reads new connections 1-3 ms
    late, 20 calls at 10/s drew one in about one run in ten. What a warm answer shows
    of it is owed now, with as much again as a margin (`WireCount.owe_late_arrival`),
    and before any answer the burst's first request owes ``TOGETHER``, how unevenly a
    server may read new connections (`ScopeFront._new_connection_read_late`): within 1%
    of the fastest and that (8 calls at 5/s take 0.65 s)."""
    s = Scenario(
        name="repro", title="", calls=calls, rate=rate, burst=burst, latency=0.05,
        connect_delay=connect_delay,
    )  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    assert all(r.status is Status.OK for r in outcome.turn.results)
    assert outcome.makespan <= 1.01 * fastest(s) + TOGETHER


def test_a_new_connection_read_late_is_owed_by_each_request_that_opens_one() -> None:
    """A bucket of one at 40/s, answers in 50-53 ms, each new connection's first request
    read 1 ms late. Every second's wait after a 429 was followed by requests over reused
    connections and one over a new one, read late, and a warm one on its token after it:
    early by what was not owed, another 429 (twelve in 40 calls, 12.7x the fastest). The
    late read is now known from the quickest round trips over new and reused connections,
    and owed by each request that opens one (`ScopeFront._new_connection_read_late`): the
    first 429, before any warm answer (the strict expected failure below), and one more
    while a few answers understate it."""
    s = Scenario(
        name="repro", title="", calls=40, rate=40, burst=1, latency=0.05,
        connect_delay=0.001, jitter=0.003, seed=42,
    )  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) <= 2
    assert all(r.status is Status.OK for r in outcome.turn.results)
    assert outcome.makespan <= 3.1 * fastest(s)


def _drawn_load(
    draw: Callable[..., Any],
    *,
    fewest_calls: int,
    rates: tuple[int, int],
    latencies: tuple[int, int],
) -> dict[str, Any]:
    """Up to 60 calls, a rate in tenths per second, a burst of 1 to 20 and a latency in
    200ths of a second, drawn in that order."""
    return {
        "calls": draw(st.integers(fewest_calls, 60)),
        "rate": draw(_grid(*rates, 10)),
        "burst": draw(st.integers(1, 20)),
        "latency": draw(_grid(*latencies, 200)),
    }


@st.composite
def buckets_reading_new_connections_late(draw: Callable[..., Any]) -> Scenario:
    """A told token bucket, no cap, answers that do not jitter, and each new connection's
    first request read 1-5 ms late."""
    reset = draw(st.sampled_from(["full", "next"]))
    return Scenario(
        name="drawn", title="a bucket reading new connections late",
        **_drawn_load(draw, fewest_calls=5, rates=(50, 500), latencies=(4, 40)),
        retry_after="seconds", reset=reset,
        headers=draw(st.sampled_from(["draft", "ietf", "x", "none"])),
        connect_delay=draw(st.sampled_from([0.001, 0.002, 0.003, 0.005])),
    )  # fmt: skip


@settings(max_examples=100, deadline=None, derandomize=True)
@given(s=buckets_reading_new_connections_late())
def test_after_a_warm_answer_a_few_ms_late_read_draws_no_429(s: Scenario) -> None:
    """A server that reads new connections 1-5 ms late and whose answers do not jitter:
    once a request over a reused connection can have been answered (two latencies and
    the late read after the first arrival), no request is refused. Before that, a
    request over a reused connection may leave at once where waiting out the worst
    case costs a token or more (the strict expected failure below)."""
    outcome = run(s)
    warm_by = s.connect_delay + 2 * s.latency
    assert [r.start for r in outcome.server.records if r.status == 429 and r.start > warm_by] == []
    assert outcome.server.count(status=503) == 0
    assert all(r.status is Status.OK for r in outcome.turn.results)


@st.composite
def windows_reading_new_connections_late(draw: Callable[..., Any]) -> Scenario:
    """A told fixed window (met at any phase) or sliding log, no cap, answers that do not
    jitter, and each new connection's first request read 1-100 ms late."""
    model = draw(st.sampled_from(["fixed", "sliding"]))
    return Scenario(
        name="drawn", title="a window reading new connections late",
        **_drawn_load(draw, fewest_calls=5, rates=(50, 500), latencies=(4, 40)),
        model=model, window_phase=draw(_grid(0, 9, 10)) if model == "fixed" else 0.0,
        retry_after="seconds", headers=draw(st.sampled_from(["draft", "ietf", "x", "none"])),
        connect_delay=draw(st.sampled_from([0.001, 0.005, 0.02, 0.1])),
    )  # fmt: skip


@settings(max_examples=60, deadline=None, derandomize=True)
@given(s=windows_reading_new_connections_late())
def test_a_window_whose_server_reads_new_connections_late_draws_no_429(s: Scenario) -> None:
    """A told window whose server reads each new connection's first request late: no 429
    at any time, every call ok, within 1.05x the fastest and one first answer. A request
    over a new connection is held, as it leaves, for how late such a request may be
    read: before any answer over a connection already open, the whole of the quickest
    round trip over a new one (`ScopeFront._window_read_late`). Held for nothing, the
    first request over a reused connection reached a sliding log of one per 50 ms with
    one sent 50 ms before it over a new connection, read 100 ms late: a 429 and a
    second's wait; and the margin kept for how much round trips vary took in the new
    connections' 100 ms, and paced the rest one per 150 ms (4.95 s for 30 calls, 1.6 s
    now, 1.55 s at the least)."""
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    assert outcome.server.count(status=503) == 0
    assert all(r.status is Status.OK for r in outcome.turn.results)
    assert outcome.makespan <= 1.05 * fastest(s) + _first_answer(s) + _EPS


@pytest.mark.xfail(
    strict=True,
    reason="open: before any warm answer, a request over a reused connection waits out "
    "a possibly late first arrival only where that costs a server that was on time less "
    "than a token; here it would cost more, so it leaves at once and arrives 20 ms early",
)
def test_a_slow_first_connection_whose_worst_case_costs_a_token_draws_no_429() -> None:
    """10/s, burst 3, 300 ms, and the server reads each connection's first request 20 ms
    late: the burst and the three paced calls after it go over new connections and arrive
    20 ms late, the seventh over a reused one on time, 20 ms ahead of the refill the late
    arrivals count from. Refused, it waits out a whole second (1.54x the fastest). The same
    draws a 429 in real time, every run. Holding it for the worst case (the burst's 0.32 s
    to its first answer, all of it possibly a late arrival) would cost a server that was
    on time three tokens. Cut to what loses half a token instead, the hold avoided this
    429, and drawn servers with slow first connections drew one in 68 runs of 600 where
    they had in 81; but servers that were on time paid for every hold: 1.35x the fastest
    where the code before took 1.09x (48.6/s, burst 12, 215 ms), and it was taken back.
    A warm answer, a round trip later, tells the truth."""
    s = Scenario(
        name="repro", title="", calls=20, rate=10, burst=3, latency=0.3, connect_delay=0.02,
        headers="x", retry_after="http-date",
    )  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) == 0


def test_holds_before_the_first_warm_answer_cost_less_than_one_first_answer() -> None:
    """34 calls, 49.3/s, burst 12, 220 ms, no cap: a random search found it. Before the
    first warm answer each request over a reused connection was held for the whole worst
    case, a second time at 0.44 s (0.921 s against 0.920 s allowed), while requests sent
    unheld since 0.28 s were still unanswered: a server slow to answer them is no server
    that read the burst late. Now a hold shrinks as that wait grows."""
    s = Scenario(
        name="drawn", title="", calls=34, rate=49.3, burst=12, latency=0.22, headers="draft",
    )  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    assert outcome.makespan <= 1.05 * fastest(s) + _first_answer(s) + _EPS


def test_calls_queued_for_a_slot_count_the_tokens_at_hand_before_the_rate() -> None:
    """2/s with a burst of 10, one call in flight, 100 ms each, an 8 s deadline: the
    schedule finishes 25 of 30 (ten on the burst, one every 0.1 s, then one every 0.5 s).
    The calls queued for the one slot were shed as if each waited 1/rate from the start,
    burst or not, and only 17 were answered ok; the tokens at hand go first. (Those
    after the burst go ``TOGETHER`` late: its first request, over a new connection,
    took the full bucket and may have been read that late.)"""
    s = Scenario(
        name="repro", title="", calls=30, rate=2, burst=10, latency=0.1, max_in_flight=1,
        deadline=8.0,
    )  # fmt: skip
    outcome = run(s)
    assert can_finish(s) == 25
    assert sum(r.status is Status.OK for r in outcome.turn.results) == 25
    starts = [round(start, 9) for start in outcome.server.starts()]
    paced = [round(0.5 * k + TOGETHER, 9) for k in range(3, 16)]
    assert starts == [round(0.1 * k, 9) for k in range(12)] + paced
    assert outcome.server.count(status=429) == 0


def test_requests_held_together_count_each_others_tokens() -> None:
    """10/s, burst 4, 4 in flight, 300 ms: the burst's answers at 0.3 s may be latency or
    late first arrivals, so requests over reused connections wait for the worst case, if
    the bucket can spare it. Three booked at 0.3 each checked that alone; held together,
    a server whose arrivals were not late would have filled up and lost two tokens, and
    the request at 1.2 s drew a 429 (and 1.67x the fastest). Now each counts the others
    held with it, only what the bucket can spare is held, and the run is the fastest
    possible but for ``TOGETHER``, as above. (The one at 0.4 s waits to 0.6 s: the
    request that left unheld at 0.3 s, still unanswered, shows 0.1 s of the worst case
    was none, and the rest is spared.)"""
    s = Scenario(
        name="repro", title="", calls=16, rate=10, burst=4, latency=0.3, max_in_flight=4,
        headers="none",
    )  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    late = [round(at + TOGETHER, 9) for at in (0.6, 0.9, 1.0, 1.2)]
    starts = [0.0] * 4 + [0.3, 0.3, 0.6, 0.6, 0.6, late[0], 0.9, 0.9, *late[1:3], 1.2, late[3]]
    assert [round(start, 9) for start in outcome.server.starts()] == starts
    assert outcome.makespan == pytest.approx(fastest(s) + TOGETHER, abs=_EPS)


@pytest.mark.parametrize(
    ("connect_delay", "starts"),
    [(0.005, [0.005, 2.01, 4.01, 6.01]), (0.0, [0.0, 2.005, 4.005, 6.005])],
)
def test_a_hold_that_costs_less_than_a_token_is_held_and_owed(
    connect_delay: float, starts: list[float]
) -> None:
    """0.5/s with a burst of one, 5 ms latency. The first answer may be latency or a first
    arrival that late (a slow first connection). Waiting out that worst case over the
    reused connection would let a server whose arrival was not late fill up and lose a
    fraction of a token, so the request at 2 s was sent at once: with a 5 ms late first
    arrival it drew a 429, and so did every other request after it (one call gave up
    after three). A loss of less than a token is cheaper than the 429 it prevents (that
    costs at least the token it is refused for): the request waits, and the bucket owes
    what the server may have lost, so the next request is not early either. Read late,
    the later ones leave a token apart: a warm answer shows the requests over the open
    connection are read as they leave, and the slack keeps nothing of the late read (a
    new connection's is owed on the wire by the request that opens one,
    `wire_written`); before, each token kept 5 ms more (4.015, 6.02)."""
    s = Scenario(
        name="repro", title="", calls=len(starts), rate=0.5, burst=1, latency=0.005,
        connect_delay=connect_delay, headers="draft",
    )  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    assert [round(start, 9) for start in outcome.server.starts()] == starts


def test_a_window_sheds_by_whole_windows_not_by_its_average_rate() -> None:
    """2 requests per 4 s window, 2 in flight, 5 ms each, a 16.8 s deadline: the windows at
    0, 4, 8, 12 and 16 s carry all ten calls. Shedding judged the queue by the window's
    average rate (a token every 2 s), which put the tenth call at 18 s and answered it
    at once; a window gives its tokens back two at a time, and the tenth starts at 16."""
    s = Scenario(
        name="repro", title="", calls=10, rate=0.5, burst=2, latency=0.005, max_in_flight=2,
        model="fixed", deadline=16.8,
    )  # fmt: skip
    outcome = run(s)
    assert can_finish(s) == 10
    assert all(r.status is Status.OK for r in outcome.turn.results)
    starts = [round(start, 9) for start in outcome.server.starts()]
    assert starts == [0.0, 0.0] + [round(4.0 * k + 0.005, 9) for k in range(1, 5) for _ in "ab"]


@pytest.mark.parametrize("model", ["fixed", "sliding"])
def test_a_window_whose_answers_jitter_holds_each_token_as_long_as_its_own_answer_shows(
    model: Any,
) -> None:
    """10 per second, 50 ms and 0-100 ms of jitter: ten at once, then ten at once a window
    after the burst's earliest answer (until a request over a reused connection is answered,
    that much of it may have been a late arrival), then each of the third ten a window
    after its token's answer, less the quickest round trip known then: a round trip that
    long may have been a late arrival. The margin for how much all round trips vary,
    kept before for every window, started all ten at the latest of those (1.07x the
    fastest here; over 300 calls at 10 per 0.2 s with 50 ms of jitter, 1.25x against
    1.15x now, in real time)."""
    s = Scenario(
        name="repro", title="", calls=30, rate=10, burst=10, latency=0.05, jitter=0.1,
        model=model,
    )  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    records = outcome.server.records
    earliest = min(record.end for record in records[:10])
    quickest, third = math.inf, []
    for record in sorted(records[:20], key=lambda r: r.end):
        quickest = min(quickest, record.end - record.start)
        if record.start > 0.0:  # the second ten's answers free the third's tokens
            third.append(round(record.end - quickest + 1.0, 9))
    starts = [round(start, 9) for start in outcome.server.starts()]
    assert starts == [0.0] * 10 + [round(1.0 + earliest, 9)] * 10 + sorted(third)
    assert outcome.makespan <= 1.07 * fastest(s)


def test_a_window_shorter_than_the_latency_keeps_its_bookings_until_they_are_answered() -> None:
    """One per 57 ms, 365 ms each. The log forgot a booking a window after it left, long
    before its answer came; that answer's count then took the request itself for another
    client's and held a token a window more, at every answer (1.22x the fastest). Now the
    only cost is the first requests': each opened a connection, and once the first answer
    shows such a round trip takes 0.365 s, each may reach the server as late as that
    after its connection began (`ScopeFront._hold_cold_unanswered`; a server slow to
    take in new connections reads them so, and one over a reused connection, read at
    once, would land inside their windows). The eighth request, over a reused
    connection, waits a window past the seventh's worst case: the one first answer a
    late first arrival may cost (module docstring)."""
    s = Scenario(name="repro", title="", calls=24, rate=1 / 0.057, burst=1, latency=0.365,
                 model="fixed")  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    # Seven before the first answer (at 0.365 s); the rest one a window apart from a
    # window after the seventh's worst case (0.342 + 0.365 s).
    starts = [0.057 * k for k in range(7)] + [0.342 + 0.365 + 0.057 * k for k in range(1, 18)]
    assert [round(start, 9) for start in outcome.server.starts()] == [round(t, 9) for t in starts]
    assert outcome.makespan == pytest.approx(fastest(s) + 0.365, abs=_EPS)


@st.composite
def capped_windows(draw: Callable[..., Any]) -> Scenario:
    """A fixed window or a sliding log with an in-flight cap, answers that do not jitter,
    and a latency up to the window's length or past it."""
    return Scenario(
        name="drawn", title="a capped window",
        **_drawn_load(draw, fewest_calls=1, rates=(5, 500), latencies=(1, 100)),
        max_in_flight=draw(st.integers(1, 16)),
        retry_after=draw(st.sampled_from(["seconds", "ms", "http-date", "absent"])),
        model=draw(st.sampled_from(["fixed", "sliding"])),
        headers=draw(st.sampled_from(["draft", "ietf", "x", "none"])),
    )  # fmt: skip


@settings(max_examples=40, deadline=None, derandomize=True)
@given(s=capped_windows())
def test_a_capped_window_costs_no_first_answer_once_a_warm_one_came(s: Scenario) -> None:
    """Told a window and an in-flight cap, fanout is within 1.05x the fastest, with no
    allowance for the first answers where a request over a reused connection can be
    answered before the window first turns over (in the fastest schedule, the request
    after the cap's first is): the requests that opened connections then hold their
    tokens from when the warm answers show they arrived, not from their own answers.
    (Held from those, 40 calls at 10 per second, four in flight, 400 ms each, took
    4.6 s for 4.2.) Otherwise no client can tell a late first arrival from a slow
    answer (module docstring), and the allowance is one first answer, as above."""
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    assert outcome.server.count(status=503) == 0
    assert all(r.status is Status.OK for r in outcome.turn.results)
    ends = optimal(s)
    cap = s.max_in_flight
    assert cap is not None
    warm_answer = ends[cap] if s.calls > cap else math.inf
    turns_over = ends[s.burst] - s.latency if s.calls > s.burst else math.inf
    allowance = 0.0 if warm_answer <= turns_over else _first_answer(s)
    assert outcome.makespan <= 1.05 * fastest(s) + allowance + _EPS


@pytest.mark.parametrize("model", ["fixed", "sliding"])
@pytest.mark.parametrize("latency", [0.1, 0.2, 0.4])
def test_a_window_holds_the_first_requests_from_when_they_arrived_once_a_warm_answer_says(
    model: Any, latency: float
) -> None:
    """Issue 13's forty calls at ten per second, four in flight, as a window: the first four
    opened their connections, so until a request over a reused one is answered they may
    have reached the server as late as their answers, and the log held their tokens a
    window from then. The warm answers, at twice the latency, show that opening cost
    nothing; held as before, the eleventh request waited a latency past the window's end
    (4.6 s for 4.2 at 0.4 s: 1.45x the least against the other server, 1.39x aiometer's).
    Now they hold their tokens a window from when they left, and the run is the fastest."""
    s = Scenario(name="repro", title="", calls=40, rate=10, burst=10, latency=latency,
                 max_in_flight=4, model=model)  # fmt: skip
    outcome = run(s)
    assert outcome.server.count(status=429) == 0
    assert all(r.status is Status.OK for r in outcome.turn.results)
    starts = outcome.server.starts()
    assert starts[10] == pytest.approx(1.0, abs=_EPS)
    assert outcome.makespan == pytest.approx(fastest(s), abs=_EPS)


@st.composite
def clock_keyed_windows(draw: Callable[..., Any]) -> Server:
    """A fixed window keyed by the clock (Kong's, Envoy's) that states its counts and its
    end, in any header style and with any wait, met at any twentieth of a window, and up
    to four windows' worth of calls."""
    limit = draw(st.integers(1, 25))
    window = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0, 10.0]))
    return Server(
        model="fixed",
        rate=limit / window,
        burst=limit,
        latency=draw(_grid(1, 60, 200)),
        jitter=0.0,
        max_in_flight=None,
        headers=draw(st.sampled_from(["draft", "ietf", "x", "openai"])),
        retry_after=draw(st.sampled_from(["seconds", "ms", "http-date", "absent"])),
        calls=draw(st.integers(1, 4 * limit)),
        window_phase=draw(_grid(0, 19, 20)),
    )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(server=clock_keyed_windows())
def test_a_told_window_keyed_by_the_clock_is_met_at_any_phase(server: Server) -> None:
    """Told "N per W" and met partway through a window keyed by the clock: no 429, every
    call ok, and no wave later than the server's own window by more than its ``Reset``'s
    rounding (a second, or nothing for OpenAI's exact durations) and two answers: the
    burst's, which says when the window ends, and the one request's sent then, whose
    count shows what the server forgot (`SlidingLog.sync`). Counted from our first burst
    alone, each wave could go up to a window late."""
    scope = Scope("api", limit=server.burst, per=server.burst / server.rate)

    async def told() -> tuple[ThrottlingServer, float]:
        throttling, _ = await learn(server.config(), server.calls, scope)
        return throttling, max(r.end for r in throttling.records)

    throttling, took = trio.run(told, clock=trio.testing.MockClock(autojump_threshold=0))
    assert throttling.count(status=429) == 0
    assert throttling.count(status=200) == server.calls
    rounding = 0.0 if server.headers == "openai" else 1.0
    assert took <= fastest_learned(server) + rounding + 2 * server.latency + _EPS


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_a_refusal_read_off_keeps_its_connection(seed: int) -> None:
    """A bucket of one at 20/s whose server reads each new connection's first request
    150 ms late: one 429, to the first request over a reused connection (before any warm
    answer; above). Closed unread, each 429's response closed its connection; the next
    request opened one and arrived late beside one sent over an open one: five to seven
    429s, each a second's wait (4-6x the fastest). Its body read off, the connection
    stays, and so does the pace."""
    config = ServerConfig(
        rate=20, burst=1, latency=0.02, headers="draft", connect_delay=0.15, jitter=0.005,
        seed=seed,
    )  # fmt: skip

    async def turn() -> tuple[ThrottlingServer, fanout.Turn, float]:
        began = trio.current_time()
        server, turn = await learn(config, 30, Scope("key", rate=20, burst=1))
        return server, turn, trio.current_time() - began

    server, told, makespan = trio.run(turn, clock=trio.testing.MockClock(autojump_threshold=0))
    assert server.count(status=429) <= 1
    assert all(r.status is Status.OK for r in told.results)
    assert makespan < 1.8 * (29 / 20 + 0.02 + 0.15)


# Told windows whose whole-second resets are rounded one way or another.
_ROUNDED_WINDOWS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["fixed", "sliding"]),
    "limit": st.integers(2, 12),
    "per": st.sampled_from([1.0, 2.0, 3.0]),
    "rounding": st.sampled_from(["up", "nearest", "down"]),
}


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    **_ROUNDED_WINDOWS,
    as_epoch=st.booleans(),
    headers=st.sampled_from(["draft", "x"]),
    calls=st.integers(10, 40),
)
def test_a_told_window_draws_one_429_at_most_however_its_reset_is_rounded(
    model: str, limit: int, per: float, rounding: str, as_epoch: bool, headers: str, calls: int
) -> None:
    """A window's reset in whole seconds, rounded down (Go's ``time.RFC3339``,
    ``int(epoch)``), names a time up to a second before its place is back: read as
    rounded up, a told window sent a request at each reset, and drew a 429 each time
    (5-10 against 10 per 2 s). One shows the server rounds down, and the scope reads
    each reset a second later from then on; a reset of 0 with nothing left shows it
    at once."""
    config = ServerConfig(
        rate=limit / per, burst=limit, model=model, latency=0.1, headers=headers,  # type: ignore[arg-type]
        reset_rounding=rounding, reset_as_epoch=as_epoch,  # type: ignore[arg-type]
    )  # fmt: skip
    scope = Scope("key", limit=limit, per=per)
    server, turn = trio.run(
        learn, config, calls, scope, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert server.count(status=429) <= 1
    assert all(r.status is Status.OK for r in turn.results)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    **_ROUNDED_WINDOWS,
    spelling=st.sampled_from(["relative", "epoch", "rfc3339"]),
    wall_phase=st.floats(0.0, 0.999),
    calls=st.integers(10, 40),
)
def test_a_told_window_begun_by_its_first_request_draws_no_429_however_its_reset_reads(
    model: str,
    limit: int,
    per: float,
    rounding: str,
    spelling: str,
    wall_phase: float,
    calls: int,
) -> None:
    """A window that begins with the client's first request ends by the log's own end:
    a whole-second reset, rounded however and spelled however, frees a token sooner
    only where it would come back half a second sooner or more, and a request sent at
    a reset rounded down is the scope's one 429 (it shows the rounding); its
    ``Retry-After`` outlasts the window by half a second at most. Rounded up: no 429.

    Read as rounded up, a truncated epoch (``int()``) or RFC 3339 time (Go's) freed a
    token up to a second before the window ended, every burst's answers freed two, and
    the requests that took them drew 429s and whole-second ``Retry-After`` waits (an
    outside server: one to four 429s, 1.09-1.19 times the fastest)."""
    config = ServerConfig(
        rate=limit / per, burst=limit, model=model, latency=0.1,  # type: ignore[arg-type]
        headers="anthropic" if spelling == "rfc3339" else "x",
        reset_rounding=rounding, reset_as_epoch=spelling == "epoch",  # type: ignore[arg-type]
    )  # fmt: skip
    scope = Scope("key", limit=limit, per=per)
    server, turn = trio.run(
        functools.partial(learn, config, calls, scope, epoch=math.floor(EPOCH) + wall_phase),
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    refused = server.count(status=429)
    assert refused <= (0 if rounding == "up" else 1)
    assert all(r.status is Status.OK for r in turn.results)
    fastest_makespan = (calls - 1) // limit * per + 0.1
    # And a first answer: what waiting out a possibly late first arrival costs (as above);
    # and what a 429's wait outlasted the window by, and its round trip.
    lost = refused * (0.5 + 0.1)
    assert max(r.end for r in server.records) <= 1.05 * fastest_makespan + 0.1 + lost + _EPS
