"""fanout.mcp against the test MCP server run as a subprocess over stdio.

The server's clock is real, the turn's is a MockClock that jumps only after
two seconds of real quiet: fast replies arrive long before that, so the turn's
times stay exact, and a hung call's deadline arrives without a real wait.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

import fanout
import fanout.mcp
from fanout import EventKind, Registry, Run, Runner, Status, ToolCall
from fanout.idempotency import idempotency_key

from .mcp_server import ask_seen

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from fanout.mcp import McpServer

SERVER = Path(__file__).with_name("mcp_server.py")


@pytest.fixture
def patient_clock() -> trio.testing.MockClock:
    """Virtual time that jumps to the next deadline only after 2s of real quiet."""
    return trio.testing.MockClock(autojump_threshold=2.0)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[McpServer]:
    with (tmp_path / "server.log").open("w") as errlog:
        async with fanout.mcp.open_stdio(sys.executable, str(SERVER), "stdio", errlog=errlog) as s:
            yield s


def body(result: fanout.ToolResult) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(result.content)
    return parsed


async def test_a_turn_over_stdio(server: McpServer, patient_clock: Any) -> None:
    """Fast, progress, failing, write and hung tools over stdio: all answered, hang cut at 5s."""
    registry = Registry()
    await fanout.mcp.register_tools(registry, server)
    runner = Runner(registry, scopes=[server.limits()], turn_timeout=5)
    run = Run()
    start = trio.current_time()
    turn = await runner.run_turn(
        [
            ToolCall("a", "lookup", {"key": "k"}),
            ToolCall("b", "report", {"steps": 3, "pause": 0.01}),
            ToolCall("c", "fail", {"reason": "bad key"}),
            ToolCall("d", "hang", {}),
            ToolCall("e", "put_note", {"name": "n", "text": "t"}),
        ],
        run=run,
    )
    assert trio.current_time() - start == 5
    statuses = [r.status for r in turn.results]
    assert statuses == [Status.OK, Status.OK, Status.ERROR, Status.TIMED_OUT, Status.TIMED_OUT]
    assert turn.results[1].content == "finished 3 steps"
    assert "cannot do that: bad key" in body(turn.results[2])["message"]
    assert body(turn.results[3])["started"] is True
    # The write waits for the reads (phase two), so the hung read's deadline takes its time.
    assert body(turn.results[4])["started"] is False
    progress = [e.detail["progress"] for e in turn.trace if e.kind is EventKind.PROGRESS]
    assert progress == [1.0, 2.0, 3.0]
    saw = await ask_seen(server)
    assert saw["hung"] == saw["cancelled"] == [str(rid) for rid in server.cancels_sent]


async def test_idle_timeout_over_stdio(server: McpServer, patient_clock: Any) -> None:
    """A hung call with idle_timeout=2 is cut at 2s, as idle, and the server is told."""
    registry = Registry()
    await fanout.mcp.register_tools(registry, server, idle_timeout=2)
    runner = Runner(registry, scopes=[server.limits()], turn_timeout=30)
    run = Run()
    start = trio.current_time()
    turn = await runner.run_turn([ToolCall("h", "hang", {})], run=run)
    assert trio.current_time() - start == 2
    [result] = turn.results
    assert result.status is Status.TIMED_OUT
    assert "idle_timeout" in body(result)["message"]
    note = {"name": "n", "text": "t"}
    written = await runner.run_turn([ToolCall("w", "put_note", note)], run=run)
    assert written.results[0].content == "stored n"
    saw = await ask_seen(server)
    assert saw["cancelled"] == saw["hung"]
    assert len(saw["hung"]) == 1
    key = idempotency_key(run.run_id, "put_note", note)
    assert saw["keys"] == {"put_note": [key]}


async def test_a_session_closes_in_its_task_when_that_task_is_cancelled(
    tmp_path: Path, patient_clock: Any
) -> None:
    """Cancelling the session's owner mid-turn: the call is answered and the session closed."""
    registry = Registry()
    with (tmp_path / "server.log").open("w") as errlog, trio.CancelScope() as owner:
        async with fanout.mcp.open_stdio(sys.executable, str(SERVER), "stdio", errlog=errlog) as s:
            await fanout.mcp.register_tools(registry, s)
            # Armed once the server is up: a deadline during its start would jump the clock.
            owner.deadline = trio.current_time() + 2
            turn = Runner(registry, scopes=[s.limits()], turn_timeout=30).turn(
                [ToolCall("h", "hang", {})]
            )
            await turn.run()
    assert owner.cancelled_caught
    [result] = turn.results
    assert (result.status, body(result)["started"]) == (Status.CANCELLED, True)
    # The transport went down with its owner (the server process is stopped),
    # so there was no one left to send a per-call cancel notice to.
    assert s.cancels_sent == ()
    turn_after = await Runner(registry).run_turn([ToolCall("a", "lookup", {"key": "k"})])
    assert "closed" in body(turn_after.results[0])["message"]


