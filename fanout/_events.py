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
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio

from ._values import Status

__all__ = ["Event", "EventKind", "Instrument"]

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


@attrs.frozen
class Event:
    """One timestamped moment. Fields that do not apply are None."""

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
    detail: Mapping[str, Any] = attrs.field(factory=dict, hash=False)


class Instrument(Protocol):
    """Anything that wants to see events: a logger, a metrics exporter, a tracer."""

    def on_event(self, event: Event) -> None: ...


@attrs.define
class Recorder:
    """Stamps events, appends them to a trace and fans them out to instruments.

    With no trace and no instruments it returns before building anything, so
    instrumentation that is off costs one branch.
    """

    instruments: Sequence[Instrument] = ()
    trace: list[Event] | None = attrs.field(factory=list)
    turn_id: str | None = None

    def emit(self, kind: EventKind, **fields: Any) -> None:
        if self.trace is None and not self.instruments:
            return
        event = Event(kind, trio.current_time(), self.turn_id, **fields)
        if self.trace is not None:
            self.trace.append(event)
        for instrument in self.instruments:
            try:
                instrument.on_event(event)
            except Exception:
                # An instrument must never cost a call its answer.
                _log.exception("fanout instrument %r failed on %s", instrument, kind.value)
