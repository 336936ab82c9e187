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

import logging
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._answers import failure
from ._budget import Budget, Verdict
from ._call import describe, let_the_deadline_answer
from ._canonical import shown
from ._events import EventDetail, EventKind
from ._going_up import split_going_up
from ._idempotency import Claim, ClaimState, StoredAnswer
from ._logs import log_failure
from ._output import cut_again
from ._redact import scrubbed
from ._values import Kind, Status, ToolResult

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._call import CallPlan, CallState
    from ._events import Recorder
    from ._run import Run

__all__ = [
    "cached_answer",
    "claim",
    "hold_claim",
    "join_flight",
    "remember",
    "settle",
    "settle_when_ended",
]

_POLL_FIRST, _POLL_MAX = 0.05, 1.0  # seconds between looks at a key another call holds
_STORE_TIMEOUT = 1.0  # the longest a store may take to settle a claim, within the deadline
STORE_SCOPE = "idempotency store"  # the scope named by answers the store decided

_log = logging.getLogger("fanout")


def join_flight(
    leaders: dict[tuple[str, str], CallState], state: CallState, recorder: Recorder
) -> CallState | None:
    """Single-flight: the earlier identical call that answers ``state``, or None.

    The first call of each key leads; a later identical one becomes its
    follower and is answered with its answer (at once, if it already has
    one: in a streaming turn the leader may have finished before its
    repeat arrived). Repeatable tools never coalesce.
    """
    plan = state.plan
    assert plan.spec is not None
    if plan.spec.repeatable:
        return None
    # One turn is one run: the tool and the arguments' spelling say what the key would.
    leader = leaders.setdefault((plan.call.name, plan.arguments_key), state)
    if leader is state:
        return None
    if leader.followers is None:
        leader.followers = []
    leader.followers.append(state)
    kind = EventKind.REPLAYED if plan.spec.kind is Kind.MUTATING else EventKind.COALESCED
    recorder.emit(
        kind, call_id=plan.call.id, tool=plan.call.name, detail=EventDetail(leader=leader.call.id)
    )
    return leader


def shared(result: ToolResult, follower: CallState) -> ToolResult:
    """The leader's answer, addressed to a follower's id."""
    return attrs.evolve(result, tool_use_id=follower.call.id)


def _cacheable(plan: CallPlan) -> bool:
    spec = plan.spec
    assert spec is not None
    return spec.cache_ttl is not None and not spec.repeatable and spec.kind is not Kind.MUTATING


def cached_answer(run: Run, plan: CallPlan, recorder: Recorder, *, limit: int) -> ToolResult | None:
    """A fresh cached answer for a cacheable read, or None; within ``limit`` characters."""
    if not _cacheable(plan):
        return None
    content = run.cache.get(plan.idempotency_key)
    if content is None:
        return None
    recorder.emit(EventKind.CACHE_HIT, call_id=plan.call.id, tool=plan.call.name)
    return kept_answer(plan, Status.OK, content, limit)


def kept_answer(plan: CallPlan, status: Status, content: str, limit: int) -> ToolResult:
    """An answer the run kept, for ``plan``'s call, cut to ``limit`` as a fresh one is.

    A run outlives the runner that kept the answer: a runner with a smaller
    ``max_output_chars`` handed the model all of it. Only ok answers are cut,
    as fresh ones are (a tool's own error is short already).
    """
    if status is Status.OK:
        content = cut_again(content, limit)
    return ToolResult(plan.call.id, status, content)


def remember(
    run: Run, plan: CallPlan, result: ToolResult, secrets: set[str], *, since: int
) -> None:
    """Cache an ok answer of a cacheable read, scrubbed: a hit has no secrets to scrub with;
    unless a write dropped its tool's answers after ``since`` (`ReadCache.stamp`)."""
    if _cacheable(plan) and result.status is Status.OK:
        assert plan.spec is not None
        assert plan.spec.cache_ttl is not None
        content = scrubbed(result, secrets).content
        cache = run.cache
        cache.put(plan.idempotency_key, plan.spec.name, content, plan.spec.cache_ttl, since=since)


