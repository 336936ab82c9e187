"""Credentials: values that never print, the names that mark them, and the forms they echo in.

A key leaks through whatever quotes it: a server echoing a request back, an
exception printing a URL, a repr of the context a tool logs. fanout learns
the credentials a request carries where it sends them (the HTTP transport),
keeps them as `Secret` values whose ``repr`` and ``str`` are redacted, and
scrubs every form a server may quote them in from each final answer:

* the raw value, and so ``Bearer <value>`` too;
* its percent-encoded (once, or twice: a URL quoted inside another) and JSON-escaped
  spellings, and any mix of them;
* a Basic credential's base64, its decoded ``user:password`` and the password;
* a URL's userinfo password, and ``user:password``.

Which request parts are credentials is `fanout._credentials`. Values
shorter than `MIN_LENGTH` are not scrubbed as text: they would match
everywhere and say nothing.

Learned secrets are also kept in one process-wide, bounded registry, so an
answer is scrubbed of every key fanout has seen sent, not only its own call's
(a tool may quote a key in an exception before it sends anything).
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import attrs

from ._exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "MIN_LENGTH",
    "REDACTED",
    "Secret",
    "SecretRegistry",
    "learn",
    "register_secret",
    "scrub_cut_secrets",
    "scrub_secrets",
    "scrubbable",
    "secrets_learned",
]

REDACTED = "REDACTED"
MIN_LENGTH = 8
"""Characters. A shorter value is not scrubbed from text: it would match anywhere. (At
four, a client's unset token sent as ``Bearer null``, or a key ``2024``, was scrubbed out
of every later answer of the process: ``{"alerts":REDACTED,"year":REDACTED}``.)"""
_MIN_DIGITS = 16  # characters: a value of digits alone, shorter, is a number in any JSON

_MAX_KNOWN = 256  # secrets remembered process-wide; the oldest go first


@attrs.frozen(repr=False)
class Secret:
    """A credential. Compares and hashes by value; its ``repr`` and ``str`` never show it."""

    _value: str = attrs.field(alias="value", validator=attrs.validators.instance_of(str))

    def reveal(self) -> str:
        """The raw value, for the one place that must send it."""
        return self._value

    def pattern(self) -> str | None:
        """A regular expression for every spelling of the value a server may quote.

        Each character may stand as itself, percent-encoded (either case) or
        JSON-escaped, independently: libraries encode different characters
        (httpx leaves ``/`` in a query, quotes ``+``), so a URL echoed back is
        often a mix. None for a value too short to scrub.
        """
        return _pattern_for(self._value)

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __str__(self) -> str:
        return REDACTED


def scrubbable(value: str) -> bool:
    """Whether ``value`` is long enough to be scrubbed from text without hitting others,
    and is no unset value's placeholder (a JavaScript client's ``Bearer undefined`` took
    the word out of every later answer)."""
    if value.lower() in _UNSET:
        return False
    return len(value) >= (_MIN_DIGITS if value.isdigit() else MIN_LENGTH)


# What a client sends where a key was never set, as its language prints nothing.
_UNSET = frozenset({"undefined", "[object object]", "undefined:undefined", "null:null"})


@functools.lru_cache(maxsize=1024)
def _pattern_for(value: str) -> str | None:
    if not scrubbable(value):
        return None
    return "".join(_spellings(char) for char in value)


@functools.lru_cache(maxsize=256)
def _spellings(char: str) -> str:
    """One character of a secret, as any of the ways text may carry it."""
    escaped = json.dumps(char)[1:-1]
    percent = "".join(f"%{byte:02X}" for byte in char.encode("utf-8"))
    # Any character may be written as a JSON \uXXXX escape, in either case: Gson
    # writes "=" as "\u003d", and a key quoted so kept all but its "=" raw.
    units = char.encode("utf-16-be")
    unicode = "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))
    # Percent-encoded twice too: a URL quoted inside another (a login redirect's
    # ``next=``) writes a key's "+" as "%252B".
    twice = percent.replace("%", "%25")
    alternatives = {
        re.escape(char), f"(?i:{re.escape(percent)})", f"(?i:{re.escape(twice)})",
        _nested(char, escaped), f"(?i:{_nested(char, unicode)})",
    }  # fmt: skip
    alternatives |= _EXTRA_SPELLINGS.get(char, set())
    return "(?:" + "|".join(sorted(alternatives, key=len, reverse=True)) + ")"


_DEPTHS = (1, 2, 3)  # levels of JSON written into JSON: a server's body in a tool's answer


def _nested(char: str, escaped: str) -> str:
    """``char``'s JSON escape (``escaped``) as a pattern that takes it written into JSON
    again, and again: each level doubles a backslash, so ``\\u003d`` has one and then
    two, four. Only one level was known, and a password echoed in a server's JSON,
    returned inside a tool's JSON answer, reached the model whole.

    Any run of backslashes before a letter or a slash (``\\u003d``, ``\\n``, ``\\/``)
    is the one escape. A backslash's own escape and a quote's are counted exactly, to
    three levels (a backslash is two, then four, eight; a quote one and a quote, then
    three, seven): a run taken whole there would take the backslashes escaping a quote
    after it too, and end the string.
    """
    if not escaped.startswith("\\"):
        return re.escape(escaped)
    if escaped == "\\\\":
        counts = [(2**depth, "") for depth in _DEPTHS]
    elif escaped == '\\"':
        counts = [(2**depth - 1, '"') for depth in _DEPTHS]
    else:
        # Each escape of it: a character past U+FFFF is two (a surrogate pair, "\ud83d\ude00"),
        # and the second doubles as the first does (left at one backslash, an emoji in a
        # password leaked from a server's JSON inside a tool's).
        return "".join(r"\\+" + re.escape(unit) for unit in escaped.split("\\")[1:])
    # The deepest first: two of a backslash's four taken, the two left escaped the quote
    # after it, and ended the string.
    deepest = sorted(counts, reverse=True)
    return "(?:" + "|".join(re.escape("\\" * count + rest) for count, rest in deepest) + ")"


# "/" may be JSON-escaped as "\/"; "+" in a query may be decoded to a space, and a space
# encoded as "+" (``urlencode``, httpx's own query: "abc def" was sent as "abc+def").
_EXTRA_SPELLINGS = {"/": {_nested("/", "\\/")}, "+": {" "}, " ": {re.escape("+")}}


class SecretRegistry:
    """Every secret fanout has learned in this process, newest last, bounded.

    Kept so that an answer is scrubbed of any key fanout has seen sent. Each
    secret has a regular expression of its own for every form, compiled once
    (about 0.7 ms) and tried longest first. One expression of them all was
    rebuilt whenever a secret was learned: 0.4 s for 256, on the event loop,
    so a turn whose 300 calls each sent a key of their own (a presigned URL's
    signature) returned 30 s past its 5 s deadline. Tried one by one, they
    scan a text as fast as the one did. A text that can spell a secret only
    raw is first looked through for each raw value (`may_be_in`), and most
    need none of them.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._secrets: OrderedDict[Secret, None] = OrderedDict()
        self._pinned: OrderedDict[Secret, None] = OrderedDict()  # kept whatever the limit
        # Their patterns, longest secret first: ``_current`` says whether they are.
        self._patterns: tuple[Screened, ...] = ()
        self._current = True
        # What each secret long enough to scrub must show in a text that spells it
        # only raw (`_plain`); rebuilt, under the lock, whenever the secrets change.
        self._plain: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self.changes = 0  # how many times a new secret was learned: text scrubbed before is stale

    def learn(self, secrets: Iterable[Secret], *, pinned: bool = False) -> None:
        """Remember ``secrets``, newest last; ``pinned``: never forget them, however many
        are learned after (a key declared once, or given once to a session: pushed out by
        300 presigned URLs' signatures, a declared password was quoted in clear)."""
        with self._lock:
            changed = False
            for secret in secrets:
                if pinned and secret not in self._pinned:
                    self._pinned[secret] = None
                    self._secrets.pop(secret, None)
                    changed = True
                    continue
                if secret in self._pinned:
                    continue
                if secret in self._secrets:
                    self._secrets.move_to_end(secret)
                    continue
                self._secrets[secret] = None
                changed = True
                if len(self._secrets) > self._limit:
                    self._secrets.popitem(last=False)
            if changed:
                self._plain = _plain_forms(secret.reveal() for secret in self._all())
                self._current = False
                self.changes += 1

    def _all(self) -> list[Secret]:
        return [*self._pinned, *self._secrets]

    def patterns(self) -> tuple[Screened, ...]:
        """A pattern for each secret long enough to scrub, longest first, with what a text
        must hold, decoded, for the pattern to find anything (`Screened`).

        Read without the lock while nothing new was learned (every answer
        asks): an update sets the patterns before it marks them current, so a
        reader racing a ``learn`` gets those from just before it.
        """
        if self._current:
            return self._patterns
        with self._lock:
            if not self._current:
                self._patterns = compiled(self._all())
                self._current = True
            return self._patterns

    def may_be_in(self, text: str) -> bool:
        """Whether ``text`` may spell one of these secrets; False only when it cannot.

        Read without the lock, as `pattern` is: a reader racing a ``learn``
        checks the secrets from just before it.
        """
        return _may_spell(text, self._plain)

    def values(self) -> list[str]:
        with self._lock:
            return [secret.reveal() for secret in self._all()]

    def unknown(self, secrets: Iterable[Secret]) -> list[Secret]:
        """Those of ``secrets`` this registry does not hold (never learned, or evicted)."""
        with self._lock:
            return [s for s in secrets if s not in self._secrets and s not in self._pinned]

    def __repr__(self) -> str:
        return f"<known secrets: {len(self._secrets) + len(self._pinned)}>"


