"""How fanout reaches Redis: one server or a Redis Cluster, named by a URL.

``redis://[user:password@]host:port/db`` is one server, ``rediss://`` the same
over TLS, ``unix:///path/to/socket`` one server on a local socket. With
``cluster=True`` a ``redis://`` or ``rediss://`` URL names one startup node of
a cluster (a managed Valkey or Redis cluster's configuration endpoint); the
client learns the other nodes and the slot map from it. A cluster has only
database 0.

TLS: coredis checks the server's certificate chain but, unless told, not
that the certificate names the host, so any certificate a trusted authority
signed for any name would do. fanout asks for the name check
(``ssl_check_hostname=true``) unless the URL sets it or turns verification
off (``ssl_cert_reqs=none``). coredis's other TLS options (``ssl_ca_certs``,
``ssl_certfile``, ``ssl_keyfile``) pass through.

coredis would accept a URL with any scheme and fail later, far from the
mistake; fanout refuses a URL it cannot use with ``ConfigurationError`` here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

import coredis
from coredis.connection import TCPLocation

from ._credentials import CREDENTIAL_PARAMS, CredentialNames, credentials_in
from ._exceptions import ConfigurationError
from ._secrets import learn

if TYPE_CHECKING:
    import attrs

__all__ = ["RedisClient", "a_client", "a_prefix", "client_from_url"]

RedisClient: TypeAlias = "coredis.Redis[Any] | coredis.RedisCluster[Any]"

_SCHEMES = {False: ("redis", "rediss", "unix"), True: ("redis", "rediss")}


def a_client(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: a coredis client (what fanout calls on one is there)."""
    if not callable(getattr(value, "register_script", None)):
        raise ConfigurationError(
            f"{attribute.name} must be a coredis client, not {type(value).__name__}"
        )


def a_prefix(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: a key prefix is text."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{attribute.name} must be a string, not {value!r}")


def client_from_url(url: str, *, cluster: bool = False) -> RedisClient:
    """A client (not yet entered) for ``url``, answering text; see the module docstring."""
    if not isinstance(url, str):
        raise ConfigurationError(f"a Redis URL is text, not {type(url).__name__}")
    if not isinstance(cluster, bool):
        raise ConfigurationError(f"cluster must be True or False, not {cluster!r}")
    what = "a Redis Cluster URL" if cluster else "a Redis URL"
    shown = _without_password(url)
    userinfo = url.partition("://")[2].rpartition("@")[0]
    if any(char in userinfo for char in "/?#"):
        raise ConfigurationError(
            f"{what} has a user or password holding '/', '?' or '#', which must be "
            f"percent-encoded ('%2F', '%3F', '%23'): {shown!r}"
        )
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigurationError(f"{what} cannot be read: {shown!r}") from None
    if parts.scheme not in _SCHEMES[cluster]:
        schemes = ", ".join(f"{scheme}://" for scheme in _SCHEMES[cluster])
        raise ConfigurationError(f"{what} must start with {schemes}; got {shown!r}")
    try:
        port = 6379 if parts.port is None else parts.port
    except ValueError as exc:
        raise ConfigurationError(f"{what} has a port that is not a number: {shown!r}") from exc
    if not 0 < port < 65536:  # port 0 was read as no port, and 6379 used
        raise ConfigurationError(f"{what} has no usable port: {shown!r}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigurationError(f"{what} must name a host: {shown!r}")
    query = parse_qs(parts.query)
    _check_numbers(what, query, shown)
    # A unix URL's path is its socket; its database comes in the query alone.
    databases = {"" if parts.scheme == "unix" else parts.path.strip("/"), *query.get("db", [])}
    if not all(db.isdigit() for db in databases - {""}):
        raise ConfigurationError(f"{what} names a database that is not a number: {shown!r}")
    if cluster and databases - {"", "0"}:
        raise ConfigurationError(f"a Redis Cluster has only database 0; got {shown!r}")
    # Its password (in the userinfo, or ``?password=``) is a credential like any other: a
    # tool that quotes it (a connection string in an error) has it scrubbed from its
    # answer, and from the answer the idempotency store keeps.
    learn(credentials_in((), url, CredentialNames()), pinned=True)
    if parts.scheme == "rediss" and "ssl_check_hostname" not in query:
        url = _checking_hostname(url, query)
    try:
        if cluster:
            # The startup node given as a TCPLocation: coredis 6.9 would pass a
            # deprecated dict itself, warning every user.
            node = TCPLocation(parts.hostname or "", port)
            return coredis.RedisCluster.from_url(url, decode_responses=True, startup_nodes=[node])
        return coredis.Redis.from_url(url, decode_responses=True)
    except (KeyError, ValueError, OSError) as exc:  # unknown values, missing TLS files
        raise ConfigurationError(f"{what} has options that cannot be used: {shown!r}") from exc


# Query options whose values are numbers: coredis took 'abc' for one and failed only on
# the first operation, or kept a protocol version it cannot speak.
_NUMBERS = ("socket_timeout", "socket_connect_timeout", "max_connections", "max_idle_time")
_PROTOCOLS = ("2", "3")


def _check_numbers(what: str, query: dict[str, list[str]], shown: str) -> None:
    """A ``ConfigurationError`` for a numeric option that is no positive number."""
    for name in _NUMBERS:
        for value in query.get(name, []):
            try:
                usable = 0 < float(value) < math.inf
            except ValueError:
                usable = False
            if not usable:
                raise ConfigurationError(
                    f"{what} has {name}={value!r}, not a positive number: {shown!r}"
                )
    for value in query.get("protocol_version", []):
        if value not in _PROTOCOLS:
            raise ConfigurationError(
                f"{what} has protocol_version={value!r}, not 2 or 3: {shown!r}"
            )


def _checking_hostname(url: str, query: dict[str, list[str]]) -> str:
    """``url`` asking coredis to check the certificate's name, unless it verifies nothing."""
    if query.get("ssl_cert_reqs") == ["none"]:
        return url
    parts = urlsplit(url)
    return parts._replace(
        query="&".join(filter(None, [parts.query, "ssl_check_hostname=true"]))
    ).geturl()


def _without_password(url: str) -> str:
    """``url`` fit for an error message: the password, if any, becomes ``***``, in the
    userinfo or in the query (``?password=``, which coredis reads too); a user with no
    password, too.

    The userinfo runs to the URL's last ``@``: a password holding an unencoded
    ``/``, ``?`` or ``#`` (base64 holds ``/``) ends what ``urlsplit`` takes
    for the host part early, so it found no password to hide, and the message
    refusing such a URL quoted it whole.
    """
    scheme, separator, rest = url.partition("://")
    userinfo, at, after = rest.rpartition("@")
    if separator and at and ":" in userinfo:
        url = f"{scheme}://{userinfo.partition(':')[0]}:***@{after}"
    elif separator and at:  # a user alone may be the password itself (``redis://<token>@``)
        url = f"{scheme}://***@{after}"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a URL that cannot be read>"
    if parts.query:
        query = [
            (name, "***" if name.lower() in CREDENTIAL_PARAMS else value)
            for name, value in parse_qsl(parts.query, keep_blank_values=True)
        ]
        parts = parts._replace(query=urlencode(query, safe="*"))
    if not parts.password:
        return parts.geturl()
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return parts._replace(netloc=f"{name}:***@{host}").geturl()
