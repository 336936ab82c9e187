"""What the adversarial credential tests share: a server that quotes credentials, and a net.

The echo server (`tests.echo_server`) quotes a request as it came, so a
credential fanout learned whole is scrubbed whole. Real servers are less
kind: they parse the request and quote the parts ("invalid token
00Qc...", "hello, <basic user>"), or serialise their answer with another
JSON library (Gson writes ``=`` as ``\\u003d``). `serve_quoting` plays that
server. `Net` gathers everything fanout writes where a person or a program
outside the call can read it (answers, adapters' messages, the trace,
every instrument, the HTTP library's own log, statistics, the run's cache
and store), so a test can look for a secret in all of it at once.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import json
import logging
import re
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit

import attrs
import h11
import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

import fanout
from fanout._credentials import CREDENTIAL_HEADERS
from fanout.contrib.logging import LoggingInstrument
from fanout.contrib.otel import OpenTelemetryInstrument
from fanout.contrib.prometheus import PrometheusInstrument
from fanout.contrib.structlog import StructlogInstrument
from fanout.idempotency import idempotency_key

from .echo_server import Seen, Server, _read_request, _serving

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Iterator


# Gson's default (HTML-safe) escaping: these ASCII characters become \u00XX in strings.
_GSON_ESCAPED = "<>&='"


def spellings(secret: str) -> set[str]:
    """The forms a secret is quoted in: raw, percent-encoded (either case, ``+`` for a
    space or not) and JSON-escaped (ASCII-only or not)."""
    percent = quote(secret, safe="")
    lower = re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), percent)
    return {
        secret,
        percent,
        lower,
        quote_plus(secret, safe=""),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
    }


def basic_of(user: str, password: str) -> str:
    """The base64 a Basic credential carries."""
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def leaks(secret: str, haystack: str, *, also: Iterable[str] = ()) -> list[str]:
    """Every spelling of ``secret`` (and each of ``also``) that ``haystack`` holds."""
    return sorted(form for form in (*spellings(secret), *also) if form in haystack)


def gson_dumps(value: object) -> str:
    """JSON as Gson writes it by default: ASCII, and ``<>&='`` escaped as ``\\u00XX``."""
    text = json.dumps(value)
    for char in _GSON_ESCAPED:
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


def credential_parts(seen: Seen) -> list[str]:
    """The parts of a request a server that parses it may quote: each credential header
    line, an Authorization token after its scheme, a Basic user and password, each
    credential query value."""
    parts: list[str] = []
    for name, value in seen.headers:
        lowered = name.lower()
        if lowered not in CREDENTIAL_HEADERS:
            continue
        parts.append(value)
        scheme, _, token = value.partition(" ")
        if lowered.endswith("authorization") and token:
            parts.append(token)
            if scheme.lower() == "basic":
                try:
                    user, _, password = base64.b64decode(token).decode().partition(":")
                except (binascii.Error, UnicodeDecodeError):
                    continue
                parts.extend([user, password])
    query = urlsplit(seen.target).query
    parts.extend(value for _, value in parse_qsl(query))
    return parts


# What a quoting server answers a request: a status, a content type and a body.
_Answer = tuple[int, str, bytes]


async def _serve_answering(
    server: Server, stream: trio.SocketStream, answer: Callable[[Seen], _Answer]
) -> None:
    """Answer each request on ``stream`` with what ``answer`` makes of it."""
    conn = h11.Connection(h11.SERVER)
    async with stream:
        try:
            while (seen := await _read_request(conn, stream)) is not None:
                server.seen.append(seen)
                status, content_type, body = answer(seen)
                headers = [("content-type", content_type), ("content-length", str(len(body)))]
                events = (h11.Response(status_code=status, headers=headers), h11.Data(body))
                data = b"".join(conn.send(e) or b"" for e in (*events, h11.EndOfMessage()))
                await stream.send_all(data)
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return


def _credentials_echo(seen: Seen) -> _Answer:
    """What the quoting server answers (`serve_quoting`): the request's credential parts."""
    answer = {"target": seen.target, "you_sent": credential_parts(seen)}
    gson = urlsplit(seen.target).path.startswith("/gson")
    return 200, "application/json", (gson_dumps(answer) if gson else json.dumps(answer)).encode()


