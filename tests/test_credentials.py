"""No credential leaves the call: every placement of a key, every path of an answer, every output.

The sweep runs, for each placement of a key (each credential header, query
parameter, URL userinfo, Basic auth) and each HTTP library, two turns of one
run against a loopback server that echoes everything back (request line,
headers, body) and names a 429's bucket after the key. The turns exercise a
fresh answer, coalescing, a cache hit, a replayed write, a retried 429 and
503, a tool that raises with the key in its message and one that raises
``raise_for_status``'s error (the URL, userinfo and all). Then every output
is searched for every spelling of the key: answers, both adapters' messages,
the trace, logging records, structlog events, Prometheus exposition, spans,
statistics, the cache, the store, exceptions and the context's repr.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import ssl
import string
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit

import attrs
import httpx
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

import fanout
import fanout.httpx2
from fanout import ConfigurationError, Kind, Registry, Runner, Scope, Status, ToolCall
from fanout._answers import failure
from fanout._canonical import truncate
from fanout._credentials import (
    BODY_LIMIT,
    CREDENTIAL_HEADERS,
    CREDENTIAL_PARAMS,
    CredentialNames,
    credentials_in,
)
from fanout._headers import SCOPE_NAME
from fanout._http_core import server_scope
from fanout._logs import log_failure
from fanout._redact import redact_text, scrubbed
from fanout._secrets import MIN_LENGTH, Secret, scrub_secrets
from fanout.contrib.logging import LoggingInstrument
from fanout.contrib.otel import OpenTelemetryInstrument
from fanout.contrib.prometheus import PrometheusInstrument
from fanout.contrib.structlog import StructlogInstrument
from fanout.http import parse_rate_limit_headers
from fanout.idempotency import idempotency_key
from fanout.redis import RedisIdempotencyStore

from .echo_server import Seen, serve_echo
from .redis_support import shared_redis_url, unique_prefix
from .test_http import LIBRARIES, Library

# Characters API keys are made of, "+/=" (base64) and "~" included.
ALPHABET = string.ascii_letters + string.digits + "-_.~+/="
keys = st.text(ALPHABET, min_size=10, max_size=32).map(lambda tail: "zQ" + tail)
USER = "alice"
EXTRA_HEADER, EXTRA_PARAM = "x-tenant-secret", "tenant_sig"

SCOPE_HEADERS = ("x-ratelimit-scope", "ratelimit-scope", "x-ratelimit-resource")
PLACEMENTS = (
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-auth-token",
    "cookie",
    EXTRA_HEADER,
    "query:key",
    "query:api_key",
    "query:token",
    "query:access_token",
    "query:sig",
    f"query:{EXTRA_PARAM}",
    "userinfo",
    "basic",
)


def spellings(key: str) -> set[str]:
    """Every way the key could show up in an output."""
    basic = base64.b64encode(f"{USER}:{key}".encode()).decode()
    twice = quote(quote(key, safe=""), safe="")  # a URL quoted inside another's query
    return {key, quote(key, safe=""), quote_plus(key), json.dumps(key)[1:-1], basic, twice}


def client_for(lib: Library, placement: str, key: str, url: str, inner: Any = None) -> Any:
    """A client of ``lib`` carrying ``key`` in ``placement`` (through ``inner``, if given)."""
    options: dict[str, Any] = {"base_url": url}
    if placement == "authorization":
        options["headers"] = {"authorization": f"Bearer {key}"}
    elif placement == "cookie":
        options["cookies"] = {"session": key}
    elif placement.startswith("query:"):
        options["params"] = {placement.removeprefix("query:"): key}
    elif placement == "userinfo":
        options["base_url"] = url.replace("http://", f"http://{USER}:{quote(key, safe='')}@")
    elif placement == "basic":
        options["auth"] = (USER, key)
    else:
        options["headers"] = {placement: key}
    transport = lib.transport(inner, secret_headers=[EXTRA_HEADER], secret_params=[EXTRA_PARAM])
    return lib.module.AsyncClient(transport=transport, **options)


@attrs.define
class Outputs:
    """Everything the sweep searches, as text."""

    texts: list[str] = attrs.field(factory=list)

    def add(self, *items: object) -> None:
        self.texts.extend(item if isinstance(item, str) else repr(item) for item in items)


class _Structlog:
    def __init__(self, outputs: Outputs) -> None:
        self.outputs = outputs

    def log(self, level: int, event: str, *args: Any, **kw: Any) -> None:
        self.outputs.add(event, args, kw)


def sweep_registry(client: Any, key: str, outputs: Outputs) -> Registry:
    """Tools that send the key and read back every echo of it."""
    reg = Registry()

    async def get(path: str) -> Any:
        try:
            return await client.get(path)
        except Exception as exc:
            outputs.add(str(exc), exc, getattr(exc, "scope", None))
            raise

    @reg.tool(kind=Kind.READS, scopes=["api"], cache_ttl=60)
    async def echo(n: int) -> str:
        return str((await get(f"/echo/{n}")).text)

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def throttled(n: int) -> str:
        return str((await get(f"/throttle/{n}")).text)

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def flaky(n: int) -> str:
        return str((await get(f"/flaky/{n}")).text)

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def explode() -> str:
        response = await get("/echo/explode")
        raise RuntimeError(f"upstream refused key {key}: {response.text}")

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def strict() -> str:
        response = await get("/status/404")
        response.raise_for_status()
        return "unreachable"

    @reg.tool(kind=Kind.PURE)
    async def context() -> str:
        await get("/echo/context")
        outputs.add(fanout.current_call())
        return "seen"

    @reg.tool(kind=Kind.MUTATING, scopes=["api"], invalidates=[])
    async def create(name: str) -> dict[str, Any]:
        response = await client.post("/echo/things", json={"name": name, "echo": key})
        return {"created": name, "server": response.json()}

    return reg


FIRST = [
    ToolCall("e1", "echo", {"n": 1}),
    ToolCall("e2", "echo", {"n": 1}),  # coalesced with e1
    ToolCall("t", "throttled", {"n": 1}),
    ToolCall("f", "flaky", {"n": 1}),
    ToolCall("x", "explode", {}),
    ToolCall("s", "strict", {}),
    ToolCall("c", "context", {}),
    ToolCall("w", "create", {"name": "a"}),
]
SECOND = [
    ToolCall("e3", "echo", {"n": 1}),  # a cache hit
    ToolCall("w2", "create", {"name": "a"}),  # replayed from the store
]


async def sweep(lib: Library, placement: str, key: str) -> tuple[Outputs, list[Seen]]:
    """Two turns with the key in ``placement``; every output collected."""
    outputs = Outputs()
    log = logging.getLogger(f"fanout.sweep.{placement}")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s %(fanout)s"))
    log.addHandler(handler)
    # The HTTP library logs every request's URL itself, at INFO (`fanout._library_log`).
    library_log = logging.getLogger(lib.module.__name__)
    library_stream = io.StringIO()
    library_handler = logging.StreamHandler(library_stream)
    library_log.addHandler(library_handler)
    level, library_log.level = library_log.level, logging.DEBUG
    metrics = PrometheusInstrument(CollectorRegistry())
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instruments = [
        LoggingInstrument(log, level=logging.DEBUG),
        StructlogInstrument(_Structlog(outputs)),
        metrics,
        OpenTelemetryInstrument(provider.get_tracer("sweep")),
    ]
    async with (
        serve_echo(scope_of=lambda seen: key) as server,
        client_for(lib, placement, key, server.url) as client,
    ):
        reg = sweep_registry(client, key, outputs)
        runner = Runner(reg, scopes=[Scope("api", rate=100, burst=100)], instruments=instruments)
        metrics.observe_scopes(runner)
        run = fanout.Run("sweep")
        turns = [await runner.run_turn(calls, run=run) for calls in (FIRST, SECOND)]
    log.removeHandler(handler)
    library_log.removeHandler(library_handler)
    library_log.setLevel(level)
    assert "HTTP Request" in library_stream.getvalue()  # the search is not vacuous
    outputs.add(library_stream.getvalue())
    for turn in turns:
        outputs.add(*turn.results, *turn.trace)
        outputs.add(fanout.anthropic_tool_results(turn.results))
        outputs.add(fanout.openai_tool_messages(turn.results))
    outputs.add(stream.getvalue(), generate_latest(metrics.registry).decode())
    outputs.add(*(span.to_json() for span in exporter.get_finished_spans()))
    outputs.add(runner.statistics(), runner.scope("api").statistics(), run.cache, run.store)
    # What the run keeps for later turns, read as they would read it; a cached
    # read and a stored write are among them, so the search is not vacuous.
    cached, stored = [], []
    for call in (*FIRST, *SECOND):
        kept = idempotency_key(run.run_id, call.name, call.arguments)
        cached.append(run.cache.get(kept))
        stored.append((await run.store.claim(kept, lease=1)).answer)
    assert any(cached)
    assert any(stored)
    outputs.add(*cached, *stored)
    return outputs, server.seen


def assert_paths_were_taken(outputs: Outputs, trace_text: str) -> None:
    for kind in ("coalesced", "cache_hit", "replayed", "retry_scheduled", "scope_blocked"):
        assert kind in trace_text, kind


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("lib_name", sorted(LIBRARIES))
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=keys)
def test_no_output_holds_the_key(lib_name: str, placement: str, key: str) -> None:
    """Whatever the key's placement and spelling, no answer, event, log, metric or repr holds it."""
    lib = LIBRARIES[lib_name]
    clock = trio.testing.MockClock(autojump_threshold=0)
    outputs, seen = trio.run(sweep, lib, placement, key, clock=clock)
    forms = spellings(key)
    # The server did receive the key, and echoed it: the sweep is not vacuous.
    assert any(form in repr(request) for request in seen for form in forms)
    everything = "\n".join(outputs.texts)
    assert_paths_were_taken(outputs, everything)
    assert "REDACTED" in everything
    leaks = sorted(form for form in forms if form in everything)
    assert not leaks, [text for text in outputs.texts if any(form in text for form in leaks)][:3]


