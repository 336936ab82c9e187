"""Hostile model streams for the three wire formats, fed to the real SDK clients.

A streamed turn is only as safe as its weakest event: the byte where the SDK's
SSE reader is cut, the delta that comes back to an earlier call, the block
index that is reused. These helpers write each API's server-sent events for
a message whose tool calls the test chooses (arguments as raw text, so they
may be broken), deliver the bytes to the real ``anthropic`` / ``openai``
clients in pieces the test chooses (through an ``httpx2.MockTransport``, so
every byte boundary is exact and no socket is involved), or serve them once
from a loopback fake whose next request is checked by the strict fake's
rules (``tests.strict_api``).

The strict rules are also applied in-process (``transcript_errors``) so a
property test can check thousands of transcripts without a server.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anthropic
import attrs
import h11
import httpx2
import openai
import trio

from fanout import Kind, Registry

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

from tests.strict_api import (
    StrictAPI,
    anthropic_errors,
    chat_errors,
    reply_whole,
    responses_errors,
    send,
    serve_strict,
)

ANTHROPIC, CHAT, RESPONSES = "anthropic", "chat", "responses"
PATHS = {ANTHROPIC: "/v1/messages", CHAT: "/v1/chat/completions", RESPONSES: "/v1/responses"}
PROMPT = "Do the things."


@attrs.frozen
class Call:
    """One tool call as the model streams it: id, tool name, arguments as raw JSON text."""

    id: str
    name: str
    arguments: str

    def as_input(self) -> dict[str, Any]:
        """The arguments as an Anthropic ``input`` object: ``{}`` when they are not one."""
        try:
            value = json.loads(self.arguments) if self.arguments.strip() else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def pieces(text: str, size: int) -> list[str]:
    """``text`` in pieces of ``size`` characters (at least one piece, maybe empty)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# -- events -------------------------------------------------------------------------


def anthropic_message_start() -> dict[str, Any]:
    """The ``message_start`` the SDK's accumulator needs: a whole, empty message."""
    message = {
        "id": "msg_hostile",
        "type": "message",
        "role": "assistant",
        "model": "fake",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    return {"type": "message_start", "message": message}


def anthropic_block(index: int, call: Call, size: int) -> list[dict[str, Any]]:
    """One ``tool_use`` block as Anthropic streams it: start, JSON deltas, stop."""
    start = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
    events: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": index, "content_block": start}
    ]
    for piece in pieces(call.arguments, size):
        delta = {"type": "input_json_delta", "partial_json": piece}
        events.append({"type": "content_block_delta", "index": index, "delta": delta})
    events.append({"type": "content_block_stop", "index": index})
    return events


def anthropic_end(stop_reason: str = "tool_use") -> list[dict[str, Any]]:
    """``message_delta`` and ``message_stop``: the message is over."""
    delta = {"stop_reason": stop_reason, "stop_sequence": None}
    return [
        {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]


def anthropic_events(calls: Sequence[Call], size: int) -> list[dict[str, Any]]:
    """A whole Messages stream: a text block, then one ``tool_use`` block per call."""
    events = [
        anthropic_message_start(),
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "On it."},
        },
        {"type": "content_block_stop", "index": 0},
    ]
    for index, call in enumerate(calls, start=1):
        events += anthropic_block(index, call, size)
    return events + anthropic_end()


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """One Chat Completions chunk of the first choice."""
    return {
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def chat_call_head(index: int, call: Call) -> dict[str, Any]:
    """The chunk that opens a call: its index, id, name and empty arguments."""
    item = {
        "index": index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }
    return chat_chunk({"tool_calls": [item]})


def chat_call_piece(index: int, piece: str) -> dict[str, Any]:
    """A chunk carrying more of a call's arguments, by index alone."""
    return chat_chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})


