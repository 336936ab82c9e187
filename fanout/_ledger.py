"""What one process knows of a scope's queue, whatever backs the scope's limits.

A local ``Scope`` and a ``RedisScope`` differ in where their bucket and
slots live, not in this: the calls waiting and in flight here (for shedding
and its estimate), the latency observed here, and a spent quota's end.
"""

from __future__ import annotations

import math

import attrs
import trio

__all__ = ["Ledger"]

_DEFAULT_LATENCY = 1.0  # seconds assumed per call before any has been observed
_SMOOTHING = 0.2  # weight of the newest sample in the latency's moving average


@attrs.define
class Ledger:
    """Counts and estimates a scope keeps in-process."""

    waiting: int = 0
    in_flight: int = 0
    shed: int = 0
    latency: float | None = None
    _exhausted_until: float | None = attrs.field(default=None, alias="_exhausted_until")

    def observe_latency(self, seconds: float) -> None:
        """Fold one attempt's duration into the moving average."""
        if self.latency is None:
            self.latency = seconds
        else:
            self.latency += _SMOOTHING * (seconds - self.latency)

    def slots_estimate(self, max_concurrency: int | None) -> float:
        """How long the calls waiting and in flight here hold the slots a new call needs."""
        if max_concurrency is None:
            return 0.0
        queued = self.waiting + self.in_flight + 1
        latency = self.latency if self.latency is not None else _DEFAULT_LATENCY
        return math.ceil(queued / max_concurrency - 1) * latency

    def exhaust(self, until: float) -> None:
        """The quota is spent until ``until`` (the later of two claims wins)."""
        self._exhausted_until = max(self._exhausted_until or -math.inf, until)

    def exhausted_until(self) -> float | None:
        """When the spent quota returns, or None while the scope is usable."""
        if self._exhausted_until is not None and trio.current_time() >= self._exhausted_until:
            self._exhausted_until = None
        return self._exhausted_until
