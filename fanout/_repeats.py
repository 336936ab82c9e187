"""Repeats: the cheapest request is the one never sent.

Three mechanisms, each keyed by the call's idempotency key (run id, tool and
canonical arguments, so key order and whitespace do not matter):

* **Single-flight**, within one turn: identical calls run once and every id
  gets the shared answer. For reads that is coalescing; for writes it is
  the same write asked for twice, so it takes effect once (and the second
  is not refused as "another write").
* **The read cache**, across a run's turns: a tool with ``cache_ttl``
  answers a fresh repeat from the cache. Any mutating call that starts drops
  the entries of the tools it ``invalidates`` (all, by default:
  correctness over savings).
* **Idempotency**, across turns and processes: a write claims its key in the
  run's store before running. A key already answered is replayed, not run;
  a key another call holds right now is waited for (within the budget).

A tool declared ``repeatable`` (a die roll) takes part in none of this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

from ._answers import failure
from ._events import EventKind
from ._idempotency import ClaimState, StoredAnswer
from ._redact import scrubbed
from ._values import Kind, Status, ToolResult

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._budget import Budget
    from ._call import CallState
    from ._events import Recorder
    from ._run import Run

__all__ = ["cached_answer", "claim", "remember", "settle", "single_flight"]

_POLL_FIRST, _POLL_MAX = 0.05, 1.0  # seconds between looks at a key another call holds
_STORE_TIMEOUT = 1.0  # the longest a store may take to settle a claim under cancellation


def single_flight(states: Sequence[CallState], recorder: Recorder) -> list[CallState]:
    """Group identical calls under the first; return the leaders, which alone run."""
    leaders: dict[str, CallState] = {}
    for state in states:
        assert state.spec is not None
        if state.spec.repeatable:
            continue
        leader = leaders.setdefault(state.idempotency_key, state)
        if leader is not state:
            state.leader = leader
            leader.followers.append(state)
            kind = EventKind.REPLAYED if state.spec.kind is Kind.MUTATING else EventKind.COALESCED
            recorder.emit(
                kind, call_id=state.call.id, tool=state.call.name, detail={"leader": leader.call.id}
            )
    return [state for state in states if state.leader is None]


def shared(result: ToolResult, follower: CallState) -> ToolResult:
    """The leader's answer, addressed to a follower's id."""
    return attrs.evolve(result, tool_use_id=follower.call.id)


def cached_answer(run: Run, state: CallState, recorder: Recorder) -> ToolResult | None:
    """A fresh cached answer for a cacheable read, or None."""
    spec = state.spec
    assert spec is not None
    if spec.cache_ttl is None or spec.repeatable or spec.kind is Kind.MUTATING:
        return None
    content = run.cache.get(state.idempotency_key)
    if content is None:
        return None
    recorder.emit(EventKind.CACHE_HIT, call_id=state.call.id, tool=state.call.name)
    return ToolResult(state.call.id, Status.OK, content)


def remember(run: Run, state: CallState, result: ToolResult) -> None:
    """Cache an ok answer of a cacheable read, scrubbed: a hit has no secrets to scrub with."""
    spec = state.spec
    assert spec is not None
    cacheable = (
        spec.cache_ttl is not None and not spec.repeatable and spec.kind is not Kind.MUTATING
    )
    if cacheable and result.status is Status.OK:
        assert spec.cache_ttl is not None
        content = scrubbed(result, state.secrets).content
        run.cache.put(state.idempotency_key, spec.name, content, spec.cache_ttl)


def invalidate_for(run: Run, state: CallState) -> None:
    """A write is about to run: drop the cached reads it may make stale."""
    spec = state.spec
    assert spec is not None
    if spec.kind is Kind.MUTATING:
        run.cache.invalidate(spec.invalidates)


def is_idempotent_write(state: CallState) -> bool:
    spec = state.spec
    return spec is not None and spec.kind is Kind.MUTATING and not spec.repeatable


async def claim(
    run: Run, state: CallState, budget: Budget, recorder: Recorder
) -> ToolResult | None:
    """Claim a write's key: None to run it, or the answer to give instead.

    While another call holds the key, look again with growing pauses until
    it is answered (replay) or released (ours now), within the budget.
    """
    pause = _POLL_FIRST
    while True:
        outcome = await run.store.claim(state.idempotency_key, ttl=run.idempotency_ttl)
        if outcome.state is ClaimState.NEW:
            return None
        if outcome.state is ClaimState.DONE:
            assert outcome.answer is not None
            recorder.emit(
                EventKind.REPLAYED, call_id=state.call.id, tool=state.call.name,
                detail={"from": "idempotency store"},
            )  # fmt: skip
            return ToolResult(state.call.id, outcome.answer.status, outcome.answer.content)
        if not budget.fits(pause):
            assert state.spec is not None
            return failure(
                state.call, Status.TIMED_OUT,
                "an identical call of this run is still running elsewhere; this one waited "
                "for its answer until its deadline and was not run",
                started=False, kind=state.spec.kind,
            )  # fmt: skip
        await trio.sleep(pause)
        pause = min(pause * 2, _POLL_MAX)


async def settle(run: Run, state: CallState) -> None:
    """Record a claimed write's answer, or release the claim when its effect is unknown.

    Only answers the tool itself gave are kept (ok, or its own error); a
    write that was cut off or throttled may be re-issued and run again.
    Runs from a ``finally``, so it is shielded, with a short bound of its own.
    """
    result = state.result
    with trio.CancelScope(shield=True), trio.move_on_after(_STORE_TIMEOUT):
        if result is not None and state.answered_by_tool:
            answer = StoredAnswer(result.status, result.content)
            await run.store.finish(state.idempotency_key, answer, ttl=run.idempotency_ttl)
        else:
            await run.store.abandon(state.idempotency_key)
