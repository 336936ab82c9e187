"""How fanout reaches Redis: one server or a Redis Cluster, named by a URL.

``redis://[user:password@]host:port/db`` is one server, ``rediss://`` the same
over TLS, ``unix:///path/to/socket`` one server on a local socket. With
``cluster=True`` a ``redis://`` or ``rediss://`` URL names one startup node of
a cluster (a managed Valkey or Redis cluster's configuration endpoint); the
client learns the other nodes and the slot map from it. A cluster has only
database 0.

coredis would accept a URL with any scheme and fail later, far from the
mistake; fanout refuses a URL it cannot use with ``ConfigurationError`` here.
Both client kinds run the same Lua scripts, as long as each script's keys
share one hash slot, which is why a scope's keys carry its name as a hash tag.
"""

from __future__ import annotations

from typing import Any, TypeAlias
from urllib.parse import parse_qs, urlsplit

import coredis
from coredis.connection import TCPLocation

from ._exceptions import ConfigurationError

__all__ = ["RedisClient", "client_from_url"]

RedisClient: TypeAlias = "coredis.Redis[Any] | coredis.RedisCluster[Any]"

_SCHEMES = {False: ("redis", "rediss", "unix"), True: ("redis", "rediss")}


def client_from_url(url: str, *, cluster: bool = False) -> RedisClient:
    """A client (not yet entered) for ``url``, answering text; see the module docstring."""
    what = "a Redis Cluster URL" if cluster else "a Redis URL"
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES[cluster]:
        schemes = ", ".join(f"{scheme}://" for scheme in _SCHEMES[cluster])
        raise ConfigurationError(f"{what} must start with {schemes}; got {url!r}")
    try:
        port = parts.port or 6379
    except ValueError as exc:
        raise ConfigurationError(f"{what} has a port that is not a number: {url!r}") from exc
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigurationError(f"{what} must name a host: {url!r}")
    if cluster:
        databases = {parts.path.strip("/"), *parse_qs(parts.query).get("db", [])}
        if databases - {"", "0"}:
            raise ConfigurationError(f"a Redis Cluster has only database 0; got {url!r}")
        # The startup node given as a TCPLocation: coredis 6.9 would pass a
        # deprecated dict itself, warning every user.
        node = TCPLocation(parts.hostname or "", port)
        return coredis.RedisCluster.from_url(url, decode_responses=True, startup_nodes=[node])
    return coredis.Redis.from_url(url, decode_responses=True)
