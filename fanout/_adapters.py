"""The edges: SDK messages in, SDK request params out.

Anthropic: an assistant ``Message`` (or its dict) carries ``tool_use``
blocks; the answer is ONE user message of ``tool_result`` blocks, in the
model's order. Splitting results across messages teaches a model to stop
batching. OpenAI: an assistant message carries ``tool_calls`` whose
arguments are a JSON *string*; the answer is one ``role: "tool"`` message
per call, in order.

SDK objects are pydantic models; they are dumped to plain data and
structured with fanout's own private cattrs converter into small attrs
shapes, so the rest of fanout never touches an SDK type.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs

from ._exceptions import InvalidTurnError
from ._values import ToolCall, ToolResult

__all__ = [
    "anthropic_tool_results",
    "calls_from_anthropic",
    "calls_from_openai",
    "openai_tool_messages",
]

_converter = cattrs.Converter(forbid_extra_keys=False)


@attrs.frozen
class _AnthropicBlock:
    type: str
    id: str | None = None
    name: str | None = None
    input: Any = None


@attrs.frozen
class _AnthropicMessage:
    content: list[_AnthropicBlock] | str = attrs.field(factory=list)


@attrs.frozen
class _OpenAIFunction:
    name: str = ""
    arguments: str | None = None


@attrs.frozen
class _OpenAICustom:
    name: str = ""
    input: str | None = None


@attrs.frozen
class _OpenAIToolCall:
    id: str
    type: str = "function"
    function: _OpenAIFunction | None = None
    custom: _OpenAICustom | None = None


@attrs.frozen
class _OpenAIMessage:
    tool_calls: list[_OpenAIToolCall] | None = None


def _content_hook(value: Any, _: Any) -> list[_AnthropicBlock] | str:
    if isinstance(value, str):
        return value
    return [_converter.structure(block, _AnthropicBlock) for block in value]


_converter.register_structure_hook(list[_AnthropicBlock] | str, _content_hook)


def _plain(message: Any) -> Any:
    """An SDK (pydantic) object as plain data; dicts pass through."""
    dump = getattr(message, "model_dump", None)
    return dump(mode="python") if callable(dump) else message


def _structure(data: Any, shape: type[Any], what: str) -> Any:
    if not isinstance(data, Mapping):
        raise InvalidTurnError(f"not a valid {what}: expected a mapping, got {type(data).__name__}")
    try:
        return _converter.structure(data, shape)
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
        raise InvalidTurnError(f"not a valid {what}: {exc}") from exc


def calls_from_anthropic(message: Any) -> list[ToolCall]:
    """The ``tool_use`` blocks of an Anthropic assistant message, as calls."""
    parsed: _AnthropicMessage = _structure(_plain(message), _AnthropicMessage, "Anthropic message")
    if isinstance(parsed.content, str):
        return []
    calls: list[ToolCall] = []
    for block in parsed.content:
        if block.type != "tool_use":
            continue
        arguments = block.input if isinstance(block.input, Mapping) else json.dumps(block.input)
        calls.append(ToolCall(block.id or "", block.name or "", arguments, len(calls)))
    return calls


def anthropic_tool_results(results: Any) -> dict[str, Any]:
    """The one user message that answers every ``tool_use`` block."""
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": result.tool_use_id,
                "content": result.content,
                "is_error": result.is_error,
            }
            for result in _results(results)
        ],
    }


def calls_from_openai(message: Any) -> list[ToolCall]:
    """The ``tool_calls`` of an OpenAI assistant message, as calls.

    Arguments that are not a JSON object are kept as their raw text; the
    call is then answered ``error`` while its siblings run.
    """
    parsed: _OpenAIMessage = _structure(_plain(message), _OpenAIMessage, "OpenAI message")
    calls: list[ToolCall] = []
    for item in parsed.tool_calls or ():
        if item.function is not None:
            name, arguments = item.function.name, _decode(item.function.arguments)
        elif item.custom is not None:
            # Custom tools take free text; it reaches the tool as {"input": text}.
            name, arguments = item.custom.name, {"input": item.custom.input or ""}
        else:
            name, arguments = "", ""
        calls.append(ToolCall(item.id, name, arguments, len(calls)))
    return calls


def openai_tool_messages(results: Any) -> list[dict[str, Any]]:
    """One ``role: "tool"`` message per call, in the model's order."""
    return [
        {"role": "tool", "tool_call_id": result.tool_use_id, "content": result.content}
        for result in _results(results)
    ]


def _decode(arguments: str | None) -> Mapping[str, Any] | str:
    if arguments is None or not arguments.strip():
        return {}  # models send "" for a call with no parameters
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def _results(results: Any) -> list[ToolResult]:
    """Accept a ``Turn`` or any iterable of results."""
    return list(getattr(results, "results", results))
