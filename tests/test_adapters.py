"""Adapters: real SDK objects in, dicts that validate as the SDKs' request params out."""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic
import pytest
import trio
from anthropic.types import Message, MessageParam, ToolUseBlock
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionToolMessageParam,
)
from openai.types.responses import Response

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


def test_openai_custom_tool_calls_carry_their_text_as_input() -> None:
    """A custom tool's free text reaches the tool as {"input": text}; a non-text input is
    kept as its raw text, answered error when its turn runs."""
    calls = fanout.calls_from_openai(
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "custom", "custom": {"name": "sql", "input": "select 1"}},
                {"id": "c2", "type": "custom", "custom": {"name": "sql", "input": 7}},
            ],
        }
    )
    assert [(c.name, c.arguments) for c in calls] == [("sql", {"input": "select 1"}), ("sql", "7")]


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


@pytest.mark.parametrize(
    ("given", "words"),
    [("results", "got str"), (7, "got int"), ([ToolCall("a", "t")], "an item of type ToolCall")],
)
@pytest.mark.parametrize(
    "adapter",
    [fanout.anthropic_tool_results, fanout.openai_tool_messages, fanout.responses_tool_outputs],
)
def test_answers_are_made_only_from_a_turn_or_its_results(
    adapter: Any, given: Any, words: str
) -> None:
    """Anything but a Turn or ToolResults (text, a number, the calls) is InvalidTurnError."""
    with pytest.raises(fanout.InvalidTurnError, match=words):
        adapter(given)


async def test_duplicate_ids_from_a_model_are_refused_before_running(runner: Runner) -> None:
    """A model message repeating an id cannot be answered validly; nothing runs."""
    duplicated = dict(ANTHROPIC_MESSAGE)
    duplicated["content"] = [ANTHROPIC_MESSAGE["content"][1]] * 2  # type: ignore[index]
    with pytest.raises(fanout.InvalidTurnError):
        runner.turn(fanout.calls_from_anthropic(duplicated))
    await trio.lowlevel.checkpoint()


# -- hostile input: one bad call is answered, never the whole message ---------------------


def _deep(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


class _Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


_HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
    st.binary(max_size=8), st.just(_deep(5000)), st.just({"a": _deep(5000)}),
    st.just({1: "a", "b": 2}), st.just({(1, 2): "tuple key"}), st.just({"x", "y"}),
    st.just("x" * 200_000), st.just(10**400), st.just(_Unprintable()),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers()),
)  # fmt: skip


@st.composite
def _anthropic_blocks(draw: st.DrawFn) -> tuple[list[Any], list[str]]:
    """Blocks with hostile values in every field but a usable id; returns them and the ids."""
    blocks: list[Any] = []
    ids: list[str] = []
    for index in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            ids.append(f"toolu_{index}")
            block = {"type": "tool_use", "id": ids[-1], "name": draw(_HOSTILE | st.just("t"))}
            if draw(st.booleans()):
                block["input"] = draw(_HOSTILE)
        else:
            block = {"type": draw(st.sampled_from(["text", "thinking", "server_tool_use"])),
                     "text": draw(_HOSTILE)}  # fmt: skip
        blocks.append(block)
    return blocks, ids


@settings(max_examples=200, deadline=None)
@given(drawn=_anthropic_blocks())
def test_hostile_anthropic_input_gives_one_call_per_tool_use(
    drawn: tuple[list[Any], list[str]],
) -> None:
    """Whatever a tool_use block's name and input hold, it becomes exactly one call."""
    blocks, ids = drawn
    calls = fanout.calls_from_anthropic({"role": "assistant", "content": blocks})
    assert [call.id for call in calls] == ids
    assert [call.position for call in calls] == list(range(len(ids)))
    for call in calls:
        assert isinstance(call.name, str)
        assert isinstance(call.arguments, str) or all(isinstance(k, str) for k in call.arguments)
    _answered_one_each(calls)


