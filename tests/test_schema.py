"""Argument schemas read from signatures: what JSON Schema says, and the hints it refuses."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

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
