"""A stated policy (``RateLimit-Policy: q;w``) is where learning starts, and its counts
can show it understates the rate: a bucket full again in under a second states ``w=1``.

Against the real throttling server on 127.0.0.1 on trio's mock clock (every start time
and request count exact), and `fanout._stated_policy` alone against windows generated
with every phase, order of arrival and way of counting.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fanout import Kind, Registry, Runner, Scope, Status, ToolCall
from fanout._learning import TOGETHER
from fanout._stated_policy import StatedPolicy
from fanout.testing import ServerConfig
from tests.buckets import counts_on_arrival
from tests.test_learning_no_numbers import api, learn

if TYPE_CHECKING:
    import fanout
    from fanout.testing import ThrottlingServer


def makespan(server: ThrottlingServer) -> float:
    return max(r.end for r in server.records)


def ok(turn: fanout.Turn) -> int:
    return sum(r.status is Status.OK for r in turn.results)


async def test_a_bucket_stating_a_whole_second_is_learned_past_its_policy(
    autojump_clock: Any,
) -> None:
    """The issue's medium row with a burst of 4 (10/s, a cap of 4, 400 ms): the server
    states ``q=4;w=1``. Taken as a ceiling, 4/s: 7.35 s, 1.84 times the fastest (4.0 s).
    Its counts (3 left at every answer, a pace apart) fit no window of 4 a second: 4.65 s,
    as where it states no window, and no 429."""
    config = ServerConfig(rate=10, burst=4, max_in_flight=4, latency=0.4)
    server, turn = await learn(config, 40)
    assert ok(turn) == 40
    assert server.count(status=429) == 0
    assert makespan(server) <= 1.2 * 4.0


async def test_a_policy_that_understates_lets_deadline_calls_wait_for_the_rate(
    autojump_clock: Any,
) -> None:
    """Issue 13's deadline row (30 calls, 10/s, burst 5, 200 ms, 2 s each), the server
    stating ``q=5;w=1``. Judged on 5/s at the first answer, 17 calls were answered
    ``rate_limited`` and 13 ran; a policy a whole second may hide twice its rate in is
    a floor the calls wait on, its counts refute it at 0.8 s: 22 ok (of 23 that can
    finish; told the limits, 22), no 429, none answered late."""
    config = ServerConfig(rate=10, burst=5, latency=0.2)
    async with api(config) as (server, client):
        registry = Registry()

        @registry.tool(kind=Kind.READS, scopes=["key"], timeout=2.0)
        async def fetch(n: int) -> str:
            (await client.get(f"/items/{n}")).raise_for_status()
            return f"item {n}"

        runner = Runner(registry, scopes=[Scope("key")], inline_wait=None, rng=random.Random(0))
        turn = await runner.run_turn([ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(30)])
    assert ok(turn) == 22
    assert server.count(status=429) == 0
    assert makespan(server) <= 2.0


@pytest.mark.parametrize(
    ("model", "rate", "burst", "phase", "at_answer"),
    [
        *[("fixed", 10, 10, phase, False) for phase in (0.0, 0.3, 0.7)],
        ("fixed", 10, 10, 0.3, True),
        ("fixed", 20, 20, 0.7, False),
        ("fixed", 4, 8, 0.3, True),
        ("fixed", 3, 6, 0.7, False),
        ("sliding", 10, 10, 0.0, False),
        ("sliding", 20, 20, 0.0, False),
        ("sliding", 5, 5, 0.0, True),
    ],
)
async def test_a_window_that_counts_as_its_policy_says_stays_its_ceiling(
    autojump_clock: Any, model: Any, rate: float, burst: int, phase: float, at_answer: bool
) -> None:
    """A window of ``q`` per ``w`` that states ``q;w`` (fixed at any phase, or sliding;
    counting as requests arrive or as it answers): its counts never refute its policy,
    which stays the scope's ceiling, and it draws one 429, as before."""
    config = ServerConfig(
        rate=rate, burst=burst, latency=0.05, model=model, window_phase=phase,
        state_at_answer=at_answer,
    )  # fmt: skip
    scope = Scope("key")
    server, turn = await learn(config, 40, scope)
    assert ok(turn) == 40
    assert server.count(status=429) <= 1
    assert scope._learner is not None
    assert scope._learner.ceiling == rate