def _answered_one_each(calls: list[ToolCall]) -> None:
    """Running the calls answers each id once, in order, whatever their arguments."""
    registry = Registry()

    @registry.tool(kind=Kind.READS)
    async def t(value: Any = None) -> str:
        return "ran"

    turn = trio.run(Runner(registry).run_turn, calls)
    assert [result.tool_use_id for result in turn.results] == [call.id for call in calls]


@st.composite
def _openai_calls(draw: st.DrawFn) -> tuple[list[Any], list[str]]:
    """tool_calls with hostile names, types and arguments (text or not) but usable ids."""
    items: list[Any] = []
    for index in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["function", "custom", None]) | _HOSTILE)
        arguments = draw(
            st.sampled_from(['{"a": 1}', "{oops", "[1]", "", "null", '"text"', "1e999"])
            | st.just("[" * 5000 + "]" * 5000) | st.just('{"a":' * 5000 + "1" + "}" * 5000)
            | _HOSTILE
        )  # fmt: skip
        body = {"name": draw(_HOSTILE | st.just("t")), "arguments": arguments, "input": arguments}
        item: dict[str, Any] = {"id": f"call_{index}", "function": body, "custom": body}
        if kind is not None:
            item["type"] = kind
        if isinstance(kind, str) and draw(st.booleans()):
            item[kind] = draw(_HOSTILE)
        items.append(item)
    return items, [item["id"] for item in items]


@settings(max_examples=200, deadline=None)
@given(drawn=_openai_calls())
def test_hostile_openai_input_gives_one_call_per_tool_call(
    drawn: tuple[list[Any], list[str]],
) -> None:
    """Deep, broken or wrongly typed arguments still give one call each, never an exception."""
    items, ids = drawn
    calls = fanout.calls_from_openai({"role": "assistant", "tool_calls": items})
    assert [call.id for call in calls] == ids
    for call in calls:
        assert isinstance(call.arguments, str) or all(isinstance(k, str) for k in call.arguments)
    _answered_one_each(calls)


async def test_deep_arguments_answer_that_one_call_error(runner: Runner) -> None:
    """5,000-deep JSON arguments are that call's error; its sibling runs (issue 11, item 7)."""
    message = {
        "role": "assistant",
        "tool_calls": [
            {"id": "deep", "type": "function",
             "function": {"name": "weather", "arguments": '{"city":' * 5000 + '"x"' + "}" * 5000}},
            {"id": "fine", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
        ],
    }  # fmt: skip
    turn = await runner.run_turn(fanout.calls_from_openai(message))
    assert [r.status for r in turn.results] == [Status.ERROR, Status.OK]
    assert "not a JSON object" in turn.results[0].content


async def test_set_input_answers_that_one_call_error(runner: Runner) -> None:
    """A set (or any non-object) as Anthropic input is that call's error, not a TypeError."""
    message = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "weather", "input": {"Oslo", "Lima"}},
        {"type": "tool_use", "id": "b", "name": "weather", "input": {"city": "Lima"}},
        {"type": "tool_use", "id": "c", "name": "weather", "input": {1: "Lima"}},
    ]}  # fmt: skip
    turn = await runner.run_turn(fanout.calls_from_anthropic(message))
    assert [r.status for r in turn.results] == [Status.ERROR, Status.OK, Status.ERROR]


@pytest.mark.parametrize(
    "block",
    [
        {"type": "tool_use", "name": "t", "input": {}},
        {"type": "tool_use", "id": "", "name": "t"},
        {"type": "tool_use", "id": 7, "name": "t"},
        {"type": 3, "id": "x"},
        "tool_use",
    ],
)
def test_a_tool_use_without_a_usable_id_is_structurally_broken(block: Any) -> None:
    """A call no answer could name refuses the message with InvalidTurnError."""
    with pytest.raises(fanout.InvalidTurnError):
        fanout.calls_from_anthropic({"role": "assistant", "content": [block]})