# --- the pieces the sweep rests on ---------------------------------------------


def test_a_secret_never_prints() -> None:
    """repr and str of a Secret, and of a context holding secrets, show no value."""
    secret = Secret("sk-live-abcdef123456")
    assert "abcdef" not in repr(secret) + str(secret) + f"{secret}" + repr([secret])
    assert secret.reveal() == "sk-live-abcdef123456"
    assert secret == Secret("sk-live-abcdef123456")
    assert len({secret, Secret("sk-live-abcdef123456")}) == 1


@given(key=keys, noise=st.text(max_size=20))
def test_every_spelling_of_a_secret_is_scrubbed(key: str, noise: str) -> None:
    """Raw, percent-encoded (either case, any mix), JSON-escaped: each spelling is replaced."""
    for form in spellings(key) - {base64.b64encode(f"{USER}:{key}".encode()).decode()}:
        assert key not in scrub_secrets(noise + form + noise, [key])
        assert form not in scrub_secrets(noise + form + noise, [key])
    mixed = "".join(f"%{ord(c):02x}" if i % 2 else c for i, c in enumerate(key))
    assert scrub_secrets(f"<{mixed}>", [key]) == "<REDACTED>"


@pytest.mark.parametrize(
    ("headers", "url", "expected"),
    [
        (
            [("Authorization", "Bearer tok-123456")],
            "http://h/",
            {"Bearer tok-123456", "tok-123456"},
        ),
        ([("X-Api-Key", "key-123456")], "http://h/", {"key-123456"}),
        ([("Cookie", "a=cookie-1234; b=cookie-5678; theme=dark")], "http://h/", None),
        ([("Accept", "text/plain")], "http://h/?q=hello-world&page=2", set()),
        ([], "http://h/?API_KEY=param-123456&q=x", {"param-123456"}),
        ([], "http://bob:pass%2F123@h/", {"pass/123", "bob:pass/123"}),
        ([("x-tenant-secret", "tenant-123456")], "http://h/", set()),
        # A Cookie sent as two lines, read joined by a comma: each value is a session's.
        (
            [("Cookie", "sid=session-123456, csrf=csrf-7654321")],
            "http://h/",
            {"sid=session-123456, csrf=csrf-7654321", "session-123456", "csrf-7654321"},
        ),
        # One parameter is the credential alone (Rails); base64's padding is none.
        (
            [("Authorization", 'Token token="tok-123456"')],
            "http://h/",
            {'Token token="tok-123456"', 'token="tok-123456"', "tok-123456"},
        ),
        (
            [("Authorization", "Bearer tok-1234==")],
            "http://h/",
            {"Bearer tok-1234==", "tok-1234=="},
        ),
        # A custom scheme's list names its secrets as a query string would.
        (
            [("Authorization", 'ApiKey id="client-1", key="tok-123456"')],
            "http://h/",
            {'ApiKey id="client-1", key="tok-123456"', "tok-123456"},
        ),
        (
            [("Authorization", 'Hawk id="dh37fgj492je", ts="1353832234", mac="mac-123456"')],
            "http://h/",
            {'Hawk id="dh37fgj492je", ts="1353832234", mac="mac-123456"', "mac-123456"},
        ),
        (
            [("Authorization", "Bearer\ttok-123456")],
            "http://h/",
            {"Bearer\ttok-123456", "tok-123456"},
        ),
        (
            [("Authorization", "SharedKey account:sig-123456")],
            "http://h/",
            {"SharedKey account:sig-123456", "account:sig-123456", "sig-123456"},
        ),
    ],
)
def test_which_request_parts_are_credentials(
    headers: list[tuple[str, str]], url: str, expected: set[str] | None
) -> None:
    """The built-in names, in any case, cookies by value, userinfo decoded; others are not."""
    found = {s.reveal() for s in credentials_in(headers, url, CredentialNames())}
    if expected is None:  # each session cookie's value, not a short preference
        assert {"cookie-1234", "cookie-5678"} <= found
        assert "dark" not in found
    else:
        assert found == expected


