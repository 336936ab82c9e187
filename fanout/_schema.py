"""JSON Schema for a tool's arguments, read from its signature and docstring.

The ``tools=`` list a model sees must say exactly what the function accepts,
or the model calls it wrong and the call is answered ``error``. Writing that
list by hand lets it drift from the code, so it is derived here from the
type hints (str, int, float, bool, lists, tuples, sets, dicts, ``Literal``,
``Enum``, ``Optional`` and other unions, attrs classes, dataclasses,
``TypedDict``, ``Annotated[..., "description"]``) and the docstring (Google
``Args:`` sections and Sphinx ``:param x:`` lines). A hint with no JSON
meaning is a ``ConfigurationError`` naming it: the tool then takes a hand
written ``schema=``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import json
import re
import types
import typing
from typing import Any

import attrs

from ._exceptions import ConfigurationError

__all__ = [
    "ANY_ARGUMENTS",
    "Parameter",
    "Signature",
    "describe_hint",
    "has_schema",
    "read_signature",
    "schema_of",
    "summary_of",
]

_EMPTY = inspect.Parameter.empty
_SCALARS: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}
_ARRAYS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set)
_OBJECTS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


@attrs.frozen
class Parameter:
    """One keyword a tool accepts: its hint (``Any`` when unannotated), default, words."""

    name: str
    hint: Any
    required: bool
    default: Any = None
    description: str | None = None


@attrs.frozen
class Signature:
    """What a tool accepts: named parameters, and the hint of ``**kwargs`` if any."""

    description: str
    parameters: tuple[Parameter, ...]
    extra: Any = None  # the hint of **kwargs; None: no other keyword is accepted
    accepts_extra: bool = False
    # The parameters' names, read once: every call's arguments are checked against them.
    names: frozenset[str] = attrs.field(init=False, eq=False, repr=False)

    @names.default
    def _names(self) -> frozenset[str]:
        return frozenset(parameter.name for parameter in self.parameters)


# What a tool whose signature cannot be read is taken to accept.
ANY_ARGUMENTS = Signature("", (), Any, accepts_extra=True)


def read_signature(fn: Any) -> Signature:
    """The parameters of ``fn`` as a tool sees them: every one passed by keyword."""
    try:
        # eval_str resolves string annotations and, unlike get_type_hints, reads
        # partials and callable objects too.
        signature = inspect.signature(fn, eval_str=True)
    except (TypeError, ValueError, NameError) as exc:
        raise ConfigurationError(
            f"cannot read the signature of {fn!r} ({exc}); pass schema= to describe it by hand"
        ) from exc
    hints = {
        name: _plain(parameter.annotation)
        for name, parameter in signature.parameters.items()
        if parameter.annotation is not _EMPTY
    }
    summary, described = _read_docstring(inspect.getdoc(getattr(fn, "func", fn)) or "")
    parameters = []
    extra: Any = None
    accepts_extra = False
    for parameter in signature.parameters.values():
        hint = hints.get(parameter.name, Any)
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            extra, accepts_extra = hint, True
            continue
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            if parameter.default is _EMPTY:
                raise ConfigurationError(
                    f"parameter {parameter.name!r} of {fn!r} cannot be passed by keyword; "
                    "a tool's arguments arrive as a JSON object"
                )
            continue
        required = parameter.default is _EMPTY
        parameters.append(
            Parameter(
                parameter.name, hint, required,
                None if required else parameter.default, described.get(parameter.name),
            )
        )  # fmt: skip
    return Signature(summary, tuple(parameters), extra, accepts_extra)


def schema_of(signature: Signature, *, tool: str) -> dict[str, Any]:
    """The JSON Schema (an ``object``) of the arguments ``signature`` accepts."""
    properties: dict[str, Any] = {}
    for parameter in signature.parameters:
        try:
            schema = _schema(parameter.hint, ())
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"tool {tool!r}, parameter {parameter.name!r}: {exc}; "
                "pass schema= to describe the arguments by hand"
            ) from exc
        if parameter.description:  # the tool's words for its parameter beat the type's
            schema = {**schema, "description": parameter.description}
        default = _json_default(parameter.default)
        if not parameter.required and default is not _NO_DEFAULT:
            schema = {**schema, "default": default}
        properties[parameter.name] = schema
    result: dict[str, Any] = {"type": "object", "properties": properties}
    required = [p.name for p in signature.parameters if p.required]
    if required:
        result["required"] = required
    if not signature.accepts_extra:
        result["additionalProperties"] = False
    elif signature.extra is not Any:
        result["additionalProperties"] = _schema(signature.extra, ())
    return result


_NO_DEFAULT = object()


def _json_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return _NO_DEFAULT  # a default JSON cannot spell is left unsaid


def _schema(hint: Any, seen: tuple[Any, ...]) -> dict[str, Any]:
    """The schema of one hint; ``seen`` holds the classes being described, to stop cycles."""
    if hint is Any or hint is object:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        schema = _schema(args[0], seen)
        words = [a for a in args[1:] if isinstance(a, str)]
        return {**schema, "description": " ".join(words)} if words else schema
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if origin is typing.Literal:
        return _literal(args)
    if origin in (typing.Union, types.UnionType):
        return _union(args, seen)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _literal(tuple(member.value for member in hint))
    if hint in _ARRAYS or origin in _ARRAYS:
        return _array(hint, origin, args, seen)
    if hint in _OBJECTS or origin in _OBJECTS:
        value = _schema(args[1], seen) if len(args) == 2 else {}
        if args and args[0] is not str:
            raise ConfigurationError(f"{hint!r} has keys that are not strings; JSON keys are")
        return {"type": "object", "additionalProperties": value} if value else {"type": "object"}
    if isinstance(hint, type):
        return _record(hint, seen)
    raise ConfigurationError(f"the hint {hint!r} has no JSON Schema")


def _literal(values: tuple[Any, ...]) -> dict[str, Any]:
    kinds = {_SCALARS.get(type(value)) for value in values}
    if None in kinds:
        raise ConfigurationError(f"the values {values!r} are not all JSON scalars")
    schema: dict[str, Any] = {"enum": list(values)}
    if len(kinds) == 1:
        schema["type"] = kinds.pop()
    return schema


def _union(args: tuple[Any, ...], seen: tuple[Any, ...]) -> dict[str, Any]:
    choices = [_schema(arg, seen) for arg in args]
    if any(choice == {} for choice in choices):
        return {}
    return {"anyOf": choices}


def _array(hint: Any, origin: Any, args: tuple[Any, ...], seen: tuple[Any, ...]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array"}
    if origin is tuple and not args:  # tuple[()]: the empty tuple (bare ``tuple`` has no origin)
        return {**schema, "maxItems": 0}
    if origin is tuple and args[-1] is not Ellipsis:
        items = [_schema(arg, seen) for arg in args]
        return {**schema, "prefixItems": items, "minItems": len(items), "maxItems": len(items)}
    if args:
        schema["items"] = _schema(args[0], seen)
    if (origin or hint) in (set, frozenset, collections.abc.Set):
        schema["uniqueItems"] = True
    return schema


def _record(cls: type, seen: tuple[Any, ...]) -> dict[str, Any]:
    """attrs classes, dataclasses and TypedDicts: objects with named fields."""
    if cls in seen:
        raise ConfigurationError(f"{cls.__name__} contains itself")
    seen = (*seen, cls)
    fields = _fields(cls)
    if fields is None:
        raise ConfigurationError(f"the hint {cls.__name__} has no JSON Schema")
    properties = {name: _schema(hint, seen) for name, hint, _ in fields}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    required = [name for name, _, needed in fields if needed]
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    # The class's own docstring only: a TypedDict would otherwise inherit dict's.
    summary, described = _read_docstring(inspect.cleandoc(cls.__dict__.get("__doc__") or ""))
    for name, words in described.items():
        if name in properties and "description" not in properties[name]:
            properties[name] = {**properties[name], "description": words}
    if summary and not _is_generated_doc(cls, summary):
        schema["description"] = summary
    return schema


def _plain(hint: Any) -> Any:
    """``hint`` keeping, of its ``Annotated`` metadata, only the words (at every depth).

    Other metadata (a dict, a validator object) means nothing to JSON Schema
    or to binding, and may not even be hashable, which typing's caches and
    cattrs' dispatch need.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        words = tuple(arg for arg in args[1:] if isinstance(arg, str))
        inner = _plain(args[0])
        return typing.Annotated[(inner, *words)] if words else inner
    if origin is None or origin is typing.Literal:
        return hint
    kept = tuple(_plain(arg) for arg in args)
    if all(new is old for new, old in zip(kept, args, strict=True)):
        return hint
    if origin in (typing.Union, types.UnionType):
        return typing.Union[kept]  # noqa: UP007  (built from a tuple)
    return origin[kept]


