"""When to try again, and when to stop amplifying a failing downstream.

``RetryPolicy`` is capped exponential backoff with jitter. Jitter matters
more than the exponent: calls of one turn fail together, and without it their
retries land together and re-trigger the limit they hit (the thundering herd).
"Full" jitter, uniform in [0, min(cap, base * 2**n)], spreads a wave widest.

``RetryBudget`` bounds retries on a scope to a fraction of its recent
requests plus a small floor, as Envoy's retry budgets and gRPC's retry
throttling do: a downstream that is failing gets fewer requests from us, not
a multiple of them.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Literal

import attrs
import trio

from ._exceptions import ConfigurationError
from ._trio_runs import RunSeen
from ._validate import at_least, finite_non_negative, positive

if TYPE_CHECKING:
    import random

__all__ = ["Jitter", "RetryBudget", "RetryBudgetStatistics", "RetryPolicy"]

Jitter = Literal["full", "equal", "none"]


@attrs.frozen
class RetryPolicy:
    """How many attempts a call gets and how long it backs off between them.

    ``attempts`` counts the first try. A server's own wait (Retry-After) takes
    precedence over the backoff; either way the wait is charged to the call's
    budget, and a wait that does not fit is answered rather than slept.
    """

    attempts: int = attrs.field(default=3, validator=at_least(1))
    base: float = attrs.field(default=0.1, validator=finite_non_negative)
    cap: float = attrs.field(default=10.0, validator=finite_non_negative)
    jitter: Jitter = attrs.field(default="full")

    @jitter.validator
    def _check_jitter(self, _: attrs.Attribute[str], value: str) -> None:
        if value not in ("full", "equal", "none"):
            raise ConfigurationError(f"jitter must be 'full', 'equal' or 'none', not {value!r}")

    def backoff(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number ``retry`` (0 for the first retry)."""
        ceiling = min(self.cap, self.base * 2.0 ** min(retry, 64))
        if self.jitter == "full":
            return rng.uniform(0.0, ceiling)
        if self.jitter == "equal":
            return ceiling / 2 + rng.uniform(0.0, ceiling / 2)
        return ceiling


@attrs.frozen
class RetryBudgetStatistics:
    """A snapshot of a retry budget: requests and retries in its window, retries refused."""

    requests: int
    retries: int
    refused: int


@attrs.define
class RetryBudget:
    """Retries allowed on a scope: ``floor + ratio * requests`` in the last ``window`` s."""

    ratio: float = attrs.field(default=0.2, validator=finite_non_negative)
    floor: int = attrs.field(default=3, validator=at_least(0))
    window: float = attrs.field(default=10.0, validator=positive)
    _requests: collections.deque[float] = attrs.field(init=False, factory=collections.deque)
    _retries: collections.deque[float] = attrs.field(init=False, factory=collections.deque)
    _refused: int = attrs.field(init=False, default=0)
    _seen: RunSeen = attrs.field(init=False, factory=RunSeen)

    def note_run(self, run: object) -> None:
        """Forget the requests and retries of an earlier trio.run (`fanout._trio_runs`):
        their times are on its clock, and one ahead of the new run's never left the window.
        A budget shared by scopes forgets them once."""
        if self._seen.moved_to(run):
            self._requests.clear()
            self._retries.clear()

    def record_request(self) -> None:
        """Count one request (first try or retry) sent to the scope."""
        self._requests.append(trio.current_time())

    def recent_requests(self, seconds: float) -> int:
        """Requests sent in the last ``seconds`` (at most the window)."""
        horizon = trio.current_time() - seconds
        return sum(1 for t in self._requests if t > horizon)

    def try_spend(self) -> bool:
        """Take one retry from the budget, or say no (and count the refusal)."""
        self._forget_old()
        allowed = self.floor + self.ratio * len(self._requests)
        if len(self._retries) + 1 > allowed:
            self._refused += 1
            return False
        self._retries.append(trio.current_time())
        return True

    def statistics(self) -> RetryBudgetStatistics:
        self._forget_old()
        return RetryBudgetStatistics(len(self._requests), len(self._retries), self._refused)

    def _forget_old(self) -> None:
        horizon = trio.current_time() - self.window
        for times in (self._requests, self._retries):
            while times and times[0] <= horizon:
                times.popleft()
