"""fanout.mcp against a real MCP server served in process, on a mock clock.

The server (``tests/mcp_server.py``) is built with the ``mcp`` package's own
server API and runs in the test's trio run over the SDK's in-memory
transport, so its sleeps follow the MockClock and every time is exact. The
same server runs as a subprocess over stdio and HTTP in the sibling files.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import MCPError
from mcp.client._memory import InMemoryTransport
from mcp.types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    CallToolResult,
    JSONRPCNotification,
    ListToolsResult,
    Tool,
    ToolAnnotations,
)

import fanout
import fanout.mcp
from fanout import EventKind, Kind, Registry, Run, Runner, Status, ToolCall
from fanout._mcp_http import RETRY_AFTER_FIELD, STATUS_FIELD
from fanout._mcp_tools import kind_of, retry_safe
from fanout._mcp_wire import Flight, TappedWriteStream
from fanout.idempotency import canonical_json, idempotency_key
from fanout.mcp import McpServer

from .mcp_server import ask_seen as seen
from .mcp_server import build

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from mcp.shared.message import SessionMessage


SCOPE = "mcp:fanout-test-server"


def body(result: fanout.ToolResult) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(result.content)
    return parsed


def runner_for(server: McpServer, registry: Registry, **options: Any) -> Runner:
    """A runner with the server's scope configured (no probing: MCP states no limits)."""
    return Runner(registry, scopes=[server.limits()], **options)


@pytest.fixture
async def server() -> AsyncIterator[McpServer]:
    async with (
        InMemoryTransport(build()) as (read, write),
        fanout.mcp.open_session(read, write) as opened,
    ):
        yield opened


@pytest.fixture
async def registry(server: McpServer) -> Registry:
    registry = Registry()
    await fanout.mcp.register_tools(registry, server, idle_timeout=2)
    return registry


async def test_every_tool_is_registered_with_its_kind_scope_and_schema(
    server: McpServer,
) -> None:
    """One call registers all tools: kinds from annotations, the server's scope, the schema."""
    registry = Registry()
    specs = await fanout.mcp.register_tools(registry, server, prefix="notes_")
    kinds = {spec.name: spec.kind for spec in specs}
    assert kinds == {
        "notes_lookup": Kind.READS, "notes_report": Kind.READS, "notes_hang": Kind.READS,
        "notes_fail": Kind.READS, "notes_picture": Kind.READS, "notes_seen": Kind.READS,
        "notes_delete_note": Kind.MUTATING, "notes_put_note": Kind.MUTATING,
        "notes_plain": Kind.MUTATING,
    }  # fmt: skip
    assert {spec.scopes for spec in specs} == {(SCOPE,)}
    lookup = registry.get("notes_lookup")
    assert lookup is not None
    assert lookup.schema is not None
    assert lookup.schema["required"] == ["key"]
    assert lookup.description == "Answer at once."


async def test_overrides_add_options_and_unknown_names_are_refused(server: McpServer) -> None:
    """Per-tool overrides reach Registry.add (scopes added, not replaced); typos are refused."""
    registry = Registry()
    await fanout.mcp.register_tools(
        registry, server, overrides={"lookup": {"cache_ttl": 60, "scopes": ["lookups"]}}
    )
    lookup = registry.get("lookup")
    assert lookup is not None
    assert (lookup.cache_ttl, lookup.scopes) == (60, (SCOPE, "lookups"))
    with pytest.raises(fanout.ConfigurationError, match="lokup"):
        await fanout.mcp.register_tools(Registry(), server, overrides={"lokup": {}})


async def test_a_name_clash_registers_nothing(server: McpServer) -> None:
    """A second server with the same tool names is refused whole, and a prefix resolves it."""
    registry = Registry()
    await fanout.mcp.register_tools(registry, server)
    before = registry.names()
    with pytest.raises(fanout.ConfigurationError, match="prefix"):
        await fanout.mcp.register_tools(registry, server)
    assert registry.names() == before
    await fanout.mcp.register_tools(registry, server, prefix="second_")
    assert len(registry) == 2 * len(before)


def test_the_public_names_are_sorted_and_exist() -> None:
    """fanout.mcp's __all__ is sorted and names only what the module defines."""
    assert fanout.mcp.__all__ == sorted(fanout.mcp.__all__)
    assert all(hasattr(fanout.mcp, name) for name in fanout.mcp.__all__)


