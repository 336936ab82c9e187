"""Events as standard-library log records: one short human line per event.

Each record's message reads like ``call toolu_1 (search) answered
rate_limited scope=crm``; the event's fields travel whole in one attribute,
``record.fanout`` (a dict of the fields that are set), so a JSON formatter or
a filter finds them all under one key without colliding with anything else.

Severity says what needs a person: the server throttling us, retries, sheds,
refusals, exhausted quotas and every non-ok answer are WARNING. The routine
steps of a call (queued, slot acquired, started, request sent, response) are
DEBUG: several lines per call, useful only when following one. Token waits,
ok answers and turn boundaries are at ``level``: pacing by the configured
limits is fanout doing its job, and the first thing to read when asking why
a turn was slow.

No record holds a credential: every text field is scrubbed of known secrets
and credential-shaped text before a line is built (`fanout.contrib._safety`).
"""

from __future__ import annotations

import logging
from typing import Any

from .._events import Event, EventKind
from .._values import Status
from ._safety import safe_event

__all__ = ["LoggingInstrument"]

_WARNING = frozenset(
    {
        EventKind.SCOPE_BLOCKED,
        EventKind.RETRY_SCHEDULED,
        EventKind.SHED,
        EventKind.REFUSED,
        EventKind.SCOPE_EXHAUSTED,
    }
)
_DEBUG = frozenset(
    {
        EventKind.QUEUED,
        EventKind.SLOT_ACQUIRED,
        EventKind.STARTED,
        EventKind.REQUEST_SENT,
        EventKind.RESPONSE,
    }
)


class LoggingInstrument:
    """Log every event to ``logger`` (default: the ``fanout`` logger)."""

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.INFO) -> None:
        self.logger = logger if logger is not None else logging.getLogger("fanout")
        self.level = level

    def on_event(self, event: Event) -> None:
        severity = _severity(event, self.level)
        if self.logger.isEnabledFor(severity):  # build nothing for a record nobody keeps
            event = safe_event(event)
            fields = {"kind": event.kind.value, **_fields(event)}
            self.logger.log(severity, _message(event), extra={"fanout": fields})


def _severity(event: Event, level: int) -> int:
    if event.kind in _WARNING or event.status not in (None, Status.OK):
        return logging.WARNING
    return logging.DEBUG if event.kind in _DEBUG else level


def _fields(event: Event) -> dict[str, Any]:
    """The event's fields that are set, as plain values; ``detail`` stays nested.

    Nested, because a detail key may share a field's name (a response's HTTP
    ``status`` beside fanout's own).
    """
    fields = {
        "time": event.time,
        "turn_id": event.turn_id,
        "call_id": event.call_id,
        "tool": event.tool,
        "scope": event.scope,
        "attempt": event.attempt,
        "status": event.status.value if event.status is not None else None,
        "wait": event.wait,
        "reason": event.reason,
        "detail": dict(event.detail) or None,
    }
    return {key: value for key, value in fields.items() if value is not None}


def _message(event: Event) -> str:
    if event.call_id is not None:
        parts = [f"call {event.call_id} ({event.tool})", event.kind.value]
    else:
        parts = [f"turn {event.turn_id}", event.kind.value.removeprefix("turn_")]
    if event.status is not None:
        parts.append(event.status.value)
    if event.scope is not None:
        parts.append(f"scope={event.scope}")
    if event.wait is not None:
        parts.append(f"wait={event.wait:.3f}s")
    if event.attempt is not None and event.attempt > 1:
        parts.append(f"attempt={event.attempt}")
    parts.extend(f"{key}={value}" for key, value in event.detail.items())
    text = " ".join(parts)
    return f"{text}: {event.reason}" if event.reason else text
