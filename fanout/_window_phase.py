"""Where a told window's boundaries fall, once the server has shown one.

A told window (``limit=20, per=2``) is kept as a sliding log: each token
comes back ``per`` seconds after its request reached the server. A fixed
window keyed by the clock (Kong's, Envoy's) gives every token of a window
back at once, at a boundary the client does not know; a ``Reset`` in whole
seconds places it only to the second. The log finds each reopening by
sending one request at the latest the ``Reset`` allows and reading its
count; the rest of the window's requests wait for that answer, a round trip,
in every window.

Once one answer shows the server forgot a whole window at once (its count
says only that request is in the new window), a boundary lies between the
last request counted in the old window and that request's arrival: ``(lo,
hi]``. The next boundaries are a window apart. A request that surely
arrived before ``lo`` plus a whole number of windows is in a window that ends
by ``hi`` plus one more: its token comes back then, and every request of
that window with it, without a request sent ahead to see.

A server that forgot a window at once may also be a token bucket that
refilled faster than the log allows; such a bucket gives tokens back no
faster than the refill it showed. Each token is also held that long
(``refill``: how long the server took, at most, to give back a whole
window), so that the schedule is safe against either.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["WindowPhase"]


@attrs.frozen
class WindowPhase:
    """A boundary of the server's windows lies in ``(lo, hi]``, and each of them a
    ``window`` after the one before; the server refilled a whole window in at most
    ``refill`` seconds."""

    lo: float
    hi: float
    refill: float
    window: float

    @classmethod
    def shown(
        cls, *, counted: list[float], arrived: float, window: float, share: float
    ) -> WindowPhase | None:
        """The phase one answer shows: the request that arrived by ``arrived`` was the first
        of a new window, and the requests that started at ``counted`` (the latest they can
        have reached the server no sooner), all of the old window's, were forgotten with
        it. ``share``: the part of the window's limit they were. None where that places
        no boundary within a window.
        """
        if not counted or share <= 0:
            return None
        lo, first = max(counted), min(counted)
        if not (arrived - lo < window and arrived > first):
            return None
        return cls(lo, arrived, (arrived - first) / min(1.0, share), window)

    def narrower(self, other: WindowPhase) -> bool:
        """Whether this places the boundaries more closely than ``other`` does."""
        return self.hi - self.lo < other.hi - other.lo

    def end_of(self, arrived: float) -> float:
        """When a request that reached the server by ``arrived`` surely left its window."""
        windows = math.floor((arrived - self.lo) / self.window)
        return max(self.hi + (windows + 1) * self.window, arrived + self.refill)
