"""The Prometheus integration: counters and histograms after a turn, scope gauges at scrape time."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry, generate_latest

import fanout
from fanout import Kind, Registry, Runner, Scope, ToolCall
from fanout.contrib.prometheus import PrometheusInstrument

from .test_events import (
    SCOPE,
    run_http_turn,
    run_throttled_turn,
    throttled_calls,
    throttled_runner,
)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_counters_after_a_throttled_turn(autojump_clock: Any) -> None:
    """Calls by tool and status, attempts, 429s and retries count exactly what happened."""
    registry = CollectorRegistry()
    await run_throttled_turn(PrometheusInstrument(registry))
    counts = {
        ("calls", "lookup", "ok"): 3.0,
        ("calls", "update", "ok"): 1.0,
        ("calls", "update", "refused"): 1.0,
        ("calls", "delete_everything", "refused"): 1.0,
    }
    for (_, tool, status), value in counts.items():
        assert sample(registry, "fanout_calls_total", tool=tool, status=status) == value
    assert sample(registry, "fanout_attempts_total", tool="lookup") == 3.0
    assert sample(registry, "fanout_attempts_total", tool="update") == 2.0
    assert sample(registry, "fanout_throttles_total", scope=SCOPE) == 1.0
    assert sample(registry, "fanout_retries_total", tool="update", reason="RateLimitedError") == 1.0
    assert sample(registry, "fanout_sheds_total", scope=SCOPE) is None  # never shed


async def test_http_requests_and_429s_are_counted(autojump_clock: Any) -> None:
    """Requests sent and responses by status code come from the HTTP transport's events."""
    registry = CollectorRegistry()
    await run_http_turn(PrometheusInstrument(registry))
    assert sample(registry, "fanout_requests_total", tool="fetch") == 3.0
    assert sample(registry, "fanout_responses_total", tool="fetch", code="200") == 2.0
    assert sample(registry, "fanout_responses_total", tool="fetch", code="429") == 1.0
    assert sample(registry, "fanout_throttles_total", scope=SCOPE) == 1.0
    assert sample(registry, "fanout_attempts_total", tool="fetch") == 3.0
    assert sample(registry, "fanout_calls_total", tool="fetch", status="ok") == 2.0


async def test_wait_and_duration_histograms(autojump_clock: Any) -> None:
    """Token waits and retry waits by scope, and queued-to-answered times by tool, are exact."""
    registry = CollectorRegistry()
    instrument = PrometheusInstrument(registry)
    turn = await run_throttled_turn(instrument)
    tokens = {"scope": SCOPE, "kind": "token_wait"}
    assert sample(registry, "fanout_wait_seconds_count", **tokens) == 3.0
    assert sample(registry, "fanout_wait_seconds_sum", **tokens) == 1.0 + 0.5 + 0.5
    assert sample(registry, "fanout_wait_seconds_bucket", **tokens, le="0.5") == 2.0
    retry = {"scope": SCOPE, "kind": "retry_scheduled"}
    assert sample(registry, "fanout_wait_seconds_sum", **retry) == 0.5
    assert sample(registry, "fanout_call_duration_seconds_count", tool="lookup") == 3.0
    assert sample(registry, "fanout_call_duration_seconds_sum", tool="lookup") == 1.5 + 2.5 + 3.5
    assert sample(registry, "fanout_call_duration_seconds_sum", tool="update") == 5.5 + 0.0
    assert sample(registry, "fanout_call_duration_seconds_count", tool="delete_everything") == 1.0
    # Each start time is used once: an answer seen again measures nothing more.
    for event in turn.trace:
        if event.kind is fanout.EventKind.ANSWERED:
            instrument.on_event(event)
    assert sample(registry, "fanout_call_duration_seconds_count", tool="lookup") == 3.0


