"""Which connection pool a request goes through (`fanout._pools`).

The promise, for any interleaving of requests taken and given back: no
request opens a connection while another pool has one to its origin idle
(so a pool opens no more connections than were ever out at once), and a
wave of requests that finds none idle spreads evenly over the pools.
"""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from fanout._pools import PoolLoads, PoolUse


@attrs.define(eq=False)
class _Pool:
    """A connection pool as httpcore keeps one: a request takes an idle connection to
    its origin if there is one, else opens one; every connection is kept."""

    name: int
    idle: dict[str, int] = attrs.field(factory=dict)
    opened: int = 0

    def send(self, origin: str) -> None:
        if self.idle.get(origin, 0):
            self.idle[origin] -= 1
        else:
            self.opened += 1

    def back(self, origin: str) -> None:
        self.idle[origin] = self.idle.get(origin, 0) + 1


_ORIGINS = ["https://a.example:None", "https://b.example:8443"]

# Each step: take a request to an origin (at a call position), or give back the
# request out that many places from the oldest.
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.integers(0, len(_ORIGINS) - 1), st.integers(0, 600)),
        st.tuples(st.just("back"), st.integers(0, 50), st.just(0)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(pools=st.integers(1, 6), steps=_steps)
def test_no_connection_is_opened_while_another_pool_has_one_idle(
    pools: int, steps: list[tuple[str, int, int]]
) -> None:
    """The connections opened to each origin, over all pools, are the most requests
    that were ever out to it at once."""
    made = [_Pool(n) for n in range(pools)]
    loads = PoolLoads[_Pool]()
    out: list[tuple[PoolUse[_Pool], str]] = []
    most = dict.fromkeys(_ORIGINS, 0)
    opened = dict.fromkeys(_ORIGINS, 0)
    for verb, which, position in steps:
        if verb == "take":
            origin = _ORIGINS[which]
            use = loads.take(made, origin, position)
            before = use.pool.opened
            use.pool.send(origin)
            opened[origin] += use.pool.opened - before
            out.append((use, origin))
            most[origin] = max(most[origin], sum(1 for _, o in out if o == origin))
        elif out:
            use, origin = out.pop(which % len(out))
            use.release()
            use.release()  # given back once, however often it is said
            use.pool.back(origin)
    assert opened == most


@settings(max_examples=100, deadline=None)
@given(pools=st.integers(1, 8), wave=st.integers(1, 300), first=st.integers(0, 1000))
def test_a_wave_that_finds_nothing_idle_spreads_evenly(pools: int, wave: int, first: int) -> None:
    """Requests of calls at consecutive positions, none given back, differ by at most one
    from pool to pool, and the first goes where its position says."""
    made = [_Pool(n) for n in range(pools)]
    loads = PoolLoads[_Pool]()
    chosen = [loads.take(made, _ORIGINS[0], first + k).pool for k in range(wave)]
    counts = [sum(1 for pool in chosen if pool is p) for p in made]
    assert max(counts) - min(counts) <= 1
    assert chosen[0] is made[first % pools]


def test_a_client_of_many_servers_keeps_a_bounded_record() -> None:
    """Requests to ten thousand origins, one at a time: what is kept stays bounded, and a
    request still out when the record is thinned is given back as counted."""
    made = [_Pool(n) for n in range(4)]
    loads = PoolLoads[_Pool]()
    held = loads.take(made, "https://kept.example:None", 0)
    for n in range(10_000):
        loads.take(made, f"https://{n}.example:None", n).release()
    assert len(loads._most) <= 1025
    held.release()
    again = loads.take(made, "https://kept.example:None", 1)
    assert again.pool is held.pool  # its connection is idle: it goes back to it
