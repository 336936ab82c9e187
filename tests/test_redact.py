"""Redaction of URLs and free text: what a trace, a log line or an answer may say of a request."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
import trio
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import fanout
from fanout import Kind, Registry, Runner, ToolCall, ToolResult
from fanout._credentials import CREDENTIAL_HEADERS, CREDENTIAL_PARAMS
from fanout._redact import (
    _LOOSE_PARAMS,
    _redact_shapes,
    _replace_shapes,
    redact_text,
    redact_url,
)
from fanout._secrets import MIN_LENGTH


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # A port out of range: not a URL urllib can take apart, so scrubbed as text.
        ("http://h:99999/x?api_key=sk-live-abcdef123", "http://h:99999/x?api_key=REDACTED"),
        # An IPv6 literal keeps its brackets and port; userinfo goes entirely.
        ("http://u:pw@[::1]:8080/p?token=abc&q=1", "http://[::1]:8080/p?token=REDACTED&q=1"),
        ("https://[2001:db8::1]/p", "https://[2001:db8::1]/p"),
    ],
)
def test_a_url_keeps_its_shape_and_loses_its_credentials(url: str, shown: str) -> None:
    """Credential parameters and userinfo are replaced; host, port, path and the rest stay."""
    assert redact_url(url) == shown


# Letters (?i) folds onto ASCII ones: the dotless i, the long s and the Kelvin sign.
_FOLDS = {"i": "\u0131", "s": "\u017f", "k": "\u212a"}


@st.composite
def _spelled(draw: st.DrawFn, word: str) -> str:
    """``word`` with each letter in either case, or (rarely) a Unicode letter that folds onto it."""
    letters = []
    for char in word:
        choices = [char.lower(), char.upper()]
        if char.lower() in _FOLDS:
            choices.append(_FOLDS[char.lower()])
        letters.append(draw(st.sampled_from(choices)))
    return "".join(letters)


_TOKEN = st.text("abcXYZ0189._~+/=-", min_size=1, max_size=12)
_KEY = st.text("abcXYZ0189_-", min_size=8, max_size=12)
_SHAPE = st.one_of(
    st.tuples(_spelled("bearer"), st.sampled_from([" ", "\t", ""]), _TOKEN),
    st.tuples(st.sampled_from(["sk", "pk", "rk", "xoxb", "xoxp", "ghp", "gho", "ghs", "glpat"]),
              st.sampled_from(["-", "_"]), _KEY),
    st.tuples(st.sampled_from(["?", "&", ";"]),
              st.sampled_from(sorted(CREDENTIAL_PARAMS)).flatmap(_spelled), st.just("="), _TOKEN),
    st.tuples(st.sampled_from(["http", "Redis+tls"]), st.just("://"), _TOKEN, st.just("@")),
    st.tuples(st.sampled_from(sorted(CREDENTIAL_HEADERS)).flatmap(_spelled),
              st.sampled_from([": ", "=", '": "', "', '", ":"]),
              st.sampled_from(["", "Basic ", "token "]), _TOKEN),
).map("".join)  # fmt: skip
_NOISE = st.text(max_size=6)


@settings(max_examples=300)
@given(before=_NOISE, shape=st.one_of(_SHAPE, st.just("")), after=_NOISE)
def test_a_text_the_shape_check_passes_over_holds_no_shape(
    before: str, shape: str, after: str
) -> None:
    """Skipping the shapes for a text without their words changes nothing: it is what
    replacing every shape would give."""
    text = f"{before} {shape} {after}"
    assert _redact_shapes(text) == _replace_shapes(text)


def test_a_url_without_a_query_keeps_its_shape() -> None:
    """A URL with no query parameters is given back with none (not an empty ``?``)."""
    assert redact_url("http://Example.com:8080/a/b#frag") == "http://example.com:8080/a/b#frag"


# Pieces of an exception's text that credential shapes read around: header and
# parameter names, their separators, quotes, escapes, and a token where a value goes.
_PIECE = st.one_of(
    st.sampled_from(sorted(CREDENTIAL_HEADERS)).flatmap(_spelled),
    st.sampled_from(sorted(CREDENTIAL_PARAMS)),
    st.sampled_from(['"', "'", ":", "=", ",", ", ", " ", "\\", '\\"', "?", "&", "@", "://"]),
    _SHAPE,
    _TOKEN,
    st.text(max_size=4),
)


@settings(max_examples=300, deadline=None)
@example(pieces=["missing header Cookie:"])
@example(pieces=["bad cookie="])
@example(pieces=["bad Cookie=\\"])
@example(pieces=["X-Api-Key", ":", "\\\\"])
@given(pieces=st.lists(_PIECE, max_size=8))
def test_an_error_answer_keeps_its_fields_whatever_its_message_says(pieces: list[str]) -> None:
    """A tool's exception text is redacted inside the answer's JSON, never across it:
    the answer still parses and says whether the call started. A message ending in
    "Cookie" once took the next field's name, ``started``, for a cookie's value."""
    message = "".join(pieces)
    registry = Registry()

    @registry.tool(kind=Kind.READS)
    async def fail() -> str:
        raise ValueError(message)

    async def main() -> ToolResult:
        turn = await Runner(registry).run_turn([ToolCall("c", "fail", {})])
        return turn.results[0]

    result = trio.run(main)
    body = json.loads(result.content)
    assert body["started"] is True
    assert (body["status"], body["tool"]) == ("error", "fail")
    assert body["message"].startswith("ValueError")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # A backslash in a credential is taken with what it escapes: none of it shows.
        ("http://DOMAIN\\user:pw-123@host/x", "http://REDACTED@host/x"),
        ("see ?api_key=abc\\def end", "see ?api_key=REDACTED end"),
        # ... but never with a quote it escapes, which would end a JSON string.
        ('{"m":"cookie=abc\\"x","started":true}', '{"m":"cookie=REDACTED\\"x","started":true}'),
    ],
)
def test_a_backslash_neither_hides_a_credential_nor_ends_a_string(text: str, shown: str) -> None:
    """Userinfo with a Windows domain, a key with a backslash, an escaped quote after one."""
    assert redact_text(text) == shown


_SECRET = st.text("abcXYZ0189", min_size=12, max_size=16)
_AROUND = st.sampled_from(["", " ", "\n", "\t", "\r\n", "log: ", "REDACTED", "(", '"'])


def _credential(kind: str, secret: str) -> str:
    """A credential of a shape fanout reads, as a tool's output may hold it."""
    return {
        "bearer": f"Bearer {secret}",
        "header": f"Authorization:\nBearer {secret}",
        "key": f"sk-{secret}",
        "json-pair": json.dumps({"x-api-key": secret}),
        "curl": f'curl -H "X-Api-Key: {secret}" https://api',
        # Schemes other than the three fanout shows: Okta's, Discord's, Kerberos's.
        "ssws": f"Authorization: SSWS {secret}",
        "bot": f"authorization: Bot {secret} refused",
        "negotiate": json.dumps({"Proxy-Authorization": f"Negotiate {secret}"}),
        # Each cookie of a line, not only the first; a cookie the server set.
        "cookies": f"Cookie: theme=dark; session={secret}",
        "set-cookie": json.dumps({"set-cookie": f"lang=en; sid={secret}; Path=/"}),
        # httpcore's DEBUG line: every header as a pair of bytes.
        "httpcore": f"[(b'Host', b'api'), (b'X-Api-Key', b'{secret}'), (b'Accept', b'*/*')]",
        "httpcore-cookie": f"[(b'Set-Cookie', b'session={secret}; HttpOnly')]",
        # A header whose value is a list of them.
        "json-list": json.dumps({"Authorization": [f"Bearer {secret}"], "n": 1}),
    }[kind]