def test_basic_credentials_are_decoded() -> None:
    """A Basic header yields the base64, the decoded user:password and the password."""
    value = base64.b64encode(b"alice:s3cret-pass").decode()
    found = credentials_in([("authorization", f"Basic {value}")], "http://h/", CredentialNames())
    assert {s.reveal() for s in found} == {
        f"Basic {value}",
        value,
        "alice:s3cret-pass",
        "s3cret-pass",
    }


def test_a_basic_credential_in_latin_1_is_decoded() -> None:
    """RFC 7617's legacy charset, as ``requests`` sends a password outside ASCII: it did not
    decode as UTF-8, and only the base64 was learned."""
    value = base64.b64encode("bob:pässwörd-1234".encode("latin-1")).decode()
    found = credentials_in([("authorization", f"Basic {value}")], "http://h/", CredentialNames())
    assert {"bob:pässwörd-1234", "pässwörd-1234"} <= {s.reveal() for s in found}


def test_a_basic_credential_that_is_not_base64_is_kept_whole() -> None:
    """A Basic value that does not decode is still a credential, as written; nothing more."""
    found = credentials_in([("authorization", "Basic not*base64!")], "http://h/", CredentialNames())
    assert {s.reveal() for s in found} == {"Basic not*base64!", "not*base64!"}


def test_credential_names_can_be_added_and_are_validated() -> None:
    """Added names join the defaults; a name that cannot be a header or parameter is refused."""
    names = CredentialNames.adding(headers=["X-Tenant-Secret"], params=["tenant_sig"])
    assert names.headers == CREDENTIAL_HEADERS | {"x-tenant-secret"}
    assert names.params == CREDENTIAL_PARAMS | {"tenant_sig"}
    for bad_headers, bad_params in [(["bad header"], ()), ([""], ()), ((), ["a b"]), ("x", ())]:
        with pytest.raises(fanout.ConfigurationError):
            CredentialNames.adding(headers=bad_headers, params=bad_params)
    with pytest.raises(fanout.ConfigurationError):
        fanout.FanoutTransport(secret_headers=["x\n"])


def test_registered_secrets_are_scrubbed_from_any_answer() -> None:
    """A key declared with register_secret is scrubbed though fanout never saw it sent."""
    secret = fanout.register_secret("db-password-0f9e8d")
    assert repr(secret) == "Secret('REDACTED')"
    assert scrub_secrets("connect failed: db-password-0f9e8d") == "connect failed: REDACTED"


@pytest.mark.redis
@pytest.mark.parametrize("placement", ["authorization", "query:api_key", "userinfo", "basic"])
def test_the_redis_store_holds_no_key(placement: str) -> None:
    """A write whose answer echoes the key is stored on Redis scrubbed, and replayed so."""
    key = "zQ-redis+store/key=0123"

    async def main(url: str) -> tuple[str, list[Any]]:
        prefix = unique_prefix()
        async with (
            serve_echo() as server,
            client_for(LIBRARIES["httpx2"], placement, key, server.url) as client,
            RedisIdempotencyStore.from_url(url, prefix=prefix) as store,
        ):
            reg = Registry()

            @reg.tool(kind=Kind.MUTATING)
            async def create(name: str) -> str:
                return str((await client.post("/echo/things", json={"name": name})).text)

            run = fanout.Run("redis-sweep", store=store)
            call = [ToolCall("w", "create", {"name": "a"})]
            turns = [await Runner(reg).run_turn(call, run=run) for _ in range(2)]
            stored = [await store.client.get(k) for k in await store.client.keys(prefix + "*")]
        assert len(server.seen) == 1  # the second turn was a replay
        return repr(stored), [*turns[0].results, *turns[1].results]

    with shared_redis_url() as url:
        stored, results = trio.run(main, url)
    assert "REDACTED" in stored
    everything = stored + repr(results)
    assert not [form for form in spellings(key) if form in everything]


# --- properties: generated keys, placements and hostile scope names -------------

placements = st.sampled_from(PLACEMENTS)


@settings(max_examples=200, deadline=None)
@given(key=keys, placement=placements, lib_name=st.sampled_from(sorted(LIBRARIES)))
def test_what_a_request_carries_is_learned_and_scrubbed_from_its_echo(
    key: str, placement: str, lib_name: str
) -> None:
    """A key in any placement, echoed whole, leaves no spelling of itself once scrubbed."""
    lib, sent = LIBRARIES[lib_name], []

    def handler(request: Any) -> Any:
        sent.append(request)
        return lib.module.Response(200)

    async def send() -> None:
        mock = lib.module.MockTransport(handler)
        async with client_for(lib, placement, key, "http://127.0.0.1:8080", mock) as client:
            await client.get("/echo/1")

    trio.run(send)
    (request,) = sent
    names = CredentialNames.adding([EXTRA_HEADER], [EXTRA_PARAM])
    learned = credentials_in(request.headers.items(), str(request.url), names)
    echo = server_view(str(request.url), list(request.headers.items()))
    assert any(form in echo for form in spellings(key))
    scrubbed = redact_text(echo + repr(request.url), [s.reveal() for s in learned])
    assert not [form for form in spellings(key) if form in scrubbed]


def server_view(url: str, headers: list[tuple[str, str]]) -> str:
    """Everything a server could quote of a request: the URL raw and decoded, its query
    values parsed, every header, and a Basic credential decoded."""
    decoded = [
        base64.b64decode(value.split(" ", 1)[1]).decode()
        for name, value in headers
        if name.lower() == "authorization" and value.startswith("Basic ")
    ]
    view = {
        "url": url,
        "decoded": unquote(url),
        "query": parse_qsl(urlsplit(url).query),
        "headers": headers,
        "basic": decoded,
    }
    return json.dumps(view) + repr(view)


