"""A told bucket's counts as requests leave, against a server's bucket.

``DepartureGate`` and ``WireCount`` count a told token bucket as this
process's requests reach the HTTP layer and the wire (`fanout._told_counts`).
Each is checked against a server's bucket (burst ``B``, refilled at ``R``/s,
counting each request as it arrives): requests at generated times wait as
the count says, reach the server a generated time later (less than a
token's time: later still, the next request overtakes it), the count is told
how late, and the server never finds less than a token.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fanout._told_counts import DepartureGate, WireCount
from tests.buckets import ServerBucket

_LIMITS = st.tuples(st.sampled_from([2.0, 10.0, 50.0]), st.sampled_from([1.0, 2.0, 5.0]))
# (how long after the one before a request would leave, the share of a token's time it
# is read late)
_REQUESTS = st.lists(
    st.tuples(st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.3, 1.0]), st.floats(0.0, 0.99)),
    min_size=1,
    max_size=30,
)


@given(_LIMITS, _REQUESTS)
@settings(max_examples=300, deadline=None)
@example((10.0, 1.0), [(0.0, 0.0), (0.0, 0.5), (0.0, 0.0)])
def test_requests_paced_on_the_wire_count_are_never_refused(
    limits: tuple[float, float], requests: list[tuple[float, float]]
) -> None:
    """Each request waits for its token on the wire, asking again after each wait (as
    `fanout._http_core` does), is read a share of a token late (in the order sent), and
    the count is told: the server always has a token for it."""
    rate, burst = limits
    wire, server = WireCount(), ServerBucket(rate, burst, tolerance=1e-9)
    now = arrived = 0.0
    for gap, share in requests:
        now += gap
        while (wait := wire.short_by(now, rate, burst)) > 0.0:  # asked again after each wait
            now += wait
        found = wire.take(now, rate, burst, burst_began=None)
        arrival = max(now + share / rate, arrived)  # read in the order sent
        wire.written(found, arrival - now, rate, burst)
        assert server.admits(arrival), (now, arrival, found)
        arrived = arrival


@given(_LIMITS, _REQUESTS, st.floats(0.0, 0.01))
@settings(max_examples=300, deadline=None)
@example((10.0, 1.0), [(0.0, 0.0), (0.0, 0.5), (0.0, 0.0)], 0.0)
def test_requests_paced_at_the_gate_are_never_refused(
    limits: tuple[float, float], requests: list[tuple[float, float]], margin: float
) -> None:
    """Each request waits at the gate (and ``margin`` more if it waits), leaves a share of
    a token later (in the order sent), and the gate is told: the server always has a
    token for it."""
    rate, burst = limits
    gate, server = DepartureGate(), ServerBucket(rate, burst, tolerance=1e-9)
    now = arrived = 0.0
    for admitted, (gap, share) in enumerate(requests):
        now += gap
        wait = gate.take(float(admitted), now, rate, burst, margin)
        now += wait
        leaves = max(now + share / rate, arrived)
        gate.left_late(float(admitted), leaves, rate, burst)
        assert server.admits(leaves), (now, leaves)
        arrived = leaves


def test_a_token_given_back_at_the_gate_is_the_next_requests() -> None:
    """A request refused while it waited gives its token back: the next one waits what
    the first would have, not a token more."""
    gate = DepartureGate()
    assert gate.take(0.0, 0.0, 10.0, 1.0, 0.0) == 0.0
    assert gate.take(0.0, 0.0, 10.0, 1.0, 0.0) == 0.1
    gate.give_back()
    assert gate.take(0.0, 0.0, 10.0, 1.0, 0.0) == 0.1


def test_a_late_burst_moves_the_wire_counts_refill_on() -> None:
    """A burst read 30 ms after it left the wire (a bucket of one at 10/s): the next
    request's token is 30 ms and the few ms of unevenness later, not at 0.1 s."""
    wire = WireCount()
    wire.new_burst()
    found = wire.take(0.0, 10.0, 1.0, burst_began=0.0)
    wire.written(found, 0.0, 10.0, 1.0)
    wire.owe_late_arrival(0.03, now=0.05, rate=10.0, burst=1.0, spread=0.0)
    assert wire.read_late == 0.03
    assert round(wire.short_by(0.05, 10.0, 1.0), 9) == round(0.1 + 0.03 + 0.005 - 0.05, 9)
