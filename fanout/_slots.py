"""Slots: taking one by a deadline, and the cap a scope learns from 503s.

A server may limit how many requests it works on at once, and say so only by
refusing the one over its cap: ``503`` (overloaded), with a ``Retry-After``
for when a request in flight should be done. No header states the cap, so a
scope nobody told ``max_concurrency`` learns it, in this process, from what
such a refusal shows: the server had its cap of requests in when the refused
one arrived, and could only have been counting ours that were on the wire
when it was sent. With ``n`` others out then, the cap is at most ``n``. From
then on no more than that many of the scope's requests are out at once, and
a later refusal lowers it further. Without this, a scope learning its rate
against 10/s with a cap of 4 sent its whole burst at every reopening: 5 of 9
refused each time, 19 refusals and 7 calls given up.

A request is on the wire from its send until its answer is read. A server
counts it out only once it has sent that answer, so a request that takes an
answered one's place at once may find it still counted: a refusal under the
cap, within a round trip of an answer, keeps the cap and spaces the places
after answers instead (`LearnedCap.overloaded`).

Only ``503`` is read so. A ``429`` is about the rate, and often the rate of
something else than requests (tokens a minute) while ``Remaining`` requests
is still positive: taken for a cap, the calls in flight at one 429 would have
capped a scope for good. A ``503`` with nothing else on the wire says nothing
of a cap: it is the rate's (or the server's) to answer for.

A cap learned from one overloaded moment is not a law: it grows by one
every minute without a refusal, so a long-lived scope finds its way back.

Until a refusal shows the cap, every request over it is refused: a scope told
nothing sent the wave its stated burst allowed after the probe, and against a
cap of 4 drew four 503s at once. So a scope that learns its rate, told no
cap, sends the requests that would put more on the wire than an answer ever
proved the server takes (`LearnedCap.try_past`) one at a time, `TRIAL_SPACING`
apart: where a server refuses over its cap as a request arrives, and its
refusal is back within that spacing, the first over the cap is the only one
refused. A refusal that takes longer (a distant server) is not waited for:
spacing a burst by a network's round trip would cost every scope told
nothing that much a request, cap or not.
"""

from __future__ import annotations

import math

import attrs
import trio

__all__ = ["LearnedCap", "Leaving", "take_slot"]

_REGROW = 60.0  # seconds without a refusal for the learned cap to grow by one
_GAP_TRIES = 4  # round trips the gap after an answer may grow to before a cap is lowered
TRIAL_SPACING = 0.002  # seconds between requests on the wire past the most proven (docstring)


