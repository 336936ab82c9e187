"""Known secrets: scrubbed in every spelling, too-short ones left alone, the oldest forgotten."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from fanout import ConfigurationError, Secret
from fanout._secrets import (
    HEAD,
    MIN_LENGTH,
    REDACTED,
    SecretRegistry,
    _compiled,
    _known,
    _raw_only,
    compiled,
    register_secret,
    scrub_secrets,
    scrubbable,
)


def test_a_value_shorter_than_eight_characters_is_never_scrubbed() -> None:
    """Scrubbing 'abc' would redact ordinary words; a secret that short is left alone. So
    is a number shorter than 16 digits: a token sent as ``Bearer null``, or a key
    ``2024``, was scrubbed out of every later answer's JSON (``"year":REDACTED``)."""
    assert scrub_secrets("abcdefg and abcdefgh", ["abcdefg"]) == "abcdefg and abcdefgh"
    assert scrub_secrets("abcdefg and abcdefgh", ["abcdefgh"]) == f"abcdefg and {REDACTED}"
    assert scrub_secrets('{"n":null,"year":2024}', ["null", "2024"]) == '{"n":null,"year":2024}'
    assert scrub_secrets('{"n":12345678}', ["12345678"]) == '{"n":12345678}'
    assert scrub_secrets("card 4111111111111111", ["4111111111111111"]) == f"card {REDACTED}"


def test_a_bounded_registry_forgets_its_oldest_secret_and_shows_none() -> None:
    """Past its limit the least recently learned secret goes; its repr counts, never shows."""
    # A registry of its own: filling the process's one would evict the secrets
    # other tests registered.
    known = SecretRegistry(limit=2)
    one, two, three = Secret("first-key"), Secret("second-key"), Secret("third-key")
    known.learn([one, two])
    known.learn([one])  # learned again: now the newest
    known.learn([three])
    assert known.values() == ["first-key", "third-key"]
    assert known.unknown([one, two, three]) == [two]
    assert repr(known) == "<known secrets: 2>"
    text = "first-key second-key third-key"
    for pattern, _ in known.patterns():
        text = pattern.sub(REDACTED, text)
    assert text == f"{REDACTED} second-key {REDACTED}"


@st.composite
def _spelling(draw: st.DrawFn, value: str) -> str:
    """``value`` as a server may quote it: each character raw, percent-encoded (either
    case), JSON-escaped, or as the other spellings a secret's pattern allows. Half the
    time no character is percent-encoded, as in most texts."""
    percent_too = draw(st.booleans())
    out = []
    for char in value:
        percent = "".join(f"%{byte:02X}" for byte in char.encode())
        forms = [char, json.dumps(char)[1:-1], *{"/": ["\\/"], "+": [" "]}.get(char, [])]
        if percent_too:
            forms += [percent, percent.lower()]
        out.append(draw(st.sampled_from(forms)))
    return "".join(out)


_VALUES = st.text('aZ9-_.~+/= %\\"é\n', min_size=MIN_LENGTH, max_size=10)


def _every_pattern(text: str, secrets: list[str]) -> str:
    """What `scrub_secrets` gives when it tries the patterns whatever the text."""
    own = compiled(_known.unknown(Secret(value) for value in secrets))
    for pattern, _ in (*own, *_known.patterns()):
        text = pattern.sub(REDACTED, text)
    return text


@st.composite
def _quoted(draw: st.DrawFn) -> tuple[str, str]:
    """A secret, and a text holding one of its spellings (or all of it but its end)."""
    value = draw(_VALUES)
    spelled = draw(st.one_of(_spelling(value), st.just(value[:-1])))
    return value, draw(st.text(max_size=4)) + spelled + draw(st.text(max_size=4))


@settings(max_examples=300)
@example(("abcd+efgh", "x abcd efgh y"))  # "+" read as a space
@example(("abcd/efgh", "x abcd\\/efgh y"))  # JSON's "\/"
@given(quoted=_quoted())
def test_a_text_the_raw_check_passes_over_holds_no_secret(quoted: tuple[str, str]) -> None:
    """Looking for a secret's raw value first, in a text that cannot spell it otherwise,
    changes nothing: the answer is what the patterns alone give, learned or not."""
    value, text = quoted
    assert scrub_secrets(text, [value]) == _every_pattern(text, [value])
    known = SecretRegistry(limit=4)
    known.learn([Secret("another-secret"), Secret(value)])
    if any(pattern.search(text) for pattern, _ in known.patterns()):
        assert known.may_be_in(text) or "%" in text or "\\" in text