_KINDS = [
    "bearer", "header", "key", "json-pair", "curl", "ssws", "bot", "negotiate", "cookies",
    "set-cookie", "httpcore", "httpcore-cookie", "json-list",
]  # fmt: skip


@settings(max_examples=500)
@given(
    kind=st.sampled_from(_KINDS),
    secret=_SECRET,
    before=_AROUND,
    after=_AROUND,
    written=st.sampled_from(["raw", "json", "json-in-json"]),
)
def test_a_credential_by_shape_is_gone_however_its_text_was_written(
    kind: str, secret: str, before: str, after: str, written: str
) -> None:
    """A credential's shape after a line break, a tab, a quote or a known secret's
    ``REDACTED``, as text, as a JSON answer writes it (``\\n``, ``\\"``), or as JSON text
    inside a JSON answer: none of it shows, and the JSON still parses. Read as
    letters, ``\\nBearer`` and ``\\nsk-`` kept their tokens, and an escaped JSON pair
    was no header; ``SSWS <token>`` lost its scheme and kept the token, a cookie line
    its first cookie only, httpcore's ``(b'X-Api-Key', b'<key>')`` nothing at all, and
    ``{"Authorization": ["Bearer ..."]}`` lost its bracket and broke the JSON."""
    text = before + _credential(kind, secret) + after
    if written == "json":
        text = json.dumps({"out": text})
    elif written == "json-in-json":
        text = json.dumps({"out": json.dumps({"body": text})})
    redacted = redact_text(text)
    assert secret not in redacted
    if written != "raw":
        json.loads(redacted)


