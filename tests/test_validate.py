"""The checks every constructor makes: numbers that work, never a bool, named in the error."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

from fanout import ConfigurationError
from fanout._validate import (
    at_least,
    flag,
    non_empty_text,
    one_of,
    optional_at_least,
    optional_positive,
    require_at_least,
    require_non_negative,
    require_positive,
)

NOT_NUMBERS = [True, False, "1", None, math.nan]


@pytest.mark.parametrize("value", [*NOT_NUMBERS, 0, -1, math.inf, -math.inf])
def test_positive_means_finite_and_above_zero(value: Any) -> None:
    """0, negatives, infinities, NaN, bools and strings are refused, naming the setting."""
    with pytest.raises(ConfigurationError, match=r"^rate must be a positive number, not "):
        require_positive("rate", value)


@pytest.mark.parametrize("value", [*NOT_NUMBERS, -0.5, math.inf])
def test_non_negative_means_finite_and_at_least_zero(value: Any) -> None:
    """Zero is allowed; below it, infinity, NaN and non-numbers are not."""
    with pytest.raises(ConfigurationError, match=r"^slack must be a finite number >= 0, not "):
        require_non_negative("slack", value)


def test_accepted_numbers_come_back_as_floats() -> None:
    """An int is a number (and comes back as a float); zero is non-negative."""
    assert require_positive("rate", 3) == 3.0
    assert isinstance(require_positive("rate", 3), float)
    assert require_non_negative("slack", 0) == 0.0


@pytest.mark.parametrize("value", [True, 1.0, "2", 0])
def test_at_least_means_a_whole_number(value: Any) -> None:
    """A float, a bool, a string or a number below the floor is refused."""
    with pytest.raises(ConfigurationError, match=r"^burst must be a whole number >= 1, not "):
        require_at_least("burst", value, 1)
    assert require_at_least("burst", 1, 1) == 1


@attrs.frozen
class _Knobs:
    count: int = attrs.field(default=1, validator=at_least(1))
    limit: int | None = attrs.field(default=None, validator=optional_at_least(2))
    wait: float | None = attrs.field(default=None, validator=optional_positive)
    on: bool = attrs.field(default=True, validator=flag)
    mode: str = attrs.field(default="a", validator=one_of(("a", "b")))
    name: str = attrs.field(default="x", validator=non_empty_text)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("count", 0, "count must be a whole number >= 1, not 0"),
        ("limit", 1, "limit must be a whole number >= 2, not 1"),
        ("wait", 0, "wait must be a positive number, not 0"),
        ("on", 1, "on must be True or False, not 1"),
        ("mode", "c", "mode must be one of a, b, not 'c'"),
        ("name", "", "name must be a non-empty string, not ''"),
    ],
)
def test_the_attrs_spellings_name_their_field(field: str, value: Any, words: str) -> None:
    """Each validator refuses with the field's own name; None passes the optional ones."""
    with pytest.raises(ConfigurationError) as refused:
        _Knobs(**{field: value})
    assert str(refused.value) == words
    assert _Knobs(limit=None, wait=None) == _Knobs()
