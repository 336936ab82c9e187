"""A turn: one assistant message's calls, answered completely and truthfully.

The turn owns a nursery under a hard deadline. Phase one runs every ``pure``
and ``reads`` call concurrently; phase two runs the mutating calls by
policy. Each call also has its own deadline.

Answers are written at the moment a call's fate is decided, not when its
task has finished unwinding: a watcher task wakes at each deadline, writes
the ``timed_out`` answers of the calls it ends, and only then cancels them.
Unwinding a thousand hung HTTP requests takes a library a while; the answers
do not wait for it. A failed sibling under ``cancel_siblings`` ends the
others the same way. What is still unanswered when the turn stops is
answered in a ``finally``, with the reason that really stopped it: the
deadline, a failed sibling, the caller (``Cancelled`` still propagates), or
a failure of fanout itself, which becomes ``error`` answers and never
escapes the turn.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import math
from typing import TYPE_CHECKING, Literal

import attrs
import trio

from ._answers import failure
from ._budget import Budget
from ._call import CallSettings, CallState, describe, execute
from ._events import Event, EventKind, Recorder
from ._exceptions import UsageError
from ._redact import redact_text
from ._repeats import (
    cached_answer,
    claim,
    hold_claim,
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

_log = logging.getLogger("fanout")

MutatingPolicy = Literal["one", "serial", "parallel"]
OnFailure = Literal["continue", "cancel_siblings"]

# Outcomes that count as a failure for on_failure="cancel_siblings". A refusal
# is a decision fanout made, not a failure of the call.
_FAILURES = frozenset({Status.ERROR, Status.TIMED_OUT, Status.RATE_LIMITED, Status.QUOTA_EXHAUSTED})

# The turn's own cancel scope fires this long after its deadline, in case the
# watcher (which ends calls at the deadline itself) could not run.
_BACKSTOP = 0.05


@attrs.define
class TurnCounts:
    """The runner's tally of turns, kept by the turns themselves."""

    started: int = 0
    running: int = 0


