"""One call's life: admission, the tool itself, and the retries in between.

``execute`` always returns the call's answer, except when it is cancelled
from outside (its own deadline, the turn's, a failed sibling, the caller);
the turn answers those. Whatever the tool does (returns anything, raises
anything, even an exception whose ``__str__`` raises) and whatever the
scopes do (raise, fail to reach Redis), the outcome is an answer with a true
message. Slots are released in ``finally`` and tokens refunded by admission,
so cancellation at any point leaves the scopes consistent.
"""

from __future__ import annotations

import functools
import logging
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any, cast

import attrs
import trio

from ._admission import Denial, admit
from ._answers import failure, success
from ._budget import Budget, Verdict, usable_wait
from ._canonical import key_of_spelled, safe_text
from ._context import CallContext, reset_current_call, set_current_call
from ._events import EventKind, Recorder
from ._exceptions import (
    LimiterUnavailableError,
    NotSentError,
    QuotaExhaustedError,
    RateLimitedError,
    ToolSignal,
    TransientError,
)
from ._going_up import split_going_up
from ._idle import IdleTimeoutError, IdleWatch
from ._logs import log_failure
from ._redact import redact_text
from ._registry import ToolSpec
from ._retry import RetryPolicy
from ._scope import ScopeLike, quota_horizon, scopes_named
from ._values import Kind, Status, ToolCall, ToolResult

__all__ = [
    "CallPlan",
    "CallSettings",
    "CallState",
    "describe",
    "execute",
    "let_the_deadline_answer",
]

_log = logging.getLogger("fanout")

_UNAVAILABLE = "limiter unavailable"


@attrs.define(eq=False)
class CallSettings:
    """The runner's knobs that shape one call.

    ``threads`` are the ``max_threads`` places for sync tools, made again by the
    runner in each new trio.run (`Runner`): a thread abandoned at a deadline gives
    its place back to the run it began in, and in a later run never would. Every
    turn holds these settings, not a copy, so a turn built before sees the new places.
    """

    retry: RetryPolicy = attrs.field(on_setattr=attrs.setters.frozen)
    inline_wait: float | None = attrs.field(on_setattr=attrs.setters.frozen)
    max_output_chars: int = attrs.field(on_setattr=attrs.setters.frozen)
    threads: trio.CapacityLimiter


@attrs.frozen
class CallPlan:
    """What a call is and how it will run: fixed when its turn is built.

    ``seed`` seeds the call's own jitter generator (the turn's seed and the
    call's id), so which call drew first cannot change anyone's backoff.
    ``arguments_key`` is the arguments' canonical spelling ("" when they are
    not a JSON object): identical calls of a turn share it, so it keys
    single-flight, and the idempotency key is a hash of it, the run and the
    tool.
    """

    call: ToolCall
    spec: ToolSpec | None
    scopes: tuple[ScopeLike, ...] = ()
    run_id: str = ""
    arguments_key: str = ""
    seed: str = ""
    # The idempotency key once hashed. A slot of its own, not a ``cached_property``:
    # attrs gives a slotted class that has one a ``__getattr__``, and then every field
    # of the plan, read a dozen times a call, took twice as long to read.
    _key: str | None = attrs.field(default=None, init=False, eq=False, repr=False)

    @property
    def idempotency_key(self) -> str:
        """The call's idempotency key (`fanout.idempotency`), "" for arguments that are not
        a JSON object; hashed on first use, since most calls (reads) never use it."""
        key = self._key
        if key is None:
            valid = self.call.arguments_valid
            key = key_of_spelled(self.run_id, self.call.name, self.arguments_key) if valid else ""
            object.__setattr__(self, "_key", key)  # kept, not changed: the same key each time
        return key

    @property
    def kind(self) -> Kind:
        """The tool's kind; an unknown tool is taken to be a write."""
        return self.spec.kind if self.spec is not None else Kind.MUTATING