@given(
    read_only=st.sampled_from([None, True, False]),
    destructive=st.sampled_from([None, True, False]),
    idempotent=st.sampled_from([None, True, False]),
    annotated=st.booleans(),
)
def test_kinds_fail_closed(
    read_only: bool | None, destructive: bool | None, idempotent: bool | None, annotated: bool
) -> None:
    """Only readOnlyHint makes a read; only a read or idempotentHint makes a retry safe."""
    annotations = (
        ToolAnnotations(
            read_only_hint=read_only, destructive_hint=destructive, idempotent_hint=idempotent
        )
        if annotated
        else None
    )
    is_read = annotated and read_only is True
    assert kind_of(annotations) is (Kind.READS if is_read else Kind.MUTATING)
    assert retry_safe(annotations) is (is_read or (annotated and idempotent is True))


async def test_a_turn_of_mcp_tools_is_answered_completely(
    server: McpServer, registry: Registry, autojump_clock: Any
) -> None:
    """Fast, failing, multi-block and hung tools: each answered, the hung one at the deadline."""
    runner = runner_for(server, registry, turn_timeout=5)
    start = trio.current_time()
    turn = await runner.run_turn(
        [
            ToolCall("a", "lookup", {"key": "k"}),
            ToolCall("b", "fail", {"reason": "no such key"}),
            ToolCall("c", "picture", {}),
            ToolCall("d", "hang", {}),
        ]
    )
    ok, failed, picture, hung = turn.results
    assert (ok.status, ok.content) == (Status.OK, "value of k")
    assert failed.status is Status.ERROR
    assert "cannot do that: no such key" in body(failed)["message"]
    assert picture.parts == [
        fanout.Text("a red dot"),
        fanout.Image("iVBORw0KGgo=", "image/png"),
    ]
    assert (hung.status, body(hung)["started"]) == (Status.TIMED_OUT, True)
    answered = {e.call_id: e.time - start for e in turn.trace if e.kind is EventKind.ANSWERED}
    assert answered == {"a": 0.0, "b": 0.0, "c": 0.0, "d": 2.0}
    assert "idle" in body(hung)["message"]


async def test_a_runner_given_no_limits_for_the_server_sends_every_call_at_once(
    registry: Registry, autojump_clock: Any
) -> None:
    """Two hung calls and a quick one, in a runner told nothing of the server's scope: the
    quick one is answered at once. (Made as a plain ``Scope``, the scope learned, its
    probe was the two hung calls, and the quick one waited unsent until its deadline.)"""
    runner = Runner(registry, turn_timeout=5)
    start = trio.current_time()
    turn = await runner.run_turn(
        [
            ToolCall("h1", "report", {"steps": 1, "pause": 60}),  # two calls, not one
            ToolCall("h2", "report", {"steps": 1, "pause": 61}),  # coalesced (`fanout._repeats`)
            ToolCall("a", "lookup", {"key": "k"}),
        ]
    )
    answered = {e.call_id: e.time - start for e in turn.trace if e.kind is EventKind.ANSWERED}
    assert (turn.results[2].status, answered["a"]) == (Status.OK, 0.0)
    assert [body(r)["started"] for r in turn.results[:2]] == [True, True]


async def test_the_server_hears_the_cancellation_of_a_call_cut_off_by_the_deadline(
    server: McpServer, autojump_clock: Any
) -> None:
    """The turn's deadline cuts a hung call: notifications/cancelled for its request id."""
    registry = Registry()
    await fanout.mcp.register_tools(registry, server)
    start = trio.current_time()
    turn = await runner_for(server, registry, turn_timeout=3).run_turn([ToolCall("h", "hang", {})])
    assert trio.current_time() - start == 3
    [result] = turn.results
    assert (result.status, body(result)["started"]) == (Status.TIMED_OUT, True)
    saw = await seen(server)
    assert saw["hung"] == saw["cancelled"] == [str(rid) for rid in server.cancels_sent]
    assert len(saw["hung"]) == 1


async def test_progress_becomes_events_and_keeps_a_slow_tool_alive(
    server: McpServer, registry: Registry, autojump_clock: Any
) -> None:
    """Server progress notifications are PROGRESS events that reset the 2s idle timeout."""
    start = trio.current_time()
    turn = await runner_for(server, registry).run_turn(
        [ToolCall("r", "report", {"steps": 4, "pause": 1.5})]
    )
    assert (turn.results[0].status, turn.results[0].content) == (Status.OK, "finished 4 steps")
    progress = [e for e in turn.trace if e.kind is EventKind.PROGRESS]
    assert [e.time - start for e in progress] == [1.5, 3.0, 4.5, 6.0]
    assert progress[0].detail == {"progress": 1.0, "total": 4.0, "message": "step 1 of 4"}