def _feed(policy: StatedPolicy, answers: list[tuple[float, float, float, float]], **kw: Any) -> int:
    """Feed ``answers`` (sent, counted by, read, remaining) in the order read; how many
    were fed when the policy was refuted (0: never)."""
    limit, window, together = kw["limit"], kw["window"], kw["together"]
    for fed, (sent, counted_by, _, remaining) in enumerate(sorted(answers, key=lambda a: a[2])):
        if policy.refuted(
            limit, window, remaining, sent=sent, counted_by=counted_by, together=together,
            on_arrival=kw.get("on_arrival", True),
        ):  # fmt: skip
            return fed + 1
    return 0


def test_a_bucket_paced_at_its_policy_below_its_refill_refutes_it_in_three_answers() -> None:
    """A bucket of 5 at 10/s states ``q=5;w=1``; paced at 5/s it is full as each request
    arrives (4 left at each), each the first of its window: the second and third answers
    need a window's edge each in the 0.4 s since the first, where edges are a second
    apart."""
    sent = [k * 0.2 for k in range(8)]
    counts = counts_on_arrival(sent, 10.0, 5.0, 5.0)
    answers = [(s, s + TOGETHER, s + 0.05, counts[k]) for k, s in enumerate(sent)]
    assert _feed(StatedPolicy(), answers, limit=5.0, window=1.0, together=TOGETHER) == 3


def _window_counts(
    arrivals: list[float], limit: int, window: float, phase: float, *, sliding: bool
) -> tuple[list[bool], Any]:
    """Which of ``arrivals`` (sorted) a window of ``limit`` per ``window`` admits, and what
    it holds at any time (its count then)."""
    admitted: list[float] = []

    def count(t: float) -> int:
        if sliding:
            return sum(1 for a in admitted if t - window < a <= t)
        start = phase + math.floor((t - phase) / window) * window
        return sum(1 for a in admitted if start <= a <= t)

    taken = []
    for a in arrivals:
        ok = count(a) < limit
        if ok:
            admitted.append(a)
        taken.append(ok)
    return taken, count


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    limit=st.integers(1, 12),
    window=st.sampled_from([1.0, 2.0, 3.0]),
    phase=st.floats(0.0, 3.0),
    sliding=st.booleans(),
    gaps=st.lists(st.floats(0.0, 0.6), min_size=2, max_size=40),
    spread=st.sampled_from([0.0, 0.002, 0.05]),
    delays=st.lists(st.floats(0.0, 1.0), min_size=40, max_size=40),
    latency=st.floats(0.01, 0.5),
    at_answer=st.booleans(),
    before=st.booleans(),
)
def test_a_window_of_its_policy_never_refutes_it(
    limit: int, window: float, phase: float, sliding: bool, gaps: list[float], spread: float,
    delays: list[float], latency: float, at_answer: bool, before: bool,
) -> None:  # fmt: skip
    """Whatever the requests, their order of arrival (up to ``spread`` apart), the phase
    of a fixed window, or the way the server counts (as each request arrives, after or
    before its token; or as it answers), no window of ``q`` per ``w`` refutes ``q;w``."""
    sent = [sum(gaps[: k + 1]) for k in range(len(gaps))]
    arrival = [s + spread * delays[k] for k, s in enumerate(sent)]
    order = sorted(range(len(sent)), key=lambda k: arrival[k])
    taken, count = _window_counts(
        [arrival[k] for k in order], limit, window, phase, sliding=sliding
    )
    answers = []
    for place, k in enumerate(order):
        if not taken[place]:
            continue
        answered = arrival[k] + latency
        held = count(answered) if at_answer else count(arrival[k]) - (1 if before else 0)
        counted_by = answered if at_answer else min(answered, sent[k] + 2 * spread + TOGETHER)
        answers.append((sent[k], counted_by, answered, float(limit - held)))
    fed = _feed(
        StatedPolicy(), answers, limit=float(limit), window=window,
        together=max(TOGETHER, spread), on_arrival=not at_answer,
    )  # fmt: skip
    assert fed == 0