@attrs.define(eq=False)
class CallState:
    """A call's progress through its turn, over its fixed plan (compared by identity).

    Only the turn and the call's own run write here; what needs nothing but
    the plan (the read cache, the retry's patience) is given the plan.
    """

    plan: CallPlan
    # Why the arguments are unusable, when a stream said more than "not JSON".
    problem: str | None = None
    # When the turn received it (a streamed call: when its block closed).
    arrived_at: float = -math.inf
    # The arguments structured into the tool's annotated types (set when checked).
    bound: dict[str, Any] | None = attrs.field(default=None, repr=False)
    started: bool = False
    attempts: int = 0
    # Of them, refused as a scope's probe: its probes, not the call's tries
    # (`ScopeLike.probed`).
    probes: int = 0
    result: ToolResult | None = None
    # What to do the moment the call is answered while its tool runs (cut off by its
    # deadline, a sibling or the caller): tell its scopes the attempt ended then
    # (`_AttemptEnd`), not once the tool has unwound.
    on_cut_off: Callable[[], None] | None = attrs.field(default=None, repr=False)
    # Credentials the HTTP layer sent for this call; scrubbed from its answer.
    secrets: set[str] = attrs.field(factory=set, repr=False)
    # The tool's own answer (its return value or its own error), as opposed to fanout's:
    # only that is kept for replay, even where the turn answered first (a write that
    # returned after its timeout was answered ``timed_out``; its own answer is the truth
    # a re-issue is given, and the timed_out one was kept for a day instead).
    own_answer: ToolResult | None = attrs.field(default=None, repr=False)
    # An attempt's request broke after it was sent (`CallContext.effect_unknown`): a
    # write's effect is unknown from then on, whatever later attempts did.
    effect_unknown: bool = False
    claimed: bool = False  # holds its idempotency key in the run's store
    # Single-flight: the identical later calls of the turn this one answers (None
    # until one comes: most calls have none, and an empty list apiece is garbage
    # collector work for nothing).
    followers: list[CallState] | None = attrs.field(default=None, repr=False)
    # What of the call may still run after it was answered: a worker thread left to
    # finish, a task in the runner's nursery still unwinding; each set as it ends (None
    # until one is out). `work_ended` waits for them.
    unfinished: list[trio.Event] | None = attrs.field(default=None, repr=False)
    # What to do as a worker thread of the call ends (a write drops the cached reads).
    on_thread_end: Callable[[], None] | None = attrs.field(default=None, repr=False)
    # What the tool's worker thread returned, boxed, though no one awaited it any more (a
    # write answered at its timeout, its thread left to finish): its own answer, late.
    thread_returned: tuple[Any] | None = attrs.field(default=None, repr=False)
    _rng: random.Random | None = attrs.field(default=None, alias="_rng", repr=False)

    @property
    def call(self) -> ToolCall:
        return self.plan.call

    def work_begun(self) -> trio.Event:
        """Something of the call that may outlive its answer began: set what this returns
        as it ends."""
        ended = trio.Event()
        self.unfinished = [*(self.unfinished or ()), ended]
        return ended

    def work_ended_now(self) -> bool:
        """Whether nothing of the call runs any more (`work_ended` would not wait)."""
        return all(ended.is_set() for ended in self.unfinished or ())

    async def work_ended(self) -> None:
        """Wait until nothing of the call runs any more: not its task, not its thread.

        Answered at its deadline, a sync tool's thread is left to finish, and was taken
        for finished: the next write of a serial phase ran beside it, a write ran
        while a read's thread still read, and a cached read from before it was served
        after it ended.
        """
        for ended in self.unfinished or ():
            await ended.wait()

    @property
    def rng(self) -> random.Random:
        """The call's own jitter generator, made from its plan's seed on first use."""
        if self._rng is None:
            self._rng = random.Random(self.plan.seed)
        return self._rng


@attrs.frozen
class _Retry:
    """The decision to try again after ``delay`` seconds."""

    delay: float
    reason: str
    scope: str | None


