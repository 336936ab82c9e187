"""A scope shared by many processes: the limits of one key, kept on Redis.

Two agent processes that share an API key must share its limits, or together
they send twice the key's rate. ``RedisScope`` is ``Scope`` with its bucket
and its slots moved to Redis; the runner cannot tell them apart.

- **Bucket**: one Lua script (``_redis_scripts.BUCKET``, run by ``_redis``) on the server's
  clock reserves, refunds, drains after a 429 and holds the shared "blocked
  until", so one process's 429 holds back every process. It answers with a
  wait, which the caller sleeps on trio's clock.
- **Slots**: leases in a sorted set scored by their expiry. A call polls for
  one (with a short, growing pause) until its deadline; a local
  ``CapacityLimiter`` in front keeps a process from polling for more slots
  than the cap. One renewal task per scope keeps this process's leases alive
  while long calls run; a crashed process stops renewing, so its leases
  expire and its slots come back by themselves within ``lease_ttl``.
- **Local only**, as in ``Scope``: the waiter count and shedding, the latency
  average, the retry budget. An exhausted quota is shared through a marker
  key that expires when the quota returns; other processes learn of it on
  their next reservation.
- **Unavailable Redis**: each operation is bounded by ``op_timeout`` (and by
  the caller's deadline). A failure makes the scope treat Redis as down for
  ``recheck_after`` seconds, so later calls do not each pay the timeout; then
  it asks again. Meanwhile ``reserve``, ``wait_for`` and ``acquire_slot``
  raise ``LimiterUnavailableError`` (fail closed), or, with ``fallback``,
  limit this process locally to a share of the rate. Releases and refunds
  never raise: a lease that cannot be removed expires.

The background task lives in the scope's own nursery, opened by
``async with scope:``, so nothing outlives the block that uses the scope.
"""

from __future__ import annotations

import contextlib
import math
import random
from typing import TYPE_CHECKING, Self

import attrs
import trio

from ._bucket import BucketStatistics, TokenBucket, _check_limits
from ._exceptions import ConfigurationError, LimiterUnavailableError
from ._ledger import Ledger
from ._redis import BucketReply, LocalFallback, RedisLink, SharedBucket, SharedLeases
from ._redis_client import RedisClient, client_from_url
from ._redis_keys import scope_key_base
from ._retry import RetryBudget
from ._scope import ScopeStatistics

if TYPE_CHECKING:
    from types import TracebackType

    from ._headers import RateLimitInfo
    from ._scope import ScopeLike, SlotHolder

__all__ = ["RedisScope"]

_FIRST_PAUSE = 0.005  # seconds between polls for a lease, doubling up to _LAST_PAUSE
_LAST_PAUSE = 0.05
_FALLBACK = "fallback"  # the slot came from the local fallback, not from Redis


