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


def _interrupting() -> fanout.Registry:
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS)
    async def boom(x: int) -> str:
        await trio.sleep(0.1)
        raise KeyboardInterrupt  # Ctrl-C, landing in this call's task

    @registry.tool(kind=fanout.Kind.READS)
    async def slow(x: int) -> str:
        await trio.sleep(5)
        return "slow"

    return registry


async def test_a_keyboard_interrupt_in_an_open_runner_comes_out_as_itself(
    autojump_clock: Any,
) -> None:
    """A call's task in the runner's nursery raises ``KeyboardInterrupt``: ``run()`` and the
    runner's block raise it as itself, and every call says what stopped it, in this
    turn and in another running beside it. (``run()`` raised a group of its
    cancellation, the block a group of the interrupt, and the other turn's call said
    "the caller cancelled the turn".)"""
    runner = fanout.Runner(_interrupting(), turn_timeout=10)
    first = runner.turn(
        [fanout.ToolCall("a", "boom", {"x": 1}), fanout.ToolCall("b", "slow", {"x": 1})]
    )
    second = runner.turn([fanout.ToolCall("c", "slow", {"x": 2})])
    raised: dict[str, BaseException] = {}

    async def run(name: str, turn: fanout.Turn) -> None:
        try:
            await turn.run()
        except BaseException as exc:
            raised[name] = exc
            raise

    caught: BaseException | None = None
    try:
        async with runner, trio.open_nursery() as nursery:
            nursery.start_soon(run, "first", first)
            nursery.start_soon(run, "second", second)
    except BaseException as exc:
        caught = exc
    assert isinstance(caught, KeyboardInterrupt)
    assert isinstance(raised["first"], KeyboardInterrupt)
    for result in [*first.results[1:], *second.results]:
        assert result.status is fanout.Status.CANCELLED
        assert "a KeyboardInterrupt stopped the turn" in result.content


async def test_a_keyboard_interrupt_caught_by_the_caller_stops_only_its_own_turns(
    autojump_clock: Any,
) -> None:
    """The caller catches the interrupt around ``run_turn`` and goes on with the runner:
    a later turn's call cut off by its deadline says so (every later call was answered
    "a KeyboardInterrupt stopped the turn")."""
    runner = fanout.Runner(_interrupting(), turn_timeout=2)
    with pytest.raises(KeyboardInterrupt):
        await runner.run_turn([fanout.ToolCall("a", "boom", {"x": 1})])
    later = await runner.run_turn([fanout.ToolCall("b", "slow", {"x": 1})])
    (result,) = later.results
    assert result.status is fanout.Status.TIMED_OUT
    assert "the turn's deadline of 2s passed" in result.content


def _streamed_weather(cities: list[str]) -> Any:
    async def stream() -> Any:
        yield {"type": "message_start", "message": {"id": "m", "role": "assistant"}}
        for i, city in enumerate(cities):
            await trio.sleep(1)
            block = {"type": "tool_use", "id": f"t{i}", "name": "weather", "input": {}}
            delta = {"type": "input_json_delta", "partial_json": f'{{"city": "{city}"}}'}
            yield {"type": "content_block_start", "index": i, "content_block": block}
            yield {"type": "content_block_delta", "index": i, "delta": delta}
            yield {"type": "content_block_stop", "index": i}
        yield {"type": "message_stop"}

    return stream()


async def test_a_turn_goes_on_in_its_own_nursery_once_its_runner_has_closed(
    autojump_clock: Any,
) -> None:
    """A streaming turn runs in another task while the runner's block ends (at 0.5 s, the
    model still writing): the calls that complete later run in the turn's own nursery.
    (Started in the closed one, the next was answered "fanout failed", and the stream
    was read no further.)"""
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS)
    async def weather(city: str) -> str:
        return f"clear over {city}"

    turns: list[fanout.Turn] = []
    async with trio.open_nursery() as nursery, fanout.Runner(registry, turn_timeout=30) as runner:

        async def read() -> None:
            stream = _streamed_weather(["Oslo", "Lima"])
            turns.append(await runner.run_stream(stream, fanout.AnthropicStream()))

        nursery.start_soon(read)
        await trio.sleep(0.5)
    assert [r.content for r in turns[0].results] == ["clear over Oslo", "clear over Lima"]


async def test_a_call_cut_off_by_its_runner_s_block_says_so(autojump_clock: Any) -> None:
    """The runner's block is cancelled while a turn runs in another task: that turn was not
    cancelled (its ``run()`` returns), and its call says the runner was, not "the caller
    cancelled the turn"."""
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS)
    async def slow(x: int) -> str:
        await trio.sleep(5)
        return "slow"

    runner = fanout.Runner(registry, turn_timeout=10)
    turn = runner.turn([fanout.ToolCall("s", "slow", {"x": 1})])
    async with trio.open_nursery() as nursery:
        with trio.move_on_after(1):
            async with runner:
                nursery.start_soon(turn.run)
                await trio.sleep_forever()
    [result] = turn.results
    assert result.status is fanout.Status.CANCELLED
    assert "the runner this turn ran in was cancelled" in result.content
