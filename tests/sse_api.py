"""The strict fake API, streaming: each reply sent as the real API's server-sent events.

A request with ``"stream": true`` is checked by the strict fake's rules
(``tests.strict_api``) exactly as a whole one is, so the next request is
still refused when its tool results do not answer every call once; the
reply the fake would have given whole is then sent in the wire format of
its API, one event at a time:

* Anthropic Messages: ``event: message_start`` ... ``content_block_start`` /
  ``input_json_delta`` / ``content_block_stop`` per ``tool_use`` block ...
  ``message_delta``, ``message_stop``;
* Chat Completions: ``data:`` chunks with ``tool_calls`` deltas by index, a
  ``finish_reason`` chunk, then ``data: [DONE]``;
* Responses: ``response.created`` ... ``response.output_item.added`` /
  ``response.function_call_arguments.delta`` / ``.done`` /
  ``response.output_item.done`` per call (a text item's content parts and
  ``output_text`` deltas in between) ... ``response.completed``.

``gap`` spaces the events; ``hold`` makes the server wait, before the event
that ends the message, until the test sets it (proof that a call started
while the message was still arriving); ``drop_after`` closes the connection
after that many events, mid-message, as a dropped connection does;
``overloaded_after`` sends Anthropic's ``event: error`` (``overloaded_error``)
there instead and ends the response, as the API does when it is overloaded
mid-stream.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import h11
import trio

from tests.strict_api import StrictAPI, reply_whole, send, send_json, serve_strict

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.strict_api import Script

PIECE = 7  # characters of arguments per delta: several deltas per call


@attrs.frozen
class Event:
    """One server-sent event: its ``event:`` name (None for Chat Completions) and data."""

    name: str | None
    data: dict[str, Any] | str
    ends_message: bool = False

    def encode(self) -> bytes:
        data = self.data if isinstance(self.data, str) else json.dumps(self.data)
        head = f"event: {self.name}\n" if self.name else ""
        return f"{head}data: {data}\n\n".encode()


@attrs.define
class Pacing:
    """How the server streams: the gap between events, a hold, a drop."""

    gap: float = 0.0
    hold: trio.Event | None = None
    drop_after: int | None = None
    overloaded_after: int | None = None
    sent: list[Event] = attrs.field(factory=list)


def _pieces(text: str) -> list[str]:
    return [text[i : i + PIECE] for i in range(0, len(text), PIECE)] or [""]


def anthropic_events(message: dict[str, Any]) -> list[Event]:
    """A whole Messages reply as its stream of events."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    events = [Event("message_start", {"type": "message_start", "message": start}),
              Event("ping", {"type": "ping"})]  # fmt: skip
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            first = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"])]
        else:
            first = {**block, "input": {}}
            raw = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in _pieces(raw)]
        events.append(Event("content_block_start", {
            "type": "content_block_start", "index": index, "content_block": first}))  # fmt: skip
        events += [
            Event(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
            for delta in deltas
        ]
        events.append(Event("content_block_stop", {"type": "content_block_stop", "index": index}))
    end = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events += [
        Event(
            "message_delta",
            {"type": "message_delta", "delta": end, "usage": {"output_tokens": 1}},
            ends_message=True,
        ),
        Event("message_stop", {"type": "message_stop"}),
    ]
    return events


def chat_events(completion: dict[str, Any]) -> list[Event]:
    """A whole Chat Completions reply as its chunks, then ``[DONE]``."""
    choice = completion["choices"][0]
    message = choice["message"]
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": 0,
            "model": completion["model"]}  # fmt: skip

    def chunk(delta: dict[str, Any], finish: str | None = None) -> Event:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
        return Event(None, {**head, "choices": choices}, ends_message=finish is not None)

    events = [chunk({"role": "assistant", "content": None if message["tool_calls"] else ""})]
    events += [chunk({"content": p}) for p in _pieces(message["content"] or "") if p]
    for index, call in enumerate(message["tool_calls"] or ()):
        function = call["function"]
        events.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": function["name"],
                                                          "arguments": ""}}]}))  # fmt: skip
        events += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in _pieces(function["arguments"])
        ]
    events += [chunk({}, choice["finish_reason"]), Event(None, "[DONE]")]
    return events


