"""The HTTP layer against real servers on 127.0.0.1, on trio's mock clock, for httpx and httpx2.

Every test takes ``lib``: it runs once with ``fanout.FanoutTransport`` on
httpx and once with ``fanout.httpx2.FanoutTransport`` on httpx2, the same
core behind two seams.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import struct
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import httpx2
import pytest
import trio
import trio.testing

import fanout
import fanout.httpx2
from fanout import Kind, Registry, Runner, Scope, Status, ToolCall
from fanout._learning import TOGETHER
from fanout.idempotency import idempotency_key
from fanout.testing import ServerConfig, ThrottlingServer, serve_throttled

from .echo_server import FAULTS, Fault, Seen, Server, _serving, serve_faulty

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

SECRET = "sk-test-SECRET-0123456789"
EPOCH = 1_790_000_000.0  # a fixed wall-clock origin, so HTTP-dates are exact


def wall() -> float:
    """A wall clock that moves with trio's (mock) clock."""
    return EPOCH + trio.current_time()


@attrs.frozen
class Library:
    """One HTTP library and fanout's transport for it."""

    module: Any  # httpx or httpx2: the same names, two class trees
    transport: Callable[..., Any]

    def client(self, inner: Any = None, **options: Any) -> Any:
        """An AsyncClient of this library whose transport is fanout's (wrapping ``inner``)."""
        return self.module.AsyncClient(transport=self.transport(inner, wall_clock=wall), **options)

    def mock(self, handler: Callable[[Any], Any]) -> Any:
        """A client answered by ``handler`` (a request -> a response of this library)."""
        return self.client(self.module.MockTransport(handler))


LIBRARIES = {
    "httpx": Library(httpx, fanout.FanoutTransport),
    "httpx2": Library(httpx2, fanout.httpx2.FanoutTransport),
}


@pytest.fixture(params=sorted(LIBRARIES))
def lib(request: pytest.FixtureRequest) -> Library:
    """Each test runs against httpx and against httpx2."""
    return LIBRARIES[request.param]


@asynccontextmanager
async def api(config: ServerConfig, lib: Library) -> AsyncIterator[tuple[ThrottlingServer, Any]]:
    async with (
        serve_throttled(config, wall_clock=wall) as server,
        lib.client(base_url=server.url, headers={"x-api-key": SECRET}) as client,
    ):
        yield server, client


def fetch_registry(
    client: Any, *, scope: str = "key", timeout: float = 30, requests: int = 1
) -> Registry:
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=[scope], timeout=timeout)
    async def fetch(n: int) -> str:
        for i in range(requests):
            response = await client.get(f"/items/{n}", params={"part": i})
            response.raise_for_status()
        return f"item {n}"

    return reg


def calls(n: int, tool: str = "fetch") -> list[ToolCall]:
    return [ToolCall(f"c{i}", tool, {"n": i}) for i in range(n)]


async def test_known_limits_cause_no_429_and_one_request_per_call(
    autojump_clock: Any, lib: Library
) -> None:
    """Configured to the server's limits: every call sends once, never faster than allowed.
    Past the burst, each token is held ``TOGETHER`` more once: before any answer, the
    burst's requests, over new connections, may reach the server that much late
    (`fanout._window.Arrivals.latest_read`), and its bucket stays full meanwhile."""
    async with api(ServerConfig(rate=4, burst=2), lib) as (server, client):
        runner = Runner(fetch_registry(client), scopes=[Scope("key", rate=4, burst=2)])
        turn = await runner.run_turn(calls(10))
    assert [r.status for r in turn.results] == [Status.OK] * 10
    assert server.count() == 10
    assert server.count(status=429) == 0
    paced = [0.25 * k + TOGETHER for k in range(1, 9)]
    assert server.starts() == pytest.approx([0, 0, *paced], abs=1e-9)
    for window in (0.25, 1.0, 2.0):
        assert server.max_starts_in_window(window) <= 2 + 4 * window


