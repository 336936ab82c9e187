"""Promise 1 and the turn's deadline against faults at fanout's seams.

Each test makes a seam misbehave (a scope backend, the idempotency store, an
MCP server, an HTTP server, a real Redis server) at a point Hypothesis
chooses, and asserts the promise itself: every id is answered exactly once,
in order; an answer says what happened (never ``ok`` for a call whose work
failed, never "the caller cancelled" when nobody did); and the turn returns
by its deadline (on a MockClock, exactly; against a real Redis, within a
stated bound).

What broke is kept as a repro named after the break, each red before its fix.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import httpx
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.client._memory import InMemoryTransport
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

import fanout
import fanout.mcp
from fanout import Kind, Registry, Runner, Scope, Status, ToolCall
from fanout.idempotency import Claim, ClaimState, MemoryIdempotencyStore, StoredAnswer

from .mcp_server import build
from .redis_support import RedisServer, unique_prefix

if TYPE_CHECKING:
    from collections.abc import Sequence

CALLER_CANCELLED = "caller cancelled"


def _body(result: fanout.ToolResult) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(result.content)
    return payload


def _assert_one_honest_answer_each(
    calls: Sequence[ToolCall], turn: fanout.Turn, *, deadline: float | None = None
) -> None:
    """Promise 1 in general: one answer per id in order, well formed, nobody blamed the caller.

    With ``deadline``, every answer was also given by then (the trace's times).
    """
    assert [r.tool_use_id for r in turn.results] == [c.id for c in calls]
    answered = [e for e in turn.trace if e.kind is fanout.EventKind.ANSWERED]
    assert sorted(e.call_id or "" for e in answered) == sorted(c.id for c in calls)
    for result in turn.results:
        if result.is_error:
            payload = _body(result)
            assert isinstance(payload["started"], bool)
            assert CALLER_CANCELLED not in payload["message"], payload
    if deadline is not None:
        assert all(e.time <= deadline for e in answered)


# -- a scope whose slot release fails after the tool has finished --------------------


class _ReleaseRaises(Scope):
    """A scope backend whose ``release_slot`` raises (a backend bug, a dropped link)."""

    async def release_slot(self, holder: Any) -> None:
        try:
            raise RuntimeError("the limiter's release failed")
        finally:
            await super().release_slot(holder)


class _ReleaseHangs(Scope):
    """A scope backend whose ``release_slot`` gives the slot back, then never returns."""

    async def release_slot(self, holder: Any) -> None:
        await super().release_slot(holder)
        await trio.sleep_forever()


def _booking_turn(scope: Scope) -> tuple[list[int], fanout.Turn, float]:
    """One write that takes effect at once, through ``scope``; its effects, turn and end."""
    effects: list[int] = []
    registry = Registry()

    @registry.tool(kind=Kind.MUTATING, scopes=[scope.name], timeout=3)
    async def book(n: int) -> str:
        effects.append(n)
        return f"booked {n}"

    runner = Runner(registry, scopes=[scope], turn_timeout=5)

    async def main() -> tuple[fanout.Turn, float]:
        turn = await runner.run_turn([ToolCall("c1", "book", {"n": 1})])
        return turn, trio.current_time()

    turn, returned = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return effects, turn, returned


def test_a_release_that_raises_after_the_write_took_effect_keeps_its_answer() -> None:
    """The write ran and returned; a limiter failing to take its slot back after that
    changes nothing the model should be told. Answered ``error`` ("it was not
    finished", effect unknown), the model re-issues a write that took effect, and
    the store, told nothing, runs it again."""
    effects, turn, _ = _booking_turn(_ReleaseRaises("api", max_concurrency=2))
    assert effects == [1]
    (result,) = turn.results
    assert result.status is Status.OK, result.content
    assert result.content == "booked 1"


def test_a_release_that_hangs_after_the_write_took_effect_costs_a_second_not_the_answer() -> None:
    """A release is cleanup, and one that never returns held the answer the tool gave
    until the call's own timeout (3 s), then answered ``timed_out`` a write that had
    finished at once. Now it has a second's grace (``fanout._call._RELEASE_GRACE``),
    and the tool's answer."""
    effects, turn, returned = _booking_turn(_ReleaseHangs("api", max_concurrency=2))
    assert effects == [1]
    (result,) = turn.results
    assert result.status is Status.OK, result.content
    assert returned == 1.0


# -- an idempotency store that returns garbage ---------------------------------------


@attrs.define
class _LyingStore(MemoryIdempotencyStore):
    """A store whose ``claim`` returns whatever it is told to (a corrupted entry)."""

    garbage: Any = None
    claims: int = 0

    async def claim(self, key: str, *, lease: float) -> Claim:
        self.claims += 1
        await trio.lowlevel.checkpoint()
        return self.garbage  # type: ignore[no-any-return]


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    __repr__ = __str__


garbage_claims = st.one_of(
    st.sampled_from([None, math.nan, 0, "new", b"done", [], {"state": "new"}]),
    st.builds(_Unprintable),
    st.builds(Claim, st.just(ClaimState.DONE), st.none()),
    # A stored answer whose content is not text, whatever its status says.
    st.builds(
        Claim,
        st.just(ClaimState.DONE),
        st.builds(
            StoredAnswer,
            st.sampled_from([*Status, "ok", None, 7]),
            st.one_of(st.none(), st.integers(), st.builds(_Unprintable)),
        ),
    ),
)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(garbage=garbage_claims, inline_wait=st.sampled_from([None, 0.0, 2.0]))
def test_a_store_returning_garbage_never_runs_the_write_nor_answers_it_ok(
    garbage: Any, inline_wait: float | None
) -> None:
    """A claim that is not a well-formed ``Claim`` cannot say the write may run, nor
    what it answered: the write is not run, its answer is not ``ok`` (``refused``, as
    for a store that fails, where it is no ``Claim`` at all: it was "fanout failed"),
    and the turn returns by its deadline. A sibling read is untouched."""
    ran: list[str] = []
    registry = Registry()

    @registry.tool(kind=Kind.MUTATING, timeout=2)
    async def send(to: str) -> str:
        ran.append(to)
        return f"sent to {to}"

    @registry.tool(kind=Kind.READS, timeout=2)
    async def look(key: str) -> str:
        return f"saw {key}"

    store = _LyingStore(garbage=garbage)
    runner = Runner(registry, turn_timeout=3, inline_wait=inline_wait)
    calls = [ToolCall("w", "send", {"to": "ann"}), ToolCall("r", "look", {"key": "k"})]

    async def main() -> tuple[fanout.Turn, float]:
        turn = await runner.run_turn(calls, run=fanout.Run(store=store))
        return turn, trio.current_time()

    turn, returned = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    _assert_one_honest_answer_each(calls, turn, deadline=turn.deadline)
    assert returned <= turn.deadline
    assert store.claims >= 1
    write, read = turn.results
    assert ran == []
    assert write.status is not Status.OK, write.content
    assert _body(write)["started"] is False
    assert read.status is Status.OK
    if not isinstance(garbage, Claim):  # a store that fails refuses the write; no runtime fault
        assert write.status is Status.REFUSED, write.content


def test_a_stored_answer_with_a_status_spelt_as_text_does_not_crash_the_turn() -> None:
    """A store of one's own that keeps the status as its text (``"ok"``, as JSON gives
    it back) hands fanout ``StoredAnswer("ok", "sent")``. fanout replays it
    unchecked as a ``ToolResult`` whose status is a ``str``; the turn's closing
    event then reads ``status.value`` and the ``AttributeError`` escapes
    ``turn.run()``, which promises that nothing but the caller's cancellation
    does."""
    registry = Registry()

    @registry.tool(kind=Kind.MUTATING, timeout=2)
    async def send(to: str) -> str:
        return f"sent to {to}"

    store = _LyingStore(garbage=Claim(ClaimState.DONE, StoredAnswer("ok", "sent to ann")))  # type: ignore[arg-type]
    calls = [ToolCall("w", "send", {"to": "ann"})]
    turn = Runner(registry, turn_timeout=3).turn(calls, run=fanout.Run(store=store))
    escaped: list[BaseException] = []

    async def main() -> None:
        try:
            await turn.run()
        except Exception as exc:
            escaped.append(exc)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert escaped == []
    (result,) = turn.results
    assert isinstance(result.status, Status)


# -- an MCP server that misbehaves on the wire -------------------------------------

MCP_FAULTS = ("pass", "drop", "twice", "garbage_then_pass", "flood_then_pass", "die")
ANSWERED_ANYWAY = {"pass", "twice", "garbage_then_pass", "flood_then_pass"}


class _McpWire:
    """A relay between fanout's MCP client and a real in-process server, spoiling the
    answer to each ``tools/call`` as ``faults`` says for its ``key`` argument.

    ``drop`` never delivers it (a server that never answers); ``twice`` delivers it
    twice; ``garbage_then_pass`` first puts a parse failure on the stream (what the
    SDK's transports do with a line that is not JSON-RPC); ``flood_then_pass`` first
    sends 300 notifications nobody asked for; ``die`` ends the stream (the server
    process died).
    """

    def __init__(self, faults: dict[str, str]) -> None:
        self.faults = faults
        self.keys: dict[Any, str] = {}  # request id -> the call's key argument
        self.to_client, self.client_read = anyio.create_memory_object_stream[
            SessionMessage | Exception
        ](1000)
        self.client_write, self.from_client = anyio.create_memory_object_stream[SessionMessage](
            1000
        )

    async def upstream(self, server_write: Any) -> None:
        async for item in self.from_client:
            message = item.message
            if isinstance(message, JSONRPCRequest) and message.method == "tools/call":
                arguments = (message.params or {}).get("arguments") or {}
                self.keys[message.id] = str(arguments.get("key"))
            await server_write.send(item)

    async def downstream(self, server_read: Any) -> None:
        async for item in server_read:
            message = item.message if isinstance(item, SessionMessage) else None
            if not isinstance(message, JSONRPCResponse) or message.id not in self.keys:
                await self.to_client.send(item)
                continue
            fault = self.faults.get(self.keys[message.id], "pass")
            if fault == "die":
                await self.to_client.aclose()
                return
            if fault == "drop":
                continue
            if fault == "garbage_then_pass":
                await self.to_client.send(ValueError("line 1: not JSON-RPC: '{\"jsonrpc\": 2'"))
            if fault == "flood_then_pass":
                for n in range(300):
                    noise = JSONRPCNotification(
                        jsonrpc="2.0", method="notifications/message",
                        params={"level": "info", "data": f"noise {n}"},
                    )  # fmt: skip
                    await self.to_client.send(SessionMessage(noise))
            await self.to_client.send(item)
            if fault == "twice":
                await self.to_client.send(item)


def _play_mcp(
    faults: list[str], *, timeout: float, idle: float
) -> tuple[list[ToolCall], fanout.Turn, float]:
    calls = [ToolCall(f"toolu_{i}", "lookup", {"key": f"k{i}"}) for i in range(len(faults))]
    wire = _McpWire({f"k{i}": fault for i, fault in enumerate(faults)})

    async def main() -> tuple[fanout.Turn, float]:
        async with (
            InMemoryTransport(build()) as (server_read, server_write),
            trio.open_nursery() as relays,
        ):
            relays.start_soon(wire.upstream, server_write)
            relays.start_soon(wire.downstream, server_read)
            async with fanout.mcp.open_session(wire.client_read, wire.client_write) as server:
                registry = Registry()
                await fanout.mcp.register_tools(
                    registry, server, timeout=timeout, idle_timeout=idle
                )
                runner = Runner(registry, scopes=[server.limits()], turn_timeout=3)
                turn = await runner.run_turn(calls)
                returned = trio.current_time()
            relays.cancel_scope.cancel()
        return turn, returned

    turn, returned = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return calls, turn, returned


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    faults=st.lists(st.sampled_from(MCP_FAULTS), min_size=1, max_size=5),
    timeout=st.sampled_from([1.0, 5.0]),
    idle=st.sampled_from([0.5, 10.0]),
)
def test_an_mcp_server_misbehaving_on_the_wire_costs_no_call_its_honest_answer(
    faults: list[str], timeout: float, idle: float
) -> None:
    """Whatever the server does with each answer, every call is answered once, by the
    turn's deadline: ``ok`` exactly when its answer arrived (a duplicate, a parse
    failure or a flood of notifications before it change nothing), ``timed_out``
    when it never did, and never ``ok`` for the call whose server died."""
    calls, turn, returned = _play_mcp(faults, timeout=timeout, idle=idle)
    _assert_one_honest_answer_each(calls, turn, deadline=turn.deadline)
    assert returned <= turn.deadline
    died = "die" in faults  # then calls still waiting lose their answers too
    for fault, result in zip(faults, turn.results, strict=True):
        if fault == "die":
            assert result.status is not Status.OK, result.content
        elif fault == "drop":
            assert result.status in {Status.TIMED_OUT, Status.ERROR}, result.content
            if not died:
                assert result.status is Status.TIMED_OUT, result.content
        elif not died:
            assert fault in ANSWERED_ANYWAY
            assert result.status is Status.OK, (fault, result.content)


# -- an HTTP server that misbehaves on a real loopback socket ------------------------

GARBAGE_VALUES = [
    b"nan", b"-5", b"1e400", b"inf", b"-inf", b"99999999999999999999999", b"\xc3\xa9t\xc3\xa9",
    b"0x10", b"", b";;", b"5, 7", b"Wed, 99 Foo 2024 99:99:99 GMT",
]  # fmt: skip
RATE_LIMIT_FIELDS = [
    b"retry-after", b"retry-after-ms", b"ratelimit-remaining", b"ratelimit-reset",
    b"ratelimit-limit", b"ratelimit", b"ratelimit-policy", b"x-ratelimit-remaining",
    b"x-ratelimit-reset", b"x-ratelimit-limit", b"x-ratelimit-scope", b"date",
    b"anthropic-ratelimit-requests-reset", b"x-ratelimit-reset-requests",
]  # fmt: skip
HTTP_FAULTS = (
    "ok", "close_before_headers", "headers_never", "body_never_ends", "close_mid_body",
    "bad_chunk", "status_429",
)  # fmt: skip
HTTP_FAILS = {"close_before_headers", "close_mid_body", "bad_chunk", "status_429"}
HTTP_HANGS = {"headers_never", "body_never_ends"}


class _RawApi:
    """A loopback HTTP/1.1 server written byte by byte, so it can say what no library
    would: each request's path names its fault, and every response carries the
    garbage rate-limit headers drawn for the example (duplicated: each twice)."""

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.headers = b"".join(
            name + b": " + value + b"\r\n" for name, value in headers for _ in range(2)
        )
        self.port = 0

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            await self._answer_each(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()

    async def _answer_each(self, stream: trio.SocketStream) -> None:
        buffered = b""
        while True:
            while b"\r\n\r\n" not in buffered:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                buffered += chunk
            head, _, buffered = buffered.partition(b"\r\n\r\n")
            fault = head.split(b" ", 2)[1].rsplit(b"/", 1)[-1].decode()
            if fault == "close_before_headers":
                return
            if fault == "headers_never":
                await trio.sleep_forever()
            status = b"429 Too Many Requests" if fault == "status_429" else b"200 OK"
            start = b"HTTP/1.1 " + status + b"\r\n" + self.headers
            if fault == "bad_chunk":
                await stream.send_all(start + b"transfer-encoding: chunked\r\n\r\nzz\r\nno\r\n")
                return
            if fault in {"body_never_ends", "close_mid_body"}:
                await stream.send_all(start + b"content-length: 100\r\n\r\npart")
                if fault == "close_mid_body":
                    return
                await trio.sleep_forever()
            await stream.send_all(start + b"content-length: 4\r\n\r\nfine")


@settings(
    max_examples=20, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(
    faults=st.lists(st.sampled_from(HTTP_FAULTS), min_size=1, max_size=6),
    headers=st.lists(
        st.tuples(st.sampled_from(RATE_LIMIT_FIELDS), st.sampled_from(GARBAGE_VALUES)),
        max_size=5,
    ),
    told=st.booleans(),
)
def test_a_misbehaving_http_server_costs_no_call_its_honest_answer(
    faults: list[str], headers: list[tuple[bytes, bytes]], told: bool
) -> None:
    """Over a real socket: a connection closed before or mid-answer, a broken chunk, a
    429, a body or headers that never come, and garbage (and duplicated)
    rate-limit headers on every response. A call is ``ok`` only if its response was
    whole; one whose server hung is ``timed_out``; the turn returns by its deadline.

    The clock is a MockClock that jumps only after 50 ms of real idleness, so the
    kernel's loopback has long delivered whatever was sent before time moves."""
    api = _RawApi(headers)
    calls = [ToolCall(f"c{i}", "fetch", {"fault": fault, "n": i}) for i, fault in enumerate(faults)]

    async def main() -> tuple[fanout.Turn, float]:
        async with trio.open_nursery() as serving:
            await serving.start(api.serve)
            client = fanout.http_client(base_url=f"http://127.0.0.1:{api.port}")
            registry = Registry()

            @registry.tool(kind=Kind.READS, scopes=["api"], timeout=2)
            async def fetch(fault: str, n: int) -> str:
                response = await client.get(f"/{n}/{fault}")
                response.raise_for_status()
                return response.text

            limits = {"rate": 50, "burst": 10} if told else {}
            runner = Runner(registry, scopes=[Scope("api", **limits)], turn_timeout=3)
            turn = await runner.run_turn(calls)
            returned = trio.current_time()
            await client.aclose()
            serving.cancel_scope.cancel()
        return turn, returned

    turn, returned = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.05))
    _assert_one_honest_answer_each(calls, turn, deadline=turn.deadline)
    assert returned <= turn.deadline
    for fault, result in zip(faults, turn.results, strict=True):
        if fault in HTTP_FAILS | HTTP_HANGS:
            assert result.status is not Status.OK, (fault, result.content)
        if result.status is Status.OK:
            assert result.content == "fine"
        elif fault == "ok":
            # Garbage headers are ignored, never trusted: a whole response is ok,
            # unless the call was never sent (an honest rate_limited or timed_out).
            assert _body(result)["started"] is False, result.content
        if fault in HTTP_HANGS and _body(result)["started"]:
            assert result.status is Status.TIMED_OUT, result.content


# -- a real Redis server killed or frozen mid-turn ----------------------------------

REDIS_LATENESS = 1.0
"""How late a turn against a real Redis may return, in real seconds, and why so much:
the turn is on trio's real clock here (Redis keeps its own time), a frozen server
costs each operation up to ``op_timeout`` (0.25 s) and a write's settling one more,
and this machine's two cores are shared with other test runs."""


@pytest.mark.redis
@pytest.mark.realtime
@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    fault=st.sampled_from(["kill", "freeze"]),
    after=st.sampled_from([0.0, 0.05, 0.15, 0.3]),
    kinds=st.lists(st.sampled_from([Kind.READS, Kind.MUTATING]), min_size=2, max_size=6),
)
def test_redis_killed_or_frozen_mid_turn_costs_no_call_its_honest_answer(
    fault: str, after: float, kinds: list[Kind]
) -> None:
    """A shared scope and a shared idempotency store on one real server, which dies or
    stops answering (SIGSTOP) at a chosen moment of the turn. Every call is
    answered once; ``ok`` only for a call whose tool ran to its end; a call that was
    not run says so (``started: false``); nothing says the caller cancelled; and the
    turn returns within ``REDIS_LATENESS`` of its deadline."""
    from fanout.redis import RedisIdempotencyStore, RedisScope

    server = RedisServer()
    finished: set[str] = set()
    calls = [
        ToolCall(f"c{i}", "write" if kind is Kind.MUTATING else "read", {"i": i})
        for i, kind in enumerate(kinds)
    ]

    async def strike() -> None:
        await trio.sleep(after)
        await trio.to_thread.run_sync(server.freeze if fault == "freeze" else server.stop)

    async def main() -> tuple[fanout.Turn, float]:
        prefix = unique_prefix()
        async with (
            RedisScope.from_url(
                server.url, name="shared", prefix=prefix, rate=50, burst=3, max_concurrency=2,
                op_timeout=0.25,
            ) as scope,
            RedisIdempotencyStore.from_url(server.url, prefix=prefix, op_timeout=0.25) as store,
        ):  # fmt: skip
            registry = Registry()

            @registry.tool(name="read", kind=Kind.READS, scopes=["shared"], timeout=None)
            async def read(i: int) -> str:
                await trio.sleep(0.1)
                finished.add(f"c{i}")
                return f"read {i}"

            @registry.tool(name="write", kind=Kind.MUTATING, scopes=["shared"], timeout=None)
            async def write(i: int) -> str:
                await trio.sleep(0.1)
                finished.add(f"c{i}")
                return f"wrote {i}"

            runner = Runner(registry, scopes=[scope], turn_timeout=1.5, mutating="parallel")
            turn = runner.turn(calls, run=fanout.Run(store=store))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(strike)
                await turn.run()
                lateness = trio.current_time() - turn.deadline  # trio's real clock here
            server.thaw()
        return turn, lateness

    try:
        turn, lateness = trio.run(main)
    finally:
        server.stop()
    _assert_one_honest_answer_each(calls, turn)
    assert lateness <= REDIS_LATENESS
    for result in turn.results:
        if result.status is Status.OK:
            assert result.tool_use_id in finished
        else:
            payload = _body(result)
            if result.tool_use_id not in finished:
                assert payload["status"] in {"refused", "timed_out", "rate_limited", "error"}
            if payload["started"] is False:
                assert result.tool_use_id not in finished


