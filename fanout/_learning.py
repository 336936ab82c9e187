"""Learning a scope's rate from what the server does, when nobody configured it.

Three sources, in order of trust:

1. **A stated window.** A limit with a window (``RateLimit-Policy:
   "x";q=100;w=60``) *is* the rate, ``limit / window``, and a ceiling never
   exceeded.
2. **How ``Remaining`` refills.** Between two responses whose requests
   reached the server at ``t1`` and ``t2``, with ``n`` requests of ours
   admitted in between, the server's bucket went from ``r1`` to ``r2`` (each
   floored, so up to one token more): ``rate >= (r2 - r1 + n - 1) / (t2 -
   t1)``. That bound holds whatever the server's burst, and whether or not its
   bucket was full on the way; the learner keeps the best bound seen, so the
   estimate only ever rises with evidence. The stated limit is the burst.
   Until a bound exists, a burst's worth per reset (at least a second) is
   the first guess: 429s correct it downward (AIMD), the refill upward.
3. **Bare 429s.** Without numbers, the rate is found the way TCP finds a
   link's capacity: additive increase, multiplicative decrease. A 429 halves
   the rate (from the rate we were actually sending at); each success adds a
   little back. AIMD turns 429s into pacing; we chose it over client-side
   adaptive throttling, which *rejects* requests locally (right for an
   overloaded backend, wrong for a rate limit, where a request should wait).

A response never resets the estimate: only new evidence moves it.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["RateLearner"]

_DECREASE = 0.5  # multiplicative decrease on a 429 when the server gave no numbers
_DECREASE_KNOWN = 0.8  # gentler when it did: the stated rate is already close
_MIN_RATE = 0.1  # requests a second: never learn a rate of zero
_STEP = 0.05  # additive increase per success, as a share of the reference rate
_BASELINE = 0.5  # seconds: the shortest span a refill is measured over


@attrs.define
class RateLearner:
    """The learned limits of one scope; ``rate`` is None while nothing is known.

    A burst of 429s from one burst of requests is one congestion event: after
    a decrease, further 429s within the server's wait (at least a second) do
    not decrease again.
    """

    rate: float | None = None
    burst: float = 1.0
    ceiling: float | None = None  # the server's stated rate; never exceeded
    measured: float | None = None  # the best lower bound from Remaining's refill
    _anchor: tuple[float, float, float] | None = attrs.field(default=None, alias="_anchor")
    _reference: float = attrs.field(default=_MIN_RATE, alias="_reference")
    _hold_until: float = attrs.field(default=-math.inf, alias="_hold_until")

    def from_headers(
        self,
        limit: float | None,
        window: float | None,
        remaining: float | None = None,
        reset_after: float | None = None,
        *,
        at: float = 0.0,
        started: float = 0.0,
    ) -> bool:
        """Take in one response; True when the limits changed.

        ``at`` is when its request was sent; ``started`` counts every request
        of ours booked to start up to then (a running total).
        """
        changed = False
        if limit is not None and limit >= 1 and math.isfinite(limit) and limit != self.burst:
            self.burst, changed = float(limit), True
        if limit is not None and window is not None and limit >= 1 and window > 0:
            stated = limit / window
            if math.isfinite(stated) and stated > 0 and stated != self.ceiling:
                self.ceiling = self._reference = self.rate = stated
                return True
            return changed
        if remaining is None or self.ceiling is not None:
            return changed
        changed |= self._measure(remaining, at, started)
        if self.rate is None and reset_after:
            # A burst's worth per reset (at least a second: resets are rounded up).
            guess = (limit if limit is not None else max(remaining, 1.0)) / max(reset_after, 1.0)
            if math.isfinite(guess) and guess > 0:
                self.rate = self._reference = max(guess, _MIN_RATE)
                changed = True
        return changed

    def _measure(self, remaining: float, at: float, started: float) -> bool:
        anchor = self._anchor
        if anchor is None or at < anchor[0]:
            self._anchor = (at, remaining, started)
            return False
        then, before, started_then = anchor
        if at - then < _BASELINE:
            return False  # over a shorter span the floored counts are mostly noise
        bound = (remaining - before + (started - started_then) - 1) / (at - then)
        if not (math.isfinite(bound) and bound > max(self.measured or 0.0, _MIN_RATE)):
            return False
        self.measured = bound
        if self.rate is None or bound > self.rate:
            self.rate = self._reference = bound
            return True
        return False

    def on_throttled(self, sending_rate: float, *, now: float, wait: float) -> None:
        """A 429: decrease from the rate we were sending at, once per congestion event."""
        if now < self._hold_until:
            return
        self._hold_until = now + max(wait, 1.0)
        current = sending_rate if self.rate is None else min(self.rate, sending_rate)
        current = max(current, _MIN_RATE)
        self._reference = self.ceiling or current
        factor = _DECREASE if self.ceiling is None else _DECREASE_KNOWN
        self.rate = max(_MIN_RATE, current * factor)
        # The measured bound was too high (429s it did not count): start over.
        self.measured, self._anchor = None, None

    def on_success(self) -> None:
        """One success: add a step of rate back, up to the server's ceiling.

        A rate measured from the server's own counts does not creep upward:
        only evidence raises it.
        """
        if self.rate is None or self.measured is not None:
            return
        grown = self.rate + _STEP * self._reference
        self.rate = grown if self.ceiling is None else min(grown, self.ceiling)
