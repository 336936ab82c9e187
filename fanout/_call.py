"""One call's life: admission, the tool itself, and the retries in between.

``execute`` always returns the call's answer, except when it is cancelled
from outside (its own deadline, the turn's, a failed sibling, the caller);
the turn answers those. Slots are released in ``finally`` and tokens refunded
by admission, so cancellation at any point leaves the scopes consistent.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._admission import Denial, admit
from ._answers import failure, success
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
from ._redact import redact_text
from ._registry import ToolSpec
from ._retry import RetryPolicy
from ._scope import ScopeLike, scopes_named
from ._values import Status, ToolCall, ToolResult

if TYPE_CHECKING:
    from ._budget import Budget

__all__ = ["CallSettings", "CallState", "execute"]


@attrs.frozen
class CallSettings:
    """The runner's knobs that shape one call."""

    retry: RetryPolicy
    inline_wait: float | None
    max_output_chars: int
    threads: trio.CapacityLimiter


@attrs.define
class CallState:
    """What the turn knows of one call while it runs."""

    call: ToolCall
    spec: ToolSpec | None
    scopes: tuple[ScopeLike, ...] = ()
    idempotency_key: str = ""
    started: bool = False
    attempts: int = 0
    result: ToolResult | None = None
    queued: Callable[[], None] = attrs.field(default=lambda: None, eq=False)
    # Each call draws its jitter from its own generator, seeded from the turn
    # and its id (made on first use), so which call drew first cannot change
    # anyone's backoff.
    seed: str = ""
    _rng: random.Random | None = attrs.field(default=None, eq=False, alias="_rng")
    # Credentials the HTTP layer sent for this call; scrubbed from its answer.
    secrets: set[str] = attrs.field(factory=set, eq=False)
    # Whether the final answer is the tool's own (a return value or its own
    # error), as opposed to fanout's; only those are kept for replay.
    answered_by_tool: bool = False
    claimed: bool = False  # holds its idempotency key in the run's store
    # Single-flight: an identical earlier call of the turn answers this one.
    leader: CallState | None = attrs.field(default=None, eq=False, repr=False)
    followers: list[CallState] = attrs.field(factory=list, eq=False, repr=False)

    @property
    def rng(self) -> random.Random:
        if self._rng is None:
            self._rng = random.Random(self.seed)
        return self._rng


_UNAVAILABLE = "limiter unavailable"


class _SlotHolder:
    """A fresh identity per attempt, so a CapacityLimiter never sees one twice."""


async def execute(
    state: CallState, *, budget: Budget, run_id: str, settings: CallSettings, recorder: Recorder
) -> ToolResult:
    """Run one call to its answer: admit, invoke, and retry what may be retried."""
    assert state.spec is not None
    assert isinstance(state.call.arguments, dict)
    spec, call = state.spec, state.call
    policy = spec.retry or settings.retry
    retries = 0
    while True:
        state.attempts += 1
        outcome = await _attempt(state, budget, run_id, settings, recorder)
        if isinstance(outcome, ToolResult):
            return outcome
        signal = outcome
        decided = await _absorb_signal(state, signal, recorder)
        if isinstance(decided, ToolResult):
            return decided
        server_wait = decided
        is_throttle = isinstance(signal, RateLimitedError)
        status = Status.RATE_LIMITED if is_throttle else Status.ERROR
        scope_name = _signal_scope(state, signal)
        if state.attempts >= policy.attempts:
            return _gave_up(state, status, signal, server_wait, scope_name)
        delay = server_wait if server_wait is not None else policy.backoff(retries, state.rng)
        refusal = _retry_refusal(state, status, signal, delay, budget, settings, scope_name)
        if refusal is not None:
            return refusal
        recorder.emit(
            EventKind.RETRY_SCHEDULED, call_id=call.id, tool=call.name,
            attempt=state.attempts, wait=delay, reason=type(signal).__name__, scope=scope_name,
        )  # fmt: skip
        await trio.sleep(delay)
        retries += 1


