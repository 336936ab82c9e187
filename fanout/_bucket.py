"""A token bucket that books start times with a maximum wait, on trio's clock.

Algorithm: GCRA's virtual scheduling, kept as ``full_at``, the time at which
the bucket would be full again given every start already booked. A booking
for ``cost`` tokens may start once ``cost`` tokens exist at that time:
``start = max(now, blocked_until, full_at - (burst - cost) / rate)``, and it
moves ``full_at`` to ``max(full_at, start) + cost / rate``. A booking takes
its tokens *at its start*, so reservations made while the bucket is blocked
are owed from the tokens that accrue during the block: when the block ends,
those calls start and the bucket is not also full again (no second burst).

A booking is a promise made on what was known then. When the server later
says otherwise (a 429 drains the bucket, a reset blocks it, a response says
fewer tokens remain), the bucket starts a new *epoch*: bookings of an older
epoch that have not started yet are void, and their holders must ``confirm``
before starting, then book again. A holder that gives up ``refund``s: the
latest booking is undone exactly; an earlier one leaves a *hole* that a later
booking of no greater cost may fill, since that start time was already
proven safe.

A request that leaves late costs a full server the refill it missed
(`ScopeFront.headers_left`): the bucket *owes* it, and every booking not
started yet moves that much later in place (``owe``); a wider slack moves
each by the pauses ahead of it (``set_slack``). Its holder finds out when it
wakes (``retimed``). Voided instead, as they once were, every holder woke to
book again: with hundreds of calls waiting on a bucket of one, each late
request and each widening woke all of them, and the busy loop woke the next
holders late, which owed again and widened the slack again.

A booking is *pending* from ``reserve`` until its holder confirms it (or
refunds it): due is not started, since a holder may wake a moment after its
start. A void hands a pending booking's tokens back to the balance, since its
holder books again; counted as spent, the pace lost a token at every void that
found a holder not yet awake (a learning scope raises its rate, and voids, on
almost every answer).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import attrs
import trio

from ._exceptions import ConfigurationError

__all__ = [
    "SURPLUS",
    "Booking",
    "BucketStatistics",
    "Epochs",
    "ServerCount",
    "TokenBucket",
    "check_cost",
]

_HOLES = 64  # refunded slots kept for reuse; more are forfeited (never over-admits)
# A booking its holder has not confirmed this long after its start is taken as
# started (a holder that never confirms is outside the contract): its token is
# spent, which errs slow, never fast.
_UNCONFIRMED = 1.0
# The least surplus a server's count adds to the bucket: a token, less what a guessed
# rate refills in the few ms between two answers. At a whole token, the probe's
# second answer (3 sure, against 2 held and 0.003 refilled at a guessed 5/s) was
# not taken in, and the turn's first wave after the probe went one short.
SURPLUS = 0.95


@attrs.frozen
class BucketStatistics:
    """A snapshot of a bucket, cheap to take at any time.

    ``window`` is None for a token bucket; for a sliding log (``_window``),
    the seconds after which a spent token comes back (``burst`` per window).
    ``present``: the tokens there are now if no booking still ahead had been
    made (None where this process cannot tell, a shared bucket or a log).
    """

    rate: float | None
    burst: float
    tokens: float
    blocked_until: float
    reserved: int
    refused: int
    refunded: int
    drained: int
    window: float | None = None
    present: float | None = None


@attrs.frozen
class Mark:
    """Where a bucket's schedule stood when a booking was made, to tell how far it has
    moved the booking in place since (`TokenBucket._moved_since`).

    ``moved``: the moves every booking ahead takes alike (an owed refill, a
    wider slack's first step). ``widened``: the slack's widenings, each of
    which also moves a booking by one widening per full booking ahead of it
    (each pauses the refill by the slack); ``widened_from`` sums each widening
    times the full bookings there were before the first it moved. ``fills``:
    the full bookings made before this one. ``paces``: this one took the
    bucket just as it filled again, and pauses the refill after it by the
    slack, as it widens (`TokenBucket.reserve`).
    """

    moved: float = 0.0
    widened: float = 0.0
    widened_from: float = 0.0
    fills: int = 0
    paces: bool = False


_UNMOVED = Mark()


@attrs.frozen
class Booking:
    """One reservation: its absolute ``start``, the ``wait`` until it, and its ``cost``.

    ``epoch`` and ``after`` let the bucket tell, on refund and confirmation,
    whether this booking is still the latest and still valid. ``mark`` is
    where a local schedule stood when it was booked, and ``moved`` how much
    later than ``start`` its holder last saw it start (`TokenBucket.retimed`);
    ``shift``, how far a shared schedule had moved (`fanout._redis_scope`).
    ``burst_began``
    is set on the first booking this process sees of a burst (the bucket was
    full): when that burst began, on this process's clock, which is where the
    server's refill counts from at the earliest. ``took_full``: the bucket was
    full at ``start`` (the server's may stay full until the request arrives,
    and loses the refill meanwhile), whether or not a burst began there.
    """

    start: float
    wait: float
    cost: float
    epoch: int
    before: Any = attrs.field(repr=False, default=None)  # the schedule before it
    after: float = attrs.field(repr=False, default=math.nan)  # the schedule after it
    shift: float = attrs.field(repr=False, default=0.0)  # a shared schedule's move, when booked
    mark: Mark = attrs.field(repr=False, default=_UNMOVED)  # a local one's
    moved: float = attrs.field(repr=False, default=0.0)  # its own move, as its holder last saw
    burst_began: float | None = attrs.field(repr=False, default=None)
    took_full: bool = attrs.field(repr=False, default=False)
    pause: float = attrs.field(repr=False, default=0.0)  # refill it put off past its own
    entry: str = attrs.field(repr=False, default="")  # its start's name in a shared log

    @property
    def starts(self) -> float:
        """When it starts, as its holder last saw it moved (``moved``)."""
        return self.start + self.moved


@attrs.frozen
class ServerCount:
    """What a response's ``Remaining`` says of the server's bucket, and how sure it is.

    The server had ``remaining`` tokens when it counted the request, which
    reached it somewhere in the ``elapsed`` s between sending and the answer
    (at most ``late`` s after it was sent). ``started_since`` is what this
    process surely started after it was counted; ``unsure``, what else
    started that the server may not have counted yet (requests sent before
    it that reached the server after it, or whose calls took their tokens
    and wait for a place on the wire under a learned cap, `fanout._slots`).
    Each bound is used only in its safe direction, whether the rate is told
    or learned: syncing down to a floored count refilled from a guessed
    arrival, or up by a refill the server may not have had, would move every
    start by that guess at each answer (later without end, or into a 429).
    ``proven`` and ``crossing`` raise a learned bucket by a refill it could
    not count (``refilled_at_least``). ``as_of`` is when ``started_since`` was
    counted, on trio's clock (None: when the bucket takes the count in).
    ``overtaking``: of ``started_since``, those that left so soon after it that
    they may have reached the server first, and be in ``remaining`` already.
    ``limit`` is the limit the response stated with it (None: none), and
    ``reset_after`` its ``Reset``: by then at least one token it counted is
    back, whatever the server (a window's end, a bucket's next token or its
    fill, a sliding log's oldest entry leaving), unless it was rounded down. A
    log reads both (`fanout._window.SlidingLog.sync`), and takes the reset only
    where it frees a token ``reset_lead`` s or more sooner than the log would
    (`ScopeFront._reset_lead`).
    """

    remaining: float
    started_since: float = 0.0
    unsure: float = 0.0
    elapsed: float = 0.0
    late: float = 0.0
    proven: float | None = None
    crossing: float = 0.0
    as_of: float | None = None
    overtaking: float = 0.0
    limit: float | None = None
    reset_after: float | None = None
    reset_lead: float = 0.0

    def of_limit(self, limit: float) -> bool:
        """Whether this counts against ``limit``: a count of another (an hourly quota's,
        a burst's beside a minute's) says nothing of what a log of it forgot."""
        return self.limit in (None, limit) and self.remaining <= limit

    def counted_by(self, now: float) -> float:
        """When ``started_since`` was counted: ``as_of``, never later than ``now``."""
        return now if self.as_of is None else min(now, self.as_of)

    def estimate(self, rate: float, burst: float) -> float:
        """The server's tokens now, refilled since the latest the request may have arrived."""
        refilled = max(0.0, self.elapsed - self.late) * rate
        return min(burst, self.remaining + refilled - self.started_since)

    def at_most(self, rate: float, burst: float) -> float:
        """The most tokens the server can have now.

        A whole count is floored (up to a token more was there), and the
        request may have reached the server as soon as it was sent, so it has
        refilled for all of ``elapsed``, while what started since drew it
        down (the burst caps the result, not the refill: the server was not
        full while those requests took their tokens). Those that may have
        overtaken it on the way in (``overtaking``) may have drawn it down
        before it was counted: taken off again, a told 5/s bucket was synced
        a token under a server that had counted one first, and the sixth of
        eight calls went at 0.48 s for 0.27 s.
        """
        floored = 1.0 if self.remaining == math.floor(self.remaining) else 0.0
        after = self.started_since - self.overtaking
        return min(burst, self.remaining + floored + self.elapsed * rate - after)

    def at_least(self, burst: float) -> float:
        """The least tokens the server can have now: its count, with no refill assumed.

        A request that reached the server late (a slow first connection) was
        counted late: refilling from its sending would overstate the server.
        """
        return min(burst, self.remaining) - self.started_since - self.unsure

    def refilled_at_least(self, burst: float) -> float | None:
        """The server's tokens now, refilled at ``proven`` since the request arrived.

        ``proven`` is a rate the server's refill was shown to reach at least
        (a learned rate's measured lower bound); None when nothing is proven.
        The request is taken to arrive by ``late``, as in ``estimate``, so only
        what started up to then may have crossed it on its way in
        (``crossing``): the server had not counted those yet.
        """
        if self.proven is None:
            return None
        refilled = max(0.0, self.elapsed - self.late) * self.proven
        return min(burst, self.remaining + refilled) - self.started_since - self.crossing


@attrs.define
class Epochs:
    """Which bookings still hold, for a bucket or a log (`fanout._window`).

    ``void`` starts a new epoch: a booking made in an older one may not
    start, and whoever waits on ``voided()`` wakes to book again. A scope
    that turns its bucket into a log hands the log these same epochs, so no
    booking of the bucket passes for one of the log.
    """

    current: int = 0
    _event: trio.Event | None = attrs.field(default=None, alias="_event")

    def void(self) -> None:
        self.current += 1
        if self._event is not None:
            self._event.set()
            self._event = None

    def voided(self) -> trio.Event:
        """An event set when bookings made until now are void (wake and book again)."""
        if self._event is None:
            self._event = trio.Event()
        return self._event


def check_cost(cost: float, most: float | None, holder: str) -> None:
    """A call's cost is a positive number no larger than ``most`` (``holder`` says of what)."""
    if not (cost > 0 and math.isfinite(cost)):
        raise ConfigurationError(f"a call's cost must be a positive number, not {cost!r}")
    if most is not None and cost > most:
        raise ConfigurationError(f"a call costing {cost:g} tokens can never start {holder}")


@attrs.define
class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``rate=None`` means no rate limit.

    A bucket without a rate still honours ``blocked_until``, so a scope whose
    limits are unknown still obeys the server's Retry-After.

    ``slack`` allows for the network. A server's bucket starts refilling when
    the first request of a burst *arrives*, and that one is often the slowest
    to arrive (it opens the connection). So when a burst starts from a full
    bucket, refilling is counted from ``slack`` seconds later; and, with
    ``every_fill``, after every booking that takes the bucket just as it has
    filled again (a burst of one, paced).
    """

    rate: float | None
    burst: float = attrs.field(default=1.0)
    slack: float = attrs.field(default=0.0)
    every_fill: bool = attrs.field(default=True, kw_only=True)
    _full_at: float = attrs.field(init=False, default=-math.inf)
    _paused_until: float = attrs.field(init=False, default=-math.inf)  # refill starts then
    _blocked_until: float = attrs.field(init=False, default=-math.inf)
    epochs: Epochs = attrs.field(init=False, factory=Epochs)
    _holes: list[tuple[float, float]] = attrs.field(init=False, factory=list)
    # Bookings not started yet, by start, cost, the refill pause each added (`reserve`)
    # and where the schedule stood when booked (each starts `_moved_since` its mark later).
    _pending: Counter[tuple[float, float, float, Mark]] = attrs.field(init=False, factory=Counter)
    _moved: float = attrs.field(init=False, default=0.0)  # `Mark`'s sums, as of now
    _widened: float = attrs.field(init=False, default=0.0)
    _widened_from: float = attrs.field(init=False, default=0.0)
    _fills: int = attrs.field(init=False, default=0)
    # The refill the latest paced booking to start put off, and until when (`_margin_kept`).
    _pause_kept: tuple[float, float] = attrs.field(init=False, default=(0.0, -math.inf))
    _prune_at: int = attrs.field(init=False, default=2 * _HOLES)
    _reserved: int = attrs.field(init=False, default=0)
    _refused: int = attrs.field(init=False, default=0)
    _refunded: int = attrs.field(init=False, default=0)
    _drained: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        check_limits(self.rate, self.burst)
        if not (self.slack >= 0 and math.isfinite(self.slack)):
            raise ConfigurationError(f"slack must be a finite number >= 0, not {self.slack!r}")

    # -- booking -------------------------------------------------------------

    def wait_for(self, cost: float = 1.0) -> float:
        """Seconds until ``cost`` tokens could be booked to start, consuming nothing."""
        self._check_cost(cost)
        now = trio.current_time()
        start, _ = self._slot(cost, now)
        return start - now

    def reserve(self, cost: float = 1.0, *, max_wait: float = math.inf) -> Booking | None:
        """Book ``cost`` tokens; the booking, or None when its wait exceeds ``max_wait``.

        None consumes nothing.
        """
        self._check_cost(cost)
        now = trio.current_time()
        start, hole = self._slot(cost, now)
        if start - now > max_wait:
            self._refused += 1
            return None
        self._reserved += 1
        if hole is not None:
            self._fill(hole, cost)
            mark = self._mark(paces=False)
            self._pend(start, cost, 0.0, mark, now)
            return Booking(start, start - now, cost, self.epochs.current, mark=mark)
        before = (self._full_at, self._paused_until)
        idle = full = False
        pause = 0.0
        if self.rate is not None:
            idle = self._full_at < start
            full = idle or (self.every_fill and self._full_at == start)
            self._full_at = max(self._full_at, start) + cost / self.rate
            if full and self.slack:
                # The server refills from when this request arrives, so this bucket
                # counts its refill from slack later: where a burst begins, and where
                # the bucket has just filled again (a burst of one, paced: every
                # request late by a ms, and the next on time, drew a 429 at 50/s).
                self._full_at += self.slack
                if idle:  # until then it holds what the burst's start left
                    self._paused_until = start + self.slack
                else:  # the pause is in the schedule: a void gives it back (`_present`)
                    pause = self.slack
        mark = self._mark(paces=full and not idle)
        if full:
            self._fills += 1
        self._pend(start, cost, pause, mark, now)
        return Booking(
            start, start - now, cost, self.epochs.current, before, self._full_at, mark=mark,
            burst_began=start if idle else None, took_full=full, pause=pause,
        )  # fmt: skip

    def _mark(self, *, paces: bool) -> Mark:
        return Mark(self._moved, self._widened, self._widened_from, self._fills, paces)

    def _pend(self, start: float, cost: float, pause: float, mark: Mark, now: float) -> None:
        """Count a booking as not started yet, until it is confirmed or refunded."""
        if self.rate is None:
            return
        self._pending[start, cost, pause, mark] += 1
        if len(self._pending) > self._prune_at:  # holders that never confirm
            self._prune_at = 2 * max(_HOLES, len(self._unstarted(now)))

    def confirm(self, booking: Booking) -> bool:
        """Whether ``booking`` may start now: it was not voided since it was made.

        A voided booking (the server drained or blocked the bucket after it
        was made) must be booked again: its tokens came back to the balance
        when it was voided, if its holder had not confirmed it by then. A
        confirmed booking has started: its tokens stay spent through any void.
        One the schedule moved since its holder last looked (``retimed``) is
        refused too: its holder would start it early.
        """
        held = (
            booking.epoch == self.epochs.current
            and trio.current_time() >= self._blocked_until
            and booking.moved == self._moved_since(booking.mark)  # its holder knows when
        )
        if held:
            self._forget(booking)  # started: its token is spent
            if booking.mark.paces and self.rate is not None:
                pause = self._pause_of(booking.pause, booking.mark)
                ends = booking.starts + booking.cost / self.rate + pause
                self._pause_kept = (pause * self.rate, ends)
        return held

    def refund(self, booking: Booking) -> None:
        """Give back a booking whose holder gave up before starting."""
        if booking.epoch != self.epochs.current or self.rate is None:
            return  # void already, or nothing was counted
        self._refunded += 1
        start = self._start_of(booking)
        self._forget(booking)
        if booking.after == self._full_at and self._moved_since(booking.mark) == 0.0:
            self._full_at, self._paused_until = booking.before
        elif start >= trio.current_time() and len(self._holes) < _HOLES:
            # Due now, and given back now, it is as good as one to come: a call on two
            # scopes gives one back as the other's token turns out later (`_admission`).
            self._holes.append((start, booking.cost))

    def retimed(self, booking: Booking) -> Booking:
        """``booking`` as it stands now: ``moved`` and ``wait`` follow the schedule's moves
        since it was booked (``owe``, ``set_slack``); the same booking if it has not moved
        since last seen (or was voided: ``confirm`` refuses it)."""
        moved = self._moved_since(booking.mark)
        if booking.epoch != self.epochs.current or moved == booking.moved:
            return booking
        start = booking.start + moved
        return attrs.evolve(booking, moved=moved, wait=start - trio.current_time())

    def set_slack(self, slack: float) -> None:
        """Use ``slack`` from now on; a busy bucket also defers its refill, and what is
        booked ahead, by the increase (a narrower one books what is ahead again)."""
        if not (slack >= 0 and math.isfinite(slack)):
            raise ConfigurationError(f"slack must be a finite number >= 0, not {slack!r}")
        if slack == self.slack or self._full_at == -math.inf:
            self.slack = slack  # nothing booked yet (and perhaps no trio running)
            return
        now = trio.current_time()
        if self._full_at > now and slack > self.slack:
            # Busy: a wider slack counts the refill from later, and what is booked
            # ahead moves with it, in place, each also by the wider pause of every
            # full booking ahead of it, as if booked again at the new slack. (Booked
            # again, a queue of hundreds woke at each widening, and the busy loop
            # woke the next holders late: that widened it again, until a bucket of
            # one at 200/s paced 40 ms apart. Moved alike, a queue booked before any
            # lag was measured kept no margin, and drew a 429.)
            wider = slack - self.slack
            first = min((mark.fills for *_, mark in self._unstarted(now)), default=self._fills)
            self._full_at += wider * (1 + self._fills - first)
            if self._paused_until > now:
                self._paused_until += wider
            self._moved += wider
            self._widened += wider
            self._widened_from += wider * first
            self._holes.clear()  # each would move by the pauses ahead of it
        elif self._full_at > now and self._ahead_of(now):
            # Narrower: bookings ahead book again, their pauses given back (`_present`).
            present = self._present(now)
            self._void()
            self._keep_balance(now, present)
        self.slack = slack

    # -- what the server said ----------------------------------------------

    def set_limits(self, rate: float | None, burst: float, *, tokens: float | None = None) -> None:
        """Change the rate and burst (learned limits), keeping what is owed.

        ``tokens`` lowers the balance to what the server said remains (never
        raises it while anything is booked).
        """
        check_limits(rate, burst)
        now = trio.current_time()
        # The balance is as of the end of a refill pause (a burst's slack) or of a
        # block: it still holds from then, not from now, at the new rate.
        since = max(now, self._paused_until)
        ahead = self._ahead_of(now)
        faster = ahead and (rate is None or (self.rate is not None and rate > self.rate))
        slower = rate is not None and self.rate is not None and rate < self.rate
        stricter = ahead and (slower or burst < self.burst)
        blocked = rate is not None and self._blocked_until > now
        if faster or (stricter and not blocked):
            # Faster now: what is booked ahead could start sooner. Slower, or a
            # shallower burst: it would start at the old pace, or together in the
            # old burst (calls that booked while a 429 was being taken in, before
            # the rate it taught was applied, drew a fourth). Either way it books
            # again at the new limits.
            balance = self._present(now)
            self._void()
        elif stricter:
            # Booked during a block, for its end, at the old limits: they book again
            # too (kept, the bookings made in a 429's block at 6.5/s with a burst of
            # 13 went eight at once as it ended, against the burst of one it taught).
            # Their tokens come back, and the bucket holds at the block's end what
            # it holds now refilled through the block at the new rate, no more: read
            # from the pause those bookings began, it held a whole old burst.
            assert rate is not None
            kept, _ = self._unstarted_tokens(now, taken_since=math.inf, upto=now)
            ready = max(0.0, self._tokens(now)) + (self._blocked_until - now) * rate
            since = self._blocked_until
            balance = min(self._tokens(since) + kept, ready)
            self._void()
        elif rate is not None and self._blocked_until > since:
            # A booking made during a block starts at its end, and the balance now
            # counts the whole block as tokens spent at the old rate: it is read at
            # the block's end instead, where the bookings took theirs. (Read now and
            # refilled at a slower rate, a 1 s block at 408/s became 13 s at 32/s.)
            # Until then it refills at the new rate, from what it holds now.
            ready = max(0.0, self._tokens(now)) + (self._blocked_until - since) * rate
            since = self._blocked_until
            balance = min(self._tokens(since), ready)
        elif self.rate is None:
            balance = burst  # nothing was counted: the new bucket starts full
        else:
            balance = self._tokens(since)
        if tokens is not None and math.isfinite(tokens):
            balance = tokens if self.rate is None else min(balance, tokens)
        self.rate, self.burst = rate, burst
        self._holes.clear()
        if rate is not None:
            self._set_balance(since, min(balance, burst))

    def sync(self, count: ServerCount) -> bool:
        """The server's count (``ServerCount``) replaces the bucket's where it is sure.

        A bucket above the most the server can have drops to the estimate
        (a rate learned too fast shows there, or in a 429); bookings not
        yet due are void, and book again against it. A surplus of a token or
        more over the bucket by the least the server can have is added (the
        bucket could not see the server refill), beyond the margin a paced
        bucket keeps on purpose (``_margin_kept``), and while learning any
        surplus a proven rate shows (``ServerCount.refilled_at_least``). True
        when the bucket changed.
        """
        if self.rate is None or not math.isfinite(count.remaining):
            return False
        now = trio.current_time()
        # The count takes a booking due since its request was sent as started, and
        # so does the bucket here; a void hands back the tokens of those whose
        # holders have not woken yet. (One due before it was sent, the count does
        # not take off: handed back too, its token was counted twice, and drew a
        # 429.) The count is as of when it was counted: in real time the clock
        # moves on before the bucket takes it in, and a booking that fell due in
        # between, in neither, was handed back as taken off (a 429 in one run of
        # twenty of the deadline row; taken earlier still, it was handed back
        # without having been taken off).
        counted = count.counted_by(now)
        kept, due = self._unstarted_tokens(now, taken_since=counted - count.elapsed, upto=counted)
        present = min(self.burst, self._tokens(now) + kept)
        if present > count.at_most(self.rate, self.burst) + 1e-9:
            self._void()
            self._set_balance(now, count.estimate(self.rate, self.burst) + due)
            return True
        adopt = count.at_least(self.burst)
        refilled = count.refilled_at_least(self.burst)
        if refilled is not None and refilled > present + 1e-9:
            # A learned bucket refills at its rate from what it was set to: a
            # refill it never counted (the probe's round trip: its count is as of
            # its sending) is made up as soon as a proven rate shows it, not a
            # token at a time.
            adopt = max(adopt, refilled)
        elif adopt < present + SURPLUS + self._margin_kept(now):
            return False
        # The bucket could not see the server refill: bookings ahead may
        # start sooner, so they are void and book again (``voided`` wakes them).
        self._void()
        self._set_balance(now, adopt + due)
        return True

    def drain(self, blocked_for: float = 0.0) -> None:
        """The server said we went too fast: no tokens now, nothing starts for ``blocked_for`` s."""
        now = trio.current_time()
        self._void()
        if self.rate is not None:
            self._set_balance(now, 0.0)
        self._blocked_until = max(self._blocked_until, now + max(0.0, blocked_for))
        self._drained += 1

    def owe(self, tokens: float) -> None:
        """Give up ``tokens`` the server may have lost (it filled up while requests were
        held back): the schedule, and every booking not started yet, moves later by
        their refill time. Holders find out as they wake (``retimed``); the holes
        left by refunds move too, still proven safe a token's time apart."""
        if self.rate is None or not tokens > 0:
            return
        delay = tokens / self.rate
        now = trio.current_time()
        self._full_at = max(self._full_at, now, self._paused_until) + delay
        self._moved += delay
        self._holes = [(start + delay, cost) for start, cost in self._holes]

    def block_until(self, when: float) -> None:
        """Start nothing before ``when`` (a window's reset), without draining.

        Every booking not yet due is void, and its tokens come back: each
        books again, after the block, against the same balance.
        """
        now = trio.current_time()
        if not (when > self._blocked_until and when > now):
            return
        if self.rate is not None:
            self._set_balance(now, self._present(now))
        self._void()
        self._blocked_until = when

    @property
    def blocked_until(self) -> float:
        return self._blocked_until

    def statistics(self) -> BucketStatistics:
        now = trio.current_time()
        return BucketStatistics(
            rate=self.rate,
            burst=self.burst,
            tokens=self._tokens(now),
            blocked_until=self._blocked_until,
            reserved=self._reserved,
            refused=self._refused,
            refunded=self._refunded,
            drained=self._drained,
            present=self._present(now) if self.rate is not None else None,
        )

    # -- the schedule --------------------------------------------------------

    def _slot(self, cost: float, now: float) -> tuple[float, tuple[float, float] | None]:
        """The earliest start for ``cost`` as of ``now``, and the hole it would fill (if any)."""
        earliest = max(now, self._blocked_until)
        if self.rate is None:
            return earliest, None
        enough = self._full_at - (self.burst - cost) / self.rate  # cost tokens exist from then
        # While the refill is paused, the tokens of its start are all there are.
        start = earliest if self._paused_until >= enough else max(earliest, enough)
        self._holes = [hole for hole in self._holes if hole[0] >= now]
        usable = [h for h in self._holes if h[0] >= earliest and h[1] >= cost and h[0] < start]
        if usable:
            hole = min(usable)
            return hole[0], hole
        return start, None

    def _fill(self, hole: tuple[float, float], cost: float) -> None:
        self._holes.remove(hole)
        if hole[1] > cost:
            self._holes.append((hole[0], hole[1] - cost))

    def _tokens(self, now: float) -> float:
        if self.rate is None:
            return self.burst
        return self.burst - max(0.0, self._full_at - max(now, self._paused_until)) * self.rate

    def _set_balance(self, now: float, tokens: float) -> None:
        assert self.rate is not None
        self._full_at = now + (self.burst - tokens) / self.rate
        self._paused_until = -math.inf

    def _keep_balance(self, now: float, tokens: float) -> None:
        """Hold ``tokens`` (what ``_present`` said), and a refill pause
        under way: it counts from the pause's end, as ``_present`` did. (Set from now,
        the send lag measured on a burst's first request ended the burst's pause at
        once, and the first token after the burst came a slack early: a told 429.)"""
        paused = self._paused_until
        self._set_balance(max(now, paused), tokens)
        if paused > now:
            self._paused_until = paused

    def voided(self) -> trio.Event:
        """An event set when bookings made until now are void (wake and book again)."""
        return self.epochs.voided()

    def _void(self) -> None:
        self.epochs.void()
        self._holes.clear()
        self._pending.clear()

    def _margin_kept(self, now: float) -> float:
        """Tokens a bucket paced at every fill holds back on purpose: the refill the pause
        of the latest paced booking to start put off (`reserve`), until it ends; the
        server had it. Taken as a refill the bucket could not see, a slack wider than a
        token's time was given back at every answer, voiding every booking ahead: a
        bucket of one at 200/s with a queue of hundreds woke them all at each answer,
        and woke the next holders late."""
        tokens, until = self._pause_kept
        return tokens if now < until else 0.0

    def _moved_since(self, mark: Mark) -> float:
        """How much later than booked a booking made at ``mark`` starts, if not started yet:
        every move alike since, and a widening's share per full booking ahead of it."""
        widened = mark.fills * (self._widened - mark.widened)
        return self._moved - mark.moved + widened - (self._widened_from - mark.widened_from)

    def _pause_of(self, pause: float, mark: Mark) -> float:
        """The refill a booking made at ``mark`` puts off after it: the ``pause`` it was
        booked with, and, if it paces, every widening of the slack since (`set_slack`)."""
        return pause + (self._widened - mark.widened if mark.paces else 0.0)

    def _start_of(self, booking: Booking) -> float:
        """When ``booking`` starts: moved with the schedule while pending, else as last seen."""
        if (booking.start, booking.cost, booking.pause, booking.mark) in self._pending:
            return booking.start + self._moved_since(booking.mark)
        return booking.starts

    def _forget(self, booking: Booking) -> None:
        entry = (booking.start, booking.cost, booking.pause, booking.mark)
        if self._pending[entry] > 1:
            self._pending[entry] -= 1
        else:
            self._pending.pop(entry, None)

    def _unstarted(self, now: float) -> Counter[tuple[float, float, float, Mark]]:
        """Bookings not started yet: pending, and not stale (``_UNCONFIRMED``)."""
        horizon = now - _UNCONFIRMED
        stale = [e for e in self._pending if e[0] + self._moved_since(e[3]) < horizon]
        for entry in stale:
            del self._pending[entry]
        return self._pending

    def _ahead_of(self, now: float) -> bool:
        """Whether a booking is still to come (one that voiding could move sooner or later)."""
        return any(start + self._moved_since(mark) > now for start, _, _, mark in self._pending)

    def _unstarted_tokens(
        self, now: float, *, taken_since: float, upto: float
    ) -> tuple[float, float]:
        """Tokens of bookings not started yet, in one pass: those a server's count of a
        request sent at ``taken_since`` did not take as started, and those due since,
        up to when it was counted (``upto``), which it did. A kept booking's refill
        pause (`reserve`) is kept too: voided, it gives back the time it put off."""
        kept = taken = 0.0
        rate = self.rate or 0.0
        for (booked, cost, pause, mark), n in self._unstarted(now).items():
            start = booked + self._moved_since(mark)
            if taken_since < start <= upto:
                taken += cost * n
            else:
                kept += (cost + self._pause_of(pause, mark) * rate) * n
        return kept, taken

    def _present(self, now: float) -> float:
        """Tokens now as if no booking not started yet existed (never more than exactly)."""
        kept, _ = self._unstarted_tokens(now, taken_since=math.inf, upto=now)
        return min(self.burst, self._tokens(now) + kept)

    def _check_cost(self, cost: float) -> None:
        most = None if self.rate is None else self.burst
        check_cost(cost, most, f"on a bucket whose burst is {self.burst:g}")


def check_limits(rate: float | None, burst: float) -> None:
    """Refuse a rate that is not positive and finite, or a burst below one."""
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise ConfigurationError(f"rate must be a positive number of tokens a second, not {rate!r}")
    if not (isinstance(burst, int | float) and burst >= 1 and math.isfinite(burst)):
        raise ConfigurationError(f"burst must be at least 1, not {burst!r}")
