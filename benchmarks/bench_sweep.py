"""Drawn servers in real time: how often one strategy draws a 429, and how fast it is.

The matrix (``python -m benchmarks``) runs the rows we chose. The promise is
"against any server", so this draws servers instead, seeded: every model the
throttling server has (a token bucket whose Reset means "until full" or
"until the next token", a fixed window, a sliding log), bursts of 2 to 30 at
2 to 100 a second, latencies of 10 to 300 ms, sometimes an in-flight cap,
jitter, or a server slow to read a new connection's first request, and every
header style and ``Retry-After`` format. Each runs one strategy (by default
fanout told the true limits, as the README says), against the server in its
own process, as the matrix does.

``tests/test_told_sweep.py`` draws the same kinds of server on a mock clock,
where every time is exact. What only real time shows is how a busy process,
a server that stalls, or a connection taken in late moves requests out of
step; so this is a count over many runs, not a bound.

Ratios are against the scenario's minimum, which is a lower bound where the
formula is not exact (a window with an in-flight cap or jitter): a large
ratio there may be the bound's, not the strategy's.

``python -m benchmarks.bench_sweep [--servers N] [--seed S] [--strategy NAME]
[--connect-delay]`` writes ``benchmarks/results/sweep-<strategy>.md``.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import trio

from .bench_strategies import run_scenario
from .report import X
from .scenarios import Model, Scenario
from .strategies import STRATEGIES

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .harness import RunResult
    from .strategies import Strategy

__all__ = ["draw_servers", "sweep", "sweep_markdown"]


def draw_servers(count: int, *, seed: int, connect_delay: bool) -> list[Scenario]:
    """``count`` servers and their calls; with ``connect_delay``, every one reads a new
    connection's first request late (10-50 ms), else a third of them 20 ms late."""
    rng = random.Random(seed)
    servers = []
    for i in range(count):
        model: Model = rng.choice(["bucket", "bucket", "fixed", "sliding"])
        headers: Literal["draft", "x", "ietf", "none"] = rng.choice(["draft", "x", "ietf", "none"])
        burst = rng.choice([2, 3, 5, 10, 20, 30])
        rate: float = rng.choice([5, 10, 20, 50, 100])
        if headers == "ietf":
            rate = burst / rng.choice([1, 2])  # the policy states a whole-second window
        latency = rng.choice([0.01, 0.05, 0.1, 0.3])
        late = rng.choice([0.01, 0.02, 0.05]) if connect_delay else rng.choice([0.0, 0.0, 0.02])
        calls = rng.choice([20, 50, 120])
        cap = rng.choice([None, None, 4, 16])
        retry_after: Literal["seconds", "http-date", "ms"] = rng.choice(
            ["seconds", "http-date", "ms"]
        )
        # A bucket's Reset: until full or until the next token (the IETF policy's is full).
        next_token = model == "bucket" and headers != "ietf" and rng.random() < 0.5
        servers.append(
            Scenario(
                name=f"drawn-{i}",
                title=f"drawn server {i}",
                calls=calls,
                rate=rate,
                burst=burst,
                latency=latency,
                max_in_flight=cap,
                retry_after=retry_after,
                model=model,
                reset="next" if next_token else "full",
                headers=headers,
                jitter=rng.choice([0.0, 0.0, 0.3 * latency]),
                connect_delay=late,
                seed=i,
            )
        )
    return servers


async def sweep(servers: Sequence[Scenario], strategy: Strategy) -> list[RunResult]:
    """One run of ``strategy`` against each server, in order."""
    results = []
    for server in servers:
        results.extend(await run_scenario(server, [strategy]))
    return results


def _refused(result: RunResult, server: Scenario) -> bool:
    """Whether the run drew more refusals (429s and 503s) than issue 13's targets allow:
    three while learning; told, none (a fixed window: one 429); a peer, none."""
    if result.strategy.startswith("fanout_learned"):
        return result.throttled + result.overloaded > 3
    told_window = result.strategy == "fanout_configured" and server.model == "fixed"
    return result.throttled > (1 if told_window else 0) or result.overloaded > 0


def sweep_markdown(servers: Sequence[Scenario], results: Sequence[RunResult]) -> str:
    """A summary line, then one row per server: its limits, the ratio and the refusals."""
    refused = sum(_refused(r, s) for s, r in zip(servers, results, strict=True))
    ratios = sorted(r.ratio for r in results)
    median = ratios[len(ratios) // 2] if ratios else float("nan")
    lines = [
        f"{len(results)} drawn servers; runs that drew a refusal beyond the targets: "
        f"**{refused}**; median ratio to the minimum {median:.2f}{X}.",
        "",
        "| server | model | headers | Retry-After | calls | ratio | 429 | 503 |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for server, result in zip(servers, results, strict=True):
        model = server.model if server.model != "bucket" else f"bucket ({server.reset})"
        limits = server.limits_text()
        if server.connect_delay:
            limits += f", new connections read {server.connect_delay * 1000:g} ms late"
        mark = " ←" if _refused(result, server) else ""
        lines.append(
            f"| {limits} | {model} | {server.headers} | {server.retry_after} | {server.calls} "
            f"| {result.ratio:.2f}{X} | {result.throttled}{mark} | {result.overloaded} |"
        )
    return "\n".join(lines) + "\n"


def _positive(text: str) -> int:
    count = int(text)
    if count < 1:
        raise argparse.ArgumentTypeError(f"at least one server, not {count}")
    return count


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sweep")
    parser.add_argument("--servers", type=_positive, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--strategy", default="fanout_configured", choices=[s.name for s in STRATEGIES]
    )
    parser.add_argument("--connect-delay", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    strategy = next(s for s in STRATEGIES if s.name == args.strategy)
    servers = draw_servers(args.servers, seed=args.seed, connect_delay=args.connect_delay)
    results = trio.run(sweep, servers, strategy)
    kind = "every one slow to read a new connection" if args.connect_delay else "any"
    text = (
        f"# {strategy.label} against drawn servers\n\n"
        f"`python -m benchmarks.bench_sweep --servers {args.servers} --seed {args.seed} "
        f"--strategy {args.strategy}{' --connect-delay' if args.connect_delay else ''}`: "
        f"servers of {kind} kind, real time, one run each.\n\n" + sweep_markdown(servers, results)
    )
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "-slow-connections" if args.connect_delay else ""
    (args.out / f"sweep-{args.strategy}{suffix}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