def test_learning_a_secret_compiles_its_pattern_alone() -> None:
    """Each secret's pattern is compiled once, when first needed; learning another does
    not compile the rest again. (One pattern of every secret, rebuilt at each new one,
    took 0.4 s for 256 on the event loop: 300 calls that each sent a key of their own
    returned 30 s past their 5 s deadline, none sent.)"""
    known = SecretRegistry(limit=300)
    texts = []
    for i in range(40):
        before = _compiled.cache_info().misses
        known.learn([Secret(f"distinct-key-{i:04d}-for-this-test")])
        patterns = known.patterns()
        assert _compiled.cache_info().misses - before == 1
        assert len(patterns) == i + 1
        texts.append(f"k=distinct-key-{i:04d}-for-this-test%20")
    for text in texts:
        for pattern, _ in known.patterns():
            text = pattern.sub(REDACTED, text)
        assert text == f"k={REDACTED}%20"


def test_a_secret_past_u_ffff_is_taken_out_however_deep_its_json() -> None:
    """A password with an emoji, written by a server's JSON (``\\ud83d\\ude00``, a pair of
    escapes) inside a tool's JSON, once or twice more: the second escape doubles its
    backslashes as the first does (left at one, the password reached the model)."""
    password = "\U0001f600emoji-pass-9"
    text = json.dumps({"password": password})
    for _ in range(3):
        scrubbed = scrub_secrets(text, [password])
        assert "emoji-pass-9" in text
        assert "emoji-pass-9" not in scrubbed
        assert scrubbed.count(REDACTED) == 1
        text = json.dumps({"body": text})


def test_a_pinned_secret_outlives_any_number_learned_after_it() -> None:
    """A declared key (``register_secret``), a Redis URL's password and an MCP session's
    key are sent without fanout seeing each request: pinned, they are never pushed out
    by the keys learned after them (300 presigned URLs' signatures pushed out a declared
    password, and an answer quoting it reached the model)."""
    registry = SecretRegistry(limit=4)
    registry.learn([Secret("declared-password-1")], pinned=True)
    registry.learn([Secret(f"signature-{n:04d}-abcdef") for n in range(300)])
    assert "declared-password-1" in registry.values()
    assert len(registry.values()) == 5  # the pinned one, and the four latest
    assert not registry.unknown([Secret("declared-password-1")])


def test_a_key_declared_as_bytes_is_refused_without_quoting_it() -> None:
    """``register_secret(b"...")`` is a ``ConfigurationError`` that names the type, not the
    key (it was a bare attrs ``TypeError`` quoting it)."""
    with pytest.raises(ConfigurationError) as refused:
        register_secret(b"sk-live-0123456789abcdef")  # type: ignore[arg-type]
    assert "0123456789" not in str(refused.value)


def test_an_unset_key_s_placeholder_is_never_scrubbed() -> None:
    """``Bearer undefined`` (a JavaScript client with no key set) teaches nothing: learned,
    the word was taken out of every later answer."""
    assert not scrubbable("undefined")
    assert not scrubbable("[object Object]")
    assert scrub_secrets("Cannot read properties of undefined", ["undefined"]).endswith("undefined")


# Keys as a tool may hold them: an API key's alphabet, and any printable character.
_KEYS = st.one_of(
    st.text("abcdefXYZ0123456789-_.", min_size=MIN_LENGTH, max_size=48),
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=MIN_LENGTH, max_size=48),
).filter(lambda key: scrubbable(key) and len(set(key.casefold())) >= 4)


@st.composite
def _html_escaped(draw: st.DrawFn, key: str) -> str:
    """``key`` with each character raw, or an HTML entity by number or by name."""
    named = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "/": "&sol;"}
    forms = [[c, f"&#x{ord(c):x};", f"&#X{ord(c):04X};", f"&#{ord(c)};", named.get(c, c)]
             for c in key]  # fmt: skip
    return "".join(draw(st.sampled_from(each)) for each in forms)