async def test_a_write_partly_sent_says_its_effect_is_unknown(
    autojump_clock: Any, lib: Library
) -> None:
    """A write's POST is answered, and its next request cannot be afforded (its token is
    5 s off, past what fanout waits inline): it was answered "not sent", with no word of
    the POST, and told to re-issue it. Likewise a write whose request broke after it left,
    whose retry its scope refused."""
    async with api(ServerConfig(rate=None), lib) as (server, client):
        reg = Registry()

        @reg.tool(kind=Kind.MUTATING, scopes=["payments"])
        async def charge(amount: float) -> str:
            (await client.post("/charges", json={"amount": amount})).raise_for_status()
            return (await client.get("/receipts/latest")).text

        runner = Runner(reg, scopes=[Scope("payments", rate=0.2, burst=1)])
        turn = await runner.run_turn([ToolCall("c1", "charge", {"amount": 9.99})])
    (result,) = turn.results
    assert server.count() == 1
    assert result.status is Status.RATE_LIMITED
    assert json.loads(result.content)["effect"].startswith("unknown")

    def broken(request: Any) -> Any:
        raise lib.module.ReadError("connection reset mid-body", request=request)

    reg = Registry()
    client = lib.mock(broken)

    @reg.tool(kind=Kind.MUTATING, scopes=["payments"])
    async def pay(amount: float) -> str:
        return (await client.post("http://api.test/charges", json={"amount": amount})).text

    runner = Runner(reg, scopes=[Scope("payments", rate=0.25, burst=1)])
    turn = await runner.run_turn([ToolCall("c1", "pay", {"amount": 9.99})])
    body = json.loads(turn.results[0].content)
    assert body["message"].startswith("its retry: scope 'payments'")
    assert body["effect"].startswith("unknown")


async def test_a_write_whose_later_request_the_server_refuses_says_its_effect_is_unknown(
    autojump_clock: Any, lib: Library
) -> None:
    """The server takes a write's POST, then refuses its receipt's GET with a 429: the
    write was answered ``rate_limited``, "not sent", with no word of the POST."""
    async with api(ServerConfig(rate=0.5, burst=1, headers="none"), lib) as (server, client):
        reg = Registry()

        @reg.tool(kind=Kind.MUTATING, retry=fanout.RetryPolicy(attempts=1))
        async def charge(amount: float) -> str:
            (await client.post("/charges", json={"amount": amount})).raise_for_status()
            return (await client.get("/receipts/latest")).text

        turn = await Runner(reg).run_turn([ToolCall("c1", "charge", {"amount": 9.99})])
    assert server.count(status=200) == 1
    assert server.count(status=429) == 1
    (result,) = turn.results
    assert result.status is Status.RATE_LIMITED
    assert json.loads(result.content)["effect"].startswith("unknown")


async def test_a_fanout_transport_handed_to_http_client_is_not_wrapped_again(
    autojump_clock: Any, lib: Library
) -> None:
    """Wrapped again, each request was charged twice: two events and two tokens apiece."""
    module = fanout if lib.module is httpx else fanout.httpx2
    async with api(ServerConfig(rate=None), lib) as (server, _):
        client = module.http_client(lib.transport(), base_url=server.url)
        turn = await Runner(fetch_registry(client)).run_turn(calls(3))
        await client.aclose()
    sent = [e for e in turn.trace if e.kind is fanout.EventKind.REQUEST_SENT]
    assert len(sent) == server.count() == 3


async def test_each_request_of_a_call_is_charged(autojump_clock: Any, lib: Library) -> None:
    """A tool making three requests takes three tokens, paced by the scope's rate (the first
    over a new connection, which may be read ``TOGETHER`` late, as above)."""
    async with api(ServerConfig(rate=None), lib) as (server, client):
        runner = Runner(fetch_registry(client, requests=3), scopes=[Scope("key", rate=4, burst=1)])
        turn = await runner.run_turn(calls(1))
    assert turn.results[0].status is Status.OK
    assert server.starts() == pytest.approx([0, 0.25 + TOGETHER, 0.5 + TOGETHER], abs=1e-9)


async def test_no_request_is_sent_past_the_call_deadline(autojump_clock: Any, lib: Library) -> None:
    """A further request whose wait would reach the deadline is kept back, not sent."""
    async with api(ServerConfig(rate=None), lib) as (server, client):
        reg = fetch_registry(client, timeout=1.0, requests=100)
        runner = Runner(reg, scopes=[Scope("key", rate=2, burst=1)])
        turn = await runner.run_turn(calls(1))
    (result,) = turn.results
    assert result.status is Status.RATE_LIMITED
    assert json.loads(result.content)["started"] is True
    assert server.starts() == pytest.approx([0, 0.5 + TOGETHER], abs=1e-9)
    assert max(server.starts()) < 1.0


async def test_learning_reaches_the_servers_rate_then_sends_no_429(
    autojump_clock: Any, lib: Library
) -> None:
    """A scope with no configured rate probes once, adopts the stated limit, stays within it."""
    async with api(ServerConfig(rate=4, burst=4, headers="ietf"), lib) as (server, client):
        runner = Runner(fetch_registry(client), inline_wait=None)
        first = await runner.run_turn(calls(20))
        second = await runner.run_turn(calls(20))
    assert all(r.status is Status.OK for r in first.results + second.results)
    assert server.count(status=429) <= 3
    assert server.count(status=200) == 40
    for window in (1.0, 2.0, 5.0):
        assert server.max_starts_in_window(window) <= 4 + 4 * window
    learned = runner.scope("key").statistics().bucket
    assert learned.rate == 4
    assert learned.burst == 4