async def _attempt(
    state: CallState, budget: Budget, run_id: str, settings: CallSettings, recorder: Recorder
) -> ToolResult | ToolSignal:
    """One admission and one invocation; a signal means the runner decides what next."""
    spec, call = state.spec, state.call
    assert spec is not None
    assert isinstance(call.arguments, dict)
    holder = _SlotHolder()
    held: list[ScopeLike] = []
    try:
        try:
            denial = await admit(
                call, state.scopes, holder=holder, held=held, budget=budget,
                cost=spec.cost_of(call.arguments), inline_wait=settings.inline_wait,
                recorder=recorder, attempt=state.attempts, queued=state.queued,
            )  # fmt: skip
        except LimiterUnavailableError as exc:
            # Fail closed: a limiter we cannot reach cannot say the call may go.
            denial = Denial(Status.RATE_LIMITED, f"{exc}; the call was not sent", _UNAVAILABLE)
        state.queued()
        if denial is not None:
            return failure(
                call, denial.status, denial.message, started=state.started, kind=spec.kind,
                scope=denial.scope, retry_after=denial.retry_after,
            )  # fmt: skip
        state.started = True
        for scope in state.scopes:
            scope.retry_budget.record_request()
        recorder.emit(EventKind.STARTED, call_id=call.id, tool=call.name, attempt=state.attempts)
        context = CallContext(
            call=call, kind=spec.kind, budget=budget, scopes=state.scopes,
            idempotency_key=state.idempotency_key, run_id=run_id,
            attempt=state.attempts, recorder=recorder, inline_wait=settings.inline_wait,
            secrets=state.secrets,
        )  # fmt: skip
        began = trio.current_time()
        # For learning, an attempt went fine unless it was throttled or cut off:
        # a tool's own error still says the rate was acceptable.
        went_fine = False
        try:
            value = await _invoke(spec, call.arguments, context, settings.threads)
            went_fine = state.answered_by_tool = True
        except ToolSignal as signal:
            went_fine = not isinstance(signal, RateLimitedError | NotSentError)
            return signal
        except Exception as exc:
            went_fine = state.answered_by_tool = True
            return failure(
                call, Status.ERROR, _describe(exc), started=True, kind=spec.kind,
                hint="the tool raised an error; fix the arguments or try another approach",
            )  # fmt: skip
        finally:
            for scope in state.scopes:
                scope.observe_call(trio.current_time() - began, ok=went_fine)
        return success(call, value, limit=settings.max_output_chars)
    finally:
        for scope in reversed(held):
            await scope.release_slot(holder)


async def _invoke(
    spec: ToolSpec, arguments: dict[str, Any], context: CallContext, threads: trio.CapacityLimiter
) -> Any:
    token = set_current_call(context)
    try:
        if spec.is_async:
            return await spec.fn(**arguments)
        # abandon_on_cancel: a sync tool that never returns cannot hold the
        # turn past its deadline; its thread is left to finish on its own.
        return await trio.to_thread.run_sync(
            functools.partial(spec.fn, **arguments), abandon_on_cancel=True, limiter=threads
        )
    finally:
        reset_current_call(token)


