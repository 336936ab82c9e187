"""Admission: what a call must get from its scopes before it may start.

In order: no scope's quota is spent; no scope's queue is full (else the call
is shed at once with a drain estimate); a slot on each scope, taken in one
global order (by name) so two calls can never hold one each and wait for the
other's; then tokens on each scope. Every wait is bounded by the call's
budget and by the inline threshold; a call that cannot be admitted in time is
denied, never sent, and nothing it reserved stays consumed.

Order: a turn admits its calls in the model's order. It starts the next call
only once this one calls ``queued()``: when it is admitted or denied, or just
before it blocks (on a slot that is not free, or in its token wait). A call
that has only to reserve never blocks, so its place is taken in order, and
the transcript does not depend on how trio happened to schedule the tasks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs
import trio

from ._events import EventKind, Recorder
from ._exceptions import ConfigurationError
from ._values import Status, ToolCall

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._budget import Budget
    from ._scope import ScopeLike, SlotHolder

__all__ = ["Denial", "Shortfall", "admit", "take_tokens"]


@attrs.frozen
class Denial:
    """Why a call was not admitted: the answer to give instead of running it."""

    status: Status
    message: str
    scope: str | None = None
    retry_after: float | None = None


async def admit(
    call: ToolCall,
    scopes: Sequence[ScopeLike],
    *,
    holder: SlotHolder,
    held: list[ScopeLike],
    budget: Budget,
    cost: float,
    inline_wait: float | None,
    recorder: Recorder,
    attempt: int,
    queued: Callable[[], None],
) -> Denial | None:
    """Admit ``call`` on every scope, or say why not.

    Slots taken are appended to ``held``; the caller releases them in a
    ``finally`` whatever happens, including cancellation during this function.
    """
    if not scopes:
        return None
    denial = _check_open(call, scopes, recorder)
    if denial is not None:
        return denial
    now = trio.current_time()
    patience = budget.deadline if inline_wait is None else min(budget.deadline, now + inline_wait)
    for scope in scopes:
        if not scope.has_free_slot():
            queued()
        if not await scope.acquire_slot(holder, patience):
            return _slot_denial(scope, budget, inline_wait)
        held.append(scope)
        if scope.max_concurrency is not None:
            recorder.emit(
                EventKind.SLOT_ACQUIRED, call_id=call.id, tool=call.name,
                scope=scope.name, attempt=attempt,
            )  # fmt: skip

    def waiting(wait: float, slowest: str | None) -> None:
        recorder.emit(
            EventKind.TOKEN_WAIT, call_id=call.id, tool=call.name, attempt=attempt,
            scope=slowest, wait=wait,
        )  # fmt: skip
        queued()

    shortfall = await take_tokens(scopes, cost, budget=budget, patience=patience, on_wait=waiting)
    return None if shortfall is None else _token_denial(shortfall, budget, inline_wait)


def _check_open(call: ToolCall, scopes: Sequence[ScopeLike], recorder: Recorder) -> Denial | None:
    now = trio.current_time()
    for scope in scopes:
        until = scope.exhausted_until()
        if until is not None:
            return Denial(
                Status.QUOTA_EXHAUSTED,
                f"the quota of scope {scope.name!r} is spent until it resets; "
                "the call was not sent",
                scope.name,
                until - now,
            )
    for scope in scopes:
        if scope.should_shed():
            scope.count_shed()
            estimate = scope.drain_estimate()
            recorder.emit(
                EventKind.SHED, call_id=call.id, tool=call.name, scope=scope.name, wait=estimate
            )
            return Denial(
                Status.RATE_LIMITED,
                f"scope {scope.name!r} already has a full queue of waiting calls; "
                "this one was answered at once instead of queueing, and was not sent",
                scope.name,
                estimate,
            )
    return None


def _slot_denial(scope: ScopeLike, budget: Budget, inline_wait: float | None) -> Denial:
    if trio.current_time() >= budget.deadline:
        return Denial(
            Status.TIMED_OUT,
            f"no slot on scope {scope.name!r} came free before the call's deadline; "
            "the call was not sent",
            scope.name,
        )
    return Denial(
        Status.RATE_LIMITED,
        f"no slot on scope {scope.name!r} came free within {inline_wait:g}s; the call was not sent",
        scope.name,
        scope.drain_estimate(),
    )


@attrs.frozen
class Shortfall:
    """Tokens a scope could not give in time: how long they would take, or why never."""

    scope: str
    needed: float
    never: str | None = None
    late: float | None = None  # the expected duration that would end past the deadline


async def take_tokens(
    scopes: Sequence[ScopeLike],
    cost: float,
    *,
    budget: Budget,
    patience: float,
    on_wait: Callable[[float, str | None], None],
) -> Shortfall | None:
    """Reserve ``cost`` on every scope and sleep the longest wait, or say what fell short.

    ``patience`` is the absolute time the caller may wait until. Reservations
    are refunded if any scope falls short or the sleep is cancelled, so the
    buckets never keep tokens for a request that was not sent. ``on_wait``
    hears of a wait (seconds, slowest scope) just before it is slept.
    """
    reserved: list[ScopeLike] = []
    taken = False
    try:
        longest, slowest = 0.0, None
        for scope in scopes:
            try:
                wait = await scope.reserve(cost, max(0.0, patience - trio.current_time()))
            except ConfigurationError as exc:
                return Shortfall(scope.name, math.inf, never=str(exc))
            if wait is not None:
                reserved.append(scope)
            if wait is None or not budget.fits(wait):
                needed = await scope.wait_for(cost) if wait is None else wait
                return Shortfall(scope.name, needed)
            expected = scope.expected_latency()
            if wait > 0 and expected is not None and not budget.fits(wait + expected):
                # Waiting only to be cut off would waste the request (and, for a
                # write, leave its effect unknown): answer now instead.
                return Shortfall(scope.name, wait, late=expected)
            if wait > longest:
                longest, slowest = wait, scope.name
        if longest > 0:
            on_wait(longest, slowest)
            for scope in scopes:
                scope.note_waiting(+1)
            try:
                await trio.sleep(longest)
            finally:
                for scope in scopes:
                    scope.note_waiting(-1)
        taken = True
        return None
    finally:
        if not taken:
            for scope in reserved:
                await scope.refund(cost)


def _token_denial(shortfall: Shortfall, budget: Budget, inline_wait: float | None) -> Denial:
    name, needed = shortfall.scope, shortfall.needed
    if shortfall.never is not None:
        return Denial(Status.REFUSED, shortfall.never, name)
    if not math.isfinite(needed):
        return Denial(Status.TIMED_OUT, f"scope {name!r} has no capacity in sight", name)
    if shortfall.late is not None:
        return Denial(
            Status.RATE_LIMITED,
            f"scope {name!r} allows this call in {needed:.3f}s, but calls there take about "
            f"{shortfall.late:.3f}s and it would end past its deadline; the call was not sent",
            name,
            needed,
        )
    where = (
        "past the call's deadline"
        if not budget.fits(needed)
        else f"longer than fanout waits inline ({inline_wait:g}s)"
    )
    return Denial(
        Status.RATE_LIMITED,
        f"scope {name!r} allows this call in {needed:.3f}s, {where}; the call was not sent",
        name,
        needed,
    )
