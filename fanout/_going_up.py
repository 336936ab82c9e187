"""What goes on up through fanout: a cancellation, or a ``KeyboardInterrupt``.

trio requires a ``Cancelled`` to reach the scope that cancelled, and Ctrl-C
reaches whichever task runs (a tool's as likely as the caller's). Everything
else a tool, a stream, a part plugged in or an SDK's task group raises is
fanout's to answer. These tell the two apart, in an exception or in the
groups trio's nurseries and anyio's task groups wrap it in.
"""

from __future__ import annotations

import math

import trio

__all__ = ["goes_up", "keyboard_interrupt_in", "only_going_up", "split_going_up"]


def split_going_up(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """``exc`` as what must go on up (cancellations, ``KeyboardInterrupt``) and the
    failure that is fanout's to answer; either may be None.

    A ``Cancelled`` goes up only where something around the code reading it was
    cancelled. One raised when nothing was (a tool, a scope or a store that kept one
    from an earlier cancellation and raised it again) is a failure like any other:
    let up, it stopped every sibling, each answered "the caller cancelled the turn".
    """
    cancelled = _cancelled_here()
    going_up = (trio.Cancelled, KeyboardInterrupt) if cancelled else (KeyboardInterrupt,)
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(going_up)
    if isinstance(exc, going_up):
        return exc, None
    return None, exc


def _cancelled_here() -> bool:
    """Whether the task reading an exception is inside a cancelled scope (outside trio, a
    ``Cancelled`` can only be going up)."""
    try:
        return trio.current_effective_deadline() == -math.inf
    except RuntimeError:
        return True


def goes_up(exc: BaseException) -> bool:
    """Whether ``exc`` is, or holds, a cancellation or a ``KeyboardInterrupt``."""
    return split_going_up(exc)[0] is not None


def only_going_up(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation or an interrupt (or a group of nothing else): no
    crash."""
    return split_going_up(exc)[1] is None


def keyboard_interrupt_in(exc: BaseException) -> KeyboardInterrupt | None:
    """The ``KeyboardInterrupt`` in ``exc``, itself or anywhere in its groups, if any."""
    if isinstance(exc, KeyboardInterrupt):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = keyboard_interrupt_in(inner)
            if found is not None:
                return found
    return None
