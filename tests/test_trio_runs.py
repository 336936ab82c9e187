"""A runner, its scopes and a Run kept across trio.run calls: each run on its own clock.

Each test runs twice, the first run's clock at 100,000 s (or the second's
past the first's expiries), as a runner built at import serves a notebook's
``trio.run`` per question. Nothing of the first clock may be waited for in
the second.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from fanout import Kind, RateLimitedError, Registry, Run, Runner, Scope, Status, ToolCall
from fanout.idempotency import idempotency_key
from fanout.redis import RedisScope
from tests.redis_support import shared_redis_url, unique_prefix

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from fanout import ToolResult

_LATE = 100_000.0  # seconds: where the first run's clock is when it uses the runner


def _in_two_runs(
    first: Callable[[], Awaitable[object]], second: Callable[[], Awaitable[Any]]
) -> Any:
    """Run ``first``, then ``second`` in a new trio.run, each on a mock clock from 0."""
    trio.run(first, clock=trio.testing.MockClock(autojump_threshold=0))
    return trio.run(second, clock=trio.testing.MockClock(autojump_threshold=0))


def _calls(tool: str, count: int) -> list[ToolCall]:
    return [ToolCall(f"c{i}", tool, {"n": i}) for i in range(count)]


def _looking(starts: list[float]) -> Registry:
    """A read on the scope "api" that notes when each call started."""
    registry = Registry()

    @registry.tool(kind=Kind.READS, scopes=["api"])
    async def look(n: int) -> str:
        starts.append(trio.current_time())
        return f"seen {n}"

    return registry


def _late_then(runner: Runner, calls: int) -> Callable[[], Awaitable[None]]:
    """A first run that uses ``runner`` once its clock is at 100,000 s."""

    async def first() -> None:
        await trio.sleep(_LATE)
        await runner.run_turn(_calls("look", calls))

    return first


def _answered(runner: Runner, calls: int) -> Callable[[], Awaitable[tuple[ToolResult, ...]]]:
    async def second() -> tuple[ToolResult, ...]:
        return (await runner.run_turn(_calls("look", calls))).results

    return second


@pytest.mark.parametrize(
    ("told", "second_starts"),
    [
        # A bucket's calls go out at its rate from the new run's 0.
        ({"rate": 1, "burst": 1}, [0.0, 1.0]),
        # A window's log starts empty; a scope told limit/per, which it reads as a rate
        # and burst, is made again from what it was told.
        ({"limit": 2, "per": 10}, [0.0, 0.0]),
    ],
)
def test_a_told_scope_starts_afresh_in_a_new_run(
    told: dict[str, float], second_starts: list[float]
) -> None:
    """A scope read at 100,000 s in one run paces the next run's calls from its own 0
    (they were answered rate_limited, a wait of 28 hours)."""
    starts: list[float] = []
    runner = Runner(_looking(starts), scopes=[Scope("api", **told)])
    results = _in_two_runs(_late_then(runner, 2), _answered(runner, 2))
    assert [r.status for r in results] == [Status.OK, Status.OK]
    assert starts[2:] == second_starts


def test_what_a_learning_scope_was_told_in_one_run_holds_nothing_in_the_next() -> None:
    """A learning scope refused at 100,000 s (a 429 asking 5 s) lets the next run's call
    out at once, not at 100,005 s."""
    starts: list[float] = []
    registry = Registry()

    @registry.tool(kind=Kind.READS, scopes=["api"])
    async def look(n: int) -> str:
        starts.append(trio.current_time())
        if len(starts) == 1:
            raise RateLimitedError(retry_after=5.0)
        return f"seen {n}"

    runner = Runner(registry, scopes=[Scope("api")])
    results = _in_two_runs(_late_then(runner, 1), _answered(runner, 1))
    assert [r.status for r in results] == [Status.OK]
    assert starts[0] == _LATE
    assert starts[-1] == 0.0


def test_a_read_cached_in_one_run_is_read_again_in_the_next() -> None:
    """A Run's cached answer expires on the clock it was cached on: the next run reads
    again (on the new clock, an answer cached at 100,000 s for 60 s was fresh for a day)."""
    reads: list[float] = []
    registry = Registry()

    @registry.tool(kind=Kind.READS, cache_ttl=60)
    async def price(n: int) -> str:
        reads.append(trio.current_time())
        return f"price {len(reads)}"

    runner, run = Runner(registry), Run()

    async def first() -> None:
        await trio.sleep(_LATE)
        await runner.run_turn(_calls("price", 1), run=run)

    async def second() -> tuple[ToolResult, ...]:
        return (await runner.run_turn(_calls("price", 1), run=run)).results

    results = _in_two_runs(first, second)
    assert [r.content for r in results] == ["price 2"]
    assert reads == [_LATE, 0.0]


def _sending(sent: list[float]) -> Registry:
    registry = Registry()

    @registry.tool(kind=Kind.MUTATING)
    async def send(n: int) -> str:
        sent.append(trio.current_time())
        return f"sent {n}"

    return registry


def test_a_write_answered_in_one_run_is_replayed_in_the_next() -> None:
    """A Run's stored answer outlives its run's clock: asked again in a run whose clock
    is past the answer's TTL as the first counted it, the write is replayed, not sent again."""
    sent: list[float] = []
    runner, run = Runner(_sending(sent)), Run()

    async def first() -> None:
        await runner.run_turn(_calls("send", 1), run=run)

    async def second() -> tuple[ToolResult, ...]:
        await trio.sleep(run.idempotency_ttl + _LATE)
        return (await runner.run_turn(_calls("send", 1), run=run)).results

    results = _in_two_runs(first, second)
    assert [(r.status, r.content) for r in results] == [(Status.OK, "sent 0")]
    assert sent == [0.0]


