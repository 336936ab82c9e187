"""A scope's in-process ledger: latency as a moving average, the queue's drain, a spent quota."""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

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


_trips = st.lists(st.floats(0.001, 0.5), min_size=1, max_size=32)
# Trips over new connections read alike: all within 5 ms.
_alike = st.builds(
    lambda base, offsets: [base + offset for offset in offsets],
    st.floats(0.001, 0.5),
    st.lists(st.floats(0.0, 0.0049), min_size=1, max_size=16),
)


@pytest.mark.parametrize("opened", [False, True])
def test_one_round_trip_varies_by_nothing(opened: bool) -> None:
    """A lone trip, over either kind of connection, is no spread; none at all is unknown."""
    ledger = Ledger()
    assert ledger.wire_trip_spread(new_up_to=0.005) is None
    ledger.observe_wire_trip(0.1, opened=opened)
    assert ledger.wire_trip_spread(new_up_to=0.005) == 0.0


@given(warm=_trips, cold=_alike, more=_alike, late=st.floats(0.0, 1.0))
def test_the_trips_margin_never_takes_in_a_new_connections_late_read(
    warm: list[float], cold: list[float], more: list[float], late: float
) -> None:
    """However late a server reads new connections (each such request holds its own token
    for that), the margin is the same: how much the round trips over open connections
    vary, or those over new ones among themselves, if more, up to 5 ms. And where some
    requests over new connections were read late and others not (held after their
    connections opened), each kind's trips count among themselves."""

    def spread(cold_trips: list[float]) -> float | None:
        ledger = Ledger()
        for seconds in warm:
            ledger.observe_wire_trip(seconds)
        for seconds in cold_trips:
            ledger.observe_wire_trip(seconds, opened=True)
        return ledger.wire_trip_spread(new_up_to=0.005)

    def among(trips: list[float]) -> float:
        return max(trips) - min(trips)

    warm_range = among(warm)
    margin = spread(cold)
    assert margin == pytest.approx(max(warm_range, among(cold)))
    assert spread([seconds + late for seconds in cold]) == pytest.approx(margin)
    read_late = [max(cold) + 0.0051 + seconds - min(more) for seconds in more]
    both_kinds = spread([*cold, *read_late])
    assert both_kinds == pytest.approx(max(warm_range, among(cold), among(more)))
