"""The token bucket: bookings with a maximum wait, refunds, drains and blocks, on trio's clock."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fanout import Booking, ConfigurationError, Scope, ServerCount, TokenBucket

if TYPE_CHECKING:
    from fanout._window import SlidingLog


def waits(bookings: list[Booking | None]) -> list[float | None]:
    return [None if b is None else b.wait for b in bookings]


def start_now(tokens: TokenBucket | SlidingLog, calls: int) -> None:
    """Book ``calls`` that start at once and confirm them, as admission does (a booking
    counts as started only once confirmed)."""
    for _ in range(calls):
        booking = tokens.reserve()
        assert booking is not None
        assert booking.wait == 0
        assert tokens.confirm(booking)


async def test_burst_is_free_then_reservations_queue_at_the_rate(autojump_clock: Any) -> None:
    """A full bucket admits `burst` at once; later reservations wait 1/rate more each."""
    bucket = TokenBucket(rate=4, burst=2)
    assert waits([bucket.reserve() for _ in range(5)]) == [0, 0, 0.25, 0.5, 0.75]


async def test_refused_reservation_consumes_nothing(autojump_clock: Any) -> None:
    """A wait beyond max_wait is refused and leaves the tokens exactly as they were."""
    bucket = TokenBucket(rate=1, burst=1)
    bucket.reserve()
    before = bucket.statistics().tokens
    assert bucket.reserve(max_wait=0.5) is None
    after = bucket.statistics()
    assert after.tokens == before
    assert after.refused == 1
    booking = bucket.reserve(max_wait=1.0)
    assert booking is not None
    assert booking.wait == 1.0


async def test_refund_of_the_latest_booking_undoes_it_exactly(autojump_clock: Any) -> None:
    """A caller that gives up hands its token back; the next caller gets its slot."""
    bucket = TokenBucket(rate=2, burst=1)
    bucket.reserve()
    booking = bucket.reserve()
    assert booking is not None
    assert booking.wait == 0.5
    bucket.refund(booking)
    assert bucket.wait_for() == 0.5
    await trio.sleep(0.5)
    assert bucket.wait_for() == 0


async def test_refund_of_an_earlier_booking_leaves_a_hole_a_later_call_fills(
    autojump_clock: Any,
) -> None:
    """An earlier booking's refunded slot is reused by the next call, not duplicated."""
    bucket = TokenBucket(rate=1, burst=1)
    _, second, third = (bucket.reserve() for _ in range(3))
    assert second is not None
    assert third is not None
    assert (second.start, third.start) == (1.0, 2.0)
    bucket.refund(second)
    again = bucket.reserve()
    assert again is not None
    assert again.start == 1.0
    after = bucket.reserve()
    assert after is not None
    assert after.start == 3.0  # never a second start at 1.0 or 2.0


async def test_refill_is_capped_at_burst(autojump_clock: Any) -> None:
    """An idle bucket never holds more than its burst."""
    bucket = TokenBucket(rate=10, burst=3)
    await trio.sleep(100)
    assert bucket.statistics().tokens == 3
    assert waits([bucket.reserve() for _ in range(4)]) == [0, 0, 0, pytest.approx(0.1)]


async def test_drain_empties_and_blocks_until_the_server_wait(autojump_clock: Any) -> None:
    """After a 429 nothing starts before the server's wait, and the burst is gone."""
    bucket = TokenBucket(rate=5, burst=5)
    bucket.drain(0.2)
    assert bucket.wait_for() == 0.2
    assert waits([bucket.reserve(), bucket.reserve()]) == [0.2, pytest.approx(0.4)]


async def test_bucket_without_rate_still_obeys_blocks(autojump_clock: Any) -> None:
    """rate=None means unlimited, except while the server has said to wait."""
    bucket = TokenBucket(rate=None)
    assert waits([bucket.reserve(5) for _ in range(3)]) == [0, 0, 0]
    bucket.drain(1.5)
    assert waits([bucket.reserve()]) == [1.5]
    await trio.sleep(1.5)
    assert waits([bucket.reserve()]) == [0]


