"""What happened, when, and why: events for the trace and for instruments.

The transcript holds answers; the trace holds the story of how they came to
be. Each event is a frozen value stamped with ``trio.current_time()``. A turn
keeps them in ``Turn.trace`` and hands each to the runner's instruments, any
object with an ``on_event`` method. Events carry a scope's name, never a
credential.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import Any, Protocol, TypedDict

import attrs
import trio

from ._logs import log_failure
from ._redact import redact_text
from ._secrets import secrets_learned
from ._values import Status

__all__ = ["Event", "EventDetail", "EventKind", "Instrument"]

_log = logging.getLogger("fanout")


class EventKind(enum.Enum):
    """The moments of a call's life, and of a scope's."""

    TURN_STARTED = "turn_started"
    TURN_FINISHED = "turn_finished"
    QUEUED = "queued"
    SLOT_ACQUIRED = "slot_acquired"
    TOKEN_WAIT = "token_wait"
    STARTED = "started"
    PROGRESS = "progress"
    REQUEST_SENT = "request_sent"
    RESPONSE = "response"
    RETRY_SCHEDULED = "retry_scheduled"
    SHED = "shed"
    REFUSED = "refused"
    COALESCED = "coalesced"
    CACHE_HIT = "cache_hit"
    REPLAYED = "replayed"
    ANSWERED = "answered"
    SCOPE_BLOCKED = "scope_blocked"
    SCOPE_EXHAUSTED = "scope_exhausted"


# The functional form, because one key ("from") is a Python keyword.
EventDetail = TypedDict(
    "EventDetail",
    {
        # TURN_STARTED: how many calls the turn held when it started.
        "calls": int,
        # TURN_FINISHED: how many answers of each status; only statuses that occurred.
        "ok": int,
        "error": int,
        "rate_limited": int,
        "timed_out": int,
        "cancelled": int,
        "refused": int,
        "quota_exhausted": int,
        # REQUEST_SENT: the HTTP method and the URL, credentials redacted.
        "method": str,
        "url": str,
        # RESPONSE: the HTTP status code, and what the rate-limit headers said
        # (requests per window, left in it, seconds to its reset, the
        # server's Retry-After, the window's length in seconds), when said.
        "status": int,
        "limit": float,
        "remaining": float,
        "reset_after": float,
        "retry_after": float,
        "window": float,
        # PROGRESS: what the tool reported (total None when unknown), and
        # its message, scrubbed of credentials, when it gave one.
        "progress": float,
        "total": float | None,
        "message": str,
        # COALESCED and REPLAYED: the id of the identical call whose answer
        # this one shares.
        "leader": str,
        # REPLAYED from the run's idempotency store rather than from a call
        # of this turn: "idempotency store".
        "from": str,
    },
    total=False,
)
EventDetail.__doc__ = """What an event says beyond its fields: a few keys, each set by one kind.

