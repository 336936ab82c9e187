"""Streams from servers in every dialect: every call decoded, none merged, none split.

OpenAI numbers each streamed call by ``index`` and sends its ``id`` once;
other servers speaking the same format send every call at index 0, or with
no index, or repeat the id in every piece, or send an empty id in every
piece after the first (the SDK's accumulator joins the ids). Each call still
needs its own answer, so the decoder must hand each one back, whole and
alone. An Anthropic ``tool_use`` block may carry its whole input in its
start, with no deltas after.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fanout
import fanout._streams

calls_strategy = st.lists(
    st.tuples(
        st.sampled_from(["lookup", "save"]),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(-99, 99), max_size=3),
    ),
    min_size=1,
    max_size=5,
)


def chunks(
    calls: list[tuple[str, str, dict[str, Any]]], indexing: str, ids: str, size: int, bundled: bool
) -> list[dict[str, Any]]:
    """The chunks a server in the given dialect streams for ``calls``."""
    items: list[list[dict[str, Any]]] = []
    for position, (call_id, name, arguments) in enumerate(calls):
        text = json.dumps(arguments)
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        call_items = []
        for k, piece in enumerate(pieces):
            item: dict[str, Any] = {"function": {"arguments": piece}}
            if indexing != "absent":
                item["index"] = position if indexing == "sequential" else 0
            if k == 0 or ids == "every":
                item["id"] = call_id
            elif ids == "empty":
                item["id"] = ""
            if k == 0:
                item.update(type="function")
                item["function"]["name"] = name
            call_items.append(item)
        items.append(call_items)
    if bundled:  # each call whole in one chunk's list, as some servers send them
        deltas = [[piece for call in items for piece in call]]
    else:
        deltas = [[piece] for call in items for piece in call]
    stream = [{"choices": [{"index": 0, "delta": {"tool_calls": d}}]} for d in deltas]
    return [*stream, {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]


@given(
    spec=calls_strategy,
    indexing=st.sampled_from(["sequential", "zero", "absent"]),
    ids=st.sampled_from(["first", "every", "empty"]),
    size=st.integers(1, 8),
    bundled=st.booleans(),
)
def test_every_streamed_chat_call_comes_back_whole_and_alone(
    spec: list[tuple[str, dict[str, Any]]], indexing: str, ids: str, size: int, bundled: bool
) -> None:
    """Any indexing dialect, ids once, in every piece or empty after the first, calls
    bundled or not: the decoded
    calls are exactly the message's calls, in order, none merged, none left unfinished."""
    calls = [(f"call_{i}", name, arguments) for i, (name, arguments) in enumerate(spec)]
    decoder = fanout.ChatCompletionsStream()
    decoded = [
        call
        for chunk in chunks(calls, indexing, ids, size, bundled)
        for call in decoder.feed(chunk)
    ]
    assert [(c.id, c.name, c.arguments) for c in decoded] == calls
    assert decoder.unfinished() == []


def test_a_chat_call_that_begins_with_an_empty_id_takes_the_first_it_is_given() -> None:
    """The SDK's accumulator joins a call's ids: ``""`` then ``"call_1"`` is ``call_1``."""
    pieces = [{"index": 0, "id": "", "function": {"name": "lookup", "arguments": '{"a"'}}]
    pieces += [{"index": 0, "id": "call_1", "function": {"arguments": ": 1}"}}]
    stream = [{"choices": [{"index": 0, "delta": {"tool_calls": [p]}}]} for p in pieces]
    stream += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]
    decoder = fanout.ChatCompletionsStream()
    decoded = [call for chunk in stream for call in decoder.feed(chunk)]
    assert [(c.id, c.name, c.arguments) for c in decoded] == [("call_1", "lookup", {"a": 1})]


def _anthropic_block(start_input: dict[str, Any], deltas: list[str]) -> list[dict[str, Any]]:
    block = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": start_input}
    events: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": 0, "content_block": block}
    ]
    for piece in deltas:
        delta = {"type": "input_json_delta", "partial_json": piece}
        events.append({"type": "content_block_delta", "index": 0, "delta": delta})
    return [*events, {"type": "content_block_stop", "index": 0}]


@given(start=st.dictionaries(st.sampled_from(["a", "b"]), st.integers(-9, 9), max_size=2),
       streamed=st.none() | st.dictionaries(st.sampled_from(["c", "d"]), st.integers(), max_size=2),
       size=st.integers(1, 6))  # fmt: skip
