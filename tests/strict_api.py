"""A strict fake of three model APIs on 127.0.0.1, and the transcript rules it enforces.

The rules are the ones the real APIs reject requests for: an Anthropic
``tool_use`` whose ``tool_result`` is not in the very next user message (or
comes after other content there), results answering ids the previous
assistant message did not use, duplicates; an OpenAI assistant ``tool_calls``
message not followed at once by one ``role: "tool"`` message per id; a
Responses ``function_call`` without exactly one ``function_call_output``, or
an output answering no call. Every message and tool definition must also
validate as the SDK's own param TypedDict.

The "model" is a script: each reply emits the next list of calls, then a
final text. Requests break no rule or are answered 400 with the reasons.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import h11
import pydantic
import trio
from anthropic.types import MessageParam, ToolParam
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from openai.types.responses import FunctionToolParam, ResponseInputItemParam

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

Script = list[list[tuple[str, Any]]]  # per reply: (tool name, arguments object or raw text)


def _invalid(adapter: pydantic.TypeAdapter[Any], value: Any, what: str) -> list[str]:
    try:
        adapter.validate_python(value)
    except pydantic.ValidationError as exc:
        return [f"{what} is not valid: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}"]
    return []


_MESSAGE = pydantic.TypeAdapter(MessageParam)
_CHAT_MESSAGE = pydantic.TypeAdapter(ChatCompletionMessageParam)
_INPUT_ITEM = pydantic.TypeAdapter(ResponseInputItemParam)


def anthropic_errors(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why Anthropic's Messages API would reject ``messages``; empty when it would not."""
    errors: list[str] = []
    for index, message in enumerate(messages):
        errors += _invalid(_MESSAGE, message, f"message {index}")
    pending: list[str] = []
    for index, message in enumerate(messages):
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        kinds = [block.get("type") for block in blocks]
        results = [
            block.get("tool_use_id") for block in blocks if block.get("type") == "tool_result"
        ]
        if message.get("role") == "user":
            if sorted(results) != sorted(pending) or len(set(results)) != len(results):
                errors.append(f"message {index}: tool_result ids {results} answer {pending}")
            first_other = next((i for i, k in enumerate(kinds) if k != "tool_result"), len(kinds))
            if "tool_result" in kinds[first_other:]:
                errors.append(f"message {index}: tool_result blocks must come first")
            pending = []
        else:
            if pending:
                errors.append(f"message {index}: tool_use ids {pending} were not answered")
            pending = [block["id"] for block in blocks if block.get("type") == "tool_use"]
    if pending:
        errors.append(f"the last message's tool_use ids {pending} were not answered")
    return errors