@settings(max_examples=200, deadline=None)
@given(call_id=_HOSTILE, content=_HOSTILE, calls=_HOSTILE)
def test_any_field_of_any_type_is_a_call_or_an_invalid_turn(
    call_id: Any, content: Any, calls: Any
) -> None:
    """Hostile ids, content and tool_calls give calls or InvalidTurnError, nothing else."""
    for adapter, message in [
        (fanout.calls_from_anthropic, {"role": "assistant", "content": content}),
        (fanout.calls_from_anthropic,
         {"content": [{"type": "tool_use", "id": call_id, "input": content}]}),
        (fanout.calls_from_openai, {"role": "assistant", "tool_calls": calls}),
        (fanout.calls_from_openai, {"tool_calls": [{"id": call_id, "function": content}]}),
        (fanout.calls_from_responses, {"output": [{"type": "function_call", "call_id": call_id,
                                                   "name": content, "arguments": calls}]}),
        (fanout.calls_from_responses, calls),
        (fanout.calls_from_anthropic, content),
        (fanout.calls_from_openai, calls),
    ]:  # fmt: skip
        try:
            found = adapter(message)
        except fanout.InvalidTurnError:
            continue
        assert all(isinstance(call, ToolCall) and call.id for call in found)


# -- wrong shapes: say what was given and what to pass ------------------------------------

CHAT_COMPLETION = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-4o",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": OPENAI_MESSAGE}],
}  # fmt: skip
RESPONSE = {
    "id": "resp_1", "object": "response", "created_at": 0, "model": "gpt-4o",
    "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
    "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_9",
                "name": "weather", "arguments": '{"city": "Oslo"}', "status": "completed"}],
}  # fmt: skip
LEGACY = {"role": "assistant", "content": None,
          "function_call": {"name": "weather", "arguments": "{}"}}  # fmt: skip


@pytest.mark.parametrize(
    ("adapter", "given", "words"),
    [
        (fanout.calls_from_openai, ChatCompletion.model_validate(CHAT_COMPLETION),
         "a whole OpenAI ChatCompletion; pass completion.choices[0].message"),
        (fanout.calls_from_openai, Response.model_validate(RESPONSE),
         "Responses API Response; pass it to fanout.calls_from_responses"),
        (fanout.calls_from_openai, Message.model_validate(ANTHROPIC_MESSAGE),
         "an Anthropic message; pass it to fanout.calls_from_anthropic"),
        (fanout.calls_from_openai, ChatCompletionMessage.model_validate(LEGACY),
         "legacy OpenAI function_call message"),
        (fanout.calls_from_anthropic, ChatCompletionMessage.model_validate(OPENAI_MESSAGE),
         "an OpenAI Chat Completions message; pass it to fanout.calls_from_openai"),
        (fanout.calls_from_anthropic, CHAT_COMPLETION, "a whole OpenAI ChatCompletion"),
        (fanout.calls_from_anthropic, {"role": "user", "content": []}, "role 'user'"),
        (fanout.calls_from_responses, ChatCompletionMessage.model_validate(OPENAI_MESSAGE),
         "an OpenAI Chat Completions message"),
        (fanout.calls_from_responses, Message.model_validate(ANTHROPIC_MESSAGE),
         "an Anthropic message"),
        (fanout.calls_from_responses, RESPONSE["output"][0], "one function_call item"),  # type: ignore[index]
        (fanout.calls_from_anthropic, {"type": "content_block_start", "index": 0},
         "an Anthropic streaming event; pass the whole message"),
        (fanout.calls_from_openai, {"object": "chat.completion.chunk", "choices": []},
         "a Chat Completions streaming chunk"),
        (fanout.calls_from_responses, {"type": "response.output_item.done", "item": {}},
         "a Responses streaming event; pass the final Response"),
    ],
)  # fmt: skip
def test_wrong_shapes_say_what_they_are_and_what_to_pass(
    adapter: Any, given: Any, words: str
) -> None:
    """Each adapter names the object it was given by mistake and the call to make instead."""
    with pytest.raises(fanout.InvalidTurnError, match=re.escape(words)):
        adapter(given)