async def test_a_bucket_without_rate_given_one_starts_full(autojump_clock: Any) -> None:
    """Without a rate nothing was counted, so the first rate comes with its whole
    burst: a slow start that knows the server took four at once sends the next
    four at once, not one and then one per token (kept at the old burst of one,
    each wave behind an in-flight cap kept that stagger to its end)."""
    bucket = TokenBucket(rate=None)
    assert waits([bucket.reserve() for _ in range(4)]) == [0, 0, 0, 0]
    bucket.set_limits(40.0, 4.0)
    assert waits([bucket.reserve() for _ in range(5)]) == pytest.approx([0, 0, 0, 0, 0.025])
    told = TokenBucket(rate=None)
    told.set_limits(40.0, 4.0, tokens=1.0)  # what the server said remains still wins
    assert waits([told.reserve() for _ in range(2)]) == pytest.approx([0, 0.025])


async def test_weighted_cost_reserves_several_tokens(autojump_clock: Any) -> None:
    """A call costing 3 takes 3 tokens; one costing more than the burst is a clear error."""
    bucket = TokenBucket(rate=1, burst=4)
    assert waits([bucket.reserve(3), bucket.reserve(3)]) == [0, 2]
    with pytest.raises(ConfigurationError, match="can never start"):
        bucket.reserve(5)


@pytest.mark.parametrize(
    ("rate", "burst"), [(0, 1), (-1, 1), (float("nan"), 1), (1, 0.5), (math.inf, 1), (1, math.inf)]
)
def test_impossible_limits_are_rejected(rate: float, burst: float) -> None:
    """Zero, negative, NaN or infinite rates and bursts below one fail at construction."""
    with pytest.raises(ConfigurationError):
        TokenBucket(rate=rate, burst=burst)


async def test_set_limits_keeps_what_is_owed(autojump_clock: Any) -> None:
    """A faster rate lets bookings ahead start sooner; nothing already spent is forgiven."""
    bucket = TokenBucket(rate=1, burst=2)
    booked = [bucket.reserve() for _ in range(4)]
    assert all(bucket.confirm(b) for b in booked[:2] if b is not None)  # two start now
    woken = bucket.voided()
    bucket.set_limits(2, 2)
    assert woken.is_set()
    assert not any(bucket.confirm(b) for b in booked[2:] if b is not None)
    assert waits([bucket.reserve() for _ in range(3)]) == [0.5, 1.0, 1.5]


async def test_a_slower_rate_books_what_is_ahead_again_at_it(autojump_clock: Any) -> None:
    """Learning a slower rate forgives nothing spent, and what is booked ahead starts at it.

    Kept at the old rate, calls that booked while a 429 was being taken in
    (before the slower rate it taught was applied) went out at the old pace
    and drew a fourth 429.
    """
    bucket = TokenBucket(rate=2, burst=2)
    booked = [bucket.reserve() for _ in range(4)]  # two now, two at 0.5 and 1.0
    assert all(bucket.confirm(b) for b in booked[:2] if b is not None)
    woken = bucket.voided()
    bucket.set_limits(1, 2)
    assert woken.is_set()
    assert not any(bucket.confirm(b) for b in booked[2:] if b is not None)
    assert waits([bucket.reserve() for _ in range(3)]) == [1.0, 2.0, 3.0]


async def test_slack_delays_the_refill_after_a_burst_begins(autojump_clock: Any) -> None:
    """With slack, the first token after a burst comes slack later; the burst itself does not."""
    bucket = TokenBucket(rate=4, burst=2, slack=0.05)
    got = waits([bucket.reserve() for _ in range(4)])
    assert got == [0, 0, pytest.approx(0.3), pytest.approx(0.55)]


async def test_slack_applies_again_after_the_bucket_refills(autojump_clock: Any) -> None:
    """An idle bucket is full again: the next burst gets its slack too, and only once."""
    bucket = TokenBucket(rate=4, burst=2, slack=0.05)
    bucket.reserve()
    await trio.sleep(10)
    got = waits([bucket.reserve() for _ in range(4)])
    assert got == [0, 0, pytest.approx(0.3), pytest.approx(0.55)]


