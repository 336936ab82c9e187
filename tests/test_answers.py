"""The words the model reads: every non-ok outcome as one canonical, actionable JSON answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fanout import Kind, Status, ToolCall
from fanout._answers import failure, success

CALL = ToolCall("c1", "send_invoice", {})


def _body(content: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(content)
    return parsed


def test_a_throttled_call_says_when_to_retry_in_whole_milliseconds() -> None:
    """A wait of 0.25001 s is 251 ms, on the result and in its text, with the rate hint."""
    result = failure(
        CALL, Status.RATE_LIMITED, "slow down", started=False, kind=Kind.READS,
        scope="api", retry_after=0.25001,
    )  # fmt: skip
    assert (result.retry_after_ms, result.scope) == (251, "api")
    assert result.content == (
        '{"hint":"re-issue the same call after retry_after_ms; the arguments were fine",'
        '"message":"slow down","retry_after_ms":251,"scope":"api","started":false,'
        '"status":"rate_limited","tool":"send_invoice"}'
    )


@pytest.mark.parametrize(
    ("status", "started", "kind", "effect_unknown", "unknown"),
    [
        (Status.TIMED_OUT, True, Kind.MUTATING, False, True),  # a write cut off mid-way
        (Status.CANCELLED, True, Kind.MUTATING, False, True),
        (Status.ERROR, True, Kind.MUTATING, True, True),  # fanout failed to finish it
        (Status.ERROR, True, Kind.MUTATING, False, False),  # the tool's own error: it answered
        (Status.TIMED_OUT, False, Kind.MUTATING, False, False),  # never started
        (Status.TIMED_OUT, True, Kind.READS, False, False),  # a read changes nothing
    ],
)
def test_only_a_write_cut_off_after_it_started_has_an_unknown_effect(
    status: Status, started: bool, kind: Kind, effect_unknown: bool, unknown: bool
) -> None:
    """The effect is unknown exactly when a started write was cut off or left unfinished."""
    result = failure(
        CALL, status, "stopped", started=started, kind=kind, effect_unknown=effect_unknown
    )
    assert ("effect" in _body(result.content)) is unknown


def test_a_hint_given_replaces_the_status_default_and_errors_have_none() -> None:
    """An explicit hint wins over the status's; an error without one has no hint at all."""
    given = failure(CALL, Status.TIMED_OUT, "x", started=False, kind=Kind.READS, hint="wait")
    assert _body(given.content)["hint"] == "wait"
    assert "hint" not in _body(
        failure(CALL, Status.ERROR, "x", started=False, kind=Kind.READS).content
    )


@pytest.mark.parametrize("wait", [None, float("nan"), "2", True])
def test_a_wait_that_is_no_usable_number_is_left_unsaid(wait: Any) -> None:
    """No retry_after_ms for a missing, NaN or non-numeric wait; a negative one is 0."""
    result = failure(
        CALL, Status.RATE_LIMITED, "x", started=False, kind=Kind.READS, retry_after=wait
    )
    assert result.retry_after_ms is None
    assert "retry_after_ms" not in _body(result.content)
    negative = failure(
        CALL, Status.RATE_LIMITED, "x", started=False, kind=Kind.READS, retry_after=-1
    )
    assert negative.retry_after_ms == 0


def test_a_long_message_is_cut_to_500_characters_with_a_marker() -> None:
    """The model reads at most 500 characters of a message, and is told what was cut."""
    message = _body(failure(CALL, Status.ERROR, "x" * 2000, started=True, kind=Kind.READS).content)
    assert len(message["message"]) == 500
    assert message["message"].startswith("xxx")
    assert message["message"].endswith("more characters]")


def test_a_tool_name_the_model_wrote_long_is_cut_as_a_message_is() -> None:
    """Every non-ok answer is small: a refusal of an unknown tool named in 100,000
    characters carried the name whole."""
    name = "search_" + "x" * 100_000
    call = ToolCall("c1", name, {})
    result = failure(call, Status.REFUSED, "no such tool", started=False, kind=Kind.READS)
    assert len(result.content) < 1_200
    assert json.loads(result.content)["tool"].startswith("search_xxx")


def test_output_that_cannot_be_json_is_an_error_answer() -> None:
    """A value that contains itself is answered error, saying so, never a crash."""
    looped: list[Any] = []
    looped.append(looped)
    result = success(CALL, looped, limit=8000)
    assert result.status is Status.ERROR
    assert "cannot be written as JSON" in _body(result.content)["message"]
