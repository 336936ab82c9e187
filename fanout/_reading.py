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

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from ._canonical import MAX_DEPTH, safe_text, shown
from ._exceptions import InvalidTurnError

__all__ = [
    "arguments_from",
    "decode_arguments",
    "items_of",
    "mapping_of",
    "plain",
    "refuse_other_shapes",
    "refusing_malformed",
    "shown",
    "tool_name",
]


_P = ParamSpec("_P")
_R = TypeVar("_R")


def refusing_malformed(what: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """An adapter or history repair whose input no SDK writes (a block without its id, a
    list where a type or an id goes, a string where a call goes) raises an
    ``InvalidTurnError`` saying so, never the ``KeyError``, ``TypeError`` or
    ``AttributeError`` its reading met: every exception fanout raises is a
    ``FanoutError``. The checks the readers make themselves say more, and come first.
    """

    def wrap(read: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(read)
        def reading(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return read(*args, **kwargs)
            except (KeyError, TypeError, AttributeError) as exc:
                detail = safe_text(exc)[:200]
                raise InvalidTurnError(
                    f"{what} holds something no SDK writes ({type(exc).__name__}: {detail})"
                ) from exc

        return reading

    return wrap


def plain(value: Any) -> Any:
    """An SDK (pydantic) object as a dict of its fields, one level deep; anything else as is.

    Only one level, and without serialising: nested SDK objects are read
    by their parents' readers in turn, and arguments inside are never walked
    (they may nest thousands deep, which a full dump would fail on).
    """
    if not hasattr(type(value), "model_fields") or not hasattr(value, "__dict__"):
        return value
    fields = dict(value.__dict__)
    fields.update(getattr(value, "__pydantic_extra__", None) or {})
    return fields


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


NO_NAME = "<no tool name>"


def tool_name(value: Any) -> str:
    """A name field: its text, or a placeholder no tool has, so the call is refused.

    An empty or missing name is one bad call, answered "there is no tool
    named ..." with the list of tools, never a refused message.
    """
    return value if isinstance(value, str) and value else NO_NAME


def arguments_from(value: Any) -> Mapping[str, Any] | str:
    """Arguments already decoded (Anthropic ``input``): a JSON object, or text saying what came.

    A mapping with a key that is not a string is not a JSON object, and a
    set or a number is not one either: the call is kept, and answered
    ``error`` as having arguments that are not a JSON object.
    """
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            return "<a mapping with keys that are not strings, not a JSON object>"
        if _deeper_than(value, MAX_DEPTH):
            return f"<an object nested deeper than {MAX_DEPTH} levels>"
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
    if not isinstance(decoded, dict) or _deeper_than(decoded, MAX_DEPTH):
        return value
    return decoded


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels, walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, Mapping):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
    return False


def refuse_other_shapes(data: Mapping[Any, Any], *, own: str, given: Any) -> None:
    """Raise when ``data`` is a shape passed by mistake, saying what it is and what to do.

    ``own`` names the shape the calling adapter reads, which is never refused.
    """
    for shape, words in _shapes(data):
        if shape != own:
            raise InvalidTurnError(f"got {words} (a {_name(given)})")


_ANTHROPIC_EVENTS = frozenset(
    {"message_start", "message_delta", "message_stop", "content_block_start",
     "content_block_delta", "content_block_stop"}
)  # fmt: skip


def _shapes(data: Mapping[Any, Any]) -> list[tuple[str, str]]:
    found = []
    kind = data.get("type")
    if kind in _ANTHROPIC_EVENTS:
        found.append(("anthropic-event", "an Anthropic streaming event; pass the whole "
                      "message (stream.get_final_message())"))  # fmt: skip
    if data.get("object") == "chat.completion.chunk":
        found.append(("chunk", "a Chat Completions streaming chunk; pass the accumulated "
                      "message (stream.get_final_completion().choices[0].message)"))  # fmt: skip
    if isinstance(kind, str) and kind.startswith("response.") and kind != "response.completed":
        found.append(("response-event", "a Responses streaming event; pass the final "
                      "Response (stream.get_final_response(), or the response.completed "
                      "event)"))  # fmt: skip
    if data.get("object") == "chat.completion" or (
        "choices" in data and data.get("object") != "chat.completion.chunk"
    ):
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
