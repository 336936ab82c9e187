"""Admission's promise 2 at a full scope: a slot wait ends at the budget, and the call says why.

Each call waits for a slot only as long as its budget allows: the inline
threshold (``rate_limited``, with a drain estimate to retry after) or, when
it is patient, its own deadline (``timed_out``); either way it was never
sent. Times are exact, on the mock clock.
"""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from fanout import Kind, Registry, Runner, Scope, Status, ToolCall


def _registry(started: list[tuple[str, float]]) -> Registry:
    registry = Registry()

    @registry.tool(kind=Kind.READS, scopes=["api"], timeout=2)
    async def hold(name: str, seconds: float) -> str:
        started.append((name, trio.current_time()))
        await trio.sleep(seconds)
        return name

    return registry


def _calls() -> list[ToolCall]:
    return [
        ToolCall("first", "hold", {"name": "first", "seconds": 1.5}),
        ToolCall("second", "hold", {"name": "second", "seconds": 0}),
    ]


async def test_a_slot_wait_past_the_inline_threshold_is_answered_rate_limited(
    autojump_clock: Any,
) -> None:
    """One slot, held 1.5 s: the second call waits 0.5 s (the inline threshold), is answered
    rate_limited with a time to retry, and never starts."""
    started: list[tuple[str, float]] = []
    scope = Scope("api", max_concurrency=1, learn=False)
    runner = Runner(_registry(started), scopes=[scope], inline_wait=0.5)
    turn = await runner.run_turn(_calls())
    first, second = turn.results
    assert first.status is Status.OK
    assert (second.status, second.scope) == (Status.RATE_LIMITED, "api")
    assert second.retry_after_ms is not None
    body = json.loads(second.content)
    assert body["message"] == "no slot on scope 'api' came free within 0.5s; the call was not sent"
    assert body["started"] is False
    answered = {e.call_id: e.time for e in turn.trace if e.kind.value == "answered"}
    assert answered == {"second": 0.5, "first": 1.5}
    assert started == [("first", 0.0)]
    assert scope.statistics().in_flight == 0


async def test_a_patient_call_waits_for_the_slot_within_its_deadline(autojump_clock: Any) -> None:
    """inline_wait=None: the second call waits for the slot (up to its own 2 s deadline); the
    first frees it at 1.5 s, and the second starts then."""
    started: list[tuple[str, float]] = []
    scope = Scope("api", max_concurrency=1, learn=False)
    runner = Runner(_registry(started), scopes=[scope], inline_wait=None)
    turn = await runner.run_turn(_calls())
    assert [r.status for r in turn.results] == [Status.OK, Status.OK]
    assert started == [("first", 0.0), ("second", 1.5)]


def test_a_slot_wait_cut_by_the_deadline_has_one_answer_on_every_run() -> None:
    """The slot wait and the turn's deadline watcher wake at the same instant, in an order trio
    picks at random: the answer is the deadline's, the same on every run, in either nursery."""

    async def play(hosted: bool) -> tuple[str, ...]:
        started: list[tuple[str, float]] = []
        scope = Scope("api", max_concurrency=1, learn=False)
        runner = Runner(_registry(started), scopes=[scope], inline_wait=None)
        calls = [ToolCall("first", "hold", {"name": "first", "seconds": 3}), _calls()[1]]
        if hosted:
            async with runner:
                turn = await runner.run_turn(calls)
        else:
            turn = await runner.run_turn(calls)
        assert started == [("first", 0.0)]
        return tuple(result.content for result in turn.results)

    answers = {
        trio.run(play, hosted, clock=trio.testing.MockClock(autojump_threshold=0))
        for hosted in (False, True)
        for _ in range(12)
    }
    assert len(answers) == 1
    (first, second) = (json.loads(content) for content in answers.pop())
    assert first["status"] == second["status"] == "timed_out"
    assert (second["message"], second["started"]) == ("the call's own timeout of 2s passed", False)