async def test_every_booking_that_takes_a_full_bucket_keeps_the_slack(
    autojump_clock: Any,
) -> None:
    """A burst of one is full again each time a booking waits for its token: the server's
    refill restarts when each request arrives, so each keeps the slack after it."""
    bucket = TokenBucket(rate=4, burst=1, slack=0.0625)
    booked = [bucket.reserve() for _ in range(3)]
    assert waits(booked) == [0, 0.3125, 0.625]
    assert all(b is not None and b.took_full for b in booked)


async def test_a_learned_bucket_keeps_the_slack_after_a_burst_only(autojump_clock: Any) -> None:
    """A learning scope's bucket is a guess: a guessed burst of one keeps the slack after
    a burst's first booking, not after each (learning from bare 429s took up to 1.8x)."""
    bucket = TokenBucket(rate=4, burst=1, slack=0.0625, every_fill=False)
    assert waits([bucket.reserve() for _ in range(3)]) == [0, 0.3125, 0.5625]
    assert not Scope("api").bucket.every_fill
    assert Scope("api", rate=4, burst=1).bucket.every_fill


async def test_a_void_gives_back_the_pauses_of_the_bookings_it_voids(
    autojump_clock: Any,
) -> None:
    """Each booking that took a full bucket put the refill off by the slack; voided, it
    gives that back with its token, and the bookings book again from what has started.
    (Kept, a void at 50/s cost every booking ahead its pause: 80-140 ms gaps.)"""
    bucket = TokenBucket(rate=4, burst=1, slack=0.0625)
    booked = [bucket.reserve() for _ in range(4)]  # at 0, 0.3125, 0.625 and 0.9375
    await trio.sleep(0.3125)
    assert all(bucket.confirm(b) for b in booked[:2] if b is not None)
    voided = bucket.voided()
    bucket.set_slack(0.0)  # narrower: the bookings ahead book again, to start sooner
    assert voided.is_set()
    # Full at 0.625 after the second's pause, then a token apart with no slack. (Their
    # pauses kept as spent, they came 0.125 s later.)
    assert waits([bucket.reserve() for _ in range(2)]) == [0.3125, 0.5625]


async def test_a_wider_slack_moves_the_bookings_ahead_in_place(autojump_clock: Any) -> None:
    """A wider slack counts the refill from that much later: what is booked ahead moves
    with it, in place, each also by the wider pause of every full booking ahead of it,
    where booking it again would have put it. (Booked again, a queue of hundreds woke at
    each widening, and the busy loop woke holders late enough to widen it again: a
    bucket of one at 200/s paced 40 ms apart. Moved alike, a queue booked before any lag
    was measured kept no margin, and drew a 429.)"""
    bucket = TokenBucket(rate=4, burst=1, slack=0.0625)
    booked = [bucket.reserve() for _ in range(4)]  # at 0, 0.3125, 0.625 and 0.9375
    await trio.sleep(0.3125)
    assert all(bucket.confirm(b) for b in booked[:2] if b is not None)
    voided = bucket.voided()
    bucket.set_slack(0.125)
    assert not voided.is_set()
    # Each a token after the one before and its pause of 0.125: at 0.6875 and 1.0625.
    assert [bucket.retimed(b).wait for b in booked[2:] if b is not None] == [0.375, 0.75]
    assert waits([bucket.reserve() for _ in range(2)]) == [1.125, 1.5]


async def test_an_owed_refill_moves_the_bookings_ahead_in_place(autojump_clock: Any) -> None:
    """A late request's owed refill moves every booking not started yet by its time, pauses
    and all, with no void: no holder wakes for it. One whose holder has not looked since
    (``retimed``) is refused, and would have started early. (Voided instead, hundreds of
    holders woke to book again at every late request of a busy bucket of one.)"""
    bucket = TokenBucket(rate=4, burst=1, slack=0.0625)
    booked = [bucket.reserve() for _ in range(4)]  # at 0, 0.3125, 0.625 and 0.9375
    await trio.sleep(0.3125)
    assert all(bucket.confirm(b) for b in booked[:2] if b is not None)
    voided = bucket.voided()
    bucket.owe(0.25)  # the second left 62.5 ms past its slack
    assert not voided.is_set()
    ahead = [b for b in booked[2:] if b is not None]
    assert [bucket.retimed(b).wait for b in ahead] == [0.375, 0.6875]
    assert waits([bucket.reserve() for _ in range(2)]) == [1.0, 1.3125]  # behind them
    await trio.sleep(0.375)
    assert not bucket.confirm(ahead[0])  # as booked, before the owe: 62.5 ms early
    assert bucket.confirm(bucket.retimed(ahead[0]))
    bucket.owe(0.25)  # the third left late too: only the fourth, not started, moves again
    assert bucket.retimed(ahead[1]).wait == 0.375


