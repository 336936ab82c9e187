"""The edges: SDK messages in, SDK request params out.

Anthropic: an assistant ``Message`` (or its dict) carries ``tool_use``
blocks; the answer is ONE user message of ``tool_result`` blocks, in the
model's order. Splitting results across messages teaches a model to stop
batching. OpenAI Chat Completions: an assistant message carries
``tool_calls`` whose arguments are a JSON *string*; the answer is one
``role: "tool"`` message per call, in order.

What comes in is read defensively (``_reading``): a message that cannot be
answered raises ``InvalidTurnError``; one bad call is still a call. What
goes out is typed as the SDKs' own param TypedDicts (imported for type
checking only), so ``messages.append(...)`` type-checks without a cast.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, cast

import attrs

from ._answers import failure
from ._exceptions import InvalidTurnError
from ._output import Document, Part, Text, render, text_of
from ._reading import (
    NO_NAME,
    arguments_from,
    decode_arguments,
    items_of,
    mapping_of,
    plain,
    refuse_other_shapes,
    refusing_malformed,
    shown,
    tool_name,
)
from ._values import Kind, Status, ToolCall, ToolResult

if TYPE_CHECKING:
    from anthropic.types import (
        Base64ImageSourceParam,
        DocumentBlockParam,
        ImageBlockParam,
        TextBlockParam,
        ToolResultBlockParam,
        UserMessageParam,
    )
    from openai.types.chat import (
        ChatCompletionContentPartTextParam,
        ChatCompletionToolMessageParam,
    )

    AnthropicPart = TextBlockParam | ImageBlockParam | DocumentBlockParam
    ImageMediaType = Literal["image/jpeg", "image/png", "image/gif", "image/webp"]

__all__ = [
    "anthropic_tool_results",
    "call_id_of",
    "calls_from_anthropic",
    "calls_from_openai",
    "openai_tool_messages",
    "results_of",
]

_ANTHROPIC = "an Anthropic assistant message (a Message, its to_param() or a dict)"
_OPENAI = "an OpenAI assistant message (completion.choices[0].message, or its dict)"


@refusing_malformed("an Anthropic message")
def calls_from_anthropic(message: Any) -> list[ToolCall]:
    """The ``tool_use`` blocks of an Anthropic assistant message, as calls, in order."""
    data = mapping_of(message, "an Anthropic message", _ANTHROPIC)
    refuse_other_shapes(data, own="anthropic", given=message)
    _assistant(data, message, _ANTHROPIC)
    if "content" not in data:
        raise InvalidTurnError(f"not an Anthropic message: it has no content; pass {_ANTHROPIC}")
    content = data["content"]
    if isinstance(content, str):
        return []
    calls: list[ToolCall] = []
    last = None
    for block in items_of(content, "an Anthropic message's content"):
        last = block
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidTurnError(
                f"an Anthropic content block must be a mapping with a type, got {shown(block)}"
            )
        if block["type"] != "tool_use":
            continue  # text, thinking, server tools: nothing for fanout to run
        call_id = call_id_of(block.get("id"), "tool_use block")
        name = tool_name(block.get("name"))
        calls.append(ToolCall(call_id, name, arguments_from(block.get("input")), len(calls)))
    if calls and data.get("stop_reason") == "max_tokens" and last and last["type"] == "tool_use":
        # Cut off inside its last block: the SDK parses such input leniently ({"seats": 12}
        # of {"seats": 120}), and a write ran with it. Streamed, its pieces are no JSON
        # object and it is answered error; so it is here, unrun.
        calls[-1] = attrs.evolve(calls[-1], arguments=_CUT_OFF)
    return calls


# The arguments of a call the message was cut off in: not a JSON object, so not run.
_CUT_OFF = "(cut off by max_tokens before the call's arguments were complete)"


def anthropic_tool_results(results: Any, message: Any = None) -> UserMessageParam:
    """The one user message that answers every ``tool_use`` block.

    ``message``: the assistant message the results answer, where a streamed
    turn may not have read all of it (`answering`).
    """
    calls = None if message is None else calls_from_anthropic(message)
    blocks: list[ToolResultBlockParam] = [
        {
            "type": "tool_result",
            "tool_use_id": result.tool_use_id,
            "content": render(result.content, _anthropic_block),
            "is_error": result.is_error,
        }
        for result in answering(results, calls)
    ]
    return {"role": "user", "content": blocks}


def _anthropic_block(part: Part) -> AnthropicPart:
    if isinstance(part, Text):
        return {"type": "text", "text": part.text}
    if isinstance(part, Document):
        return _anthropic_document(part)
    # Image validated media_type against the four types Anthropic accepts.
    media_type = cast("ImageMediaType", part.media_type)
    source: Base64ImageSourceParam = {"type": "base64", "media_type": media_type, "data": part.data}
    return {"type": "image", "source": source}


def _anthropic_document(part: Document) -> DocumentBlockParam:
    block: DocumentBlockParam
    if part.media_type == "text/plain":
        block = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": part.data},
        }
    else:
        block = {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": part.data},
        }
    if part.title is not None:
        block["title"] = part.title
    return block


@refusing_malformed("a Chat Completions message")
def calls_from_openai(message: Any) -> list[ToolCall]:
    """The ``tool_calls`` of an OpenAI assistant message, as calls, in order.

    Arguments that are not a JSON object (or nest too deep to read) are kept
    as their raw text; that call is then answered ``error`` while its
    siblings run.
    """
    data = mapping_of(message, "an OpenAI message", _OPENAI)
    refuse_other_shapes(data, own="chat", given=message)
    _assistant(data, message, _OPENAI)
    calls: list[ToolCall] = []
    for item in items_of(data.get("tool_calls"), "an OpenAI message's tool_calls"):
        if not isinstance(item, dict):
            raise InvalidTurnError(f"a tool call must be a mapping, got {shown(item)}")
        call_id = call_id_of(item.get("id"), "tool call")
        kind = item.get("type", "function")
        body = plain(item.get(kind)) if isinstance(kind, str) else None
        if not isinstance(body, dict):
            name, arguments = NO_NAME, decode_arguments(body)
        elif kind == "custom":
            # Custom tools take free text; it reaches the tool as {"input": text}.
            text = body.get("input")
            name = tool_name(body.get("name"))
            arguments = {"input": text} if isinstance(text, str) else arguments_from(text)
        else:
            name = tool_name(body.get("name"))
            arguments = decode_arguments(body.get("arguments"))
        calls.append(ToolCall(call_id, name, arguments, len(calls)))
    return calls


def openai_tool_messages(results: Any, message: Any = None) -> list[ChatCompletionToolMessageParam]:
    """One ``role: "tool"`` message per call, in the model's order (``message``: the
    assistant message they answer, where a streamed turn may not have read all of it)."""
    calls = None if message is None else calls_from_openai(message)
    return [
        {
            "role": "tool",
            "tool_call_id": result.tool_use_id,
            "content": render(result.content, _chat_part),
        }
        for result in answering(results, calls)
    ]


def _chat_part(part: Part) -> ChatCompletionContentPartTextParam:
    """Tool messages carry text only: an image or a document is named, not sent."""
    return {"type": "text", "text": text_of(part)}


def call_id_of(value: Any, what: str) -> str:
    """A call's id: without one, no answer can name the call, so the message is refused."""
    if not isinstance(value, str) or not value:
        raise InvalidTurnError(f"a {what} needs a non-empty string id, got {shown(value)}")
    return value


