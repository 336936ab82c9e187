"""A scope shared by many processes: the limits of one key, kept on Redis.

Two agent processes that share an API key must share its limits, or together
they send twice the key's rate. ``RedisScope`` is the scope front (every
rule, in ``_front``) over a Redis backend; the runner cannot tell it from a
``Scope``.

- **Window**: a scope that counts in windows keeps a sliding log instead,
  a sorted set of bookings by start kept by ``_redis_scripts.WINDOW``, with
  the same verbs and the same epochs.
- **Bucket**: one Lua script (``_redis_scripts.BUCKET``, run by ``_redis``)
  on the server's clock books, refunds, drains after a 429, syncs to a
  server's count and holds the shared "blocked until", so one process's 429
  holds back every process. It answers with a wait, which the caller sleeps
  on trio's clock, and an epoch, which voids bookings the server overruled.
- **Slots**: leases in a sorted set scored by their expiry. A call polls for
  one (with a short, growing pause) until its patience ends, never past it;
  a local ``CapacityLimiter`` in front keeps a process from polling for more
  slots than the cap. One renewal task per scope keeps this process's leases
  alive (and adds back any Redis lost); a crashed process stops renewing, so
  its leases expire within ``lease_ttl``. A lease whose acquisition was cut
  off is removed once Redis answers again (``SharedLeases``).
- **Local**, as in ``Scope``: the waiter count and shedding, the latency
  average, the retry budget, learning. An exhausted quota is shared through
  a marker key that expires when the quota returns.
- **Unavailable Redis**: each operation is bounded by ``op_timeout`` (and by
  the caller's deadline). A failure makes the scope treat Redis as down for
  ``recheck_after`` seconds. Meanwhile calls are refused (fail closed), or,
  with ``fallback``, limited locally to a share of the scope; the fallback's
  cap counts this process's calls still holding Redis leases, and its slots
  are registered as leases once Redis answers, so the cap holds before,
  during and after the outage.

The background tasks live in the scope's own nursery, opened by
``async with scope:``, so nothing outlives the block that uses the scope.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import math
import random
from typing import TYPE_CHECKING, Any, Self

import attrs
import trio

from ._bucket import SURPLUS, Booking, BucketStatistics, TokenBucket
from ._exceptions import ConfigurationError, LimiterUnavailableError, UsageError
from ._front import ScopeFront
from ._learning import TOGETHER
from ._ledger import Ledger
from ._redis import (
    BucketReply,
    LocalFallback,
    RedisLink,
    SharedBucket,
    SharedLeases,
    SharedWindow,
)
from ._redis_client import RedisClient, a_client, a_prefix, client_from_url
from ._redis_keys import scope_key_base
from ._slots import take_slot
from ._trio_runs import current_run
from ._validate import positive
from ._window import SlidingLog, past_reset

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from types import TracebackType

    from ._backend import SlotHolder
    from ._bucket import ServerCount
    from ._scope import ScopeLike

__all__ = ["RedisScope"]

_RESCALES_KEPT = 64  # rate increases remembered, to re-time bookings made before them
_COMMITTED_KEPT = 5.0  # seconds a booking sure to start is kept for a sync's count
_FIRST_PAUSE = 0.005  # seconds between polls for a lease, doubling up to _LAST_PAUSE
_LAST_PAUSE = 0.05
_HEAR_EVERY = 0.1  # seconds between asks for the others' proofs while calls wait here


def _optional_fallback(
    _: object, __: attrs.Attribute[LocalFallback | None], value: LocalFallback | None
) -> None:
    if value is not None and not isinstance(value, LocalFallback):
        raise ConfigurationError(f"fallback must be a LocalFallback or None, not {value!r}")


@attrs.define
class _Turns:
    """This process's trips that book or confirm go together; a sync goes alone.

    A sync sets the shared bucket to the server's count less what this
    process started since it was counted. A booking Redis took between the
    count and the sync was in neither, and its token was forgotten: learning
    a window on Redis drew two 429s where one was due. So a sync waits for
    the trips under way and holds new ones back until it is done, and every
    booking it could miss is one this process has the answer to.
    """

    _under_way: int = 0
    _idle: trio.Event = attrs.field(factory=trio.Event)
    _alone: trio.Event | None = None

    @contextlib.asynccontextmanager
    async def together(self) -> AsyncIterator[None]:
        while self._alone is not None:
            await self._alone.wait()
        self._under_way += 1
        try:
            yield
        finally:
            self._under_way -= 1
            if not self._under_way:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        while self._alone is not None:
            await self._alone.wait()
        done = self._alone = trio.Event()
        try:
            while self._under_way:
                self._idle = trio.Event()
                await self._idle.wait()
            yield
        finally:
            self._alone = None
            done.set()


@attrs.define(eq=False)
class RedisBackend:
    """Slots as leases, tokens in the shared bucket (or log: ``window``), with a local fallback."""

    link: RedisLink
    bucket: SharedBucket
    log: SharedWindow
    leases: SharedLeases | None
    ledger: Ledger
    fallback: LocalFallback | None
    rate: float | None
    burst: float
    window: float | None = None
    slack: float = 0.0
    nursery: trio.Nursery | None = None
    _gate: trio.CapacityLimiter | None = attrs.field(init=False, default=None)
    _fallback_cap: int = attrs.field(init=False, default=0)
    _released: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    _fallback_bucket: TokenBucket | SlidingLog | None = attrs.field(init=False, default=None)
    _held: dict[object, str] = attrs.field(init=False, factory=dict)  # holder -> member
    _seen: tuple[float, float, float] | None = attrs.field(init=False, default=None)
    _seen_recoveries: int = attrs.field(init=False, default=0)  # the link's, as last seen
    _fallback_emptied: float | None = attrs.field(init=False, default=None)  # for this outage
    _opened_seen: float = attrs.field(init=False, default=0.0)  # the latest burst's ``opened``
    _starts_read: float = attrs.field(init=False, default=0.0)  # others' starts read up to here
    _reading_starts: trio.Lock = attrs.field(init=False, factory=trio.Lock)
    # A faster rate waiting to re-time the shared schedule, and the re-timings made here.
    _faster_to: float | None = attrs.field(init=False, default=None)
    _rescaling: trio.Lock = attrs.field(init=False, factory=trio.Lock)
    _rescales: list[tuple[float, float]] = attrs.field(init=False, factory=list)
    _wakeup: trio.Event | None = attrs.field(init=False, default=None)
    _log_epoch: int | None = attrs.field(init=False, default=None)  # the newest a log showed
    # This process's bookings not yet due (a heap by start), and their tokens.
    _ahead: list[tuple[float, float]] = attrs.field(init=False, factory=list)
    _ahead_tokens: float = attrs.field(init=False, default=0.0)
    _counts: dict[str, int] = attrs.field(
        init=False, factory=lambda: dict.fromkeys(("reserved", "refused", "refunded", "drained"), 0)
    )
    _turns: _Turns = attrs.field(init=False, factory=_Turns)
    # This process's bookings sure to start (booked without a wait, or confirmed), sorted
    # by start, for a sync to take off those its count could not (``_committed_after``).
    _committed: list[tuple[float, float]] = attrs.field(init=False, factory=list)
    # What the server said remains when the limits were learned, and when (``set_limits``).
    _told: tuple[float, float] | None = attrs.field(init=False, default=None)
    _proven: float = attrs.field(init=False, default=0.0)  # the fastest refill any process proved

    def open(self, nursery: trio.Nursery) -> None:
        """What needs trio running: the local gate, the fallback, the background tasks."""
        self.nursery = nursery
        cap = self.leases.cap if self.leases is not None else None
        self._gate = trio.CapacityLimiter(cap) if cap is not None else None
        if self.fallback is not None:
            share = self.fallback.share
            self._fallback_bucket = self._local_fallback(share)
            if cap is not None:
                self._fallback_cap = max(1, math.floor(cap * share))
        if self.leases is not None:
            nursery.start_soon(self.leases.renew_forever)
            nursery.start_soon(self.leases.sweep_forever)

    def _opened(self) -> None:
        if self.nursery is None:
            raise UsageError(
                f"RedisScope {self.link.scope!r} is not open: use it inside `async with scope:`"
            )

    # -- slots ---------------------------------------------------------------

    def has_free_slot(self) -> bool:
        """Only without a cap: whether a shared slot is free is known by asking Redis."""
        return self.leases is None

    async def acquire_slot(self, holder: SlotHolder, deadline: float) -> bool:
        """One try is made even at the deadline; no wait ends after it."""
        self._opened()
        if self._gate is None:
            await trio.lowlevel.checkpoint()
            return True
        if not await take_slot(self._gate, holder, deadline):
            return False
        member: str | None = None
        try:
            member = await self._lease(deadline)
        finally:
            if member is None:
                self._gate.release_on_behalf_of(holder)
        if member is None:
            return False
        self._held[holder] = member
        return True

    async def _lease(self, deadline: float) -> str | None:
        """A lease's member name (from Redis, or the fallback), or None at ``deadline``."""
        assert self.leases is not None
        pause, first = _FIRST_PAUSE, True
        while True:
            try:
                # The first try is made even at the deadline (a free slot is
                # taken, as ``_nowait`` would); the call's own deadline still
                # bounds it. Later tries never run past ``deadline``.
                with trio.move_on_at(math.inf if first else deadline) as attempt:
                    member = await self.leases.try_acquire()
                if attempt.cancelled_caught:
                    return None
                first = False
            except LimiterUnavailableError:
                if self.fallback is None:
                    raise
                return await self._fallback_slot(deadline)
            if member is not None:
                return member
            now = trio.current_time()
            if now >= deadline:
                return None
            await trio.sleep(min(pause * random.uniform(0.5, 1.0), deadline - now))
            pause = min(2 * pause, _LAST_PAUSE)

    async def _fallback_slot(self, deadline: float) -> str | None:
        """A slot under the fallback's cap, which counts every slot this process holds.

        Calls still holding Redis leases count too: the outage does not free
        their slots. The slot is registered as a lease once Redis answers.
        """
        assert self.leases is not None
        with trio.move_on_at(deadline):
            while len(self._held) >= self._fallback_cap:
                await self._released.park()
            member = self.leases.new_member()
            self.leases.hold(member)
            return member
        return None

    async def release_slot(self, holder: SlotHolder) -> None:
        """Give the slot back; shielded and bounded, so safe in ``finally``."""
        member = self._held.pop(holder, None)
        if self._gate is None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        self._gate.release_on_behalf_of(holder)
        self._released.unpark_all()
        if member is not None and self.leases is not None:
            await self.leases.release(member)
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()

    # -- tokens ----------------------------------------------------------------

    def _local_fallback(self, share: float) -> TokenBucket | SlidingLog:
        """The local bucket (or log) that takes ``share`` of the limits while Redis is away."""
        burst = max(1.0, self.burst * share)
        if self.window is not None:
            return SlidingLog(burst, self.window)
        return TokenBucket(self.rate * share if self.rate is not None else None, burst)

    def use_window(self, window: float) -> None:
        """Keep tokens in the shared log from now on (and in a local one while Redis is away)."""
        self.window = window
        self._told = None  # a log has no balance to lower
        if self._fallback_bucket is not None and self.fallback is not None:
            self._fallback_bucket = self._local_fallback(self.fallback.share)

    def leave_window(self) -> None:
        """Keep tokens in the shared bucket again (a window learned wrong), and in a local
        one while Redis is away. The log's bookings are void (their epochs are the log's,
        begun from the clock, never the bucket's): their holders wake and book again. The
        front drains the bucket with the refusal's wait."""
        self.window = None
        if self._fallback_bucket is not None and self.fallback is not None:
            self._fallback_bucket = self._local_fallback(self.fallback.share)
        self._wake()

    async def _shared(
        self,
        op: str,
        cost: float = 1.0,
        extra: float = 0.0,
        booking: tuple[int, float, float] = (0, 0.0, 0.0),
        *,
        member: str = "",
        elapsed: float = 0.0,
        rate: float | None = None,
        ahead: float = 0.0,
        entry: str = "",
        reset: float = -1.0,
        late: float = -1.0,
        lead: float = 0.0,
    ) -> BucketReply:
        """One op on the shared bucket or log; remember what it said for the sync methods."""
        self._opened()
        if self.window is not None:
            reply = await self.log.run(
                op, limit=self.burst, window=self.window, cost=cost, extra=extra,
                slack=self.slack, epoch=booking[0], member=member, elapsed=elapsed,
                reset=reset, late=late, lead=lead,
            )  # fmt: skip
        else:
            reply = await self.bucket.run(
                op, rate=self.rate if rate is None else rate, burst=self.burst, cost=cost,
                extra=extra, ahead=ahead,
                slack=self.slack, booking=booking, entry=entry, lost=self._lost_refill(),
            )  # fmt: skip
        if self.window is not None:
            if self._log_epoch is not None and reply.epoch > self._log_epoch:
                self._wake()  # a void, here or in another process: book again now
            self._log_epoch = max(reply.epoch, self._log_epoch or 0)
        now = trio.current_time()
        blocked_until = now + reply.blocked_for if reply.blocked_for > 0 else -math.inf
        self._seen = (reply.tokens, now, blocked_until)
        self._seen_recoveries = self.link.recoveries
        self._proven = max(self._proven, reply.proven)
        if reply.exhausted_for is not None:
            self.ledger.exhaust(now + reply.exhausted_for)
        return reply

    def _lost_refill(self) -> float:
        """How long the shared bucket would take to fill by what this process last saw of it,
        for Redis to make it again no fuller should it have lost it (``BUCKET``): after an
        outage, all of it (this process spent tokens on its fallback that no reply showed);
        nothing before any reply."""
        if self._seen is None or self.rate is None:
            return 0.0
        if self.link.recoveries > self._seen_recoveries:
            return self.burst / self.rate
        tokens, seen_at, _ = self._seen
        return max(0.0, seen_at + (self.burst - tokens) / self.rate - trio.current_time())

    def _fallback_now(self) -> TokenBucket | SlidingLog | None:
        """The local fallback, emptied as each outage begins: Redis may have gone with the
        shared bucket spent to its last token. (Kept full while unused, it let a fresh burst
        through on the spot: the server refused one or two requests each time.)"""
        local, outage = self._fallback_bucket, self.link.outage_since
        if local is not None and outage is not None and outage != self._fallback_emptied:
            self._fallback_emptied = outage
            # Nothing before this process's own bookings on Redis start, either: their
            # tokens were the shared bucket's next ones.
            booked = max((due for due, _ in self._ahead), default=-math.inf)
            local.drain(max(0.0, booked - trio.current_time()))
        return local

    async def reserve(self, cost: float, max_wait: float) -> Booking | None:
        asked = trio.current_time()
        member = ""
        try:
            if self._told is not None:
                await self._adopt_told()
            async with self._turns.together():
                # Named as the op goes: a scope that turned to a window while this
                # waited its turn sent a bucket's empty name to the log, and the log,
                # holding a booking it could not read, failed every op after it.
                member = self.log.new_member(cost) if self.window is not None else ""
                reply = await self._shared("reserve", cost, max_wait, member=member)
        except LimiterUnavailableError:
            local = self._fallback_now()
            if local is None or (local.rate is not None and cost > local.burst):
                raise
            return local.reserve(cost, max_wait=max_wait)
        self._counts["reserved" if reply.granted else "refused"] += 1
        if not reply.granted:
            return None
        now = trio.current_time()
        if reply.wait > 0:
            self._own_ahead()  # those now due leave, so the heap stays as long as the queue
            heapq.heappush(self._ahead, (now + reply.wait, cost))
            self._ahead_tokens += cost
        else:
            self._commit(now, cost)
        before = member or reply.before  # a log's booking is named by its member
        took_full = self._took_full(reply)
        return Booking(
            now + reply.wait, reply.wait, cost, reply.epoch, before, reply.after, reply.shift,
            burst_began=self._burst_began(reply, asked), entry=reply.entry,
            took_full=took_full, pause=self._pause(reply) if took_full else 0.0,
        )  # fmt: skip

    def _took_full(self, reply: BucketReply) -> bool:
        """Whether this booking took a full shared bucket: it opened the latest burst
        (the script marks where a booking found the bucket full, ``opened``)."""
        return self.window is None and reply.opened > 0 and reply.opened_in == reply.wait

    def _pause(self, reply: BucketReply) -> float:
        """The slack the script kept after this booking, which took a full bucket, if
        it took it just as it filled again (a burst of one, paced: it starts when the
        bucket was full before it, ``before``), as a local bucket's ``Booking.pause``.

        That margin is for the request's way to the server, so its lateness is owed
        whole (`ScopeFront.headers_left`); a booking that opened an idle bucket keeps
        it as the burst's allowance for leaving late, and has none.
        """
        return self.slack if reply.before == reply.opened else 0.0

    def _burst_began(self, reply: BucketReply, asked: float) -> float | None:
        """When the shared burst this booking belongs to began, the first time this
        process books in it: on its own clock, as early as it can have been.

        Any process may have opened it, and the server refills from the first
        request of the burst to arrive, whoever sent it: measured from this
        process's own first booking, the lag of the processes that booked
        before it went unseen (four processes a few ms apart under load sent
        the request after the burst 20 ms early, and drew a 429). The script
        ran somewhere between asking and the answer, so the burst began no
        earlier than ``asked`` plus the offset the script gave.

        A process whose first booking in it starts a token or more after it
        began is not in the burst (the others took its tokens): its calls say
        nothing of how late the burst arrived, and counted from the burst
        they would read the wait for their turn as lag (1.2 s of slack).
        """
        if self.window is not None or reply.opened <= 0 or reply.opened == self._opened_seen:
            return None
        self._opened_seen = reply.opened
        if self.rate is None or reply.wait - reply.opened_in >= 1.0 / self.rate:
            return None
        return asked + reply.opened_in

    async def refund(self, booking: Booking) -> None:
        """Undo a booking; never raises, safe in ``finally``."""
        self._counts["refunded"] += 1
        if not isinstance(booking.before, float | str):  # booked on the local fallback
            if self._fallback_bucket is not None:
                self._fallback_bucket.refund(booking)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        with trio.CancelScope(shield=True):
            try:
                if isinstance(booking.before, str):
                    await self._shared(
                        "refund", booking=(booking.epoch, 0.0, 0.0), member=booking.before
                    )
                else:
                    await self._shared(
                        "refund",
                        booking.cost,
                        booking=(booking.epoch, booking.before, booking.after),
                        entry=booking.entry,
                    )
            except LimiterUnavailableError:
                if self._fallback_bucket is not None:
                    self._fallback_bucket.refund(booking)

    async def confirm(self, booking: Booking) -> float | None:
        """When the booking starts, or None if it is void. It holds if of the same
        epoch and not answered too late to start (``_answered_too_late``); a
        booking without a wait needs no trip. A block holds a booking of its
        epoch (made with the block known) until it ends.

        A schedule moved since the booking was made holds it at its new
        time: later by what a wider slack added (``widen``), sooner by a
        faster rate this process set (``_go_faster``). It waits until then,
        waking when the schedule moves again, and asks again.

        A log's booking is marked confirmed as it is asked, so that no void
        takes it once its request goes (a void takes every booking not
        confirmed, as the local log's does).
        """
        if booking.wait <= 0:
            await trio.lowlevel.checkpoint()
            return booking.starts
        logged = self.window is not None and isinstance(booking.before, str)
        while True:
            try:
                async with self._turns.together():
                    if logged:
                        reply = await self._shared(
                            "confirm",
                            booking=(booking.epoch, 0.0, 0.0),
                            member=str(booking.before),
                        )
                    else:
                        reply = await self._shared("peek")
            except LimiterUnavailableError:
                if self._fallback_bucket is None:
                    raise
                return booking.starts if self._fallback_bucket.confirm(booking) else None
            if reply.epoch != booking.epoch or (logged and not reply.granted):
                return None
            now = trio.current_time()
            start = self._retimed(booking) + max(0.0, reply.shift - booking.shift)
            if reply.blocked_for > 0:
                # Booked in this epoch, so after the block began: it holds, to start once
                # the block ends. (Dropped, as a holder woken early by a rescale found the
                # scope shut, its tokens stayed booked and it booked again behind them.)
                start = max(start, now + reply.blocked_for)
            if start <= now:
                if not logged and self._answered_too_late(start, now):
                    return None
                self._commit(booking.start, booking.cost)
                return start
            woken = self.voided()
            with trio.move_on_at(start):
                if woken is None:
                    await trio.sleep_forever()
                await woken.wait()
            # Re-timed as of ``now``: only what changes from here moves it again.
            booking = attrs.evolve(booking, start=start, wait=start - now, shift=reply.shift)

    def _answered_too_late(self, start: float, now: float) -> bool:
        """Whether a booking due at ``start`` is confirmed so late, at ``now``, that it may
        not start: later than the slack allows by half a token or more, it is nearer
        the next booking's start than its own.

        Redis frozen for 0.3 s answered every confirm sent in its last 0.25 s
        (the op timeout) at once as it woke, and two bookings of a 6/s bucket
        with a burst of one, due 0.17 s apart, started in the same
        millisecond. Such a booking is void (`fanout._admission` refunds it
        and books again): it starts after what the bucket holds now.
        """
        return self.rate is not None and now - start > self.slack + 0.5 / self.rate

    def _retimed(self, booking: Booking) -> float:
        """When ``booking`` starts after the rate increases made here since it was booked."""
        start, booked_at = booking.start, booking.start - booking.wait
        for when, factor in self._rescales:
            if booked_at < when < start:
                start = when + (start - when) * factor
        return start

    async def wait_for(self, cost: float) -> float:
        try:
            return (await self._shared("peek", cost)).wait
        except LimiterUnavailableError:
            local = self._fallback_now()
            if local is None:
                raise
            return local.wait_for(min(cost, local.burst))

    async def answered(
        self, sent: float, arrived_by: float, *, booked_by: float | None, set_up: float,
        way: float | None = None,
    ) -> None:  # fmt: skip
        """A log holds a booking from when its request reached the server (one round trip).
        The shared log keeps what it was told (`SlidingLog.answered` holds a request
        sooner once ``set_up`` shows it arrived sooner; the shared one does not yet)."""
        if self.window is None:
            await trio.lowlevel.checkpoint()
            return
        if isinstance(self._fallback_bucket, SlidingLog):
            self._fallback_bucket.answered(
                sent, arrived_by, booked_by=booked_by, set_up=set_up, way=way
            )
        now = trio.current_time()
        with contextlib.suppress(LimiterUnavailableError):
            await self._shared("answered", extra=now - arrived_by, elapsed=now - sent)

    def delayed(self, booked_by: float) -> None:
        """As ``left``: only the local log while Redis is away holds a delayed request's
        token until it leaves."""
        if isinstance(self._fallback_bucket, SlidingLog):
            self._fallback_bucket.delayed(booked_by)

    def left(self, booked_by: float, *, anew: bool = False) -> None:
        """Only the local log while Redis is away counts a late request from when it left;
        the shared log counts it from its booking until its answer says when it arrived."""
        if isinstance(self._fallback_bucket, SlidingLog):
            self._fallback_bucket.left(booked_by, anew=anew)

    def written(self, booked_by: float, late: float, *, read_late: float = 0.0) -> None:
        """As ``left``: only the local log while Redis is away counts a request from when
        its headers were written."""
        if isinstance(self._fallback_bucket, SlidingLog):
            self._fallback_bucket.written(booked_by, late, read_late=read_late)

    def departure_wait(self, booked_by: float) -> float:
        """As ``left``: only the local log while Redis is away waits for a window's token
        as a request leaves; the shared log's other processes' requests are not seen."""
        if isinstance(self._fallback_bucket, SlidingLog):
            return self._fallback_bucket.departure_wait(booked_by)
        return 0.0

    async def hold_started(self, starts: Sequence[tuple[float, float]]) -> None:
        """Requests (start, cost) that started before the log did: each a phantom in the
        shared log (and the local one while Redis is away) from its start."""
        if isinstance(self._fallback_bucket, SlidingLog):
            self._fallback_bucket.hold_started(starts)
        if self.window is None or not starts:
            await trio.lowlevel.checkpoint()
            return
        now = trio.current_time()
        with contextlib.suppress(LimiterUnavailableError):
            for start, cost in starts:
                await self._shared("held", cost=cost, elapsed=now - start)

    async def drain(self, blocked_for: float) -> None:
        self._counts["drained"] += 1
        if self._fallback_bucket is not None:
            self._fallback_bucket.drain(blocked_for)
        with contextlib.suppress(LimiterUnavailableError):
            await self._shared("drain", extra=max(0.0, blocked_for))

    async def block_until(self, when: float) -> None:
        if self._fallback_bucket is not None:
            self._fallback_bucket.block_until(when)
        delay = when - trio.current_time()
        if delay <= 0:
            await trio.lowlevel.checkpoint()
            return
        with contextlib.suppress(LimiterUnavailableError):
            await self._shared("block", extra=delay)
            self._wake()  # the block gave back what it voided: book again now

    async def sync(self, count: ServerCount) -> None:
        """Lowers the shared bucket to the server's estimate, only from above the most it
        can have (`TokenBucket.sync`), and raises it to the least the server holds,
        less what the others started that it may not have counted (`_adopt`).

        It goes alone (``_Turns``): this process's bookings sure to start that
        the count could not take off (Redis took them after it was made) are
        taken off here, and so is what the server said remained when the
        limits were learned, if no sync has taken it in yet (``set_limits``).
        """
        if self.window is not None:
            # As the local log reads it (`SlidingLog.sync`): a count of this limit may
            # free entries the server forgot, and its Reset (a moment after it) the oldest
            # it counted.
            of_limit = count.of_limit(self.burst)
            given = count.reset_after
            reset = past_reset(given) if of_limit and given is not None else -1.0
            with contextlib.suppress(LimiterUnavailableError):
                await self._shared(
                    "sync", extra=count.remaining, elapsed=count.elapsed, reset=reset,
                    late=max(TOGETHER, count.late) if of_limit else -1.0,
                    lead=count.reset_lead,
                )  # fmt: skip
            return
        if self.rate is None:
            await trio.lowlevel.checkpoint()
            return
        with contextlib.suppress(LimiterUnavailableError):
            async with self._turns.alone():
                unseen = self._committed_after(count.counted_by(trio.current_time()))
                estimate = count.estimate(self.rate, self.burst) - unseen
                # As the local bucket reads it: a whole count is floored, so the bucket
                # is lowered only from above the most the server can have.
                most = count.at_most(self.rate, self.burst) - unseen
                told = self._told_now()
                if told is not None:
                    estimate, most = min(estimate, told), min(most, told)
                before = (await self._shared("sync", extra=estimate, booking=(0, most, 0.0))).epoch
                self._told = None
                if self.window is not None:
                    return  # a window was learned meanwhile: its log has nothing to adopt
                adopt = count.at_least(self.burst) - unseen
                ahead = self._own_ahead()
                if adopt >= self._projected()[0] + ahead + SURPLUS:  # as last seen: worth asking
                    # The others' requests sent up to the spread of arrivals before this
                    # one may have reached the server after it, and each leaves up to
                    # the slack after its start.
                    since = count.elapsed + max(TOGETHER, count.late) + self.slack
                    await self._adopt(adopt, ahead, since=since, epoch=before)

    def _commit(self, start: float, cost: float) -> None:
        """A booking of this process's is sure to start at ``start`` (a void cannot take it)."""
        bisect.insort(self._committed, (start, cost))  # almost always at the end
        del self._committed[
            : bisect.bisect_left(self._committed, (trio.current_time() - _COMMITTED_KEPT,))
        ]

    def _committed_after(self, since: float) -> float:
        """Tokens of this process's bookings sure to start, that start after ``since``:
        only those are read (about a round trip's worth), not all that are kept."""
        first = bisect.bisect_right(self._committed, (since, math.inf))
        return sum(cost for _, cost in self._committed[first:])

    def _told_now(self) -> float | None:
        """What the server said remained when the limits were learned, refilled
        since then and less what this process surely started since."""
        if self._told is None or self.rate is None:
            return None  # never told, or a log now (``use_window`` forgets it)
        tokens, at = self._told
        refilled = tokens + (trio.current_time() - at) * self.rate
        return min(self.burst, refilled) - self._committed_after(at)

    async def _adopt_told(self) -> None:
        """Take in what the server said remained, before booking against the new limits."""
        async with self._turns.alone():
            told = self._told_now()
            if told is not None:
                await self._shared("sync", extra=told, booking=(0, told, 0.0))
            self._told = None

    async def others_started(self) -> list[tuple[float, float]]:
        """The (start, cost), on this process's clock, of what the other processes
        sharing the bucket started since this process last asked.

        A process that learns the rate counts every start the server's
        ``Remaining`` was drawn down by: counting only its own, it took the
        others' for a slower refill, learned under 1/s against a 20/s server,
        and booked the shared schedule at that pace for everyone. A log
        (``window``) keeps no such record; nor does Redis while it is away.
        """
        if self.window is not None:
            await trio.lowlevel.checkpoint()
            return []
        # One read at a time: answers arrive together, and two reads from the same
        # place would both return (and count) the same starts.
        async with self._reading_starts:
            try:
                now, self._starts_read, found = await self.bucket.started_by_others(
                    self._starts_read
                )
            except LimiterUnavailableError:
                return []
        here = trio.current_time()
        return [(here - (now - start), cost) for start, cost in found]

    def _own_ahead(self) -> float:
        """Tokens of this process's bookings not yet due (each is forgotten once due:
        a refunded one stays counted until then, which only makes adopting rarer)."""
        now = trio.current_time()
        while self._ahead and self._ahead[0][0] <= now:
            self._ahead_tokens -= heapq.heappop(self._ahead)[1]
        return max(0.0, self._ahead_tokens)

    async def _adopt(self, adopt: float, ahead: float, *, since: float, epoch: int) -> None:
        """Raise the shared bucket to ``adopt``, the least the server holds by this
        process's counts, less what the other processes started in the last ``since``
        s (``adopt`` in ``BUCKET``), as the local bucket adds a surplus it could not
        see the server refill. Every booking ahead (``ahead`` tokens of them this
        process's) is void, and wakes to book again.

        Only the sole booker adopted before: four processes learning one 20/s
        server took turns to book, none ever was, and they paced at their first
        guess of 10/s while the server's bucket filled up (1.5-2.0 times the
        minimum)."""
        reply = await self._shared("adopt", extra=adopt, booking=(0, since, 0.0), ahead=ahead)
        if reply.epoch != epoch:
            self._ahead.clear()
            self._ahead_tokens = 0.0
            self._wake()

    def set_limits(self, rate: float | None, burst: float, *, tokens: float | None = None) -> None:
        """Each script refills with the limits its caller sends; processes agree once
        each has the same limits.

        ``tokens`` (what the server said remains, as a rate is first learned)
        lowers the shared bucket at the next sync or booking, whichever comes
        first: a bucket first given a rate is full, and learning's first
        limits on Redis let the two requests of its probe out again (a second
        429 where one was due). Later ones are left to the syncs: those after
        a 429 are counted from the end of its block, which the shared
        bucket's drain already holds empty.

        A faster rate (a learning scope measured it) first re-times what is
        booked ahead (``_go_faster``), as the local bucket lets its bookings
        ahead book again: a turn booked at a first guess would otherwise keep
        that pace to its end. Until then this process books at the old rate,
        which the shared schedule still holds.
        """
        first = self.rate is None and self._faster_to is None and self.window is None
        if first and rate is not None and tokens is not None and math.isfinite(tokens):
            self._told = (tokens, trio.current_time())
        if self._fallback_bucket is not None and self.fallback is not None:
            share = self.fallback.share
            self._fallback_bucket.set_limits(
                rate * share if rate is not None else None, max(1.0, burst * share)
            )
        self.burst = burst
        old = self.rate
        faster = old is not None and rate is not None and rate > old
        if faster and self.window is None and self.nursery is not None:
            self._faster_to = rate
            self.nursery.start_soon(self._go_faster)
            return
        self._faster_to = None
        self.rate = rate

    def set_slack(self, slack: float) -> None:
        """A wider slack reaches the shared tokens, as it does a local bucket or log.

        A log's bookings ahead are void: they were placed with the narrower
        window, and their holders book again on waking. A busy bucket's
        whole schedule moves that much later (the burst under way was booked
        before the lag that widened it was seen, so without this the request
        after it leaves early and draws a 429): each booking ahead starts
        later by the move (``confirm``), in the same order; voiding them
        would queue every one of them again behind the tokens they hold.
        """
        wider = slack > self.slack
        self.slack = slack
        if self._fallback_bucket is not None:
            self._fallback_bucket.set_slack(slack)
        if wider and self.nursery is not None:
            self.nursery.start_soon(self._widen, slack)

    async def _widen(self, slack: float) -> None:
        with contextlib.suppress(LimiterUnavailableError):
            if self.window is not None:
                await self._shared("void")
            elif self.rate is not None:
                await self._shared("widen", extra=slack)

    async def _go_faster(self) -> None:
        """Contract the shared schedule to the faster rate, then book at it.

        The bookings ahead keep their order and start sooner: each holder
        here wakes (``voided``) and re-times its own (``confirm``). Other
        processes' holders start at their old times, later than they may:
        never sooner than allowed. The script reads the schedule at the rate
        of whoever laid it last, so processes that learn the same rise
        contract it once (contracted by each, the next booking went at 0.075
        s where 20/s allows 0.15 s), and each re-times its own holders by its
        own old rate. If Redis does not answer, nothing was
        contracted, and booking at the faster rate against the longer
        schedule only starts later.

        It goes alone (``_Turns``): a booking sent at the old rate that Redis
        took after the contraction was never re-timed, and a shut window
        reopened at 1.9 a second kept a booking every 3 s (its rate while
        shut) until calls ran out of time.
        """
        async with self._rescaling, self._turns.alone():
            faster, old = self._faster_to, self.rate
            if faster is None or old is None or faster <= old:
                return
            with contextlib.suppress(LimiterUnavailableError):
                await self._shared("rescale", extra=old, rate=faster)
                self._rescales.append((trio.current_time(), old / faster))
                del self._rescales[:-_RESCALES_KEPT]
            if self._faster_to == faster:
                self._faster_to = None
                self.rate = faster
            self._wake()

    def _wake(self) -> None:
        """Wake this process's holders (``voided``): their bookings moved or are void."""
        woken, self._wakeup = self._wakeup, None
        if woken is not None:
            woken.set()

    def voided(self) -> trio.Event | None:
        """Set when this process re-times the schedule to a faster rate, adopts a
        surplus or blocks the bucket (which gives back what it voids), or, for a
        log, when any reply shows a newer epoch (a void here, or one by another
        process seen on this one's next trip): its holders wake to re-time or
        book again. (Holders that slept to their start past a void found the
        places or tokens it freed booked again behind them: a window late, or a
        shut server's probe a second or more after it reopened.) Other voids of
        a bucket are not heard of here: waiters confirm on waking. (Woken at
        every void any process made, four processes learning one bucket drew a
        429 in 5 of 6 runs, against 1 of 7.)"""
        if self._wakeup is None:
            self._wakeup = trio.Event()
        return self._wakeup

    def estimated_wait(self, cost: float) -> float:
        """From the bucket as last seen, refilled to now on trio's clock."""
        tokens, blocked_until = self._projected()
        now = trio.current_time()
        wait = max(0.0, blocked_until - now)
        if self.rate is not None:
            available = min(self.burst, tokens + wait * self.rate)
            wait += max(0.0, min(cost, self.burst) - available) / self.rate
        return wait

    def _projected(self) -> tuple[float, float]:
        if self._seen is None:
            return self.burst, -math.inf
        tokens, seen_at, blocked_until = self._seen
        if self.rate is None:
            return self.burst, blocked_until
        refilled = tokens + (trio.current_time() - seen_at) * self.rate
        return min(self.burst, refilled), blocked_until

    def retimed(self, booking: Booking) -> Booking:
        """A shared booking as it is: ``confirm`` follows the shared schedule's moves
        itself, and holds it until its new start. One booked on the local fallback
        while Redis was away (``refund`` tells them apart the same way) moves with that
        bucket."""
        local = self._fallback_bucket
        if isinstance(local, TokenBucket) and not isinstance(booking.before, float | str):
            return local.retimed(booking)
        return booking

    def owe(self, tokens: float) -> None:
        """The server lost ``tokens`` (`ScopeFront.headers_left`): the shared schedule
        moves that much later, each booking ahead with it (``confirm``), as a wider
        slack moves it (``widen``)."""
        if isinstance(self._fallback_bucket, TokenBucket):
            self._fallback_bucket.owe(tokens)
        if self.nursery is not None and self.window is None and self.rate is not None:
            self.nursery.start_soon(self._tell, "owe", tokens)

    async def _tell(self, op: str, extra: float) -> None:
        """Run ``op`` (``owe``, ``prove``) on the shared bucket from the scope's own
        nursery; if Redis does not answer, only what it would have told is lost."""
        with contextlib.suppress(LimiterUnavailableError):
            await self._shared(op, extra=extra)

    def prove(self, rate: float) -> None:
        """This process's counts proved the server refills ``rate`` tokens a second at
        least: every process sharing the bucket learns it with its next op (``prove``).

        Each learned only from its own answers before, one in four where four
        shared the limit: paced at their first guess of 10/s against a 20/s server
        for half a second or more after one had proved 17/s, each booking at its
        own rate. A rate one process only guessed (a slow start's) is not shared.
        """
        if self.nursery is not None and self.window is None and rate > self._proven:
            self._proven = rate
            self.nursery.start_soon(self._tell, "prove", rate)

    def proven(self) -> float:
        """The fastest refill any process sharing the bucket proved, as last seen."""
        return self._proven

    def share_exhaustion(self, until: float) -> None:
        """Tell every process the quota is spent (a marker key with a TTL)."""
        if self.nursery is not None:
            self.nursery.start_soon(self.bucket.mark_exhausted, until - trio.current_time())

    def blocked_until(self) -> float:
        _, blocked_until = self._projected()
        return blocked_until

    def bucket_statistics(self) -> BucketStatistics:
        tokens, blocked_until = self._projected()
        return BucketStatistics(
            rate=self.rate, burst=self.burst, tokens=tokens, blocked_until=blocked_until,
            reserved=self._counts["reserved"], refused=self._counts["refused"],
            refunded=self._counts["refunded"], drained=self._counts["drained"], window=self.window,
        )  # fmt: skip

    @property
    def shared(self) -> bool:
        """Yes: every process naming the scope spends the same tokens."""
        return True