async def test_reservations_made_during_a_block_are_owed_from_its_tokens(
    autojump_clock: Any,
) -> None:
    """Issue 13 cause 1: calls booked in a block start at its end; no second burst follows."""
    bucket = TokenBucket(32.0, 16.0)  # binary fractions: every time below is exact
    for _ in range(16):
        bucket.reserve()
    bucket.block_until(trio.current_time() + 1.0)  # a 200 said Remaining 0, Reset 1
    await trio.sleep(0.5)
    booked = [bucket.reserve() for _ in range(12)]
    assert waits(booked) == [0.5] * 12
    await trio.sleep(0.5)
    assert bucket.statistics().tokens == 4.0  # not 16: those 12 start now
    assert waits([bucket.reserve() for _ in range(5)]) == [0, 0, 0, 0, 1 / 32]


async def test_a_void_hands_back_a_due_booking_whose_holder_has_not_woken(
    autojump_clock: Any,
) -> None:
    """A booking due now whose holder has not confirmed it has not started: a faster
    rate voids it with the rest, and its holder finds its token again at once.

    Taken as started, its token was spent twice (once booked, once booked again):
    a learning scope raises its rate on almost every answer, and in real time,
    where holders wake a moment late, the pace lost one start in five.
    """
    bucket = TokenBucket(rate=10, burst=1)
    first = bucket.reserve()
    assert first is not None
    assert bucket.confirm(first)
    due, ahead = bucket.reserve(), bucket.reserve()  # due at 0.1, and at 0.2
    assert due is not None
    assert ahead is not None
    await trio.sleep(0.1)  # due's holder has not woken yet
    bucket.set_limits(20, 1)
    assert not bucket.confirm(due)
    assert waits([bucket.reserve(), bucket.reserve()]) == pytest.approx([0.0, 0.05], abs=1e-9)


async def test_a_count_hands_back_only_what_it_took_as_started(autojump_clock: Any) -> None:
    """A server's count takes as started what fell due after its request was sent, so a
    sync that voids hands back only those of them not yet confirmed. A booking due
    before (its call waits on another scope) is not in the count: handed back as well,
    its token was counted twice, and the next request drew a 429."""
    bucket = TokenBucket(rate=10, burst=5)
    booked = [bucket.reserve() for _ in range(5)]
    for booking in booked[:4]:
        assert booking is not None
        assert bucket.confirm(booking)
    waiting = booked[4]  # due at 0, its holder still waits on another scope
    assert waiting is not None
    await trio.sleep(0.1)
    assert bucket.sync(ServerCount(3.0, elapsed=0.05))  # sent at 0.05: 3 left, at least
    assert not bucket.confirm(waiting)
    assert waits([bucket.reserve(max_wait=9) for _ in range(4)]) == pytest.approx(
        [0.0, 0.0, 0.0, 0.1]
    )


async def test_a_void_never_hands_back_a_booking_that_started(autojump_clock: Any) -> None:
    """Confirmed is started: a block after it keeps those tokens spent, so the calls
    after the block find what refilled, not a second burst."""
    bucket = TokenBucket(rate=4, burst=2)
    start_now(bucket, 2)
    bucket.block_until(0.1)
    assert waits([bucket.reserve(max_wait=9) for _ in range(2)]) == [0.25, 0.5]


