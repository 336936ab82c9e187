"""MCP servers as tool sources: every tool of a server, in a registry, in one call.

::

    async with fanout.mcp.open_stdio(sys.executable, "server.py") as server:
        await fanout.mcp.register_tools(registry, server, idle_timeout=10)
        turn = await runner.run_turn(calls)

An MCP tool then runs like any other fanout tool: under its call's budget
and the turn's hard deadline, through the server's scope (``server.scope``,
one per server, and per credential over HTTP), answered exactly once. What
MCP adds:

* kinds come from the server's ``ToolAnnotations``, failing closed (only
  ``readOnlyHint`` makes a read);
* the tool's ``inputSchema`` and description are kept on its ``ToolSpec``
  (``schema``, ``description``) for the definitions sent to the model;
* ``isError`` results are answered ``error``; content blocks pass through;
* progress notifications become ``PROGRESS`` events and reset the tool's
  ``idle_timeout``;
* a call cut off (its deadline, an idle timeout, a failed sibling, the
  caller) sends ``notifications/cancelled`` for its request id, shielded and
  bounded, and is answered ``timed_out`` or ``cancelled`` with ``started``;
* writes carry their idempotency key in the request's ``_meta``
  (``fanout/idempotency-key``).

Sessions are async context managers: open one with ``async with`` in the
task that runs the turns (or a parent of it) and let the same task close it.
trio's cancel scopes belong to the task that entered them, so a session
entered in one task and left in another is an error, not a leak.

Requires the ``mcp`` extra: ``pip install 'fanout[mcp]'``.
"""

from __future__ import annotations

import hashlib
import re
import sys
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, TextIO, cast

import attrs
import httpx2
import trio
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, PaginatedRequestParams
from pydantic import ValidationError

from ._call import describe
from ._canonical import canonical_json
from ._context import CallContext, maybe_current_call
from ._exceptions import ConfigurationError, RateLimitedError, TransientError
from ._going_up import goes_up
from ._library_log import scrub_library_log
from ._mcp_http import (
    RETRY_AFTER_FIELD,
    STATUS_FIELD,
    AnsweredTransport,
    address_of,
    credentials_of,
)
from ._mcp_tools import McpSessionError, McpToolError, answer_of, error_text, kind_of, retry_safe
from ._mcp_wire import Flight, TappedWriteStream, flying, landed
from ._scope import Scope
from ._secrets import Secret, learn
from ._validate import positive
from ._values import Kind

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from mcp.shared._stream_protocols import ReadStream, WriteStream
    from mcp.shared.dispatcher import ProgressFnT
    from mcp.shared.message import SessionMessage
    from mcp.types import RequestId, RequestParamsMeta, Tool

    from ._output import Part
    from ._registry import Registry, ToolSpec

__all__ = [
    "IDEMPOTENCY_KEY_FIELD",
    "McpServer",
    "McpSessionError",
    "McpToolError",
    "open_http",
    "open_session",
    "open_stdio",
    "register_tools",
]

IDEMPOTENCY_KEY_FIELD = "fanout/idempotency-key"
_CANCEL_GRACE = 1.0  # seconds a cancel notice may take to write


