"""The call a tool is running for, reachable from inside the tool.

Tools take their arguments as keyword arguments and nothing else; what they
may need from fanout (the idempotency key, the budget, the scopes to charge
HTTP requests to) is found with ``current_call()``. trio gives each task its
own copy of the context, and copies it into worker threads, so sync tools see
it too.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from ._budget import Budget
from ._events import EventDetail, EventKind, Recorder
from ._exceptions import FanoutError
from ._idle import IdleWatch
from ._redact import redact_text
from ._scope import ScopeLike
from ._values import Kind, ToolCall

if TYPE_CHECKING:
    # A cycle at run time (a call builds its context); nothing structures a
    # CallContext, so its annotations are never resolved.
    from ._call import CallPlan  # noqa: TC004

__all__ = ["CallContext", "current_call"]


@attrs.define
class CallContext:
    """Everything about the running call that a tool or the HTTP layer may use.

    ``requests`` counts requests sent in this attempt (``answered``, those a
    server admitted: a write one of whose requests was admitted and a later
    one not sent, or refused, has taken effect in part): the runner reserved
    one token for the attempt, which covers the first request; the HTTP layer
    charges each further request to the scopes again. ``secrets`` collects the
    credentials the HTTP layer sent, so the answer can be scrubbed of them
    even when a server echoes them back; it is left out of the ``repr``, so a
    tool that logs its context logs no key. ``effect_unknown`` is set when a
    write's request left but its response was lost (a reset mid-body): the
    server may have acted, so no answer of this attempt is kept for replay.
    ``admitted_at`` is when admission let the attempt start: its first
    request leaves a little later, and the scope measures by how much;
    ``booked_by``, when that request's tokens were due: the same, or later
    where a scope let the call start ahead of them for its tool's own set-up
    (a window's log knows the call's booking by it);
    ``arrived_at``, when the turn received the call (a streamed call arrives
    when its block closes, after others of its burst may have started).
    ``opened_connection`` is set when a request of the attempt opened a new
    connection (the HTTP layer is told so by the connection pool): its
    duration then includes the connection's set-up, so it is not a sample
    of how fast the server answers; ``reused_connection``, when one was seen
    leaving over a connection already open. ``held`` is how long its requests
    waited inside the pool for a slow first connection's worst case, or for
    a place under a learned cap (`fanout._http_core`), which is no part of
    how long the server took.
    ``refused`` is set when the server turned a request of the attempt away
    with a 503: answered at once, that is no sample of its latency, and no
    admission a scope learning its rate may count.
    """

    call: ToolCall
    kind: Kind
    budget: Budget
    scopes: tuple[ScopeLike, ...]
    _plan: CallPlan = attrs.field(alias="plan", repr=False)
    run_id: str
    attempt: int
    recorder: Recorder
    secrets: set[str] = attrs.field(factory=set, repr=False)
    requests: int = 0
    answered: int = 0  # of them, those the server admitted (answered, not refused)
    effect_unknown: bool = False
    admitted_at: float = -math.inf
    booked_by: float = -math.inf
    arrived_at: float = -math.inf
    opened_connection: bool = False
    reused_connection: bool = False
    held: float = 0.0
    refused: bool = False
    idle: IdleWatch | None = None  # set while a tool with an idle_timeout runs
    # How to give back the places its requests took on the wire (`fanout._slots`): each
    # is given back once its answer is read, and any left when the attempt ends.
    places: list[Callable[[], None]] = attrs.field(factory=list, repr=False)

    @property
    def idempotency_key(self) -> str:
        """The key a write's requests carry (`fanout.idempotency`), hashed on first use."""
        return self._plan.idempotency_key

    def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Say the tool is making progress: a ``PROGRESS`` event, and its idle timeout restarts.

        Callable from an async tool, or from a sync one in its worker thread
        (the report is handed to trio's thread). The message goes to the
        trace only, scrubbed of credentials.
        """
        if not trio.lowlevel.in_trio_run():
            trio.from_thread.run_sync(self.report_progress, progress, total, message)
            return
        detail = EventDetail(progress=progress, total=total)
        if message is not None:
            detail["message"] = redact_text(message, self.secrets)
        self.recorder.emit(
            EventKind.PROGRESS, call_id=self.call.id, tool=self.call.name,
            attempt=self.attempt, detail=detail,
        )  # fmt: skip
        if self.idle is not None:
            self.idle.touch()


_current: contextvars.ContextVar[CallContext] = contextvars.ContextVar("fanout_call")


def current_call() -> CallContext:
    """The context of the tool call running in this task (or its thread)."""
    try:
        return _current.get()
    except LookupError:
        raise FanoutError("current_call() was used outside a tool run by fanout") from None


def maybe_current_call() -> CallContext | None:
    """The running call's context, or None outside of one."""
    return _current.get(None)


# The variable's own methods, not functions around them: every call sets and resets it,
# and a wrapper is a Python call more each time.
set_current_call = _current.set
reset_current_call = _current.reset
