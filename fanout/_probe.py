"""The probe: while a scope knows nothing of its limits, a few calls go first.

A scope that was told no rate sends its first two calls and learns from their
answers (the server's stated limits, or at least its latency) before the rest
go. Two, not one: the server's bucket is full while the probe is answered, and
what it refills meanwhile is lost; a lone probe lost a token a latency, and
with it one call of 23 that could finish under 2 s deadlines. The second may
draw a refusal from a server whose burst or in-flight cap is one. A scope
told its concurrency may send more at once (``width``): the user said that
many may be in flight, and the first answer still comes within one latency,
while a narrower probe costs a whole latency of idle slots. The
calls that queued behind the probe then pass one at a time, in the order
they arrived: each hands the gate on once it has reserved its tokens, so
which of them gets the first learned token never depends on the order in
which trio happens to wake tasks.
"""

from __future__ import annotations

import collections

import attrs
import trio

__all__ = ["Probe"]


@attrs.define
class Probe:
    """A first-in, first-out gate that opens for good once the probe call finishes."""

    done: bool = False
    width: int = 1  # calls that may probe at once
    _holders: list[object] = attrs.field(factory=list, init=False)
    _queue: collections.deque[trio.Event] = attrs.field(factory=collections.deque, init=False)
    _passing: trio.lowlevel.Task | None = attrs.field(default=None, init=False)

    def is_open(self) -> bool:
        """Whether a call arriving now would pass without waiting."""
        if self._queue or self._passing is not None:
            return False
        return self.done or len(self._holders) < self.width

    async def wait_turn(self, holder: object, deadline: float) -> bool:
        """Pass the gate (as the probe, or in turn), or return False at ``deadline``."""
        if self.is_open():
            if not self.done:
                self._holders.append(holder)
            return True
        turn = trio.Event()
        self._queue.append(turn)
        got = False
        try:
            with trio.move_on_at(deadline):
                await turn.wait()
                got = True
        finally:
            if not turn.is_set():
                self._queue.remove(turn)
            elif not got:
                self._hand_on()  # woken, then cancelled before taking its turn
        if not got:
            return False
        if self.done:
            self._passing = trio.lowlevel.current_task()
        else:
            self._holders.append(holder)  # an earlier probe gave up: this call probes now
        return True

    def step_done(self) -> None:
        """The call that passed last has reserved (or given up): let the next one through."""
        if self._passing is trio.lowlevel.current_task():
            self._hand_on()

    def finished(self) -> None:
        """The probe call finished: the gate opens for good, queued calls first."""
        if not self.done:
            self.done = True
            self._holders.clear()
            self._hand_on()

    def abandoned(self, holder: object) -> None:
        """The probe gave up before finishing (denied, cancelled): the next call probes."""
        if not self.done and any(held is holder for held in self._holders):
            self._holders = [held for held in self._holders if held is not holder]
            self._hand_on()

    def _hand_on(self) -> None:
        self._passing = None
        if self._queue:
            self._queue.popleft().set()