Plain JSON-able values, so an instrument can write ``dict(event.detail)``
as it is. Keys a kind does not set are absent, never None.
"""


@attrs.frozen
class Event:
    """One timestamped moment of a turn, a call or a scope.

    Fields that do not apply to a kind are None (``detail`` is then empty):

    - ``kind``: which moment (`EventKind`).
    - ``time``: ``trio.current_time()`` when it happened, in seconds.
    - ``turn_id``: the turn it belongs to; every event of one turn shares it.
    - ``call_id``: the ``tool_use_id`` of the call, for call events; None
      for ``TURN_STARTED`` and ``TURN_FINISHED``.
    - ``tool``: the tool's name as the model sent it, for call events.
    - ``scope``: the scope's name, for events about a limit (a slot, a
      token wait, a shed, a throttle, an exhausted quota, a response that
      named one, an answer a scope decided). Never a credential.
    - ``attempt``: the attempt, from 1, for events within an attempt.
    - ``status``: how the call ended, on ``ANSWERED`` only.
    - ``wait``: seconds waited or to wait: a token wait, a retry's delay, a
      shed's estimate, a scope blocked or exhausted for that long.
    - ``reason``: words for an operator: why a retry was scheduled (the
      signal's type) or why a call was refused.
    - ``detail``: the kind's own facts (`EventDetail`).
    """

    kind: EventKind
    time: float
    turn_id: str | None = None
    call_id: str | None = None
    tool: str | None = None
    scope: str | None = None
    attempt: int | None = None
    status: Status | None = None
    wait: float | None = None
    reason: str | None = None
    detail: EventDetail = attrs.field(factory=lambda: EventDetail(), hash=False)


class Instrument(Protocol):
    """Anything that wants to see events: a logger, a metrics exporter, a tracer."""

    def on_event(self, event: Event) -> None: ...


# What one event says beyond its kind and time, in `Event`'s order after ``turn_id``.
_FIELDS = 8


@attrs.define
class Recorder:
    """Stamps events, appends them to a trace and fans them out to instruments.

    With no trace and no instruments it returns before building anything, so
    instrumentation that is off costs one branch (its fields are named
    parameters, so not even a dict of them is built). With instruments, each
    event is built as it happens and handed to them. With the trace alone,
    an event is noted as its kind, time and fields, one after the other in
    one flat list, and built when the trace is read (`events`): a turn of
    ten thousand calls does not build thirty thousand events, nor thirty
    thousand tuples for the cyclic collector to go over, that nobody may
    read, while its calls run.
    """

    instruments: Sequence[Instrument] = ()
    trace: list[Event] | None = attrs.field(factory=list)
    turn_id: str | None = None
    # Events noted and not yet built: kind, time and the _FIELDS fields, then the next.
    _noted: list[Any] = attrs.field(factory=list, init=False)
    # How many secrets the process had learned when the trace's events were scrubbed.
    _scrubbed_with: int = attrs.field(factory=secrets_learned, init=False)
    # The clock of the trio.run the turn runs in (`reads_the_clock_of_this_run`).
    _clock: trio.abc.Clock | None = attrs.field(default=None, init=False)

    def reads_the_clock_of_this_run(self) -> None:
        """Stamp events with the clock of the trio.run going on, looked up once: what
        ``trio.current_time()`` reads, without its two Python calls around it at every
        event. A turn runs once, in one run, and says so as it begins."""
        self._clock = trio.lowlevel.current_clock()

    @property
    def active(self) -> bool:
        """Whether an event is kept or seen at all: what only an event needs can be skipped."""
        return self.trace is not None or bool(self.instruments)

    def emit(
        self,
        kind: EventKind,
        *,
        call_id: str | None = None,
        tool: str | None = None,
        scope: str | None = None,
        attempt: int | None = None,
        status: Status | None = None,
        wait: float | None = None,
        reason: str | None = None,
        detail: EventDetail | None = None,
    ) -> None:
        """Record one event; the fields are `Event`'s (``detail`` None: an empty one)."""
        if self.trace is None and not self.instruments:
            return
        clock = self._clock
        now = trio.current_time() if clock is None else clock.current_time()
        if not self.instruments:
            self._noted += (kind, now, call_id, tool, scope, attempt, status, wait, reason, detail)
            return
        event = Event(
            kind, now, self.turn_id, _scrubbed(call_id), _scrubbed(tool), scope, attempt,
            status, wait, _scrubbed(reason), EventDetail() if detail is None else detail,
        )  # fmt: skip
        if self.trace is not None:
            self.trace.append(event)
        for instrument in self.instruments:
            try:
                instrument.on_event(event)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                # An instrument must never cost a call its answer, not even by
                # raising ``SystemExit``: raised on, it left calls unanswered.
                log_failure(
                    _log, "fanout instrument %r failed on %s", instrument, kind.value, exc=exc
                )

    def events(self) -> tuple[Event, ...]:
        """The trace so far, as events (each built once, on the first read that needs it).

        Scrubbed of every secret learned by the time it is read: a tool may report
        progress quoting a key a moment before its request sends it, and only then is
        the key known. (The trace kept it where the call's answer had it scrubbed.)
        """
        kept = self.trace
        if kept is None:
            return ()
        if self._scrubbed_with != secrets_learned():
            self._scrubbed_with = secrets_learned()
            kept[:] = [_rescrubbed(event) for event in kept]
        noted = self._noted
        for i in range(0, len(noted), 2 + _FIELDS):
            kind, time, call_id, tool, scope, attempt, status, wait, reason, detail = noted[
                i : i + 2 + _FIELDS
            ]
            kept.append(
                Event(
                    kind, time, self.turn_id, _scrubbed(call_id), _scrubbed(tool), scope,
                    attempt, status, wait, _scrubbed(reason), _scrubbed_detail(detail),
                )
            )  # fmt: skip
        noted.clear()
        return tuple(kept)


def _scrubbed_detail(detail: EventDetail | None) -> EventDetail:
    """An event's detail with its texts scrubbed again: a tool's progress message, and a
    request's URL (one whose path held a key sent later as a header was left with it)."""
    if detail is None:
        return EventDetail()
    again = detail
    for field in ("message", "url"):
        text = again.get(field)
        if isinstance(text, str) and (scrubbed := redact_text(text)) != text:
            again = again.copy() if again is detail else again
            again[field] = scrubbed
    return again


def _rescrubbed(event: Event) -> Event:
    """``event`` scrubbed of secrets learned since it was built."""
    call_id, tool = _scrubbed(event.call_id), _scrubbed(event.tool)
    reason, detail = _scrubbed(event.reason), _scrubbed_detail(event.detail)
    # A scope named for its key (as one may well be) learned as the key is sent.
    scope = _scrubbed(event.scope)
    if (call_id, tool, reason, detail, scope) == (
        event.call_id, event.tool, event.reason, event.detail, event.scope
    ):  # fmt: skip
        return event
    return attrs.evolve(
        event, call_id=call_id, tool=tool, reason=reason, detail=detail, scope=scope
    )


def _scrubbed(text: str | None) -> str | None:
    """What the model sent (a call's id, a tool's name) and what fanout wrote of it (a
    refusal's reason), with no credential: an answer is scrubbed of a key the model
    put in an unknown tool's name, and so is the event, as it is built. (Left raw,
    ``turn.trace`` and every custom instrument had it, where the answer did not.)"""
    return None if text is None else redact_text(text)
