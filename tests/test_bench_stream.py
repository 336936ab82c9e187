"""The streaming benchmark runs end to end (``--quick``) and its timeline is what it claims."""

from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks.bench_stream import _timeline, main

if TYPE_CHECKING:
    from pathlib import Path


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