@asynccontextmanager
async def serve_quoting() -> AsyncIterator[Server]:
    """A loopback server that parses each request and quotes its credential parts back
    (``/gson/...``: in Gson's escaping)."""
    server = Server()
    serve = functools.partial(_serve_answering, server, answer=_credentials_echo)
    async with _serving(serve, server) as running:
        yield running


def body_strings(seen: Seen) -> list[str]:
    """Every text value of a request's body, form-encoded or JSON at any depth, as a server
    that parsed it would have them."""
    text = seen.body.decode("utf-8", "replace")
    try:
        document = json.loads(text)
    except ValueError:
        return [value for _, value in parse_qsl(text)]
    found: list[str] = []
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    return found


def _body_echo(seen: Seen) -> _Answer:
    """What the body-quoting server answers (`serve_body_quoting`): a status, a content
    type and a body."""
    path = urlsplit(seen.target).path
    if path.startswith("/raw"):
        return 200, "application/octet-stream", seen.body
    values = body_strings(seen)
    if path.startswith("/message"):
        message = "; ".join(f"invalid credential {value}" for value in values)
        return 401, "text/plain; charset=utf-8", message.encode()
    errors = [{"message": f'field rejected: "{value}"'} for value in values]
    return 400, "application/json", json.dumps({"errors": errors}).encode()


@asynccontextmanager
async def serve_body_quoting() -> AsyncIterator[Server]:
    """A loopback server that quotes a request's body back, as servers do in errors:
    ``/raw``: the body as it came; ``/message``: a 401 whose text quotes each value of
    the body's fields ("invalid credential <value>"); anything else: a 400 whose JSON
    quotes each value inside a message (so JSON-escaped, quotes and all)."""
    server = Server()
    serve = functools.partial(_serve_answering, server, answer=_body_echo)
    async with _serving(serve, server) as running:
        yield running


class _Structlog:
    def __init__(self, net: Net) -> None:
        self.net = net

    def log(self, level: int, event: str, *args: Any, **kw: Any) -> None:
        self.net.add(event, args, kw)


@attrs.define
class Net:
    """Everything fanout wrote during a test, as text, and the instruments that fed it."""

    texts: list[str] = attrs.field(factory=list)
    log_stream: io.StringIO = attrs.field(factory=io.StringIO)
    metrics: PrometheusInstrument = attrs.field(
        factory=lambda: PrometheusInstrument(CollectorRegistry())
    )
    spans: InMemorySpanExporter = attrs.field(factory=InMemorySpanExporter)
    instruments: list[Any] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        logger = logging.getLogger(f"fanout.adversarial.{id(self)}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        handler = logging.StreamHandler(self.log_stream)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s %(fanout)s"))
        logger.addHandler(handler)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.instruments = [
            LoggingInstrument(logger, level=logging.DEBUG),
            StructlogInstrument(_Structlog(self)),
            self.metrics,
            OpenTelemetryInstrument(provider.get_tracer("adversarial")),
        ]

    def add(self, *items: object) -> None:
        self.texts.extend(item if isinstance(item, str) else repr(item) for item in items)

    def add_turn(self, turn: fanout.Turn) -> None:
        """A turn's answers, as both adapters send them, and its trace."""
        self.add(*turn.results, *turn.trace, turn)
        self.add(fanout.anthropic_tool_results(turn.results))
        self.add(fanout.openai_tool_messages(turn.results))

    async def add_run(self, run: fanout.Run, calls: Iterable[fanout.ToolCall]) -> None:
        """What the run keeps for later turns: its cache and its store, read back."""
        self.add(run.cache, run.store)
        for call in calls:
            kept = idempotency_key(run.run_id, call.name, call.arguments)
            self.add(run.cache.get(kept), (await run.store.claim(kept, lease=1)).answer)

    def text(self) -> str:
        spans = [span.to_json() for span in self.spans.get_finished_spans()]
        exposition = generate_latest(self.metrics.registry).decode()
        return "\n".join([*self.texts, self.log_stream.getvalue(), exposition, *spans])


@contextmanager
def library_logs(net: Net, names: Iterable[str] = ("httpx", "httpx2")) -> Iterator[None]:
    """The HTTP libraries' own loggers, at DEBUG, written into ``net`` when the block ends."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    saved = []
    for name in names:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
        net.add(stream.getvalue())
