"""The benchmarks run end to end (quick mode), and their theoretical minimum is right."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import attrs
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import bench_sweep
from benchmarks.__main__ import main
from benchmarks.scenarios import FULL, QUICK, earliest_starts, max_ok_by, min_makespan
from benchmarks.strategies import STRATEGIES

if TYPE_CHECKING:
    from pathlib import Path


def test_quick_run_writes_tables_timelines_and_raw_results(tmp_path: Path) -> None:
    """`python -m benchmarks --quick --out DIR` writes every file, and every id is answered."""
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    for scenario in QUICK:
        assert (tmp_path / f"{scenario.name}.md").read_text().startswith("## ")
        assert (tmp_path / f"{scenario.name}.png").read_bytes()[:4] == b"\x89PNG"
    summary = (tmp_path / "summary.md").read_text()
    assert "python -m benchmarks --quick" in summary
    assert "## Targets" in summary
    raw = json.loads((tmp_path / "results.json").read_text())
    assert raw["ceiling"]["per_second"] > 0
    assert len(raw["runs"]) == len(STRATEGIES) * len(QUICK)
    assert all(run["all_answered"] for run in raw["runs"])
    assert raw["overhead"]["timings"]
    assert raw["deadline"]["results"]


def test_a_sweep_draws_the_same_servers_from_a_seed_and_tables_each_run() -> None:
    """`python -m benchmarks.bench_sweep` draws its servers from the seed alone, every
    one slow to read a new connection when asked, and reports each run in a row. Two
    small servers run for real here (the drawn ones take up to a minute each)."""
    drawn = bench_sweep.draw_servers(30, seed=5, connect_delay=False)
    assert drawn == bench_sweep.draw_servers(30, seed=5, connect_delay=False)
    assert drawn != bench_sweep.draw_servers(30, seed=6, connect_delay=False)
    assert {s.model for s in drawn} == {"bucket", "fixed", "sliding"}
    assert all(
        s.connect_delay > 0 for s in bench_sweep.draw_servers(30, seed=5, connect_delay=True)
    )
    small = [
        attrs.evolve(s, calls=6, rate=20.0, latency=0.01, retry_after_precise=True)
        for s in drawn[:2]
    ]
    told = next(s for s in STRATEGIES if s.name == "fanout_configured")
    results = trio.run(bench_sweep.sweep, small, told)
    assert [r.scenario for r in results] == [s.name for s in small]
    assert all(r.all_answered for r in results)
    table = bench_sweep.sweep_markdown(small, results)
    assert table.startswith("2 drawn servers; runs that drew a refusal beyond the targets: ")
    assert len(table.strip().splitlines()) == 4 + len(small)


@pytest.mark.parametrize(
    ("n", "rate", "burst", "latency", "concurrency", "expected"),
    [
        # 8 vs 5/s, burst 5: three calls wait 1/5 s each after the burst.
        (8, 5, 5, 0.05, None, 0.05 + 3 / 5),
        # 40 vs 10/s at 0.4 s, 4 in flight: ten waves of four, the last starting at 3.6 s.
        (40, 10, 10, 0.4, 4, 4.0),
        # 200 vs 50/s, burst 50: 150 more at 50/s.
        (200, 50, 50, 0.05, None, 3.05),
        # Fewer calls than the burst: one latency.
        (3, 5, 5, 0.25, None, 0.25),
        # Burst below the cap: waves of 3 every 10 s, and the rate delays the 2nd of the
        # last wave by 1 s: starts 0,1,2 | 10,11,12 | 20,21 -> 21 + 10.
        (8, 1, 1, 10, 3, 31.0),
        (0, 5, 5, 1.0, None, 0.0),
    ],
)
def test_min_makespan_hand_computed(
    n: int, rate: float, burst: int, latency: float, concurrency: int | None, expected: float
) -> None:
    """The closed form gives the hand-derived minimum for the scenarios and corner cases."""
    got = min_makespan(n, rate=rate, burst=burst, latency=latency, concurrency=concurrency)
    assert got == pytest.approx(expected)


def test_deadline_scenario_allows_29_calls_in_time() -> None:
    """40 calls vs 10/s burst 10 at 0.1 s: B + floor((D - L) * R) = 29 can finish by 2 s."""
    assert max_ok_by(2.0, 40, rate=10, burst=10, latency=0.1) == 29
    deadline = next(s for s in FULL if s.deadline is not None)
    assert deadline.max_ok == 29


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 80),
    rate=st.sampled_from([0.5, 1.0, 3.0, 5.0, 10.0, 50.0]),
    burst=st.integers(1, 12),
    latency=st.sampled_from([0.0, 0.01, 0.1, 0.4, 2.0]),
    concurrency=st.one_of(st.none(), st.integers(1, 8)),
)
def test_closed_form_matches_a_simulated_capped_bucket(
    n: int, rate: float, burst: int, latency: float, concurrency: int | None
) -> None:
    """The formula equals the earliest schedule of a real (capped) bucket and C slots."""
    schedule = earliest_starts(n, rate=rate, burst=burst, latency=latency, concurrency=concurrency)
    formula = min_makespan(n, rate=rate, burst=burst, latency=latency, concurrency=concurrency)
    assert formula == pytest.approx(schedule[-1] + latency, abs=1e-9)
