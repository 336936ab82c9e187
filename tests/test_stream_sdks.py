"""Streaming loops with the real SDK clients against the strict fake, streaming on 127.0.0.1.

Each turn's message arrives as the API's server-sent events, is read by the
SDK, fed to ``Runner.run_stream`` with the matching decoder, and the answers
go back in the next request, which the fake refuses unless every call is
answered exactly once.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anthropic
import attrs
import httpx2
import openai
import pytest
import trio
from openai.lib.streaming.chat import ChatCompletionStreamState

import fanout
from examples.typed_loop import (
    anthropic_stream_loop,
    assistant_param,
    chat_stream_loop,
    responses_stream_loop,
)
from fanout import Registry, Runner, Status
from tests.sse_api import Pacing, serve_sse
from tests.test_wire_loops import _registry

if TYPE_CHECKING:
    from collections.abc import AsyncIterable, AsyncIterator

    from tests.strict_api import Script

SCRIPT: Script = [
    [("weather", {"city": "Oslo"}), ("weather", {"city": 5}), ("launch", {}),
     ("weather", "{broken"), ("weather", {"city": "Oslo"})],
    [("weather", {"city": "Lima", "unit": "fahrenheit"}), ("weather", {"city": "Pune"})],
]  # fmt: skip
FIRST_IDS = [f"call_0_{i}" for i in range(5)]
MAX_TURNS = 5


@attrs.define
class Release:
    """An instrument that sets ``hold`` when a call starts: the server may end the message."""

    hold: trio.Event

    def on_event(self, event: fanout.Event) -> None:
        if event.kind is fanout.EventKind.STARTED:
            self.hold.set()


def _held() -> tuple[Pacing, Runner, Registry]:
    """A server that ends no message before a call has started, and a runner that lets it."""
    hold = trio.Event()
    registry = _registry()
    return Pacing(gap=0.002, hold=hold), Runner(registry, instruments=[Release(hold)]), registry


def _check(api: Any, path: str, turns: int) -> None:
    assert api.rejections == []
    assert [p for p, _ in api.requests] == [path] * turns
    assert all(body["stream"] is True for _, body in api.requests)


async def test_anthropic_stream_helper_loop() -> None:
    """messages.stream(): calls run as blocks stop; every turn's results are accepted."""
    pacing, runner, registry = _held()
    async with serve_sse(SCRIPT, pacing) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)
        messages = await anthropic_stream_loop(client, runner, registry, "Weather?")
    _check(api, "/v1/messages", 3)
    results = messages[2]["content"]
    assert isinstance(results, list)
    assert [b["tool_use_id"] for b in results] == FIRST_IDS  # type: ignore[typeddict-item]
    assert [b["is_error"] for b in results] == [False, True, True, True, False]  # type: ignore[typeddict-item]
    assert api.requests[0][1]["tools"] == registry.anthropic_tools()


async def _recorded(events: AsyncIterable[Any], into: list[Any]) -> AsyncIterator[Any]:
    """The events, passed on unchanged, each kept in ``into``."""
    async for event in events:
        into.append(event)
        yield event


def _anthropic_content(events: list[Any]) -> list[dict[str, Any]]:
    """The assistant content that raw Messages stream events spell out."""
    blocks: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.type == "content_block_start":
            blocks[event.index] = {**event.content_block.model_dump(), "json": ""}
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            blocks[event.index]["text"] += event.delta.text
        elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            blocks[event.index]["json"] += event.delta.partial_json
    content = []
    for block in blocks.values():
        raw = block.pop("json")
        if block["type"] == "tool_use":
            block["input"] = json.loads(raw)
        content.append(block)
    return content


async def test_anthropic_raw_stream_loop() -> None:
    """messages.create(stream=True): the SDK's raw events feed the turn directly."""
    pacing, runner, _ = _held()
    async with serve_sse(SCRIPT, pacing) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "Weather?"}]
        for _ in range(MAX_TURNS):
            events: list[Any] = []
            async with await client.messages.create(
                model="m", max_tokens=64, messages=messages, stream=True
            ) as stream:
                turn = await runner.run_stream(_recorded(stream, events), fanout.AnthropicStream())
            messages.append({"role": "assistant", "content": _anthropic_content(events)})
            if not turn.results:
                break
            messages.append(fanout.anthropic_tool_results(turn))
    _check(api, "/v1/messages", 3)
    assert [r.tool_use_id for r in turn.results] == []
    assert [b["tool_use_id"] for b in messages[4]["content"]] == ["call_1_0", "call_1_1"]


async def test_chat_raw_stream_loop() -> None:
    """chat.completions.create(stream=True): chunks feed the turn; one tool message per id."""
    pacing, runner, registry = _held()
    async with serve_sse(SCRIPT, pacing) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "Weather?"}]
        for _ in range(MAX_TURNS):
            state = ChatCompletionStreamState()
            chunks: list[Any] = []
            async with await client.chat.completions.create(
                model="m", messages=messages, tools=registry.openai_tools(), stream=True
            ) as stream:
                turn = await runner.run_stream(
                    _recorded(stream, chunks), fanout.ChatCompletionsStream()
                )
            for chunk in chunks:
                state.handle_chunk(chunk)
            messages.append(assistant_param(state.get_final_completion().choices[0].message))
            if not turn.results:
                break
            messages.extend(fanout.openai_tool_messages(turn))
    _check(api, "/v1/chat/completions", 3)
    assert [m["role"] for m in messages] == ["user", "assistant", *["tool"] * 5, "assistant",
                                             "tool", "tool", "assistant"]  # fmt: skip
    assert [m["tool_call_id"] for m in messages[2:7]] == FIRST_IDS