@attrs.define(eq=False)
class McpServer:
    """One open MCP session, as fanout uses it.

    ``scope`` is the name of the scope every tool of this server draws from:
    give the runner ``server.limits(max_concurrency=4, rate=...)`` to cap
    the server. ``cancels_sent`` lists the request ids the server was
    told to cancel, in order.
    """

    session: ClientSession
    scope: str
    _wire: TappedWriteStream = attrs.field(alias="wire")
    cancel_grace: float = attrs.field(default=_CANCEL_GRACE, validator=positive)
    _open: bool = attrs.field(default=True, init=False)

    @property
    def cancels_sent(self) -> tuple[RequestId, ...]:
        return tuple(self._wire.cancels_sent)

    def limits(self, **options: Any) -> Scope:
        """This server's scope, with ``Scope``'s options, for ``Runner(scopes=[...])``.

        Learning is off unless asked for: an MCP server states no limits in
        headers, so a scope that waits to learn them would hold every call
        behind the first one (its probe) for nothing.
        """
        options.setdefault("learn", False)
        return Scope(self.scope, **options)

    async def call(
        self, name: str, arguments: Mapping[str, Any], *, retry_safe: bool = False
    ) -> str | list[Part]:
        """Call the server's tool ``name``, as part of the fanout call running now (if any).

        Returns the answer's content (see ``answer_of``); raises
        ``McpToolError`` for an ``isError`` result, ``RateLimitedError`` for a
        refusal over HTTP (a 429, with the server's wait), ``TransientError``
        for a lost connection when ``retry_safe``, and ``McpToolError`` for any
        other protocol error. A write whose connection was lost may have taken
        effect: its call is marked so (``effect_unknown``), and its answer says
        it.
        """
        if not self._open:
            raise McpToolError(f"the MCP session of scope {self.scope!r} is closed")
        context = maybe_current_call()
        flight = Flight(context.budget if context is not None else None, self.cancel_grace)
        token = flying(flight)
        try:
            result = await self.session.call_tool(
                name,
                dict(arguments),
                progress_callback=_progress_to(context),
                meta=_meta_for(context),
            )
        except MCPError as exc:
            message = f"MCP error {exc.code}: {exc.error.message}"
            data = exc.error.data if isinstance(exc.error.data, dict) else {}
            if data.get(STATUS_FIELD) == 429 or RETRY_AFTER_FIELD in data:
                wait = _seconds(data.get(RETRY_AFTER_FIELD))
                raise RateLimitedError(message, retry_after=wait, scope=self.scope) from exc
            lost = exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT)
            if lost and context is not None and context.kind is Kind.MUTATING:
                context.effect_unknown = True
            if retry_safe and lost:
                raise TransientError(message) from exc
            raise McpToolError(message) from exc
        finally:
            landed(token)
        return _answer(result)

    def tool(self, name: str, *, retry_safe: bool = False) -> Callable[..., Awaitable[Any]]:
        """A fanout tool function that calls the server's tool ``name``."""

        async def call_mcp_tool(**arguments: Any) -> str | list[Part]:
            return await self.call(name, arguments, retry_safe=retry_safe)

        call_mcp_tool.__name__ = call_mcp_tool.__qualname__ = name
        return call_mcp_tool

    def _close(self) -> None:
        self._open = False


def _seconds(value: object) -> float | None:
    """A wait the session's transport read off a refusal over HTTP, if it read one
    (`fanout._mcp_http.AnsweredTransport`)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _answer(result: CallToolResult) -> str | list[Part]:
    """A result's content (`answer_of`); its ``structuredContent`` where it carries its
    data there alone (answered from ``content`` only, such a result was an empty list)."""
    if result.is_error:
        raise McpToolError(error_text(result.content))
    if not result.content and result.structured_content is not None:
        return canonical_json(result.structured_content)
    return answer_of(result.content)


def _progress_to(context: CallContext | None) -> ProgressFnT | None:
    """Progress notifications for this request, reported on the fanout call."""
    if context is None:
        return None

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        # The SDK awaits this callback; reporting waits for nothing, so the
        # callback does not checkpoint (the SDK's own await is the checkpoint).
        context.report_progress(progress, total, message)

    return on_progress


def _meta_for(context: CallContext | None) -> RequestParamsMeta | None:
    """A write's idempotency key, so a server that dedupes can recognise a re-sent call."""
    if context is None or context.kind is not Kind.MUTATING or not context.idempotency_key:
        return None
    return cast("RequestParamsMeta", {IDEMPOTENCY_KEY_FIELD: context.idempotency_key})


def _scope_name(server: str, credential: str | None) -> str:
    """``mcp:<server>``, and a fingerprint of the credential, never the credential.

    The fingerprint is scrypt's, slow to guess from (some 60 ms and 16 MB a guess), and
    the same in every process, so that processes sharing one credential share one
    scope name (a ``RedisScope``). A plain sha256 of it, in every event, log line and
    key name, gave a weak password back from a list of 620 guesses in milliseconds.
    """
    if not credential:
        return f"mcp:{server}"
    fingerprint = hashlib.scrypt(
        credential.encode(), salt=_FINGERPRINT_SALT, n=2**14, r=8, p=1, dklen=6
    ).hex()
    return f"mcp:{server}#{fingerprint}"


