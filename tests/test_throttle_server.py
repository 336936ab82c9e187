"""The throttling test server: limits, timing, headers and records, on virtual time.

Timing tests take pytest-trio's built-in ``autojump_clock`` fixture
(``MockClock(autojump_threshold=0)``); the server runs in the same ``trio.run``
as the client, so every timestamp asserted here is exact. Rates are powers of
two so that the expected times are exact binary floats.
"""

from __future__ import annotations

import email.utils
import math
import random
import subprocess
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import attrs
import httpx
import pytest
import trio
import trio.testing

import fanout
import fanout.testing
from fanout._throttle_server import go_duration, key_label, parse_command_line
from fanout.testing import (
    HeaderStyle,
    KeyLimits,
    RetryAfterFormat,
    ServerConfig,
    ThrottlingServer,
    serve_throttled,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

WALL = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def wall() -> float:
    """A wall clock that advances with trio's (virtual) clock."""
    return WALL + trio.current_time()


@asynccontextmanager
async def running(
    config: ServerConfig, **headers: str
) -> AsyncIterator[tuple[ThrottlingServer, httpx.AsyncClient]]:
    async with (
        serve_throttled(config, wall_clock=wall) as server,
        httpx.AsyncClient(base_url=server.url, headers=headers, timeout=None) as client,
    ):
        yield server, client


async def test_public_names() -> None:
    """fanout.testing exports exactly the server's public names, sorted."""
    expected = [
        "HeaderStyle",
        "KeyLimits",
        "Model",
        "RequestRecord",
        "ResetMeaning",
        "ResetRounding",
        "RetryAfterFormat",
        "ServerConfig",
        "ThrottlingServer",
        "serve_throttled",
    ]
    assert fanout.testing.__all__ == expected


async def test_burst_then_429(autojump_clock: trio.testing.MockClock) -> None:
    """A full bucket admits `burst` requests at once; the next gets 429 with Retry-After 1."""
    async with running(ServerConfig(rate=4, burst=2), **{"x-api-key": "k"}) as (server, client):
        statuses = [(await client.get("/")).status_code for _ in range(2)]
        refused = await client.get("/")
    assert statuses == [200, 200]
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"  # true wait 0.25 s, ceil, min 1
    assert refused.json() == {"ok": False, "error": "rate_limited", "n": 3}
    assert server.starts() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("retry_after", "precise", "expected"),
    [
        ("seconds", True, {"retry-after": "0.25"}),
        ("ms", False, {"retry-after-ms": "250"}),
        ("http-date", False, {"retry-after": "Tue, 14 Nov 2023 22:13:21 GMT"}),
        ("absent", False, {}),
    ],
)
async def test_retry_after_formats(
    autojump_clock: trio.testing.MockClock,
    retry_after: RetryAfterFormat,
    precise: bool,
    expected: dict[str, str],
) -> None:
    """Each Retry-After format carries the true wait for the next token (0.25 s here)."""
    config = ServerConfig(rate=4, burst=1, retry_after=retry_after, retry_after_precise=precise)
    async with running(config) as (_, client):
        await client.get("/")
        refused = await client.get("/")
    assert refused.status_code == 429
    got = {k: v for k, v in refused.headers.items() if k in ("retry-after", "retry-after-ms")}
    assert got == expected


async def test_refill_at_configured_rate(autojump_clock: trio.testing.MockClock) -> None:
    """Tokens refill at `rate`: a client sleeping exactly the advertised wait is admitted."""
    config = ServerConfig(rate=4, burst=1, retry_after="ms")
    async with running(config) as (server, client):
        admitted: list[float] = []
        while len(admitted) < 4:
            response = await client.get("/")
            if response.status_code == 429:
                await trio.sleep(int(response.headers["retry-after-ms"]) / 1000)
            else:
                admitted.append(trio.current_time())
        await trio.sleep(0.125)  # halfway through a 0.25 s refill
        early = await client.get("/")
    assert admitted == [0.0, 0.25, 0.5, 0.75]
    assert early.headers["retry-after-ms"] == "125"
    assert server.starts() == [0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.75, 0.875]
    assert [r.status for r in server.records] == [200, 429] * 3 + [200, 429]


