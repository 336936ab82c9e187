"""An in-process fake API for limit tests: a token bucket of its own and a record of requests.

It stands where a real server would, but without sockets, so a test can
count requests and timestamps exactly on trio's mock clock. The HTTP tests
use the real loopback server in ``fanout.testing`` instead.
"""

from __future__ import annotations

import attrs
import trio

import fanout


@attrs.define
class FakeAPI:
    """Admits ``burst`` requests, then one per ``1/rate`` s; answers 429 beyond that."""

    rate: float
    burst: int
    retry_after: float | None = None  # None: the true wait until the next token
    latency: float = 0.0
    starts: list[float] = attrs.field(factory=list)
    throttled: list[float] = attrs.field(factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    _tokens: float = attrs.field(init=False)
    _updated: float | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._tokens = float(self.burst)

    async def request(self, scope: str | None = None) -> str:
        now = trio.current_time()
        if self._updated is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        if self._tokens < 1 - 1e-9:
            self.throttled.append(now)
            wait = self.retry_after
            if wait is None:
                wait = (1 - self._tokens) / self.rate
            raise fanout.RateLimitedError("429 Too Many Requests", retry_after=wait, scope=scope)
        self._tokens -= 1
        self.starts.append(now)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await trio.sleep(self.latency)
        finally:
            self.in_flight -= 1
        return f"ok #{len(self.starts)}"

    @property
    def requests(self) -> int:
        return len(self.starts) + len(self.throttled)


def max_in_window(times: list[float], window: float) -> int:
    """The most request starts in any half-open window [t, t + window)."""
    ordered = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(ordered):
        while ordered[lo] <= t - window + 1e-9:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