_FINGERPRINT_SALT = b"fanout: the scope of an MCP server"


@asynccontextmanager
async def open_session(
    read_stream: ReadStream[SessionMessage | Exception],
    write_stream: WriteStream[SessionMessage],
    *,
    name: str | None = None,
    credential: str | None = None,
    cancel_grace: float = _CANCEL_GRACE,
) -> AsyncIterator[McpServer]:
    """An initialised session over any MCP transport's streams.

    ``name`` names the scope (default: the name the server gives itself);
    ``credential``, when the transport has one, splits the scope per key.
    """
    wire = TappedWriteStream(write_stream)
    async with ClientSession(read_stream, wire) as session:
        info = await session.initialize()
        server = McpServer(
            session,
            _scope_name(name or info.server_info.name, credential),
            wire=wire,
            cancel_grace=cancel_grace,
        )
        try:
            yield server
        finally:
            server._close()


# An environment variable's name that marks its value a credential.
_CREDENTIAL_NAME = re.compile(
    r"(?i)(?:^|_)(?:API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|AUTH|CREDENTIALS?)(?:_|$)"
)


@asynccontextmanager
async def open_stdio(
    command: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    name: str | None = None,
    errlog: TextIO = sys.stderr,
    cancel_grace: float = _CANCEL_GRACE,
) -> AsyncIterator[McpServer]:
    """Start ``command args...`` as an MCP server on stdio; stop it on exit.

    The server gets the SDK's safe default environment (``PATH``, ``HOME``,
    ...) plus ``env``, not the rest of this process's environment. What it
    writes that is not UTF-8 is read with U+FFFD in its place: read strictly,
    one such byte ended the session's reader, and every call after it waited
    for its deadline. A value of ``env`` whose name marks a credential
    (``CRM_API_KEY``, ``GITHUB_TOKEN``, ``DB_PASSWORD``: how most MCP servers
    are given theirs) is scrubbed from every answer, event and log from then
    on, as an HTTP session's credentials are.
    """
    learn(
        {
            Secret(value)
            for key, value in (env or {}).items()
            if isinstance(key, str) and isinstance(value, str) and _CREDENTIAL_NAME.search(key)
        },
        pinned=True,
    )
    parameters = StdioServerParameters(
        command=command, args=list(args), env=dict(env) if env else None, cwd=cwd,
        encoding_error_handler="replace",
    )  # fmt: skip
    async with (
        _opening(f"the MCP server {command!r}") as opened,
        stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
        open_session(read_stream, write_stream, name=name, cancel_grace=cancel_grace) as server,
    ):
        opened.set()
        yield server


@asynccontextmanager
async def open_http(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    name: str | None = None,
    cancel_grace: float = _CANCEL_GRACE,
) -> AsyncIterator[McpServer]:
    """Connect to a streamable-HTTP MCP server at ``url``.

    The scope is named after the server's host and port (or ``name``), split
    by the credential the session carries when it carries one (a fingerprint
    of it, never the credential itself). That credential (in a credential
    header, the URL's query or its userinfo) is scrubbed from every answer,
    event and log from then on, as one fanout saw sent is, and the ``httpx2``
    and ``mcp`` loggers that log the URL are scrubbed too. A request that
    fails on the wire, or a refusal over HTTP, fails only its own call
    (`fanout._mcp_http`).
    """
    headers = dict(headers or {})
    found = credentials_of(url, headers)
    learn(found, pinned=True)  # sent with every call, as the session's, never each seen
    for logger in ("httpx2", "mcp.client.streamable_http"):
        scrub_library_log(logger)
    authorization = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
    credential = authorization or "\n".join(sorted(secret.reveal() for secret in found))
    async with (
        _opening(f"the MCP server at {address_of(url)}") as opened,
        AsyncExitStack() as stack,
    ):
        client = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=headers,
                timeout=httpx2.Timeout(30.0, read=300.0),
                # No cap on connections: a call cut off at its deadline keeps its own
                # while the server works on (the SDK reads its answer on), and its cancel
                # notice is one more request. Capped at httpx's 100, 120 cut-off calls
                # held them all: the SDK's one writer waited for a connection for the
                # first notice, every later message queued behind it, and the session
                # jammed (the next turn's instant call answered timed_out).
                transport=AnsweredTransport(
                    httpx2.AsyncHTTPTransport(limits=httpx2.Limits(max_connections=None))
                ),
            )
        )
        read_stream, write_stream = await stack.enter_async_context(
            streamable_http_client(url, http_client=client)
        )
        server = await stack.enter_async_context(
            open_session(
                read_stream,
                write_stream,
                name=name or address_of(url),
                credential=credential,
                cancel_grace=cancel_grace,
            )
        )
        opened.set()
        yield server


