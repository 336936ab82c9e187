"""The OpenAI Responses API: function_call items in, function_call_output items out."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseInputItemParam,
    ResponseOutputMessage,
)

import fanout
from fanout import Kind, Registry, Runner, Status, ToolCall

OUTPUT: list[dict[str, Any]] = [
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "weather",
     "arguments": '{"city": "Oslo"}', "status": "completed"},
    {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "weather",
     "arguments": "{oops", "status": "completed"},
    {"type": "function_call", "id": "fc_3", "call_id": "call_c", "name": "weather",
     "arguments": "", "status": "completed"},
]  # fmt: skip
RESPONSE: dict[str, Any] = {
    "id": "resp_1", "object": "response", "created_at": 0, "model": "gpt-4o",
    "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "output": OUTPUT,
}  # fmt: skip
EXPECTED = [
    ToolCall("call_a", "weather", {"city": "Oslo"}, 0),
    ToolCall("call_b", "weather", "{oops", 1),
    ToolCall("call_c", "weather", {}, 2),
]


@pytest.fixture
def runner() -> Runner:
    registry = Registry()

    @registry.tool(kind=Kind.READS)
    async def weather(city: str = "here") -> str:
        return f"clear in {city}"

    return Runner(registry)


@pytest.mark.parametrize(
    "given",
    [
        Response.model_validate(RESPONSE),
        RESPONSE,
        Response.model_validate(RESPONSE).output,
        OUTPUT,
        [ResponseOutputMessage.model_validate(OUTPUT[1]),
         *(ResponseFunctionToolCall.model_validate(item) for item in OUTPUT[2:])],
        ResponseCompletedEvent(type="response.completed", sequence_number=9,
                               response=Response.model_validate(RESPONSE)),
    ],
    ids=["sdk-response", "dict-response", "sdk-output", "dict-output", "sdk-items",
         "stream-completed-event"],
)  # fmt: skip
def test_function_calls_are_read_from_every_form(given: Any) -> None:
    """A Response, its dict, or its output items (objects or dicts) give the same calls."""
    assert fanout.calls_from_responses(given) == EXPECTED


async def test_every_call_id_is_answered_in_order(runner: Runner) -> None:
    """One function_call_output per call_id, in order, each a valid ResponseInputItemParam."""
    turn = await runner.run_turn(fanout.calls_from_responses(Response.model_validate(RESPONSE)))
    outputs = fanout.responses_tool_outputs(turn)
    adapter = pydantic.TypeAdapter(ResponseInputItemParam)
    for item in outputs:
        adapter.validate_python(item)
    assert [item["call_id"] for item in outputs] == ["call_a", "call_b", "call_c"]
    assert [item["type"] for item in outputs] == ["function_call_output"] * 3
    assert [r.status for r in turn.results] == [Status.OK, Status.ERROR, Status.OK]
    assert outputs[0]["output"] == "clear in Oslo"


def test_a_response_without_calls_gives_none() -> None:
    """A Response that only talks has nothing to run."""
    assert fanout.calls_from_responses({**RESPONSE, "output": OUTPUT[:2]}) == []


@pytest.mark.parametrize(
    "given",
    [42, {"object": "response"}, {"output": 7}, {"output": [7]},
     {"output": [{"type": "function_call", "name": "weather"}]},
     {"output": [{"type": "custom_tool_call", "call_id": "c", "name": "x", "input": ""}]},
     {"type": "response.completed", "response": "done"}],
)  # fmt: skip
def test_unreadable_responses_are_invalid_turns(given: Any) -> None:
    """Input that cannot be answered raises InvalidTurnError saying what was wrong."""
    with pytest.raises(fanout.InvalidTurnError):
        fanout.calls_from_responses(given)
