"""The token bucket: reservations with a maximum wait, refunds and drains, on trio's clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from fanout import ConfigurationError, TokenBucket


async def test_burst_is_free_then_reservations_queue_at_the_rate(autojump_clock: Any) -> None:
    """A full bucket admits `burst` at once; later reservations wait 1/rate more each."""
    bucket = TokenBucket(rate=4, burst=2)
    assert [bucket.reserve() for _ in range(5)] == [0, 0, 0.25, 0.5, 0.75]


async def test_refused_reservation_consumes_nothing(autojump_clock: Any) -> None:
    """A wait beyond max_wait is refused and leaves the tokens exactly as they were."""
    bucket = TokenBucket(rate=1, burst=1)
    assert bucket.reserve() == 0
    before = bucket.statistics().tokens
    assert bucket.reserve(max_wait=0.5) is None
    after = bucket.statistics()
    assert after.tokens == before
    assert after.refused == 1
    assert bucket.reserve(max_wait=1.0) == 1.0


async def test_refund_restores_a_given_up_reservation(autojump_clock: Any) -> None:
    """A caller that gives up during its wait hands its token back."""
    bucket = TokenBucket(rate=2, burst=1)
    bucket.reserve()
    assert bucket.reserve() == 0.5
    bucket.refund()
    assert bucket.wait_for() == 0.5
    await trio.sleep(0.5)
    assert bucket.wait_for() == 0


async def test_refill_is_capped_at_burst(autojump_clock: Any) -> None:
    """An idle bucket never holds more than its burst."""
    bucket = TokenBucket(rate=10, burst=3)
    await trio.sleep(100)
    assert bucket.statistics().tokens == 3
    assert [bucket.reserve() for _ in range(4)] == [0, 0, 0, pytest.approx(0.1)]


async def test_drain_empties_and_blocks_until_the_server_wait(autojump_clock: Any) -> None:
    """After a 429 nothing starts before the server's wait, and the burst is gone."""
    bucket = TokenBucket(rate=5, burst=5)
    bucket.drain(0.2)
    assert bucket.wait_for() == 0.2
    assert bucket.reserve() == 0.2
    # One token refilled during the block; the next waits for the one after it.
    assert bucket.reserve() == pytest.approx(0.4)


async def test_bucket_without_rate_still_obeys_blocks(autojump_clock: Any) -> None:
    """rate=None means unlimited, except while the server has said to wait."""
    bucket = TokenBucket(rate=None)
    assert [bucket.reserve(5) for _ in range(3)] == [0, 0, 0]
    bucket.drain(1.5)
    assert bucket.reserve() == 1.5
    await trio.sleep(1.5)
    assert bucket.reserve() == 0


async def test_weighted_cost_reserves_several_tokens(autojump_clock: Any) -> None:
    """A call costing 3 takes 3 tokens; one costing more than the burst is a clear error."""
    bucket = TokenBucket(rate=1, burst=4)
    assert bucket.reserve(3) == 0
    assert bucket.reserve(3) == 2
    with pytest.raises(ConfigurationError, match="can never start"):
        bucket.reserve(5)


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (float("nan"), 1), (1, 0.5)])
def test_impossible_limits_are_rejected(rate: float, burst: float) -> None:
    """Zero, negative or NaN rates and bursts below one fail at construction."""
    with pytest.raises(ConfigurationError):
        TokenBucket(rate=rate, burst=burst)


async def test_set_limits_keeps_what_is_owed(autojump_clock: Any) -> None:
    """Learning a new rate does not forgive reservations already promised."""
    bucket = TokenBucket(rate=1, burst=2)
    for _ in range(4):
        bucket.reserve()
    bucket.set_limits(2, 2)
    assert bucket.wait_for() == 1.5


async def test_slack_delays_the_refill_after_a_burst_begins(autojump_clock: Any) -> None:
    """With slack, the first token after a burst comes slack later; the burst itself does not."""
    bucket = TokenBucket(rate=4, burst=2, slack=0.05)
    assert [bucket.reserve() for _ in range(4)] == [0, 0, pytest.approx(0.3), pytest.approx(0.55)]


async def test_slack_applies_again_after_the_bucket_refills(autojump_clock: Any) -> None:
    """An idle bucket is full again: the next burst gets its slack too, and only once."""
    bucket = TokenBucket(rate=4, burst=1, slack=0.05)
    bucket.reserve()
    await trio.sleep(10)
    assert bucket.reserve() == 0
    assert bucket.reserve() == pytest.approx(0.3)
    assert bucket.reserve() == pytest.approx(0.55)