def answering(results: Any, calls: list[ToolCall] | None) -> list[ToolResult]:
    """The turn's results; given the calls of the message they answer, one per call, in
    the message's order.

    A streamed turn stops reading the stream when its deadline passes, or when
    a call fails under ``on_failure="cancel_siblings"``; the model may have
    written calls after that, which the SDK's final message holds, and the
    API refuses a next request that leaves one unanswered. Each such call is
    answered ``cancelled``, never run. (Results for calls the message does
    not hold follow, as they are.)

    A server that repeats a call's id in every piece (as some OpenAI-compatible
    ones do) has the SDK join them: the message says ``call_1call_1call_1``
    where the stream said ``call_1``. That call is ``call_1``'s, answered under
    the message's id; it was answered "cancelled, not run", and ``call_1``'s own
    answer, for an id the message does not hold, was refused by the API.
    """
    listed = results_of(results)
    if calls is None:
        return listed
    by_id = {result.tool_use_id: result for result in listed}
    answered = []
    for call in calls:
        own = by_id.pop(call.id, None) or _repeated(call.id, by_id)
        answered.append(_never_read(call) if own is None else own)
    return answered + [result for result in listed if result.tool_use_id in by_id]


def _repeated(call_id: str, by_id: dict[str, ToolResult]) -> ToolResult | None:
    """The result whose id ``call_id`` is two or more copies of, taken out of ``by_id``,
    under ``call_id``; None if there is none."""
    for result_id in by_id:
        copies, rest = divmod(len(call_id), len(result_id) or len(call_id) + 1)
        if copies >= 2 and not rest and result_id * copies == call_id:
            return attrs.evolve(by_id.pop(result_id), tool_use_id=call_id)
    return None


def _never_read(call: ToolCall) -> ToolResult:
    return failure(
        call, Status.CANCELLED,
        "the turn had stopped reading the message (its deadline passed, or a call failed "
        "under cancel_siblings) before this call was complete; it was not run",
        started=False, kind=Kind.READS,
    )  # fmt: skip


def results_of(results: Any) -> list[ToolResult]:
    """Accept a ``Turn`` or any iterable of results."""
    found = getattr(results, "results", results)
    if not isinstance(found, Iterable) or isinstance(found, str | bytes):
        raise InvalidTurnError(f"expected a Turn or its results, got {type(results).__name__}")
    listed = list(found)
    for result in listed:
        if not isinstance(result, ToolResult):
            raise InvalidTurnError(
                f"expected a Turn or its results, got an item of type {type(result).__name__}"
            )
    return listed


def _assistant(data: Any, given: Any, expected: str) -> None:
    # A role of None is none said: the SDK's accumulated stream has one where no chunk
    # carried a role, and it is still the assistant's message.
    role = data.get("role") or "assistant"
    if role != "assistant":
        raise InvalidTurnError(
            f"got a message with role {shown(role)} (a {type(given).__name__}); pass {expected}"
        )
