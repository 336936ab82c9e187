"""The Redis half of a shared scope: one guarded link, the shared bucket, the leases.

``RedisLink`` runs every operation of one scope: bounded by ``op_timeout``,
and, once Redis has failed, not tried again for ``recheck_after`` seconds
(one call probes; the rest fail at once instead of each paying the timeout).
Each outage is logged once when it starts and once when it ends.

``SharedBucket``, ``SharedWindow`` and ``SharedLeases`` turn the scripts of ``_redis_scripts``
into typed calls. What a scope *does* with them (local gates, the fallback,
statistics) is in ``_redis_scope``.
"""

from __future__ import annotations

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
from ._redis_scripts import (
    ACQUIRE_LEASE,
    BUCKET,
    RENEW_LEASES,
    STARTS,
    WINDOW,
    bounded,
    lua_number,
)
from ._validate import finite

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "BucketReply",
    "LocalFallback",
    "RedisLink",
    "SharedBucket",
    "SharedLeases",
    "SharedWindow",
]

log = logging.getLogger("fanout.redis")

_SWEEP = 0.1  # seconds between removals of orphaned leases
_STARTS_READ = 2000  # others' starts read at once: a second of them at 2,000/s


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
        share = finite(value)
        if share is None or not 0 < share <= 1:
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
    failures: int = attrs.field(init=False, default=0)  # ops that failed, ever
    recoveries: int = attrs.field(init=False, default=0)  # outages that ended, ever

    async def run(
        self, op: str, operation: Callable[[], Awaitable[Any]], *, urgent: bool = False
    ) -> Any:
        """Run ``operation`` or raise ``LimiterUnavailableError``, within ``op_timeout``.

        After a failure the link refuses at once for ``recheck_after``, without
        asking Redis, except an ``urgent`` operation: the renewal of leases whose
        calls still run. Refused too, those leases lapsed on Redis while their
        calls went on, and after a freeze of 0.4 s another process took the one
        slot of ``max_concurrency=1``: two in flight.
        """
        what = f"the shared limiter of scope {self.scope!r}"
        now = trio.current_time()
        # Read once: another task may clear or move it while this one checkpoints.
        down_until = self._down_until
        if down_until is not None and not urgent:
            if now < down_until:
                await trio.lowlevel.checkpoint()
                raise LimiterUnavailableError(
                    f"{what} is unavailable: Redis failed recently; "
                    f"fanout asks it again in {down_until - now:.2f}s"
                )
            self._down_until = now + self.recheck_after  # this call probes; others fail fast
        try:
            result = await bounded(what, self.op_timeout, operation)
        except LimiterUnavailableError as exc:
            self.failures += 1
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
            self.recoveries += 1
        self._down_until = None
        return result

    @property
    def outage_since(self) -> float | None:
        """When the outage under way began (its first failure), or None while Redis answers."""
        return self._outage_since

    async def run_quietly(self, op: str, operation: Callable[[], Awaitable[Any]]) -> bool:
        """For cleanup in ``finally``: shielded, bounded, never raising; True if it ran."""
        with trio.CancelScope(shield=True):
            try:
                await self.run(op, operation)
            except LimiterUnavailableError:
                return False
        return True


def _logged_cost(rest: str) -> float | None:
    """The cost in a logged start's ``"<sequence> <cost>"``; None if it holds none
    (a start another version wrote is skipped, not a reason to fail a call)."""
    try:
        cost = float(rest.rpartition(" ")[2])
    except ValueError:
        return None
    return cost if math.isfinite(cost) and cost > 0 else None


@attrs.frozen
class BucketReply:
    """The bucket script's answer; durations are relative to the moment it ran."""

    granted: bool
    wait: float
    tokens: float
    blocked_for: float
    exhausted_for: float | None
    epoch: int
    before: float
    after: float
    shift: float = 0.0  # how far a wider slack has moved the schedule (``widen``)
    opened: float = 0.0  # when the latest burst began, on Redis's clock (0: none yet)
    opened_in: float = 0.0  # ... as seconds from the moment the script ran
    entry: str = ""  # a booking's name in the log of starts (``STARTS``)
    proven: float = 0.0  # the fastest refill a process sharing the bucket proved (``prove``)


