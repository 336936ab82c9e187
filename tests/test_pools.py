"""Which connection pool a request goes through (`fanout._pools`).

The promise, for any interleaving of requests taken and given back: no
request opens a connection while another pool has one to its origin idle
(so a pool opens no more connections than were ever out at once), and a
wave of requests that finds none idle spreads evenly over the pools.
"""

from __future__ import annotations

import attrs
import httpx
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
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


_FATES = ["read", "left_open", "raises_after_headers", "connect_error", "hangs", "refused"]


@settings(max_examples=40, deadline=None)
@given(fates=st.lists(st.sampled_from(_FATES), min_size=1, max_size=12))
def test_every_request_gives_its_pool_back_however_its_call_ends(fates: list[str]) -> None:
    """Calls whose requests are read, left open by their tools, dropped after the headers,
    refused before they connect, hung until the call's timeout, or refused with a 429:
    once the turn is answered, no pool counts a request of it as still out (a count
    left behind would make that pool look busy for good, and its idle connections
    go unused). A mock transport's answers come with their bodies read already, so
    here every use is given back when its call's attempt ends, if not before."""

    async def answer(request: httpx.Request) -> httpx.Response:
        fate = _FATES[int(request.url.path.rsplit("/", 1)[1])]
        if fate == "connect_error":
            raise httpx.ConnectError("refused", request=request)
        if fate == "hangs":
            await trio.sleep_forever()
        if fate == "refused":
            return httpx.Response(429, headers={"retry-after": "0"})
        return httpx.Response(200, text="x" * 100)

    async def main() -> None:
        transport = fanout.FanoutTransport(httpx.MockTransport(answer))
        registry = fanout.Registry()
        async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:

            @registry.tool(kind=fanout.Kind.READS, timeout=1.0)
            async def fetch(fate: int) -> str:
                name = _FATES[fate]
                if name == "left_open":
                    request = client.build_request("GET", f"/{fate}")
                    response = await client.send(request, stream=True)
                    return str(response.status_code)  # its body never read nor closed
                response = await client.get(f"/{fate}")
                if name == "raises_after_headers":
                    raise ValueError("dropped")
                return response.text

            runner = fanout.Runner(registry, retry=fanout.RetryPolicy(attempts=2))
            calls = [
                fanout.ToolCall(f"c{i}", "fetch", {"fate": _FATES.index(fate)})
                for i, fate in enumerate(fates)
            ]
            turn = await runner.run_turn(calls)
            assert [r.tool_use_id for r in turn.results] == [c.id for c in calls]
            assert all(out == 0 for out in transport._core._loads._out.values())

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