# --- parts plugged in that raise anything: a kept Cancelled, SystemExit, groups -------


async def _a_kept_cancelled() -> BaseException:
    """A ``Cancelled`` from a scope that was cancelled and is gone: raised again later (a
    retry helper's last error), nothing around it is cancelled."""
    with trio.CancelScope() as inner:
        inner.cancel()
        try:
            await trio.sleep(1)
        except trio.Cancelled as exc:
            return exc
    raise AssertionError("the scope was cancelled")


class _BoolRaises(Exception):
    def __bool__(self) -> bool:
        raise TypeError("no truth in me")


async def _raised(kind: str) -> BaseException:
    """What a misbehaving part raises."""
    if kind == "kept-cancelled":
        return await _a_kept_cancelled()
    if kind == "group-with-kept-cancelled":
        return BaseExceptionGroup("helpers", [await _a_kept_cancelled(), ValueError("boom")])
    return {"system-exit": SystemExit(3), "value-error": ValueError("boom"),
            "bool-raises": _BoolRaises("unloggable")}[kind]  # fmt: skip


PART_FAULTS = (
    "kept-cancelled", "group-with-kept-cancelled", "system-exit", "value-error", "bool-raises"
)  # fmt: skip
SEAMS = ("acquire_slot", "reserve", "claim", "finish", "renew", "instrument")


