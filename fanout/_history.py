"""Repair a stored history so every tool call in it has exactly one answer.

fanout answers every call of a turn it runs, but a process can die between
the model's reply and the answer being saved, and histories get truncated
or edited. The APIs then refuse the whole conversation ("tool_use ids were
found without tool_result blocks"). Repair makes the smallest change that
leaves a history the API accepts: every dangling call gets an explicit
``cancelled`` answer with fixed text (same input, same output), and results
that answer no call, or answer one twice, are dropped. Answers that are
there are kept as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ._canonical import canonical_json
from ._exceptions import InvalidTurnError
from ._reading import refusing_malformed
from ._values import Status

if TYPE_CHECKING:
    from anthropic.types import MessageParam
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.responses import ResponseInputItemParam

__all__ = ["repair_anthropic_history", "repair_openai_history", "repair_responses_input"]


def cancelled_text(tool: str) -> str:
    """The answer a repaired call gets: a pure function of the tool's name."""
    return canonical_json(
        {
            "status": Status.CANCELLED.value,
            "tool": tool,
            "message": "the history held no answer for this call; it was answered when the "
            "history was repaired",
            "effect": "unknown: the call may or may not have run; check before re-issuing a write",
            "hint": "re-issue the call if its result is still needed",
        }
    )


@refusing_malformed("an Anthropic history")
def repair_anthropic_history(messages: Iterable[Any]) -> list[MessageParam]:
    """Messages API history: each ``tool_use`` answered first thing in the next user message."""
    source = [_anthropic_message(message) for message in messages]
    repaired: list[Any] = []
    index = 0
    while index < len(source):
        message = source[index]
        index += 1
        uses = _tool_uses(message) if message["role"] == "assistant" else []
        if message["role"] == "assistant":
            repaired.append(message)
        if not uses:
            if message["role"] == "user":
                others = _non_results(message["content"])
                if others:  # results here answer nothing: the last assistant used no tools
                    repaired.append({**message, "content": others})
            continue
        following = source[index] if index < len(source) else None
        content: Any = []
        if following is not None and following["role"] == "user":
            content = following["content"]
            index += 1
        found = {}
        for block in content if isinstance(content, list) else []:
            if _kind(block) == "tool_result" and block.get("tool_use_id") not in found:
                found[block.get("tool_use_id")] = block
        results = [
            found.get(call_id)
            or {"type": "tool_result", "tool_use_id": call_id, "content": cancelled_text(name),
                "is_error": True}
            for call_id, name in uses
        ]  # fmt: skip
        repaired.append({"role": "user", "content": [*results, *_non_results(content)]})
    return repaired


@refusing_malformed("a Chat Completions history")
def repair_openai_history(messages: Iterable[Any]) -> list[ChatCompletionMessageParam]:
    """Chat Completions history: each ``tool_calls`` message followed by one tool message per id."""
    repaired: list[Any] = []
    pending: dict[str, str] = {}  # id -> tool name, of calls not answered yet

    def flush() -> None:
        for call_id, name in pending.items():
            repaired.append(
                {"role": "tool", "tool_call_id": call_id, "content": cancelled_text(name)}
            )
        pending.clear()

    for raw in messages:
        message = _chat_message(raw)
        if message.get("role") == "tool":
            if message.get("tool_call_id") in pending:
                del pending[message["tool_call_id"]]
                repaired.append(message)
            continue  # a tool message answering nothing pending is dropped
        flush()
        repaired.append(message)
        for call in message.get("tool_calls") or ():
            body = call.get(call.get("type", "function")) or {}
            pending.setdefault(call["id"], body.get("name", ""))
    flush()
    return repaired


@refusing_malformed("a Responses input")
def repair_responses_input(items: Iterable[Any]) -> list[ResponseInputItemParam]:
    """Responses API input: each ``function_call`` with one ``function_call_output`` after it,
    and each ``custom_tool_call`` with one ``custom_tool_call_output``.

    A missing output is placed right after the run of call and output items
    its call belongs to. (Custom calls were left unanswered, and their orphan
    outputs kept: the API refuses both.)
    """
    source = [_plain_item(item) for item in items]
    seen: dict[str, str] = {}  # call id -> the type of the output that answers it
    answered: set[str] = set()
    kept: list[Any] = []
    for item in source:
        kind = item.get("type")
        if kind in _OUTPUT_OF:
            seen[item["call_id"]] = _OUTPUT_OF[kind]
        elif kind in _OUTPUTS:
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or seen.get(call_id) != kind or call_id in answered:
                continue  # answers no earlier call, or answers one twice
            answered.add(call_id)
        kept.append(item)
    repaired: list[Any] = []
    block: list[tuple[str, str, str]] = []  # the current run's calls: id, name, output type

    def close_block() -> None:
        repaired.extend(
            {"type": output, "call_id": call_id, "output": cancelled_text(name)}
            for call_id, name, output in block
            if call_id not in answered
        )
        block.clear()

    for item in kept:
        kind = item.get("type")
        if kind in _OUTPUT_OF:
            block.append((item["call_id"], item.get("name", ""), _OUTPUT_OF[kind]))
        elif kind not in _OUTPUTS:
            close_block()
        repaired.append(item)
    close_block()
    return repaired


# The call items of the Responses API, and the type of the item that answers each.
_OUTPUT_OF = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
}
_OUTPUTS = frozenset(_OUTPUT_OF.values())


# -- reading stored messages --------------------------------------------------------------


def _dump(value: Any) -> Any:
    """SDK objects as the plain data a request carries (no nulls the params do not allow)."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else value


def _mapping(value: Any, what: str) -> dict[str, Any]:
    data = _dump(value)
    if not isinstance(data, Mapping):
        raise InvalidTurnError(
            f"{what} must be a mapping or an SDK object, got {type(value).__name__}"
        )
    return dict(data)


def _anthropic_message(value: Any) -> dict[str, Any]:
    data = _mapping(value, "a stored Anthropic message")
    role, content = data.get("role"), data.get("content")
    if role not in ("user", "assistant") or not isinstance(content, str | list | tuple):
        raise InvalidTurnError(
            "a stored Anthropic message needs role 'user' or 'assistant' and content, "
            f"got role {role!r}"
        )
    # Only what a request may carry: a dumped Message also has id, model, usage...
    return {
        "role": role,
        "content": content if isinstance(content, str) else [_dump(b) for b in content],
    }


def _kind(block: Any) -> Any:
    return block.get("type") if isinstance(block, Mapping) else None


def _tool_uses(message: Mapping[str, Any]) -> list[tuple[str, str]]:
    content = message["content"]
    blocks = content if isinstance(content, list) else []
    return [(b["id"], b.get("name", "")) for b in blocks if _kind(b) == "tool_use"]


def _non_results(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [block for block in content if _kind(block) != "tool_result"]


_CHAT_ASSISTANT_KEYS = ("role", "content", "name", "refusal", "tool_calls")


def _chat_message(value: Any) -> dict[str, Any]:
    is_sdk = callable(getattr(value, "model_dump", None))
    data = _mapping(value, "a stored OpenAI message")
    if is_sdk:  # a ChatCompletionMessage: keep what a request may carry
        data = {key: data[key] for key in _CHAT_ASSISTANT_KEYS if key in data}
        data.setdefault("content", None)
    if not isinstance(data.get("role"), str):
        raise InvalidTurnError("a stored OpenAI message needs a role")
    return data


def _plain_item(value: Any) -> dict[str, Any]:
    return _mapping(value, "a Responses input item")
