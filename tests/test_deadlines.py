"""The deadline watcher: each action at its time, in order, and a late addition wakes it."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import trio

from fanout._deadlines import Deadlines


async def test_each_action_runs_at_its_time_and_watch_returns_at_the_last(
    autojump_clock: Any,
) -> None:
    """Actions run at their exact times, ties in the order added; watch ends at ``last``."""
    deadlines = Deadlines()
    ran: list[tuple[str, float]] = []
    for name, when in (("b", 2.0), ("a", 1.0), ("c", 2.0), ("late", 9.0)):
        deadlines.add(when, lambda name=name: ran.append((name, trio.current_time())))
    await deadlines.watch(5.0)
    assert ran == [("a", 1.0), ("b", 2.0), ("c", 2.0)]
    assert trio.current_time() == 5.0


async def test_a_deadline_added_while_watching_wakes_the_watcher(autojump_clock: Any) -> None:
    """An earlier deadline added mid-sleep is acted on at its time, not at the later one."""
    deadlines = Deadlines()
    ran: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deadlines.watch, 10.0)
        await trio.sleep(1)
        deadlines.add(3.0, lambda: ran.append(trio.current_time()))
    assert ran == [3.0]
    assert trio.current_time() == 10.0


async def test_an_action_runs_before_any_task_its_deadline_wakes(autojump_clock: Any) -> None:
    """Due actions run in trio's pass over deadlines, before every task that pass wakes.

    Trio runs a batch of woken tasks forwards or backwards at random, so a
    watcher woken like any task would come after some sleepers in about
    half the rounds.
    """

    async def sleeper(due: float, acted: list[float], seen: list[bool]) -> None:
        await trio.sleep_until(due)
        seen.append(bool(acted))

    for round_ in range(10):
        deadlines = Deadlines()
        acted: list[float] = []
        seen: list[bool] = []
        due = trio.current_time() + 3.0
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(sleeper, due, acted, seen)
            deadlines.add(due, lambda acted=acted: acted.append(trio.current_time()))
            nursery.start_soon(deadlines.watch, due + 1.0)
        assert acted == [due], round_
        assert seen == [True] * 5, round_


async def test_an_action_that_raises_fails_the_watcher_not_trio(autojump_clock: Any) -> None:
    """An action raising inside trio's pass is raised in the watcher's task, at its time."""
    deadlines = Deadlines()

    def broken() -> None:
        raise ValueError("broken action")

    deadlines.add(2.0, broken)
    with pytest.raises(ValueError, match="broken action"):
        await deadlines.watch(5.0)
    assert trio.current_time() == 2.0


async def test_actions_run_with_the_collector_paused_then_left_as_it_was(
    autojump_clock: Any,
) -> None:
    """Due actions run with the cyclic collector off; after them it is on again, unless it
    was off before."""
    seen: list[bool] = []
    for collecting in (True, False):
        (gc.enable if collecting else gc.disable)()
        try:
            deadlines = Deadlines()
            deadlines.add(trio.current_time() + 1, lambda: seen.append(gc.isenabled()))
            await deadlines.watch(trio.current_time() + 2)
            assert gc.isenabled() is collecting
        finally:
            gc.enable()
    assert seen == [False, False]