@pytest.mark.parametrize("style", ["draft", "x", "openai", "anthropic"])
async def test_learning_reads_every_header_family(
    autojump_clock: Any, lib: Library, style: Any
) -> None:
    """Whatever dialect the server speaks, a fresh scope ends up within its rate."""
    async with api(ServerConfig(rate=4, burst=4, headers=style), lib) as (server, client):
        runner = Runner(fetch_registry(client), inline_wait=None)
        turn = await runner.run_turn(calls(20))
    assert all(r.status is Status.OK for r in turn.results)
    assert server.count(status=429) <= 5
    assert server.max_starts_in_window(2.0) <= 4 + 4 * 2.0


async def test_exhausted_window_waits_for_the_reset_instead_of_a_429(
    autojump_clock: Any, lib: Library
) -> None:
    """On a fixed window, remaining=0 blocks the scope until the reset: no request is refused."""
    async with api(ServerConfig(rate=1, burst=2, headers="x"), lib) as (server, client):
        scope = Scope("key", rate=100, burst=100, max_concurrency=1, window="fixed")
        runner = Runner(fetch_registry(client), scopes=[scope])
        turn = await runner.run_turn(calls(3))
    assert [r.status for r in turn.results] == [Status.OK] * 3
    assert server.count(status=429) == 0
    assert server.starts() == [0, 0, 2]


@pytest.mark.parametrize(
    ("dates", "earliest", "latest"),
    [({"date_skew": 3600}, 1.0, 2.0), ({"date_every": 1.0}, 1.0, 1.0)],
    ids=["an-hour-ahead", "written-once-a-second"],
)
async def test_http_date_retry_after_is_read_against_the_servers_date(
    autojump_clock: Any, lib: Library, dates: dict[str, float], earliest: float, latest: float
) -> None:
    """A server clock an hour ahead still means 'wait about a second', not 'wait an hour':
    an HTTP-date has whole seconds and is read against the server's Date, so the wait
    lands between one and two seconds.

    uvicorn (FastAPI, Starlette) writes its Date once a second and sends it until the
    next, so it runs up to a second and a half behind the clock here. Our clock agrees
    with the server's: the retry goes at the HTTP-date's instant, 1 s. Bounded as if the
    Date were fresh, our clock was disbelieved, and the retry went a second late."""
    config = ServerConfig(rate=1, burst=1, retry_after="http-date", headers="none", **dates)
    async with api(config, lib) as (server, client):
        runner = Runner(fetch_registry(client), scopes=[Scope("key", learn=False)])
        turn = await runner.run_turn(calls(2))
    assert [r.status for r in turn.results] == [Status.OK, Status.OK]
    assert server.count(status=429) == 1
    assert earliest - 1e-9 <= server.starts()[-1] <= latest + 1e-9


@pytest.mark.parametrize("fmt", ["seconds", "ms"])
async def test_retry_after_formats_pace_the_retry(
    autojump_clock: Any, lib: Library, fmt: Any
) -> None:
    """Retry-After in seconds or milliseconds: the retry starts no earlier than told."""
    config = ServerConfig(
        rate=2, burst=1, retry_after=fmt, retry_after_precise=True, headers="none"
    )
    async with api(config, lib) as (server, client):
        runner = Runner(fetch_registry(client), scopes=[Scope("key", learn=False)])
        turn = await runner.run_turn(calls(2))
    assert [r.status for r in turn.results] == [Status.OK, Status.OK]
    refused = [r for r in server.records if r.status == 429]
    assert len(refused) == 1
    assert server.starts() == [0.0, 0.0, 0.5]


async def test_mutating_requests_carry_the_calls_idempotency_key(
    autojump_clock: Any, lib: Library
) -> None:
    """Writes send Idempotency-Key (the same on a retry); reads do not."""
    config = ServerConfig(rate=1, burst=1, retry_after_precise=True, headers="none")
    async with api(config, lib) as (server, client):
        reg = Registry()

        @reg.tool(kind=Kind.MUTATING, scopes=["key"])
        async def create(name: str) -> str:
            response = await client.post("/things", json={"name": name})
            return response.text

        @reg.tool(kind=Kind.READS, scopes=["key"])
        async def read(name: str) -> str:
            return (await client.get("/things")).text

        runner = Runner(reg, scopes=[Scope("key", learn=False)])
        turn = await runner.run_turn(
            [ToolCall("r", "read", {"name": "a"}), ToolCall("w", "create", {"name": "a"})],
            run=fanout.Run("run-1"),
        )
    assert [r.status for r in turn.results] == [Status.OK, Status.OK]
    expected = idempotency_key("run-1", "create", {"name": "a"})
    posts = [r for r in server.records if r.method == "POST"]
    assert [r.status for r in posts] == [429, 200]
    assert {r.idempotency_key for r in posts} == {expected}
    assert [r.idempotency_key for r in server.records if r.method == "GET"] == [None]


