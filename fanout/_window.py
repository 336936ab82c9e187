"""A sliding log: at most ``limit`` tokens in any ``window`` seconds, on trio's clock.

Why a log, not a bucket: an API that allows "N per W seconds" counts in
windows (fixed, from a first request or the calendar, or sliding). A token
bucket of burst N refilled at N/W admits N at once and then one more every
W/N s, and those land inside the window the burst already spent: 429s. A log
gives each token back ``window`` seconds after it was spent, so no interval of
length ``window`` ever holds more than ``limit`` starts. That is safe against
a fixed window (each of its windows is such an interval), a sliding log, and a
token bucket of burst N and rate N/W alike, and for a batch that starts at
once it finishes as early as any of them allows.

``slack`` widens the window by the spread of arrival times: requests admitted
``window + slack`` apart reach the server at least ``window`` apart.

Bookings behave as in ``_bucket``: a booking is an entry in the log at its
start (perhaps in the future), found by ``earliest_start``; when the server
says otherwise (a 429, a block, a count above the log's) the log starts a new
epoch, bookings not yet confirmed are void, and their holders book again. (A
booking already due but not yet confirmed is void too: its holder will find
the new epoch and book again, and kept, it held a place no one used.) Tokens the
server counted and the log did not (another client's, or a drained window)
are *phantom* entries: they hold capacity until they leave, and no refund
touches them.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
from typing import TYPE_CHECKING

import attrs
import trio

from ._bucket import Booking, BucketStatistics, Epochs, ServerCount, check_cost
from ._exceptions import ConfigurationError
from ._learning import TOGETHER, whole_seconds
from ._window_phase import WindowPhase

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Arrivals", "SlidingLog", "earliest_start", "past_reset"]

_EPS = 1e-9

_BOOKED, _ANSWERED, _PHANTOM, _STARTED, _LEFT, _DELAYED, _RELEASED = 0, 1, 2, 3, 4, 5, 6
# (start, cost, kind, held until at least): a booking, a booking whose answer
# came, tokens the server counted and the log did not, a booking its holder
# confirmed (its request went), one whose request left (`SlidingLog.left`), one
# whose request is on its way but not out yet (`SlidingLog.delayed`), or one
# the server showed it counts no longer (held until then exactly: `SlidingLog.sync`).
Entry = tuple[float, float, int, float]
# A booking not confirmed yet: (start, cost). Kept apart from the entries, as it holds its
# tokens exactly a window (and the slack) from its start: see `SlidingLog._slot`.
Reservation = tuple[float, float]
# What the server counts already, or will as it arrives: no request leaving may overlap it.
_GONE = (_ANSWERED, _PHANTOM, _LEFT, _RELEASED)


def _booked(reservation: Reservation) -> Entry:
    return (reservation[0], reservation[1], _BOOKED, -math.inf)


def _end(entry: Entry, span: float) -> float:
    if entry[2] == _RELEASED:
        return entry[3]
    return max(entry[0] + span, entry[3])


def _arrival(entry: Entry) -> float:
    """When an answered request reached the server, as its entry holds it (a window and
    the way in later): the order the server forgets them in. Not their booked starts,
    which a tool's set-up reorders: by those, an answer's count freed a request that
    left 0.3 s after its booking, while the server had forgotten one that left before
    it, and the next request was refused."""
    return entry[3]


def past_reset(reset: float) -> float:
    """When to send after a ``reset`` (or a wait) that says when the server counts anew:
    a moment after it (``TOGETHER``), unless it is whole seconds, rounded up past the end.

    Sent at the very end the server names, a request reached a server that
    counts that instant in the old window, and was refused; on a learned
    window each such 429 lengthened it (2 per 2 s stating its reset to the
    millisecond: ten 429s, and the window grew from 1.9 s to 490 s). An
    epoch in whole seconds, read against a finer clock, is not whole here: it
    may name the end exactly, where the window's end is a whole second.
    """
    return reset if whole_seconds(reset) else reset + TOGETHER


def earliest_start(
    entries: Sequence[Entry], cost: float, *, earliest: float, limit: float, span: float
) -> float:
    """The first time ``>= earliest`` at which ``cost`` more fits the log.

    ``entries`` is sorted by start; an entry holds its cost from its start
    until ``span`` later (or until it is held, if later). A start ``t`` fits
    when every instant ``τ`` in ``[t, t + span)`` holds at most ``limit -
    cost``; the load only rises where an entry starts, so it is checked at
    ``t`` and at those starts. The answer is ``earliest`` or the moment some
    entry leaves (only then can the load fall).

    A start that fails is passed over with every later one up to the
    instant that failed it (each of them holds that instant too): the next
    to try is the first moment an entry leaves after it. (Tried one by one,
    300 bookings into a log of 2 per 20 ms took 215 ms of the loop; now
    114.)
    """
    starts = [entry[0] for entry in entries]
    ends = sorted((_end(entry, span), entry[1]) for entry in entries)
    ending = [end for end, _ in ends]
    started, ended = [0.0], [0.0]
    for entry, (_, cost_ended) in zip(entries, ends, strict=True):
        started.append(started[-1] + entry[1])
        ended.append(ended[-1] + cost_ended)

    def load(at: float) -> float:
        # Whatever has ended had started: the two running sums leave what holds now.
        return started[bisect.bisect_right(starts, at)] - ended[bisect.bisect_right(ending, at)]

    room = limit - cost + _EPS
    full = [at for at in starts if load(at) > room]  # starts no booking may overlap
    t = earliest
    while True:
        i = bisect.bisect_left(full, t)
        if i < len(full) and full[i] < t + span:
            # Every start up to a full one fails, and so on along full starts closer
            # together than a span: the next to try is past the last of them.
            while i + 1 < len(full) and full[i + 1] - full[i] < span:
                i += 1
            failed = full[i]
        elif load(t) > room:
            failed = t
        else:
            return t
        # Something holds where it failed, and leaves later: the search always ends.
        t = ending[bisect.bisect_right(ending, failed)]


def _first_fit(
    entries: Sequence[Entry], cost: float, *, earliest: float, limit: float, span: float
) -> float:
    """`earliest_start`, but ``earliest`` at once where all that holds past it leaves room:
    what most bookings find. Searched in full every time, booking 1,000 calls in a
    window of 1,000 took 0.32 s of the loop (0.13 s now), and each request's check
    as it leaves (`SlidingLog.departure_wait`) as long again."""
    if sum(e[1] for e in entries if _end(e, span) > earliest) <= limit - cost + _EPS:
        return earliest
    return earliest_start(entries, cost, earliest=earliest, limit=limit, span=span)


@attrs.define
class Arrivals:
    """By when a request reached the server, judged from how it went and when its answer came.

    The server counts a request from its arrival, which the client never
    sees. A request over a connection already open (*warm*) reaches the
    server as it leaves, give or take the log's slack (which keeps how much
    durations vary, `Lags.margin`): a server whose answers
    jitter took it in then, and only its answer is late, so its answer says
    no more of its arrival. Taking the answer, less the quickest round trip
    plus how much trips vary, for the arrival held each token for the
    spread of answer times a second time, and smeared each window's starts
    over it.

    A request that opened a connection (*cold*) may have reached the server
    late by the connection's set-up (a TLS handshake, a server slow to
    accept), which looks just like a slower answer. The set-up is taken to
    cost every new connection about alike, as a burst's earliest answer is
    taken for all of it in the bucket's slack: it is at most the quickest
    round trip of any cold request, less the quickest warm one (the
    server's own time and the way back, which the set-up did not add to),
    or all of it before any warm round trip. A cold request arrived no
    later than that after it left, nor after its answer.

    ``opened`` None: the transport cannot tell; a request sent before the
    first answer is taken for cold (no connection was free then), any later
    one for warm.
    """

    _first_answer: float = attrs.field(default=math.inf, alias="_first_answer")
    _cold: float = attrs.field(default=math.inf, alias="_cold")  # quickest cold round trip
    _warm: float = attrs.field(default=math.inf, alias="_warm")  # quickest warm round trip

    def arrived_by(
        self, sent: float, answered: float, *, opened: bool | None = None,
        since: float | None = None,
    ) -> float:  # fmt: skip
        """The latest the request sent at ``sent`` and answered at ``answered`` arrived;
        ``since``: when the connection it opened began to open, if known and sooner (a
        request held after that, as it left, was no later for the server)."""
        if opened is None:
            opened = sent < self._first_answer
        self._first_answer = min(self._first_answer, answered)
        if not opened:
            self._warm = min(self._warm, answered - sent)
            return sent
        began = sent if since is None else min(sent, since)
        self._cold = min(self._cold, answered - began)
        # At most this trip (the quickest cold one is no slower): never after its answer.
        return max(sent, began + max(0.0, self.set_up))

    @property
    def set_up(self) -> float:
        """How much later than it left a cold request may have reached the server: the
        quickest cold round trip, less the quickest warm one once one is known."""
        return self._cold - self._warm if math.isfinite(self._warm) else self._cold

    @property
    def latest_read(self) -> float:
        """How much later than its connection began a cold request may reach the server:
        ``set_up`` (infinite before any cold round trip), and once a warm round trip
        has made it a difference, up to ``TOGETHER`` more (a server slow to take in
        connections is not always as slow; more than that is a request held after its
        connection opened, not read later).

        How unevenly a server takes in new connections no round trip shows before it
        happens. Taken as how much recent cold round trips varied, the first answer's
        one trip showed none, and a request over a new connection read 0.9 ms later
        than the first was followed, a told window of one per 20 ms after it, by one
        over an open connection: a 429 and a second's wait, in 10 of 40 seeded turns
        on a mock clock whose server read new connections 0-1 ms late. Before a warm
        round trip, ``set_up`` is the whole of the quickest cold one, the server's own
        time with it, which holds those few ms: added, they held the first requests of
        a window a moment past their own answers, and those holds outlived the warm
        answer that showed the set-up cost nothing (`SlidingLog._arrived_sooner`).
        """
        return self.set_up + (TOGETHER if math.isfinite(self._warm) else 0.0)

    @property
    def measured_set_up(self) -> float:
        """``set_up`` where both kinds of round trip were seen; 0 until then."""
        both = math.isfinite(self._warm) and math.isfinite(self._cold)
        return max(0.0, self.set_up) if both else 0.0


@attrs.define
class SlidingLog:
    """``limit`` tokens in any ``window`` seconds; the same verbs as ``TokenBucket``.

    ``epochs`` are the bucket's when a scope turns its bucket into a log, so
    no booking of the bucket passes for one of the log. ``told``: its limit and
    window are the server's as the user told them, so that a reopening shown
    places every window after it (`fanout._window_phase`).
    """

    limit: float
    window: float
    slack: float = attrs.field(default=0.0)
    epochs: Epochs = attrs.field(factory=Epochs)
    told: bool = attrs.field(default=False, kw_only=True)
    # Where the server's windows fall, once an answer showed one reopen (`_place_windows`).
    _phase: WindowPhase | None = attrs.field(init=False, default=None)
    _entries: list[Entry] = attrs.field(init=False, factory=list)  # all but bookings
    _bookings: list[Reservation] = attrs.field(init=False, factory=list)
    # Costs of at least this fit nowhere between the earliest start and the latest (`_slot`).
    _packed_from: float = attrs.field(init=False, default=math.inf)
    _longest: float = attrs.field(init=False, default=0.0)  # the slowest answer yet
    _blocked_until: float = attrs.field(init=False, default=-math.inf)
    _reserved: int = attrs.field(init=False, default=0)
    _refused: int = attrs.field(init=False, default=0)
    _refunded: int = attrs.field(init=False, default=0)
    _drained: int = attrs.field(init=False, default=0)
    # Requests answered over new connections, each held from the latest its set-up let
    # it arrive (`answered`): (sent, held until before, entry as answered).
    _answered_cold: collections.deque[tuple[float, float, Entry]] = attrs.field(
        init=False, factory=collections.deque
    )
    _set_up: float = attrs.field(init=False, default=math.inf)

    def __attrs_post_init__(self) -> None:
        if not (self.limit >= 1 and math.isfinite(self.limit)):
            raise ConfigurationError(f"a window's limit must be at least 1, not {self.limit!r}")
        if not (self.window > 0 and math.isfinite(self.window)):
            raise ConfigurationError(f"a window must be a positive number, not {self.window!r}")

    @property
    def rate(self) -> float:
        """The long-run rate the window allows."""
        return self.limit / self.window

    @property
    def burst(self) -> float:
        return self.limit

    @property
    def blocked_until(self) -> float:
        return self._blocked_until

    # -- booking -------------------------------------------------------------

    def wait_for(self, cost: float = 1.0) -> float:
        """Seconds until ``cost`` tokens could be booked to start, consuming nothing."""
        self._check_cost(cost)
        now = trio.current_time()
        return self._slot(cost, now) - now

    def reserve(self, cost: float = 1.0, *, max_wait: float = math.inf) -> Booking | None:
        """Book ``cost`` tokens; the booking, or None (nothing consumed) past ``max_wait``."""
        self._check_cost(cost)
        now = trio.current_time()
        self._forget(now)
        start = self._slot(cost, now)
        if start - now > max_wait:
            self._refused += 1
            return None
        self._reserved += 1
        # At or after every start, no cost of this or more fit anywhere before it.
        self._packed_from = cost if start >= self._last_start() else math.inf
        bisect.insort(self._bookings, (start, cost))
        return Booking(start, start - now, cost, self.epochs.current)

    def confirm(self, booking: Booking) -> bool:
        """Whether ``booking`` may start now: nothing voided or dropped it since it was made,
        and it still fits beside any request on its way (``delayed``).

        A call may start before its booking is due, as long before as its tool
        takes to send (`ScopeFront.admission_lead`): its entry starts where it was
        booked, and its call knows it by then (``booked_by``)."""
        now = trio.current_time()
        held = booking.epoch == self.epochs.current and now >= self._blocked_until
        reservation = (booking.start, booking.cost)
        if not held or not self._unbook(reservation):
            return False
        due = max(now, booking.start)
        # A request still on its way may hold its token longer than it was booked. (Its
        # booking is out of the log meanwhile, so the log may fit more than it did.)
        if (
            any(e[2] == _DELAYED for e in self._entries)
            and self._slot(booking.cost, now, anywhere=True, earliest=due) > due
        ):
            self._packed_from = math.inf
            return False
        # Started: no void takes it back now.
        bisect.insort(self._entries, (booking.start, booking.cost, _STARTED, -math.inf))
        return True

    def refund(self, booking: Booking) -> None:
        """Give back a booking whose holder gave up before starting."""
        if booking.epoch == self.epochs.current and self._unbook((booking.start, booking.cost)):
            self._packed_from = math.inf
            self._refunded += 1

    def set_slack(self, slack: float) -> None:
        """Use ``slack`` from now on; a wider window moves the bookings ahead later."""
        if not (slack >= 0 and math.isfinite(slack)):
            raise ConfigurationError(f"slack must be a finite number >= 0, not {slack!r}")
        wider = slack > self.slack
        if slack != self.slack:
            self._packed_from = math.inf
        self.slack = slack
        if wider and self._ahead(trio.current_time()):
            self._drop_bookings()

    # -- what the server said ----------------------------------------------

    def lengthen(self, window: float) -> None:
        """Count in a longer ``window`` from now on (one learned too short).

        What started holds its tokens the longer window (the server counts it
        that long), and bookings not yet due book again against that.
        """
        if not (window > 0 and math.isfinite(window)):
            raise ConfigurationError(f"a window must be a positive number, not {window!r}")
        if window <= self.window:
            return
        self.window = window
        self._phase = None
        now = trio.current_time()
        if self._ahead(now):
            self._void()

    def set_limits(self, rate: float | None, burst: float, *, tokens: float | None = None) -> None:
        """A new ``limit`` (the burst); the window stays, so ``rate`` is not read.

        ``tokens`` lowers what may start now to what the server said remains.
        """
        del rate
        now = trio.current_time()
        if burst != self.limit:
            if not (burst >= 1 and math.isfinite(burst)):
                raise ConfigurationError(f"a window's limit must be at least 1, not {burst!r}")
            self.limit = burst
            self._packed_from = math.inf
            self._phase = None
            if self._ahead(now):
                self._void()
        if tokens is not None and math.isfinite(tokens):
            self._hold(now, self.limit - tokens - self._load(now), returns=now + self._span)

    def sync(self, count: ServerCount) -> bool:
        """The server said ``count.remaining`` were left when a request sent
        ``count.elapsed`` s ago arrived.

        What it counted beyond the entries of the log that were in it then is
        someone else's: held as phantoms until they surely left, a window from
        now (it counted them by now). (Entries that left the log since, while
        the answer travelled, were counted too: the log keeps them a window,
        and as long as the slowest answer yet, longer than they hold tokens,
        to tell.) Later
        starts (``started_since``) are in the log already; requests it may not
        have counted yet (``unsure``) are not taken off, as they would be from
        a bucket: the log keeps them anyway.

        A count of this log's limit may also show the server holding less
        than the log: it forgot tokens the log still holds
        (`_release_forgotten`), or says by its ``Reset`` that one comes back
        before the log would give any (`_release_by_reset`). Both free them,
        and waiting calls book again. That is how a fixed window keyed by the
        clock, met partway through, is counted in its own windows: counted
        from our first burst, 20 per 2 s met 1.2 s in sent each wave up to a
        window late (1.19 times the minimum). True when the log changed.
        """
        remaining, elapsed = count.remaining, count.elapsed
        if not math.isfinite(remaining):
            return False
        now = trio.current_time()
        # Ours that started as late as TOGETHER after it may have reached the server first
        # (and ``counted_by - elapsed`` can fall short of the request's own start): taken
        # for someone else's, such a request left a phantom a window long, and the last
        # call of a capped log of 5 per second went a window late in 1 run of 12. So may
        # ours that left the log after it was sent: it arrived then or later.
        sent = count.counted_by(now) - max(0.0, elapsed)
        ours = sum(entry[1] for entry in self._live_between(sent, sent + TOGETHER))
        if self._hold(now, self.limit - remaining - ours, returns=now + self.window):
            return True
        if not count.of_limit(self.limit):
            return False
        forgotten = self._release_forgotten(sent, remaining, now, late=count.late)
        released = bool(forgotten)
        if forgotten and self.told:
            released |= self._place_windows(sent, forgotten, late=count.late)
        if count.reset_after is not None:
            until = now + past_reset(count.reset_after)
            released |= self._release_by_reset(sent, until, lead=count.reset_lead)
        if released:
            self._void()
        return released

    def _release_forgotten(
        self, sent: float, remaining: float, now: float, *, late: float
    ) -> list[Entry]:
        """Free, now, what the server counted once and no longer does.

        Surely counted before the request sent at ``sent`` were the entries
        answered that arrived by then, less how much later one request may
        reach the server than another (``late``); the server counted that request too,
        and ``remaining`` (floored: it may hold more) leaves at most ``limit -
        remaining`` counted in all. Fewer than the log holds of those were
        forgotten: a fixed window ended (all of them, the oldest first), or a
        bucket refilled faster than the log allows. Requests sent with it
        are left out: the server may have counted them after it (read as
        forgotten, the first answer to a burst of 20 said 19 remained). Returns
        the entries it freed sooner.
        """
        span = self._span
        surely = [
            e for e in self._entries
            if e[2] == _ANSWERED and e[0] <= sent < _end(e, span)
            and e[3] - self.window + max(TOGETHER, late) <= sent
        ]  # fmt: skip
        forgotten = sum(e[1] for e in surely) + 1.0 - (self.limit - remaining)
        released = []
        for entry in sorted(surely, key=_arrival):  # the first to arrive first
            if entry[1] > forgotten + _EPS:
                break
            forgotten -= entry[1]
            if self._release(entry, now):
                released.append(entry)
        return released

    def _place_windows(self, sent: float, forgotten: list[Entry], *, late: float) -> bool:
        """The server forgot ``forgotten`` by the time it counted the request sent at
        ``sent``, before a window from their arrivals: a window of theirs ended in
        between. Where that places the server's windows (`fanout._window_phase`), each
        answered request holds its token until its window surely ended, not a window
        from when it arrived; True if one comes back sooner. (Each reopening of 20 per
        2 s keyed by the clock was led by one request whose count showed it, and the
        rest went a round trip behind, in every window.)"""
        lead = self._latest(sent, (_ANSWERED,))
        arrived = sent + max(late, TOGETHER)
        if lead is not None:
            arrived = max(arrived, lead[3] - self.window)
        phase = WindowPhase.shown(
            counted=[e[0] - TOGETHER - self.slack for e in forgotten], arrived=arrived,
            window=self.window, share=sum(e[1] for e in forgotten) / self.limit,
        )  # fmt: skip
        if phase is None or (self._phase is not None and self._phase.narrower(phase)):
            return False
        self._phase = phase
        answered = [e for e in self._entries if e[2] == _ANSWERED]
        return any([self._held_to_its_window(entry) for entry in answered])

    def _held_to_its_window(self, entry: Entry) -> bool:
        """``entry`` (answered) holds its token until its window surely ended, if the
        windows are placed and that is sooner; True if it is."""
        if self._phase is None:
            return False
        arrived = entry[3] - self.window  # the latest it can have reached the server
        return self._release(entry, self._phase.end_of(arrived) + TOGETHER)

    def _release_by_reset(self, sent: float, until: float, *, lead: float = 0.0) -> bool:
        """By ``until`` (a ``Reset``), at least one token the server counted is back:
        taken where it comes back ``lead`` s or more sooner than the log would give it.

        The log holds every entry it counted (the request's own, answered, at
        least) past then: the oldest ends then instead. Phantoms are among
        them, one token each (what the server counted before the log knew of
        it is older than what the log sent since): left out, each answer freed
        the log's newest request instead, and the phantoms all left together
        a window on. A bucket of 9 at 4/s whose ``Reset`` names its next token,
        learned as a log of 9 per 2.1 s, sent eight at once then, all refused.
        One answer after another says so of the same tokens: once one entry
        ends by then (or ``TOGETHER`` after: an epoch read against the server's
        clock moves by a millisecond from one answer to the next, and a burst's
        answers freed two tokens for one, two 429s), the rest hold. The request
        that takes its place shows by its count what else the server forgot
        (`_release_forgotten`).

        However soon its request arrived: a window that began with it ends no
        sooner. A reset that may have been rounded down (`ScopeFront._reset_lead`)
        names a time before such a window's end, and a request sent then was
        refused.
        """
        span = self._span
        counted = [
            e for e in self._entries
            if e[2] in (_ANSWERED, _RELEASED, _PHANTOM) and e[0] <= sent < _end(e, span)
        ]  # fmt: skip
        if any(_end(e, span) <= until + TOGETHER for e in counted):
            return False
        oldest = next((e for e in counted if e[2] != _RELEASED), None)
        if oldest is None:
            return False
        if oldest[2] == _ANSWERED:
            oldest = min((e for e in counted if e[2] == _ANSWERED), key=_arrival)
        if oldest[0] + span < until + lead:
            return False
        # A phantom stands for as many requests as it holds tokens: one of them leaves.
        return self._release(oldest, until, tokens=1.0 if oldest[2] == _PHANTOM else oldest[1])

    def _release(self, entry: Entry, at: float, *, tokens: float | None = None) -> bool:
        """``entry`` holds its tokens (or ``tokens`` of them, the rest as before) until
        ``at`` (if sooner), and not a moment longer. True if they come back sooner: an
        entry that already left by ``at`` changes nothing, and no one need book again.
        (Read as a change, most answers to a told log of 20 per 0.4 s woke every call
        waiting to book again: 31 times in 200 calls.)"""
        sooner = at < _end(entry, self._span) - _EPS
        self._entries.remove(entry)
        if tokens is not None and entry[1] > tokens + _EPS:
            bisect.insort(self._entries, (entry[0], entry[1] - tokens, *entry[2:]))
        kept = entry[1] if tokens is None else min(tokens, entry[1])
        released = (entry[0], kept, _RELEASED, min(at, _end(entry, self._span)))
        bisect.insort(self._entries, released)
        if sooner:
            self._packed_from = math.inf
        return sooner

    def answered(
        self,
        sent: float,
        arrived_by: float,
        *,
        booked_by: float | None = None,
        set_up: float = math.inf,
        way: float | None = None,
    ) -> None:
        """A request sent at ``sent`` reached the server by ``arrived_by``.

        Its booking (the one due by ``booked_by``, for a call's first request;
        else the latest not yet answered that started by ``sent``) is held until
        a window after that, if that is later than its booked
        start allowed: a request that left late (a busy process) or that the
        server took in late (a cold connection, a busy server) holds its token
        as long as the server does. One known to have arrived only by when it
        left (a warm connection) may have reached the server as late as the
        slack allows for, so it holds the slack more (or ``way``, if more: how
        much later than it left its round trip shows it may have arrived); one
        whose arrival is bounded by its answer does not. Bookings ahead that
        this overlaps book again.

        ``set_up``: how much later than it left a request over a new connection
        may have arrived (`Arrivals.set_up`). Before any answer over a warm one,
        that is its whole round trip; once it is less, the requests answered
        over new connections are held from the sooner arrival (`_arrived_sooner`).
        """
        now = trio.current_time()
        self._longest = max(self._longest, now - sent)
        entry = self._sent_by(sent) if booked_by is None else self._confirmed_by(booked_by)
        if entry is not None:
            way = max(self.slack, way or 0.0) if arrived_by <= sent else 0.0
            # It reached the server no sooner than it left (`left`), whatever its answer says.
            held = self._hold_entry(entry, _ANSWERED, arrived_by + self.window + way, now)
            if self._held_to_its_window(held):
                # Holding it a window from its arrival may have dropped the bookings
                # behind it, whose holders would find so only when due: they wake now.
                self._void()
            if arrived_by > sent:
                while self._answered_cold and _end(self._answered_cold[0][2], self._span) <= now:
                    self._answered_cold.popleft()  # the server forgot it
                self._answered_cold.append((sent, entry[3], held))
        if set_up < self._set_up:
            self._set_up = set_up
            self._arrived_sooner(now)

    def _arrived_sooner(self, now: float) -> None:
        """The requests answered over new connections reached the server no later than
        the set-up now known after they left: each holds its token a window from then.

        Before any request over a warm connection was answered, one that opened its
        own was held from its answer: with the answers 0.4 s away and a cap of four,
        the first four held their tokens until 1.4 s against ten per second, and
        every window after started 0.4 s late (1.45x the fastest; aiometer 1.39x).
        Bookings ahead book again, sooner.
        """
        sooner, kept = False, collections.deque[tuple[float, float, Entry]]()
        for sent, before, entry in self._answered_cold:
            at = bisect.bisect_left(self._entries, entry)
            if at == len(self._entries) or self._entries[at] != entry:
                continue  # released, or gone: nothing of it to hold
            way = self.slack if self._set_up <= 0.0 else 0.0
            until = max(before, sent + max(0.0, self._set_up) + self.window + way)
            if until < entry[3]:
                sooner = sooner or entry[3] - until > TOGETHER
                self._packed_from = math.inf
                del self._entries[at]
                entry = (*entry[:3], until)
                bisect.insort(self._entries, entry)
            if _end(entry, self._span) > now:
                kept.append((sent, before, entry))
        self._answered_cold = kept
        if sooner and self._ahead(now):
            self._void()

    def _confirmed_by(self, booked_by: float) -> Entry | None:
        """The entry of the booking due by ``booked_by`` not answered yet: the latest
        that started by then, one that left before one that did not. Matched by when
        its request was sent instead, a call that set up for 0.1 s took the entry of
        one admitted after it and sent before it, and the later one's was counted
        twice as it left (the log then held a window of ten per second full at eight)."""
        return self._latest(booked_by, (_LEFT, _STARTED, _DELAYED))

    def _latest(self, booked_by: float, kinds: tuple[int, ...]) -> Entry | None:
        """The latest entry of one of ``kinds`` that started by ``booked_by``; of those
        that started together, the first of ``kinds``."""
        mine = [e for e in self._entries if e[2] in kinds and e[0] <= booked_by]
        if not mine:
            return None
        latest = [e for e in mine if e[0] == mine[-1][0]]
        return min(latest, key=lambda e: kinds.index(e[2]))

    def _sent_by(self, sent: float) -> Entry | None:
        """The entry of a request sent at ``sent`` whose booking is not known: its own was
        confirmed, and its request left; one still on its way is taken only if none
        was, and one never confirmed only if none is."""
        for kinds in ((_STARTED, _LEFT), (_DELAYED,)):
            mine = [e for e in self._entries if e[2] in kinds and e[0] <= sent]
            if mine:
                return mine[-1]
        due = bisect.bisect_right(self._bookings, (sent, math.inf))
        return _booked(self._bookings[due - 1]) if due else None

    def delayed(self, booked_by: float) -> None:
        """The request of a booking due by ``booked_by`` is on its way, not out yet:
        opening a connection, or held back. Until it leaves (``left``), its token is
        held at least a window from now: a booking due meanwhile is checked against
        that when it is confirmed, and books again if it no longer fits. Counted from
        its booking, one per 20 ms, a call admitted 20 ms after one whose connection
        took 30 ms left first.
        """
        mine = [e for e in self._entries if e[2] == _STARTED and e[0] <= booked_by]
        if mine:
            self._entries.remove(mine[-1])
            bisect.insort(self._entries, (*mine[-1][:2], _DELAYED, mine[-1][3]))

    def left(self, booked_by: float, *, anew: bool = False) -> None:
        """The request of a booking due by ``booked_by`` left now (``anew``: counted
        from now even where the log no longer keeps its entry).

        The server counts it from its arrival, no sooner than now. Later
        than the slack allows for (a new connection's set-up, a tool's own,
        a hold before it left), its token is held a window from now, and the
        slack (the way may take that much longer for one request than
        another), not from its booked start: measured in real time against
        a sliding log of 2 per 20 ms, a call admitted at 0 opened its
        connection until 4.6 ms, one admitted a window later opened its own
        in 2.4 ms, reached the server 15.5 ms after the first, and was
        refused. No answer is needed for this, and none would come in time:
        that window is shorter than a round trip.

        A request that took longer to leave than the log keeps a start (a
        window and the slowest answer: a tool's long set-up, a wait at a cap)
        has no entry left; ``anew``, it is counted from now as one token (a
        told window's departures, `departure_wait`, must see it: uncounted,
        tools setting up 0 to 0.3 s drew more 429s than before the departures
        were counted). A learned window, which never waits at the departure,
        leaves it out, as before (counted, a window of 13 per 2 s learned
        behind a cap of one took 9.5 s for 8.6).
        """
        now = trio.current_time()
        mine = self._own(booked_by)
        if mine is None and not anew:
            return
        if mine is None:
            mine = (booked_by, 1.0, _STARTED, -math.inf)
            self._add(mine)
        self._leaves_now(mine, now)

    def written(self, booked_by: float, late: float, *, read_late: float = 0.0) -> None:
        """The request of a booking due by ``booked_by``, counted as leaving
        ``late`` seconds ago (``left``), had its headers written only now: the server
        counts it from now, or ``read_late`` after (a new connection's first request,
        which a server may read late: `ScopeFront.wire_written`). Later than the slack
        allows for, its token is held a window from then, as ``left`` holds a late one.
        (Held from when its headers began, a request written 34 ms later, behind a full
        garbage collection, was followed inside its window by one a window after it
        began: against one per 20 ms, answered in 50 ms, a 429.)"""
        mine = self._confirmed_by(booked_by)
        if (late > 0.0 or read_late > 0.0) and mine is not None and mine[2] == _LEFT:
            self._leaves_now(mine, trio.current_time() + read_late)

    def _leaves_now(self, entry: Entry, arrives: float) -> None:
        """``entry``'s request reaches the server no sooner than ``arrives``: later than
        the slack allows for, its token is held a window from then, not from its start."""
        late = arrives - entry[0] > self.slack
        until = arrives + self._span if late else -math.inf
        self._hold_entry(entry, _LEFT, until, trio.current_time())

    def _own(self, booked_by: float) -> Entry | None:
        """The entry of the booking due by ``booked_by`` whose request has not left:
        the latest that started by then, one delayed before one not. None where the log
        no longer keeps it (it started more than a window and the slowest answer ago).

        Entries are told apart only by their starts, so a call may take another's, one
        token for another; each finds one as long as each takes the latest that fits.
        Taking one delayed, if any, before a later one, the last of ten took an earlier
        call's, the earlier found none, and counted a token of its own (`left`): eleven
        in a log of ten, and the tenth call of a turn waited a window."""
        return self._latest(booked_by, (_DELAYED, _STARTED))

    def departure_wait(self, booked_by: float) -> float:
        """How long the request of a booking due by ``booked_by``, leaving now, waits
        to fit beside the requests that left before it and what the server counts of
        others' (and past a block): 0 where it fits now.

        Its booking held a token from its admission, but the server counts
        the request from its arrival. A tool that sets up before it sends
        (parses, reads a file, asks something else) reorders the two: a call
        admitted a window after one still setting up sent first, and the late
        one followed inside the window. Against fixed windows and sliding logs
        of one or two, tools setting up 0 to 0.3 s drew a 429 in 16 of 100
        drawn turns. Calls admitted but not sent are left out: each is checked
        as it leaves, and holding a token through every set-up paced a window
        of one per 0.1 s whose tools all took 0.3 s at one per 0.4 s.

        Nor before its booked start: a call let start ahead of it
        (`ScopeFront.admission_lead`) whose tool was quicker than any before
        left inside the window of a request that had not left yet, and the log
        held its token from its booking, a window after the server did.
        """
        now = trio.current_time()
        mine = self._own(booked_by)
        cost = 1.0 if mine is None else mine[1]
        gone = [e for e in self._entries if e[2] in _GONE]
        earliest = max(now, self._blocked_until, -math.inf if mine is None else mine[0])
        return _first_fit(gone, cost, earliest=earliest, limit=self.limit, span=self._span) - now

    def _hold_entry(self, entry: Entry, kind: int, until: float, now: float) -> Entry:
        """``entry`` becomes ``kind``, holding its tokens until ``until`` at least (and as
        long as it did); bookings that start before it now leaves book again. Returns
        the entry as held."""
        held = (entry[0], entry[1], kind, max(until, entry[3]))
        if entry[2] == _BOOKED:
            self._unbook(entry[:2])
        else:
            self._entries.remove(entry)
        bisect.insort(self._entries, held)
        end = _end(held, self._span)
        if end > _end(entry, self._span) and self._ahead(now, before=end):
            self._drop_bookings()
        return held

    def hold_started(self, starts: Sequence[tuple[float, float]]) -> None:
        """Requests (start, cost) that started before the log did, which the server still
        counts: each holds its tokens a window from its start, as a phantom."""
        for start, cost in starts:
            self._add((start, cost, _PHANTOM, -math.inf))

    def drain(self, blocked_for: float = 0.0) -> None:
        """A 429: the window is full now, and nothing starts for ``blocked_for`` s."""
        now = trio.current_time()
        self._void()
        self._hold(now, self.limit - self._load(now), returns=now + self._span, void=False)
        self._blocked_until = max(self._blocked_until, now + max(0.0, blocked_for))
        self._drained += 1
        self._phase = None  # the server refused what its windows, so placed, allowed

    def block_until(self, when: float) -> None:
        """Start nothing before ``when``; bookings not yet due book again after it."""
        now = trio.current_time()
        if when > self._blocked_until and when > now:
            self._void()
            self._blocked_until = when

    def voided(self) -> trio.Event:
        """An event set when bookings made until now are void (wake and book again)."""
        return self.epochs.voided()

    def statistics(self) -> BucketStatistics:
        now = trio.current_time()
        return BucketStatistics(
            rate=self.rate, burst=self.limit, tokens=max(0.0, self.limit - self._load(now)),
            blocked_until=self._blocked_until, reserved=self._reserved, refused=self._refused,
            refunded=self._refunded, drained=self._drained, window=self.window,
        )  # fmt: skip

    # -- the log -----------------------------------------------------------

    @property
    def _span(self) -> float:
        return self.window + self.slack

    def _slot(
        self, cost: float, now: float, *, anywhere: bool = False, earliest: float = -math.inf
    ) -> float:
        """The first start for ``cost`` from ``now`` (or ``earliest``, if later: see
        `earliest_start`), searched from the latest start on where nothing before it can
        fit ``cost``; ``anywhere``: searched in full, where the log may fit more than it did.

        Past every start, the load only falls, so the first fit is the first
        moment it leaves room (`_at_end`), among the entries that hold a
        window from there: a few windows' worth. Before it, a queue booked
        one call after another has no room for its own cost: each booking
        found none up to where it went (``_packed_from``, until something
        frees tokens or starts past them all, `_add`). Searched in full every
        time, the log of a deep queue (a thousand calls waiting on 100 per
        0.2 s) took 0.8 ms a search, three searches a call, and held the
        whole turn to the process's pace: 1.5-1.65x the fastest in real time,
        against a server in its own process.
        """
        earliest, last = max(now, self._blocked_until, earliest), self._last_start()
        if earliest >= last or (cost >= self._packed_from and not anywhere):
            return self._at_end(cost, max(earliest, last), self._as_of(now))
        everything = self._schedule(now)
        return _first_fit(everything, cost, earliest=earliest, limit=self.limit, span=self._span)

    def _forget(self, now: float) -> None:
        """Drop what has held no token for a window and the slowest answer (`sync` matches
        answers against entries that long), as each booking is made."""
        span, keep = self._span, self.window + self._longest
        self._entries = [e for e in self._entries if e[2] == _DELAYED or _end(e, span) + keep > now]
        gone = 0
        while gone < len(self._bookings) and self._bookings[gone][0] + span + keep <= now:
            gone += 1
        del self._bookings[:gone]

    def _at_end(self, cost: float, at: float, entries: list[Entry]) -> float:
        """The first moment from ``at``, on or after every start, at which ``cost`` fits:
        the first at which what holds then leaves room (nothing starts later to hold more)."""
        span = self._span
        # A booking holds its tokens a span from its start; those that hold ``at`` lie last.
        first = bisect.bisect_left(self._bookings, (at - span - _EPS,))
        holding = sorted(
            end_cost for end_cost in [
                *((_end(e, span), e[1]) for e in entries),
                *((start + span, booked) for start, booked in self._bookings[first:]),
            ] if end_cost[0] > at
        )  # fmt: skip
        load, room, fits = sum(held for _, held in holding), self.limit - cost + _EPS, at
        for end, held in holding:
            if load <= room:
                break
            load, fits = load - held, end
        return fits

    def _last_start(self) -> float:
        """The latest start of anything in the log, bookings too."""
        latest = self._entries[-1][0] if self._entries else -math.inf
        return max(latest, self._bookings[-1][0]) if self._bookings else latest

    def _add(self, entry: Entry) -> None:
        """Put ``entry`` (no booking) in the log; one that starts after the rest leaves
        the stretch before it unsearched (`_slot`)."""
        if entry[0] > self._last_start():
            self._packed_from = math.inf
        bisect.insort(self._entries, entry)

    def _unbook(self, reservation: Reservation) -> bool:
        """Take ``reservation`` out of the bookings; False if it is not there."""
        at = bisect.bisect_left(self._bookings, reservation)
        if at == len(self._bookings) or self._bookings[at] != reservation:
            return False
        del self._bookings[at]
        return True

    def _schedule(self, now: float) -> list[Entry]:
        """Everything in the log as it stands at ``now``, bookings too, by start."""
        return list(heapq.merge(self._as_of(now), map(_booked, self._bookings)))

    def _as_of(self, now: float) -> list[Entry]:
        """The entries as they stand at ``now``: one whose request is still on its way
        holds its token at least a window from now."""
        held = now + self._span
        return [(e[0], e[1], e[2], max(e[3], held)) if e[2] == _DELAYED else e
                for e in self._entries]  # fmt: skip

    def _live(self, now: float) -> list[Entry]:
        """Entries that started and have not left yet."""
        return self._live_between(now, now)

    def _live_between(self, since: float, until: float) -> list[Entry]:
        """Entries held at some moment from ``since`` to ``until``, bookings too."""
        span = self._span
        held = [e for e in self._as_of(until) if e[0] <= until and _end(e, span) > since]
        first = bisect.bisect_left(self._bookings, (since - span - _EPS,))
        last = bisect.bisect_right(self._bookings, (until, math.inf))
        held += [_booked(b) for b in self._bookings[first:last] if b[0] + span > since]
        return held

    def _ahead(self, now: float, *, before: float = math.inf) -> bool:
        """Whether anything starts after ``now`` (and before ``before``): bookings, mostly."""
        after = bisect.bisect_right(self._bookings, (now, math.inf))
        if after < len(self._bookings) and self._bookings[after][0] < before:
            return True
        return any(now < e[0] < before for e in self._entries)

    def _load(self, now: float) -> float:
        return sum(entry[1] for entry in self._live(now))

    def _hold(self, now: float, tokens: float, *, returns: float, void: bool = True) -> bool:
        """Hold ``tokens`` the log does not know of until ``returns``; True if any."""
        if tokens <= _EPS:
            return False
        if void:
            self._drop_bookings()
        self._add((returns - self._span, tokens, _PHANTOM, -math.inf))
        return True

    def _void(self) -> None:
        """A new epoch: every booking not confirmed goes, due or not, and its holder
        wakes to book again (``voided``)."""
        self.epochs.void()
        self._drop_bookings()

    def _drop_bookings(self) -> None:
        """Every booking not confirmed goes, due or not; each holder finds its own gone
        when it is due (``confirm``), and books again then, in the order they had.

        For when the log can take less than it did: no booking may start
        sooner, so no holder is woken. A void wakes every holder to book
        again at once; a hundred calls waiting on a log of 2 per 20 ms did,
        at every answer that held a token longer, and the loop they kept
        busy sent requests late, which widened the slack, which voided again.
        """
        self._bookings.clear()
        self._packed_from = math.inf

    def _check_cost(self, cost: float) -> None:
        check_cost(cost, self.limit, f"in a window whose limit is {self.limit:g}")
