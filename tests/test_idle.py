"""The idle watch, on a mock clock: progress pushes the idle end out, never past the deadline."""

from __future__ import annotations

import math
from typing import Any

import trio

from fanout._budget import Budget
from fanout._idle import IdleTimeoutError, IdleWatch


async def test_a_quiet_tool_is_stopped_one_idle_timeout_after_its_last_report(
    autojump_clock: Any,
) -> None:
    """The watch answers the call as it goes idle, and only then cancels the tool."""
    watch = IdleWatch(0.5, Budget(deadline=10.0))
    answered: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.watch, lambda: answered.append(trio.current_time()))
        with watch.scope:
            await trio.sleep(0.4)
            watch.touch()  # alive at 0.4: quiet may last until 0.9
            await trio.sleep(0.4)
            watch.touch()  # alive at 0.8: until 1.3
            try:
                await trio.sleep_forever()
            finally:
                assert answered == [1.3]  # answered before the tool unwinds
    assert watch.scope.cancelled_caught
    assert trio.current_time() == 1.3


async def test_the_watch_steps_aside_when_the_idle_end_reaches_the_deadline(
    autojump_clock: Any,
) -> None:
    """Quiet until 1.0 would end at the hard deadline (1.0): the call's own deadline ends
    it, so its answer names the deadline, not idleness."""
    watch = IdleWatch(0.5, Budget(deadline=1.0))
    assert watch.end == 0.5
    await trio.sleep(0.6)
    watch.touch()
    assert watch.end == math.inf


def test_the_idle_error_names_the_timeout() -> None:
    assert str(IdleTimeoutError(2.5)) == (
        "the tool reported no progress for 2.5s (its idle_timeout) and was stopped as idle"
    )
