"""The collector's full passes: held off by counted holders, and timed in trio's clock."""

from __future__ import annotations

import gc
from typing import Any

import trio

from fanout._collector import FullPasses


def test_full_passes_are_held_until_the_last_holder_releases() -> None:
    """Two holders: the full pass's threshold is out of reach until both have released,
    and then back to what it was; the young generations' thresholds are untouched."""
    passes = FullPasses()
    before = gc.get_threshold()
    try:
        passes.hold()
        passes.hold()
        held = gc.get_threshold()
        assert held[:2] == before[:2]
        assert held[2] > 1_000_000
        passes.release()
        assert gc.get_threshold() == held
        passes.release()
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)


def test_a_threshold_set_during_a_hold_stands() -> None:
    """Someone else setting the full pass's threshold while it was held keeps theirs."""
    passes = FullPasses()
    before = gc.get_threshold()
    try:
        passes.hold()
        gc.set_threshold(before[0], before[1], 25)
        passes.release()
        assert gc.get_threshold()[2] == 25
    finally:
        gc.set_threshold(*before)


async def test_the_lead_is_the_longest_recent_full_pass_and_a_half_in_bounds(
    autojump_clock: Any,
) -> None:
    """Timed in trio's clock: passes of 0.2 s and 0.1 s lead by 0.3 s; a pass of 5 s by
    the longest lead (1 s); before any, a quarter second; young passes are not timed."""
    passes = FullPasses()
    assert passes.lead() == 0.25
    for generation, took in ((2, 0.2), (2, 0.1), (1, 3.0)):
        passes._time_pass("start", {"generation": generation})
        await trio.sleep(took)
        passes._time_pass("stop", {"generation": generation})
    assert passes.lead() == 0.2 * 1.5
    passes._time_pass("start", {"generation": 2})
    await trio.sleep(5.0)
    passes._time_pass("stop", {"generation": 2})
    assert passes.lead() == 1.0


def test_a_pass_outside_a_trio_run_is_not_timed() -> None:
    """No trio clock, no timing: the lead stays the first guess."""
    passes = FullPasses()
    passes._time_pass("start", {"generation": 2})
    passes._time_pass("stop", {"generation": 2})
    assert passes.lead() == 0.25


def test_passes_are_timed_once_asked_and_by_one_hook() -> None:
    """Asked twice, one hook; the hook is gone again once removed (test hygiene)."""
    passes = FullPasses()
    passes.time_passes()
    passes.time_passes()
    try:
        assert sum(hook == passes._time_pass for hook in gc.callbacks) == 1
    finally:
        gc.callbacks.remove(passes._time_pass)
