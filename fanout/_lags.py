"""How late a scope's requests leave and arrive, as measured: the slack it keeps.

A bucket counts a burst's refill from its first admission; the server, from
its first request's arrival. The slack is the margin kept for what lies
between, measured, never a number a user must guess: how late the process
woke a call (`Lags.woke`), how much later than the quickest a call's request
left (`Lags.sent`), how much the way to the headers varies (`Lags.wrote`),
and how late a burst's first request arrived, as its earliest answer less
the quickest warm call shows (`Lags.arrived_late`). Which of them a scope
keeps depends on what it sees of its requests' way out (`Sight`): the scope
front (`fanout._front`) says, and hands the margin to its backend.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs

from ._budget import CLOCK_NOISE
from ._learning import TOGETHER

if TYPE_CHECKING:
    from ._ledger import Ledger

__all__ = ["Lags", "Sight"]


@attrs.frozen
class Sight:
    """What a scope sees of its requests on their way, which decides what its margin keeps.

    ``wire``: a told bucket counted as requests reach the wire
    (`ScopeFront.wire_wait`); ``bucket_departures``: a told bucket that sees
    each request leave; ``window_departures``: a told window that counts each
    request from when it leaves (`ScopeFront.window_wait`); ``windowed``: the
    scope counts in a window, told or learned; ``answers_hold_their_own``:
    every answer comes back before its token could be taken again
    (`ScopeFront._answers_hold_their_own`); ``told_window``: a window the
    scope was told, seen leaving or not (a shared one's).
    """

    wire: bool
    bucket_departures: bool
    window_departures: bool
    windowed: bool
    answers_hold_their_own: bool
    told_window: bool = False


@attrs.define
class Lags:
    """The lags measured so far, and the warm calls' quickest and slowest durations."""

    _wake: float = 0.0  # how late a call that took a full bucket was woken, at most
    _send: float = 0.0  # how much later than the quickest a call's request left, at most
    # The least and most time any call took from admission to the HTTP layer.
    _sends: tuple[float, float] = (math.inf, -math.inf)
    quickest_send: float = math.inf  # ... the least a call of the latest burst took
    # The least and most time requests over open connections took to reach their headers.
    _writes: tuple[float, float] = (math.inf, -math.inf)
    arrival: float = 0.0  # how late a burst's first request reached the server, at most
    # The burst whose earliest answer a 429 made the slack take as all late arrival.
    _assumed: tuple[float, float] | None = None
    # The quickest and slowest calls whose requests opened no connection: the server's
    # own time, with no connection's set-up in it.
    warm_fastest: float | None = None
    warm_slowest: float | None = None

    def margin(self, sight: Sight, ledger: Ledger) -> float:
        """The margin measured so far: the later of the two signs of a late first arrival,
        or how much the requests' way out varies (`wrote`). A call woken late
        (`woke`) also sends late: the two lags add up.

        A window gives back every token of its last window, not only a
        burst's first: its margin is also how much call durations vary. A
        server takes a burst's requests in a few ms apart, as busy as it
        is, and a log whose next window began a window after each *send*
        drew one to three 429s a run against the sliding log in real time.
        Durations cannot tell that lateness from a server whose answers
        jitter (which took each request in when it arrived), so the whole
        spread is kept: against such a server it costs the spread in every
        window, once (the answers themselves no longer add it again,
        `fanout._window.Arrivals`). Not where each answer comes back before
        its token could be taken again: it holds its own token as long as its
        round trip shows (``sight.answers_hold_their_own``).

        A told bucket that sees its requests leave keeps of a late arrival only
        what is beyond how much its warm answers vary (`warm_spread`): the
        server's own time varies that much with no late arrival at all. One that
        counts them on the wire keeps none once a warm answer is in: the request
        that opens a connection owes its late read there
        (`ScopeFront.wire_written`).
        """
        send_lag, trips = self._send, None
        if sight.window_departures or sight.told_window:
            # Those over new connections too, among themselves, up to TOGETHER: how much
            # later than the others they come is a late read, which holds its own token
            # (`ScopeFront._window_read_late`). A told window that does not see its
            # requests leave (a shared one) keeps its whole send lag besides: its
            # round trips, not its calls' durations, which hold the scopes' own Redis
            # trips (they varied by 0.18 s where round trips varied by 0.03, and every
            # shared window of 10 per second began that much later: 1.10-1.18x).
            trips = ledger.wire_trip_spread(new_up_to=TOGETHER)
            if trips is None:  # no pool told when its headers left
                trips = ledger.trip_spread()
        if sight.window_departures:
            quickest = ledger.quickest_trip()
            send_lag = min(send_lag, math.inf if quickest is None else quickest)
        arrival = self.arrival
        if sight.bucket_departures:
            arrival = max(0.0, arrival - self.warm_spread())
        if sight.wire and self.warm_fastest is not None:
            arrival = 0.0
        way_out = self.way_out_spread(counted=sight.wire or sight.window_departures)
        slack = max(self._wake + send_lag, arrival, way_out)
        if sight.windowed and not sight.answers_hold_their_own:
            slack = max(slack, ledger.spread() if trips is None else trips)
        return slack

    def way_out_spread(self, *, counted: bool) -> float:
        """How much later one request may reach the server than another that left the
        HTTP layer as it did (`wrote`): a margin, where nothing counts requests as they
        really reach the wire or leave (``counted``).

        A told local bucket does (`ScopeFront.wire_wait`), so it keeps none:
        kept, the spread was the largest ever seen, and one garbage collection
        of 30 ms while a request was on its way held every later request of a
        bucket of one 30 ms longer (1.47-1.50x in one real-time run in twenty).
        Nor does a told window that counts each request from when it leaves
        (`SlidingLog.left`): the way to the headers was before that. Kept,
        twenty requests waking together took up to 60 ms to get there (the
        process busy with the others), and every window of 20 per 0.4 s began
        that much later (200 calls 1.13-1.19x the fastest in real time, against
        a server in its own process; 1.08-1.11x without)."""
        if counted:
            return 0.0
        lowest, highest = self._writes
        return max(0.0, highest - lowest)

    def warm_spread(self) -> float:
        """How much the durations of calls that opened no connection have varied: the
        server's own time, with no connection's set-up in it."""
        fastest, slowest = self.warm_fastest, self.warm_slowest
        return 0.0 if fastest is None or slowest is None else slowest - fastest

    def warm_call(self, seconds: float) -> None:
        """A call whose requests opened no connection took ``seconds``."""
        fastest, slowest = self.warm_fastest, self.warm_slowest
        self.warm_fastest = seconds if fastest is None else min(fastest, seconds)
        self.warm_slowest = seconds if slowest is None else max(slowest, seconds)

    def woke(self, seconds: float) -> bool:
        """A call was woken ``seconds`` late (`ScopeFront.observe_wake_lag`); whether that
        is later than any before."""
        if seconds <= self._wake:
            return False
        self._wake = seconds
        return True

    def wrote(self, seconds: float) -> bool:
        """A request over an open connection got to its headers ``seconds`` after it was
        handed on (`ScopeFront.observe_write_lag`); whether the spread grew."""
        lowest, highest = self._writes
        self._writes = (min(lowest, seconds), max(highest, seconds))
        return not lowest <= seconds <= highest

    def new_burst(self) -> None:
        """A burst begins: its calls' quickest send is still to come."""
        self.quickest_send = math.inf

    def sent(self, seconds: float, since: float, *, departures_seen: bool) -> bool:
        """A call's first request left ``seconds`` after its admission, and ``since`` s
        after the latest burst began, if it is of it (`ScopeFront.observe_send_lag`);
        whether the send lag grew.

        ``departures_seen``: every request is seen leaving, so a tool's own set-up
        is accounted for as it leaves, and the lag is only how much later than the
        quickest a call got there (and a call of the burst, than the burst's
        quickest). Otherwise, the whole of it.
        """
        if departures_seen:
            least, most = self._sends
            self._sends = least, most = min(least, seconds), max(most, seconds)
            if since:
                self.quickest_send = min(self.quickest_send, seconds)
            lag = max(most - least, since - self.quickest_send if since else 0.0)
        else:
            lag = max(seconds, since)
        if lag <= self._send + CLOCK_NOISE:  # float noise is no lag
            return False
        self._send = lag
        return True

    def arrived_late(self, lag: float) -> bool:
        """A burst's first request reached the server up to ``lag`` s after the burst
        began; whether that is later than any before."""
        if lag <= self.arrival:
            return False
        self.arrival = lag
        return True

    def assume(self, burst: tuple[float, float]) -> bool:
        """A 429 made the worst case the case: the whole of ``burst``'s earliest answer,
        (began, first answer), was its first request arriving late
        (`ScopeFront._late_first_arrival`); whether that is later than any before."""
        if not self.arrived_late(burst[1] - burst[0]):
            return False
        self._assumed = burst
        return True

    def measure_assumed(self, fastest: float) -> bool:
        """A warm call, ``fastest`` the quickest, measures what a 429 made the slack assume
        (`assume`): the burst's first arrival was that much less late. Whether there
        was such an assumption."""
        assumed, self._assumed = self._assumed, None
        if assumed is None:
            return False
        self.arrival = max(0.0, assumed[1] - assumed[0] - fastest)
        return True