scope_values = st.one_of(
    st.text(max_size=80),
    st.text(ALPHABET + ":", max_size=80),
    keys,
    st.tuples(st.sampled_from(["", "org/", "Bearer ", "key="]), keys).map("".join),
)


@given(key=keys, value=scope_values, header=st.sampled_from(SCOPE_HEADERS))
def test_a_server_named_scope_is_a_plain_name_and_never_a_key(
    key: str, value: str, header: str
) -> None:
    """A scope header becomes no scope, a plain name of at most 64, or REDACTED; never the key."""
    info = parse_rate_limit_headers({header: value, "x-api-key": key}, now=0.0)
    scope = server_scope(info.scope, [key])
    assert scope is None or scope == "REDACTED" or SCOPE_NAME.fullmatch(scope)
    assert scope is None or not [form for form in spellings(key) if form in scope]


@given(key=keys, filler=st.integers(0, 300), data=st.data())
def test_a_key_cut_in_two_by_a_size_cap_is_scrubbed(key: str, filler: int, data: Any) -> None:
    """Wherever a cap falls inside a key, what is left of it before the cut is replaced."""
    kept = data.draw(st.integers(MIN_LENGTH, len(key) - 1), label="characters of the key kept")
    text = " " * filler + key + " tail" * 20
    kept_text = " " * filler + key[:kept] + "\n"
    cut = next(c for c in (truncate(text, n) for n in range(len(text))) if c.startswith(kept_text))
    answer = fanout.ToolResult("c", fanout.Status.OK, cut)
    failed = failure(ToolCall("c", "t"), fanout.Status.ERROR, cut, started=True, kind=Kind.READS)
    for result in (answer, failed):
        assert key[:MIN_LENGTH] not in scrubbed(result, [key]).content


async def test_an_answer_capped_inside_a_key_keeps_no_part_of_it(autojump_clock: Any) -> None:
    """A tool whose output is cut mid-key by max_output_chars: the answer holds no part of it."""
    key = "zQ-cut-in-two-0123456789"
    async with (
        serve_echo() as server,
        client_for(LIBRARIES["httpx"], "x-api-key", key, server.url) as client,
    ):
        reg = Registry()

        output = "a" * 70 + key + "b" * 100
        assert key[:10] in truncate(output, 123)  # the cap falls inside the key

        @reg.tool(kind=Kind.READS)
        async def fetch() -> str:
            await client.get("/echo/1")
            return output

        turn = await Runner(reg, max_output_chars=123).run_turn([ToolCall("c", "fetch", {})])
    (result,) = turn.results
    assert "truncated by fanout" in result.content
    assert key[:MIN_LENGTH] not in result.content


async def test_an_sdk_client_on_the_httpx2_transport_is_charged_and_scrubbed() -> None:
    """The Anthropic SDK on fanout's client goes through fanout; its echoed key is scrubbed.

    Real time: the SDK reads its platform in a worker thread, which a mock clock
    would jump past.
    """
    anthropic = pytest.importorskip("anthropic")
    key = "sk-ant-sdk-0123456789abcdef"
    async with serve_echo() as server:
        client = anthropic.AsyncAnthropic(
            api_key=key, base_url=server.url, http_client=fanout.httpx2.http_client(), max_retries=0
        )
        reg = Registry()

        @reg.tool(kind=Kind.READS, scopes=["anthropic"])
        async def ask() -> str:
            raw = await client.messages.with_raw_response.create(
                model="m", max_tokens=1, messages=[{"role": "user", "content": "hi"}]
            )
            return str(raw.http_response.text)

        with trio.fail_after(10):
            turn = await Runner(reg).run_turn([ToolCall("a", "ask", {})])
    (result,) = turn.results
    assert result.status is fanout.Status.OK
    assert '"target": "/v1/messages"' in result.content
    assert [e.kind for e in turn.trace].count(fanout.EventKind.REQUEST_SENT) == 1
    assert key in repr(server.seen)
    assert key not in result.content + repr(turn.trace)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Bearer abcdefgh123", "Bearer REDACTED"),
        ("Authorization: Basic YWxpY2U6c2VjcmV0", "Authorization: Basic REDACTED"),
        ('["x-api-key", "abc123xyz"]', '["x-api-key", "REDACTED"]'),
        ('{"authorization": "Token zzz999"}', '{"authorization": "Token REDACTED"}'),
        ("{'X-Auth-Token': 'tok-1'}", "{'X-Auth-Token': 'REDACTED'}"),
        ("http://alice:pw@h/x?api_key=1&q=2", "http://REDACTED@h/x?api_key=REDACTED&q=2"),
        ("key sk-abcdefgh1234 here", "key REDACTED here"),
        ("callback#access_token=ya29.a0AfB_byC1 ok", "callback#access_token=REDACTED ok"),
        ("Credential=AKIA/x, Signature=9f8e7d6c5b4a", "Credential=AKIA/x, Signature=REDACTED"),
        # Prose that merely names a credential keeps its words.
        ("token verification failed", "token verification failed"),
        ("a basic understanding", "a basic understanding"),
        ("the api-key, which is set", "the api-key, which is set"),
        ("status code=404 for /x?q=key", "status code=404 for /x?q=key"),
        ("mail alice@example.com", "mail alice@example.com"),
        # Words that follow a credential's mark, and code: a token has a digit, or is long.
        ("Use bearer authentication", "Use bearer authentication"),
        ("self.pk_url_kwarg and sk-video-toolkit", "self.pk_url_kwarg and sk-video-toolkit"),
        ("key=value pairs", "key=value pairs"),
        # A link's or a call's closing bracket is not the value's.
        ("[map](https://m.test/embed?key=abc123)", "[map](https://m.test/embed?key=REDACTED)"),
        ("connect(db, api_key=*****)", "connect(db, api_key=REDACTED)"),
    ],
)
def test_credentials_by_shape_are_redacted_and_prose_is_not(text: str, expected: str) -> None:
    """Text shaped like a credential fanout never saw is redacted; ordinary words are kept."""
    assert redact_text(text) == expected


# --- credentials in places found since: nested JSON, cookies set, late keys, logs ---

_ESCAPED = st.text(ALPHABET + '\\"/', min_size=10, max_size=24).map(lambda tail: "zQ\\" + tail)