async def test_scope_named_by_the_server_is_the_one_that_waits(
    autojump_clock: Any, lib: Library
) -> None:
    """A 429 naming one bucket blocks that scope; a call on another scope is not held back."""
    reg = Registry()
    sent: list[tuple[str, float]] = []

    def handler(request: Any) -> Any:
        sent.append((request.url.path, trio.current_time()))
        if request.url.path == "/org" and len(sent) == 1:
            return lib.module.Response(
                429, headers={"retry-after": "1", "x-ratelimit-scope": "org"}
            )
        return lib.module.Response(200, text="ok")

    client = lib.mock(handler)

    @reg.tool(kind=Kind.READS, scopes=["org", "key"])
    async def org_call() -> str:
        return (await client.get("https://api.test/org")).text

    @reg.tool(kind=Kind.READS, scopes=["key"])
    async def key_call() -> str:
        await trio.sleep(0.25)  # after the org call's 429
        return (await client.get("https://api.test/key")).text

    scopes = [Scope("org", learn=False), Scope("key", learn=False)]
    runner = Runner(reg, scopes=scopes)
    turn = await runner.run_turn([ToolCall("o", "org_call", {}), ToolCall("k", "key_call", {})])
    assert [r.status for r in turn.results] == [Status.OK, Status.OK]
    assert sent == [("/org", 0), ("/key", 0.25), ("/org", 1)]
    assert runner.scope("org").statistics().bucket.drained == 1
    assert runner.scope("key").statistics().bucket.drained == 0


def respond(lib: Library, status: int, **headers: str) -> Callable[[Any], Any]:
    return lambda request: lib.module.Response(status, headers=headers, text="body")


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (429, {"retry-after": "1"}, fanout.RateLimitedError),
        (429, {}, fanout.RateLimitedError),
        (503, {"retry-after": "1"}, fanout.RateLimitedError),
        (503, {}, fanout.TransientError),
        (529, {"retry-after": "1"}, fanout.RateLimitedError),
        (529, {}, fanout.TransientError),
        (408, {}, fanout.TransientError),
        (502, {}, fanout.TransientError),
        (
            403,
            {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1700000060"},
            fanout.RateLimitedError,
        ),
        (403, {"retry-after": "60"}, fanout.RateLimitedError),
        (403, {"x-ratelimit-remaining": "12"}, None),
        (403, {}, None),
        (501, {}, None),
        (400, {"x-should-retry": "true"}, fanout.TransientError),
        (502, {"x-should-retry": "false"}, None),
        (404, {}, None),
        (200, {}, None),
    ],
)
async def test_statuses_become_signals(
    autojump_clock: Any,
    lib: Library,
    status: int,
    headers: dict[str, str],
    expected: type[Exception] | None,
) -> None:
    """429, a 403 that says it is a rate limit (GitHub's), and 503 or 529 with a Retry-After
    throttle; a plain 403 is final; 408, 500, 502, 503 and 529 are transient; x-should-retry
    overrides."""
    reg = Registry()
    client = lib.mock(respond(lib, status, **headers))
    seen: list[BaseException | None] = []

    @reg.tool(kind=Kind.READS)
    async def probe() -> str:
        try:
            await client.get("https://api.test/x")
        except fanout.ToolSignal as exc:
            seen.append(exc)
            raise
        seen.append(None)
        return "done"

    await Runner(reg, retry=fanout.RetryPolicy(attempts=1)).run_turn([ToolCall("p", "probe", {})])
    assert seen[0].__class__ is (expected or type(None))


async def fetch_once(client: Any, url: str) -> fanout.Turn:
    """One call whose tool GETs ``url``: retried after a backoff of at most 0.5 s, or after
    whatever wait the server states, however long (``inline_wait=None``)."""
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def fetch() -> str:
        return (await client.get(url)).text

    runner = Runner(reg, retry=fanout.RetryPolicy(base=0.1, cap=0.5), inline_wait=None)
    return await runner.run_turn([ToolCall("f", "fetch", {})])


def retry_info(delay: str) -> dict[str, Any]:
    """Google's refusal body: the wait in a ``RetryInfo`` detail, not in a header."""
    detail = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
    return {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [detail]}}


