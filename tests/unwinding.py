"""A tool that never finishes on its own and takes a while to stop once cancelled."""

from __future__ import annotations

from typing import Any

import trio

from fanout import Kind, Registry


def slow_to_unwind(registry: Registry, unwind: float, *, name: str, **options: Any) -> None:
    """Register ``name``: a read that waits until it is cancelled, then takes ``unwind``
    seconds, shielded, to stop (a library closing its connections). ``options`` are
    ``Registry.add``'s (``timeout``, ``idle_timeout``)."""

    async def slow(n: int = 0) -> str:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(unwind)

    registry.add(slow, name=name, kind=Kind.READS, **options)
