"""Which token buckets explain what a server admitted and refused.

With no numbers stated, a server's answers are the only evidence of its
limits. A token bucket is two numbers, a rate and a burst; for any rate, a
bigger burst only ever holds more, so the smallest burst that admits every
request the server admitted is found by bisection, replaying the answers.
The rate *fits* when that bucket also refuses every request the server
refused. Rates are tried from the slowest proven up, 10% apart, then the
ends of the slowest run of two or more that fit (a lone rate may fit by
rounding alone) are found 2% apart.

A server that states its burst is replayed with that burst alone. A burst
of one admits a request only a whole token's refill after the one before,
and refuses it sooner, so every two answers bound the rate: after two 429s
against 5/s, 3.3-5.4/s, where any burst fitted 0.9-5.3/s and proved
nothing of the slowest.

The replay starts full at the first request (the server's bucket starts
full at a key's first arrival), or, once the log is long and has started
over at a 429, with the less than one token a 429 proves. A request reaches
the server after it left: the server held up to ``_TOLERANCE`` more than the
replay says when it admitted. A refused request reached it at any time
before its 429 was read: the bucket refused it if it held less than a token
when it was sent, or just after any admission sent before the 429 was read.
(Replayed as arrived when sent, a 429 that went over a new connection, 46 ms
on its way while ten sent after it over warm ones got there first, fitted
only 130-140/s against 50/s.)
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["AnswerLog", "Fit"]

_LOGGED = 512  # answers replayed (a fit takes about 0.1 ms per answer)
_PRECISION = 0.01  # tokens: how finely the smallest burst is found
_FINE = 1.02  # rates 2% apart, at the ends of a run that fits
_COARSE = 1.1  # rates 10% apart, on the first pass
_TOLERANCE = 0.1  # tokens: requests reach the server out of step with when they left

# When a request was sent, whether it was refused, and when its answer was read.
_Answer = tuple[float, bool, float]


@attrs.frozen
class Fit:
    """The slowest and fastest rate that fit; ``bounded`` when a faster one was seen not to,
    ``floored`` when the slowest rate tried fits (so might slower ones: ``low`` bounds
    nothing, it is only where the search began)."""

    low: float
    high: float
    bounded: bool
    floored: bool = False


@attrs.define
class AnswerLog:
    """A server's answers, in the order sent: of two sent at once, the admitted came first."""

    _answers: list[_Answer] = attrs.field(factory=list, alias="_answers")
    _from_429: bool = attrs.field(default=False, alias="_from_429")  # it starts at a 429

    def __len__(self) -> int:
        return len(self._answers)

    def note(self, sent: float, *, admitted: bool, read: float | None = None) -> None:
        """Log one answer, read at ``read`` (default: when sent). A long log starts over
        at a 429 (its bucket was empty then)."""
        answers = self._answers
        if admitted and len(answers) >= 2 * _LOGGED:
            return  # unlogged admissions only make the fit slower, never faster
        bisect.insort(answers, (sent, not admitted, sent if read is None else max(sent, read)))
        if not admitted and len(answers) > _LOGGED:
            tail = len(answers) - _LOGGED
            start = next((i for i in range(tail, len(answers)) if answers[i][1]), len(answers) - 1)
            del answers[:start]
            self._from_429 = True

    def with_pending(self, pending: Sequence[float] = ()) -> list[tuple[float, bool]]:
        """The answers (sent, refused), with requests sent at ``pending`` and not yet
        answered taken as admitted (a refusal comes back at once)."""
        return [(sent, refused) for sent, refused, _ in self._timeline(pending)]

    def _timeline(self, pending: Sequence[float] = ()) -> list[_Answer]:
        """The answers (sent, refused, read), with ``pending`` as admitted."""
        answers = self._answers
        if pending and answers:
            extra = [(sent, False, sent) for sent in pending if sent >= answers[0][0]]
            return sorted(answers + extra)
        return list(answers)

    def fit(
        self,
        *,
        slowest: float,
        fastest: float,
        pending: Sequence[float] = (),
        burst: float | None = None,
    ) -> Fit | None:
        """The rates from ``slowest`` up that explain every answer, or None if none does.

        ``fastest`` is a rate we were refused at: no bucket twice as fast fits.
        ``burst``: the server's, where it states it (else the smallest that
        admits every admitted request, for each rate).
        ``pending``: when requests still unanswered were sent, taken as
        admitted (a refusal comes back at once, an admission after the
        server's latency). Left out, the requests of the last round trip
        read as never sent, and a 429 after them as a bucket that refilled
        nothing meanwhile: a fit of 1.2/s against 20/s.
        """
        answers = self._timeline(pending)
        admitted = sum(not refused for _, refused, _ in answers)
        span = answers[-1][0] - answers[0][0] if answers else 0.0
        if admitted < 2 or span <= 0:
            return None
        high = 2 * max((admitted + 1) / span, fastest)

        def fits(rate: float) -> bool:
            if burst is not None:
                return self._replay(answers, rate, burst) == (True, True)
            smallest = self._smallest_burst(answers, rate, admitted + 1.0)
            return smallest is not None and self._replay(answers, rate, smallest)[1]

        tried = _rates(slowest, high, _COARSE)
        run = _slowest_run(tried, fits)
        if len(run) < 2:
            # Two 429s a second apart against 50/s with a burst of 20 fit 49-51/s alone,
            # which rates 10% apart stride over: no rate fitted, and the rate was halved
            # to 24/s where 48/s was proven (or a lone faster rate fitted by rounding).
            # Then 2% apart, below it: the slower of two that fit is the safer.
            upto = run[0] if run else max(slowest, min(high, 2 * fastest))
            below = _rates(slowest, upto, _FINE)
            finer_run = _slowest_run(below[:-1] if run else below, fits)
            if finer_run:
                tried, run = below, finer_run
        if not run:
            return None
        finer = _rates(run[0] / _COARSE, run[0], _FINE)
        low = next(r for r in finer if fits(r))
        top = run[-1]
        for rate in _rates(top, top * _COARSE, _FINE):
            if not fits(rate):
                break
            top = rate
        return Fit(low, top, run[-1] != tried[-1], floored=low == finer[0])

    def _replay(self, answers: list[_Answer], rate: float, burst: float) -> tuple[bool, bool]:
        """Whether a bucket of ``rate`` and ``burst`` admits every admitted request,
        and refuses every refused one (at some time before its 429 was read)."""
        empty = self._from_429
        tokens, last = (min(burst, 1.0) if empty else burst), answers[0][0]
        admits = refuses = True
        # When the first refusal not yet explained was read; the others may wait as long.
        explained_by = math.inf
        for sent, refused, read in answers[1:] if empty else answers:
            tokens, last = min(burst, tokens + (sent - last) * rate), sent
            refuses = refuses and sent <= explained_by
            if not refused:
                admits = admits and tokens >= 1.0 - _TOLERANCE
                tokens = max(tokens - 1.0, 0.0)
                if tokens < 1.0:
                    explained_by = math.inf  # each may have arrived just after this one
            elif tokens >= 1.0:
                explained_by = min(explained_by, read)
        return admits, refuses and explained_by == math.inf

    def _smallest_burst(self, answers: list[_Answer], rate: float, most: float) -> float | None:
        """The smallest burst (to ``_PRECISION``) admitting every admission at ``rate``."""
        low, high = 1.0, most
        if not self._replay(answers, rate, high)[0]:
            return None
        while high - low > _PRECISION:
            middle = (low + high) / 2
            if self._replay(answers, rate, middle)[0]:
                high = middle
            else:
                low = middle
        return high


def _slowest_run(rates: list[float], fits: Callable[[float], bool]) -> list[float]:
    """The slowest run of two or more of ``rates`` in a row that fit (a lone rate may fit
    by rounding alone), else the longest, which may be one or none."""
    runs: list[list[float]] = [[]]
    for rate in rates:
        if fits(rate):
            runs[-1].append(rate)
        elif runs[-1]:
            runs.append([])
    return next((run for run in runs if len(run) > 1), max(runs, key=len))


def _rates(low: float, high: float, step: float) -> list[float]:
    """Rates from ``low`` to ``high`` (both included), each ``step`` times the last."""
    count = max(0, math.ceil(math.log(max(high, low) / low) / math.log(step)))
    return [min(low * step**k, high) for k in range(count + 1)]
