"""fanout's transport for httpx2, the client the Anthropic, OpenAI and MCP SDKs are built on.

The same transport as ``fanout.FanoutTransport`` (one implementation,
`fanout._http_core`), for ``httpx2.AsyncClient``: requests are charged to
the running call, credentials learned and scrubbed, rate-limit headers read,
429s and body errors turned into signals the runner retries. Needs the
``httpx2`` extra (``pip install 'fanout[httpx2]'``)::

    from fanout.httpx2 import FanoutTransport, http_client
    client = anthropic.AsyncAnthropic(http_client=http_client())
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx2

from ._http_core import GuardedBody, Seam, TransportBase, charged_client

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["FanoutTransport", "http_client"]


class _Body(GuardedBody, httpx2.AsyncByteStream):
    """A response body that reports a reset or a bad chunk as ``TransientError``."""


class FanoutTransport(TransportBase[httpx2.Request, httpx2.Response], httpx2.AsyncBaseTransport):
    """An httpx2 transport that charges each request to the running call; see `TransportBase`."""

    seam = Seam.of(httpx2, body=_Body)


def http_client(
    transport: httpx2.AsyncBaseTransport | None = None,
    *,
    secret_headers: Iterable[str] = (),
    secret_params: Iterable[str] = (),
    **client_options: Any,
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` whose requests are charged to the running call."""
    return charged_client(
        FanoutTransport, httpx2.AsyncClient, transport, client_options,
        secret_headers=secret_headers, secret_params=secret_params,
    )  # fmt: skip
