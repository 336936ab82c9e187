"""The OpenAI Responses API: ``function_call`` items in, ``function_call_output`` items out.

A ``Response`` lists its output items (messages, reasoning, calls) in
``output``; each ``function_call`` carries a ``call_id`` and its arguments as
JSON text. The next request's ``input`` must hold one
``function_call_output`` per ``call_id``; ``role: "tool"`` messages, which
Chat Completions wants, are refused there. Output items are typed as the
SDK's ``ResponseInputItemParam`` member, so
``input_items.extend(fanout.responses_tool_outputs(turn))`` type-checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._adapters import answering, call_id_of
from ._canonical import shown
from ._exceptions import InvalidTurnError
from ._output import Image, Part, Text, render
from ._reading import (
    decode_arguments,
    items_of,
    plain,
    refuse_other_shapes,
    refusing_malformed,
    tool_name,
)
from ._values import ToolCall

if TYPE_CHECKING:
    from openai.types.responses.response_function_call_output_item_param import (
        ResponseFunctionCallOutputItemParam,
    )
    from openai.types.responses.response_input_item_param import FunctionCallOutput

__all__ = ["CUSTOM_CALLS_REFUSED", "calls_from_responses", "responses_tool_outputs"]

_EXPECTED = "an OpenAI Response, or its output list (SDK items or dicts)"
CUSTOM_CALLS_REFUSED = (
    "custom tools are not supported on the Responses API yet; "
    "declare the tool as a function (registry.responses_tools())"
)


@refusing_malformed("a Responses response")
def calls_from_responses(response: Any) -> list[ToolCall]:
    """The ``function_call`` items of a Response (or of its ``output`` list), as calls.

    Items fanout does not run (messages, reasoning, hosted tools) are
    skipped. A ``custom_tool_call`` is refused: its answer is a different
    item type, which ``responses_tool_outputs`` does not write.
    """
    calls: list[ToolCall] = []
    for item in _output_items(response):
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise InvalidTurnError(
                f"a Responses output item must be a mapping with a type, got {shown(item)}"
            )
        if item["type"] == "custom_tool_call":
            raise InvalidTurnError(CUSTOM_CALLS_REFUSED)
        if item["type"] != "function_call":
            continue
        call_id = call_id_of(item.get("call_id"), "function_call item")
        name = tool_name(item.get("name"))
        calls.append(ToolCall(call_id, name, decode_arguments(item.get("arguments")), len(calls)))
    return calls


def responses_tool_outputs(results: Any, response: Any = None) -> list[FunctionCallOutput]:
    """One ``function_call_output`` item per call, in the model's order (``response``:
    the Response they answer, where a streamed turn may not have read all of it)."""
    calls = None if response is None else calls_from_responses(response)
    return [
        {"type": "function_call_output", "call_id": result.tool_use_id,
         "output": render(result.content, _output_item)}
        for result in answering(results, calls)
    ]  # fmt: skip


def _output_item(part: Part) -> ResponseFunctionCallOutputItemParam:
    if isinstance(part, Text):
        return {"type": "input_text", "text": part.text}
    if isinstance(part, Image):
        return {"type": "input_image", "image_url": f"data:{part.media_type};base64,{part.data}"}
    if part.media_type == "application/pdf":
        return {"type": "input_file", "filename": part.title or "document.pdf",
                "file_data": f"data:application/pdf;base64,{part.data}"}  # fmt: skip
    return {"type": "input_text", "text": part.data}


def _output_items(response: Any) -> list[Any]:
    data = plain(response)
    if isinstance(data, list | tuple):
        return items_of(data, "a Response's output")
    if not isinstance(data, dict):
        raise InvalidTurnError(f"got a {type(response).__name__}; pass {_EXPECTED}")
    if data.get("type") == "function_call":
        raise InvalidTurnError(
            f"got one function_call item; pass {_EXPECTED} so every call is answered"
        )
    if data.get("type") == "response.completed" and "response" in data:
        data = plain(data["response"])  # the stream's last event holds the final Response
        if not isinstance(data, dict):
            raise InvalidTurnError(f"a response.completed event without a Response: {shown(data)}")
    refuse_other_shapes(data, own="response", given=response)
    if "output" not in data:
        raise InvalidTurnError(f"got a mapping without output; pass {_EXPECTED}")
    return items_of(data["output"], "a Response's output")