@attrs.define(eq=False)
class SharedBucket:
    """The token bucket of one scope, as the ``BUCKET`` script keeps it."""

    link: RedisLink
    key: str
    exhausted_key: str
    _identity: str = attrs.field(init=False, factory=lambda: uuid.uuid4().hex)  # this process
    _script: Script[Any] = attrs.field(init=False)
    _starts: Script[Any] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._script = self.link.client.register_script(BUCKET)
        self._starts = self.link.client.register_script(STARTS)

    @property
    def _keys(self) -> list[str]:
        """The bucket, the exhaustion marker, the log of starts and its sequence (one slot)."""
        return [self.key, self.exhausted_key, f"{self.key}:starts", f"{self.key}:sequence"]

    async def run(
        self,
        op: str,
        *,
        rate: float | None,
        burst: float,
        cost: float = 1.0,
        extra: float = 0.0,
        slack: float = 0.0,
        booking: tuple[int, float, float] = (0, 0.0, 0.0),
        ahead: float = 0.0,
        entry: str = "",
        lost: float = 0.0,
    ) -> BucketReply:
        """One bucket op (see ``BUCKET``); ``rate=None`` is a bucket without a rate.

        ``booking`` is (epoch, before, after) of the booking a refund undoes,
        and ``entry`` its name in the log of starts; ``ahead``, what this
        process has booked and not yet started (``adopt``); ``lost``, how long
        the bucket would take to fill by what this process saw of it, should
        Redis have lost it (`RedisBackend._lost_refill`).
        """
        epoch, before, after = booking
        args = [
            op, lua_number(rate or 0.0), lua_number(burst), lua_number(cost), lua_number(extra),
            str(epoch), lua_number(before), lua_number(after), lua_number(slack),
            self._identity, lua_number(ahead), entry, lua_number(lost),
        ]  # fmt: skip
        call = functools.partial(self._script, keys=self._keys, args=args)
        raw = await self.link.run(op, call)
        exhausted_ms = int(raw[4])
        return BucketReply(
            granted=bool(int(raw[0])), wait=float(raw[1]), tokens=float(raw[2]),
            blocked_for=float(raw[3]),
            exhausted_for=exhausted_ms / 1000 if exhausted_ms > 0 else None,
            epoch=int(raw[5]), before=float(raw[6]), after=float(raw[7]), shift=float(raw[8]),
            opened=float(raw[9]), opened_in=float(raw[10]), entry=str(raw[11]),
            proven=float(raw[12]),
        )  # fmt: skip

    async def started_by_others(
        self, after: float
    ) -> tuple[float, float, list[tuple[float, float]]]:
        """What other processes logged to start after ``after`` (Redis's clock) and by now.

        Returns Redis's clock now, where the next read goes on from (now, or
        the last start read when there were more than ``_STARTS_READ``), and
        the (start, cost) of each, on Redis's clock.
        """
        args = [lua_number(after), str(_STARTS_READ)]
        call = functools.partial(self._starts, keys=[self._keys[2]], args=args)
        raw = await self.link.run("starts", call)
        now, pairs = float(raw[0]), raw[1:]
        found, last = [], now
        for member, score in zip(pairs[::2], pairs[1::2], strict=True):
            last = float(score)
            process, _, rest = str(member).partition(" ")
            cost = _logged_cost(rest)
            if process != self._identity and cost is not None:
                found.append((last, cost))
        return now, (last if len(pairs) >= 2 * _STARTS_READ else now), found

    async def mark_exhausted(self, seconds: float) -> None:
        """Tell every process the quota is spent for ``seconds`` (a key with a TTL)."""
        milliseconds = math.ceil(seconds * 1000)
        if milliseconds > 0:
            await self.link.run_quietly(
                "exhaust",
                functools.partial(self.link.client.set, self.exhausted_key, "1", px=milliseconds),
            )


@attrs.define(eq=False)
class SharedWindow:
    """The sliding log of one scope that counts in windows, as the ``WINDOW`` script keeps it.

    Replies are ``BucketReply``s: ``before`` and ``after`` are not used (a
    refund names its booking's member instead).
    """

    link: RedisLink
    key: str
    state_key: str
    exhausted_key: str
    _identity: str = attrs.field(init=False, factory=lambda: uuid.uuid4().hex)
    _serial: itertools.count[int] = attrs.field(init=False, factory=itertools.count)
    _script: Script[Any] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._script = self.link.client.register_script(WINDOW)

    def new_member(self, cost: float) -> str:
        """A booking's name: its cost (which the script reads), then an id unique to it."""
        return f"{cost!r}|{self._identity}:{next(self._serial)}"

    async def run(
        self,
        op: str,
        *,
        limit: float,
        window: float,
        cost: float = 1.0,
        extra: float = 0.0,
        slack: float = 0.0,
        epoch: int = 0,
        member: str = "",
        elapsed: float = 0.0,
        reset: float = -1.0,
        late: float = -1.0,
        lead: float = 0.0,
    ) -> BucketReply:
        """One log op (see ``WINDOW``)."""
        args = [
            op, lua_number(limit), lua_number(window), lua_number(cost), lua_number(extra),
            str(epoch), member, lua_number(slack), lua_number(elapsed), lua_number(reset),
            lua_number(late), lua_number(lead),
        ]  # fmt: skip
        keys = [self.key, self.state_key, self.exhausted_key]
        raw = await self.link.run(op, functools.partial(self._script, keys=keys, args=args))
        exhausted_ms = int(raw[4])
        return BucketReply(
            granted=bool(int(raw[0])), wait=float(raw[1]), tokens=float(raw[2]),
            blocked_for=float(raw[3]),
            exhausted_for=exhausted_ms / 1000 if exhausted_ms > 0 else None,
            epoch=int(raw[5]), before=math.nan, after=math.nan,
        )  # fmt: skip