@attrs.define
class _Within:
    """What every attempt of one call runs within: its budget, run, knobs, trace and turn.

    Never changed once made; not frozen, since a frozen class takes three times as
    long to build, and one is built for every call.
    """

    queued: Callable[[], None]
    budget: Budget
    run_id: str
    settings: CallSettings
    recorder: Recorder
    answered: Callable[[ToolResult], None]


class _SlotHolder:
    """A fresh identity per attempt, so a CapacityLimiter never sees one twice."""


async def execute(
    state: CallState,
    *,
    queued: Callable[[], None],
    budget: Budget,
    run_id: str,
    settings: CallSettings,
    recorder: Recorder,
    answered: Callable[[ToolResult], None],
) -> ToolResult:
    """Run one call to its answer: admit, invoke, and retry what may be retried.

    ``queued`` gives up the call's place in the turn's admission order (the
    next call may start); admission calls it, at the latest when the first
    attempt has been admitted or denied. Calling it again does nothing.
    ``answered`` is given the answer as soon as it is final, before the
    attempt's slots go back (the one returned, too).
    """
    assert state.plan.spec is not None
    policy = state.plan.spec.retry or settings.retry
    within = _Within(queued, budget, run_id, settings, recorder, answered)
    retries = 0
    while True:
        state.attempts += 1
        outcome = await _attempt(state, within)
        if isinstance(outcome, ToolResult):
            return outcome
        decision = await _decide(state, outcome, policy, retries, within)
        if isinstance(decision, ToolResult):
            return decision
        call = state.plan.call
        recorder.emit(
            EventKind.RETRY_SCHEDULED, call_id=call.id, tool=call.name, attempt=state.attempts,
            wait=decision.delay, reason=decision.reason, scope=decision.scope,
        )  # fmt: skip
        await trio.sleep(decision.delay)
        retries += 1


async def _attempt(state: CallState, within: _Within) -> ToolResult | ToolSignal:
    """One admission and one invocation; a signal means the runner decides what next."""
    plan, recorder = state.plan, within.recorder
    spec, call = plan.spec, plan.call
    assert spec is not None
    holder = _SlotHolder()
    held: list[ScopeLike] = []
    context: CallContext | None = None
    try:
        # A call with no scopes has no limiter to ask and no tokens to charge
        # (its tool's ``cost`` is not computed).
        due = await _admit(state, within, holder, held) if plan.scopes else -math.inf
        within.queued()
        if isinstance(due, Denial):
            if trio.current_time() >= within.budget.deadline:
                await let_the_deadline_answer()
            # A retry refused: the call ran before, and its effect may be unknown
            # (admission's words are for a call never sent).
            message = f"its retry: {due.message}" if state.started else due.message
            denied = failure(
                call, due.status, message, started=state.started, kind=spec.kind,
                scope=due.scope, retry_after=due.retry_after,
                effect_unknown=state.effect_unknown,
            )  # fmt: skip
            within.answered(denied)
            return denied
        # No body runs once the call is cancelled: a call admitted without a
        # wait (no scope) has not checkpointed yet, so check here.
        await trio.lowlevel.checkpoint_if_cancelled()
        if state.result is not None:
            # Answered while it waited (a sibling failed, under cancel_siblings): its
            # answer says it never started, so it never does. (In the runner's nursery,
            # a slot the failed call gave back woke it before its cancellation came, and
            # a write answered "cancelled, not started" charged the card.)
            return state.result
        for scope in plan.scopes:
            scope.retry_budget.record_request()
        recorder.emit(EventKind.STARTED, call_id=call.id, tool=call.name, attempt=state.attempts)
        now = trio.current_time()
        # Its leading fields by position, in `CallContext`'s order: built for every call,
        # and each keyword a class is called with goes into a dict first.
        context = CallContext(
            call, spec.kind, within.budget, plan.scopes, plan, within.run_id, state.attempts,
            recorder, state.secrets, admitted_at=now, booked_by=max(now, due),
            arrived_at=state.arrived_at,
        )  # fmt: skip
        for scope in context.scopes:
            scope.attempt_began(context.admitted_at)
        # Started as the tool is invoked, not before: a scope's hook or an instrument that
        # raised just before was answered "started: true, may have taken effect". A sync
        # tool has started once a worker thread runs it (`_call_fn`): one that waited for
        # a thread, all of them held by tools that ignored their cancellation, was
        # answered timed_out "started" though it never ran. And once started, in any
        # attempt, it has: a write retried after it ran, whose retry waited for a thread
        # to its deadline, was answered "not started".
        state.started = state.started or spec.is_async
        outcome = await _run_tool(state, spec, context, within)
        if isinstance(outcome, ToolResult):
            # Final: answered before its slots go back, so that a call that fails under
            # cancel_siblings has its siblings answered before one of them can take the
            # slot it gave back (one did, between the two, and ran).
            within.answered(outcome)
        return outcome
    finally:
        if context is not None:
            for give_back in context.places:  # a body the tool never closed (`fanout._slots`)
                give_back()
            if not context.requests:  # else its first request told the scopes
                for scope in context.scopes:
                    scope.attempt_ended(context.admitted_at)
        for scope in reversed(held):
            await _release(scope, holder)


