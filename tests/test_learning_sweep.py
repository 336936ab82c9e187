"""Learning against any server: generated servers, not the rows we thought of.

Issue 13's target for a scope told no rate and no burst (the benchmarks'
``fanout_learned``): at most three refused requests (429 and 503; a
probe's, sent before any answer, count once), every call answered ok, and
a makespan within 1.20 times the fastest any client could finish, on every
server model. Here the server is drawn: its model,
numbers, latency, jitter, in-flight cap, header style and Retry-After format,
and client and server run in one ``trio.run`` on a MockClock, so a
counterexample is exact and replays as it was found.

What the draws found, each pinned below by an exact repro named for what it
shows, and what is still missed (the makespan property is an expected
failure until learning meets it; ``README.md``, "Learning limits").
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import unittest.mock
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import Phase, assume, example, given, settings
from hypothesis import strategies as st

import fanout
import fanout._slots
from benchmarks.scenarios import FULL, jittered_makespan, min_makespan
from fanout import Scope, Status
from fanout.testing import ServerConfig, ThrottlingServer
from tests.clocks import replayable_run, ticking_clock
from tests.test_learning_no_numbers import learn

if TYPE_CHECKING:
    from collections.abc import Iterator

_REFUSED = 3  # 429s and 503s a learning scope may draw
_WITHIN = 1.20  # times the minimum makespan


@attrs.frozen
class Server:
    """A drawn server: ``model`` is a ``ServerConfig`` model, or ``"concurrency"`` (no rate)."""

    model: str
    rate: float
    burst: int
    latency: float
    jitter: float
    max_in_flight: int | None
    headers: str
    retry_after: str
    calls: int
    reset: str = "full"
    seed: int = 0
    rate_status: int = 429  # what the rate refuses with (403: as GitHub's, with its headers)
    window_phase: float = 0.0  # a fixed window's first began this share of one before us
    cap_told: bool = True  # the scope is told the in-flight cap (None: there is none)
    # The X- and draft reset as an epoch, to the millisecond, this late (slowapi's: 1 s).
    reset_as_epoch: bool = False
    reset_precise: bool = False
    reset_late: float = 0.0
    reset_rounding: str = "up"  # as ``round()`` ("nearest") or ``int()`` ("down") would
    state_at_answer: bool = False  # its count as of the answer, after its latency
    connect_delay: float = 0.0  # each connection's first request is read this late
    state_on_refusals: bool = False  # its counts on 429s only

    def config(self) -> ServerConfig:
        concurrency = self.model == "concurrency"
        return ServerConfig(
            rate=None if concurrency else self.rate,
            burst=self.burst,
            max_in_flight=self.max_in_flight,
            latency=self.latency,
            jitter=self.jitter,
            seed=self.seed,
            retry_after=self.retry_after,  # type: ignore[arg-type]
            headers=self.headers,  # type: ignore[arg-type]
            model="bucket" if concurrency else self.model,  # type: ignore[arg-type]
            reset=self.reset,  # type: ignore[arg-type]
            rate_status=self.rate_status,
            window_phase=self.window_phase,
            reset_as_epoch=self.reset_as_epoch,
            reset_precise=self.reset_precise,
            reset_late=self.reset_late,
            reset_rounding=self.reset_rounding,  # type: ignore[arg-type]
            state_at_answer=self.state_at_answer,
            connect_delay=self.connect_delay,
            state_on_refusals=self.state_on_refusals,
        )

    def scope(self) -> Scope:
        """What ``fanout_learned`` tells the scope: the in-flight cap where there is one
        (``fanout_learned_uncapped``: nothing at all, unless ``cap_told``)."""
        return Scope("api", max_concurrency=self.max_in_flight if self.cap_told else None)


def fastest(server: Server, *, blind: bool = False) -> float:
    """The fastest any client could finish ``server.calls`` against ``server``.

    The schedule that starts every request at the earliest instant the
    server would admit it and a slot is free, in admission order (the k-th
    admission takes ``latency`` plus the server's k-th jitter draw), is
    optimal: each start is a non-decreasing function of the earlier ones
    (`benchmarks.scenarios` argues the same for a bucket). Unlike
    ``min_makespan`` this also covers windows, and a cap together with
    jitter (a slot is held for the jittered duration).
    """
    draws = random.Random(server.seed)
    window = server.burst / server.rate
    starts: list[float] = []
    ends: list[float] = []
    tokens, updated = float(server.burst), 0.0
    for k in range(server.calls):
        t = starts[-1] if starts else 0.0
        if blind and k == _REFUSED + 1:
            t = max(t, min(ends))  # the first answer
        cap = server.max_in_flight
        if cap is not None and k >= cap:
            t = max(t, sorted(ends)[k - cap])
        if server.model == "bucket":
            tokens = min(float(server.burst), tokens + (t - updated) * server.rate)
            if tokens < 1.0 - 1e-12:
                t += (1.0 - tokens) / server.rate
                tokens = 1.0
            tokens, updated = tokens - 1.0, t
        elif server.model == "fixed":
            # Windows follow each other from a phase of one before the first request.
            t = max(t, (k // server.burst - server.window_phase) * window)
        elif server.model == "sliding" and k >= server.burst:
            t = max(t, starts[k - server.burst] + window)
        starts.append(t)
        ends.append(t + server.latency + (draws.uniform(0, server.jitter) if server.jitter else 0))
    return max(ends, default=0.0)


async def learn_on(server: Server) -> tuple[ThrottlingServer, fanout.Turn, float]:
    """The turn, as ``fanout_learned`` runs it; the server, the turn and its makespan."""
    began = trio.current_time()
    throttling, turn = await learn(server.config(), server.calls, server.scope())
    answered = max(e.time for e in turn.trace if e.kind is fanout.EventKind.ANSWERED)
    return throttling, turn, answered - began


def run(
    server: Server, clock: trio.testing.MockClock | None = None
) -> tuple[ThrottlingServer, fanout.Turn, float]:
    """One turn on a MockClock (or ``clock``), replayable (`tests.clocks`)."""
    return replayable_run(learn_on, server, seed=server.seed, clock=clock)


@st.composite
def servers(draw: st.DrawFn) -> Server:
    """Any server of the matrix's kinds, with numbers of its own (ranges: module tests)."""
    model = draw(st.sampled_from(["bucket", "bucket-next", "fixed", "sliding", "concurrency"]))
    reset = "next" if model == "bucket-next" else "full"
    model = "bucket" if model == "bucket-next" else model
    headers = draw(st.sampled_from(["draft", "ietf", "x", "none"]))
    burst = draw(st.integers(1, 25))
    if headers == "ietf" and model != "concurrency":
        # The IETF policy states its window in whole seconds: a server states its
        # own policy only when that window is whole (else it advertises a slower
        # rate than it enforces, and a client that honours it is slower too).
        rate = burst / draw(st.integers(1, 3))
    else:
        rate = draw(st.floats(2.0, 50.0))
    cap = draw(st.none() | st.integers(1, 16))
    if model == "concurrency" and cap is None:
        cap = draw(st.integers(1, 16))
    latency = draw(st.floats(0.01, 0.3))
    return Server(
        model=model,
        rate=rate,
        burst=burst,
        latency=latency,
        jitter=draw(st.sampled_from([0.0, 0.5])) * latency,
        max_in_flight=cap,
        headers=headers,
        retry_after=draw(st.sampled_from(["seconds", "ms", "http-date", "absent"])),
        calls=draw(st.integers(1, 80)),
        reset=reset,
        seed=draw(st.integers(0, 3)),
    )


def refused(throttling: ThrottlingServer) -> int:
    return throttling.count(status=429) + throttling.count(status=503)


_READ = 1e-3  # how long after the server answers the client may read it (`spent`)


def spent(throttling: ThrottlingServer) -> int:
    """The refusals learning spent: those of requests that reached the server before
    the first answer could be read are one congestion event, the probe's, and count
    once. (On a clock that ticks, as in real time, a request sent blind reaches the
    server a few readings after the first refusal left it: `tests.clocks`.)"""
    first_answer = min((r.end for r in throttling.records), default=0.0) + _READ
    blind = sum(r.start <= first_answer for r in throttling.records if r.status in (429, 503))
    return refused(throttling) - max(0, blind - 1)


def refusals(throttling: ThrottlingServer) -> list[float]:
    return [round(r.start, 9) for r in throttling.records if r.status in (403, 429, 503)]


def assert_learned(server: Server, *, refused_at: list[float], makespan: float) -> None:
    """``server``'s turn, replayed: every call ok, refused when said, and done by then."""
    throttling, turn, took = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refusals(throttling) == refused_at
    assert took == pytest.approx(makespan)


# The docstring below is part of what seeds its derandomized draws, so it is kept as
# it was: its reason for the exception is dated. A server found shut is now probed at
# times twice as far apart, and those probes spend no call's attempts
# (`RateLearner._probe_closure`); the exception stands because each probe is a 429, and
# a longer window takes more than three (`test_a_window_that_states_nothing_...`).
# Reworded, the draws changed and met a window of one that draws a fourth at the code
# before too (`test_a_window_of_one_a_half_second_stating_its_counts_draws_a_fourth`).
@settings(max_examples=60, deadline=None, derandomize=True)
@given(server=servers())
def test_learning_answers_every_call_and_draws_at_most_three_refusals(server: Server) -> None:
    """Any server: every call ok, and at most three 429s and 503s, the probe's counted once.

    The same 60 servers each run, so that CI is repeatable; the pinned
    servers below are what a wider seeded search (thousands of servers) found.

    Except a window that says nothing at all (no state headers, no
    Retry-After): nothing tells when it reopens, so a call's three attempts
    can all land inside one window however they are spaced, and a longer
    window defeats any finite number of them.
    """
    assume(server.model in ("bucket", "concurrency") or server.headers != "none"
           or server.retry_after != "absent")  # fmt: skip
    throttling, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= _REFUSED


@settings(max_examples=60, deadline=None, derandomize=True)
@given(server=servers(), tick=st.sampled_from([1e-6, 5e-6, 2e-5]))
def test_learning_draws_at_most_three_refusals_as_time_moves_on(
    server: Server, tick: float
) -> None:
    """As above, on a clock later at every reading, as real time is (`tests.clocks`):
    where a mock clock reads one instant twice, real time reads two. In a seeded scan
    of 400 drawn servers, 5 spent more than three here against 2 on a mock clock, until
    a stricter rate taught in a 429's wait booked again what was booked for its end
    (`test_a_stricter_rate_taught_during_a_429_s_wait_...`); now 2 and 2."""
    assume(server.model in ("bucket", "concurrency") or server.headers != "none"
           or server.retry_after != "absent")  # fmt: skip
    throttling, turn, _ = run(server, ticking_clock(tick))
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= _REFUSED


@settings(max_examples=100, deadline=None, derandomize=True)
@given(server=servers(), rounding=st.sampled_from(["nearest", "down"]))
def test_a_reset_rounded_to_the_nearest_or_a_lower_second_is_learned(
    server: Server, rounding: str
) -> None:
    """Any token bucket that states a reset, rounding it as ``round()`` or ``int()``
    would, not up: with tokens to spare, it says ``Reset: 0``. Every call ok, at most
    three refusals (the probe's counted once), and within a fifth of the time the same
    server rounding up takes (learning's own margin: the two learn from different
    numbers, and one drawn server took 1.15x as long). A Reset of 0 was no first guess
    of the rate, and the probe's Remaining went unread: a 429 in the first wave, and
    bookings a second deep behind it (1.5x as long); with nothing remaining, a Reset
    of 0 was read as now, and each wait for it ended in a 429 (four, against 2/s with
    a burst of 18). A window is another matter
    (`test_a_window_whose_reset_is_rounded_down_draws_a_fourth`)."""
    assume(server.model == "bucket" and server.headers != "none")
    _, _, rounded_up = run(server)
    throttling, turn, took = run(attrs.evolve(server, reset_rounding=rounding))
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= _REFUSED
    assert took <= 1.2 * rounded_up


@settings(max_examples=100, deadline=None, derandomize=True)
@given(server=servers())
def test_a_bucket_that_states_its_count_as_it_answers_is_learned(server: Server) -> None:
    """Any token bucket stating its counts as it answers, after its latency (slowapi's; a
    handler that works, then asks its limiter what is left): every call ok, and at most
    three refusals, the probe's counted once. Its counts are later than the requests'
    arrivals, and say less: read as of the answer once a wave shows it
    (`ScopeFront._counted_at`), none is exact, and none may be spent twice. How fast:
    the rows in ``tests/test_learning.py`` (``state_at_answer``); against 150 drawn
    buckets with a burst of four or more, as fast as the same servers counting on
    arrival (0.99 times, geometric mean), 1.13 times at most; with smaller bursts, or a
    cap of one, learning's other limits show, as they do on arrival. (Windows that
    count so: slowapi's rows, `test_learning_a_window_whose_reset_runs_a_second_late`.)"""
    assume(server.model == "bucket" and server.headers != "none")
    throttling, turn, _ = run(attrs.evolve(server, state_at_answer=True))
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= _REFUSED


def test_nothing_remaining_and_a_reset_of_0_is_read_as_a_reset_of_a_second() -> None:
    """A bucket of 18 at 2/s whose reset to its next token is rounded to the nearest
    second: with nothing remaining it says 0 (its next token is under half a second
    away). Read as a second, the turn is the one a server rounding up gets, refusal for
    refusal; read as now, four 429s, at 0.306, 0.612, 1.223 and 3.445 s."""
    server = Server("bucket", 2.0, 18, 0.25, 0.0, None, "draft", "ms", 25, reset="next")
    up, _, took_up = run(server)
    nearest, turn, took = run(attrs.evolve(server, reset_rounding="nearest"))
    assert all(r.status is Status.OK for r in turn.results)
    assert refusals(nearest) == refusals(up) == [0.305555556, 1.638888889]
    assert took == pytest.approx(took_up)


def _assert_learned_as_rounding_up(server: Server) -> None:
    """Every call ok, at most two 429s, and no slower than ``server`` rounding its reset up."""
    throttling, turn, took = run(server)
    _, _, rounded_up = run(attrs.evolve(server, reset_rounding="up"))
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= 2
    assert took <= rounded_up


def test_a_window_whose_reset_is_rounded_down_is_learned() -> None:
    """A fixed window of 3 per 1.5 s whose reset is rounded down (``int()``): every call
    ok, two 429s, and no slower than the same window rounding up. Its ``Reset: 0`` with
    requests counted (the window not over) is under a second, not now: read as now, the
    log freed a token the server still counted at each such answer, and learning drew
    four 429s, at 0.458, 2.708, 3.833 and 5.333 s."""
    server = Server("fixed", 2.0, 3, 0.125, 0.0, None, "draft", "seconds", 13,
                    reset_rounding="down")  # fmt: skip
    _assert_learned_as_rounding_up(server)


@pytest.mark.xfail(
    strict=True,
    reason="open: a fixed window of one per half second stating its counts, probed four "
    "wide, draws a fourth 429 (three at 0.757, 2.971 and 7.993 s after the probe's)",
)
def test_a_window_of_one_a_half_second_stating_its_counts_draws_a_fourth() -> None:
    """Found when the property above drew other servers; the code before draws it too."""
    server = Server("fixed", 2.0, 1, 0.01, 0.005, 6, "draft", "ms", 16)
    throttling, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= _REFUSED


def test_a_bucket_whose_reset_is_rounded_down_is_learned_as_one_rounding_up() -> None:
    """A bucket of 4 at 3.5/s whose reset (until full) is rounded down, taken for a window
    on trial after its second wave: the same two 429s and the same makespan as rounding
    up. Its ``Reset: 0`` with tokens counted freed a token of the trial's log at once, a
    fifth request followed the wave, and learning drew four 429s (4.74 s, 4.34 now).
    Drawn by the rounding property above in one run of a group of test files."""
    server = Server("bucket", 3.5, 4, 0.03125, 0.0, None, "draft", "seconds", 16,
                    reset_rounding="down")  # fmt: skip
    _assert_learned_as_rounding_up(server)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(server=servers())
def test_a_403_that_says_it_is_the_rate_is_learned_as_a_429(server: Server) -> None:
    """Any server with a rate, refusing with a 403 as GitHub's primary limit does
    (``Remaining: 0`` in its headers) or with a Retry-After as its secondary limits do:
    the same turn as with 429s, refusal for refusal, to the same instant.

    Before, such a 403 was a final answer: every call past the limit failed
    "Forbidden" and nothing waited. A server that says neither cannot be told
    from a permission refusal, and is left out.
    """
    assume(server.model != "concurrency")
    assume(server.headers != "none" or server.retry_after != "absent")
    throttling, turn, took = run(server)
    github, turn_403, took_403 = run(attrs.evolve(server, rate_status=403))
    assert refusals(github) == refusals(throttling)
    assert github.count(status=429) == 0
    assert [r.status for r in turn_403.results] == [r.status for r in turn.results]
    assert took_403 == pytest.approx(took)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(server=servers(), style=st.sampled_from(["shopify", "azure"]))
def test_a_bucket_stating_its_level_but_no_reset_is_learned(server: Server, style: str) -> None:
    """Any token bucket (of two or more) that states its limit and what remains, but no
    reset and no window, as Shopify's fill level ``X-Shopify-Shop-Api-Call-Limit: 32/40``
    does, or only what remains, as Azure OpenAI's ``x-ratelimit-remaining-requests``:
    every call ok, and at most three refusals, the probe's counted once.

    Before, the stated limit was taken for a stated rate, and with no reset there was
    no first guess: nothing paced the calls. Against 2/s with a burst of 40 (Shopify's),
    80 calls drew 20 429s and 5 calls gave up; with no Retry-After either, 39 and 19.
    Now the rate is learned as from bare 429s, with the stated burst: after the first
    429, the first guess is what was admitted beyond the burst.
    """
    assume(server.model == "bucket" and server.burst >= 2)
    throttling, turn, _ = run(attrs.evolve(server, headers=style))
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= _REFUSED


def test_a_sliding_log_that_states_only_its_waits_is_counted_in_as_one() -> None:
    """20 per 4 s in a sliding log, 300 ms, no headers but ``Retry-After`` in ms, 120
    calls. The first 429 (after the burst of 20) waits until the first two requests
    leave; the second, two requests later, until the third leaves, where a log of 20
    per 4 s puts it. Before, the answers were fitted as a deep bucket refilling at
    0.16-0.98/s: 119.4 s for what takes 20.3 (5.9 times); now 21.4 s."""
    server = Server("sliding", 5, 20, 0.3, 0.0, None, "none", "ms", 120)
    assert_learned(server, refused_at=[1.114368132, 4.10563129], makespan=21.39210851648328)


def test_a_bucket_whose_whole_second_waits_fit_a_log_is_not_counted_in_one() -> None:
    """Found by a wider seeded search (the code of the release before drew the same). At
    255 ms, the first run of 11 took 0.72 s; the second 429's wait, rounded up to a
    second, ends where a log of 11 per 1.72 s would reopen, and every bucket that fits
    is slower (0.8-2.4/s). Counted in that log, each reopening sent nine at once into a
    bucket that held two: 15 429s, and four calls answered ``rate_limited``. Doubted,
    the window is paced one request at a time from the wait's end, and the bucket
    refuses one of them (`RateLearner._doubt_window`)."""
    server = Server("bucket", 2.0, 10, 0.25519726468185366, 0.0, None, "none", "seconds", 41,
                    seed=2)  # fmt: skip
    throttling, _, _ = run(server)
    assert_learned(
        server,
        refused_at=[0.717742307, 1.917742307, 3.938531366],
        makespan=18.835450882936566,
    )
    doubted = [r for r in throttling.records if 2.9 < r.start <= 3.94]  # the wait's end on
    assert len(doubted) == 5
    assert all(b.start >= a.end for a, b in itertools.pairwise(doubted))  # one at a time


@settings(max_examples=20, deadline=None, derandomize=True)
@example(
    rate=2.0, burst=24, latency=0.23795328514500902, jitter=0.5, calls=77, reset="full", seed=1
).via("a drawn bucket that drew 40 429s, and calls answered rate_limited, before")
@example(
    rate=1.0, burst=8, latency=0.2775192273591164, jitter=0.5, calls=20, reset="full", seed=2
).via("taken for a log of 8 per 1.93 s that half its rate fits: 12 429s, four failed")
@given(
    rate=st.floats(1.0, 4.0),
    burst=st.integers(8, 25),
    latency=st.floats(0.01, 0.3),
    jitter=st.sampled_from([0.0, 0.5]),
    calls=st.integers(20, 80),
    reset=st.sampled_from(["full", "next"]),
    seed=st.integers(0, 3),
)
def test_a_deep_bucket_stating_only_whole_second_waits_is_not_flooded_as_a_window(
    rate: float, burst: int, latency: float, jitter: float, calls: int, reset: str, seed: int
) -> None:
    """A slow bucket with a deep burst, no headers and ``Retry-After`` in whole seconds
    (rounded up) explains its first run and 429s as a window would: every call ok, and
    at most three 429s. Over 150 drawn, the code before failed calls on six."""
    server = Server("bucket", rate, burst, latency, jitter * latency, None, "none", "seconds",
                    calls, reset=reset, seed=seed)  # fmt: skip
    throttling, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= _REFUSED


def test_calls_waiting_behind_a_cap_a_probe_s_503_showed_are_not_its_wave() -> None:
    """nginx's ``limit_req`` at 2/s with no burst: it refuses with a bare 503. The probe's
    second request is refused while the first is out, which shows a cap of one, and the
    other 25 calls wait for the place. Counted as the probe's wave (26), they made the
    slow start 2,700/s at the first answer, and its first 429 read 24 admitted, a
    guess of 24/s: five refusals where a 429 draws two. Only what left counts."""
    server = Server(
        "bucket", 2.0, 1, 0.01, 0.0, None, "none", "absent", 27, seed=1, rate_status=503
    )
    assert_learned(server, refused_at=[0.0, 0.01, 1.35], makespan=19.29464888216587)


def test_a_window_on_trial_is_as_long_as_an_exact_wait_shows() -> None:
    """10 per 2.07 s in a sliding log, stating its counts (X- headers) and waits in ms, 75
    calls. The window trial took its length from the learned rate, halved at each 429
    to 10 per 1.82 s, and the log sent nine at once as it reopened: all nine refused,
    14 in all, and a call answered rate_limited once they spent the retry budget.
    Found by a wider seeded search. The 429 that began the trial that passed waited
    0.25 s for the oldest of the last ten requests to leave, sent 2.07 s before then:
    the log now counts in 2.07 s, with three 429s. (Each trial goes a moment after the
    wait, `past_reset`. 0.4 ms sooner since a count of tokens the log had already let
    go stopped voiding its bookings: `SlidingLog._release`.)"""
    server = Server("sliding", 4.829359244625359, 10, 0.01, 0.005, None, "x", "ms", 75)
    assert_learned(
        server,
        refused_at=[0.314222109, 2.717834839, 4.537304296],
        makespan=16.635814232161522,
    )


def test_a_window_learned_is_never_longer_than_the_policy_states() -> None:
    """A fixed window of 22 a second that states its policy (``w=1``), its 429's wait
    as an HTTP-date (read against the server's finer clock: 1.578 s, where the window
    reopened 0.828 s on). The trial read that wait as showing a window 1.75 s long,
    and the scope counted 22 per 1.75 s (3.754 s, 1.76 times the minimum). The server's
    own policy bounds the window it counts in: 22 per second, 3.004 s."""
    server = Server("fixed", 22.0, 22, 0.127, 0.0, None, "ietf", "http-date", 53, seed=2)
    assert_learned(server, refused_at=[0.172454545], makespan=3.004)


def test_a_bucket_whose_waits_end_late_is_judged_by_the_guessed_window() -> None:
    """2/s with a burst of 13, a cap of 1, Reset its next token, Retry-After as an
    HTTP-date (a wait read against the server's finer clock, so not whole, and up to a
    second long). Judged as a window of the length that wait showed (2.39 s), the trial
    found 12 sent within it and one remaining, 13, a log's count: counted as 13 per
    2.39 s, the bucket drew eight 429s. The trial judged by the guessed length, and
    three were drawn (at 1.94, 3.83 and 11.50 s; 33.81 s in all).

    The first guess (13 per reset) no longer lasts until a 429: the bucket, drawn
    down one request at a time, regained too little for it (2.75/s at most by 0.6 s,
    `RateLearner._bound_refill`), and the rate comes down towards 2/s before any 429.
    One is drawn, and the window is never guessed: this server no longer reaches the
    trial it was found by."""
    server = Server(
        "bucket", 2.0, 13, 0.121365846066667, 0.0, 1, "draft", "http-date", 77, reset="next",
        seed=3,
    )  # fmt: skip
    assert_learned(server, refused_at=[2.486768288], makespan=32.892157252334634)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    model=st.sampled_from(["sliding", "fixed"]),
    rate=st.floats(2.0, 50.0),
    burst=st.integers(5, 25),
    latency=st.floats(0.01, 0.3),
    share=st.floats(0.0, 1.0),
    seed=st.integers(0, 3),
)
def test_a_window_that_states_only_exact_waits_is_learned_within_twice_the_minimum(
    model: str, rate: float, burst: int, latency: float, share: float, seed: int
) -> None:
    """Any window (fixed or sliding) of 5 to 25 requests whose 429s carry a wait in ms and
    nothing else, four to five windows' worth of calls: every call ok, at most three
    refusals, and within twice the fastest and a second: the probe, the slow start and
    the first 429's wait cost a short turn about that against any server (a log of 5
    per 0.18 s, 20 calls: 1.48 s for 0.60, as at the code before). At the code before,
    drawn so, a log of 23 per 1.7 s took 8.2 times the fastest."""
    calls = 4 * burst + round(share * burst)
    server = Server(model, rate, burst, latency, 0.0, None, "none", "ms", calls, seed=seed)
    throttling, turn, took = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= _REFUSED
    assert took <= 2.0 * fastest(server) + 1.0