@pytest.mark.parametrize(
    ("status", "body", "content_type", "retried_at"),
    [
        (429, retry_info("2.5s"), "application/json", 2.5),
        (429, retry_info("2.5s"), "application/json; charset=UTF-8", 2.5),
        (503, retry_info("2.5s"), "application/json", 2.5),  # overloaded, with its wait
        (429, retry_info("2.5s"), "text/plain", None),  # says it is not JSON: not read
        (429, {**retry_info("2.5s"), "padding": "x" * 70_000}, "application/json", None),
        (429, {"error": {"message": "quota"}}, "application/json", None),
    ],
)
async def test_a_wait_stated_in_a_refusal_s_body_is_waited(
    autojump_clock: Any,
    lib: Library,
    status: int,
    body: dict[str, Any],
    content_type: str,
    retried_at: float | None,
) -> None:
    """Gemini states a 429's wait only in its JSON body: that wait is the retry's, to the
    instant. A body that is not JSON, or over 64 KiB, or states none, is a bare refusal,
    retried after the policy's backoff (under a second here). Before, every one was: a
    scope told its rate retried into the same spent quota and gave the call up."""
    sent: list[float] = []

    def handler(request: Any) -> Any:
        sent.append(trio.current_time())
        if len(sent) > 1:
            return lib.module.Response(200, text="ok")
        data = json.dumps(body).encode()
        return lib.module.Response(status, content=data, headers={"content-type": content_type})

    turn = await fetch_once(lib.mock(handler), "https://api.test/x")
    assert turn.results[0].status is Status.OK
    if retried_at is None:
        assert sent[1] < 1.0
    else:
        assert sent == [0, retried_at]


async def _refuse_once_with_a_body(server: Server, how: str, stream: trio.SocketStream) -> None:
    """The first request: a JSON 429 with no Retry-After whose body ``how`` misbehaves
    (trickles a byte a second, runs to a megabyte, or is reset part way); then 200s."""
    server.seen.append(Seen("GET", "/", [], b""))
    if len(server.seen) > 1:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        return
    head = b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
    await stream.send_all(head + b"transfer-encoding: chunked\r\n\r\n")
    if how == "huge":
        with contextlib.suppress(trio.BrokenResourceError):  # the client stops reading
            for _ in range(16):
                await stream.send_all(b"10000\r\n" + b" " * 0x10000 + b"\r\n")
        return
    elif how == "reset":
        await stream.send_all(b"10\r\n" + b'{"error": {"det' + b"a\r\n")
        await trio.sleep(0.01)
        stream.socket.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )  # an RST on close
        await stream.aclose()
        return
    else:  # "trickle": a byte a second, forever
        while True:
            await stream.send_all(b"1\r\n \r\n")
            await trio.sleep(1.0)
    await stream.send_all(b"0\r\n\r\n")


@pytest.mark.parametrize(("how", "by"), [("trickle", 1.5), ("huge", 0.5), ("reset", 0.5)])
async def test_a_refusal_s_body_that_misbehaves_is_a_bare_refusal(
    autojump_clock: Any, lib: Library, how: str, by: float
) -> None:
    """A JSON refusal whose body never ends, runs past 64 KiB or breaks: its wait is not
    waited for (a second at most for one that trickles), the call is retried after the
    policy's backoff, and answered ok."""
    server = Server()
    handler = functools.partial(_refuse_once_with_a_body, server, how)
    async with _serving(handler, server):
        client = lib.client(base_url=server.url)
        turn = await fetch_once(client, "/x")
        await client.aclose()
    assert turn.results[0].status is Status.OK
    assert len(server.seen) == 2
    assert trio.current_time() <= by


async def test_a_refusal_s_body_whose_stream_fails_is_a_bare_refusal(
    autojump_clock: Any, lib: Library
) -> None:
    """A transport of the user's own whose refusal body raises something that is no
    transport error: the wait it might have stated is lost, nothing else. The call is
    retried after the policy's backoff and answered ok."""

    class Failing(lib.module.AsyncByteStream):  # type: ignore[name-defined,misc]
        async def __aiter__(self) -> Any:
            raise RuntimeError("a stream of the transport's own, broken")
            yield b""  # an async generator all the same

    sent: list[float] = []

    def handler(request: Any) -> Any:
        sent.append(trio.current_time())
        if len(sent) > 1:
            return lib.module.Response(200, text="ok")
        json_type = {"content-type": "application/json"}
        return lib.module.Response(429, headers=json_type, stream=Failing())

    turn = await fetch_once(lib.mock(handler), "https://api.test/x")
    assert turn.results[0].status is Status.OK
    assert len(sent) == 2
    assert sent[1] < 1.0


async def test_a_refusal_s_body_is_left_to_the_tool_when_the_server_says_not_to_retry(
    autojump_clock: Any, lib: Library
) -> None:
    """A 503 with x-should-retry: false is the tool's response: its body is not read first."""
    body = json.dumps(retry_info("2s"))

    client = lib.mock(
        lambda request: lib.module.Response(
            503, text=body, headers={"content-type": "application/json", "x-should-retry": "false"}
        )
    )
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def fetch() -> str:
        response = await client.get("https://api.test/x")
        return f"{response.status_code} {response.text}"

    turn = await Runner(reg).run_turn([ToolCall("f", "fetch", {})])
    assert turn.results[0].status is Status.OK
    assert turn.results[0].content == f"503 {body}"


