"""Content blocks as a content string, and JSON cut to size: properties over any input."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from hypothesis import given
from hypothesis import strategies as st

from fanout import Document, Image, Text
from fanout._canonical import truncation_marker
from fanout._output import cut_json, defuse, encode_parts, parts_in, parts_of, text_of

if TYPE_CHECKING:
    from collections.abc import Iterator

texts = st.builds(Text, st.text(max_size=50))
HEADS = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff\xe0"}
images = st.builds(
    lambda kind, tail: Image(HEADS[kind] + tail, kind),
    st.sampled_from(sorted(HEADS)), st.binary(max_size=30),
)  # fmt: skip
parts = st.lists(st.one_of(texts, images), min_size=1, max_size=5)


def _shown(blocks: list[Text | Image]) -> list[Text | Image]:
    """The blocks a model is sent: a text block of white space alone is left out (Anthropic
    refuses one, and the history with it)."""
    return [block for block in blocks if not isinstance(block, Text) or block.text.strip()]


@given(parts)
def test_blocks_within_the_limit_come_back_as_they_were(blocks: list[Text | Image]) -> None:
    """Whole, in order, but for text blocks of white space alone; none at all is no
    blocks, an empty answer."""
    encoded = encode_parts(blocks, limit=10_000)
    assert (parts_of(encoded) or []) == _shown(blocks)
    assert encoded or not _shown(blocks)


@given(parts, st.integers(min_value=0, max_value=80))
def test_text_is_cut_to_the_limit_and_no_other_block_is_lost(
    blocks: list[Text | Image], limit: int
) -> None:
    decoded = parts_of(encode_parts(blocks, limit=limit)) or []
    images_in = [block for block in blocks if isinstance(block, Image)]
    assert [block for block in decoded if isinstance(block, Image)] == images_in
    total = sum(len(block.text) for block in _shown(blocks) if isinstance(block, Text))
    shown = sum(len(block.text) for block in decoded if isinstance(block, Text))
    if total <= limit:
        assert decoded == _shown(blocks)
    else:  # cut, the marker saying so counted in (unless the marker alone is longer)
        assert shown <= max(limit, len(truncation_marker(total)))


@given(st.text())
def test_a_tools_own_text_is_never_read_as_blocks(text: str) -> None:
    assert parts_of(defuse(text)) is None


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=30,
    ),
    st.integers(min_value=60, max_value=400),
)
def test_cut_json_is_always_json_within_the_limit(value: object, limit: int) -> None:
    text = json.dumps(value)
    cut = cut_json(text, limit)
    assert len(cut) <= limit
    json.loads(cut)
    if len(text) <= limit:
        assert cut == text


def test_what_is_and_is_not_blocks() -> None:
    image = Image(HEADS["image/png"], media_type="image/png")
    assert parts_in(Text("a")) == [Text("a")]
    assert parts_in((Text("a"), image)) == [Text("a"), image]
    assert parts_in([]) is None
    assert parts_in([Text("a"), "b"]) is None
    assert parts_in("a") is None


class _ReadOnce(list[Text]):
    """Parts the first time it is read; raises the next."""

    reads = 0

    def __iter__(self) -> Iterator[Text]:
        self.reads += 1
        if self.reads > 1:
            raise RuntimeError("read twice")
        return super().__iter__()


class _Unreadable(tuple[Text, ...]):
    def __iter__(self) -> Iterator[Text]:
        raise RuntimeError("gone")


def test_blocks_are_read_once_and_a_list_that_raises_as_it_is_read_is_not_blocks() -> None:
    once = _ReadOnce([Text("a")])
    parts = parts_in(once)
    assert parts == [Text("a")]
    assert parts_of(encode_parts(parts, limit=100)) == [Text("a")]
    assert parts_in(_Unreadable((Text("a"),))) is None


def test_a_block_in_a_text_only_format_is_named_not_sent() -> None:
    assert text_of(Text("hi")) == "hi"
    assert text_of(Document(b"abcd", media_type="application/pdf")).startswith(
        "[document application/pdf, about"
    )
