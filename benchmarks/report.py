"""Markdown tables and PNG timelines from the benchmark records.

Everything here is a pure function of the records (plus matplotlib's Agg
backend for the PNGs), so a report can be regenerated from
``results.json`` without re-running anything.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from .bench_deadline import DeadlineReport
    from .bench_overhead import OverheadReport
    from .bench_strategies import Ceiling
    from .harness import RunResult
    from .scenarios import Scenario

__all__ = [
    "deadline_table",
    "headline_table",
    "matrix_table",
    "overhead_tables",
    "scenario_markdown",
    "summary_markdown",
    "targets_table",
    "timeline_png",
]

# Typography for the tables, spelled as escapes so no look-alike hides in the source.
X = "\N{MULTIPLICATION SIGN}"
DASH = "\N{EN DASH}"

_STATUS_COLOURS = {200: "#2a9d4b", 429: "#d62828", 503: "#f77f00", None: "#8d99ae"}


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A GitHub markdown table; ``align`` is one letter per column (l or r)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _ratio(result: RunResult) -> str:
    return f"{result.ratio:.2f}{X}" if math.isfinite(result.ratio) else DASH


def scenario_markdown(scenario: Scenario, results: Sequence[RunResult], png: str) -> str:
    """One scenario: its limits, the minimum and how it was derived, one row per strategy."""
    header = [
        "strategy", "makespan", f"{X} min", "requests", "429", "503",
        "ok", "failed", "past deadline", "every id answered", "answers",
    ]  # fmt: skip
    rows = []
    for r in results:
        rows.append(
            [
                r.label,
                f"{r.makespan:.3f} s",
                _ratio(r),
                str(r.requests),
                str(r.throttled),
                str(r.overloaded),
                str(r.ok) if r.ok_in_time is None else f"{r.ok} ({r.ok_in_time} in time)",
                str(r.failed),
                DASH if r.past_deadline is None else str(r.past_deadline),
                _yes(r.all_answered),
                ", ".join(f"{k} {v}" for k, v in r.statuses.items()),
            ]
        )
    lines = [
        f"## {scenario.title}",
        "",
        f"{scenario.calls} calls, one request each. Server: {scenario.limits_text()}; "
        f"Retry-After as {scenario.retry_after}"
        + (" (fractional)" if scenario.retry_after_precise else " (whole seconds)")
        + ".",
        "",
    ]
    if scenario.why:
        lines += [scenario.why, ""]
    lines += [f"Theoretical minimum makespan: {scenario.formula_text()}.", ""]
    if scenario.deadline is not None:
        lines += [
            f"With a {scenario.deadline:g} s deadline no client can answer more than "
            f'{scenario.max_ok} of the {scenario.calls} calls ok in time; "{X} min" compares '
            'with the time to run all of them, which the deadline forbids. "Past deadline" '
            "counts answers given more than 10 ms after it (a call answered ok after its "
            "deadline is ok, but not in time).",
            "",
        ]
    lines += [_table(header, rows, "l" + "r" * 8 + "ll"), "", f"![timeline]({png})", ""]
    return "\n".join(lines)


def timeline_png(scenario: Scenario, results: Sequence[RunResult], path: Path) -> None:
    """Request starts over time, one panel per strategy, against the allowed-rate line.

    A dot is one request at its start time. A green dot (admitted) stands at
    the number of requests admitted so far, so green dots stay on or under
    the dashed line, the most the server's bucket admits by time t
    (``B + R·t``). A red or orange dot (refused) stands at the number of
    requests sent so far: the load offered, which the naive strategies push
    far above the line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    panels = len(results)
    fig, axes = plt.subplots(
        panels, 1, figsize=(8, 1.55 * panels + 0.8), sharex=True, squeeze=False
    )
    horizon = max([r.makespan for r in results] + [scenario.min_makespan]) * 1.02
    for ax, result in zip(axes[:, 0], results, strict=True):
        admitted: list[tuple[float, int]] = []
        refused: list[tuple[float, int, str]] = []
        for sent, (start, status) in enumerate(sorted(result.starts, key=lambda s: s[0]), 1):
            if status == 200:
                admitted.append((start, len(admitted) + 1))
            else:
                refused.append((start, sent, _STATUS_COLOURS.get(status, "#8d99ae")))
        if admitted:
            ax.scatter(*zip(*admitted, strict=True), s=6, c=_STATUS_COLOURS[200], linewidths=0)
        if refused:
            xs_, ys_, colours = zip(*refused, strict=True)
            ax.scatter(xs_, ys_, s=6, c=list(colours), linewidths=0)
        xs = [0.0, horizon]
        ax.plot(xs, [scenario.burst + scenario.rate * x for x in xs], "--", color="#264653", lw=1)
        ax.set_xlim(0, horizon)
        ax.set_ylim(0, max(len(result.starts), scenario.calls) * 1.08 + 1)
        if scenario.deadline is not None:
            ax.axvline(scenario.deadline, color="#6c757d", lw=1, ls=":")
        ax.axvline(scenario.min_makespan, color="#2a9d8f", lw=0.8, alpha=0.6)
        ax.set_title(
            f"{result.label}: {result.makespan:.2f} s ({_ratio(result)}), "
            f"{result.requests} requests, {result.throttled} {X} 429, {result.overloaded} {X} 503",
            fontsize=8,
            loc="left",
        )
        ax.tick_params(labelsize=7)
        ax.set_ylabel("requests", fontsize=7)
    axes[-1, 0].set_xlabel("seconds since the turn began", fontsize=8)

    def dot(status: int, label: str) -> Line2D:
        return Line2D([], [], ls="", marker="o", ms=4, color=_STATUS_COLOURS[status], label=label)

    legend = [
        dot(200, "200: n-th admitted"),
        dot(429, "429: n-th sent"),
        dot(503, "503: n-th sent"),
        Line2D([], [], ls="--", color="#264653", label="allowed: B + R·t"),
        Line2D([], [], color="#2a9d8f", alpha=0.6, label="theoretical minimum"),
    ]
    if scenario.deadline is not None:
        legend.append(Line2D([], [], color="#6c757d", ls=":", label="deadline"))
    top = 1 - 0.75 / fig.get_figheight()  # room for the title and the legend, in inches
    fig.suptitle(f"{scenario.title}: request starts", fontsize=10, y=0.995)
    fig.legend(
        handles=legend,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.3 / fig.get_figheight()),
        ncol=(len(legend) + 1) // 2,
        fontsize=7,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cell(scenario: Scenario, result: RunResult) -> str:
    """A headline cell: speed against the minimum (or ok against the possible), refusals."""
    refused = result.throttled + result.overloaded
    if scenario.deadline is not None:
        text = f"{result.ok_in_time}/{scenario.max_ok} ok in time, {result.past_deadline} late"
    else:
        text = f"{_ratio(result)}"
        if result.failed:
            text += f", {result.failed} failed"
    text += f", {refused} refused" if refused else ", 0 refused"
    if not result.all_answered:
        text += ", ids lost"
    return text


