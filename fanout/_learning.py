"""Learning a scope's rate from the server, when nobody configured it.

Two sources, in order of trust:

1. **The server's own numbers.** A limit and a window in the rate-limit
   headers (``RateLimit-Policy: "x";q=100;w=60``, ``X-RateLimit-Limit`` with a
   window, ...) *are* the rate: the bucket takes ``limit / window`` with a
   burst of ``limit`` at once, and never goes faster than that ceiling.
2. **Its 429s.** Without numbers, the rate is found the way TCP finds a
   link's capacity: additive increase, multiplicative decrease. A 429 halves
   the rate (starting from the rate we were actually sending at); each
   success adds a little back. We chose AIMD over the client-side adaptive
   throttling of Google's SRE book because that scheme *rejects* requests
   locally in proportion to recent failures: right for shedding load from an
   overloaded backend, wrong for a rate limit, where the request should wait
   for its turn, not fail. AIMD turns 429s into pacing.

Until the first answer arrives, a scope that knows nothing lets one request
out alone (the probe): a fresh process asks once and learns the limits,
instead of firing its whole turn into a limit it has not seen.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["RateLearner"]

_DECREASE = 0.5  # multiplicative decrease on a 429 when the server gave no numbers
_DECREASE_KNOWN = 0.8  # gentler when it did: the stated rate is already close
_MIN_RATE = 0.1  # requests a second: never learn a rate of zero
_STEP = 0.05  # additive increase per success, as a share of the reference rate


@attrs.define
class RateLearner:
    """The learned limits of one scope; ``rate`` is None while nothing is known.

    The additive step is a fixed share of a reference rate (the server's
    stated rate, else the rate before the last decrease), so recovery takes
    about twenty successes at any scale. A burst of 429s from one burst of
    requests is one congestion event: after a decrease, further 429s within
    the server's wait (at least a second) do not decrease again.
    """

    rate: float | None = None
    burst: float = 1.0
    ceiling: float | None = None  # the server's stated rate; never exceeded
    _reference: float = attrs.field(default=_MIN_RATE, alias="_reference")
    _hold_until: float = attrs.field(default=-math.inf, alias="_hold_until")

    def from_headers(
        self,
        limit: float | None,
        window: float | None,
        remaining: float | None = None,
        reset_after: float | None = None,
    ) -> bool:
        """Adopt what the server stated; True when the limits changed.

        A limit with a window is the rate itself. Without a window (the
        ``X-RateLimit-*`` and vendor families), what is left of the window
        spread over the time until its reset is a pace that cannot overrun it.
        """
        if limit is not None and window is not None and limit >= 1 and window > 0:
            stated = limit / window
            if not (math.isfinite(stated) and stated > 0):
                return False
            if self.ceiling == stated and self.burst == limit:
                return False
            self.ceiling, self.burst, self._reference = stated, float(limit), stated
            self.rate = stated
            return True
        if self.ceiling is None and remaining is not None and reset_after:
            pace = max(remaining, 1.0) / reset_after
            if math.isfinite(pace) and pace > 0 and pace != self.rate:
                self.rate, self._reference = max(pace, _MIN_RATE), max(pace, _MIN_RATE)
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

    def on_success(self) -> None:
        """One success: add a step of rate back, up to the server's ceiling."""
        if self.rate is None:
            return
        grown = self.rate + _STEP * self._reference
        self.rate = grown if self.ceiling is None else min(grown, self.ceiling)
