"""Telling a window from a bucket by the waits of a server that states nothing else."""

from __future__ import annotations

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fanout._window_fit import Closure, WindowGuess, closure_before, explained_by_window

TOLERANCE = 0.005

# The answers of a sliding log of 20 per 4 s (the learning sweep's 5/s with a burst
# of 20, at 300 ms, with Retry-After in ms): a burst of 20, a 429 at 1.114 whose wait
# ends at 4.0 (the first two requests leave), two admitted then, a 429 at 4.106
# whose wait ends at 4.3 (the third leaves).
BURST = [0.0, 0.0, 0.3, 0.375, 0.45, 0.525, 0.6, 0.66, 0.712, 0.761, 0.804, 0.844]
BURST += [0.881, 0.917, 0.95, 0.981, 1.011, 1.038, 1.065, 1.09]
LOG = sorted([(t, False) for t in [*BURST, 4.0, 4.053]] + [(1.114, True), (4.106, True)])
GUESS = WindowGuess(limit=20, length=4.0, first=0.0)


def test_a_sliding_log_is_told_by_where_its_second_wait_ends() -> None:
    assert explained_by_window(LOG, GUESS, 4.106, (4.3, 4.3), tolerance=TOLERANCE) == "sliding"


def test_a_wait_that_ends_elsewhere_shows_no_window() -> None:
    """A bucket's second wait is until its next token: not where the log's third leaves."""
    assert explained_by_window(LOG, GUESS, 4.106, (4.15, 4.16), tolerance=TOLERANCE) is None
    assert explained_by_window(LOG, GUESS, 4.106, (4.5, 4.6), tolerance=TOLERANCE) is None


def test_more_admitted_in_a_window_than_its_limit_shows_no_window() -> None:
    crowded = sorted([*LOG, (4.02, False)])
    assert explained_by_window(crowded, GUESS, 4.106, (4.3, 4.3), tolerance=TOLERANCE) is None


def test_fixed_windows_are_told_by_the_window_s_end() -> None:
    """20 per 4 s from the first request: the second window admits 20 again from 4.0."""
    second = [4.0 + 0.05 * k for k in range(20)]
    answers = sorted([(t, False) for t in [*BURST, *second]] + [(1.114, True), (5.02, True)])
    assert explained_by_window(answers, GUESS, 5.02, (8.0, 8.0), tolerance=TOLERANCE) == "fixed"
    assert explained_by_window(answers, GUESS, 5.02, (6.0, 6.0), tolerance=TOLERANCE) is None


def test_a_refusal_at_a_window_s_edge_shows_no_window_full() -> None:
    """A bucket of 2/s and burst 8, refused as a guessed 8 per 0.75 s reopened: at the edge
    the refusal is no evidence of a full window, and no window is taken."""
    answers = sorted([(0.0, False)] * 4 + [(0.0625, False)] * 4 + [(0.0625, True), (0.75, False)])
    answers.append((0.75, True))
    guess = WindowGuess(limit=8, length=0.75, first=0.0)
    assert explained_by_window(answers, guess, 0.75, (0.75, 1.75), tolerance=TOLERANCE) is None


def test_a_guess_of_one_request_is_no_window() -> None:
    answers = [(0.0, False), (0.1, True), (1.0, False), (1.05, True)]
    guess = WindowGuess(limit=1, length=1.0, first=0.0)
    assert explained_by_window(answers, guess, 1.05, (2.0, 2.0), tolerance=TOLERANCE) is None


def _sliding_log(limit: int, length: float, sends: list[float]) -> list[tuple[float, bool]]:
    """What a sliding log of ``limit`` per ``length`` answers to requests arriving at ``sends``."""
    admitted: list[float] = []
    answers = []
    for t in sorted(sends):
        ok = sum(1 for a in admitted if a > t - length) < limit
        if ok:
            admitted.append(t)
        answers.append((t, not ok))
    return answers


def _reopens(answers: list[tuple[float, bool]], limit: int, length: float, at: float) -> float:
    inside = [t for t, refused in answers if not refused and at - length < t <= at]
    return inside[len(inside) - limit] + length


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(2, 30),
    length=st.floats(0.5, 10.0),
    burst_share=st.floats(0.0, 0.5),
    gaps=st.lists(st.floats(0.0, 2.0), min_size=2, max_size=80),
)
def test_a_sliding_log_s_own_answers_are_explained_by_it(
    limit: int, length: float, burst_share: float, gaps: list[float]
) -> None:
    """Any sliding log, any schedule that spends it at once and sends more after its wait:
    the guess its first 429 gives (what was admitted, to where that wait ends) explains
    every later 429 whose wait ends where the log frees its next place. (Requests are
    sent more than the tolerance apart: closer, they reach the server in either order.)"""
    step = 3 * TOLERANCE + burst_share * length / limit
    assume(step * limit < length)
    burst = [k * step for k in range(limit + 1)]  # one more than the log takes
    reopen = _reopens(_sliding_log(limit, length, burst), limit, length, burst[-1])
    sends, at = list(burst), reopen
    for gap in gaps:  # a gap of a few tolerances up to twice the log's pace
        sends.append(at)
        at += 3 * TOLERANCE + gap * length / limit
    answers = _sliding_log(limit, length, sends)
    guess = WindowGuess(limit=limit, length=reopen - burst[0], first=burst[0])
    checked = 0
    for sent, refused in answers:
        if refused and sent > reopen:
            frees = _reopens(answers, limit, length, sent)
            before = [a for a in answers if a[0] <= sent]
            assert (
                explained_by_window(before, guess, sent, (frees, frees), tolerance=TOLERANCE)
                == "sliding"
            )
            checked += 1
    assume(checked)


