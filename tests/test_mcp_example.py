"""The MCP example runs against its real server and prints what the README shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
SHOWN = re.compile(r"```\n\$ python examples/mcp_turn.py\n(?P<output>.*?)```", re.S)


def test_mcp_example_prints_what_the_readme_shows() -> None:
    """examples/mcp_turn.py prints the README's output: all answered, hung one idle, server told."""
    shown = SHOWN.search((ROOT / "README.md").read_text())
    assert shown is not None
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mcp_turn.py")],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == shown["output"]
