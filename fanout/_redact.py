"""Keeping credentials out of everything fanout writes.

A key leaks through the text around it: an exception that prints a URL with
``?api_key=...`` or ``https://user:password@host``, a header echoed into a
log line. Everything the HTTP layer puts in a trace event, an error message
or a result goes through here first, and so does every final answer. Two
nets, one after the other: the secrets fanout knows (`fanout._secrets`), in
every form a server may echo them; then credentials by shape, for keys it
was never shown.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs

from ._credentials import CREDENTIAL_HEADERS, CREDENTIAL_PARAMS
from ._secrets import REDACTED, Secret, scrub_cut_secrets, scrub_secrets

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._values import ToolResult

__all__ = ["REDACTED", "address", "read_as_credentials", "redact_text", "redact_url", "scrubbed"]


def _names(names: Iterable[str]) -> str:
    return "|".join(sorted(map(re.escape, names), key=len, reverse=True))


def _value_replaced(match: re.Match[str]) -> str:
    """What a shape whose group 1 is the text it keeps becomes: that text and ``REDACTED``.

    A value that is ``REDACTED``'s own beginning was redacted already and then
    cut by a size cap ("&token=REDA"): replaced again, it grew the capped
    answer past the cap.
    """
    kept = match.group(1)
    if REDACTED.startswith(match.group(0)[len(kept) :]):
        return match.group(0)
    return kept + REDACTED


# Credentials by shape, wherever they stand in free text, each with the text
# it keeps: a bearer token; a vendor key (sk-..., ghp_...); a credential query
# parameter; URL userinfo; and a credential header quoted as text
# ("Authorization: Basic ...", or a JSON pair '"x-api-key": "..."').
#
# Free text is often JSON (every error answer is), so no value replaced may
# reach across its string: a backslash is taken only with what it escapes,
# never before a quote (that quote would then end the string), and a
# header's value is never a word that a quote and a colon follow, which is
# the next key ('"message":"...Cookie","started":true' once lost its field
# "started" to a cookie's value). Userinfo ends at its "@", so it needs
# neither.
#
# And in JSON, a line break or a tab is written ``\n`` or ``\t``: before a word, it is
# a break (``_START``), and between a header and its value, space (``_SPACE``); a
# quote inside a string is written ``\"`` (``_QUOTE``), as a JSON text a tool hands
# back inside its output is (and ``\\\"`` a level deeper). Read as letters,
# "Authorization:\nBearer <token>" in a JSON answer lost only "\nBearer" and kept
# the token, "\nsk-..." was no key at all, and '{\"x-api-key\": \"<key>\"}' was
# no header. A known secret's ``REDACTED`` just before a shape is a break too.
_START = rf"(?:\b|(?<=\\[nrtbf])|(?<={REDACTED}))"
# Space between a name and its value: on the same line (raw line breaks are not crossed:
# "Cookie:" ending one line took the whole next one as its value), or JSON's escaped ones.
_SPACE = r"(?:[ \t]|\\+[nrt])"
# A quote, raw or escaped (an odd number of backslashes before it: after an even number
# it is no escaped quote but the end of a string, and a value read past it broke JSON).
_QUOTE = r"(?:\\(?:\\\\)*+)?+[\"']"
# A quote that opens a value: a value follows it, not a string's end (',' '}' ']'), an
# empty value, or space.
_OPENS = rf"(?:(?-i:b)?{_QUOTE}(?![\s,;}}\]:\"'\\]))"
# What a value may hold: a character, an escaped one, or escaped backslashes, but never
# half a run of backslashes before a quote (``\\\"``, a quote escaped in JSON in JSON).
# Each value is bounded, and taken whole (possessive): a long run of backslashes after
# "Authorization: " was tried one way after another, and a 40 KB text took 2 s.
_ESCAPES = r"\\[^\s\"'\\]|(?:\\\\)++(?![\\\"'])"


def _run(allowed: str, most: int = 4096) -> str:
    """A value: up to ``most`` of the ``allowed`` characters (a class's inside) or escapes."""
    return rf"(?:[{allowed}]|{_ESCAPES}){{1,{most}}}+"


def _key_ahead(allowed: str) -> str:
    """What a value read so would be where it is the next JSON key: a key is short."""
    return rf"{_run(allowed, 256)}{_QUOTE}{_SPACE}*+:"


# A query value ends before a ")" or "]" too: no key holds one, and a link's or a call's
# closing bracket went with the value ("[the map](...?key=REDACTED for details").
_PARAM_VALUE = _run(r"^&\s\"'<>\\#)\]")
_HEADER_CHARS = r"^\s\"',;\]}\\"
_HEADER_VALUE = _run(_HEADER_CHARS)
_KEY_AHEAD = _key_ahead(_HEADER_CHARS)
# A cookie header's value runs to the end of its line or string: every pair in it
# ("theme=dark; session=<value>") may be the one that matters.
_COOKIE_CHARS = r"^\r\n\"'\\"
_COOKIES_VALUE = rf"(?=[^\s,;]){_run(_COOKIE_CHARS)}"
_COOKIES_AHEAD = _key_ahead(_COOKIE_CHARS)
# Between a header's name and its value: '": "' or '": ["' (a JSON key, its value a
# string), "', b'" (httpcore's DEBUG line, ``(b'name', b'value')`` pairs, and a JSON
# list's ``"name", "value"``), or ": " (text, the value quoted or not). A JSON key
# whose value is no string (``"Authorization": null``) has none to hide: replaced by a
# bare REDACTED, the JSON no longer parsed. The quote that opens the value is the group
# ``opened``: a value in quotes is the header's, whatever it reads as.
_BETWEEN = (
    rf"(?:{_QUOTE}{_SPACE}*,{_SPACE}*(?={_OPENS})"
    rf"|{_QUOTE}{_SPACE}*[:=]{_SPACE}*(?:\[{_SPACE}*)?(?={_OPENS})"
    rf"|{_SPACE}*[:=]{_SPACE}*)(?P<opened>{_OPENS})?+"
)
# An authorization scheme fanout shows, or any other word before the credential
# ("SSWS <token>", "Bot <token>"): such a word and the credential are replaced together.
_KNOWN_SCHEME = rf"(?:(?:bearer|basic|token){_SPACE}+)"
_OTHER_SCHEME = rf"(?:[A-Za-z][A-Za-z0-9_.-]{{0,31}}{_SPACE}+(?!{_QUOTE}|{_SPACE}))"
_COOKIE_HEADERS = frozenset({"cookie", "set-cookie"})
# A token is a credential's when it has a digit, or is long: "bearer authentication"
# and Django's "pk_url_kwarg" are words.
_TOKENISH = r"(?=[A-Za-z._~+/=-]*[0-9]|[A-Za-z0-9._~+/=-]{20})"
# A header's value neither quoted nor after a scheme fanout shows may be prose: "Missing
# X-Api-Key: no key was provided" lost "no key" (read as a scheme and its token). So
# there a value is taken only if it reads as a credential: a token (`_TOKENISH`), or a
# word of 8 or more characters that ends the line ("X-Api-Key: <key>" in a curl
# command); after a word that reads as a scheme (a capital: "Bot", "SSWS"), one of 8
# or more, or a token after any word.
_ENDS_LINE = rf"(?=[{_HEADER_CHARS}]{{8,}}+(?![ \t]++[^\s]))"
_SCHEMED = (
    rf"(?:(?=(?-i:[A-Z])){_OTHER_SCHEME}(?=[{_HEADER_CHARS}]{{8}})|{_OTHER_SCHEME}{_TOKENISH})"
    rf"(?!{_KEY_AHEAD})"
)
_BARE_HEADER_VALUE = rf"(?:{_SCHEMED}|{_TOKENISH}|{_ENDS_LINE}){_HEADER_VALUE}"
_ANY_HEADER_VALUE = rf"(?:{_OTHER_SCHEME}(?!{_KEY_AHEAD})(?={_HEADER_VALUE}))?{_HEADER_VALUE}"
# A cookie header's bare value after a colon is cookies only if it holds one (a name and
# "=", or Gson's "\u003d"): "Cookie: none sent" is prose. After "cookie=" it is one.
_COOKIE_BARE = r"(?:(?<==)|(?=[^\s=;,\"'\\]++(?:=|\\u003[dD])))"
# Parameters that name a credential after a space or a comma too, as in AWS's
# "Credential=..., SignedHeaders=..., Signature=<hex>" (the generic names, "key" and
# "token", are left to their query form: "key=value pairs" is prose).
_LOOSE_PARAMS = (
    "signature", "x-amz-signature", "sig", "access_token", "refresh_token", "id_token",
    "client_secret", "password", "passwd", "api_key", "apikey", "api-key",
)  # fmt: skip

# A value that is code naming where a credential is kept, not the credential: a read of
# the environment (``os.environ["X"]``, ``os.environ.get(``, ``os.getenv(``,
# ``process.env.X``), a settings object's attribute (``settings.X``), a shell's or a
# template's variable (``${X}``, or ``$X`` in capitals and nothing after it). Taken for
# a value, ``password=os.environ["DB_PASSWORD"]`` in a tool's answer of source code
# lost its code, and ``Authorization: Bearer $TOKEN`` in a curl command its variable.
_CODE_REFERENCE = (
    r"(?:os\.environ\s*+[\[.]|os\.getenv\s*+\(|process\.env\.|settings\.[A-Za-z_]"
    r"|\$\{[A-Za-z_][A-Za-z0-9_]*+[}:]|(?-i:\$[A-Z_][A-Z0-9_]*+(?![A-Za-z0-9._~+/=-])))"
)
# A header's value that is such code, after a scheme or not (``Bearer $TOKEN``): looked
# for before the scheme, or the scheme word alone was taken for the value.
_CODE_VALUE = rf"(?:[A-Za-z][A-Za-z0-9_.-]{{0,31}}{_SPACE}+)?{_CODE_REFERENCE}"

# A shape, and what a match of it becomes.
_Shape = tuple[re.Pattern[str], Any]


def _shapes(headers: Iterable[str], params: Iterable[str]) -> tuple[_Shape, ...]:
    """The shapes, with ``headers`` and ``params`` as the credential names."""
    return (
        (
            re.compile(
                rf"(?i)({_START}bearer{_SPACE}+)(?!{_CODE_REFERENCE}){_TOKENISH}[A-Za-z0-9._~+/=-]{{8,}}+"
            ),
            rf"\1{REDACTED}",
        ),
        (
            re.compile(
                rf"{_START}(?:sk|pk|rk|xox[abpr]|ghp|gho|ghs|glpat)[-_]"
                rf"{_TOKENISH}[A-Za-z0-9_-]{{8,}}+"
            ),
            REDACTED,
        ),
        # A query's, or a fragment's (an OAuth redirect's "#access_token=").
        (
            re.compile(rf"(?i)([?&;#](?:{_names(params)})=)(?!{_CODE_REFERENCE}){_PARAM_VALUE}"),
            _value_replaced,
        ),
        (
            re.compile(
                rf"(?i)((?<=[\s,])(?:{_names(_LOOSE_PARAMS)})=)(?!{_CODE_REFERENCE}){_PARAM_VALUE}"
            ),
            _value_replaced,
        ),
        # A scheme is short: unbounded, every word of "a-a-a-..." ran to the text's end
        # looking for "://", and a 20,000-character message took most of a second.
        # Userinfo is a credential with a password in it, or a user that is a token (a
        # GitHub token as the user); a name alone is not ("ssh://git@github.com", a
        # "postgres://postgres@localhost" lost their user names).
        (
            re.compile(
                rf"(?i)(\b[a-z][a-z0-9+.-]{{0,31}}://)"
                rf"(?:[^/?#\s@\"'<>:]*:[^/?#\s@\"'<>]*|{_TOKENISH}[^/?#\s@\"'<>:]{{8,}})@"
            ),
            rf"\1{REDACTED}@",
        ),
        (
            re.compile(
                rf"(?i)({_START}(?:{_names(_COOKIE_HEADERS)}){_BETWEEN})"
                rf"(?!{_COOKIES_AHEAD})(?(opened)|{_COOKIE_BARE}){_COOKIES_VALUE}"
            ),
            _value_replaced,
        ),
        (
            re.compile(
                rf"(?i)({_START}(?:{_names(set(headers) - _COOKIE_HEADERS)}){_BETWEEN}"
                rf"(?!{_CODE_VALUE})(?P<scheme>{_KNOWN_SCHEME})?)(?!{_KEY_AHEAD})"
                rf"(?(opened){_ANY_HEADER_VALUE}|(?(scheme){_ANY_HEADER_VALUE}|{_BARE_HEADER_VALUE}))"
            ),
            _value_replaced,
        ),
    )


def _shape_words(headers: Iterable[str]) -> re.Pattern[str]:
    """What some shape needs in a text of ASCII, lower-cased: a bearer token or a
    credential header by name, a query parameter ("="), userinfo ("@"). A text with
    none of them (nor a vendor key's prefix) is left as it is without trying each shape."""
    return re.compile(rf"bearer|{_names(headers)}|[=@]")


@attrs.frozen
class _Names:
    """The credential names the shapes know: the defaults, and those any transport was
    told (`read_as_credentials`), with the shapes and the prefilter made of them."""

    headers: frozenset[str]
    params: frozenset[str]
    shapes: tuple[_Shape, ...]
    words: re.Pattern[str]

    @classmethod
    def of(cls, headers: frozenset[str], params: frozenset[str]) -> _Names:
        return cls(headers, params, _shapes(headers, params), _shape_words(headers))


_known_names = _Names.of(CREDENTIAL_HEADERS, CREDENTIAL_PARAMS)
_VENDOR_PREFIX = re.compile(r"(?:sk|pk|rk|xox[abpr]|ghp|gho|ghs|glpat)[-_]")


def read_as_credentials(headers: Iterable[str] = (), params: Iterable[str] = ()) -> None:
    """Header and query parameter names a transport was told carry credentials
    (``secret_headers=``, ``secret_params=``): from now on their values are redacted
    by shape too, wherever they stand.

    A key sent under such a name is known as a secret while the process-wide
    registry keeps it (`fanout._secrets`, the 256 latest); past that, only its
    shape hides it, and the shapes knew the default names alone: a call still out
    when 300 others sent keys of their own had its ``tenant_sig=`` written in
    clear in httpx's log line for it.
    """
    global _known_names
    names = _known_names
    more_headers = names.headers | {name.lower() for name in headers}
    more_params = names.params | {name.lower() for name in params}
    if (more_headers, more_params) == (names.headers, names.params):
        return
    _known_names = _Names.of(more_headers, more_params)
    _redact_shapes.cache_clear()


def redact_url(url: object, secrets: Iterable[str | Secret] = ()) -> str:
    """The URL with credential query values, any userinfo and known ``secrets`` replaced."""
    try:
        parts = urlsplit(str(url))
        port = parts.port
    except ValueError:  # not a URL we can take apart: scrub it as text
        return redact_text(str(url), secrets)
    query = parts.query and urlencode(
        [
            (name, REDACTED if name.lower() in _known_names.params else value)
            for name, value in parse_qsl(parts.query, keep_blank_values=True)
        ],
        safe="/:",
    )
    netloc = address(parts.hostname, port)
    cleaned = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return redact_text(cleaned, secrets)


def address(host: str | None, port: int | None) -> str:
    """A URL's host and port, without its userinfo (a password, there); an IPv6 literal
    keeps its brackets."""
    host = host or ""
    if ":" in host:
        host = f"[{host}]"
    return host if port is None else f"{host}:{port}"


def redact_text(text: str, secrets: Iterable[str | Secret] = ()) -> str:
    """Free text with known secrets (``secrets`` and every registered one) and
    credential-shaped tokens replaced."""
    text = scrub_secrets(text, secrets)
    return _shapes_gone(text) if len(text) > _REMEMBERED_SIZE else _redact_shapes(text)


# Texts longer than this are not remembered: 200 answers of 1 MB, remembered whole,
# held 400 MB after the turns that made them were gone.
_REMEMBERED_SIZE = 4096


def _shapes_gone(text: str) -> str:
    """``text`` with credential-shaped tokens replaced."""
    return _replace_shapes(text) if _may_show_a_shape(text) else text


# The same, remembered (for texts up to `_REMEMBERED_SIZE`), since answers repeat.
_redact_shapes = functools.lru_cache(maxsize=1024)(_shapes_gone)


def _may_show_a_shape(text: str) -> bool:
    """False only when no shape can match ``text``; outside ASCII, case folding is
    Unicode's (the shapes' ``(?i)`` takes the dotless i, U+0131, for "i"), so such a
    text is tried."""
    if not text.isascii():
        return True
    return bool(_known_names.words.search(text.lower()) or _VENDOR_PREFIX.search(text))


def _replace_shapes(text: str) -> str:
    """``text`` with every shape tried and replaced."""
    for shape, replacement in _known_names.shapes:
        text = shape.sub(replacement, text)
    return text


def scrubbed(result: ToolResult, secrets: Iterable[str | Secret] = ()) -> ToolResult:
    """The answer with no credential in its content or scope: what every answer becomes.

    Called where an answer is made final, so fresh, coalesced, cached and
    replayed answers all pass through it, as do the cache and the store.
    """
    secrets = tuple(secrets)
    content = scrub_cut_secrets(redact_text(result.content, secrets), secrets)
    scope = None if result.scope is None else redact_text(result.scope, secrets)
    if content == result.content and scope == result.scope:
        return result
    return attrs.evolve(result, content=content, scope=scope)
