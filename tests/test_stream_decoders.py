"""Chat Completions streams from OpenAI-compatible servers: every call decoded, none merged.

OpenAI numbers each streamed call by ``index`` and sends its ``id`` once;
other servers speaking the same format send every call at index 0, or with
no index, or repeat the id in every piece. Each call still needs its own
answer, so the decoder must hand each one back, whole and alone.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import fanout

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
    ids=st.sampled_from(["first", "every"]),
    size=st.integers(1, 8),
    bundled=st.booleans(),
)
def test_every_streamed_chat_call_comes_back_whole_and_alone(
    spec: list[tuple[str, dict[str, Any]]], indexing: str, ids: str, size: int, bundled: bool
) -> None:
    """Any indexing dialect, ids once or in every piece, calls bundled or not: the decoded
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
