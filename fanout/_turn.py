"""A turn: one assistant message's calls, answered completely, whatever happens.

The turn owns a nursery under a hard deadline (a cancel scope). Phase one
runs every ``pure`` and ``reads`` call concurrently; phase two runs the
mutating calls by policy. Each call also has its own deadline. Whatever ends
a call early, its answer is written in a ``finally``, so ``Turn.results``
holds exactly one answer per call id, in the model's order, even when the
caller cancels the turn from outside (and ``Cancelled`` still propagates).
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Literal

import attrs
import trio

from ._answers import failure
from ._budget import Budget
from ._call import CallSettings, CallState, execute
from ._events import Event, EventKind, Recorder
from ._redact import scrubbed
from ._repeats import (
    cached_answer,
    claim,
    invalidate_for,
    is_idempotent_write,
    remember,
    settle,
    shared,
    single_flight,
)
from ._values import Kind, Status, ToolCall, ToolResult

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from ._registry import Registry
    from ._run import Run

__all__ = ["MutatingPolicy", "OnFailure", "Turn", "TurnCounts"]

MutatingPolicy = Literal["one", "serial", "parallel"]
OnFailure = Literal["continue", "cancel_siblings"]

# Outcomes that count as a failure for on_failure="cancel_siblings". A refusal
# is a decision fanout made, not a failure of the call.
_FAILURES = frozenset({Status.ERROR, Status.TIMED_OUT, Status.RATE_LIMITED, Status.QUOTA_EXHAUSTED})


@attrs.define
class TurnCounts:
    """The runner's tally of turns, kept by the turns themselves."""

    started: int = 0
    running: int = 0