_RELEASE_GRACE = 1.0  # seconds a scope may take to give a slot back before it is left to it


async def _release(scope: ScopeLike, holder: _SlotHolder) -> None:
    """Give ``scope`` its slot back, once the attempt's answer is made.

    A scope gives it back at once, shielded, and never raises (`ScopeFront`'s
    backends do). One plugged in that raised there replaced the tool's answer
    with fanout's failure, and a write that had taken effect was left to run
    again; one that never returned kept the answer until the call's timeout.
    Either now costs the call a log line, and at most ``_RELEASE_GRACE``.
    """
    try:
        with trio.move_on_after(_RELEASE_GRACE) as bounded:
            await scope.release_slot(holder)
    except Exception as exc:
        log_failure(_log, "fanout: scope %s failed to give a slot back", scope.name, exc=exc)
        return
    if bounded.cancelled_caught:
        _log.error(
            "fanout: scope %s did not give a slot back within %gs", scope.name, _RELEASE_GRACE
        )


async def _admit(
    state: CallState, within: _Within, holder: _SlotHolder, held: list[ScopeLike]
) -> Denial | float:
    """Admission (`admit`: the denial, or when the call's tokens are due), with a limiter
    that fails or cannot be reached refusing the call."""
    plan = state.plan
    call = plan.call
    assert plan.spec is not None
    assert isinstance(call.arguments, dict)
    try:
        return await admit(
            call, plan.scopes, holder=holder, held=held, budget=within.budget,
            cost=plan.spec.cost_of(call.arguments), inline_wait=within.settings.inline_wait,
            recorder=within.recorder, attempt=state.attempts, queued=within.queued,
        )  # fmt: skip
    except LimiterUnavailableError as exc:
        # Fail closed: a limiter we cannot reach cannot say the call may go.
        return Denial(Status.REFUSED, f"{describe(exc)}; the call was not sent", _UNAVAILABLE)
    except BaseException as exc:
        # Whatever a scope plugged in raises (a ``SystemExit``, a ``Cancelled`` it kept)
        # is this call's limiter failing, never its siblings' (`split_going_up`).
        cancelled, failed = split_going_up(exc)
        if failed is None:
            raise
        log_failure(_log, "fanout: admitting call %s (%s) failed", call.id, call.name, exc=failed)
        if cancelled is not None:
            raise cancelled from None
        return Denial(
            Status.REFUSED,
            f"the limiter of this call failed ({describe(failed)}); the call was not sent",
            _UNAVAILABLE,
        )