async def test_server_saying_do_not_retry_is_obeyed(autojump_clock: Any, lib: Library) -> None:
    """A 429 with x-should-retry: false is answered at once, with no second request."""
    sent: list[float] = []

    def handler(request: Any) -> Any:
        sent.append(trio.current_time())
        return lib.module.Response(429, headers={"retry-after": "1", "x-should-retry": "false"})

    client = lib.mock(handler)
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def fetch() -> str:
        return (await client.get("https://api.test/x")).text

    turn = await Runner(reg).run_turn([ToolCall("f", "fetch", {})])
    assert turn.results[0].status is Status.RATE_LIMITED
    assert sent == [0]


async def test_no_credential_reaches_results_trace_or_errors(
    autojump_clock: Any, lib: Library
) -> None:
    """The key, sent as a header and a query parameter, appears in no answer, event or log."""
    config = ServerConfig(rate=1, burst=1, retry_after="seconds")
    async with api(config, lib) as (server, client):
        reg = Registry()

        @reg.tool(kind=Kind.READS, scopes=["key"], timeout=5)
        async def leaky(n: int) -> str:
            response = await client.get("/search", params={"q": "x", "api_key": SECRET})
            return response.text

        @reg.tool(kind=Kind.READS, timeout=5)
        async def unreachable() -> str:
            # A closed port: the transport error's text would carry the URL.
            return (await client.get(f"http://127.0.0.1:9/x?token={SECRET}")).text

        runner = Runner(
            reg, scopes=[Scope("key", learn=False)], retry=fanout.RetryPolicy(attempts=2)
        )
        turn = await runner.run_turn([*calls(3, "leaky"), ToolCall("u", "unreachable", {})])
    texts = [r.content for r in turn.results]
    texts += [repr(event) for event in turn.trace]
    assert server.count() >= 3
    assert any(r.status is not Status.OK for r in turn.results)
    assert not [text for text in texts if SECRET in text]
    sent = [e for e in turn.trace if e.kind is fanout.EventKind.REQUEST_SENT]
    assert sent
    assert all("api_key=REDACTED" in e.detail["url"] for e in sent if "search" in e.detail["url"])


def test_calls_queued_behind_the_probe_keep_the_models_order(lib: Library) -> None:
    """After the probe, queued calls take learned tokens first-come: same answers every run."""
    outcomes = set()
    for _ in range(20):

        async def main() -> tuple[str, ...]:
            async with api(ServerConfig(rate=2, burst=2, latency=0.1), lib) as (_, client):
                runner = Runner(fetch_registry(client), inline_wait=1.0)
                turn = await runner.run_turn(calls(6))
            return tuple(r.status.value for r in turn.results)

        outcomes.add(trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)))
    assert len(outcomes) == 1
    (statuses,) = outcomes
    # The probe, then the learned burst and rate: later calls are the ones told to wait.
    assert statuses[:3] == ("ok", "ok", "ok")
    assert statuses == tuple(sorted(statuses, key=lambda s: s != "ok"))


async def test_learning_spends_what_the_probe_says_remains(
    autojump_clock: Any, lib: Library
) -> None:
    """The probe's answer says 3 of 4 remain: three calls go at once, then one per 1/R."""
    async with api(ServerConfig(rate=4, burst=4, headers="ietf"), lib) as (server, client):
        runner = Runner(fetch_registry(client), inline_wait=None)
        await runner.run_turn(calls(6))
    assert server.starts() == [0, 0, 0, 0, 0.25, 0.5]
    assert server.count(status=429) == 0


# --- response bodies that break ------------------------------------------------


def read_and_write(send: Callable[[str], Awaitable[str]]) -> Registry:
    """A read and a write that each make one request with ``send(method)``."""
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def read() -> str:
        return await send("GET")

    @reg.tool(kind=Kind.MUTATING)
    async def write() -> str:
        return await send("POST")

    return reg