async def test_chat_stream_helper_loop() -> None:
    """chat.completions.stream(): the helper's chunk events feed the same decoder."""
    pacing, runner, registry = _held()
    async with serve_sse(SCRIPT, pacing) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        messages = await chat_stream_loop(client, runner, registry, "Weather?")
    _check(api, "/v1/chat/completions", 3)
    assert [m.get("tool_call_id") for m in messages[2:7]] == FIRST_IDS


async def test_responses_stream_helper_loop() -> None:
    """responses.stream(): the helper's events feed the decoder; outputs chained by id."""
    pacing, runner, registry = _held()
    async with serve_sse(SCRIPT, pacing) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        ids = await responses_stream_loop(client, runner, registry, "Weather?")
    _check(api, "/v1/responses", 3)
    assert ids == ["resp_0", "resp_1", "resp_2"]
    assert [i["call_id"] for i in api.requests[2][1]["input"]] == ["call_1_0", "call_1_1"]


async def test_responses_stream_loop() -> None:
    """responses.create(stream=True): function_call items feed the turn; outputs chained."""
    pacing, runner, registry = _held()
    async with serve_sse(SCRIPT, pacing) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        pending: list[Any] = [{"role": "user", "content": "Weather?"}]
        previous: str | None = None
        ids: list[str] = []
        for _ in range(MAX_TURNS):
            events: list[Any] = []
            async with await client.responses.create(
                model="m", input=pending, previous_response_id=previous,
                tools=registry.responses_tools(), stream=True,
            ) as stream:  # fmt: skip
                turn = await runner.run_stream(_recorded(stream, events), fanout.ResponsesStream())
            completed = [e.response for e in events if e.type == "response.completed"]
            ids.append(previous := completed[0].id)
            if not turn.results:
                break
            pending = list(fanout.responses_tool_outputs(turn))
    _check(api, "/v1/responses", 3)
    assert ids == ["resp_0", "resp_1", "resp_2"]
    assert [i["call_id"] for i in api.requests[1][1]["input"]] == FIRST_IDS


# The SDK's own error for a connection closed mid-message, as raised by its version.
_DROPPED = (httpx2.RemoteProtocolError, anthropic.APIConnectionError)


@pytest.mark.parametrize("drop_after", [9, 17, 28])
async def test_a_dropped_connection_answers_every_id_seen_then_raises(drop_after: int) -> None:
    """The server closes mid-message: each call whose block began is answered once,
    the complete ones run, and the SDK's own error is raised."""
    pacing = Pacing(drop_after=drop_after)
    registry = _registry()
    async with serve_sse(SCRIPT, pacing) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)
        async with client.messages.stream(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "Weather?"}]
        ) as stream:
            turn = Runner(registry).stream_turn(stream, fanout.AnthropicStream())
            with pytest.raises(_DROPPED) as raised:
                await turn.run()
    # Older SDKs let the transport's error through; newer ones (2.17 here) wrap it.
    dropped = raised.value if raised.type is httpx2.RemoteProtocolError else raised.value.__cause__
    assert isinstance(dropped, httpx2.RemoteProtocolError)
    sent = [e.data for e in pacing.sent if isinstance(e.data, dict)]
    begun = {e["index"]: e["content_block"] for e in sent if e["type"] == "content_block_start"
             and e["content_block"]["type"] == "tool_use"}  # fmt: skip
    stopped = {e["index"] for e in sent if e["type"] == "content_block_stop"}
    assert begun, "the drop came after at least one call began"
    assert [r.tool_use_id for r in turn.results] == [b["id"] for b in begun.values()]
    for index, result in zip(begun, turn.results, strict=True):
        if index in stopped:
            assert result.status is not Status.CANCELLED  # complete: run (or refused) as usual
        elif begun[index]["name"] == "weather":
            assert result.status is Status.ERROR
            assert "the stream broke off" in json.loads(result.content)["message"]
        else:  # a tool that does not exist is refused for that, complete or not
            assert result.status is Status.REFUSED


async def test_an_overloaded_error_mid_stream_answers_every_id_seen_then_raises() -> None:
    """Anthropic's error event mid-message: the SDK raises it once every id seen is answered."""
    pacing = Pacing(overloaded_after=17)
    async with serve_sse(SCRIPT, pacing) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)
        async with client.messages.stream(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "Weather?"}]
        ) as stream:
            turn = Runner(_registry()).stream_turn(stream, fanout.AnthropicStream())
            with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
                await turn.run()
    assert [r.tool_use_id for r in turn.results] == ["call_0_0", "call_0_1", "call_0_2"]
    assert [r.status for r in turn.results] == [Status.OK, Status.ERROR, Status.REFUSED]


