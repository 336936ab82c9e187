"""The README's runnable examples run as printed, and its reading order names every module."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"
# A python block that runs a program, and the plain block right after it, if any.
EXAMPLE = re.compile(r"```python\n(?P<code>.*?)```\n(?:\n```\n(?P<output>.*?)```)?", re.S)


def examples() -> list[tuple[str, str | None]]:
    found = []
    for match in EXAMPLE.finditer(README.read_text()):
        if "trio.run(" in match["code"]:
            found.append((match["code"], match["output"]))
    return found


@pytest.mark.parametrize(("code", "output"), examples())
def test_readme_example_runs_as_documented(code: str, output: str | None) -> None:
    """Each example exits 0 and, where the README shows output, prints exactly that."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    if output is not None:
        assert done.stdout == output


def test_readme_has_runnable_examples() -> None:
    """The README keeps at least its three runnable examples."""
    assert len(examples()) >= 3


def test_reading_order_places_every_module() -> None:
    """Every module of the package is named in the README's reading order."""
    readme = README.read_text()
    section = readme.split("### Reading order", 1)[1].split("\n## ", 1)[0]
    placed = set(re.findall(r"`([\w]+)`", section))
    package = README.parent / "fanout"
    modules = {path.stem for path in package.glob("*.py")}
    modules |= {path.stem for path in (package / "contrib").glob("*.py")} - {"__init__"}
    assert modules - {"__init__"} <= placed