@attrs.define
class _PartFaults:
    """Which seam fails, with what, and how many times it did."""

    seam: str
    fault: str
    raised: int = 0

    async def fail(self, seam: str) -> None:
        if seam == self.seam:
            self.raised += 1
            raise await _raised(self.fault)


class _FaultyScope(Scope):
    """A scope whose ``acquire_slot`` or ``reserve`` raises what the test chose."""

    def __init__(self, name: str, faults: _PartFaults) -> None:
        super().__init__(name, max_concurrency=2)
        self._faults = faults

    async def acquire_slot(self, holder: Any, deadline: float) -> bool:
        await self._faults.fail("acquire_slot")
        return await super().acquire_slot(holder, deadline)

    async def reserve(self, cost: float, max_wait: float) -> Any:
        await self._faults.fail("reserve")
        return await super().reserve(cost, max_wait)


class _FaultyStore(MemoryIdempotencyStore):
    def __init__(self, faults: _PartFaults) -> None:
        super().__init__()
        self._faults = faults

    async def claim(self, key: str, *, lease: float) -> Claim:
        await self._faults.fail("claim")
        return await super().claim(key, lease=lease)

    async def finish(self, key: str, answer: StoredAnswer, *, ttl: float) -> None:
        await self._faults.fail("finish")
        await super().finish(key, answer, ttl=ttl)

    async def renew(self, key: str, *, lease: float) -> bool:
        await self._faults.fail("renew")
        return await super().renew(key, lease=lease)


