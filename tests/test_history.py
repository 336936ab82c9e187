"""History repair: every dangling call answered cancelled, stray results dropped, valid after."""

from __future__ import annotations

import contextlib
import itertools
import json
from typing import Any

import pytest
from anthropic.types import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessage
from openai.types.responses import ResponseFunctionToolCall

import fanout
from fanout._history import cancelled_text
from tests.strict_api import anthropic_errors, chat_errors, responses_errors

# A conversation as the model saw it: per turn, the calls made (id, tool name).
Turns = list[list[tuple[str, str]]]

_TURNS = st.lists(
    st.lists(st.sampled_from(["weather", "search", "launch"]), max_size=4), min_size=1, max_size=4
).map(
    lambda turns: [[(f"t{i}_{j}", name) for j, name in enumerate(t)] for i, t in enumerate(turns)]
)
# What goes wrong with a stored history, per answer: kept, lost, doubled, split off, or stray.
_FATE = st.sampled_from(["kept", "kept", "lost", "doubled", "split", "stray"])


@st.composite
def _damaged_anthropic(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A history with answers lost, doubled, split off, stray, and cut anywhere."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for turn in draw(_TURNS):
        uses = [{"type": "tool_use", "id": i, "name": n, "input": {}} for i, n in turn]
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "ok"}, *uses]})
        results: list[dict[str, Any]] = []
        split: list[dict[str, Any]] = []
        for call_id, _ in turn:
            block = {"type": "tool_result", "tool_use_id": call_id, "content": f"answer {call_id}"}
            fate = draw(_FATE)
            if fate in ("kept", "doubled"):
                results.append(block)
            if fate == "doubled":
                results.append({**block, "content": "second answer"})
            if fate == "split":
                split.append(block)
            if fate == "stray":
                results.append({**block, "tool_use_id": f"stray_{call_id}"})
        if results or draw(st.booleans()):
            messages.append({"role": "user", "content": [*results, {"type": "text", "text": "go"}]})
        if split:
            messages.append({"role": "user", "content": split})
    cut = draw(st.integers(1, len(messages)))
    return messages[:cut]


@settings(max_examples=300, deadline=None)
@given(damaged=_damaged_anthropic())
def test_repaired_anthropic_history_is_valid_and_keeps_real_answers(
    damaged: list[dict[str, Any]],
) -> None:
    """Any damage repairs to a history the Messages API accepts, real answers intact."""
    kept = _answered_in_place(damaged)
    repaired = fanout.repair_anthropic_history(damaged)
    assert anthropic_errors(repaired) == []
    assert fanout.repair_anthropic_history(repaired) == repaired
    answers = {
        block["tool_use_id"]: block["content"]
        for message in repaired
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"  # type: ignore[index]
    }
    for call_id, content in answers.items():
        if call_id in kept:
            assert content == kept[call_id]
        else:
            assert json.loads(content)["status"] == "cancelled"  # type: ignore[arg-type]


def _answered_in_place(messages: list[dict[str, Any]]) -> dict[str, str]:
    """The first answer to each call found in the user message right after it."""
    kept: dict[str, str] = {}
    for message, following in itertools.pairwise(messages):
        uses = [b["id"] for b in message["content"] if b["type"] == "tool_use"] if (
            message["role"] == "assistant") else []  # fmt: skip
        for block in following["content"] if following["role"] == "user" else []:
            if block["type"] == "tool_result" and block["tool_use_id"] in uses:
                kept.setdefault(block["tool_use_id"], block["content"])
    return kept


def test_sdk_messages_in_a_history_become_params() -> None:
    """Stored SDK Message objects lose their response-only fields and are answered."""
    response = Message.model_validate({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "launch", "input": {"n": 1}}],
    })  # fmt: skip
    repaired = fanout.repair_anthropic_history([{"role": "user", "content": "go"}, response])
    assert anthropic_errors(repaired) == []
    assert repaired[1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "launch", "input": {"n": 1}}],
    }
    assert repaired[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": cancelled_text("launch"), "is_error": True}],
    }  # fmt: skip


@st.composite
def _damaged_chat(draw: st.DrawFn) -> list[Any]:
    messages: list[Any] = [{"role": "user", "content": "start"}]
    for turn in draw(_TURNS):
        calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}
                 for i, n in turn]  # fmt: skip
        assistant: dict[str, Any] = {"role": "assistant", "content": "ok"}
        if calls:
            assistant = {"role": "assistant", "content": None, "tool_calls": calls}
        sdk = draw(st.booleans())
        messages.append(ChatCompletionMessage.model_validate(assistant) if sdk else assistant)
        late = []
        for call_id, _ in turn:
            answer = {"role": "tool", "tool_call_id": call_id, "content": f"answer {call_id}"}
            fate = draw(_FATE)
            if fate in ("kept", "doubled"):
                messages.append(answer)
            if fate == "doubled":
                messages.append(answer)
            if fate == "split":
                late.append(answer)
            if fate == "stray":
                messages.append({**answer, "tool_call_id": f"stray_{call_id}"})
        messages.append({"role": "user", "content": "next"})
        messages += late
    return messages[: draw(st.integers(1, len(messages)))]


