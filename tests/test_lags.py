"""The lags a scope measures, and the margin they make (`fanout._lags`).

End-to-end, the slack is pinned against servers in ``tests/test_pacing.py``
and ``tests/test_send_lag.py``; these pin how each lag is taken in and which
of them a scope keeps by what it sees of its requests (``Sight``).
"""

from __future__ import annotations

from fanout._lags import Lags, Sight
from fanout._ledger import Ledger

_BLIND = Sight(wire=False, bucket_departures=False, window_departures=False, windowed=False,
               answers_hold_their_own=False)  # fmt: skip
_ON_THE_WIRE = Sight(wire=True, bucket_departures=True, window_departures=False,
                     windowed=False, answers_hold_their_own=False)  # fmt: skip


def test_a_set_up_every_call_takes_alike_is_no_lag_where_departures_are_seen() -> None:
    """Seen leaving, calls that all took 0.1 s to send lag by how much they differ; unseen,
    by the whole 0.1 s (the server is taken to be as slow to read them)."""
    seen, unseen = Lags(), Lags()
    for seconds in (0.1, 0.1, 0.102):
        seen.sent(seconds, 0.0, departures_seen=True)
        unseen.sent(seconds, 0.0, departures_seen=False)
    assert round(seen.margin(_BLIND, Ledger()), 9) == 0.002
    assert unseen.margin(_BLIND, Ledger()) == 0.102
    assert not seen.sent(0.101, 0.0, departures_seen=True)  # within the spread: no change


def test_a_late_wake_adds_to_the_send_lag() -> None:
    """A call woken 2 ms late sends 2 ms late on top of its own way out."""
    lags = Lags()
    assert lags.sent(0.003, 0.0, departures_seen=False)
    assert lags.woke(0.002)
    assert not lags.woke(0.001)
    assert round(lags.margin(_BLIND, Ledger()), 9) == 0.005


def test_the_way_out_spread_is_kept_only_where_nothing_counts_requests_leaving() -> None:
    """Writes that took 1 to 9 ms are an 8 ms margin for a scope that cannot see its
    requests reach the wire, and none for one that counts them there."""
    lags = Lags()
    assert lags.wrote(0.001)
    assert lags.wrote(0.009)
    assert not lags.wrote(0.005)
    assert round(lags.way_out_spread(counted=False), 9) == 0.008
    assert lags.way_out_spread(counted=True) == 0.0
    assert lags.margin(_ON_THE_WIRE, Ledger()) == 0.0


def test_a_late_arrival_is_kept_until_a_warm_call_shows_the_wire_owes_it() -> None:
    """A burst read 40 ms late is the margin; a told bucket counted on the wire keeps
    none of it once a warm call is in (the wire owes it), and one that sees its requests
    leave keeps only what is beyond how much the warm calls vary."""
    lags = Lags()
    assert lags.arrived_late(0.04)
    assert not lags.arrived_late(0.03)
    assert lags.margin(_ON_THE_WIRE, Ledger()) == 0.04
    lags.warm_call(0.05)
    lags.warm_call(0.06)
    assert lags.margin(_ON_THE_WIRE, Ledger()) == 0.0
    sees_leaving = Sight(wire=False, bucket_departures=True, window_departures=False,
                         windowed=False, answers_hold_their_own=False)  # fmt: skip
    assert round(lags.margin(sees_leaving, Ledger()), 9) == 0.03


def test_a_worst_case_a_429_made_true_is_measured_by_the_first_warm_call() -> None:
    """A 429 made a burst's whole 0.15 s first answer its late arrival; a warm call of
    0.1 s shows the server takes that long itself: 0.05 s late."""
    lags = Lags()
    assert lags.assume((1.0, 1.15))
    assert round(lags.arrival, 9) == 0.15
    assert lags.measure_assumed(0.1)
    assert round(lags.arrival, 9) == 0.05
    assert not lags.measure_assumed(0.1)  # measured once


def test_a_told_window_not_seen_leaving_keeps_how_round_trips_vary_not_durations() -> None:
    """A shared told window: its calls' durations hold its own Redis trips (0.05 to 0.23 s)
    where the server's round trips varied by 10 ms; the trips are its margin, with its
    whole send lag (kept as durations, every window of 10 a second began 0.18 s late).
    A window it learned keeps the durations: how its requests went is a guess too."""
    ledger = Ledger()
    for duration, trip in ((0.05, 0.040), (0.23, 0.045), (0.12, 0.050)):
        ledger.observe_latency(duration)
        ledger.observe_wire_trip(trip)
    lags = Lags()
    lags.sent(0.003, 0.0, departures_seen=False)
    told = Sight(wire=False, bucket_departures=False, window_departures=False, windowed=True,
                 answers_hold_their_own=False, told_window=True)  # fmt: skip
    learned = Sight(wire=False, bucket_departures=False, window_departures=False, windowed=True,
                    answers_hold_their_own=False)  # fmt: skip
    assert round(lags.margin(told, ledger), 9) == 0.01
    assert round(lags.margin(learned, ledger), 9) == 0.18
