"""Agent loops for the three model APIs, type-checked with ``mypy --strict`` in CI.

Each loop sends the registry's tool definitions, runs every call the model
asks for with fanout, and sends the answers back, until the model stops
calling tools. No line needs a cast: fanout's outputs are typed as the SDKs'
own params. The tests run these loops against a strict fake API.

The ``*_stream_loop`` versions stream each reply and pass the SDK's stream
helper to ``Runner.run_stream`` with the decoder of its API, so every read
starts the moment its block is complete instead of after the whole message
(their tests use a fake that streams each API's real server-sent events).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallUnionParam,
)

import fanout

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic
    from anthropic.types import MessageParam
    from openai import AsyncOpenAI
    from openai.types.responses import ResponseInputParam

MAX_TURNS = 8


async def anthropic_loop(
    client: AsyncAnthropic, runner: fanout.Runner, registry: fanout.Registry, prompt: str
) -> list[MessageParam]:
    """Messages API: tool_use blocks in, one user message of tool_result blocks out."""
    messages: list[MessageParam] = [{"role": "user", "content": prompt}]
    for _ in range(MAX_TURNS):
        response = await client.messages.create(
            model="claude-sonnet-5-5",
            max_tokens=1024,
            tools=registry.anthropic_tools(),
            messages=messages,
        )
        messages.append({"role": "assistant", "content": response.content})
        calls = fanout.calls_from_anthropic(response)
        if not calls:
            break
        turn = await runner.run_turn(calls)
        messages.append(fanout.anthropic_tool_results(turn))
    return messages


async def chat_loop(
    client: AsyncOpenAI, runner: fanout.Runner, registry: fanout.Registry, prompt: str
) -> list[ChatCompletionMessageParam]:
    """Chat Completions: tool_calls in, one role="tool" message per call out."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    for _ in range(MAX_TURNS):
        completion = await client.chat.completions.create(
            model="gpt-4o", tools=registry.openai_tools(), messages=messages
        )
        message = completion.choices[0].message
        messages.append(assistant_param(message))
        calls = fanout.calls_from_openai(message)
        if not calls:
            break
        turn = await runner.run_turn(calls)
        messages.extend(fanout.openai_tool_messages(turn))
    return messages


async def responses_loop(
    client: AsyncOpenAI, runner: fanout.Runner, registry: fanout.Registry, prompt: str
) -> list[str]:
    """Responses API: function_call items in, function_call_output items out.

    The server keeps the transcript (previous_response_id); each request
    sends only what is new. Returns the ids of the responses, in order.
    """
    pending: ResponseInputParam = [{"role": "user", "content": prompt}]
    previous: str | None = None
    ids: list[str] = []
    for _ in range(MAX_TURNS):
        response = await client.responses.create(
            model="gpt-4o",
            tools=registry.responses_tools(),
            input=pending,
            previous_response_id=previous,
        )
        ids.append(previous := response.id)
        calls = fanout.calls_from_responses(response)
        if not calls:
            break
        turn = await runner.run_turn(calls)
        pending = list(fanout.responses_tool_outputs(turn))
    return ids


def assistant_param(message: ChatCompletionMessage) -> ChatCompletionAssistantMessageParam:
    """The assistant message as a request param (the SDK has no to_param() for it), with
    every call fanout answers: function calls and custom (free-text) ones alike, or the
    answer to a call left out is refused."""
    param: ChatCompletionAssistantMessageParam = {"role": "assistant", "content": message.content}
    calls: list[ChatCompletionMessageToolCallUnionParam] = []
    for c in message.tool_calls or ():
        if isinstance(c, ChatCompletionMessageFunctionToolCall):
            name, arguments = c.function.name, c.function.arguments
            calls.append(
                {"id": c.id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        else:
            name, text = c.custom.name, c.custom.input
            calls.append({"id": c.id, "type": "custom", "custom": {"name": name, "input": text}})
    if calls:
        param["tool_calls"] = calls
    return param


async def anthropic_stream_loop(
    client: AsyncAnthropic, runner: fanout.Runner, registry: fanout.Registry, prompt: str
) -> list[MessageParam]:
    """Messages API, streamed: ``messages.stream()`` events in, tool_result blocks out."""
    messages: list[MessageParam] = [{"role": "user", "content": prompt}]
    for _ in range(MAX_TURNS):
        async with client.messages.stream(
            model="claude-sonnet-5-5",
            max_tokens=1024,
            tools=registry.anthropic_tools(),
            messages=messages,
        ) as stream:
            turn = await runner.run_stream(stream, fanout.AnthropicStream())
            message = await stream.get_final_message()
        messages.append({"role": "assistant", "content": message.content})
        # Given the message, every tool_use in it is answered, also those written after
        # the turn stopped reading (its deadline, or a failed call under cancel_siblings).
        reply = fanout.anthropic_tool_results(turn, message)
        if not reply["content"]:
            break
        messages.append(reply)
    return messages


async def chat_stream_loop(
    client: AsyncOpenAI, runner: fanout.Runner, registry: fanout.Registry, prompt: str
) -> list[ChatCompletionMessageParam]:
    """Chat Completions, streamed: the ``chat.completions.stream()`` helper's chunks in."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    for _ in range(MAX_TURNS):
        async with client.chat.completions.stream(
            model="gpt-4o", tools=registry.openai_tools(), messages=messages
        ) as stream:
            turn = await runner.run_stream(stream, fanout.ChatCompletionsStream())
            completion = await stream.get_final_completion()
        messages.append(assistant_param(completion.choices[0].message))
        replies = fanout.openai_tool_messages(turn, completion.choices[0].message)
        if not replies:
            break
        messages.extend(replies)
    return messages


async def responses_stream_loop(
    client: AsyncOpenAI, runner: fanout.Runner, registry: fanout.Registry, prompt: str
) -> list[str]:
    """Responses API, streamed: ``responses.stream()`` events in, outputs chained by id."""
    pending: ResponseInputParam = [{"role": "user", "content": prompt}]
    previous: str | None = None
    ids: list[str] = []
    for _ in range(MAX_TURNS):
        async with client.responses.stream(
            model="gpt-4o",
            tools=registry.responses_tools(),
            input=pending,
            previous_response_id=previous,
        ) as stream:
            turn = await runner.run_stream(stream, fanout.ResponsesStream())
            response = await stream.get_final_response()
        ids.append(previous := response.id)
        outputs = fanout.responses_tool_outputs(turn, response)
        if not outputs:
            break
        pending = list(outputs)
    return ids
