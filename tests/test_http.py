"""The HTTP layer against a real throttling server on 127.0.0.1, on trio's mock clock."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import trio.testing

import fanout
from fanout import Kind, Registry, Runner, Scope, Status, ToolCall
from fanout.testing import ServerConfig, ThrottlingServer, serve_throttled

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

SECRET = "sk-test-SECRET-0123456789"
EPOCH = 1_790_000_000.0  # a fixed wall-clock origin, so HTTP-dates are exact


def wall() -> float:
    """A wall clock that moves with trio's (mock) clock."""
    return EPOCH + trio.current_time()


@asynccontextmanager
async def api(config: ServerConfig) -> AsyncIterator[tuple[ThrottlingServer, httpx.AsyncClient]]:
    async with serve_throttled(config, wall_clock=wall) as server:
        transport = fanout.FanoutTransport(wall_clock=wall)
        async with httpx.AsyncClient(
            transport=transport, base_url=server.url, headers={"x-api-key": SECRET}
        ) as client:
            yield server, client


def fetch_registry(
    client: httpx.AsyncClient, *, scope: str = "key", timeout: float = 30, requests: int = 1
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


async def test_known_limits_cause_no_429_and_one_request_per_call(autojump_clock: Any) -> None:
    """Configured to the server's limits: every call sends once, never faster than allowed."""
    async with api(ServerConfig(rate=4, burst=2)) as (server, client):
        runner = Runner(fetch_registry(client), scopes=[Scope("key", rate=4, burst=2)])
        turn = await runner.run_turn(calls(10))
    assert [r.status for r in turn.results] == [Status.OK] * 10
    assert server.count() == 10
    assert server.count(status=429) == 0
    assert server.starts() == [0, 0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    for window in (0.25, 1.0, 2.0):
        assert server.max_starts_in_window(window) <= 2 + 4 * window


async def test_each_request_of_a_call_is_charged(autojump_clock: Any) -> None:
    """A tool making three requests takes three tokens, paced by the scope's rate."""
    async with api(ServerConfig(rate=None)) as (server, client):
        runner = Runner(fetch_registry(client, requests=3), scopes=[Scope("key", rate=4, burst=1)])
        turn = await runner.run_turn(calls(1))
    assert turn.results[0].status is Status.OK
    assert server.starts() == [0, 0.25, 0.5]


async def test_no_request_is_sent_past_the_call_deadline(autojump_clock: Any) -> None:
    """A further request whose wait would reach the deadline is kept back, not sent."""
    async with api(ServerConfig(rate=None)) as (server, client):
        reg = fetch_registry(client, timeout=1.0, requests=100)
        runner = Runner(reg, scopes=[Scope("key", rate=2, burst=1)])
        turn = await runner.run_turn(calls(1))
    (result,) = turn.results
    assert result.status is Status.RATE_LIMITED
    assert json.loads(result.content)["started"] is True
    assert server.starts() == [0, 0.5]
    assert max(server.starts()) < 1.0


async def test_learning_reaches_the_servers_rate_then_sends_no_429(autojump_clock: Any) -> None:
    """A scope with no configured rate probes once, adopts the stated limit, stays within it."""
    async with api(ServerConfig(rate=4, burst=4, headers="ietf")) as (server, client):
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
async def test_learning_reads_every_header_family(autojump_clock: Any, style: Any) -> None:
    """Whatever dialect the server speaks, a fresh scope ends up within its rate."""
    async with api(ServerConfig(rate=4, burst=4, headers=style)) as (server, client):
        runner = Runner(fetch_registry(client), inline_wait=None)
        turn = await runner.run_turn(calls(20))
    assert all(r.status is Status.OK for r in turn.results)
    assert server.count(status=429) <= 5
    assert server.max_starts_in_window(2.0) <= 4 + 4 * 2.0


async def test_exhausted_window_waits_for_the_reset_instead_of_a_429(autojump_clock: Any) -> None:
    """On a fixed window, remaining=0 blocks the scope until the reset: no request is refused."""
    async with api(ServerConfig(rate=1, burst=2, headers="x")) as (server, client):
        scope = Scope("key", rate=100, burst=100, max_concurrency=1, window="fixed")
        runner = Runner(fetch_registry(client), scopes=[scope])
        turn = await runner.run_turn(calls(3))
    assert [r.status for r in turn.results] == [Status.OK] * 3
    assert server.count(status=429) == 0
    assert server.starts() == [0, 0, 2]


async def test_http_date_retry_after_is_read_against_the_servers_date(autojump_clock: Any) -> None:
    """A server clock an hour ahead still means 'wait about a second', not 'wait an hour'."""
    config = ServerConfig(rate=1, burst=1, retry_after="http-date", headers="none", date_skew=3600)
    async with api(config) as (server, client):
        runner = Runner(fetch_registry(client), scopes=[Scope("key", learn=False)])
        turn = await runner.run_turn(calls(2))
    assert [r.status for r in turn.results] == [Status.OK, Status.OK]
    assert server.count(status=429) == 1
    retried = server.starts()[-1]
    assert 1 <= retried <= 2


@pytest.mark.parametrize("fmt", ["seconds", "ms"])
async def test_retry_after_formats_pace_the_retry(autojump_clock: Any, fmt: Any) -> None:
    """Retry-After in seconds or milliseconds: the retry starts no earlier than told."""
    config = ServerConfig(
        rate=2, burst=1, retry_after=fmt, retry_after_precise=True, headers="none"
    )
    async with api(config) as (server, client):
        runner = Runner(fetch_registry(client), scopes=[Scope("key", learn=False)])
        turn = await runner.run_turn(calls(2))
    assert [r.status for r in turn.results] == [Status.OK, Status.OK]
    refused = [r for r in server.records if r.status == 429]
    assert len(refused) == 1
    assert server.starts()[-1] == pytest.approx(0.5)


async def test_mutating_requests_carry_the_calls_idempotency_key(autojump_clock: Any) -> None:
    """Writes send Idempotency-Key (the same on a retry); reads do not."""
    config = ServerConfig(rate=1, burst=1, retry_after_precise=True, headers="none")
    async with api(config) as (server, client):
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
    expected = fanout.idempotency_key("run-1", "create", {"name": "a"})
    posts = [r for r in server.records if r.method == "POST"]
    assert [r.status for r in posts] == [429, 200]
    assert {r.idempotency_key for r in posts} == {expected}
    assert [r.idempotency_key for r in server.records if r.method == "GET"] == [None]


async def test_scope_named_by_the_server_is_the_one_that_waits(autojump_clock: Any) -> None:
    """A 429 naming one bucket blocks that scope; a call on another scope is not held back."""
    reg = Registry()
    sent: list[tuple[str, float]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((request.url.path, trio.current_time()))
        if request.url.path == "/org" and len(sent) == 1:
            return httpx.Response(429, headers={"retry-after": "1", "x-ratelimit-scope": "org"})
        return httpx.Response(200, text="ok")

    client = httpx.AsyncClient(transport=fanout.FanoutTransport(httpx.MockTransport(handler)))

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


def respond(status: int, **headers: str) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(status, headers=headers, text="body")


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (429, {"retry-after": "1"}, fanout.RateLimitedError),
        (503, {"retry-after": "1"}, fanout.RateLimitedError),
        (503, {}, fanout.TransientError),
        (502, {}, fanout.TransientError),
        (400, {"x-should-retry": "true"}, fanout.TransientError),
        (502, {"x-should-retry": "false"}, None),
        (404, {}, None),
        (200, {}, None),
    ],
)
async def test_statuses_become_signals(
    autojump_clock: Any, status: int, headers: dict[str, str], expected: type[Exception] | None
) -> None:
    """429 and 503+Retry-After throttle, other 5xx are transient, x-should-retry overrides."""
    reg = Registry()
    client = httpx.AsyncClient(
        transport=fanout.FanoutTransport(httpx.MockTransport(respond(status, **headers)))
    )
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


async def test_server_saying_do_not_retry_is_obeyed(autojump_clock: Any) -> None:
    """A 429 with x-should-retry: false is answered at once, with no second request."""
    sent: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(trio.current_time())
        return httpx.Response(429, headers={"retry-after": "1", "x-should-retry": "false"})

    client = httpx.AsyncClient(transport=fanout.FanoutTransport(httpx.MockTransport(handler)))
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def fetch() -> str:
        return (await client.get("https://api.test/x")).text

    turn = await Runner(reg).run_turn([ToolCall("f", "fetch", {})])
    assert turn.results[0].status is Status.RATE_LIMITED
    assert sent == [0]


async def test_no_credential_reaches_results_trace_or_errors(autojump_clock: Any) -> None:
    """The key, sent as a header and a query parameter, appears in no answer, event or log."""
    config = ServerConfig(rate=1, burst=1, retry_after="seconds")
    async with api(config) as (server, client):
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


def test_calls_queued_behind_the_probe_keep_the_models_order() -> None:
    """After the probe, queued calls take learned tokens first-come: same answers every run."""
    outcomes = set()
    for _ in range(20):

        async def main() -> tuple[str, ...]:
            async with api(ServerConfig(rate=2, burst=2, latency=0.1)) as (_, client):
                runner = Runner(fetch_registry(client), inline_wait=1.0)
                turn = await runner.run_turn(calls(6))
            return tuple(r.status.value for r in turn.results)

        outcomes.add(trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)))
    assert len(outcomes) == 1
    (statuses,) = outcomes
    # The probe, then the learned burst and rate: later calls are the ones told to wait.
    assert statuses[:3] == ("ok", "ok", "ok")
    assert statuses == tuple(sorted(statuses, key=lambda s: s != "ok"))


async def test_learning_spends_what_the_probe_says_remains(autojump_clock: Any) -> None:
    """The probe's answer says 3 of 4 remain: three calls go at once, then one per 1/R."""
    async with api(ServerConfig(rate=4, burst=4, headers="ietf")) as (server, client):
        runner = Runner(fetch_registry(client), inline_wait=None)
        await runner.run_turn(calls(6))
    assert server.starts() == [0, 0, 0, 0, 0.25, 0.5]
    assert server.count(status=429) == 0