@pytest.mark.parametrize(
    ("server", "refused_at", "makespan"),
    [
        # The benchmark's row: paced at the window's average until the end, 6.29 s (1.25
        # times the fastest); counted in as 10 per second once no bucket explained the
        # answers and more than half of it was admitted, at 1.67 s, each window's
        # requests go as it opens: 5.72 s.
        (
            Server("fixed", 10, 10, 0.05, 0.0, None, "none", "absent", 60),
            [0.133928571, 0.245039683, 0.484793833],
            5.71571135399728,
        ),
        # 20 per 4 s: before, each 429 in the shut window cut the rate again, to
        # 0.23/s, and four were drawn; 445.9 s for what takes 20.3 s (then 28.4 s, paced).
        (
            Server("fixed", 5, 20, 0.3, 0.0, None, "none", "absent", 120),
            [1.114368132, 1.166999711, 1.813983397],
            23.896026450802765,
        ),
        # 30 per 10 s: before, paced at 0.08/s, 58 of the 135 calls would not fit the
        # turn and were answered rate_limited (then 49.7 s, paced).
        (
            Server("fixed", 3, 30, 0.3, 0.0, None, "none", "absent", 135),
            [1.308858466, 1.343341224, 1.965201745, 2.748602778, 5.497205556],
            46.70513629629535,
        ),
    ],
)
def test_a_window_that_states_nothing_is_counted_in_once_it_has_reopened(
    server: Server, refused_at: list[float], makespan: float
) -> None:
    """A fixed window whose 429s carry nothing at all: refused three times in a row after
    the slow start's run, it is shut, and is tried once it may have reopened, at four
    times the run's length from its start and a twentieth (30 per 10 s: twice, four
    and eight times, two 429s more); admitted again, it is paced at the run per that
    time (`RateLearner._pace_reopened`), and counted in as a window once no token
    bucket explains the answers (`RateLearner._trust_reopened`)."""
    assert_learned(server, refused_at=refused_at, makespan=makespan)


