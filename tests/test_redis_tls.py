"""``rediss://`` against a real server behind real TLS: trusted and named, or refused.

The server is the suite's plain Redis; ``redis_tls`` terminates TLS in front
of it with certificates from a throwaway authority (see its docstring).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest

from fanout import LimiterUnavailableError
from fanout._idempotency import ClaimState
from fanout.redis import RedisIdempotencyStore, RedisScope
from tests.redis_support import shared_redis_url, unique_prefix
from tests.redis_tls import TlsFiles, serve_tls

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import trio

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def plain_url() -> Iterator[str]:
    with shared_redis_url() as url:
        yield url


async def tls_url(nursery: trio.Nursery, plain_url: str, tmp_path: Path, name: str) -> str:
    """A rediss:// URL to the plain server, through TLS with a certificate for ``name``."""
    files = TlsFiles.issue(tmp_path, name)
    port = await serve_tls(nursery, files, plain_url)
    return f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={quote(files.ca)}"


async def works(url: str) -> None:
    """A scope reserves and a store claims through ``url`` (given time for the handshakes)."""
    prefix = unique_prefix()
    async with (
        RedisScope.from_url(url, name="api", prefix=prefix, rate=0.001, op_timeout=2) as scope,
        RedisIdempotencyStore.from_url(url, prefix=prefix, op_timeout=2) as store,
    ):
        booking = await scope.reserve(1, 0)
        assert booking is not None
        assert booking.wait == 0.0
        assert await scope.reserve(1, 0) is None
        assert (await store.claim("write-1", lease=60)).state is ClaimState.NEW


async def refused(url: str) -> None:
    """Through ``url``, the scope and the store fail closed: nothing runs unchecked."""
    async with RedisScope.from_url(url, name="api", prefix=unique_prefix(), rate=1) as scope:
        with pytest.raises(LimiterUnavailableError):
            await scope.reserve(1, 0)
    async with RedisIdempotencyStore.from_url(url, prefix=unique_prefix()) as store:
        with pytest.raises(LimiterUnavailableError):
            await store.claim("write-1", lease=60)


async def test_rediss_reaches_a_trusted_server_named_in_its_certificate(
    nursery: trio.Nursery, plain_url: str, tmp_path: Path
) -> None:
    """A certificate from the authority in ssl_ca_certs, for the URL's host: both clients work."""
    await works(await tls_url(nursery, plain_url, tmp_path, "127.0.0.1"))


async def test_rediss_checks_the_name_in_the_certificate_by_default(
    nursery: trio.Nursery, plain_url: str, tmp_path: Path
) -> None:
    """A trusted certificate for another host is refused, unless the URL turns the check off."""
    url = await tls_url(nursery, plain_url, tmp_path, "redis.example")
    await refused(url)
    await works(f"{url}&ssl_check_hostname=false")


async def test_rediss_refuses_a_certificate_from_an_unknown_authority(
    nursery: trio.Nursery, plain_url: str, tmp_path: Path
) -> None:
    """Without the authority in ssl_ca_certs (the system's are used), the server is refused."""
    url = await tls_url(nursery, plain_url, tmp_path, "127.0.0.1")
    await refused(url.partition("?")[0])
