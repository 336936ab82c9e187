"""Arguments bound to a tool's hints: JSON kinds kept strict, and every misfit named."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from fanout import ArgumentError, Registry


def tag(
    name: str, pinned: bool, labels: frozenset[str], ids: set[int], mode: Literal["a", 1]
) -> None:
    """Tag something."""


SPEC = Registry().add(tag)
FIT = {"name": "x", "pinned": True, "labels": ["p", "q", "p"], "ids": [1, 2], "mode": "a"}


def test_fitting_arguments_are_structured_into_their_hints() -> None:
    """A list becomes a frozenset or a set; a bool stays a bool; a literal stays itself."""
    assert SPEC.bind(FIT) == {
        "name": "x", "pinned": True, "labels": frozenset({"p", "q"}), "ids": {1, 2}, "mode": "a",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"pinned": 1}, "pinned: expected true or false, got integer"),
        ({"mode": True}, "mode: expected one of 'a', 1, got True"),
        ({"mode": "b"}, "mode: expected one of 'a', 1, got 'b'"),
        ({"ids": {"one": 1}}, "ids: expected an array, got object"),
    ],
)
def test_a_misfit_is_named_with_what_was_expected(change: dict[str, Any], problem: str) -> None:
    """A value of the wrong JSON kind is an ArgumentError naming the argument and the kind."""
    bound = SPEC.bind(FIT | change)
    assert isinstance(bound, ArgumentError)
    assert bound.problems == (problem,)


def test_raw_text_never_fits() -> None:
    """Arguments that are a string (not a JSON object) are refused whatever they say."""
    assert SPEC.bind('{"name": "x"}') == ArgumentError(("the arguments are not a JSON object",))