def body_tools(client: Any, seen: list[BaseException]) -> Registry:
    """Tools that read a response body and let fanout's signals through, noting them."""

    async def send(method: str) -> str:
        try:
            response = await client.request(method, "/thing", params={"api_key": SECRET})
        except fanout.ToolSignal as exc:
            seen.append(exc)
            raise
        return str(response.text)

    return read_and_write(send)


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_body_error_is_transient_and_the_read_is_retried(
    autojump_clock: Any, lib: Library, fault: Fault
) -> None:
    """A reset, a short body or a bad chunk mid-body: TransientError, retried, then ok."""
    seen: list[BaseException] = []
    async with serve_faulty(fault, faults=1) as server, lib.client(base_url=server.url) as client:
        turn = await Runner(body_tools(client, seen)).run_turn([ToolCall("r", "read", {})])
    assert turn.results[0].status is Status.OK
    assert len(server.seen) == 2
    assert [type(exc) for exc in seen] == [fanout.TransientError]
    assert "while reading the response body" in str(seen[0])
    assert SECRET not in str(seen[0])
    retries = [e for e in turn.trace if e.kind is fanout.EventKind.RETRY_SCHEDULED]
    assert [e.reason for e in retries] == ["TransientError"]


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_write_cut_off_mid_body_is_never_replayed(
    autojump_clock: Any, lib: Library, fault: Fault
) -> None:
    """A write whose body breaks is not stored: re-issued next turn, it is re-sent, same key."""
    seen: list[BaseException] = []
    run = fanout.Run("run-body")
    async with serve_faulty(fault, faults=100) as server, lib.client(base_url=server.url) as client:
        runner = Runner(body_tools(client, seen), retry=fanout.RetryPolicy(attempts=2))
        first = await runner.run_turn([ToolCall("w1", "write", {})], run=run)
        sent_first = len(server.seen)
        second = await runner.run_turn([ToolCall("w2", "write", {})], run=run)
    assert first.results[0].status is Status.ERROR
    assert (
        "hint" not in first.results[0].content
        or "fix the arguments" not in first.results[0].content
    )
    assert sent_first == 2
    assert len(server.seen) == 4  # run again, not replayed
    assert second.results[0].status is Status.ERROR
    assert not [e for e in second.trace if e.kind is fanout.EventKind.REPLAYED]
    keys = {dict(s.headers).get("idempotency-key") for s in server.seen}
    assert keys == {idempotency_key("run-body", "write", {})}


def swallowing_tools(client: Any, unknown: list[bool]) -> Registry:
    """Tools that catch the body error themselves and answer as if all went well."""

    async def send(method: str) -> str:
        try:
            await client.request(method, "/thing")
        except fanout.TransientError:
            unknown.append(fanout.current_call().effect_unknown)
            return "done, probably"
        return "done"

    return read_and_write(send)


async def test_a_write_cut_off_mid_body_marks_its_effect_unknown(
    autojump_clock: Any, lib: Library
) -> None:
    """The context says a write's effect is unknown after a body error; a read's is not."""
    unknown: list[bool] = []
    async with serve_faulty("reset", faults=2) as server, lib.client(base_url=server.url) as client:
        calls = [ToolCall("r", "read", {})]
        runner = Runner(swallowing_tools(client, unknown), mutating="serial")
        await runner.run_turn([*calls, ToolCall("w", "write", {})])
    assert unknown == [False, True]


async def test_a_connection_refused_write_has_no_unknown_effect(
    autojump_clock: Any, lib: Library
) -> None:
    """A write that never left (nothing listens on the port) is not marked effect_unknown."""
    unknown: list[bool] = []
    async with lib.client(base_url="http://127.0.0.1:9") as client:
        await Runner(swallowing_tools(client, unknown)).run_turn([ToolCall("w", "write", {})])
    assert unknown == [False]


async def test_a_write_that_swallows_a_body_error_is_not_replayed(
    autojump_clock: Any, lib: Library
) -> None:
    """Even when the tool hides the body error, a re-issued write is sent again, not replayed."""
    unknown: list[bool] = []
    run = fanout.Run("run-swallow")
    async with serve_faulty("reset", faults=1) as server, lib.client(base_url=server.url) as client:
        runner = Runner(swallowing_tools(client, unknown))
        await runner.run_turn([ToolCall("w1", "write", {})], run=run)
        await runner.run_turn([ToolCall("w2", "write", {})], run=run)
    assert unknown == [True]
    assert len(server.seen) == 2


# --- scope names a server gives ----------------------------------------------------


@pytest.mark.parametrize(
    ("named", "expected"),
    [
        (SECRET, "REDACTED"),  # the key itself
        (f"org/{SECRET}", "REDACTED"),  # the key inside a plain name
        ("org-42", "org-42"),  # a plain name passes
        (f"Bearer {SECRET}", None),  # not a plain name: ignored
        ("x" * 65, None),  # too long: ignored
    ],
)
async def test_a_scope_named_by_the_server_is_checked_before_it_is_used(
    autojump_clock: Any, lib: Library, named: str, expected: str | None
) -> None:
    """A scope header holding the key reads REDACTED; a non-name is ignored; a name is kept."""
    seen: list[Any] = []

    def handler(request: Any) -> Any:
        return lib.module.Response(429, headers={"retry-after": "5", "x-ratelimit-scope": named})

    client = lib.mock(handler)
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def fetch() -> str:
        try:
            return (await client.get("https://api.test/x", headers={"x-api-key": SECRET})).text
        except fanout.RateLimitedError as exc:
            seen.append(exc.scope)
            raise

    turn = await Runner(reg, inline_wait=1).run_turn([ToolCall("f", "fetch", {})])
    (result,) = turn.results
    assert seen == [expected]
    assert result.status is Status.RATE_LIMITED
    assert result.scope == expected
    responses = [e for e in turn.trace if e.kind is fanout.EventKind.RESPONSE]
    assert [e.scope for e in responses] == [expected]
    assert SECRET not in repr(turn.trace) + repr(turn.results)


