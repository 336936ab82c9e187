"""MCP tools as fanout reads them: a kind from the annotations, an answer from the result.

Annotations are hints from a server, so they are read to fail closed: only
``readOnlyHint: true`` makes a tool a read; anything else (a destructive
write, an additive one, no annotations at all) is ``MUTATING``.
``idempotentHint`` only says a write may be sent again with the same
idempotency key, so transport failures of such a tool are retried.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from mcp.types import (
    BlobResourceContents,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

from ._canonical import canonical_json
from ._exceptions import ConfigurationError, FanoutError
from ._output import IMAGE_TYPES, Document, Image, Part, Text
from ._values import Kind

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mcp.types import ContentBlock, ToolAnnotations

__all__ = ["McpSessionError", "McpToolError", "answer_of", "error_text", "kind_of", "retry_safe"]


class McpToolError(Exception):
    """The MCP server answered the call with ``isError: true``."""


class McpSessionError(FanoutError):
    """An MCP session could not be opened, or its tools listed: the server's failure,
    said once, with what failed (never the exception groups the SDK's task groups make
    of it)."""


def kind_of(annotations: ToolAnnotations | None) -> Kind:
    """READS for a tool the server says is read-only; MUTATING otherwise."""
    if annotations is not None and annotations.read_only_hint is True:
        return Kind.READS
    return Kind.MUTATING


def retry_safe(annotations: ToolAnnotations | None) -> bool:
    """Whether a call that may have reached the server can be sent again."""
    if annotations is None:
        return False
    return annotations.read_only_hint is True or annotations.idempotent_hint is True


def _part(block: ContentBlock) -> Part:
    """One MCP content block as a fanout content part, passed on intact.

    Text is text and an image of a type the model APIs take is an image;
    an embedded PDF or text resource is a document. Anything else (audio, a
    resource link, an image of another type) is its block as the protocol
    spells it, written as JSON text: nothing is dropped or renamed (an image
    whose bytes are not of the type it says is one of those).
    """
    if isinstance(block, TextContent):
        return Text(block.text)
    if isinstance(block, ImageContent) and block.mime_type in IMAGE_TYPES:
        with contextlib.suppress(ConfigurationError):  # bytes not of the type it says
            return Image(block.data, block.mime_type)
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        if isinstance(resource, BlobResourceContents) and resource.mime_type == "application/pdf":
            return Document(resource.blob, "application/pdf")
        if isinstance(resource, TextResourceContents):
            return Document(resource.text, "text/plain")
    return Text(canonical_json(block.model_dump(mode="json", by_alias=True, exclude_none=True)))


def answer_of(content: Sequence[ContentBlock]) -> str | list[Part]:
    """A result's content as the model reads it: a lone text block is its text,
    anything else fanout's content parts (``Text``, ``Image``, ``Document``),
    carried intact to each vendor's blocks."""
    if len(content) == 1 and isinstance(content[0], TextContent):
        return content[0].text
    return [_part(block) for block in content]


def error_text(content: Sequence[ContentBlock]) -> str:
    """The words of an ``isError`` result: its text blocks, and the types of the rest."""
    parts = [
        block.text if isinstance(block, TextContent) else f"[{block.type} block]"
        for block in content
    ]
    return " ".join(parts) or "the server reported an error without details"
