"""A server's wall clock, read from its ``Date`` headers more finely than their whole seconds.

``Date`` is the server's time floored to the second, so an HTTP-date
``Retry-After`` measured against it alone waits up to a second longer than
the server meant, and at a few seconds a turn that is most of its cost. Each
response received at trio time ``r`` with ``Date: D`` proves that the
server's clock read at least ``D`` then, so at least ``D + (t - r)`` at any
later ``t``. The best such bound is kept: once the server's second has
ticked over between two responses, it is as fine as their spacing. It stays
a lower bound, so a wait read against it is never shorter than the server's;
and it never leaves the second the latest ``Date`` names (a server clock set
back is believed at once).
"""

from __future__ import annotations

import math

import attrs

__all__ = ["ServerClock"]


@attrs.define
class ServerClock:
    """The best lower bound of one server's clock, as an offset from trio's."""

    _offset: float = attrs.field(default=-math.inf, alias="_offset")

    def read(self, date: float | None, now: float) -> float | None:
        """The server's time now (epoch seconds), given this response's ``Date``; None without."""
        if date is None or not math.isfinite(date):
            return None
        if now + self._offset >= date + 1.0:
            self._offset = -math.inf  # the server's clock went back: forget what it said before
        self._offset = max(self._offset, date - now)
        return now + self._offset