class _Stage(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DONE = "done"


class Turn:
    """One turn's calls and their answers. Create it with ``Runner.turn``."""

    def __init__(
        self,
        states: Sequence[CallState],
        *,
        registry: Registry,
        timeout: float,
        run: Run,
        mutating: MutatingPolicy,
        on_failure: OnFailure,
        settings: CallSettings,
        recorder: Recorder,
        counts: TurnCounts,
    ) -> None:
        self._counts = counts
        self._states = list(states)
        self._registry = registry
        self._timeout = timeout
        self._run = run
        self._mutating = mutating
        self._on_failure = on_failure
        self._settings = settings
        self._recorder = recorder
        self._stage = _Stage.NEW
        self._deadline = math.inf  # set when the turn starts running
        self._failed: CallState | None = None
        self._siblings = trio.CancelScope()

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(state.call for state in self._states)

    @property
    def results(self) -> tuple[ToolResult, ...]:
        """One answer per call, in the model's order. Complete at every moment."""
        return tuple(
            state.result if state.result is not None else self._pending(state)
            for state in self._states
        )

    @property
    def trace(self) -> tuple[Event, ...]:
        """What happened, with times and reasons; never part of the transcript."""
        return tuple(self._recorder.trace or ())

    @property
    def deadline(self) -> float:
        return self._deadline

    async def run(self) -> None:
        """Run every call to its answer under the turn's hard deadline."""
        if self._stage is not _Stage.NEW:
            raise RuntimeError("a turn runs once; build a new one for the next message")
        self._stage = _Stage.RUNNING
        self._deadline = trio.current_time() + self._timeout
        self._counts.started += 1
        self._counts.running += 1
        self._recorder.emit(EventKind.TURN_STARTED, detail={"calls": len(self._states)})
        try:
            runnable = self._answer_without_running()
            with trio.CancelScope(deadline=self._deadline), self._siblings:
                writes = self._writes_allowed([c for c in runnable if _kind(c) is Kind.MUTATING])
                await self._phase(c for c in runnable if _kind(c) is not Kind.MUTATING)
                await self._mutating_phase(writes)
        finally:
            for state in self._states:
                if state.result is None:
                    self._answer(state, self._interrupted(state))
            self._stage = _Stage.DONE
            self._counts.running -= 1
            self._recorder.emit(EventKind.TURN_FINISHED, detail=_tally(self.results))

    # -- phases -------------------------------------------------------------

    def _answer_without_running(self) -> list[CallState]:
        """Answer what needs no run (unknown tool, broken arguments, repeats, cache hits).

        Returns the calls left to run: one per group of identical calls.
        """
        runnable = []
        for state in self._states:
            call = state.call
            self._recorder.emit(EventKind.QUEUED, call_id=call.id, tool=call.name)
            if state.spec is None:
                names = ", ".join(self._registry.names()) or "(none)"
                self._refuse(state, f"there is no tool named {call.name!r}; the tools are: {names}")
            elif not call.arguments_valid:
                self._answer(
                    state,
                    failure(
                        call, Status.ERROR,
                        "the arguments are not a JSON object; the call was not run",
                        started=False, kind=state.spec.kind,
                        hint="re-issue the call with arguments that are a valid JSON object",
                    ),
                )  # fmt: skip
            else:
                runnable.append(state)
        leaders = single_flight(runnable, self._recorder)
        for state in leaders:
            hit = cached_answer(self._run, state, self._recorder)
            if hit is not None:
                self._answer(state, hit)
        return [state for state in leaders if state.result is None]

    async def _phase(self, states: Iterable[CallState]) -> None:
        """Run ``states`` concurrently, admitting those with scopes in the model's order."""
        async with trio.open_nursery() as nursery:
            for state in states:
                if state.scopes:
                    await nursery.start(self._run_one, state)
                else:
                    nursery.start_soon(self._run_one, state)

    def _writes_allowed(self, writes: list[CallState]) -> list[CallState]:
        """Under policy ``one``, refuse every write but the first, before anything runs."""
        if self._mutating != "one" or len(writes) < 2:
            return writes
        first = writes[0]
        for state in writes[1:]:
            self._refuse(
                state,
                f"{state.call.name} was requested in the same turn as another write "
                f"({first.call.name}); it was not run. Re-request it alone if still needed",
            )
        return [first]

    async def _mutating_phase(self, writes: list[CallState]) -> None:
        if self._mutating == "parallel":
            await self._phase(writes)
        else:
            for state in writes:
                await self._run_one(state)

    async def _run_one(
        self, state: CallState, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        assert state.spec is not None
        budget = Budget.starting_now(
            state.spec.timeout,
            turn_deadline=self._deadline,
            inline_wait=self._settings.inline_wait,
        )
        signalled = False

        def queued() -> None:
            nonlocal signalled
            if not signalled:
                signalled = True
                task_status.started()

        state.queued = queued
        try:
            if budget.deadline < self._deadline:
                with trio.move_on_at(budget.deadline) as own_deadline:
                    await self._execute(state, budget)
                if own_deadline.cancelled_caught and state.result is None:
                    self._answer(state, self._timed_out(state, budget))
            else:
                # The turn's deadline is this call's: its scope is enough.
                await self._execute(state, budget)
        finally:
            if state.result is None:
                self._answer(state, self._interrupted(state))
            queued()
            if state.claimed:
                await settle(self._run, state)

    async def _execute(self, state: CallState, budget: Budget) -> None:
        """Answer one call: a replay of a write already done, or a run of it."""
        if is_idempotent_write(state):
            invalidate_for(self._run, state)
            replay = await claim(self._run, state, budget, self._recorder)
            if replay is not None:
                self._answer(state, replay)
                return
            state.claimed = True
        result = await execute(
            state, budget=budget, run_id=self._run.run_id,
            settings=self._settings, recorder=self._recorder,
        )  # fmt: skip
        remember(self._run, state, result)
        self._answer(state, result)

    # -- answers ------------------------------------------------------------

    def _answer(self, state: CallState, result: ToolResult) -> None:
        state.result = result = scrubbed(result, state.secrets)
        for follower in state.followers:
            if follower.result is None:
                follower.started = state.started
                self._answer(follower, shared(result, follower))
        call = state.call
        self._recorder.emit(
            EventKind.ANSWERED, call_id=call.id, tool=call.name, status=result.status,
            scope=result.scope, attempt=state.attempts or None,
        )  # fmt: skip
        if (
            self._on_failure == "cancel_siblings"
            and result.status in _FAILURES
            and self._failed is None
            and trio.current_time() < self._deadline
        ):
            self._failed = state
            self._siblings.cancel()

    def _refuse(self, state: CallState, message: str) -> None:
        call = state.call
        self._recorder.emit(EventKind.REFUSED, call_id=call.id, tool=call.name, reason=message)
        self._answer(
            state, failure(call, Status.REFUSED, message, started=False, kind=_kind(state))
        )

    def _timed_out(self, state: CallState, budget: Budget) -> ToolResult:
        if budget.deadline < self._deadline:
            assert state.spec is not None
            why = f"the call's own timeout of {state.spec.timeout:g}s passed"
        else:
            why = f"the turn's deadline of {self._timeout:g}s passed"
        return failure(state.call, Status.TIMED_OUT, why, started=state.started, kind=_kind(state))

    def _interrupted(self, state: CallState) -> ToolResult:
        """The answer for a call stopped from outside: a sibling, the deadline, the caller."""
        failed = self._failed
        if failed is not None and failed is not state:
            why = (
                f"call {failed.call.id} ({failed.call.name}) failed, so the calls still "
                "unfinished were cancelled (on_failure='cancel_siblings')"
            )
            status = Status.CANCELLED
        elif trio.current_time() >= self._deadline:
            why, status = f"the turn's deadline of {self._timeout:g}s passed", Status.TIMED_OUT
        else:
            why, status = "the caller cancelled the turn", Status.CANCELLED
        return failure(state.call, status, why, started=state.started, kind=_kind(state))

    def _pending(self, state: CallState) -> ToolResult:
        return failure(
            state.call, Status.CANCELLED, "the turn has not finished running this call",
            started=state.started, kind=_kind(state),
        )  # fmt: skip


def _kind(state: CallState) -> Kind:
    return state.spec.kind if state.spec is not None else Kind.MUTATING


def _tally(results: Sequence[ToolResult]) -> dict[str, int]:
    """How many answers of each status, for the turn's closing event."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status.value] = counts.get(result.status.value, 0) + 1
    return dict(sorted(counts.items()))
