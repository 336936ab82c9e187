"""The structlog integration: one ``fanout.<kind>`` event per event, fields as key-values."""

from __future__ import annotations

from typing import Any

import structlog
from structlog.testing import capture_logs

import fanout
from fanout.contrib.structlog import StructlogInstrument

from .test_events import SECRET, run_throttled_turn


async def test_one_structlog_event_per_event_with_its_fields(autojump_clock: Any) -> None:
    """A retried call's events come out in order, named, levelled, with exact fields."""
    with capture_logs() as logs:
        turn = await run_throttled_turn(StructlogInstrument())
    assert len(logs) == len(turn.trace) == 31
    w1 = [entry for entry in logs if entry.get("call_id") == "w1"]
    common = {"turn_id": "turn-1", "call_id": "w1", "tool": "update"}
    assert w1 == [
        {"event": "fanout.queued", "log_level": "debug", "time": 0.0, **common},
        {
            "event": "fanout.slot_acquired", "log_level": "debug", "time": 3.5, **common,
            "scope": "crm-key", "attempt": 1,
        },
        {"event": "fanout.started", "log_level": "debug", "time": 3.5, **common, "attempt": 1},
        {
            "event": "fanout.scope_blocked", "log_level": "warning", "time": 3.5, **common,
            "scope": "crm-key", "wait": 0.5,
        },
        {
            "event": "fanout.retry_scheduled", "log_level": "warning", "time": 3.5, **common,
            "scope": "crm-key", "attempt": 1, "wait": 0.5, "reason": "RateLimitedError",
        },
        {
            "event": "fanout.slot_acquired", "log_level": "debug", "time": 4.0, **common,
            "scope": "crm-key", "attempt": 2,
        },
        {
            "event": "fanout.token_wait", "log_level": "info", "time": 4.0, **common,
            "scope": "crm-key", "attempt": 2, "wait": 0.5,
        },
        {"event": "fanout.started", "log_level": "debug", "time": 4.5, **common, "attempt": 2},
        {
            "event": "fanout.answered", "log_level": "info", "time": 5.5, **common,
            "attempt": 2, "status": "ok",
        },
    ]  # fmt: skip
    assert logs[0] == {
        "event": "fanout.turn_started", "log_level": "info", "time": 0.0, "turn_id": "turn-1",
        "detail": {"calls": 6},
    }  # fmt: skip
    assert logs[-1] == {
        "event": "fanout.turn_finished", "log_level": "info", "time": 5.5, "turn_id": "turn-1",
        "detail": {"ok": 4, "refused": 2},
    }  # fmt: skip


async def test_refusals_warn_with_their_reason(autojump_clock: Any) -> None:
    """An unknown tool's refusal and its answer are warnings; the reason is a field."""
    with capture_logs() as logs:
        await run_throttled_turn(StructlogInstrument())
    x1 = [(e["event"], e["log_level"], e.get("reason")) for e in logs if e.get("call_id") == "x1"]
    assert x1 == [
        ("fanout.queued", "debug", None),
        (
            "fanout.refused",
            "warning",
            "there is no tool named 'delete_everything'; the tools are: lookup, update",
        ),
        ("fanout.answered", "warning", None),
    ]


async def test_given_logger_is_used_with_its_bindings(autojump_clock: Any) -> None:
    """Events go through the logger passed in, keeping what was bound to it."""
    with capture_logs() as logs:
        await run_throttled_turn(StructlogInstrument(structlog.get_logger().bind(agent="triage")))
    assert {entry["agent"] for entry in logs} == {"triage"}
    assert len(logs) == 31


async def test_structlog_events_never_carry_a_credential(autojump_clock: Any) -> None:
    """A key passed as a tool argument appears in no captured event."""
    with capture_logs() as logs:
        await run_throttled_turn(StructlogInstrument())
    assert not [entry for entry in logs if SECRET in repr(entry)]


def test_a_credential_in_an_event_never_reaches_structlog() -> None:
    """Credential-shaped text in a reason or a detail is redacted before the event is logged."""
    event = fanout.Event(
        fanout.EventKind.RETRY_SCHEDULED, 0.0, "t", "c1", "tool", reason="token sk-live-abcdef123",
        detail={"url": "https://api.test/x?token=tok-abcdef123"},
    )  # fmt: skip
    with capture_logs() as logs:
        StructlogInstrument().on_event(event)
    assert "abcdef" not in repr(logs)
    assert "REDACTED" in repr(logs)
