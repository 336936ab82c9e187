"""The HTTP layer for httpx: a transport that obeys, and learns, the server's limits.

Tools make requests with an ordinary ``httpx.AsyncClient`` whose transport is
a ``FanoutTransport``. What it does to each request (charging, credentials,
idempotency keys, rate-limit headers, 429s, body errors) is `fanout._http_core`,
shared with the httpx2 transport (`fanout.httpx2`); this module only names
httpx's classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from ._http_core import GuardedBody, Seam, TransportBase, charged_client

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["FanoutTransport", "http_client"]


class _Body(GuardedBody, httpx.AsyncByteStream):
    """A response body that reports a reset or a bad chunk as ``TransientError``."""


class FanoutTransport(TransportBase[httpx.Request, httpx.Response], httpx.AsyncBaseTransport):
    """An httpx transport that charges each request to the running call; see `TransportBase`."""

    seam = Seam.of(httpx, body=_Body)


def http_client(
    transport: httpx.AsyncBaseTransport | None = None,
    *,
    secret_headers: Iterable[str] = (),
    secret_params: Iterable[str] = (),
    **client_options: Any,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose requests are charged to the running call.

    Share one client between tools: its connection pool is reused, and the
    transport finds the running call itself (through ``current_call()``).
    """
    return charged_client(
        FanoutTransport, httpx.AsyncClient, transport, client_options,
        secret_headers=secret_headers, secret_params=secret_params,
    )  # fmt: skip