async def let_the_deadline_answer() -> None:
    """Yield once at the call's deadline, so the turn's answer for it is the one given.

    A wait that ran to the deadline (a slot, an idempotency claim) wakes at
    the same instant as the turn's deadline watcher, in an order trio picks
    at random. The watcher answers the call and cancels it; after one yield
    it has, whichever ran first, and the answer is the same on every run.
    """
    await trio.lowlevel.checkpoint()


async def _run_tool(
    state: CallState, spec: ToolSpec, context: CallContext, within: _Within
) -> ToolResult | ToolSignal:
    """Invoke the tool and turn whatever it does into an answer or a signal."""
    call = state.plan.call
    settings = within.settings
    assert state.bound is not None  # the turn checked the arguments before the call ran
    # For learning, an attempt went fine unless it was throttled or cut off:
    # a tool's own error still says the rate was acceptable.
    went_fine = False
    end = _AttemptEnd(state.plan.scopes, context)
    state.on_cut_off = end.cut_off
    try:
        value = await _invoke(spec, state, context, settings.threads, within.answered)
        went_fine = True
        result = success(call, value, limit=settings.max_output_chars, secrets=state.secrets)
        # A write whose request broke mid-answer has an unknown effect, even
        # when the tool swallowed the error: its answer is not kept for replay.
        state.own_answer = None if context.effect_unknown else result
        return result
    except IdleTimeoutError as idle:
        return failure(call, Status.TIMED_OUT, str(idle), started=True, kind=spec.kind)
    except _AnsweredFirst:
        assert state.result is not None
        return state.result
    except ToolSignal as signal:
        went_fine = not isinstance(signal, RateLimitedError | NotSentError)
        went_fine = went_fine and not context.refused
        state.effect_unknown |= context.effect_unknown or _partly_sent(context)
        return signal
    except Exception as exc:
        wrapped = _signal_within(exc)
        state.effect_unknown |= context.effect_unknown
        if wrapped is not None:  # an SDK re-raised fanout's signal as its own error
            went_fine = not isinstance(wrapped, RateLimitedError | NotSentError)
            went_fine = went_fine and not context.refused
            state.effect_unknown |= _partly_sent(context)
            return wrapped
        went_fine = True
        message = exc.description if isinstance(exc, _ToolRaised) else describe(exc)
        result = failure(
            call, Status.ERROR, message, started=True, kind=spec.kind,
            effect_unknown=state.effect_unknown,
            hint=_BROKE_OFF if state.effect_unknown else _TOOL_RAISED,
        )  # fmt: skip
        state.own_answer = None if context.effect_unknown else result
        return result
    finally:
        state.on_cut_off = None
        end.observe(ok=went_fine)


@attrs.define
class _AttemptEnd:
    """Tells an attempt's scopes, once, how long it ran and whether it went fine: as it
    ends, or the moment the call is answered while it runs, if sooner (`cut_off`).

    A call answered while its tool runs was cut off then (its deadline, a sibling's
    failure, the caller): that says only that the work takes at least as long as it
    ran until then, and whatever of the scope waited for its answer (a learning
    scope's probe) need wait no longer. How long the tool then took to unwind is no
    part of it: counted, a read that took 5 s to close after its 1 s timeout made the
    scope's latency 6 s, and the next call, behind one 0.1 s call under a 3 s timeout,
    was shed as "needs about 6.000s to drain"; and the calls behind a learning scope's
    probes cut off so waited for them to unwind.
    """

    scopes: tuple[ScopeLike, ...]
    context: CallContext
    told: bool = False

    def cut_off(self) -> None:
        self.observe(ok=False)

    def observe(self, *, ok: bool) -> None:
        if self.told:
            return
        self.told = True
        context = self.context
        elapsed = max(0.0, trio.current_time() - context.admitted_at - context.held)
        warm = not context.opened_connection
        reused = warm and context.reused_connection
        for scope in self.scopes:  # only a scope learns from how long the attempt took
            try:
                scope.observe_call(elapsed, ok=ok, warm=warm, reused=reused)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                # What the scope learns is its own: one of yours that fails to learn,
                # even by raising ``SystemExit``, leaves the answer the tool's (a write
                # that took effect was answered "fanout failed ... not finished"), and
                # raises nothing into the turn answering the call at its deadline.
                log_failure(_log, "fanout: scope %s failed to observe a call", scope.name, exc=exc)


