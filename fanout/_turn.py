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

import contextlib
import enum
import heapq
import itertools
import logging
import math
from typing import TYPE_CHECKING, Any, Literal

import attrs
import trio

from ._answers import failure
from ._binding import ArgumentError
from ._budget import Budget
from ._call import CallSettings, CallState, describe, execute
from ._events import Event, EventKind, Recorder
from ._exceptions import InvalidTurnError, UsageError
from ._redact import scrubbed
from ._repeats import (
    cached_answer,
    claim,
    hold_claim,
    invalidate_for,
    is_idempotent_write,
    join_flight,
    remember,
    settle,
    shared,
)
from ._values import Kind, Status, ToolCall, ToolResult

if TYPE_CHECKING:
    from collections.abc import (
        AsyncIterable,
        AsyncIterator,
        Awaitable,
        Callable,
        Iterator,
        Sequence,
    )

    from ._registry import Registry
    from ._run import Run
    from ._streams import StreamDecoder

__all__ = ["MutatingPolicy", "OnFailure", "StreamingTurn", "Turn", "TurnCounts"]

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
        host: trio.Nursery | None = None,
    ) -> None:
        self._counts = counts
        self._host = host
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
        self._deadline_reached = False
        self._stopping = False  # set once the turn has stopped its calls
        self._internal = ""  # what failed, when fanout itself did
        self._scope = trio.CancelScope()
        self._deadlines: list[tuple[float, int, CallState, trio.CancelScope]] = []
        self._serial = itertools.count()
        self._deadlines_changed = trio.Event()
        # Every running call's own cancel scope, so the turn can stop calls
        # that run in the runner's nursery rather than under its own scope.
        self._running: dict[CallState, trio.CancelScope] = {}
        self._phase_left: set[CallState] = set()
        self._phase_done = trio.Event()
        self._delivered = False  # a whole message's calls have been handed out
        self._leaders: dict[str, CallState] = {}  # single-flight: the first call per key
        self._writes: list[CallState] = []  # writes kept for the mutating phase

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
        await self._run_to_the_end()

    async def _run_to_the_end(self) -> None:
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
            raise
        except BaseException as exc:
            self._fail_internally(exc)
        finally:
            self._stop_calls()
            self._arrivals_cut_off()
            for state in self._states:
                if state.result is None:
                    self._answer(state, self._interrupted(state))
            self._stage = _Stage.DONE
            self._counts.running -= 1
            self._recorder.emit(EventKind.TURN_FINISHED, detail=_tally(self.results))

    async def _run_phases(self) -> None:
        async with trio.open_nursery() as watching:
            watching.start_soon(self._watch_deadlines)
            with self._noting_crashes(), self._scope:
                await self._run_together(self._arrivals, register=True)
                await self._mutating_phase(self._writes)
            watching.cancel_scope.cancel()

    # -- arrivals -------------------------------------------------------------

    async def _arrivals(self) -> list[CallState] | None:
        """The next calls of the message, or None once it has ended.

        A turn built from a whole message has them all at once: every call
        is checked (unknown tool, broken arguments, repeats, cache hits)
        before any of them starts.
        """
        await trio.lowlevel.checkpoint()
        if self._delivered:
            return None
        self._delivered = True
        return list(self._states)

    def _arrivals_cut_off(self) -> None:
        """The turn stopped before its message ended (a streaming turn answers partial calls)."""

    @contextlib.contextmanager
    def _noting_crashes(self) -> Iterator[None]:
        """Remember what crashed, before trio cancels the rest because of it.

        The calls a crash cancels are answered as they unwind; this is how
        they know it was fanout failing, not the caller cancelling.
        """
        try:
            yield
        except BaseException as exc:
            if not _only_cancelled(exc) and not self._internal:
                self._internal = describe(exc)
            raise

    def _fail_internally(self, exc: BaseException) -> None:
        """fanout itself failed: answer what is left ``error``, never crash the caller.

        A cancellation that arrived with the failure still propagates.
        """
        cancelled: BaseException | None = None
        failed: BaseException | None = exc
        if isinstance(exc, BaseExceptionGroup):
            cancelled, failed = exc.split((trio.Cancelled, KeyboardInterrupt))
        if failed is not None:
            _log.error("fanout: a turn failed", exc_info=failed)
            self._internal = self._internal or describe(failed)
        if cancelled is not None:
            raise cancelled

    # -- phases -------------------------------------------------------------

    def _register(self, state: CallState) -> bool:
        """Check one arriving call, answering what needs no run; True to start it now.

        Unknown tools are refused and broken arguments answered; an identical
        earlier call answers this one (single-flight); a fresh cached read
        answers it; under policy ``one`` a write after the first is refused,
        and the writes kept wait for the mutating phase, which needs the
        whole message. A call arriving after a sibling failed
        (``cancel_siblings``) is answered ``cancelled`` without running.
        """
        call = state.call
        self._recorder.emit(EventKind.QUEUED, call_id=call.id, tool=call.name)
        if state.spec is None:
            names = ", ".join(self._registry.names()) or "(none)"
            self._refuse(state, f"there is no tool named {call.name!r}; the tools are: {names}")
            return False
        if not call.arguments_valid:
            why = state.problem or "the arguments are not a JSON object; the call was not run"
            self._answer(
                state,
                failure(
                    call, Status.ERROR, why, started=False, kind=state.kind,
                    hint="re-issue the call with arguments that are a valid JSON object",
                ),
            )  # fmt: skip
            return False
        if isinstance(unfit := state.spec.bind(call.arguments), ArgumentError):
            self._answer(
                state,
                failure(
                    call, Status.ERROR, f"{unfit.message}; the call was not run",
                    started=False, kind=state.kind,
                    hint="re-issue the call with arguments that fit the tool's schema",
                ),
            )  # fmt: skip
            return False
        if self._failed is not None:
            self._answer(state, self._interrupted(state))
            return False
        leader = join_flight(self._leaders, state, self._recorder)
        if leader is not None:
            if leader.result is not None:
                state.started = leader.started
                self._answer(state, shared(leader.result, state))
            return False
        hit = cached_answer(self._run, state, self._recorder)
        if hit is not None:
            self._answer(state, hit)
            return False
        if state.kind is not Kind.MUTATING:
            return True
        if self._mutating == "one" and self._writes:
            first = self._writes[0]
            self._refuse(
                state,
                f"{call.name} was requested in the same turn as another write "
                f"({first.call.name}); it was not run. Re-request it alone if still needed",
            )
        else:
            self._writes.append(state)
        return False

    async def _run_together(
        self, arrivals: Callable[[], Awaitable[list[CallState] | None]], *, register: bool
    ) -> None:
        """Run arriving calls concurrently, each admitted in the model's order.

        Every call is started with ``nursery.start``, which returns once the
        call has queued or begun: which call goes first, and whether a call
        had started when a sibling failed, never depends on how trio happened
        to schedule the tasks. With ``register``, each batch is checked first
        (``_register``); the mutating phase's writes were checked on arrival.

        In the turn's own nursery, this ends when the calls' tasks have ended.
        In the runner's nursery (a runner used with ``async with``), it ends
        when they are *answered*: a call stopped at the deadline unwinds in
        the runner's nursery after the turn has returned.
        """
        if self._host is None:
            async with trio.open_nursery() as nursery:
                with self._noting_crashes():
                    await self._start_arrivals(arrivals, nursery, self._run_one, register)
            return
        self._phase_left = set()
        self._phase_done = trio.Event()
        with self._noting_crashes():
            await self._start_arrivals(arrivals, self._host, self._run_hosted, register)
        if self._phase_left:
            await self._phase_done.wait()

    async def _start_arrivals(
        self,
        arrivals: Callable[[], Awaitable[list[CallState] | None]],
        nursery: trio.Nursery,
        run_one: Callable[..., Awaitable[None]],
        register: bool,
    ) -> None:
        while (batch := await arrivals()) is not None:
            ready = [state for state in batch if self._register(state)] if register else batch
            for state in ready:
                if state.result is None:
                    if self._host is not None:
                        self._phase_left.add(state)
                    await nursery.start(run_one, state)

    async def _run_hosted(
        self, state: CallState, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """A call in the runner's nursery: whatever happens, it must not crash that nursery."""
        try:
            await self._run_one(state, task_status)
        except Exception:
            _log.exception("fanout: call %s failed after it was answered", state.call.id)

    async def _mutating_phase(self, writes: list[CallState]) -> None:
        if self._mutating == "parallel":
            batches = iter([writes, None])

            async def arrivals() -> list[CallState] | None:
                await trio.lowlevel.checkpoint()
                return next(batches)

            await self._run_together(arrivals, register=False)
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
            with self._noting_crashes(), trio.CancelScope() as own:
                own.deadline = self._deadline + _BACKSTOP
                self._running[state] = own
                if self._stopping:
                    own.cancel()
                if budget.deadline < self._deadline:
                    self._watch(state, budget.deadline, own)
                try:
                    await self._execute(state, budget)
                except Exception as exc:
                    _log.error("fanout: call %s failed inside fanout", state.call.id, exc_info=exc)
                    self._answer(state, self._broken(state, describe(exc)))
        finally:
            self._running.pop(state, None)
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
        with self._noting_crashes():
            await self._watch_each_deadline()

    async def _watch_each_deadline(self) -> None:
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
                self._deadline_reached = True
                for state in self._states:
                    if state.result is None:
                        self._answer(state, self._interrupted(state))
                self._scope.cancel()
                return

    def _stop_calls(self) -> None:
        """Cancel every call still running, wherever its task lives.

        Calls in the turn's own nurseries are cancelled with its scope; calls
        in the runner's nursery only here, as the turn returns: cancelled
        earlier, a thousand of them unwinding at once would stand between
        the turn and its caller in trio's run queue.
        """
        self._stopping = True
        self._scope.cancel()
        for scope in self._running.values():
            scope.cancel()

    # -- answers ------------------------------------------------------------

    def _answer(self, state: CallState, result: ToolResult) -> None:
        if state.result is not None:
            return  # the first answer stands: a call is answered once
        state.result = result = scrubbed(result, state.secrets)
        if state in self._phase_left:
            self._phase_left.discard(state)
            if not self._phase_left:
                self._phase_done.set()
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
        elif self._deadline_reached or trio.current_time() >= self._deadline:
            why, status = f"the turn's deadline of {self._timeout:g}s passed", Status.TIMED_OUT
        elif self._internal:
            return self._broken(state, self._internal)
        else:
            # Stopped by none of the turn's own reasons, and nothing crashed:
            # the cancellation came from outside the turn.
            why, status = "the caller cancelled the turn", Status.CANCELLED
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


class StreamingTurn(Turn):
    """A turn fed by a model's stream: each read starts the moment its block is complete.

    Build it with ``Runner.stream_turn(events, decoder)``. Running it reads
    the stream; every call is checked as it arrives (single-flight and the
    run's cache apply to calls that arrive later too), reads start in the
    model's order while the message is still being written, and writes wait
    for its end, since the mutating policy needs the whole set. The turn's
    deadline covers the stream. A call whose block had begun when the
    stream ended, broke off, or was cut off is answered too (``error``,
    ``timed_out`` or ``cancelled``), never lost; writes of a message that
    broke off are refused. The answers are those a turn built from the
    finished message would give.

    The stream's own error (a dropped connection, two calls with one id) is
    raised from ``run()`` once every call seen is answered.
    """

    def __init__(
        self,
        events: AsyncIterable[Any],
        decoder: StreamDecoder,
        state_for: Callable[[ToolCall, int], CallState],
        **options: Any,
    ) -> None:
        if not hasattr(events, "__aiter__"):  # else the turn would end at once, empty
            raise UsageError(
                f"a streaming turn reads an async iterable of stream events, not "
                f"{type(events).__name__}: enter a stream manager first (async with "
                f"client.messages.stream(...) as stream) or await a coroutine (await "
                f"client.messages.create(..., stream=True)), and pass what it gives"
            )
        super().__init__([], **options)
        self._events = events
        self._decoder = decoder
        self._state_for = state_for
        self._iterator: AsyncIterator[Any] | None = None
        self._ended = False
        self._stream_error: Exception | None = None

    async def run(self) -> None:
        """Read the stream and run every call to its answer under the turn's deadline."""
        await self._run_to_the_end()
        if self._stream_error is not None:
            raise self._stream_error

    async def _arrivals(self) -> list[CallState] | None:
        if self._ended:
            await trio.lowlevel.checkpoint()
            return None
        if self._iterator is None:
            self._iterator = self._events.__aiter__()
        while True:
            try:
                event = await self._iterator.__anext__()
            except StopAsyncIteration:
                return self._end("the message ended before this call's arguments were complete")
            except Exception as exc:
                self._stream_error = exc
                return self._end(
                    f"the stream broke off ({describe(exc)}) before this call's arguments "
                    "were complete"
                )
            arrived = [self._add(call) for call in self._decoded(event)]
            if self._stream_error is not None:
                return self._end("the stream was invalid before this call was complete")
            if arrived:
                return [state for state in arrived if state is not None]

    def _decoded(self, event: Any) -> list[ToolCall]:
        try:
            return self._decoder.feed(event)
        except Exception as exc:
            self._stream_error = exc
            return []

    def _add(self, call: ToolCall, problem: str | None = None) -> CallState | None:
        """A call that arrived, as the turn's next state; a repeated id spoils the stream."""
        if any(state.call.id == call.id for state in self._states):
            self._stream_error = InvalidTurnError(
                f"two calls in the stream share the id {call.id!r}; each id needs one answer"
            )
            return None
        state = self._state_for(call, len(self._states))
        state.problem = problem
        self._states.append(state)
        return state

    def _end(self, why: str) -> list[CallState]:
        """The stream is over: its unfinished calls arrive, to be answered ``error``."""
        self._ended = True
        arrived = [self._add(call, why) for call in self._unfinished()]
        return [state for state in arrived if state is not None]

    def _unfinished(self) -> list[ToolCall]:
        try:
            begun = self._decoder.unfinished()
        except Exception:
            _log.exception("fanout: a stream decoder failed to list its unfinished calls")
            return []
        return [ToolCall(u.id, u.name or "<no tool name>", u.received or "") for u in begun]

    def _arrivals_cut_off(self) -> None:
        if not self._ended:
            self._ended = True
            for call in self._unfinished():
                self._add(call)

    async def _mutating_phase(self, writes: list[CallState]) -> None:
        if self._stream_error is None:
            await super()._mutating_phase(writes)
            return
        await trio.lowlevel.checkpoint()
        for state in writes:
            self._refuse(
                state,
                "the message broke off before it was complete; a write from an incomplete "
                "message is not run. Re-request it if still needed",
            )


def _only_cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation (or a group of nothing else): no crash."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_cancelled(inner) for inner in exc.exceptions)
    return isinstance(exc, trio.Cancelled | KeyboardInterrupt)


def _tally(results: Sequence[ToolResult]) -> dict[str, int]:
    """How many answers of each status, for the turn's closing event."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status.value] = counts.get(result.status.value, 0) + 1
    return dict(sorted(counts.items()))