def chat_events(calls: Sequence[Call], size: int) -> list[dict[str, Any]]:
    """A whole Chat Completions stream of ``calls``, each opened then filled by index."""
    events = [chat_chunk({"role": "assistant", "content": None})]
    for index, call in enumerate(calls):
        events.append(chat_call_head(index, call))
        events += [chat_call_piece(index, p) for p in pieces(call.arguments, size) if p]
    return [*events, chat_chunk({}, "tool_calls")]


def responses_envelope(status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    """A Responses ``response`` object as the stream's first and last events carry it."""
    return {
        "id": "resp_hostile",
        "object": "response",
        "created_at": 0,
        "model": "fake",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "status": status,
    }


def responses_item(index: int, call: Call, arguments: str | None = None) -> dict[str, Any]:
    """A ``function_call`` output item; ``arguments`` as given (the whole text by default)."""
    return {
        "type": "function_call",
        "id": f"fc_{index}",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if arguments is None else arguments,
        "status": "completed" if arguments is None else "in_progress",
    }


def responses_call(index: int, call: Call, size: int) -> list[dict[str, Any]]:
    """One function call as Responses streams it: added, argument deltas, done."""
    at = {"output_index": index, "item_id": f"fc_{index}"}
    events: list[dict[str, Any]] = [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": responses_item(index, call, ""),
        },
    ]
    events += [
        {"type": "response.function_call_arguments.delta", **at, "delta": p}
        for p in pieces(call.arguments, size)
    ]
    events.append(
        {"type": "response.function_call_arguments.done", **at, "arguments": call.arguments}
    )
    events.append(
        {
            "type": "response.output_item.done",
            "output_index": index,
            "item": responses_item(index, call),
        }
    )
    return events


