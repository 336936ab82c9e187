"""MCP tools as fanout reads them: a kind from the annotations, an answer from the result.

Annotations are hints from a server, so they are read to fail closed: only
``readOnlyHint: true`` makes a tool a read; anything else (a destructive
write, an additive one, no annotations at all) is ``MUTATING``.
``idempotentHint`` only says a write may be sent again with the same
idempotency key, so transport failures of such a tool are retried.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp.types import TextContent

from ._values import Kind

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mcp.types import ContentBlock, ToolAnnotations

__all__ = ["McpToolError", "answer_of", "error_text", "kind_of", "retry_safe"]


class McpToolError(Exception):
    """The MCP server answered the call with ``isError: true``."""


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


def _block(block: ContentBlock) -> dict[str, Any]:
    dumped: dict[str, Any] = block.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def answer_of(content: Sequence[ContentBlock]) -> str | list[dict[str, Any]]:
    """A result's content as the model reads it.

    fanout's results are text, so a lone text block is its text and anything
    else is the list of blocks as the protocol spells them (type, text,
    data, mimeType, ...), written as JSON: nothing is dropped or renamed.
    """
    if len(content) == 1 and isinstance(content[0], TextContent):
        return content[0].text
    return [_block(block) for block in content]


def error_text(content: Sequence[ContentBlock]) -> str:
    """The words of an ``isError`` result: its text blocks, and the types of the rest."""
    parts = [
        block.text if isinstance(block, TextContent) else f"[{block.type} block]"
        for block in content
    ]
    return " ".join(parts) or "the server reported an error without details"
