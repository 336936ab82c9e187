"""Events as structlog key-value events: ``fanout.<kind>`` with the event's fields.

The event name is stable (``fanout.answered``, ``fanout.token_wait``, ...);
the fields are the ones that are set, flat (``turn_id=... call_id=...
status=...``) except ``detail``, kept as one dict so that its keys cannot
shadow a field. Severity and fields are the logging integration's
(`fanout.contrib._records`): throttling, retries, sheds, refusals, exhausted
quotas and non-ok answers warn; a call's routine steps are debug; the rest
is info. No field holds a credential (`fanout.contrib._safety`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from ._records import event_fields, severity
from ._safety import safe_event

if TYPE_CHECKING:
    from .._events import Event

__all__ = ["StructlogInstrument"]


class _Logger(Protocol):
    def log(self, level: int, event: str, *args: Any, **kw: Any) -> Any: ...


class StructlogInstrument:
    """Log every event to ``logger`` (default: ``structlog.get_logger("fanout")``)."""

    def __init__(self, logger: _Logger | None = None) -> None:
        self.logger: _Logger = logger if logger is not None else structlog.get_logger("fanout")

    def on_event(self, event: Event) -> None:
        level = severity(event, logging.INFO)
        event = safe_event(event)
        self.logger.log(level, f"fanout.{event.kind.value}", **event_fields(event))