async def test_a_booking_never_confirmed_counts_as_started_after_a_second(
    autojump_clock: Any,
) -> None:
    """A holder that never confirms is outside the contract: its booking is taken to
    have started once a second has passed, so a void then errs slow, never fast."""
    bucket = TokenBucket(rate=1, burst=2)
    silent = [bucket.reserve() for _ in range(2)]  # due now; never confirmed
    assert all(silent)
    await trio.sleep(1.5)
    bucket.block_until(1.6)
    assert waits([bucket.reserve(max_wait=9) for _ in range(2)]) == pytest.approx([0.1, 0.5])


async def test_a_booking_voided_by_a_later_block_is_not_confirmed(autojump_clock: Any) -> None:
    """Issue 13 cause 2: a call booked for t=1, then blocked until 5.5, does not start at 1."""
    bucket = TokenBucket(rate=1, burst=1)
    bucket.reserve()
    booked = bucket.reserve()
    assert booked is not None
    assert booked.start == 1.0
    await trio.sleep(0.5)
    bucket.drain(5.0)  # c0's 429 with Retry-After: 5 at t=0.5
    await trio.sleep(0.5)
    assert not bucket.confirm(booked)
    again = bucket.reserve()
    assert again is not None
    assert again.start == 5.5
    await trio.sleep(again.wait)
    assert bucket.confirm(again)


async def test_sync_adopts_a_lower_server_count_and_refills_at_the_rate(
    autojump_clock: Any,
) -> None:
    """Remaining: 0 with a known rate means the next token is 1/rate away, not a reset away."""
    bucket = TokenBucket(rate=8, burst=8)
    assert bucket.sync(ServerCount(0.0))
    assert bucket.wait_for() == 0.125
    assert not bucket.sync(ServerCount(0.5))  # less than a token more: not worth voiding
    assert not bucket.sync(ServerCount(2.0, unsure=2.0))  # started with it: maybe uncounted
    assert bucket.sync(ServerCount(2.0))  # the server refilled where this bucket could not see
    assert bucket.wait_for() == 0


async def test_a_surplus_of_a_token_less_a_guessed_refill_is_taken_in(
    autojump_clock: Any,
) -> None:
    """A probe of two, its second answer read first: 3 left after both, so 2 for the
    bucket (the other may not have been counted). The first answer, 0.6 ms later,
    shows it was counted first: 3 are surely there, against the 2 held and 0.003
    refilled since at a guessed 5/s. Less than a whole token more, that surplus
    was left, and the wave after the probe went one short (issue 13's deadline row,
    in real time); a token less the few ms of a guessed refill is taken in."""
    bucket = TokenBucket(rate=5, burst=5)
    bucket.set_limits(5, 5, tokens=2.0)
    await trio.sleep(0.0006)
    assert bucket.sync(ServerCount(4.0, started_since=1.0, elapsed=0.21))
    assert bucket.statistics().tokens == pytest.approx(3.0)
    assert not bucket.sync(ServerCount(3.5))  # half a token more: not worth voiding


async def test_a_learned_bucket_makes_up_what_a_proven_rate_refilled(
    autojump_clock: Any,
) -> None:
    """Remaining 0, counted 0.1 s ago: the server refilled since at a rate proven to be at
    least 8/s, so 0.8 of a token is made up at once (a count alone, less than a token more
    than the bucket, is not worth voiding), less what may have crossed the request."""
    bucket = TokenBucket(rate=10, burst=10)
    assert bucket.sync(ServerCount(0.0))
    count = ServerCount(0.0, elapsed=0.1)
    assert not bucket.sync(count)
    assert not bucket.sync(ServerCount(0.0, elapsed=0.1, proven=8.0, crossing=1.0))
    assert bucket.sync(ServerCount(0.0, elapsed=0.1, proven=8.0))
    assert bucket.wait_for() == pytest.approx(0.02)


