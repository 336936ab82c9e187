"""Reading what a model sent, whatever it is, without trusting any of it.

The adapters take SDK objects (pydantic models), their ``to_param()`` or
``model_dump()`` dicts, and dicts that hold SDK objects (``{"role":
"assistant", "content": response.content}``). Every field may be of the
wrong type. Two kinds of badness are told apart: a message that cannot be
answered at all (not a mapping, a call without an id) is an
``InvalidTurnError`` saying what was given and what to pass; one call with
a bad name or bad arguments is still a call, answered ``refused`` or
``error`` while its siblings run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._exceptions import InvalidTurnError

__all__ = [
    "arguments_from",
    "decode_arguments",
    "items_of",
    "mapping_of",
    "plain",
    "refuse_other_shapes",
    "shown",
    "text_or_empty",
]


def plain(value: Any) -> Any:
    """An SDK (pydantic) object as plain data, one level deep; anything else as is.

    Only one level: nested SDK objects are dumped by their parents, and the
    arguments inside are never walked (they may nest thousands deep).
    """
    dump = getattr(value, "model_dump", None)
    if not callable(dump):
        return value
    try:
        return dump(mode="python")
    except Exception as exc:  # a broken model object is broken input
        raise InvalidTurnError(f"cannot read {type(value).__name__}: {exc}") from exc


def mapping_of(value: Any, what: str, expected: str) -> Mapping[Any, Any]:
    """``value`` as a mapping, or an error saying what it is and what to pass."""
    data = plain(value)
    if not isinstance(data, Mapping):
        raise InvalidTurnError(f"not {what}: got {_name(value)}; pass {expected}")
    return data


def items_of(value: Any, what: str) -> list[Any]:
    """A JSON array field as a list of plain items; None is an empty list."""
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise InvalidTurnError(f"{what} must be a list, got {_name(value)}")
    return [plain(item) for item in value]


def text_or_empty(value: Any) -> str:
    """A name field: text, or "" (the call is then answered "no such tool")."""
    return value if isinstance(value, str) else ""


def arguments_from(value: Any) -> Mapping[str, Any] | str:
    """Arguments already decoded (Anthropic ``input``): a JSON object, or text saying what came.

    A mapping with a key that is not a string is not a JSON object, and a
    set or a number is not one either: the call is kept, and answered
    ``error`` as having arguments that are not a JSON object.
    """
    if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        return dict(value)
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return f"<{type(value).__name__}, not a JSON object>"


def decode_arguments(value: Any) -> Mapping[str, Any] | str:
    """Arguments sent as JSON text (OpenAI): the decoded object, or the raw text.

    Text nested too deep to decode, or that is not an object, stays text.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}  # models send "" for a call with no parameters
    if not isinstance(value, str):
        return arguments_from(value)
    try:
        decoded = json.loads(value)
    except (ValueError, RecursionError):
        return value
    return decoded if isinstance(decoded, dict) else value


def refuse_other_shapes(data: Mapping[Any, Any], *, own: str, given: Any) -> None:
    """Raise when ``data`` is a shape passed by mistake, saying what it is and what to do.

    ``own`` names the shape the calling adapter reads, which is never refused.
    """
    for shape, words in _shapes(data):
        if shape != own:
            raise InvalidTurnError(f"got {words} (a {_name(given)})")


def _shapes(data: Mapping[Any, Any]) -> list[tuple[str, str]]:
    found = []
    if data.get("object") == "chat.completion" or "choices" in data:
        found.append(("completion", "a whole OpenAI ChatCompletion; pass "
                      "completion.choices[0].message to fanout.calls_from_openai"))  # fmt: skip
    if data.get("object") == "response" or isinstance(data.get("output"), list | tuple):
        found.append(("response", "an OpenAI Responses API Response; pass it to "
                      "fanout.calls_from_responses"))  # fmt: skip
    if data.get("function_call") is not None and not data.get("tool_calls"):
        found.append(("legacy", "a legacy OpenAI function_call message, which fanout does "
                      "not run; send tools= (not functions=) so the model answers with "
                      "tool_calls"))  # fmt: skip
    if data.get("tool_calls") is not None:
        found.append(("chat", "an OpenAI Chat Completions message; pass it to "
                      "fanout.calls_from_openai"))  # fmt: skip
    content = data.get("content")
    if isinstance(content, list | tuple) and any(_is_tool_use(block) for block in content):
        found.append(("anthropic", "an Anthropic message; pass it to "
                      "fanout.calls_from_anthropic"))  # fmt: skip
    return found


def _is_tool_use(block: Any) -> bool:
    kind = block.get("type") if isinstance(block, Mapping) else getattr(block, "type", None)
    return kind == "tool_use"


def _name(value: Any) -> str:
    return type(value).__name__


def shown(value: Any) -> str:
    """A short, safe rendering of a hostile value for an error message."""
    try:
        text = repr(value)
    except Exception:  # a __repr__ that raises, or nesting too deep to render
        return f"a {_name(value)}"
    return text if len(text) <= 80 else text[:77] + "..."
