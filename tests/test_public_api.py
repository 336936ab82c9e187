"""The public surface: exactly the names we mean to export, sorted, and typed."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import fanout

EXPECTED = {
    # values
    "Kind", "Status", "ToolCall", "ToolResult",
    # primitives
    "Booking", "Budget", "Verdict", "BucketStatistics", "ServerCount", "TokenBucket",
    "RetryPolicy",
    "RetryBudget",
    "RetryBudgetStatistics",
    "Scope", "ScopeLike", "ScopeStatistics", "concurrency_for", "Leaving",
    # scheduling
    "Registry", "ToolSpec", "Runner", "RunnerStatistics", "Turn", "Run",
    "CallContext", "current_call",
    # events
    "Event", "EventDetail", "EventKind", "Instrument",
    # errors
    "FanoutError", "InvalidTurnError", "ConfigurationError", "ToolSignal", "RateLimitedError",
    "TransientError", "QuotaExhaustedError", "LimiterUnavailableError",
    "UsageError",
    # edges
    "calls_from_anthropic", "anthropic_tool_results", "calls_from_openai",
    "openai_tool_messages", "FanoutTransport", "http_client", "Secret", "register_secret",
    # streaming turns (issue 16)
    "StreamingTurn", "StreamDecoder", "AnthropicStream", "ChatCompletionsStream",
    "ResponsesStream", "Unfinished",
    # definitions and wire formats (issue 14)
    "ArgumentError", "ToolDefinition", "calls_from_responses", "responses_tool_outputs",
    "repair_anthropic_history", "repair_openai_history", "repair_responses_input",
    "Text", "Image", "Document",
}  # fmt: skip

# Rarely needed names live in public submodules, where their topic is.
SUBMODULES = {
    "fanout.idempotency": {
        "Claim", "ClaimState", "IdempotencyStore", "MemoryIdempotencyStore", "ReadCache",
        "StoredAnswer", "canonical_json", "idempotency_key",
    },
    "fanout.http": {
        "FanoutTransport", "NotSentError", "RateLimitInfo", "http_client",
        "parse_rate_limit_headers",
    },
}  # fmt: skip


def test_all_is_exactly_the_public_names() -> None:
    """__all__ lists what we mean to export, and nothing private leaks into it."""
    assert set(fanout.__all__) == EXPECTED
    assert all(hasattr(fanout, name) for name in fanout.__all__)


def test_all_is_sorted() -> None:
    """A sorted __all__ keeps the surface reviewable."""
    assert fanout.__all__ == sorted(fanout.__all__)


@pytest.mark.parametrize("name", sorted(SUBMODULES))
def test_submodules_export_exactly_their_names(name: str) -> None:
    """Each public submodule's sorted __all__ is exactly its topic's names, all importable."""
    module = importlib.import_module(name)
    assert set(module.__all__) == SUBMODULES[name]
    assert module.__all__ == sorted(module.__all__)
    assert all(hasattr(module, item) for item in module.__all__)


def test_a_name_has_one_public_home_unless_it_is_common() -> None:
    """Names moved to a submodule are gone from the top level; only the HTTP pair is in both."""
    everywhere = set().union(*SUBMODULES.values())
    assert everywhere & set(fanout.__all__) == {"FanoutTransport", "http_client"}


def test_package_ships_its_type_information() -> None:
    """py.typed is present, so users' type checkers read fanout's annotations."""
    assert (Path(fanout.__file__).parent / "py.typed").exists()


def _fanout_types_named_in(annotation: object) -> set[type]:
    """The fanout classes a (string) return annotation names, wherever they are defined."""
    package = Path(fanout.__file__).parent
    modules = [importlib.import_module(f"fanout.{path.stem}") for path in package.glob("_*.py")]
    found = set()
    for word in re.findall(r"\b[A-Z]\w*", str(annotation)):
        for module in modules:
            kind = getattr(module, word, None)
            if isinstance(kind, type) and kind.__module__.startswith("fanout"):
                found.add(kind)
    return found


def test_every_fanout_type_a_public_method_returns_is_exported() -> None:
    """A user can name (and type-annotate) whatever a public method or property returns."""
    public = set(fanout.__all__).union(*SUBMODULES.values())
    unnamed = set()
    for name in fanout.__all__:
        cls = getattr(fanout, name)
        for attr, member in vars(cls).items() if isinstance(cls, type) else ():
            fn = member.fget if isinstance(member, property) else member
            if attr.startswith("_") or not callable(fn):
                continue
            returned = getattr(fn, "__annotations__", {}).get("return")
            unnamed |= {
                f"{name}.{attr} -> {kind.__name__}"
                for kind in _fanout_types_named_in(returned)
                if kind.__name__ not in public
            }
    assert unnamed == set()
