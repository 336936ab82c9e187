"""What one process sent a scope's server, and when: the other side of every count.

A server's ``Remaining`` is its count as one request reached it. Reading it
(`fanout._front`) means knowing what this process had started by then, what
it started since, what other processes sharing the bucket started, which
requests really left (a call admitted at its token may set up, or wait for a
place on the wire, before its request goes), and which the server refused
(no token taken), and which are still out over new connections (a server
may read those late) or over reused ones. ``Outgoing`` keeps that, over the
last minute of bookings and the last second of departures, and answers the
sums the front asks.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import math
from typing import TYPE_CHECKING

import attrs
import trio

from ._learning import TOGETHER, SentAround
from ._starts import Starts

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

__all__ = ["ColdRequest", "Outgoing"]

_RECENT = 4096  # bookings remembered, to count what started since a request was sent
_RECENT_FOR = 60.0  # seconds a booking is remembered
_LEFT_FOR = 1.0  # seconds a departure, or another process's start, is remembered
_COLD_KEPT = 30.0  # seconds a request over a new connection is awaited (`cold_behind`)


@attrs.frozen
class ColdRequest:
    """A request that opened a connection, until its answer comes."""

    began: float  # when its connection began to open
    written: float  # when its headers were written
    due: float  # when its call's token was due (`CallContext.booked_by`)


@attrs.define(eq=False)
class Outgoing:
    """One scope's bookings, its requests' departures and what other processes started."""

    # Bookings by when they start, and the running total of their tokens.
    _booked: Starts = attrs.field(init=False, factory=lambda: Starts(_RECENT))
    _started: float = attrs.field(init=False, default=0.0)
    # What other processes sharing a bucket started in the last second (`others_started`).
    _others: collections.deque[tuple[float, float]] = attrs.field(
        init=False, factory=collections.deque
    )
    # When the calls of the requests waiting for a place on the wire took their tokens.
    _parked: list[float] = attrs.field(init=False, factory=list)
    # When the calls took their tokens whose first request has not reached the HTTP
    # layer yet (their tool's own set-up, `setting_up`). Kept sorted.
    _setting_up: list[float] = attrs.field(init=False, factory=list)
    # When this process's requests left, over the last second (`left`), and every one so far.
    _left: collections.deque[float] = attrs.field(init=False, factory=collections.deque)
    _left_total: int = attrs.field(init=False, default=0)
    # The requests that opened connections, until their answers come (`opened`).
    _cold: list[ColdRequest] = attrs.field(init=False, factory=list)
    # Requests over reused connections on the wire, and since when one has been unanswered.
    _warm_out: int = attrs.field(init=False, default=0)
    _warm_since: float = attrs.field(init=False, default=math.inf)

    @property
    def started(self) -> float:
        """The running total of tokens booked (less those given back or refused)."""
        return self._started

    # -- bookings -----------------------------------------------------------

    def booked(self, start: float, cost: float) -> None:
        """A booking of ``cost`` tokens starts at ``start``."""
        self._started += cost
        self._booked.add(start, cost)
        self._booked.forget_before(trio.current_time() - _RECENT_FOR)

    def unbooked(self, start: float, cost: float) -> None:
        """The booking starting at ``start`` was given back before it started."""
        if self._booked.discard(start, cost):
            self._started -= cost

    def moved(self, start: float, to: float, cost: float) -> None:
        """The booking starting at ``start`` starts at ``to`` instead (confirmed late, or
        moved on with the schedule)."""
        if start != to and self._booked.discard(start, cost):
            self._booked.add(to, cost)

    def forget_start(self, by: float) -> None:
        """Take the latest booking to start by ``by`` out of what learning counts as
        started: no start the server saw."""
        entry = self._booked.take_latest(by)
        if entry is not None:
            self._started -= entry[1]

    def refused(self, sent: float) -> None:
        """A refused request took no token of the server's: learning counts only admissions.

        Counted, a wave of 429s would read as requests the server's refill
        paid for, and "proves" a rate many times the true one.
        """
        self.forget_start(sent)
        # Nor among the requests that left (kept a second; counted only before that):
        # the latest departure by ``sent``, which the HTTP layer reads off the clock
        # after the departure was counted. Only on a mock clock do the two agree;
        # in real time the refused requests stayed counted, and 503s from a cap no
        # one told "proved" 52/s against 50/s, and drew a 429 (the 200-call row).
        departed = self._latest_departure(sent)
        if departed is not None:
            del self._left[departed]
            self._left_total -= 1
        elif self._left_total and sent <= trio.current_time() - _LEFT_FOR:
            self._left_total -= 1

    def _latest_departure(self, by: float) -> int | None:
        """The index in ``_left`` of the latest departure at or before ``by``, if any
        is kept (they are kept in order)."""
        for index in range(len(self._left) - 1, -1, -1):
            if self._left[index] <= by:
                return index
        return None

    def started_by(self, when: float) -> float:
        """The running total of tokens booked to start at or before ``when``."""
        return self._started - self._booked.cost_after(when)

    def sent_by(self, when: float) -> float:
        """Of `started_by`, those whose requests left: not still waiting for a place
        on the wire or for their tool to send (`parked_by`)."""
        return self.started_by(when) - self.parked_by(when)

    def started_between(self, since: float, now: float) -> float:
        """Tokens of bookings that started after the request sent at ``since``, up to ``now``.

        The request itself is not among them: the server's count already
        took it. Bookings still in the future are not counted either: a sync
        voids them, and they book again against the server's count. Where
        the HTTP layer tells when requests left, as many as left after it, if
        more: calls booked together with it whose requests left a few ms
        later (a busy process) were counted by the server after it, and
        read as booked before it, a count at 0.81 s took three of them for
        tokens still in the bucket (a 429 against 10/s, burst 5).
        """
        after = math.nextafter(since, math.inf)  # ``since`` itself is the request's own
        return max(self._booked.cost_within(after, now), self.left_within(after, now))

    def sent_within(self, since: float, sent: float) -> float:
        """Tokens of bookings that started from ``since`` to ``sent``, both included."""
        return self._booked.cost_within(since, sent)

    def started_within(self, since: float, until: float) -> list[tuple[float, float]]:
        """The bookings (start, cost) that started from ``since`` to ``until``, both included."""
        return self._booked.within(since, until)

    def out_before(self, sent: float, on_the_wire: int) -> list[float]:
        """When the requests still on the wire that left before ``sent`` were booked to
        start, of ``on_the_wire`` out now: the latest bookings before it, as many as
        are out, less those that left after it (a request's answer comes about in
        the order sent)."""
        now = trio.current_time()
        out = on_the_wire - self._booked.count_within(math.nextafter(sent, math.inf), now)
        if out <= 0:
            return []
        return self._booked.latest_before(sent, out)

    def around(self, sent: float, now: float, *, together: float, refused: bool) -> SentAround:
        """What this process had sent around its request sent at ``sent``, as its answer
        is read ``now`` (`RateLearner.from_headers`). ``together``: how much earlier
        than it a request may have left and still reached the server after it
        (``TOGETHER``, or how much slower one may be on its way in than another).
        ``refused``: the answer is a 429's, so its request took no token, and the count
        it states is the server's after those before it. (Counted as admitted, a
        429's ``Remaining: 0`` measured a refill of 10.6/s against 10/s, burst 2, the
        bound the next decrease lands on.)
        """
        own = 1.0 if refused else 0.0
        # Calls admitted by then and still waiting for a place had not left, by then or
        # ``together`` before it.
        started = self.sent_by(sent)
        before = self.sent_by(sent - together)
        # Booked with it, or (where the HTTP layer tells) left with it. Calls booked
        # together whose requests left 7 ms later were counted one by one, each as the
        # only one, and three such answers measured 9.8/s at 1 s where 7.4/s was proven
        # (a 429 against 10/s, burst 5, in real time).
        left_with = self.left_within(sent - together, sent)
        alongside = max(0.0, started - before - 1.0, left_with - 1.0)
        after = self.started_between(sent, now) - self.parked_by(now) + self.parked_by(sent)
        # Only this process's own departures: the others' are known by their bookings,
        # not by when their requests left. Counted among what left, two probes 5 ms
        # apart with three of the others' between "proved" 91.5/s against 20/s (their
        # new connections reached the server in another order), and every process
        # sharing it drew a 429, twelve in all (real time, four processes).
        left = self.left_by(sent)
        return SentAround(
            started=started - own,
            alongside=alongside,
            tied=max(0.0, started - self.sent_by(sent - TOGETHER) - 1.0),
            others_with=min(alongside, self.others_since(sent - together, until=sent)),
            after=max(0.0, after),
            after_with=self.started_between(sent, min(now, sent + together)),
            left=None if left is None else left - own,
            left_with=max(0.0, left_with - 1.0),
        )

    def oldest_counted(self, sent: float, counted: float) -> float:
        """When the earliest of the ``counted`` requests a window held at the request sent at
        ``sent`` (itself among them) was sent, all taken for ours, which reaches back the
        furthest; -inf where fewer are kept."""
        count = round(counted)
        starts = self._booked.latest_before(math.nextafter(sent, math.inf), count)
        return starts[0] if count >= 1 and len(starts) == count else -math.inf

    # -- other processes ----------------------------------------------------

    def others_started(self, starts: Iterable[tuple[float, float]]) -> None:
        """Other processes sharing the bucket started these (start, cost): counted as if
        started here, and kept a second (`others_since`)."""
        for start, cost in starts:
            self.booked(start, cost)
            self._others.append((start, cost))
        horizon = trio.current_time() - _LEFT_FOR
        while self._others and self._others[0][0] < horizon:
            self._others.popleft()

    def others_since(self, since: float, until: float = math.inf) -> float:
        """Tokens other processes started after ``since``, up to ``until`` (as far as
        last counted)."""
        return sum(cost for start, cost in self._others if since < start <= until)

    def others_seen(self) -> bool:
        """Whether other processes started anything in the last second counted."""
        return bool(self._others)

    # -- on the way out -----------------------------------------------------

    def setting_up(self, admitted_at: float) -> None:
        """A call admitted at ``admitted_at`` runs its tool: until its first request
        reaches the HTTP layer, its token is taken and the server has not counted it
        (`parked_by`). Kept sorted: thousands of calls may be setting up at once."""
        bisect.insort(self._setting_up, admitted_at)

    def set_up(self, admitted_at: float) -> bool:
        """One call admitted at ``admitted_at`` is done setting up, if one was: True then.

        Calls admitted at one instant are alike here; a later request of one,
        while another is still setting up, is taken for the other's first
        (which then counts as sent at once): no worse than before they were told.
        """
        i = bisect.bisect_left(self._setting_up, admitted_at)
        if i < len(self._setting_up) and self._setting_up[i] == admitted_at:
            del self._setting_up[i]
            return True
        return False

    @contextlib.contextmanager
    def parked(self, admitted_at: float) -> Iterator[None]:
        """A request whose call took its token at ``admitted_at`` waits for its place on
        the wire meanwhile."""
        self._parked.append(admitted_at)
        try:
            yield
        finally:
            self._parked.remove(admitted_at)

    def parked_by(self, when: float) -> float:
        """Requests whose calls took tokens by ``when`` and that have not left: waiting for
        a place on the wire, or not yet sent by their tool (`setting_up`)."""
        parked = sum(1 for admitted in self._parked if admitted <= when)
        return float(parked + bisect.bisect_right(self._setting_up, when))

    def sent_late(self, admitted_at: float, now: float) -> None:
        """A call admitted at ``admitted_at`` sends its request only ``now``, after a
        wait for a place under a learned cap, or its tool's own set-up: what counts
        what started since a response's request was sent counts it from now (as a
        booking confirmed late is). Counted from its admission, 17 calls admitted at
        once and sent six at a time measured a refill of 20/s against 2/s; and a
        sibling's count, read as including a request that left 70 ms after its
        admission, raised a told bucket over the server's."""
        entry = self._booked.take_latest(admitted_at)
        if entry is not None:
            self._booked.add(now, entry[1])

    def left(self, now: float) -> None:
        """A request left now, as the HTTP layer tells (only learning reads it)."""
        self._left.append(now)
        self._left_total += 1
        self.sent_lately()  # drops what is over a second old

    def left_within(self, since: float, until: float) -> float:
        """Requests that left from ``since`` to ``until``, both included, as far as the
        HTTP layer tells (`left`; kept a second, and only while learning)."""
        return float(sum(1 for t in self._left if since <= t <= until))

    def left_by(self, when: float) -> float | None:
        """The running total of requests that left by ``when``, where the HTTP layer
        tells; None where it told of none, or ``when`` is older than the second kept."""
        self.sent_lately()
        if not self._left_total or when <= trio.current_time() - _LEFT_FOR:
            return None
        return float(self._left_total - sum(1 for t in self._left if t > when))

    def sent_lately(self) -> int:
        """Requests of this process that left in the last second, as far as the HTTP
        layer tells of them (`left`)."""
        horizon = trio.current_time() - _LEFT_FOR
        while self._left and self._left[0] <= horizon:
            self._left.popleft()
        return len(self._left)

    # -- over new connections, and reused ones --------------------------------

    def opened(self, began: float, written: float, due: float) -> None:
        """A request whose connection began to open at ``began`` had its headers written at
        ``written``; its call's token was due by ``due``. Kept until its answer comes
        (`cold_answered`)."""
        self._forget_cold(written)
        self._cold.append(ColdRequest(began, written, due))

    def cold_answered(self, sent: float, connecting: float | None) -> None:
        """A request over a new connection is answered: of those whose connection began at
        ``connecting`` (all, where the pool did not say), the one written nearest
        ``sent`` is out no longer."""
        if not self._cold:
            return
        mine = [cold for cold in self._cold if cold.began == connecting] or self._cold
        self._cold.remove(min(mine, key=lambda cold: abs(cold.written - sent)))

    def cold_unanswered(self, now: float) -> list[ColdRequest]:
        """The requests over new connections still waiting for their answers."""
        self._forget_cold(now)
        return list(self._cold)

    def cold_behind(self, sent: float, horizon: float, set_up: float) -> float:
        """Requests that opened connections and left more than ``horizon`` s before the
        one sent at ``sent``, yet late enough to have reached the server after it: a
        new connection may be read as late as ``set_up``, the set-up the answers show
        (`Arrivals.set_up`), and these are not answered yet.

        How much later one request may arrive than another is otherwise read from
        the answers over warm connections. Against a server reading new connections
        100 ms late, six requests over new ones were overtaken by one sent 90 ms
        after them over a warm one; its count, taken as theirs too, raised a learned
        bucket by seven tokens, and two of the five requests sent on it were
        refused (then, after the wait, read as a window: 2.8x the fastest).
        """
        since = sent - horizon
        return float(sum(1 for c in self._cold if c.written < since and c.written + set_up > sent))

    def _forget_cold(self, now: float) -> None:
        """Forget the requests over new connections no answer came for in `_COLD_KEPT`:
        they failed, and arrived long ago or never."""
        if self._cold and self._cold[0].written < now - _COLD_KEPT:
            self._cold = [c for c in self._cold if c.written >= now - _COLD_KEPT]

    def warm_left(self, now: float) -> None:
        """A request over a reused connection left ``now``."""
        if self._warm_out == 0:
            self._warm_since = now
        self._warm_out += 1

    def warm_back(self, now: float) -> None:
        """A request `warm_left` told of is answered, or failed on the wire, ``now``."""
        self._warm_out = max(0, self._warm_out - 1)
        # Whether the oldest came back is not known: count those left from now, the cautious side.
        self._warm_since = now

    def warm_out_since(self) -> float | None:
        """Since when a request over a reused connection has been on the wire unanswered
        (None: none is)."""
        return self._warm_since if self._warm_out else None
