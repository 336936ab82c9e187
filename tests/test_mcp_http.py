"""fanout.mcp against the test MCP server over streamable HTTP on 127.0.0.1, in real time.

An HTTP server in another process cannot follow a mock clock, so these tests
use real time with short deadlines and assert outcomes and orderings, never
durations. Each wait is bounded.
"""

from __future__ import annotations

import hashlib
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
    # Slow to guess from, and the same in every process: not a plain hash of the header.
    plain = hashlib.sha256(b"Bearer alpha-secret-token").hexdigest()[:12]
    assert not scopes[0].endswith(plain)


async def test_a_server_that_dies_mid_call_fails_that_call_not_the_turn(url: str) -> None:
    """The server's process ends while a destructive call is out: that call is answered
    ``error`` with its effect unknown, its sibling ``ok``, and nothing escapes the
    session. (The SDK raised the dropped connection inside the session's task group,
    which cancelled the turn: no answer came back, and an exception group of
    ``httpx2`` errors left ``open_http``.)"""
    async with fanout.mcp.open_http(url) as server:
        registry = Registry()
        await fanout.mcp.register_tools(registry, server)
        runner = Runner(registry, scopes=[server.limits()], turn_timeout=20)
        calls = [ToolCall("a", "lookup", {"key": "k"}), ToolCall("b", "vanish", {"pause": 0.3})]
        turn = await runner.run_turn(calls)
    looked, vanished = turn.results
    assert (looked.status, looked.content) == (Status.OK, "value of k")
    assert vanished.status is Status.ERROR
    assert body(vanished)["effect"].startswith("unknown")
    assert "fix the arguments" not in body(vanished)["hint"]


async def test_a_session_that_cannot_open_says_so_once() -> None:
    """Nothing listens at the port: a ``McpSessionError`` naming the failure, not the
    exception groups the SDK's task groups made of it."""
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(fanout.mcp.McpSessionError, match="could not be opened: MCPError"):
        async with fanout.mcp.open_http(f"http://127.0.0.1:{port}/mcp"):
            raise AssertionError("opened")


async def test_the_credentials_a_session_carries_never_reach_an_answer(url: str) -> None:
    """A server that quotes the request's headers back, a key in the URL's query, a
    password in its userinfo: none of them is in an answer, a trace event or the scope,
    though none was sent through fanout's own HTTP layer."""
    token, key = "tok-4f9a1c2e7b", "qk-8d3e5a9f1b"
    keyed = url.replace("http://", "http://alice:pw-5c7e9a2d4f@") + f"?api_key={key}"
    headers = {"Authorization": f"Bearer {token}"}
    async with fanout.mcp.open_http(keyed, headers=headers) as server:
        registry = Registry()
        await fanout.mcp.register_tools(registry, server)
        runner = Runner(registry, scopes=[server.limits()], turn_timeout=20)
        turn = await runner.run_turn([ToolCall("w", "whoami", {})])
    [answer] = turn.results
    assert answer.status is Status.OK
    assert "authorization" in answer.content.lower()  # the server did quote it
    shown = [answer.content, server.scope, *(repr(event) for event in turn.trace)]
    for secret in (token, key, "pw-5c7e9a2d4f"):
        assert not any(secret in text for text in shown), secret
    assert server.scope.startswith("mcp:127.0.0.1:")
    assert "alice" not in server.scope


async def test_the_session_id_the_server_gave_never_reaches_an_answer(server: McpServer) -> None:
    """Whoever holds an MCP session's id acts in the session: quoted among the request's
    headers, or bare in a server's message, it reads ``REDACTED`` (both showed it)."""
    registry = Registry()
    await fanout.mcp.register_tools(registry, server)
    runner = Runner(registry, scopes=[server.limits()], turn_timeout=20)
    turn = await runner.run_turn([ToolCall("w", "whoami", {}), ToolCall("s", "session", {})])
    quoted, bare = turn.results
    assert body(quoted)["mcp-session-id"] == "REDACTED"
    assert bare.content == "your session is REDACTED"


async def test_more_cut_off_calls_than_a_connection_pool_holds_do_not_jam_the_session(
    server: McpServer,
) -> None:
    """120 slow calls cut off at the deadline each keep their connection while the server
    works on, and each cancel notice is one more request: with httpx's pool of 100, the
    first notice waited for a connection, the session's one writer behind it, and the
    next turn's instant call was answered timed_out. The session answers the next
    call at once."""
    registry = Registry()
    await fanout.mcp.register_tools(registry, server)
    runner = Runner(registry, scopes=[server.limits(max_concurrency=None)], turn_timeout=1)
    slow = [ToolCall(f"r{i}", "report", {"steps": 1, "pause": 100 + i}) for i in range(120)]
    hung = await runner.run_turn(slow)
    assert {r.status for r in hung.results} == {Status.TIMED_OUT}
    await trio.sleep(2)  # the cut-off calls unwind (their notices: 1 s of grace)
    assert sum(body(r)["started"] for r in hung.results) > 100
    with trio.fail_after(1):
        after = await runner.run_turn([ToolCall("a", "lookup", {"key": "k"})])
    assert after.results[0].status is Status.OK, after.results[0].content
