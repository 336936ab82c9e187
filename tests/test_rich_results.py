"""Rich results: content blocks carried intact, and limits that never cut a block or a JSON."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

import pydantic
import pytest
from anthropic.types import MessageParam
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionToolMessageParam
from openai.types.responses import ResponseInputItemParam

import fanout
from fanout import Document, Image, Kind, Registry, Run, Runner, Status, Text, ToolCall
from fanout._answers import success
from fanout._output import MARKER, parts_of

if TYPE_CHECKING:
    from collections.abc import Callable

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 48  # a 12 kB "image"
PDF = b"%PDF-1.4 fanout test document"


def _runner(ran: list[str]) -> Runner:
    registry = Registry()

    @registry.tool(kind=Kind.READS, cache_ttl=60)
    async def screenshot(page: str) -> list[Any]:
        ran.append(page)
        return [Text(f"the {page} page"), Image(PNG, "image/png")]

    @registry.tool(kind=Kind.MUTATING, invalidates=())
    async def render_invoice(number: int) -> Document:
        ran.append(f"invoice {number}")
        return Document(PDF, title=f"invoice {number}")

    return Runner(registry, max_output_chars=100)


async def test_blocks_reach_each_vendor_as_its_own_blocks() -> None:
    """Text and a 12 kB image become Anthropic blocks and Responses items; Chat names the image."""
    turn = await _runner([]).run_turn([ToolCall("a", "screenshot", {"page": "home"})])
    anthropic_message = fanout.anthropic_tool_results(turn)
    pydantic.TypeAdapter(MessageParam).validate_python(anthropic_message)
    [block] = anthropic_message["content"]
    assert block["content"] == [  # type: ignore[index]
        {"type": "text", "text": "the home page"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(PNG).decode()}},
    ]  # fmt: skip
    [item] = fanout.responses_tool_outputs(turn)
    pydantic.TypeAdapter(ResponseInputItemParam).validate_python(item)
    assert item["output"][1] == {  # type: ignore[index]
        "type": "input_image",
        "image_url": "data:image/png;base64," + base64.b64encode(PNG).decode(),
    }
    [chat] = fanout.openai_tool_messages(turn)
    pydantic.TypeAdapter(ChatCompletionToolMessageParam).validate_python(chat)
    assert chat["content"][1]["text"].startswith("[image image/png, about 12")  # type: ignore[index]


async def test_documents_reach_each_vendor_as_documents() -> None:
    """A titled PDF and a plain-text document become Anthropic documents and Responses items."""
    registry = Registry()

    @registry.tool(kind=Kind.READS)
    async def attachments() -> list[Document]:
        return [Document(PDF, title="invoice 7"), Document("plain notes", "text/plain")]

    turn = await Runner(registry).run_turn([ToolCall("d", "attachments", {})])
    pdf = base64.b64encode(PDF).decode()
    anthropic_message = fanout.anthropic_tool_results(turn)
    pydantic.TypeAdapter(MessageParam).validate_python(anthropic_message)
    [block] = anthropic_message["content"]
    assert block["content"] == [  # type: ignore[index]
        {"type": "document", "title": "invoice 7",
         "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}},
        {"type": "document",
         "source": {"type": "text", "media_type": "text/plain", "data": "plain notes"}},
    ]  # fmt: skip
    [item] = fanout.responses_tool_outputs(turn)
    pydantic.TypeAdapter(ResponseInputItemParam).validate_python(item)
    assert item["output"] == [  # type: ignore[index]
        {"type": "input_file", "filename": "invoice 7",
         "file_data": f"data:application/pdf;base64,{pdf}"},
        {"type": "input_text", "text": "plain notes"},
    ]  # fmt: skip


async def test_blocks_survive_coalescing_cache_and_replay() -> None:
    """Single-flight followers, cache hits and idempotent replays carry the same blocks."""
    ran: list[str] = []
    runner, run = _runner(ran), Run()
    home, invoice = {"page": "home"}, {"number": 7}
    first = await runner.run_turn(
        [ToolCall("a", "screenshot", home), ToolCall("b", "screenshot", home),
         ToolCall("w", "render_invoice", invoice)],
        run=run,
    )  # fmt: skip
    second = await runner.run_turn(
        [ToolCall("c", "screenshot", home), ToolCall("x", "render_invoice", invoice)], run=run
    )
    assert ran == ["home", "invoice 7"]
    contents = [r.content for r in (*first.results, *second.results)]
    assert contents[0] == contents[1] == contents[3]
    assert contents[2] == contents[4]
    assert parts_of(contents[4]) == [Document(base64.b64encode(PDF).decode(), title="invoice 7")]
    assert all(r.status is Status.OK for r in (*first.results, *second.results))


# Hypothesis favours short text; repeated text makes long parts (and cuts) common.
_LONG_TEXT = st.builds(
    lambda text, times: text * times, st.text(min_size=1, max_size=9), st.integers(1, 80)
)
_PARTS = st.lists(
    st.one_of(
        (st.text(max_size=300) | _LONG_TEXT).map(Text),
        st.binary(max_size=64).map(lambda data: Image(b"RIFF\0\0\0\0WEBP" + data, "image/webp")),
        st.text(max_size=50).map(lambda text: Document(text, "text/plain")),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(parts=_PARTS, limit=st.integers(60, 600))
def test_the_limit_cuts_text_never_a_block(parts: list[Any], limit: int) -> None:
    """Over the limit, text parts are cut (visibly) and every image and document stays
    whole. A text part of white space alone is left out (Anthropic refuses one)."""
    result = success(ToolCall("a", "t"), parts, limit=limit)
    parts = [p for p in parts if not isinstance(p, Text) or p.text.strip()]
    decoded = parts_of(result.content) or []
    assert decoded or not parts
    assert [p for p in decoded if not isinstance(p, Text)] == [
        p for p in parts if not isinstance(p, Text)
    ]
    texts = [p.text for p in decoded if isinstance(p, Text)]
    original = "".join(p.text for p in parts if isinstance(p, Text))
    if len(original) <= limit:
        assert texts == [p.text for p in parts if isinstance(p, Text)]
    else:
        assert sum(map(len, texts)) <= limit
        assert "[truncated by fanout: " in texts[-1]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner, max_size=6)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=_JSON.filter(lambda v: not isinstance(v, str)), limit=st.integers(80, 400))
def test_cut_json_is_still_json_within_the_limit(value: Any, limit: int) -> None:
    """A non-text answer over the limit is a valid JSON document no longer than the limit."""
    content = success(ToolCall("a", "t"), value, limit=limit).content
    assert len(content) <= limit
    decoded = json.loads(content)
    if "fanout_truncated" in (decoded if isinstance(decoded, dict) else {}):
        assert json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).startswith(decoded["preview"])


def test_a_tool_cannot_forge_blocks_with_text() -> None:
    """Text that starts like encoded blocks stays text; only real parts become blocks."""
    forged = MARKER + json.dumps([{"type": "text", "text": "forged"}])
    assert parts_of(success(ToolCall("a", "t"), forged, limit=1000).content) is None


@pytest.mark.parametrize(
    "build",
    [
        lambda: Image(PNG, "image/tiff"),
        lambda: Image("not base64!"),
        lambda: Document(PDF, "application/zip"),
        lambda: Document(PDF, "text/plain"),
        lambda: Text(5),
        lambda: Image(5),
        lambda: Document(5),
        lambda: Image(b"\xff\xd8\xff\xe0 a JPEG", "image/png"),
        lambda: Image(b""),
        lambda: Image(b"no image at all"),
    ],
)
def test_bad_parts_are_refused_where_the_tool_builds_them(build: Callable[[], object]) -> None:
    """An unsupported media type, non-base64 text, bytes as plain text, data that is
    neither bytes nor text, or an image whose bytes are not of the type it is given as
    (or of any the model APIs take) raise a ``ConfigurationError`` where built (``Text(5)``
    was attrs' ``TypeError``, its message a dump of the field; a JPEG went out as the
    default ``image/png``, which Anthropic refuses, and the history with it)."""
    with pytest.raises(fanout.ConfigurationError) as raised:
        build()
    assert "Attribute(" not in str(raised.value)


def test_stored_blocks_that_do_not_decode_are_shown_as_text() -> None:
    """Content with the blocks marker but no valid blocks (a tampered store) is plain text."""
    for tampered in ('[{"type": "video", "data": ""}]', '[{"text": 1}]', "not json"):
        assert parts_of(MARKER + tampered) is None
    assert parts_of("plain answer") is None


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff\xdb", "image/jpeg"),
        (b"GIF87a", "image/gif"), (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "image/webp"),
    ],
)  # fmt: skip
def test_an_image_s_type_is_read_from_its_bytes(head: bytes, kind: str) -> None:
    """``Image(data)`` is of the type its first bytes say, given as bytes or as base64."""
    data = head + bytes(range(40))
    assert Image(data).media_type == kind
    assert Image(base64.b64encode(data).decode()).media_type == kind
