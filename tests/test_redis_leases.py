"""A scope's leases on Redis, on a mock clock: renewal through an outage, orphans swept away.

A stand-in client answers the lease scripts from a dict, and can be taken
down, so every count and time is exact; ``tests/test_redis.py`` runs the
same rules against a real server.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from fanout._redis import RedisLink, SharedLeases
from fanout._redis_scripts import ACQUIRE_LEASE

if TYPE_CHECKING:
    import pytest


class _Redis:
    """The lease scripts and ZREM over a dict of member -> expiry; ``down`` refuses all."""

    def __init__(self) -> None:
        self.leases: dict[str, float] = {}
        self.down = False
        self.renewing: trio.Event | None = None  # set: renewals wait for it

    def register_script(self, source: str) -> Any:
        return self._acquire if source is ACQUIRE_LEASE else self._renew

    async def _refuse_if_down(self) -> None:
        await trio.lowlevel.checkpoint()
        if self.down:
            raise OSError("connection refused")

    async def _acquire(self, *, keys: list[str], args: list[str]) -> list[int]:
        await self._refuse_if_down()
        cap, ttl, member, *again = args
        now = trio.current_time()
        for held in again:
            self.leases[held] = now + float(ttl)
        if len(self.leases) >= int(cap):
            return [0]
        self.leases[member] = now + float(ttl)
        return [1]

    async def _renew(self, *, keys: list[str], args: list[str]) -> list[str]:
        if self.renewing is not None:
            await self.renewing.wait()
        await self._refuse_if_down()
        ttl, *members = args
        missing = [member for member in members if member not in self.leases]
        for member in members:
            self.leases[member] = trio.current_time() + float(ttl)
        return missing

    async def zrem(self, key: str, members: list[str]) -> int:
        await self._refuse_if_down()
        return sum(self.leases.pop(member, None) is not None for member in members)


def _leases(redis: _Redis, *, cap: int = 2) -> SharedLeases:
    link = RedisLink(redis, "api", 0.1, 1.0, None)  # type: ignore[arg-type]
    return SharedLeases(link, "api:leases", cap, 3.0)


async def test_a_renewal_in_an_outage_is_skipped_and_lost_leases_come_back(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis refuses a renewal: nothing raises, the lease stays held here. Redis returns
    having lost it (a restart): the next renewal adds it back and says so, once."""
    caplog.set_level(logging.WARNING, logger="fanout")
    redis = _Redis()
    leases = _leases(redis)
    member = await leases.try_acquire()
    assert member is not None
    redis.down = True
    await leases.renew()
    assert leases.held == {member}
    redis.down, redis.leases = False, {}  # back, empty
    await trio.sleep(1.0)  # the link asks Redis again after recheck_after
    await leases.renew()
    assert redis.leases == {member: 4.0}
    assert [r.getMessage() for r in caplog.records if "missing" in r.getMessage()] == [
        "scope 'api': 1 lease(s) of calls still in flight were missing from Redis "
        "(restarted, or away longer than lease_ttl); registered again"
    ]


async def test_a_lease_released_while_its_renewal_is_on_the_way_is_removed_again(
    autojump_clock: Any,
) -> None:
    """The renewal that adds a just-released lease back does not keep it: it is orphaned,
    swept from Redis within a sweep, and forgotten once no late script could add it."""
    redis = _Redis()
    leases = _leases(redis)
    member = await leases.try_acquire()
    assert member is not None
    redis.renewing = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(leases.renew)
        await trio.sleep(0.01)  # the renewal is on its way
        await leases.release(member)
        assert redis.leases == {}
        redis.renewing.set()
    assert redis.leases == {member: 3.01}  # the renewal put it back
    assert set(leases.orphans) == {member}
    with trio.move_on_after(3.5):
        await leases.sweep_forever()
    assert redis.leases == {}
    assert leases.orphans == {}  # forgotten after ttl + op_timeout of sweeping


async def test_a_release_redis_refuses_is_swept_once_it_answers(autojump_clock: Any) -> None:
    """Releasing during an outage orphans the lease; the sweep keeps trying and removes it
    once Redis answers."""
    redis = _Redis()
    leases = _leases(redis)
    member = await leases.try_acquire()
    assert member is not None
    redis.down = True
    await leases.release(member)
    assert member in leases.orphans
    async with trio.open_nursery() as nursery:
        nursery.start_soon(leases.sweep_forever)
        await trio.sleep(0.5)
        assert member in redis.leases  # Redis still down: swept later
        redis.down = False
        await trio.sleep(1.2)  # past recheck_after, then a sweep
        assert redis.leases == {}
        nursery.cancel_scope.cancel()