def test_a_claim_whose_holder_ended_with_its_run_lapses_in_the_next() -> None:
    """A write's claim taken at 100,000 s by a holder that never finished (its run ended)
    does not hold the same write in the next run: it runs at once."""
    sent: list[float] = []
    runner, run = Runner(_sending(sent)), Run()

    async def first() -> None:
        await trio.sleep(_LATE)
        await run.store.claim(idempotency_key(run.run_id, "send", {"n": 0}), lease=6.0)

    async def second() -> tuple[ToolResult, ...]:
        return (await runner.run_turn(_calls("send", 1), run=run)).results

    results = _in_two_runs(first, second)
    assert [r.status for r in results] == [Status.OK]
    assert sent == [0.0]


def test_a_scope_shared_by_two_runners_is_made_afresh_once_a_run() -> None:
    """The first runner to run a turn in a new run makes the shared scope afresh; the other
    finds it of this run and keeps what the first spent (its call waits for the next token)."""
    starts: list[float] = []
    shared = Scope("api", rate=1, burst=1)
    one, other = (Runner(_looking(starts), scopes=[shared]) for _ in range(2))

    async def first() -> None:
        await trio.sleep(_LATE)
        await one.run_turn(_calls("look", 1))
        await other.run_turn(_calls("look", 1))

    async def second() -> tuple[ToolResult, ...]:
        await other.run_turn(_calls("look", 1))
        return (await one.run_turn(_calls("look", 1))).results

    results = _in_two_runs(first, second)
    assert [r.status for r in results] == [Status.OK]
    assert starts == [_LATE, _LATE + 1.0, 0.0, 1.0]


def test_a_thread_abandoned_in_one_run_holds_no_place_in_the_next() -> None:
    """A sync tool left running past its run's deadline kept its place among max_threads
    for good (trio gives it back to the run it began in); the next run has them all.
    (On the real clock: a mock clock jumps to the deadline while a thread works.)"""
    release = threading.Event()
    registry = Registry()

    @registry.tool(kind=Kind.READS, timeout=None)
    def stuck(n: int) -> str:
        if n == 0:
            release.wait(10)
        return f"done {n}"

    runner = Runner(registry, max_threads=1)

    async def first() -> None:
        await runner.run_turn([ToolCall("c0", "stuck", {"n": 0})], timeout=0.05)

    async def second() -> tuple[ToolResult, ...]:
        return (await runner.run_turn([ToolCall("c1", "stuck", {"n": 1})], timeout=5)).results

    try:
        trio.run(first)
        results = trio.run(second)
    finally:
        release.set()
    assert [(r.status, r.content) for r in results] == [(Status.OK, "done 1")]


@pytest.mark.redis
def test_a_redis_scope_entered_again_in_a_new_run_starts_afresh() -> None:
    """A RedisScope (its own client) entered in one run at 100,000 s and again in the next
    serves the next run's calls at once: what it kept here on trio's clock is made again."""
    starts: list[float] = []
    with shared_redis_url() as url:
        scope = RedisScope.from_url(url, name="api", prefix=unique_prefix(), rate=10, burst=2)
        runner = Runner(_looking(starts), scopes=[scope])

        async def first() -> None:
            clock.jump(_LATE)
            async with scope:
                await runner.run_turn(_calls("look", 2))

        async def second() -> tuple[ToolResult, ...]:
            async with scope:
                return (await runner.run_turn(_calls("look", 2))).results

        clock = trio.testing.MockClock(rate=1)
        trio.run(first, clock=clock)
        results = trio.run(second, clock=trio.testing.MockClock(rate=1))
    assert [r.status for r in results] == [Status.OK, Status.OK]
    assert max(starts[2:]) < 1.0