async def test_a_signal_wrapped_by_an_sdk_still_steers_the_runner(
    autojump_clock: Any, lib: Library
) -> None:
    """A 429 signal an SDK wrapped as the cause of its own error is still answered rate_limited."""

    def handler(request: Any) -> Any:
        return lib.module.Response(429, headers={"retry-after": "60"})

    client = lib.mock(handler)
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def ask() -> str:
        try:
            return (await client.get("https://api.test/v1/messages")).text
        except Exception as exc:  # what an SDK's request loop does
            raise ConnectionError("Connection error.") from exc

    turn = await Runner(reg, inline_wait=1).run_turn([ToolCall("a", "ask", {})])
    assert turn.results[0].status is Status.RATE_LIMITED
    assert turn.results[0].retry_after_ms == 60_000


@pytest.mark.parametrize("pools", [0, -1, 1.5])
def test_a_transport_needs_at_least_one_pool(lib: Library, pools: Any) -> None:
    """pools below one (or not a whole number) is a configuration error, not a crash later."""
    with pytest.raises(fanout.ConfigurationError):
        lib.transport(pools=pools)


async def test_a_trace_the_caller_set_still_hears_every_step(
    autojump_clock: Any, lib: Library
) -> None:
    """fanout listens to the pool's ``trace`` extension to tell a new connection from a
    reused one, until the request's headers leave; a tool that set its own still hears
    every step, the connection's opening only for the request that opened it, and the
    request keeps the tool's ``trace`` (or none) once it has left."""
    heard: list[list[str]] = []
    kept: list[Any] = []

    async with api(ServerConfig(rate=None), lib) as (_, client):
        reg = Registry()

        @reg.tool(kind=Kind.READS, scopes=["key"])
        async def fetch(n: int) -> str:
            for _ in range(2):
                steps: list[str] = []
                heard.append(steps)

                async def trace(event: str, info: dict[str, Any], steps: list[str] = steps) -> None:
                    steps.append(event)

                response = await client.get(f"/items/{n}", extensions={"trace": trace})
                response.raise_for_status()
                kept.append(response.request.extensions.get("trace") is trace)
            response = await client.get(f"/items/{n}")
            kept.append("trace" not in response.request.extensions)
            return "ok"

        turn = await Runner(reg, scopes=[Scope("key", rate=100, burst=3)]).run_turn(calls(1))
    assert turn.results[0].status is Status.OK
    assert kept == [True, True, True]
    opened = [[e for e in steps if e.startswith("connection.connect_")] for steps in heard]
    assert opened == [["connection.connect_tcp.started", "connection.connect_tcp.complete"], []]
    assert all("http11.receive_response_headers.complete" in steps for steps in heard)


class _StubPool:
    """A pool that only knows whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    async def handle_async_request(self, request: Any) -> Any:
        raise AssertionError("not sent in this test")

    async def aclose(self) -> None:
        self.closed = True


async def test_a_large_turn_spreads_over_sets_of_pools_made_once() -> None:
    """Positions past the first set's get a set of pools of their own, made once."""
    from fanout._http_core import _CALLS_PER_SET, HttpCore, Seam

    made: list[_StubPool] = []

    def more() -> _StubPool:
        made.append(_StubPool())
        return made[-1]

    first = [_StubPool() for _ in range(4)]
    core = HttpCore(
        Seam.of(httpx, fanout._http.GuardedBody), first, wall_clock=wall,
        credentials=fanout._credentials.CredentialNames(), more=more,
    )  # fmt: skip
    assert all(core._pools_for(p) == tuple(first) for p in range(_CALLS_PER_SET))
    assert made == []
    sets = [core._pools_for(p) for p in range(3 * _CALLS_PER_SET)]
    assert sets == [core._pools_for(p) for p in range(3 * _CALLS_PER_SET)]
    assert len(made) == 8
    for which in range(3):
        mine = set(sets[which * _CALLS_PER_SET : (which + 1) * _CALLS_PER_SET])
        assert len(mine) == 1
        assert len(set(mine.pop())) == 4
    await core.aclose()
    assert all(pool.closed for pool in [*first, *made])


def test_the_pools_of_one_transport_read_the_ca_bundle_once(
    lib: Library, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One TLS context serves every pool: building one reads the CA bundle (some 20 ms)."""
    import ssl

    built: list[object] = []
    create = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(kwargs.get("cafile"))
        return create(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    lib.transport(pools=8)
    assert len(built) == 1
