"""Idempotency: one write, one effect, however often the model asks for it.

Every call has a key, sha256 over (run id, tool, canonical arguments). Before
a mutating call runs, fanout *claims* its key in a store: the first claimant
runs it; a later identical call finds either the stored answer (and replays
it without running) or a claim still running (and waits for its answer,
within its budget). Only answers the tool itself gave are stored: a write
cut off mid-flight has an unknown effect, so its claim is released and a
re-issue runs again, carrying the same key downstream (``Idempotency-Key``).

A claim is a lease, not a lock: it lapses ``lease`` seconds after its holder
last renewed it. The holder renews it while the write runs; a holder that
dies (a process killed mid-write) stops renewing, and its key is free again
within seconds instead of blocking every re-issue for the answers' TTL.

The store is a small protocol: in memory here, on Redis for many processes.
"""

from __future__ import annotations

import enum
from typing import Protocol

import attrs
import trio

from ._trio_runs import RunSeen, current_run
from ._values import Status

__all__ = ["Claim", "ClaimState", "IdempotencyStore", "MemoryIdempotencyStore", "StoredAnswer"]


@attrs.frozen
class StoredAnswer:
    """An answer as stored: everything of a ``ToolResult`` but whose id it was."""

    status: Status
    content: str


class ClaimState(enum.Enum):
    NEW = "new"  # the key is ours: run the call, then finish or abandon it
    DONE = "done"  # an answer is stored: replay it
    RUNNING = "running"  # another call holds the key right now


@attrs.frozen
class Claim:
    state: ClaimState
    answer: StoredAnswer | None = None


class IdempotencyStore(Protocol):
    """Where keys are claimed (as leases) and answers kept (for ``ttl`` seconds).

    ``claim`` takes a key for ``lease`` seconds if nobody holds it;
    ``renew`` extends this store's own claim (False once it has lapsed or was
    taken over); ``finish`` replaces the claim with the answer; ``abandon``
    releases the claim, leaving answers alone. fanout bounds every call by
    the write's budget and answers for a store that fails or hangs.
    """

    async def claim(self, key: str, *, lease: float) -> Claim: ...
    async def renew(self, key: str, *, lease: float) -> bool: ...
    async def finish(self, key: str, answer: StoredAnswer, *, ttl: float) -> None: ...
    async def abandon(self, key: str) -> None: ...


@attrs.define
class MemoryIdempotencyStore:
    """The in-process store: a dict of keys with expiry on ``trio.current_time()``.

    Kept across trio.runs (a ``Run`` kept by a notebook that runs one per
    question), it re-bases its expiries on each new run's clock (`_now`).
    """

    _entries: dict[str, tuple[float, StoredAnswer | None]] = attrs.field(init=False, factory=dict)
    _seen: RunSeen = attrs.field(init=False, factory=RunSeen)
    _last_read: float = attrs.field(init=False, default=0.0)  # on the clock of the run seen

    async def claim(self, key: str, *, lease: float) -> Claim:
        await trio.lowlevel.checkpoint()
        now = self._now()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            answer = entry[1]
            return Claim(ClaimState.RUNNING) if answer is None else Claim(ClaimState.DONE, answer)
        self._entries[key] = (now + lease, None)
        return Claim(ClaimState.NEW)

    async def renew(self, key: str, *, lease: float) -> bool:
        await trio.lowlevel.checkpoint()
        now = self._now()
        entry = self._entries.get(key)
        if entry is None or entry[1] is not None or entry[0] <= now:
            return False
        self._entries[key] = (now + lease, None)
        return True

    def _now(self) -> float:
        """trio's time, the entries re-based first if they were kept in an earlier run.

        Its clock starts elsewhere (`fanout._trio_runs`): an answer kept to
        86,400 s expired at once on a clock that began past it, and its write
        ran again. Each answer keeps the life it had left when this store last
        read the old clock (the time between runs cannot be known, so it is not
        counted: an answer outliving its TTL is replayed, never run twice); a
        claim lapses, its holder having ended with its run.
        """
        now = trio.current_time()
        if self._seen.moved_to(current_run()):
            last = self._last_read
            self._entries = {
                key: (now + expires - last, answer)
                for key, (expires, answer) in self._entries.items()
                if answer is not None and expires > last
            }
        self._last_read = now
        return now

    # Settling is cleanup, done even when the time for it is up: the work
    # comes before the checkpoint, as trio's own ``aclose`` methods do.

    async def finish(self, key: str, answer: StoredAnswer, *, ttl: float) -> None:
        self._entries[key] = (self._now() + ttl, answer)
        await trio.lowlevel.checkpoint()

    async def abandon(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry[1] is None:
            del self._entries[key]
        await trio.lowlevel.checkpoint()