async def test_in_flight_cap_gives_503(autojump_clock: trio.testing.MockClock) -> None:
    """Past `max_in_flight` a request gets 503, Retry-After = earliest admitted finish."""
    config = ServerConfig(rate=None, max_in_flight=2, latency=1.5, retry_after_precise=True)
    responses: list[httpx.Response] = []
    async with running(config) as (server, client):

        async def fetch(delay: float) -> None:
            await trio.sleep(delay)
            responses.append(await client.get("/"))

        async with trio.open_nursery() as nursery:
            for delay in (0.0, 0.25, 0.5):
                nursery.start_soon(fetch, delay)
    refused, first, second = responses
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"  # first finishes at 1.5, asked at 0.5
    assert [first.status_code, second.status_code] == [200, 200]
    assert [(r.start, r.end, r.status) for r in server.records] == [
        (0.0, 1.5, 200),
        (0.25, 1.75, 200),
        (0.5, 0.5, 503),
    ]
    assert [r.in_flight_at_start for r in server.records] == [0, 1, 2]
    assert server.max_in_flight() == 2


async def test_latency_is_exact(autojump_clock: trio.testing.MockClock) -> None:
    """An admitted request takes exactly `latency` of virtual time, holding its slot."""
    async with running(ServerConfig(latency=0.75)) as (server, client):
        await client.get("/a")
        assert trio.current_time() == 0.75
        await client.get("/b")
    assert [(r.start, r.end) for r in server.records] == [(0.0, 0.75), (0.75, 1.5)]


async def test_jitter_is_seeded(autojump_clock: trio.testing.MockClock) -> None:
    """Each admitted request takes latency + Random(seed).uniform(0, jitter), exactly, drawn
    per key: the k-th admission of every key gets the same jitter."""
    rng = random.Random(7)
    expected = [1.0 + rng.uniform(0, 0.5) for _ in range(5)]
    async with running(ServerConfig(latency=1.0, jitter=0.5, seed=7)) as (server, client):
        for i in range(10):
            await client.get("/", headers={"x-api-key": "ab"[i % 2]})
    for key in "ab":
        records = [r for r in server.records if r.key == key]
        durations = [r.end - r.start for r in records]
        assert durations == pytest.approx(expected, abs=1e-9)
    assert all(1.0 <= d <= 1.5 for d in expected)


async def test_records_and_window(autojump_clock: trio.testing.MockClock) -> None:
    """Records keep arrival order, key, method, path and Idempotency-Key; windows are half-open."""
    async with running(ServerConfig(rate=None)) as (server, client):
        for at, key in [(0.0, "a"), (0.25, "b"), (0.5, "a"), (1.0, "a")]:
            await trio.sleep(at - trio.current_time())
            await client.post("/t?x=1", headers={"x-api-key": key, "idempotency-key": f"i{at}"})
    first = server.records[0]
    assert attrs.astuple(first) == (1, 0.0, 0.0, "a", "POST", "/t?x=1", 200, "i0.0", 0)
    assert [r.n for r in server.records] == [1, 2, 3, 4]
    assert server.starts(key="a") == [0.0, 0.5, 1.0]
    assert server.count(key="b") == 1
    assert server.max_starts_in_window(0.5) == 2  # [0, 0.5) holds 0 and 0.25
    assert server.max_starts_in_window(0.5, key="a") == 1
    assert server.max_starts_in_window(0.75) == 3
    assert server.max_starts_in_window(1.0, key="a") == 2


IETF = {"ratelimit-policy": '"default";q=4;w=2', "ratelimit": '"default";r=3;t=1'}
DRAFT = {"ratelimit-limit": "4", "ratelimit-remaining": "3", "ratelimit-reset": "1"}
X = {"x-ratelimit-limit": "4", "x-ratelimit-remaining": "3", "x-ratelimit-reset": "1"}
OPENAI = {
    "x-ratelimit-limit-requests": "4",
    "x-ratelimit-remaining-requests": "3",
    "x-ratelimit-reset-requests": "500ms",
}
ANTHROPIC = {
    "anthropic-ratelimit-requests-limit": "4",
    "anthropic-ratelimit-requests-remaining": "3",
    "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:21Z",
}


