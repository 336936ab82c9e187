"""Strategies side by side: each scenario's calls, run by every strategy, in real time.

One server process per scenario, started with that scenario's limits; each
strategy run uses a fresh API key, so it meets a full bucket and an empty
in-flight count, exactly as if the server had been restarted. Before any of
it, the server's own unthrottled ceiling is measured, so that nobody mistakes
the harness for the limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import httpx
import stamina
import trio

from .harness import RecordingTransport, RunResult, fresh_key, run_server
from .strategies import STRATEGIES, Setting

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .scenarios import Scenario
    from .strategies import Strategy

__all__ = ["Ceiling", "measure_ceiling", "run_scenario"]

# Between runs, let requests a strategy abandoned (at a deadline) finish on the
# server, so they cannot compete for its CPU with the next strategy's.
_PAUSE = 0.3


@attrs.frozen
class Ceiling:
    """The server's throughput with no limits at all, from one client process."""

    requests: int
    seconds: float
    workers: int

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    def to_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "per_second": self.per_second}


async def measure_ceiling(*, seconds: float = 2.0, workers: int = 32) -> Ceiling:
    """Requests a second the server answers with ``--rate none``: ``workers`` keep-alive
    connections sending back to back for ``seconds``.

    The client shares the machine, so this is a floor on the server's true
    ceiling; either way it is far above every rate the scenarios use.
    """
    answered = 0

    async def hammer(client: httpx.AsyncClient) -> None:
        nonlocal answered
        while True:
            response = await client.get("/ceiling")
            answered += response.status_code == 200

    async with run_server(["--rate", "none", "--latency", "0"]) as url:
        limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
        async with httpx.AsyncClient(base_url=url, limits=limits) as client:
            await client.get("/warm-up")
            with trio.move_on_after(seconds):
                async with trio.open_nursery() as nursery:
                    for _ in range(workers):
                        nursery.start_soon(hammer, client)
    return Ceiling(answered, seconds, workers)


async def run_scenario(
    scenario: Scenario,
    strategies: Sequence[Strategy] = STRATEGIES,
    *,
    progress: Callable[[RunResult], None] | None = None,
    pause: float = _PAUSE,
) -> list[RunResult]:
    """Run ``scenario`` once per strategy against one server; one result per strategy."""
    # stamina logs every retry by default; hundreds of lines would drown the report.
    stamina.instrumentation.set_on_retry_hooks([])
    results = []
    async with run_server(scenario.server_args()) as url:
        for strategy in strategies:
            key = fresh_key(scenario.name, strategy.name)
            transport = RecordingTransport()
            origin = transport.start_clock()
            setting = Setting(scenario, url, key, origin, transport)
            outcomes = await strategy.run(setting)
            makespan = trio.current_time() - origin
            await transport.aclose()
            result = RunResult.build(
                scenario, strategy.name, strategy.label,
                call_ids=setting.ids(), outcomes=outcomes, sent=transport.sent, makespan=makespan,
            )  # fmt: skip
            results.append(result)
            if progress is not None:
                progress(result)
            await trio.sleep(pause)
    return results