# A secret's pattern, and what a text must hold once decoded (`_decoded`) for the
# pattern to find it there; None where the decoding cannot say (`_screen_of`).
Screened = tuple[re.Pattern[str], str | None]


def compiled(secrets: Iterable[Secret]) -> tuple[Screened, ...]:
    """A pattern for every spelling of each of ``secrets``, longest first (a secret
    that holds another is replaced whole before the other is looked for)."""
    ordered = sorted(secrets, key=lambda secret: len(secret.reveal()), reverse=True)
    return tuple(
        (_compiled(pattern), _screen_of(secret.reveal()))
        for secret in ordered
        if (pattern := secret.pattern()) is not None
    )


# A secret whose every character is printable ASCII, but "%" and "\\": the escapes
# `_decoded` undoes leave it as it is, and every spelling of it becomes it.
_SCREENABLE = re.compile(r"[ !#$&-\[\]-~\"]+", re.ASCII)


def _screen_of(value: str) -> str | None:
    """What a text decoded must hold where it spells ``value`` (None: it cannot tell)."""
    return _plain(value) if _SCREENABLE.fullmatch(value) else None


_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_UNICODE = re.compile(r"\\+u([0-9A-Fa-f]{4})")
_ESCAPE = re.compile(r"\\+([\"/bfnrt])")
_ESCAPED = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _decoded(text: str) -> str:
    """``text`` with the escapes a secret's spelling may use undone: percent-encoding,
    JSON's ``\\uXXXX`` and one-letter escapes at any depth; then "+" and " " made one.

    Only to screen the patterns worth running: with 256 secrets known, a 1 MB answer
    holding a backslash (any JSON with a line break) was searched by each of them,
    twice, on the event loop (16 s for five such answers, where the turn had 2 s).
    A printable ASCII secret spelled any way in ``text`` is in this, or raw in the
    text itself (an escape undone next to a raw spelling may take its first
    characters along: both are looked in).
    """
    for _ in range(2):  # once, and again for a URL quoted inside another
        text = _PERCENT.sub(lambda m: chr(int(m[1], 16)), text)
    text = _UNICODE.sub(lambda m: chr(int(m[1], 16)), text)
    text = _ESCAPE.sub(lambda m: _ESCAPED.get(m[1], m[1]), text)
    return _plain(text)


