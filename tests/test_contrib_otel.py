"""The OpenTelemetry integration: a turn span, call spans inside it, steps as span events."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import fanout
from fanout import ToolCall
from fanout.contrib.otel import OpenTelemetryInstrument

from .test_events import SCOPE, SECRET, run_http_turn, run_throttled_turn, throttled_runner

S = 1_000_000_000  # nanoseconds in a second
EPOCH_NS = 1_790_000_000 * S  # a fixed wall clock, so span times are exact


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def instrument(exporter: InMemorySpanExporter) -> OpenTelemetryInstrument:
    """An instrument on a private provider; the global one is never touched."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OpenTelemetryInstrument(provider.get_tracer("tests"), wall_clock=lambda: EPOCH_NS)


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


def offset(span: ReadableSpan, origin: ReadableSpan) -> tuple[float, float]:
    """A span's start and end, in seconds after ``origin`` started."""
    assert span.start_time is not None
    assert span.end_time is not None
    assert origin.start_time is not None
    return (span.start_time - origin.start_time) / S, (span.end_time - origin.start_time) / S


async def test_turn_span_holds_one_child_span_per_call(
    autojump_clock: Any, instrument: OpenTelemetryInstrument, exporter: InMemorySpanExporter
) -> None:
    """One turn span, parent of every call span, lasting exactly as long as the turn."""
    await run_throttled_turn(instrument)
    spans = by_name(exporter.get_finished_spans())
    assert {name: len(group) for name, group in spans.items()} == {
        "fanout.turn": 1,
        "execute_tool lookup": 3,
        "execute_tool update": 2,
        "execute_tool delete_everything": 1,
    }
    (turn,) = spans.pop("fanout.turn")
    assert turn.parent is None
    assert (turn.start_time, turn.end_time) == (EPOCH_NS, EPOCH_NS + 5_500_000_000)
    assert dict(turn.attributes or {}) == {
        "fanout.turn_id": "turn-1",
        "fanout.calls": 6,
        "fanout.answers.ok": 4,
        "fanout.answers.refused": 2,
    }
    calls = [span for group in spans.values() for span in group]
    assert {span.parent.span_id for span in calls if span.parent} == {turn.context.span_id}
    assert len({span.context.trace_id for span in [turn, *calls]}) == 1
    reads = sorted(offset(span, turn) for span in spans["execute_tool lookup"])
    assert reads == [(0.0, 1.5), (0.0, 2.5), (0.0, 3.5)]


async def test_retried_call_span_has_its_steps_as_events(
    autojump_clock: Any, instrument: OpenTelemetryInstrument, exporter: InMemorySpanExporter
) -> None:
    """A throttled, retried write: attributes, ok status, and each step at its exact time."""
    await run_throttled_turn(instrument)
    spans = by_name(exporter.get_finished_spans())
    (turn,) = spans["fanout.turn"]
    w1 = next(
        s for s in spans["execute_tool update"] if (s.attributes or {})["fanout.call_id"] == "w1"
    )
    assert offset(w1, turn) == (0.0, 5.5)
    assert dict(w1.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "update",
        "gen_ai.tool.call.id": "w1",
        "fanout.tool": "update",
        "fanout.call_id": "w1",
        "fanout.attempt": 2,
        "fanout.status": "ok",
    }
    assert w1.status.status_code is StatusCode.UNSET
    assert turn.start_time is not None
    events = [
        (e.name, (e.timestamp - turn.start_time) / S, dict(e.attributes or {})) for e in w1.events
    ]
    assert events == [
        ("slot_acquired", 3.5, {"fanout.scope": SCOPE, "fanout.attempt": 1}),
        ("started", 3.5, {"fanout.attempt": 1}),
        ("scope_blocked", 3.5, {"fanout.scope": SCOPE, "fanout.wait": 0.5}),
        (
            "retry_scheduled",
            3.5,
            {
                "fanout.scope": SCOPE,
                "fanout.attempt": 1,
                "fanout.wait": 0.5,
                "fanout.reason": "RateLimitedError",
            },
        ),
        ("slot_acquired", 4.0, {"fanout.scope": SCOPE, "fanout.attempt": 2}),
        ("token_wait", 4.0, {"fanout.scope": SCOPE, "fanout.attempt": 2, "fanout.wait": 0.5}),
        ("started", 4.5, {"fanout.attempt": 2}),
    ]


async def test_http_exchanges_are_span_events_with_their_detail(
    autojump_clock: Any, instrument: OpenTelemetryInstrument, exporter: InMemorySpanExporter
) -> None:
    """Requests and responses are span events; the response's numbers are detail attributes."""
    _, base = await run_http_turn(instrument)
    (h2,) = [
        s
        for s in exporter.get_finished_spans()
        if s.attributes and s.attributes.get("fanout.call_id") == "h2"
    ]
    exchanges = [(e.name, dict(e.attributes or {})) for e in h2.events if e.name != "slot_acquired"]
    sent = {
        "fanout.attempt": 1,
        "fanout.detail.method": "GET",
        "fanout.detail.url": f"{base}/items/2?api_key=REDACTED",
    }
    assert exchanges[:3] == [
        ("started", {"fanout.attempt": 1}),
        ("request_sent", sent),
        (
            "response",
            {"fanout.attempt": 1, "fanout.detail.status": 429, "fanout.detail.retry_after": 1.0},
        ),
    ]
    assert [name for name, _ in exchanges[3:]] == [
        "scope_blocked", "retry_scheduled", "started", "request_sent", "response"
    ]  # fmt: skip


