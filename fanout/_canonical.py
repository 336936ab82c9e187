"""Canonical text: one spelling for equal values, and a visible cap on size.

The transcript must be byte-identical for the same outcomes (invariant 4), so
anything we turn into text for the model is serialised with sorted keys and
compact separators, and anything we cut is cut visibly.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_json", "idempotency_key", "truncate"]


def canonical_json(value: Any) -> str:
    """Serialise ``value`` with sorted keys and no insignificant whitespace.

    Values JSON cannot represent are written with ``str()``: a tool's output
    is for a model to read, and failing the call over a ``datetime`` would
    lose an answer the tool did produce. For the same reason NaN and infinity
    are written as JavaScript does (``NaN``, ``Infinity``). A structure that
    contains itself still raises ``ValueError``.
    """
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )


def _marker(dropped: int) -> str:
    return f"\n[truncated by fanout: {dropped} more characters]"


def truncate(text: str, limit: int) -> str:
    """Cut ``text`` to at most ``limit`` characters, saying how much was dropped.

    The marker counts against the cap (sized for the largest count it could
    carry), so a cut text is never longer than ``limit`` unless the cap is
    shorter than the marker itself.
    """
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(_marker(len(text))))
    return text[:keep] + _marker(len(text) - keep)


def idempotency_key(run_id: str, tool: str, arguments: Any) -> str:
    """sha256 over the run, the tool and the canonical arguments.

    Equal calls in one run share a key however the model ordered or spaced
    their arguments, so a retried or re-issued write is recognisable as the
    same write, here and downstream.
    """
    try:
        spelled = canonical_json(arguments)
    except (ValueError, RecursionError):
        spelled = repr(arguments)  # a structure containing itself: no canonical form
    material = "\x00".join((run_id, tool, spelled))
    return hashlib.sha256(material.encode()).hexdigest()
