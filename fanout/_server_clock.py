"""A server's wall clock, read from its ``Date`` headers more finely than their whole seconds.

``Date`` is the server's time floored to the second, so an HTTP-date
``Retry-After`` measured against it alone waits up to a second longer than
the server meant: with whole-second dates, every 429 cost a client that
obeyed it a second or two. The responses bound the server's clock from both
sides. One received at trio time ``r`` with ``Date: D``, for a request sent
at ``s``, shows that the server read at least ``D`` at ``r`` and less than
``D + 1 + STALE`` at ``s``: at a later ``t``, between ``D + (t - r)`` and
``D + 1 + STALE + (t - s)``. ``STALE`` is how long a server may keep one
``Date`` for: uvicorn (under FastAPI and Starlette) writes the date once a
second and sends it until the next, so its ``Date`` was 0.85-1.83 s behind
its clock, and bounded as if fresh, a synchronised clock was disbelieved
and every HTTP-date wait ran a second long (2.0x the minimum, against 1.1x
for a fresh ``Date``). The tightest of these bounds are kept. Within them
our own wall clock, when it agrees, places the server's time exactly (most
clocks are synchronised); outside them it is not believed. So a client
clock skewed either way can never stretch a wait beyond what the server's
own ``Date`` says, nor shrink it by more than what the server's dates leave
open.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["STALE", "ServerClock"]

STALE = 1.0  # seconds a server may send the same ``Date`` for after its second began


@attrs.define
class ServerClock:
    """The bounds of one server's clock, as offsets from trio's."""

    _low: float = attrs.field(default=-math.inf, alias="_low")
    _high: float = attrs.field(default=math.inf, alias="_high")

    def read(self, date: float | None, *, now: float, sent: float, wall: float) -> float | None:
        """The server's time now (epoch seconds), given a response's ``Date``; None without.

        ``now`` is trio's time, ``sent`` when the request left (trio time),
        ``wall`` our wall clock now.
        """
        if date is None or not math.isfinite(date):
            return None
        low, high = date - now, date + 1.0 + STALE - min(sent, now)
        if low >= self._high or high <= self._low:
            self._low, self._high = low, high  # the server's clock was set: start again
        self._low, self._high = max(self._low, low), min(self._high, high)
        local = wall - now
        return now + (local if self._low <= local < self._high else self._low)