# A fixed window of 10 per second that states nothing at all (no headers, no
# Retry-After), as learning met it: ten admitted in the slow start, then refused at
# 0.268 and 0.379 (shut), and at 0.536; admitted again at 1.071.
SHUT = [(t, False) for t in [0.0, 0.0, 0.1, 0.125, 0.15, 0.175, 0.2, 0.22, 0.238, 0.254]]
SHUT += [(0.268, True), (0.379, True), (0.536, True), (1.071, False)]


def test_a_server_that_shut_after_a_run_is_a_closure() -> None:
    assert closure_before(SHUT, 0.379, tolerance=TOLERANCE) == Closure(
        admitted=10, first=0.0, closed_at=0.268, refused=2, last_refused=0.379
    )
    assert closure_before(SHUT, 0.536, tolerance=TOLERANCE) == Closure(10, 0.0, 0.268, 3, 0.536)


def test_a_closure_reopened_is_the_run_per_the_time_to_its_reopening() -> None:
    closure = closure_before(SHUT, 0.536, tolerance=TOLERANCE)
    assert closure is not None
    assert closure.reopened(1.071) == WindowGuess(limit=10, length=1.071, first=0.0)


def test_a_closure_counted_in_is_whole_seconds_where_they_fit() -> None:
    """Reopened at 1.071 s, last refused at 0.536: a window of one second. Refused at 1.05
    s and reopened at 1.9, it is no whole number of seconds (two is too long, one too
    short): it stays as the reopening showed it."""
    closure = closure_before(SHUT, 0.536, tolerance=TOLERANCE)
    assert closure is not None
    assert closure.whole(1.071) == WindowGuess(limit=10, length=1.0, first=0.0)
    late = closure_before([*SHUT[:13], (1.05, True)], 1.05, tolerance=TOLERANCE)
    assert late is not None
    assert late.whole(1.9) == WindowGuess(limit=10, length=1.9, first=0.0)
    assert closure.whole(0.9) == WindowGuess(limit=10, length=0.9, first=0.0)  # under a second


def test_an_admission_among_the_refusals_ends_the_closure() -> None:
    """A bucket that refilled a token between two 429s never shut: the run since is one."""
    answers = sorted([*SHUT[:11], (0.3, False), (0.379, True)])
    assert closure_before(answers, 0.379, tolerance=TOLERANCE) is None


def test_a_refusal_that_overtook_an_admission_of_the_run_is_part_of_the_run() -> None:
    """Sent a millisecond before the run's last admission, a refusal reached the server
    after it (on Redis, under load): the run is the ten admitted, not the last one."""
    answers = sorted([*SHUT[:9], (0.253, True), *SHUT[9:13]])
    assert closure_before(answers, 0.536, tolerance=TOLERANCE) == Closure(10, 0.0, 0.268, 3, 0.536)
    apart = sorted([*SHUT[:9], (0.248, True), *SHUT[9:13]])  # 6 ms: not reordered
    assert closure_before(apart, 0.536, tolerance=TOLERANCE) is None


def test_a_closure_needs_a_run_of_two_and_a_refusal() -> None:
    assert (
        closure_before([(0.0, False), (0.1, True), (0.2, True)], 0.2, tolerance=TOLERANCE) is None
    )
    assert closure_before(SHUT, 0.254, tolerance=TOLERANCE) is None  # nothing refused yet
    assert closure_before(SHUT, 1.071, tolerance=TOLERANCE) is None  # admitted again: open


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(2, 30),
    length=st.floats(0.5, 60.0) | st.integers(1, 60).map(float),
    spread=st.floats(0.0, 0.99),
    probes=st.lists(st.floats(0.01, 3.0), min_size=1, max_size=12),
)
def test_a_sliding_log_reopened_is_never_guessed_faster_than_it_allows(
    limit: int, length: float, spread: float, probes: list[float]
) -> None:
    """Any sliding log, a run that fills it within one window, then probes growing apart
    until one is admitted: the closure counts the run and every probe refused, and its
    guess at the reopening is no faster than the log (`RateLearner._pace_reopened`
    paces at it)."""
    step = spread * length / limit
    sends = [k * step for k in range(limit + 1)]  # one more than the log takes
    at = sends[-1]
    for gap in probes:
        at += gap * length
        sends.append(at)
    answers = _sliding_log(limit, length, sends)
    reopened = next((t for t, refused in answers if not refused and t > sends[limit]), None)
    assume(reopened is not None)
    assert reopened is not None
    closure = closure_before(answers, math.nextafter(reopened, -math.inf), tolerance=TOLERANCE)
    refused = [t for t, r in answers if r and t < reopened]
    assert closure == Closure(limit, 0.0, sends[limit], len(refused), refused[-1])
    guess = closure.reopened(reopened)
    assert guess.limit / guess.length <= limit / length
    if length.is_integer():  # windows are whole seconds: counted in whole, no faster
        counted = closure.whole(reopened)
        assert counted.limit / counted.length <= limit / length