def _positive(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ConfigurationError(f"{attribute.name} must be a positive number, not {value!r}")


@attrs.define(eq=False)
class RedisScope:
    """Limits shared by every process that names the same scope on one Redis.

    Configure it as ``Scope`` (``rate``, ``burst``, ``max_concurrency``,
    ``max_waiters``, ``quota_horizon``, ``retry_budget``), plus: ``client``,
    a coredis client the caller has entered (or use ``from_url``); ``prefix``
    of every key; ``lease_ttl``, how long a slot outlives a crashed holder;
    ``op_timeout``, the longest one Redis operation may take; ``recheck_after``,
    how long Redis is left alone after it failed; ``fallback``, what to do
    while it is away (None: refuse). Use it inside ``async with scope:``.
    """

    client: RedisClient = attrs.field(repr=False)
    name: str
    rate: float | None = None
    burst: float | None = None
    max_concurrency: int | None = None
    max_waiters: int | None = 64
    quota_horizon: float = 3600.0
    retry_budget: RetryBudget = attrs.field(factory=RetryBudget)
    prefix: str = "fanout:"
    lease_ttl: float = attrs.field(default=10.0, validator=_positive)
    op_timeout: float = attrs.field(default=0.25, validator=_positive)
    recheck_after: float = attrs.field(default=1.0, validator=_positive)
    fallback: LocalFallback | None = None
    _owns_client: bool = attrs.field(init=False, default=False)
    _manager: contextlib.AbstractAsyncContextManager[trio.Nursery] | None = attrs.field(
        init=False, default=None
    )
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)
    _link: RedisLink = attrs.field(init=False)
    _bucket: SharedBucket = attrs.field(init=False)
    _leases: SharedLeases | None = attrs.field(init=False, default=None)
    _gate: trio.CapacityLimiter | None = attrs.field(init=False, default=None)
    _fallback_gate: trio.CapacityLimiter | None = attrs.field(init=False, default=None)
    _fallback_bucket: TokenBucket | None = attrs.field(init=False, default=None)
    _held: dict[object, str] = attrs.field(init=False, factory=dict)  # holder -> lease
    _ledger: Ledger = attrs.field(init=False, factory=Ledger)
    _seen: tuple[float, float, float] | None = attrs.field(init=False, default=None)
    _counts: dict[str, int] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        if not self.name:
            raise ConfigurationError("a scope needs a non-empty name")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigurationError(f"max_concurrency must be >= 1, not {self.max_concurrency}")
        if self.max_waiters is not None and self.max_waiters < 0:
            raise ConfigurationError(f"max_waiters must be >= 0, not {self.max_waiters}")
        self.burst = self.burst if self.burst is not None else max(1.0, self.rate or 1.0)
        _check_limits(self.rate, self.burst)
        base = scope_key_base(self.prefix, self.name)  # one cluster slot per scope
        self._link = RedisLink(
            self.client, self.name, self.op_timeout, self.recheck_after, self.fallback
        )
        self._bucket = SharedBucket(self._link, f"{base}:bucket", f"{base}:exhausted")
        if self.max_concurrency is not None:
            self._leases = SharedLeases(
                self._link, f"{base}:leases", self.max_concurrency, self.lease_ttl
            )
        self._counts = dict.fromkeys(("reserved", "refused", "refunded", "drained"), 0)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        name: str,
        rate: float | None = None,
        burst: float | None = None,
        max_concurrency: int | None = None,
        max_waiters: int | None = 64,
        quota_horizon: float = 3600.0,
        retry_budget: RetryBudget | None = None,
        prefix: str = "fanout:",
        lease_ttl: float = 10.0,
        op_timeout: float = 0.25,
        recheck_after: float = 1.0,
        fallback: LocalFallback | None = None,
        cluster: bool = False,
    ) -> RedisScope:
        """A scope with a client of its own on ``url`` (``redis://host:6379/0``).

        ``rediss://`` connects over TLS; ``cluster=True`` treats ``url`` as a
        startup node of a Redis Cluster (see ``_redis_client``). The client
        opens and closes with ``async with scope:``.
        """
        client = client_from_url(url, cluster=cluster)
        scope = cls(
            client, name=name, rate=rate, burst=burst, max_concurrency=max_concurrency,
            max_waiters=max_waiters, quota_horizon=quota_horizon,
            retry_budget=retry_budget or RetryBudget(), prefix=prefix, lease_ttl=lease_ttl,
            op_timeout=op_timeout, recheck_after=recheck_after, fallback=fallback,
        )  # fmt: skip
        scope._owns_client = True
        return scope

    # -- lifetime -----------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._nursery is not None:
            raise RuntimeError(f"RedisScope {self.name!r} is already open; enter it once")
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
        self._open_local_parts()
        if self._leases is not None:
            self._nursery.start_soon(self._leases.renew_forever)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The block's own exception is not passed down: the nursery (and
        # coredis's task group) would wrap it in an ExceptionGroup, and only
        # the renewal task's failures belong to them.
        nursery, manager = self._nursery, self._manager
        assert nursery is not None
        assert manager is not None
        nursery.cancel_scope.cancel()
        try:
            await manager.__aexit__(None, None, None)
        finally:
            self._nursery = self._manager = None
            if self._owns_client:
                await self.client.__aexit__(None, None, None)

    def _open_local_parts(self) -> None:
        """What needs trio running: the local gates and the fallback bucket."""
        cap = self.max_concurrency
        self._gate = trio.CapacityLimiter(cap) if cap is not None else None
        share = self.fallback.share if self.fallback is not None else None
        if share is not None:
            rate = self.rate * share if self.rate is not None else None
            self._fallback_bucket = TokenBucket(rate, max(1.0, self._burst * share))
            if cap is not None:
                self._fallback_gate = trio.CapacityLimiter(max(1, math.floor(cap * share)))

    def _open(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError(
                f"RedisScope {self.name!r} is not open: use it inside `async with scope:`"
            )
        return self._nursery

    # -- talking to Redis -----------------------------------------------------

    async def _shared(self, op: str, cost: float = 1.0, extra: float = 0.0) -> BucketReply:
        """One op on the shared bucket; remember what it said for the sync methods."""
        self._open()
        reply = await self._bucket.run(
            op, rate=self.rate, burst=self._burst, cost=cost, extra=extra
        )
        now = trio.current_time()
        blocked_until = now + reply.blocked_for if reply.blocked_for > 0 else -math.inf
        self._seen = (reply.tokens, now, blocked_until)
        if reply.exhausted_for is not None:
            learned = now + reply.exhausted_for
            self._ledger.exhaust(learned)
        return reply

    @property
    def _burst(self) -> float:
        assert self.burst is not None  # resolved in __attrs_post_init__
        return self.burst

    # -- admission --------------------------------------------------------------

    def should_shed(self) -> bool:
        """Whether this process's queue is full, so a new call is answered at once."""
        return self.max_waiters is not None and self._ledger.waiting >= self.max_waiters

    def has_free_slot(self) -> bool:
        """Whether ``acquire_slot`` returns at once: only without a cap, since
        whether a shared slot is free is known only by asking Redis."""
        return self.max_concurrency is None

    def count_shed(self) -> None:
        self._ledger.shed += 1

    def note_waiting(self, delta: int) -> None:
        """Count a call that waits for tokens, so shedding sees the whole queue."""
        self._ledger.waiting += delta

    async def acquire_slot(self, holder: SlotHolder, deadline: float) -> bool:
        """Take a slot for ``holder``, or return False once ``deadline`` passes.

        One try is made even at the deadline, as ``_nowait`` would. Raises
        ``LimiterUnavailableError`` when Redis cannot say (and no fallback).
        """
        self._open()
        if self._gate is None:
            await trio.lowlevel.checkpoint()
            self._ledger.in_flight += 1
            return True
        self._ledger.waiting += 1
        try:
            if not await _take(self._gate, holder, deadline):
                return False
            try:
                slot = await self._lease(holder, deadline)
            except BaseException:
                self._gate.release_on_behalf_of(holder)
                raise
            if slot is None:
                self._gate.release_on_behalf_of(holder)
                return False
            self._held[holder] = slot
            self._ledger.in_flight += 1
            return True
        finally:
            self._ledger.waiting -= 1

    async def _lease(self, holder: SlotHolder, deadline: float) -> str | None:
        """A lease's member name, the fallback marker, or None at the deadline."""
        assert self._leases is not None
        pause = _FIRST_PAUSE
        while True:
            try:
                member = await self._leases.try_acquire()
            except LimiterUnavailableError:
                if self._fallback_gate is None:
                    raise
                return _FALLBACK if await _take(self._fallback_gate, holder, deadline) else None
            if member is not None:
                return member
            sleep = pause * random.uniform(0.5, 1.0)
            if trio.current_time() + sleep >= deadline:
                return None
            await trio.sleep(sleep)
            pause = min(2 * pause, _LAST_PAUSE)

    async def release_slot(self, holder: SlotHolder) -> None:
        """Give the slot back; shielded and bounded, so safe in ``finally``."""
        slot = self._held.pop(holder, None)
        self._ledger.in_flight -= 1
        if self._gate is None:
            return
        self._gate.release_on_behalf_of(holder)
        if slot == _FALLBACK:
            assert self._fallback_gate is not None
            self._fallback_gate.release_on_behalf_of(holder)
        elif slot is not None and self._leases is not None:
            await self._leases.release(slot)

    # -- tokens ------------------------------------------------------------------

    async def reserve(self, cost: float, max_wait: float) -> float | None:
        """Reserve tokens: the wait before starting, or None (nothing consumed)."""
        self._check_cost(cost)
        try:
            reply = await self._shared("reserve", cost, max(0.0, max_wait))
        except LimiterUnavailableError:
            local = self._fallback_bucket
            if local is None or (local.rate is not None and cost > local.burst):
                raise
            return local.reserve(cost, max_wait=max_wait)
        self._counts["reserved" if reply.granted else "refused"] += 1
        return reply.wait if reply.granted else None

    async def refund(self, cost: float) -> None:
        """Hand back a reservation whose call gave up; never raises, safe in ``finally``."""
        self._counts["refunded"] += 1
        with trio.CancelScope(shield=True):
            try:
                await self._shared("refund", cost)
            except LimiterUnavailableError:
                if self._fallback_bucket is not None:
                    self._fallback_bucket.refund(cost)

    async def wait_for(self, cost: float) -> float:
        """Seconds until ``cost`` tokens would be available, consuming nothing."""
        self._check_cost(cost)
        try:
            return (await self._shared("peek", cost)).wait
        except LimiterUnavailableError:
            if self._fallback_bucket is None:
                raise
            return self._fallback_bucket.wait_for(min(cost, self._fallback_bucket.burst))

    def _check_cost(self, cost: float) -> None:
        if not (cost > 0 and math.isfinite(cost)):
            raise ConfigurationError(f"a call's cost must be a positive number, not {cost!r}")
        if self.rate is not None and self.burst is not None and cost > self.burst:
            raise ConfigurationError(
                f"a call costing {cost:g} tokens can never start on a bucket whose "
                f"burst is {self.burst:g}"
            )

    # -- what the server told us -------------------------------------------------

    async def on_throttled(self, wait: float) -> None:
        """A 429: empty the shared bucket and hold every process back ``wait`` s."""
        self._counts["drained"] += 1
        if self._fallback_bucket is not None:
            self._fallback_bucket.drain(wait)
        with contextlib.suppress(LimiterUnavailableError):
            await self._shared("drain", extra=max(0.0, wait))

    async def block_until(self, when: float) -> None:
        """The server's remaining count hit zero: no process starts before ``when``."""
        if self._fallback_bucket is not None:
            self._fallback_bucket.block_until(when)
        delay = when - trio.current_time()
        if delay > 0:
            with contextlib.suppress(LimiterUnavailableError):
                await self._shared("block", extra=delay)

    async def observe_headers(self, info: RateLimitInfo) -> None:
        """A response said its window is spent: no process starts before the reset.

        Stated limits are not adopted: the rate of a shared scope is
        configuration, so that every process refills the bucket alike.
        """
        if info.remaining is not None and info.remaining < 1 and info.reset_after is not None:
            await self.block_until(trio.current_time() + info.reset_after)
        else:
            await trio.lowlevel.checkpoint()

    def exhaust(self, until: float) -> None:
        """The quota is spent until ``until``: here at once, elsewhere via a marker key."""
        self._ledger.exhaust(until)
        if self._nursery is not None:
            self._nursery.start_soon(self._bucket.mark_exhausted, until - trio.current_time())

    def exhausted_until(self) -> float | None:
        """When the spent quota returns (as last known here), or None."""
        return self._ledger.exhausted_until()

    def expected_latency(self) -> float | None:
        """This process's moving average of call durations here (local, as in ``Scope``)."""
        return self._ledger.latency

    def observe_call(self, seconds: float, *, ok: bool) -> None:
        """Fold one attempt's duration into this process's moving average."""
        self._ledger.observe_latency(seconds)

    def set_limits(self, rate: float | None, burst: float) -> None:
        """Use a learned rate and burst for this process's next scripts.

        Each script refills with the limits its caller sends, so processes
        agree once each has learned the same headers.
        """
        _check_limits(rate, burst)
        self.rate, self.burst = rate, burst
        if self._fallback_bucket is not None and self.fallback is not None:
            share = self.fallback.share
            self._fallback_bucket.set_limits(
                rate * share if rate is not None else None, max(1.0, burst * share)
            )

    # -- estimates and snapshots ----------------------------------------------------

    def drain_estimate(self) -> float:
        """How long this process's queue needs, from the bucket as last seen."""
        by_slots = self._ledger.slots_estimate(self.max_concurrency)
        tokens, blocked_until = self._projected()
        now = trio.current_time()
        by_rate = max(0.0, blocked_until - now)
        if self.rate is not None:
            available = min(self._burst, tokens + by_rate * self.rate)
            by_rate += max(0.0, 1.0 - available) / self.rate + self._ledger.waiting / self.rate
        return max(by_slots, by_rate)

    def _projected(self) -> tuple[float, float]:
        """Tokens and blocked-until as last seen, refilled to now on trio's clock."""
        if self._seen is None:
            return self._burst, -math.inf
        tokens, seen_at, blocked_until = self._seen
        if self.rate is None:
            return self._burst, blocked_until
        refilled = tokens + (trio.current_time() - seen_at) * self.rate
        return min(self._burst, refilled), blocked_until

    @property
    def in_flight(self) -> int:
        """Calls in flight from this process (other processes' are in Redis)."""
        return self._ledger.in_flight

    def statistics(self) -> ScopeStatistics:
        """A snapshot from what this process last heard; it never asks Redis."""
        budget = self.retry_budget.statistics()
        tokens, blocked_until = self._projected()
        bucket = BucketStatistics(
            rate=self.rate, burst=self._burst, tokens=tokens, blocked_until=blocked_until,
            reserved=self._counts["reserved"], refused=self._counts["refused"],
            refunded=self._counts["refunded"], drained=self._counts["drained"],
        )  # fmt: skip
        return ScopeStatistics(
            name=self.name, in_flight=self._ledger.in_flight, max_concurrency=self.max_concurrency,
            waiting=self._ledger.waiting, bucket=bucket, exhausted_until=self.exhausted_until(),
            latency=self._ledger.latency, shed=self._ledger.shed, requests=budget.requests,
            retries=budget.retries, retries_refused=budget.refused,
        )  # fmt: skip


async def _take(limiter: trio.CapacityLimiter, holder: SlotHolder, deadline: float) -> bool:
    """A local slot now if free, else by ``deadline``; never past it."""
    try:
        limiter.acquire_on_behalf_of_nowait(holder)
    except trio.WouldBlock:
        with trio.move_on_at(deadline):
            await limiter.acquire_on_behalf_of(holder)
            return True
        return False
    await trio.lowlevel.cancel_shielded_checkpoint()  # a slot taken is never dropped
    return True


if TYPE_CHECKING:

    def _fits_the_protocol(scope: RedisScope) -> ScopeLike:
        return scope  # mypy checks that RedisScope implements ScopeLike
