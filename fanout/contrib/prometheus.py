"""Prometheus metrics: counters and histograms from events, scope gauges at scrape time.

Counters and histograms follow the events, in the turn's task. The gauges
(calls in flight and waiting, per scope) do not: no event marks a slot's
release, and a scope without a concurrency cap emits no ``slot_acquired``,
so a gauge kept from events would drift. ``observe_scopes(runner)`` instead
registers a collector reading the frozen ``runner.statistics()`` at scrape
time; a scrape from another thread (``start_http_server``'s) asks the
runner's trio thread for it, since scopes live on trio's clock.

Labels hold no credential and stay few: tool and scope names come from the
model and from servers, so each label keeps its first ``max_label_values``
distinct values and counts the rest as ``other`` (`fanout.contrib._safety`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .._events import Event, EventKind
from .._exceptions import ConfigurationError
from .._redact import redact_text
from ._safety import BoundedLabels

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .._runner import Runner, RunnerStatistics

__all__ = ["PrometheusInstrument"]


class PrometheusInstrument:
    """Export fanout's events as ``<namespace>_*`` metrics on ``registry`` (default: global).

    ``max_label_values`` bounds each label (tool, scope, retry reason): its
    first that many distinct values are kept, later ones read ``other``.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        namespace: str = "fanout",
        *,
        max_label_values: int = 100,
    ) -> None:
        if not isinstance(namespace, str):
            raise ConfigurationError(f"namespace must be text, not {namespace!r}")
        self.registry = REGISTRY if registry is None else registry
        self.namespace = namespace
        self._tool = BoundedLabels(max_label_values, self._forget)
        self._scope = BoundedLabels(max_label_values, self._forget)
        self._reason = BoundedLabels(max_label_values, self._forget)
        # Registered before the metrics, so a scrape scrubs their labels before it reads
        # them: scrubbed only as events came, a series named with a key declared after
        # the last event was exported raw on every scrape.
        self.registry.register(_LabelsScrubbed((self._tool, self._scope, self._reason)))
        self._labelled: list[tuple[Counter | Histogram, tuple[str, ...]]] = []
        self._scopes: _ScopeCollector | None = None
        # (turn id, call id) -> when it was queued; popped when it is answered,
        # and every queued call is answered, so this holds only calls in progress.
        self._queued: dict[tuple[str | None, str | None], float] = {}

        def counter(name: str, doc: str, *labels: str) -> Counter:
            metric = Counter(name, doc, labels, namespace=namespace, registry=self.registry)
            self._labelled.append((metric, labels))
            return metric

        def histogram(name: str, doc: str, *labels: str) -> Histogram:
            metric = Histogram(name, doc, labels, namespace=namespace, registry=self.registry)
            self._labelled.append((metric, labels))
            return metric

        self.calls = counter("calls", "Calls answered, by tool and status.", "tool", "status")
        self.attempts = counter("attempts", "Attempts admitted and started.", "tool")
        self.requests = counter("requests", "HTTP requests sent.", "tool")
        self.responses = counter("responses", "HTTP responses, by status code.", "tool", "code")
        self.throttles = counter("throttles", "Waits a server imposed on a scope.", "scope")
        self.retries = counter("retries", "Retries scheduled, by cause.", "tool", "reason")
        self.sheds = counter("sheds", "Calls answered at once: queue full.", "scope")
        self.exhausted = counter("quota_exhausted", "Times a quota ran dry.", "scope")
        self.waits = histogram("wait_seconds", "Waits before a start.", "scope", "kind")
        self.durations = histogram("call_duration_seconds", "Queued to answered.", "tool")

    def _forget(self, stale: set[str]) -> None:
        """Drop every series labelled with a value now known to hold a secret.

        It was exported before fanout learned the secret (a tool named after a
        key registered later); its counts go with it, rather than the key stay
        on every scrape.
        """
        for metric, names in self._labelled:
            shown = {
                values
                for family in metric.collect()
                for sample in family.samples
                if stale & set(values := tuple(sample.labels[name] for name in names))
            }
            for values in shown:
                metric.remove(*values)

    def observe_scopes(self, runner: Runner) -> None:
        """Export ``runner``'s per-scope in-flight and waiting counts, read at scrape time."""
        self._scopes = _ScopeCollector(runner, self.namespace)
        self.registry.register(self._scopes)

    def on_event(self, event: Event) -> None:
        tool, scope = self._tool(event.tool or ""), self._scope(event.scope or "")
        key = (event.turn_id, event.call_id)
        match event.kind:
            case EventKind.QUEUED:
                self._queued[key] = event.time
                if self._scopes is not None:
                    self._scopes.token = trio.lowlevel.current_trio_token()
            case EventKind.ANSWERED:
                self.calls.labels(tool, event.status.value if event.status else "").inc()
                queued = self._queued.pop(key, None)
                if queued is not None:
                    self.durations.labels(tool).observe(event.time - queued)
            case EventKind.STARTED:
                self.attempts.labels(tool).inc()
            case EventKind.REQUEST_SENT:
                self.requests.labels(tool).inc()
            case EventKind.RESPONSE:
                self.responses.labels(tool, str(event.detail.get("status", ""))).inc()
            case EventKind.SCOPE_BLOCKED:
                self.throttles.labels(scope).inc()
            case EventKind.RETRY_SCHEDULED:
                self.retries.labels(tool, self._reason(event.reason or "")).inc()
                self.waits.labels(scope, event.kind.value).observe(event.wait or 0.0)
            case EventKind.TOKEN_WAIT:
                self.waits.labels(scope, event.kind.value).observe(event.wait or 0.0)
            case EventKind.SHED:
                self.sheds.labels(scope).inc()
            case EventKind.SCOPE_EXHAUSTED:
                self.exhausted.labels(scope).inc()


class _LabelsScrubbed(Collector):
    """Scrubs the labels again as a scrape begins (`BoundedLabels.refresh`); exports nothing."""

    def __init__(self, labels: tuple[BoundedLabels, ...]) -> None:
        self.labels = labels

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for labels in self.labels:
            labels.refresh()
        return iter(())


class _ScopeCollector(Collector):
    def __init__(self, runner: Runner, namespace: str) -> None:
        self.runner = runner
        self.namespace = namespace
        self.token: trio.lowlevel.TrioToken | None = None  # the runner's trio run, once seen

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self._snapshot()
        name = f"{self.namespace}_scope_"
        in_flight = GaugeMetricFamily(name + "in_flight", "Calls holding a slot.", labels=["scope"])
        waiting = GaugeMetricFamily(name + "waiting", "Calls waiting to start.", labels=["scope"])
        for scope in stats.scopes if stats is not None else ():
            name = redact_text(scope.name)
            in_flight.add_metric([name], scope.in_flight)
            waiting.add_metric([name], scope.waiting)
        yield in_flight
        yield waiting

    def _snapshot(self) -> RunnerStatistics | None:
        try:
            here: trio.lowlevel.TrioToken | None = trio.lowlevel.current_trio_token()
        except RuntimeError:
            here = None
        if here is not None and (self.token is None or here is self.token):
            return self.runner.statistics()  # the runner's own thread: read directly
        if self.token is None:
            return None  # no turn seen yet, and no trio thread to ask
        try:  # another thread: ask the runner's trio thread for the snapshot
            return trio.from_thread.run_sync(self.runner.statistics, trio_token=self.token)
        except trio.RunFinishedError:
            return None
