"""What the counts read already say of a new one is never more than a bucket allows.

``StatedCounts`` (`fanout._stated_counts`) tells, from the counts a server's
answers stated, which requests sent after one were surely counted before it.
Taken for more than they were, a count would read as taking requests it did
not, and the scope would hand out their tokens twice. Generated buckets,
sends and arrivals (each request up to ``late`` behind its sending, so they
overtake each other) give the true order; the answer never exceeds it.
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fanout._outgoing import Outgoing
from fanout._stated_counts import StatedCounts
from tests.buckets import counts_on_arrival


@st.composite
def _overtaking_wave(draw: st.DrawFn) -> tuple[StatedCounts, float, float, float, float, int]:
    """A bucket's counts of requests that reached it out of order, some answered: the
    counts read, the rate, how late one may arrive, one request's sending and count,
    and how many sent after it the bucket really counted before it."""
    rate = draw(st.sampled_from([1.0, 5.0, 50.0]))
    burst = draw(st.integers(1, 20))
    late = draw(st.sampled_from([0.0, 0.005, 0.05]))
    sends = sorted(draw(st.lists(st.floats(0.0, 0.2), min_size=2, max_size=25)))
    arrivals = [s + draw(st.floats(0.0, 1.0)) * late for s in sends]
    counts = counts_on_arrival(arrivals, rate, float(burst), draw(st.floats(0.0, float(burst))))
    assume(counts)
    mine = draw(st.sampled_from(sorted(counts)))
    stated = StatedCounts(Outgoing())
    for k in draw(st.lists(st.sampled_from(sorted(counts)), unique=True)):
        stated.add(sends[k], counts[k], refused=False)
    before = sum(
        1 for k in counts if sends[k] > sends[mine] and (arrivals[k], k) < (arrivals[mine], mine)
    )
    return stated, rate, late, sends[mine], counts[mine], before


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(wave=_overtaking_wave())
def test_a_request_is_taken_as_counted_first_only_where_it_was(
    wave: tuple[StatedCounts, float, float, float, float, int],
) -> None:
    """However a bucket's requests reached it, the requests sent after one that its
    answers read already show as counted before it are no more than really were."""
    stated, rate, late, sent, remaining, before = wave
    assert stated.counted_before(sent, remaining, rate, late) <= before


def test_a_level_wave_no_refill_explains_shows_counting_as_answered() -> None:
    """Three requests 2 ms apart that each said 2 left, against 20/s with a burst of 8:
    no refill between them explains it, so the server counted as it answered; a burst
    of 3, full as each arrived (a fast refill states 2 to each), does not show it."""
    stated = StatedCounts(Outgoing())
    for sent in (0.000, 0.002):
        stated.add(sent, 2.0, refused=False)
    assert stated.level_wave(0.004, 2.0, 20.0, 8.0, within=0.05, late=0.0)
    assert not stated.level_wave(0.004, 2.0, 20.0, 3.0, within=0.05, late=0.0)
    assert not stated.level_wave(0.004, 1.0, 20.0, 8.0, within=0.05, late=0.0)
