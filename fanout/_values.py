"""The values a turn is made of: calls in, results out.

These are plain frozen data. They know nothing of JSON, of any SDK, or of
time; the adapters at the edge translate them, and the runner produces them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

import attrs

from ._exceptions import UsageError
from ._output import Part, parts_of
from ._validate import member_of

__all__ = ["Kind", "RateLimitInfo", "Status", "ToolCall", "ToolResult"]


class Status(enum.Enum):
    """How a call ended. Closed: the model and the caller can rely on the set."""

    OK = "ok"
    ERROR = "error"
    RATE_LIMITED = "rate_limited"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    REFUSED = "refused"
    QUOTA_EXHAUSTED = "quota_exhausted"


class Kind(enum.Enum):
    """What a tool does to the world, which decides when it may run.

    ``PURE`` computes from its arguments; ``READS`` reads mutable state;
    ``MUTATING`` changes it. A tool nobody described is ``MUTATING``: the
    safe assumption is the one that cannot race a write.
    """

    PURE = "pure"
    READS = "reads"
    MUTATING = "mutating"


def _frozen_mapping(value: Mapping[str, Any] | str) -> Mapping[str, Any] | str:
    # A dict handed in stays the caller's; the call keeps its own copy so a
    # later mutation by the caller cannot change what ran. A mapping that
    # cannot be read (its ``keys()`` raises) is kept as text, and its call is
    # answered ``error`` for arguments that are not a JSON object.
    if not isinstance(value, Mapping):
        return value
    try:
        return dict(value)
    except Exception:
        return f"<arguments that could not be read: a {type(value).__name__}>"


@attrs.frozen
class ToolCall:
    """One tool call the model asked for.

    ``arguments`` is the decoded mapping, or the raw string when the model
    sent text that is not a JSON object; such a call is answered ``error``
    without running, and its siblings still run.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] | str = attrs.field(
        factory=dict, converter=_frozen_mapping, hash=False
    )
    position: int = 0

    @property
    def arguments_valid(self) -> bool:
        """Whether the arguments decoded to a JSON object."""
        # Every mapping was copied into a dict when the call was built; a dict
        # is a quicker test than the Mapping protocol.
        return isinstance(self.arguments, dict)


def _status(value: object) -> Status:
    # A member is itself (every answer fanout builds passes one): asked of the enum,
    # it is three Python calls per answer to say so.
    if isinstance(value, Status):
        return value
    return member_of(Status, value, "a result's status", UsageError)


def _text(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str):
        raise UsageError(f"a result's {attribute.name} must be text, not {type(value).__name__}")


@attrs.frozen
class ToolResult:
    """The one answer a tool call gets.

    ``content`` is the text the model will read; timings and reasons for
    operators live in the trace, never here, so the transcript is a function
    of the calls and their outcomes alone. A tool that returned content
    blocks (``Text``, ``Image``, ``Document``) has them encoded in
    ``content``, so that every path an answer takes (coalescing, the cache,
    the idempotency store) carries them intact; ``parts`` reads them back.
    """

    tool_use_id: str
    # A status spelt as its value ("ok", from a store that keeps JSON) is the status;
    # anything else is refused here, where it is made, not later as a turn ends.
    status: Status = attrs.field(converter=_status)
    content: str = attrs.field(validator=_text)
    retry_after_ms: int | None = None
    scope: str | None = None

    @property
    def is_error(self) -> bool:
        """Everything but ``ok`` is an error to the model's SDKs."""
        return self.status is not Status.OK

    @property
    def parts(self) -> list[Part] | None:
        """The content blocks of this answer, or None when its content is plain text."""
        return parts_of(self.content)


# Finite and >= 0 (or > 0): NaN fails every comparison, inf fails "< inf".
_non_negative = attrs.validators.optional(
    attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(math.inf))
)
_positive = attrs.validators.optional(
    attrs.validators.and_(attrs.validators.gt(0.0), attrs.validators.lt(math.inf))
)


@attrs.frozen
class RateLimitInfo:
    """What a response's headers say about waiting and quota; ``None`` = unknown.

    Durations are seconds from the moment the response was received.
    ``reset_exact``: the server gave its reset finer than whole seconds (a
    fractional epoch or delta, milliseconds), so it is not rounded.
    """

    retry_after: float | None = attrs.field(default=None, validator=_non_negative)
    limit: float | None = attrs.field(default=None, validator=_positive)
    remaining: float | None = attrs.field(default=None, validator=_non_negative)
    reset_after: float | None = attrs.field(default=None, validator=_non_negative)
    window: float | None = attrs.field(default=None, validator=_positive)
    scope: str | None = None
    should_retry: bool | None = None
    reset_exact: bool = False

    @property
    def rate(self) -> float | None:
        """Requests per second the server allows (``limit / window``), if both are known."""
        if self.limit is None or self.window is None:
            return None
        rate = self.limit / self.window
        return rate if math.isfinite(rate) else None