class _Stage(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DONE = "done"


class _Stop(enum.Enum):
    """Why calls still unanswered were stopped."""

    DEADLINE = "deadline"
    SIBLING = "sibling"
    CALLER = "caller"
    INTERNAL = "internal"


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
        self._stop: _Stop | None = None
        self._internal = ""  # what failed, when fanout itself did
        self._scope = trio.CancelScope()
        # The cancel scopes of the turn's own nurseries: trio cancels one
        # when a task in it crashes, which is fanout failing, not the caller.
        self._nursery_scopes: list[trio.CancelScope] = []
        self._deadlines: list[tuple[float, int, CallState, trio.CancelScope]] = []
        self._serial = itertools.count()
        self._deadlines_changed = trio.Event()

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
        """Run every call to its answer under the turn's hard deadline.

        Nothing but ``Cancelled`` (the caller's) and ``KeyboardInterrupt``
        escapes: whatever else fails is logged and answered.
        """
        if self._stage is not _Stage.NEW:
            raise UsageError("a turn runs once; build a new one for the next message")
        self._stage = _Stage.RUNNING
        self._deadline = trio.current_time() + self._timeout
        self._scope.deadline = self._deadline + _BACKSTOP
        self._counts.started += 1
        self._counts.running += 1
        self._recorder.emit(EventKind.TURN_STARTED, detail={"calls": len(self._states)})
        try:
            await self._run_phases()
        except (trio.Cancelled, KeyboardInterrupt):
            self._stop = self._stop or _Stop.CALLER
            raise
        except BaseException as exc:
            self._fail_internally(exc)
        finally:
            for state in self._states:
                if state.result is None:
                    self._answer(state, self._interrupted(state))
            self._stage = _Stage.DONE
            self._counts.running -= 1
            self._recorder.emit(EventKind.TURN_FINISHED, detail=_tally(self.results))

    async def _run_phases(self) -> None:
        runnable = self._answer_without_running()
        async with trio.open_nursery() as watching:
            self._nursery_scopes.append(watching.cancel_scope)
            watching.start_soon(self._watch_deadlines)
            with self._scope:
                writes = self._writes_allowed([c for c in runnable if c.kind is Kind.MUTATING])
                await self._phase(c for c in runnable if c.kind is not Kind.MUTATING)
                await self._mutating_phase(writes)
            watching.cancel_scope.cancel()

    def _fail_internally(self, exc: BaseException) -> None:
        """fanout itself failed: answer what is left ``error``, never crash the caller."""
        if isinstance(exc, BaseExceptionGroup):
            cancelled, rest = exc.split((trio.Cancelled, KeyboardInterrupt))
            if rest is None and cancelled is not None:
                self._stop = self._stop or _Stop.CALLER
                raise cancelled
            if cancelled is not None:
                _log.error("fanout: a turn failed", exc_info=rest)
                self._stop, self._internal = _Stop.INTERNAL, describe(rest or exc)
                raise cancelled
        _log.error("fanout: a turn failed", exc_info=exc)
        self._stop, self._internal = _Stop.INTERNAL, describe(exc)

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
                        started=False, kind=state.kind,
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
        """Run ``states`` concurrently, each admitted in the model's order.

        Every call is started with ``nursery.start``, which returns once the
        call has queued or begun: which call goes first, and whether a call
        had started when a sibling failed, never depends on how trio happened
        to schedule the tasks.
        """
        async with trio.open_nursery() as nursery:
            self._nursery_scopes.append(nursery.cancel_scope)
            for state in states:
                if state.result is None:
                    await nursery.start(self._run_one, state)

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
                if state.result is None:
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
            with trio.CancelScope() as own:
                if budget.deadline < self._deadline:
                    self._watch(state, budget.deadline, own)
                try:
                    await self._execute(state, budget)
                except Exception as exc:
                    _log.error("fanout: call %s failed inside fanout", state.call.id, exc_info=exc)
                    self._answer(state, self._broken(state, describe(exc)))
        finally:
            if state.result is None:
                self._answer(state, self._interrupted(state))
            queued()
            if state.claimed:
                await settle(self._run, state, budget)

    async def _execute(self, state: CallState, budget: Budget) -> None:
        """Answer one call: a replay of a write already done, or a run of it."""
        if is_idempotent_write(state):
            invalidate_for(self._run, state)
            replay = await claim(self._run, state, budget, self._recorder)
            if replay is not None:
                self._answer(state, replay)
                return
        if state.claimed:
            async with trio.open_nursery() as holding:
                holding.start_soon(hold_claim, self._run, state.idempotency_key)
                result = await self._execute_tool(state, budget)
                holding.cancel_scope.cancel()
        else:
            result = await self._execute_tool(state, budget)
        self._answer(state, result)

    async def _execute_tool(self, state: CallState, budget: Budget) -> ToolResult:
        result = await execute(
            state, budget=budget, run_id=self._run.run_id,
            settings=self._settings, recorder=self._recorder,
        )  # fmt: skip
        remember(self._run, state, result)
        return result

    # -- deadlines ------------------------------------------------------------

    def _watch(self, state: CallState, deadline: float, scope: trio.CancelScope) -> None:
        """Have the watcher end ``state`` at ``deadline`` (its own, before the turn's)."""
        heapq.heappush(self._deadlines, (deadline, next(self._serial), state, scope))
        self._deadlines_changed.set()

    async def _watch_deadlines(self) -> None:
        """Answer each call at its deadline, then cancel it; the turn's last of all."""
        while True:
            due = self._deadlines[0][0] if self._deadlines else self._deadline
            due = min(due, self._deadline)
            with trio.move_on_at(due):
                await self._deadlines_changed.wait()
                self._deadlines_changed = trio.Event()
                continue
            now = trio.current_time()
            while self._deadlines and self._deadlines[0][0] <= now:
                _, _, state, scope = heapq.heappop(self._deadlines)
                if state.result is None:
                    self._answer(state, self._timed_out(state))
                scope.cancel()
            if now >= self._deadline:
                self._stop = self._stop or _Stop.DEADLINE
                for state in self._states:
                    if state.result is None:
                        self._answer(state, self._interrupted(state))
                self._scope.cancel()
                return

    # -- answers ------------------------------------------------------------

    def _answer(self, state: CallState, result: ToolResult) -> None:
        if state.result is not None:
            return  # the first answer stands: a call is answered once
        if state.secrets:
            result = attrs.evolve(result, content=redact_text(result.content, state.secrets))
        state.result = result
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
            self._stop = self._stop or _Stop.SIBLING
            for other in self._states:
                if other.result is None:
                    self._answer(other, self._interrupted(other))
            self._scope.cancel()

    def _refuse(self, state: CallState, message: str) -> None:
        call = state.call
        self._recorder.emit(EventKind.REFUSED, call_id=call.id, tool=call.name, reason=message)
        self._answer(state, failure(call, Status.REFUSED, message, started=False, kind=state.kind))

    def _timed_out(self, state: CallState) -> ToolResult:
        """The answer of a call whose own timeout passed."""
        assert state.spec is not None
        why = f"the call's own timeout of {state.spec.timeout:g}s passed"
        return failure(state.call, Status.TIMED_OUT, why, started=state.started, kind=state.kind)

    def _interrupted(self, state: CallState) -> ToolResult:
        """The answer of a call stopped from outside, saying what stopped it."""
        failed = self._failed
        if failed is not None and failed is not state:
            why = (
                f"call {failed.call.id} ({failed.call.name}) failed, so the calls still "
                "unfinished were cancelled (on_failure='cancel_siblings')"
            )
            status = Status.CANCELLED
        elif self._stop is _Stop.DEADLINE or trio.current_time() >= self._deadline:
            why, status = f"the turn's deadline of {self._timeout:g}s passed", Status.TIMED_OUT
        elif self._stop is _Stop.CALLER or (
            self._stop is None and not any(scope.cancel_called for scope in self._nursery_scopes)
        ):
            # Cancelled, and by none of the turn's own scopes: from outside.
            why, status = "the caller cancelled the turn", Status.CANCELLED
        else:
            what = self._internal or "another part of the turn failed and stopped it"
            return self._broken(state, what)
        return failure(state.call, status, why, started=state.started, kind=state.kind)

    def _broken(self, state: CallState, what: str) -> ToolResult:
        """The answer of a call fanout itself failed to finish."""
        return failure(
            state.call, Status.ERROR,
            f"fanout failed while handling this call ({what}); it was not finished",
            started=state.started, kind=state.kind, effect_unknown=state.started,
            hint="this is a failure of the runtime, not of the arguments; re-issue the call",
        )  # fmt: skip

    def _pending(self, state: CallState) -> ToolResult:
        return failure(
            state.call, Status.CANCELLED, "the turn has not finished running this call",
            started=state.started, kind=state.kind,
        )  # fmt: skip


def _tally(results: Sequence[ToolResult]) -> dict[str, int]:
    """How many answers of each status, for the turn's closing event."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status.value] = counts.get(result.status.value, 0) + 1
    return dict(sorted(counts.items()))
