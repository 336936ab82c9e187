"""What one process knows of a scope's queue, whatever backs the scope's limits.

A local ``Scope`` and a ``RedisScope`` differ in where their bucket and
slots live, not in this: the calls waiting and in flight here (for shedding
and its estimate), the latency observed here, and a spent quota's end.
"""

from __future__ import annotations

import collections
import itertools
import math

import attrs
import trio

__all__ = ["Ledger"]

_SMOOTHING = 0.2  # weight of the newest sample in the latency's moving average
_SAMPLES = 32  # recent durations kept for the fastest and slowest
_GUESS = 1.0  # seconds a call is assumed to take, for a hint, before any has finished


@attrs.define
class Ledger:
    """Counts and estimates a scope keeps in-process."""

    waiting: int = 0  # calls queued here: for the probe, a slot, or their tokens
    booked: int = 0  # of those, the calls already holding their tokens
    in_flight: int = 0
    shed: int = 0
    latency: float | None = None
    _samples: collections.deque[float] = attrs.field(
        factory=lambda: collections.deque(maxlen=_SAMPLES), alias="_samples"
    )
    _exhausted_until: float | None = attrs.field(default=None, alias="_exhausted_until")
    _trips: collections.deque[float] = attrs.field(
        factory=lambda: collections.deque(maxlen=_SAMPLES), alias="_trips"
    )
    _wire_trips: collections.deque[float] = attrs.field(
        factory=lambda: collections.deque(maxlen=_SAMPLES), alias="_wire_trips"
    )
    _cold_wire_trips: collections.deque[float] = attrs.field(
        factory=lambda: collections.deque(maxlen=_SAMPLES), alias="_cold_wire_trips"
    )

    def observe_latency(self, seconds: float) -> None:
        """Fold one attempt's duration into the moving average and the recent samples."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            return
        self._samples.append(seconds)
        if self.latency is None:
            self.latency = seconds
        else:
            self.latency += _SMOOTHING * (seconds - self.latency)

    def observe_cut_short(self, seconds: float) -> None:
        """An attempt refused or cut off after ``seconds``: the work takes at least that.

        It raises the latency when longer than it (a throttled call that had
        worked 0.8 s shows calls take that long) and is no sample of how fast
        a call can be: a 429 answered in 2 ms says nothing of the work.
        """
        if seconds >= 0 and math.isfinite(seconds) and seconds > (self.latency or 0.0):
            self.latency = seconds

    def finished(self) -> int:
        """How many recent call durations are kept (the last ``_SAMPLES`` at most)."""
        return len(self._samples)

    def fastest(self) -> float:
        """The shortest recent call duration (zero before any finished)."""
        return min(self._samples, default=0.0)

    def slowest(self) -> float:
        """The longest recent call duration (zero before any finished)."""
        return max(self._samples, default=0.0)

    def spread(self) -> float:
        """How much recent call durations vary: how much later than another a request
        may reach the server, as far as durations can tell."""
        return self.slowest() - self.fastest()

    def observe_trip(self, seconds: float) -> None:
        """One request's round trip, from when it left to its answer (not its call's set-up)."""
        _keep(self._trips, seconds)

    def quickest_trip(self) -> float | None:
        """The shortest recent round trip (None before any)."""
        return min(self._trips, default=None)

    def trip_spread(self) -> float | None:
        """How much recent round trips vary (None before any): as `spread`, without the
        time tools took before they sent, which varies with the tool, not the way."""
        return _range(self._trips)

    def observe_wire_trip(self, seconds: float, *, opened: bool = False) -> None:
        """One request's round trip from when its headers left (not from when the HTTP
        layer had it: the way to the headers, as long as the process is busy);
        ``opened``: over a connection it opened, which a server may read late."""
        _keep(self._cold_wire_trips if opened else self._wire_trips, seconds)

    def quickest_wire_trip(self) -> float | None:
        """The shortest recent round trip from the headers, over any connection (None
        before any): the least the server's own time and the way back can take."""
        return min((*self._wire_trips, *self._cold_wire_trips), default=None)

    def slowest_wire_trip(self) -> float | None:
        """The longest recent round trip from the headers, over any connection (None
        before any)."""
        return max((*self._wire_trips, *self._cold_wire_trips), default=None)

    def wire_trip_spread(self, *, new_up_to: float) -> float | None:
        """How much recent round trips from the headers vary (None before any): those over
        connections already open, or those over new ones, if more, up to ``new_up_to``,
        but not by how much later than others some came. A new connection's trip that
        came more than ``new_up_to`` after the next quicker one was read that much later
        by a server slow to take new connections in (or was held after its connection
        opened, and read at once), which a window holds each such request's own token
        for (`fanout._window.Arrivals`); only how much such trips vary among themselves
        is the margin's. Taken in up to 5 ms, a server reading new connections 100 ms
        late paced a log of one per 50 ms 56 ms apart throughout (1.16x the fastest in
        real time), one reading them 5 ms late a log of one per 20 ms 25 ms apart (1.2x
        on a mock clock). With the warm trips' spread alone, a plain log of one per 50
        ms drew a 429 in 2 of 28 real-time runs; with the new ones' among themselves
        too, none after the first answers in 80."""
        warm, cold = self._wire_trips, self._cold_wire_trips
        if not warm and not cold:
            return None
        return max(_range(warm) or 0.0, min(new_up_to, _range_within(cold, new_up_to)))

    def slots_estimate(self, max_concurrency: int | None, *, guess: bool) -> float:
        """How long the calls waiting and in flight here hold the slots a new call needs.

        Before any call has finished the latency is unknown: with ``guess``
        (a hint for the model) a call is assumed to take a second; without
        (deciding whether to shed) the estimate is zero, since the wait for a
        slot is bounded by the budget anyway and work that fits is not shed.
        """
        latency = self.latency if self.latency is not None else (_GUESS if guess else 0.0)
        if max_concurrency is None:
            return 0.0
        queued = self.waiting - self.booked + self.in_flight + 1
        return math.ceil(queued / max_concurrency - 1) * latency

    def exhaust(self, until: float) -> None:
        """The quota is spent until ``until`` (the later of two claims wins)."""
        self._exhausted_until = max(self._exhausted_until or -math.inf, until)

    def exhausted_until(self) -> float | None:
        """When the spent quota returns, or None while the scope is usable."""
        if self._exhausted_until is not None and trio.current_time() >= self._exhausted_until:
            self._exhausted_until = None
        return self._exhausted_until


def _keep(samples: collections.deque[float], seconds: float) -> None:
    """Keep ``seconds`` among the recent ``samples``, if it is a duration at all."""
    if seconds >= 0 and math.isfinite(seconds):
        samples.append(seconds)


def _range_within(samples: collections.deque[float], apart: float) -> float:
    """How far apart ``samples`` lie within each run of them whose neighbours are at most
    ``apart`` apart, at most (0 before any)."""
    widest, ordered = 0.0, sorted(samples)
    first = ordered[0] if ordered else 0.0
    for before, seconds in itertools.pairwise(ordered):
        if seconds - before > apart:
            first = seconds
        widest = max(widest, seconds - first)
    return widest


def _range(samples: collections.deque[float]) -> float | None:
    """How far apart the recent ``samples`` lie (None before any)."""
    return max(samples) - min(samples) if samples else None
