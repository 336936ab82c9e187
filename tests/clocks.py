"""A mock clock that moves as real time does: later at every reading.

On ``trio.testing.MockClock`` two readings with no sleep between them are
equal. Code that keeps one reading and later looks it up by another, taken a
few lines on, passes there and fails in real time, where the second is later:
a refused request's departure, looked up by the time its answer said it was
sent, stayed counted, and learning "proved" 52/s against 50/s. A ticking
clock is still virtual and exact (autojump, replayable), and each reading
is ``tick`` later than the one before, as a busy process's would be.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import trio
import trio.testing

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["replayable_run", "ticking_clock"]

T = TypeVar("T")


def ticking_clock(tick: float = 5e-6) -> trio.testing.MockClock:
    """A ``MockClock(autojump_threshold=0)`` whose every reading is ``tick`` later.

    trio's clock classes are final, so the reading is replaced on the instance.
    """
    clock = trio.testing.MockClock(autojump_threshold=0)
    read = clock.current_time
    readings = 0

    def current_time() -> float:
        nonlocal readings
        readings += 1
        return read() + readings * tick

    clock.current_time = current_time  # type: ignore[method-assign]
    return clock


def replayable_run(
    main: Callable[..., Awaitable[T]], *args: object, seed: int, clock: trio.abc.Clock | None = None
) -> T:
    """``trio.run(main, *args)`` on ``clock`` (a MockClock, autojumping, by default).

    trio's scheduler shuffles wake-ups at random, so it is seeded (privately:
    trio has no public switch) for a counterexample to replay; the stream it
    had is restored, so other tests keep theirs.
    """
    scheduler = trio._core._run._r
    state = scheduler.getstate()
    scheduler.seed(seed)
    try:
        clock = clock if clock is not None else trio.testing.MockClock(autojump_threshold=0)
        return trio.run(main, *args, clock=clock)
    finally:
        scheduler.setstate(state)
