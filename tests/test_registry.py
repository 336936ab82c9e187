"""The registry: what a tool may be registered with, and the clear error for what it may not."""

from __future__ import annotations

from typing import Any

import pytest

from fanout import ConfigurationError, Kind, Registry, RetryPolicy


def lookup(query: str) -> str:
    """Look something up."""
    return query


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"scopes": "crm"}, "a list of names, not the string 'crm'"),
        ({"scopes": ["crm", ""]}, "non-empty strings"),
        ({"invalidates": [3]}, "non-empty strings"),
        ({"kind": "sometimes"}, "kind must be one of pure, reads, mutating, not 'sometimes'"),
        ({"retry": 3}, "retry must be a RetryPolicy or None, not 3"),
        ({"cost": 0}, "cost"),
        ({"timeout": -1}, "timeout"),
    ],
)
def test_bad_options_are_configuration_errors_that_say_what_is_wrong(
    options: dict[str, Any], words: str
) -> None:
    """Each bad option is refused at registration with a ConfigurationError naming it."""
    with pytest.raises(ConfigurationError) as raised:
        Registry().add(lookup, **options)
    assert words in str(raised.value)


def test_a_tool_must_be_callable_and_named_once() -> None:
    """A non-callable is refused, and so is a second tool under a taken name."""
    registry = Registry()
    with pytest.raises(ConfigurationError, match="must be callable"):
        registry.add("not a function", name="text")  # type: ignore[arg-type]
    registry.add(lookup)
    with pytest.raises(ConfigurationError, match="'lookup' is already registered"):
        registry.add(lookup)
    with pytest.raises(ConfigurationError, match="a tool needs a name"):
        registry.add(type("Nameless", (), {"__call__": lambda self: 1})())


def test_a_kind_may_be_given_by_its_value() -> None:
    """kind="reads" is Kind.READS; an unregistered tool's kind defaults to MUTATING."""
    registry = Registry()
    assert registry.add(lookup, kind="reads").kind is Kind.READS  # type: ignore[arg-type]
    assert registry.add(lookup, name="other").kind is Kind.MUTATING
    assert registry.add(lookup, name="third", retry=RetryPolicy(attempts=2)).retry is not None


def test_an_unreadable_signature_passes_arguments_through_and_says_why_on_request() -> None:
    """A positional-only tool gets JSON arguments unchanged; its definition names the problem."""

    def positional(query: str, /) -> str:
        return query

    spec = Registry().add(positional)
    assert spec.bind({"query": "x"}) == {"query": "x"}
    for _ in range(2):  # read once, the same error each time
        with pytest.raises(ConfigurationError, match="query"):
            spec.definition()


def test_a_registry_lists_its_tools_in_order_and_its_names_sorted() -> None:
    """Iteration keeps registration order; names() is sorted; len counts the tools."""
    registry = Registry()
    for name in ("zeta", "alpha", "mid"):
        registry.add(lookup, name=name)
    assert [spec.name for spec in registry] == ["zeta", "alpha", "mid"]
    assert registry.names() == ["alpha", "mid", "zeta"]
    assert len(registry) == 3
    assert registry.get("alpha") is not None
    assert registry.get("missing") is None
