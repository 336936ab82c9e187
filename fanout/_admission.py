"""Admission: what a call must get from its scopes before it may start.

In order: no scope's quota is spent; no scope's queue is too long for the
call's budget (else the call is shed at once with a drain estimate); a slot
on each scope, taken in one global order (by name) so two calls can never
hold one each and wait for the other's; then tokens on each scope, booked,
slept, and confirmed (a booking the server overruled meanwhile is booked
again), unless even the quickest call seen there would now end past the
deadline. The budget judges every wait; a call that cannot be admitted in
time is denied, never sent, and nothing it booked stays consumed.

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

from ._budget import Verdict
from ._events import EventKind, Recorder
from ._exceptions import ConfigurationError
from ._values import Status, ToolCall

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._bucket import Booking
    from ._budget import Budget
    from ._scope import ScopeLike, SlotHolder

__all__ = ["Denial", "Shortfall", "admit", "take_tokens"]

_TRIES = 3  # bookings tried while the wait keeps changing under a call
# Seconds: a call's tokens on its scopes due within this of each other start it together.
# (At 1 ms, a shared bucket's bookings, timed across a Redis round trip, were always a few
# ms off a local one's: each was given back and booked again, at the back of its line,
# until the calls' deadlines.)
_APART = 0.01


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
) -> Denial | float:
    """Admit ``call`` on every scope, or say why not: the denial, or when its tokens are
    due (now, or later where a scope lets it start ahead of them).

    Slots taken are appended to ``held``; the caller releases them in a
    ``finally`` whatever happens, including cancellation during this function.
    Every wait is judged by ``budget`` (which holds the inline threshold);
    ``inline_wait`` is accepted for the caller's sake and not read.
    """
    if not scopes:
        return trio.current_time()
    denial = _check_open(call, scopes, budget, recorder)
    if denial is not None:
        return denial
    for scope in scopes:
        if not scope.has_free_slot():
            queued()
        if not await scope.acquire_slot(holder, budget.patience()):
            return _slot_denial(scope, budget)
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

    due = [trio.current_time()]
    shortfall = await take_tokens(
        scopes, cost, budget=budget, patience=budget.patience(), on_wait=waiting,
        admits=due.append,
    )  # fmt: skip
    return max(due) if shortfall is None else _token_denial(shortfall, budget)


def _check_open(
    call: ToolCall, scopes: Sequence[ScopeLike], budget: Budget, recorder: Recorder
) -> Denial | None:
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
        full = scope.queue_full()
        estimate = scope.shed(budget)
        if estimate is None:
            continue
        recorder.emit(
            EventKind.SHED, call_id=call.id, tool=call.name, scope=scope.name, wait=estimate
        )
        if full:
            why = "already has a full queue of waiting calls"
        else:
            verdict = budget.judge(estimate, latency=scope.expected_latency())
            explained = budget.explain(verdict, latency=scope.expected_latency())
            why = f"has a queue that needs about {estimate:.3f}s to drain, {explained}"
        return Denial(
            Status.RATE_LIMITED,
            f"scope {scope.name!r} {why}; answered at once instead of queueing, it was not sent",
            scope.name,
            estimate,
        )
    return None


def _slot_denial(scope: ScopeLike, budget: Budget) -> Denial:
    if trio.current_time() >= budget.deadline or budget.inline_wait is None:
        return Denial(
            Status.TIMED_OUT,
            f"no slot on scope {scope.name!r} came free before the call's deadline; "
            "the call was not sent",
            scope.name,
        )
    return Denial(
        Status.RATE_LIMITED,
        f"no slot on scope {scope.name!r} came free within {budget.inline_wait:g}s; "
        "the call was not sent",
        scope.name,
        scope.drain_estimate(),
    )


@attrs.frozen
class Shortfall:
    """Tokens a scope could not give in time: how long they would take, and why not."""

    scope: str
    needed: float
    verdict: Verdict = Verdict.PAST_DEADLINE
    never: str | None = None
    latency: float | None = None  # the scope's usual latency, when it decided


async def take_tokens(
    scopes: Sequence[ScopeLike],
    cost: float,
    *,
    budget: Budget,
    patience: float,
    on_wait: Callable[[float, str | None], None],
    admits: Callable[[float], None] | None = None,
) -> Shortfall | None:
    """Book ``cost`` on every scope and sleep the longest wait, or say what fell short.

    A call takes its tokens on all its scopes at the instant it starts: the scopes
    whose tokens come last are booked first (`_latest_first`), the others once those
    are due, and a booking due sooner than the call's last is given back and booked
    again (`_early`), so that no scope counts the call from before it starts.
    ``patience`` is the absolute time the caller may wait until; the budget
    judges every wait. After the sleep each booking is confirmed: a drain or
    block since it was made voids it (the server said otherwise meanwhile),
    and the call books again on every scope, within the same budget, or is
    denied. Bookings
    are refunded if any scope falls short or the sleep is cancelled, so the
    buckets never keep tokens for a request that was not sent.

    ``admits``: the tokens admit a call, which may start a scope's lead
    before them (`ScopeFront.admission_lead`), and is told when they are due
    (a window's log knows its booking by that, `SlidingLog.confirm`); a later
    request of the call leaves as its tokens are taken, and is given none.
    """
    if not scopes:  # nothing to book (a scope-less call's second request)
        await trio.lowlevel.checkpoint()
        return None
    held: list[tuple[ScopeLike, Booking]] = []  # booked, not confirmed yet
    try:
        while True:
            todo = [scope for scope in scopes if not _has(held, scope)]
            if todo:
                if not held:
                    todo = await _latest_first(todo, cost)
                booked = await _book_all(todo, cost, budget, patience)
                if isinstance(booked, Shortfall):
                    await _refund(held)
                    held.clear()
                    if await _wait_for_a_rise(scopes, booked, budget, patience, on_wait):
                        continue
                    return booked
                held += booked
            early = _early(held)
            if early:
                # A token due sooner than the call's last is given back, and booked again
                # once that one is due (the look ahead may have been wrong). Never taken
                # early: counted from before its call starts, a window's token came back
                # before the server's did (three in 1.5 s against 2 per 2 s).
                for pair in early:
                    held.remove(pair)
                await _refund(early)
            longest, slowest = _longest_wait(held, ahead=admits is not None)
            if longest > 0:
                assert slowest is not None
                on_wait(longest, slowest.name)
            woken_for = await _sleep_until_due(
                held, admits=admits is not None, budget=budget, patience=patience
            )
            if woken_for is None:  # moved past what the budget allows: book again, judged
                await _refund(held)
                held.clear()
                continue
            if len(held) < len(scopes):
                continue  # the tokens that come last are due: book the others now
            doomed = _ends_late_however_quick(scopes, budget)
            if doomed is not None:
                return doomed
            if await _confirm_all(held, woken_for):
                if admits is not None:
                    admits(max(booking.starts for _, booking in held))
                held.clear()  # started: nothing to give back
                return None
            # One was voided: booked again everywhere, as a token confirmed already would
            # be counted from before the call starts (a bucket of one started two calls at
            # once). Given back now, each is a token due now, which the call's own
            # booking may take again (`TokenBucket.refund`).
            await _refund(held)
            held.clear()
    finally:
        await _refund(held)


async def _confirm_all(held: list[tuple[ScopeLike, Booking]], woken_for: float) -> bool:
    """Confirm each booking, in order; False at the first that no longer holds (those after
    it are not asked). ``woken_for``: when the sleep for them was to end.

    How late the process woke the call is taken before any confirmation's own time: a
    shared schedule's confirmation waits where the schedule moved, and counted as waking
    late, that wait widened the slack, which moved the schedule further (a shared bucket
    of one at 30/s took 2.9 times the minimum).
    """
    woke_late = trio.current_time() - woken_for
    for scope, booking in held:
        if not await scope.confirm(booking):
            return False
        if booking.took_full:  # a late wake cost a full server its refill
            scope.observe_wake_lag(woke_late)
    return True


async def _latest_first(scopes: list[ScopeLike], cost: float) -> list[ScopeLike]:
    """Of a call's scopes, those whose tokens come last, by a look that takes none: booked
    first, and the others only once those are due, so that every scope counts the call
    from when it starts.

    Booked at once, a bucket of 10 beside a window of 25 per 4 s counted a call the
    window let go at 4.0 s from its bucket token at 1.6 s, and at 4.0 s let ten others
    go with it: eleven at once. (Given back and booked again, the tokens left holes the
    bucket could hand out only one at a time: 10/s where a burst was due.)
    """
    if len(scopes) < 2:
        return scopes
    waits = []
    for scope in scopes:
        try:
            waits.append((await scope.wait_for(cost), scope))
        except ConfigurationError:  # a cost no scope can give: booking says so
            return scopes
    latest = max(wait for wait, _ in waits)
    return [scope for wait, scope in waits if wait >= latest - _APART]


def _has(bookings: list[tuple[ScopeLike, Booking]], scope: ScopeLike) -> bool:
    return any(held is scope for held, _ in bookings)


def _early(held: list[tuple[ScopeLike, Booking]]) -> list[tuple[ScopeLike, Booking]]:
    """The bookings that start sooner than the call's last token is due."""
    if not held:
        return []
    latest = max(booking.starts for _, booking in held)
    return [(scope, booking) for scope, booking in held if booking.starts < latest - _APART]


async def _refund(bookings: list[tuple[ScopeLike, Booking]]) -> None:
    for scope, booking in bookings:
        await scope.refund(booking)


async def _sleep_until_due(
    booked: list[tuple[ScopeLike, Booking]], *, admits: bool, budget: Budget, patience: float
) -> float | None:
    """Sleep until every booking is due, following each as its schedule moves; when
    the last sleep was to end, or None if they moved past what the budget allows.

    A late request moves every booking of its bucket later (`TokenBucket.owe`)
    without waking anyone: a holder finds out as it wakes (``retimed``) and
    sleeps on, judged again on the longer wait. ``booked`` is updated in place,
    so that whatever happens next (a confirmation, a refund under cancellation)
    has each booking as its scope last moved it. It wakes early only when its
    bookings are void (the server said otherwise), to confirm, be refused, and
    book again.
    """
    scopes = [scope for scope, _ in booked]
    longest, slowest = _longest_wait(booked, ahead=admits)
    woken_for = trio.current_time() + longest
    while longest > 0:
        assert slowest is not None
        voided = slowest.voided()  # the server said otherwise: wake to book again
        for scope in scopes:
            scope.note_waiting(+1)
        try:
            with trio.move_on_after(longest):
                if voided is None:
                    await trio.sleep_forever()
                else:
                    await voided.wait()
        finally:
            for scope in scopes:
                scope.note_waiting(-1)
        if voided is not None and voided.is_set():
            break
        retimed = [(scope, scope.retimed(booking)) for scope, booking in booked]
        if all(new is old for (_, new), (_, old) in zip(retimed, booked, strict=True)):
            break  # nothing moved while it slept
        booked[:] = retimed
        longest, slowest = _longest_wait(booked, ahead=admits)
        if longest <= 0:
            break  # woken later than it moved
        assert slowest is not None
        latency = slowest.wait_latency()
        if (
            trio.current_time() + longest > patience
            or budget.judge(longest, latency=latency) is not Verdict.SLEEP
        ):
            return None
        woken_for = trio.current_time() + longest
    return woken_for


def _longest_wait(
    booked: list[tuple[ScopeLike, Booking]], *, ahead: bool
) -> tuple[float, ScopeLike | None]:
    """The longest wait of the bookings from now, and whose; ``ahead``, each less the lead its
    scope gives a call (`ScopeFront.admission_lead`: it may start that much before its
    token)."""
    now = trio.current_time()
    waits = [
        (max(0.0, booking.starts - now - (scope.admission_lead() if ahead else 0.0)), scope)
        for scope, booking in booked
    ]
    return max(waits, key=lambda wait: wait[0], default=(0.0, None))


def _ends_late_however_quick(scopes: Sequence[ScopeLike], budget: Budget) -> Shortfall | None:
    """A shortfall if, now its turn has come, even the quickest call seen would end late.

    A booking is judged when it is made, and then a scope may know no
    latency yet: a told scope books the 29th call of a 2 s deadline row for
    1.9 s at t=0. Sent then, a 100 ms call is cut off at its deadline, its
    answer written a few ms past it, and the server counts a request whose
    answer nobody reads. Judged again here on the quickest call each scope
    has seen (not the usual one: answers a few ms quicker than usual would
    lose calls that fit), it is answered at once, and its tokens go back.
    """
    if not math.isfinite(budget.deadline):
        return None  # nothing ends late: no need to scan the scopes' calls
    for scope in scopes:
        quickest = scope.quickest_call()
        if quickest is not None and budget.ends_late(quickest):
            return Shortfall(scope.name, 0.0, Verdict.ENDS_LATE, latency=quickest)
    return None


_BEFORE_THE_DEADLINE = 0.001  # seconds: the last moment to answer a wait that cannot fit


async def _wait_for_a_rise(
    scopes: Sequence[ScopeLike],
    shortfall: Shortfall,
    budget: Budget,
    patience: float,
    on_wait: Callable[[float, str | None], None],
) -> bool:
    """Whether the call waited for the short scope's learned rate to rise, and may book again.

    A scope still learning its rate (`ScopeFront.rate_rising`) puts tokens
    past the deadline at a rate that is a guess or a lower bound; the call
    is not answered on it, but waits until the rate rises or until the last
    moment it could start and still end in time (its deadline less the
    scope's usual latency), and books again. Past that moment it is answered
    as before, before its deadline. Nor does it wait past its ``patience``:
    a runner's ``inline_wait`` bounds what is slept without telling the model.
    It books again, too, when the bookings ahead are void (the server's
    count showed tokens the bucket had not counted): woken only by a rise, a
    token that came free at 1.71 s went unused, and the call it could have
    carried went out at 1.8 s, to end at its deadline.
    """
    if shortfall.verdict not in (Verdict.PAST_DEADLINE, Verdict.ENDS_LATE):
        return False
    if shortfall.never is not None or not math.isfinite(shortfall.needed):
        return False
    scope = next(s for s in scopes if s.name == shortfall.scope)
    rose = scope.rate_rising()
    # With no latency known yet, a moment before the deadline: woken at it, the call
    # was answered by the deadline as ``timed_out``, its wait unsaid.
    latency = max(scope.expected_latency() or 0.0, _BEFORE_THE_DEADLINE)
    last = min(budget.deadline - latency, patience)
    if rose is None or trio.current_time() >= last:
        return False
    if scope.statistics().bucket.blocked_until >= last:
        # Shut by the server (its ``Retry-After``) past that moment: no rise brings a
        # token sooner. Waited for all the same, a call on a learning scope that a
        # 429 had shut for 30 s was answered ``timed_out`` at its 10 s timeout.
        return False
    on_wait(shortfall.needed, scope.name)
    voided = scope.voided()
    # Pressing may raise the rate at once: ``rose`` is set then, and the call books again.
    with scope.pressing(last), trio.move_on_at(last):
        await _first_of(rose, *([] if voided is None else [voided]))
    return True


async def _first_of(*events: trio.Event) -> None:
    """Return once any of ``events`` is set."""
    async with trio.open_nursery() as nursery:
        for event in events:
            nursery.start_soon(_set_then_stop, event, nursery.cancel_scope)


async def _set_then_stop(event: trio.Event, stop: trio.CancelScope) -> None:
    await event.wait()
    stop.cancel()


async def _book_all(
    scopes: Sequence[ScopeLike], cost: float, budget: Budget, patience: float
) -> list[tuple[ScopeLike, Booking]] | Shortfall:
    """One booking on each scope, each judged by the budget; all or none."""
    booked: list[tuple[ScopeLike, Booking]] = []
    done = False
    try:
        for scope in scopes:
            latency = scope.wait_latency()
            for _ in range(_TRIES):
                try:
                    booking = await scope.reserve(cost, max(0.0, patience - trio.current_time()))
                except ConfigurationError as exc:
                    return Shortfall(scope.name, math.inf, never=str(exc))
                if booking is not None:
                    break
                needed = await scope.wait_for(cost)
                verdict = budget.judge(needed, latency=latency)
                if verdict is not Verdict.SLEEP:
                    return Shortfall(scope.name, needed, verdict, latency=latency)
                # The wait shrank meanwhile (a refund, a hole): book again.
            else:
                # The wait kept changing under the call (bookings given back and made
                # again as a learned rate rose): judged as its last booking found it,
                # past its patience. Answered as too long for waiting inline, 19 calls
                # with 1.4 s left were lost at once to a rate rising under them.
                needed = max(needed, patience - trio.current_time())
                verdict = Verdict.PAST_DEADLINE if patience >= budget.deadline else Verdict.TOO_LONG
                return Shortfall(scope.name, needed, verdict, latency=latency)
            booked.append((scope, booking))
            verdict = budget.judge(booking.wait, latency=latency)
            if verdict is not Verdict.SLEEP:
                return Shortfall(scope.name, booking.wait, verdict, latency=latency)
        done = True
        return booked
    finally:
        if not done:
            for scope, booking in booked:
                await scope.refund(booking)


def _token_denial(shortfall: Shortfall, budget: Budget) -> Denial:
    name, needed = shortfall.scope, shortfall.needed
    if shortfall.never is not None:
        return Denial(Status.REFUSED, shortfall.never, name)
    if not math.isfinite(needed):
        return Denial(Status.TIMED_OUT, f"scope {name!r} has no capacity in sight", name)
    if needed == 0 and shortfall.verdict is Verdict.ENDS_LATE:
        return Denial(
            Status.RATE_LIMITED,
            f"scope {name!r} allows this call now, but the quickest call there took "
            f"{shortfall.latency or 0.0:.3f}s and it would end past its deadline; "
            "the call was not sent",
            name,
        )
    why = budget.explain(shortfall.verdict, latency=shortfall.latency)
    return Denial(
        Status.RATE_LIMITED,
        f"scope {name!r} allows this call in {needed:.3f}s, {why}; the call was not sent",
        name,
        needed,
    )
