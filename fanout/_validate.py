"""The checks every public constructor makes, written once.

Configuration fails closed: a value that cannot work (a negative timeout, a
NaN rate, a string where a number belongs) is a ``ConfigurationError`` at
construction, never a surprise in the middle of a turn. Booleans are not
numbers here, though Python lets them pass as ints.

Each check exists in two spellings: ``require_*(name, value)`` for plain
``__init__`` methods, and an attrs validator of the same rule.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any, TypeVar

from ._canonical import shown
from ._exceptions import ConfigurationError, FanoutError

if TYPE_CHECKING:
    import attrs

E = TypeVar("E", bound=enum.Enum)

__all__ = [
    "at_least",
    "finite",
    "finite_non_negative",
    "flag",
    "member_of",
    "non_empty_text",
    "one_of",
    "optional_at_least",
    "optional_count",
    "optional_non_negative",
    "optional_positive",
    "positive",
    "require_at_least",
    "require_non_negative",
    "require_one_of",
    "require_positive",
]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def finite(value: object) -> float | None:
    """``value`` as a finite float, or None: not a number, NaN, infinite, or an int too
    large for a float (``10**400 < math.inf`` holds, and ``float()`` of it raises)."""
    if not _is_number(value):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def require_positive(name: str, value: object) -> float:
    """A finite number > 0."""
    number = finite(value)
    if number is None or not number > 0:
        raise ConfigurationError(f"{name} must be a positive number, not {shown(value)}")
    return number


def require_non_negative(name: str, value: object) -> float:
    """A finite number >= 0."""
    number = finite(value)
    if number is None or not number >= 0:
        raise ConfigurationError(f"{name} must be a finite number >= 0, not {shown(value)}")
    return number


def require_at_least(name: str, value: object, least: int) -> int:
    """A whole number >= ``least``."""
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
        raise ConfigurationError(f"{name} must be a whole number >= {least}, not {value!r}")
    return value


def _attrs_rule(check: Any) -> Any:
    def validator(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        check(attribute.name, value)

    return validator


positive = _attrs_rule(require_positive)
finite_non_negative = _attrs_rule(require_non_negative)


def optional_positive(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """None, or a finite number > 0."""
    if value is not None:
        require_positive(attribute.name, value)


def optional_count(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """None, or a finite number >= 1 (a burst, a window's limit: fractions allowed)."""
    if value is None:
        return
    number = finite(value)
    if number is None or not number >= 1:
        raise ConfigurationError(
            f"{attribute.name} must be a finite number >= 1, not {shown(value)}"
        )


def optional_non_negative(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """None, or a finite number >= 0."""
    if value is not None:
        require_non_negative(attribute.name, value)


def optional_at_least(least: int) -> Any:
    """An attrs validator: None, or a whole number >= ``least``."""

    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not None:
            require_at_least(attribute.name, value, least)

    return check


def flag(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """``True`` or ``False``, nothing truthy in their place."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{attribute.name} must be True or False, not {value!r}")


def require_one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """One of the ``allowed`` strings."""
    if value not in allowed:
        choices = ", ".join(allowed)
        raise ConfigurationError(f"{name} must be one of {choices}, not {value!r}")


def one_of(allowed: tuple[str, ...]) -> Any:
    """An attrs validator: one of the ``allowed`` strings."""

    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        require_one_of(attribute.name, value, allowed)

    return check


def at_least(least: int) -> Any:
    """An attrs validator: a whole number >= ``least``."""
    return _attrs_rule(lambda name, value: require_at_least(name, value, least))


def text(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A ``str`` (empty or not)."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{attribute.name} must be a str, not {type(value).__name__}")


def non_empty_text(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A non-empty ``str``."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{attribute.name} must be a non-empty string, not {value!r}")


def member_of(kind: type[E], value: object, what: str, error: type[FanoutError]) -> E:
    """``kind(value)``: an enum member, by itself or its value (``"ok"``); else ``error``
    naming ``what`` and the values allowed."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in kind)
        raise error(f"{what} must be one of {allowed}, not {shown(value)}") from None
