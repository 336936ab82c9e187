"""Promise 2 under attack: no credential leaks, whatever its shape and wherever it travels.

`tests/test_credentials.py` sweeps keys made of an API key's alphabet. Here
the secrets are hostile: four characters or sixty, Unicode, regular
expression metacharacters, quotes and backslashes, text that already looks
percent-encoded or base64, and they go everywhere fanout can carry them:
tool output (raw, nested in JSON), exception messages, every credential
header and query parameter, URL userinfo, Basic auth, a 429 whose bucket
the server names after the key, a replayed write on Redis. Each test then
looks for the secret, in every spelling a reader could decode, in all that
fanout writes (`tests.adversarial_credentials_support.Net`).

Each leak found is pinned by a small deterministic repro below, named for
what now holds; each failed before its fix.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import logging
import string
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

import fanout
from fanout import Kind, Registry, Runner, Scope, ToolCall
from fanout._credentials import CREDENTIAL_PARAMS
from fanout._redis_client import client_from_url
from fanout._secrets import MIN_LENGTH
from fanout.contrib.prometheus import PrometheusInstrument
from fanout.redis import RedisIdempotencyStore, RedisScope

from .adversarial_credentials_support import (
    Net,
    basic_of,
    leaks,
    library_logs,
    serve_body_quoting,
    serve_quoting,
    spellings,
)
from .echo_server import serve_echo
from .redis_support import shared_redis_url, unique_prefix
from .test_http import LIBRARIES

USER = "alice"
# No shrinking: each example is a loopback server and two turns, and shrinking one
# failure took five minutes. The failing example is printed as found.
SETTINGS = settings(
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)


def mock_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only once the loopback server has had a real moment to answer."""
    return trio.testing.MockClock(autojump_threshold=0.05)


# --- secrets of many shapes ------------------------------------------------------

# Characters that never occur in what fanout writes around a secret by themselves
# (no digits: ports and timestamps; no ASCII letters: words), for secrets as short as
# fanout scrubs (`MIN_LENGTH`) that could not otherwise be told from the text beside them.
RARE = "(.*+?[]{}|^$\\€☃ßøΩж中🙂"
# Printable ASCII but the space: what a header value can carry.
HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F))
# No control characters or spaces of any kind: a URL cannot carry them raw.
unicode_text = st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"))

short_rare = st.text(RARE, min_size=MIN_LENGTH, max_size=MIN_LENGTH + 3)
long_any = st.text(unicode_text, min_size=12, max_size=60)
base64_of_bytes = st.binary(min_size=9, max_size=40).map(lambda b: base64.b64encode(b).decode())
already_encoded = st.text(string.ascii_letters, min_size=6, max_size=20).map(
    lambda t: quote(t + "/+=&?é", safe="")
)
regex_heavy = st.text(string.ascii_letters + r"\^$.|?*+()[]{}", min_size=12, max_size=40)

any_secret = st.one_of(short_rare, long_any, base64_of_bytes, already_encoded, regex_heavy)
header_secret = st.one_of(
    st.text(HEADER_SAFE, min_size=12, max_size=60),
    base64_of_bytes,
    already_encoded,
    regex_heavy,
)


def plausible(secret: str, baseline: str) -> bool:
    """A secret no spelling of which is already in what fanout writes without it."""
    # Four distinct characters at least: "000000000000" is in any float fanout prints.
    varied = len(set(secret)) >= 4 and not secret.isdigit()
    return varied and not leaks(secret, baseline) and "REDACTED" not in secret


# --- registered secrets through answers, errors and every instrument ---------------