@given(key=_ESCAPED, depth=st.integers(1, 3))
def test_a_learned_secret_is_scrubbed_from_json_at_any_depth(key: str, depth: int) -> None:
    """A password holding a backslash or a quote, echoed in a server's JSON body that a
    tool returns inside its own JSON answer: each level doubles the escapes, and one
    level was all the spellings knew (the model decoded ``Tr0ub4dor\\&"3-horse`` back)."""
    text = key
    for level in range(depth):
        text = json.dumps({f"level{level}": text})
    scrubbed = scrub_secrets(text, [key])
    for _ in range(depth):
        scrubbed = next(iter(json.loads(scrubbed).values()))
    assert scrubbed == "REDACTED"


@pytest.mark.parametrize("lib_name", sorted(LIBRARIES))
async def test_a_session_cookie_the_server_sets_is_a_credential(
    lib_name: str, autojump_clock: Any
) -> None:
    """A tool that returns the cookies its login set (``dict(response.cookies)``, or the
    ``Set-Cookie`` line) showed the model the session; the cookie's attributes (an
    ``Expires`` date) are not secrets."""
    lib, session = LIBRARIES[lib_name], "sess-7f3a9c2e5b1d8f4a6c0e"
    expires = "Wed, 21 Oct 2026 07:28:00 GMT"

    def handler(request: Any) -> Any:
        cookie = f"session={session}; Path=/; Expires={expires}; HttpOnly"
        return lib.module.Response(200, headers=[("Set-Cookie", cookie), ("Set-Cookie", "t=1")])

    client = lib.mock(handler)
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def login() -> dict[str, Any]:
        response = await client.post("http://api.test/login")
        return {"cookies": dict(response.cookies), "line": response.headers["set-cookie"]}

    turn = await Runner(reg).run_turn([ToolCall("c", "login", {})])
    (result,) = turn.results
    assert result.status is fanout.Status.OK
    assert session not in result.content
    assert expires in result.content


async def test_a_progress_message_quoting_a_key_sent_later_is_scrubbed_in_the_trace(
    autojump_clock: Any,
) -> None:
    """A tool reports progress quoting its key, then sends it: the key is known only from
    then, and the trace, read after the turn, had it where the answer did not (with an
    instrument too, whose events are built as they happen)."""
    key = "tenantKey-5e6f7a8b9c0d1e2f"
    seen: list[fanout.Event] = []

    def handler(request: Any) -> Any:
        return LIBRARIES["httpx"].module.Response(200)

    client = LIBRARIES["httpx"].mock(handler)
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def sync_tenant() -> str:
        fanout.current_call().report_progress(0, 1, f"syncing with key {key}")
        await client.get("http://api.test/sync", headers={"X-Api-Key": key})
        return f"synced with key {key}"

    for instruments in ([], [_Collect(seen)]):
        runner = Runner(reg, instruments=instruments)
        turn = await runner.run_turn([ToolCall("c", "sync_tenant", {})])
        assert key not in turn.results[0].content
        (progress,) = [e for e in turn.trace if e.kind is fanout.EventKind.PROGRESS]
        assert progress.detail["message"] == "syncing with key REDACTED"


@attrs.define
class _Collect:
    """An instrument that keeps what it is handed."""

    events: list[fanout.Event]

    def on_event(self, event: fanout.Event) -> None:
        self.events.append(event)


def test_a_library_log_record_s_traceback_is_scrubbed() -> None:
    """The MCP client logs a failed stream with its traceback, whose error names the URL
    with ``?api_key=``: the message was scrubbed, the traceback written in clear."""
    from fanout._library_log import scrub_library_log

    key = "mcpq-6b1d9e3f7a2c5e8d"
    fanout.register_secret(key)
    logger = logging.getLogger("fanout-test.library-with-tracebacks")
    scrub_library_log(logger.name)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError(f"Client error '405' for url 'http://h/mcp?api_key={key}'")
        except RuntimeError:
            logger.error("GET stream error", exc_info=True, stack_info=True)
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert "GET stream error" in written
    assert "RuntimeError: Client error '405'" in written
    assert key not in written


@pytest.mark.parametrize("logger_name", ["fanout", "fanout.redis", "hpack.hpack", "hpack.table"])
async def test_fanouts_own_logs_and_http2_header_logs_are_scrubbed(logger_name: str) -> None:
    """A failed part's traceback, in fanout's own log, names what it was doing (an
    exporter's URL with its key, a store's DSN with a declared password), and HTTP/2's
    header table logs every header at DEBUG: each was written in clear."""
    key = "ownlog-5c8e1a7d3f9b2e6a"
    fanout.register_secret(key)
    fanout.FanoutTransport()  # a transport puts the filter on its libraries' loggers
    logger = logging.getLogger(logger_name)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        try:
            raise ConnectionError(f"could not write to postgres://app:{key}@db:5432/app")
        except ConnectionError as exc:
            log_failure(logger, "store %s failed", "pg", exc=exc)
        logger.warning("Adding %r to the header table", (b"x-api-key", key.encode()))
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert "store pg failed" in written
    assert "ConnectionError: could not write to postgres://" in written
    assert key not in written


def test_what_the_model_is_told_of_a_tool_holds_no_credential() -> None:
    """A signature's default (``api_key: str = KEY``) became the schema's ``"default"``,
    and a description (an MCP server's) may quote the session's token: every ``tools=``
    spelling went to the model with them."""
    key = "tooldef-9a7c5e3b1d8f6a4c"
    fanout.register_secret(key)
    reg = Registry()

    @reg.tool(kind=Kind.READS, description=f"Search as {key}.")
    async def search(q: str, api_key: str = key, hint: str = f"key {key}") -> str:
        return q

    told = [reg.anthropic_tools(), reg.openai_tools(), reg.responses_tools()]
    written = json.dumps(told)
    assert key not in written
    assert written.count("REDACTED") == 3 * 3  # a description and two defaults, thrice
    (definition,) = reg.definitions()
    assert list(definition.parameters["properties"]) == ["q", "api_key", "hint"]


def test_a_duplicate_call_id_holding_a_key_is_not_quoted_in_the_error() -> None:
    """The model's call id is quoted in `InvalidTurnError`; a key-shaped one was whole."""
    call_id = "sk-proj-Ab3dEf6hIj9kLm2nOp5q"
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def noop() -> str:
        return "ok"

    calls = [ToolCall(call_id, "noop", {}), ToolCall(call_id, "noop", {})]
    with pytest.raises(fanout.InvalidTurnError) as raised:
        trio.run(Runner(reg).run_turn, calls)
    assert "two calls share the id" in str(raised.value)
    assert call_id not in str(raised.value)


_PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=8, max_size=24)


@settings(max_examples=300)
@given(
    key=_PRINTABLE.map(lambda tail: "zQ" + tail),
    spelled=st.lists(st.sampled_from(["raw", "percent", "unicode", "json"]), min_size=1),
    depth=st.integers(0, 2),
    noise=st.text(st.sampled_from('ab%\\u0041"/+ \n'), max_size=12),
)
def test_a_secret_spelled_any_way_is_found_however_the_text_around_it_is_escaped(
    key: str, spelled: list[str], depth: int, noise: str
) -> None:
    """Each character raw, percent-encoded, a ``\\uXXXX`` escape or JSON-escaped, the whole
    written into JSON ``depth`` times, with escapes around it: replaced. (Only the
    patterns whose secret the decoded text can hold are run; with 256 secrets known, a
    1 MB answer holding a backslash took each of them, twice: 16 s for five answers.)"""
    forms = {
        "raw": lambda c: c, "percent": lambda c: f"%{ord(c):02X}",
        "unicode": lambda c: f"\\u{ord(c):04x}", "json": lambda c: json.dumps(c)[1:-1],
    }  # fmt: skip
    text = "".join(forms[spelled[i % len(spelled)]](c) for i, c in enumerate(key))
    text = noise + text + noise
    for _ in range(depth):
        text = json.dumps({"body": text})
    scrubbed = scrub_secrets(text, [key])
    for _ in range(depth):
        scrubbed = json.loads(scrubbed)["body"]
    assert "REDACTED" in scrubbed
    assert key not in scrubbed


def test_a_basic_login_with_a_short_password_does_not_teach_its_user() -> None:
    """With a password, however short, the user is a name, not the key: learned, a support
    address was taken out of every later answer of the process."""
    value = base64.b64encode(b"support@example.com:hunter2").decode()
    found = {
        s.reveal()
        for s in credentials_in(
            [("authorization", f"Basic {value}")], "http://h/", CredentialNames()
        )
    }
    assert "support@example.com" not in found
    assert "support@example.com:hunter2" in found
    keyed = base64.b64encode(b"sk_live_0123456789abcdef:").decode()  # the key as user
    found = {
        s.reveal()
        for s in credentials_in(
            [("authorization", f"Basic {keyed}")], "http://h/", CredentialNames()
        )
    }
    assert "sk_live_0123456789abcdef" in found


def test_a_digest_parameter_list_with_a_comma_in_a_quoted_value_is_read_as_one() -> None:
    """A Digest ``uri`` with a comma in it: its ``response`` hash is learned bare, and its
    other parameters not at all. (Split on the comma, the list was no list: every part
    was learned whole, ``qop=auth`` and ``algorithm=MD5`` taken out of later answers.)"""
    digest = (
        'Digest username="bob", realm="api", nonce="abc123", uri="/search?q=a,b", '
        'response="6629fae49393a05397450978507c4ef1", qop=auth, nc=00000001, '
        'cnonce="0a4f113b", algorithm=MD5'
    )
    found = {
        s.reveal()
        for s in credentials_in([("authorization", digest)], "http://h/", CredentialNames())
    }
    assert "6629fae49393a05397450978507c4ef1" in found
    assert not {"qop=auth", "algorithm=MD5", "nc=00000001", "auth", "MD5"} & found
    assert not any(value.startswith(("qop", "algorithm", "realm", 'uri="')) for value in found)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("git clone ssh://git@github.com/python-trio/trio.git", True),
        ("postgres://postgres@localhost:5432/app", True),
        ("ftp://anonymous@ftp.example.org/pub", True),
        ("https://alice:s3cret-pass@example.com/x", False),
        ("https://ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r", False),
    ],
)
def test_userinfo_is_a_credential_with_a_password_or_a_token_as_user(text: str, kept: bool) -> None:
    """A user name alone is no credential (``git@``, ``postgres@`` were redacted); a
    password, or a token standing as the user, is."""
    assert (redact_text(text) == text) is kept


@pytest.mark.parametrize("how", ["argument", "environment"])
@pytest.mark.parametrize("library", ["httpx", "httpx2"])
def test_a_request_through_a_proxy_is_charged_and_its_key_learned(
    library: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``http_client(proxy=...)``: httpx mounts a proxy transport of its own for every URL,
    and took each request past fanout's (no event, no key learned: a key the server
    quoted reached the model). The proxy's own password goes as ``Proxy-Authorization``,
    which httpcore adds below fanout's transport: a 407 quoting it reached the model.
    The environment's proxy (``HTTP_PROXY``) was not used at all. The echo server stands
    in for the proxy."""
    key = "k-proxy-7f3a9c2e5b1d"
    password = "proxy-pw-5e9c1a7b3d"
    module = fanout if library == "httpx" else fanout.httpx2

    async def main() -> fanout.Turn:
        async with serve_echo() as proxy:
            url = proxy.url.replace("http://", f"http://alice:{password}@")
            if how == "argument":
                client = module.http_client(proxy=url, headers={"X-Api-Key": key})
            else:
                for name in ("ALL_PROXY", "HTTPS_PROXY", "NO_PROXY", "all_proxy", "no_proxy"):
                    monkeypatch.delenv(name, raising=False)
                monkeypatch.setenv("HTTP_PROXY", url)
                client = module.http_client(headers={"X-Api-Key": key})
            reg = Registry()

            @reg.tool(kind=Kind.READS)
            async def lookup() -> str:
                response = await client.get("http://api.example.test/items")
                sent = dict(response.json()["headers"])["proxy-authorization"].split()[-1]
                # As a proxy's 407 says it: "credentials alice:<password> rejected".
                return f"{response.text} {base64.b64decode(sent).decode()}"

            turn = await Runner(reg).run_turn([ToolCall("c1", "lookup", {})])
            await client.aclose()
            (seen,) = proxy.seen
            assert ("proxy-authorization", f"Basic {basic}") in seen.headers
        return turn

    basic = base64.b64encode(f"alice:{password}".encode()).decode()
    turn = trio.run(main)
    assert turn.results[0].status is Status.OK
    assert key not in turn.results[0].content
    assert basic not in turn.results[0].content
    assert password not in turn.results[0].content
    assert [e for e in turn.trace if e.kind is fanout.EventKind.REQUEST_SENT]


@pytest.mark.parametrize("library", ["httpx", "httpx2"])
def test_the_clients_transport_options_reach_fanouts_pools(library: str) -> None:
    """``http_client(verify=False)``: httpx gives its options to a transport it builds
    itself, and handed fanout's, it dropped them: the pools verified anyway."""
    module = fanout if library == "httpx" else fanout.httpx2
    client = module.http_client(verify=False)
    pools = client._transport._core._transports  # type: ignore[attr-defined]
    assert [pool._pool._ssl_context.verify_mode for pool in pools] == [ssl.CERT_NONE] * 4


