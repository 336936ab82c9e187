"""The streaming benchmark runs end to end (``--quick``) and its timeline is what it claims."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from benchmarks.bench_stream import _one, _timeline, best_possible, main
from fanout._learning import TOGETHER

if TYPE_CHECKING:
    from pathlib import Path

    from fanout.testing import HeaderStyle


def test_blocks_close_evenly_and_the_message_ends_at_t() -> None:
    """Block k of N closes at T·(k+1)/N; the message's last events are sent at T."""
    events = _timeline(8, 2.0)
    closes = [at for at, name, _ in events if name == "content_block_stop"]
    assert closes == [0.25 * (k + 1) for k in range(8)]
    assert [at for at, name, _ in events[-2:]] == [2.0, 2.0]
    assert [name for _, name, _ in events[-2:]] == ["message_delta", "message_stop"]


def test_quick_run_writes_the_table_and_the_figure(tmp_path: Path) -> None:
    """`python -m benchmarks.bench_stream --quick --out DIR`: every call ok, both files."""
    main(["--quick", "--out", str(tmp_path)])
    table = (tmp_path / "stream.md").read_text()
    assert "| 4 | 0.4 s |" in table
    assert (tmp_path / "stream.png").stat().st_size > 0


def test_the_best_possible_waits_for_each_block_and_the_apis_bucket() -> None:
    """4/s, burst 2, 50 ms: alone, two at once then one per 0.25 s; streamed, the same behind
    the first block's close, or each block's close when they come slower than tokens."""
    assert best_possible("alone", 8, 0.5) == 1.5 + 0.05
    assert best_possible("streaming", 8, 0.5) == 0.0625 + 1.5 + 0.05
    assert best_possible("streaming", 8, 2.0) == 2.0 + 0.05
    assert best_possible("whole", 8, 0.5) == 0.5 + 1.5 + 0.05


@pytest.mark.parametrize("headers", ["openai", "none"])
@pytest.mark.parametrize(("n", "seconds"), [(8, 0.5), (8, 2.0)])
@pytest.mark.parametrize("mode", ["alone", "streaming", "whole"])
def test_on_virtual_time_each_mode_meets_the_best_possible(
    mode: str, n: int, seconds: float, headers: HeaderStyle
) -> None:
    """The benchmark's own runs, on MockClock: no 429, and the latency is the best possible,
    or up to ``TOGETHER`` more where a call's token came before any answer did: the first
    request holds that margin for how unevenly a server may take in new connections
    (`fanout._window.Arrivals.latest_read`), which no answer has shown yet."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    elapsed, refused = trio.run(_one, mode, n, seconds, headers, clock=clock)
    assert refused == 0
    best = best_possible(mode, n, seconds)
    assert best - 1e-9 <= elapsed <= best + TOGETHER + 1e-9
