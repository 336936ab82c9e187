"""The HTTP side of an MCP session: every failure an answer, every credential known.

The ``mcp`` SDK's streamable-HTTP client sends each request from a task of
its own, inside a task group around the whole session. A request that fails
on the wire (a refused connection, one dropped mid-answer) raised there, and
the task group cancelled everything inside the session, the turn that was
running with it: no call of that turn got its answer, and an exception group
of ``httpx2`` errors came out of ``open_http``. So the session's client
sends through ``AnsweredTransport``, which turns such a failure into the
JSON-RPC error the SDK hands to the one request it was for: that call alone
fails, as a lost connection (``CONNECTION_CLOSED``), and the session lives.

A refusal with a wait (a 429, or a 503 with ``Retry-After``) is answered the
same way, with the wait in the error's data (``RETRY_AFTER_FIELD``): the SDK
itself keeps only "Server returned an error response", and the call could
not be answered ``rate_limited`` with the server's wait.

What the session is opened with (its URL, its headers) is read for the
credentials it carries (`credentials_of`), so that answers, events and logs
are scrubbed of them, whatever a server quotes back; so is the session id
the server gives it, as it comes and as each request carries it.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx2
from mcp.client.streamable_http import MCP_SESSION_ID
from mcp.types import CONNECTION_CLOSED, INTERNAL_ERROR

from ._canonical import safe_text
from ._credentials import CredentialNames, credentials_in
from ._headers import parse_rate_limit_headers
from ._redact import address, redact_text
from ._secrets import learn

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._secrets import Secret

__all__ = ["RETRY_AFTER_FIELD", "AnsweredTransport", "address_of", "credentials_of"]

# In the data of a JSON-RPC error this transport writes: the server's wait, in seconds,
# and the HTTP status that carried it.
RETRY_AFTER_FIELD = "fanout/retry-after"
STATUS_FIELD = "fanout/http-status"


def _json_rpc_error(code: int, message: str, data: dict[str, Any] | None = None) -> httpx2.Response:
    """An HTTP answer holding a JSON-RPC error, which the SDK gives the request it answers
    (its ``id`` is the request's: the SDK puts it back where the server left it null)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data:
        error["data"] = data
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    return httpx2.Response(502, headers={"content-type": "application/json"}, content=body)


class AnsweredTransport(httpx2.AsyncBaseTransport):
    """An ``httpx2`` transport whose failures reach the SDK as answers, not exceptions.

    A JSON answer is read whole here, so that a connection dropped while its
    body arrives fails as one dropped before it (an event stream is left to
    the SDK, which answers a stream cut short itself).
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        _learn_session_id(request.headers)
        try:
            response = await self._inner.handle_async_request(request)
            _learn_session_id(response.headers)
            content_type = response.headers.get("content-type", "").lower()
            if content_type.startswith("application/json"):
                raw = b"".join([chunk async for chunk in response.aiter_raw()])
                await response.aclose()
                response = httpx2.Response(
                    response.status_code, headers=response.headers, content=raw,
                    extensions=response.extensions,
                )  # fmt: skip
        except httpx2.TransportError as exc:
            what = redact_text(f"{type(exc).__name__}: {safe_text(exc)}")
            return _json_rpc_error(
                CONNECTION_CLOSED, f"the connection to the MCP server failed ({what})"
            )
        if response.status_code in (429, 503):
            wait = parse_rate_limit_headers(response.headers, now=time.time()).retry_after
            if response.status_code == 429 or wait is not None:
                await response.aclose()
                data: dict[str, Any] = {STATUS_FIELD: response.status_code}
                if wait is not None:
                    data[RETRY_AFTER_FIELD] = wait
                return _json_rpc_error(
                    INTERNAL_ERROR, f"the MCP server answered HTTP {response.status_code}", data
                )
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _learn_session_id(headers: httpx2.Headers) -> None:
    """Learn the session id ``headers`` carry: whoever holds it acts in the session, and a
    tool quoting its request's headers showed it to the model. Learned from the answer
    that sets it (before the SDK can send it) and from each request (a server may hand
    out another); not pinned, as a session's id ends with it."""
    session_id = headers.get(MCP_SESSION_ID)
    if session_id:
        learn(credentials_in([(MCP_SESSION_ID, session_id)], "", CredentialNames()))


def credentials_of(url: str, headers: Mapping[str, str]) -> set[Secret]:
    """The credentials a session's requests carry: in its credential headers, its URL's
    query and its userinfo, as fanout's HTTP layer finds them in a request."""
    return credentials_in(headers.items(), url, CredentialNames())


def address_of(url: str) -> str:
    """Where ``url`` points, host and port, without its userinfo (a password, there)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return address(parts.hostname, port)
