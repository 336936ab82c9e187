"""Which parts of a request are credentials, and what values they carry.

A decision, not a guess: the header and query parameter names below, plus
any a user adds (validated, so a typo is an error rather than a silent
miss), and the URL's userinfo. A Basic credential is decoded, so that a
server quoting ``user:password`` or the password alone is scrubbed too;
a Cookie header gives each session-length value. A body's fields are read
too, form-encoded or JSON (`BODY_LIMIT`): a login's password, a token
endpoint's ``refresh_token`` and ``client_secret``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, unquote, urlsplit

import attrs

from ._exceptions import ConfigurationError
from ._secrets import MIN_LENGTH, Secret, scrubbable

__all__ = [
    "BODY_LIMIT",
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
    headers: Iterable[tuple[str, str]], url: str, names: CredentialNames, body: bytes = b""
) -> set[Secret]:
    """The credentials a request carries: in ``names``' headers, query parameters and
    userinfo, and in its ``body``'s fields (`_body_credentials`)."""
    found: set[str] = set()
    content_type = ""
    for name, joined in headers:
        lowered = name.lower()
        if lowered == "content-type":
            content_type = joined
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
    found.update(_body_credentials(body, content_type, names))
    return {Secret(value) for value in found if len(value) >= MIN_LENGTH}


BODY_LIMIT = 65_536
"""Bytes: a request body longer than this is not read for credentials. A login or a
token request is a few hundred bytes; a body of megabytes (an upload) would be parsed
on the event loop for each request that sends it. A body streamed (an iterator, a
file, a multipart upload) is not read at all: reading it would consume it."""


def _body_credentials(body: bytes, content_type: str, names: CredentialNames) -> set[str]:
    """The values of a request body's credential fields (`_is_credential_field`).

    A body form-encoded (as OAuth token endpoints take it:
    ``grant_type=refresh_token&refresh_token=...&client_secret=...``) or JSON, any
    depth (a GraphQL request's ``variables``, Keystone's ``auth.identity.password``).
    A body of no declared type is read as JSON if it opens as JSON, else as a form.
    Only text values, long enough to scrub (`scrubbable`): a number or a boolean is
    no secret, and a ``"password": "x"`` learned took every "x" out of every answer.
    Unread, a server that quotes what it was sent ("invalid password <it>"), as
    many do in an error, showed it to the model.
    """
    if not body or len(body) > BODY_LIMIT:
        return set()
    media = content_type.partition(";")[0].strip().lower()
    text = body.decode("utf-8", "replace")
    if media.endswith(("/json", "+json")) or (not media and text.lstrip()[:1] in ("{", "[")):
        values = _json_credentials(text, names)
    elif media in ("application/x-www-form-urlencoded", ""):
        fields = _body_names(names)
        values = {value for name, value in parse_qsl(text) if _is_credential_field(name, fields)}
    else:
        return set()
    return {value for value in values if scrubbable(value)}


def _json_credentials(text: str, names: CredentialNames) -> set[str]:
    """The text values of a JSON body's credential fields, at any depth, each item of a
    list under such a field too; none if ``text`` is no JSON."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python parses
        return set()
    fields = _body_names(names) - _DATA_IN_JSON
    found: set[str] = set()
    # A stack, not recursion: a body may nest as deep as the parser goes.
    stack: list[tuple[object, bool]] = [(document, False)]
    while stack:
        value, credential = stack.pop()
        if isinstance(value, str) and credential:
            found.add(value)
        elif isinstance(value, list):
            stack.extend((item, credential) for item in value)
        elif isinstance(value, dict):
            stack.extend(
                (item, _is_credential_field(str(key), fields)) for key, item in value.items()
            )
    return found


# A JSON field named ``key`` is mostly data: an object's (S3's and DynamoDB's ``Key``),
# a map entry's, a key pressed. Learned, "reports/q3.pdf" left every answer that listed it.
_DATA_IN_JSON = frozenset({"key"})
# Name endings that make any field a credential (``newPassword``, ``webhookSecret``), where
# others name data too (``nextToken``, ``sortKey``): only the whole name counts for those.
_CREDENTIAL_ENDINGS = ("password", "passwd", "secret")


def _normalised(name: str) -> str:
    """A field's name with its case and separators gone: ``clientSecret``,
    ``client-secret`` and ``CLIENT_SECRET`` are ``client_secret``."""
    return re.sub(r"[^0-9a-z]", "", name.lower())


@functools.cache
def _body_names(names: CredentialNames) -> frozenset[str]:
    """``names``' query parameters, normalised: a body's field is one in any spelling."""
    return frozenset(_normalised(name) for name in names.params)


def _is_credential_field(name: str, fields: frozenset[str]) -> bool:
    normal = _normalised(name)
    return normal in fields or normal.endswith(_CREDENTIAL_ENDINGS)


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