def test_an_anthropic_call_s_input_is_its_start_s_unless_deltas_follow(
    start: dict[str, Any], streamed: dict[str, Any] | None, size: int
) -> None:
    """As the SDK accumulates a block: the input in ``content_block_start`` is the call's,
    and ``input_json_delta`` pieces, where any come, replace it. (Read from the deltas
    alone, a start that carried the input whole ran the call with no arguments.)"""
    text = "" if streamed is None else json.dumps(streamed)
    deltas = [text[i : i + size] for i in range(0, len(text), size)]
    decoder = fanout.AnthropicStream()
    decoded = [c for event in _anthropic_block(start, deltas) for c in decoder.feed(event)]
    assert [(c.id, c.arguments) for c in decoded] == [
        ("toolu_1", start if streamed is None else streamed)
    ]


class _SameByIdentity(str):
    """A proxy id compared by identity, as some lazy strings are."""

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__


class _Unhashable(str):
    def __hash__(self) -> int:
        raise TypeError("no hash for you")


@pytest.mark.parametrize("kind", [_SameByIdentity, _Unhashable])
def test_a_streamed_id_that_is_a_str_subclass_is_read_as_its_text(kind: type[str]) -> None:
    """As `run_turn` reads a call's id: a ``str`` subclass is its plain text, whose own
    ``__eq__`` and ``__hash__`` never run (one compared by identity was answered twice;
    one whose hash raised lost the calls after it)."""
    decoder = fanout.AnthropicStream()
    events = []
    for index, call_id in enumerate([kind("toolu_1"), kind("toolu_2")]):
        block = {"type": "tool_use", "id": call_id, "name": "lookup", "input": {"n": index}}
        events += [
            {"type": "content_block_start", "index": index, "content_block": block},
            {"type": "content_block_stop", "index": index},
        ]
    decoded = [call for event in events for call in decoder.feed(event)]
    assert [(type(c.id), c.id) for c in decoded] == [(str, "toolu_1"), (str, "toolu_2")]


@given(
    spec=calls_strategy,
    size=st.integers(1, 8),
    order=st.randoms(use_true_random=False),
)
def test_interleaved_chat_deltas_hand_each_call_back_only_whole(
    spec: list[tuple[str, dict[str, Any]]], size: int, order: Any
) -> None:
    """A server that interleaves the pieces of several calls (each call's in its own
    order, by index; calls begin in index order): every call comes back with all its
    arguments, in the order the calls began, and none before its last piece came."""
    calls = [(f"call_{i}", name, arguments) for i, (name, arguments) in enumerate(spec)]
    per_call = [chunk_deltas(chunks([call], "sequential", "first", size, False)) for call in calls]
    for position, deltas in enumerate(per_call):
        for delta in deltas:
            delta[0]["index"] = position
    queues = [list(deltas) for deltas in per_call]
    stream, last_piece_at = [], {}
    while any(queues):
        # Any call's next piece, but calls begin in the order of their indexes.
        begun = [i for i, q in enumerate(queues) if len(q) < len(per_call[i])]
        ready = [i for i, q in enumerate(queues) if q and i <= len(begun)]
        position = order.choice(ready)
        stream.append({"choices": [{"index": 0, "delta": {"tool_calls": queues[position].pop(0)}}]})
        if not queues[position]:
            last_piece_at[f"call_{position}"] = len(stream) - 1
    stream.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    decoder = fanout.ChatCompletionsStream()
    decoded = []
    for at, chunk in enumerate(stream):
        for call in decoder.feed(chunk):
            assert at >= last_piece_at[call.id], f"{call.id} handed back before its last piece"
            decoded.append(call)
    assert [(c.id, c.name, c.arguments) for c in decoded] == calls
    assert decoder.unfinished() == []


@given(spec=calls_strategy, size=st.integers(1, 8))
def test_a_chat_call_comes_back_the_moment_the_next_one_begins(
    spec: list[tuple[str, dict[str, Any]]], size: int
) -> None:
    """Calls streamed one after another, as OpenAI sends them: each is handed back with
    the first piece of the next, not later (the last with the choice's end)."""
    calls = [(f"call_{i}", name, arguments) for i, (name, arguments) in enumerate(spec)]
    stream = chunks(calls, "sequential", "first", size, False)
    firsts = [i for i, chunk in enumerate(stream[:-1]) if "id" in chunk_deltas([chunk])[0][0]]
    decoder = fanout.ChatCompletionsStream()
    handed = {call.id: at for at, chunk in enumerate(stream) for call in decoder.feed(chunk)}
    assert [handed[call_id] for call_id, _, _ in calls] == [*firsts[1:], len(stream) - 1]