# A stdio MCP server written by hand: its tool "bad" answers with a byte that is not
# UTF-8 (Latin-1's "é"), its tool "ok" with plain text.
_LATIN1_SERVER = r"""
import json, sys
out = sys.stdout.buffer
def send(line):
    out.write(line + b"\n"); out.flush()
for raw in sys.stdin.buffer:
    msg = json.loads(raw)
    mid, method = msg.get("id"), msg.get("method")
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities":
                  {"tools": {}}, "serverInfo": {"name": "latin1", "version": "0"}}
    elif method == "tools/list":
        result = {"tools": [{"name": name, "inputSchema": {"type": "object"},
                             "annotations": {"readOnlyHint": True}} for name in ("bad", "ok")]}
    elif method == "tools/call" and msg["params"]["name"] == "bad":
        text = b'{"type":"text","text":"caf\xe9"}'
        send(b'{"jsonrpc":"2.0","id":%d,"result":{"content":[%s]}}' % (mid, text))
        continue
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "fine"}]}
    else:
        continue
    send(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}).encode())
"""


async def test_a_byte_that_is_not_utf8_is_read_as_a_replacement_character(
    patient_clock: trio.testing.MockClock,
) -> None:
    """Read strictly, one such byte ended the session's reader: the call waited out its
    deadline, and so did every later call. Read with U+FFFD in its place, both answer."""
    async with fanout.mcp.open_stdio(sys.executable, "-c", _LATIN1_SERVER) as server:
        registry = Registry()
        await fanout.mcp.register_tools(registry, server)
        runner = Runner(registry, scopes=[server.limits()], turn_timeout=10)
        first = await runner.run_turn([ToolCall("a", "bad", {})])
        second = await runner.run_turn([ToolCall("b", "ok", {})])
    assert [(r.status, r.content) for r in (*first.results, *second.results)] == [
        (Status.OK, "caf\ufffd"),
        (Status.OK, "fine"),
    ]


async def test_a_credential_handed_to_a_stdio_server_in_its_environment_is_scrubbed(
    tmp_path: Path, patient_clock: Any
) -> None:
    """Most MCP servers get their key in their environment (``CRM_API_KEY``): fanout never
    sees it sent, and a tool answer quoting it (an upstream 401) reached the model. A
    variable named for something else is no credential."""
    key, region = "crm-9b1f4e7a2c6d8e0f", "eu-central-pool"
    env = {"CRM_API_KEY": key, "CRM_REGION": region}
    with (tmp_path / "server.log").open("w") as errlog:
        async with fanout.mcp.open_stdio(
            sys.executable, str(SERVER), "stdio", env=env, errlog=errlog
        ) as server:
            registry = Registry()
            await fanout.mcp.register_tools(registry, server)
            runner = Runner(registry, scopes=[server.limits()])
            said = f"upstream said 401: key {key} is revoked ({region})"
            turn = await runner.run_turn([ToolCall("a", "plain", {"text": said})])
    (result,) = turn.results
    assert result.status is Status.OK
    assert key not in result.content
    assert region in result.content