async def _absorb_signal(
    state: CallState, signal: ToolSignal, recorder: Recorder
) -> ToolResult | float | None:
    """Tell the scopes what the downstream said; return its wait, or a final answer."""
    spec, call = state.spec, state.call
    assert spec is not None
    if isinstance(signal, NotSentError):
        return failure(
            call, signal.status, str(signal), started=True, kind=spec.kind,
            scope=signal.scope, retry_after=signal.retry_after,
        )  # fmt: skip
    targets = scopes_named(state.scopes, getattr(signal, "scope", None))
    horizon = min((scope.quota_horizon for scope in targets), default=3600.0)
    if isinstance(signal, QuotaExhaustedError) or (
        isinstance(signal, RateLimitedError)
        and signal.retry_after is not None
        and signal.retry_after > horizon
    ):
        reset = getattr(signal, "reset_after", None) or getattr(signal, "retry_after", None)
        until = trio.current_time() + (reset if reset is not None else horizon)
        for scope in targets:
            scope.exhaust(until)
            recorder.emit(
                EventKind.SCOPE_EXHAUSTED, call_id=call.id, tool=call.name,
                scope=scope.name, wait=until - trio.current_time(),
            )  # fmt: skip
        return failure(
            call, Status.QUOTA_EXHAUSTED, _describe(signal), started=True, kind=spec.kind,
            scope=_signal_scope(state, signal), retry_after=reset,
        )  # fmt: skip
    if isinstance(signal, RateLimitedError):
        for scope in targets:
            # A bare 429 (no wait stated) still drains the bucket and drives AIMD.
            await scope.on_throttled(signal.retry_after)
            if signal.retry_after is not None:
                recorder.emit(
                    EventKind.SCOPE_BLOCKED, call_id=call.id, tool=call.name,
                    scope=scope.name, wait=signal.retry_after,
                )  # fmt: skip
        if not signal.retryable:
            return failure(
                call, Status.RATE_LIMITED, f"{_describe(signal)}; the server said not to retry",
                started=True, kind=spec.kind, scope=_signal_scope(state, signal),
                retry_after=signal.retry_after,
                hint="the server asked for this call not to be retried; do not re-issue it now",
            )  # fmt: skip
        return signal.retry_after
    if isinstance(signal, TransientError):
        return None
    return failure(call, Status.ERROR, _describe(signal), started=True, kind=spec.kind)


def _signal_scope(state: CallState, signal: ToolSignal) -> str | None:
    targets = scopes_named(state.scopes, getattr(signal, "scope", None))
    return targets[0].name if targets else getattr(signal, "scope", None)


def _gave_up(
    state: CallState,
    status: Status,
    signal: ToolSignal,
    wait: float | None,
    scope: str | None,
) -> ToolResult:
    assert state.spec is not None
    return failure(
        state.call, status,
        f"{_describe(signal)}; gave up after {state.attempts} attempts",
        started=True, kind=state.spec.kind, scope=scope,
        retry_after=wait if status is Status.RATE_LIMITED else None,
    )  # fmt: skip


def _retry_refusal(
    state: CallState,
    status: Status,
    signal: ToolSignal,
    delay: float,
    budget: Budget,
    settings: CallSettings,
    scope: str | None,
) -> ToolResult | None:
    """The answer when a retry's wait may not be slept, or None to go ahead."""
    assert state.spec is not None
    why = None
    if not budget.fits(delay):
        why = f"the retry would wait {delay:.3f}s, past the call's deadline; it was not sent"
    elif settings.inline_wait is not None and delay > settings.inline_wait:
        why = (
            f"the retry would wait {delay:.3f}s, longer than fanout waits inline "
            f"({settings.inline_wait:g}s); it was not sent"
        )
    else:
        for candidate in state.scopes:
            if not candidate.retry_budget.try_spend():
                why = (
                    f"scope {candidate.name!r} has spent its retry budget; the downstream "
                    "is failing and fanout will not add load to it"
                )
                scope = candidate.name
                break
    if why is None:
        return None
    return failure(
        state.call, status, f"{_describe(signal)}; {why}", started=True, kind=state.spec.kind,
        scope=scope, retry_after=delay if status is Status.RATE_LIMITED else None,
    )  # fmt: skip


def _describe(exc: BaseException) -> str:
    """Exception type and message: enough to act on, with no traceback and no credential.

    Messages often quote what failed (a URL with ``?api_key=``, a header), so
    credential-shaped text is redacted before the model can read it.
    """
    text = redact_text(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
