"""What every instrument does to an event before it writes anything: no credential, few labels.

Events carry names that came from outside fanout: tool names the model
sent, scope names a server sent, reasons quoting a server's answer. The HTTP
layer already keeps credentials out of them; instruments scrub again (known
secrets and credential-shaped text), because a log line or a metric label
outlives every answer. A label's values must also stay few: a Prometheus
series per distinct value lives until the process exits, so each label keeps
its first values and calls the rest ``other``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from .._exceptions import ConfigurationError
from .._redact import redact_text
from .._secrets import secrets_learned

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._events import Event

__all__ = ["OTHER", "BoundedLabels", "safe_event"]

OTHER = "other"
_TEXT_FIELDS = ("turn_id", "call_id", "tool", "scope", "reason")


def safe_event(event: Event) -> Event:
    """``event`` with every text field and ``detail`` value scrubbed of credentials."""
    changes: dict[str, Any] = {}
    for name in _TEXT_FIELDS:
        value = getattr(event, name)
        if value is not None and (clean := redact_text(value)) != value:
            changes[name] = clean
    detail = {key: _clean(value) for key, value in event.detail.items()}
    if detail != dict(event.detail):
        changes["detail"] = detail
    return attrs.evolve(event, **changes) if changes else event


def _clean(value: object) -> object:
    return redact_text(value) if isinstance(value, str) else value


class BoundedLabels:
    """The values one label may take: the first ``limit`` distinct ones, scrubbed, then ``other``.

    A value is scrubbed when first seen, and again whenever the process has
    learned a secret since; otherwise a label costs one dict lookup, so an
    instrument on every event stays cheap. (Scrubbed once only, a tool name
    seen before it was registered as a secret went on being exported raw.)
    """

    def __init__(self, limit: int, on_stale: Callable[[set[str]], None] | None = None) -> None:
        if not (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1):
            raise ConfigurationError(f"a label's value limit must be an int >= 1, not {limit!r}")
        self._limit = limit
        self._labels: dict[str, str] = {}
        self._scrubbed_at = secrets_learned()
        self._on_stale = on_stale

    def __call__(self, value: str) -> str:
        self.refresh()
        label = self._labels.get(value)
        if label is None:
            if len(self._labels) >= self._limit:
                return OTHER
            label = self._labels[value] = redact_text(value)
        return label

    def refresh(self) -> None:
        """Scrub every label again if the process has learned a secret since the last time."""
        learned = secrets_learned()
        if learned != self._scrubbed_at:
            self._rescrub()
            self._scrubbed_at = learned

    def _rescrub(self) -> None:
        """Scrub every label again; tell ``on_stale`` the labels that showed a secret."""
        before, self._labels = self._labels, {raw: redact_text(raw) for raw in self._labels}
        stale = {label for raw, label in before.items() if self._labels[raw] != label}
        if stale and self._on_stale is not None:
            self._on_stale(stale)
