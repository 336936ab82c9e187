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
* a URL's userinfo password, and ``user:password``;
* each character as an HTML entity (``&#x61;``, ``&#97;``, ``&amp;``);
* the value upper-cased and lower-cased, its UTF-8 as base64 (either alphabet,
  padded or not) and as hex (either case), as a server may write it back;
* its first `HEAD` characters, and whatever of a token follows them, as a log
  shows a key's beginning (``sk-proj-abcdefghijkl...``).

Which request parts are credentials is `fanout._credentials`. Values
shorter than `MIN_LENGTH` are not scrubbed as text: they would match
everywhere and say nothing.

Learned secrets are also kept in one process-wide, bounded registry, so an
answer is scrubbed of every key fanout has seen sent, not only its own call's
(a tool may quote a key in an exception before it sends anything).
"""

from __future__ import annotations

import base64
import functools
import json
import re
import threading
from collections import OrderedDict
from html import unescape
from html.entities import html5
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

        Each character may stand as itself, percent-encoded (either case),
        JSON-escaped or as an HTML entity, independently: libraries encode
        different characters (httpx leaves ``/`` in a query, quotes ``+``), so a
        URL echoed back is often a mix. So may the value in any case, its base64
        and hex (`_base64`, `_hex`), and its head (`HEAD`). None for a value too
        short to scrub.
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


HEAD = 20
"""Characters: a key's beginning this long, shown as a log shows one (``sk-proj-abcd...``),
is scrubbed with what of a token follows it (`_REST`)."""


@functools.lru_cache(maxsize=1024)
def _pattern_for(value: str) -> str | None:
    if not scrubbable(value):
        return None
    forms = [
        # In any case: a server that upper-cases what it quotes, or lower-cases it.
        f"(?i:{_spelled(value)})",
        *(_spelled(form, _LITERAL) for form in _recased(value)),
        # Its padding, however spelled, goes with it.
        *(_spelled(form, _LITERAL) + f"{_spellings('=')}{{0,2}}" for form in _base64(value)),
        f"(?i:{_hex(value)})",
    ]
    if _shows_head(value):
        forms.append(_spelled(value[:HEAD]) + _REST)
    return "|".join(forms)  # the whole value is tried before its head


# What a form of a value made by a program (base64, a case changed) holds that no one
# escapes: only its other characters are spelled every way.
_LITERAL = re.compile(r"[A-Za-z0-9]")


def _spelled(form: str, literal: re.Pattern[str] | None = None) -> str:
    """A pattern of every spelling of ``form``, but of its ``literal`` characters, which
    stand only as themselves (each spelled every way, a form's pattern was ten times a
    value's, and took 0.15 s to compile)."""
    return "".join(
        re.escape(char) if literal and literal.fullmatch(char) else _spellings(char)
        for char in form
    )


# What of a token may follow a key's head: the rest of the key, raw or percent-encoded,
# or the dots a log writes for it.
_REST = r"(?:[A-Za-z0-9._~+/=-]|%[0-9A-Fa-f]{2})*+"


def _recased(value: str) -> list[str]:
    """``value`` upper- and lower-cased, as a server may write it back, where a pattern
    ignoring case would not find it: a character whose other case is two ("ß", "SS"),
    or folds apart from it (a dotless i, whose upper case is "I")."""
    forms = dict.fromkeys(form for form in (value.upper(), value.lower()) if form != value)
    return [
        form for form in forms
        if len(form) != len(value) or form.casefold() != value.casefold()
    ]  # fmt: skip


def _base64(value: str) -> list[str]:
    """``value``'s UTF-8 as base64, in either alphabet, without its padding (which a
    pattern takes after it, or not)."""
    data = value.encode("utf-8")
    encoded = (base64.b64encode(data), base64.urlsafe_b64encode(data))
    return list(dict.fromkeys(form.decode().rstrip("=") for form in encoded))


def _hex(value: str) -> str:
    """``value``'s UTF-8 as hex, in lower case, which a pattern and a screen ignore."""
    return value.encode("utf-8").hex()


def _shows_head(value: str) -> bool:
    """Whether ``value``'s head is a credential's: it is longer than its head, and no
    value of parts (``user:password``, ``Bearer <token>``) whose parts are learned on
    their own, and whose head would be a user name or a scheme."""
    return len(value) > HEAD and not any(char.isspace() or char == ":" for char in value)


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
    alternatives |= _EXTRA_SPELLINGS.get(char, set()) | _entities(char)
    return "(?:" + "|".join(sorted(alternatives, key=len, reverse=True)) + ")"


def _entities(char: str) -> set[str]:
    """``char`` as HTML writes it: by number (``&#x61;``, ``&#97;``) or by name (``&amp;``,
    ``&sol;``), as a page or an HTML-escaped answer quotes a key back."""
    point = ord(char)
    named = {re.escape(f"&{name}") for name in _ENTITY_NAMES.get(char, ())}
    # Hex digits in either case as classes: an inline "(?i:...)" in every character's
    # spellings made a pattern twice as slow to compile.
    digits = "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{point:x}")
    return named | {f"&#(?:[xX]0*{digits}|0*{point});"}


def _names_of_characters() -> dict[str, list[str]]:
    """Each character's HTML names, with their ";" (those without are legacy spellings)."""
    names: dict[str, list[str]] = {}
    for name, char in html5.items():
        if name.endswith(";") and len(char) == 1:
            names.setdefault(char, []).append(name)
    return names


_ENTITY_NAMES = _names_of_characters()


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
        # Each known secret's pattern, compiled once while it is known (`_screened_all`).
        self._screened: dict[Secret, Screened | None] = {}
        # What each secret long enough to scrub must show in a text that spells it
        # only raw (`_raw_forms`); rebuilt, under the lock, whenever the secrets change.
        self._raw: Screens = ((), frozenset())
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
                    forgotten, _ = self._secrets.popitem(last=False)
                    self._screened.pop(forgotten, None)
            if changed:
                self._raw = _raw_forms(secret.reveal() for secret in self._all())
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
                self._patterns = self._screened_all()
                self._current = True
            return self._patterns

    def _screened_all(self) -> tuple[Screened, ...]:
        """Every known secret's pattern, longest first, each compiled once while it is
        known. Left to the compile cache, more secrets than it holds (pinned ones have
        no limit) were all compiled again at each new one: 6 s for 700, on the event
        loop, at every secret learned after them."""
        known = self._all()
        for secret in known:
            if secret not in self._screened:
                self._screened[secret] = _screened(secret)
        known.sort(key=lambda secret: len(secret.reveal()), reverse=True)
        return tuple(entry for secret in known if (entry := self._screened[secret]) is not None)

    def may_be_in(self, text: str) -> bool:
        """Whether ``text`` may spell one of these secrets; False only when it cannot.

        Read without the lock, as `pattern` is: a reader racing a ``learn``
        checks the secrets from just before it.
        """
        return _may_spell(text, self._raw)

    def values(self) -> list[str]:
        with self._lock:
            return [secret.reveal() for secret in self._all()]

    def unknown(self, secrets: Iterable[Secret]) -> list[Secret]:
        """Those of ``secrets`` this registry does not hold (never learned, or evicted)."""
        with self._lock:
            return [s for s in secrets if s not in self._secrets and s not in self._pinned]

    def __repr__(self) -> str:
        return f"<known secrets: {len(self._secrets) + len(self._pinned)}>"


# What a text folded (`_folded`) must hold for a secret's pattern to find it there: one
# of its forms anywhere, or the first `_ANCHOR` letters of one of its encoded forms
# (base64, hex) in a run of their letters (`_looked_in`). Each encoded form looked for
# in the text, 256 secrets known tripled the time a short answer took to scrub; a
# run's every window looked up in a set costs the same however many are known.
Screens = tuple[tuple[str, ...], frozenset[str]]
# A secret's pattern, and what a text must hold once decoded (`_decoded`) for the
# pattern to find it there; None where the decoding cannot say (`_screens_of`).
Screened = tuple[re.Pattern[str], Screens | None]


def compiled(secrets: Iterable[Secret]) -> tuple[Screened, ...]:
    """A pattern for every spelling of each of ``secrets``, longest first (a secret
    that holds another is replaced whole before the other is looked for)."""
    ordered = sorted(secrets, key=lambda secret: len(secret.reveal()), reverse=True)
    return tuple(entry for secret in ordered if (entry := _screened(secret)) is not None)


def _screened(secret: Secret) -> Screened | None:
    """``secret``'s pattern and screens; None for a value too short to scrub."""
    pattern = secret.pattern()
    return None if pattern is None else (_compiled(pattern), _screens_of(secret.reveal()))


# A secret whose every character is printable ASCII, but "%", "\\" and "&": the escapes
# `_decoded` undoes leave it as it is, and every spelling of it becomes one of its forms.
_SCREENABLE = re.compile(r"[ !#$'-\[\]-~\"]+", re.ASCII)


def _screens_of(value: str) -> Screens | None:
    """What a text decoded must hold where it spells ``value`` (None: it cannot tell)."""
    return _screens(value) if _SCREENABLE.fullmatch(value) else None


@functools.lru_cache(maxsize=2 * _MAX_KNOWN)
def _screens(value: str) -> Screens:
    """``value``'s forms (its head where it shows one), folded."""
    shown = value[:HEAD] if _shows_head(value) else value
    anywhere = _fewest({_folded(form) for form in (shown, *_recased(value))})
    return anywhere, frozenset(_folded(form)[:_ANCHOR] for form in (*_base64(value), _hex(value)))


def _fewest(forms: set[str]) -> tuple[str, ...]:
    """``forms`` but those that hold another: a text holding one of them holds one of these."""
    return tuple(sorted(f for f in forms if not any(o != f and o in f for o in forms)))


# Letters: the base64 of a value as short as any scrubbed (`MIN_LENGTH`), unpadded.
_ANCHOR = 11
# A run of base64's letters (either alphabet) or hex's, in a text folded.
_ENCODED_RUN = re.compile(rf"[a-z0-9+/_-]{{{_ANCHOR},}}")


def _looked_in(text: str) -> tuple[str, str]:
    """``text`` folded, and its runs of encoded letters (`Screens`): read before a space
    is folded into a "+", or all of a prose text would be one."""
    lowered = text.casefold()
    return _folded(lowered), "\n".join(_ENCODED_RUN.findall(lowered))


# Letters of runs a window each, per anchor known, past which each anchor is looked for
# in the runs instead: a 2 MB base64 answer took 0.6 s a window at a time, on the event
# loop, where a search per anchor takes milliseconds.
_WINDOWS_PER_ANCHOR = 64


def _holds(looked_in: tuple[str, str], screens: Screens) -> bool:
    folded, runs = looked_in
    anywhere, anchors = screens
    if any(form in folded for form in anywhere):
        return True
    if len(runs) > _WINDOWS_PER_ANCHOR * len(anchors):
        return any(anchor in runs for anchor in anchors)
    return any(runs[at : at + _ANCHOR] in anchors for at in range(len(runs) - _ANCHOR + 1))


_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_UNICODE = re.compile(r"\\+u([0-9A-Fa-f]{4})")
_ESCAPE = re.compile(r"\\+([\"/bfnrt])")
_ESCAPED = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _decoded(text: str) -> str:
    """``text`` with the escapes a secret's spelling may use undone: percent-encoding,
    JSON's ``\\uXXXX`` and one-letter escapes at any depth, HTML's entities.

    Only to screen the patterns worth running: with 256 secrets known, a 1 MB answer
    holding a backslash (any JSON with a line break) was searched by each of them,
    twice, on the event loop (16 s for five such answers, where the turn had 2 s).
    A printable ASCII secret spelled any way in ``text`` is in this, folded, or raw in
    the text itself (an escape undone next to a raw spelling may take its first
    characters along: both are looked in).
    """
    for _ in range(2):  # once, and again for a URL quoted inside another
        text = _PERCENT.sub(lambda m: chr(int(m[1], 16)), text)
    text = _UNICODE.sub(lambda m: chr(int(m[1], 16)), text)
    text = _ESCAPE.sub(lambda m: _ESCAPED.get(m[1], m[1]), text)
    return unescape(text) if "&" in text else text


@functools.lru_cache(maxsize=2 * _MAX_KNOWN)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# Every spelling `Secret.pattern` allows but a character's own holds "%" (percent-
# encoded), "\\" (JSON-escaped, "\\/") or "&" and ";" (an HTML entity), except "+" read
# as a space: a text without them spells a secret only as one of its forms, raw.
def _raw_only(text: str) -> bool:
    return "%" not in text and "\\" not in text and not ("&" in text and ";" in text)


def _folded(text: str) -> str:
    """``text`` with case and "+" or " " made one, so that a raw spelling of a form
    (the value upper-cased too) is a plain substring of the text's."""
    return text.casefold().replace(" ", "+")


def _raw_forms(values: Iterable[str]) -> Screens:
    """What a text must hold, folded, to spell one of ``values`` raw (those long enough
    to be scrubbed, `scrubbable`)."""
    screens = [_screens(value) for value in values if scrubbable(value)]
    return tuple(f for s in screens for f in s[0]), frozenset().union(*(s[1] for s in screens))


def _raw_forms_of(secrets: Iterable[str | Secret]) -> Screens:
    return _raw_forms(s.reveal() if isinstance(s, Secret) else s for s in secrets)


def _may_spell(text: str, forms: Screens) -> bool:
    """Whether ``text``, which spells secrets only raw (`_raw_only`), may hold one of
    ``forms`` (`_raw_forms`)."""
    return bool(forms[0] or forms[1]) and _holds(_looked_in(text), forms)


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
    if not secrets and not _known.changes:
        # No secret of the call's and none ever learned (a process that sent no key):
        # there is nothing to look for, and every answer and event asks.
        return text
    if _raw_only(text):
        # Most texts (a URL, an answer) can spell a secret only raw, and hold none:
        # a look for each is cheaper than the pattern, which then need not be built.
        secrets = tuple(secrets)
        if not (_known.may_be_in(text) or (secrets and _may_spell(text, _raw_forms_of(secrets)))):
            return text
    # A call's secrets were learned when sent: only those the registry lacks
    # need a pattern of their own. An empty collection has none to look up
    # (anything else, a generator too, is looked up).
    own = (
        compiled(_known.unknown(s if isinstance(s, Secret) else Secret(s) for s in secrets))
        if secrets
        else ()
    )
    looked_in: tuple[tuple[str, str], ...] = ()
    for pattern, screens in (*own, *_known.patterns()):
        if screens is not None:
            looked_in = looked_in or (_looked_in(text), _looked_in(_decoded(text)))
            if not any(_holds(each, screens) for each in looked_in):
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