def invalidate_for(run: Run, plan: CallPlan) -> None:
    """A write is about to run: drop the cached reads it may make stale."""
    if plan.kind is Kind.MUTATING:
        assert plan.spec is not None
        run.cache.invalidate(plan.spec.invalidates)


def is_idempotent_write(plan: CallPlan) -> bool:
    spec = plan.spec
    return spec is not None and spec.kind is Kind.MUTATING and not spec.repeatable


async def claim(
    run: Run, state: CallState, budget: Budget, recorder: Recorder, *, limit: int
) -> ToolResult | None:
    """Claim a write's key: None to run it (the claim is now ours), or the answer instead
    (a replay within ``limit`` characters).

    While another call holds the key, look again with growing pauses until
    it is answered (replay) or released (ours now), for as long as the
    budget allows the wait. A store that fails refuses the write (a write
    whose key cannot be checked is not run); one that does not answer within
    the budget times it out.
    """
    plan = state.plan
    call = plan.call
    pause, waited = _POLL_FIRST, 0.0
    while True:
        outcome = await _ask_store(run, plan, budget)
        if isinstance(outcome, ToolResult):
            return outcome
        if outcome.state is ClaimState.NEW:
            state.claimed = True
            return None
        if outcome.state is ClaimState.DONE and outcome.answer is not None:
            recorder.emit(
                EventKind.REPLAYED, call_id=call.id, tool=call.name,
                detail=EventDetail({"from": STORE_SCOPE}),
            )  # fmt: skip
            return kept_answer(plan, outcome.answer.status, outcome.answer.content, limit)
        # The whole wait for another holder counts against the inline threshold.
        verdict = budget.judge(pause)
        if verdict is Verdict.SLEEP and budget.inline_wait is not None:
            verdict = Verdict.TOO_LONG if waited + pause > budget.inline_wait else verdict
        if verdict is not Verdict.SLEEP:
            return _still_running(plan, verdict, waited)
        await trio.sleep(pause)
        waited += pause
        pause = min(pause * 2, _POLL_MAX)


async def _ask_store(run: Run, plan: CallPlan, budget: Budget) -> Claim | ToolResult:
    """One claim, bounded by the budget; a failure or a silence is the write's answer."""
    call = plan.call
    try:
        with trio.move_on_at(budget.deadline):
            claimed = await run.store.claim(plan.idempotency_key, lease=run.claim_lease)
            if not isinstance(claimed, Claim) or not isinstance(claimed.state, ClaimState):
                # A store of one's own answering what no store should (None, a dict): a
                # store that fails, not fanout failing.
                raise TypeError(f"its claim answered {shown(claimed)}, not a Claim")
            return claimed
    except BaseException as exc:
        # Anything the store raises (a ``SystemExit``, a ``Cancelled`` it kept) fails
        # this write, not its siblings (`split_going_up`).
        cancelled, failed = split_going_up(exc)
        if failed is None:
            raise
        if cancelled is not None:
            raise cancelled from None
        return failure(
            call, Status.REFUSED,
            f"the idempotency store failed ({describe(failed)}); a write whose key cannot be "
            "checked is not run",
            started=False, kind=plan.kind, scope=STORE_SCOPE,
            hint="the write was not run; re-issue it once the store is back",
        )  # fmt: skip
    await let_the_deadline_answer()
    return failure(
        call, Status.TIMED_OUT,
        "the idempotency store did not answer before the call's deadline; the write was not run",
        started=False, kind=plan.kind, scope=STORE_SCOPE,
    )  # fmt: skip