@settings(max_examples=300, deadline=None)
@given(damaged=_damaged_chat())
def test_repaired_chat_history_is_valid(damaged: list[Any]) -> None:
    """Any damage repairs to a history Chat Completions accepts; repair is idempotent."""
    repaired = fanout.repair_openai_history(damaged)
    assert chat_errors(repaired) == []
    assert fanout.repair_openai_history(repaired) == repaired


@st.composite
def _damaged_responses(draw: st.DrawFn) -> list[Any]:
    items: list[Any] = [{"role": "user", "content": "start"}]
    for turn in draw(_TURNS):
        outputs = []
        for call_id, name in turn:
            call = {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}
            items.append(ResponseFunctionToolCall.model_validate(call) if draw(st.booleans())
                         else call)  # fmt: skip
            output = {"type": "function_call_output", "call_id": call_id, "output": "done"}
            fate = draw(_FATE)
            if fate in ("kept", "doubled", "split"):
                outputs.append(output)
            if fate == "doubled":
                outputs.append(output)
            if fate == "stray":
                items.insert(draw(st.integers(0, len(items))), output)
        items += outputs
        items.append({"role": "assistant", "content": "said something"})
    return items[: draw(st.integers(1, len(items)))]


@settings(max_examples=300, deadline=None)
@given(damaged=_damaged_responses())
def test_repaired_responses_input_is_valid(damaged: list[Any]) -> None:
    """Any damage repairs to input the Responses API accepts; repair is idempotent."""
    repaired = fanout.repair_responses_input(damaged)
    assert responses_errors(repaired) == []
    assert fanout.repair_responses_input(repaired) == repaired


@pytest.mark.parametrize(
    ("repair", "history"),
    [
        (fanout.repair_anthropic_history, [42]),
        (fanout.repair_anthropic_history, [{"role": "system", "content": "x"}]),
        (fanout.repair_openai_history, [{"content": "no role"}]),
        (fanout.repair_responses_input, ["text"]),
    ],
)
def test_unreadable_histories_are_invalid_turns(repair: Any, history: list[Any]) -> None:
    """A history item that is no message raises InvalidTurnError naming what it got."""
    with pytest.raises(fanout.InvalidTurnError):
        repair(history)


_HOSTILE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6)
    | st.sampled_from(["tool_use", "tool_result", "function_call", "function_call_output",
                       "assistant", "user", "tool", "id", "call_id", "type", "function"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(
        st.sampled_from(["type", "id", "call_id", "role", "content", "tool_calls", "function",
                         "name", "input", "arguments", "output", "tool_use_id", "tool_call_id"]),
        inner, max_size=5,
    ),
    max_leaves=20,
)  # fmt: skip
_READERS = [
    fanout.repair_anthropic_history, fanout.repair_openai_history, fanout.repair_responses_input,
    fanout.calls_from_anthropic, fanout.calls_from_openai, fanout.calls_from_responses,
    lambda message: fanout.anthropic_tool_results([], message),
    lambda message: fanout.openai_tool_messages([], message),
    lambda message: fanout.responses_tool_outputs([], message),
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(value=_HOSTILE, reader=st.sampled_from(_READERS))
def test_any_message_or_history_is_read_or_refused_with_a_fanout_error(
    value: Any, reader: Any
) -> None:
    """Blocks without ids, lists where a type goes, strings where a call goes: every
    adapter and history repair reads its input or raises a ``FanoutError``, never the
    ``KeyError``, ``TypeError`` or ``AttributeError`` its reading met (ten such were
    found: a ``tool_use`` block without ``id``, ``"tool_calls": 5``, ``{"type": []}``)."""
    with contextlib.suppress(fanout.FanoutError):
        reader(value)


def test_a_responses_history_s_custom_tool_calls_are_answered_and_orphans_dropped() -> None:
    """A dangling ``custom_tool_call`` was left unanswered and an orphan
    ``custom_tool_call_output`` kept: the Responses API refuses both. Each is answered
    by its own output type; an output of the wrong type answers nothing."""
    stored = [
        {"role": "user", "content": "find TODOs and the weather"},
        {"type": "function_call", "call_id": "call_f", "name": "weather", "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "call_c", "name": "grep", "input": "TODO"},
        {"type": "custom_tool_call_output", "call_id": "call_gone", "output": "stale"},
        {"type": "function_call_output", "call_id": "call_c", "output": "wrong type"},
    ]
    repaired = [dict(item) for item in fanout.repair_responses_input(stored)]
    outputs = [(i["type"], i["call_id"]) for i in repaired if i.get("type", "").endswith("output")]
    assert outputs == [("function_call_output", "call_f"), ("custom_tool_call_output", "call_c")]