def test_the_probes_of_a_shut_server_spend_no_call_s_attempts() -> None:
    """A sliding log of 6 per 10 s that states nothing: shut after three 429s, it is tried
    at 2.1, 4.2 and 8.4 s (each a 429) and takes one again at 16.8 s. Those three are the
    scope's probes: counted as the calls' tries and retries, they spent the scope's
    retry budget, and a call was answered rate_limited ("the downstream is
    failing"). (64.6 s paced at its average to the end; 57.5 s counted in.)"""
    server = Server("sliding", 0.6, 6, 0.1, 0.0, None, "none", "absent", 24)
    assert_learned(
        server, refused_at=[0.2, 0.4, 0.858051974, 2.1, 4.2, 8.4], makespan=57.46666666666669
    )


def test_the_refusals_of_a_probe_sent_blind_spend_no_retry_budget() -> None:
    """Told a cap of 8, learning probes four wide into a bucket of one at 2/s: three of the
    probe are refused at once. Found by a wider seeded search: counted as retries, they
    were the retry budget's floor (three), learning's two 429s after them were retries
    refused, and a call of eight was answered rate_limited ("the downstream is
    failing"). They are the scope's probe, as a shut server's are (`ScopeFront.probed`)."""
    server = Server("bucket", 2.0, 1, 0.01, 0.0, 8, "draft", "absent", 8, reset="next", seed=1)
    assert_learned(
        server, refused_at=[0.0, 0.0, 0.0, 0.755, 2.162410468], makespan=5.375738161302631
    )


@pytest.mark.parametrize(
    ("server", "refused_at", "makespan"),
    [
        # Before: 11 429s. The second run "proved" 13.3/s as a bucket's refill after the
        # first 429, and that floor held the pace over the closure's 9.5/s: a 429 a window.
        # (5.47 s paced to the end; 4.95 counted in after its reopening at 1.35 s.)
        (
            Server("fixed", 10, 10, 0.05, 0.0, None, "none", "absent", 60, window_phase=0.8),
            [0.133928571, 0.847519853, 0.926938072, 1.00635629],
            4.951853669275449,
        ),
        # Before: 68 429s, and 40 of the 100 calls answered rate_limited. The first closure's
        # guess (30 per 4.2 s) was twice the server's, and its floor held it there. The
        # first reopening, at the window's edge 2.1 s on, showed 30 per 2 s: counted in,
        # it refused the request at 4.1 s, and the scope left it (43.7 s paced to the
        # end, with as many 429s).
        (
            Server("fixed", 3, 30, 0.05, 0.0, None, "none", "absent", 100, window_phase=0.8),
            [0.218143078, 0.252625836, 0.358412839, 1.05, 4.1, 4.24, 4.52, 6.3, 10.5],
            40.03666666666665,
        ),
    ],
)  # fmt: skip
def test_a_fixed_window_met_at_any_phase_is_paced_by_each_closure(
    server: Server, refused_at: list[float], makespan: float
) -> None:
    """A fixed window that states nothing, whose windows began before our first request
    (a counter keyed by the clock's second): an edge inside the first run, or between it
    and the probe, makes the first closure's guess too fast. The 429s it draws shut the
    server again, and that closure, whose run began as a window did, is paced in turn;
    a floor proven by admissions after a 429 is a bucket's, and a window's reopening
    disproves it (`RateLearner._pace_reopened`)."""
    assert_learned(server, refused_at=refused_at, makespan=makespan)


async def learn_watching(
    server: Server,
) -> tuple[ThrottlingServer, fanout.Turn, list[float | None]]:
    """As ``learn_on``, and each window the scope counted in, in turn (None: a bucket
    again), as its statistics showed them every 10 ms."""
    scope = server.scope()
    windows: list[float | None] = [None]

    async def watch() -> None:
        while True:
            window = scope.statistics().bucket.window
            if window != windows[-1]:
                windows.append(window)
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        throttling, turn = await learn(server.config(), server.calls, scope)
        nursery.cancel_scope.cancel()
    return throttling, turn, windows[1:]


