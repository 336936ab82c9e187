"""Which parts of a request are credentials, and what values they carry.

A decision, not a guess: the header and query parameter names below, plus
any a user adds (validated, so a typo is an error rather than a silent
miss), and the URL's userinfo. A Basic credential is decoded, so that a
server quoting ``user:password`` or the password alone is scrubbed too;
a Cookie header gives each session-length value.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, unquote, urlsplit

import attrs

from ._exceptions import ConfigurationError
from ._secrets import MIN_LENGTH, Secret

__all__ = [
    "CREDENTIAL_HEADERS",
    "CREDENTIAL_PARAMS",
    "CredentialNames",
    "cookies_set",
    "credentials_in",
]

CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-access-token",
        "x-goog-api-key",
        "ocp-apim-subscription-key",
        "x-amz-security-token",
        "private-token",
        "mcp-session-id",
        "cookie",
        "set-cookie",
    }
)
"""Request headers whose whole value is a credential (names compared case-insensitively).

An MCP session's id is one: whoever holds it acts in the session."""

CREDENTIAL_PARAMS = frozenset(
    {
        "key",
        "api_key",
        "api-key",
        "apikey",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "auth",
        "secret",
        "client_secret",
        "password",
        "passwd",
        "sig",
        "signature",
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-credential",
        "private_token",
        "subscription-key",
        "appid",
    }
)
"""Query parameters whose value is a credential (names compared case-insensitively)."""

# RFC 9110 token: what a header name, or an authorization scheme, may be.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")
_PARAM_NAME = re.compile(r"[\x21-\x7e]{1,100}")
_MIN_COOKIE = 8  # characters: a shorter cookie value is a preference, not a session


@attrs.frozen
class CredentialNames:
    """Which request headers and query parameters carry credentials.

    The defaults are `CREDENTIAL_HEADERS` and `CREDENTIAL_PARAMS`; names
    given here are added to them (never replace them). A header name must be
    an HTTP token, a parameter name printable ASCII without spaces: anything
    else is a `ConfigurationError`, not a silent miss.
    """

    headers: frozenset[str] = attrs.field(default=CREDENTIAL_HEADERS)
    params: frozenset[str] = attrs.field(default=CREDENTIAL_PARAMS)

    @classmethod
    def adding(cls, headers: Iterable[str] = (), params: Iterable[str] = ()) -> CredentialNames:
        """The defaults plus ``headers`` and ``params``."""
        extra_headers = _validated(headers, _TOKEN, "header")
        extra_params = _validated(params, _PARAM_NAME, "query parameter")
        return cls(CREDENTIAL_HEADERS | extra_headers, CREDENTIAL_PARAMS | extra_params)


def _validated(names: Iterable[str], pattern: re.Pattern[str], what: str) -> frozenset[str]:
    if isinstance(names, str):
        raise ConfigurationError(f"credential {what} names must be a collection, not one string")
    if not isinstance(names, Iterable):
        raise ConfigurationError(
            f"credential {what} names must be a collection, not {type(names).__name__}"
        )
    checked = set()
    for name in names:
        if not isinstance(name, str) or not pattern.fullmatch(name):
            # Not quoted: handed ``headers.items()``, the message quoted each key.
            given = f"{len(name)} characters" if isinstance(name, str) else type(name).__name__
            raise ConfigurationError(
                f"a credential {what} name must be a name (printable, no spaces), not a "
                f"{given} value that is not one"
            )
        checked.add(name.lower())
    return frozenset(checked)


