"""The words the model reads: every outcome as one stable, actionable answer.

A failure is a response, not a hole in the transcript. Non-ok answers are a
small canonical JSON object so the model can plan with them: what happened,
whether the tool had started (side effects possible) or never ran, and what
to do next. Nothing here depends on timing except a server-given or
limiter-computed ``retry_after_ms``, which is itself a function of the clock.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from ._budget import usable_wait
from ._canonical import canonical_json, clean_text, safe_text, truncate
from ._output import cut_json, defuse, encode_parts, parts_in
from ._redact import redact_text
from ._values import Kind, Status, ToolCall, ToolResult

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._secrets import Secret

__all__ = ["failure", "milliseconds", "success"]

_HINTS = {
    Status.RATE_LIMITED: "re-issue the same call after retry_after_ms; the arguments were fine",
    Status.QUOTA_EXHAUSTED: "the quota for this scope is spent; do not retry before it resets",
    Status.TIMED_OUT: "the call ran out of time; re-issue it only if still needed",
    Status.CANCELLED: "the call was stopped before it finished; re-issue it if still needed",
}

_UNKNOWN_EFFECT = (
    "unknown: the call had started and may have taken effect; re-issuing it is safe "
    "only with the same idempotency key, which fanout sends for identical calls in this run"
)

_MAX_MESSAGE = 500


def success(
    call: ToolCall, value: Any, *, limit: int, secrets: Iterable[str | Secret] = ()
) -> ToolResult:
    """An ``ok`` answer; non-text output is serialised canonically, then capped.

    Credentials (``secrets``, and any by shape) are taken out before the cap,
    not after: a short value replaced by ``REDACTED`` grew a capped answer
    past the cap (100 characters became 180), and a cap falling inside a
    key left its first part to be read. Output that cannot be serialised at
    all (a structure containing itself, or nested past all use) is an
    ``error`` answer that says so, never a crashed turn.
    """
    if isinstance(value, str):
        text = redact_text(defuse(clean_text(str.__str__(value))), secrets)
        return ToolResult(call.id, Status.OK, truncate(text, limit))
    parts = parts_in(value)
    if parts is not None:
        return ToolResult(call.id, Status.OK, encode_parts(parts, limit=limit))
    try:
        text = canonical_json(value)
    except Exception as exc:  # a value that contains itself, or that raised as it was read
        message = f"the tool returned output that cannot be written as JSON ({safe_text(exc)})"
        return failure(call, Status.ERROR, message, started=True, kind=Kind.PURE)
    return ToolResult(call.id, Status.OK, cut_json(redact_text(text, secrets), limit))


def failure(
    call: ToolCall,
    status: Status,
    message: str,
    *,
    started: bool,
    kind: Kind,
    scope: str | None = None,
    retry_after: float | None = None,
    hint: str | None = None,
    effect_unknown: bool = False,
) -> ToolResult:
    """A non-ok answer as canonical JSON, with the facts the model needs.

    A write that had started and was cut off (or that fanout failed to
    finish: ``effect_unknown``) says its effect is unknown.
    """
    retry_after_ms = milliseconds(retry_after)
    cut_off = status in (Status.CANCELLED, Status.TIMED_OUT) or effect_unknown
    unknown_effect = started and kind is Kind.MUTATING and cut_off
    content = _failure_text(
        status, call.name, message, started, scope, retry_after_ms, hint, unknown_effect
    )
    return ToolResult(call.id, status, content, retry_after_ms=retry_after_ms, scope=scope)


@functools.lru_cache(maxsize=1024)
def _failure_text(
    status: Status,
    tool: str,
    message: str,
    started: bool,
    scope: str | None,
    retry_after_ms: int | None,
    hint: str | None,
    unknown_effect: bool,
) -> str:
    """The canonical JSON of a non-ok answer; remembered, since a deadline ends many alike."""
    body: dict[str, Any] = {
        "status": status.value,
        # The model's name for the tool, cut as a message is: a refusal of an unknown tool
        # named in 100,000 characters was as long.
        "tool": truncate(tool, _MAX_MESSAGE),
        "message": truncate(clean_text(message), _MAX_MESSAGE),
        "started": started,
    }
    if scope is not None:
        body["scope"] = scope
    if retry_after_ms is not None:
        body["retry_after_ms"] = retry_after_ms
    chosen_hint = hint or _HINTS.get(status)
    if chosen_hint:
        body["hint"] = chosen_hint
    if unknown_effect:
        body["effect"] = _UNKNOWN_EFFECT
    return canonical_json(body)


def milliseconds(seconds: object) -> int | None:
    """A wait as whole milliseconds for the model, or None when it is no usable number.

    Waits come from tools and servers; `usable_wait` says which are usable.
    """
    wait = usable_wait(seconds)
    return None if wait is None else math.ceil(wait * 1000)
