"""``Starts`` answers every query as a scan of the bookings in any order would.

The scope reads each answer against what started when (`fanout._front`);
these sums used to be scans of every booking of the last minute. A sorted
``Starts`` must give the same answers for any bookings, in any order, with
any removals: a generated sequence of operations is run on it and on a plain
list scanned the old way, and every answer compared.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fanout._starts import Starts

# Few distinct instants, so that equal starts, and queries on their edges, are common.
_TIMES = st.integers(0, 12).map(lambda k: k / 4)
_COSTS = st.sampled_from([1.0, 2.0, 0.5])

_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), _TIMES, _COSTS),
        st.tuples(st.just("discard"), _TIMES, _COSTS),
        st.tuples(st.just("take_latest"), _TIMES),
        st.tuples(st.just("forget_before"), _TIMES),
        st.tuples(st.just("cost_within"), _TIMES, _TIMES),
        st.tuples(st.just("cost_after"), _TIMES),
        st.tuples(st.just("count_within"), _TIMES, _TIMES),
        st.tuples(st.just("latest_before"), _TIMES, st.integers(0, 5)),
    ),
    max_size=60,
)


class _Scanned:
    """The bookings as the scope kept them before: in order, every query a scan."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self.entries: list[tuple[float, float]] = []

    def add(self, start: float, cost: float) -> None:
        self.entries.append((start, cost))
        # Past ``kept``, the earliest start goes (a deque dropped the first added).
        if len(self.entries) > self.kept:
            self.entries.remove(min(self.entries, key=lambda entry: entry[0]))

    def discard(self, start: float, cost: float) -> bool:
        if (start, cost) in self.entries:
            self.entries.remove((start, cost))
            return True
        return False

    def take_latest(self, by: float) -> float | None:
        """The start taken out (which of equal starts goes is not promised)."""
        latest = max((e for e in self.entries if e[0] <= by), key=lambda e: e[0], default=None)
        if latest is None:
            return None
        # Of equal starts, the one a sorted list keeps last: the latest added. By its
        # place, not its value: ``remove`` took the first equal entry, an earlier one of
        # the same cost, and a start of cost 1 taken between two of cost 2 read as a
        # disagreement.
        last = max(i for i, entry in enumerate(self.entries) if entry[0] == latest[0])
        del self.entries[last]
        return latest[0]

    def forget_before(self, horizon: float) -> None:
        self.entries = [e for e in self.entries if e[0] >= horizon]

    def cost_within(self, since: float, until: float) -> float:
        return sum(cost for start, cost in self.entries if since <= start <= until)

    def cost_after(self, when: float) -> float:
        return sum(cost for start, cost in self.entries if start > when)

    def count_within(self, since: float, until: float) -> int:
        return sum(1 for start, _ in self.entries if since <= start <= until)

    def latest_before(self, when: float, count: int) -> list[float]:
        before = sorted(start for start, _ in self.entries if start < when)
        return before[max(0, len(before) - count) :] if count else []


@settings(max_examples=400, deadline=None)
@given(operations=_OPERATIONS, kept=st.integers(1, 8))
@example(
    operations=[
        ("add", 0.0, 2.0), ("add", 0.0, 1.0), ("add", 0.0, 2.0),
        ("take_latest", 0.0), ("take_latest", 0.0),
    ],
    kept=3,
)  # fmt: skip
def test_every_query_agrees_with_a_scan_of_the_bookings(
    operations: list[tuple[Any, ...]], kept: int
) -> None:
    starts, scanned = Starts(kept), _Scanned(kept)
    for name, *arguments in operations:
        got = getattr(starts, name)(*arguments)
        expected = getattr(scanned, name)(*arguments)
        if name == "take_latest":
            got = None if got is None else got[0]
        assert got == expected, (name, arguments)
    # Whatever was done, what is left is the same.
    assert starts.cost_within(-math.inf, math.inf) == scanned.cost_within(-math.inf, math.inf)
    assert starts.count_within(-math.inf, math.inf) == len(scanned.entries)


def test_an_open_lower_bound_is_the_next_float_up() -> None:
    """The scope asks for ``since < start <= until`` as ``[nextafter(since), until]``."""
    starts = Starts(10)
    for start in (1.0, 1.0, 2.0):
        starts.add(start, 1.0)
    assert starts.cost_within(math.nextafter(1.0, math.inf), 2.0) == 1.0
    assert starts.cost_within(1.0, 2.0) == 3.0
    assert starts.latest_before(2.0, 5) == [1.0, 1.0]
    assert starts.latest_before(2.0, 0) == []