def test_a_name_a_transport_was_told_is_a_credential_by_shape_from_then_on() -> None:
    """A key sent as ``?vault_sig=`` (``secret_params=["vault_sig"]``) is known as a
    secret only while the process-wide registry keeps it (the 256 latest): a call still
    out when 300 others sent keys of their own had it written in clear in httpx's log.
    Once a transport is told the name, its value is redacted by shape as the default
    names' are, in text and in a URL's query."""
    # Names no other test tells a transport: the shapes know a name for the process.
    text = "GET /slow?q=sales&vault_sig=tsig-7f3a9c2e4b1d8806 200"
    assert "tsig-7f3a9c2e4b1d8806" in redact_text(text)  # no default name: not a shape
    fanout.FanoutTransport(secret_params=["vault_sig"], secret_headers=["X-Vault-Key"])
    assert redact_text(text) == "GET /slow?q=sales&vault_sig=REDACTED 200"
    assert redact_url("https://h/p?vault_sig=tsig-1&q=1") == "https://h/p?vault_sig=REDACTED&q=1"
    assert redact_text("x-vault-key: tk-4e1f8a2b9c") == "x-vault-key: REDACTED"


_JSON_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
    st.sampled_from(["", "Cookie:", "cookie=", "Authorization: ", "Bearer", "a\\", '"']),
    st.text(max_size=12),
)  # fmt: skip
_KEY = st.one_of(
    st.sampled_from(["Authorization", "cookie", "Set-Cookie", "x-api-key", "authorization:"]),
    st.text(max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(
    answer=st.recursive(
        st.dictionaries(_KEY, _JSON_VALUE, max_size=4),
        lambda inner: st.dictionaries(_KEY, inner | st.lists(inner | _JSON_VALUE, max_size=3)),
        max_leaves=12,
    ),
    nested=st.booleans(),
)
def test_a_json_answer_still_parses_whatever_its_keys_and_values(answer: Any, nested: bool) -> None:
    """A tool's JSON answer whose keys name credentials, with values of every JSON type,
    alone or as a server's body inside the tool's own JSON: the answer still parses.
    ``{"Authorization": null}`` became ``{"Authorization":REDACTED}``, a string ending in
    ``Cookie:`` took the next field's quote, and ``\\\"`` lost half its backslashes."""
    text = json.dumps(answer)
    if nested:
        text = json.dumps({"body": text, "status": 401})
    redacted = redact_text(text)
    parsed = json.loads(redacted)
    if nested:
        json.loads(parsed["body"])


def _cased(names: frozenset[str]) -> st.SearchStrategy[str]:
    """One of ``names``, as written in lower, upper or title case."""
    return st.sampled_from(sorted(names)).flatmap(
        lambda name: st.sampled_from([name, name.upper(), name.title()])
    )


_WORDS = st.lists(st.text(string.ascii_lowercase, min_size=1, max_size=12), min_size=2, max_size=6)
_SCHEMES_FANOUT_SHOWS = {"bearer", "basic", "token"}
_SAID = st.sampled_from(["", "Missing ", "error: ", "401 Unauthorized: "])


def _written(text: str, how: str) -> str:
    """``text`` as a tool writes it: raw, or as a JSON answer's string."""
    return json.dumps({"message": text}) if how == "json" else text


@settings(max_examples=300)
@example(said="Missing ", name="X-Api-Key", words=["no", "key", "was", "provided"], how="raw")
@example(said="", name="Cookie", words=["none", "sent"], how="raw")
@given(
    said=_SAID,
    name=_cased(CREDENTIAL_HEADERS),
    words=_WORDS,
    how=st.sampled_from(["raw", "json"]),
)
def test_words_after_a_credential_header_name_are_kept(
    said: str, name: str, words: list[str], how: str
) -> None:
    """Prose after a credential header's name is not its value: "Missing X-Api-Key: no key
    was provided" lost "no key" (read as a scheme and its token), "Cookie: none sent" its
    every word. Words without a digit, none of them a scheme fanout shows, are kept."""
    assume(words[0] not in _SCHEMES_FANOUT_SHOWS)
    text = _written(f"{said}{name}: {' '.join(words)}", how)
    assert redact_text(text) == text


_VALUE_CHARS = string.ascii_letters + string.digits + "._~+/=-"
# Long enough to be a key fanout scrubs (a shorter one is in "401" too).
_CREDENTIAL_VALUE = st.one_of(
    st.text(_VALUE_CHARS, min_size=MIN_LENGTH, max_size=24).filter(
        lambda value: any(char.isdigit() for char in value)
    ),
    st.text(_VALUE_CHARS, min_size=20, max_size=40),
)


@settings(max_examples=300)
@given(
    said=_SAID,
    name=_cased(CREDENTIAL_HEADERS - {"cookie", "set-cookie"}),
    value=_CREDENTIAL_VALUE,
    words=st.one_of(st.just([]), _WORDS),
    how=st.sampled_from(["raw", "json"]),
)
def test_a_credential_shaped_value_after_a_header_name_is_cut(
    said: str, name: str, value: str, words: list[str], how: str
) -> None:
    """A value after a credential header's name, unquoted and after no scheme, is cut when
    it reads as a credential (a digit in it, or 20 token characters), prose after it or
    not, and a JSON answer still parses. (A value that is also in the text around it,
    as ``x-amz-security-token`` is in its header's name, is not looked for.)"""
    assume(value not in " ".join([said, name, *words]))
    text = _written(f"{said}{name}: {' '.join([value, *words])}", how)
    redacted = redact_text(text)
    assert value not in redacted
    if how == "json":
        json.loads(redacted)


# Code naming where a credential is kept, as a tool quoting source code or a curl command
# shows it: a read of the environment, a settings attribute, a shell's variable.
_REFERENCES = (
    'os.environ["{}"]', "os.environ['{}']", 'os.environ.get("{}", "")', 'os.getenv("{}")',
    "process.env.{}", "settings.{}", "${{{}}}", "${{{}:-dev}}", "${}",
)  # fmt: skip
_VARIABLE = st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True)
# Where such code stands: a keyword argument or an assignment of a credential parameter,
# a URL's query, a header in a curl command or a dict (its value after a scheme or not).
# Each with how a credential's literal stands there instead.
_PARAM_PLACES = (
    ("connect(db, {name}={value})", "{}"), ("env {name}={value} ./run", "{}"),
    ("x; {name}={value}", "{}"),
)  # fmt: skip
_QUERY_PLACES = (
    ("curl 'https://api.test/v1?q=1&{name}={value}'", "{}"), ("GET /v1?{name}={value} 401", "{}"),
)  # fmt: skip
_HEADER_PLACES = (
    ('curl -H "{name}: {value}" https://api.test', "{}"),
    ('curl -H "{name}: Bearer {value}"', "{}"),
    ('headers = {{"{name}": {value}}}', '"{}"'), ('{{"{name}": "Key {value}"}}', "{}"),
    ("{name}: {value}", "{}"),
)  # fmt: skip
_CODE_PLACES = st.one_of(
    st.tuples(st.sampled_from(_PARAM_PLACES), st.sampled_from(sorted(_LOOSE_PARAMS))),
    st.tuples(st.sampled_from(_QUERY_PLACES), st.sampled_from(sorted(CREDENTIAL_PARAMS))),
    st.tuples(
        st.sampled_from(_HEADER_PLACES), _cased(CREDENTIAL_HEADERS - {"cookie", "set-cookie"})
    ),
)


@settings(max_examples=300)
@example(  # the README's: a tool's answer quoting Python source
    place=(_PARAM_PLACES[0], "password"),
    reference=_REFERENCES[0],
    variable="DB_PASSWORD",
    value="hunter2-hunter2",
    how="raw",
)
@given(
    place=_CODE_PLACES,
    reference=st.sampled_from(_REFERENCES),
    variable=_VARIABLE,
    value=_CREDENTIAL_VALUE,
    how=st.sampled_from(["raw", "json"]),
)
def test_code_naming_a_credential_is_kept_and_the_credential_is_not(
    place: tuple[tuple[str, str], str], reference: str, variable: str, value: str, how: str
) -> None:
    """``password=os.environ["DB_PASSWORD"]`` (or ``$TOKEN``, ``settings.X``) holds no
    secret: a tool's answer quoting such code keeps it whole, where it lost the code to a
    ``REDACTED``. The same place holding a credential still loses it."""
    (template, literal), name = place
    code = _written(template.format(name=name, value=reference.format(variable)), how)
    assert redact_text(code) == code
    held = _written(template.format(name=name, value=literal.format(value)), how)
    assert value not in redact_text(held)
