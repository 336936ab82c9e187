"""Adapters: real SDK objects in, dicts that validate as the SDKs' request params out."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
import trio
from anthropic.types import Message, MessageParam
from openai.types.chat import ChatCompletionMessage, ChatCompletionToolMessageParam

import fanout
from fanout import Kind, Registry, Runner, Status, ToolCall

ANTHROPIC_MESSAGE = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 20},
    "content": [
        {"type": "text", "text": "Let me look those up."},
        {"type": "tool_use", "id": "toolu_a", "name": "weather", "input": {"city": "Oslo"}},
        {"type": "tool_use", "id": "toolu_b", "name": "weather", "input": {"city": "Lima"}},
        {"type": "tool_use", "id": "toolu_c", "name": "launch", "input": {}},
    ],
}

OPENAI_MESSAGE = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
        },
        {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": "{oops"}},
        {"id": "call_3", "type": "function", "function": {"name": "weather", "arguments": "[1]"}},
    ],
}


@pytest.fixture
def runner() -> Runner:
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def weather(city: str) -> dict[str, Any]:
        return {"city": city, "sky": "clear"}

    return Runner(reg)


def test_anthropic_sdk_message_becomes_calls_in_order() -> None:
    """tool_use blocks of an SDK Message become calls with ids, names, inputs and positions."""
    calls = fanout.calls_from_anthropic(Message.model_validate(ANTHROPIC_MESSAGE))
    assert calls == [
        ToolCall("toolu_a", "weather", {"city": "Oslo"}, 0),
        ToolCall("toolu_b", "weather", {"city": "Lima"}, 1),
        ToolCall("toolu_c", "launch", {}, 2),
    ]
    assert fanout.calls_from_anthropic(ANTHROPIC_MESSAGE) == calls


async def test_anthropic_results_are_one_valid_user_message(runner: Runner) -> None:
    """Every tool_use is answered in ONE user message that validates as MessageParam."""
    calls = fanout.calls_from_anthropic(Message.model_validate(ANTHROPIC_MESSAGE))
    turn = await runner.run_turn(calls)
    message = fanout.anthropic_tool_results(turn)
    pydantic.TypeAdapter(MessageParam).validate_python(message)
    assert message["role"] == "user"
    blocks = message["content"]
    assert [b["tool_use_id"] for b in blocks] == ["toolu_a", "toolu_b", "toolu_c"]
    assert [b["is_error"] for b in blocks] == [False, False, True]
    assert json.loads(blocks[2]["content"])["status"] == "refused"


def test_openai_sdk_message_becomes_calls() -> None:
    """tool_calls with JSON-string arguments decode; broken or non-object arguments stay raw."""
    calls = fanout.calls_from_openai(ChatCompletionMessage.model_validate(OPENAI_MESSAGE))
    assert [c.id for c in calls] == ["call_1", "call_2", "call_3"]
    assert calls[0].arguments == {"city": "Oslo"}
    assert calls[1].arguments == "{oops"
    assert calls[2].arguments == "[1]"


async def test_openai_results_are_tool_messages_in_order(runner: Runner) -> None:
    """One role=tool message per call, in order, each valid as ChatCompletionToolMessageParam."""
    calls = fanout.calls_from_openai(ChatCompletionMessage.model_validate(OPENAI_MESSAGE))
    turn = await runner.run_turn(calls)
    messages = fanout.openai_tool_messages(turn.results)
    adapter = pydantic.TypeAdapter(ChatCompletionToolMessageParam)
    for message in messages:
        adapter.validate_python(message)
    assert [m["tool_call_id"] for m in messages] == ["call_1", "call_2", "call_3"]
    assert [r.status for r in turn.results] == [Status.OK, Status.ERROR, Status.ERROR]


def test_message_without_tool_calls_gives_no_calls() -> None:
    """A plain text reply has nothing to run."""
    assert fanout.calls_from_openai({"role": "assistant", "content": "hi"}) == []
    assert fanout.calls_from_anthropic({"role": "assistant", "content": "hi"}) == []


@pytest.mark.parametrize("garbage", [42, "text", {"content": 7}, {"content": [{"id": "x"}]}])
def test_garbage_anthropic_message_is_a_typed_error(garbage: Any) -> None:
    """Input that is not a message raises InvalidTurnError, not a cattrs internals error."""
    with pytest.raises(fanout.InvalidTurnError):
        fanout.calls_from_anthropic(garbage)


@pytest.mark.parametrize("garbage", [42, {"tool_calls": 7}, {"tool_calls": [{"type": "function"}]}])
def test_garbage_openai_message_is_a_typed_error(garbage: Any) -> None:
    """Input that is not a message raises InvalidTurnError, not a cattrs internals error."""
    with pytest.raises(fanout.InvalidTurnError):
        fanout.calls_from_openai(garbage)


async def test_duplicate_ids_from_a_model_are_refused_before_running(runner: Runner) -> None:
    """A model message repeating an id cannot be answered validly; nothing runs."""
    duplicated = dict(ANTHROPIC_MESSAGE)
    duplicated["content"] = [ANTHROPIC_MESSAGE["content"][1]] * 2  # type: ignore[index]
    with pytest.raises(fanout.InvalidTurnError):
        runner.turn(fanout.calls_from_anthropic(duplicated))
    await trio.lowlevel.checkpoint()
