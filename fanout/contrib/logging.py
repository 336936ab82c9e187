"""Events as standard-library log records: one short human line per event.

Each record's message reads like ``call toolu_1 (search) answered
rate_limited scope=crm``; the event's fields travel whole in one attribute,
``record.fanout`` (a dict of the fields that are set), so a JSON formatter or
a filter finds them all under one key without colliding with anything else.

Severity says what needs a person (`fanout.contrib._records`): throttling,
retries, sheds, refusals, exhausted quotas and non-ok answers are WARNING; a
call's routine steps are DEBUG; token waits, ok answers and turn boundaries
are at ``level``.

No record holds a credential: every text field is scrubbed of known secrets
and credential-shaped text before a line is built (`fanout.contrib._safety`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .._exceptions import ConfigurationError
from ._records import event_fields, severity
from ._safety import safe_event

if TYPE_CHECKING:
    from .._events import Event

__all__ = ["LoggingInstrument"]


class LoggingInstrument:
    """Log every event to ``logger`` (default: the ``fanout`` logger)."""

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.INFO) -> None:
        if not (isinstance(level, int) and not isinstance(level, bool)):
            raise ConfigurationError(f"level must be a logging level (an int), not {level!r}")
        self.logger = logger if logger is not None else logging.getLogger("fanout")
        self.level = level

    def on_event(self, event: Event) -> None:
        level = severity(event, self.level)
        if self.logger.isEnabledFor(level):  # build nothing for a record nobody keeps
            event = safe_event(event)
            fields = {"kind": event.kind.value, **event_fields(event)}
            self.logger.log(level, _message(event), extra={"fanout": fields})


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
