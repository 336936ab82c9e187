"""Limits and idempotency shared by many processes, on Redis (``pip install fanout[redis]``).

``RedisScope`` stands in for ``fanout.Scope`` wherever a runner takes scopes;
``RedisIdempotencyStore`` for the in-memory idempotency store::

    async with RedisScope.from_url(url, name="ticket-api", rate=20, burst=5) as scope:
        runner = fanout.Runner(registry, scopes=[scope])
"""

from ._redis import LocalFallback as LocalFallback
from ._redis_scope import RedisScope as RedisScope
from ._redis_store import RedisIdempotencyStore as RedisIdempotencyStore

__all__ = ["LocalFallback", "RedisIdempotencyStore", "RedisScope"]
