"""Where a told window's boundaries fall: never sooner than the server's own."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from fanout._window_phase import WindowPhase

_UNIT = st.floats(0.0, 1.0, exclude_max=True)


@given(
    window=st.floats(0.1, 60.0), boundary=st.floats(-100.0, 100.0), counted_at=_UNIT,
    lead_at=_UNIT, arrived_at=st.floats(0.0, 10.0), share=st.floats(0.05, 1.0),
)  # fmt: skip
def test_a_request_s_window_never_ends_sooner_than_the_server_s(
    window: float, boundary: float, counted_at: float, lead_at: float, arrived_at: float,
    share: float,
) -> None:  # fmt: skip
    """A fixed window's boundaries at ``boundary + k * window``: a request counted before one
    of them (forgotten) and one after it (the lead) place it; any request arriving later
    has its window end no sooner than the server's does, nor sooner than the refill
    shown after its arrival."""
    last_forgotten = boundary - counted_at * window  # in the window before the boundary
    lead = boundary + lead_at * window  # in the window the boundary opened
    phase = WindowPhase.shown(
        counted=[last_forgotten - window / 2, last_forgotten], arrived=lead, window=window,
        share=share,
    )  # fmt: skip
    if phase is None:
        assert lead - last_forgotten >= window
        return
    arrived = lead + arrived_at * window
    true_end = boundary + (math.floor((arrived - boundary) / window) + 1) * window
    end = phase.end_of(arrived)
    assert end >= true_end - 1e-9 * max(1.0, abs(true_end))
    assert end >= arrived + phase.refill


def test_a_reopening_shown_to_the_second_places_nothing() -> None:
    """Forgotten and the lead a whole window apart or more: no boundary is placed."""
    assert WindowPhase.shown(counted=[0.0], arrived=2.0, window=2.0, share=1.0) is None
    assert WindowPhase.shown(counted=[], arrived=1.0, window=2.0, share=1.0) is None


def test_the_refill_shown_is_a_whole_window_s() -> None:
    """Nineteen of twenty forgotten 1.06 s after the first: a window's worth in 1.12 s."""
    phase = WindowPhase.shown(counted=[0.0, 0.02], arrived=1.06, window=2.0, share=19 / 20)
    assert phase == WindowPhase(0.02, 1.06, 1.06 * 20 / 19, 2.0)
    assert phase.end_of(1.1) == 1.06 + 2.0
    assert phase.end_of(3.07) == 1.06 + 4.0