def chat_errors(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why Chat Completions would reject ``messages``; empty when it would not."""
    errors: list[str] = []
    for index, message in enumerate(messages):
        errors += _invalid(_CHAT_MESSAGE, message, f"message {index}")
    pending: list[str] = []
    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            if message.get("tool_call_id") not in pending:
                errors.append(f"message {index}: tool message answers no pending call")
            else:
                pending.remove(message["tool_call_id"])
            continue
        if pending:
            errors.append(f"message {index}: tool_calls {pending} were not answered")
        pending = [call["id"] for call in message.get("tool_calls") or []]
    if pending:
        errors.append(f"tool_calls {pending} were not answered")
    return errors


def responses_errors(items: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why the Responses API would reject ``input``; empty when it would not."""
    errors: list[str] = []
    for index, item in enumerate(items):
        errors += _invalid(_INPUT_ITEM, item, f"input item {index}")
        if item.get("role") == "tool":
            errors.append(f"input item {index}: role 'tool' is not a Responses input")
    calls: list[str] = []
    answered: list[str] = []
    for index, item in enumerate(items):
        if item.get("type") == "function_call":
            calls.append(item["call_id"])
        elif item.get("type") == "function_call_output":
            if item.get("call_id") not in calls or item["call_id"] in answered:
                errors.append(f"input item {index}: output answers no call of its own")
            answered.append(item.get("call_id", ""))
    missing = [call for call in calls if call not in answered]
    if missing:
        errors.append(f"function calls {missing} have no output")
    return errors


@attrs.define
class StrictAPI:
    """The fake: scripted replies, every request checked, everything recorded."""

    script: Script
    requests: list[tuple[str, dict[str, Any]]] = attrs.field(factory=list)
    rejections: list[list[str]] = attrs.field(factory=list)
    url: str = ""
    _responses: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict)

    def reply(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append((path, body))
        handler = {
            "/v1/messages": self._anthropic,
            "/v1/chat/completions": self._chat,
            "/v1/responses": self._responses_api,
        }.get(path)
        if handler is None:
            return 404, {"error": {"type": "not_found", "message": path}}
        status, answer = handler(body)
        if status != 200:
            self.rejections.append(answer["error"]["message"].split("; "))
        return status, answer

    def _turn_number(self) -> int:
        return len(self.requests) - 1

    def _calls(self) -> list[tuple[str, str, Any]]:
        turn = self._turn_number()
        if turn >= len(self.script):
            return []
        return [
            (f"call_{turn}_{i}", name, args) for i, (name, args) in enumerate(self.script[turn])
        ]

    def _anthropic(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        errors = anthropic_errors(body.get("messages", []))
        for tool in body.get("tools", []):
            errors += _invalid(pydantic.TypeAdapter(ToolParam), tool, "tool")
        if errors:
            return 400, _error(errors)
        content: list[dict[str, Any]] = [{"type": "text", "text": "Working on it."}]
        for call_id, name, args in self._calls():
            # Anthropic's input is always an object; raw text arrives as an unknown argument.
            arguments = {"raw": args} if isinstance(args, str) else args
            content.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
        return 200, {
            "id": f"msg_{self._turn_number()}", "type": "message", "role": "assistant",
            "model": "fake", "content": content, "stop_sequence": None,
            "stop_reason": "tool_use" if len(content) > 1 else "end_turn",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }  # fmt: skip

    def _chat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        errors = chat_errors(body.get("messages", []))
        for tool in body.get("tools", []):
            errors += _invalid(pydantic.TypeAdapter(ChatCompletionToolParam), tool, "tool")
        if errors:
            return 400, _error(errors)
        calls = [
            {"id": call_id, "type": "function",
             "function": {"name": name, "arguments": args if isinstance(args, str)
                          else json.dumps(args)}}
            for call_id, name, args in self._calls()
        ]  # fmt: skip
        message = {"role": "assistant", "content": None if calls else "Done.",
                   "tool_calls": calls or None}  # fmt: skip
        return 200, {
            "id": f"chatcmpl-{self._turn_number()}", "object": "chat.completion",
            "created": 0, "model": "fake",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if calls else "stop"}],
        }  # fmt: skip

    def _responses_api(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        given = body.get("input", [])
        items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self._responses:
            return 400, _error([f"unknown previous_response_id {previous}"])
        transcript = [*self._responses.get(previous or "", []), *items]
        errors = responses_errors(transcript)
        for tool in body.get("tools", []):
            errors += _invalid(pydantic.TypeAdapter(FunctionToolParam), tool, "tool")
        if errors:
            return 400, _error(errors)
        output: list[dict[str, Any]] = [
            {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
             "arguments": args if isinstance(args, str) else json.dumps(args),
             "status": "completed"}
            for call_id, name, args in self._calls()
        ]  # fmt: skip
        if not output:
            text = {"type": "output_text", "text": "Done.", "annotations": []}
            output = [{"type": "message", "id": "msg_done", "role": "assistant",
                       "status": "completed", "content": [text]}]  # fmt: skip
        response_id = f"resp_{self._turn_number()}"
        self._responses[response_id] = [*transcript, *output]
        return 200, {
            "id": response_id, "object": "response", "created_at": 0, "model": "fake",
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "status": "completed",
        }  # fmt: skip


def _error(errors: list[str]) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "; ".join(errors)},
    }


Respond = Callable[["StrictAPI", h11.Connection, trio.SocketStream, str, dict[str, Any]],
                   Awaitable[bool]]  # fmt: skip


async def send(conn: h11.Connection, stream: trio.SocketStream, event: Any) -> None:
    """One h11 event out on ``stream``."""
    await stream.send_all(conn.send(event) or b"")


async def send_json(
    conn: h11.Connection, stream: trio.SocketStream, status: int, answer: dict[str, Any]
) -> None:
    """A whole JSON response out on ``stream``."""
    data = json.dumps(answer).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
    for event in (h11.Response(status_code=status, headers=headers), h11.Data(data),
                  h11.EndOfMessage()):  # fmt: skip
        await send(conn, stream, event)


async def reply_whole(
    api: StrictAPI, conn: h11.Connection, stream: trio.SocketStream, path: str,
    body: dict[str, Any],
) -> bool:  # fmt: skip
    """Answer a request with the fake's whole JSON reply; True: the connection lives on."""
    await send_json(conn, stream, *api.reply(path, body))
    return True


async def _serve_connection(api: StrictAPI, respond: Respond, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    async with stream:
        try:
            while isinstance(request := await _next_event(conn, stream), h11.Request):
                body = b""
                while not isinstance(event := await _next_event(conn, stream), h11.EndOfMessage):
                    if isinstance(event, h11.Data):
                        body += event.data
                path = request.target.decode().split("?")[0]
                if not await respond(api, conn, stream, path, json.loads(body)):
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> object:
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await stream.receive_some(65536))
    return event


@asynccontextmanager
async def serve_strict(script: Script, respond: Respond = reply_whole) -> AsyncIterator[StrictAPI]:
    """Run a StrictAPI on 127.0.0.1 for the block; ``api.url`` is its base URL.

    ``respond`` sends each checked reply (``tests.sse_api`` streams it).
    """
    api = StrictAPI(script)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, partial(_serve_connection, api, respond), 0, host="127.0.0.1")
        )
        api.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        try:
            yield api
        finally:
            nursery.cancel_scope.cancel()
