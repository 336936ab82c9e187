"""The README's examples run as printed; its reading order places every module and holds."""

from __future__ import annotations

import ast
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


# Run each example on trio's mock clock, which jumps to the next deadline once every
# task has waited half a second of real time: the times it prints are then exact,
# whatever else the machine is doing. (Not at once: a sync tool's worker thread, which
# trio cannot see, must finish before the clock may jump.)
ON_MOCK_CLOCK = """\
import functools, trio, trio.testing
trio.run = functools.partial(trio.run, clock=trio.testing.MockClock(autojump_threshold=0.5))
"""


@pytest.mark.parametrize(("code", "output"), examples())
def test_readme_example_runs_as_documented(code: str, output: str | None) -> None:
    """Each example exits 0 and, where the README shows output, prints exactly that."""
    done = subprocess.run(
        [sys.executable, "-c", ON_MOCK_CLOCK + code],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    if output is not None:
        assert done.stdout == output


def test_readme_has_runnable_examples() -> None:
    """The README keeps at least its three runnable examples."""
    assert len(examples()) >= 3


def _reading_order() -> dict[str, int]:
    """Each module the README's reading order names, with the number of its layer."""
    readme = README.read_text()
    section = readme.split("### Reading order", 1)[1].split("\n## ", 1)[0]
    layers = re.split(r"^(\d)\. ", section, flags=re.M)[1:]
    return {
        name: int(number)
        for number, text in zip(layers[::2], layers[1::2], strict=True)
        for name in re.findall(r"`(\w+)`", text)
    }


def _modules() -> dict[str, Path]:
    """Every module of the package and of fanout.contrib, by name (no two share one)."""
    package = README.parent / "fanout"
    paths = [*package.glob("*.py"), *(package / "contrib").glob("*.py")]
    return {path.stem: path for path in paths if path.stem != "__init__"}


def _runtime_imports(path: Path) -> set[str]:
    """The fanout modules ``path`` imports outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    return {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level and id(node) not in typing_only
    }


def test_reading_order_places_every_module() -> None:
    """Every module of the package is named in the README's reading order."""
    assert set(_modules()) - set(_reading_order()) == set()


def test_no_module_imports_a_layer_below_its_own_at_run_time() -> None:
    """Layers read top-down: run-time imports go to the same layer or to one above."""
    layer = _reading_order()
    downward = sorted(
        f"{module} (layer {layer[module]}) imports {target} (layer {layer[target]})"
        for module, path in _modules().items()
        for target in _runtime_imports(path)
        if target in layer and layer[target] > layer[module]
    )
    assert downward == []