def headline_table(scenarios: Sequence[Scenario], results: Sequence[RunResult]) -> str:
    """Strategies down, scenarios across: the one table a reader needs."""
    by_key = {(r.scenario, r.strategy): r for r in results}
    strategies: list[tuple[str, str]] = []
    for r in results:
        if (r.strategy, r.label) not in strategies:
            strategies.append((r.strategy, r.label))
    header = ["strategy", *[s.title for s in scenarios]]
    rows = [
        [label, *[_cell(s, by_key[(s.name, name)]) for s in scenarios if (s.name, name) in by_key]]
        for name, label in strategies
    ]
    minimum = ["*theoretical minimum*"]
    for s in scenarios:
        if s.deadline is None:
            minimum.append(f"*{s.min_makespan:.2f} s*")
        else:
            minimum.append(f"*{s.max_ok}/{s.calls} can finish*")
    return _table(header, [*rows, minimum], "l" * (len(scenarios) + 1))


_FANOUT = ("fanout_configured", "fanout_learned", "fanout_learned_uncapped")


def _matrix_cell(scenario: Scenario, result: RunResult) -> str:
    if scenario.deadline is not None:
        return f"{result.ok_in_time}/{scenario.max_ok} ok, {result.past_deadline} late"
    text = f"{_ratio(result)}, {result.throttled} {X} 429"
    if result.overloaded:
        text += f", {result.overloaded} {X} 503"
    if result.failed:
        text += f", {result.failed} failed"
    return text


