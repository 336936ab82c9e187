"""Which of a transport's connection pools a request goes through (`fanout._http_core`).

fanout spreads a transport's requests over a few connection pools: one gets
slower as many requests share it. Spread by each call's position alone, the
pool a call came to could have its one connection busy while others idled
in the other pools, and the request opened a connection of its own: a TLS
handshake, or a server slow to take new connections in. Against one that
read each new connection's first request 100 ms late, a told window of one
per 50 ms sent a call so every few calls, and paced the calls after it from
there: 2.15 s for 30 calls on a mock clock, 1.60 s through the pools with
idle connections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import attrs

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["PoolLoads", "PoolUse"]

PoolT = TypeVar("PoolT")

_ORIGINS = 1024  # (pool, origin) pairs kept before those with nothing out are forgotten


@attrs.define(eq=False)
class PoolUse(Generic[PoolT]):
    """One request's use of ``pool``, until it is given back (once, ``release``)."""

    pool: PoolT
    _loads: PoolLoads[PoolT]
    _key: tuple[int, str]
    _released: bool = False

    def release(self) -> None:
        """Its connection is free again: its answer was read, or it failed."""
        if not self._released:
            self._released = True
            self._loads.released(self._key)


@attrs.define
class PoolLoads(Generic[PoolT]):
    """How many requests to each origin each pool has out now, and had at most at once.

    A pool keeps the connections it opened (up to its keep-alive limit), so
    one that had more requests out to an origin than it has now likely has a
    connection to it idle. A request goes through the least busy of those;
    where none has, through the least busy pool; ties go by the call's
    position, so a wave of calls that start together spreads evenly.
    """

    _out: dict[tuple[int, str], int] = attrs.field(factory=dict)
    _most: dict[tuple[int, str], int] = attrs.field(factory=dict)

    def take(self, pools: Sequence[PoolT], origin: str, position: int) -> PoolUse[PoolT]:
        """A use of the pool of ``pools`` a request to ``origin``, of the call at
        ``position``, is best sent through."""
        order = [pools[(position + k) % len(pools)] for k in range(len(pools))]

        def preference(pool: PoolT) -> tuple[bool, int]:
            key = (id(pool), origin)
            out = self._out.get(key, 0)
            return self._most.get(key, 0) > out, -out

        pool = max(order, key=preference)  # the first of the best: ties by position
        key = (id(pool), origin)
        if key not in self._most and len(self._most) >= _ORIGINS:
            # Many origins: forget those with nothing out, which only costs a reuse.
            self._most = {k: most for k, most in self._most.items() if self._out.get(k)}
            self._out = {k: out for k, out in self._out.items() if out}
        out = self._out[key] = self._out.get(key, 0) + 1
        self._most[key] = max(self._most.get(key, 0), out)
        return PoolUse(pool, self, key)

    def released(self, key: tuple[int, str]) -> None:
        """One request out through ``key``'s pool to its origin is back."""
        self._out[key] -= 1
