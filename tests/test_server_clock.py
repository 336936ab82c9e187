"""Reading a server's clock from its Date headers more finely than their whole seconds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fanout._server_clock import STALE, ServerClock

D = 1_700_000_000.0  # a whole second on the server's clock


def test_without_a_date_there_is_no_reading() -> None:
    """No Date header, no reading: the caller falls back to its own clock."""
    assert ServerClock().read(None, now=1.0, sent=1.0, wall=D) is None


def test_a_second_ticking_over_between_responses_pins_the_clock() -> None:
    """Date D answered at t=0.5, D+1 at t=0.6: the tick was in between, so at t=1 it is D+1.4."""
    clock = ServerClock()
    far = D + 100.0  # our own clock is useless here
    clock.read(D, now=0.5, sent=0.45, wall=far)
    assert clock.read(D + 1, now=0.6, sent=0.55, wall=far) == pytest.approx(D + 1.0)
    # At t=1.0 the server read at least D+1 + 0.4: the earliest it can be.
    assert clock.read(D + 1, now=1.0, sent=0.95, wall=far) == pytest.approx(D + 1.4)


def test_our_clock_is_believed_within_what_the_dates_allow() -> None:
    """A synchronised wall clock places the server's time inside its Date's second exactly."""
    clock = ServerClock()
    assert clock.read(D, now=0.5, sent=0.45, wall=D + 0.7) == pytest.approx(D + 0.7)


@given(skew=st.floats(-5.0, 5.0), fraction=st.floats(0.0, 0.999))
def test_a_skewed_clock_never_stretches_a_wait_nor_shrinks_it_past_the_date(
    skew: float, fraction: float
) -> None:
    """Whatever our clock says, the reading stays inside the second the Date names, or
    the one after it (a server may send a Date for a second after writing it)."""
    clock = ServerClock()
    reading = clock.read(D, now=3.0, sent=3.0, wall=D + fraction + skew)
    assert reading is not None
    assert D <= reading < D + 1.0 + STALE


@given(
    written=st.lists(st.floats(0.0, 60.0), min_size=1, max_size=20),
    lag=st.floats(0.0, 0.999),
    fraction=st.floats(0.0, 0.999),
)
def test_a_date_written_once_a_second_leaves_a_synchronised_clock_believed(
    written: list[float], lag: float, fraction: float
) -> None:
    """uvicorn (FastAPI, Starlette) writes its Date once a second and sends it until the
    next: each answer's Date is the floor of a time up to a second before it. Our clock,
    synchronised with the server's, is read exactly at every answer, in any order of
    lags. Bounded as a fresh Date, it was disbelieved: 84 % of uvicorn's answers were
    over a second behind, and each HTTP-date wait ran about a second long."""
    clock = ServerClock()
    for t in sorted(written):
        server_now = D + t + fraction
        date = float(int(server_now - lag))  # written up to a second ago, floored
        reading = clock.read(date, now=t, sent=t - 0.001, wall=server_now)
        assert reading == pytest.approx(server_now)


def test_a_server_clock_set_back_is_believed_at_once() -> None:
    """A Date earlier than the bounds allow starts the bounds again (never an early reading)."""
    clock = ServerClock()
    clock.read(D, now=0.5, sent=0.45, wall=D + 50)
    clock.read(D + 1, now=0.6, sent=0.55, wall=D + 50)
    assert clock.read(D - 60, now=0.7, sent=0.65, wall=D + 50) == pytest.approx(D - 60)