@attrs.define(eq=False)
class RedisScope(ScopeFront):
    """Limits shared by every process that names the same scope on one Redis.

    Configure it as ``Scope`` (``ScopeFront``'s options), plus: ``client``,
    a coredis client the caller has entered (or use ``from_url``); ``prefix``
    of every key; ``lease_ttl``, how long a slot outlives a crashed holder;
    ``op_timeout``, the longest one Redis operation may take; ``recheck_after``,
    how long Redis is left alone after it failed; ``fallback``, what to do
    while it is away (None: refuse). Use it inside ``async with scope:``.
    """

    client: RedisClient = attrs.field(repr=False, validator=a_client)
    name: str
    prefix: str = attrs.field(default="fanout:", kw_only=True, validator=a_prefix)
    lease_ttl: float = attrs.field(default=10.0, kw_only=True, validator=positive)
    op_timeout: float = attrs.field(default=0.25, kw_only=True, validator=positive)
    recheck_after: float = attrs.field(default=1.0, kw_only=True, validator=positive)
    fallback: LocalFallback | None = attrs.field(
        default=None, kw_only=True, validator=_optional_fallback
    )
    _owns_client: bool = attrs.field(init=False, default=False)
    _manager: contextlib.AbstractAsyncContextManager[trio.Nursery] | None = attrs.field(
        init=False, default=None
    )
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"a scope needs a non-empty string name, not {self.name!r}")
        self._told_window()
        self._build()

    def _build(self) -> None:
        base = scope_key_base(self.prefix, self.name)  # one cluster slot per scope
        link = RedisLink(self.client, self.name, self.op_timeout, self.recheck_after, self.fallback)
        leases = None
        if self.max_concurrency is not None:
            leases = SharedLeases(link, f"{base}:leases", self.max_concurrency, self.lease_ttl)
        per = self.per
        exhausted = f"{base}:exhausted"
        backend = RedisBackend(
            link, SharedBucket(link, f"{base}:bucket", exhausted),
            SharedWindow(link, f"{base}:window", f"{base}:window-state", exhausted), leases,
            self._ledger, self.fallback, self.rate, self._initial_burst(), per,
        )  # fmt: skip
        self._start_front(backend)

    @classmethod
    def from_url(cls, url: str, *, name: str, cluster: bool = False, **options: Any) -> RedisScope:
        """A scope with a client of its own on ``url`` (``redis://host:6379/0``).

        ``rediss://`` connects over TLS; ``cluster=True`` treats ``url`` as a
        startup node of a Redis Cluster (see ``_redis_client``). ``options``
        are the scope's own (``rate``, ``burst``, ``max_concurrency``,
        ``learn``, ``lease_ttl``, ``fallback``, ...). The client opens and
        closes with ``async with scope:``.
        """
        client = client_from_url(url, cluster=cluster)
        scope = cls(client, name, **options)
        scope._owns_client = True
        return scope

    # -- lifetime -----------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._nursery is not None:
            raise UsageError(f"RedisScope {self.name!r} is already open; enter it once")
        # What it keeps here is on trio's clock: entered in a new trio.run, it starts afresh.
        self.note_run(current_run())
        if self._owns_client:
            await self.client.__aenter__()
        try:
            manager = trio.open_nursery()
            self._nursery = await manager.__aenter__()
        except BaseException:
            if self._owns_client:
                await self.client.__aexit__(None, None, None)
            raise
        self._manager = manager
        backend = self._backend
        assert isinstance(backend, RedisBackend)
        backend.open(self._nursery)
        if self._learner is not None:
            self._nursery.start_soon(self._hear_proofs)
        return self

    async def _hear_proofs(self) -> None:
        """While calls of this process wait on the shared bucket, ask Redis every
        ``_HEAR_EVERY`` s what the others proved the server refills (`_take_proof`).

        Its holders sleep until their bookings start, booked at the pace this
        process knew then, and only its own answers told it of a faster one: a
        process whose calls all waited had none. Four processes learning one
        20/s server took turns, the last waiting at its first guess of 10/s for
        two seconds after another had proved 19/s.
        """
        while True:
            await trio.sleep(_HEAR_EVERY)
            if self._ledger.waiting:
                with contextlib.suppress(LimiterUnavailableError):
                    await self._backend.wait_for(1.0)  # a read: each reply tells the proof
                self._take_proof()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The block's own exception is not passed down: the nursery (and
        # coredis's task group) would wrap it in an ExceptionGroup, and only
        # the background tasks' failures belong to them.
        nursery, manager = self._nursery, self._manager
        assert nursery is not None
        assert manager is not None
        nursery.cancel_scope.cancel()
        try:
            await manager.__aexit__(None, None, None)
        finally:
            self._nursery = self._manager = None
            backend = self._backend
            assert isinstance(backend, RedisBackend)
            backend.nursery = None
            if self._owns_client:
                await self.client.__aexit__(None, None, None)


if TYPE_CHECKING:

    def _fits_the_protocol(scope: RedisScope) -> ScopeLike:
        return scope  # mypy checks that RedisScope implements ScopeLike
