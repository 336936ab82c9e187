"""A refusal's wait stated in its body, as Google's ``RetryInfo`` does.

Google's APIs (Gemini, Cloud) answer a spent quota with a ``429`` whose JSON
body, not a header, says how long to wait::

    {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "23s"}]}}

Unread, the refusal is a bare 429: a scope told its rate retried after a
short backoff into the same spent quota, three times, and gave the call up.
Some of Google's APIs wrap the error in a one-element list; both are read.
Two plainer forms say the same in seconds: Discord's top-level
``"retry_after": 64.57`` and Telegram's ``"parameters": {"retry_after": 35}``.

The body is read only from a refusal whose headers state no wait, only when
it says it is JSON, and only up to ``BODY_LIMIT`` bytes (a refusal is a few
hundred; a bigger one is not this). Anything unexpected is no wait, never an
error: a body is the server's to get wrong.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import AsyncIterable

__all__ = ["BODY_LIMIT", "read_capped", "retry_delay"]

BODY_LIMIT = 64 * 1024  # bytes of a refusal's body read for its wait
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
# A protobuf Duration in JSON: whole seconds, up to nine decimals, then "s".
_DURATION = re.compile(r"(\d{1,12}(?:\.\d{1,9})?)s", re.ASCII)


def retry_delay(body: bytes, max_wait: float) -> float | None:
    """Seconds the body's ``RetryInfo`` says to wait, or None (none, unreadable, or
    longer than ``max_wait``)."""
    try:
        data: Any = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested absurdly deep
        return None
    if isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, dict):
        return None
    seconds = _google(data.get("error"))
    if seconds is None:
        parameters = data.get("parameters")
        plain = parameters.get("retry_after") if isinstance(parameters, dict) else None
        seconds = _seconds(data.get("retry_after"))
        seconds = _seconds(plain) if seconds is None else seconds
    return seconds if seconds is not None and seconds <= max_wait else None


def _google(error: Any) -> float | None:
    """The ``retryDelay`` of the first ``RetryInfo`` among an error's details."""
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, dict) and detail.get("@type") == _RETRY_INFO:
            delay = detail.get("retryDelay")
            match = _DURATION.fullmatch(delay.strip()) if isinstance(delay, str) else None
            if match is not None:
                return float(match[1])
    return None


def _seconds(value: Any) -> float | None:
    """A JSON number of seconds, at least 0 and finite (``true`` is no number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


async def read_capped(stream: AsyncIterable[bytes], limit: int = BODY_LIMIT) -> bytes | None:
    """The whole body if it is at most ``limit`` bytes, else None (it is not read on)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
