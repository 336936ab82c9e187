"""A scope's in-process ledger: latency as a moving average, the queue's drain, a spent quota."""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio

from fanout._ledger import Ledger


def test_latency_is_a_moving_average_and_nonsense_is_ignored() -> None:
    """The first duration is the latency; each next one moves it a fifth of the way; a
    negative, NaN or infinite duration changes nothing."""
    ledger = Ledger()
    for nonsense in (-1.0, math.nan, math.inf):
        ledger.observe_latency(nonsense)
    assert (ledger.latency, ledger.slowest()) == (None, 0.0)
    ledger.observe_latency(1.0)
    assert (ledger.latency, ledger.slowest()) == (1.0, 1.0)
    ledger.observe_latency(2.0)
    assert (ledger.latency, ledger.slowest()) == (1.2, 2.0)


@pytest.mark.parametrize(
    ("latency", "guess", "expected"), [(None, True, 2.0), (None, False, 0.0), (0.5, False, 1.0)]
)
def test_the_slot_wait_is_whole_rounds_of_the_calls_ahead(
    latency: float | None, guess: bool, expected: float
) -> None:
    """Four calls ahead of a new one (2 in flight, 2 waiting without tokens) on 2 slots: it
    starts after two rounds of the latency (a second each, when guessing before any finished)."""
    ledger = Ledger(waiting=3, booked=1, in_flight=2)
    if latency is not None:
        ledger.observe_latency(latency)
    assert ledger.slots_estimate(2, guess=guess) == expected
    assert ledger.slots_estimate(None, guess=guess) == 0.0  # no cap: no slot wait


async def test_a_spent_quota_returns_at_the_later_of_two_ends(autojump_clock: Any) -> None:
    """Two claims of exhaustion: the later end wins, and the scope is usable from it on."""
    ledger = Ledger()
    assert ledger.exhausted_until() is None
    ledger.exhaust(5.0)
    ledger.exhaust(3.0)
    assert ledger.exhausted_until() == 5.0
    await trio.sleep(4.999)
    assert ledger.exhausted_until() == 5.0
    await trio.sleep(0.001)
    assert ledger.exhausted_until() is None