def test_a_part_cut_inside_a_key_with_a_quote_in_it_shows_no_head_of_it() -> None:
    """A text block capped inside a key holding ``"`` and ``\\``: in the blocks' JSON the
    key is escaped, and its head, read only as written, was left whole but its last
    character."""
    key = 'pa"ss\\word-db72d4f7347c'

    def handler(request: Any) -> Any:
        return httpx.Response(200, text="x" * 135 + request.headers["x-api-key"] + " tail" * 60)

    async def main() -> fanout.Turn:
        client = LIBRARIES["httpx"].client(httpx.MockTransport(handler), headers={"X-Api-Key": key})
        reg = Registry()

        @reg.tool(kind=Kind.READS)
        async def fetch() -> list[fanout.Text]:
            return [fanout.Text((await client.get("http://api.test/x")).text)]

        return await Runner(reg, max_output_chars=200).run_turn([ToolCall("c1", "fetch", {})])

    turn = trio.run(main)
    shown = turn.results[0].parts[0].text  # type: ignore[union-attr]
    assert not any(key[:k] in shown for k in range(MIN_LENGTH, len(key) + 1))


def test_a_key_sent_as_the_basic_user_beside_a_dummy_password_is_learned() -> None:
    """Freshdesk and BambooHR take the key as the Basic user and "X" as the password: the
    user reads as a key, and is learned (a 401 quoting it reached the model)."""
    value = base64.b64encode(b"aBcD3fGh1JkLmN0pQrSt:X").decode()
    found = credentials_in([("authorization", f"Basic {value}")], "http://h/", CredentialNames())
    assert "aBcD3fGh1JkLmN0pQrSt" in {s.reveal() for s in found}


def _basic_learned(user: str, password: str) -> set[str]:
    """What fanout learns of a Basic login ``user:password``."""
    value = base64.b64encode(f"{user}:{password}".encode()).decode()
    header = [("authorization", f"Basic {value}")]
    return {s.reveal() for s in credentials_in(header, "http://h/", CredentialNames())}


@given(
    user=st.one_of(
        st.text(ALPHABET, min_size=1, max_size=40),
        st.sampled_from(["svc-reporting-2024", "etl-2024-nightly-runner", "support@example.com"]),
    ),
    password=st.text(ALPHABET + ":@ ", min_size=MIN_LENGTH, max_size=40),
)
def test_a_basic_user_beside_a_real_password_is_a_name_however_it_reads(
    user: str, password: str
) -> None:
    """Beside a password long enough to be one, the Basic user is a name and is not
    learned, even one that reads as a key (``svc-reporting-2024``: learned, it was taken
    out of every later answer); the password and the pair are."""
    assume(password not in (user, "api_token"))
    learned = _basic_learned(user, password)
    assert user not in learned
    assert {password, f"{user}:{password}"} <= learned


def test_a_key_sent_as_the_basic_user_beside_a_conventional_word_is_learned_alone() -> None:
    """Toggl takes the token as the Basic user and the word ``api_token`` as the password:
    the token is learned, the word is not (learned, it was taken out of every answer)."""
    token = "1971800d4d82861d8f2c1651fea4d212"
    learned = _basic_learned(token, "api_token")
    assert token in learned
    assert "api_token" not in learned


@pytest.mark.parametrize(
    ("headers", "url", "expected"),
    [
        (
            [], "https://s.test/o?X-Goog-Signature=ab12cd34ef56&X-Goog-Credential=svc%2F2024",
            {"ab12cd34ef56", "svc/2024"},
        ),
        (
            [("PRIVATE-TOKEN", "glpat-0123456789ab")], "https://gitlab.test/api",
            {"glpat-0123456789ab"},
        ),
        ([], "https://api.test/w?appid=0123456789abcdef&q=Oslo", {"0123456789abcdef"}),
    ],
)  # fmt: skip
def test_more_vendors_credentials_are_learned(
    headers: list[tuple[str, str]], url: str, expected: set[str]
) -> None:
    """Google's signed URLs, GitLab's token header, OpenWeatherMap's ``appid``."""
    assert expected <= {s.reveal() for s in credentials_in(headers, url, CredentialNames())}


def test_names_given_wrong_are_refused_without_quoting_them() -> None:
    """``secret_headers=headers.items()`` hands pairs: refused, saying what is wrong, and
    quoting no key (the message quoted each pair)."""
    with pytest.raises(ConfigurationError) as refused:
        fanout.http_client(secret_headers=[("X-Api-Key", "sk-live-0123456789")])  # type: ignore[list-item]
    assert "0123456789" not in str(refused.value)


def test_a_request_sent_outside_any_call_still_teaches_its_key() -> None:
    """A worker task the tools hand their requests to sends outside any call: the key it
    carries is learned all the same, and an answer quoting it is scrubbed."""
    key = "k-outside-7f3a9c2e5b1d"
    client = LIBRARIES["httpx"].mock(lambda request: httpx.Response(200, text="ok"))

    async def main() -> str:
        await client.get("http://api.test/x", headers={"X-Api-Key": key})
        reg = Registry()

        @reg.tool(kind=Kind.PURE)
        async def quote() -> str:
            return f"the key was {key}"

        turn = await Runner(reg).run_turn([ToolCall("c1", "quote", {})])
        return turn.results[0].content

    assert key not in trio.run(main)


async def test_a_request_s_url_in_the_trace_is_scrubbed_of_a_key_learned_later() -> None:
    """Call 1 puts a key in a URL's path; call 2 then sends it as a header: read after, the
    trace's request URL of call 1 is scrubbed too (only messages were)."""
    key = "k-path-9d8c7b6a5f4e3d2c"
    client = LIBRARIES["httpx"].mock(lambda request: httpx.Response(200, text="ok"))
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def info() -> str:
        await client.get(f"http://api.test/v1/tokens/{key}/info")
        return "fine"

    @reg.tool(kind=Kind.READS)
    async def use() -> str:
        await client.get("http://api.test/v1/me", headers={"Authorization": f"Bearer {key}"})
        return "fine"

    runner = Runner(reg)
    first = await runner.run_turn([ToolCall("c1", "info", {})])
    await runner.run_turn([ToolCall("c2", "use", {})])
    assert key not in repr(first.trace)


