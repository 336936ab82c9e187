"""A loopback HTTP/1.1 server that echoes every request back, and one that breaks bodies.

The echo server is the worst server a credential can meet: it quotes the
request line, every header and the body in its answer, and in its own
headers, and names the bucket of a 429 after the request's own credential.
Paths choose what it does, so one server plays every part of a sweep:

* ``/throttle/<tag>``: the first request of a tag is a 429 (Retry-After
  0.5 s, ``x-ratelimit-scope`` from ``scope_of``: the credential, say),
  later ones are echoed;
* ``/flaky/<tag>``: the first request of a tag is a 503, later ones echoed;
* ``/status/<code>``: that status, with the echo as its body;
* anything else: 200 with the echo.

The faulty server answers 200 and then breaks the body (``reset``: RST
mid-body; ``truncate``: close before Content-Length is reached; ``chunk``: a
chunk size that is not hexadecimal), for the first ``faults`` requests only.
Both run on trio's clock beside the client, so ``MockClock`` times are exact.
"""

from __future__ import annotations

import json
import socket
import struct
from collections import Counter
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal

import attrs
import h11
import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable

Fault = Literal["reset", "truncate", "chunk"]
FAULTS: tuple[Fault, ...] = ("reset", "truncate", "chunk")


@attrs.define
class Seen:
    """One request as the server read it: the raw request line, headers and body."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes


def _no_scope(seen: Seen) -> str | None:
    return None


@attrs.define
class Server:
    """The requests a server saw; ``scope_of`` names a 429's bucket (a server knows its keys)."""

    url: str = ""
    seen: list[Seen] = attrs.field(factory=list)
    tags: Counter[str] = attrs.field(factory=Counter)
    scope_of: Callable[[Seen], str | None] = _no_scope


async def _read_request(conn: h11.Connection, stream: trio.SocketStream) -> Seen | None:
    event = await _next_event(conn, stream)
    if not isinstance(event, h11.Request):
        return None
    body = b""
    while not isinstance(part := await _next_event(conn, stream), h11.EndOfMessage):
        if isinstance(part, h11.Data):
            body += part.data
    headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in event.headers]
    return Seen(event.method.decode(), event.target.decode("latin-1"), headers, body)


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> object:
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await stream.receive_some(65536))
    return event


def _echo_response(server: Server, seen: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
    echo = {
        "method": seen.method,
        "target": seen.target,
        "headers": seen.headers,
        "body": seen.body.decode("latin-1"),
    }
    body = json.dumps(echo).encode()
    headers = [("content-type", "application/json"), ("x-echo-target", seen.target)]
    parts = seen.target.split("?")[0].strip("/").split("/")
    status = 200
    if parts[0] in ("throttle", "flaky") and len(parts) > 1:
        server.tags[seen.target.split("?")[0]] += 1
        if server.tags[seen.target.split("?")[0]] == 1:
            status = 429 if parts[0] == "throttle" else 503
    if parts[0] == "status" and len(parts) > 1 and parts[1].isdigit():
        status = int(parts[1])
    if status == 429:
        headers.append(("retry-after", "0.5"))
        if (scope := server.scope_of(seen)) is not None:
            headers.append(("x-ratelimit-scope", scope))
    return status, headers, body


async def _serve_echo(server: Server, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    async with stream:
        try:
            while (seen := await _read_request(conn, stream)) is not None:
                server.seen.append(seen)
                status, headers, body = _echo_response(server, seen)
                headers.append(("content-length", str(len(body))))
                events = (h11.Response(status_code=status, headers=headers), h11.Data(body))
                data = b"".join(conn.send(e) or b"" for e in (*events, h11.EndOfMessage()))
                await stream.send_all(data)
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return


def _reset(stream: trio.SocketStream) -> None:
    """Close with RST instead of FIN: the client reads ECONNRESET."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def _serve_faulty(
    server: Server, fault: Fault, faults: int, stream: trio.SocketStream
) -> None:
    conn = h11.Connection(h11.SERVER)
    async with stream:
        try:
            while (seen := await _read_request(conn, stream)) is not None:
                server.seen.append(seen)
                body = b'{"ok": true, "n": %d}' % len(server.seen)
                if len(server.seen) > faults:
                    head = [("content-length", str(len(body)))]
                    events = (h11.Response(status_code=200, headers=head), h11.Data(body))
                    data = b"".join(conn.send(e) or b"" for e in (*events, h11.EndOfMessage()))
                    await stream.send_all(data)
                    conn.start_next_cycle()
                    continue
                await _break_body(stream, fault, body)
                return
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return


async def _break_body(stream: trio.SocketStream, fault: Fault, body: bytes) -> None:
    if fault == "chunk":
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        await stream.send_all(head + b"4\r\n" + body[:4] + b"\r\nzz\r\n")
        return
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (len(body) + 1000)
    await stream.send_all(head + body)
    await trio.sleep(0.01)  # let the client take the first bytes before the fault
    if fault == "reset":
        _reset(stream)


@asynccontextmanager
async def _serving(
    handler: Callable[[trio.SocketStream], Awaitable[None]], server: Server
) -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        server.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def serve_echo(
    scope_of: Callable[[Seen], str | None] = _no_scope,
) -> AsyncIterator[Server]:
    """The echo server on 127.0.0.1 for the duration of the block."""
    server = Server(scope_of=scope_of)
    async with _serving(lambda stream: _serve_echo(server, stream), server) as running:
        yield running


@asynccontextmanager
async def serve_faulty(fault: Fault, *, faults: int = 1) -> AsyncIterator[Server]:
    """A server whose first ``faults`` responses break mid-body by ``fault``."""
    server = Server()
    async with _serving(lambda stream: _serve_faulty(server, fault, faults, stream), server) as s:
        yield s
