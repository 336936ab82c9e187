"""A token bucket that counts each request as it arrives, for tests that generate them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


def counts_on_arrival(
    arrivals: Sequence[float], rate: float, burst: float, tokens: float
) -> dict[int, float]:
    """What a bucket of ``burst`` at ``rate``/s, holding ``tokens`` at 0, states to each
    request it admits (its floored count left), by index, the requests taken in the
    order they arrive (ties by index); a refused one is left out."""
    counts: dict[int, float] = {}
    at = 0.0
    for k in sorted(range(len(arrivals)), key=lambda k: (arrivals[k], k)):
        tokens, at = min(burst, tokens + (arrivals[k] - at) * rate), arrivals[k]
        if tokens >= 1.0:
            tokens -= 1.0
            counts[k] = float(math.floor(tokens))
    return counts
