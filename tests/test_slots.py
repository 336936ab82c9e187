"""A cap on requests in flight, learned from 503s (`fanout._slots`).

The unit tests drive ``LearnedCap`` on trio's mock clock; the others run a
scope told nothing (no rate, no ``max_concurrency``) against the real
throttling server on 127.0.0.1, on the mock clock, so every start time and
count asserted is exact.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from fanout import Kind, Registry, Runner, Scope, Status, ToolCall
from fanout._slots import TRIAL_SPACING, LearnedCap, Leaving
from fanout.testing import ServerConfig, ThrottlingServer
from tests.clocks import ticking_clock
from tests.test_learning_no_numbers import learn, shape
from tests.test_learning_sweep import Server, refusals_from_afar, run

if TYPE_CHECKING:
    from collections.abc import Iterator

# -- LearnedCap alone -------------------------------------------------------


def _refused(cap: LearnedCap, others: int) -> bool:
    """A 503 to a request that left with ``others`` out, long after any answer."""
    return cap.overloaded(Leaving(others), round_trip=0.001)


async def test_requests_go_uncapped_until_a_503_shows_a_cap(autojump_clock: Any) -> None:
    cap = LearnedCap()
    assert [(await cap.sending()).others for _ in range(5)] == [0, 1, 2, 3, 4]
    assert cap.limit is None
    assert _refused(cap, 4)  # the fifth was refused with four others out
    assert cap.limit == 4


async def test_a_503_with_nothing_else_on_the_wire_shows_no_cap(autojump_clock: Any) -> None:
    cap = LearnedCap()
    await cap.sending()
    assert not _refused(cap, 0)
    assert cap.limit is None


async def test_a_later_503_only_ever_lowers_the_cap(autojump_clock: Any) -> None:
    cap = LearnedCap()
    _refused(cap, 4)
    _refused(cap, 7)  # answers on their way back: the server counted fewer than that
    assert cap.limit == 4
    _refused(cap, 2)
    assert cap.limit == 2


async def test_the_cap_grows_back_by_one_each_minute_without_a_503(autojump_clock: Any) -> None:
    cap = LearnedCap()
    _refused(cap, 3)
    await trio.sleep(59.9)
    assert cap.limit == 3
    await trio.sleep(0.1)
    assert cap.limit == 4
    await trio.sleep(120)
    assert cap.limit == 6
    _refused(cap, 5)  # a 503 again: from the cap as it had grown, lowered, and the clock restarts
    assert cap.limit == 5


async def test_a_full_cap_holds_requests_and_passes_places_on_in_order(autojump_clock: Any) -> None:
    cap = LearnedCap()
    _refused(cap, 2)
    for _ in range(2):
        await cap.sending()
    left: list[tuple[int, float, int]] = []

    async def leave(n: int) -> None:
        leaving = await cap.sending()
        left.append((n, trio.current_time(), leaving.others))

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(leave, n)
            await trio.testing.wait_all_tasks_blocked()
        assert left == []
        await trio.sleep(1)
        cap.answered()
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(1)
        cap.answered()
        await trio.testing.wait_all_tasks_blocked()
        cap.answered()
    assert left == [(0, 1.0, 1), (1, 2.0, 1), (2, 2.0, 1)]
    assert cap.on_the_wire == 2


async def test_a_request_cancelled_while_it_waits_takes_no_place(autojump_clock: Any) -> None:
    cap = LearnedCap()
    _refused(cap, 1)
    await cap.sending()
    with trio.move_on_after(1):
        await cap.sending()
    assert cap.on_the_wire == 1
    cap.answered()
    assert cap.on_the_wire == 0
    assert (await cap.sending()).others == 0  # at once: nobody waits


@pytest.mark.parametrize("held", ["under a learned cap", "past the most proven"])
async def test_a_request_that_waited_through_a_429_needs_a_token_anew(
    autojump_clock: Any, held: str
) -> None:
    """A request waiting for its place (under a learned cap, or to go past the most
    proven on the wire) took its token before a 429 emptied the bucket: it leaves
    overruled, to book again."""
    cap = LearnedCap()
    if held == "under a learned cap":
        _refused(cap, 1)
    else:
        cap.try_past(0)
    first = await cap.sending()
    outcomes: list[Leaving] = []

    async def leave() -> None:
        outcomes.append(await cap.sending())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(leave)
        await trio.testing.wait_all_tasks_blocked()
        cap.throttled()
        cap.answered()
    assert not first.overruled  # it did not wait
    assert [leaving.overruled for leaving in outcomes] == [True]


async def _leave_together(cap: LearnedCap, n: int) -> list[tuple[float, Leaving]]:
    """``n`` requests about to leave at once; when each left, and how."""
    left: list[tuple[float, Leaving]] = []

    async def leave() -> None:
        leaving = await cap.sending()
        left.append((trio.current_time(), leaving))

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(leave)
    return left


async def test_requests_past_the_most_proven_leave_one_at_a_time(autojump_clock: Any) -> None:
    """Nobody told a cap, two proven (a probe's): the third goes at once, and each after
    it `TRIALTRIAL_SPACING` after the one before; none is held back by a cap."""
    cap = LearnedCap()
    cap.try_past(2)
    left = await _leave_together(cap, 5)
    assert [when for when, _ in left] == pytest.approx(
        [0.0, 0.0, 0.0, TRIAL_SPACING, 2 * TRIAL_SPACING]
    )
    assert [leaving.others for _, leaving in left] == [0, 1, 2, 3, 4]
    assert not any(leaving.overruled for _, leaving in left)
    assert cap.limit is None


async def test_an_admitted_answer_proves_how_many_the_server_took(autojump_clock: Any) -> None:
    """An answer to a request that left with four others out proves five: five go at
    once, and the sixth is a trial; an answer with fewer out lowers nothing."""
    cap = LearnedCap()
    cap.try_past(2)
    cap.proved(Leaving(4))
    cap.proved(Leaving(1))
    left = await _leave_together(cap, 7)
    assert [when for when, _ in left] == pytest.approx([0.0] * 6 + [TRIAL_SPACING])


async def test_a_scope_told_a_cap_sends_nothing_one_at_a_time(autojump_clock: Any) -> None:
    """Without `try_past` (a cap told, or a rate), requests leave as they come."""
    left = await _leave_together(LearnedCap(), 5)
    assert [when for when, _ in left] == [0.0] * 5


async def test_a_cap_shown_while_waiting_past_the_proven_holds_the_rest(
    autojump_clock: Any,
) -> None:
    """The trial past two is refused with 503 (a cap of 3): the requests still waiting
    to go past it wait for places under the cap instead, handed on by answers."""
    cap = LearnedCap()
    cap.try_past(2)
    left: list[float] = []

    async def leave() -> None:
        await cap.sending()
        left.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(leave)
        await trio.testing.wait_all_tasks_blocked()
        assert left == [0.0, 0.0, 0.0]
        assert cap.overloaded(Leaving(2), round_trip=0.001)
        cap.answered()  # the refused request's place
        await trio.sleep(1)
        assert left == [0.0, 0.0, 0.0]
        cap.answered()
        cap.answered()
    assert left == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert cap.limit == 2


async def test_a_place_handed_on_unused_passes_in_order_and_is_no_answer(
    autojump_clock: Any,
) -> None:
    """A request overruled while it waited hands its place on before it books a new
    token: held while it waited for that token, its place stopped the requests queued
    behind it, each on a token already due (a cap of one sent one request a window for
    three windows). The place goes to the next in line, and the time of the last
    answer stays, so nothing is spaced after a handing-on as after an answer."""
    cap = LearnedCap()
    _refused(cap, 1)
    await cap.sending()
    outcomes: list[tuple[str, Leaving]] = []

    async def leave(name: str) -> None:
        outcomes.append((name, await cap.sending()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(leave, "overruled")
        await trio.testing.wait_all_tasks_blocked()
        cap.throttled()
        nursery.start_soon(leave, "after the refusal")
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(1.0)
        cap.answered()  # at 1.0
        await trio.testing.wait_all_tasks_blocked()
        assert [name for name, _ in outcomes] == ["overruled"]
        await trio.sleep(1.0)
        cap.hand_on()  # at 2.0
    assert [(name, leaving.overruled) for name, leaving in outcomes] == [
        ("overruled", True), ("after the refusal", False),
    ]  # fmt: skip
    assert outcomes[1][1].since_answer == pytest.approx(1.0)
    assert cap.on_the_wire == 1


async def test_a_503_right_after_an_answer_keeps_the_cap_and_spaces_the_next_place(
    autojump_clock: Any,
) -> None:
    """A server counts a request out once it has sent its answer: a request that took the
    answered one's place at once may find it still counted. Under a cap of 4, such a 503
    with 3 others out keeps the cap, and places are used again a round trip after an
    answer (twice as long at each such 503); past four round trips it is a lower cap."""
    cap = LearnedCap()
    _refused(cap, 4)
    for _ in range(4):
        await cap.sending()
    cap.answered()  # at t=0
    racing = await cap.sending()
    assert racing.others == 3
    assert racing.since_answer == 0.0
    assert cap.overloaded(racing, round_trip=0.01, quickest=0.1)
    assert cap.limit == 4
    cap.answered()  # the refused one is back; an answer at t=0 again
    cap.answered()
    spaced = await cap.sending()
    assert trio.current_time() == pytest.approx(0.01)  # a round trip after the answer
    for gap in (0.02, 0.04):
        assert cap.overloaded(attrs.evolve(spaced, since_answer=0.0), round_trip=0.01, quickest=0.1)
        assert cap.limit == 4
        cap.answered()
        began = trio.current_time()
        spaced = await cap.sending()
        assert trio.current_time() - began == pytest.approx(gap)
    assert cap.overloaded(attrs.evolve(spaced, since_answer=0.0), round_trip=0.01, quickest=0.1)
    assert cap.limit == 2  # past four round trips of gap: a cap of what was out (2)


async def test_a_slow_503_after_an_answer_lowers_the_cap_and_spaces_nothing(
    autojump_clock: Any,
) -> None:
    """A 503 that took longer than the server's quickest admitted answer was not refused
    as it arrived: no race with an answer. Read as one, it would have spaced every later
    request a whole (slow) round trip after each answer."""
    cap = LearnedCap()
    _refused(cap, 4)
    for _ in range(4):
        await cap.sending()
    cap.answered()
    late = await cap.sending()
    assert late.since_answer == 0.0
    assert cap.overloaded(late, round_trip=30.0, quickest=0.1)
    assert cap.limit == 3
    cap.answered()
    cap.answered()
    began = trio.current_time()
    await cap.sending()
    assert trio.current_time() == began  # no gap after the answer


async def test_a_request_cancelled_in_the_gap_after_an_answer_gives_its_place_back(
    autojump_clock: Any,
) -> None:
    cap = LearnedCap()
    _refused(cap, 2)
    for _ in range(2):
        await cap.sending()
    cap.answered()
    assert cap.overloaded(await cap.sending(), round_trip=1.0, quickest=2.0)  # a gap of 1 s
    cap.answered()
    cap.answered()
    assert cap.on_the_wire == 0
    with trio.move_on_after(0.5):
        await cap.sending()  # holds its place through the gap, and is cancelled in it
    assert cap.on_the_wire == 0
    await trio.sleep(0.5)
    await cap.sending()
    assert cap.on_the_wire == 1


# -- a scope told nothing, against a capped server -----------------------------


def _after_first_503(server: ThrottlingServer) -> tuple[float, list[Any]]:
    first = min(r.end for r in server.records if r.status == 503)
    return first, [r for r in server.records if r.start > first]


@pytest.fixture
def far_refusals() -> Iterator[None]:
    """A server whose 503s come back later than the spacing past what is proven."""
    with refusals_from_afar():
        yield


_FORTY = ServerConfig(
    rate=10, burst=10, latency=0.4, max_in_flight=4, headers="draft", retry_after="seconds"
)


async def test_a_cap_nobody_told_costs_one_503_past_the_probe(autojump_clock: Any) -> None:
    """The issue's 40 calls at 10/s with a cap of 4 and 400 ms, the scope told nothing.

    The probe's two answers at 0.4 s prove the server takes two at once; the
    wave its burst allows then goes one request at a time past those two,
    `TRIAL_SPACING` (2 ms) apart, and the fifth is refused as it arrives: one
    503, read before the sixth would leave. From then on no more than 4 are out. Sent at once, the
    wave drew three (`test_..._from_a_wave_of_503s`).
    """
    scope = Scope("key")
    server, turn = await learn(_FORTY, 40, scope)
    assert all(r.status is Status.OK for r in turn.results)
    assert [r.start for r in server.records if r.start < 0.5] == [
        0.0, 0.0, 0.4, 0.4, 0.4, 0.4 + TRIAL_SPACING, pytest.approx(0.4 + 2 * TRIAL_SPACING)
    ]  # fmt: skip
    assert [r.start for r in server.records if r.status == 503] == [
        pytest.approx(0.4 + 2 * TRIAL_SPACING)
    ]
    _, later = _after_first_503(server)
    assert all(r.status == 200 and r.in_flight_at_start < 4 for r in later)
    assert max(r.end for r in server.records) == pytest.approx(4.4)  # the minimum is 4.0 s
    assert scope.statistics().max_concurrency == 4


@pytest.mark.usefixtures("far_refusals")
async def test_a_cap_nobody_told_is_learned_from_a_wave_of_503s(autojump_clock: Any) -> None:
    """As above, from a server whose refusals come back later than the spacing.

    The probe's answers at 0.4 s let the burst out: 4 admitted, 3 refused at
    once (4 after a probe of one). From then on no more than 4 are out, and no
    503 follows; the refused calls wait out their Retry-After while the others
    go on. Before, every reopening sent the burst again: 19 refusals, 7 calls
    given up, 7.8 s.
    """
    scope = Scope("key")
    server, turn = await learn(_FORTY, 40, scope)
    assert all(r.status is Status.OK for r in turn.results)
    assert [r.start for r in server.records if r.status == 503] == [0.4] * 3
    first, later = _after_first_503(server)
    assert first == 0.4
    assert all(r.status == 200 and r.in_flight_at_start < 4 for r in later)
    assert max(r.end for r in server.records) == pytest.approx(4.4)  # the minimum is 4.0 s
    assert scope.statistics().max_concurrency == 4


async def test_a_server_that_limits_only_concurrency_costs_one_503(autojump_clock: Any) -> None:
    """No rate at all, 4 in flight, 200 ms, nothing stated: one 503, then 4 at a time.

    Before, the 503s were taken for a rate and each blocked the whole scope
    for its whole-second Retry-After: 5.1 s, where 2.275 s now (minimum 2.0 s;
    2.42 s after a probe of one).
    """
    config = ServerConfig(rate=None, burst=10, latency=0.2, max_in_flight=4)
    server, turn = await learn(config, 40, Scope("key"))
    assert all(r.status is Status.OK for r in turn.results)
    assert server.count(status=503) == 1
    _, later = _after_first_503(server)
    assert all(r.in_flight_at_start < 4 for r in later)
    assert max(r.end for r in server.records) == pytest.approx(2.275)


async def test_429s_with_requests_in_flight_teach_no_cap(autojump_clock: Any) -> None:
    """A 429 is the rate's: however many were out, the scope stays uncapped."""
    scope = Scope("key")
    server, turn = await learn(shape("absent"), 60, scope)
    assert server.count(status=429) >= 1
    assert max(r.in_flight_at_start for r in server.records if r.status == 429) >= 1
    assert all(r.status is Status.OK for r in turn.results)
    assert scope.statistics().max_concurrency is None


class _ToldNothing(Server):
    """A drawn server, run by a scope told not even its cap."""

    def scope(self) -> Scope:
        return Scope("api")


def _all_ok(server: Server) -> tuple[ThrottlingServer, float]:
    """Run a turn against ``server``; every call must be answered ok. The server's
    record of the requests, and the makespan."""
    throttling, turn, makespan = run(server)
    assert all(r.status is Status.OK for r in turn.results)
    return throttling, makespan


def test_requests_held_by_the_cap_through_a_429_wait_for_a_new_token() -> None:
    """Bare 429s from a bucket with a cap of 5 nobody told: after the cap's 503, calls
    admitted on earlier tokens wait for places on the wire. When a 429 came, each
    refused one passed its place on at once, to a request that went out on a token
    of before it: 48 429s in a row and 30 calls given up. Now three, the most learning
    spends: two at the first refusal, and one at 7.6 s, where the rate learned (11/s
    against 9.2/s) ran ahead. (Two while an overruled request held its place as it
    waited for a new token: the requests queued behind it left later.)"""
    server = _ToldNothing(
        "bucket", 9.163776537932376, 12, 0.25497283013155525, 0.12748641506577763, 5,
        "none", "absent", 80, reset="next", seed=1,
    )  # fmt: skip
    throttling, _ = _all_ok(server)
    assert throttling.count(status=429) == 3
    assert throttling.count(status=503) == 1


def test_a_cap_of_one_queues_calls_without_slowing_the_rate_or_widening_the_window() -> None:
    """A fixed window of 13 per 2 s stated in the IETF policy, and a cap of 1 nobody
    told: after its 503s, 50 calls admitted at once wait for the one place on the wire.
    Their wait there was counted twice: as call durations, whose spread became the
    learned window's margin (8 s, then more as the calls waited longer), and against
    the rate, as nothing sent in the second before a 429 (the stated 6.5/s cut to the
    least, 0.1/s). 329 s for what takes 8.5 s, two calls given up after waiting 78 s.
    Now 9.6 s, every call ok (with the rules for calls held at the cap, below, and a
    void that hands back the tokens of bookings whose holders had not woken yet); 9.3 s
    since a 429 inside a window reported spent waits for the server's Retry-After where
    that comes before the Reset reported earlier (one 429, one 503, as before); 8.6 s
    since the learned log frees what the window's counts show it forgot at its end
    (`SlidingLog.sync`); 8.599 s since the window trial waits a moment past the
    server's wait, an HTTP-date here (`past_reset`); 8.653 s since a whole-second reset
    not yet seen rounded either way frees a token only half a second or more before the
    log would (`ScopeFront._reset_lead`): one the log reached within half a second
    is passed over, as it may have been rounded down."""
    server = _ToldNothing(
        "fixed", 6.5, 13, 0.07483907974691155, 0.0, 1, "ietf", "http-date", 59, seed=2,
    )  # fmt: skip
    throttling, makespan = _all_ok(server)
    assert throttling.count(status=429) <= 3
    assert makespan == pytest.approx(8.65306897365326, abs=0.01)


@pytest.mark.usefixtures("far_refusals")
def test_the_wave_that_shows_a_cap_lowers_it_to_the_least_it_shows() -> None:
    """A cap of 2 nobody told, 503s with no wait: five requests leave at once, three
    are refused. The first answer read (with 3 others out) taught a cap of 3; the
    other two 503s of that wave, with a cap now learned, were read as the rate's, so
    the cap stayed 3 against the server's 2, every later third request was refused,
    and a call gave up after three 503s. The wave's requests left before any cap was
    learned, so each is read against the cap: 2, three 503s in all, every call ok
    (0.70 s; 0.91 s after a probe of one)."""
    throttling, makespan = _all_ok(_ToldNothing(
        "bucket", 9.0, 9, 0.1840230284240259, 0.09201151421201295, 2, "ietf", "absent", 6,
        seed=0,
    ))  # fmt: skip
    assert throttling.count(status=503) == 3
    assert makespan == pytest.approx(0.700632102005369, abs=1e-6)


@pytest.mark.usefixtures("far_refusals")
def test_a_cap_read_too_high_no_longer_spends_the_retry_budget() -> None:
    """As above, eleven calls against a cap of 2: the first wave taught a cap of 3,
    so later requests went out three at a time, and the 503s of the third ones, on
    top of the wave's six, spent the scope's retry budget (3 + 0.2 a request, meant
    for a failing downstream): three calls failed with it spent. Read against the
    wave's least, the cap is 2: every call ok. The probe's two fill the cap, so the
    wave after it is the one refused: four 503s (three after a probe of one), 0.32 s
    (0.35 s)."""
    server = _ToldNothing(
        "bucket", 39.57486075789762, 9, 0.04228018076572377, 0.021140090382861885, 2,
        "draft", "absent", 11, seed=2,
    )  # fmt: skip
    throttling, _ = _all_ok(server)
    assert throttling.count(status=503) == 4


@pytest.mark.usefixtures("far_refusals")
def test_requests_waiting_for_a_place_are_not_counted_as_tokens_the_server_has() -> None:
    """8/s, burst 16, a cap of 3 nobody told, the IETF policy stated. Calls took their
    tokens and waited for a place on the wire while answers said how many the server
    had left; a count above the bucket was adopted as if those calls had never taken
    theirs, and they went out on tokens spent twice: four 429s, 9.3 s. They will reach
    the server, so the least it can have leaves them out (one 429, 6.2 s), and each is
    counted from when it leaves (below): no 429, 5.66 s for 5.64 (5.68 s since the least
    count of a wave all answered is read as what the server holds, `_tied_shortfall`:
    the starts move, and the last by 22 ms)."""
    server = _ToldNothing(
        "bucket", 8.0, 16, 0.010961154867075908, 0.0, 3, "ietf", "seconds", 61, seed=2,
    )  # fmt: skip
    throttling, makespan = _all_ok(server)
    assert throttling.count(status=429) == 0
    assert makespan == pytest.approx(5.679805774335379, abs=1e-6)


def test_calls_held_at_the_cap_are_counted_from_when_their_requests_leave() -> None:
    """A sliding log of 19 per 9.5 s and a cap of 6, neither told. The probe's answer
    admitted 17 calls at once; they left six at a time, and the refill the answers
    showed was measured against their admissions: 20/s, against 2/s. The next wave
    drew five 429s at once, whose retries (with four 503s) spent the retry budget,
    and a call failed. Counted from when each left (and a 503 over the cap as no
    admission, as a 429 is not): two 429s, every call ok. And the requests sent
    together with an answer's own leave out the calls still held then, as what
    had started by then does (counted there, calls held since long before shrank
    that company to none, the refill measured too fast, and drew a second): one."""
    throttling, _ = _all_ok(_ToldNothing(
        "sliding", 2.0000000000000004, 19, 0.2505580559680573, 0.0, 6, "x", "http-date", 24,
        seed=2,
    ))  # fmt: skip
    assert throttling.count(status=429) == 1


@st.composite
def capped_servers(draw: st.DrawFn) -> Server:
    """A server of any of the matrix's kinds with an in-flight cap (503s beyond it)."""
    model = draw(st.sampled_from(["bucket", "bucket-next", "fixed", "sliding", "concurrency"]))
    headers = draw(st.sampled_from(["draft", "ietf", "x", "none"]))
    retry_after = draw(st.sampled_from(["seconds", "ms", "http-date", "absent"]))
    burst = draw(st.integers(1, 25))
    rate = draw(st.floats(2.0, 50.0))
    if headers == "ietf" and model != "concurrency":
        rate = burst / draw(st.integers(1, 3))  # a policy window is whole seconds
    latency = draw(st.floats(0.01, 0.3))
    if model in ("fixed", "sliding") and headers == "none" and retry_after == "absent":
        retry_after = "seconds"  # a window that says nothing at all is the sweep's known miss
    return _ToldNothing(
        model="bucket" if model == "bucket-next" else model,
        rate=rate,
        burst=burst,
        latency=latency,
        jitter=draw(st.sampled_from([0.0, 0.5])) * latency,
        max_in_flight=draw(st.integers(1, 16)),
        headers=headers,
        retry_after=retry_after,
        calls=draw(st.integers(1, 80)),
        reset="next" if model == "bucket-next" else "full",
        seed=draw(st.integers(0, 3)),
    )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(server=capped_servers())
def test_a_cap_nobody_told_fails_no_call_and_draws_no_503_once_learned(server: Server) -> None:
    """Any capped server, the scope told nothing: every call ok, and no request sent
    after the first 503 came back is refused for the cap. (Over 145 such servers,
    before: 1,036 calls failed and 1,473 503s came after the first.) Its 503s come at
    once, so past the probe the cap is crossed by one request (`fanout._slots`): one
    503 in all, the probe's or the crossing's. (Of 300 drawn alike, the wave sent at
    once drew two to four on 94.)"""
    throttling, _ = _all_ok(server)
    assert throttling.count(status=503) <= 1


@settings(max_examples=40, deadline=None, derandomize=True)
@given(server=capped_servers(), tick=st.sampled_from([1e-6, 2e-6]))
def test_a_cap_nobody_told_is_crossed_by_one_request_as_time_moves_on(
    server: Server, tick: float
) -> None:
    """As above, on a clock later at every reading (`tests.clocks`): a 503 takes a few
    readings to come back, as in real time, and still comes within the spacing past
    the proven, so one 503 in all. (At 5 µs a reading, a process far busier than any
    real run here, one of 200 drawn drew two: its 503 took longer than 2 ms.)"""
    throttling, turn, _ = run(server, ticking_clock(tick))
    assert all(r.status is Status.OK for r in turn.results)
    assert throttling.count(status=503) <= 1


# -- a place on the wire is held until the answer is read ------------------------


async def _capped_turn(tools: dict[str, Any], arguments: list[dict[str, Any]]) -> list[float]:
    """Calls of ``tools`` through one scope whose second request at t=0 is refused with a
    503 while the first is out (a cap of one learned); when each request was sent."""
    sent: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(trio.current_time())
        if len(sent) == 2:
            return httpx.Response(503, headers={"retry-after": "5"})
        return httpx.Response(200, text="ok")

    async with fanout.http_client(httpx.MockTransport(handler), base_url="http://api") as client:
        registry = Registry()
        for name, body in tools.items():
            registry.tool(name=name, kind=Kind.READS, scopes=["api"], timeout=60)(
                functools.partial(body, client)
            )
        runner = Runner(registry, scopes=[Scope("api", rate=1000, burst=1000)], inline_wait=None)
        turn = await runner.run_turn(
            [ToolCall(f"c{i}", args.pop("tool"), args) for i, args in enumerate(arguments)]
        )
    assert all(r.status is Status.OK for r in turn.results)
    return sent


async def _read_slowly(client: httpx.AsyncClient, n: int, wait: float) -> str:
    await trio.sleep(wait)
    async with client.stream("GET", f"/item/{n}") as response:
        await trio.sleep(1)
        return (await response.aread()).decode()


async def _leave_unread(client: httpx.AsyncClient, n: int, wait: float) -> str:
    await trio.sleep(wait)
    response = await client.send(client.build_request("GET", f"/item/{n}"), stream=True)
    await trio.sleep(2)
    return str(response.status_code)  # its body never closed


async def test_a_place_on_the_wire_is_given_back_when_the_answer_is_read(
    autojump_clock: Any,
) -> None:
    """Given back at the headers, the next request reached a server that had not yet
    counted the answered one out. Here the first answer's body is read at t=1: the
    third request, ready at 0.5, leaves then, not at 0.5 (the refused one retries at 5)."""
    sent = await _capped_turn(
        {"read": _read_slowly},
        [
            {"tool": "read", "n": 0, "wait": 0},
            {"tool": "read", "n": 1, "wait": 0},
            {"tool": "read", "n": 2, "wait": 0.5},
        ],
    )
    assert sent == [0.0, 0.0, 1.0, 5.0]


async def test_a_body_never_closed_gives_its_place_back_when_the_attempt_ends(
    autojump_clock: Any,
) -> None:
    sent = await _capped_turn(
        {"leave": _leave_unread, "read": _read_slowly},
        [
            {"tool": "leave", "n": 0, "wait": 0},
            {"tool": "read", "n": 1, "wait": 0},
            {"tool": "read", "n": 2, "wait": 0.5},
        ],
    )
    assert sent == [0.0, 0.0, 2.0, 5.0]


# -- no place is ever lost -----------------------------------------------------

_OUTCOMES = st.sampled_from(
    ["ok", "slow", "503", "503 bare", "429", "connect error", "timeout", "hang"]
)


async def _answer(outcome: str) -> httpx.Response:
    if outcome == "slow":
        await trio.sleep(0.3)
    elif outcome == "ok":
        await trio.sleep(0.05)
    if outcome == "hang":
        await trio.sleep_forever()  # only the call's deadline ends it
    if outcome == "connect error":
        raise httpx.ConnectError("refused")
    if outcome == "timeout":
        await trio.sleep(0.2)
        raise httpx.ReadTimeout("no answer")
    if outcome == "503":
        return httpx.Response(503, headers={"retry-after": "1"})
    if outcome in ("503 bare", "429"):
        return httpx.Response(int(outcome[:3]))
    return httpx.Response(200, text="ok")


@settings(max_examples=150, deadline=None)
@given(
    outcomes=st.lists(_OUTCOMES, min_size=1, max_size=30),
    tools=st.lists(st.sampled_from(["read", "leave open", "raise"]), min_size=1, max_size=12),
    deadline=st.sampled_from([0.1, 0.5, 3.0, 30.0]),
    told=st.booleans(),
)
def test_every_place_on_the_wire_comes_back_and_every_call_is_answered(
    outcomes: list[str], tools: list[str], deadline: float, told: bool
) -> None:
    """Any mix of answers, failures, 503s and requests that hang, tools that read, leave
    a body open or raise, any deadline: every call is answered once, and no request is left counted
    on the wire (a lost place would hold a learned cap shut for good)."""

    async def main() -> None:
        served = iter(outcomes * 20)

        async def handler(request: httpx.Request) -> httpx.Response:
            return await _answer(next(served, "ok"))

        scope = Scope("api", rate=50, burst=5) if told else Scope("api")
        transport = httpx.MockTransport(handler)
        async with fanout.http_client(transport, base_url="http://api") as client:
            registry = Registry()

            @registry.tool(kind=Kind.READS, scopes=["api"], timeout=deadline)
            async def fetch(n: int, how: str) -> str:
                if how == "leave open":
                    response = await client.send(client.build_request("GET", f"/{n}"), stream=True)
                    return str(response.status_code)
                response = await client.get(f"/{n}")
                if how == "raise":
                    raise RuntimeError("the tool failed after its request")
                response.raise_for_status()
                return response.text

            runner = Runner(registry, scopes=[scope], inline_wait=None, turn_timeout=60)
            calls = [
                ToolCall(f"c{i}", "fetch", {"n": i, "how": how}) for i, how in enumerate(tools)
            ]
            turn = await runner.run_turn(calls)
        assert [r.tool_use_id for r in turn.results] == [call.id for call in calls]
        assert scope.statistics().on_the_wire == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