async def take_slot(limiter: trio.CapacityLimiter, holder: object, deadline: float) -> bool:
    """A slot now if free, else by ``deadline``; never past it.

    As trio's ``CapacityLimiter.acquire``: a cancel point before, none after
    a slot is taken, so a slot taken is never dropped.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        limiter.acquire_on_behalf_of_nowait(holder)
    except trio.WouldBlock:
        with trio.move_on_at(deadline):
            await limiter.acquire_on_behalf_of(holder)
            return True
        return False
    await trio.lowlevel.cancel_shielded_checkpoint()
    return True


@attrs.frozen
class Leaving:
    """A request leaving: ``others`` of the scope on the wire with it; ``overruled``: it
    waited for its place while the rate refused one, so needs a token anew;
    ``since_answer``: how long after the scope's latest answer it left (under a
    learned cap; otherwise not measured); ``under_cap``: a cap was learned
    when it left."""

    others: int
    overruled: bool = False
    since_answer: float = math.inf
    under_cap: bool = False


@attrs.define(eq=False)
class LearnedCap:
    """The requests on the wire a server's 503s allow this process (module docstring).

    It counts the scope's requests on the wire, which is what a refusal is
    read against, and once a refusal shows a cap, a request waits to leave
    while that many are out. The wait is at the wire, not at admission: calls
    already admitted, waiting for their tokens when the cap is learned, are
    held to it too. Places pass in order: an answer hands its place to the
    request that waited longest.
    """

    _learned: int | None = None
    _lowered_at: float = -math.inf
    _waiting: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _throttled: int = 0  # the rate's refusals so far
    _answered_at: float = -math.inf
    _gap: float = 0.0  # how long after an answer its place is used again
    # Nobody told a cap: the most on the wire at once an answer proved (`try_past`),
    # and when the latest request past it left. None: requests leave as they come.
    _proven: int | None = None
    _tried_at: float = -math.inf
    _trying: int = 0  # requests waiting to go past it
    on_the_wire: int = 0

    @property
    def limit(self) -> int | None:
        """The cap now, grown back by one for each minute since it was lowered."""
        if self._learned is None:
            return None
        grown = (trio.current_time() - self._lowered_at) // _REGROW
        return self._learned + int(min(grown, 1e6))

    async def sending(self) -> Leaving:
        """A request is about to leave: wait for a place under the cap; how many others are out.

        A request that waited while the rate refused one (`throttled`) is
        told so: the token it was admitted on was spent before that refusal
        emptied the bucket, and it must not go out on it, as a booking the
        refusal voided would not (a storm of 48 429s, each refused request's
        place passed at once to the next). So is one that waited to go past
        the most proven (`try_past`): a wave of 429s 2 ms apart, otherwise.
        """
        throttled = self._throttled
        if self._proven is not None and self.limit is None:
            await self._past_proven()
        limit = self.limit
        if limit is None:
            self.on_the_wire += 1
            return Leaving(self.on_the_wire - 1, overruled=self._throttled != throttled)
        # A cancel point before the check, none between it and taking the place.
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.on_the_wire >= limit or self._waiting:
            await self._waiting.park()  # ``answered`` handed its place over, counted
        else:
            self.on_the_wire += 1
        try:
            await trio.sleep_until(self._answered_at + self._gap)
        except BaseException:
            self._give_back()
            raise
        return Leaving(
            self.on_the_wire - 1,
            overruled=self._throttled != throttled,
            since_answer=trio.current_time() - self._answered_at,
            under_cap=True,
        )

    def try_past(self, proven: int) -> None:
        """Nobody told this scope a cap: requests beyond ``proven`` on the wire at once
        (and beyond what answers prove later, `proved`) leave `TRIAL_SPACING` apart."""
        self._proven = proven

    def proved(self, leaving: Leaving) -> None:
        """The server admitted a request that left as ``leaving`` says: it took that
        many of the scope's requests at once (or fewer, had some been answered)."""
        if self._proven is not None:
            self._proven = max(self._proven, leaving.others + 1)

    async def _past_proven(self) -> None:
        """Wait while this request would be on the wire past the most proven, or others
        wait so, until `TRIAL_SPACING` after the latest one that went; none between
        the last check and the caller counting it on the wire.

        Those waiting leave one at a time even once answers prove more: they took
        their tokens at the pace of their bookings, and let go together when an
        answer proved room for them, four reached a log that had none at once.
        """
        self._trying += 1
        try:
            while self.limit is None and self._proven is not None:
                if self._trying == 1 and self.on_the_wire < self._proven:
                    return
                now = trio.current_time()
                if now >= self._tried_at + TRIAL_SPACING:
                    self._tried_at = now
                    return
                await trio.sleep_until(self._tried_at + TRIAL_SPACING)
        finally:
            self._trying -= 1

    def throttled(self) -> None:
        """The rate refused a request (a 429): requests waiting here need a token anew."""
        self._throttled += 1

    def answered(self) -> None:
        """A request's answer (or its failure) is back: its place is free, or passed on."""
        self._answered_at = trio.current_time()
        self._give_back()

    def hand_on(self) -> None:
        """A request that waited for its place may not use it (`Leaving.overruled`): the
        place passes on as if it had never been taken, and no answer came."""
        self._give_back()

    def _give_back(self) -> None:
        limit = self.limit
        if self._waiting and (limit is None or self.on_the_wire <= limit):
            self._waiting.unpark()
            return
        self.on_the_wire = max(0, self.on_the_wire - 1)

    def overloaded(self, leaving: Leaving, round_trip: float, *, quickest: float = 0.0) -> bool:
        """A 503 to a request that left as ``leaving`` says and was refused ``round_trip``
        after; True when it shows a cap. ``quickest``: the quickest answer the
        server gave a request it admitted.

        Under a cap already learned, one that left within a round trip of an
        answer may have reached a server that had not yet counted that answer's
        request out (a server counts it out once it has sent the answer): the
        cap stays, and a place is used again only that much after an answer,
        twice as long at each such refusal. In real time, each lowered a cap
        of 4 to 3 in two of three runs, at a quarter of the throughput. Only a
        refusal quicker than any admitted answer (refused as it arrived) is
        read so: a slow one would have spaced every later request by its
        whole round trip.
        """
        others = leaving.others
        if others < 1:
            return False
        limit = self.limit
        racing = (
            limit is not None and others < limit and round_trip < quickest
            and leaving.since_answer <= round_trip
        )  # fmt: skip
        if racing and self._gap < _GAP_TRIES * round_trip:
            self._gap = max(2 * self._gap, round_trip)
            return True
        self._learned = others if limit is None else min(limit, others)
        self._lowered_at = trio.current_time()
        return True