def test_a_window_guessed_wrong_from_its_reopening_is_left_at_its_first_429() -> None:
    """30 per 10 s keyed by the clock, met 8 s into a window: the first reopening came at
    the window's edge, 2.1 s after our first request, and showed 30 per 2 s. Counted
    in, it refused a request 2 s later, and the scope left it for a bucket again
    (`RateLearner._throttled_blind`), which the next closure paced; its reopening, a
    window later, was counted in from then on (30 per 16 s: probed at times twice as
    far apart, it was found late)."""
    server = Server("fixed", 3, 30, 0.05, 0.0, None, "none", "absent", 100, window_phase=0.8)
    throttling, turn, windows = trio.run(
        learn_watching, server, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert all(r.status is Status.OK for r in turn.results)
    assert windows == [2.0, None, 16.0]
    assert len(refusals(throttling)) == 9


@st.composite
def buckets_stating_nothing(draw: st.DrawFn) -> Server:
    """A token bucket whose 429s carry nothing, slow (0.3-1.5/s: those shut as a window does,
    once the slow start drains them) or not (up to 50/s), drained by up to 100 calls."""
    latency = draw(st.floats(0.01, 0.3))
    return Server(
        model="bucket",
        rate=draw(st.floats(0.3, 1.5) | st.floats(1.5, 50.0)),
        burst=draw(st.integers(1, 25)),
        latency=latency,
        jitter=draw(st.sampled_from([0.0, 0.5])) * latency,
        max_in_flight=draw(st.none() | st.integers(2, 16)),
        headers="none",
        retry_after="absent",
        calls=draw(st.integers(5, 100)),
        seed=draw(st.integers(0, 3)),
    )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(server=buckets_stating_nothing())
def test_a_token_bucket_that_shuts_is_never_counted_in_as_a_window(server: Server) -> None:
    """Any token bucket that states nothing: the scope never counts in a window, though a
    slow one is found shut and tried as a window reopening is (`_pace_reopened`); some
    bucket explains its answers until the end (`RateLearner._trust_reopened`). Every
    call is ok."""
    _, turn, windows = trio.run(
        learn_watching, server, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert all(r.status is Status.OK for r in turn.results)
    assert windows == []


@st.composite
def windows_stating_nothing(draw: st.DrawFn) -> Server:
    """A fixed window or a sliding log of 5 to 25 requests per 1 to 10 s (windows are whole
    seconds) whose 429s carry nothing, and four to five windows' worth of calls; a fixed
    window's first began at any twentieth of one before our first request."""
    burst = draw(st.integers(5, 25))
    model = draw(st.sampled_from(["sliding", "fixed"]))
    return Server(
        model=model,
        rate=burst / draw(st.integers(1, 10)),
        burst=burst,
        latency=draw(st.floats(0.01, 0.3)),
        jitter=0.0,
        max_in_flight=None,
        headers="none",
        retry_after="absent",
        calls=4 * burst + draw(st.integers(0, burst)),
        seed=draw(st.integers(0, 3)),
        window_phase=draw(st.integers(0, 19)) / 20 if model == "fixed" else 0.0,
    )


@settings(max_examples=30, deadline=None, derandomize=True)
@given(server=windows_stating_nothing())
# Found by a wider draw: 9 per 2 s met at 0.7 of a window, guessed 18 per 4 s (the run
# spanned an edge), was counted in with half of that admitted; eight requests went at
# once and were refused, twelve 429s in all (`RateLearner._trust_reopened`).
@example(server=Server("fixed", 4.5, 9, 0.25, 0.0, None, "none", "absent", 36, window_phase=0.7))
def test_a_window_that_states_nothing_is_learned_within_three_times_the_minimum(
    server: Server,
) -> None:
    """Any window that states nothing (`windows_stating_nothing`): every call ok, within
    three times the fastest and a second, and at most ten 429s. It is tried at times twice
    as far apart while shut, so the window it finds is up to twice the server's: 1.10 to
    2.7 times the fastest in 30 drawn so (median 1.53), against 1.26 to 31 (median 12) at
    the code before, where 8 of the 30 turns answered calls rate_limited. Three 429s find
    it shut, one more for each probe it refuses (four for 10 s), and a fixed window met
    out of phase shuts a second time; on 40 such windows drawn at any phase, at most
    eight 429s, where the code before drew up to 50 and answered 11 of 85 calls
    rate_limited."""
    throttling, turn, took = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert took <= 3.0 * fastest(server) + 1.0
    assert len(refusals(throttling)) <= 10


@pytest.mark.parametrize(
    ("headers", "refused_at", "makespan"),
    [
        ("draft", [0.1], 7.2),
        # An exact Reset (OpenAI's duration, in ms) is the rest of the window: 1.7 s;
        # each says where the window ends, and the log frees what it counted then, a
        # moment after it (`SlidingLog.sync`, `past_reset`): 7.2 s before that.
        ("openai", [0.1], 6.945),
    ],
)
def test_a_fixed_window_keyed_by_the_clock_is_counted_in_at_its_length(
    headers: str, refused_at: list[float], makespan: float
) -> None:
    """20 per 2 s, stating its counts and when the window ends (Kong's calendar windows,
    Envoy's), whose windows began 1.2 s before our first request: the window trial's
    answer gives the length, its ``Reset`` and the time since it reopened
    (`WindowWatch.judge`). Guessed from our first request to the reopening
    instead, it was 1.1 s: the next burst of 20 was refused whole, 21 429s, and 6 calls
    answered rate_limited (7.2 s now, 1.05 times the fastest)."""
    server = Server("fixed", 10, 20, 0.05, 0.0, None, headers, "seconds", 100, window_phase=0.6)
    assert_learned(server, refused_at=refused_at, makespan=makespan)


def _exact(server: Server, late: float = 0.0) -> Server:
    """``server`` stating its reset as an epoch to the millisecond (slowapi's float epoch,
    Discord's), ``late`` s after the truth (slowapi's: a second)."""
    return attrs.evolve(server, reset_as_epoch=True, reset_precise=True, reset_late=late)


@pytest.mark.parametrize(
    ("server", "late", "refused_at", "makespan"),
    [
        # 2 per 2 s, a cap of one: the code before sent each window's first request at
        # the very end the last one named, which the server still counted in it; each
        # 429 lengthened the learned window, 1.9 s to 490 s, and four calls gave up.
        (
            Server("fixed", 1.0, 2, 0.084, 0.0, 1, "draft", "seconds", 50, seed=1),
            0.0,
            [1.041999945, 5.920999796, 9.920999809],
            50.08900008964546,
        ),
        # 5 per 3 s stating nothing else: the trial at the end refused, never a window
        # (eight 429s, and one call gave up).
        (
            Server("fixed", 5 / 3, 5, 0.286, 0.0, None, "draft", "absent", 45, seed=2),
            0.0,
            [0.828799997, 8.999999765, 11.999999876],
            27.290999996662144,
        ),
        # 5 per 2 s: the trial's reset read from when it was sent, not answered, made the
        # window 1.932 s long, and each third window's five were refused (1.91x, 4 429s).
        (
            Server("fixed", 2.5, 5, 0.0675, 0.0, None, "draft", "absent", 60, seed=1),
            0.0,
            [0.453999977, 7.995000134, 11.995000029],
            24.072500002384178,
        ),
        # A sliding log of 10 per 2 s: 1.43x with four 429s before.
        (
            Server("sliding", 5.0, 10, 0.05, 0.0, None, "x", "seconds", 60),
            0.0,
            [0.245000005],
            10.614999938011177,
        ),
        # slowapi's late reset, 10 a second: 10 per 1.95 s before (1.78x).
        (
            Server("fixed", 10.0, 10, 0.05, 0.0, None, "x", "seconds", 60),
            1.0,
            [0.245000005],
            5.345000004768371,
        ),
        # Late, a sliding log of 19 per 2 s, 200-400 ms answers, its waits as HTTP-dates.
        (
            Server("sliding", 9.5, 19, 0.2635, 0.13, None, "draft", "http-date", 55),
            1.0,
            [0.639714695],
            5.650998474379609,
        ),
    ],
)
def test_a_window_stating_its_reset_to_the_millisecond_is_learned(
    server: Server, late: float, refused_at: list[float], makespan: float
) -> None:
    """A window whose reset is exact names the instant it ends, which the server may still
    count in it: the trial, and each place the log frees by a reset, go a moment after
    (`fanout._window.past_reset`), and the trial's reset is read from when it was
    answered, where it arrived by (`WindowWatch.judge`). A server that reports
    its ends ``late`` (slowapi: a second, while its Retry-After is the wait rounded up)
    lets the trial in before the end it reported, and the window is no longer than its
    reported ends allow (`fanout._window_watch._late_length`)."""
    assert_learned(_exact(server, late), refused_at=refused_at, makespan=makespan)


# Windows the code before gave calls up on (in a wider scan; none of the 30 drawn below).
@example(
    server=Server("fixed", 1.0, 2, 0.084, 0.0, 1, "draft", "seconds", 50, seed=1),
    window=2,
    late=0.0,
)
@example(
    server=Server("fixed", 1.0, 5, 0.286, 0.0, None, "draft", "absent", 45, seed=2),
    window=3,
    late=0.0,
)
@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    server=st.builds(
        Server,
        model=st.sampled_from(["fixed", "sliding"]),
        rate=st.just(1.0),  # replaced below: the limit per a whole number of seconds
        burst=st.integers(2, 25),
        latency=st.floats(0.01, 0.3),
        jitter=st.just(0.0),
        max_in_flight=st.none() | st.integers(1, 16),
        headers=st.sampled_from(["draft", "x"]),
        retry_after=st.sampled_from(["seconds", "ms", "http-date", "absent"]),
        calls=st.integers(1, 80),
        seed=st.integers(0, 3),
    ),
    window=st.integers(1, 3),
    late=st.sampled_from([0.0, 1.0]),
)
def test_a_window_stating_an_exact_reset_answers_every_call(
    server: Server, window: int, late: float
) -> None:
    """Any fixed window or sliding log of a whole number of seconds stating its reset to the
    millisecond, honest or a second late: every call ok. In a scan of 300 such honest
    windows, the code before answered calls rate_limited on 5, and drew more than three
    429s from 81; now none, and 12 (a second late: none either way, and 4, now 3;
    `README.md`, "Learning the limits")."""
    server = _exact(attrs.evolve(server, rate=server.burst / window), late)
    _, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)