async def test_a_slow_step_is_answered_as_idle_and_cancelled_on_the_server(
    server: McpServer, registry: Registry, autojump_clock: Any
) -> None:
    """A step longer than idle_timeout: timed_out 2s after the last report, server told."""
    start = trio.current_time()
    turn = await runner_for(server, registry).run_turn(
        [ToolCall("r", "report", {"steps": 2, "pause": 3})]
    )
    [result] = turn.results
    assert trio.current_time() - start == 2
    assert result.status is Status.TIMED_OUT
    assert "idle_timeout" in body(result)["message"]
    assert len((await seen(server))["cancelled"]) == 1


async def test_a_failed_sibling_cancels_a_hung_call_on_the_server(
    server: McpServer, registry: Registry, autojump_clock: Any
) -> None:
    """on_failure='cancel_siblings': the hung call is answered cancelled and the server told."""
    runner = Runner(
        registry, scopes=[server.limits()], on_failure="cancel_siblings", turn_timeout=10
    )
    turn = await runner.run_turn(
        [ToolCall("h", "hang", {}), ToolCall("f", "fail", {"reason": "x"})]
    )
    hung, failed = turn.results
    assert failed.status is Status.ERROR
    assert (hung.status, body(hung)["started"]) == (Status.CANCELLED, True)
    saw = await seen(server)
    assert saw["cancelled"] == saw["hung"] == [str(rid) for rid in server.cancels_sent]


async def test_the_caller_cancelling_the_turn_cancels_on_the_server(
    server: McpServer, registry: Registry, autojump_clock: Any
) -> None:
    """A turn cancelled from outside still answers every id and tells the server."""
    turn = runner_for(server, registry, turn_timeout=10).turn([ToolCall("h", "hang", {})])
    with trio.move_on_after(1):
        await turn.run()
    saw = await seen(server)
    assert saw["cancelled"] == saw["hung"]
    assert len(saw["hung"]) == 1
    [result] = turn.results
    assert (result.status, body(result)["started"]) == (Status.CANCELLED, True)


async def test_writes_carry_their_idempotency_key(
    server: McpServer, registry: Registry, autojump_clock: Any
) -> None:
    """A mutating MCP call sends fanout's idempotency key in _meta; a read sends none."""
    run = Run()
    arguments = {"name": "n", "text": "t"}
    await runner_for(server, registry).run_turn([ToolCall("w", "put_note", arguments)], run=run)
    keys = (await seen(server))["keys"]
    assert keys == {"put_note": [idempotency_key(run.run_id, "put_note", arguments)]}


async def test_the_servers_scope_caps_all_its_tools(
    server: McpServer, registry: Registry, autojump_clock: Any
) -> None:
    """With the server's scope at concurrency 1, its tools run one at a time."""
    runner = Runner(registry, scopes=[server.limits(max_concurrency=1)], inline_wait=None)
    calls = [ToolCall(f"r{i}", "report", {"steps": i + 1, "pause": 1}) for i in range(3)]
    start = trio.current_time()
    turn = await runner.run_turn(calls)
    assert [r.status for r in turn.results] == [Status.OK] * 3
    answered = [e.time - start for e in turn.trace if e.kind is EventKind.ANSWERED]
    assert answered == [1.0, 3.0, 6.0]


async def test_a_session_held_by_its_own_task_serves_many_turns(autojump_clock: Any) -> None:
    """A task that opens the session, hands it out and sleeps serves turns, then closes it."""

    async def hold(task_status: trio.TaskStatus[McpServer]) -> None:
        async with (
            InMemoryTransport(build()) as (read, write),
            fanout.mcp.open_session(read, write) as opened,
        ):
            task_status.started(opened)
            await trio.sleep_forever()

    registry = Registry()
    async with trio.open_nursery() as nursery:
        server: McpServer = await nursery.start(hold)
        await fanout.mcp.register_tools(registry, server)
        runner = runner_for(server, registry)
        for key in "abc":
            turn = await runner.run_turn([ToolCall(key, "lookup", {"key": key})])
            assert turn.results[0].content == f"value of {key}"
        nursery.cancel_scope.cancel()
    turn = await runner.run_turn([ToolCall("z", "lookup", {"key": "z"})])
    assert "closed" in body(turn.results[0])["message"]


async def test_a_closed_session_answers_error(autojump_clock: Any) -> None:
    """A tool of a session already closed is answered error, saying so; nothing hangs."""
    registry = Registry()
    async with (
        InMemoryTransport(build()) as (read, write),
        fanout.mcp.open_session(read, write) as server,
    ):
        await fanout.mcp.register_tools(registry, server)
    turn = await runner_for(server, registry).run_turn([ToolCall("a", "lookup", {"key": "k"})])
    [result] = turn.results
    assert result.status is Status.ERROR
    assert "closed" in body(result)["message"]


