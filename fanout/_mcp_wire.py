"""What fanout watches on an MCP connection's outgoing side.

The ``mcp`` client already sends ``notifications/cancelled`` when the task
awaiting a request is cancelled, under a shield with a fixed bound of its
own. fanout needs two more things: to know which request id a tool call got
(so it can say which request the server was told to drop), and to bound that
notice by the call's budget rather than a constant. Both are seen where every
message passes: the session's write stream, in the task that sends it.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

import attrs
import trio
from mcp.shared._stream_protocols import WriteStream
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCNotification, JSONRPCRequest, RequestId

from ._budget import Budget

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Flight", "TappedWriteStream", "flying", "landed"]


@attrs.define
class Flight:
    """One ``tools/call`` on the wire, and the budget its cancel notice is bounded by.

    ``budget`` is the call's, when fanout runs it; ``grace`` is the longest a
    cancel notice may take to write.
    """

    budget: Budget | None
    grace: float
    request_id: RequestId | None = None

    def notice_deadline(self) -> float:
        """When writing the cancel notice gives up.

        Within the call's budget when the call was cut off early (a sibling,
        the caller); when the deadline itself cut it off, the notice gets its
        own ``grace``, or the server would never hear of it.
        """
        now = trio.current_time()
        end = self.budget.bound(self.grace) if self.budget is not None else now
        return end if end > now else now + self.grace


_flight: contextvars.ContextVar[Flight | None] = contextvars.ContextVar(
    "fanout_mcp_flight", default=None
)


def flying(flight: Flight) -> contextvars.Token[Flight | None]:
    """Make ``flight`` the one this task's next ``tools/call`` belongs to."""
    return _flight.set(flight)


def landed(token: contextvars.Token[Flight | None]) -> None:
    _flight.reset(token)


@attrs.define
class TappedWriteStream:
    """A session's write stream that notes request ids and bounds cancel notices."""

    inner: WriteStream[SessionMessage]
    cancels_sent: list[RequestId] = attrs.field(factory=list)

    async def send(self, item: SessionMessage, /) -> None:
        flight = _flight.get()
        message = item.message
        if flight is None:
            await self.inner.send(item)
        elif isinstance(message, JSONRPCRequest) and message.method == "tools/call":
            flight.request_id = message.id
            await self.inner.send(item)
        elif (
            isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled"
        ):
            with trio.move_on_at(flight.notice_deadline()):
                await self.inner.send(item)
                cancelled = (message.params or {}).get("requestId", flight.request_id)
                if isinstance(cancelled, str | int):
                    self.cancels_sent.append(cancelled)
        else:
            await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> TappedWriteStream:
        # Async because the stream protocol says so; entering does nothing to
        # wait for, so it does not checkpoint (as trio's AsyncResource).
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None