def test_the_429s_learning_spends_are_not_one_call_s_attempts() -> None:
    """A fixed window of 15 per 6.4 s stating nothing but its wait, in ms. Learning spends
    its three 429s finding it, a window apart, and each came to the call first in line,
    the same one each time: its three attempts spent, it was answered rate_limited while
    the other 55 were ok. Those 429s are the scope's, as its probe's are
    (`ScopeFront.probed`): every call ok, the same three 429s."""
    server = Server(
        "fixed", 2.3550801672260544, 15, 0.20987831710156418, 0.0, None, "none", "ms", 56
    )
    assert_learned(
        server, refused_at=[0.686302097, 7.101843306, 15.91432111], makespan=21.4996142606359
    )


def test_a_bucket_whose_exact_reset_is_its_next_token_is_no_sliding_log() -> None:
    """20 at 4.16/s, its ``Reset`` an epoch to the millisecond naming its next token. The
    trial 0.25 s after our first 20 was let in (one token back) and showed the bucket
    empty: a log of 20 per second would have refused it, but a trial may count one over
    the log's limit (the one at its edge), and it passed for a log. Each reopening then
    sent the whole burst, four admitted and the rest refused: 36 429s, calls answered
    rate_limited. Counted over only where the oldest may have left the log, it stays a
    bucket (seven 429s: four more at 10/s in its next refills, all within the second
    the first one held the rate; now a 429 to a request sent after that 429's wait
    ended is news, and the rate comes down: three)."""
    server = Server("bucket", 4.159254437410363, 20, 0.0955, 0.0, None, "x", "ms", 73, reset="next")
    assert_learned(_exact(server), refused_at=[0.1455, 0.3455, 0.9455], makespan=14.27840136105043)


def test_a_bucket_passed_for_a_log_does_not_send_what_it_held_for_the_server_at_once() -> None:
    """9 at 3.99/s, its ``Reset`` an epoch to the millisecond naming its next token, answers
    in 115-173 ms. Paced just under its rate, it passes the window trial as a log of 9
    per 2.13 s, which holds the 8 the server had counted as phantoms a window from then.
    Each answer's reset (a token back within 130 ms) freed the log's newest request
    instead of one of those, and a window on the 8 left together: sent at once, all
    refused (ten 429s). Each reset now frees one of them (`SlidingLog._release_by_reset`):
    five 429s, 1.0005 times the fastest; four since two answers' resets a millisecond
    apart free one token, not two. Still over three (`README.md`, what is still
    missed): a log of 9 per 2.13 s allows 4.2/s, and two of its 429s lengthen it."""
    server = Server(
        "bucket", 3.9871734063711646, 9, 0.1150064491935081, 0.05750322459675405, 13, "x", "ms",
        44, reset="next", seed=3,
    )  # fmt: skip
    assert_learned(
        _exact(server),
        refused_at=[0.239801294, 2.239801294, 5.210810462, 7.395391086],
        makespan=8.915316462026654,
    )


# The bucket above, which the code before gave calls up on.
@example(
    server=Server("bucket", 4.159254437410363, 20, 0.0955, 0.0, None, "x", "ms", 73, reset="next")
)
@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    server=st.builds(
        Server,
        model=st.just("bucket"),
        rate=st.floats(2.0, 50.0),
        burst=st.integers(1, 25),
        latency=st.floats(0.01, 0.3),
        jitter=st.sampled_from([0.0, 0.05]),
        max_in_flight=st.none() | st.integers(1, 16),
        headers=st.sampled_from(["draft", "x"]),
        retry_after=st.sampled_from(["seconds", "ms", "http-date", "absent"]),
        calls=st.integers(1, 80),
        reset=st.sampled_from(["next", "full"]),
        seed=st.integers(0, 3),
    )
)
def test_a_bucket_stating_an_exact_reset_answers_every_call(server: Server) -> None:
    """Any token bucket stating its reset to the millisecond, until its next token or until
    full: every call ok. In a scan of 600 windows and buckets so, the code before
    answered calls rate_limited on one (above), and drew more than three 429s from 7;
    now none, and 3."""
    _, turn, _ = run(_exact(server))
    assert all(r.status is Status.OK for r in turn.results)


@st.composite
def fixed_windows_stating_counts(draw: st.DrawFn) -> Server:
    """A fixed window of 2 to 25 per 1 to 10 s that states its counts and its end, in any
    header style and with any wait, met at any twentieth of a window, and two to five
    windows' worth of calls."""
    burst, window = draw(st.integers(2, 25)), draw(st.integers(1, 10))
    return Server(
        model="fixed",
        rate=burst / window,
        burst=burst,
        latency=draw(st.floats(0.01, 0.3)),
        jitter=0.0,
        max_in_flight=None,
        headers=draw(st.sampled_from(["draft", "ietf", "x", "openai"])),
        retry_after=draw(st.sampled_from(["seconds", "ms", "http-date"])),
        calls=draw(st.integers(2 * burst, 5 * burst)),
        seed=draw(st.integers(0, 3)),
        window_phase=draw(st.integers(0, 19)) / 20,
    )


@settings(max_examples=25, deadline=None, derandomize=True)
@given(server=fixed_windows_stating_counts())
def test_a_fixed_window_stating_its_counts_is_learned_at_any_phase(server: Server) -> None:
    """Any such window (`fixed_windows_stating_counts`): every call ok, at most three 429s,
    within three times the fastest and a second (a first answer that finds the window
    spent holds the turn until its rounded-up ``Reset``: 4 calls against 2 a second took
    1.375 s for 0.45). On 40 drawn alike, the code before drew more than three 429s on
    16 (up to 36) and answered calls rate_limited on 12; now at most three, every call
    ok, 1.00 to 2.33 times the fastest."""
    throttling, turn, took = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refused(throttling) <= _REFUSED
    assert took <= 3.0 * fastest(server) + 1.0


def test_a_leaky_bucket_of_40_at_2_a_second_stating_its_level_is_learned() -> None:
    """Shopify's REST limits: a bucket of 40 leaking 2/s, its level in every answer, a
    Retry-After in seconds; 80 calls of 100 ms. Before: 20 refusals, 5 calls given up;
    now three, and 1.06 times the fastest."""
    server = Server(
        model="bucket", rate=2.0, burst=40, latency=0.1, jitter=0.0, max_in_flight=None,
        headers="shopify", retry_after="seconds", calls=80,
    )  # fmt: skip
    assert_learned(server, refused_at=[0.172, 1.881707719, 8.467878065], makespan=21.2951309863917)
    assert fastest(server) == pytest.approx(20.1)  # 1.06 times


@pytest.mark.parametrize("epoch", [False, True])
async def test_a_draft_reset_sent_as_an_epoch_is_read_as_one(
    autojump_clock: Any, epoch: bool
) -> None:
    """GitLab sends the older draft's ``RateLimit-Reset`` as an epoch: read as a delta, it
    was a wait of decades, dropped, and the rate had no first guess (20/s, burst 10: two
    429s and 1.44 times the minimum). Read as an epoch, as with the delta: none."""
    config = ServerConfig(
        rate=20, burst=10, latency=0.05, headers="draft", retry_after="seconds",
        reset_as_epoch=epoch,
    )  # fmt: skip
    began = trio.current_time()
    throttling, turn = await learn(config, 60, Scope("api"))
    took = trio.current_time() - began
    assert all(r.status is Status.OK for r in turn.results)
    assert refusals(throttling) == []
    assert took <= 1.05 * ((60 - 10) / 20 + 0.05)


def proven_rates(server: Server, clock: trio.testing.MockClock | None = None) -> list[float]:
    """Every rate the scope took as proven by how ``Remaining`` refilled, in ``server``'s
    turn."""
    proven: list[float] = []
    take_in = fanout._learning.RateLearner.from_headers

    def recording(learner: fanout._learning.RateLearner, *args: Any, **kwargs: Any) -> bool:
        changed = take_in(learner, *args, **kwargs)
        if learner.measured is not None:
            proven.append(learner.measured)
        return changed

    with unittest.mock.patch.object(fanout._learning.RateLearner, "from_headers", recording):
        run(server, clock)
    return proven


# Told nothing, not even the cap of one: the probe's second request drew a 503, its own
# token was left out of the count its answer stated twice, and the first probe's
# admission counted as come after it: 3.9/s against 2/s.
@example(
    server=Server("bucket", 2.0, 2, 0.25, 0.0, 1, "draft", "seconds", 3, cap_told=False)
)  # fmt: skip
@settings(max_examples=60, deadline=None, derandomize=True)
@given(server=servers())
def test_a_refill_bound_never_exceeds_the_server_s_rate(server: Server) -> None:
    """Any token bucket that states its counts: every rate the scope takes as proven by
    how ``Remaining`` refilled is at most the server's. A bound is a floor the rate
    never goes below and a 429 lands under, so one above the server's rate is a
    promise to send faster than allowed. A 429's own ``Remaining`` was counted as an
    admission (the request took no token): 6.5/s proven against 5/s, burst 2, and up
    to 1.42 times the server's rate across 150 drawn servers."""
    assume(server.model == "bucket" and server.headers != "none" and server.calls > 2)
    assert max(proven_rates(server), default=0.0) <= server.rate


def test_a_refill_bound_counts_a_request_that_overtook_the_earliest_answered() -> None:
    """Told nothing, on a clock later at every reading, as real time is (`tests.clocks`):
    2/s with a burst of 8 and a cap of 4. A request sent 0.1 ms after the earliest
    answered one reached the server first; counted as come after the count it was in,
    it proved 2.18/s against 2/s. An answer with others sent just after it is no
    anchor for the refill (`RateLearner._measure`)."""
    server = Server("bucket", 2.0, 8, 0.125, 0.0, 4, "draft", "seconds", 11, cap_told=False)
    assert max(proven_rates(server, ticking_clock(1e-6))) <= server.rate


@contextlib.contextmanager
def refusals_from_afar() -> Iterator[None]:
    """A server whose 503 takes longer to come back than `fanout._slots.TRIAL_SPACING`
    (a distant one): past the probe, a scope told nothing sends the wave its burst
    allows at once, every request of it gone before the first refusal could be read.
    The test server refuses at once, so the spacing is what is set to none."""
    with unittest.mock.patch.object(fanout._slots, "TRIAL_SPACING", 0.0):
        yield


_ACROSS_A_429 = Server("bucket", 6.0, 19, 0.1875, 0.0, 4, "draft", "seconds", 28, cap_told=False)