@functools.lru_cache(maxsize=2 * _MAX_KNOWN)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# Every spelling `Secret.pattern` allows but a character's own holds "%" (percent-
# encoded) or "\\" (JSON-escaped, "\\/"), except "+" read as a space: a text without
# either spells a secret only as its raw value, up to "+" and " ".
def _raw_only(text: str) -> bool:
    return "%" not in text and "\\" not in text


def _plain(text: str) -> str:
    """``text`` with "+" and " " made one, so a raw spelling is a plain substring."""
    return text.replace(" ", "+")


def _plain_forms(values: Iterable[str]) -> tuple[str, ...]:
    """The plain form of each value long enough to be scrubbed (`scrubbable`)."""
    return tuple(_plain(value) for value in values if scrubbable(value))


def _plain_of(secrets: Iterable[str | Secret]) -> tuple[str, ...]:
    return _plain_forms(s.reveal() if isinstance(s, Secret) else s for s in secrets)


def _may_spell(text: str, plain: tuple[str, ...]) -> bool:
    """Whether ``text``, which spells secrets only raw (`_raw_only`), may hold one of ``plain``."""
    if not plain:
        return False
    text = _plain(text)
    return any(value in text for value in plain)


_known = SecretRegistry(_MAX_KNOWN)


def register_secret(value: str | Secret) -> Secret:
    """Declare a credential fanout did not see sent, so that no answer, event or log shows it.

    The HTTP transport registers what requests carry by itself; use this for
    keys a tool holds some other way (an SDK on its own client, a database
    password). Returns the value as a `Secret`.
    """
    if not isinstance(value, str | Secret):
        # Not quoted: a key read as bytes is as secret as one read as text.
        raise ConfigurationError(
            f"register_secret takes a str or a Secret, not {type(value).__name__}"
        )
    secret = value if isinstance(value, Secret) else Secret(value)
    _known.learn([secret], pinned=True)
    return secret