@attrs.define
class _FaultyInstrument:
    faults: _PartFaults

    def on_event(self, event: fanout.Event) -> None:
        if self.faults.seam == "instrument" and event.kind is fanout.EventKind.STARTED:
            self.faults.raised += 1
            exc = {"system-exit": SystemExit(3), "value-error": ValueError("boom")}.get(
                self.faults.fault, _BoolRaises("unloggable")
            )
            raise exc


@settings(max_examples=60, deadline=None)
@given(
    seam=st.sampled_from(SEAMS),
    fault=st.sampled_from(PART_FAULTS),
    hosted=st.booleans(),
    mutating=st.sampled_from(["one", "serial", "parallel"]),
)
def test_a_part_that_raises_anything_fails_its_own_call_never_its_siblings(
    seam: str, fault: str, hosted: bool, mutating: str
) -> None:
    """A scope, a store or an instrument raising a ``Cancelled`` it kept (alone or in a
    group), a ``SystemExit``, or an exception logging cannot write: every call is answered
    once, none blamed on the caller, the calls on a healthy scope answered ok, and the
    turn back by its deadline. A kept ``Cancelled`` went up as the caller's, a store's
    ``SystemExit`` in ``finish`` crashed the turn's nursery, and an instrument's
    exception whose ``__bool__`` raised escaped ``run()`` as a ``TypeError``."""
    faults = _PartFaults(seam, fault)
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["flaky"])
    async def flaky_read() -> str:
        return "read"

    @reg.tool(kind=Kind.READS, scopes=["healthy"])
    async def healthy_read() -> str:
        await trio.sleep(1)
        return "fine"

    @reg.tool(kind=Kind.MUTATING, scopes=["flaky"], timeout=30)
    async def write(n: int) -> str:
        await trio.sleep(3 if seam == "renew" else 0)  # past a renewal (every lease / 3)
        return f"wrote {n}"

    faults_store = fanout.Run(store=_FaultyStore(faults), claim_lease=6.0)
    calls = [
        ToolCall("r1", "flaky_read", {}), ToolCall("h1", "healthy_read", {}),
        ToolCall("w1", "write", {"n": 1}), ToolCall("w2", "write", {"n": 2}),
    ]  # fmt: skip
    runner = Runner(
        reg, scopes=[_FaultyScope("flaky", faults), Scope("healthy")], turn_timeout=60,
        mutating=mutating, instruments=[_FaultyInstrument(faults)],
    )  # fmt: skip

    async def main() -> fanout.Turn:
        if not hosted:
            return await runner.run_turn(calls, run=faults_store)
        async with runner:
            return await runner.run_turn(calls, run=faults_store)

    clock = trio.testing.MockClock(autojump_threshold=0)
    started = clock.current_time()
    turn = trio.run(main, clock=clock)
    _assert_one_honest_answer_each(calls, turn)
    assert turn.results[1].status is Status.OK, turn.results[1]
    assert max(e.time for e in turn.trace) <= started + 60


