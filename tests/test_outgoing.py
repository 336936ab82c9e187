"""``Outgoing`` answers what a scope sent and when, as a plain record of it would.

Every count a server states is read against these sums (`fanout._front`). A
generated sequence of bookings, departures, set-ups, parked requests,
refusals and other processes' starts, at generated times on a mock clock, is
kept both by ``Outgoing`` and by a plain model written from the rules its
docstrings state, and every answer compared.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from fanout._learning import SentAround
from fanout._outgoing import Outgoing

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

_TIMES = st.integers(0, 12).map(lambda k: k / 4)
_COSTS = st.sampled_from([1.0, 2.0])

_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("sleep"), st.sampled_from([0.25, 0.5, 1.25])),
        st.tuples(st.just("booked"), _TIMES, _COSTS),
        st.tuples(st.just("unbooked"), _TIMES, _COSTS),
        st.tuples(st.just("forget_start"), _TIMES),
        st.tuples(st.just("refused"), _TIMES),
        st.tuples(st.just("left")),
        st.tuples(st.just("setting_up"), _TIMES),
        st.tuples(st.just("set_up"), _TIMES),
        st.tuples(st.just("park"), _TIMES),
        st.tuples(st.just("unpark")),
        st.tuples(st.just("others"), _TIMES, _COSTS),
    ),
    max_size=40,
)


class _Model:
    """What was sent, kept whole and scanned at every question."""

    def __init__(self) -> None:
        self.booked: list[tuple[float, float]] = []
        self.left: list[float] = []
        self.left_total = 0
        self.setting_up: list[float] = []
        self.parked: list[float] = []
        self.others: list[tuple[float, float]] = []

    def take_latest(self, by: float) -> tuple[float, float] | None:
        """The booking ``Starts.take_latest`` takes: the last added of the latest start."""
        candidates = [i for i, (start, _) in enumerate(self.booked) if start <= by]
        if not candidates:
            return None
        latest = max(self.booked[i][0] for i in candidates)
        index = max(i for i in candidates if self.booked[i][0] == latest)
        return self.booked.pop(index)

    def started_by(self, when: float) -> float:
        return sum(cost for start, cost in self.booked if start <= when)

    def parked_by(self, when: float) -> float:
        return float(sum(1 for t in self.parked + self.setting_up if t <= when))

    def recent_left(self, now: float) -> list[float]:
        return [t for t in self.left if t > now - 1.0]


def _apply(outgoing: Outgoing, model: _Model, op: tuple[Any, ...], parks: list[Any]) -> None:
    now = trio.current_time()
    name = op[0]
    if name == "booked":
        outgoing.booked(op[1], op[2])
        model.booked.append((op[1], op[2]))
    elif name == "unbooked":
        outgoing.unbooked(op[1], op[2])
        same = [i for i, entry in enumerate(model.booked) if entry == (op[1], op[2])]
        if same:
            del model.booked[same[0]]
    elif name == "forget_start":
        outgoing.forget_start(op[1])
        model.take_latest(op[1])
    elif name == "refused":
        outgoing.refused(op[1])
        model.take_latest(op[1])
        kept = model.recent_left(now)
        departed = [t for t in kept if t <= op[1]]
        if departed:
            model.left.remove(departed[-1])
            model.left_total -= 1
        elif model.left_total and op[1] <= now - 1.0:
            model.left_total -= 1
    elif name == "left":
        outgoing.left(now)
        model.left.append(now)
        model.left_total += 1
    elif name == "setting_up":
        outgoing.setting_up(op[1])
        model.setting_up.append(op[1])
    elif name == "set_up":
        done = outgoing.set_up(op[1])
        assert done == (op[1] in model.setting_up)
        if done:
            model.setting_up.remove(op[1])
    elif name == "park":
        parked = contextlib.ExitStack()
        parked.enter_context(outgoing.parked(op[1]))
        parks.append((parked, op[1]))
        model.parked.append(op[1])
    elif name == "unpark" and parks:
        parked, admitted = parks.pop(0)
        parked.close()
        model.parked.remove(admitted)
    elif name == "others":
        outgoing.others_started([(op[1], op[2])])
        model.booked.append((op[1], op[2]))
        model.others.append((op[1], op[2]))
        while model.others and model.others[0][0] < now - 1.0:  # kept in the order told
            del model.others[0]


def _check(outgoing: Outgoing, model: _Model) -> None:
    now = trio.current_time()
    assert math.isclose(outgoing.started, sum(cost for _, cost in model.booked), abs_tol=1e-9)
    left = model.recent_left(now)
    assert outgoing.sent_lately() == len(left)
    for t in [k / 4 for k in range(-1, 14)] + [now]:
        assert math.isclose(outgoing.started_by(t), model.started_by(t), abs_tol=1e-9)
        assert outgoing.parked_by(t) == model.parked_by(t)
        assert math.isclose(
            outgoing.sent_by(t), model.started_by(t) - model.parked_by(t), abs_tol=1e-9
        )
        for u in (t + 0.25, t + 1.0):
            booked = sum(cost for start, cost in model.booked if t < start <= u)
            departed = float(sum(1 for x in left if t < x <= u))
            assert math.isclose(outgoing.started_between(t, u), max(booked, departed))
            others = sum(cost for start, cost in model.others if t < start <= u)
            assert math.isclose(outgoing.others_since(t, u), others)
        if model.left_total and t > now - 1.0:
            assert outgoing.left_by(t) == model.left_total - sum(1 for x in left if x > t)
        else:
            assert outgoing.left_by(t) is None


@given(_OPERATIONS)
@settings(max_examples=150, deadline=None)
def test_every_sum_is_what_a_plain_record_of_the_sends_gives(ops: list[tuple[Any, ...]]) -> None:
    """Bookings, departures, set-ups, parked requests, refusals and others' starts, in
    any order and at any times, give the sums a scan of everything kept gives."""

    async def main() -> None:
        outgoing, model, parks = Outgoing(), _Model(), []
        for op in ops:
            if op[0] == "sleep":
                await trio.sleep(op[1])
            else:
                _apply(outgoing, model, op, parks)
            _check(outgoing, model)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _run(main: Callable[[], Awaitable[None]]) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_refusal_takes_back_its_start_and_its_departure() -> None:
    """A refused request took no token: its booking and the latest departure by its
    sending leave the counts learning reads."""

    async def main() -> None:
        outgoing = Outgoing()
        outgoing.booked(0.0, 1.0)
        outgoing.left(0.0)
        await trio.sleep(0.1)
        outgoing.booked(0.1, 1.0)
        outgoing.left(0.1)
        outgoing.refused(0.1)
        assert outgoing.started == 1.0
        assert outgoing.left_within(0.0, 1.0) == 1.0
        assert outgoing.left_by(0.1) == 1.0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_request_sent_late_counts_from_when_it_left() -> None:
    """A call admitted at 0 whose request leaves at 0.07 s is counted as started then,
    not among what came before an answer to a request sent at 0.05 s."""

    async def main() -> None:
        outgoing = Outgoing()
        outgoing.booked(0.0, 1.0)
        outgoing.booked(0.0, 1.0)
        outgoing.setting_up(0.0)
        assert outgoing.sent_by(0.05) == 1.0  # one still sets up
        await trio.sleep(0.07)
        assert outgoing.set_up(0.0)
        outgoing.sent_late(0.0, 0.07)
        assert outgoing.started_by(0.05) == 1.0
        assert outgoing.started_between(0.05, 0.07) == 1.0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_requests_over_new_connections_are_out_until_answered() -> None:
    """Each request that opened a connection is out until its answer, matched by the
    connection's start (or, untold, the nearest write), and counted as possibly read
    after a later request while its set-up could make it so; forgotten after 30 s."""

    async def main() -> None:
        outgoing = Outgoing()
        outgoing.opened(0.0, 0.01, 0.0)
        outgoing.opened(0.0, 0.02, 0.0)
        outgoing.opened(0.005, 0.03, 0.0)
        assert outgoing.cold_behind(0.1, 0.05, set_up=0.1) == 3.0
        assert outgoing.cold_behind(0.1, 0.05, set_up=0.075) == 1.0  # only the one at 0.03
        outgoing.cold_answered(0.021, 0.0)
        assert [c.written for c in outgoing.cold_unanswered(0.1)] == [0.01, 0.03]
        outgoing.cold_answered(0.011, None)
        assert [c.began for c in outgoing.cold_unanswered(0.1)] == [0.005]
        assert outgoing.cold_unanswered(31.0) == []

    _run(main)


def test_requests_over_reused_connections_are_out_since_the_first_or_the_latest_answer() -> None:
    """Unanswered since the first left while none was out; since the latest answer (which
    of them came back is unknown), while any still is."""
    outgoing = Outgoing()
    assert outgoing.warm_out_since() is None
    outgoing.warm_left(1.0)
    outgoing.warm_left(2.0)
    assert outgoing.warm_out_since() == 1.0
    outgoing.warm_back(3.0)
    assert outgoing.warm_out_since() == 3.0
    outgoing.warm_back(4.0)
    assert outgoing.warm_out_since() is None


def test_what_was_sent_around_a_request_is_counted_from_its_bookings_and_departures() -> None:
    """Around a request sent at 0.1 s, read at 0.2 s: two booked 3 ms before it are sent
    with it and tied to it, one 20 ms before only with it (``together`` 25 ms), one
    still parked is not sent at all, and one booked 10 ms after it was sent with it on
    the other side. Another process's start among those with it is counted as such."""

    async def main() -> None:
        outgoing = Outgoing()
        outgoing.booked(0.0, 1.0)
        outgoing.booked(0.08, 1.0)
        for _ in range(2):
            outgoing.booked(0.097, 1.0)
        outgoing.others_started([(0.099, 1.0)])
        outgoing.booked(0.1, 1.0)  # the request itself
        with outgoing.parked(0.1):
            outgoing.booked(0.1, 1.0)
            outgoing.booked(0.11, 1.0)
            outgoing.booked(0.15, 1.0)
            await trio.sleep(0.2)
            around = outgoing.around(0.1, 0.2, together=0.025, refused=False)
            assert around == SentAround(
                started=6.0, alongside=4.0, tied=3.0, others_with=1.0, after=2.0,
                after_with=1.0, left=None, left_with=0.0,
            )  # fmt: skip
            refused = outgoing.around(0.1, 0.2, together=0.025, refused=True)
            assert refused.started == 5.0  # a 429's request took no token

    _run(main)


def test_a_request_sent_with_others_that_left_later_counts_them_alongside() -> None:
    """Where the HTTP layer tells departures, those that left with a request count as sent
    with it, even if booked long before, and the running total of departures by its
    sending leaves its own out when it was refused."""

    async def main() -> None:
        outgoing = Outgoing()
        for _ in range(3):
            outgoing.booked(0.0, 1.0)
        await trio.sleep(0.1)
        for _ in range(3):
            outgoing.left(0.1)
        around = outgoing.around(0.1, 0.1, together=0.005, refused=True)
        assert around.alongside == 2.0
        assert around.left == 2.0
        assert around.left_with == 2.0

    _run(main)
