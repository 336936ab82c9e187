"""The HTTP layer: an httpx transport that obeys, and learns, the server's limits.

Tools make requests with an ordinary ``httpx.AsyncClient`` whose transport is
a ``FanoutTransport``. For each request sent from inside a tool call it:

* charges the request to the call's scopes and budget first. The runner
  reserved one token when it admitted the attempt, which pays for the first
  request; each further request reserves again, so a tool making three
  requests is charged three times. A request whose wait does not fit the
  budget (or the inline threshold) is never sent: ``NotSentError``;
* adds ``Idempotency-Key`` (the call's key) to requests of mutating calls;
* reads the rate-limit headers of the response into the scopes (a window
  with nothing remaining blocks the scope until its reset; stated limits
  teach a scope with no configured rate);
* turns 429, and 503 with a Retry-After, into ``RateLimitedError`` with the
  parsed wait and the bucket the server named, so the runner's retry policy
  applies; other 5xx become ``TransientError``; ``x-should-retry`` overrides
  either way;
* writes no credential anywhere: URLs and messages are redacted before they
  reach an event or an exception.

Outside a tool call the transport simply forwards the request.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

import httpx
import trio

from ._admission import take_tokens
from ._context import maybe_current_call
from ._events import EventKind
from ._exceptions import NotSentError, RateLimitedError, TransientError
from ._headers import parse_rate_limit_headers
from ._redact import redact_text, redact_url, secrets_in
from ._scope import scopes_named
from ._values import Kind, Status

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._context import CallContext
    from ._headers import RateLimitInfo

__all__ = ["FanoutTransport", "http_client"]

_TRANSIENT = frozenset({500, 502, 503, 504})


class FanoutTransport(httpx.AsyncBaseTransport):
    """Wraps any httpx transport; see the module docstring for what it adds.

    Without a ``transport`` of its own it spreads calls over ``pools`` httpx
    connection pools (``pool_options`` configure each). httpx's pool gets
    slower as many concurrent requests share it; at 200 concurrent calls
    four pools beat one (``benchmarks/bench_http.py``).
    ``wall_clock`` is only for reading HTTP-dates and epoch resets; every
    wait is measured on trio's clock.
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        pools: int = 4,
        wall_clock: Callable[[], float] = time.time,
        **pool_options: Any,
    ) -> None:
        if transport is not None:
            self._transports: tuple[httpx.AsyncBaseTransport, ...] = (transport,)
        else:
            count = max(1, pools)
            self._transports = tuple(httpx.AsyncHTTPTransport(**pool_options) for _ in range(count))
        self._unbound = itertools.cycle(self._transports)
        self._wall_clock = wall_clock

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        context = maybe_current_call()
        if context is None:
            return await next(self._unbound).handle_async_request(request)
        # A call keeps to one pool, so its next request finds the connection
        # its last one just released.
        transport = self._transports[context.call.position % len(self._transports)]
        if context.requests > 0:
            await _charge(context)
        context.requests += 1
        context.secrets.update(secrets_in(request))
        if context.kind is Kind.MUTATING and context.idempotency_key:
            request.headers.setdefault("Idempotency-Key", context.idempotency_key)
        url = redact_url(request.url)
        _emit(context, EventKind.REQUEST_SENT, detail={"method": request.method, "url": url})
        sent_at = trio.current_time()
        try:
            response = await transport.handle_async_request(request)
        except httpx.TransportError as exc:
            # The exception's text may carry the URL; keep only a redacted form.
            raise TransientError(redact_text(f"{type(exc).__name__}: {exc}")) from None
        info = parse_rate_limit_headers(response.headers, now=self._wall_clock())
        for scope in scopes_named(context.scopes, info.scope):
            await scope.observe_headers(info, sent_at=sent_at)
        _emit(
            context, EventKind.RESPONSE, scope=info.scope, detail=_response_detail(response, info)
        )
        signal = _signal_for(response.status_code, info, f"{request.method} {url}")
        if signal is not None:
            await response.aclose()
            raise signal
        return response

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()


def http_client(
    transport: httpx.AsyncBaseTransport | None = None, **client_options: Any
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose requests are charged to the running call.

    Share one client between tools: its connection pool is reused, and the
    transport finds the running call itself (through ``current_call()``).
    """
    return httpx.AsyncClient(transport=FanoutTransport(transport), **client_options)


async def _charge(context: CallContext) -> None:
    """Reserve a token on each scope for a request after the first, within budget."""
    patience = context.budget.deadline
    if context.inline_wait is not None:
        patience = min(patience, trio.current_time() + context.inline_wait)
    shortfall = await take_tokens(
        context.scopes, 1.0, budget=context.budget, patience=patience,
        on_wait=lambda wait, scope: _emit(context, EventKind.TOKEN_WAIT, wait=wait, scope=scope),
    )  # fmt: skip
    if shortfall is not None:
        raise NotSentError(
            f"a further request of this call would wait {shortfall.needed:.3f}s on scope "
            f"{shortfall.scope!r}, more than it can afford; it was not sent",
            status=Status.RATE_LIMITED, scope=shortfall.scope, retry_after=shortfall.needed,
        )  # fmt: skip


def _signal_for(
    status: int, info: RateLimitInfo, what: str
) -> RateLimitedError | TransientError | None:
    """The exception a response's status and headers call for, if any."""
    retry = info.should_retry
    if status == 429 or (status == 503 and info.retry_after is not None):
        return RateLimitedError(
            f"{what} answered {status}",
            retry_after=info.retry_after, scope=info.scope, retryable=retry is not False,
        )  # fmt: skip
    if retry is False:
        return None
    if status in _TRANSIENT or (retry is True and status >= 400):
        return TransientError(f"{what} answered {status}")
    return None


def _response_detail(response: httpx.Response, info: RateLimitInfo) -> dict[str, Any]:
    detail: dict[str, Any] = {"status": response.status_code}
    for name in ("limit", "remaining", "reset_after", "retry_after", "window"):
        value = getattr(info, name)
        if value is not None:
            detail[name] = value
    return detail


def _emit(context: CallContext, kind: EventKind, **fields: Any) -> None:
    context.recorder.emit(
        kind, call_id=context.call.id, tool=context.call.name, attempt=context.attempt, **fields
    )