# -- a scope whose hooks around the tool raise ---------------------------------------------


class _HookRaises(Scope):
    """A scope of yours whose hook ``hook`` raises (a metrics export that fails)."""

    def __init__(self, name: str, hook: str) -> None:
        super().__init__(name)
        self._hook = hook

    def _fail(self, hook: str) -> None:
        if hook == self._hook:
            raise ConnectionError(f"the metrics export in {hook} failed")

    def attempt_began(self, admitted_at: float) -> None:
        self._fail("attempt_began")
        super().attempt_began(admitted_at)

    def observe_call(self, seconds: float, **kwargs: Any) -> None:
        self._fail("observe_call")
        super().observe_call(seconds, **kwargs)

    async def observe_headers(self, info: Any, **kwargs: Any) -> None:
        self._fail("observe_headers")
        await super().observe_headers(info, **kwargs)


@pytest.mark.parametrize("hook", ["attempt_began", "observe_call", "observe_headers"])
def test_a_scope_hook_that_raises_leaves_a_writes_answer_true(hook: str) -> None:
    """Before the tool runs, a hook that raises means the write never started, and its
    answer says so (it said "started: true, may have taken effect"); after (the server
    answered, the tool returned), the write's own answer stands (it was "fanout failed
    ... not finished", or the scope's error taken for the tool's, with no word of the
    charge the server made)."""
    charged: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        charged.append(json.loads(request.content)["amount"])
        return httpx.Response(200, json={"charged": True})

    client = fanout.http_client(httpx.MockTransport(handler))
    registry = Registry()

    @registry.tool(kind=Kind.MUTATING, scopes=["payments"])
    async def charge(amount: float) -> str:
        response = await client.post("http://api.test/charges", json={"amount": amount})
        return f"charged {amount}: {response.json()['charged']}"

    runner = Runner(registry, scopes=[_HookRaises("payments", hook)])
    turn = trio.run(runner.run_turn, [ToolCall("c1", "charge", {"amount": 9.99})])
    (result,) = turn.results
    if hook == "attempt_began":
        assert charged == []
        assert result.status is Status.ERROR
        assert _body(result)["started"] is False
        assert "effect" not in _body(result)
    else:
        assert charged == [9.99]
        assert (result.status, result.content) == (Status.OK, "charged 9.99: True")