async def test_a_booking_that_fell_due_after_a_count_was_counted_is_not_taken_off(
    autojump_clock: Any,
) -> None:
    """In real time the clock moves on between counting what started since a request
    (``started_since``, as of ``as_of``) and the bucket taking the count in. A booking
    that fell due in between is in neither: taken off as started, its token came
    back twice (once as due, once to its holder booking again), and the deadline
    row drew a 429 in about one run of twenty. Handed back like one not yet due, its
    holder books again against the server's count: three left, then two."""
    bucket = TokenBucket(rate=10, burst=5)
    assert bucket.sync(ServerCount(0.0))  # empty
    booking = bucket.reserve()
    assert booking is not None
    assert booking.start == pytest.approx(0.1)
    await trio.sleep(0.1 + 1e-4)  # due, its holder not awake yet
    counted = trio.current_time() - 2e-4  # before it fell due
    assert bucket.sync(ServerCount(3.0, elapsed=0.05, as_of=counted))
    assert not bucket.confirm(booking)  # void: its holder books again
    again = bucket.reserve()
    assert again is not None
    assert again.wait == 0
    assert bucket.confirm(again)
    assert bucket.statistics().tokens == pytest.approx(2.0)


def test_a_slower_rate_in_a_block_books_again_what_was_booked_for_its_end() -> None:
    """Found by the model below: 4/s, burst 2, slack 0.05. A 429 drains the bucket and
    blocks it for a second; two calls book for its end (a burst: the refill pauses for
    the slack after it). Told 1/s now, those two book again: the block refills one
    token at the new rate, so one call starts at its end and the next a second apart.
    Kept, the two went together at 1.0, a burst the old rate had refilled; and a
    balance read from their pause's end at the old rate let a third out beside them."""

    async def main() -> None:
        bucket = TokenBucket(4.0, 2.0, slack=0.05)
        assert bucket.reserve(1.0, max_wait=0) is not None
        bucket.drain(1.0)
        booked = [bucket.reserve(1.0, max_wait=9) for _ in range(2)]
        assert [b.start for b in booked if b is not None] == [1.0, 1.0]
        bucket.set_limits(1.0, 2.0)
        assert not any(bucket.confirm(b) for b in booked if b is not None)
        again = [bucket.reserve(1.0, max_wait=9) for _ in range(3)]
        assert [b.start for b in again if b is not None] == pytest.approx([1.0, 2.0, 3.0])

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# -- the model: any interleaving, and the promise -----------------------------------


@attrs.frozen
class Admitted:
    """A start that happened: when, what it cost, and the order of its booking and start."""

    at: float
    cost: float
    booked: int
    seq: int


_reserve = st.tuples(
    st.just("reserve"),
    st.sampled_from([1.0, 1.0, 2.0]),
    st.sampled_from([0, 0.5, 9]),
    st.sampled_from([0.0, 0.0, 0.0, 0.004, 0.3, 1.5]),  # how late its holder wakes
)
_sleep = st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.05, 0.25, 1.0]))
_ops = st.one_of(
    _reserve,
    _reserve,  # bookings and time are what the rest act on: drawn more often
    _sleep,
    _sleep,
    st.tuples(st.just("refund"), st.integers(0, 40)),
    st.tuples(st.just("drain"), st.sampled_from([0.0, 0.3, 1.0])),
    st.tuples(st.just("block"), st.sampled_from([0.1, 0.7, 2.0])),
    st.tuples(st.just("sync"), st.sampled_from([0.0, 1.0, 3.0]), st.sampled_from([0.0, 0.2])),
    st.tuples(st.just("limits"), st.sampled_from([1.0, 4.0, 10.0]), st.sampled_from([2.0, 5.0])),
    # A slack measured wider (or set narrower), and a late request's lost refill owed.
    st.tuples(st.just("slack"), st.sampled_from([0.0, 0.01, 0.05, 0.1])),
    st.tuples(st.just("owe"), st.sampled_from([0.25, 1.0])),
)


