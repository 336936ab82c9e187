"""Arguments checked against a tool's signature before the tool runs.

A model that sends ``{"count": "three"}`` or forgets a field should read which
argument was wrong and what was expected, not a Python ``TypeError`` from
deep inside the tool (or worse, a tool that ran on half its input). Each
argument is structured with a private cattrs converter into its annotated
type (attrs classes, dataclasses, enums, ``Literal``, containers), strictly:
JSON has no implicit conversions, so neither do we (``"3"`` is not an
``int``; ``3.0`` is, as JSON does not tell them apart).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import attrs
import cattrs
import cattrs.cols
import cattrs.gen
import cattrs.gen.typeddicts

from ._schema import Signature, describe_hint, has_schema

__all__ = ["ArgumentError", "bind"]

_MAX_PROBLEMS = 5


@attrs.frozen
class ArgumentError:
    """Why a call's arguments do not fit its tool: one line per argument at fault."""

    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        return "the arguments do not fit the tool: " + "; ".join(self.problems)


class _Mismatch(TypeError):
    """A JSON value of the wrong kind; its message is what the model reads."""


def _kind_of(value: Any) -> str:
    """The JSON word for ``value``'s type, as a model would understand it."""
    if value is None:
        return "null"
    for kind, words in ((bool, "boolean"), (str, "string"), (int, "integer"), (float, "number")):
        if isinstance(value, kind):
            return words
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _strict_str(value: Any, _: Any) -> str:
    if not isinstance(value, str):
        raise _Mismatch(f"expected a string, got {_kind_of(value)}")
    return value


def _strict_bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise _Mismatch(f"expected true or false, got {_kind_of(value)}")
    return value


