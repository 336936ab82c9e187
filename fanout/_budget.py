"""A call's budget: the one deadline every wait is charged against, and its patience.

A call may wait for a concurrency slot, a token, a server's Retry-After, a
backoff, an idempotency claim held elsewhere or a store that answers slowly.
Each of those asks the budget, and the budget alone decides (invariant 2):
sleep the wait, or do not, and why. The budget is an absolute time on
``trio.current_time()``.

Three reasons not to sleep a wait, checked in this order:

* it would end at or past the deadline (nothing would be left to do the work);
* it fits, but the work that follows usually takes longer than what would be
  left, so the call would be cut off mid-flight (a wasted request, and for a
  write an unknown effect); work expected to end exactly at the deadline is
  in time (a call of 100 ms started at 1.9 s ends at 2.0 s);
* it fits, but is longer than ``inline_wait``, the longest wait fanout sleeps
  without telling the model; a longer one is surfaced so the model can plan.
"""

from __future__ import annotations

import enum
import math

import attrs
import trio

from ._validate import require_non_negative

__all__ = ["CLOCK_NOISE", "MAX_WAIT", "QUOTA_HORIZON", "Budget", "Verdict", "usable_wait"]

CLOCK_NOISE = 1e-9  # seconds: float noise in sums of clock readings, not a later time

MAX_WAIT: float = 7 * 24 * 3600.0
"""Seconds. A server or tool asking for a longer wait is wrong, not patient."""

QUOTA_HORIZON: float = 3600.0
"""Seconds. A server wait beyond it is a spent quota, not throttling (a scope's default)."""


def usable_wait(value: object) -> float | None:
    """A wait a tool or server gave, as seconds fanout can use, or None if unusable.

    Negative clamps to 0 (the moment has passed); NaN and non-numbers are
    unsaid; anything past ``MAX_WAIT`` is capped there (and so is an
    exhausted quota, not a throttle).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):  # compared as an int: ``float(10**400)`` overflows
        return float(min(max(value, 0), int(MAX_WAIT)))
    if math.isnan(value):
        return None
    return min(max(float(value), 0.0), MAX_WAIT)


class Verdict(enum.Enum):
    """What the budget says of one wait."""

    SLEEP = "sleep"
    PAST_DEADLINE = "past_deadline"
    ENDS_LATE = "ends_late"
    TOO_LONG = "too_long"


def _inline_wait(_: object, __: attrs.Attribute[float | None], value: float | None) -> None:
    if value is not None:
        require_non_negative("inline_wait", value)


@attrs.frozen
class Budget:
    """The absolute deadline of one call, min(turn deadline, start + timeout).

    ``inline_wait`` is the longest single wait slept without surfacing it
    (None: any wait that fits the deadline is slept).
    """

    deadline: float
    inline_wait: float | None = attrs.field(default=None, validator=_inline_wait)

    @classmethod
    def starting_now(
        cls,
        timeout: float | None,
        *,
        turn_deadline: float,
        inline_wait: float | None = None,
        since: float | None = None,
    ) -> Budget:
        """A budget for a call that starts now (or started at ``since``, if before now),
        capped by its turn's deadline."""
        now = trio.current_time()
        start = now if since is None else min(now, since)
        own = math.inf if timeout is None else start + timeout
        return cls(min(own, turn_deadline), inline_wait)

    def fits(self, wait: float) -> bool:
        """Whether waiting ``wait`` seconds ends strictly before the deadline.

        A wait that ends exactly at the deadline does not fit: the request
        would be sent with no time left to answer it. NaN never fits.
        """
        return trio.current_time() + wait < self.deadline

    def ends_late(self, seconds: float) -> bool:
        """Whether work of ``seconds`` from now is expected to end past the deadline.

        Unlike a wait, work that ends exactly at the deadline is in time: its
        answer is there when the deadline comes.
        """
        return trio.current_time() + seconds > self.deadline + CLOCK_NOISE

    def patience(self) -> float:
        """The absolute time until which a wait starting now may be slept."""
        if self.inline_wait is None:
            return self.deadline
        return min(self.deadline, trio.current_time() + self.inline_wait)

    def judge(self, wait: float, *, latency: float | None = None) -> Verdict:
        """The one decision on a wait of ``wait`` seconds before work of ``latency``.

        ``latency`` is what the work after the wait usually takes (a scope's
        observed latency), or None when unknown. A wait of zero is always
        worth trying if the deadline has not passed: the call may be fast.
        """
        if math.isnan(wait) or not self.fits(max(0.0, wait)):  # max() would turn NaN into 0
            return Verdict.PAST_DEADLINE
        if wait > 0 and latency is not None and self.ends_late(wait + latency):
            return Verdict.ENDS_LATE
        if self.inline_wait is not None and wait > self.inline_wait:
            return Verdict.TOO_LONG
        return Verdict.SLEEP

    def explain(self, verdict: Verdict, *, latency: float | None = None) -> str:
        """Why a wait was not slept, as the model reads it (after "would wait Ns, ")."""
        if verdict is Verdict.ENDS_LATE:
            return (
                f"but calls there take about {latency or 0.0:.3f}s and it would end past "
                "its deadline"
            )
        if verdict is Verdict.TOO_LONG:
            return f"longer than fanout waits inline ({self.inline_wait or 0.0:g}s)"
        return "past the call's deadline"

    def bound(self, seconds: float) -> float:
        """The absolute end of an operation allowed ``seconds``, never past the deadline.

        For what must be bounded by its own timeout *and* the call's: a store
        or Redis operation, a cleanup run under a shield.
        """
        return min(self.deadline, trio.current_time() + max(0.0, seconds))
