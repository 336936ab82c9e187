"""A turn: one assistant message's calls, answered completely and truthfully.

The turn owns a nursery under a hard deadline. Phase one runs every ``pure``
and ``reads`` call concurrently; phase two runs the mutating calls by
policy. Each call also has its own deadline.

Answers are written at the moment a call's fate is decided, not when its
task has finished unwinding: at each deadline a watcher writes the
``timed_out`` answers of the calls it ends (in trio's own pass over expired
deadlines, before any task that pass wakes), and only then cancels them.
Unwinding a thousand hung HTTP requests takes a library a while; the answers
do not wait for it. A failed sibling under ``cancel_siblings`` ends the
others the same way. What is still unanswered when the turn stops is
answered in a ``finally``, with the reason that really stopped it: the
deadline, a failed sibling, the caller (``Cancelled`` still propagates), or
a failure of fanout itself, which becomes ``error`` answers and never
escapes the turn.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import enum
import functools
import logging
import math
from typing import TYPE_CHECKING, Any, Literal, cast

import attrs
import trio

from ._answers import failure, success
from ._binding import ArgumentError
from ._budget import Budget
from ._call import CallSettings, CallState, describe, execute
from ._collector import collection_paused
from ._deadlines import Deadlines
from ._events import Event, EventDetail, EventKind, Recorder
from ._exceptions import UsageError
from ._going_up import keyboard_interrupt_in, only_going_up, split_going_up
from ._logs import log_failure
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
    settle_when_ended,
    shared,
)
from ._validate import finite
from ._values import Kind, Status, ToolCall, ToolResult

if TYPE_CHECKING:
    from collections.abc import (
        Awaitable,
        Callable,
        Coroutine,
        Iterator,
        Sequence,
    )

    from ._registry import Registry
    from ._run import Run

__all__ = ["MutatingPolicy", "OnFailure", "Turn", "TurnCounts", "model_order"]

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
    # A KeyboardInterrupt went up through a turn: it stops the runner's other turns running
    # with it too (a turn that begins with none running begins without it).
    interrupted: bool = False


class _Stage(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DONE = "done"


class Turn:
    """One turn's calls and their answers. Create it with ``Runner.turn``."""

    # Whether each call runs under a cancel scope of its own, even in the turn's own
    # nursery with no deadline of its own; a streaming turn's do (`_stop_the_calls`).
    _calls_own_scopes = False

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
        begin: Callable[[], trio.Nursery | None] = lambda: None,
    ) -> None:
        self._counts = counts
        # Called as the turn begins to run: readies the runner for the trio.run going
        # on, and hands over its nursery if it is open then (the turn may have been
        # built before ``async with runner:``).
        self._begin = begin
        self._host: trio.Nursery | None = None
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
        # The budget of every call with no timeout of its own (a frozen value, so shared).
        self._turn_budget = Budget(math.inf, settings.inline_wait)
        self._failed: CallState | None = None
        self._deadline_reached = False
        # The caller cancelled the turn (its deadline watcher was stopped from outside).
        self._cancelled_from_outside = False
        self._phases_over = False
        self._stopping = False  # set once the turn has stopped its calls
        self._internal = ""  # what failed, when fanout itself did
        self._keyboard_interrupt = False  # a KeyboardInterrupt went up through the turn
        self._interrupt: KeyboardInterrupt | None = None  # which one
        self._scope = trio.CancelScope()
        self._deadlines = Deadlines()
        # Every running call's own cancel scope, so the turn can stop calls
        # that run in the runner's nursery rather than under its own scope.
        self._running: dict[CallState, trio.CancelScope] = {}
        self._phase_left: set[CallState] = set()
        self._phase_done = trio.Event()
        self._delivered = False  # a whole message's calls have been handed out
        # Single-flight: the first call per tool and arguments.
        self._leaders: dict[tuple[str, str], CallState] = {}
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
        return self._recorder.events()

    @property
    def deadline(self) -> float:
        return self._deadline

    async def run(self, *, since: float | None = None) -> None:
        """Run every call to its answer under the turn's hard deadline.

        Nothing but ``Cancelled`` (the caller's) and ``KeyboardInterrupt``
        escapes: whatever else fails is logged and answered. ``since`` (a
        ``trio.current_time()``): when the deadline counts from, if before now;
        `Runner.run_turn` passes when it was called, so that building the calls
        is within it (10,000 calls took 32 ms to build, and were answered that
        much after the caller's deadline).
        """
        await self._run_to_the_end(since)

    async def _run_to_the_end(self, since: float | None = None) -> None:
        if self._stage is not _Stage.NEW:
            raise UsageError("a turn runs once; build a new one for the next message")
        if since is not None and finite(since) is None:
            raise UsageError(
                f"since must be a trio.current_time() (a finite number), not {since!r}"
            )
        self._stage = _Stage.RUNNING
        self._host = self._begin()
        self._recorder.reads_the_clock_of_this_run()
        now = trio.current_time()
        self._deadline = (now if since is None else min(now, since)) + self._timeout
        self._turn_budget = Budget(self._deadline, self._settings.inline_wait)
        self._scope.deadline = self._deadline + _BACKSTOP
        self._counts.started += 1
        if self._counts.running == 0:
            # An interrupt stops the turns running with it, not those after it: a caller
            # that caught it and went on was told of it by every later turn.
            self._counts.interrupted = False
        self._counts.running += 1
        interrupted: KeyboardInterrupt | None = None
        try:
            self._recorder.emit(EventKind.TURN_STARTED, detail={"calls": len(self._states)})
            await self._run_phases()
        except BaseException as exc:
            if self._interrupt is not None and only_going_up(exc):
                # A call's task in the runner's nursery raised it there, and the nursery
                # cancels this task: it is what stopped the turn, and comes out as itself
                # (a group of the cancellation came out, and `except KeyboardInterrupt`
                # caught nothing).
                raise self._interrupt from None
            if isinstance(exc, trio.Cancelled):
                raise
            if isinstance(exc, KeyboardInterrupt):
                self._note_interrupt(exc)
                raise
            self._fail_internally(exc)
        finally:
            self._stop_calls()
            self._arrivals_cut_off()
            for state in self._states:
                if state.result is None:
                    try:
                        self._answer(state, self._interrupted(state))
                    except KeyboardInterrupt as exc:
                        # From an instrument as the call was answered: the answer is
                        # in, and so must the others be before it goes on up.
                        interrupted = interrupted or exc
            self._stage = _Stage.DONE
            self._counts.running -= 1
            if self._recorder.active:  # the tally is the event's alone
                self._recorder.emit(EventKind.TURN_FINISHED, detail=_tally(self.results))
        if interrupted is not None:
            raise interrupted

    async def _run_phases(self) -> None:
        async with trio.open_nursery() as watching:
            watching.start_soon(self._watch_deadlines)
            with self._noting_crashes(), self._scope:
                await self._run_together(self._arrivals, register=True)
                if any(state.result is None for state in self._writes):
                    # The reads are answered; the writes wait until they have ended too
                    # (a read's thread left to finish, one unwinding in the runner's
                    # nursery), or the deadline answers them.
                    writes = set(self._writes)
                    for state in self._states:
                        if state not in writes:
                            await state.work_ended()
                await self._mutating_phase(self._writes)
            self._phases_over = True
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
            self._note_crash(exc)
            raise

    def _note_interrupt(self, exc: BaseException) -> None:
        """Remember a ``KeyboardInterrupt`` in ``exc``: the turn's (and, in an open runner,
        its other turns') calls say so, and `run` raises it as itself."""
        interrupt = keyboard_interrupt_in(exc)
        if interrupt is not None:
            self._keyboard_interrupt = self._counts.interrupted = True
            self._interrupt = self._interrupt or interrupt

    def _note_crash(self, exc: BaseException) -> None:
        self._note_interrupt(exc)
        if not only_going_up(exc) and not self._internal:
            self._internal = describe(exc)

    def _fail_internally(self, exc: BaseException) -> None:
        """fanout itself failed: answer what is left ``error``, never crash the caller.

        A cancellation that arrived with the failure still propagates; a
        ``KeyboardInterrupt`` among them goes up as itself, out of the groups
        the turn's nurseries wrapped it in, so that ``except KeyboardInterrupt``
        around the turn catches it (a level-triggered cancellation is raised
        again at the caller's next checkpoint).
        """
        cancelled, failed = split_going_up(exc)
        if failed is not None:
            log_failure(_log, "fanout: a turn failed", exc=failed)
            self._internal = self._internal or describe(failed)
        if cancelled is not None:
            interrupt = keyboard_interrupt_in(cancelled)
            if interrupt is not None:
                raise interrupt from None
            raise cancelled

    # -- phases -------------------------------------------------------------

    def _register(self, state: CallState, now: float) -> bool:
        """Check one arriving call, answering what needs no run; True to start it now.

        Unknown tools are refused and broken arguments answered; an identical
        earlier call answers this one (single-flight); a fresh cached read
        answers it; under policy ``one`` a write after the first is refused,
        and the writes kept wait for the mutating phase, which needs the
        whole message. A call arriving after a sibling failed
        (``cancel_siblings``) is answered ``cancelled`` without running.
        ``now`` is when its batch arrived.
        """
        plan = state.plan
        call = plan.call
        state.arrived_at = now
        self._recorder.emit(EventKind.QUEUED, call_id=call.id, tool=call.name)
        if plan.spec is None:
            names = ", ".join(self._registry.names()) or "(none)"
            self._refuse(state, f"there is no tool named {call.name!r}; the tools are: {names}")
            return False
        if not call.arguments_valid:
            why = state.problem or "the arguments are not a JSON object; the call was not run"
            self._answer(
                state,
                failure(
                    call, Status.ERROR, why, started=False, kind=plan.kind,
                    hint="re-issue the call with arguments that are a valid JSON object",
                ),
            )  # fmt: skip
            return False
        bound = plan.spec.bind(call.arguments)
        if isinstance(bound, ArgumentError):
            unfit = bound
            self._answer(
                state,
                failure(
                    call, Status.ERROR, f"{unfit.message}; the call was not run",
                    started=False, kind=plan.kind,
                    hint="re-issue the call with arguments that fit the tool's schema",
                ),
            )  # fmt: skip
            return False
        state.bound = bound
        if self._failed is not None:
            self._answer(state, self._interrupted(state))
            return False
        leader = join_flight(self._leaders, state, self._recorder)
        if leader is not None:
            if leader.result is not None:
                state.started = leader.started
                self._answer(state, shared(leader.result, state))
            return False
        hit = cached_answer(self._run, plan, self._recorder, limit=self._settings.max_output_chars)
        if hit is not None:
            self._answer(state, hit)
            return False
        if plan.kind is not Kind.MUTATING:
            return True
        self._keep_write(state)
        return False

    def _keep_write(self, state: CallState) -> None:
        """Keep a write for the mutating phase, in the model's order; under ``"one"``, only
        the model's first, the other refused.

        A streamed write may end before one that began earlier (interleaved blocks), and
        no write runs before the message has ended: the one the model asked for first is
        the one that runs, as in `run_turn`, not the one whose block ended first.
        """
        bisect.insort(self._writes, state, key=model_order)
        if self._mutating == "one" and len(self._writes) > 1:
            first, later = self._writes
            self._writes = [first]
            self._refuse(
                later,
                f"{later.call.name} was requested in the same turn as another write "
                f"({first.call.name}); it was not run. Re-request it alone if still needed",
            )

    async def _run_together(
        self, arrivals: Callable[[], Awaitable[list[CallState] | None]], *, register: bool
    ) -> None:
        """Run arriving calls concurrently, each admitted in the model's order.

        A call is started with ``nursery.start``, which returns once the call
        has queued or begun, wherever order shows in the answers: on scopes
        (who gets the next token) and under ``cancel_siblings`` (whether a
        call had started when a sibling failed, and which failure came
        first). Elsewhere each answer is the call's own, whatever order trio
        runs the tasks in, and ``start_soon`` saves a scheduler round trip.
        With ``register``, each batch is checked first (``_register``); the
        mutating phase's writes were checked on arrival.

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
        async with trio.open_nursery() as own:  # for calls once the runner has closed
            with self._noting_crashes():
                starts = _Starts(self._host, own)
                await self._start_arrivals(arrivals, starts, self._run_hosted, register)
            # Made only now: while calls were still arriving, the set could run
            # empty for a moment without the phase being over.
            self._phase_done = trio.Event()
            if self._phase_left:
                await self._phase_done.wait()

    async def _start_arrivals(
        self,
        arrivals: Callable[[], Awaitable[list[CallState] | None]],
        nursery: trio.Nursery | _Starts,
        run_one: Callable[..., Awaitable[None]],
        register: bool,
    ) -> None:
        cancel_siblings = self._on_failure == "cancel_siblings"
        while (batch := await arrivals()) is not None:
            # Checking the batch, and starting it when no call needs its place in
            # line, allocates only what the calls keep (`fanout._collector`).
            with collection_paused():
                now = trio.current_time()
                ready = [s for s in batch if self._register(s, now)] if register else batch
                in_line = cancel_siblings or any(state.plan.scopes for state in ready)
                if not in_line:
                    for state in ready:
                        self._start_soon(state, nursery, run_one, now)
            if in_line:
                # Each waits for its place behind the calls before it, counted in its
                # own time from now (`_run_one`).
                for state in ready:
                    if not (state.plan.scopes or cancel_siblings):
                        self._start_soon(state, nursery, run_one, now)
                    elif self._starting(state):
                        await nursery.start(run_one, state, now)

    def _start_soon(
        self,
        state: CallState,
        nursery: trio.Nursery | _Starts,
        run_one: Callable[..., Awaitable[None]],
        since: float,
    ) -> None:
        if self._starting(state):
            nursery.start_soon(run_one, state, since)

    def _starting(self, state: CallState) -> bool:
        """Whether ``state`` is still to start (a sibling's failure or the deadline may
        have answered it while earlier calls started); it then counts as in the phase."""
        if state.result is not None:
            return False
        if self._host is not None:
            self._phase_left.add(state)
        return True

    async def _run_hosted(
        self,
        state: CallState,
        since: float,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """A call in the runner's nursery: whatever happens, it must not crash that nursery.
        It may go on unwinding after it was answered: its work ends with its task."""
        ended = state.work_begun()
        try:
            await self._run_one(state, since, task_status)
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except BaseException as exc:
            # Cancellations grouped by a nursery of the call's (a write holding its claim)
            # are no failure: cancelled by the turn while it still held its place in line,
            # it unwound here, where that cancellation is no one's to catch. (Logged, each
            # such write was an error "failed after it was answered", with no error in it.)
            failed = exc.split(trio.Cancelled)[1] if isinstance(exc, BaseExceptionGroup) else exc
            if failed is not None:
                log_failure(
                    _log, "fanout: call %s failed after it was answered", state.call.id, exc=failed
                )
        finally:
            ended.set()

    async def _mutating_phase(self, writes: list[CallState]) -> None:
        if self._mutating == "parallel":
            batches = iter([writes, None])

            async def arrivals() -> list[CallState] | None:
                await trio.lowlevel.checkpoint()
                return next(batches)

            await self._run_together(arrivals, register=False)
        else:
            before: CallState | None = None
            for state in writes:
                if before is not None:
                    await before.work_ended()  # its thread too, if it was left to finish
                if state.result is None:
                    await self._run_alone(state)
                    before = state

    async def _run_alone(self, state: CallState) -> None:
        """Run one write of a serial phase to its end before the next begins: in the
        runner's nursery when it is open, so that a write unwinding past the turn's
        deadline holds the runner, not the turn (awaited here, one that took 100 s to
        unwind held ``run_turn`` 100 s past its 5 s deadline)."""
        host = self._host
        if host is None:
            await self._run_one(state)
        else:
            ended = trio.Event()

            async def run_to_its_end() -> None:
                try:
                    await self._run_hosted(state, trio.current_time())
                finally:
                    ended.set()

            try:
                host.start_soon(run_to_its_end)
            except RuntimeError:  # the runner's nursery is closing: run it here
                await self._run_one(state)
            else:
                await ended.wait()

    async def _run_one(
        self,
        state: CallState,
        since: float | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run one call to its answer, its own timeout counted from ``since`` (when its
        batch was started, default now).

        A call waits for its place in line until the call before it has queued
        or begun: instant on a local scope, a round trip to Redis on a shared
        one. Counted from when it got its place, a Redis that stopped answering
        held each call its predecessor's whole wait before its own began: four
        reads with a timeout of 0.1 s were answered 0.1, 0.2, 0.3 and 0.4 s on.
        """
        assert state.plan.spec is not None
        timeout = state.plan.spec.timeout
        budget = self._turn_budget
        if timeout is not None:
            budget = Budget.starting_now(
                timeout, turn_deadline=self._deadline, inline_wait=self._settings.inline_wait,
                since=since,
            )  # fmt: skip
        give_up = _no_place  # a call started with start_soon holds no place in line
        if task_status is not trio.TASK_STATUS_IGNORED:
            give_up = _Place(task_status).give_up
        try:
            own_scope = self._calls_own_scopes or self._host is not None
            if not own_scope and budget.deadline >= self._deadline:
                # Under the turn's own scope, with no deadline of its own: the
                # turn's scope and watcher are all this call needs.
                await self._execute(state, budget, give_up)
            else:
                # The runner's calls are stopped by the turn as it returns; a
                # backstop of their own would start a thousand unwinding
                # before the turn could return.
                backstop = self._deadline + _BACKSTOP if self._host is None else math.inf
                with trio.CancelScope(deadline=backstop) as own:
                    self._running[state] = own
                    if self._stopping:
                        own.cancel()
                    if budget.deadline < self._deadline:
                        self._watch(state, budget.deadline, own)
                    await self._execute(state, budget, give_up)
        finally:
            self._running.pop(state, None)
            if state.result is None:
                self._answer(state, self._interrupted(state))
            give_up()  # a call answered before admission (a replay, a crash) too
            if state.claimed:
                if trio.current_time() < budget.deadline and state.work_ended_now():
                    await settle(self._run, state, budget)
                else:  # cut off, or still running: kept once it ends (`settle_when_ended`)
                    with contextlib.suppress(RuntimeError):  # trio's run is ending: it lapses
                        trio.lowlevel.spawn_system_task(
                            settle_when_ended, self._run, state, self._late_answer(state)
                        )

    async def _execute(self, state: CallState, budget: Budget, queued: Callable[[], None]) -> None:
        """Answer one call: a replay of a write already done, or a run of it.

        A failure of fanout's own is answered, not raised.
        """
        stamp = self._run.cache.stamp()
        # What only a write does is skipped at once for the reads (most calls).
        write = state.plan.kind is Kind.MUTATING
        if write:
            # A sync write's thread left to finish ends later than its task: the reads
            # are dropped again then.
            state.on_thread_end = functools.partial(invalidate_for, self._run, state.plan)
        try:
            if write:
                # Any write, repeatable or not, may make reads stale.
                invalidate_for(self._run, state.plan)
            if write and is_idempotent_write(state.plan):
                limit = self._settings.max_output_chars
                replay = await claim(self._run, state, budget, self._recorder, limit=limit)
                if replay is not None:
                    self._answer(state, replay)
                    return
            if state.claimed:
                async with trio.open_nursery() as holding:
                    holding.start_soon(hold_claim, self._run, state.plan.idempotency_key)
                    result = await self._tool_run(state, budget, queued)
                    holding.cancel_scope.cancel()
            else:
                result = await self._tool_run(state, budget, queued)
            remember(self._run, state.plan, result, state.secrets, since=stamp)
            self._answer(state, result)
        except Exception as exc:
            log_failure(_log, "fanout: call %s failed inside fanout", state.call.id, exc=exc)
            self._answer(state, self._broken(state, describe(exc)))
        except BaseException as exc:
            # A part the user plugged in (a scope, a store) raised a ``BaseException``
            # of its own (``SystemExit``): this call's failure, as an ``Exception`` is.
            # Raised on, it took every sibling with it, and under an open runner it
            # crashed the runner's nursery into the caller's code.
            cancelled, failed = split_going_up(exc)
            self._note_interrupt(exc)
            if failed is None:
                raise
            log_failure(_log, "fanout: call %s failed inside fanout", state.call.id, exc=failed)
            self._answer(state, self._broken(state, describe(failed)))
            if cancelled is not None:
                raise cancelled from None
        finally:
            if write:
                # And again as a write ends, however: a read that ran beside it may hold
                # what it changed.
                invalidate_for(self._run, state.plan)

    def _late_answer(self, state: CallState) -> Callable[[Any], ToolResult]:
        """How what ``state``'s tool returned after its answer becomes its own answer."""
        limit = self._settings.max_output_chars
        return lambda value: success(state.call, value, limit=limit, secrets=state.secrets)

    def _tool_run(
        self, state: CallState, budget: Budget, queued: Callable[[], None]
    ) -> Coroutine[Any, Any, ToolResult]:
        """The call's run (`fanout._call.execute`), to await: one coroutine fewer per call."""
        return execute(
            state, queued=queued, budget=budget, run_id=self._run.run_id,
            settings=self._settings, recorder=self._recorder,
            answered=lambda result: self._answer(state, result),
        )  # fmt: skip

    # -- deadlines ------------------------------------------------------------

    def _watch(self, state: CallState, deadline: float, scope: trio.CancelScope) -> None:
        """At ``deadline`` (the call's own, before the turn's): answer ``state``, then cancel
        it, once the calls cancelled before it are unwinding (`Deadlines.cancel_soon`)."""

        def expire() -> None:
            if state.result is None:
                self._answer(state, self._timed_out(state))
            self._deadlines.cancel_soon(scope)

        self._deadlines.add(deadline, expire)

    async def _watch_deadlines(self) -> None:
        """Answer each call at its deadline, then cancel it; at the turn's, all that are left.

        The answers are written in trio's pass over expired deadlines
        (`fanout._deadlines`); cancelling the calls at the turn's deadline,
        which takes trio a while for calls hung on sockets, waits for this
        task's turn to run.
        """
        with self._noting_crashes():
            self._deadlines.add(self._deadline, self._answer_the_rest)
            try:
                await self._deadlines.watch(self._deadline)
            except trio.Cancelled:
                # Stopped before the deadline, with the calls still running and nothing
                # crashed: the caller cancelled. Said now, a call that takes until past
                # the deadline to unwind is not answered "the turn's deadline passed".
                over = self._phases_over or self._internal or self._keyboard_interrupt
                self._cancelled_from_outside = not over
                if self._cancelled_from_outside:
                    # And answered now: left to the turn's end, a call that took 5 s to
                    # unwind was answered then, past the turn's deadline.
                    self._answer_unanswered()
                raise
            self._scope.cancel()

    def _answer_the_rest(self) -> None:
        """The turn's deadline passed: every call still unanswered is answered ``timed_out``."""
        self._deadline_reached = True
        self._answer_unanswered()

    def _answer_unanswered(self) -> None:
        """Answer every call not answered yet by what stopped it (`_interrupted`), those
        still being written in a stream too (`_arrivals_cut_off`: left to the turn's end,
        one was answered after its siblings had unwound, 3 s past the deadline)."""
        self._arrivals_cut_off()
        for state in self._states:
            if state.result is None:
                self._answer(state, self._interrupted(state))

    def _stop_the_calls(self) -> None:
        """A sibling failed under ``cancel_siblings``: stop every call (`_stop_calls`)."""
        self._stop_calls()

    def _stop_calls(self) -> None:
        """Cancel every call still running, wherever its task lives.

        Calls in the turn's own nurseries are cancelled with its scope. Calls
        in the runner's nursery are cancelled only as the turn returns, and
        by a task of the runner's: cancelling a thousand calls hung on
        sockets takes trio a while (each wait is taken off the poller), and
        the turn, its calls answered, need not wait for that either.
        """
        self._stopping = True
        self._scope.cancel()
        self._cancel_running()

    def _cancel_running(self) -> None:
        """Cancel the calls running under scopes of their own (`_stop_calls`)."""
        running = list(self._running.values())
        if not running:
            return
        if self._host is not None:
            try:
                self._host.start_soon(_cancel_soon, running)
                return
            except RuntimeError:  # the runner's nursery is closing: cancel here
                pass
        _cancel_all(running)

    # -- answers ------------------------------------------------------------

    def _answer(self, state: CallState, result: ToolResult, *, shared_run: bool = False) -> None:
        """Answer ``state`` (once) and the calls that share its run; ``shared_run``: this is
        such a follower's answer, whose failure is its run's, not a sibling's of its own
        (taken for one, the first follower's cancelled the others before they were given
        the run's answer, each "cancelled, not started" beside a write that ran)."""
        if state.result is not None:
            return  # the first answer stands: a call is answered once
        state.result = result = scrubbed(result, state.secrets)
        if state.on_cut_off is not None:  # answered while its tool runs: cut off now
            state.on_cut_off()
        if state in self._phase_left:
            self._phase_left.discard(state)
            if not self._phase_left:
                self._phase_done.set()
        for follower in state.followers or ():
            if follower.result is None:
                follower.started = state.started
                self._answer(follower, shared(result, follower), shared_run=True)
        call = state.plan.call
        self._recorder.emit(
            EventKind.ANSWERED, call_id=call.id, tool=call.name, status=result.status,
            scope=result.scope, attempt=state.attempts or None,
        )  # fmt: skip
        if (
            not shared_run
            and self._on_failure == "cancel_siblings"
            and result.status in _FAILURES
            and self._failed is None
            and trio.current_time() < self._deadline
        ):
            self._failed = state
            for other in self._states:
                if other.result is None:
                    self._answer(other, self._interrupted(other))
            # The calls in the runner's nursery too: left to the turn's end, one that
            # waited for the failed call's slot was woken by it and ran.
            self._stop_the_calls()

    def _refuse(self, state: CallState, message: str) -> None:
        call = state.call
        self._recorder.emit(EventKind.REFUSED, call_id=call.id, tool=call.name, reason=message)
        self._answer(
            state, failure(call, Status.REFUSED, message, started=False, kind=state.plan.kind)
        )

    def _timed_out(self, state: CallState) -> ToolResult:
        """The answer of a call whose own timeout passed."""
        plan = state.plan
        assert plan.spec is not None
        why = f"the call's own timeout of {plan.spec.timeout:g}s passed"
        return failure(plan.call, Status.TIMED_OUT, why, started=state.started, kind=plan.kind)

    def _interrupted(self, state: CallState) -> ToolResult:
        """The answer of a call stopped from outside, saying what stopped it."""
        failed = self._failed
        if self._keyboard_interrupt or self._counts.interrupted:
            why, status = "a KeyboardInterrupt stopped the turn", Status.CANCELLED
        elif failed is not None and failed is not state:
            why = (
                f"call {failed.call.id} ({failed.call.name}) failed, so the calls still "
                "unfinished were cancelled (on_failure='cancel_siblings')"
            )
            status = Status.CANCELLED
        elif self._cancelled_from_outside and not self._deadline_reached:
            why, status = "the caller cancelled the turn", Status.CANCELLED
        elif self._deadline_reached or trio.current_time() >= self._deadline:
            why, status = f"the turn's deadline of {self._timeout:g}s passed", Status.TIMED_OUT
        elif self._internal:
            return self._broken(state, self._internal)
        elif self._host is not None:
            # The turn was not cancelled (its watcher would know): the runner's nursery,
            # where the call ran, was (its block cancelled while the turn ran in another
            # task). Said to be the caller's, it was no one's the turn could name.
            why = "the runner this turn ran in was cancelled or closed before the call finished"
            status = Status.CANCELLED
        else:
            # Stopped by none of the turn's own reasons, and nothing crashed:
            # the cancellation came from outside the turn.
            why, status = "the caller cancelled the turn", Status.CANCELLED
        return failure(state.call, status, why, started=state.started, kind=state.plan.kind)

    def _broken(self, state: CallState, what: str) -> ToolResult:
        """The answer of a call fanout itself failed to finish."""
        return failure(
            state.call, Status.ERROR,
            f"fanout failed while handling this call ({what}); it was not finished",
            started=state.started, kind=state.plan.kind, effect_unknown=state.started,
            hint="this is a failure of the runtime, not of the arguments; re-issue the call",
        )  # fmt: skip

    def _pending(self, state: CallState) -> ToolResult:
        return failure(
            state.call, Status.CANCELLED, "the turn has not finished running this call",
            started=state.started, kind=state.plan.kind,
        )  # fmt: skip


