"""What the logging instruments share: how loud an event is, and its fields as plain values.

The standard-library and structlog instruments write the same records in two
shapes; one home for the severity rule and the field list keeps them alike.

Severity says what needs a person: the server throttling us, retries, sheds,
refusals, exhausted quotas and every non-ok answer warn. The routine steps
of a call (queued, slot acquired, started, request sent, response) are
debug: several lines per call, useful only when following one. Everything
else (token waits, ok answers, turn boundaries) is at the instrument's
level: pacing by the configured limits is fanout doing its job, and the
first thing to read when asking why a turn was slow.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .._events import EventKind
from .._values import Status

if TYPE_CHECKING:
    from .._events import Event

__all__ = ["event_fields", "severity"]

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


def severity(event: Event, level: int) -> int:
    """The logging level for ``event``: WARNING, DEBUG, or ``level`` for the rest."""
    if event.kind in _WARNING or event.status not in (None, Status.OK):
        return logging.WARNING
    return logging.DEBUG if event.kind in _DEBUG else level


def event_fields(event: Event) -> dict[str, Any]:
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