class _LostConnection:
    """A session whose every call fails as a dropped connection does."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call_tool(self, name: str, arguments: Any, **_: Any) -> Any:
        self.calls.append(name)
        raise MCPError(CONNECTION_CLOSED, "Connection closed")


async def test_only_retry_safe_tools_are_retried_when_the_connection_drops(
    autojump_clock: Any,
) -> None:
    """A lost connection is retried for an idempotent write, never for any other write."""
    session = _LostConnection()
    server = McpServer(session, "mcp:lost", wire=TappedWriteStream(None))
    registry = Registry()
    registry.add(server.tool("put_note", retry_safe=True), name="put_note")
    registry.add(server.tool("delete_note", retry_safe=False), name="delete_note")
    runner = Runner(registry, mutating="parallel", retry=fanout.RetryPolicy(attempts=3))
    turn = await runner.run_turn([ToolCall("p", "put_note", {}), ToolCall("d", "delete_note", {})])
    put, delete = turn.results
    assert sorted(session.calls) == ["delete_note", "put_note", "put_note", "put_note"]
    assert (put.status, delete.status) == (Status.ERROR, Status.ERROR)
    assert "gave up after 3 attempts" in body(put)["message"]
    assert "Connection closed" in body(delete)["message"]
    # Both writes may have reached the server: neither blames its arguments.
    for write in (put, delete):
        assert body(write)["effect"].startswith("unknown")
        assert "fix the arguments" not in body(write).get("hint", "")


def test_the_cancel_notice_deadline() -> None:
    """Within the budget when cut off early; its own grace when the deadline cut it off."""

    async def main() -> tuple[float, float, float]:
        early = Flight(fanout.Budget(deadline=10.0), grace=1.0).notice_deadline()
        near = Flight(fanout.Budget(deadline=0.5), grace=1.0).notice_deadline()
        late = Flight(fanout.Budget(deadline=0.0), grace=1.0).notice_deadline()
        return early, near, late

    clock = trio.testing.MockClock()
    assert trio.run(main, clock=clock) == (1.0, 0.5, 1.0)


class _StuckOnCancel:
    """A write stream whose ``notifications/cancelled`` never gets through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        if isinstance(message, JSONRPCNotification) and message.method.endswith("cancelled"):
            await trio.sleep_forever()
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _StuckOnCancel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def test_a_stuck_cancel_notice_costs_at_most_its_grace(autojump_clock: Any) -> None:
    """A transport that cannot take the cancel notice holds the turn only cancel_grace more."""
    registry = Registry()
    async with (
        InMemoryTransport(build()) as (read, write),
        fanout.mcp.open_session(read, _StuckOnCancel(write), cancel_grace=0.25) as server,
    ):
        await fanout.mcp.register_tools(registry, server)
        start = trio.current_time()
        turn = await runner_for(server, registry, turn_timeout=3).run_turn(
            [ToolCall("h", "hang", {})]
        )
        assert trio.current_time() - start == 3.25
        assert turn.results[0].status is Status.TIMED_OUT
        assert server.cancels_sent == ()


_TOOLS = st.one_of(
    st.builds(lambda k: ("lookup", {"key": k}), st.sampled_from("abc")),
    st.builds(
        lambda s, p: ("report", {"steps": s, "pause": p}),
        st.integers(1, 3),
        st.sampled_from([0.5, 1, 2.5]),
    ),
    st.just(("hang", {})),
    st.builds(lambda r: ("fail", {"reason": r}), st.sampled_from("xy")),
    st.just(("picture", {})),
)


