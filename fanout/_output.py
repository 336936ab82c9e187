"""A tool's output as the model will read it: text, JSON, or content blocks.

A tool may return content blocks (``Text``, ``Image``, ``Document``, alone
or in a list) instead of a value: a screenshot, a PDF, text beside a chart.
They are kept inside ``ToolResult.content`` as one marked canonical JSON
string, so coalescing, the run's cache and idempotent replay (which all
carry ``content`` and nothing else) carry them intact; the adapters turn
them into each vendor's blocks.

The output limit cuts text, never a block and never a JSON document: text
parts are cut with a visible marker and blocks stay whole; JSON over the
limit becomes a small valid JSON document holding a preview, not the first
half of the original.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from ._canonical import canonical_json, truncate, truncation_marker, uncut
from ._exceptions import ConfigurationError
from ._validate import require_one_of
from ._validate import text as validate_text

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

T = TypeVar("T")

__all__ = [
    "IMAGE_TYPES",
    "Document",
    "Image",
    "Part",
    "Text",
    "cut_again",
    "cut_json",
    "defuse",
    "encode_parts",
    "parts_in",
    "parts_of",
    "render",
    "text_of",
]

# Starts a content string that holds blocks. It contains NUL, which no JSON
# document and no tool's text of its own begins with (``defuse`` sees to it).
MARKER = "\x00fanout-blocks\x00"

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_DOCUMENT_TYPES = ("application/pdf", "text/plain")


def _base64(value: bytes | str) -> str:
    """Bytes as base64 text; text is taken as base64 already, and checked."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if not isinstance(value, str):
        raise ConfigurationError(f"data must be bytes or base64 text, not {type(value).__name__}")
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigurationError(f"data given as text must be base64: {exc}") from exc
    return value


@attrs.frozen
class Text:
    """Text the model reads; the only part the output limit may cut."""

    text: str = attrs.field(validator=validate_text)


@attrs.frozen(init=False)
class Image:
    """An image (bytes, or base64 text) the model sees; never cut.

    Its type is read from its first bytes (``media_type`` None, the default), and one
    given must be theirs: Anthropic refuses an image whose bytes are not of the type
    it is sent as, and the refused block stays in the history, so every later request
    of the conversation is refused too. (A JPEG was sent as the default ``image/png``.)
    An empty image is refused as well.
    """

    data: str
    media_type: str

    def __init__(self, data: bytes | str, media_type: str | None = None) -> None:
        data = _base64(data)
        if media_type is not None:
            require_one_of("media_type", media_type, IMAGE_TYPES)
        found = _image_type(data)
        if found is None:
            raise ConfigurationError(
                "an image's data must be a JPEG, PNG, GIF or WebP image; these bytes are none"
            )
        if media_type is not None and media_type != found:
            raise ConfigurationError(f"the image is {found}, not {media_type}")
        self.__attrs_init__(data, found)


# How each image type the model APIs take begins (WebP: RIFF, a size, then WEBP).
_IMAGE_SIGNATURES = (
    (b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"),
)  # fmt: skip


def _image_type(data: str) -> str | None:
    """The type of the image whose base64 is ``data``, from its first bytes; None if
    it is none of those the model APIs take."""
    head = base64.b64decode(data[:24])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for signature, kind in _IMAGE_SIGNATURES if head.startswith(signature)), None)


@attrs.frozen(init=False)
class Document:
    """A PDF (bytes or base64) or plain text document; never cut.

    ``data`` is kept as text: a PDF's base64, or a plain document's own text.
    """

    data: str
    media_type: str
    title: str | None

    def __init__(
        self, data: bytes | str, media_type: str = "application/pdf", title: str | None = None
    ) -> None:
        require_one_of("media_type", media_type, _DOCUMENT_TYPES)
        if media_type == "application/pdf":
            data = _base64(data)
        elif not isinstance(data, str):
            raise ConfigurationError("a text/plain document's data is its text, a str")
        self.__attrs_init__(data, media_type, title)


Part = Text | Image | Document
_KINDS: dict[str, type[Part]] = {"text": Text, "image": Image, "document": Document}


def parts_in(value: Any) -> list[Part] | None:
    """The content blocks a tool's return value is (a part, or a list or tuple of only
    parts), read once; None for anything else.

    A list or tuple subclass may raise as it is read (its ``__iter__`` or
    ``__len__``): that is not content blocks either, and is written by its
    text (`canonical_json`), never answered as the tool raising: it
    returned. Read once, so what is written is what was checked.
    """
    if isinstance(value, Text | Image | Document):
        return [value]
    if not isinstance(value, list | tuple):
        return None
    try:
        items = list(value)
    except Exception:
        return None
    if items and all(isinstance(item, Text | Image | Document) for item in items):
        return items
    return None


