"""Which token buckets explain a server's answers: the fit a scope learning with no numbers uses."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fanout._bucket_fit import AnswerLog, Fit


def answers(rate: float, burst: float, paces: list[float]) -> list[tuple[float, bool]]:
    """What a token bucket answers to requests sent at ``paces`` a second: (sent, admitted)."""
    tokens, last, sent, out = burst, 0.0, 0.0, []
    for pace in paces:
        tokens, last = min(burst, tokens + (sent - last) * rate), sent
        admitted = tokens >= 1.0
        tokens -= admitted
        out.append((sent, admitted))
        sent += 1 / pace
    return out


def log_of(pairs: list[tuple[float, bool]]) -> AnswerLog:
    log = AnswerLog()
    for sent, admitted in pairs:
        log.note(sent, admitted=admitted)
    return log


def test_a_short_run_fits_the_servers_rate_and_not_the_pace_it_refused() -> None:
    """A 20/s bucket of 10, sent to as a learning scope does (faster and faster, then slower
    and growing again): the rates that fit hold 20/s and stop just above it."""
    paces = [20 * 2 ** (k / 4) for k in range(14)] + [13 * 1.1**k for k in range(16)]
    fit = log_of(answers(20.0, 10.0, paces)).fit(slowest=0.1, fastest=max(paces))
    assert fit is not None
    assert fit.low <= 20.0 <= fit.high <= 22.0  # two 429s bound it within 10 %
    assert fit.bounded


def test_a_long_log_starts_over_at_a_429() -> None:
    """3000 answers: the log keeps the last few hundred, from a 429, so a fit's cost is bounded."""
    log = log_of(answers(10.0, 5.0, [12.0] * 3000))
    assert len(log) <= 2 * 512
    assert log._answers[0][1]  # refused


def test_of_two_sent_at_once_the_admitted_came_first() -> None:
    """A probe admitted and a request refused at the same instant: a bucket of one explains it."""
    fit = log_of([(0.0, True), (0.0, False), (1.0, True), (2.0, True)]).fit(
        slowest=0.1, fastest=2.0
    )
    assert fit is not None
    assert fit.low <= 1.0


def test_too_few_answers_fit_nothing() -> None:
    """One admission proves no rate at all."""
    assert log_of([(0.0, True), (0.1, False)]).fit(slowest=0.1, fastest=10.0) is None


def test_the_servers_own_rate_fits_however_narrow_the_band_that_does() -> None:
    """5/s, burst 2, as a learning scope met it (three 429s, exact times): the rates that
    fit are a band a tenth wide around 5/s. Found to 0.1 token, the smallest burst of each
    rate was too big to refuse where the server had refused, at rates next to 5/s: the
    band fell apart, and the fit settled on 5.9/s, which drew a fourth 429."""
    refused_at = {0.788, 1.854, 2.669}
    sends = [0.0, 0.3, 0.45, 0.6, 0.7, 0.788, 1.038, 1.288, 1.471, 1.625, 1.75, 1.854,
             2.054, 2.254, 2.421, 2.554, 2.669, 2.899]  # fmt: skip
    log = log_of([(sent, sent not in refused_at) for sent in sends])
    fit = log.fit(slowest=2.93, fastest=13.33)
    assert fit is not None
    assert fit.low <= 5.0 <= fit.high


def test_requests_still_out_count_as_admitted_when_asked() -> None:
    """A 20/s bucket of 5, paced ever faster; a 429 comes while the last round trip's
    requests are out. Left out, they read as never sent: the fit says the bucket refilled
    nothing in that time, so at most a few a second. Counted as admitted, 20/s fits."""
    paces = [5 * 1.15**k for k in range(40)]
    pairs = answers(20.0, 5.0, paces)
    refused = next(i for i, (_, admitted) in enumerate(pairs) if not admitted)
    answered, out = pairs[: refused - 8], [sent for sent, _ in pairs[refused - 8 : refused]]
    log = log_of([*answered, pairs[refused]])
    blind = log.fit(slowest=0.1, fastest=max(paces))
    told = log.fit(slowest=0.1, fastest=max(paces), pending=out)
    assert blind is not None
    assert told is not None
    assert blind.high < 20.0 <= told.high


def test_a_stated_burst_of_one_bounds_the_rate_from_below_too() -> None:
    """5/s, burst 1, paced ever faster into two 429s. Any burst explains the answers down
    to the slowest rate tried (a bigger bucket spent slowly): the fit proves nothing
    from below. A bucket of one admits a request only once a token refilled since the
    one before, so the admissions 0.23 s apart prove nearly 4/s."""
    paces = [2 * 1.3**k for k in range(9)]
    log = log_of(answers(5.0, 1.0, paces))
    free = log.fit(slowest=0.1, fastest=max(paces))
    one = log.fit(slowest=0.1, fastest=max(paces), burst=1.0)
    assert free is not None
    assert one is not None
    assert free.floored
    assert not one.floored
    assert 3.9 <= one.low <= 5.0 <= one.high == free.high


