"""Tools, as the runner sees them: a callable plus how it may be scheduled.

A tool is declared once with what it does to the world (``kind``), how long
one call may take, which scopes it draws from and how it retries. A tool
declared without a kind is ``MUTATING``: fanout never guesses that a tool is
safe to run beside a write.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, overload

import attrs

from ._binding import ArgumentError, bind
from ._definitions import (
    ToolDefinition,
    anthropic_tool,
    checked_schema,
    openai_tool,
    responses_tool,
    scrubbed_definition,
)
from ._exceptions import ConfigurationError
from ._retry import RetryPolicy
from ._schema import ANY_ARGUMENTS, Signature, read_signature, schema_of, summary_of
from ._validate import flag, member_of, non_empty_text, optional_positive, require_positive
from ._values import Kind

if TYPE_CHECKING:
    from anthropic.types import ToolParam
    from openai.types.chat import ChatCompletionFunctionToolParam
    from openai.types.responses import FunctionToolParam

__all__ = ["Registry", "ToolSpec"]

F = TypeVar("F", bound=Callable[..., Any])
Cost = float | Callable[[Mapping[str, Any]], float]


def _names(value: Iterable[str], what: str = "scopes") -> tuple[str, ...]:
    if isinstance(value, str):
        raise ConfigurationError(f"{what} must be a list of names, not the string {value!r}")
    if not isinstance(value, Iterable) or isinstance(value, bytes | Mapping):
        raise ConfigurationError(f"{what} must be a list of names, not {type(value).__name__}")
    names = tuple(value)
    if not all(isinstance(name, str) and name for name in names):
        raise ConfigurationError(f"{what} must be non-empty strings, not {names!r}")
    return names


def _kind(value: Kind | str) -> Kind:
    return member_of(Kind, value, "kind", ConfigurationError)


def _check_cost(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not callable(value):
        require_positive(attribute.name, value)


def _optional_text(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigurationError(f"{attribute.name} must be text or None, not {value!r}")


def _check_retry(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, RetryPolicy):
        raise ConfigurationError(f"retry must be a RetryPolicy or None, not {value!r}")


@attrs.frozen
class ToolSpec:
    """One registered tool.

    ``timeout`` caps one call (None: only the turn's deadline); ``scopes``
    name the limits it draws from; ``retry`` overrides the runner's policy;
    ``cost`` is the tokens one call takes (a number, or a function of the
    arguments); ``cache_ttl`` lets a read be answered from the run's cache;
    ``repeatable`` says repeats are intended, so no coalescing, caching or
    idempotency applies; ``invalidates`` names the tools whose cached reads a
    mutating call makes stale (None: all of them); ``idle_timeout`` stops a
    call that reports no progress for that long (None: never), within its
    deadline. ``description`` and ``schema`` replace what the docstring and
    the type hints would say in the tool's definition (``schema`` is the JSON
    Schema of the arguments object, as an MCP server lists it).
    """

    name: str = attrs.field(validator=non_empty_text)
    fn: Callable[..., Any] = attrs.field(eq=False)
    kind: Kind = attrs.field(default=Kind.MUTATING, converter=_kind)
    timeout: float | None = attrs.field(default=30.0, validator=optional_positive)
    scopes: tuple[str, ...] = attrs.field(default=(), converter=_names)
    retry: RetryPolicy | None = attrs.field(default=None, validator=_check_retry)
    cost: Cost = attrs.field(default=1.0, eq=False, validator=_check_cost)
    cache_ttl: float | None = attrs.field(default=None, validator=optional_positive)
    repeatable: bool = attrs.field(default=False, validator=flag)
    invalidates: tuple[str, ...] | None = None
    idle_timeout: float | None = attrs.field(default=None, validator=optional_positive)
    description: str | None = attrs.field(default=None, validator=_optional_text)
    schema: Mapping[str, Any] | None = attrs.field(default=None, converter=checked_schema, eq=False)

    # Read on first use, not at registration: a hint may name a class defined
    # after the tool. One slot, holding the Signature or the ConfigurationError.
    _signature: list[Signature | ConfigurationError] = attrs.field(
        init=False, factory=list, eq=False, repr=False
    )

    # Async tools run in the turn's nursery; sync ones in worker threads.
    is_async: bool = attrs.field(init=False)

    @is_async.default
    def _is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @fn.validator
    def _check_fn(self, _: attrs.Attribute[Any], value: object) -> None:
        if not callable(value):
            raise ConfigurationError(f"tool {self.name!r} must be callable, not {value!r}")

    def cost_of(self, arguments: Mapping[str, Any]) -> float:
        """The tokens this call reserves on each of its scopes."""
        return self.cost(arguments) if callable(self.cost) else self.cost

    def _read_signature(self) -> Signature:
        """The parameters the tool accepts, from its signature and docstring.

        Raises ``ConfigurationError`` when they cannot be read (a parameter
        that cannot be passed by keyword, a hint naming an undefined class).
        """
        if not self._signature:
            try:
                self._signature.append(read_signature(self.fn))
            except ConfigurationError as exc:
                self._signature.append(exc)
        read = self._signature[0]
        if isinstance(read, ConfigurationError):
            raise read
        return read

    def bind(self, arguments: Mapping[str, Any] | str) -> dict[str, Any] | ArgumentError:
        """The keyword arguments to call the tool with, structured into their hints.

        Or an ``ArgumentError`` naming each argument that does not fit and
        what was expected (raw text that is not a JSON object never fits);
        the call is then answered ``error`` and not run. A tool whose
        signature cannot be read gets a JSON object's arguments unchanged.
        """
        try:
            signature = self._read_signature()
        except ConfigurationError:
            signature = ANY_ARGUMENTS
        return bind(signature, arguments)

    def definition(self) -> ToolDefinition:
        """Name, description and arguments' JSON Schema, as every vendor needs them.

        Raises ``ConfigurationError`` when a hint has no JSON Schema and no
        ``schema=`` was given.
        """
        description = self.description if self.description is not None else summary_of(self.fn)
        if self.schema is not None:
            return ToolDefinition(self.name, description, dict(self.schema))
        return ToolDefinition(
            self.name, description, schema_of(self._read_signature(), tool=self.name)
        )


class Registry:
    """The tools a runner may call, by name."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolSpec] = {}
        self._scope_defaults: dict[str, dict[str, Any]] = {}

    def set_scope_defaults(self, name: str, **options: Any) -> None:
        """The ``Scope`` options of the scope ``name`` where a runner is given none of that
        name (``Runner(scopes=...)``): the scope it makes is ``Scope(name, **options)``.

        A tool source that knows what its scope should be says so here: an MCP
        server's does not learn (`fanout.mcp.register_tools`). Made as a plain
        ``Scope(name)``, it learned, and its probe held every call behind the
        first two: two hung calls left the rest unsent until their deadlines.
        """
        self._scope_defaults[name] = dict(options)

    def scope_defaults(self, name: str) -> dict[str, Any]:
        """The options `set_scope_defaults` gave the scope ``name`` (none by default)."""
        return dict(self._scope_defaults.get(name, {}))

    @overload
    def tool(self, fn: F, /) -> F: ...
    @overload
    def tool(self, /, **options: Any) -> Callable[[F], F]: ...
    def tool(self, fn: F | None = None, /, **options: Any) -> F | Callable[[F], F]:
        """Register a function as a tool; usable bare or with ``add``'s options.

        The function is returned unchanged, so it stays callable directly.
        """

        def register(fn: F) -> F:
            self.add(fn, **options)
            return fn

        return register if fn is None else register(fn)

    def add(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        kind: Kind = Kind.MUTATING,
        timeout: float | None = 30.0,
        scopes: Iterable[str] = (),
        retry: RetryPolicy | None = None,
        cost: Cost = 1.0,
        cache_ttl: float | None = None,
        repeatable: bool = False,
        invalidates: Iterable[str] | None = None,
        idle_timeout: float | None = None,
        description: str | None = None,
        schema: Mapping[str, Any] | None = None,
    ) -> ToolSpec:
        """Register ``fn`` under ``name`` (default: its ``__name__``).

        ``description`` and ``schema`` (the JSON Schema of the arguments)
        override what the docstring and the type hints say.
        """
        tool_name = name or getattr(fn, "__name__", "")
        if not isinstance(tool_name, str) or not tool_name:
            raise ConfigurationError("a tool needs a name")
        if tool_name in self._tools:
            raise ConfigurationError(f"a tool named {tool_name!r} is already registered")
        spec = ToolSpec(
            name=tool_name,
            fn=fn,
            kind=kind,
            timeout=timeout,
            scopes=_names(scopes),
            retry=retry,
            cost=cost,
            cache_ttl=cache_ttl,
            repeatable=repeatable,
            invalidates=None if invalidates is None else _names(invalidates, "invalidates"),
            idle_timeout=idle_timeout,
            description=description,
            schema=schema,
        )
        self._tools[tool_name] = spec
        return spec

    def get(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Registered names, sorted, so messages that list them are stable."""
        return sorted(self._tools)

    def definitions(self) -> list[ToolDefinition]:
        """Every tool's definition, in the order the tools were registered, with no
        credential in its description or schema (`scrubbed_definition`)."""
        return [scrubbed_definition(spec.definition()) for spec in self._tools.values()]

    def anthropic_tools(self) -> list[ToolParam]:
        """The ``tools=`` list for Anthropic's Messages API."""
        return [anthropic_tool(definition) for definition in self.definitions()]

    def openai_tools(self) -> list[ChatCompletionFunctionToolParam]:
        """The ``tools=`` list for OpenAI's Chat Completions API."""
        return [openai_tool(definition) for definition in self.definitions()]

    def responses_tools(self) -> list[FunctionToolParam]:
        """The ``tools=`` list for OpenAI's Responses API."""
        return [responses_tool(definition) for definition in self.definitions()]

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)