@pytest.mark.parametrize(
    ("style", "epoch", "expected"),
    [
        ("ietf", False, IETF),
        ("draft", False, DRAFT),
        ("x", False, X),
        ("x", True, {**X, "x-ratelimit-reset": str(int(WALL) + 1)}),
        ("openai", False, OPENAI),
        ("anthropic", False, ANTHROPIC),
        ("none", False, {}),
    ],
)
async def test_header_styles(
    autojump_clock: trio.testing.MockClock,
    style: HeaderStyle,
    epoch: bool,
    expected: dict[str, str],
) -> None:
    """Each style reports limit=burst, remaining after this request, reset=time to full."""
    config = ServerConfig(rate=2, burst=4, headers=style, reset_as_epoch=epoch)
    async with running(config) as (_, client):
        response = await client.get("/")
    got = {k: v for k, v in response.headers.items() if "ratelimit" in k}
    assert got == expected


async def test_headers_track_the_bucket(autojump_clock: trio.testing.MockClock) -> None:
    """Remaining counts down to 0 on the 429 and is back to the limit once refilled."""
    async with running(ServerConfig(rate=2, burst=2, headers="draft")) as (_, client):
        seen = [(await client.get("/")).headers["ratelimit-remaining"] for _ in range(3)]
        await trio.sleep(1.0)
        refilled = await client.get("/")
    assert seen == ["1", "0", "0"]
    assert refilled.headers["ratelimit-remaining"] == "1"
    assert refilled.headers["ratelimit-reset"] == "1"  # 0.5 s to full, rounded up


async def test_unlimited_key_has_no_limit_headers(autojump_clock: trio.testing.MockClock) -> None:
    """A key with rate=None is never refused and gets no rate-limit headers."""
    async with running(ServerConfig(rate=None)) as (server, client):
        responses = [await client.get("/") for _ in range(50)]
    assert {r.status_code for r in responses} == {200}
    assert not [k for k in responses[0].headers if "ratelimit" in k]
    assert server.max_starts_in_window(0.001) == 50


async def test_date_skew(autojump_clock: trio.testing.MockClock) -> None:
    """date_skew moves Date and an HTTP-date Retry-After together; their gap is the wait."""
    config = ServerConfig(rate=4, burst=1, retry_after="http-date", date_skew=3600.5)
    async with running(config) as (_, client):
        await client.get("/")
        refused = await client.get("/")
    date = email.utils.parsedate_to_datetime(refused.headers["date"]).timestamp()
    retry = email.utils.parsedate_to_datetime(refused.headers["retry-after"]).timestamp()
    assert date == WALL + 3600  # 3600.5 later, truncated to whole seconds
    assert retry == WALL + 3601  # 3600.5 + 0.25 later, rounded up
    assert retry - date >= 0.25


async def test_keys_are_independent(autojump_clock: trio.testing.MockClock) -> None:
    """Each key (x-api-key, Bearer token, anonymous) has its own bucket and overrides."""
    config = ServerConfig(rate=1, burst=1, keys={"big": KeyLimits(rate=1, burst=3)})
    async with running(config) as (server, client):
        for headers in [
            {"x-api-key": "a"},
            {"authorization": "Bearer b"},
            {},
            {"x-api-key": "big"},
        ]:
            for _ in range(4):
                await client.get("/", headers=headers)
    assert [(k, server.count(200, k), server.count(429, k)) for k in ("a", "b", "anonymous")] == [
        ("a", 1, 3),
        ("b", 1, 3),
        ("anonymous", 1, 3),
    ]
    assert (server.count(200, "big"), server.count(429, "big")) == (3, 1)


