"""A tool's definition, and the three ``tools=`` spellings the vendors accept.

The same facts (name, description, JSON Schema of the arguments) are laid
out differently for Anthropic Messages (``input_schema``), OpenAI Chat
Completions (nested under ``function``) and OpenAI Responses (flat, with
``strict``). The return types are the SDKs' own param TypedDicts, imported
for type checking only: fanout never needs an SDK at run time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ._exceptions import ConfigurationError
from ._redact import redact_text

if TYPE_CHECKING:
    from anthropic.types import ToolParam
    from openai.types.chat import ChatCompletionFunctionToolParam
    from openai.types.responses import FunctionToolParam

__all__ = [
    "ToolDefinition",
    "anthropic_tool",
    "checked_schema",
    "openai_tool",
    "responses_tool",
    "scrubbed_definition",
]

# What both vendors accept as a tool name.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@attrs.frozen
class ToolDefinition:
    """What a model is told about one tool."""

    name: str
    description: str
    parameters: dict[str, Any] = attrs.field(eq=False)


def checked_schema(schema: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A hand-written schema must describe an arguments object, as every vendor requires."""
    if schema is None:
        return None
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ConfigurationError(
            'schema= is the JSON Schema of the arguments object: a mapping with "type": "object"'
        )
    return dict(schema)


def scrubbed_definition(definition: ToolDefinition) -> ToolDefinition:
    """``definition`` with no credential in its description or in any text of its schema.

    What the model is told of a tool is text fanout writes for it, as an
    answer is: a signature's default (``api_key: str = KEY``) became the
    schema's ``"default"``, and an MCP server put the session's own token in
    a tool's description; both went to the model in every ``tools=`` list.
    The schema's keys (the arguments' names) are the tool's, and stay.
    """
    description = redact_text(definition.description)
    parameters = _scrubbed_values(definition.parameters)
    if description == definition.description and parameters is definition.parameters:
        return definition
    return ToolDefinition(definition.name, description, parameters)


def _scrubbed_values(value: Any) -> Any:
    """``value`` (JSON) with each string in it redacted; the same object where none was."""
    if isinstance(value, str):
        scrubbed = redact_text(value)
        return value if scrubbed == value else scrubbed
    if isinstance(value, Mapping):
        items = {key: _scrubbed_values(item) for key, item in value.items()}
        same = all(items[key] is item for key, item in value.items())
        return value if same else items
    if isinstance(value, list | tuple):
        entries = [_scrubbed_values(item) for item in value]
        return value if all(a is b for a, b in zip(entries, value, strict=True)) else entries
    return value


def _named(definition: ToolDefinition) -> str:
    if not _NAME.fullmatch(definition.name):
        raise ConfigurationError(
            f"tool name {definition.name!r} is not accepted by the model APIs: "
            "use 1 to 64 letters, digits, '_' or '-' (register it with name=...)"
        )
    return definition.name


def anthropic_tool(definition: ToolDefinition) -> ToolParam:
    """One entry of ``tools=`` for ``client.messages.create``."""
    tool: ToolParam = {"name": _named(definition), "input_schema": definition.parameters}
    if definition.description:
        tool["description"] = definition.description
    return tool


def openai_tool(definition: ToolDefinition) -> ChatCompletionFunctionToolParam:
    """One entry of ``tools=`` for ``client.chat.completions.create``."""
    tool: ChatCompletionFunctionToolParam = {
        "type": "function",
        "function": {"name": _named(definition), "parameters": definition.parameters},
    }
    if definition.description:
        tool["function"]["description"] = definition.description
    return tool


def responses_tool(definition: ToolDefinition) -> FunctionToolParam:
    """One entry of ``tools=`` for ``client.responses.create``.

    ``strict`` is False: strict mode demands every property be required and
    no defaults, which ordinary signatures with optional arguments do not
    meet. A tool that does meet it can pass its own ``schema=``.
    """
    tool: FunctionToolParam = {
        "type": "function",
        "name": _named(definition),
        "parameters": definition.parameters,
        "strict": False,
    }
    if definition.description:
        tool["description"] = definition.description
    return tool
