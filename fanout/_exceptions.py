"""fanout's exceptions, all rooted in one base.

::

    FanoutError
    ├── InvalidTurnError           the turn is structurally broken; nothing ran
    ├── ConfigurationError         a tool, scope or policy was declared wrongly
    ├── UsageError                 an object was used out of its order (a turn run twice)
    ├── ToolSignal                 raised *by tools* to tell the runner something
    │   ├── RateLimitedError       the downstream said "not now" (429/503)
    │   ├── TransientError         a failure worth retrying (declared by the tool)
    │   ├── QuotaExhaustedError    the downstream's quota is spent until a reset
    │   └── NotSentError           fanout kept a request back: its wait did not fit
    └── LimiterUnavailableError    a shared limiter backend could not be reached

Errors a tool raises that are not ``ToolSignal`` become ``error`` results;
they are never retried and never escape the turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._values import Status

__all__ = [
    "ConfigurationError",
    "FanoutError",
    "InvalidTurnError",
    "LimiterUnavailableError",
    "NotSentError",
    "QuotaExhaustedError",
    "RateLimitedError",
    "ToolSignal",
    "TransientError",
    "UsageError",
]


class FanoutError(Exception):
    """The root of every exception fanout raises."""


class InvalidTurnError(FanoutError, ValueError):
    """The turn cannot be answered one result per id (duplicate or missing ids).

    Raised before anything runs, because no answer we could send would be valid.
    """


class ConfigurationError(FanoutError, ValueError):
    """A tool, scope or policy was declared with values that cannot work."""


class UsageError(FanoutError, RuntimeError):
    """An object was used out of its order: a turn run twice, a scope not yet opened."""


class ToolSignal(FanoutError):
    """Base of the exceptions a tool raises on purpose to steer the runner.

    Every signal may say how long to wait (``retry_after``, seconds) and which
    scope the downstream named (``scope``); the runner reads both here, and
    treats values that are not usable numbers or names as unsaid.
    """

    def __init__(
        self, message: str = "", *, retry_after: float | None = None, scope: str | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.scope = scope


class RateLimitedError(ToolSignal):
    """The downstream refused for now; ``retry_after`` seconds is its wait, if it said.

    ``scope`` names the bucket the server said was hit, when it said one; the
    wait is then charged to that scope rather than to every scope of the call.
    ``retryable`` is False when the server said not to retry at all.
    ``sent_at`` is when the refused request was sent (trio time), when known:
    a scope learning its rate tells one congestion event from the next by it.
    """

    def __init__(
        self,
        message: str = "rate limited by the downstream",
        *,
        retry_after: float | None = None,
        scope: str | None = None,
        retryable: bool = True,
        sent_at: float | None = None,
    ) -> None:
        super().__init__(message, retry_after=retry_after, scope=scope)
        self.retryable = retryable
        self.sent_at = sent_at


class TransientError(ToolSignal):
    """A failure the tool declares worth retrying (a reset connection, a 502).

    The HTTP layer raises it for a connection that broke, before or during
    the response body: the request may have reached the server, so a write's
    effect is unknown.
    """


class QuotaExhaustedError(ToolSignal):
    """The downstream's quota is spent; ``reset_after`` seconds until it returns, if known."""

    def __init__(
        self,
        message: str = "quota exhausted",
        *,
        reset_after: float | None = None,
        scope: str | None = None,
    ) -> None:
        super().__init__(message, retry_after=reset_after, scope=scope)

    @property
    def reset_after(self) -> float | None:
        return self.retry_after


class NotSentError(ToolSignal):
    """A request the HTTP layer did not send, because its wait did not fit.

    Raised inside a tool by fanout's transport; if it escapes the tool, the
    call is answered with ``status`` at once and nothing is retried: the
    limiter, not the server, said no, so there is nothing to back off from.
    """

    def __init__(
        self,
        message: str,
        *,
        status: Status,
        scope: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, retry_after=retry_after, scope=scope)
        self.status = status


class LimiterUnavailableError(FanoutError):
    """A shared limiter (Redis) did not answer in time; callers fail closed."""
