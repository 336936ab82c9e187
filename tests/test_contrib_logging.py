"""The logging integration: one record per event, a human message, fields under ``fanout``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import fanout
from fanout.contrib.logging import LoggingInstrument

from .test_events import SECRET, run_http_turn, run_throttled_turn

if TYPE_CHECKING:
    import pytest

DEBUG, INFO, WARNING = logging.DEBUG, logging.INFO, logging.WARNING


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``fanout`` attribute the instrument put on a record."""
    found: dict[str, Any] = vars(record)["fanout"]
    return found


def records_of(caplog: pytest.LogCaptureFixture, call_id: str) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage()) for r in caplog.records if fields(r).get("call_id") == call_id
    ]


async def test_one_record_per_event_with_human_messages(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Each event is one record; a retried call reads as a short story, at fitting levels."""
    caplog.set_level(DEBUG, logger="fanout")
    turn = await run_throttled_turn(LoggingInstrument())
    assert len(caplog.records) == len(turn.trace) == 31
    assert records_of(caplog, "w1") == [
        (DEBUG, "call w1 (update) queued"),
        (DEBUG, "call w1 (update) slot_acquired scope=crm-key"),
        (DEBUG, "call w1 (update) started"),
        (WARNING, "call w1 (update) scope_blocked scope=crm-key wait=0.500s"),
        (WARNING, "call w1 (update) retry_scheduled scope=crm-key wait=0.500s: RateLimitedError"),
        (DEBUG, "call w1 (update) slot_acquired scope=crm-key attempt=2"),
        (INFO, "call w1 (update) token_wait scope=crm-key wait=0.500s attempt=2"),
        (DEBUG, "call w1 (update) started attempt=2"),
        (INFO, "call w1 (update) answered ok attempt=2"),
    ]
    assert records_of(caplog, "x1") == [
        (DEBUG, "call x1 (delete_everything) queued"),
        (
            WARNING,
            "call x1 (delete_everything) refused: there is no tool named 'delete_everything'; "
            "the tools are: lookup, update",
        ),
        (WARNING, "call x1 (delete_everything) answered refused"),
    ]
    turn_records = [(r.levelno, r.getMessage()) for r in (caplog.records[0], caplog.records[-1])]
    assert turn_records == [
        (INFO, "turn turn-1 started calls=6"),
        (INFO, "turn turn-1 finished ok=4 refused=2"),
    ]


async def test_fields_travel_in_one_fanout_attribute(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``record.fanout`` holds the event's set fields as plain values, detail nested."""
    caplog.set_level(DEBUG, logger="fanout")
    await run_throttled_turn(LoggingInstrument())
    retry = next(fields(r) for r in caplog.records if fields(r)["kind"] == "retry_scheduled")
    assert retry == {
        "kind": "retry_scheduled",
        "time": 3.5,
        "turn_id": "turn-1",
        "call_id": "w1",
        "tool": "update",
        "scope": "crm-key",
        "attempt": 1,
        "wait": 0.5,
        "reason": "RateLimitedError",
    }
    queued = next(fields(r) for r in caplog.records if fields(r).get("call_id") == "w2")
    assert queued == {
        "kind": "queued", "time": 0.0, "turn_id": "turn-1", "call_id": "w2", "tool": "update"
    }  # fmt: skip
    finished = fields(caplog.records[-1])
    assert finished == {
        "kind": "turn_finished", "time": 5.5, "turn_id": "turn-1",
        "detail": {"ok": 4, "refused": 2},
    }  # fmt: skip


async def test_info_level_keeps_answers_waits_and_warnings(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """At INFO a call's routine steps are dropped before a record is built; the rest stays."""
    caplog.set_level(INFO, logger="fanout")
    await run_throttled_turn(LoggingInstrument())
    levels = [r.levelno for r in caplog.records]
    assert (levels.count(INFO), levels.count(WARNING), levels.count(DEBUG)) == (9, 6, 0)


async def test_given_logger_and_level_are_used(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Routine records go to the given logger at the given level; problems still warn."""
    caplog.set_level(DEBUG, logger="app.tools")
    await run_throttled_turn(LoggingInstrument(logging.getLogger("app.tools"), level=DEBUG))
    assert {r.name for r in caplog.records} == {"app.tools"}
    levels = [r.levelno for r in caplog.records]
    assert (levels.count(WARNING), levels.count(DEBUG)) == (6, 25)


async def test_logs_never_carry_a_credential(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A key passed as a tool argument reaches neither messages nor fields."""
    caplog.set_level(DEBUG, logger="fanout")
    await run_throttled_turn(LoggingInstrument())
    assert SECRET not in caplog.text
    assert not [r for r in caplog.records if SECRET in repr(fields(r))]


async def test_http_exchanges_are_logged_without_the_key(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Requests and responses are DEBUG lines with their detail; the key sent is in none."""
    caplog.set_level(DEBUG, logger="fanout")
    _, base = await run_http_turn(LoggingInstrument())
    exchanges = [
        (level, message.replace(base, "BASE"))
        for level, message in records_of(caplog, "h2")
        if " request_sent" in message or " response" in message
    ]
    assert exchanges == [
        (DEBUG, "call h2 (fetch) request_sent method=GET url=BASE/items/2?api_key=REDACTED"),
        (DEBUG, "call h2 (fetch) response status=429 retry_after=1.0"),
        (
            DEBUG,
            "call h2 (fetch) request_sent attempt=2 method=GET url=BASE/items/2?api_key=REDACTED",
        ),
        (DEBUG, "call h2 (fetch) response attempt=2 status=200"),
    ]
    assert SECRET not in caplog.text


def test_a_credential_in_an_event_never_reaches_a_record(caplog: pytest.LogCaptureFixture) -> None:
    """Text shaped like a credential, in any field or detail, is redacted in message and fields."""
    caplog.set_level(DEBUG, logger="fanout")
    event = fanout.Event(
        fanout.EventKind.REFUSED, 0.0, "t", "c1", "tool", "org", reason="Bearer sk-live-abcdef123",
        detail={"url": "https://u:pw-123456@api.test/x?api_key=sk-live-abcdef123"},
    )  # fmt: skip
    LoggingInstrument().on_event(event)
    (record,) = caplog.records
    text = record.getMessage() + repr(fields(record))
    assert "abcdef" not in text
    assert "pw-123456" not in text
    assert "REDACTED" in text