async def test_scope_header_names_the_bucket(autojump_clock: trio.testing.MockClock) -> None:
    """With scope_header set, a 429 names the configured scope, else the key."""
    keys = {"k1": KeyLimits(rate=1, burst=1, scope="tickets")}
    config = ServerConfig(rate=1, burst=1, keys=keys, scope_header="x-ratelimit-scope")
    async with running(config) as (_, client):
        scopes = []
        for key in ("k1", "k2"):
            ok = await client.get("/", headers={"x-api-key": key})
            refused = await client.get("/", headers={"x-api-key": key})
            assert "x-ratelimit-scope" not in ok.headers
            scopes.append(refused.headers["x-ratelimit-scope"])
    assert scopes == ["tickets", key_label("k2")]


async def test_credentials_not_echoed(autojump_clock: trio.testing.MockClock) -> None:
    """The key is recorded for accounting but never sent back in a response."""
    async with running(ServerConfig(), authorization="Bearer tok") as (server, client):
        response = await client.get("/p")
    assert response.json() == {"ok": True, "path": "/p", "n": 1}
    assert "tok" not in response.text
    assert all("tok" not in value for value in response.headers.values())
    assert server.records[0].key == "tok"


async def test_fail_first(autojump_clock: trio.testing.MockClock) -> None:
    """The first `fail_first` requests get 500 without consuming a token."""
    async with running(ServerConfig(rate=1, burst=1, fail_first=2)) as (server, client):
        statuses = [(await client.get("/")).status_code for _ in range(4)]
    assert statuses == [500, 500, 200, 429]
    assert [r.status for r in server.records] == statuses


async def test_head_has_no_body(autojump_clock: trio.testing.MockClock) -> None:
    """HEAD is throttled like GET but answered without a body, keeping the connection."""
    async with running(ServerConfig(rate=1, burst=1, headers="draft")) as (server, client):
        head = await client.head("/")
        refused = await client.get("/")
    assert (head.status_code, head.content, head.headers["ratelimit-remaining"]) == (200, b"", "0")
    assert refused.status_code == 429
    assert [r.method for r in server.records] == ["HEAD", "GET"]