def test_a_refill_bound_measured_across_a_429_as_time_moves_on() -> None:
    """6/s with a burst of 19 and a cap of 4 nobody told, 187.5 ms answers, its 503s
    from afar (the wave past the probe crosses the cap at once): a call waiting for a
    place under the learned cap when the 429 that ends the first burst came was
    overruled, and booked again, but the start its first booking noted stayed
    counted. On a clock that ticks, the next anchor's count then held one admission
    too many, and the refill bound proved 6.19/s against 6/s (a strict expected
    failure until found: `ScopeFront.request_leaving`). A generated property over such
    servers found it."""
    with refusals_from_afar():
        assert max(proven_rates(_ACROSS_A_429, ticking_clock(1e-6))) <= _ACROSS_A_429.rate


def test_a_refill_bound_past_a_cap_crossed_one_request_at_a_time_as_time_moves_on() -> None:
    """The server above, its 503s read as they come: past the probe, requests go one at a
    time until the cap refuses one (`fanout._slots`); the one 429 is where the burst runs
    out under the first guess (a burst a second, against 6/s), and every rate proven
    is within the server's."""
    throttling, turn, _ = run(_ACROSS_A_429, ticking_clock(1e-6))
    assert all(r.status is Status.OK for r in turn.results)
    assert [r.status for r in throttling.records if r.status != 200] == [503, 429]
    assert max(proven_rates(_ACROSS_A_429, ticking_clock(1e-6))) <= _ACROSS_A_429.rate


def test_calls_held_past_the_proven_are_left_out_of_a_proven_refill_as_time_moves_on() -> None:
    """40.4/s with a burst of 22 and a cap of 12 nobody told, X- headers, waits in ms,
    jittered 17 ms answers, on a clock that ticks: past the probe, calls that took
    their tokens wait to leave one at a time (`fanout._slots`). The 503 that crossed
    the cap stated 8 left, and the refill a proven rate makes up raised the bucket to
    6 as if the calls still waiting had not taken theirs: the ninth request after it
    drew a 429, read as a window's, and the turn took 2.76 times the fastest. They
    will reach the server, so that refill leaves them out: one 503, no 429. (Found with
    the answers' jitter drawn from seed 2; since each request goes through a pool with
    a connection idle, `fanout._pools`, that draw stays under the cap, and seed 4's
    crosses it.)"""
    server = Server(
        "bucket", 40.370772599080986, 22, 0.017326445438924646, 0.008663222719462323, 12,
        "x", "ms", 52, seed=4, cap_told=False,
    )  # fmt: skip
    throttling, turn, took = run(server, ticking_clock(5e-6))
    assert all(r.status is Status.OK for r in turn.results)
    assert [r.status for r in throttling.records if r.status != 200] == [503]
    assert took <= 1.05 * fastest(server)


def test_a_cap_nobody_told_leaves_the_learned_rate_alone_as_time_moves_on() -> None:
    """The issue's 200-call row (50/s, burst 20, cap 16, 100 ms), told nothing at all, on
    a clock later at every reading: the cap is read from the wave of 503s that crosses
    it, and the rate is learned without a 429. (Before, 1.23x with a 429 whose
    whole-second wait held the turn: the 503s were counted as admissions.)"""
    server = Server("bucket", 50, 20, 0.1, 0.0, 16, "draft", "seconds", 200, cap_told=False)
    throttling, turn, took = run(server, ticking_clock(5e-6))
    assert all(r.status is Status.OK for r in turn.results)
    assert throttling.count(status=429) == 0
    assert throttling.count(status=503) <= 2
    assert took <= 1.05 * fastest(server)


def test_a_stricter_rate_taught_during_a_429_s_wait_paces_its_end_as_time_moves_on() -> None:
    """A sliding log of 13 per 2 s stating its policy (6.5/s), 200 ms answers with jitter:
    its first 429 teaches 5.2/s with a burst of one, and blocks the scope until the log
    frees a place. On a clock later at every reading, the calls woken by another
    answer booked again at 6.5/s with a burst of 13 before that lesson was applied,
    for the block's end, and eight went at once when it ended: eight more 429s and a
    call given up. A stricter rate books again what is booked for a block's end."""
    latency = 0.20768613925381932  # as drawn, with half of it in jitter
    server = Server("sliding", 6.5, 13, latency, latency / 2, None, "ietf", "ms", 64, seed=1)
    throttling, turn, _ = run(server, ticking_clock(1e-6))
    assert all(r.status is Status.OK for r in turn.results)
    assert len(refusals(throttling)) == 1


@pytest.mark.xfail(
    strict=True,
    reason="learning is within 1.20x of the minimum on the benchmark rows, not on every "
    "server: about half the drawn servers take longer (small bursts, windows, few calls)",
)
@settings(max_examples=40, deadline=None, phases=[Phase.generate])
@given(server=servers())
def test_learning_finishes_within_a_fifth_of_the_minimum(server: Server) -> None:
    """Any server: within 1.20 times the fastest a client told nothing could finish.

    The minimum is ``fastest(server, blind=True)``: the optimal schedule,
    except that no more than four requests start before the first answer.
    That much is provable: a learner that sends a fifth before any answer
    draws four 429s from a server whose burst is one and whose rate is slow
    enough, which the three allowed here cannot absorb. Nothing else is
    allowed for: with few calls, that one round trip is most of the minimum,
    and the bound says so rather than being widened to pass.
    """
    _, _, makespan = run(server)
    assert makespan <= _WITHIN * fastest(server, blind=True) + 1e-9


def test_the_fastest_schedule_is_the_benchmarks_minimum_where_that_applies() -> None:
    """``fastest`` agrees with ``benchmarks.scenarios``' formulas."""
    for calls, rate, burst, latency, cap in [(60, 20, 10, 0.05, None), (40, 10, 10, 0.4, 4)]:
        server = Server("bucket", rate, burst, latency, 0.0, cap, "none", "absent", calls)
        best = min_makespan(calls, rate=rate, burst=burst, latency=latency, concurrency=cap)
        assert math.isclose(fastest(server), best)
    jittered = Server("bucket", 20, 10, 0.05, 0.1, None, "none", "absent", 60, seed=3)
    best = jittered_makespan(60, rate=20, burst=10, latency=0.05, jitter=0.1, seed=3)
    assert math.isclose(fastest(jittered), best)
    # And for the windows of the matrix, a fixed window keyed by the clock among them.
    for row in FULL:
        if row.model in ("fixed", "sliding") and not row.max_in_flight:
            server = Server(
                row.model, row.rate, row.burst, row.latency, 0.0, None, "none", "absent",
                row.calls, window_phase=row.window_phase,
            )  # fmt: skip
            assert math.isclose(fastest(server), row.min_makespan), row.name


def test_a_bucket_whose_reset_is_its_next_token_is_tried_before_it_is_taken_for_a_window() -> None:
    """5/s, burst 10, ``Reset`` = next token (1 s, rounded up): its 429 comes inside the
    window its answers reported spent, as a window's would. Taken for a window at once,
    its ten went at every reopening and five were refused each time (32 refused, 15
    calls failed); tried with one request first, it shows a bucket, and stays one."""
    server = Server("bucket", 5, 10, 0.05, 0.0, None, "draft", "seconds", 60, reset="next")
    throttling, turn, makespan = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refusals(throttling) == [0.15]
    assert makespan == pytest.approx(10.25)  # the minimum is 10.05


@pytest.mark.parametrize(
    ("rate", "burst", "calls"),
    [(20, 30, 100), (5, 6, 30)],
    ids=["20-per-s-burst-30", "5-per-s-burst-6"],
)
def test_a_bucket_whose_reset_is_until_full_is_tried_when_the_server_says_retry(
    rate: float, burst: int, calls: int
) -> None:
    """A burst worth more than a second of rate: ``Reset`` (until full, rounded up) says
    2 s when the bucket is spent, ``Retry-After`` 1 s. The 429 came inside the window the
    answers reported spent, and the scope waited those 2 s, tried the server as it was
    full again, and took it for a window of a burst per 2 s: 15/s against 20/s (1.76x),
    3/s against 5/s (1.75x). Tried when the server said to retry, the bucket has refilled
    only a second's worth, and stays a bucket."""
    server = Server("bucket", rate, burst, 0.05, 0.0, None, "draft", "seconds", calls)
    throttling, turn, makespan = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refused(throttling) == 1
    assert makespan <= 1.1 * fastest(server)


def test_a_window_tried_one_request_at_a_time_counts_each_of_them() -> None:
    """A sliding log of 16 a second at 250 ms: four requests go, one at a time, before the
    trial's answer shows the window; the log then holds all four, not only the trial."""
    server = Server("sliding", 16, 16, 0.25, 0.0, None, "ietf", "absent", 38, seed=3)
    throttling, turn, makespan = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refused(throttling) == 1
    assert makespan <= _WITHIN * fastest(server, blind=True)


def test_a_deep_bucket_whose_trial_shows_its_refill_is_no_sliding_log() -> None:
    """5/s with a burst of 30: spent, its ``Reset`` (until full) says 6 s, and a 429 inside
    that is tried at the server's wait. The trial's answer shows 4 left after 31 sent
    within 6 s: a log of 30 per 6 s would have refused the 31st, and shows room for
    the burst less what went, no more; this bucket showed its refill. Read as room
    enough for a log, it was taken for one, and the last 5 calls waited 6 s (7.09 s; the
    minimum is 2.02 s)."""
    server = Server("bucket", 5, 30, 0.02, 0.0, None, "draft", "seconds", 40)
    assert_learned(server, refused_at=[0.07, 1.156666667], makespan=2.1966666666666694)


def test_a_stated_bucket_of_one_is_fitted_as_one() -> None:
    """2/s, ``Limit: 1``: after the second 429, any burst explained the answers down to
    the slowest rate tried, and the rate settled near it (31.0 s for 40 calls; the
    minimum is 19.6 s). Fitted as the bucket of one the server states, the admissions
    bound it from below too: 24.6 s, with the same two 429s."""
    server = Server("bucket", 2, 1, 0.1, 0.0, None, "draft", "http-date", 40, seed=1)
    assert_learned(server, refused_at=[0.0, 1.4], makespan=24.605775220166592)


def test_a_stated_bucket_of_one_is_learned_from_its_429s() -> None:
    """A burst of one says nothing in ``Remaining`` (0 after every request): learned as a
    server that states nothing, 20/s is found in two 429s, where the stated path crept
    from the guessed 1/s by 0.05 a success (39.4 s; the minimum is 2.2 s). The probe's
    second request is the first 429 (5.4 s with a probe of one, whose first 429 came
    at 0.6 s). At the second, the request still out counts as admitted where a bucket
    of one needs it so: read as never sent, no bucket of one explained the answers, any
    burst was fitted, and the rate settled well below what the admissions proved (5.62
    s; 5.24 s now)."""
    server = Server("bucket", 20, 1, 0.15, 0.0, None, "draft", "seconds", 42)
    assert_learned(server, refused_at=[0.0, 2.672407458], makespan=5.242403762954561)


