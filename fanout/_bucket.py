"""A token bucket that reserves with a maximum wait, on trio's clock.

Algorithm: the classic token bucket kept as (tokens, updated), where tokens
may go negative. A negative balance is a queue of reservations already
promised to callers that are sleeping until their start time, which makes
this equivalent to GCRA's virtual scheduling: the wait a caller gets is when
the balance it leaves behind will have refilled.

Its one primitive is ``reserve(cost, max_wait)``: the wait before the caller
may start, or a refusal *that consumes nothing* when the wait is more than the
caller can afford. A caller that gives up during its wait hands the tokens
back with ``refund``. After a 429 the bucket ``drain``s: its tokens go to zero
and nothing starts before the server's "blocked until".
"""

from __future__ import annotations

import math

import attrs
import trio

from ._exceptions import ConfigurationError

__all__ = ["BucketStatistics", "TokenBucket"]


@attrs.frozen
class BucketStatistics:
    """A snapshot of a bucket, cheap to take at any time."""

    rate: float | None
    burst: float
    tokens: float
    blocked_until: float
    reserved: int
    refused: int
    refunded: int
    drained: int


@attrs.define
class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``rate=None`` means no rate limit.

    A bucket without a rate still honours ``blocked_until``, so a scope whose
    limits are unknown still obeys the server's Retry-After.

    ``slack`` allows for the network. A server's bucket starts refilling when
    the first request of a burst *arrives*, and that one is often the slowest
    to arrive (it opens the connection). So when a burst starts from a full
    bucket, refilling is counted from ``slack`` seconds later, and the first
    request after the burst cannot reach the server before its token exists.
    """

    rate: float | None
    burst: float = attrs.field(default=1.0)
    slack: float = attrs.field(default=0.0)
    _tokens: float = attrs.field(init=False)
    _updated: float | None = attrs.field(init=False, default=None)
    _blocked_until: float = attrs.field(init=False, default=-math.inf)
    _reserved: int = attrs.field(init=False, default=0)
    _refused: int = attrs.field(init=False, default=0)
    _refunded: int = attrs.field(init=False, default=0)
    _drained: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        _check_limits(self.rate, self.burst)
        if not (self.slack >= 0 and math.isfinite(self.slack)):
            raise ConfigurationError(f"slack must be a finite number >= 0, not {self.slack!r}")
        self._tokens = self.burst

    def set_limits(self, rate: float | None, burst: float, *, tokens: float | None = None) -> None:
        """Change the rate and burst (learned limits), keeping what is owed.

        ``tokens`` sets the balance outright, for a bucket adopting limits for
        the first time from a server that also said how many requests remain.
        """
        _check_limits(rate, burst)
        self._refill()
        self.rate, self.burst = rate, burst
        if tokens is not None and math.isfinite(tokens):
            self._tokens = tokens
        self._tokens = min(self._tokens, burst)

    def wait_for(self, cost: float = 1.0) -> float:
        """Seconds until ``cost`` tokens could be reserved, consuming nothing."""
        self._check_cost(cost)
        self._refill()
        now = trio.current_time()
        if self.rate is None:
            return max(0.0, self._blocked_until - now)
        # Tokens accrue from ``_updated`` on, through any block; the call may
        # start once enough have accrued and the block is over.
        assert self._updated is not None
        shortfall = cost - self._tokens
        ready = self._blocked_until
        if shortfall > 0:
            ready = max(ready, self._updated + shortfall / self.rate)
        return max(0.0, ready - now)

    def reserve(self, cost: float = 1.0, *, max_wait: float = math.inf) -> float | None:
        """Reserve ``cost`` tokens; return the wait before starting, or None.

        None means the wait would exceed ``max_wait``; nothing was consumed.
        """
        wait = self.wait_for(cost)
        if wait > max_wait:
            self._refused += 1
            return None
        if self.rate is not None:
            starts_burst = self._tokens >= self.burst
            self._tokens -= cost
            if starts_burst and self.slack:
                assert self._updated is not None
                self._updated = max(self._updated, trio.current_time()) + self.slack
        self._reserved += 1
        return wait

    def refund(self, cost: float = 1.0) -> None:
        """Give back a reservation whose caller gave up before starting."""
        self._refill()
        if self.rate is not None:
            self._tokens = min(self.burst, self._tokens + cost)
        self._refunded += 1

    def drain(self, blocked_for: float = 0.0) -> None:
        """The server said we went too fast: empty the bucket, block ``blocked_for`` s."""
        self._refill()
        self._tokens = min(self._tokens, 0.0)
        self._blocked_until = max(self._blocked_until, trio.current_time() + blocked_for)
        self._drained += 1

    def block_until(self, when: float) -> None:
        """Start nothing before ``when`` (the server's reset), without draining."""
        self._blocked_until = max(self._blocked_until, when)

    @property
    def blocked_until(self) -> float:
        return self._blocked_until

    def statistics(self) -> BucketStatistics:
        self._refill()
        return BucketStatistics(
            rate=self.rate,
            burst=self.burst,
            tokens=self._tokens,
            blocked_until=self._blocked_until,
            reserved=self._reserved,
            refused=self._refused,
            refunded=self._refunded,
            drained=self._drained,
        )

    def _refill(self) -> None:
        # The clock is read on first use, not at construction, so buckets
        # (and scopes) can be built before trio.run starts.
        now = trio.current_time()
        if self._updated is None:
            self._updated = now
        if now <= self._updated:
            return  # refilling has not resumed yet (slack after a burst began)
        if self.rate is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now

    def _check_cost(self, cost: float) -> None:
        if not (cost > 0 and math.isfinite(cost)):
            raise ConfigurationError(f"a call's cost must be a positive number, not {cost!r}")
        if self.rate is not None and cost > self.burst:
            raise ConfigurationError(
                f"a call costing {cost:g} tokens can never start on a bucket whose "
                f"burst is {self.burst:g}"
            )


def _check_limits(rate: float | None, burst: float) -> None:
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise ConfigurationError(f"rate must be a positive number of tokens a second, not {rate!r}")
    if not (burst >= 1 and math.isfinite(burst)):
        raise ConfigurationError(f"burst must be at least 1, not {burst!r}")
