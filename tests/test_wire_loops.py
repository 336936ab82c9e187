"""Multi-turn loops with the real SDK clients against a strict fake API on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

import fanout
from examples.typed_loop import anthropic_loop, chat_loop, responses_loop
from fanout import Kind, Registry, Runner
from tests.strict_api import Script, serve_strict

SCRIPT: Script = [
    [("weather", {"city": "Oslo"}), ("weather", {"city": 5}), ("launch", {}),
     ("weather", "{broken"), ("weather", {"city": "Oslo"})],
    [("weather", {"city": "Lima", "unit": "fahrenheit"})],
]  # fmt: skip


def _registry() -> Registry:
    registry = Registry()

    @registry.tool(kind=Kind.READS)
    async def weather(city: str, unit: str = "celsius") -> str:
        """The sky over a city.

        Args:
            city: The city's English name.
            unit: celsius or fahrenheit.
        """
        return f"clear over {city} ({unit})"

    return registry


@pytest.fixture
def registry() -> Registry:
    return _registry()


def _statuses(api: Any) -> list[str]:
    return [path for path, _ in api.requests]


async def test_anthropic_loop_is_accepted_at_every_turn(registry: Registry) -> None:
    """Definitions, calls and results survive three Messages requests the fake would reject."""
    async with serve_strict(SCRIPT) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)
        messages = await anthropic_loop(client, Runner(registry), registry, "Weather?")
    assert api.rejections == []
    assert _statuses(api) == ["/v1/messages"] * 3
    results = messages[2]["content"]
    assert isinstance(results, list)
    assert [block["is_error"] for block in results] == [False, True, True, True, False]  # type: ignore[typeddict-item]
    assert api.requests[0][1]["tools"] == registry.anthropic_tools()


async def test_chat_loop_is_accepted_at_every_turn(registry: Registry) -> None:
    """Chat Completions: every tool_call answered by one tool message, at every turn."""
    async with serve_strict(SCRIPT) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        messages = await chat_loop(client, Runner(registry), registry, "Weather?")
    assert api.rejections == []
    assert _statuses(api) == ["/v1/chat/completions"] * 3
    assert [m["role"] for m in messages] == ["user", "assistant", *["tool"] * 5, "assistant",
                                             "tool", "assistant"]  # fmt: skip


async def test_responses_loop_is_accepted_at_every_turn(registry: Registry) -> None:
    """Responses API: every call_id answered by a function_call_output, chained by id."""
    async with serve_strict(SCRIPT) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        ids = await responses_loop(client, Runner(registry), registry, "Weather?")
    assert api.rejections == []
    assert ids == ["resp_0", "resp_1", "resp_2"]
    outputs = api.requests[1][1]["input"]
    assert [item["call_id"] for item in outputs] == [f"call_0_{i}" for i in range(5)]


async def test_the_fake_rejects_what_the_real_apis_reject(registry: Registry) -> None:
    """Results split across messages, or missing, are refused: the fake is strict."""
    async with serve_strict(SCRIPT) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)
        first = await client.messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        turn = await Runner(registry).run_turn(fanout.calls_from_anthropic(first))
        answer = fanout.anthropic_tool_results(turn)
        blocks = list(answer["content"])
        split: list[anthropic.types.MessageParam] = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": blocks[:2]},  # type: ignore[typeddict-item]
            {"role": "user", "content": blocks[2:]},  # type: ignore[typeddict-item]
        ]
        with pytest.raises(anthropic.BadRequestError, match="tool_result ids"):
            await client.messages.create(model="m", max_tokens=10, messages=split)
        with pytest.raises(anthropic.BadRequestError, match="not answered"):
            await client.messages.create(model="m", max_tokens=10, messages=split[:2])


async def test_a_crashed_loop_resumes_after_repair(registry: Registry) -> None:
    """A history saved before its answers is refused as is, and accepted once repaired."""
    async with serve_strict(SCRIPT) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)
        messages: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Weather?"}]
        response = await client.messages.create(model="m", max_tokens=10, messages=messages)
        messages.append({"role": "assistant", "content": response.content})  # then: a crash
        with pytest.raises(anthropic.BadRequestError):
            await client.messages.create(model="m", max_tokens=10, messages=messages)
        await client.messages.create(
            model="m", max_tokens=10, messages=fanout.repair_anthropic_history(messages)
        )
    assert len(api.rejections) == 1


async def test_a_crashed_chat_loop_resumes_after_repair(registry: Registry) -> None:
    """Chat Completions: the same crash, refused, then accepted after repair."""
    async with serve_strict(SCRIPT) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        history: list[Any] = [{"role": "user", "content": "Weather?"}]
        completion = await client.chat.completions.create(model="m", messages=history)
        history.append(completion.choices[0].message)  # stored as the SDK object; then a crash
        history.append({"role": "tool", "tool_call_id": "call_0_0", "content": "clear"})
        await client.chat.completions.create(
            model="m", messages=fanout.repair_openai_history(history)
        )
    assert api.rejections == []


async def test_a_crashed_responses_loop_resumes_after_repair(registry: Registry) -> None:
    """Responses: output items stored without their outputs are repaired into valid input."""
    async with serve_strict(SCRIPT) as api:
        client = openai.AsyncOpenAI(api_key="test", base_url=f"{api.url}/v1", max_retries=0)
        items: list[Any] = [{"role": "user", "content": "Weather?"}]
        response = await client.responses.create(model="m", input=items)
        items += response.output  # then a crash before any function_call_output was saved
        await client.responses.create(model="m", input=fanout.repair_responses_input(items))
    assert api.rejections == []
    sent = api.requests[1][1]["input"]
    assert [i["call_id"] for i in sent if i.get("type") == "function_call_output"] == [
        f"call_0_{n}" for n in range(5)
    ]
