"""OpenTelemetry traces: a span per turn, a span per call inside it, each step an event.

A call's span runs from ``queued`` to ``answered``; what happened between
(slot acquired, token wait, started, request sent, response, throttling,
retry scheduled, shed, refused) is a span event with ``fanout.*`` attributes.
A non-ok answer sets the span's status to ERROR. Spans are found by the
events' ``turn_id`` and ``call_id`` and dropped when they end, so concurrent
turns never mix and nothing accumulates.

Times come from the events (trio's clock), anchored once per turn to the wall
clock OpenTelemetry requires (``wall_clock``, ns since the epoch): span
durations are the ones fanout measured, exact under ``MockClock``.

Attributes hold no credential, and the names that come from outside (tool
names from the model, scope names from servers) keep to their first
``max_names`` distinct values, then read ``other`` (`fanout.contrib._safety`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import attrs
from opentelemetry import trace

from .._events import Event, EventKind
from .._values import Status
from ._safety import BoundedLabels, safe_event

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["OpenTelemetryInstrument"]


@attrs.define
class _Turn:
    span: trace.Span | None  # None for events seen without their turn's start
    origin: float  # a trio time ...
    epoch_ns: int  # ... and the wall clock then, in ns since the epoch
    calls: dict[str | None, trace.Span] = attrs.field(factory=dict)

    def ns(self, t: float) -> int:
        return self.epoch_ns + round((t - self.origin) * 1e9)


class OpenTelemetryInstrument:
    """Trace turns and calls with ``tracer`` (default: the global provider's ``fanout``)."""

    def __init__(
        self,
        tracer: trace.Tracer | None = None,
        *,
        wall_clock: Callable[[], int] = time.time_ns,
        max_names: int = 100,
    ) -> None:
        self.tracer = tracer if tracer is not None else trace.get_tracer("fanout")
        self._wall_clock = wall_clock
        self._turns: dict[str | None, _Turn] = {}
        self._tool = BoundedLabels(max_names)
        self._scope = BoundedLabels(max_names)

    def on_event(self, event: Event) -> None:
        event = safe_event(event)
        event = attrs.evolve(
            event,
            tool=None if event.tool is None else self._tool(event.tool),
            scope=None if event.scope is None else self._scope(event.scope),
        )
        kind, turn = event.kind, self._turns.get(event.turn_id)
        if turn is None:
            now = self._wall_clock()  # the one wall-clock read of a turn
            span = None
            if kind is EventKind.TURN_STARTED:
                attributes = {"fanout.turn_id": event.turn_id or "", **_attributes(event, "")}
                span = self.tracer.start_span("fanout.turn", attributes=attributes, start_time=now)
            turn = self._turns[event.turn_id] = _Turn(span, event.time, now)
        if kind is EventKind.TURN_FINISHED:
            del self._turns[event.turn_id]
            if turn.span is not None:
                turn.span.set_attributes(_attributes(event, "answers."))
                turn.span.end(turn.ns(event.time))
        elif kind is EventKind.QUEUED:
            parent = trace.set_span_in_context(turn.span) if turn.span is not None else None
            turn.calls[event.call_id] = self.tracer.start_span(
                f"execute_tool {event.tool}", parent, start_time=turn.ns(event.time),
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": event.tool or "",
                    "gen_ai.tool.call.id": event.call_id or "",
                    "fanout.tool": event.tool or "",
                    "fanout.call_id": event.call_id or "",
                },
            )  # fmt: skip
        elif (call := turn.calls.get(event.call_id)) is None:
            return
        elif kind is EventKind.ANSWERED:
            del turn.calls[event.call_id]
            call.set_attributes(_attributes(event))
            if event.status is not Status.OK and event.status is not None:
                call.set_status(trace.StatusCode.ERROR, event.status.value)
            call.end(turn.ns(event.time))
        else:
            call.add_event(kind.value, _attributes(event), turn.ns(event.time))


def _attributes(event: Event, detail_prefix: str = "detail.") -> dict[str, Any]:
    """The event's set fields as ``fanout.*`` attributes; ``detail`` under its own prefix."""
    fields = {
        "fanout.scope": event.scope,
        "fanout.attempt": event.attempt,
        "fanout.status": event.status.value if event.status is not None else None,
        "fanout.wait": event.wait,
        "fanout.reason": event.reason,
        **{f"fanout.{detail_prefix}{key}": value for key, value in event.detail.items()},
    }
    return {k: v for k, v in fields.items() if isinstance(v, str | bool | int | float)}
