"""The runner: configuration that cannot work is refused when built, and it opens once."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import fanout
from fanout import (
    ConfigurationError,
    InvalidTurnError,
    Registry,
    Runner,
    Scope,
    ToolCall,
    UsageError,
)


@pytest.fixture
def registry() -> Registry:
    reg = Registry()

    @reg.tool(kind=fanout.Kind.PURE)
    async def echo(text: str) -> str:
        return text

    return reg


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"mutating": "some"}, "mutating must be 'one', 'serial' or 'parallel', not 'some'"),
        ({"on_failure": "stop"}, "on_failure must be 'continue' or 'cancel_siblings', not 'stop'"),
        ({"retry": 3}, "retry must be a RetryPolicy or None, not 3"),
        ({"instruments": [object()]}, "an instrument needs an on_event method"),
        ({"scopes": [Scope("api"), Scope("api")]}, "two scopes are named 'api'"),
    ],
)
def test_unworkable_options_are_refused_when_built(
    registry: Registry, options: dict[str, Any], words: str
) -> None:
    """Each option that cannot work raises ConfigurationError naming it, before any turn."""
    with pytest.raises(ConfigurationError, match=words.replace("(", r"\(")):
        Runner(registry, **options)


async def test_a_runner_opens_once(registry: Registry) -> None:
    """Entering an open runner again is a UsageError; the first `async with` is unharmed."""
    runner = Runner(registry)
    async with runner:
        with pytest.raises(UsageError, match="already open"):
            await runner.__aenter__()
        turn = await runner.run_turn([ToolCall("a", "echo", {"text": "hi"})])
    assert [r.content for r in turn.results] == ["hi"]
    async with runner:  # closed again: it may be opened anew
        await trio.lowlevel.checkpoint()


def test_a_turn_is_made_of_tool_calls(registry: Registry) -> None:
    """A turn of something that is not a ToolCall is an InvalidTurnError naming its type."""
    with pytest.raises(InvalidTurnError, match="made of ToolCall values, not dict"):
        Runner(registry).turn([{"id": "a", "name": "echo"}])  # type: ignore[list-item]