_TOOL_RAISED = "the tool raised an error; fix the arguments or try another approach"
# A write whose request broke after it was sent: its server failed, not its arguments.
_BROKE_OFF = (
    "the connection broke after the call was sent; check whether it took effect before "
    "re-issuing it"
)


def _partly_sent(context: CallContext) -> bool:
    """Whether a write stopped by a signal (a request not sent, or refused) had a request
    the server took before: its effect is then unknown (a POST charged, its receipt's
    GET not affordable or refused with a 429, was answered "not sent" and told to
    re-issue it)."""
    return context.answered > 0 and context.kind is Kind.MUTATING


def _signal_within(exc: BaseException) -> ToolSignal | None:
    """A ``ToolSignal`` that ``exc`` was raised from, if any.

    The Anthropic and OpenAI SDKs catch what their transport raises and
    raise their own connection error from it; fanout's 429 signal is then
    the cause, and must still steer the runner.
    """
    seen: set[int] = set()
    cause = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen and len(seen) < 16:
        if isinstance(cause, ToolSignal):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


async def _invoke(
    spec: ToolSpec,
    state: CallState,
    context: CallContext,
    threads: trio.CapacityLimiter,
    answered: Callable[[ToolResult], None],
) -> Any:
    """Call the tool; anything it raises that is not a cancellation becomes an ``Exception``.

    A tool may raise a ``BaseException`` (``SystemExit``, ``GeneratorExit``, a
    group mixing a cancellation with an error). Cancellation and
    ``KeyboardInterrupt`` propagate, as trio requires; the rest is the tool's
    error, not the turn's. (Re-raised, a tool's ``GeneratorExit`` crashed the
    turn, and its siblings were answered as fanout's failure.)
    """
    token = set_current_call(context)
    try:
        if spec.idle_timeout is None:
            return await _call_fn(spec, state, threads)
        # Progress (context.report_progress) pushes the idle deadline out.
        context.idle = watch = IdleWatch(spec.idle_timeout, context.budget)
        idle = IdleTimeoutError(spec.idle_timeout)
        call = state.plan.call

        def answer_idle() -> None:
            # A sync tool still waiting for a thread has not started (`_in_a_thread`).
            answered(
                failure(call, Status.TIMED_OUT, str(idle), started=state.started, kind=spec.kind)
            )

        # What the tool raises is carried out of the watch's nursery, not raised in its
        # body: trio writes the body's exception with ``repr`` as it closes the nursery,
        # and one whose ``__repr__`` raised left it half-closed (an open runner's trio
        # run died, "Nursery stack corrupted"). Only what must go up goes through it.
        raised: BaseException | None = None
        try:
            async with trio.open_nursery() as watching:
                watching.start_soon(watch.watch, answer_idle)
                with watch.scope:
                    try:
                        value = await _call_fn(spec, state, threads)
                    except BaseException as exc:
                        if split_going_up(exc)[0] is not None:
                            raise
                        raised = exc
                    watching.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The watch never fails: what the nursery wrapped is the tool's own.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        if raised is not None:
            raise raised
        if not watch.scope.cancelled_caught:
            return value
        raise idle
    except Exception:
        raise
    except BaseException as exc:  # ``SystemExit``, ``GeneratorExit``, its own kinds, groups
        # A ``Cancelled`` the tool kept (a retry helper re-raising its last error) when
        # nothing around it was cancelled is its error too (`split_going_up`): let
        # through, alone or in a group, it read as the caller cancelling the turn.
        passing, rest = split_going_up(exc)
        if passing is not None:
            raise passing from None
        assert rest is not None
        if isinstance(rest, trio.Cancelled):
            raise _ToolRaised(
                "Cancelled: the tool raised a cancellation when nothing had cancelled it"
            ) from None
        raise _ToolRaised(describe(rest)) from None
    finally:
        reset_current_call(token)