def test_a_scope_named_with_its_key_shows_it_nowhere_once_sent() -> None:
    """Named *with* the key it limits (the README's own example did): once the key is sent,
    the trace's events and the runner's statistics read ``REDACTED`` for the scope."""
    key = "scopekey-7c1e9a3f5b2d"

    def handler(request: Any) -> Any:
        return httpx.Response(200, text="ok")

    async def main() -> tuple[fanout.RunnerStatistics, fanout.Turn]:
        client = LIBRARIES["httpx"].client(httpx.MockTransport(handler), headers={"x-api-key": key})
        reg = Registry()

        @reg.tool(kind=Kind.READS, scopes=[key])
        async def fetch() -> str:
            return str((await client.get("http://api.test/x")).text)

        runner = Runner(reg)
        turn = await runner.run_turn([ToolCall("c1", "fetch", {})])
        return runner.statistics(), turn

    statistics, turn = trio.run(main)
    assert turn.results[0].status is Status.OK
    assert key not in repr(turn.trace)
    assert key not in repr(statistics)
    assert [s.name for s in statistics.scopes] == ["REDACTED"]


FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize(
    ("content_type", "body", "expected"),
    [
        # An OAuth token endpoint's form: the refresh token and the client's secret.
        (
            FORM,
            "grant_type=refresh_token&refresh_token=rt-4f9a2c7e&client_secret=cs%2B9d1e7b3a"
            "&client_id=app-12345678",
            {"rt-4f9a2c7e", "cs+9d1e7b3a"},
        ),
        # A JSON login, its type's parameters and a vendor's type said too.
        (
            "application/json; charset=utf-8",
            '{"username": "bob-the-user", "password": "s3cr3t-Value-123"}',
            {"s3cr3t-Value-123"},
        ),
        (
            "application/vnd.api+json",
            '{"data": [{"attributes": {"clientSecret": "cs-7e1d3b9a"}}]}',
            {"cs-7e1d3b9a"},
        ),
        # Nested (Keystone's ``auth``), and any spelling of a name: ``apiKey``, ``API-KEY``.
        (
            "application/json",
            '{"auth": {"identity": {"password": {"user": {"name": "bob-the-user",'
            ' "password": "pw-0a8c6e4f"}}}}, "apiKey": "ak-2b4d6f8a", "API-KEY": "ak-1c3e5a7b"}',
            {"pw-0a8c6e4f", "ak-2b4d6f8a", "ak-1c3e5a7b"},
        ),
        # Each text of a list under such a name; a field ending in a password's name.
        (
            "application/json",
            '{"tokens": ["t-1"], "token": ["tok-8a6c4e2f", 12345], "newPassword": "new-5e3c1a9b"}',
            {"tok-8a6c4e2f", "new-5e3c1a9b"},
        ),
        # No type said: JSON if it opens as JSON, else a form.
        ("", '{"password": "pw-6d4b2f0e"}', {"pw-6d4b2f0e"}),
        ("", "password=pw-9b7d5f3a", {"pw-9b7d5f3a"}),
        # Not secrets: too short to scrub, a number, a boolean, null, digits shorter than
        # a number's longest, an unset value's placeholder; data under ``key``, a cursor
        # under ``nextToken`` (in JSON); a body of another type.
        (
            "application/json",
            '{"password": "x", "secret": 123456789012, "token": true, "auth": null,'
            ' "passwd": "12345678", "api_key": "undefined", "key": "reports/q3-2024.pdf",'
            ' "nextToken": "cursor-0a1b2c3d"}',
            set(),
        ),
        ("text/plain", "password=pw-9b7d5f3a", set()),
        ("application/json", '{"password": "pw-unclosed-1', set()),
        # A form's ``key`` is a query's: a credential.
        (FORM, "key=AIzaSyD-4f2a9c", {"AIzaSyD-4f2a9c"}),
    ],
)
def test_a_body_s_credential_fields_are_learned(
    content_type: str, body: str, expected: set[str]
) -> None:
    """A form's or a JSON body's fields named as credentials (a query parameter's name, in
    any case or spelling), at any depth; text values long enough to scrub, no others."""
    headers = [("Content-Type", content_type)] if content_type else []
    found = credentials_in(headers, "http://h/", CredentialNames(), body.encode())
    assert {s.reveal() for s in found} == expected


def test_a_body_field_a_transport_was_told_of_is_learned_in_any_spelling() -> None:
    """``secret_params=["tenant_sig"]`` names a body's ``tenantSig`` too."""
    names = CredentialNames.adding(params=["tenant_sig"])
    body = b'{"tenantSig": "ts-3a5c7e9b", "tenant": "acme-corp-1"}'
    found = credentials_in([("content-type", "application/json")], "http://h/", names, body)
    assert {s.reveal() for s in found} == {"ts-3a5c7e9b"}


def test_a_body_past_the_limit_is_not_parsed() -> None:
    """A body longer than `BODY_LIMIT` (an upload) is not parsed for credentials."""
    padding = "a" * BODY_LIMIT
    body = json.dumps({"password": "pw-7c5a3e1d", "file": padding}).encode()
    assert (
        credentials_in([("content-type", "application/json")], "http://h/", CredentialNames(), body)
        == set()
    )


@pytest.mark.parametrize("lib_name", sorted(LIBRARIES))
def test_a_streamed_body_reaches_the_server_whole_and_unread(lib_name: str) -> None:
    """A body sent from an iterator is not read for credentials: it reaches the server
    whole (reading it would have consumed it), and a body held whole is read."""
    lib = LIBRARIES[lib_name]
    received: list[bytes] = []

    async def handler(request: Any) -> Any:
        received.append(await request.aread())
        return lib.module.Response(200, text="ok")

    async def chunks() -> Any:
        yield b'{"password": '
        yield b'"pw-streamed-4e2c"}'

    async def main() -> str:
        client = lib.mock(handler)
        reg = Registry()

        @reg.tool(kind=Kind.READS)
        async def send() -> str:
            headers = {"content-type": "application/json"}
            await client.post("http://api.test/s", content=chunks(), headers=headers)
            await client.post("http://api.test/w", json={"password": "pw-whole-8d6b"})
            return "sent pw-whole-8d6b"

        turn = await Runner(reg).run_turn([ToolCall("c1", "send", {})])
        return turn.results[0].content

    assert "pw-whole-8d6b" not in trio.run(main)
    assert received[0] == b'{"password": "pw-streamed-4e2c"}'
