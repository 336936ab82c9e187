"""Streamed messages: tool calls read from the SDKs' stream events as they complete.

A model that emits eight tool calls streams them over seconds. Each decoder
here reads one SDK's events (SDK objects or their dicts) and hands back each
call the moment its block is complete, with its place in the model's order
(interleaved blocks end in another order than they began), so a streaming
turn can start it while the rest of the message is still being written:

* ``AnthropicStream``: Messages streaming, a ``tool_use`` block from its
  ``content_block_start`` through its ``input_json_delta`` pieces to its
  ``content_block_stop`` (the SDK's ``messages.stream()`` helper events work
  too: they carry the raw ones);
* ``ChatCompletionsStream``: Chat Completions chunks, ``tool_calls`` deltas
  gathered by index; a call is complete when a later one has begun and its
  arguments are a whole JSON object, or when the choice finishes;
* ``ResponsesStream``: Responses events, a ``function_call`` item from
  ``response.output_item.added`` to ``response.output_item.done``.

Whatever the stream holds, a decoder never raises but for what `run_turn`
refuses of the finished message (a Responses ``custom_tool_call``): events
it does not know are skipped, a call whose arguments are not valid JSON is
handed back with its text (the turn answers it ``error``), and
``unfinished()`` names the calls that had begun but never completed (the
turn answers those too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from ._canonical import safe_text
from ._exceptions import InvalidTurnError
from ._reading import decode_arguments, plain, tool_name
from ._responses import CUSTOM_CALLS_REFUSED
from ._values import ToolCall

__all__ = [
    "AnthropicStream",
    "ChatCompletionsStream",
    "ResponsesStream",
    "StreamDecoder",
    "Unfinished",
]


@attrs.frozen
class Unfinished:
    """A call whose block began but never completed: its id, name and the text that came."""

    id: str
    name: str
    received: str
    position: int = 0  # how many calls of the message began before it


class StreamDecoder(Protocol):
    """Reads one SDK's stream events into tool calls as their blocks complete."""

    def feed(self, event: Any) -> list[ToolCall]:
        """The calls this event completed (usually none or one), each at its ``position``:
        how many calls of the message began before it. Calls may end in another order
        than they began; the turn answers them in the order they began."""
        ...

    def unfinished(self) -> list[Unfinished]:
        """The calls begun and not completed so far, in the model's order."""
        ...


def _field(value: Any, name: str) -> Any:
    """``value[name]`` or ``value.name``, whichever the event is; None when absent. Text is
    plain text: a ``str`` subclass (a proxy, a lazy string) is read as the text it holds,
    as `run_turn` reads a call's id, so its own ``__hash__`` and ``__eq__`` never run (an
    id compared by identity was answered twice, one whose hash raised lost the calls)."""
    data = plain(value)
    found = data.get(name) if isinstance(data, Mapping) else getattr(data, name, None)
    return str.__str__(found) if isinstance(found, str) and type(found) is not str else found


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@attrs.define
class _Pending:
    """A call being streamed: what is known of it so far."""

    id: str
    name: str
    position: int  # how many calls began before it: its place in the model's order
    pieces: list[str] = attrs.field(factory=list)
    done: bool = False
    # Arguments the call began with, whole (an Anthropic ``content_block_start``'s
    # ``input``): its arguments unless pieces follow.
    began_with: Mapping[str, Any] | None = None

    def call(self, arguments: Any = None) -> ToolCall:
        if arguments is None and not self.pieces and self.began_with is not None:
            arguments = self.began_with
        raw = arguments if arguments is not None else "".join(self.pieces)
        return ToolCall(self.id, tool_name(self.name), decode_arguments(raw), self.position)

    def unfinished(self) -> Unfinished:
        return Unfinished(self.id, self.name, "".join(self.pieces), self.position)


def _key(value: Any) -> Any:
    """A block's index or item id as a dict key: an unhashable one (``"index": [0]``,
    which the SDKs pass through) by its text, so that no event can raise here."""
    try:
        hash(value)
    except Exception:
        return ("unhashable", safe_text(value))
    return value