def _call_fn(spec: ToolSpec, state: CallState, threads: trio.CapacityLimiter) -> Awaitable[Any]:
    """The tool's run, to await: its own coroutine, or its call in a worker thread."""
    arguments = state.bound
    assert arguments is not None
    if spec.is_async:
        coroutine: Awaitable[Any] = spec.fn(**arguments)  # typed so: a cast is a call more
        return coroutine
    return _in_a_thread(functools.partial(spec.fn, **arguments), state, threads)


async def _in_a_thread(
    fn: Callable[[], Any], state: CallState, threads: trio.CapacityLimiter
) -> Any:
    """``fn`` in a worker thread, the call started once a thread is its.

    A sync tool waits for one of the ``max_threads`` (those that ignored their
    cancellation keep theirs until they end): answered while it waits, it never
    started (one was answered "started: true" though it never ran). Once it has a
    place, it has started, whenever trio's thread then runs it (marked started only
    as the thread ran it, a write cut off between the two was answered "started:
    false" and ran). ``abandon_on_cancel``: a tool that never returns cannot hold the
    turn past its deadline; its thread is left to finish on its own, in its place.
    """
    place = _ThreadPlace(threads, state)
    await threads.acquire_on_behalf_of(place)
    place.taken()
    if state.result is not None:
        # Answered while it waited, and woken by a thread given back before the
        # cancellation that answer brings (a deadline cancels a batch at a time, a
        # sibling's failure in the runner's nursery a checkpoint later): it never
        # starts. (Run, a write answered "not started" charged the card.)
        place.release_on_behalf_of(place)
        raise _AnsweredFirst
    state.started = True

    def runs() -> Any:
        value = fn()
        state.thread_returned = (value,)  # read once the thread has ended
        return value

    try:
        # Typed as a CapacityLimiter; trio takes any object with its two methods.
        limiter = cast("trio.CapacityLimiter", place)
        return await trio.to_thread.run_sync(runs, abandon_on_cancel=True, limiter=limiter)
    finally:
        if not place.handed:  # cancelled before trio took the place: give it back
            place.release_on_behalf_of(place)


class _ThreadPlace:
    """One of the ``max_threads`` places, taken already: trio's ``run_sync`` takes it
    from here without a wait, and gives it back when its thread has ended, abandoned or
    not, which is when the call's work has ended (`CallState.work_ended`)."""

    def __init__(self, threads: trio.CapacityLimiter, state: CallState) -> None:
        self._threads = threads
        self._state = state
        self._ended: trio.Event | None = None
        self.handed = False

    def taken(self) -> None:
        """The place is this call's now: its work runs until the place is given back."""
        self._ended = self._state.work_begun()

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        self.handed = True

    def release_on_behalf_of(self, borrower: object) -> None:
        self._threads.release_on_behalf_of(self)
        if self._ended is not None:
            self._ended.set()
        if self._state.on_thread_end is not None:
            self._state.on_thread_end()


class _AnsweredFirst(Exception):
    """A call answered while it waited for a worker thread: its tool never runs."""


