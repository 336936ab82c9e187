"""Tools, as the runner sees them: a callable plus how it may be scheduled.

A tool is declared once with what it does to the world (``kind``), how long
one call may take, which scopes it draws from and how it retries. A tool
declared without a kind is ``MUTATING``: fanout never guesses that a tool is
safe to run beside a write.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, overload

import attrs

from ._exceptions import ConfigurationError
from ._retry import RetryPolicy
from ._values import Kind

__all__ = ["Registry", "ToolSpec"]

F = TypeVar("F", bound=Callable[..., Any])
Cost = float | Callable[[Mapping[str, Any]], float]


def _positive_or_none(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise ConfigurationError(f"{attribute.name} must be a positive number or None")


def _names(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ConfigurationError(f"scopes must be a list of names, not the string {value!r}")
    return tuple(value)


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
    deadline; ``description`` and ``schema`` (the JSON Schema of the arguments
    object) are what the model is told of the tool, when given (an MCP listing).
    """

    name: str
    fn: Callable[..., Any] = attrs.field(eq=False)
    kind: Kind = Kind.MUTATING
    timeout: float | None = attrs.field(default=30.0, validator=_positive_or_none)
    scopes: tuple[str, ...] = attrs.field(default=(), converter=_names)
    retry: RetryPolicy | None = None
    cost: Cost = attrs.field(default=1.0, eq=False)
    cache_ttl: float | None = attrs.field(default=None, validator=_positive_or_none)
    repeatable: bool = False
    invalidates: tuple[str, ...] | None = None
    idle_timeout: float | None = attrs.field(default=None, validator=_positive_or_none)
    description: str | None = None
    schema: Mapping[str, Any] | None = attrs.field(default=None, eq=False)

    # Async tools run in the turn's nursery; sync ones in worker threads.
    is_async: bool = attrs.field(init=False)

    @is_async.default
    def _is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def cost_of(self, arguments: Mapping[str, Any]) -> float:
        """The tokens this call reserves on each of its scopes."""
        return self.cost(arguments) if callable(self.cost) else self.cost


class Registry:
    """The tools a runner may call, by name."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolSpec] = {}

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
        """Register ``fn`` under ``name`` (default: its ``__name__``)."""
        tool_name = name or getattr(fn, "__name__", "")
        if not tool_name:
            raise ConfigurationError("a tool needs a name")
        if tool_name in self._tools:
            raise ConfigurationError(f"a tool named {tool_name!r} is already registered")
        spec = ToolSpec(
            name=tool_name,
            fn=fn,
            kind=Kind(kind),
            timeout=timeout,
            scopes=_names(scopes),
            retry=retry,
            cost=cost,
            cache_ttl=cache_ttl,
            repeatable=repeatable,
            invalidates=None if invalidates is None else tuple(invalidates),
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

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)
