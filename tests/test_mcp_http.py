"""fanout.mcp against the test MCP server over streamable HTTP on 127.0.0.1, in real time.

An HTTP server in another process cannot follow a mock clock, so these tests
use real time with short deadlines and assert outcomes and orderings, never
durations. Each wait is bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

import fanout
import fanout.mcp
from fanout import EventKind, Registry, Runner, Status, ToolCall

from .mcp_server import ask_seen

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from fanout.mcp import McpServer

SERVER = Path(__file__).with_name("mcp_server.py")


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    """Start the test server on a free loopback port; stop it after the test."""
    with (tmp_path / "server.log").open("w") as errlog:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(SERVER), "http"], stdout=subprocess.PIPE, stderr=errlog
        )
        try:
            assert process.stdout is not None
            with trio.fail_after(30):
                first = b""
                while not first.endswith(b"\n"):
                    first += await process.stdout.receive_some(1)
            port = int(first.decode().split()[1])
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            process.terminate()
            with trio.move_on_after(5):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


@pytest.fixture
async def server(url: str) -> AsyncIterator[McpServer]:
    async with fanout.mcp.open_http(url) as opened:
        yield opened


def body(result: fanout.ToolResult) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(result.content)
    return parsed


async def cancellations_seen(server: McpServer) -> dict[str, Any]:
    """The server's record, once it has caught up with the cancels sent (bounded wait).

    Over HTTP a cancel notice is its own POST, so it may land after the next request.
    """
    expected = {str(rid) for rid in server.cancels_sent}
    for _ in range(40):
        saw = await ask_seen(server)
        if expected <= set(saw["cancelled"]):
            return saw
        await trio.sleep(0.05)
    return saw


async def test_a_turn_over_streamable_http(server: McpServer) -> None:
    """Fast, progress, failing and hung tools over HTTP: all answered; the server hears of it."""
    registry = Registry()
    await fanout.mcp.register_tools(registry, server)
    runner = Runner(registry, scopes=[server.limits()], turn_timeout=3)
    turn = await runner.run_turn(
        [
            ToolCall("a", "lookup", {"key": "k"}),
            ToolCall("b", "report", {"steps": 3, "pause": 0.01}),
            ToolCall("c", "fail", {"reason": "bad key"}),
            ToolCall("d", "hang", {}),
        ]
    )
    assert [r.status for r in turn.results] == [
        Status.OK, Status.OK, Status.ERROR, Status.TIMED_OUT,
    ]  # fmt: skip
    assert turn.results[1].content == "finished 3 steps"
    assert body(turn.results[3])["started"] is True
    progress = [e.detail["progress"] for e in turn.trace if e.kind is EventKind.PROGRESS]
    assert progress == [1.0, 2.0, 3.0]
    assert len(server.cancels_sent) == 1
    saw = await cancellations_seen(server)
    assert saw["hung"] == saw["cancelled"] == [str(rid) for rid in server.cancels_sent]


async def test_idle_timeout_over_http_ends_a_hung_call_before_its_deadline(
    server: McpServer,
) -> None:
    """idle_timeout=0.3 under a 30s deadline: answered as idle, long before the deadline."""
    registry = Registry()
    await fanout.mcp.register_tools(registry, server, idle_timeout=0.3)
    runner = Runner(registry, scopes=[server.limits()], turn_timeout=30)
    turn = await runner.run_turn([ToolCall("h", "hang", {})])
    [result] = turn.results
    assert result.status is Status.TIMED_OUT
    assert "idle_timeout" in body(result)["message"]
    assert trio.current_time() < turn.deadline
    saw = await cancellations_seen(server)
    assert saw["hung"] == saw["cancelled"]


async def test_each_credential_has_its_own_scope(url: str) -> None:
    """Authorization splits the server's scope by a fingerprint; the token never appears."""
    scopes = []
    for token in ("alpha-secret-token", "beta-secret-token", "alpha-secret-token"):
        headers = {"Authorization": f"Bearer {token}"}
        async with fanout.mcp.open_http(url, headers=headers) as server:
            scopes.append(server.scope)
    assert scopes[0] == scopes[2] != scopes[1]
    host = url.removeprefix("http://").removesuffix("/mcp")
    assert all(scope.startswith(f"mcp:{host}#") for scope in scopes)
    assert not any("secret" in scope for scope in scopes)