def credentials_in(
    headers: Iterable[tuple[str, str]], url: str, names: CredentialNames
) -> set[Secret]:
    """The credentials a request carries: in ``names``' headers, query parameters and userinfo."""
    found: set[str] = set()
    for name, joined in headers:
        lowered = name.lower()
        if lowered not in names.headers:
            continue
        found.add(joined)
        if lowered in ("cookie", "set-cookie"):
            found.update(_cookie_values(joined))
            continue
        found.add(joined)
        params = _auth_params(joined)
        if params is not None:
            found.update(params)
            continue
        # A header sent twice reaches here joined ("a, b"), as httpx reads it: each
        # value is a credential of its own, and a server quotes one line at a time.
        for value in {joined, *(part.strip() for part in joined.split(","))}:
            found.add(value)
            found.update(_after_scheme(value))
    parts = urlsplit(url)
    for name, value in parse_qsl(parts.query, keep_blank_values=False) if parts.query else ():
        if name.lower() in names.params:
            found.add(value)
    if "@" in parts.netloc and parts.password:  # only userinfo holds a password
        password = unquote(parts.password)
        found.update({password, f"{unquote(parts.username or '')}:{password}"})
    found.update(_bot_tokens(unquote(parts.path)))
    return {Secret(value) for value in found if len(value) >= MIN_LENGTH}


# A bot's token as Telegram's Bot API takes it, in the path: ``/bot<id>:<secret>/<method>``.
_PATH_BOT_TOKEN = re.compile(r"/bot([0-9]{5,}:[A-Za-z0-9_-]{30,})(?=/|$)")


def _bot_tokens(path: str) -> set[str]:
    """The bot tokens in a URL's ``path``, whole and their secret part (a server quotes
    either; unread, the path held the only credential of the request and it reached the
    model); the bot's id alone is no secret."""
    tokens = set(_PATH_BOT_TOKEN.findall(path))
    return tokens | {token.partition(":")[2] for token in tokens}


# An authorization parameter (``qop=auth``, ``Signature=<hex>``, ``response="<hash>"``):
# its name, and its value unquoted.
# One ``name=value`` of a parameter list, the value quoted (commas and escapes inside) or
# not, and the comma after it (or the end).
_AUTH_PARAM = re.compile(
    r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,"]+)\s*(?:,|$)'
)
_QUOTED_PAIR = re.compile(r"\\(.)")
# Those whose value is the secret part: a signature, a Digest response, Hawk's ``mac``, a
# token, and every name that is a credential as a query parameter (``key=``,
# ``client_secret=``: a custom scheme's list is a query string in another spelling).
_SECRET_AUTH_PARAMS = CREDENTIAL_PARAMS | {
    "response", "oauth_signature", "oauth_token", "mac", "hash",
}  # fmt: skip


def _auth_params(value: str) -> set[str] | None:
    """The secret values of a scheme's parameter list (``Digest username="bob", ...,
    response="<hash>"``, AWS's ``Credential=..., SignedHeaders=..., Signature=<hex>``);
    None if ``value`` is no such list. (Each of their parts was learned: ``qop=auth``
    and ``SignedHeaders=host`` were scrubbed from unrelated answers, and the bare
    signature or hash, which a server quotes back, was not known.) A list of one
    parameter is the credential alone (Rails' ``Token token="<key>"``), whatever its
    name: only ``token="<key>"`` was learned, and the bare key quoted back was not."""
    _, _, rest = _scheme_and_rest(value)
    params: list[tuple[str, str]] = []
    at = 0
    while at < len(rest):
        param = _AUTH_PARAM.match(rest, at)
        if param is None or param.end() == at:
            return None
        name, spelled = param[1], param[2]
        if spelled.startswith('"'):  # a quoted value may hold commas (a Digest uri="/q?a,b")
            spelled = _QUOTED_PAIR.sub(r"\1", spelled[1:-1])
        elif not spelled.strip("="):  # base64's padding (``Basic dXNlcjpwdw==``): no list
            return None
        params.append((name, spelled))
        at = param.end()
    if not params:
        return None
    if len(params) == 1:
        return {params[0][1], rest.strip()} - {""}
    return {spelled for name, spelled in params if name.lower() in _SECRET_AUTH_PARAMS and spelled}