@attrs.define(eq=False)
class SharedLeases:
    """Slots as leases in a sorted set scored by expiry; this process's are kept registered.

    ``held`` is every member this process's calls hold (leases Redis granted,
    and slots taken from the local fallback while Redis was away). Renewal
    pushes their expiry and adds back any Redis lost (a restart), so calls
    still in flight are always counted against the cap. After an outage the
    first acquisition re-registers them in the same script, before it counts.

    ``orphans`` are members that may exist without an owner: an acquisition
    cut off mid-ask (its script may still run when Redis resumes, as after a
    ``CLIENT PAUSE``), or a release Redis did not take. They are removed
    repeatedly from the moment Redis answers again until they could no
    longer appear.
    """

    link: RedisLink
    key: str
    cap: int
    ttl: float
    held: set[str] = attrs.field(init=False, factory=set)
    orphans: dict[str, float] = attrs.field(init=False, factory=dict)  # member -> forget at
    _identity: str = attrs.field(init=False, factory=lambda: uuid.uuid4().hex)
    _serial: itertools.count[int] = attrs.field(init=False, factory=itertools.count)
    _registered_at: int = attrs.field(init=False, default=0)  # link.failures when last synced
    _orphaned: trio.Event = attrs.field(init=False, factory=trio.Event)
    _acquire: Script[Any] = attrs.field(init=False)
    _renew: Script[Any] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._acquire = self.link.client.register_script(ACQUIRE_LEASE)
        self._renew = self.link.client.register_script(RENEW_LEASES)

    def new_member(self) -> str:
        """A fresh member name, unique to this process."""
        return f"{self._identity}:{next(self._serial)}"

    async def try_acquire(self) -> str | None:
        """One attempt: a lease's member name, or None while the cap is taken."""
        member = self.new_member()
        failures = self.link.failures
        # After a failure Redis may have lost this process's leases: add them back first.
        again = sorted(self.held) if failures != self._registered_at else []
        args = [str(self.cap), lua_number(self.ttl), member, *again]
        try:
            raw = await self.link.run(
                "lease", functools.partial(self._acquire, keys=[self.key], args=args)
            )
        except BaseException:
            self.orphan(member)  # cut off mid-ask: the lease may exist, now or later
            raise
        self._registered_at = failures
        if not int(raw[0]):
            return None
        self.held.add(member)
        return member

    def hold(self, member: str) -> None:
        """Count a slot taken without Redis (the fallback): registered once Redis answers."""
        self.held.add(member)
        self._registered_at = -1

    async def release(self, member: str) -> None:
        """Remove a lease now if Redis answers; otherwise remove it once it does."""
        self.held.discard(member)
        removed = await self.link.run_quietly(
            "release", functools.partial(self.link.client.zrem, self.key, [member])
        )
        if not removed:
            self.orphan(member)

    def orphan(self, member: str) -> None:
        """Remember a member that may exist without an owner, for removal."""
        self.held.discard(member)
        self.orphans[member] = math.inf  # the clock starts once Redis answers again
        self._orphaned.set()

    async def renew_forever(self) -> None:
        """Keep the held leases alive: one round trip per third of the TTL.

        After a failure the held leases may be gone from Redis (a restart),
        so they are registered again as soon as Redis answers: retried every
        ``recheck_after`` until then, not only once per third of the TTL.
        """
        while True:
            behind = self.held and self._registered_at != self.link.failures
            await trio.sleep(min(self.ttl / 3, self.link.recheck_after) if behind else self.ttl / 3)
            await self.renew()

    async def renew(self) -> None:
        """Push the expiry of every held member (adding back any Redis lost)."""
        members = sorted(self.held)
        if not members:
            return
        failures = self.link.failures
        args = [lua_number(self.ttl), *members]
        try:
            missing = await self.link.run(
                "renewal", functools.partial(self._renew, keys=[self.key], args=args), urgent=True
            )
        except LimiterUnavailableError:
            return
        self._registered_at = failures
        for member in set(members) - self.held:
            self.orphan(member)  # released while this renewal was on its way: remove again
        if missing:
            log.warning(
                "scope %r: %d lease(s) of calls still in flight were missing from Redis "
                "(restarted, or away longer than lease_ttl); registered again",
                self.link.scope, len(missing),
            )  # fmt: skip

    async def sweep_forever(self) -> None:
        """Remove orphans, every ``_SWEEP`` s, until they could no longer appear.

        A script Redis received before it paused runs when it resumes, up to
        ``op_timeout`` after it answers again; a member it adds expires by
        itself after ``ttl``. So each orphan is removed repeatedly from the
        moment Redis answers until ``ttl`` past that.
        """
        while True:
            if not self.orphans:
                self._orphaned = trio.Event()
                await self._orphaned.wait()
            await trio.sleep(_SWEEP)
            members = sorted(self.orphans)
            if not await self.link.run_quietly(
                "sweep", functools.partial(self.link.client.zrem, self.key, members)
            ):
                continue
            now = trio.current_time()
            for member in members:
                forget_at = self.orphans.get(member)
                if forget_at is None:
                    continue
                if forget_at == math.inf:
                    self.orphans[member] = now + self.ttl + self.link.op_timeout
                elif now >= forget_at:
                    del self.orphans[member]