def test_a_wide_probe_against_a_bucket_of_one_spends_one_429_of_learning_s_three() -> None:
    """Four probes, a burst of one: three refused at once. They are not retried at once
    (the bucket the learned rate starts from is the empty one they showed), and they are
    one congestion event: counted as three, they spent all learning may, the rate could
    grow only as far as admissions proved, and a burst of one proves nothing beyond the
    pace it was sent at: 2/s against 20/s, 29.6 s (the minimum is 3.0 s). Counted once,
    one more 429 finds the rate."""
    server = Server("bucket", 20, 1, 0.05, 0.0, 4, "none", "absent", 60)
    assert_learned(server, refused_at=[0.0, 0.0, 0.0, 1.656387085], makespan=4.810265276870035)


def test_requests_sent_together_are_left_out_of_a_refill_bound() -> None:
    """2/s, burst 3, ``Reset`` = next token: two requests sent at once get Remaining 1
    and 0, in either order. Counting the other as already taken when 1 came back
    "proved" 2.7/s, and the scope drew a 429 a cycle (seven, and a call failed)."""
    server = Server("bucket", 2, 3, 0.0625, 0.0, None, "draft", "seconds", 18, reset="next")
    throttling, turn, makespan = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refused(throttling) == 1
    assert makespan <= _WITHIN * fastest(server, blind=True)


def test_a_bucket_taken_for_a_window_lengthens_it_at_its_second_429() -> None:
    """3.2/s, burst 4, cap 5, X- headers whose Reset is "until full", bare 429s. The
    one-second wait after the first 429 refilled the bucket whole, so the window trial
    read it as a window of 4 per second, and the log sent 4 a second against 3.2/s:
    every other window's last request was refused, twelve 429s. From the second 429 a
    learned window grows by limit / (limit - 1) (4 per 1.33 s, under the bucket's 3.2/s):
    three refusals in all, within a fifth of the fastest."""
    server = Server(
        "bucket", 3.161783616955944, 4, 0.16030297070471308, 0.08015148535235654, 5, "x",
        "absent", 66, seed=2,
    )  # fmt: skip
    throttling, turn, makespan = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refused(throttling) == 3
    assert makespan <= _WITHIN * fastest(server, blind=True)


def test_a_measured_rate_grows_while_the_server_s_bucket_stays_full() -> None:
    """30/s, burst 2, X- headers, Retry-After as an HTTP-date. After the first 429 the
    refill bound measured 4.5/s and the rate never moved again: every answer said
    Remaining 1 (the bucket full when asked), which only shows the scope kept up, so no
    bound rose above its own pace: 12.9 s for 2.0. Full for half a second, the rate now
    grows as after a first 429 until the bucket is drawn down: 5.1 s, two 429s (6.9 s
    before the slow start stopped adding a whole rate per latency to a rate below it,
    6.5 s before it read the bucket after the requests sent since, too). Measured from
    answers that found the bucket full (an exact count), the slow start reaches its
    first 429 a little sooner: 5.2 s, still two 429s. A probe two wide empties the
    bucket of two, and the slow start waits on the answers after: 6.1 s. A 429 lands
    under the refill measured before it (25/s, not half of the 20 sent that second):
    4.9 s, still two 429s. Grown while found full on arrival, whatever is in flight (the
    test below), it reaches its first 429 sooner, at 1.26 s for 1.40, and the fit after
    it lands at 12.7/s for 25: 5.3 s, still two 429s. Once an answer found the bucket
    drawn down half a second after the first, the slow start stopped doubling a pace
    near the rate, and grows it only while the bucket stays full: 2.9 s, no 429. The
    answers it measures from kept apart, over more than the last eight, the refill
    proven keeps nearer the pace: 2.90 s for 2.93."""
    server = Server("bucket", 30, 2, 0.05, 0.0, None, "x", "http-date", 60)
    assert_learned(server, refused_at=[], makespan=2.897165893722031)


def test_a_bucket_found_full_on_arrival_grows_the_rate_with_more_in_flight_than_it_holds() -> None:
    """40/s, burst 3, 250 ms and up to 125 ms of jitter. Every answer said Remaining 2 (the
    bucket full on arrival), but with requests 0.11 s apart and the latencies 0.12 s
    apart, one sent before each may have been counted after it: no answer showed room
    for a faster rate *now*, and the rate stayed at 9/s from 1.5 s to 7.6 s (7.02 s for
    a least of 2.15). Found full on arrival for half a second, it grows as after a first
    429 (5.06 s, no 429); up to twice the pace proven, as the answers that show the
    bucket drawn down come a round trip late (the second server below). Once an answer
    found the bucket drawn down half a second after the first, the slow start no longer
    doubles the rate at an answer that found it full: 5.09 s. Two sent at the same
    instant are found full when either is (the server took them in some order), and
    the answers measured from reach further back: 4.32 s."""
    server = Server("bucket", 40, 3, 0.25, 0.125, None, "draft", "seconds", 76, seed=2)
    assert_learned(server, refused_at=[], makespan=4.318781577070976)


def test_a_small_fast_bucket_behind_long_jittery_answers_is_learned_past_its_probe() -> None:
    """50/s, burst 3, 250-350 ms. Of the probe's two, sent at once, one said Remaining 1:
    read as drawn down, it ended the slow start at 6/s, and every later answer found
    the bucket full, which proves only the pace kept (the last eight such answers,
    all that were kept, spanned too little to measure over): 4.77 s, 2.9 times the
    least. Found full where any order of the two would be, and measured over answers
    kept apart: 3.26 s, no 429."""
    server = Server("bucket", 50, 3, 0.25, 0.1, None, "draft", "seconds", 60)
    assert_learned(server, refused_at=[], makespan=3.2604369218164364)


def test_growth_on_a_bucket_found_full_stops_at_twice_the_pace_proven() -> None:
    """19.3/s, burst 3, 245 ms, jitter. Grown without a bound, the rate passed 30/s before
    an answer showed the bucket drawn down, twice (two 429s, 8.75 s, where staying at
    the slow start's 16/s took 7.00 s); up to twice the pace proven, one 429: 6.42 s.
    Once an answer found the bucket drawn down half a second after the first, the slow
    start no longer doubles at an answer that found it full, and grows only once every
    answer has for half a second: the 429 comes later, 7.20 s. A loss here; over 620
    drawn servers (mock clock) the change drew 10 fewer 429s (436 of 446), 12 servers
    took longer and 13 less, and the geometric mean went from 1.464 to 1.452. Taken
    back to the refill proven at the first answer that surely found the bucket drawn
    down, the growth stops short of the 429: 6.80 s, none."""
    server = Server("bucket", 19.33, 3, 0.2446, 0.1223, None, "draft", "http-date", 78, seed=1)
    assert_learned(server, refused_at=[], makespan=6.801756888980728)


def test_the_slow_start_at_most_doubles_the_rate_an_answer() -> None:
    """20/s, burst 3, 50 ms. The slow start added one request per latency (20/s) to the
    rate at each answer that found the bucket full, as TCP adds a segment per ack; but
    at 6.5/s against 50 ms less than one request is in flight, and one answer took the
    rate to 26.5/s: the bucket was drained before any answer could show it, and the
    429's second cost 1.60 times the minimum. Doubling at most with each answer, the
    rate meets the server's with no 429: 1.17 times; 1.00 from a probe two wide."""
    server = Server("bucket", 20, 3, 0.05, 0.0, None, "draft", "seconds", 60)
    assert_learned(server, refused_at=[], makespan=2.9071013708513775)


def test_a_429_to_a_probe_sent_blind_shows_no_window() -> None:
    """46/s, burst 3, 12 ms, a cap of 14 told: the probe goes four wide, before any
    answer, and the fourth is refused with the bucket's Remaining 0 and Reset 1. That
    refusal was read as a 429 inside a window the server had reported spent (by its own
    headers), and the window trial that followed passed, the 429's wait having refilled
    the bucket whole: counted as 3 a second, 25.2 s. Sent blind, it shows a burst
    smaller than the probe, nothing more: 4.7 s, that one 429; 2.6 s since the answers
    that found the bucket full measure its refill exactly (2.64 s with each span
    widened by twice the latencies' spread, not once; 2.635 s with three of them sent
    at once found full when any of them is; 2.36 s since a 429's counts, back before
    any 200's, no longer stand for a server that states them)."""
    server = Server(
        "bucket", 46.04692740860116, 3, 0.012431934977911837, 0.0062159674889559185, 14,
        "x", "ms", 77, reset="next", seed=3,
    )  # fmt: skip
    assert_learned(server, refused_at=[0.0], makespan=2.3587094741294687)


def test_the_429s_of_one_blind_probe_are_one_event_the_rate_grows_after() -> None:
    """23/s, burst 2, 150 ms, a cap of 9 told: two of the four probes are refused at
    once. They are one congestion event, as any 429s within the server's wait are; but
    the growth of a rate whose bucket stays full stopped at a second 429, counted one
    by one, and the scope kept a burst of 2 every 2 s (7.3 s, read as a window before
    the fix above). Counted as one event, the rate grows from the guess: 3.2 s (2.7 s
    since the answers that found the bucket full measure its refill exactly; 2.2 s since
    a bucket found full on arrival grows the rate with more in flight than it holds; 1.6 s
    since the 429s' counts, back first, no longer stand for a server that states them)."""
    server = Server("bucket", 23.16, 2, 0.15, 0.0, 9, "draft", "ms", 9, reset="next", seed=3)
    assert_learned(server, refused_at=[0.0, 0.0], makespan=1.5985462936419996)


def test_a_sliding_log_tried_as_its_oldest_request_leaves_is_kept() -> None:
    """4 per 2 s, one at a time: the trial reaches the log as its oldest request leaves,
    so Remaining is 0, and that is what a window with our last three in it has left.
    Read as "not full again", the log was taken for a bucket and drew a 429 a window."""
    server = Server("sliding", 2, 4, 0.125, 0.0625, 1, "draft", "seconds", 18)
    throttling, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refused(throttling) == 1


def test_a_retry_paced_at_the_slower_rate_is_a_new_congestion_event() -> None:
    """2/s with a burst of 7, no numbers: after the first 429 the retry is paced exactly
    one slower-rate interval later. Read as part of the first event (it was sent a
    float's width before that interval ended), its 429 slowed nothing, and the same
    call's third attempt was refused too: the call failed."""
    server = Server("bucket", 2, 7, 0.1875, 0.0, None, "none", "absent", 9)
    throttling, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refused(throttling) == 2


