"""Keeping credentials out of everything fanout writes.

A key leaks through the text around it: an exception that prints a URL with
``?api_key=...``, a header echoed into a log line. Everything the HTTP layer
puts in a trace event, an error message or a result goes through here first.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["SECRET_HEADERS", "redact_text", "redact_url", "secrets_in"]

REDACTED = "REDACTED"

SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "set-cookie"}
)

# Query parameters whose values are credentials, by the names services use.
_SECRET_PARAM = re.compile(
    r"(?i)^(api[-_]?key|apikey|key|token|access[-_]?token|auth|secret|client[-_]?secret|"
    r"password|passwd|sig|signature|x-amz-signature|x-amz-credential|code)$"
)
# Credentials by shape, wherever they stand in free text.
_SECRET_TEXT = re.compile(
    r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(sk|pk|rk|xox[abpr]|ghp|gho|ghs|glpat)[-_][A-Za-z0-9_-]{8,}"
    r"|([?&](?:api[-_]?key|apikey|key|token|access[-_]?token|secret|password|sig)=)[^&\s\"']+"
)


def redact_url(url: httpx.URL | str) -> str:
    """The URL with credential-like query values and any userinfo replaced."""
    parsed = httpx.URL(url)
    params = [
        (name, REDACTED if _SECRET_PARAM.match(name) else value)
        for name, value in parsed.params.multi_items()
    ]
    cleaned = parsed.copy_with(params=params) if params else parsed
    if parsed.userinfo:
        cleaned = cleaned.copy_with(username=None, password=None)
    return str(cleaned)


def secrets_in(request: httpx.Request) -> set[str]:
    """The credential values a request carries, in headers and query parameters."""
    found = set()
    for name, value in request.headers.items():
        if name.lower() in SECRET_HEADERS:
            found.add(value)
            scheme, _, credential = value.partition(" ")
            if credential and scheme.lower() in ("bearer", "basic", "token"):
                found.add(credential)
    for name, value in request.url.params.multi_items():
        if _SECRET_PARAM.match(name):
            found.add(value)
    return {secret for secret in found if len(secret) >= 4}


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Free text with known ``secrets`` and credential-shaped tokens replaced."""
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return _SECRET_TEXT.sub(_keep_prefix, text)


def _keep_prefix(match: re.Match[str]) -> str:
    prefix = match.group(1) or match.group(3) or ""
    return prefix + REDACTED