async def test_sheds_and_exhausted_quotas_are_counted(autojump_clock: Any) -> None:
    """A shed call and a spent quota each count once, on their scope."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["bulk"])
    async def export() -> str:
        return "done"

    @reg.tool(kind=Kind.READS, scopes=["llm"])
    async def ask() -> str:
        raise fanout.QuotaExhaustedError(reset_after=60)

    registry = CollectorRegistry()
    runner = Runner(
        reg,
        scopes=[Scope("bulk", max_concurrency=1, max_waiters=0)],
        instruments=[PrometheusInstrument(registry)],
    )
    await runner.run_turn([ToolCall("e", "export", {}), ToolCall("a", "ask", {})])
    assert sample(registry, "fanout_sheds_total", scope="bulk") == 1.0
    assert sample(registry, "fanout_quota_exhausted_total", scope="llm") == 1.0
    assert sample(registry, "fanout_calls_total", tool="export", status="rate_limited") == 1.0
    assert sample(registry, "fanout_calls_total", tool="ask", status="quota_exhausted") == 1.0


async def test_scope_gauges_are_read_at_scrape_time(autojump_clock: Any) -> None:
    """In-flight and waiting per scope are the scope's own counts at the moment of scraping."""
    registry = CollectorRegistry()
    instrument = PrometheusInstrument(registry, namespace="agent")
    runner = throttled_runner(instrument)
    instrument.observe_scopes(runner)

    def gauges() -> tuple[float | None, float | None]:
        return (
            sample(registry, "agent_scope_in_flight", scope=SCOPE),
            sample(registry, "agent_scope_waiting", scope=SCOPE),
        )

    assert gauges() == (0.0, 0.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner.run_turn, throttled_calls())
        await trio.sleep(0.25)  # two reads hold the slots; one waits for a token, one for a slot
        assert gauges() == (2.0, 2.0)
        await trio.sleep(1.5)  # t=1.75: the third read holds a slot and waits for a token
        assert gauges() == (2.0, 1.0)
    assert gauges() == (0.0, 0.0)


async def test_scrape_from_another_thread_asks_the_trio_thread() -> None:
    """A scrape from a worker thread (as start_http_server's) sees live scope counts.

    Real clock on purpose: an autojumping clock would advance virtual time
    while trio waits for the thread, and the call here waits on an event.
    """
    release = trio.Event()
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["crm"])
    async def hold(n: int) -> str:
        await release.wait()
        return f"done {n}"

    registry = CollectorRegistry()
    instrument = PrometheusInstrument(registry)
    runner = Runner(reg, scopes=[Scope("crm", max_concurrency=1)], instruments=[instrument])
    instrument.observe_scopes(runner)
    calls = [ToolCall("h1", "hold", {"n": 1}), ToolCall("h2", "hold", {"n": 2})]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner.run_turn, calls)
        await trio.testing.wait_all_tasks_blocked()  # h1 holds the slot, h2 waits for it
        scraped = await trio.to_thread.run_sync(
            lambda: (
                registry.get_sample_value("fanout_scope_in_flight", {"scope": "crm"}),
                registry.get_sample_value("fanout_scope_waiting", {"scope": "crm"}),
            )
        )
        assert scraped == (1.0, 1.0)
        release.set()
    assert sample(registry, "fanout_calls_total", tool="hold", status="ok") == 2.0


def test_scrape_after_the_run_has_ended_exports_no_scope() -> None:
    """Once the trio run is over, the scope gauges are present but empty, not an error."""
    registry = CollectorRegistry()
    instrument = PrometheusInstrument(registry)
    runner = throttled_runner(instrument)
    instrument.observe_scopes(runner)
    trio.run(runner.run_turn, [ToolCall("x1", "nope", {})])
    assert sample(registry, "fanout_scope_in_flight", scope=SCOPE) is None
    assert sample(registry, "fanout_calls_total", tool="nope", status="refused") == 1.0


def test_labels_from_outside_keep_to_their_bound() -> None:
    """Scope names beyond max_label_values read 'other'; a credential never becomes a label."""
    registry = CollectorRegistry()
    metrics = PrometheusInstrument(registry, max_label_values=3)
    scopes = ["token=sk-live-0123456789abc", *(f"scope{n}" for n in range(5))]
    for n, scope in enumerate(scopes):
        blocked = fanout.EventKind.SCOPE_BLOCKED
        metrics.on_event(fanout.Event(blocked, 0.0, "t", f"c{n}", "tool", scope, wait=1.0))
    throttles = {
        scope: sample(registry, "fanout_throttles_total", scope=scope)
        for scope in ("token=REDACTED", "scope0", "scope1", "scope2", "other")
    }
    assert throttles == {
        "token=REDACTED": 1.0,
        "scope0": 1.0,
        "scope1": 1.0,
        "scope2": None,
        "other": 3.0,
    }
    assert "sk-live" not in generate_latest(registry).decode()


def test_a_label_bound_must_be_positive() -> None:
    """max_label_values below 1 is a configuration error, not an unbounded label."""
    with pytest.raises(fanout.ConfigurationError):
        PrometheusInstrument(CollectorRegistry(), max_label_values=0)


def test_a_scrape_before_any_turn_exports_no_scope() -> None:
    """Scraped from a thread with no trio run before any turn: empty scope gauges, no error."""
    registry = CollectorRegistry()
    instrument = PrometheusInstrument(registry)
    instrument.observe_scopes(throttled_runner(instrument))
    assert sample(registry, "fanout_scope_in_flight", scope=SCOPE) is None
    assert "fanout_scope_in_flight" in generate_latest(registry).decode()
