"""The Redis idempotency store: a holder renews its lease; an unreadable answer refuses."""

from __future__ import annotations

from typing import TYPE_CHECKING

import coredis
import pytest
import trio

import fanout
from fanout.idempotency import ClaimState, StoredAnswer
from fanout.redis import RedisIdempotencyStore
from tests.redis_support import shared_redis_url, unique_prefix

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.redis, pytest.mark.realtime]  # Redis keeps its own time


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with shared_redis_url() as url:
        yield url


async def test_a_renewed_claim_outlives_its_first_lease(redis_url: str) -> None:
    """The holder's renew keeps its key RUNNING past the first lease; then it lapses."""
    prefix = unique_prefix()
    async with (
        RedisIdempotencyStore.from_url(redis_url, prefix=prefix) as holder,
        RedisIdempotencyStore.from_url(redis_url, prefix=prefix) as other,
    ):
        assert (await holder.claim("k", lease=0.3)).state is ClaimState.NEW
        assert await holder.renew("k", lease=5) is True
        await trio.sleep(0.4)  # past the first lease, well within the second
        assert (await other.claim("k", lease=0.3)).state is ClaimState.RUNNING
        assert await other.renew("k", lease=5) is False  # never its claim


async def test_a_lapsed_claim_taken_over_cannot_be_renewed_by_its_first_holder(
    redis_url: str,
) -> None:
    """Once the lease lapses and another process claims the key, the old holder's renew is False."""
    prefix = unique_prefix()
    async with (
        RedisIdempotencyStore.from_url(redis_url, prefix=prefix) as holder,
        RedisIdempotencyStore.from_url(redis_url, prefix=prefix) as other,
    ):
        assert (await holder.claim("k", lease=0.1)).state is ClaimState.NEW
        await trio.sleep(0.2)
        assert (await other.claim("k", lease=5)).state is ClaimState.NEW
        assert await holder.renew("k", lease=5) is False
        assert await other.renew("k", lease=5) is True
        await other.finish("k", StoredAnswer(fanout.Status.OK, "done"), ttl=5)
        assert await other.renew("k", lease=5) is False  # an answer is not a claim


async def test_an_answer_the_store_cannot_read_refuses_the_claim(redis_url: str) -> None:
    """A stored value that is not fanout's answer is LimiterUnavailableError, never a replay."""
    prefix = unique_prefix()
    async with coredis.Redis.from_url(redis_url, decode_responses=True) as client:
        async with RedisIdempotencyStore(client, prefix=prefix) as store:
            for garbage in (
                "not json", '{"status": "sideways", "content": ""}', '{"content": 1}',
                '{"status": "ok", "content": ["x"]}', '{"status": "ok", "content": null}',
            ):  # fmt: skip
                await client.set(f"{prefix}idem:k", garbage)
                with pytest.raises(fanout.LimiterUnavailableError, match="cannot read"):
                    await store.claim("k", lease=5)
        # The store did not own the caller's client, so leaving it left the client open.
        await client.set(f"{prefix}idem:k", "still here")
        assert await client.get(f"{prefix}idem:k") == "still here"


async def test_a_write_that_commits_past_its_deadline_is_kept_in_redis(redis_url: str) -> None:
    """A write answered ``timed_out`` whose commit, shielded, returns after its deadline:
    what it returned is kept, and a re-issue is answered with it. (Recorded under the
    expired deadline, Redis's write was cancelled at once, and each re-issue committed
    again once the claim left behind had lapsed.)"""
    commits: list[str] = []
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.MUTATING, timeout=0.2)
    async def commit(order: str) -> str:
        commits.append(order)
        with trio.CancelScope(shield=True):
            await trio.sleep(0.4)  # a commit that completes whatever happens
        return f"committed {order}"

    async with RedisIdempotencyStore.from_url(redis_url, prefix=unique_prefix()) as store:
        run = fanout.Run("conversation", store=store, claim_lease=1.0)
        runner = fanout.Runner(registry)
        first = await runner.run_turn([fanout.ToolCall("a", "commit", {"order": "42"})], run=run)
        await trio.sleep(0.5)  # the commit has returned, and been recorded
        again = await runner.run_turn([fanout.ToolCall("b", "commit", {"order": "42"})], run=run)
    assert first.results[0].status is fanout.Status.TIMED_OUT
    assert (again.results[0].status, again.results[0].content) == (
        fanout.Status.OK, "committed 42"
    )  # fmt: skip
    assert commits == ["42"]