def _best_alternative(scenario: Scenario, runs: Sequence[RunResult]) -> RunResult | None:
    """The alternative a user would pick here: most answered ok, then fastest."""
    others = [r for r in runs if r.strategy not in _FANOUT]
    if not others:
        return None
    if scenario.deadline is not None:
        return max(others, key=lambda r: (r.ok_in_time or 0, -(r.past_deadline or 0)))
    return min(others, key=lambda r: (r.failed, r.ratio))


def _targets(scenario: Scenario, told: RunResult, learned: RunResult, best: RunResult) -> str:
    """Issue 13's targets for one cell row: told, learning, ahead of the best alternative."""
    if scenario.deadline is not None:
        goal = 0.95 * scenario.max_ok
        met = [
            (told.ok_in_time or 0) >= goal and told.past_deadline == 0,
            (learned.ok_in_time or 0) >= goal and learned.past_deadline == 0,
            min(told.ok_in_time or 0, learned.ok_in_time or 0) >= (best.ok_in_time or 0),
        ]
    else:
        allowed = 1 if scenario.model == "fixed" else 0
        met = [
            told.ratio <= 1.05 and told.throttled <= allowed and not told.failed,
            learned.ratio <= 1.20 and learned.throttled <= 3 and not learned.failed,
            max(told.ratio, learned.ratio) <= best.ratio or bool(best.failed),
        ]
    return " / ".join("yes" if flag else "**no**" for flag in met)


def matrix_table(scenarios: Sequence[Scenario], results: Sequence[RunResult]) -> str:
    """The server matrix: one row per server model; fanout told, learning, the best peer.

    Cells: makespan over the theoretical minimum and the 429s (and 503s)
    caused; for the deadline row, calls answered ok in time out of the most
    that can finish, and calls answered late. The last column says which of
    issue 13's targets the row meets: told (<= 1.05, no 429, a fixed window
    one), learning (<= 1.20, <= 3 429s), ahead of the best alternative.
    """
    rows = []
    for scenario in scenarios:
        runs = [r for r in results if r.scenario == scenario.name]
        by_strategy = {r.strategy: r for r in runs}
        told, learned = by_strategy.get("fanout_configured"), by_strategy.get("fanout_learned")
        best = _best_alternative(scenario, runs)
        if told is None or learned is None or best is None:
            continue
        minimum = (
            f"{scenario.max_ok}/{scenario.calls} can finish"
            if scenario.deadline is not None
            else f"{scenario.min_makespan:.2f} s"
        )
        rows.append([
            scenario.title, minimum, _matrix_cell(scenario, told),
            _matrix_cell(scenario, learned),
            f"{best.label}: {_matrix_cell(scenario, best)}",
            _targets(scenario, told, learned, best),
        ])  # fmt: skip
    header = ["server", "minimum", "fanout, limits told", "fanout, learning",
              "best alternative", "targets met (told / learning / ahead)"]  # fmt: skip
    return _table(header, rows, "llllll")