@attrs.define
class _Calls:
    """Calls in the order they began, each completed at most once.

    A key (a block's index, an item's id) names the call that began under it
    last: a server that reuses one for a second call (two ``tool_use`` blocks
    at index 0, two items with one id) begins a call of its own, and the first,
    unless completed, is unfinished. Kept under the key alone, the second call
    was dropped, and the next request had a call with no answer.
    """

    _order: list[_Pending] = attrs.field(factory=list)
    _by_key: dict[Any, _Pending] = attrs.field(factory=dict)

    def begin(self, key: Any, call_id: Any, name: Any, arguments: Any = None) -> None:
        if not isinstance(call_id, str):
            return
        key = _key(key)
        current = self._by_key.get(key)
        if current is not None and current.id == call_id:
            return  # told again (a Responses item as it is done)
        began_with = arguments if isinstance(arguments, Mapping) and arguments else None
        pending = _Pending(call_id, _text(name), len(self._order), began_with=began_with)
        self._by_key[key] = pending
        self._order.append(pending)

    def streaming(self, key: Any) -> _Pending | None:
        return self._by_key.get(_key(key))

    def add(self, key: Any, piece: Any) -> None:
        pending = self.streaming(key)
        if pending is not None and not pending.done and isinstance(piece, str):
            pending.pieces.append(piece)

    def complete(self, key: Any, arguments: Any = None) -> list[ToolCall]:
        pending = self.streaming(key)
        if pending is None or pending.done:
            return []
        pending.done = True
        return [pending.call(arguments)]

    def unfinished(self) -> list[Unfinished]:
        return [p.unfinished() for p in self._order if not p.done]


@attrs.define
class AnthropicStream:
    """Anthropic Messages stream events in, ``tool_use`` calls out as each block stops."""

    _calls: _Calls = attrs.field(factory=_Calls, init=False)

    def feed(self, event: Any) -> list[ToolCall]:
        kind, index = _field(event, "type"), _field(event, "index")
        if kind == "content_block_start":
            block = _field(event, "content_block")
            if _field(block, "type") == "tool_use":
                # Its input may come whole here, with no deltas after (as the SDK's own
                # accumulator reads it, the deltas replace it where there are any).
                self._calls.begin(
                    index, _field(block, "id"), _field(block, "name"), _field(block, "input")
                )
        elif kind == "content_block_delta":
            delta = _field(event, "delta")
            if _field(delta, "type") == "input_json_delta":
                self._calls.add(index, _field(delta, "partial_json"))
        elif kind == "content_block_stop":
            # The SDK's helper stream attaches the finished block, its input parsed; but
            # parsed leniently: a block cut off by max_tokens ({"n": 12 of {"n": 120})
            # reads as whole. The pieces received are the truth where there are any.
            block = _field(event, "content_block")
            whole = _field(block, "input") if _field(block, "type") == "tool_use" else None
            streaming = self._calls.streaming(index)
            if streaming is not None and streaming.pieces:
                whole = None
            return self._calls.complete(index, whole if isinstance(whole, Mapping) else None)
        return []

    def unfinished(self) -> list[Unfinished]:
        return self._calls.unfinished()