async def test_abandoned_request_frees_its_slot(autojump_clock: trio.testing.MockClock) -> None:
    """A client that hangs up mid-latency is still recorded, and its slot comes back."""
    config = ServerConfig(rate=None, max_in_flight=1, latency=1.0)
    async with running(config) as (server, client):
        with trio.move_on_after(0.5):
            await client.get("/gone")
        await trio.sleep(1.0)
        later = await client.get("/later")
    assert later.status_code == 200
    assert [(r.path, r.start, r.end, r.in_flight_at_start) for r in server.records] == [
        ("/gone", 0.0, 1.0, 0),
        ("/later", 1.5, 2.5, 0),
    ]


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xff\xfe garbage\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000,
    ],
    ids=["binary", "bad-content-length", "huge-header"],
)
async def test_garbage_gets_4xx_and_close(
    autojump_clock: trio.testing.MockClock, garbage: bytes
) -> None:
    """Malformed HTTP gets a 4xx and a closed connection; the server keeps serving."""
    async with running(ServerConfig()) as (server, client):
        stream = await trio.open_tcp_stream("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
        async with stream:
            await stream.send_all(garbage)
            reply = b""
            while chunk := await stream.receive_some():
                reply += chunk
        after = await client.get("/")
    assert reply.split(b" ", 2)[1] in (b"400", b"431")
    assert b"connection: close" in reply
    assert after.status_code == 200
    assert server.count() == 1


async def test_a_request_asking_to_close_is_answered_then_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Connection: close gets its one answer, then the server ends the connection."""
    async with running(ServerConfig()) as (server, _):
        stream = await trio.open_tcp_stream("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
        async with stream:
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := await stream.receive_some():  # ends: the server closed
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert reply.count(b"HTTP/1.1") == 1
    assert server.count() == 1


async def test_counts_stated_on_refusals_alone(autojump_clock: trio.testing.MockClock) -> None:
    """``state_on_refusals``: an admitted answer carries no state headers, a 429 all of them."""
    config = ServerConfig(rate=4, burst=1, headers="draft", state_on_refusals=True)
    async with running(config) as (_, client):
        admitted, refused = await client.get("/"), await client.get("/")
    assert admitted.status_code == 200
    assert not any(name.startswith("ratelimit") for name in admitted.headers)
    assert refused.status_code == 429
    assert refused.headers["ratelimit-limit"] == "1"
    assert refused.headers["ratelimit-remaining"] == "0"


async def test_each_connection_closed_after_its_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``close_each``: every answer says ``Connection: close`` and ends its connection, as an
    HTTP/1.0 server's, so each request opens one."""
    async with running(ServerConfig(close_each=True)) as (server, _):
        stream = await trio.open_tcp_stream("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
        async with stream:
            await stream.send_all(
                b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            reply = b""
            while chunk := await stream.receive_some():  # ends: the server closed
                reply += chunk
    assert reply.count(b"HTTP/1.1 200 ") == 1
    assert b"connection: close" in reply.lower()
    assert server.count() == 1


async def test_half_sent_request_is_dropped(autojump_clock: trio.testing.MockClock) -> None:
    """A client closing mid-body ends only its own connection handler."""
    async with running(ServerConfig()) as (server, client):
        stream = await trio.open_tcp_stream("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        await stream.aclose()
        after = await client.get("/")
    assert after.status_code == 200


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.02, "20ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"), (3723, "1h2m3s")],
)
def test_go_duration(seconds: float, text: str) -> None:
    """OpenAI-style reset durations are Go durations, rounded up to the millisecond."""
    assert go_duration(seconds) == text


def test_config_validates() -> None:
    """Nonsense limits are rejected when the config is built, not when serving."""
    with pytest.raises(ValueError, match="burst"):
        ServerConfig(burst=0)
    with pytest.raises(ValueError, match="rate"):
        KeyLimits(rate=0)
    with pytest.raises(ValueError, match="headers"):
        ServerConfig(headers="bogus")  # type: ignore[arg-type]
    for seconds in (-1.0, math.nan, math.inf):  # a Date's period, a reset's lateness
        with pytest.raises(ValueError, match="date_every"):
            ServerConfig(date_every=seconds)
        with pytest.raises(ValueError, match="reset_late"):
            ServerConfig(reset_late=seconds)


def test_the_command_line_spells_every_option() -> None:
    """Each flag reaches the config; 'none' lifts a limit; no flags give the defaults."""
    port, config = parse_command_line(
        ["--port", "8080", "--rate", "none", "--burst", "3", "--max-in-flight", "2",
         "--latency", "0.5", "--retry-after", "http-date", "--headers", "openai",
         "--reset-as-epoch", "--scope-header", "x-scope", "--fail-first", "1",
         "--model", "fixed", "--reset", "next", "--connect-delay", "0.25",
         "--connect-jitter", "0.01", "--window-phase", "0.5", "--date-every", "1",
         "--reset-late", "1", "--reset-precise", "--state-at-answer",
         "--state-on-refusals", "--close-each"]
    )  # fmt: skip
    assert port == 8080
    assert config == ServerConfig(
        rate=None, burst=3, max_in_flight=2, latency=0.5, retry_after="http-date",
        headers="openai", reset_as_epoch=True, scope_header="x-scope", fail_first=1,
        model="fixed", reset="next", connect_delay=0.25, connect_jitter=0.01, window_phase=0.5,
        date_every=1.0,
        reset_late=1.0, reset_precise=True, state_at_answer=True, state_on_refusals=True,
        close_each=True,
    )  # fmt: skip
    assert parse_command_line([]) == (0, ServerConfig())


def test_a_server_not_yet_listening_has_no_url() -> None:
    """Asking a server for its URL before it listens is a UsageError, not a wrong URL."""
    with pytest.raises(fanout.UsageError, match="not listening yet"):
        ThrottlingServer(ServerConfig()).url  # noqa: B018


async def test_cli_runs_in_its_own_process() -> None:
    """`python -m fanout._throttle_server` prints READY <url> and serves real requests."""
    argv = [sys.executable, "-m", "fanout._throttle_server", "--rate", "2", "--burst", "1"]
    process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE)
    try:
        with trio.fail_after(20):
            assert process.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive_some(1)
            word, url = line.decode().split()
            async with httpx.AsyncClient(base_url=url) as client:
                statuses = [(await client.get("/")).status_code for _ in range(2)]
    finally:
        process.kill()
        await process.wait()
    assert word == "READY"
    assert url.startswith("http://127.0.0.1:")
    assert statuses == [200, 429]


