"""Python's cyclic garbage collector, paused while fanout allocates only what it keeps.

The collector starts a pass every 700 new container objects, and a pass
over every object alive after enough of those. At three moments fanout
allocates in bursts of its own, with no awaits and nothing that becomes
garbage: building a turn's calls, checking them and starting their tasks,
and writing the answers of the calls a deadline ends. A pass in the middle
of such a burst finds nothing to free, and over a ten-thousand-call turn
the full passes alone cost more than the rest of the bookkeeping. The
collector is paused for the burst and collects right after it, from the
next allocation on.
"""

from __future__ import annotations

import contextlib
import gc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["collection_paused"]


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """The cyclic collector off for the block, and back as it was (on, unless someone else
    turned it off). The block must not await: other tasks would run uncollected."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