def secret_tools(secret: str) -> Registry:
    """Tools that put ``secret`` in each place an answer comes from."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, cache_ttl=60)
    async def say() -> str:
        return f"before {secret} after"

    @reg.tool(kind=Kind.READS)
    async def nested() -> dict[str, Any]:
        return {"deep": [{"token": secret, "why": f"quoted: {secret}"}]}

    @reg.tool(kind=Kind.READS)
    async def fail() -> str:
        raise ValueError(f"the upstream refused {secret}")

    @reg.tool(kind=Kind.READS)
    async def fail_with_args() -> str:
        raise KeyError(secret, {"header": secret})

    @reg.tool(kind=Kind.READS)
    async def report() -> str:
        fanout.current_call().report_progress(1, 2, message=f"using {secret}")
        return "ok"

    @reg.tool(kind=Kind.MUTATING, invalidates=[])
    async def write(name: str) -> dict[str, str]:
        return {"created": name, "with": secret}

    return reg


SECRET_CALLS = [
    ToolCall("s1", "say", {}),
    ToolCall("s2", "say", {}),
    ToolCall("n", "nested", {}),
    ToolCall("f", "fail", {}),
    ToolCall("k", "fail_with_args", {}),
    ToolCall("p", "report", {}),
    ToolCall("w", "write", {"name": "a"}),
]
SECOND_CALLS = [ToolCall("s3", "say", {}), ToolCall("w2", "write", {"name": "a"})]


async def run_secret_tools(secret: str) -> str:
    """Two turns of one run whose tools quote ``secret``; everything written, as text."""
    net = Net()
    runner = Runner(secret_tools(secret), instruments=net.instruments)
    run = fanout.Run("adversarial")
    for calls in (SECRET_CALLS, SECOND_CALLS):
        net.add_turn(await runner.run_turn(calls, run=run))
    net.add(runner.statistics(), repr(runner))
    await net.add_run(run, [*SECRET_CALLS, *SECOND_CALLS])
    return net.text()


@functools.cache
def secret_tools_baseline() -> str:
    return trio.run(run_secret_tools, "PLACEHOLDER-NOT-SECRET", clock=mock_clock())


@SETTINGS
@given(secret=any_secret)
def test_a_registered_secret_of_any_shape_reaches_no_answer_record_or_store(secret: str) -> None:
    """A declared key is scrubbed from fresh, coalesced, cached and replayed answers, error
    messages, progress, the trace and every instrument, in all of its spellings."""
    assume(plausible(secret, secret_tools_baseline()))
    fanout.register_secret(secret)
    text = trio.run(run_secret_tools, secret, clock=mock_clock())
    assert "REDACTED" in text  # the secret went through, and was replaced
    assert leaks(secret, text) == []


# --- credentials in every part of a request, against a server that echoes them -------

HEADER_PLACEMENTS = ("authorization", "proxy-authorization", "x-api-key", "api-key", "x-tenant")
QUERY_PLACEMENTS = ("query:api_key", "query:sig", "query:tenant_sig")
URL_PLACEMENTS = ("userinfo", "basic")


def client_for(placement: str, secret: str, url: str) -> httpx.AsyncClient:
    """An httpx client on fanout's transport carrying ``secret`` in ``placement``."""
    options: dict[str, Any] = {"base_url": url}
    if placement == "authorization":
        options["headers"] = {"authorization": f"Bearer {secret}"}
    elif placement.startswith("query:"):
        options["params"] = {placement.removeprefix("query:"): secret}
    elif placement == "userinfo":
        options["base_url"] = url.replace("http://", f"http://{USER}:{quote(secret, safe='')}@")
    elif placement == "basic":
        options["auth"] = (USER, secret)
    else:
        options["headers"] = {placement: secret}
    transport = fanout.FanoutTransport(secret_headers=["x-tenant"], secret_params=["tenant_sig"])
    return httpx.AsyncClient(transport=transport, **options)


