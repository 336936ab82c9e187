"""Deadlines kept in one place, and one task that acts on each as it passes.

A call's deadline is not a cancel scope's deadline inside the call's task:
when it passes, the call must be *answered* first and cancelled second, so
that its answer never waits for a library to unwind. ``Deadlines`` holds
what to do at each deadline, earliest first (a heap); ``watch`` sleeps until
the next one, does it, and returns at the last deadline of all (the turn's).
A deadline added while it sleeps for a later one wakes it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import attrs
import trio

__all__ = ["Deadlines"]


@attrs.define
class Deadlines:
    """What to do at which time; ``watch`` does each as its time comes."""

    _due: list[tuple[float, int, Callable[[], None]]] = attrs.field(factory=list, init=False)
    _order: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    _added: trio.Event = attrs.field(factory=trio.Event, init=False)

    def add(self, when: float, expire: Callable[[], None]) -> None:
        """Call ``expire`` at ``when`` (deadlines that tie keep the order they were added)."""
        heapq.heappush(self._due, (when, next(self._order), expire))
        self._added.set()

    async def watch(self, last: float) -> None:
        """Run each deadline's action as its time comes; return once ``last`` has passed."""
        while True:
            due = min(self._due[0][0], last) if self._due else last
            with trio.move_on_at(due):
                await self._added.wait()
                self._added = trio.Event()
                continue
            now = trio.current_time()
            while self._due and self._due[0][0] <= now:
                _, _, expire = heapq.heappop(self._due)
                expire()
            if now >= last:
                return
