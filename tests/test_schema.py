"""Argument schemas read from signatures: what JSON Schema says, and the hints it refuses."""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

import fanout
from fanout import Registry


def _parameters(fn: Any) -> dict[str, Any]:
    return Registry().add(fn).definition().parameters


class _Opaque:
    """A class with no fields JSON could carry."""


class _Pairs(enum.Enum):
    A = (1, 2)


@dataclasses.dataclass
class _Node:
    child: _Node | None = None


def int_keys(mapping: dict[int, str]) -> None:
    """Keys that JSON cannot spell."""


def opaque(value: _Opaque) -> None:
    """A class with no schema."""


def pairs(pair: _Pairs) -> None:
    """An enum whose values are not JSON scalars."""


def node(tree: _Node) -> None:
    """A dataclass that contains itself."""


def unresolved(value: Missing) -> None:  # type: ignore[name-defined]  # noqa: F821
    """A hint naming a class that does not exist."""


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (int_keys, "dict[int, str] has keys that are not strings; JSON keys are"),
        (opaque, "the hint _Opaque has no JSON Schema"),
        (pairs, "the values ((1, 2),) are not all JSON scalars"),
        (node, "_Node contains itself"),
        (unresolved, "name 'Missing' is not defined"),
    ],
)
def test_a_hint_json_schema_cannot_describe_is_a_configuration_error(fn: Any, words: str) -> None:
    """The definition names the tool, the parameter's problem and the way out (schema=)."""
    with pytest.raises(fanout.ConfigurationError) as raised:
        _parameters(fn)
    assert words in str(raised.value)
    assert "pass schema= to describe" in str(raised.value)


def test_sets_are_arrays_of_unique_items() -> None:
    """set and frozenset hints are arrays with uniqueItems and their item schema."""

    def tags(names: frozenset[str], ids: set[int]) -> None:
        """Tag things."""

    properties = _parameters(tags)["properties"]
    unique = {"type": "array", "uniqueItems": True}
    assert properties["names"] == {**unique, "items": {"type": "string"}}
    assert properties["ids"] == {**unique, "items": {"type": "integer"}}


def test_keyword_arguments_are_additional_properties_of_their_hint() -> None:
    """**rest: int lets any other key through, as long as its value is an integer."""

    def extra(**rest: int) -> None:
        """Take anything."""

    assert _parameters(extra) == {
        "type": "object", "properties": {}, "additionalProperties": {"type": "integer"},
    }  # fmt: skip


def test_a_default_json_cannot_spell_is_left_unsaid_and_the_parameter_optional() -> None:
    """An object() default is not written into the schema, and the parameter is not required."""
    sentinel = object()

    def odd_default(limit: int = sentinel) -> None:  # type: ignore[assignment]
        """Odd."""

    assert _parameters(odd_default) == {
        "type": "object", "properties": {"limit": {"type": "integer"}},
        "additionalProperties": False,
    }  # fmt: skip


def test_the_empty_tuple_is_an_array_of_no_items() -> None:
    """tuple[()] allows no items; a bare tuple or list allows any; a bare set unique ones."""

    def shapes(none: tuple[()], some: tuple, items: list, unique: set) -> None:  # type: ignore[type-arg]
        """Shapes."""

    properties = _parameters(shapes)["properties"]
    assert properties == {
        "none": {"type": "array", "maxItems": 0},
        "some": {"type": "array"},
        "items": {"type": "array"},
        "unique": {"type": "array", "uniqueItems": True},
    }


def test_keyword_arguments_of_any_value_leave_the_object_open() -> None:
    """**rest: Any says nothing of additional properties: any key, any value."""

    def anything(**rest: Any) -> None:
        """Take anything."""

    assert _parameters(anything) == {"type": "object", "properties": {}}


def test_positional_only_parameters_with_defaults_are_not_offered() -> None:
    """A parameter JSON cannot name is left at its default and out of the schema."""

    def search(page: int = 1, /, *, query: str) -> None:
        """Search."""

    assert _parameters(search) == {
        "type": "object", "properties": {"query": {"type": "string"}},
        "required": ["query"], "additionalProperties": False,
    }  # fmt: skip


@pytest.mark.parametrize("hint", [Callable[[int], int], TypeVar("T")])
def test_a_hint_that_is_not_a_class_and_has_no_schema_is_refused(hint: Any) -> None:
    """A callable or a type variable has no JSON Schema: ConfigurationError naming the hint."""

    def tool(value: Any) -> None:
        """Tool."""

    tool.__annotations__["value"] = hint
    with pytest.raises(fanout.ConfigurationError, match=f"the hint {re.escape(repr(hint))} has no"):
        _parameters(tool)


@dataclasses.dataclass
class _Inner:
    """An inner thing."""

    size: int


@dataclasses.dataclass
class _Outer:
    """An outer thing.

    Args:
        inner: the outer class's words for its field.
        ghost: documents no field, and is dropped.
    """

    inner: _Inner


def test_a_field_keeps_its_own_class_description_over_the_outer_docstring() -> None:
    """A record field typed by a described class keeps that class's summary; words for a
    name that is not a field are dropped."""

    def place(where: _Outer) -> None:
        """Place."""

    outer = _parameters(place)["properties"]["where"]
    assert outer["description"] == "An outer thing."
    assert set(outer["properties"]) == {"inner"}
    assert outer["properties"]["inner"]["description"] == "An inner thing."


def test_a_parameter_description_runs_on_across_a_blank_line() -> None:
    """Google-style Args: a parameter's words continue after a blank line in its entry."""

    def search(query: str, limit: int) -> None:
        """Search.

        Args:
            query: what to look for,
                in words.

                More about the query.
            limit: how many.
        """

    properties = _parameters(search)["properties"]
    assert properties["query"]["description"] == "what to look for, in words. More about the query."
    assert properties["limit"]["description"] == "how many."