@pytest.mark.parametrize(
    ("cap", "retry_after", "calls"),
    [(12, "ms", 43), (10, "seconds", 27)],
    ids=["taken-for-a-window", "refilled-through-a-wait"],
)
def test_a_slow_bucket_whose_reset_is_its_next_token_draws_two_429s(
    cap: int, retry_after: str, calls: int
) -> None:
    """2/s, burst 21, ``Reset`` = next token (1 s): the first guess is a burst per Reset,
    21/s. With 12 in flight, the window then tried (21 per 4.7 s) reached back over the
    first burst, so what went in it (25) plus what the trial saw remaining passed the
    bucket for a log; the log sent 11 and 8 at once, and 13 were refused. Now a log that
    took more than its limit in one window is refuted. With 10 in flight, the guessed
    rate, halved, refilled the bucket all through the 1 s wait, which sent three at its
    end and four at the next: one and two refused. A guess is no evidence that the
    server refilled so much: the bucket holds one request at the wait's end."""
    server = Server(model="bucket", rate=2.0, burst=21, latency=0.050791635329969595,
                    jitter=0.0, max_in_flight=cap, headers="draft", retry_after=retry_after,
                    calls=calls, reset="next")  # fmt: skip
    throttling, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refusals(throttling) == pytest.approx([0.101583271, 1.292059461], abs=1e-6)


def test_a_429_at_the_fitted_rate_is_a_new_congestion_event() -> None:
    """4.5/s, burst 10, no numbers: the second 429's interim guess (0.73/s) set how long
    after it a 429 still counts as the same event (1.4 s). The fit then raised the rate
    to 5.3/s, too fast, and the 429 that drew at 1.56 s was merged into the old event:
    the rate stayed, and a fourth 429 followed. Judged by the fitted rate, the third is
    an event of its own, the fit settles below 4.5/s, and there is no fourth. (Since the
    slow start begins from the probe's four and each 429 is taken in as it arrives, the
    run no longer reaches that merge: two 429s, and the times pinned are today's. The
    rule stays; this server guards the count.)"""
    server = Server("bucket", 4.496841751841005, 10, 0.1681989180861059, 0.0, 16, "none",
                    "ms", 72, reset="next", seed=2)  # fmt: skip
    throttling, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refusals(throttling) == pytest.approx([0.3154, 0.5454], abs=1e-4)


def test_a_window_that_states_nothing_slows_the_growth_once_no_bucket_fits() -> None:
    """A fixed window of 9 per 1.36 s with jitter and no state headers: it refills all at
    once, and after a second 429 no token bucket explains its answers. Growing e-fold
    each half second from there drew a 429 a window, a fourth among them; growing
    slowly, the third is the last."""
    server = Server(model="fixed", rate=6.6226928240013, burst=9,
                    latency=0.29934743223778637, jitter=0.14967371611889319,
                    max_in_flight=None, headers="none", retry_after="seconds", calls=78,
                    seed=3)  # fmt: skip
    throttling, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refused(throttling) == 3


def test_a_429_is_taken_in_as_it_arrives_before_a_queued_call_goes() -> None:
    """25/s, burst 18, no numbers: the runner told the scope of a 429 only after the
    call's attempt had ended, and the end of an attempt lets queued calls go. One went
    on a bucket no refusal had emptied yet, 5 ms after the first 429, and drew a second
    of the same event: three in all (two of 489 seeded servers drew a third this way;
    before the probe's wave doubled, one drew a fourth). The HTTP layer now tells the
    scope as the 429 arrives: two."""
    server = Server("bucket", 25.199379443860956, 18, 0.07564302072211265, 0.0, 13, "none",
                    "absent", 41, reset="next", seed=3)  # fmt: skip
    throttling, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refusals(throttling) == pytest.approx([0.2198, 0.5934], abs=1e-4)


@pytest.mark.parametrize(
    "server",
    [
        Server("bucket", 3.767491698426621, 19, 0.5425173139654726, 0.0, 16, "none", "absent", 57,
               seed=2),
        Server("bucket", 2.819676849374968, 25, 0.28509567561802135, 0.0, None, "none", "absent",
               77, seed=2),
    ],
)  # fmt: skip
def test_the_third_429_is_the_last_when_a_round_trip_is_still_out(server: Server) -> None:
    """Bare 429s, answers half a second long: the third 429 came with a round trip of
    requests still out. Fitted as if they were never sent, no bucket explained it (or a
    loose one did), the rate stayed above the server's, and a fourth 429 followed; counted
    as admitted, the fit bounds it. (Found while letting a floored fit grow towards its
    fastest rate; calls that booked at the old pace while a 429 was taken in, before the
    slower rate was applied, had drawn the fourth too.)"""
    throttling, turn, _ = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refused(throttling) == 3


@pytest.mark.parametrize(
    ("server", "refused_at", "makespan"),
    [
        (
            Server("sliding", 20, 3, 0.01, 0.0, 4, "draft", "seconds", 120, seed=35),
            [0.0, 1.673866204, 3.384421759],
            19.01,
        ),
        (
            Server("fixed", 20, 3, 0.05, 0.0, None, "x", "http-date", 120, seed=46),
            [0.895277778, 3.113529945, 4.77862971],
            16.97,
        ),
    ],
    ids=["sliding-log", "fixed-window"],
)
def test_once_its_429s_are_spent_learning_sends_no_burst_a_window_refuses(
    server: Server, refused_at: list[float], makespan: float
) -> None:
    """3 per 150 ms, in a sliding log and in fixed windows, whose ``Reset`` (rounded up to
    a second) hid the window: learned as a bucket of 3 at the rate its refill showed, the
    scope sent 3 at once and the next as soon as a token was back, about 100 ms on, where
    the window took it only 150 ms on. Every cycle drew a 429: ten and eight in a turn. From
    the third 429 on, one at a time: three, and a turn a fifth longer (2.71x to 3.25x and
    2.54x to 2.88x the fastest; it was 15.9 s and 15.0 s)."""
    throttling, turn, took = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    assert refusals(throttling) == refused_at
    assert took == pytest.approx(makespan, abs=0.01)


def test_requests_over_new_connections_read_late_may_have_come_after_a_count() -> None:
    """20/s with a burst of 10, 50 ms answers, each connection's first request read 100 ms
    late. Six requests the slow start sent over new connections had not reached the server
    when one sent after them over a warm one was counted; how much later one may arrive
    than another was read from the warm answers alone (2 ms), so its count was taken as
    theirs too, the bucket was raised to it, and one request of those sent on it was
    refused (1.25x the fastest; in real time against the other server, two or four and a
    window made of the wait, 2.8x, in 3 runs of 5). Requests over new connections are
    awaited as late as the set-up the answers show (`Outgoing.cold_behind`)."""
    server = Server("bucket", 20, 10, 0.05, 0.002, None, "draft", "seconds", 60, connect_delay=0.1)
    throttling, turn, took = run(server)
    assert throttling.count(status=429) == 0
    assert all(r.status is Status.OK for r in turn.results)
    assert took <= 1.02 * (fastest(server) + server.connect_delay)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(server=servers())
def test_a_server_stating_its_counts_on_429s_alone_is_learned(server: Server) -> None:
    """Counts on its refusals only, nothing on what it admits: every call ok, at most three
    refusals learning spends, as from a server that states nothing."""
    assume(server.model != "concurrency" and server.headers != "none")
    throttling, turn, _ = run(attrs.evolve(server, state_on_refusals=True))
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= _REFUSED


def test_a_bucket_whose_429s_alone_state_its_counts_is_not_paced_at_its_first_guess() -> None:
    """20/s with a burst of 10, 50 ms, draft headers on 429s only: the first 429 said 10
    of 10 and a reset of a second, and taken for a server that states its counts, the
    rate it guessed (half the server's) stood: 4.2x the fastest with one 429. Learned as
    a server that states nothing, it grows on: under twice the fastest."""
    server = Server("bucket", 20, 10, 0.05, 0.0, None, "draft", "seconds", 60)
    throttling, turn, took = run(attrs.evolve(server, state_on_refusals=True))
    assert all(r.status is Status.OK for r in turn.results)
    assert spent(throttling) <= 2
    assert took < 2.0 * fastest(server)


# The rows of the outside tester's server whose counts came on its 429s alone, on a mock
# clock: a bucket of 50 at 50/s (300 calls, 50 ms and up to 20 ms more) and one of 10 at
# 20/s (60 calls, 50 ms), in each Retry-After format; the deep bucket's over three seeds.
_COUNTS_ON_REFUSALS = [
    *(Server("bucket", 50, 50, 0.05, 0.02, None, headers, retry_after, 300, seed=seed)
      for headers in ("ietf", "draft") for retry_after in ("seconds", "ms", "http-date", "absent")
      for seed in ((0, 1, 2) if retry_after == "seconds" else (0,))),
    *(Server("bucket", 20, 10, 0.05, 0.0, None, "x", retry_after, 60)
      for retry_after in ("seconds", "ms", "http-date", "absent")),
]  # fmt: skip


@pytest.mark.parametrize(
    "server", _COUNTS_ON_REFUSALS,
    ids=[f"{s.rate:g}-{s.burst}-{s.headers}-{s.retry_after}-{s.seed}" for s in _COUNTS_ON_REFUSALS],
)  # fmt: skip
def test_a_bucket_whose_429s_alone_state_its_counts_is_learned_within_a_fifth(
    server: Server,
) -> None:
    """A bucket stating its counts on its 429s alone: every call ok, at most three 429s (the
    server's own count), within 1.2 times the fastest (1.25 where a first 429's wait of a
    whole second leaves the bucket of 10 full for half of it: the fastest any client that
    waits it out can do is 1.21 times).

    Were: 1.43 times with the IETF policy (its 429 stated 50 per second, and the rate was
    cut to 40/s as if paced at the policy, then never grown: nothing else stated a count;
    its window, reported by that 429 itself, stayed on trial, one request at a time); 1.2
    to 1.3 times and two or three 429s with draft headers (the first guess, a burst's
    worth short of a second's refill, 16/s, grew while the server's bucket filled unspent
    through the wait); 1.8 times against 20/s with a burst of 10 (a guess of 2/s).
    """
    throttling, turn, took = run(attrs.evolve(server, state_on_refusals=True))
    assert all(r.status is Status.OK for r in turn.results)
    assert throttling.count(status=429) <= _REFUSED
    within = 1.25 if server.burst == 10 and server.retry_after == "seconds" else _WITHIN
    assert took <= within * fastest(server)