# Paced bookings of a burst of one, each pausing the refill, voided by a debt while one
# more books at once: a void that gave back more than their pauses let it in early.
@example(
    rate=4.0, burst=1.0, slack=0.05,
    ops=[
        ("reserve", 1.0, 9, 0.0), ("sleep", 0.0), ("reserve", 1.0, 9, 0.0),
        ("reserve", 1.0, 9, 0.0), ("owe", 0.25), ("reserve", 1.0, 9, 0.0), ("sleep", 1.0),
    ],
)  # fmt: skip
# Booked during a 429's block at 10/s with a burst of 5, then told 1/s with a burst of
# 2 (what learning does with that 429): kept, three started together as it ended.
@example(
    rate=10.0, burst=5.0, slack=0.0,
    ops=[("drain", 1.0)] + [("reserve", 1.0, 9, 0.0)] * 5 + [("limits", 1.0, 2.0), ("sleep", 1.0)],
)  # fmt: skip
@settings(max_examples=300, deadline=None)
@given(
    rate=st.sampled_from([1.0, 4.0, 10.0]),
    burst=st.sampled_from([1.0, 2.0, 5.0]),
    slack=st.sampled_from([0.0, 0.05]),
    ops=st.lists(_ops, min_size=8, max_size=60),
)
def test_no_interleaving_admits_faster_than_allowed_or_inside_a_block(
    rate: float, burst: float, slack: float, ops: list[tuple[Any, ...]]
) -> None:
    """Starts never exceed burst + rate*dt in any interval, nor begin inside a block.

    Waiters behave as admission does: sleep to their start, sleep on to where
    a lost refill or a wider slack moved it (``retimed``), confirm, and book
    again (or give up) when the booking was voided meanwhile. Some wake late
    (a busy process; a call that also waits on another scope), so a void can
    find a booking due and not yet confirmed: its tokens come back, and its
    holder books again. A start is counted when it was booked for, as moved
    (a late holder's request reaches the server late, which is its own
    lateness, not the bucket's admission).
    """
    admitted: list[Admitted] = []
    limits: list[tuple[int, float, float]] = []  # (seq set, rate, burst)
    changed: list[tuple[float, float, float]] = []  # (time set, rate, burst)
    blocks: list[tuple[int, float]] = []  # (seq set, until)
    counter = iter(range(10**9))

    async def main() -> None:
        bucket = TokenBucket(rate, burst, slack=slack)
        limits.append((next(counter), rate, burst))
        changed.append((trio.current_time(), rate, burst))
        pending: list[tuple[Booking, int, float]] = []  # (booking, seq booked, lateness)

        def wakes(waiter: tuple[Booking, int, float]) -> float:
            booking, _, late = waiter
            return booking.start + booking.moved + late

        async def advance(seconds: float) -> None:
            target = trio.current_time() + seconds
            while True:
                due = [p for p in pending if wakes(p) <= target]
                if not due:
                    break
                waiter = min(due, key=wakes)
                booking, booked_at, late = waiter
                await trio.sleep_until(max(wakes(waiter), trio.current_time()))
                pending.remove(waiter)
                retimed = bucket.retimed(booking)
                if retimed is not booking:  # moved later while it slept: sleeps on
                    pending.append((retimed, booked_at, late))
                elif bucket.confirm(booking):
                    at = booking.start + booking.moved  # when its token was taken
                    admitted.append(Admitted(at, booking.cost, booked_at, next(counter)))
                else:
                    again = bucket.reserve(booking.cost, max_wait=10)
                    if again is not None:
                        pending.append((again, next(counter), late))
            await trio.sleep_until(target)

        for op in ops:
            name, *args = op
            now = trio.current_time()
            if name == "reserve":
                cost = min(args[0], bucket.burst)
                booking = bucket.reserve(cost, max_wait=args[1])
                if booking is not None:
                    pending.append((booking, next(counter), args[2]))
            elif name == "refund" and pending:
                booking, _, _ = pending.pop(args[0] % len(pending))
                bucket.refund(booking)
            elif name == "drain":
                bucket.drain(args[0])
                blocks.append((next(counter), now + args[0]))
            elif name == "block":
                bucket.block_until(now + args[0])
                blocks.append((next(counter), now + args[0]))
            elif name == "sync":
                # The model cannot vouch for an arbitrary count: it may only lower.
                bucket.sync(ServerCount(args[0], elapsed=args[1], unsure=bucket.burst))
            elif name == "limits":
                bucket.set_limits(args[0], args[1])
                limits.append((next(counter), args[0], args[1]))
                changed.append((now, args[0], args[1]))
            elif name == "slack":
                bucket.set_slack(args[0])
            elif name == "owe":
                bucket.owe(args[0])
            elif name == "sleep":
                await advance(args[0])
        await advance(60.0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    starts = sorted(admitted, key=lambda a: a.at)
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            window = starts[i : j + 1]
            since, until = min(a.booked for a in window), max(a.seq for a in window)
            active = [lim for lim in limits if lim[0] < since][-1:] + [
                lim for lim in limits if since < lim[0] < until
            ]
            elapsed = starts[j].at - first.at
            allowed = max(b for _, _, b in active) + max(r for _, r, _ in active) * elapsed
            assert sum(a.cost for a in window) <= allowed + 1e-6
            # And by the limits in force as they start: what was booked at looser
            # ones and starts after stricter ones were set books again.
            since = [c for c in changed if c[0] < first.at][-1:] + [
                c for c in changed if first.at <= c[0] <= starts[j].at
            ]
            strict = max(b for _, _, b in since) + max(r for _, r, _ in since) * elapsed
            assert sum(a.cost for a in window) <= strict + 1e-6
    for start in admitted:
        for seq, until in blocks:
            assert not (seq < start.seq and start.at < until - 1e-9)


async def test_owing_lowers_the_balance_and_moves_what_is_ahead(autojump_clock: Any) -> None:
    """``owe`` gives up tokens the server may have lost: the balance drops by them, and a
    booking not yet due moves later by their refill time, the next after it."""
    bucket = TokenBucket(10.0, 2.0)
    start_now(bucket, 2)
    ahead = bucket.reserve()
    assert ahead is not None
    assert ahead.start == pytest.approx(0.1)
    bucket.owe(0.5)
    assert not bucket.confirm(ahead)  # its holder would start it 50 ms early
    assert bucket.retimed(ahead).wait == pytest.approx(0.15)
    assert bucket.wait_for(1.0) == pytest.approx(0.25)


@settings(max_examples=200, deadline=None)
@given(
    old=st.floats(1e-3, 1e10),
    new=st.floats(1e-3, 1e10),
    burst=st.integers(1, 20),
    block=st.floats(0.001, 7 * 24 * 3600.0),  # a Retry-After past a week is not taken
)
def test_a_rate_changed_during_a_block_keeps_the_schedule_in_time(
    old: float, new: float, burst: int, block: float
) -> None:
    """Drained and blocked, booked during the block, then told a new rate (what learning
    does at a 429): the next start is at most the booking's token and its own, at the new
    rate, after the block ends, and never a number that is not one. (Reading the
    balance now, the block's length in old-rate tokens was repaid at the new rate: a 1 s
    block at 408/s became 13 s at 32/s.)"""

    async def main() -> tuple[float, float]:
        bucket = TokenBucket(old, float(burst))
        bucket.reserve(float(burst))
        bucket.drain(block)
        during = bucket.reserve(1.0)
        assert during is not None
        assert during.start >= block
        bucket.set_limits(new, float(burst))
        return bucket.wait_for(1.0), bucket.blocked_until

    wait, until = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert math.isfinite(wait)
    assert until - 1e-9 <= wait <= until + 2.0 / new + until * 1e-12 + 1e-9


async def test_a_wider_slack_during_a_bursts_pause_keeps_the_pause(autojump_clock: Any) -> None:
    """8/s, burst 2, slack 62.5 ms: the burst's refill waits until 62.5 ms. Widened to
    125 ms at 31.25 ms (the burst's first request left that late), the call booked after
    the burst moves to 0.25 s, the pause's end and a token. Rebooked from now instead,
    it went at 0.15625 s, 94 ms early: the server, whose refill began when the burst's
    first request arrived, could refuse it."""
    bucket = TokenBucket(rate=8, burst=2, slack=0.0625)
    booked = [bucket.reserve() for _ in range(3)]
    assert waits(booked) == [0, 0, 0.1875]
    await trio.sleep(0.03125)
    assert all(bucket.confirm(b) for b in booked[:2] if b is not None)
    bucket.set_slack(0.125)
    assert not any(bucket.confirm(b) for b in booked[2:] if b is not None)
    assert [bucket.retimed(b).wait for b in booked[2:] if b is not None] == [0.21875]
    assert waits([bucket.reserve()]) == [0.34375]  # a token after it
