"""Python's cyclic garbage collector: paused while fanout allocates only what it keeps, and
its full passes held off while a deadline is near.

The collector starts a pass every 700 new container objects, and a pass
over every object alive after enough of those. At three moments fanout
allocates in bursts of its own, with no awaits and nothing that becomes
garbage: building a turn's calls, checking them and starting their tasks,
and writing the answers of the calls a deadline ends. A pass in the middle
of such a burst finds nothing to free, and over a ten-thousand-call turn
the full passes alone cost more than the rest of the bookkeeping. The
collector is paused for the burst and collects right after it, from the
next allocation on.

A full pass over every object alive cannot be interrupted: with a
thousand connections open it takes 0.1-0.7 s, and one that starts just
before a deadline holds that deadline's answers until it ends (a thousand
hung calls answered 0.19-0.33 s late, on a loaded machine). So the
deadline watcher (`fanout._deadlines`) holds full passes off from a little
before a deadline (as long as the longest recent full pass, and a half
more) until its answers are written; the young generations are still
collected meanwhile, and the pass that was held runs right after. A hold
lasts at most ``_LONGEST_HOLD``, and after one that long the passes are
free for as long again, so that a stream of deadlines never stops them.
"""

from __future__ import annotations

import collections
import contextlib
import gc
from typing import TYPE_CHECKING, Any

import attrs
import trio

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["FULL_PASSES", "LONGEST_HOLD", "collection_paused"]

LONGEST_HOLD = 2.0  # seconds: full passes held off at most this long at a time (docstring)
_NEVER = 1 << 30  # a threshold for full passes that no count reaches
_PASSES_KEPT = 8  # the recent full passes the lead is taken from
_LEAD_MARGIN = 1.5  # the lead is the longest of them, and a half more
_SHORTEST_LEAD = 0.1  # seconds
_LONGEST_LEAD = 1.0  # seconds
_FIRST_LEAD = 0.25  # seconds: before any full pass was timed


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


@attrs.define
class FullPasses:
    """The collector's full passes: how long they take, and held off while any holder asks.

    Holders count: the passes are held from the first hold to the last
    release, by raising the full pass's threshold out of reach. Released,
    the threshold goes back to what it was, unless someone set another
    meanwhile (theirs stands).
    """

    _holders: int = attrs.field(default=0, init=False)
    _threshold: int = attrs.field(default=0, init=False)  # the full pass's, before the hold
    _took: collections.deque[float] = attrs.field(
        factory=lambda: collections.deque(maxlen=_PASSES_KEPT), init=False
    )
    _started: float | None = attrs.field(default=None, init=False)
    _timing: bool = attrs.field(default=False, init=False)

    def time_passes(self) -> None:
        """Time the full passes from now on (`gc.callbacks`); once is enough."""
        if not self._timing:
            self._timing = True
            gc.callbacks.append(self._time_pass)

    def lead(self) -> float:
        """How long before a deadline to hold the passes off: the longest recent one, and a
        half more, in bounds."""
        if not self._took:
            return _FIRST_LEAD
        return min(_LONGEST_LEAD, max(_SHORTEST_LEAD, _LEAD_MARGIN * max(self._took)))

    def hold(self) -> None:
        """Hold full passes off until the matching `release`."""
        if self._holders == 0:
            young, middle, self._threshold = gc.get_threshold()
            gc.set_threshold(young, middle, _NEVER)
        self._holders += 1

    def release(self) -> None:
        """End one `hold`; the last one lets the held pass run."""
        self._holders -= 1
        if self._holders == 0:
            young, middle, full = gc.get_threshold()
            if full == _NEVER:
                gc.set_threshold(young, middle, self._threshold)

    def _time_pass(self, phase: str, info: dict[str, Any]) -> None:
        """A `gc.callbacks` hook: time each full pass that runs inside a trio run, in its
        clock (a pass outside one is not timed)."""
        if info.get("generation") != 2:
            return
        try:
            now = trio.current_time()
        except RuntimeError:
            self._started = None
            return
        if phase == "start":
            self._started = now
        elif self._started is not None:
            self._took.append(max(0.0, now - self._started))
            self._started = None


FULL_PASSES = FullPasses()
