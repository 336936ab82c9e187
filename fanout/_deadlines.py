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
instead. And from a little before each deadline until its answers are
written, the collector's full passes are held off: one that began just
before it held the answers until it ended.

What an action cancels (``cancel_soon``) is cancelled a few tasks a batch:
each cancelled task unwinds in the next batch, and no deadline is acted on
until that batch is over. A thousand calls hung on a server that never
answers, each with its own 2 s timeout and started one after another, came
due about a hundred at a time; cancelled together, their unwinding (a few
ms each, closing connections in pools of hundreds) made a batch of 0.3-0.5
s, through which the next hundred deadlines passed unanswered, and so on:
answers up to 0.33-0.59 s late. Eight a batch, 0.12-0.14 s. Fewer would
answer sooner still (two a batch, 40 ms), but the connections left open
meanwhile slow every call still to start, and the turn ended a second later.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
from collections.abc import Callable

import attrs
import trio

from ._collector import FULL_PASSES, LONGEST_HOLD, collection_paused

__all__ = ["Deadlines"]

_CANCELS_PER_BATCH = 8  # tasks set unwinding before the next batch (module docstring)
_NEXT_PASS = 1e-6  # seconds: a deadline that trio's next pass over deadlines finds passed


@attrs.define
class Deadlines:
    """What to do at which time; ``watch`` does each as its time comes."""

    _due: list[tuple[float, int, Callable[[], None]]] = attrs.field(factory=list, init=False)
    _order: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    # The watcher's wait, while it waits: its deadline is the next one due.
    _waiting: trio.CancelScope | None = attrs.field(default=None, init=False)
    # What an action raised inside trio's pass, to be raised in the watcher's task.
    _failure: BaseException | None = attrs.field(default=None, init=False)
    # Scopes an action asked to cancel, not yet cancelled (`cancel_soon`), and how many
    # more may be cancelled before the next batch.
    _cancelling: collections.deque[trio.CancelScope] = attrs.field(
        factory=collections.deque, init=False
    )
    _cancels_left: int = attrs.field(default=_CANCELS_PER_BATCH, init=False)
    # The collector's full passes: held off since then (None: free), and free until
    # then after a hold as long as one may be (`fanout._collector`).
    _held_since: float | None = attrs.field(default=None, init=False)
    _free_until: float = attrs.field(default=-math.inf, init=False)
    _last: float = attrs.field(default=math.inf, init=False)  # the watcher leaves then

    def add(self, when: float, expire: Callable[[], None]) -> None:
        """Call ``expire`` at ``when`` (deadlines that tie keep the order they were added)."""
        heapq.heappush(self._due, (when, next(self._order), expire))
        if self._waiting is not None:  # woken in time to hold the collector's passes off
            self._waiting.deadline = min(self._waiting.deadline, when - FULL_PASSES.lead())

    def cancel_soon(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` once the tasks cancelled before it are set unwinding, a few a
        batch (module docstring): at once, where fewer than that were this batch."""
        self._cancelling.append(scope)
        self._cancel_some()
        if self._cancelling and self._waiting is not None:  # the watcher goes on with them
            self._waiting.deadline = min(self._waiting.deadline, trio.current_time() + _NEXT_PASS)

    async def watch(self, last: float) -> None:
        """Run each deadline's action as its time comes; return once ``last`` has passed.

        Leaving, it cancels whatever is still to cancel, all at once."""
        FULL_PASSES.time_passes()
        self._last = last
        try:
            while True:
                self._cancels_left = _CANCELS_PER_BATCH  # a batch ran since this task last did
                self._expire()  # what came due while this task waited for its turn to run
                self._cancel_some()
                if trio.current_time() >= last:
                    return
                due = self._next_due()
                due = min(due, self._steer_collector(due))
                if self._cancelling:
                    # The next few after the batch now unwinding, woken in trio's pass
                    # before the next one, with what came due meanwhile. (Parked already
                    # due, it went straight back to the run queue, and what came due
                    # waited for its turn in the batch after: two batches late.)
                    due = min(due, trio.current_time() + _NEXT_PASS)
                try:
                    with trio.CancelScope(deadline=due) as self._waiting:
                        await trio.lowlevel.wait_task_rescheduled(self._abort)
                finally:
                    self._waiting = None
                    failure, self._failure = self._failure, None
                    if failure is not None:
                        raise failure
        finally:
            if self._held_since is not None:
                self._held_since = None
                FULL_PASSES.release()
            while self._cancelling:
                self._cancelling.popleft().cancel()

    def _steer_collector(self, due: float) -> float:
        """Hold the collector's full passes off while the next deadline, ``due``, is less
        than a pass away, and let them run once it is not, or once they were held as long
        as they may be (`fanout._collector`); when to steer them next."""
        now, hold_from = trio.current_time(), due - FULL_PASSES.lead()
        held = self._held_since
        if held is not None and (now < hold_from or now - held >= LONGEST_HOLD):
            self._held_since = None
            FULL_PASSES.release()
            if now - held >= LONGEST_HOLD:
                self._free_until = now + (now - held)
        elif held is None and now >= hold_from and now >= self._free_until:
            self._held_since = now
            FULL_PASSES.hold()
        if self._held_since is not None:
            return self._held_since + LONGEST_HOLD
        return max(hold_from, self._free_until)

    def _cancel_some(self) -> None:
        """Cancel the oldest waiting, as many as this batch has left (`cancel_soon`)."""
        while self._cancelling and self._cancels_left > 0:
            self._cancels_left -= 1
            self._cancelling.popleft().cancel()

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        """Trio is cancelling the wait (a deadline passed, or the watcher is stopped).

        Called by trio's scheduler, outside any task: an exception here would
        crash the run, so it is kept and raised in the watcher's task.
        """
        try:
            self._expire()
            # Steered here too, not only once the watcher's task runs: with ten thousand
            # steps of httpx in the batch before it, a hold began after the pass it was for.
            self._steer_collector(self._next_due())
        except BaseException as exc:
            self._failure = exc
        return trio.lowlevel.Abort.SUCCEEDED

    def _next_due(self) -> float:
        return min(self._due[0][0], self._last) if self._due else self._last

    def _expire(self) -> None:
        now = trio.current_time()
        if not self._due or self._due[0][0] > now:
            return
        with collection_paused():
            while self._due and self._due[0][0] <= now:
                _, _, expire = heapq.heappop(self._due)
                expire()
