"""A run: one agent conversation, spanning its turns.

The model repeats itself. Within a turn the same search appears twice; across
turns of one conversation the same invoice is "sent" again after a retry or a
re-plan. A run is where fanout remembers enough to make a repeat cheap (a
read answered from its cache) or harmless (a write answered from its
idempotency store instead of taking effect twice).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import attrs
import trio

from ._idempotency import IdempotencyStore, MemoryIdempotencyStore
from ._trio_runs import RunSeen
from ._validate import non_empty_text, positive

if TYPE_CHECKING:
    from collections.abc import Iterable


__all__ = ["ReadCache", "Run"]


@attrs.frozen
class _Entry:
    expires: float
    tool: str
    content: str


@attrs.define
class ReadCache:
    """Answers of cacheable reads, by call key, with an expiry on trio's clock.

    A read's answer is kept only if no write dropped its tool's answers while it
    ran (``since``, a `stamp` taken as it began): a read that began before a write
    and ended after it, a read timed out and still unwinding, may hold what the
    write changed, and the next turn's read was answered from before the write.
    """

    _entries: dict[str, _Entry] = attrs.field(init=False, factory=dict)
    _drops: int = attrs.field(init=False, default=0)  # writes that dropped answers so far
    _dropped: dict[str | None, int] = attrs.field(init=False, factory=dict)  # by tool (None: all)

    def get(self, key: str) -> str | None:
        """A fresh cached answer for ``key``, or None (an expired one is dropped)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if trio.current_time() >= entry.expires:
            del self._entries[key]
            return None
        return entry.content

    def stamp(self) -> int:
        """What a read about to run passes to `put` as ``since``."""
        return self._drops

    def put(self, key: str, tool: str, content: str, ttl: float, *, since: int = -1) -> None:
        """Keep ``content`` for ``ttl`` s, unless a write dropped ``tool``'s answers after
        the `stamp` ``since`` (-1: keep it whatever was dropped)."""
        if since >= 0 and max(self._dropped.get(tool, -1), self._dropped.get(None, -1)) >= since:
            return
        self._entries[key] = _Entry(trio.current_time() + ttl, tool, content)

    def invalidate(self, tools: Iterable[str] | None) -> int:
        """Drop the entries of ``tools`` (None: all of them); return how many went."""
        drop = self._drops
        self._drops += 1
        for tool in [None] if tools is None else tools:
            self._dropped[tool] = drop
        if tools is None:
            dropped = len(self._entries)
            self._entries.clear()
            return dropped
        names = set(tools)
        stale = [key for key, entry in self._entries.items() if entry.tool in names]
        for key in stale:
            del self._entries[key]
        return len(stale)

    def __len__(self) -> int:
        return len(self._entries)


@attrs.define
class Run:
    """One conversation: its id, its idempotency store and its read cache.

    Pass the same run to every turn of a conversation
    (``runner.run_turn(calls, run=run)``). A write's idempotency key is
    derived from the run id, so another process serving the same
    conversation must use the same ``run_id`` and a shared store (Redis) for
    its re-issued writes to take effect once. ``idempotency_ttl`` is how long
    answers are kept; ``claim_lease`` how long a write's claim outlives a
    holder that stopped renewing it (renewed every third of it while the
    write runs).
    """

    run_id: str = attrs.field(factory=lambda: uuid.uuid4().hex, validator=non_empty_text)
    store: IdempotencyStore = attrs.field(factory=MemoryIdempotencyStore)
    idempotency_ttl: float = attrs.field(default=24 * 3600.0, validator=positive)
    claim_lease: float = attrs.field(default=6.0, validator=positive)
    cache: ReadCache = attrs.field(init=False, factory=ReadCache)
    _seen: RunSeen = attrs.field(init=False, factory=RunSeen, repr=False)

    def note_run(self, run: object) -> None:
        """Drop the read cache if ``run`` is a later trio.run than its answers' expiries
        were read in (`fanout._trio_runs`): on the new run's clock, an answer cached at
        100,000 s was fresh for another day. The store keeps its answers (it re-bases
        their expiries itself): without them a write asked again would run twice."""
        if self._seen.moved_to(run):
            self.cache = ReadCache()