def test_param_dicts_holding_sdk_objects_are_read() -> None:
    """to_param() and {"role": ..., "content": response.content} read like the message."""
    message = Message.model_validate(ANTHROPIC_MESSAGE)
    expected = fanout.calls_from_anthropic(message)
    assert len(expected) == 3
    assert fanout.calls_from_anthropic(message.to_param()) == expected
    assert (
        fanout.calls_from_anthropic({"role": "assistant", "content": message.content}) == expected
    )
    chat = ChatCompletionMessage.model_validate(OPENAI_MESSAGE)
    held = {"role": "assistant", "content": None, "tool_calls": chat.tool_calls}
    assert fanout.calls_from_openai(held) == fanout.calls_from_openai(chat)


async def test_deep_input_inside_an_sdk_block_is_that_calls_error(runner: Runner) -> None:
    """SDK objects are read field by field, so 5,000-deep input fails only its own call."""
    deep = ToolUseBlock.model_construct(id="toolu_deep", name="weather", input=_deep(5000),
                                        type="tool_use")  # fmt: skip
    fine = ToolUseBlock(id="toolu_fine", name="weather", input={"city": "Oslo"}, type="tool_use")
    calls = fanout.calls_from_anthropic({"role": "assistant", "content": [deep, fine]})
    assert [call.id for call in calls] == ["toolu_deep", "toolu_fine"]
    turn = await runner.run_turn(calls)
    assert [r.status for r in turn.results] == [Status.ERROR, Status.OK]
    assert calls[0].arguments == "<an object nested deeper than 200 levels>"


# --- what a real SDK loop hands the adapters (found by one run against strict fakes) ---


def test_a_tool_use_cut_off_by_max_tokens_is_not_run_with_what_the_sdk_made_of_it() -> None:
    """``stop_reason: "max_tokens"`` inside the last ``tool_use``: the SDK's lenient parse
    gave ``{"seats": 12}`` of ``{"seats": 120}``, and the write ran with it. Streamed, the
    pieces are no JSON object and the call is answered error; so it is here, not run."""
    message = {
        "role": "assistant", "stop_reason": "max_tokens",
        "content": [
            {"type": "tool_use", "id": "toolu_0", "name": "lookup", "input": {"q": "x"}},
            {"type": "tool_use", "id": "toolu_1", "name": "book", "input": {"seats": 12}},
        ],
    }  # fmt: skip
    first, cut = fanout.calls_from_anthropic(message)
    assert (first.arguments, first.arguments_valid) == ({"q": "x"}, True)
    assert not cut.arguments_valid
    whole = {**message, "stop_reason": "tool_use"}
    assert fanout.calls_from_anthropic(whole)[1].arguments == {"seats": 12}


def test_a_message_whose_role_is_none_is_the_assistant_s() -> None:
    """The SDK's accumulated stream has ``role: None`` where no chunk carried one: it was
    refused as another role's message, after its calls had run."""
    message = {"role": None, "content": None,
               "tool_calls": [{"id": "call_1", "type": "function",
                               "function": {"name": "weather", "arguments": "{}"}}]}  # fmt: skip
    assert [c.id for c in fanout.calls_from_openai(message)] == ["call_1"]


def test_a_call_id_the_sdk_joined_from_repeated_pieces_is_answered_under_it() -> None:
    """A server that repeats a call's id in every piece: the SDK's final message says
    ``call_1call_1call_1``; fanout ran ``call_1``. Its answer goes under the message's id
    (it was answered "cancelled, not run", and ``call_1``'s own answer followed for an id
    the message did not hold: the API refused it)."""
    joined = "call_1" * 3
    message = {"role": "assistant", "content": None,
               "tool_calls": [{"id": joined, "type": "function",
                               "function": {"name": "weather", "arguments": "{}"}}]}  # fmt: skip
    result = fanout.ToolResult("call_1", Status.OK, "clear")
    (answer,) = fanout.openai_tool_messages([result], message)
    assert (answer["tool_call_id"], answer["content"]) == (joined, "clear")
