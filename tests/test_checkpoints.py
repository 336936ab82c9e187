"""trio's convention, kept: every public ``async`` function of fanout yields.

A caller relies on an ``await`` being a place where other tasks run and where
it can be cancelled (trio's ``design.rst``); an ``async`` function that
returns without yielding breaks both. Each method here is awaited on a path
that needs no waiting, the path most likely to forget.

Two kinds of method, two promises. Those that *ask* (a slot, tokens, an
idempotency claim) are full checkpoints: they may raise ``Cancelled``.
Those that *tell* a scope what happened (a slot given back, a booking
refunded, a 429, a window's reset) yield but are never cancelled part way:
they run from ``finally`` blocks and after a response arrived, where a
cancellation must not lose the news or leak a slot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

import fanout
from fanout.idempotency import MemoryIdempotencyStore, StoredAnswer

Step = Callable[[fanout.Scope], Awaitable[Any]]
_HOLDER = object()


async def _confirm(scope: fanout.Scope) -> bool:
    booking = await scope.reserve(1, 0)
    assert booking is not None
    return await scope.confirm(booking)


async def _refund(scope: fanout.Scope) -> None:
    booking = await scope.reserve(1, 0)
    assert booking is not None
    await scope.refund(booking)


ASKING: dict[str, Step] = {
    "acquire_slot": lambda scope: scope.acquire_slot(_HOLDER, trio.current_time() + 1),
    "reserve": lambda scope: scope.reserve(1, 0),
    "wait_for": lambda scope: scope.wait_for(1),
}
TELLING: dict[str, Step] = {
    "release_slot": lambda scope: scope.release_slot(_HOLDER),
    "on_throttled": lambda scope: scope.on_throttled(None),
    "block_until": lambda scope: scope.block_until(trio.current_time() + 1),
}


def _scope() -> fanout.Scope:
    return fanout.Scope("api", rate=100, burst=10, max_concurrency=2, learn=False)


@pytest.mark.parametrize("method", list(ASKING))
async def test_a_scope_asked_for_something_checkpoints(method: str, autojump_clock: Any) -> None:
    """Asking a scope with capacity to spare is still a full checkpoint."""
    scope = _scope()
    with trio.testing.assert_checkpoints():
        await ASKING[method](scope)


async def test_confirming_and_refunding_a_booking_checkpoint(autojump_clock: Any) -> None:
    """A booking's confirmation is a full checkpoint; so is the booking before a refund."""
    with trio.testing.assert_checkpoints():
        assert await _confirm(_scope())
    with trio.testing.assert_checkpoints():
        await _refund(_scope())


class _Steps(trio.abc.Instrument):
    """Counts the times one task is scheduled to run again: each one follows a yield."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


@pytest.mark.parametrize("method", list(TELLING))
async def test_a_scope_told_something_yields_and_is_never_cancelled(
    method: str, autojump_clock: Any
) -> None:
    """Telling a scope yields to other tasks, and completes even in a cancelled scope."""
    scope = _scope()
    assert await scope.acquire_slot(_HOLDER, trio.current_time() + 1)
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        with trio.CancelScope() as cancelled:
            cancelled.cancel()
            await TELLING[method](scope)
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert not cancelled.cancelled_caught
    assert steps.count == 1
    if method == "release_slot":
        assert scope.statistics().in_flight == 0


@pytest.mark.parametrize("method", ["claim", "renew", "finish", "abandon"])
async def test_the_memory_store_checkpoints(method: str, autojump_clock: Any) -> None:
    """The in-process idempotency store checkpoints on every method, as a networked one must."""
    store = MemoryIdempotencyStore()
    steps: dict[str, Callable[[], Awaitable[Any]]] = {
        "claim": lambda: store.claim("k", lease=5),
        "renew": lambda: store.renew("k", lease=5),
        "finish": lambda: store.finish("k", StoredAnswer(fanout.Status.OK, "done"), ttl=60),
        "abandon": lambda: store.abandon("k"),
    }
    with trio.testing.assert_checkpoints():
        await steps[method]()


async def test_an_empty_turn_and_opening_and_closing_a_runner_checkpoint(
    autojump_clock: Any,
) -> None:
    """A turn with no calls still checkpoints; so do entering and leaving a runner with
    nothing running, though a bare nursery would not."""
    runner = fanout.Runner(fanout.Registry())
    with trio.testing.assert_checkpoints():
        await runner.run_turn([])
    with trio.testing.assert_checkpoints():
        await runner.__aenter__()
    with trio.testing.assert_checkpoints():
        await runner.__aexit__(None, None, None)