def overhead_tables(report: OverheadReport) -> str:
    """The headline size in every configuration, then the growth curve."""
    from .bench_overhead import CONFIGS

    n = report.headline_calls
    rows = []
    for config, (label, _) in CONFIGS.items():
        timing = report.timing(config, n)
        peak = report.memory.get(config)
        rows.append(
            [
                label,
                f"{timing.us_per_call:.1f} µs",
                f"{report.ratio(config):.2f}{X}",
                DASH
                if peak is None
                else f"{peak / 2**20:.1f} MiB ({peak / n / 1024:.2f} KiB/call)",
            ]
        )
    first = _table(["configuration", "per call", f"{X} bare nursery", "peak memory"], rows)
    growth = []
    for size in report.sizes:
        bare, fan = report.timing("bare", size), report.timing("fanout_trace", size)
        growth.append(
            [
                f"{size:,}",
                f"{bare.us_per_call:.1f} µs",
                f"{fan.us_per_call:.1f} µs",
                f"{report.ratio('fanout_trace', size):.2f}{X}",
                f"{fan.seconds:.3f} s",
            ]
        )
    second = _table(
        ["calls in one turn", "bare nursery", "fanout (default)", "ratio", "fanout turn"], growth
    )
    return (
        f"{n:,} no-op calls in one turn (median of {report.timing('bare', n).repeats} runs):\n\n"
        f"{first}\n\nGrowth (median of fewer runs above {n:,}):\n\n{second}\n"
    )


def deadline_table(report: DeadlineReport) -> str:
    rows = []
    for r in report.results:
        s = r.summary()
        rows.append(
            [
                r.mode,
                str(r.turns),
                str(r.calls_per_turn),
                f"{r.timeout:g} s",
                f"{s['p50'] * 1000:.2f} ms",
                f"{s['p99'] * 1000:.2f} ms",
                f"{s['max'] * 1000:.2f} ms",
                f"{r.answer_late_max * 1000:.2f} ms",
                _yes(r.all_timed_out),
            ]
        )
    header = [
        "turns run", "turns", "calls/turn", "turn timeout",
        "p50 late", "p99 late", "max late", "latest answer", "all answered timed_out",
    ]  # fmt: skip
    return _table(header, rows, "l" + "r" * 7 + "l")


def summary_markdown(
    *,
    command: str,
    machine: dict[str, Any],
    ceiling: Ceiling | None,
    scenarios: Sequence[Scenario],
    results: Sequence[RunResult],
    overhead: OverheadReport | None,
    deadlines: DeadlineReport | None,
    elapsed: float,
    notes: Sequence[str] = (),
    redis: str | None = None,
) -> str:
    """``summary.md``: the headline table, the machine, the command, and pointers."""
    lines = [
        "# fanout benchmarks: summary",
        "",
        f"Command: `{command}` ({elapsed:.0f} s). Machine: {machine['platform']}, "
        f"{machine['cpu_count']} CPUs, {machine['implementation']} {machine['python']}, "
        f"trio {machine['trio']}, httpx {machine['httpx']}.",
        "",
    ]
    if ceiling is not None:
        lines += [
            f"Server ceiling (no limits, {ceiling.workers} keep-alive connections from one "
            f"client process): **{ceiling.per_second:,.0f} requests/s**, far above every "
            "scenario's rate: the limits below are the server's configured ones, not the harness.",
            "",
        ]
    if results:
        lines += [
            "## The server matrix",
            "",
            "One row per server model (see `fanout/_throttle_server.py`), the same calls run by "
            "every strategy. Cells: makespan as a multiple of the theoretical minimum and the "
            "429s (503s) it caused; the deadline row counts calls answered ok in time and calls "
            "answered late. The best alternative is the peer with the fewest failures, then the "
            "fastest.",
            "",
            matrix_table(scenarios, results),
            "",
            "## Strategies",
            "",
            "Each cell: makespan as a multiple of the theoretical minimum (deadline scenario: "
            "calls answered ok out of the most that can finish in time, and calls answered "
            "late), then requests the server refused (429 + 503), and calls that failed.",
            "",
            headline_table(scenarios, results),
            "",
            "Per-scenario tables with every column, and timelines: "
            + ", ".join(f"[{s.title}]({s.name}.md)" for s in scenarios)
            + ".",
            "",
        ]
    if results or overhead is not None:
        lines += [
            "## Targets",
            "",
            targets_table(scenarios, results, overhead, deadlines),
            "",
        ]
    if overhead is not None:
        lines += ["## Overhead", "", overhead_tables(overhead), ""]
    if deadlines is not None:
        lines += [
            "## Deadline precision",
            "",
            "How long after its deadline each `run_turn` returned (real time), for turns whose "
            "tools all hang (async tools sleeping forever and one sync tool stuck in a thread).",
            "",
            deadline_table(deadlines),
            "",
        ]
    if redis is not None:
        lines += ["## Shared limits on Redis", ""]
        if redis == "ok":
            lines.append(
                "What a reservation costs on Redis, and how exactly four processes sharing "
                "one limit hold its rate: [redis.md](redis.md) (`benchmarks/bench_redis.py`)."
            )
        else:
            lines.append(f"`benchmarks/bench_redis.py` {redis}.")
        lines.append("")
    if notes:
        lines += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    return "\n".join(lines)