@asynccontextmanager
async def _opening(what: str) -> AsyncIterator[trio.Event]:
    """Say once, as a ``McpSessionError``, why ``what`` could not be opened; the event
    is set once it is open (what the session's user raises after is theirs).

    The SDK opens a session inside task groups of its own, so a refused
    connection or a command that does not exist came out as exception groups
    nested two deep, of the SDK's or ``httpx2``'s errors. A cancellation (or
    a ``KeyboardInterrupt``) among them goes on up as it came.
    """
    opened = trio.Event()
    try:
        yield opened
    except Exception as exc:
        if opened.is_set() or goes_up(exc):
            raise
        leaf = _first_leaf(exc)
        raise McpSessionError(f"{what} could not be opened: {describe(leaf)}") from exc


def _first_leaf(exc: BaseException) -> BaseException:
    """The first exception in ``exc`` that is no group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def _list_tools(session: ClientSession) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    while True:
        try:
            page = await session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None
            )
        except (MCPError, ValidationError) as exc:  # a tool list the SDK could not read
            raise McpSessionError(
                f"the server's tools could not be listed: {describe(exc)}"
            ) from exc
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


async def register_tools(
    registry: Registry,
    server: McpServer,
    *,
    prefix: str = "",
    timeout: float | None = 30.0,
    idle_timeout: float | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[ToolSpec]:
    """Register every tool the server lists, named ``prefix + name``; return their specs.

    Each tool draws from ``server.scope``, which a runner given no
    ``server.limits(...)`` makes as that would, learning nothing (its probe would
    hold every call behind the first two); ``timeout`` and ``idle_timeout``
    apply to all of them. ``overrides`` maps a server tool's name to more
    ``Registry.add`` options for it (``cache_ttl``, ``cost``, ``retry``, a
    stricter or looser ``kind``, more ``scopes``...). A name in
    ``overrides`` that the server does not list, or a name the registry
    already has, is a ``ConfigurationError``, raised before any tool is added.
    """
    tools = await _list_tools(server.session)
    listed = [tool.name for tool in tools]
    twice = sorted({name for name in listed if listed.count(name) > 1})
    if twice:
        # Which of the two the server runs is unknown: registered as the first, a tool
        # the server listed as a read and as destructive ran as a read.
        raise ConfigurationError(f"the server lists tools more than once: {twice}")
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - {tool.name for tool in tools})
    if unknown:
        raise ConfigurationError(f"overrides name tools the server does not list: {unknown}")
    taken = sorted(prefix + tool.name for tool in tools if registry.get(prefix + tool.name))
    if taken:
        raise ConfigurationError(
            f"the registry already has tools named {taken}; register this server with a prefix="
        )
    # A runner given no ``server.limits(...)`` makes the scope as that would: no learning.
    if not registry.scope_defaults(server.scope):
        registry.set_scope_defaults(server.scope, learn=False)
    specs = []
    for tool in tools:
        options: dict[str, Any] = {
            "kind": kind_of(tool.annotations),
            "timeout": timeout,
            "idle_timeout": idle_timeout,
            **overrides.get(tool.name, {}),
        }
        scopes = (server.scope, *options.pop("scopes", ()))
        specs.append(
            registry.add(
                server.tool(tool.name, retry_safe=retry_safe(tool.annotations)),
                name=prefix + tool.name,
                scopes=scopes,
                description=tool.description or "",
                schema=tool.input_schema,
                **options,
            )
        )
    return specs