async def _statuses_at(
    client: httpx.AsyncClient, times: list[float]
) -> list[tuple[float, int, dict[str, str]]]:
    """GET at each virtual time; the status and rate-limit headers of each answer."""
    seen = []
    for at in times:
        await trio.sleep_until(at)
        response = await client.get("/")
        headers = {
            k: v for k, v in response.headers.items() if k.startswith(("ratelimit", "retry"))
        }
        seen.append((at, response.status_code, headers))
    return seen


async def test_fixed_window_resets_at_its_end(autojump_clock: trio.testing.MockClock) -> None:
    """A fixed window admits `burst` per window of burst/rate s; Reset counts to its end."""
    config = ServerConfig(rate=4, burst=2, model="fixed", headers="draft")
    async with running(config) as (_, client):
        seen = await _statuses_at(client, [0.0, 0.0, 0.0, 0.25, 0.5, 0.5, 0.5])
    assert [status for _, status, _ in seen] == [200, 200, 429, 429, 200, 200, 429]
    assert seen[1][2]["ratelimit-remaining"] == "0"
    assert seen[1][2]["ratelimit-reset"] == "1"  # 0.5 s to the window's end, rounded up
    assert seen[3][2]["retry-after"] == "1"


async def test_a_fixed_window_may_begin_before_the_first_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``window_phase``: the first window began that share of one before the first request,
    as a counter keyed by the clock's second does, and the next begins sooner."""
    config = ServerConfig(rate=4, burst=2, model="fixed", headers="draft", window_phase=0.75)
    async with running(config) as (_, client):
        seen = await _statuses_at(client, [0.0, 0.0, 0.0, 0.125, 0.125, 0.125])
    assert [status for _, status, _ in seen] == [200, 200, 429, 200, 200, 429]
    assert seen[2][2]["retry-after"] == "1"  # 0.125 s to the window's end, rounded up
    with pytest.raises(ValueError, match="window_phase"):
        ServerConfig(window_phase=1.0)


async def test_sliding_log_counts_any_window(autojump_clock: trio.testing.MockClock) -> None:
    """A sliding log admits at most `burst` in any burst/rate s, not per aligned window."""
    config = ServerConfig(rate=4, burst=2, model="sliding", retry_after="ms")
    async with running(config) as (server, client):
        seen = await _statuses_at(client, [0.0, 0.25, 0.375, 0.5, 0.625, 0.75])
    assert [status for _, status, _ in seen] == [200, 200, 429, 200, 429, 200]
    assert seen[2][2]["retry-after-ms"] == "125"  # the first request leaves the log at 0.5
    admitted = [r.start for r in server.records if r.status == 200]
    assert admitted == [0.0, 0.25, 0.5, 0.75]  # never three in any half second


@pytest.mark.parametrize(("reset", "expected"), [("full", "2"), ("next", "1")])
async def test_bucket_reset_means_full_or_next_token(
    autojump_clock: trio.testing.MockClock, reset: fanout.testing.ResetMeaning, expected: str
) -> None:
    """Reset is the time until the bucket is full (2 s), or until its next token (0.25 s)."""
    config = ServerConfig(rate=4, burst=8, reset=reset, headers="x")
    async with running(config) as (_, client):
        for _ in range(8):
            last = await client.get("/")
    assert last.headers["x-ratelimit-remaining"] == "0"
    assert last.headers["x-ratelimit-reset"] == expected  # rounded up to whole seconds


@pytest.mark.parametrize(("rounding", "expected"), [("up", "1"), ("nearest", "0"), ("down", "0")])
async def test_a_bucket_reset_is_rounded_as_configured(
    autojump_clock: trio.testing.MockClock,
    rounding: fanout.testing.ResetRounding,
    expected: str,
) -> None:
    """A full bucket at 4/s, one request taken: 0.25 s until full again, rounded up to
    1, or to 0 as ``round()`` and ``int()`` would (a bucket with tokens to spare)."""
    config = ServerConfig(rate=4, burst=8, headers="draft", reset_rounding=rounding)
    async with running(config) as (_, client):
        first = await client.get("/")
    assert first.headers["ratelimit-remaining"] == "7"
    assert first.headers["ratelimit-reset"] == expected