class _Starts:
    """Where a turn in an open runner starts its calls: the runner's nursery, or, once
    that has closed (its block ended while the turn ran in another task), the turn's
    own. (Started in the closed one, the next call was answered "fanout failed", and a
    stream was read no further.)"""

    def __init__(self, host: trio.Nursery, own: trio.Nursery) -> None:
        self._host = host
        self._own = own

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        try:
            self._host.start_soon(fn, *args)
        except RuntimeError:  # closed to new arrivals
            self._own.start_soon(fn, *args)

    async def start(self, fn: Callable[..., Awaitable[object]], *args: object) -> object:
        try:
            return await self._host.start(fn, *args)
        except RuntimeError:  # closed: the call itself raises nothing (`_run_hosted`)
            return await self._own.start(fn, *args)


class _Place:
    """A call's place in the turn's admission order, given up once: the next call may start.

    The one ordering mechanism: ``nursery.start`` returns when the call gives
    up its place (admission does, as the call blocks or is admitted; the
    turn does for a call answered without admission).
    """

    def __init__(self, task_status: trio.TaskStatus[None]) -> None:
        self._task_status: trio.TaskStatus[None] | None = task_status

    def give_up(self) -> None:
        if self._task_status is not None:
            self._task_status.started()
            self._task_status = None


def model_order(state: CallState) -> int:
    """Where the model put a call in its message: the order a turn keeps its calls in."""
    return state.call.position


def _no_place() -> None:
    """Give up the place of a call that holds none (it was started with ``start_soon``)."""


def _cancel_all(scopes: list[trio.CancelScope]) -> None:
    for scope in scopes:
        scope.cancel()


async def _cancel_soon(scopes: list[trio.CancelScope]) -> None:
    """Cancel ``scopes`` from a task of its own, once whoever asked has moved on."""
    await trio.lowlevel.checkpoint()
    _cancel_all(scopes)


def _tally(results: Sequence[ToolResult]) -> EventDetail:
    """How many answers of each status, for the turn's closing event."""
    # Counted by member, spelled once per status: ``.value`` is a Python call each time.
    counts = collections.Counter(result.status for result in results)
    return cast("EventDetail", dict(sorted((status.value, n) for status, n in counts.items())))