class _ToolRaised(Exception):
    """A tool raised a ``BaseException`` that is not fanout's to propagate."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


async def _decide(
    state: CallState,
    signal: ToolSignal,
    policy: RetryPolicy,
    retries: int,
    within: _Within,
) -> ToolResult | _Retry:
    """Tell the scopes what the downstream said; answer now, or retry after a delay."""
    budget, recorder = within.budget, within.recorder
    plan = state.plan
    spec, call = plan.spec, plan.call
    assert spec is not None
    wait = usable_wait(signal.retry_after)
    named = signal.scope if isinstance(signal.scope, str) else None
    targets = scopes_named(plan.scopes, named)
    scope_name = targets[0].name if targets else named

    def answer(status: Status, message: str, **extra: Any) -> ToolResult:
        return failure(
            call, status, message, started=True, kind=spec.kind, scope=scope_name,
            effect_unknown=state.effect_unknown, **extra,
        )  # fmt: skip

    if isinstance(signal, NotSentError):
        return answer(signal.status, describe(signal), retry_after=wait)
    horizon = quota_horizon(targets)
    if isinstance(signal, QuotaExhaustedError) or (
        isinstance(signal, RateLimitedError) and wait is not None and wait > horizon
    ):
        reset = wait if wait is not None else horizon
        for scope in targets:
            scope.exhaust(trio.current_time() + reset)
            recorder.emit(
                EventKind.SCOPE_EXHAUSTED, call_id=call.id, tool=call.name,
                scope=scope.name, wait=reset,
            )  # fmt: skip
        return answer(Status.QUOTA_EXHAUSTED, describe(signal), retry_after=reset)
    probe = False
    if isinstance(signal, RateLimitedError):
        for scope in targets:
            # A bare 429 (no wait stated) still drains the bucket and drives AIMD.
            await scope.on_throttled(wait, sent_at=signal.sent_at)
            if wait is not None:
                recorder.emit(
                    EventKind.SCOPE_BLOCKED, call_id=call.id, tool=call.name,
                    scope=scope.name, wait=wait,
                )  # fmt: skip
        if not signal.retryable:
            return answer(
                Status.RATE_LIMITED, f"{describe(signal)}; the server said not to retry",
                retry_after=wait,
                hint="the server asked for this call not to be retried; do not re-issue it now",
            )  # fmt: skip
        status = Status.RATE_LIMITED
        # The scope's probe (its first wave while learning, or one request when a server
        # it found shut may have reopened): a refusal then is the scope's, not the
        # call's try, and a retry adds no load (four probes of a window of 5 per 10 s
        # spent the retry budget, and a call was answered "downstream failing"). The
        # wait stays charged to the call's budget.
        probe = any(scope.probed(signal.sent_at) for scope in targets)
        if probe:
            state.probes += 1
    elif isinstance(signal, TransientError):
        status = Status.ERROR
    else:
        return answer(Status.ERROR, describe(signal))
    retry_after = wait if status is Status.RATE_LIMITED else None
    if state.attempts - state.probes >= policy.attempts:
        return answer(
            status, f"{describe(signal)}; gave up after {state.attempts} attempts",
            retry_after=retry_after,
        )  # fmt: skip
    delay = wait if wait is not None else policy.backoff(retries, state.rng)
    why = _retry_refused(plan, delay, budget, charged=not probe)
    if why is not None:
        shown = delay if status is Status.RATE_LIMITED else None
        return answer(status, f"{describe(signal)}; {why}", retry_after=shown)
    return _Retry(delay, type(signal).__name__, scope_name)


def _retry_refused(
    plan: CallPlan, delay: float, budget: Budget, *, charged: bool = True
) -> str | None:
    """Why a retry after ``delay`` may not be made, or None to make it; ``charged``: it
    spends the scopes' retry budgets."""
    latencies = [s.expected_latency() for s in plan.scopes]
    known = [latency for latency in latencies if latency is not None]
    latency = max(known) if known else None
    verdict = budget.judge(delay, latency=latency)
    if verdict is not Verdict.SLEEP:
        why = budget.explain(verdict, latency=latency)
        return f"the retry would wait {delay:.3f}s, {why}; it was not sent"
    for scope in plan.scopes if charged else ():
        if not scope.retry_budget.try_spend():
            return (
                f"scope {scope.name!r} has spent its retry budget; the downstream "
                "is failing and fanout will not add load to it"
            )
    return None


def describe(exc: BaseException) -> str:
    """Exception type and message: enough to act on, with no traceback and no credential.

    Messages often quote what failed (a URL with ``?api_key=``, a header), so
    credential-shaped text is redacted before the model can read it. A
    message that cannot be printed is replaced by its type.
    """
    text = redact_text(safe_text(exc))
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