def _fields(cls: type) -> list[tuple[str, Any, bool]] | None:
    """(name, hint, required) for each field, or None when ``cls`` is no record."""
    if attrs.has(cls):
        hints = typing.get_type_hints(cls, include_extras=True)
        return [
            (f.alias or f.name, _plain(hints.get(f.name, Any)), f.default is attrs.NOTHING)
            for f in attrs.fields(cls)
            if f.init
        ]
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls, include_extras=True)
        missing = dataclasses.MISSING
        return [
            (
                f.name,
                _plain(hints.get(f.name, Any)),
                f.default is missing and f.default_factory is missing,
            )
            for f in dataclasses.fields(cls)
            if f.init
        ]
    if typing.is_typeddict(cls):
        hints = typing.get_type_hints(cls)  # drops Required/NotRequired
        needed: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
        return [(name, _plain(hint), name in needed) for name, hint in hints.items()]
    return None


def _is_generated_doc(cls: type, summary: str) -> bool:
    # dataclasses invent a docstring from the signature; it says nothing to a model.
    return summary.startswith(f"{cls.__name__}(")


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Attributes|Fields):\s*$")
_OTHER_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")
_GOOGLE_ITEM = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_ITEM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def _read_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The summary (text before any section) and each parameter's description."""
    summary: list[str] = []
    described: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_section = False
    indent = 0
    for line in doc.splitlines():
        stripped = line.strip()
        sphinx = _SPHINX_ITEM.match(stripped)
        if sphinx:
            current = described.setdefault(sphinx[1], [sphinx[2]])
            in_section = True
            continue
        if _SECTION.match(stripped):
            in_section, current = True, None
            continue
        if _OTHER_SECTION.match(stripped) or stripped.startswith(":"):
            in_section, current = True, None  # Returns:, Raises:, :returns: are not for the model
            continue
        if not in_section:
            summary.append(stripped)
            continue
        item = _GOOGLE_ITEM.match(stripped)
        depth = len(line) - len(line.lstrip())
        if item and (current is None or depth <= indent):
            indent = depth
            current = described.setdefault(item[1].lstrip("*"), [item[3]])
        elif current is not None and stripped:
            current.append(stripped)
    text = " ".join(" ".join(summary).split())
    return text, {name: " ".join(" ".join(words).split()) for name, words in described.items()}


_WORDS = {"string": "a string", "integer": "an integer", "number": "a number",
          "boolean": "true or false", "null": "null"}  # fmt: skip


_DESCRIBABLE: dict[Any, bool] = {}


def has_schema(hint: Any) -> bool:
    """Whether JSON Schema can describe ``hint`` (memoised: asked for every argument)."""
    if hint not in _DESCRIBABLE:  # hints are hashable: read_signature kept them plain
        _DESCRIBABLE[hint] = _describable(hint)
    return _DESCRIBABLE[hint]


def _describable(hint: Any) -> bool:
    try:
        _schema(hint, ())
    except ConfigurationError:
        return False
    return True


def summary_of(fn: Any) -> str:
    """The first paragraph of ``fn``'s docstring, as a tool's description."""
    return _read_docstring(inspect.getdoc(getattr(fn, "func", fn)) or "")[0]


def describe_hint(hint: Any) -> str:
    """A hint in the words a model reads: "an integer", or its schema as compact JSON."""
    try:
        schema = _schema(hint, ())
    except ConfigurationError:
        return getattr(hint, "__name__", None) or repr(hint)
    if set(schema) == {"type"} and schema["type"] in _WORDS:
        return _WORDS[schema["type"]]
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 200 else text[:197] + "..."