def _encoded(key: str) -> list[str]:
    """``key`` written back whole in another form: case changed, base64, hex."""
    data = key.encode()
    return [
        key.upper(), key.lower(),
        base64.b64encode(data).decode(), base64.urlsafe_b64encode(data).decode().rstrip("="),
        data.hex(), data.hex().upper(),
    ]  # fmt: skip


@st.composite
def _echoed(draw: st.DrawFn) -> tuple[str, str]:
    """A key, and a spelling of it fanout did not read before (or, when the key is longer
    than `HEAD`, its head as a log shows it)."""
    key = draw(_KEYS)
    choices = [draw(_html_escaped(key)), *_encoded(key)]
    # A value of parts (``user:password``) shows no head: its parts are learned alone.
    if len(key) > HEAD and not any(char.isspace() or char == ":" for char in key):
        choices += [key[:HEAD] + "...", key[: draw(st.integers(HEAD, len(key)))]]
    return key, draw(st.sampled_from(choices))


# Each example compiles a key's pattern: a first one takes longer than a deadline.
@settings(max_examples=300, deadline=None)
@example(echoed=("zQ-echo-Key-0123456789abcdef", "ZQ-ECHO-KEY-0123456789ABCDEF"), blob="")
@example(echoed=("zQ-echo-Key-0123456789abcdef", "zQ-echo-Key-01234567..."), blob="")
@example(echoed=("p&ss<w>rd-2024", "p&amp;ss&lt;w&gt;rd-2024"), blob="")
@given(echoed=_echoed(), blob=st.sampled_from(["", "QUJD" * 600]))
def test_a_key_echoed_in_another_spelling_is_scrubbed(echoed: tuple[str, str], blob: str) -> None:
    """A server or tool that writes a key back HTML-escaped, upper- or lower-cased, as
    base64 or hex of its bytes, or shows its first 20 characters, shows none of it: each
    reached the model whole, fanout reading the key only character by character. Beside
    a long base64 ``blob`` (an image's), its encoded forms are looked for whole, not a
    window at a time (0.6 s for 2 MB, on the event loop)."""
    key, echo = echoed
    shown = echo.removesuffix("...")
    assume(shown not in "said: [] (end)")
    learned = SecretRegistry(limit=4)
    learned.learn([Secret(key)])
    text = f"said: [{echo}] (end) {blob}"
    for scrubbed in (scrub_secrets(text, [key]), _every_pattern(text, [key])):
        assert shown not in scrubbed
        assert scrubbed.startswith("said: [")
        assert scrubbed.endswith(f"] (end) {blob}")
    assert learned.may_be_in(text) or not _raw_only(text)


@settings(deadline=None)
@given(key=_KEYS, cut=st.integers(1, HEAD - 1))
def test_no_head_shorter_than_twenty_characters_and_no_user_name_is_scrubbed(
    key: str, cut: int
) -> None:
    """A key's beginning is scrubbed only from its 20th character on, and a value made of
    parts shows no head: an 8-character key's first characters, or a Basic login's
    ``user:password`` whose head is the user, would be taken out of unrelated text."""
    head = key[:cut]
    assume(not scrubbable(head) or len(head) < HEAD)
    assert scrub_secrets(f"<{head}>", [key + "-and-more"]) == f"<{head}>"
    user = "svc-reporting-2024@example.com"
    assert scrub_secrets(f"hello {user}", [f"{user}:{key}"]) == f"hello {user}"


def test_a_secret_learned_after_more_than_the_compile_cache_holds_compiles_alone() -> None:
    """Pinned secrets have no limit: past what the compile cache holds (twice the learned
    limit), a cache gone round them all compiled every pattern again at each new secret
    (6 s for 700, on the event loop). Each is compiled once while it is known."""
    known = SecretRegistry(limit=4)
    many = _compiled.cache_info().maxsize or 0
    known.learn([Secret(f"pin-{i:06d}") for i in range(many + 40)], pinned=True)
    known.patterns()
    for i in range(3):
        before = _compiled.cache_info().misses
        known.learn([Secret(f"new-key-{i:04d}")])
        assert len(known.patterns()) == many + 40 + i + 1
        assert _compiled.cache_info().misses - before == 1