def _scheme_and_rest(value: str) -> tuple[str, str, str]:
    """``value`` split at the first run of whitespace after its scheme (a tab too:
    ``Bearer<TAB><token>`` was learned only whole)."""
    parts = value.strip().split(None, 1)
    return (parts[0], " ", parts[1]) if len(parts) == 2 else (value.strip(), "", "")


def _after_scheme(value: str) -> set[str]:
    """The token after an authorization scheme, whatever the scheme (``Bearer``,
    Okta's ``SSWS``, Discord's ``Bot``), and what a Basic credential encodes.

    A server that refuses the key quotes the token alone; only listed
    schemes were read, and "SSWS 00QC..." left its token to be quoted.
    """
    scheme, _, credential = _scheme_and_rest(value)
    credential = credential.strip()
    if not credential or not _TOKEN.fullmatch(scheme):
        return set()
    if scheme.lower() == "basic":
        return {credential, *_basic_parts(credential)}
    # ``account:signature`` (Azure's ``SharedKey``): a server quotes the signature alone.
    _, colon, after = credential.partition(":")
    return {credential, after} if colon and after and " " not in credential else {credential}


def cookies_set(lines: Iterable[str]) -> set[Secret]:
    """The cookies a response's ``Set-Cookie`` lines set, long enough to be a session: a
    server's session cookie is as much a credential as the key that got it (a tool that
    returned ``dict(response.cookies)`` showed the model the session). Only each line's
    first pair is the cookie; the attributes after it (an ``Expires`` date) are not."""
    values = set()
    for line in lines:
        _, _, value = line.split(";", 1)[0].partition("=")
        values.add(value.strip().strip('"'))
    return {Secret(value) for value in values if len(value) >= max(_MIN_COOKIE, MIN_LENGTH)}


def _cookie_values(header: str) -> set[str]:
    """The values of a Cookie header long enough to be a session (``theme=dark`` is not).

    Split at commas too: a cookie's value holds none (RFC 6265), and a Cookie sent
    as two header lines (as HTTP/2 clients send them) is read joined by one
    (``sid=<a>, csrf=<b>``: neither value was learned)."""
    values = set()
    for pair in re.split(r"[;,]", header):
        _, _, value = pair.partition("=")
        values.add(value.strip().strip('"'))
    return {value for value in values if len(value) >= _MIN_COOKIE}


# A user that reads as a key, not a name: 16 or more characters of letters, digits and
# "-_.", a digit among them.
_KEYLIKE = re.compile(r"(?=[^0-9]*[0-9])[A-Za-z0-9._-]{16,}")
# Passwords that say, by an API's convention, that the user is the key and the password
# is a fixed word, no secret: Toggl's ``<token>:api_token``.
_KEY_AS_USER_PASSWORDS = frozenset({"api_token"})


def _basic_parts(credential: str) -> set[str]:
    """``user:password`` and the password (with none, the user) a Basic credential encodes;
    none if not base64."""
    try:
        raw = base64.b64decode(credential, validate=True)
    except (binascii.Error, ValueError):
        return set()
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:  # RFC 7617's legacy charset, as ``requests`` sends it
        decoded = raw.decode("latin-1")
    user, colon, password = decoded.partition(":")
    if not colon:
        return {decoded}
    if _user_is_the_key(user, password):
        return {decoded, user}
    return {decoded, password}


def _user_is_the_key(user: str, password: str) -> bool:
    """Whether a Basic login's user is its key rather than a name.

    So with no password (Stripe's ``auth=(key, "")``), or with a word an API's
    convention puts there (Toggl's ``api_token``, itself no secret: learned, the
    word was taken out of every answer), or with a dummy password too short to
    be one beside a user that reads as a key (Freshdesk's and BambooHR's ``X``).
    Beside a real password the user is a name, however it reads: learned,
    "support@example.com" (beside a 7-character password) and
    "svc-reporting-2024" were taken out of every answer of the process.
    """
    if not password or password in _KEY_AS_USER_PASSWORDS:
        return True
    return len(password) < MIN_LENGTH and _KEYLIKE.fullmatch(user) is not None