def encode_parts(parts: Sequence[Part], *, limit: int, total: int | None = None) -> str:
    """The content string for blocks, their text cut to ``limit`` characters in all;
    ``total``: the length of the text they hold the head of, when they were cut before."""
    # A text block with nothing but white space in it is refused by Anthropic ("text
    # content blocks must contain non-whitespace text"), and the history with it: left out.
    parts = [part for part in parts if not isinstance(part, Text) or part.text.strip()]
    if not parts:
        return ""
    if total is None:
        total = _text_length(parts)
    # Over the limit, the marker counts against the cap: room for text is what
    # is left beside a marker sized for the largest count it could carry.
    room = limit if total <= limit else max(0, limit - len(truncation_marker(total)))
    used = 0
    kept: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, Text):
            if used > room:
                continue  # the text was cut already; later text is dropped
            text = part.text
            if used + len(text) > room:
                text = text[: room - used] + truncation_marker(total - room)
            used += len(part.text)
            kept.append({"type": "text", "text": text})
        else:
            fields = attrs.asdict(part, filter=lambda _, v: v is not None)
            kept.append({"type": "image" if isinstance(part, Image) else "document", **fields})
    return MARKER + canonical_json(kept)


def _text_length(parts: Sequence[Part]) -> int:
    return sum(len(part.text) for part in parts if isinstance(part, Text))


def parts_of(content: str) -> list[Part] | None:
    """The blocks a content string holds, or None when it is plain text."""
    if not content.startswith(MARKER):
        return None
    try:
        return [_KINDS[item.pop("type")](**item) for item in json.loads(content[len(MARKER) :])]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None  # not written by encode_parts (a tampered store): shown as text


def render(content: str, block: Callable[[Part], T]) -> str | list[T]:
    """Plain text as it is; blocks each rendered by ``block``, in order."""
    parts = parts_of(content)
    return content if parts is None else [block(part) for part in parts]


def text_of(part: Part) -> str:
    """A part as text, for a format that carries text only: a block is named, not sent."""
    if isinstance(part, Text):
        return part.text
    size = len(part.data) * 3 // 4 if part.media_type != "text/plain" else len(part.data)
    what = "image" if isinstance(part, Image) else "document"
    return f"[{what} {part.media_type}, about {size} bytes: not shown, this API takes text only]"


def defuse(text: str) -> str:
    """A tool's own text, never mistaken for blocks (it cannot start with the marker)."""
    return " " + text if text.startswith(MARKER) else text


def cut_json(text: str, limit: int, *, total: int | None = None) -> str:
    """JSON ``text`` within ``limit`` characters, still a valid JSON document.

    A document over the limit is replaced by an object saying so, with as
    much of the original as fits as a string preview, so a model (or a
    program) reading the answer always gets JSON it can parse. ``total`` is
    the original's length when ``text`` is only the preview of it.
    """
    total = len(text) if total is None else total
    if total <= limit:
        return text
    keep = limit
    while True:
        envelope = canonical_json(
            {"fanout_truncated": {"total_chars": total}, "preview": text[: max(0, keep)]}
        )
        if len(envelope) <= limit or keep <= 0:
            return envelope
        keep -= len(envelope) - limit


def cut_again(content: str, limit: int) -> str:
    """An ok answer's content, kept by a run (its cache, its idempotency store) as another
    runner cut it, within ``limit``, cut as a fresh answer would be.

    A runner with a smaller cap than the one that kept the answer handed the model all of
    it. What was cut before is cut from what was kept, and says how long the original
    was: text its marker's count, JSON its envelope's ``total_chars``, blocks the marker
    in their text. Content is read as it was written: blocks by their marker, JSON
    objects and arrays as JSON (a tool's text that is one is cut as JSON too), the rest
    as text.
    """
    parts = parts_of(content)
    if parts is not None:
        return _parts_cut_again(parts, limit) if _text_length(parts) > limit else content
    if len(content) <= limit:
        return content
    document = _document(content)
    if document is None:
        kept, total = uncut(content)
        return truncate(kept, limit, total=total)
    preview, total = _preview(document)
    return cut_json(content, limit) if preview is None else cut_json(preview, limit, total=total)


def _parts_cut_again(parts: list[Part], limit: int) -> str:
    """Blocks cut (again) to ``limit``: the text their marker ended is taken back to what
    was kept of it, and counted as long as the original was."""
    total = 0
    kept: list[Part] = []
    for part in parts:
        if isinstance(part, Text):
            text, length = uncut(part.text)
            total += length
            part = Text(text)
        kept.append(part)
    return encode_parts(kept, limit=limit, total=total)


def _document(content: str) -> dict[str, Any] | list[Any] | None:
    """``content`` as a JSON object or array, or None when it is no such document."""
    try:
        document = json.loads(content)
    except ValueError:
        return None
    return document if isinstance(document, dict | list) else None


def _preview(document: dict[str, Any] | list[Any]) -> tuple[str | None, int]:
    """The preview `cut_json` kept of a document and the original's length; (None, 0) for
    a document it never cut."""
    if not isinstance(document, dict) or set(document) != {"fanout_truncated", "preview"}:
        return None, 0
    cut, preview = document["fanout_truncated"], document["preview"]
    total = cut.get("total_chars") if isinstance(cut, dict) else None
    if not isinstance(total, int) or not isinstance(preview, str):
        return None, 0
    return preview, total
