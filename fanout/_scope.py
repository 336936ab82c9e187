"""A scope: the unit a server throttles, kept in this process.

One API key's limits are shared by every tool that uses the key, so limits
live on the scope, not on the tool. ``Scope`` is the scope front (every rule,
in ``_front``) over a local backend: a ``trio.CapacityLimiter`` for calls in
flight and a ``TokenBucket`` for rate and burst.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from ._backend import SlotHolder
from ._bucket import TokenBucket
from ._budget import QUOTA_HORIZON
from ._canonical import shown
from ._exceptions import ConfigurationError
from ._front import ScopeFront, ScopeStatistics
from ._slots import take_slot
from ._validate import finite
from ._window import SlidingLog

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from contextlib import AbstractContextManager

    from ._bucket import Booking, BucketStatistics, ServerCount
    from ._budget import Budget
    from ._retry import RetryBudget
    from ._slots import Leaving
    from ._values import RateLimitInfo

__all__ = [
    "LocalBackend",
    "Scope",
    "ScopeLike",
    "ScopeStatistics",
    "SlotHolder",
    "concurrency_for",
    "quota_horizon",
    "scopes_named",
]


def concurrency_for(rate: float, latency: float) -> int:
    """Little's law: the in-flight cap that sustains ``rate`` at ``latency``.

    10 requests a second that each take 0.4 s keep 4 in flight; more slots
    only queue at the server, fewer leave rate unused.
    """
    rate_, latency_ = finite(rate), finite(latency)
    if rate_ is None or latency_ is None or not (rate_ > 0 and latency_ > 0):
        raise ConfigurationError(
            f"rate and latency must be positive and finite, not {shown(rate)} and {shown(latency)}"
        )
    if not math.isfinite(rate_ * latency_):
        raise ConfigurationError("rate and latency must give a finite product")
    return max(1, math.ceil(rate_ * latency_ - 1e-9))


def scopes_named(scopes: tuple[ScopeLike, ...], named: str | None) -> tuple[ScopeLike, ...]:
    """The scopes a server's wait applies to: the one it named, else all of them.

    A server that names the bucket it throttled (an organisation, a
    resource) holds back that bucket only, so calls governed by another
    scope are not stalled by it.
    """
    if named is not None:
        hit = tuple(scope for scope in scopes if scope.name == named)
        if hit:
            return hit
    return scopes


def scopes_stated(scopes: tuple[ScopeLike, ...], info: RateLimitInfo) -> tuple[ScopeLike, ...]:
    """The scopes an answer's counts speak for: the scope the server named (`scopes_named`);
    of a call on several, those told the limit it states; where none was, those told no
    limit (learning); else all of them.

    A server that enforces two limits (10 a second and 25 in 4 s; requests a
    minute and a second) states the one nearer to refusing. Taken in by every
    scope of the call, the bucket's ``Limit: 10`` became the window's limit
    and its ``Remaining: 0`` spent the window: 3.1-3.6x the fastest, and as
    slow told ``trust="config"``.
    """
    named = scopes_named(scopes, info.scope)
    if len(named) < 2 or info.scope is not None or info.limit is None:
        return named
    told = tuple(scope for scope in named if scope.told_limit == info.limit)
    if told:
        return told
    untold = tuple(scope for scope in named if scope.told_limit is None)
    return untold or named


def quota_horizon(scopes: tuple[ScopeLike, ...]) -> float:
    """The longest server wait these scopes still take as throttling: a longer one
    means a spent quota (the shortest of their ``quota_horizon``)."""
    return min((scope.quota_horizon for scope in scopes), default=QUOTA_HORIZON)


class ScopeLike(Protocol):
    """What the runner needs of a scope: ``Scope`` here, ``RedisScope`` across processes.

    Both are ``ScopeFront`` over a backend; this protocol is what the call,
    admission and HTTP layers may rely on.
    """

    @property
    def name(self) -> str: ...
    @property
    def max_concurrency(self) -> int | None: ...
    @property
    def told_limit(self) -> float | None: ...
    @property
    def quota_horizon(self) -> float: ...
    @property
    def retry_budget(self) -> RetryBudget: ...
    def has_free_slot(self) -> bool: ...
    def queue_full(self) -> bool: ...
    def shed(self, budget: Budget) -> float | None: ...
    def drain_estimate(self) -> float: ...
    def note_waiting(self, delta: int) -> None: ...
    async def acquire_slot(self, holder: SlotHolder, deadline: float) -> bool: ...
    async def release_slot(self, holder: SlotHolder) -> None: ...
    async def reserve(self, cost: float, max_wait: float) -> Booking | None: ...
    async def refund(self, booking: Booking) -> None: ...
    async def confirm(self, booking: Booking) -> bool: ...
    def voided(self) -> trio.Event | None: ...
    def retimed(self, booking: Booking) -> Booking: ...
    def note_run(self, run: object) -> None: ...
    def warm_hold(self) -> float: ...
    def warm_request_left(self) -> None: ...
    def warm_request_back(self) -> None: ...
    def headers_left(self, admitted_at: float) -> None: ...
    def admission_lead(self) -> float: ...
    def request_delayed(self, booked_by: float, *, first: bool = ...) -> None: ...
    def request_left(self, booked_by: float, *, first: bool = ...) -> None: ...
    def window_wait(self, booked_by: float) -> float: ...
    def wire_wait(self) -> float: ...
    def wire_left(self) -> float: ...
    def wire_written(
        self, found: float, late: float, *, booked_by: float, opened: bool = False,
        connecting: float = ...,
    ) -> None: ...  # fmt: skip
    def attempt_began(self, admitted_at: float) -> None: ...
    def attempt_ended(self, admitted_at: float) -> None: ...
    async def wait_for(self, cost: float) -> float: ...
    async def on_throttled(
        self, wait: float | None, *, sent_at: float | None = None, arriving: bool = False
    ) -> None: ...
    async def block_until(self, when: float) -> None: ...
    async def request_leaving(
        self, admitted_at: float = ..., on_wait: Callable[[float], None] | None = ...
    ) -> Leaving: ...
    def request_back(self, *, sent: bool = True) -> None: ...
    async def observe_headers(
        self, info: RateLimitInfo, *, sent_at: float | None = None, refused: bool = False,
        opened: bool | None = None, left_with: Leaving | None = None, overloaded: bool = False,
        booked_by: float | None = None, left_at: float | None = None,
        connecting: float | None = None,
    ) -> None: ...  # fmt: skip
    def exhaust(self, until: float) -> None: ...
    def exhausted_until(self) -> float | None: ...
    def probed(self, sent_at: float | None = None) -> bool: ...
    def observe_call(
        self, seconds: float, *, ok: bool, warm: bool = True, reused: bool = False
    ) -> None: ...
    def observe_send_lag(self, seconds: float, *, arrived_at: float = ...) -> None: ...
    def observe_wake_lag(self, seconds: float) -> None: ...
    def observe_write_lag(self, seconds: float) -> None: ...
    def observe_connect(self, seconds: float) -> None: ...
    def expected_latency(self) -> float | None: ...
    def wait_latency(self) -> float | None: ...
    def quickest_call(self) -> float | None: ...
    def rate_rising(self) -> trio.Event | None: ...
    def pressing(self, last: float) -> AbstractContextManager[None]: ...
    def statistics(self) -> ScopeStatistics: ...


@attrs.define(eq=False)
class LocalBackend:
    """Slots in a ``trio.CapacityLimiter``, tokens in a ``TokenBucket`` or, for an
    API that counts in windows, a ``SlidingLog`` (``use_window``).

    Each awaited method checkpoints *before* it acts, so what it decided is
    still true when it returns.
    """

    bucket: TokenBucket
    limiter: trio.CapacityLimiter | None
    log: SlidingLog | None = None

    @property
    def tokens(self) -> TokenBucket | SlidingLog:
        """Where tokens live now: the log once the scope counts in windows."""
        return self.log if self.log is not None else self.bucket

    def use_window(self, window: float) -> None:
        """Count tokens in a log of ``burst`` per ``window`` s from now on.

        The bucket's bookings are void (their holders wake and book again in
        the log, which goes on from the bucket's epochs); a block carries over.
        Called again (a window learned too short), the log keeps what it holds
        and counts it in the longer window.
        """
        if self.log is not None:
            self.log.lengthen(window)
            return
        bucket = self.bucket
        bucket.drain()
        log = SlidingLog(bucket.burst, window, bucket.slack, epochs=bucket.epochs)
        log.block_until(bucket.blocked_until)
        self.log = log

    def leave_window(self) -> None:
        """Count tokens in the bucket again: a window learned wrong. The front drains it
        with the refusal's wait, which voids the log's bookings too (they share epochs)."""
        self.log = None

    def has_free_slot(self) -> bool:
        if self.limiter is None:
            return True
        return self.limiter.available_tokens > 0 and self.limiter.statistics().tasks_waiting == 0

    async def acquire_slot(self, holder: SlotHolder, deadline: float) -> bool:
        if self.limiter is None:
            await trio.lowlevel.checkpoint()
            return True
        return await take_slot(self.limiter, holder, deadline)

    async def release_slot(self, holder: SlotHolder) -> None:
        if self.limiter is not None:
            self.limiter.release_on_behalf_of(holder)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def reserve(self, cost: float, max_wait: float) -> Booking | None:
        await trio.lowlevel.checkpoint()
        return self.tokens.reserve(cost, max_wait=max_wait)

    async def refund(self, booking: Booking) -> None:
        self.tokens.refund(booking)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def confirm(self, booking: Booking) -> float | None:
        await trio.lowlevel.checkpoint()
        return booking.starts if self.tokens.confirm(booking) else None

    async def wait_for(self, cost: float) -> float:
        await trio.lowlevel.checkpoint()
        return self.tokens.wait_for(cost)

    async def hold_started(self, starts: Sequence[tuple[float, float]]) -> None:
        if self.log is not None:
            self.log.hold_started(starts)
        await trio.lowlevel.checkpoint()

    async def answered(
        self, sent: float, arrived_by: float, *, booked_by: float | None, set_up: float,
        way: float | None = None,
    ) -> None:  # fmt: skip
        if self.log is not None:
            self.log.answered(sent, arrived_by, booked_by=booked_by, set_up=set_up, way=way)
        await trio.lowlevel.cancel_shielded_checkpoint()

    def delayed(self, booked_by: float) -> None:
        if self.log is not None:
            self.log.delayed(booked_by)

    def left(self, booked_by: float, *, anew: bool = False) -> None:
        if self.log is not None:
            self.log.left(booked_by, anew=anew)

    def written(self, booked_by: float, late: float, *, read_late: float = 0.0) -> None:
        if self.log is not None:
            self.log.written(booked_by, late, read_late=read_late)

    def departure_wait(self, booked_by: float) -> float:
        return 0.0 if self.log is None else self.log.departure_wait(booked_by)

    async def drain(self, blocked_for: float) -> None:
        self.tokens.drain(blocked_for)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def block_until(self, when: float) -> None:
        self.tokens.block_until(when)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def sync(self, count: ServerCount) -> None:
        self.tokens.sync(count)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def others_started(self) -> list[tuple[float, float]]:
        return []  # no other process shares these tokens

    def prove(self, rate: float) -> None:
        pass  # no other process to tell

    def proven(self) -> float:
        return 0.0

    def set_limits(self, rate: float | None, burst: float, *, tokens: float | None = None) -> None:
        self.tokens.set_limits(rate, burst, tokens=tokens)

    def set_slack(self, slack: float) -> None:
        self.tokens.set_slack(slack)

    def voided(self) -> trio.Event | None:
        return self.tokens.voided()

    def retimed(self, booking: Booking) -> Booking:
        """A log's bookings never move: only a bucket owes (``owe``)."""
        return booking if self.log is not None else self.bucket.retimed(booking)

    def estimated_wait(self, cost: float) -> float:
        return self.tokens.wait_for(min(cost, self.tokens.burst))

    def owe(self, tokens: float) -> None:
        """Only a bucket says what it holds (``present``), so only a bucket is held for and owes."""
        self.bucket.owe(tokens)

    def share_exhaustion(self, until: float) -> None:
        """Nothing to share: this process is the only one that uses the scope."""

    def bucket_statistics(self) -> BucketStatistics:
        return self.tokens.statistics()

    def blocked_until(self) -> float:
        return self.tokens.blocked_until

    @property
    def shared(self) -> bool:
        """No: this process is the only one that uses the scope."""
        return False


@attrs.define(eq=False)
class Scope(ScopeFront):
    """Limits shared by every call in this process that draws from ``name``.

    Configured as ``ScopeFront`` says (rate, burst, concurrency, shedding,
    quota horizon, slack, trust, window). A scope built without a ``rate``
    learns one (``learn=True``): from the limits the server states, the way
    its ``Remaining`` refills, else from its 429s; until its first call has
    finished, it lets that one call out alone.
    """

    name: str

    def __attrs_post_init__(self) -> None:
        self._told_window()
        self._build()

    def _build(self) -> None:
        # A learned bucket is a guess: a guessed burst of one would pause after every call.
        told = self.rate is not None or not self.learn
        bucket = TokenBucket(self.rate, self._initial_burst(), every_fill=told)
        per = self.per
        log = SlidingLog(self._initial_burst(), per, told=True) if per is not None else None
        limiter = trio.CapacityLimiter(self.max_concurrency) if self.max_concurrency else None
        self._start_front(LocalBackend(bucket, limiter, log))

    @property
    def bucket(self) -> TokenBucket:
        """The local token bucket (for inspection and tests)."""
        backend = self._backend
        assert isinstance(backend, LocalBackend)
        return backend.bucket