def request_tools(client: httpx.AsyncClient, secret: str) -> Registry:
    """Tools that send the credential and hand back what the server said of it."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["api"], cache_ttl=60)
    async def echo(n: int) -> str:
        return (await client.get(f"/echo/{n}")).text

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def parsed() -> Any:
        return (await client.get("/echo/parsed")).json()

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def throttled() -> str:
        return (await client.get("/throttle/1")).text

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def strict() -> str:
        (await client.get("/status/404")).raise_for_status()
        return "unreachable"

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def explode() -> str:
        response = await client.get("/echo/explode")
        raise RuntimeError(f"refused {secret}: {response.text}")

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def broken() -> str:
        response = await client.get("/status/503")
        return response.text

    @reg.tool(kind=Kind.MUTATING, scopes=["api"], invalidates=[])
    async def create(name: str) -> Any:
        return (await client.post("/echo/things", json={"name": name, "key": secret})).json()

    return reg


REQUEST_CALLS = [
    ToolCall("e1", "echo", {"n": 1}),
    ToolCall("e2", "echo", {"n": 1}),
    ToolCall("p", "parsed", {}),
    ToolCall("t", "throttled", {}),
    ToolCall("s", "strict", {}),
    ToolCall("x", "explode", {}),
    ToolCall("b", "broken", {}),
    ToolCall("w", "create", {"name": "a"}),
]
REQUEST_AGAIN = [ToolCall("e3", "echo", {"n": 1}), ToolCall("w2", "create", {"name": "a"})]


async def run_request_tools(placement: str, secret: str) -> tuple[str, int]:
    """Two turns whose tools send ``secret`` in ``placement`` to the echo server (which names
    a 429's bucket after the credential); everything written, and requests seen."""
    net = Net()
    with library_logs(net):
        async with (
            serve_echo(scope_of=lambda seen: header_safe(secret)) as server,
            client_for(placement, secret, server.url) as client,
        ):
            scope = Scope("api", rate=1000, burst=1000)
            runner = Runner(
                request_tools(client, secret), scopes=[scope], instruments=net.instruments
            )
            net.metrics.observe_scopes(runner)
            run = fanout.Run("adversarial-http")
            for calls in (REQUEST_CALLS, REQUEST_AGAIN):
                net.add_turn(await runner.run_turn(calls, run=run))
            net.add(runner.statistics(), scope.statistics(), repr(client._transport), scope)
            await net.add_run(run, [*REQUEST_CALLS, *REQUEST_AGAIN])
    return net.text(), len(server.seen)


def header_safe(secret: str) -> str | None:
    """The secret as a server would name its bucket in a header: only if ASCII can carry it."""
    return secret if secret.isascii() and secret.isprintable() else None


@functools.cache
def request_baseline(placement: str) -> str:
    return trio.run(run_request_tools, placement, "PLACEHOLDER-NOT-SECRET", clock=mock_clock())[0]


def extra_forms(placement: str, secret: str) -> list[str]:
    """What a Basic credential adds to a key's spellings: its base64."""
    return [basic_of(USER, secret)] if placement in URL_PLACEMENTS else []


@SETTINGS
@given(placement=st.sampled_from(HEADER_PLACEMENTS), secret=header_secret)
def test_a_header_credential_of_any_shape_is_scrubbed_from_everything(
    placement: str, secret: str
) -> None:
    """Any credential header (or Bearer token), regex metacharacters, quotes, backslashes and
    percent signs included, echoed whole in bodies, URLs, errors and a 429's scope name."""
    assume(plausible(secret, request_baseline(placement)))
    text, requests = trio.run(run_request_tools, placement, secret, clock=mock_clock())
    assert requests >= 8
    assert leaks(secret, text) == []


# Query values and passwords may be any Unicode (percent-encoded on the wire); a space,
# sent as "+", has a repro of its own below.
query_secret = st.one_of(long_any, base64_of_bytes, already_encoded, regex_heavy)


@SETTINGS
@given(placement=st.sampled_from(QUERY_PLACEMENTS + URL_PLACEMENTS), secret=query_secret)
def test_a_query_or_userinfo_credential_of_any_shape_is_scrubbed_from_everything(
    placement: str, secret: str
) -> None:
    """A credential query parameter, userinfo password or Basic password, in any script,
    percent-encoded by the library, is scrubbed from answers, trace, instruments and the
    HTTP library's own log."""
    assume(plausible(secret, request_baseline(placement)))
    text, _ = trio.run(run_request_tools, placement, secret, clock=mock_clock())
    assert leaks(secret, text, also=extra_forms(placement, secret)) == []


# --- a server that parses the request and quotes the parts ---------------------------


async def quoted_answer(path: str = "/quote", **options: Any) -> tuple[str, str]:
    """One call whose tool returns what the quoting server said of its request; the answer
    and the HTTP library's log."""
    net = Net()
    with library_logs(net):
        async with serve_quoting() as server:
            secret_params = options.pop("secret_params", ())
            transport = fanout.FanoutTransport(secret_params=secret_params)
            url = options.pop("base_url", server.url)
            if "{server}" in url:
                url = url.format(server=server.url.removeprefix("http://"))
            async with httpx.AsyncClient(transport=transport, base_url=url, **options) as client:
                reg = Registry()

                @reg.tool(kind=Kind.READS)
                async def whoami() -> str:
                    return (await client.get(path)).text

                turn = await Runner(reg, instruments=net.instruments).run_turn(
                    [ToolCall("c", "whoami", {})]
                )
                net.add_turn(turn)
    return turn.results[0].content, net.text()


@SETTINGS
@given(secret=header_secret, scheme=st.sampled_from(["Bearer", "bearer", "Token", "Basic"]))
def test_a_token_quoted_without_its_scheme_is_scrubbed(secret: str, scheme: str) -> None:
    """A server that answers "invalid token <token>" (the scheme dropped, a Basic
    credential's user and password quoted apart) still leaks nothing, for the schemes
    fanout lists."""
    value = basic_of(USER, secret) if scheme == "Basic" else secret
    assume(plausible(secret, "PLACEHOLDER REDACTED") and secret != USER)
    content, text = trio.run(
        functools.partial(quoted_answer, headers={"authorization": f"{scheme} {value}"}),
        clock=mock_clock(),
    )
    assert "REDACTED" in content
    assert leaks(secret, text) == []


# --- credentials in a request's body, quoted back by the server -----------------------

# Field names that carry a credential in a body: every query parameter fanout knows (but
# ``key``, data in JSON), one a transport was told of, and names ending in a password's or
# a secret's (a change of password sends the new one as ``newPassword``).
BODY_FIELDS = sorted(CREDENTIAL_PARAMS - {"key"} | {"tenant_sig", "new_password", "webhook_secret"})
# Where a JSON body's credential sits: wrapped in objects (an ``auth`` block, a GraphQL
# request's ``variables``) and lists, outermost first.
WRAPPERS = st.lists(
    st.one_of(st.sampled_from(["data", "auth", "credentials", "variables"]), st.just(None)),
    max_size=3,
)
BODY_SHAPES = ("form", "json", "json-undeclared")
# The server quotes the body raw, in an error's text, or in an error's JSON; a tool hands
# that back as it came, inside its own JSON (escaped again), or in an exception.
ECHOES = ("/raw", "/message", "/json")
HANDED_BACK = ("text", "wrapped", "raised")
body_secret = st.one_of(
    long_any, base64_of_bytes, already_encoded, regex_heavy, st.text(HEADER_SAFE + " ", min_size=12)
)


def spelled(field: str, style: str) -> str:
    """``field`` (snake_case or kebab-case) in a spelling of ``style``, as a JSON API names
    its fields (``clientSecret``, ``ClientSecret``, ``CLIENT_SECRET``, ``client-secret``)."""
    words = field.replace("-", "_").split("_")
    return {
        "as-is": field,
        "camel": words[0] + "".join(word.title() for word in words[1:]),
        "pascal": "".join(word.title() for word in words),
        "upper": "_".join(words).upper(),
        "kebab": "-".join(words),
    }[style]


def body_options(shape: str, field: str, secret: str, wrappers: list[str | None]) -> dict[str, Any]:
    """What ``client.post`` takes to send ``secret`` under ``field`` in a body of ``shape``,
    beside fields that are no credential."""
    fields = {"username": "bob", "grant_type": "refresh_token", field: secret}
    if shape == "form":
        return {"data": fields}
    document: Any = {**fields, "remember": True, "attempt": 3}
    for wrapper in reversed(wrappers):
        document = [document, {"id": 7}] if wrapper is None else {wrapper: document}
    if shape == "json":
        return {"json": document}
    return {"content": json.dumps(document).encode()}  # no Content-Type said


async def body_answer(
    lib_name: str, echo: str, handed: str, options: dict[str, Any]
) -> tuple[fanout.ToolResult, str]:
    """One call whose tool POSTs ``options``' body to the body-quoting server and hands
    back what it said, as ``handed``; its answer and everything written."""
    net = Net()
    lib = LIBRARIES[lib_name]
    with library_logs(net):
        async with (
            serve_body_quoting() as server,
            lib.module.AsyncClient(
                transport=lib.transport(secret_params=["tenant_sig"]), base_url=server.url
            ) as client,
        ):
            reg = Registry()

            @reg.tool(kind=Kind.READS)
            async def login() -> Any:
                said = (await client.post(f"{echo}/login", **options)).text
                if handed == "raised":
                    raise PermissionError(f"login refused: {said}")
                return {"upstream": said} if handed == "wrapped" else said

            turn = await Runner(reg, instruments=net.instruments).run_turn(
                [ToolCall("c", "login", {})]
            )
            net.add_turn(turn)
    assert len(server.seen) == 1
    return turn.results[0], net.text()


@functools.cache
def body_baseline() -> str:
    """What a body's echo writes with no secret in it, every way it is echoed."""
    options = body_options("json", "password", "PLACEHOLDER-NOT-SECRET", ["auth", None])
    return "\n".join(
        trio.run(body_answer, "httpx", echo, handed, options, clock=mock_clock())[1]
        for echo in ECHOES
        for handed in HANDED_BACK
    )


@SETTINGS
@given(
    lib_name=st.sampled_from(sorted(LIBRARIES)),
    secret=body_secret,
    shape=st.sampled_from(BODY_SHAPES),
    field=st.sampled_from(BODY_FIELDS),
    style=st.sampled_from(["as-is", "camel", "pascal", "upper", "kebab"]),
    wrappers=WRAPPERS,
    echo=st.sampled_from(ECHOES),
    handed=st.sampled_from(HANDED_BACK),
)
def test_a_credential_in_a_request_body_is_scrubbed_however_the_server_quotes_it(
    lib_name: str,
    secret: str,
    shape: str,
    field: str,
    style: str,
    wrappers: list[str | None],
    echo: str,
    handed: str,
) -> None:
    """A login's password, a token endpoint's ``client_secret``, under any spelling of a
    credential's name, in a form or a JSON body (nested in objects and lists, its type
    declared or not), quoted back by the server raw, in an error's text or in its JSON,
    and handed on by the tool as it came, inside its own JSON or in an exception: no
    spelling of it reaches the answer, the trace or a log."""
    assume(plausible(secret, body_baseline()) and secret.strip() == secret)
    options = body_options(shape, spelled(field, style), secret, wrappers)
    result, text = trio.run(body_answer, lib_name, echo, handed, options, clock=mock_clock())
    assert "REDACTED" in result.content
    assert leaks(secret, text) == []


# --- Redis: keys and values --------------------------------------------------------


@pytest.fixture(scope="module")
def redis_url() -> Any:
    with shared_redis_url() as url:
        yield url


async def redis_round(url: str, secret: str) -> tuple[str, str]:
    """A write that echoes ``secret`` (sent as x-api-key), run twice on a Redis store and
    a Redis scope; every Redis key and value under the prefix, and the answers."""
    prefix = unique_prefix()
    net = Net()
    async with (
        serve_echo(scope_of=lambda seen: secret) as server,
        client_for("x-api-key", secret, server.url) as client,
        RedisIdempotencyStore.from_url(url, prefix=prefix) as store,
        RedisScope.from_url(url, name="api", prefix=prefix, rate=100, burst=100) as scope,
    ):
        reg = Registry()

        @reg.tool(kind=Kind.MUTATING, scopes=["api"])
        async def create(name: str) -> str:
            throttled = await client.get("/throttle/redis")
            created = await client.post("/echo/things", json={"name": name, "key": secret})
            return throttled.text + created.text

        runner = Runner(reg, scopes=[scope], instruments=net.instruments)
        run = fanout.Run("adversarial-redis", store=store)
        call = [ToolCall("w", "create", {"name": "a"})]
        for _ in range(2):
            net.add_turn(await runner.run_turn(call, run=run))
        net.add(repr(store), repr(scope), scope.statistics())
        stored: list[str] = []
        for key in await store.client.keys(prefix + "*"):
            kind = await store.client.type(key)
            value: Any = None
            if kind == "string":
                value = await store.client.get(key)
            elif kind == "hash":
                value = await store.client.hgetall(key)
            elif kind == "zset":
                value = await store.client.zrange(key, 0, -1)
            stored.append(f"{key} {kind} {value!r}")
    return "\n".join(stored), net.text()


@pytest.mark.redis
@settings(max_examples=6, deadline=None, derandomize=True, phases=SETTINGS.phases)
@given(secret=header_secret)
def test_redis_holds_no_credential_in_any_key_or_value(redis_url: str, secret: str) -> None:
    """What a write echoing the key leaves on Redis (the stored answer, as JSON with \\u
    escapes; the scope's bucket, leases and start log) holds no spelling of it."""
    assume(plausible(secret, "PLACEHOLDER REDACTED fanout-test idem bucket leases api"))
    stored, text = trio.run(redis_round, redis_url, secret, clock=mock_clock())
    assert "idem:" in stored
    assert "REDACTED" in stored
    assert leaks(secret, stored + text) == []


def test_a_redis_url_with_a_userinfo_password_never_shows_it() -> None:
    """Every refusal of a Redis URL, and the repr of what it builds, hides the password."""
    password = "hunter2-Ω-pässword"
    shown = []
    for url in (
        f"redis://u:{password}@host:abc/0",
        f"http://u:{password}@host/0",
        f"redis://:{password}@host:6379/3?db=3",
    ):
        for cluster in (False, True):
            try:
                shown.append(repr(client_from_url(url, cluster=cluster)))
            except fanout.ConfigurationError as exc:
                shown.append(f"{exc} {exc!r} {exc.__cause__!r}")
    shown.append(repr(RedisIdempotencyStore.from_url(f"redis://u:{password}@host:6379/0")))
    shown.append(repr(RedisScope.from_url(f"redis://u:{password}@host:6379/0", name="api")))
    assert leaks(password, "\n".join(shown)) == []


# --- reprs -------------------------------------------------------------------------


def test_no_public_object_prints_a_credential_it_carries() -> None:
    """A Secret, the context a tool sees, a transport and a scope keep a key out of repr."""
    key = "zQ-repr-key-(.*)-|x"

    async def main() -> str:
        seen = []
        async with serve_echo() as server, client_for("x-api-key", key, server.url) as client:
            reg = Registry()

            @reg.tool(kind=Kind.READS)
            async def look() -> str:
                await client.get("/echo/1")
                seen.append(repr(fanout.current_call()))
                return "ok"

            turn = await Runner(reg).run_turn([ToolCall("c", "look", {})])
            seen += [repr(turn), repr(client._transport), repr(fanout.Secret(key))]
            seen += [str(fanout.Secret(key)), repr(Scope("api"))]
        return "\n".join(seen)

    assert leaks(key, trio.run(main)) == []


# === Leaks found: deterministic repros, expected to fail until fixed =================


def test_a_query_credential_with_a_space_sent_as_plus_is_scrubbed_everywhere() -> None:
    """httpx sends a space in a query value as "+"; fanout learns the decoded value (with
    a space) and spells " " only as " " or "%20", so the "+" form survives: in the answer
    and REQUEST_SENT url for a custom parameter, and in httpx's log for any parameter."""
    secret = "abc defGH1234"
    content, text = trio.run(
        functools.partial(
            quoted_answer, params={"tenant_sig": secret}, secret_params=["tenant_sig"]
        ),
        clock=mock_clock(),
    )
    assert "abc+defGH1234" not in content
    assert "abc+defGH1234" not in text


def test_a_basic_credential_with_the_key_as_username_keeps_the_key_out() -> None:
    """``auth=(api_key, "")`` (Stripe, Recurly and others): fanout learns ``key:`` and the
    base64, never the key alone, so a server quoting its user leaks it."""
    key = "rk9Ke7yQpLmZwvTT"
    content, _ = trio.run(functools.partial(quoted_answer, auth=(key, "")), clock=mock_clock())
    assert key not in content


def test_a_bot_token_in_the_url_path_is_scrubbed() -> None:
    """Telegram's Bot API takes the token in the path (``/bot<id>:<secret>/getMe``): a
    server quoting the path, or the secret alone, showed it to the model and the log."""
    token = "5123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
    content, text = trio.run(
        functools.partial(quoted_answer, path=f"/bot{token}/getMe"), clock=mock_clock()
    )
    secret = token.partition(":")[2]
    assert "getMe" in content  # the server did quote the path
    assert secret not in content
    assert secret not in text


def test_a_token_after_an_unlisted_authorization_scheme_is_scrubbed() -> None:
    """Okta's ``SSWS <token>``, Discord's ``Bot <token>``: fanout learns only the whole
    header value, so a server quoting the token alone leaks it."""
    token = "00QCjAl4MlV-8W9ktfJ"
    content, _ = trio.run(
        functools.partial(quoted_answer, headers={"authorization": f"SSWS {token}"}),
        clock=mock_clock(),
    )
    assert token not in content


def test_a_credential_header_sent_twice_has_each_value_scrubbed() -> None:
    """Two ``x-api-key`` lines reach fanout through ``headers.items()`` as one value
    joined with ", "; a server quoting one line leaks it."""

    async def main() -> str:
        async with (
            serve_quoting() as server,
            httpx.AsyncClient(transport=fanout.FanoutTransport()) as client,
        ):
            reg = Registry()

            @reg.tool(kind=Kind.READS)
            async def whoami() -> str:
                pairs = [("x-api-key", "first-key-ZZ9"), ("x-api-key", "second-key-YY8")]
                return (await client.get(server.url + "/quote", headers=pairs)).text

            turn = await Runner(reg).run_turn([ToolCall("c", "whoami", {})])
        return turn.results[0].content

    content = trio.run(main, clock=mock_clock())
    assert "first-key-ZZ9" not in content
    assert "second-key-YY8" not in content


def test_a_key_quoted_by_a_gson_server_with_unicode_escapes_is_scrubbed() -> None:
    """Gson writes "=" as \\u003d, and other serialisers write \\u00E9 in upper case; a
    secret's pattern knows only Python's escapes, so a base64 key echoed by such a server
    keeps everything but its padding."""
    key = "c2VjcmV0LWtleS0xMjM0NQ=="
    content, _ = trio.run(
        functools.partial(quoted_answer, "/gson/whoami", headers={"x-api-key": key}),
        clock=mock_clock(),
    )
    assert "c2VjcmV0LWtleS0xMjM0NQ" not in content


def test_a_json_answer_cut_inside_a_key_keeps_no_part_of_it() -> None:
    """``cut_json`` (non-text output) writes a preview with no "[truncated by fanout"
    marker, which `scrub_cut_secrets` looks for; the key must be gone before the cut
    (it is, since dba7b44: found leaking by this file, fixed meanwhile)."""
    key = "zQcutjsonkey0123456789"
    fanout.register_secret(key)
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def fetch() -> dict[str, str]:
        return {"a": "x" * 60 + key + "y" * 100}

    async def main() -> str:
        turn = await Runner(reg, max_output_chars=136).run_turn([ToolCall("c", "fetch", {})])
        return turn.results[0].content

    content = trio.run(main)
    assert "preview" in content
    assert key[:4] not in content


def test_a_text_answer_cut_inside_a_percent_encoded_key_keeps_no_part_of_it() -> None:
    """`scrub_cut_secrets` looks for a raw prefix of the key before the cut; a key the
    server quoted percent-encoded ("ab%2Bc...") must be scrubbed before the cap falls
    inside it (it is, since dba7b44)."""
    key = "ab+cdefghijklmnop"

    async def main() -> str:
        async with (
            serve_echo() as server,
            httpx.AsyncClient(
                transport=fanout.FanoutTransport(), base_url=server.url, params={"api_key": key}
            ) as client,
        ):
            reg = Registry()

            @reg.tool(kind=Kind.READS)
            async def echo() -> str:
                target = (await client.get("/e")).json()["target"]
                return "x" * 50 + target.split("api_key=")[1] + "y" * 200

            turn = await Runner(reg, max_output_chars=99).run_turn([ToolCall("c", "echo", {})])
        return turn.results[0].content

    content = trio.run(main, clock=mock_clock())
    assert "truncated by fanout" in content
    assert "ab%2Bc" not in content


def test_a_prometheus_label_first_seen_before_its_secret_was_known_is_dropped() -> None:
    """`BoundedLabels` cached a value's scrubbed label by its raw value, so a tool name
    (or scope, or reason) seen before its secret was learned went on being exported
    raw. Labels are scrubbed again once a secret is learned, and the series exported
    with the raw value before are dropped."""
    name = "zQpromLabelKey98765"
    metrics = PrometheusInstrument(CollectorRegistry())
    runner = Runner(Registry(), instruments=[metrics])

    async def main() -> None:
        await runner.run_turn([ToolCall("c1", name, {})])
        fanout.register_secret(name)
        await runner.run_turn([ToolCall("c2", name, {})])

    trio.run(main)
    exposition = generate_latest(metrics.registry).decode()
    assert name not in exposition


def test_a_prometheus_label_whose_secret_was_declared_after_the_last_event_is_dropped() -> None:
    """As above, with no event after the secret was declared: the labels were scrubbed
    again only as events came, and every scrape until the next one showed the key."""
    name = "zQpromLateKey4321098"
    metrics = PrometheusInstrument(CollectorRegistry())
    runner = Runner(Registry(), instruments=[metrics])
    trio.run(runner.run_turn, [ToolCall("c1", name, {})])
    assert name in generate_latest(metrics.registry).decode()  # not yet known as a secret
    fanout.register_secret(name)
    exposition = generate_latest(metrics.registry).decode()
    assert name not in exposition
    assert "fanout_calls_total" in exposition


def test_httpx_log_scrubs_a_query_key_evicted_while_its_request_was_in_flight() -> None:
    """The filter on httpx's logger scrubs only the process-wide registry (256 secrets),
    with no shape rules; a key evicted while its request was out (a large turn of signed
    URLs) is logged raw when the response comes."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("httpx")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def answer(request: httpx.Request) -> httpx.Response:
        for n in range(300):  # other calls' signatures, learned meanwhile
            fanout.register_secret(f"other-signature-{n:04d}")
        return httpx.Response(200, text="ok")

    async def main() -> None:
        transport = fanout.FanoutTransport(httpx.MockTransport(answer))
        async with httpx.AsyncClient(transport=transport) as client:
            reg = Registry()

            @reg.tool(kind=Kind.READS)
            async def get() -> str:
                url = "http://api.example/x"
                return (await client.get(url, params={"sig": "zQevictedSig12345"})).text

            await Runner(reg).run_turn([ToolCall("c", "get", {})])

    try:
        trio.run(main)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert "HTTP Request" in stream.getvalue()
    assert "zQevictedSig12345" not in stream.getvalue()


def test_a_redis_url_password_in_the_query_is_hidden_when_refused() -> None:
    """coredis takes ``?password=`` from the query; fanout hides only a userinfo password
    when it quotes a URL it refuses."""
    with pytest.raises(fanout.ConfigurationError) as refused:
        client_from_url("redis://host:abc/0?password=hunter2hunter2")
    assert "hunter2hunter2" not in str(refused.value)


def test_the_spellings_searched_for_are_real_spellings() -> None:
    """The net is not empty: each spelling it looks for is what a reader would find."""
    secret = 'a b+é/"\\'
    forms = spellings(secret)
    assert {'a b+é/"\\', "a%20b%2B%C3%A9%2F%22%5C", "a+b%2B%C3%A9%2F%22%5C"} <= forms
    assert json.dumps(secret)[1:-1] in forms
    assert leaks(secret, f"x {json.dumps(secret)} y") != []


def test_httpcore_debug_log_scrubs_a_credential_a_server_echoes_in_a_header() -> None:
    """The filter sits on the ``httpx`` logger only; httpcore, under fanout's own pools,
    logs every response's headers at DEBUG (``receive_response_headers.complete``), so a
    server that names its bucket, or echoes the target, after the key writes it there."""
    key = "zQ-httpcore-log-key-0123"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("httpcore")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)

    async def main() -> None:
        async with (
            serve_echo() as server,
            client_for("query:api_key", key, server.url) as client,
        ):
            reg = Registry()

            @reg.tool(kind=Kind.READS)
            async def echo() -> str:
                return (await client.get("/echo/1")).text

            await Runner(reg).run_turn([ToolCall("c", "echo", {})])

    try:
        trio.run(main, clock=mock_clock())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert "receive_response_headers.complete" in stream.getvalue()
    assert key not in stream.getvalue()