@settings(max_examples=40, deadline=None)
@given(
    tools=st.lists(_TOOLS, min_size=1, max_size=6),
    turn_timeout=st.integers(1, 24).map(lambda n: n / 2 + 0.25),  # never on a step's instant
    on_failure=st.sampled_from(["continue", "cancel_siblings"]),
)
def test_every_id_answered_and_every_cut_off_call_cancelled_on_the_server(
    tools: list[tuple[str, dict[str, Any]]], turn_timeout: float, on_failure: Any
) -> None:
    """Any MCP calls, deadline and failure policy: every id answered; each cut-off request told."""

    async def main() -> tuple[fanout.Turn, dict[str, Any], McpServer]:
        async with (
            InMemoryTransport(build()) as (read, write),
            fanout.mcp.open_session(read, write) as server,
        ):
            registry = Registry()
            await fanout.mcp.register_tools(registry, server, idle_timeout=2)
            runner = Runner(
                registry, scopes=[server.limits()], turn_timeout=turn_timeout, on_failure=on_failure
            )
            calls = [ToolCall(f"c{i}", name, args) for i, (name, args) in enumerate(tools)]
            turn = await runner.run_turn(calls)
            return turn, await seen(server), server

    turn, saw, server = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [r.tool_use_id for r in turn.results] == [f"c{i}" for i in range(len(tools))]
    # Cut off after the tool began (started: true). Its request may not have
    # been written yet (a sibling failed first): then there is nothing to cancel.
    cut_off = [
        r
        for r in turn.results
        if r.status in (Status.TIMED_OUT, Status.CANCELLED) and body(r)["started"]
    ]
    for (name, _), result in zip(tools, turn.results, strict=True):
        if name == "hang":
            assert result.status in (Status.TIMED_OUT, Status.CANCELLED)
    # Identical calls coalesce into one request: count distinct requests cut off.
    requests_cut_off = {
        canonical_json([name, args])
        for (name, args), result in zip(tools, turn.results, strict=True)
        if result in cut_off
    }
    # No request that was answered is cancelled; the server hears every notice
    # sent; it stops work only when told, and always stops a hung request. (A
    # notice may cross a quick answer on the wire: then there is nothing to stop.)
    assert len(saw["cancelled"]) <= len(requests_cut_off)
    assert sorted(saw["cancelled"]) == sorted(str(rid) for rid in server.cancels_sent)
    assert set(saw["hung"]) <= set(saw["interrupted"]) <= set(saw["cancelled"])


@pytest.mark.parametrize("grace", [0, -1.0, float("nan"), float("inf"), True])
def test_a_cancel_grace_that_cannot_work_is_refused(grace: Any) -> None:
    """cancel_grace is a positive, finite number of seconds, or a ConfigurationError."""
    with pytest.raises(fanout.ConfigurationError, match="cancel_grace must be a positive number"):
        McpServer(_LostConnection(), "mcp:lost", wire=TappedWriteStream(None), cancel_grace=grace)


class _Refused:
    """A session whose every call is refused over HTTP with a wait, as the session's
    transport answers a 429 (`fanout._mcp_http.AnsweredTransport`)."""

    async def call_tool(self, name: str, arguments: Any, **_: Any) -> Any:
        data = {STATUS_FIELD: 429, RETRY_AFTER_FIELD: 2.0}
        raise MCPError(INTERNAL_ERROR, "the MCP server answered HTTP 429", data)


async def test_a_refusal_over_http_is_rate_limited_with_the_server_s_wait(
    autojump_clock: Any,
) -> None:
    """A 429 with ``Retry-After: 2`` is answered ``rate_limited`` with the wait, not an
    error blaming the arguments (the SDK alone keeps "Server returned an error
    response")."""
    server = McpServer(_Refused(), "mcp:refusing", wire=TappedWriteStream(None))
    registry = Registry()
    registry.add(server.tool("lookup", retry_safe=True), name="lookup", kind=Kind.READS)
    runner = Runner(registry, turn_timeout=1)
    [result] = (await runner.run_turn([ToolCall("a", "lookup", {})])).results
    assert result.status is Status.RATE_LIMITED
    assert result.retry_after_ms == 2000


class _Listing:
    """A session that lists the tools it was given."""

    def __init__(self, tools: list[Tool]) -> None:
        self.tools = tools

    async def list_tools(self, **_: Any) -> Any:
        return ListToolsResult(tools=self.tools)


async def test_a_tool_listed_twice_registers_nothing(autojump_clock: Any) -> None:
    """Listed as a read and as destructive, which of the two runs is unknown: refused
    before any tool is added (registered as the first, the destructive one ran as a
    read)."""
    schema = {"type": "object"}
    tools = [
        Tool(name="lookup", input_schema=schema, annotations=ToolAnnotations(read_only_hint=True)),
        Tool(name="wipe", input_schema=schema, annotations=ToolAnnotations(read_only_hint=True)),
        Tool(name="wipe", input_schema=schema, annotations=ToolAnnotations(destructive_hint=True)),
    ]
    server = McpServer(_Listing(tools), "mcp:twice", wire=TappedWriteStream(None))
    registry = Registry()
    with pytest.raises(fanout.ConfigurationError, match="more than once"):
        await fanout.mcp.register_tools(registry, server)
    assert registry.names() == []


def test_a_result_whose_data_is_structured_only_is_answered_with_it() -> None:
    """``content`` empty and ``structuredContent`` given: the data, as JSON text."""
    result = CallToolResult(content=[], structured_content={"temp_c": 21.5})
    assert fanout.mcp._answer(result) == '{"temp_c":21.5}'
