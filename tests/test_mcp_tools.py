"""What a model reads of an MCP tool's result: each content block as a fanout part, intact."""

from __future__ import annotations

import json

from mcp.types import (
    AudioContent,
    BlobResourceContents,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

import fanout
from fanout._mcp_tools import answer_of, error_text


def test_a_lone_text_block_is_its_text() -> None:
    """One text block is answered as a plain string, not a list of parts."""
    assert answer_of([TextContent(type="text", text="done")]) == "done"


def test_embedded_pdfs_and_text_resources_are_documents() -> None:
    """An embedded PDF blob and an embedded text resource become Documents of their type."""
    pdf = BlobResourceContents(uri="file:///a.pdf", blob="JVBERi0=", mime_type="application/pdf")
    notes = TextResourceContents(uri="file:///notes.txt", text="line one", mime_type="text/plain")
    parts = answer_of(
        [
            EmbeddedResource(type="resource", resource=pdf),
            EmbeddedResource(type="resource", resource=notes),
        ]
    )
    assert parts == [
        fanout.Document("JVBERi0=", "application/pdf"),
        fanout.Document("line one", "text/plain"),
    ]


def test_blocks_no_model_api_takes_are_written_as_their_json() -> None:
    """Audio, a non-PDF blob and an image of an unsupported type reach the model as the
    protocol spells them (JSON text), nothing dropped or renamed."""
    zip_blob = BlobResourceContents(
        uri="file:///a.zip", blob="UEsDBA==", mime_type="application/zip"
    )
    blocks = [
        AudioContent(type="audio", data="UklGRg==", mime_type="audio/wav"),
        EmbeddedResource(type="resource", resource=zip_blob),
        ImageContent(type="image", data="AAAA", mime_type="image/tiff"),
    ]
    parts = answer_of(blocks)
    assert isinstance(parts, list)
    assert all(isinstance(part, fanout.Text) for part in parts)
    spelled = [json.loads(part.text) for part in parts if isinstance(part, fanout.Text)]
    assert spelled == [
        {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
        {
            "type": "resource",
            "resource": {"uri": "file:///a.zip", "blob": "UEsDBA==", "mimeType": "application/zip"},
        },
        {"type": "image", "data": "AAAA", "mimeType": "image/tiff"},
    ]


def test_an_error_result_names_its_text_and_the_types_of_the_rest() -> None:
    """isError content reads as its text blocks and a placeholder per other block."""
    image = ImageContent(type="image", data="AAAA", mime_type="image/png")
    assert error_text([TextContent(type="text", text="no such note"), image]) == (
        "no such note [image block]"
    )
    assert error_text([]) == "the server reported an error without details"
