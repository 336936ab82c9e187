"""The public surface: exactly the names we mean to export, sorted, and typed."""

from __future__ import annotations

from pathlib import Path

import fanout

EXPECTED = {
    # values
    "Kind", "Status", "ToolCall", "ToolResult",
    # primitives
    "Budget", "BucketStatistics", "TokenBucket", "RetryPolicy", "RetryBudget",
    "RetryBudgetStatistics",
    "Scope", "ScopeStatistics", "concurrency_for",
    # scheduling
    "Registry", "ToolSpec", "Runner", "RunnerStatistics", "Turn", "Run", "ReadCache",
    "CallContext", "current_call", "canonical_json", "idempotency_key",
    # idempotency
    "IdempotencyStore", "MemoryIdempotencyStore", "Claim", "ClaimState", "StoredAnswer",
    # events
    "Event", "EventDetail", "EventKind", "Instrument",
    # errors
    "FanoutError", "InvalidTurnError", "ConfigurationError", "ToolSignal", "RateLimitedError",
    "TransientError", "QuotaExhaustedError", "NotSentError", "LimiterUnavailableError",
    "UsageError",
    # edges
    "calls_from_anthropic", "anthropic_tool_results", "calls_from_openai",
    "openai_tool_messages", "FanoutTransport", "http_client", "RateLimitInfo",
    "parse_rate_limit_headers", "Secret", "register_secret",
    # definitions and wire formats (issue 14)
    "ArgumentError", "ToolDefinition", "calls_from_responses", "responses_tool_outputs",
    "repair_anthropic_history", "repair_openai_history", "repair_responses_input",
    "Text", "Image", "Document",
}  # fmt: skip


def test_all_is_exactly_the_public_names() -> None:
    """__all__ lists what we mean to export, and nothing private leaks into it."""
    assert set(fanout.__all__) == EXPECTED
    assert all(hasattr(fanout, name) for name in fanout.__all__)


def test_all_is_sorted() -> None:
    """A sorted __all__ keeps the surface reviewable."""
    assert fanout.__all__ == sorted(fanout.__all__)


def test_package_ships_its_type_information() -> None:
    """py.typed is present, so users' type checkers read fanout's annotations."""
    assert (Path(fanout.__file__).parent / "py.typed").exists()
