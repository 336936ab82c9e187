"""A small MCP server for ``mcp_turn.py``, built with the ``mcp`` package's own server API.

Three tools: a quick stock lookup, a reindex that reports progress as it
goes, and a supplier query that never answers; and a fourth that lists the
request ids the server was told to cancel (``notifications/cancelled``).
Speaks MCP on stdin/stdout: ``python examples/mcp_inventory_server.py``.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

read_only = ToolAnnotations(read_only_hint=True)
cancelled: list[str] = []


async def record_cancels(ctx: Any, call_next: Any) -> Any:
    """Middleware: note the request id of every cancellation the client sends."""
    if ctx.method == "notifications/cancelled":
        cancelled.append(str((ctx.params or {}).get("requestId")))
    return await call_next(ctx)


server = MCPServer("inventory", middleware=[record_cancels])


@server.tool(annotations=read_only)
async def stock(sku: str) -> str:
    """Units of ``sku`` in stock."""
    return f"{sku}: 12 in stock"


@server.tool(annotations=read_only)
async def reindex(batches: int, ctx: Context) -> str:
    """Rebuild the search index, one batch at a time, reporting progress."""
    for done in range(1, batches + 1):
        await anyio.sleep(0.3)
        await ctx.report_progress(done, batches, f"batch {done} of {batches}")
    return f"reindexed {batches} batches"


@server.tool(annotations=read_only)
async def supplier_eta(sku: str) -> str:
    """Ask the supplier when ``sku`` arrives (the supplier never answers)."""
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


@server.tool(annotations=read_only)
async def cancellations() -> str:
    """The request ids this server was told to cancel."""
    return json.dumps(cancelled)


if __name__ == "__main__":
    server.run("stdio")
