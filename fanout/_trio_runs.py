"""Which ``trio.run`` is going on, for what outlives one.

trio's clock begins again with every ``trio.run`` (a ``MockClock`` at 0, the
system clock at a random offset), so a time read in one run means nothing in
the next. A runner built at import, a notebook's ``trio.run`` per question, a
command line's per command: each keeps its scopes and its ``Run`` across runs,
and a bucket whose last refill was read at 100,000 s answered the next run's
calls ``rate_limited`` for 28 hours. So what keeps trio times notes the run it
read them in (a token in a ``RunVar``), and in a new run makes them afresh.
"""

from __future__ import annotations

import attrs
import trio

__all__ = ["RunSeen", "current_run", "run_if_any"]

_RUN: trio.lowlevel.RunVar[object] = trio.lowlevel.RunVar("fanout_run")


def current_run() -> object:
    """A token of the ``trio.run`` going on: the same object all through it, a new one in
    the next (a ``RunVar`` holds it, so nothing of the run it names is kept alive)."""
    try:
        return _RUN.get()
    except LookupError:
        run = object()
        _RUN.set(run)
        return run


def run_if_any() -> object | None:
    """The run going on (`current_run`), or None outside trio."""
    return current_run() if trio.lowlevel.in_trio_run() else None


@attrs.define
class RunSeen:
    """The run an object last read trio's clock in: the one it was built in, None if
    built outside trio (it has read nothing yet, so its first run is not a new one)."""

    _run: object | None = attrs.field(factory=run_if_any)

    def moved_to(self, run: object) -> bool:
        """Whether ``run`` is a later run than the one seen; it is the one seen from now."""
        seen, self._run = self._run, run
        return seen is not None and seen is not run