@pytest.mark.parametrize(
    ("epoch", "late", "expected"),
    [
        (True, 0.0, f"{WALL + 2:.3f}"),
        (False, 0.0, "2.000"),
        (True, 1.0, f"{WALL + 3:.3f}"),  # slowapi: its float epoch, a second late
        (False, 1.0, "3.000"),
    ],
)
async def test_a_precise_reset_is_written_to_the_millisecond(
    autojump_clock: trio.testing.MockClock, epoch: bool, late: float, expected: str
) -> None:
    """``reset_precise`` writes the X- reset (an epoch or a delta) to the millisecond;
    ``reset_late`` moves every reset, and never a refusal's ``Retry-After``: slowapi's
    is the whole seconds of its late reset less now, the wait rounded up."""
    config = ServerConfig(
        rate=4, burst=8, headers="x", reset_as_epoch=epoch, reset_precise=True, reset_late=late
    )
    async with running(config) as (_, client):
        for _ in range(8):
            last = await client.get("/")
        refused = await client.get("/")
    assert last.headers["x-ratelimit-reset"] == expected  # 2 s to full
    assert refused.headers["retry-after"] == "1"  # 0.25 s to the next token, rounded up


@pytest.mark.parametrize(("at_answer", "expected"), [(False, ["3", "2", "1"]), (True, ["1"] * 3)])
async def test_the_state_may_be_read_as_of_the_answer(
    autojump_clock: trio.testing.MockClock, at_answer: bool, expected: list[str]
) -> None:
    """Three requests at once, answered 0.1 s later: what remains as each was counted, or,
    with ``state_at_answer`` (slowapi's middleware reads it once the handler ran), as
    it is when each is answered, after all three."""
    config = ServerConfig(rate=2, burst=4, headers="x", latency=0.1, state_at_answer=at_answer)
    remaining: list[str] = []
    async with running(config) as (_, client):

        async def one() -> None:
            remaining.append((await client.get("/")).headers["x-ratelimit-remaining"])

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(one)
    assert sorted(remaining, reverse=True) == expected


async def test_openai_reset_shows_the_meaning_precisely(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With a millisecond reset, "full" and "next" differ as the server means them."""
    results = {}
    for reset in ("full", "next"):
        config = ServerConfig(rate=4, burst=8, reset=reset, headers="openai")  # type: ignore[arg-type]
        async with running(config) as (_, client):
            for _ in range(8):
                last = await client.get("/")
        results[reset] = last.headers["x-ratelimit-reset-requests"]
    assert results == {"full": "2s", "next": "250ms"}


async def test_slow_first_connection_arrives_late(autojump_clock: trio.testing.MockClock) -> None:
    """connect_delay holds back the first request of a connection only."""
    config = ServerConfig(rate=None, connect_delay=0.125)
    async with running(config) as (server, client):
        await client.get("/")
        await client.get("/")
    assert server.starts() == [0.125, 0.125]


async def test_connections_are_taken_in_unevenly_with_connect_jitter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """connect_jitter holds back each connection's first request by its own draw, up to
    that much beyond connect_delay, the same draws for the same seed."""

    async def lates(seed: int) -> list[float]:
        config = ServerConfig(rate=None, connect_delay=0.1, connect_jitter=0.01, seed=seed)
        late = []
        async with serve_throttled(config, wall_clock=wall) as server:
            for _ in range(6):  # a client, and so a connection, each
                began = trio.current_time()
                async with httpx.AsyncClient(base_url=server.url) as client:
                    await client.get("/")
                    await client.get("/")
                first, again = (start - began for start in server.starts()[-2:])
                assert again == first  # the connection's second request is read at once
                late.append(round(first, 9))
        return late

    drawn = await lates(seed=1)
    assert all(0.1 <= late <= 0.11 for late in drawn)
    assert len(set(drawn)) == len(drawn)
    assert drawn == await lates(seed=1)
    assert drawn != await lates(seed=2)
