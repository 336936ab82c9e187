"""A run's memory: the in-memory store's leases and answers, the read cache's expiry."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from fanout import ConfigurationError, Run, Status
from fanout.idempotency import ClaimState, MemoryIdempotencyStore, ReadCache, StoredAnswer


async def test_a_claim_is_a_lease_its_holder_renews_until_an_answer_replaces_it(
    autojump_clock: Any,
) -> None:
    """NEW, then RUNNING while leased; renew extends it; an answer is DONE and not renewable."""
    store = MemoryIdempotencyStore()
    assert (await store.claim("k", lease=2)).state is ClaimState.NEW
    await trio.sleep(1.5)
    assert await store.renew("k", lease=2) is True  # now leased until 3.5
    await trio.sleep(1.5)
    assert (await store.claim("k", lease=2)).state is ClaimState.RUNNING  # at 3.0
    answer = StoredAnswer(Status.OK, "done")
    await store.finish("k", answer, ttl=10)
    assert await store.renew("k", lease=2) is False
    replay = await store.claim("k", lease=2)
    assert (replay.state, replay.answer) == (ClaimState.DONE, answer)


async def test_a_lapsed_or_unknown_claim_is_not_renewed_and_the_key_is_free(
    autojump_clock: Any,
) -> None:
    """Past its lease a claim cannot be renewed and the next claimant gets NEW."""
    store = MemoryIdempotencyStore()
    assert await store.renew("never-claimed", lease=2) is False
    assert (await store.claim("k", lease=2)).state is ClaimState.NEW
    await trio.sleep(2)
    assert await store.renew("k", lease=2) is False
    assert (await store.claim("k", lease=2)).state is ClaimState.NEW


async def test_abandon_frees_a_claim_but_never_an_answer(autojump_clock: Any) -> None:
    """Abandoning a running claim frees the key; abandoning an answered key keeps the answer."""
    store = MemoryIdempotencyStore()
    await store.claim("k", lease=5)
    await store.abandon("k")
    assert (await store.claim("k", lease=5)).state is ClaimState.NEW
    await store.finish("k", StoredAnswer(Status.ERROR, "no"), ttl=5)
    await store.abandon("k")
    assert (await store.claim("k", lease=5)).state is ClaimState.DONE
    await trio.sleep(5)  # the answer's ttl is over
    assert (await store.claim("k", lease=5)).state is ClaimState.NEW


async def test_the_read_cache_expires_and_invalidates_by_tool(autojump_clock: Any) -> None:
    """A cached read lives for its ttl; invalidating a tool (or all) drops its entries."""
    cache = ReadCache()
    cache.put("a", "profile", "v1", ttl=10)
    cache.put("b", "prices", "p1", ttl=1)
    assert (cache.get("a"), cache.get("b"), len(cache)) == ("v1", "p1", 2)
    await trio.sleep(1)
    assert cache.get("b") is None  # expired, and dropped
    assert len(cache) == 1
    cache.put("c", "prices", "p2", ttl=10)
    assert cache.invalidate(["profile"]) == 1
    assert (cache.get("a"), cache.get("c")) == (None, "p2")
    assert cache.invalidate(None) == 1
    assert len(cache) == 0


def test_a_run_needs_an_id_and_positive_durations() -> None:
    """An empty run id or a lease of zero is refused when the run is made."""
    with pytest.raises(ConfigurationError, match="run_id must be a non-empty string"):
        Run(run_id="")
    with pytest.raises(ConfigurationError):
        Run(claim_lease=0)
