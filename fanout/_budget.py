"""A call's budget: the one deadline every wait is charged against.

A call may wait for a concurrency slot, a token, a server's Retry-After and a
backoff; each of those asks the budget first, so no wait outlives the call
(invariant 2). The budget is an absolute time on ``trio.current_time()``.
"""

from __future__ import annotations

import math

import attrs
import trio

__all__ = ["Budget"]


@attrs.frozen
class Budget:
    """The absolute deadline of one call: min(turn deadline, start + timeout)."""

    deadline: float

    @classmethod
    def starting_now(cls, timeout: float | None, *, turn_deadline: float) -> Budget:
        """A budget for a call that starts now, capped by its turn's deadline."""
        own = math.inf if timeout is None else trio.current_time() + timeout
        return cls(min(own, turn_deadline))

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.deadline - trio.current_time())

    def fits(self, wait: float) -> bool:
        """Whether waiting ``wait`` seconds still leaves time to do the work.

        A wait that ends exactly at the deadline does not fit: the request
        would be sent with no time left to answer it.
        """
        return trio.current_time() + wait < self.deadline