def responses_events(response: dict[str, Any]) -> list[Event]:
    """A whole Responses reply as its stream of events, numbered."""
    bare = {**response, "status": "in_progress", "output": []}
    data: list[dict[str, Any]] = [{"type": "response.created", "response": bare},
                                  {"type": "response.in_progress", "response": bare}]  # fmt: skip
    for index, item in enumerate(response["output"]):
        at = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "function_call":
            added = {**item, "arguments": "", "status": "in_progress"}
            data.append({"type": "response.output_item.added", "output_index": index,
                         "item": added})  # fmt: skip
            data += [
                {"type": "response.function_call_arguments.delta", **at, "delta": p}
                for p in _pieces(item["arguments"])
            ]
            data.append({"type": "response.function_call_arguments.done", **at,
                         "arguments": item["arguments"]})  # fmt: skip
        else:
            text = item["content"][0]["text"]
            data.append({"type": "response.output_item.added", "output_index": index,
                         "item": {**item, "content": [], "status": "in_progress"}})  # fmt: skip
            part = {"type": "output_text", "text": "", "annotations": []}
            data.append({"type": "response.content_part.added", **at, "content_index": 0,
                         "part": part})  # fmt: skip
            data += [
                {"type": "response.output_text.delta", **at, "content_index": 0, "delta": p,
                 "logprobs": []}
                for p in _pieces(text)
            ]  # fmt: skip
            data.append({"type": "response.output_text.done", **at, "content_index": 0,
                         "text": text, "logprobs": []})  # fmt: skip
            data.append({"type": "response.content_part.done", **at, "content_index": 0,
                         "part": item["content"][0]})  # fmt: skip
        data.append({"type": "response.output_item.done", "output_index": index, "item": item})
    data.append({"type": "response.completed", "response": response})
    return [
        Event(
            d["type"], {**d, "sequence_number": n}, ends_message=d["type"] == "response.completed"
        )
        for n, d in enumerate(data)
    ]


ENCODERS = {
    "/v1/messages": anthropic_events,
    "/v1/chat/completions": chat_events,
    "/v1/responses": responses_events,
}


async def reply_streaming(
    pacing: Pacing, api: StrictAPI, conn: h11.Connection, stream: trio.SocketStream, path: str,
    body: dict[str, Any],
) -> bool:  # fmt: skip
    """Stream the reply when the request asks for it; False when the connection was dropped."""
    if not body.get("stream") or path not in ENCODERS:
        return await reply_whole(api, conn, stream, path, body)
    status, answer = api.reply(path, body)
    if status != 200:
        await send_json(conn, stream, status, answer)
        return True
    headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
    await send(conn, stream, h11.Response(status_code=200, headers=headers))
    for count, event in enumerate(ENCODERS[path](answer)):
        if pacing.drop_after is not None and count == pacing.drop_after:
            return False  # closed without the end of the chunked body: a dropped connection
        if pacing.overloaded_after is not None and count == pacing.overloaded_after:
            error = {
                "type": "error",
                "error": {"type": "overloaded_error", "message": "Overloaded"},
            }
            await send(conn, stream, h11.Data(Event("error", error).encode()))
            break
        if event.ends_message and pacing.hold is not None:
            with trio.fail_after(10):  # bounded: a call that never starts fails the test
                await pacing.hold.wait()
        await trio.sleep(pacing.gap)
        await send(conn, stream, h11.Data(event.encode()))
        pacing.sent.append(event)
    await send(conn, stream, h11.EndOfMessage())
    return True


@asynccontextmanager
async def serve_sse(script: Script, pacing: Pacing | None = None) -> AsyncIterator[StrictAPI]:
    """Run the strict fake, streaming when asked, on 127.0.0.1 for the block."""
    async with serve_strict(script, partial(reply_streaming, pacing or Pacing())) as api:
        yield api