def responses_events(calls: Sequence[Call], size: int) -> list[dict[str, Any]]:
    """A whole Responses stream of ``calls`` as function call items."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": responses_envelope("in_progress", [])},
    ]
    for index, call in enumerate(calls):
        events += responses_call(index, call, size)
    output = [responses_item(index, call) for index, call in enumerate(calls)]
    events.append(
        {"type": "response.completed", "response": responses_envelope("completed", output)}
    )
    return events


EVENTS: dict[str, Callable[[Sequence[Call], int], list[dict[str, Any]]]] = {
    ANTHROPIC: anthropic_events,
    CHAT: chat_events,
    RESPONSES: responses_events,
}


def encode(api: str, events: Sequence[dict[str, Any]], *, done: bool = True) -> bytes:
    """The events as the API's server-sent event bytes (Chat Completions: then ``[DONE]``,
    unless ``done`` is false)."""
    out = []
    for number, event in enumerate(events):
        if api == CHAT:
            out.append(f"data: {json.dumps(event)}\n\n")
        else:
            data = {**event, "sequence_number": number} if api == RESPONSES else event
            out.append(f"event: {event['type']}\ndata: {json.dumps(data)}\n\n")
    if api == CHAT and done:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def split(data: bytes, sizes: Sequence[int]) -> list[bytes]:
    """``data`` cut into consecutive pieces whose sizes cycle through ``sizes``."""
    out, at, turn = [], 0, 0
    while at < len(data):
        size = max(1, sizes[turn % len(sizes)])
        out.append(data[at : at + size])
        at, turn = at + size, turn + 1
    return out


# -- the SDK clients, fed exact bytes -----------------------------------------------


@attrs.define
class Body:
    """What the fake transport sends: the pieces, then an end, a drop, or a hang."""

    chunks: list[bytes]
    ending: str = "end"  # "end" (clean), "drop" (the connection breaks), "hang" (never ends)

    async def stream(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            await trio.lowlevel.checkpoint()
            yield chunk
        if self.ending == "drop":
            raise httpx2.ReadError("the connection dropped mid-stream")
        if self.ending == "hang":
            await trio.sleep_forever()


def _transport(body: Body) -> httpx2.AsyncClient:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=body.stream()
        )

    return httpx2.AsyncClient(transport=httpx2.MockTransport(handler))


def anthropic_client(body: Body) -> anthropic.AsyncAnthropic:
    """The real Anthropic client, its one response being ``body``."""
    return anthropic.AsyncAnthropic(
        api_key="test", base_url="http://fake.test", max_retries=0, http_client=_transport(body)
    )


def openai_client(body: Body) -> openai.AsyncOpenAI:
    """The real OpenAI client, its one response being ``body``."""
    return openai.AsyncOpenAI(
        api_key="test", base_url="http://fake.test/v1", max_retries=0, http_client=_transport(body)
    )


# -- the promise, as the strict fake checks it ---------------------------------------


def assistant_with(api: str, calls: Sequence[Call]) -> list[dict[str, Any]]:
    """The prompt and the assistant turn that emitted ``calls``, as request params."""
    user = {"role": "user", "content": PROMPT}
    if api == ANTHROPIC:
        blocks = [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": c.as_input()} for c in calls
        ]
        return [
            user,
            {"role": "assistant", "content": [{"type": "text", "text": "On it."}, *blocks]},
        ]
    if api == CHAT:
        tool_calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
        return [user, {"role": "assistant", "content": None, "tool_calls": tool_calls}]
    items = [
        {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
        for c in calls
    ]
    return [user, *items]


def transcript_errors(api: str, calls: Sequence[Call], answers: Any) -> list[str]:
    """Why the API would refuse the next request holding ``answers`` to ``calls``."""
    head = assistant_with(api, calls)
    if api == ANTHROPIC:
        return anthropic_errors([*head, answers])
    if api == CHAT:
        return chat_errors([*head, *answers])
    return responses_errors([*head, *answers])


def tagged_registry(log: list[tuple[str, int]]) -> Registry:
    """Tools whose every run is logged with the arguments it got.

    ``count`` is a read that records its ``tag`` and ``n``; ``explode`` fails;
    ``save`` is a write. Unique tags keep single-flight from merging calls.
    """
    registry = Registry()

    @registry.tool(kind=Kind.READS)
    async def count(tag: str, n: int = 0) -> str:
        """Count to n."""
        log.append((tag, n))
        await trio.lowlevel.checkpoint()
        return f"{tag}={n}"

    @registry.tool(kind=Kind.READS)
    async def explode(tag: str) -> str:
        """Always fails."""
        await trio.lowlevel.checkpoint()
        raise RuntimeError(f"{tag} exploded")

    @registry.tool(kind=Kind.MUTATING)
    async def save(tag: str) -> str:
        """A write."""
        log.append((f"save {tag}", 0))
        return f"saved {tag}"

    return registry


# -- a loopback fake: one hostile streamed reply, then the strict fake ---------------


@attrs.define
class Hostile:
    """The first reply's bytes, sent in pieces, and how the response ends."""

    chunks: list[bytes]
    emitted: list[Call]  # what the model emitted, for the Responses transcript
    gap: float = 0.0
    drop: bool = False


def _respond(hostile: Hostile) -> Callable[..., Any]:
    async def respond(
        api: StrictAPI,
        conn: h11.Connection,
        stream: trio.SocketStream,
        path: str,
        body: dict[str, Any],
    ) -> bool:
        if api.requests:
            return await reply_whole(api, conn, stream, path, body)
        api.requests.append((path, body))
        given = body.get("input", [])
        prompt = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
        api._responses["resp_hostile"] = [*prompt, *assistant_with(RESPONSES, hostile.emitted)[1:]]
        headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        await send(conn, stream, h11.Response(status_code=200, headers=headers))
        for chunk in hostile.chunks:
            await trio.sleep(hostile.gap)
            await send(conn, stream, h11.Data(chunk))
        if hostile.drop:
            return False
        await send(conn, stream, h11.EndOfMessage())
        return True

    return respond


@asynccontextmanager
async def serve_hostile(hostile: Hostile) -> AsyncIterator[StrictAPI]:
    """A loopback fake: the first request gets ``hostile``; every later one is checked
    strictly (a 400 naming each rule broken) and answered with a final text."""
    async with serve_strict([], _respond(hostile)) as api:
        yield api