def learning_answers(
    rate: float, burst: float, grow: float, back: float
) -> list[tuple[float, bool]]:
    """What a token bucket answers to a learning scope's pace up to its second 429: from
    half its rate, growing by ``grow`` times it a second, each 429 setting it ``back``."""
    tokens, last, sent, out, pace = burst, 0.0, 0.0, [], rate / 2
    while sum(not admitted for _, admitted in out) < 2:
        tokens, last = min(burst, tokens + (sent - last) * rate), sent
        admitted = tokens >= 1.0
        tokens -= admitted
        out.append((sent, admitted))
        pace = pace + grow * rate / pace if admitted else rate * back
        sent += 1 / pace
    return out


@pytest.mark.parametrize(
    ("rate", "burst", "grow", "back"),
    [(50.0, 20.0, 1.0, 0.76), (79.77, 19.0, 0.53, 0.77), (41.33, 36.0, 0.51, 0.61),
     (12.0, 5.0, 2.0, 0.5)],
)  # fmt: skip
def test_a_narrow_band_of_rates_that_fit_is_found(
    rate: float, burst: float, grow: float, back: float
) -> None:
    """Two 429s a second apart against 50/s with a burst of 20 fit 49-51/s alone, which
    rates 10% apart strode over: no rate fitted (or a lone faster one, by rounding), and
    a learning scope halved its rate where 48/s was proven. Rates 2% apart below find it."""
    fit = log_of(learning_answers(rate, burst, grow, back)).fit(
        slowest=rate * 0.85, fastest=4 * rate
    )
    assert fit is not None
    assert fit.low <= rate * 1.02


def late_answers(
    rate: float, burst: float, paces: list[float], delays: list[float]
) -> list[tuple[float, bool, float]]:
    """What a token bucket answers to requests sent at ``paces`` a second, each reaching
    it ``delays`` later (in the order they arrive), a 429 read as it arrives: (sent,
    admitted, arrived)."""
    sends = list(itertools.accumulate((1 / pace for pace in paces[:-1]), initial=0.0))
    tokens, last, out = burst, 0.0, []
    for arrived, sent in sorted(
        (sent + delay, sent) for sent, delay in zip(sends, delays, strict=True)
    ):
        tokens, last = min(burst, tokens + (arrived - last) * rate), arrived
        admitted = tokens >= 1.0
        tokens -= admitted
        out.append((sent, admitted, arrived))
    return out


# A late request is drawn among the last half, sent well past the rate, where the server's
# bucket is empty: one late there is mostly refused (a fifth of the draws are kept).
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    rate=st.floats(5.0, 100.0),
    burst=st.integers(1, 30),
    growth=st.floats(1.03, 1.1),
    late=st.dictionaries(st.integers(30, 59), st.floats(0.005, 0.1), min_size=1, max_size=3),
)
def test_a_429_that_reached_the_server_late_still_fits_its_rate(
    rate: float, burst: int, growth: float, late: dict[int, float]
) -> None:
    """A slow start's requests, a few of them over a new connection that takes up to 0.1 s
    to reach the server, refused there: requests sent after them over warm ones got
    there first. Replayed as arrived when sent, such a refusal found a token left at the
    server's own rate, and only far faster buckets fitted, or none (130-140/s against
    50/s, in a real-time run). Read when its 429 was, it may have arrived after any
    admission sent before: the server's rate fits."""
    paces = [rate * growth**k for k in range(60)]
    delays = [late.get(k, 0.0) for k in range(60)]
    answered = late_answers(rate, float(burst), paces, delays)
    # An admission late on its way found the bucket fuller than when it left, which the
    # replay allows only to a tenth of a token: the late ones drawn here were refused.
    assume(all(not admitted for sent, admitted, arrived in answered if arrived > sent))
    assume(sum(not admitted for _, admitted, _ in answered) >= 2)
    # Where the rate fits the answers replayed as they arrived (a band of rates narrower
    # than the fit's steps may not: that is another question).
    arrivals = log_of([(arrived, admitted) for _, admitted, arrived in answered])
    assume(fits_rate(arrivals.fit(slowest=0.1, fastest=max(paces)), rate))
    log = AnswerLog()
    for sent, admitted, arrived in answered:
        log.note(sent, admitted=admitted, read=arrived)
    assert fits_rate(log.fit(slowest=0.1, fastest=max(paces)), rate)


def fits_rate(fit: Fit | None, rate: float) -> bool:
    """Whether ``fit`` holds ``rate``, to the 2% the fit's steps are apart."""
    return fit is not None and fit.low <= rate * 1.02 and rate <= fit.high * 1.02