@attrs.define
class ChatCompletionsStream:
    """Chat Completions chunks in; a call out once a later one has begun (or the choice
    ended) and its own arguments are whole.

    Deltas are gathered by index, as the SDK gathers them. A call begins
    with a new ``index``, or with a new ``id`` at an index already in use:
    some OpenAI-compatible servers send every call at index 0, or none, and
    each of those calls still needs its own answer. Chat Completions has no
    end-of-call event, so a call is complete when a later one has begun and
    its arguments parse as a JSON object (whose closing brace no piece can
    follow), or when the choice finishes. The second condition is for
    servers that interleave the deltas of several calls: taken complete as
    soon as the next began, a call ran with the arguments it had so far
    (two calls opened, then their arguments by index: both ran with ``{}``).
    Calls come out in the order they began, as reads start in the model's.
    """

    _calls: _Calls = attrs.field(factory=_Calls, init=False)
    # The key in ``_calls`` of the call streaming under each index, and the next key.
    _at_index: dict[Any, int] = attrs.field(factory=dict, init=False)
    _begun: int = attrs.field(default=0, init=False)
    _handed: int = attrs.field(default=0, init=False)  # calls handed out so far, in order
    # How far the arguments of each call checked for being whole were read (`_whole`).
    _closing: dict[int, _Closing] = attrs.field(factory=dict, init=False)

    def feed(self, event: Any) -> list[ToolCall]:
        if _field(event, "type") == "chunk":  # the SDK's stream() helper wraps chunks
            event = _field(event, "chunk")
        finished = False
        for choice in _field(event, "choices") or ():
            if _field(choice, "index") not in (0, None):
                continue  # n > 1: the first choice is the message fanout answers
            delta = _field(choice, "delta")
            for item in _field(delta, "tool_calls") or ():
                index, call_id = _key(_field(item, "index")), _field(item, "id")
                function = _field(item, "function")
                name = _field(function, "name")
                if self._begins_a_call(index, call_id):
                    self._at_index[index] = self._begun
                    # No id yet (none, or null) is an empty one: the first given is its.
                    # (Not begun, the call lost its name and the start of its arguments.)
                    given = call_id if isinstance(call_id, str) else ""
                    self._calls.begin(self._begun, given, name)
                    self._begun += 1
                else:
                    self._name_goes_on(self._at_index[index], name)
                self._calls.add(self._at_index[index], _field(function, "arguments"))
            finished |= _field(choice, "finish_reason") is not None
        return self._complete(every=finished)

    def _begins_a_call(self, index: Any, call_id: Any) -> bool:
        """Whether a ``tool_calls`` delta begins a call: a new index, or a new id at an
        index in use. An empty id is none: some servers send ``"id": ""`` on every
        chunk after a call's first, and the SDK's accumulator joins the ids, so it
        is the same call (read as a new one, the call ran with half its arguments,
        and a second call with no id was answered). A call that began with an empty
        id takes the first it is given, as the joined ids would."""
        if index not in self._at_index:
            return True
        streaming = self._calls.streaming(self._at_index[index])
        if not isinstance(call_id, str) or not call_id:
            return False
        if streaming is not None and not streaming.id:
            streaming.id = call_id
            return False
        return streaming is None or call_id != streaming.id

    def _name_goes_on(self, key: int, piece: Any) -> None:
        """A name in a later piece of a call: the rest of its name, as the SDK joins it
        (``get_`` then ``weather``: the call ran as ``get_``, unknown), unless it is the
        whole name again, which servers that repeat every field send (the SDK doubles
        it, and no tool is called that)."""
        pending = self._calls.streaming(key)
        if pending is not None and isinstance(piece, str) and piece and piece != pending.name:
            pending.name += piece

    def _complete(self, *, every: bool) -> list[ToolCall]:
        """The calls, in the order they began, that are complete now: all of them once the
        choice has finished (``every``)."""
        completed: list[ToolCall] = []
        while self._handed < self._begun:
            pending = self._calls.streaming(self._handed)
            followed = self._handed + 1 < self._begun
            if pending is not None and not every and not (followed and self._whole(pending)):
                break
            completed += self._calls.complete(self._handed)
            self._handed += 1
        return completed

    def _whole(self, pending: _Pending) -> bool:
        """Whether a call's arguments so far are a whole JSON object: its outermost brace
        closed (`_Closing`, each piece read once) and the text then parsed. (Joined and
        parsed again at every chunk while later calls streamed beside it, 64,000
        pieces of one call took seconds of the event loop.)"""
        closing = self._closing.get(id(pending))
        if closing is None:
            # Asked first as the next call begins, as OpenAI streams them: whole then.
            if isinstance(decode_arguments("".join(pending.pieces) or "-"), Mapping):
                return True
            closing = self._closing[id(pending)] = _Closing()
        for piece in pending.pieces[closing.read :]:
            closing.feed(piece)
        closing.read = len(pending.pieces)
        if not closing.closed or closing.spoilt:
            return False
        # Anything but white space after the closing brace is no JSON object, ever.
        closing.spoilt = not isinstance(decode_arguments("".join(pending.pieces)), Mapping)
        return not closing.spoilt

    def unfinished(self) -> list[Unfinished]:
        return self._calls.unfinished()


@attrs.define
class _Closing:
    """Whether JSON text read piece by piece has closed its outermost brace: braces
    counted outside strings, each character once."""

    read: int = 0  # pieces read so far
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    closed: bool = False
    spoilt: bool = False  # closed, and then no JSON object once parsed

    def feed(self, piece: str) -> None:
        for char in piece:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char == "{":
                self.depth += 1
            elif char == "}":
                self.depth -= 1
                self.closed = self.closed or self.depth == 0


@attrs.define
class ResponsesStream:
    """Responses stream events in; a ``function_call`` out when its item is done."""

    _calls: _Calls = attrs.field(factory=_Calls, init=False)

    def feed(self, event: Any) -> list[ToolCall]:
        kind = _field(event, "type")
        if kind == "response.output_item.added":
            item = _field(event, "item")
            if _field(item, "type") == "custom_tool_call":
                # Refused as `calls_from_responses` refuses the finished message: skipped,
                # the writes beside it ran, and no answer to the response could be built.
                raise InvalidTurnError(CUSTOM_CALLS_REFUSED)
            if _field(item, "type") == "function_call":
                key = _field(item, "id") or _field(event, "output_index")
                self._calls.begin(key, _field(item, "call_id"), _field(item, "name"))
        elif kind == "response.function_call_arguments.delta":
            self._calls.add(_field(event, "item_id"), _field(event, "delta"))
        elif kind == "response.output_item.done":
            item = _field(event, "item")
            if _field(item, "type") == "function_call":
                key = _field(item, "id") or _field(event, "output_index")
                self._calls.begin(key, _field(item, "call_id"), _field(item, "name"))
                return self._calls.complete(key, _field(item, "arguments"))
        return []

    def unfinished(self) -> list[Unfinished]:
        return self._calls.unfinished()