def targets_table(
    scenarios: Sequence[Scenario],
    results: Sequence[RunResult],
    overhead: OverheadReport | None,
    deadlines: DeadlineReport | None,
) -> str:
    """The issue's targets, each against what this run measured: met or missed."""
    by_key = {(r.scenario, r.strategy): r for r in results}
    timed = [s for s in scenarios if s.deadline is None]
    rows: list[list[str]] = []

    def runs(strategy: str, pool: Sequence[Scenario]) -> list[RunResult]:
        return [by_key[(s.name, strategy)] for s in pool if (s.name, strategy) in by_key]

    configured, learned = runs("fanout_configured", scenarios), runs("fanout_learned", scenarios)
    if configured:
        # A fixed window may cost one 429 per scope (issue 13): told nothing of its edge.
        allowed = {s.name: 1 if s.model == "fixed" else 0 for s in scenarios}
        over = [r for r in configured if r.throttled > allowed[r.scenario]]
        throttled = sum(r.throttled for r in configured)
        rows.append(["limits told: no 429 (a fixed window: at most one)",
                     f"{throttled} in all", _met(not over)])  # fmt: skip
        worst = max((r.ratio for r in runs("fanout_configured", timed)), default=math.nan)
        rows.append([f"limits told: ≤ 1.05{X} the minimum", f"worst {worst:.2f}{X}",
                     _met(worst <= 1.05)])  # fmt: skip
    if learned:
        worst = max((r.ratio for r in runs("fanout_learned", timed)), default=math.nan)
        most = max(r.throttled + r.overloaded for r in learned)
        rows.append([f"learning: ≤ 1.20{X} the minimum", f"worst {worst:.2f}{X}",
                     _met(worst <= 1.20)])  # fmt: skip
        rows.append(["learning: ≤ 3 429s (or 503s) per scope", f"most {most}",
                     _met(most <= 3)])  # fmt: skip
    for scenario in scenarios:
        if scenario.deadline is None:
            continue
        for result in runs("fanout_configured", [scenario]) + runs("fanout_learned", [scenario]):
            ok = result.ok_in_time or 0
            goal = 0.95 * scenario.max_ok
            rows.append([f"{result.label}: ≥ 95 % of what can finish by the deadline",
                         f"{ok}/{scenario.max_ok}", _met(ok >= goal)])  # fmt: skip
    if overhead is not None:
        ratio = overhead.ratio("fanout_trace")
        rows.append([f"overhead per call ≤ 2{X} a bare nursery", f"{ratio:.1f}{X} (default)",
                     _met(ratio <= 2)])  # fmt: skip
    fanout_runs = configured + learned
    deadline_runs = [r for r in fanout_runs if r.past_deadline is not None]
    if deadline_runs or deadlines is not None:
        late = sum(r.past_deadline or 0 for r in deadline_runs)
        text = f"{late} calls answered > 10 ms late"
        if deadlines is not None:
            worst_ms = max(r.answer_late_max for r in deadlines.results) * 1000
            text += f"; hung turns answered ≤ {worst_ms:.1f} ms after the deadline"
        rows.append(["no call past its deadline", text, _met(late == 0)])
    return _table(["target", "measured", "met"], rows, "lll")


def _met(flag: bool) -> str:
    return "yes" if flag else "**missed**"