def _strict_int(value: Any, _: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        got = " ".join(filter(None, (_kind_of(value), _short(value))))
        raise _Mismatch(f"expected an integer, got {got}")
    return value


def _strict_float(value: Any, _: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Mismatch(f"expected a number, got {_kind_of(value)}")
    return value  # an int stays an int: Python's float hint accepts it as is


def _short(value: Any) -> str:
    """A short spelling of a scalar the model sent, for a message; "" for anything else.

    Never raises: an int longer than Python will print (``{10**5000: 1}`` as a
    key) is named by its size, and a subclass's ``__repr__`` is not called.
    """
    if isinstance(value, bool):
        return repr(bool(value))
    if isinstance(value, int):
        try:
            text = repr(int.__int__(value))
        except ValueError:
            return f"an integer of {int.bit_length(value)} bits"
    elif isinstance(value, float):
        text = repr(float.__float__(value))
    elif isinstance(value, str):
        text = repr(str.__str__(value))
    else:
        return ""
    return text if len(text) <= 40 else text[:37] + "..."


def _is_array(hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    return origin in (list, tuple, set, frozenset, Sequence, AbstractSet, MutableSequence)


def _arrays_only(hint: Any) -> Any:
    """Lists, tuples and sets from JSON arrays only: a string is not a list of letters."""
    origin = typing.get_origin(hint) or hint
    args = typing.get_args(hint)
    item = args[0] if args else Any
    as_list = cattrs.cols.list_structure_factory(list[item], _converter)  # type: ignore[valid-type]
    # tuple[int, str] and tuple[()] (no args, unlike a bare tuple: no origin) have a length.
    fixed = typing.get_origin(hint) is tuple and args[-1:] != (Ellipsis,)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise _Mismatch(f"expected an array, got {_kind_of(value)}")
        if fixed:
            if len(value) != len(args):
                raise _Mismatch(f"expected an array of {len(args)} items, got {len(value)}")
            return tuple(_converter.structure(v, a) for v, a in zip(value, args, strict=True))
        items = as_list(value, list)
        if origin in (set, frozenset, AbstractSet):
            return frozenset(items) if origin is frozenset else set(items)
        return tuple(items) if origin is tuple else items

    return structure


def _objects_only(hint: Any) -> Any:
    """Dicts from JSON objects only."""
    as_mapping = cattrs.cols.mapping_structure_factory(hint, _converter)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _Mismatch(f"expected an object, got {_kind_of(value)}")
        return as_mapping(value, hint)

    return structure


def _is_object(hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    return origin in (dict, Mapping, MutableMapping)


def _is_record(hint: Any) -> bool:
    return isinstance(hint, type) and (
        attrs.has(hint) or dataclasses.is_dataclass(hint) or typing.is_typeddict(hint)
    )


def _records_only(hint: Any) -> Any:
    """attrs classes, dataclasses and TypedDicts from JSON objects only, no unknown keys."""
    if typing.is_typeddict(hint):
        generated = cattrs.gen.typeddicts.make_dict_structure_fn(
            hint, _converter, _cattrs_forbid_extra_keys=True
        )
    else:
        generated = cattrs.gen.make_dict_structure_fn(
            hint, _converter, _cattrs_forbid_extra_keys=True
        )

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _Mismatch(f"expected an object, got {_kind_of(value)}")
        return generated(dict(value), hint)

    return structure


def _enum_member(value: Any, hint: Any) -> Any:
    try:
        return hint(value)
    except ValueError:
        choices = ", ".join(repr(member.value) for member in hint)
        got = _short(value) or _kind_of(value)
        raise _Mismatch(f"expected one of {choices}, got {got}") from None


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _first_fitting(value: Any, hint: Any) -> Any:
    """A union takes the first member the value fits, in the order the hint names them."""
    members = typing.get_args(hint)
    if value is None and type(None) in members:
        return None
    for member in members:
        if member is type(None):
            continue
        try:
            return _converter.structure(value, member)
        except Exception:  # the next member may fit
            continue
    raise _Mismatch(f"expected {describe_hint(hint)}, got {_kind_of(value)}")


def _is_literal(hint: Any) -> bool:
    return typing.get_origin(hint) is typing.Literal


def _literal(value: Any, hint: Any) -> Any:
    choices = typing.get_args(hint)
    # 1 == True in Python, not in JSON: compare kinds as well as values.
    if not any(value == c and type(value) is type(c) for c in choices):
        words = ", ".join(repr(choice) for choice in choices)
        raise _Mismatch(f"expected one of {words}, got {_short(value) or _kind_of(value)}")
    return value


_converter = cattrs.Converter(forbid_extra_keys=True)
_converter.register_structure_hook(str, _strict_str)
_converter.register_structure_hook(bool, _strict_bool)
_converter.register_structure_hook(int, _strict_int)
_converter.register_structure_hook(float, _strict_float)
_converter.register_structure_hook_func(
    lambda hint: isinstance(hint, type) and issubclass(hint, enum.Enum), _enum_member
)
_converter.register_structure_hook_func(_is_literal, _literal)
_converter.register_structure_hook_func(_is_union, _first_fitting)
_converter.register_structure_hook_factory(_is_array, _arrays_only)
_converter.register_structure_hook_factory(_is_object, _objects_only)
_converter.register_structure_hook_factory(_is_record, _records_only)


def bind(
    signature: Signature, arguments: Mapping[str, Any] | str
) -> dict[str, Any] | ArgumentError:
    """The keyword arguments to call the tool with, or every reason they do not fit.

    Never raises: whatever the model sent, the answer is one of the two.
    """
    if isinstance(arguments, str):
        return ArgumentError(("the arguments are not a JSON object",))
    problems: list[str] = []
    bound: dict[str, Any] = {}
    known = signature.names
    for parameter in signature.parameters:
        if parameter.name not in arguments:
            if parameter.required:
                problems.append(f"{parameter.name}: missing ({_expected(parameter.hint)})")
            continue
        _structure(parameter.name, arguments[parameter.name], parameter.hint, bound, problems)
    # Every name a parameter's (the usual case): no other key to check or structure.
    others = () if known.issuperset(arguments) else arguments.items()
    for name, value in others:
        if not isinstance(name, str):
            problems.append(f"{_short(name) or type(name).__name__}: a key that is not a string")
        elif name in known:
            continue
        elif not signature.accepts_extra:
            expected = ", ".join(sorted(known)) or "no arguments"
            problems.append(f"{name}: not an argument of this tool (it takes {expected})")
        else:
            _structure(name, value, signature.extra, bound, problems)
    if problems:
        extra = len(problems) - _MAX_PROBLEMS
        shown = problems[:_MAX_PROBLEMS] + ([f"and {extra} more"] if extra > 0 else [])
        return ArgumentError(tuple(shown))
    return bound


def _structure(
    name: str, value: Any, hint: Any, bound: dict[str, Any], problems: list[str]
) -> None:
    hook = _HOOKS[hint] if hint in _HOOKS else _hook_for(hint)  # a Python call only the first time
    if hook is None:
        bound[name] = value
        return
    try:
        bound[name] = hook(value, hint)
    except Exception as exc:  # cattrs raises many types; every one is a bad argument
        problems.extend(_describe(exc, name))


_HOOKS: dict[Any, Callable[[Any, Any], Any] | None] = {}


def _hook_for(hint: Any) -> Callable[[Any, Any], Any] | None:
    """The converter's function for ``hint`` (memoised: asked for every argument), or None
    to pass the value through as sent.

    A hint JSON cannot describe (the tool was given schema= by hand) passes it
    through: the hand-written schema is the contract.
    """
    if hint not in _HOOKS:  # hints are hashable: read_signature kept them plain
        plain = hint is Any or hint is None or not has_schema(hint)
        _HOOKS[hint] = None if plain else _converter.get_structure_hook(hint)
    return _HOOKS[hint]


def _describe(exc: Exception, name: str) -> list[str]:
    try:
        lines = cattrs.transform_error(exc, path=name, format_exception=_words)
    except Exception:
        lines = [f"invalid value @ {name}"]
    return [f"{path}: {words}" for words, _, path in (line.rpartition(" @ ") for line in lines)]


def _words(exc: BaseException, hint: Any) -> str:
    if isinstance(exc, _Mismatch):
        return str(exc)
    if isinstance(exc, KeyError):
        return f"missing ({_expected(hint)})" if hint is not None else "missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown keys {sorted(map(str, exc.extra_fields))}"
    return f"expected {_expected(hint)}"


def _expected(hint: Any) -> str:
    if hint is None:
        return "a value"
    return describe_hint(hint)
