"""The MCP write stream fanout taps: which request a call got, and cancel notices it saw through."""

from __future__ import annotations

from typing import Any

import trio
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

import fanout
from fanout._mcp_wire import Flight, TappedWriteStream, flying, landed


class _Sent:
    """A write stream that keeps what it is given."""

    def __init__(self) -> None:
        self.items: list[SessionMessage] = []

    async def send(self, item: SessionMessage, /) -> None:
        await trio.lowlevel.checkpoint()
        self.items.append(item)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def _request(id: int, method: str = "tools/call") -> SessionMessage:
    return SessionMessage(message=JSONRPCRequest(jsonrpc="2.0", id=id, method=method, params={}))


def _notice(method: str, params: dict[str, Any] | None) -> SessionMessage:
    return SessionMessage(message=JSONRPCNotification(jsonrpc="2.0", method=method, params=params))


async def test_a_flight_learns_its_request_id_and_everything_passes_through() -> None:
    """Within a flight: the tools/call's id is noted, other messages pass untouched, and a
    cancel notice without an id of its own counts as cancelling the flight's request."""
    sent = _Sent()
    wire = TappedWriteStream(sent)  # type: ignore[arg-type]
    flight = Flight(budget=None, grace=1.0)
    token = flying(flight)
    try:
        messages = [
            _request(7),
            _notice("notifications/progress", {"progress": 1}),
            SessionMessage(message=JSONRPCResponse(jsonrpc="2.0", id=3, result={})),
            _notice("notifications/cancelled", {}),
            _notice("notifications/cancelled", {"requestId": 9}),
        ]
        for message in messages:
            await wire.send(message)
    finally:
        landed(token)
    assert flight.request_id == 7
    assert sent.items == messages
    assert wire.cancels_sent == [7, 9]


async def test_outside_a_flight_nothing_is_noted() -> None:
    """A request sent by no call of fanout's is passed on and noted nowhere."""
    sent = _Sent()
    wire = TappedWriteStream(sent)  # type: ignore[arg-type]
    await wire.send(_notice("notifications/cancelled", {"requestId": 4}))
    assert len(sent.items) == 1
    assert wire.cancels_sent == []


async def test_a_cancel_notice_naming_no_usable_id_is_sent_but_not_counted() -> None:
    """A notice whose requestId is neither a string nor a number is still sent, not counted."""
    sent = _Sent()
    wire = TappedWriteStream(sent)  # type: ignore[arg-type]
    token = flying(Flight(budget=fanout.Budget(deadline=10.0), grace=1.0))
    try:
        await wire.send(_notice("notifications/cancelled", {"requestId": None}))
    finally:
        landed(token)
    assert len(sent.items) == 1
    assert wire.cancels_sent == []
