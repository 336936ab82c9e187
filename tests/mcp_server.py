"""A real MCP server for fanout's tests, built with the ``mcp`` package's own server API.

Run as ``python tests/mcp_server.py stdio`` (speaks MCP on stdin/stdout) or
``python tests/mcp_server.py http`` (streamable HTTP on 127.0.0.1, on a port
the OS picks, printed as ``PORT <n>`` on the first line of stdout). Tests
may also serve ``build()`` in process, where its sleeps follow trio's clock.

Its tools are fast, slow with progress, hung, failing, and annotated each
way. It remembers the ids of the requests it was told to cancel
(``notifications/cancelled``), the requests whose work was stopped, and the
idempotency keys it was sent; the ``seen`` tool reports them, so a test can
prove the server heard fanout and stopped the work.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent, ToolAnnotations

if TYPE_CHECKING:
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

    from fanout.mcp import McpServer

READ = ToolAnnotations(read_only_hint=True)
DESTROY = ToolAnnotations(read_only_hint=False, destructive_hint=True)
IDEMPOTENT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
KEY_FIELD = "fanout/idempotency-key"


def build() -> MCPServer:
    """A fresh server with its own memory of what it saw."""
    cancelled: list[str] = []
    hung: list[str] = []
    interrupted: list[str] = []  # requests whose work was stopped mid-way
    keys: dict[str, list[str]] = {}

    async def record_cancels(
        ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "notifications/cancelled":
            cancelled.append(str((ctx.params or {}).get("requestId")))
        return await call_next(ctx)

    def remember_key(tool: str, ctx: Context) -> None:
        meta = (ctx.request_context.params or {}).get("_meta") or {}
        keys.setdefault(tool, []).append(str(meta.get(KEY_FIELD)))

    server = MCPServer("fanout-test-server", middleware=[record_cancels])

    @server.tool(annotations=READ)
    async def lookup(key: str) -> str:
        """Answer at once."""
        return f"value of {key}"

    @server.tool(annotations=READ)
    async def report(steps: int, pause: float, ctx: Context) -> str:
        """Work ``steps`` steps of ``pause`` seconds, reporting progress after each."""
        try:
            for done in range(1, steps + 1):
                await anyio.sleep(pause)
                await ctx.report_progress(done, steps, f"step {done} of {steps}")
        except anyio.get_cancelled_exc_class():
            interrupted.append(ctx.request_id)
            raise
        return f"finished {steps} steps"

    @server.tool(annotations=READ)
    async def hang(ctx: Context) -> str:
        """Never answer; remember this request's id."""
        hung.append(ctx.request_id)
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            interrupted.append(ctx.request_id)
            raise
        raise AssertionError("unreachable")

    @server.tool(annotations=READ)
    async def fail(reason: str) -> str:
        """Answer with an error result (isError)."""
        raise ToolError(f"cannot do that: {reason}")

    @server.tool(annotations=DESTROY)
    async def delete_note(name: str, ctx: Context) -> str:
        """A destructive write."""
        remember_key("delete_note", ctx)
        return f"deleted {name}"

    @server.tool(annotations=IDEMPOTENT)
    async def put_note(name: str, text: str, ctx: Context) -> str:
        """An idempotent write."""
        remember_key("put_note", ctx)
        return f"stored {name}"

    @server.tool()
    async def plain(text: str) -> str:
        """No annotations at all."""
        return text

    @server.tool(annotations=READ, structured_output=False)
    async def picture() -> list[TextContent | ImageContent]:
        """Two content blocks, text and image."""
        return [
            TextContent(type="text", text="a red dot"),
            ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
        ]

    @server.tool(annotations=READ)
    async def seen() -> str:
        """What this server saw: cancelled, hung and interrupted request ids, idempotency keys."""
        return json.dumps(
            {"cancelled": cancelled, "hung": hung, "interrupted": interrupted, "keys": keys}
        )

    return server


def add_process_tools(server: MCPServer) -> None:
    """Tools only a server in a process of its own has: one ends that process."""

    @server.tool(annotations=READ)
    async def whoami(ctx: Context) -> str:
        """The request's headers, as a server that quotes what it was sent."""
        return json.dumps(dict(ctx.headers or {}))

    @server.tool(annotations=READ)
    async def session(ctx: Context) -> str:
        """The session's id, bare, as a server's message may quote it."""
        return f"your session is {(ctx.headers or {}).get('mcp-session-id')}"

    @server.tool(annotations=DESTROY)
    async def vanish(pause: float) -> str:
        """Wait ``pause`` seconds, then end this server's process mid-call."""
        await anyio.sleep(pause)
        os._exit(3)


async def ask_seen(client: McpServer) -> dict[str, Any]:
    """Ask a running test server (through fanout's client) what it saw."""
    text = await client.call("seen", {})
    assert isinstance(text, str)
    parsed: dict[str, Any] = json.loads(text)
    return parsed


async def _serve_http(server: MCPServer) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is announced, a client connecting at once waits in the
    # backlog until the server accepts. Announced before, it could be refused: uvicorn
    # listens only once started, and a busy machine lost a CI run to that.
    sock.listen(128)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    server = build()
    add_process_tools(server)
    if sys.argv[1:] == ["stdio"]:
        server.run("stdio")
    elif sys.argv[1:] == ["http"]:
        anyio.run(_serve_http, server)
    else:
        raise SystemExit("usage: mcp_server.py stdio|http")


if __name__ == "__main__":
    main()