def secrets_learned() -> int:
    """How many times this process learned a new secret: text scrubbed and kept since
    an earlier count may show one learned after it (`fanout.contrib._safety.BoundedLabels`)."""
    return _known.changes


def learn(secrets: Iterable[Secret], *, pinned: bool = False) -> None:
    """Remember secrets the HTTP layer saw a request carry; ``pinned``, for good (a key a
    session or client was given once, and sends on every request without fanout seeing
    each: a Redis password, an MCP session's header)."""
    _known.learn(secrets, pinned=pinned)


def scrub_secrets(text: str, secrets: Iterable[str | Secret] = ()) -> str:
    """``text`` with every form of ``secrets`` and of every registered secret replaced."""
    if _raw_only(text):
        # Most texts (a URL, an answer) can spell a secret only raw, and hold none:
        # a look for each is cheaper than the pattern, which then need not be built.
        secrets = tuple(secrets)
        if not (_known.may_be_in(text) or (secrets and _may_spell(text, _plain_of(secrets)))):
            return text
    # A call's secrets were learned when sent: only those the registry lacks
    # need a pattern of their own. An empty collection has none to look up
    # (anything else, a generator too, is looked up).
    own = (
        compiled(_known.unknown(s if isinstance(s, Secret) else Secret(s) for s in secrets))
        if secrets
        else ()
    )
    screens: tuple[str, str] | None = None
    for pattern, screen in (*own, *_known.patterns()):
        if screen is not None:
            screens = screens or (_plain(text), _decoded(text))
            if screen not in screens[0] and screen not in screens[1]:
                continue
        text = pattern.sub(REDACTED, text)
    return text


# Where fanout cut a long text (``fanout._canonical.truncate``), raw or inside JSON;
# every such place holds the marker's words, which most answers lack (a quicker test).
_CUT_WORDS = "[truncated by fanout: "
_CUT = re.compile(r"(?:\n|\\n)" + re.escape(_CUT_WORDS))


def scrub_cut_secrets(text: str, secrets: Iterable[str | Secret] = ()) -> str:
    """``text`` with the start of a secret that a size cap cut in two replaced.

    A cap may fall inside a key: what is left before the cut is no longer
    the whole secret, so it escapes `scrub_secrets`; here it is replaced if
    it is at least `MIN_LENGTH` characters of a known secret's beginning.
    """
    if _CUT_WORDS not in text:
        return text
    cuts = [match.start() for match in _CUT.finditer(text)]
    if not cuts:
        return text
    raw = {secret.reveal() if isinstance(secret, Secret) else secret for secret in secrets}
    # As written, and as written in JSON: a cap falls in a part's JSON too (`encode_parts`),
    # where a key's quote or backslash is escaped, and a head of it read only as written
    # was left whole but its last character.
    spellings = {*raw, *_known.values()}
    spellings |= {json.dumps(value, ensure_ascii=ascii)[1:-1] for value in spellings
                  for ascii in (False, True)}  # fmt: skip
    values = sorted(spellings, key=len, reverse=True)
    for cut in reversed(cuts):
        head = text[:cut]
        for value in values:
            start = next(
                (len(head) - k for k in range(len(value) - 1, MIN_LENGTH - 1, -1)
                 if head.endswith(value[:k])),
                None,
            )  # fmt: skip
            if start is not None:
                text = text[:start] + REDACTED + text[cut:]
                break
    return text
