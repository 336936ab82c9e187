"""The Redis half of a shared scope: one guarded link, the shared bucket, the leases.

``RedisLink`` runs every operation of one scope: bounded by ``op_timeout``,
and, once Redis has failed, not tried again for ``recheck_after`` seconds
(one call probes; the rest fail at once instead of each paying the timeout).
Each outage is logged once when it starts and once when it ends.

``SharedBucket`` and ``SharedLeases`` turn the scripts of ``_redis_scripts``
into typed calls. What a scope *does* with them (local gates, the fallback,
statistics) is in ``_redis_scope``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import uuid
from typing import TYPE_CHECKING, Any

import attrs
import trio
from coredis.commands.script import Script

from ._exceptions import ConfigurationError, LimiterUnavailableError
from ._redis_client import RedisClient
from ._redis_scripts import ACQUIRE_LEASE, BUCKET, RENEW_LEASES, bounded, lua_number

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["BucketReply", "LocalFallback", "RedisLink", "SharedBucket", "SharedLeases"]

log = logging.getLogger("fanout.redis")


@attrs.frozen
class LocalFallback:
    """While Redis is unreachable, limit this process alone to ``share`` of the scope.

    The rate becomes ``rate * share``, the burst ``max(1, burst * share)``,
    the concurrency ``max(1, floor(max_concurrency * share))``. With N
    processes, a share of 1/N keeps their sum at the configured limits.
    """

    share: float = attrs.field(default=0.25)

    @share.validator
    def _check_share(self, _: attrs.Attribute[float], value: float) -> None:
        if not 0 < value <= 1:
            raise ConfigurationError(f"a fallback share must be in (0, 1], not {value!r}")


@attrs.define(eq=False)
class RedisLink:
    """One scope's way to Redis: bounded operations and a short memory of failure."""

    client: RedisClient = attrs.field(repr=False)
    scope: str
    op_timeout: float
    recheck_after: float
    fallback: LocalFallback | None
    _down_until: float | None = attrs.field(init=False, default=None)
    _outage_since: float | None = attrs.field(init=False, default=None)

    async def run(self, op: str, operation: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``operation`` or raise ``LimiterUnavailableError``, within ``op_timeout``."""
        what = f"the shared limiter of scope {self.scope!r}"
        now = trio.current_time()
        if self._down_until is not None:
            if now < self._down_until:
                await trio.lowlevel.checkpoint()
                raise LimiterUnavailableError(
                    f"{what} is unavailable: Redis failed recently; "
                    f"fanout asks it again in {self._down_until - now:.2f}s"
                )
            self._down_until = now + self.recheck_after  # this call probes; others fail fast
        try:
            result = await bounded(what, self.op_timeout, operation)
        except LimiterUnavailableError as exc:
            self._down_until = trio.current_time() + self.recheck_after
            if self._outage_since is None:
                self._outage_since = now
                then = (
                    f"limiting this process locally at {self.fallback.share:.0%} of the scope"
                    if self.fallback is not None
                    else "refusing its calls (fail closed)"
                )
                log.warning(
                    "scope %r: %s (on %s: %r); %s until Redis answers",
                    self.scope, exc, op, exc.__cause__, then,
                )  # fmt: skip
            raise
        if self._outage_since is not None:
            log.warning(
                "scope %r: Redis answers again after %.1fs; shared limits resume",
                self.scope, trio.current_time() - self._outage_since,
            )  # fmt: skip
            self._outage_since = None
        self._down_until = None
        return result

    async def run_quietly(self, op: str, operation: Callable[[], Awaitable[Any]]) -> None:
        """For cleanup in ``finally``: shielded, bounded, and never raising."""
        with trio.CancelScope(shield=True), contextlib.suppress(LimiterUnavailableError):
            await self.run(op, operation)


@attrs.frozen
class BucketReply:
    """The bucket script's answer; durations are relative to the moment it ran."""

    granted: bool
    wait: float
    tokens: float
    blocked_for: float
    exhausted_for: float | None


@attrs.define(eq=False)
class SharedBucket:
    """The token bucket of one scope, as the ``BUCKET`` script keeps it."""

    link: RedisLink
    key: str
    exhausted_key: str
    _script: Script[Any] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._script = self.link.client.register_script(BUCKET)

    async def run(
        self, op: str, *, rate: float | None, burst: float, cost: float = 1.0, extra: float = 0.0
    ) -> BucketReply:
        """One bucket op (see ``BUCKET``); ``rate=None`` is a bucket without a rate."""
        args = [op, lua_number(rate or 0.0), lua_number(burst), lua_number(cost)]
        call = functools.partial(
            self._script, keys=[self.key, self.exhausted_key], args=[*args, lua_number(extra)]
        )
        raw = await self.link.run(op, call)
        exhausted_ms = int(raw[4])
        return BucketReply(
            granted=bool(int(raw[0])), wait=float(raw[1]), tokens=float(raw[2]),
            blocked_for=float(raw[3]),
            exhausted_for=exhausted_ms / 1000 if exhausted_ms > 0 else None,
        )  # fmt: skip

    async def mark_exhausted(self, seconds: float) -> None:
        """Tell every process the quota is spent for ``seconds`` (a key with a TTL)."""
        milliseconds = math.ceil(seconds * 1000)
        if milliseconds > 0:
            await self.link.run_quietly(
                "exhaust",
                functools.partial(self.link.client.set, self.exhausted_key, "1", px=milliseconds),
            )


@attrs.define(eq=False)
class SharedLeases:
    """Slots as leases in a sorted set scored by expiry; this process's are renewed.

    ``held`` is the set of members this process holds. A member is added only
    once Redis granted it, so renewal never resurrects a lease that was
    refused or already released.
    """

    link: RedisLink
    key: str
    cap: int
    ttl: float
    held: set[str] = attrs.field(init=False, factory=set)
    _identity: str = attrs.field(init=False, factory=lambda: uuid.uuid4().hex)
    _serial: itertools.count[int] = attrs.field(init=False, factory=itertools.count)
    _acquire: Script[Any] = attrs.field(init=False)
    _renew: Script[Any] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._acquire = self.link.client.register_script(ACQUIRE_LEASE)
        self._renew = self.link.client.register_script(RENEW_LEASES)

    async def try_acquire(self) -> str | None:
        """One attempt: a lease's member name, or None while the cap is taken."""
        member = f"{self._identity}:{next(self._serial)}"
        args = [str(self.cap), lua_number(self.ttl), member]
        try:
            raw = await self.link.run(
                "lease", functools.partial(self._acquire, keys=[self.key], args=args)
            )
        except BaseException:
            await self.release(member)  # cut off mid-ask: the lease may exist
            raise
        if not int(raw[0]):
            return None
        self.held.add(member)
        return member

    async def release(self, member: str) -> None:
        """Remove a lease now if Redis answers in time; otherwise it expires by itself."""
        self.held.discard(member)
        await self.link.run_quietly(
            "release", functools.partial(self.link.client.zrem, self.key, [member])
        )

    async def renew_forever(self) -> None:
        """Keep the held leases alive: one round trip per third of the TTL."""
        while True:
            await trio.sleep(self.ttl / 3)
            members = sorted(self.held)
            if not members:
                continue
            args = [lua_number(self.ttl), *members]
            try:
                missing = await self.link.run(
                    "renewal", functools.partial(self._renew, keys=[self.key], args=args)
                )
            except LimiterUnavailableError:
                continue
            lapsed = self.held.intersection(_text(member) for member in missing)
            if lapsed:
                log.warning(
                    "scope %r: %d lease(s) lapsed (Redis was away longer than lease_ttl); "
                    "those calls run on without a shared slot", self.link.scope, len(lapsed),
                )  # fmt: skip
                self.held -= lapsed


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
