"""A token bucket that counts each request as it arrives, for tests that generate them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


class ServerBucket:
    """A server's bucket of ``burst`` at ``rate``/s, holding ``tokens`` at 0, counting each
    request as it arrives (arrivals in order); ``tolerance``: float noise forgiven."""

    def __init__(
        self, rate: float, burst: float, *, tokens: float | None = None, tolerance: float = 0.0
    ) -> None:
        self.rate, self.burst, self.tolerance = rate, burst, tolerance
        self.tokens, self.at = (burst if tokens is None else tokens), 0.0

    def admits(self, arrival: float) -> bool:
        """Whether a request arriving at ``arrival`` finds a token (and takes it)."""
        self.tokens = min(self.burst, self.tokens + (arrival - self.at) * self.rate)
        self.at = arrival
        if self.tokens < 1.0 - self.tolerance:
            return False
        self.tokens -= 1.0
        return True


def counts_on_arrival(
    arrivals: Sequence[float], rate: float, burst: float, tokens: float
) -> dict[int, float]:
    """What a bucket of ``burst`` at ``rate``/s, holding ``tokens`` at 0, states to each
    request it admits (its floored count left), by index, the requests taken in the
    order they arrive (ties by index); a refused one is left out."""
    bucket = ServerBucket(rate, burst, tokens=tokens)
    counts: dict[int, float] = {}
    for k in sorted(range(len(arrivals)), key=lambda k: (arrivals[k], k)):
        if bucket.admits(arrivals[k]):
            counts[k] = float(math.floor(bucket.tokens))
    return counts
