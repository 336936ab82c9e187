"""A scope: the unit a server throttles, and everything fanout knows about it.

One API key's limits are shared by every tool that uses the key, so limits
live on the scope, not on the tool. A scope holds a ``trio.CapacityLimiter``
(calls in flight), a token bucket (rate and burst), the server's "blocked
until", its quota state, a retry budget, and the latency it has observed (for
honest drain estimates when it sheds load).

Every method a caller awaits is async, so that a scope shared between
processes (on Redis) can stand behind the same interface.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from ._bucket import BucketStatistics, TokenBucket
from ._exceptions import ConfigurationError
from ._learning import RateLearner
from ._ledger import Ledger
from ._probe import Probe
from ._retry import RetryBudget

if TYPE_CHECKING:
    from ._headers import RateLimitInfo

__all__ = [
    "Scope",
    "ScopeLike",
    "ScopeStatistics",
    "SlotHolder",
    "concurrency_for",
    "scopes_named",
]


def concurrency_for(rate: float, latency: float) -> int:
    """Little's law: the in-flight cap that sustains ``rate`` at ``latency``.

    10 requests a second that each take 0.4 s keep 4 in flight; more slots
    only queue at the server, fewer leave rate unused.
    """
    if not (rate > 0 and latency > 0 and math.isfinite(rate * latency)):
        raise ConfigurationError("rate and latency must be positive and finite")
    return max(1, math.ceil(rate * latency - 1e-9))


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


@attrs.frozen
class ScopeStatistics:
    """A snapshot of one scope, cheap and safe to take from any task.

    ``in_flight`` counts calls holding a slot; ``waiting`` counts calls queued
    for a slot, the probe or tokens. A call that holds its slot while it
    waits for a token is in both: it occupies capacity and is not yet running.
    """

    name: str
    in_flight: int
    max_concurrency: int | None
    waiting: int
    bucket: BucketStatistics
    exhausted_until: float | None
    latency: float | None
    shed: int
    requests: int
    retries: int
    retries_refused: int


class SlotHolder(Protocol):
    """What a scope needs to know of whoever holds a slot: only identity."""


class ScopeLike(Protocol):
    """What the runner needs of a scope; ``Scope`` here, ``RedisScope`` across processes.

    Awaited methods may talk to a server; the others must be cheap and local.
    ``release_slot`` and ``refund`` are called from ``finally`` blocks, under
    cancellation: an implementation that does I/O shields them itself, with a
    short timeout of its own.
    """

    @property
    def name(self) -> str: ...
    @property
    def max_concurrency(self) -> int | None: ...
    @property
    def quota_horizon(self) -> float: ...
    @property
    def retry_budget(self) -> RetryBudget: ...
    def should_shed(self) -> bool: ...
    def has_free_slot(self) -> bool: ...
    def count_shed(self) -> None: ...
    def drain_estimate(self) -> float: ...
    def note_waiting(self, delta: int) -> None: ...
    async def acquire_slot(self, holder: SlotHolder, deadline: float) -> bool: ...
    async def release_slot(self, holder: SlotHolder) -> None: ...
    async def reserve(self, cost: float, max_wait: float) -> float | None: ...
    async def refund(self, cost: float) -> None: ...
    async def wait_for(self, cost: float) -> float: ...
    async def on_throttled(self, wait: float) -> None: ...
    async def block_until(self, when: float) -> None: ...
    async def observe_headers(self, info: RateLimitInfo) -> None: ...
    def exhaust(self, until: float) -> None: ...
    def exhausted_until(self) -> float | None: ...
    def observe_call(self, seconds: float, *, ok: bool) -> None: ...
    def expected_latency(self) -> float | None: ...
    def set_limits(self, rate: float | None, burst: float) -> None: ...
    def statistics(self) -> ScopeStatistics: ...


@attrs.define(eq=False)
class Scope:
    """Limits shared by every call that draws from ``name``.

    ``rate`` and ``burst`` configure the token bucket (``rate=None``: no rate
    limit until one is learned from the server's headers); ``max_concurrency``
    caps calls in flight; ``max_waiters`` bounds how many calls may queue
    before the rest are answered at once; ``quota_horizon`` is the longest
    server wait still treated as throttling rather than an exhausted quota.

    A scope built without a ``rate`` learns one (``learn=True``): from the
    limits the server states in its headers, else from its 429s; and until
    its first call has finished, it lets that one call out alone. ``slack``
    (seconds) allows for the network at the start of a burst; see
    ``TokenBucket``.
    """

    name: str
    rate: float | None = None
    burst: float | None = None
    max_concurrency: int | None = None
    max_waiters: int | None = 64
    quota_horizon: float = 3600.0
    retry_budget: RetryBudget = attrs.field(factory=RetryBudget)
    learn: bool = True
    slack: float = 0.0
    _bucket: TokenBucket = attrs.field(init=False)
    _limiter: trio.CapacityLimiter | None = attrs.field(init=False)
    _ledger: Ledger = attrs.field(init=False, factory=Ledger)
    _learner: RateLearner | None = attrs.field(init=False, default=None)
    _probe: Probe = attrs.field(init=False, factory=lambda: Probe(done=True))

    def __attrs_post_init__(self) -> None:
        if not self.name:
            raise ConfigurationError("a scope needs a non-empty name")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigurationError(f"max_concurrency must be >= 1, not {self.max_concurrency}")
        if self.max_waiters is not None and self.max_waiters < 0:
            raise ConfigurationError(f"max_waiters must be >= 0, not {self.max_waiters}")
        burst = self.burst if self.burst is not None else max(1.0, self.rate or 1.0)
        self._bucket = TokenBucket(self.rate, burst, slack=self.slack)
        self._limiter = trio.CapacityLimiter(self.max_concurrency) if self.max_concurrency else None
        if self.rate is None and self.learn:
            self._learner = RateLearner()
            self._probe = Probe()

    # -- admission --------------------------------------------------------

    def should_shed(self) -> bool:
        """Whether the queue is full, so a new call must be answered at once."""
        return self.max_waiters is not None and self._ledger.waiting >= self.max_waiters

    def has_free_slot(self) -> bool:
        """Whether ``acquire_slot`` would return at once (a scope that cannot
        know cheaply, like a shared one, says False)."""
        if not self._probe.is_open():
            return False
        if self._limiter is None:
            return True
        return self._limiter.available_tokens > 0 and self._ledger.waiting == 0

    async def acquire_slot(self, holder: SlotHolder, deadline: float) -> bool:
        """Take a slot for ``holder``, or return False once ``deadline`` passes."""
        if not await self._pass_probe(holder, deadline):
            return False
        if not await self._take_slot(holder, deadline):
            self._probe.abandoned(holder)
            self._probe.step_done()
            return False
        return True

    async def _pass_probe(self, holder: SlotHolder, deadline: float) -> bool:
        if self._probe.is_open():
            return await self._probe.wait_turn(holder, deadline)
        self._ledger.waiting += 1
        try:
            return await self._probe.wait_turn(holder, deadline)
        finally:
            self._ledger.waiting -= 1

    async def _take_slot(self, holder: SlotHolder, deadline: float) -> bool:
        if self._limiter is None:
            await trio.lowlevel.checkpoint()
            self._ledger.in_flight += 1
            return True
        try:
            # A free slot is taken even when no time is left to wait for one.
            self._limiter.acquire_on_behalf_of_nowait(holder)
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            self._ledger.in_flight += 1
            return True
        self._ledger.waiting += 1
        try:
            with trio.move_on_at(deadline):
                await self._limiter.acquire_on_behalf_of(holder)
                self._ledger.in_flight += 1
                return True
            return False
        finally:
            self._ledger.waiting -= 1

    async def release_slot(self, holder: SlotHolder) -> None:
        """Give the slot back; safe to call from a ``finally`` under cancellation."""
        self._probe.abandoned(holder)
        self._probe.step_done()
        self._ledger.in_flight -= 1
        if self._limiter is not None:
            self._limiter.release_on_behalf_of(holder)

    async def reserve(self, cost: float, max_wait: float) -> float | None:
        """Reserve tokens: the wait before starting, or None (nothing consumed)."""
        try:
            return self._bucket.reserve(cost, max_wait=max_wait)
        finally:
            self._probe.step_done()

    async def refund(self, cost: float) -> None:
        """Hand back a reservation whose call gave up before starting."""
        self._bucket.refund(cost)

    async def wait_for(self, cost: float) -> float:
        """Seconds until ``cost`` tokens would be available, consuming nothing."""
        return self._bucket.wait_for(cost)

    def note_waiting(self, delta: int) -> None:
        """Count a call that waits for tokens, so shedding sees the whole queue."""
        self._ledger.waiting += delta

    def drain_estimate(self) -> float:
        """How long the calls already here need before a new one would start.

        From the queue (waiting plus in flight), the rate, the concurrency and
        the latency observed so far; a new call re-issued after this long
        finds the queue drained.
        """
        by_rate = self._bucket.wait_for(1.0)
        if self._bucket.rate is not None:
            by_rate += self._ledger.waiting / self._bucket.rate
        return max(self._ledger.slots_estimate(self.max_concurrency), by_rate)

    def count_shed(self) -> None:
        self._ledger.shed += 1

    # -- what the server told us -----------------------------------------

    async def on_throttled(self, wait: float) -> None:
        """A 429: empty the bucket, start nothing for ``wait`` s, and slow down if learning."""
        self._bucket.drain(wait)
        if self._learner is not None:
            self._learner.on_throttled(
                float(self.retry_budget.recent_requests(1.0)),
                now=trio.current_time(),
                wait=wait,
            )
            self._apply_learned()

    async def block_until(self, when: float) -> None:
        """The server's remaining count hit zero: start nothing before ``when``."""
        self._bucket.block_until(when)

    async def observe_headers(self, info: RateLimitInfo) -> None:
        """Take in what a response said: an exhausted window, and stated limits."""
        if info.remaining is not None and info.remaining < 1 and info.reset_after is not None:
            self._bucket.block_until(trio.current_time() + info.reset_after)
        if self._learner is None:
            return
        first = self._bucket.rate is None
        if self._learner.from_headers(info.limit, info.window, info.remaining, info.reset_after):
            # The first answer is the probe's, alone in flight: what it says
            # remains is exactly what the bucket may spend now.
            self._apply_learned(tokens=info.remaining if first else None)

    def exhaust(self, until: float) -> None:
        """The quota is spent: answer every call ``quota_exhausted`` until ``until``."""
        self._ledger.exhaust(until)

    def exhausted_until(self) -> float | None:
        """When the spent quota returns, or None while the scope is usable."""
        return self._ledger.exhausted_until()

    def observe_call(self, seconds: float, *, ok: bool) -> None:
        """One attempt finished: fold in its duration, end the probe, learn from success."""
        self._ledger.observe_latency(seconds)
        self._probe.finished()
        if ok and self._learner is not None:
            self._learner.on_success()
            self._apply_learned()

    def expected_latency(self) -> float | None:
        """The moving average of call durations here, or None before any finished."""
        return self._ledger.latency

    def _apply_learned(self, *, tokens: float | None = None) -> None:
        assert self._learner is not None
        if self._learner.rate is not None:
            burst = max(1.0, self._learner.burst)
            self._bucket.set_limits(self._learner.rate, burst, tokens=tokens)

    def set_limits(self, rate: float | None, burst: float) -> None:
        """Replace the bucket's rate and burst (learned from the server)."""
        self._bucket.set_limits(rate, burst)

    # -- snapshots ---------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self._ledger.in_flight

    @property
    def bucket(self) -> TokenBucket:
        return self._bucket

    def statistics(self) -> ScopeStatistics:
        budget = self.retry_budget.statistics()
        return ScopeStatistics(
            name=self.name,
            in_flight=self.in_flight,
            max_concurrency=self.max_concurrency,
            waiting=self._ledger.waiting,
            bucket=self._bucket.statistics(),
            exhausted_until=self.exhausted_until(),
            latency=self._ledger.latency,
            shed=self._ledger.shed,
            requests=budget.requests,
            retries=budget.retries,
            retries_refused=budget.refused,
        )
