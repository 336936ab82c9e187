"""Which token buckets explain a server's answers: the fit a scope learning with no numbers uses."""

from __future__ import annotations

from fanout._bucket_fit import AnswerLog


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