def _still_running(plan: CallPlan, verdict: Verdict, waited: float) -> ToolResult:
    running = "an identical call of this run is still running elsewhere"
    if verdict is Verdict.TOO_LONG:
        return failure(
            plan.call, Status.RATE_LIMITED,
            f"{running}; this one waited {waited:.3f}s for its answer, as long as fanout "
            "waits inline, and was not run",
            started=False, kind=plan.kind, retry_after=_POLL_MAX,
            hint="re-issue the same call later: it is answered from the other call's result",
        )  # fmt: skip
    return failure(
        plan.call, Status.TIMED_OUT,
        f"{running}; this one waited for its answer until its deadline and was not run",
        started=False, kind=plan.kind,
    )  # fmt: skip


async def hold_claim(run: Run, key: str) -> None:
    """Renew a write's claim while it runs, every third of its lease, until cancelled.

    A renewal that fails is logged and tried again at the next turn of the
    loop: the lease's length is the margin for a store that blips.
    """
    while True:
        await trio.sleep(run.claim_lease / 3)
        try:
            with trio.move_on_after(run.claim_lease / 3):
                if not await run.store.renew(key, lease=run.claim_lease):
                    _log.warning("fanout: the claim on a write's key lapsed while it ran")
        except BaseException as exc:
            # A store's own ``BaseException`` (a ``Cancelled`` it kept) must not cut off
            # the write it renews for: that write ran on, answered as fanout's failure.
            if split_going_up(exc)[0] is not None:
                raise
            log_failure(
                _log, "fanout: renewing a write's claim failed", exc=exc, level=logging.WARNING
            )


async def settle_when_ended(run: Run, state: CallState, late: Callable[[Any], ToolResult]) -> None:
    """Settle a claimed write once its work has ended, however long after its answer.

    A write cut off by its deadline may go on: a sync tool's thread left to
    finish, a commit it shielded. Its claim is held meanwhile (a re-issue of
    the same call waits for it rather than run beside it), and what it
    returned in the end is what is kept (``late`` makes it an answer, from a
    thread's return value): released as the deadline passed, the claim let
    each re-issue run the write again, three times where it took effect once;
    bounded by the deadline, a store that awaits before recording (Redis)
    never kept an answer that came after it. Recording is bounded by the
    store's own timeout from when the work ended. Runs as trio's system task,
    outside the turn, which has answered and need not wait.
    """
    key = state.plan.idempotency_key
    async with trio.open_nursery() as holding:
        holding.start_soon(hold_claim, run, key)
        await state.work_ended()
        holding.cancel_scope.cancel()
    if state.own_answer is None and state.thread_returned is not None:
        state.own_answer = late(state.thread_returned[0])
    await settle(run, state, Budget(deadline=trio.current_time() + _STORE_TIMEOUT))


async def settle(run: Run, state: CallState, budget: Budget) -> None:
    """Record a claimed write's answer, or release the claim when its effect is unknown.

    Only answers the tool itself gave are kept (ok, or its own error); a
    write that was cut off or throttled may be re-issued and run again.
    Runs from a ``finally``, so it is shielded, and bounded by the call's
    deadline as every wait is: past it, a claim left behind lapses with its
    lease, and a re-issue runs again with the same key downstream. A store
    that fails is logged, never raised.
    """
    own = state.own_answer
    key = state.plan.idempotency_key
    with trio.CancelScope(shield=True, deadline=budget.bound(_STORE_TIMEOUT)) as bounded:
        try:
            if own is not None:
                own = scrubbed(own, state.secrets)
                answer = StoredAnswer(own.status, own.content)
                await run.store.finish(key, answer, ttl=run.idempotency_ttl)
            else:
                await run.store.abandon(key)
        except BaseException as exc:
            # A store that raises anything (a ``SystemExit``, a ``Cancelled`` it kept)
            # fails this write's settling, never a sibling (raised on, it crashed the
            # turn's nursery, and a sibling write was answered "the caller cancelled").
            if split_going_up(exc)[0] is not None:
                raise
            log_failure(
                _log, "fanout: the idempotency store failed to settle a write", exc=exc,
                level=logging.WARNING,
            )  # fmt: skip
    if bounded.cancelled_caught:
        _log.warning("fanout: the idempotency store did not settle a write before its deadline")
