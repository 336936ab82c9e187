"""The words the model reads: every outcome as one stable, actionable answer.

A failure is a response, not a hole in the transcript. Non-ok answers are a
small canonical JSON object so the model can plan with them: what happened,
whether the tool had started (side effects possible) or never ran, and what
to do next. Nothing here depends on timing except a server-given or
limiter-computed ``retry_after_ms``, which is itself a function of the clock.
"""

from __future__ import annotations

import math
from typing import Any

from ._canonical import canonical_json, truncate
from ._output import cut_json, defuse, encode_parts, is_parts
from ._values import Kind, Status, ToolCall, ToolResult

__all__ = ["failure", "success"]

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


def success(call: ToolCall, value: Any, *, limit: int) -> ToolResult:
    """An ``ok`` answer; non-text output is serialised canonically, then capped.

    Output that cannot be serialised at all (a structure containing itself)
    is an ``error`` answer that says so, never a crashed turn.
    """
    if isinstance(value, str):
        return ToolResult(call.id, Status.OK, truncate(defuse(value), limit))
    if is_parts(value):
        return ToolResult(call.id, Status.OK, encode_parts(value, limit=limit))
    try:
        text = canonical_json(value)
    except (ValueError, RecursionError) as exc:
        message = f"the tool returned output that cannot be written as JSON ({exc})"
        return failure(call, Status.ERROR, message, started=True, kind=Kind.PURE)
    return ToolResult(call.id, Status.OK, cut_json(text, limit))


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
) -> ToolResult:
    """A non-ok answer as canonical JSON, with the facts the model needs."""
    retry_after_ms = None
    if retry_after is not None and math.isfinite(retry_after):
        retry_after_ms = max(0, math.ceil(retry_after * 1000))
    body: dict[str, Any] = {
        "status": status.value,
        "tool": call.name,
        "message": truncate(message, _MAX_MESSAGE),
        "started": started,
    }
    if scope is not None:
        body["scope"] = scope
    if retry_after_ms is not None:
        body["retry_after_ms"] = retry_after_ms
    chosen_hint = hint or _HINTS.get(status)
    if chosen_hint:
        body["hint"] = chosen_hint
    if started and kind is Kind.MUTATING and status in (Status.CANCELLED, Status.TIMED_OUT):
        body["effect"] = _UNKNOWN_EFFECT
    return ToolResult(
        call.id, status, canonical_json(body), retry_after_ms=retry_after_ms, scope=scope
    )