async def test_non_ok_call_span_has_error_status(
    autojump_clock: Any, instrument: OpenTelemetryInstrument, exporter: InMemorySpanExporter
) -> None:
    """A refused call's span is ERROR, described by its status, its reason an event."""
    await run_throttled_turn(instrument)
    (x1,) = by_name(exporter.get_finished_spans())["execute_tool delete_everything"]
    assert (x1.status.status_code, x1.status.description) == (StatusCode.ERROR, "refused")
    assert x1.attributes is not None
    assert x1.attributes["fanout.status"] == "refused"
    assert [(e.name, dict(e.attributes or {})) for e in x1.events] == [
        (
            "refused",
            {
                "fanout.reason": "there is no tool named 'delete_everything'; "
                "the tools are: lookup, update"
            },
        )
    ]


async def test_concurrent_turns_keep_their_own_spans(
    autojump_clock: Any, instrument: OpenTelemetryInstrument, exporter: InMemorySpanExporter
) -> None:
    """Two turns running at once on one runner each parent only their own calls."""
    runner = throttled_runner(instrument)
    async with trio.open_nursery() as nursery:
        for prefix in ("a", "b"):
            calls = [ToolCall(f"{prefix}{i}", "lookup", {"query": f"{prefix}{i}"}) for i in (1, 2)]
            nursery.start_soon(runner.run_turn, calls)
    spans = exporter.get_finished_spans()
    turns = {span.context.span_id: span for span in spans if span.name == "fanout.turn"}
    assert len(turns) == 2
    families = {
        parent_id: sorted(
            str(s.attributes["fanout.call_id"])
            for s in spans
            if s.parent is not None and s.parent.span_id == parent_id and s.attributes
        )
        for parent_id in turns
    }
    assert sorted(families.values()) == [["a1", "a2"], ["b1", "b2"]]


async def test_spans_never_carry_a_credential(
    autojump_clock: Any, instrument: OpenTelemetryInstrument, exporter: InMemorySpanExporter
) -> None:
    """A key passed as a tool argument appears in no span, attribute or event."""
    await run_throttled_turn(instrument)
    assert not [span for span in exporter.get_finished_spans() if SECRET in span.to_json()]


def test_names_from_outside_are_bounded_and_scrubbed(exporter: InMemorySpanExporter) -> None:
    """Tool names past max_names read 'other'; a credential in a scope or reason never lands."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel = OpenTelemetryInstrument(
        provider.get_tracer("tests"), wall_clock=lambda: EPOCH_NS, max_names=2
    )
    kinds = fanout.EventKind
    otel.on_event(fanout.Event(kinds.TURN_STARTED, 0.0, "t"))
    for n in range(4):
        otel.on_event(fanout.Event(kinds.QUEUED, 0.0, "t", f"c{n}", f"tool{n}"))
        otel.on_event(
            fanout.Event(
                kinds.SCOPE_BLOCKED, 0.0, "t", f"c{n}", f"tool{n}", "key=sk-live-0123456789",
                reason="Bearer sk-live-0123456789",
            )
        )  # fmt: skip
        otel.on_event(fanout.Event(kinds.ANSWERED, 1.0, "t", f"c{n}", f"tool{n}"))
    otel.on_event(fanout.Event(kinds.TURN_FINISHED, 1.0, "t"))
    spans = exporter.get_finished_spans()
    tools = sorted(
        str(s.attributes["fanout.tool"])
        for s in spans
        if s.attributes and "fanout.tool" in s.attributes
    )
    assert tools == ["other", "other", "tool0", "tool1"]
    assert "sk-live" not in "".join(span.to_json() for span in spans)


def test_a_turn_joined_midway_gets_call_spans_without_a_parent(
    instrument: OpenTelemetryInstrument, exporter: InMemorySpanExporter
) -> None:
    """Events of a turn whose start the instrument never saw: its calls still get spans (with
    no turn span to sit in), and its end ends nothing and raises nothing."""
    kinds = fanout.EventKind
    instrument.on_event(fanout.Event(kinds.QUEUED, 0.0, "t", "c1", "lookup"))
    instrument.on_event(fanout.Event(kinds.ANSWERED, 0.5, "t", "c1", "lookup"))
    instrument.on_event(fanout.Event(kinds.TURN_FINISHED, 0.5, "t"))
    spans = exporter.get_finished_spans()
    assert [span.name for span in spans] == ["execute_tool lookup"]
    assert spans[0].parent is None
