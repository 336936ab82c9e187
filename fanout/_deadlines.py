"""Deadlines kept in one place, each acted on in trio's own pass over expired deadlines.

A call's deadline is not a cancel scope's deadline inside the call's task:
when it passes, the call must be *answered* first and cancelled second, so
that its answer never waits for a library to unwind. ``Deadlines`` holds
what to do at each deadline, earliest first (a heap); ``watch`` waits for
the next one and returns at the last deadline of all (the turn's).

The wait is a task parked under a cancel scope whose deadline is the next
one due. When it passes, trio cancels the scope between two batches of
tasks, and the parked task's abort callback does what is due right there:
before any task of the next batch runs. A woken task, by contrast, waits its
turn in that batch, behind every task woken with it: with ten thousand
connections in flight, the answers came a whole batch late (over a
second). A deadline added while the watcher waits moves the scope's
deadline earlier.

The actions due at one moment run with Python's cyclic garbage collector
paused (`fanout._collector`): writing ten thousand answers allocates enough
to start collections, and with ten thousand connections alive those took
0.4 s in the middle of the answers. The collection runs right after them
instead.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import attrs
import trio

from ._collector import collection_paused

__all__ = ["Deadlines"]


@attrs.define
class Deadlines:
    """What to do at which time; ``watch`` does each as its time comes."""

    _due: list[tuple[float, int, Callable[[], None]]] = attrs.field(factory=list, init=False)
    _order: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    # The watcher's wait, while it waits: its deadline is the next one due.
    _waiting: trio.CancelScope | None = attrs.field(default=None, init=False)
    # What an action raised inside trio's pass, to be raised in the watcher's task.
    _failure: BaseException | None = attrs.field(default=None, init=False)

    def add(self, when: float, expire: Callable[[], None]) -> None:
        """Call ``expire`` at ``when`` (deadlines that tie keep the order they were added)."""
        heapq.heappush(self._due, (when, next(self._order), expire))
        if self._waiting is not None and when < self._waiting.deadline:
            self._waiting.deadline = when

    async def watch(self, last: float) -> None:
        """Run each deadline's action as its time comes; return once ``last`` has passed."""
        while True:
            self._expire()  # what came due while this task waited for its turn to run
            if trio.current_time() >= last:
                return
            due = min(self._due[0][0], last) if self._due else last
            try:
                with trio.CancelScope(deadline=due) as self._waiting:
                    await trio.lowlevel.wait_task_rescheduled(self._abort)
            finally:
                self._waiting = None
                failure, self._failure = self._failure, None
                if failure is not None:
                    raise failure

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        """Trio is cancelling the wait (a deadline passed, or the watcher is stopped).

        Called by trio's scheduler, outside any task: an exception here would
        crash the run, so it is kept and raised in the watcher's task.
        """
        try:
            self._expire()
        except BaseException as exc:
            self._failure = exc
        return trio.lowlevel.Abort.SUCCEEDED

    def _expire(self) -> None:
        now = trio.current_time()
        if not self._due or self._due[0][0] > now:
            return
        with collection_paused():
            while self._due and self._due[0][0] <= now:
                _, _, expire = heapq.heappop(self._due)
                expire()