def chunk_deltas(stream: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each chunk's ``tool_calls`` deltas (none for the last, which only finishes)."""
    return [c["choices"][0]["delta"]["tool_calls"] for c in stream if c["choices"][0]["delta"]]


def _chat(*deltas: dict[str, Any]) -> list[dict[str, Any]]:
    stream = [{"choices": [{"index": 0, "delta": {"tool_calls": [d]}}]} for d in deltas]
    return [*stream, {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]


def test_a_chat_call_s_name_in_pieces_is_joined_and_a_repeated_one_is_not() -> None:
    """A server that streams a function's name in pieces (``get_`` then ``weather``): the
    SDK joins them, and fanout ran ``get_``, an unknown tool. One that repeats every field
    in every piece has the name whole each time: it is not doubled."""
    pieces = _chat(
        {"index": 0, "id": "call_1", "function": {"name": "get_", "arguments": ""}},
        {"index": 0, "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
    )
    repeated = _chat(
        {"index": 0, "id": "call_1", "function": {"name": "weather", "arguments": '{"city"'}},
        {"index": 0, "id": "call_1", "function": {"name": "weather", "arguments": ': "Oslo"}'}},
    )
    for stream, name in ((pieces, "get_weather"), (repeated, "weather")):
        decoder = fanout.ChatCompletionsStream()
        decoded = [call for chunk in stream for call in decoder.feed(chunk)]
        assert [(c.id, c.name, c.arguments) for c in decoded] == [
            ("call_1", name, {"city": "Oslo"})
        ]


def test_a_responses_custom_tool_call_spoils_the_stream_as_it_spoils_the_message() -> None:
    """`calls_from_responses` refuses a message with a ``custom_tool_call``; streamed, it
    was skipped, the write beside it ran, and no answer to the response could be built."""
    item = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_c", "name": "n",
            "input": "x"}  # fmt: skip
    decoder = fanout.ResponsesStream()
    with pytest.raises(fanout.InvalidTurnError, match="custom tools are not supported"):
        decoder.feed({"type": "response.output_item.added", "output_index": 0, "item": item})


def test_interleaved_pieces_are_read_once(monkeypatch: Any) -> None:
    """Two calls opened, then 2,000 pieces of the first's arguments beside the second's:
    the first's whole text was joined (and checked) again at every chunk, and 64,000
    pieces took seconds of the event loop. Each piece is read once now, and the text
    parsed when its outermost brace closes."""
    parsed: list[str] = []
    read: list[str] = []
    decode, feed = fanout._streams.decode_arguments, fanout._streams._Closing.feed

    def counted(value: Any) -> Any:
        parsed.append(value)
        return decode(value)

    def reading(self: Any, piece: str) -> None:
        read.append(piece)
        feed(self, piece)

    monkeypatch.setattr(fanout._streams, "decode_arguments", counted)
    monkeypatch.setattr(fanout._streams._Closing, "feed", reading)
    text = json.dumps({"text": "}" * 2000})
    deltas = [
        {"index": 0, "id": "call_A", "function": {"name": "note", "arguments": ""}},
        {"index": 1, "id": "call_B", "function": {"name": "note", "arguments": "{}"}},
        *({"index": 0, "function": {"arguments": piece}} for piece in text),
    ]
    decoder = fanout.ChatCompletionsStream()
    decoded = [call for chunk in _chat(*deltas) for call in decoder.feed(chunk)]
    assert [c.id for c in decoded] == ["call_A", "call_B"]
    assert decoded[0].arguments == {"text": "}" * 2000}
    assert len(read) == len(text) + 1  # and the empty piece the call began with
    assert len(parsed) <= 4


def test_a_chat_call_whose_first_piece_has_no_id_keeps_its_name_and_arguments() -> None:
    """A first piece with no ``id`` (absent, or null) and the id in the next: the call lost
    its name and the start of its arguments, answered "no tool named '<no tool name>'"."""
    for missing in ({}, {"id": None}):
        stream = _chat(
            {"index": 0, **missing, "function": {"name": "quick", "arguments": '{"n"'}},
            {"index": 0, "id": "call_1", "function": {"arguments": ": 1}"}},
        )
        decoder = fanout.ChatCompletionsStream()
        decoded = [call for chunk in stream for call in decoder.feed(chunk)]
        assert [(c.id, c.name, c.arguments) for c in decoded] == [("call_1", "quick", {"n": 1})]