def _openai_ids_begun(sent: list[Any]) -> list[str]:
    """The call ids whose first piece the server sent: Chat Completions or Responses."""
    ids = []
    for data in (e.data for e in sent if isinstance(e.data, dict)):
        for choice in data.get("choices", ()):
            ids += [c["id"] for c in choice["delta"].get("tool_calls", ()) if "id" in c]
        if data.get("type") == "response.output_item.added":
            ids.append(data["item"]["call_id"])
    return ids


@pytest.mark.parametrize("api_kind", ["chat", "responses"])
async def test_a_dropped_openai_stream_answers_every_id_seen_then_raises(api_kind: str) -> None:
    """Chat Completions and Responses: the same drop, mid-call; one answer per id begun,
    the half-written call answered error, then the SDK's error."""
    pacing = Pacing(drop_after=12)
    registry = _registry()
    async with serve_sse(SCRIPT, pacing) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        prompt: Any = [{"role": "user", "content": "Weather?"}]
        if api_kind == "chat":
            opened: Any = await client.chat.completions.create(
                model="m", messages=prompt, stream=True
            )
            decoder: fanout.StreamDecoder = fanout.ChatCompletionsStream()
        else:
            opened = await client.responses.create(model="m", input=prompt, stream=True)
            decoder = fanout.ResponsesStream()
        async with opened as stream:
            turn = Runner(registry).stream_turn(stream, decoder)
            with pytest.raises(openai.APIConnectionError):  # the SDK wraps the drop
                await turn.run()
    begun = _openai_ids_begun(pacing.sent)
    assert len(begun) >= 2
    assert [r.tool_use_id for r in turn.results] == begun
    last = turn.results[-1]
    assert last.status is Status.ERROR
    assert "the stream broke off" in json.loads(last.content)["message"]
    assert turn.results[0].status is Status.OK


async def test_the_streaming_fake_refuses_a_streamed_call_left_unanswered() -> None:
    """Answers missing one streamed id are refused, as the real API refuses them."""
    pacing, runner, _ = _held()
    async with serve_sse(SCRIPT, pacing) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "Weather?"}]
        async with client.chat.completions.stream(model="m", messages=messages) as stream:
            turn = await runner.run_stream(stream, fanout.ChatCompletionsStream())
            completion = await stream.get_final_completion()
        messages.append(assistant_param(completion.choices[0].message))
        messages += fanout.openai_tool_messages(turn)[1:]
        with pytest.raises(openai.BadRequestError, match=r"tool_calls \['call_0_0'\]"):
            await client.chat.completions.create(model="m", messages=messages, stream=True)
    assert len(api.rejections) == 1


async def test_the_deadline_covers_a_stream_that_stalls() -> None:
    """The server stalls before the message's end: at the turn's deadline the calls not
    yet complete are answered timed_out, not started, and the turn returns with every id
    answered. Chat Completions completes the last call only at the end, and a call whose
    arguments never close (``{broken``) is not complete when the next begins: a server
    that interleaves calls may still send the rest of them."""
    pacing = Pacing(hold=trio.Event())  # never set: the message never ends
    registry = _registry()
    async with serve_sse(SCRIPT, pacing) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        prompt: Any = [{"role": "user", "content": "Weather?"}]
        # A safety net only: the deadline below is what ends it. That deadline is real
        # time, so it leaves room for a loaded machine to open the stream and read the
        # first four calls (at 0.5 s, a run under a full test suite answered none).
        with trio.fail_after(10):
            async with await client.chat.completions.create(
                model="m", messages=prompt, stream=True
            ) as stream:
                turn = await Runner(registry, turn_timeout=2.0).run_stream(
                    stream, fanout.ChatCompletionsStream()
                )
    assert [r.tool_use_id for r in turn.results] == FIRST_IDS
    statuses = [r.status for r in turn.results]
    assert statuses == [Status.OK, Status.ERROR, Status.REFUSED, *[Status.TIMED_OUT] * 2]
    assert [json.loads(r.content)["started"] for r in turn.results[3:]] == [False, False]


# The manager, never entered (the point of the test), still holds the SDK's request.
@pytest.mark.filterwarnings("ignore:coroutine 'AsyncAPIClient.post' was never awaited")
async def test_a_stream_not_yet_opened_is_a_usage_error() -> None:
    """The SDK's stream manager not entered, or its coroutine not awaited: a UsageError
    that says what to do, before any request (not a turn that ends empty)."""
    registry = _registry()
    async with serve_sse(SCRIPT) as api:
        claude = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)
        manager = claude.messages.stream(model="m", max_tokens=64, messages=[])
        with pytest.raises(fanout.UsageError, match="enter a stream manager first"):
            Runner(registry).stream_turn(manager, fanout.AnthropicStream())
        gpt = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        pending = gpt.chat.completions.create(model="m", messages=[], stream=True)
        with pytest.raises(fanout.UsageError, match="not coroutine"):
            Runner(registry).stream_turn(pending, fanout.ChatCompletionsStream())
        pending.close()
    assert api.requests == []
