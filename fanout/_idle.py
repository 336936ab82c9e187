"""Idle timeouts: a tool that goes quiet is stopped before its deadline.

A long tool that reports progress shows it is still working; one that stays
silent for its ``idle_timeout`` is presumed stuck, and waiting for the hard
deadline would only waste the rest of the turn. The watch is a task beside
the tool's invocation that waits for an idle end each progress report pushes
out, always within the call's budget (progress can keep a call alive, never
make it outlive its hard deadline), then answers the call and cancels the
tool's scope: the answer does not wait for the tool to unwind.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs
import trio

from ._budget import Budget

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["IdleTimeoutError", "IdleWatch"]


@attrs.define
class IdleWatch:
    """The idle deadline of one attempt, reset by each progress report."""

    idle_timeout: float
    budget: Budget
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    end: float = attrs.field(init=False, default=math.inf)  # when it is idle, if quiet

    def __attrs_post_init__(self) -> None:
        self.touch()

    def touch(self) -> None:
        """The tool showed it is alive: it may be quiet for another ``idle_timeout``.

        When the idle end would reach the hard deadline, the watch steps
        aside: the call's own deadline ends it, and its answer says so.
        """
        end = self.budget.bound(self.idle_timeout)
        self.end = end if end < self.budget.deadline else math.inf

    async def watch(self, idle: Callable[[], None]) -> None:
        """Wait for the tool to go quiet: then ``idle()`` (which answers the call), and only
        then stop it. Stopped by its scope's deadline instead, a tool that took 3 s to
        unwind was answered idle 3 s after its idle end, and the turn returned then."""
        while True:
            end = self.end
            await trio.sleep_until(end)
            if self.end <= end:  # no progress since: idle
                idle()
                self.scope.cancel()
                return


class IdleTimeoutError(Exception):
    """The tool reported no progress for its ``idle_timeout`` and was stopped."""

    def __init__(self, idle_timeout: float) -> None:
        super().__init__(
            f"the tool reported no progress for {idle_timeout:g}s (its idle_timeout) "
            "and was stopped as idle"
        )
