"""Adversarial streamed turns: whatever the stream does, every call emitted gets one answer.

The promise under test: for every tool call the model emitted, the next
request holds exactly one answer, in a shape the API accepts; a call never
starts before its arguments are complete; and nothing escapes the turn but
the SDK's own error or a typed ``fanout`` error. The streams are written as
each API's server-sent events, cut at any byte, and read by the real
``anthropic`` and ``openai`` clients, either through an exact-byte mock
transport (for the property tests) or from a loopback fake whose next
request is checked by the strict fake's rules.

Each break found is kept as a minimal repro, each red before its fix; the
one left as a strict expected failure is a limitation the README states
(Chat Completions deltas interleaved across calls).
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import openai
import pytest
import trio
import trio.testing
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState

import fanout
from fanout import Runner, Status
from tests.adversarial_streams_support import (
    ANTHROPIC,
    CHAT,
    EVENTS,
    PROMPT,
    RESPONSES,
    Body,
    Call,
    Hostile,
    anthropic_block,
    anthropic_client,
    anthropic_end,
    anthropic_message_start,
    assistant_with,
    chat_call_head,
    chat_call_piece,
    chat_chunk,
    encode,
    openai_client,
    serve_hostile,
    split,
    tagged_registry,
    transcript_errors,
)

SDK_ERRORS = (httpx2.HTTPError, anthropic.APIError, openai.APIError)
MODES = [(api, helper) for api in (ANTHROPIC, CHAT, RESPONSES) for helper in (False, True)]


# -- driving a turn through the real SDKs ---------------------------------------------


def answers_of(api: str, turn: fanout.Turn, message: Any = None) -> Any:
    """The turn's answers in the API's own shape for the next request; given the
    assistant message (as the README's loops give it), one for each of its calls."""
    if api == ANTHROPIC:
        return fanout.anthropic_tool_results(turn, message)
    if api == CHAT:
        return fanout.openai_tool_messages(turn, message)
    return list(fanout.responses_tool_outputs(turn, message))


def answered_ids(api: str, answers: Any) -> list[str]:
    if api == ANTHROPIC:
        return [block["tool_use_id"] for block in answers["content"]]
    if api == CHAT:
        return [message["tool_call_id"] for message in answers]
    return [item["call_id"] for item in answers]


def decoder_for(api: str) -> fanout.StreamDecoder:
    return {
        ANTHROPIC: fanout.AnthropicStream,
        CHAT: fanout.ChatCompletionsStream,
        RESPONSES: fanout.ResponsesStream,
    }[api]()


def final_ids(api: str, final: Any) -> list[str]:
    """The call ids in the SDK's own finished message: what the caller will send back."""
    if api == ANTHROPIC:
        return [block.id for block in final.content if block.type == "tool_use"]
    if api == CHAT:
        return [call.id for call in final.choices[0].message.tool_calls or ()]
    return [item.call_id for item in final.output if item.type == "function_call"]


async def open_stream(api: str, helper: bool, body: Body) -> Any:
    """The SDK's stream on ``body``, ready for ``async with``: the helper's manager or the
    raw ``create(..., stream=True)`` stream."""
    prompt: Any = [{"role": "user", "content": PROMPT}]
    if api == ANTHROPIC:
        claude = anthropic_client(body)
        if helper:
            return claude.messages.stream(model="m", max_tokens=64, messages=prompt)
        return await claude.messages.create(model="m", max_tokens=64, messages=prompt, stream=True)
    gpt = openai_client(body)
    if api == CHAT and helper:
        return gpt.chat.completions.stream(model="m", messages=prompt)
    if api == CHAT:
        return await gpt.chat.completions.create(model="m", messages=prompt, stream=True)
    if helper:
        return gpt.responses.stream(model="m", input=prompt)
    return await gpt.responses.create(model="m", input=prompt, stream=True)


FINISHED = {
    ANTHROPIC: "get_final_message",
    CHAT: "get_final_completion",
    RESPONSES: "get_final_response",
}


async def stream_turn(
    api: str,
    helper: bool,
    body: Body,
    runner: Runner,
    into: list[fanout.Turn] | None = None,
    *,
    finish: bool = True,
) -> tuple[fanout.Turn, BaseException | None, list[str] | None]:
    """Open the SDK's stream on ``body``, run the turn on it, and read the SDK's final
    message when the helper offers one: (turn, what ``run()`` raised, the final ids).
    ``into`` receives the turn as soon as it is built (for a caller that cancels it)."""
    raised: BaseException | None = None
    final: list[str] | None = None
    async with await open_stream(api, helper, body) as stream:
        turn = runner.stream_turn(stream, decoder_for(api))
        if into is not None:
            into.append(turn)
        try:
            await turn.run()
        except Exception as exc:
            raised = exc
        if helper and finish and raised is None:
            final = final_ids(api, await getattr(stream, FINISHED[api])())
    return turn, raised, final


# -- strategies ----------------------------------------------------------------------

BROKEN = ['{"tag": "x", "n":', "{broken", "[1, 2]", '"text"', "null", '{"n": 1}}', "{'a': 1}"]


@st.composite
def emitted_calls(draw: st.DrawFn, broken_json: bool, max_size: int = 10) -> list[Call]:
    """Calls a model might emit: known and unknown tools, good and broken arguments."""
    count = draw(st.integers(1, max_size))
    calls = []
    for position in range(count):
        tag = f"t{position}"
        name = draw(st.sampled_from(["count", "count", "explode", "save", "no_such_tool"]))
        options = [
            json.dumps({"tag": tag, "n": draw(st.integers(-5, 500))}),
            json.dumps({"tag": tag}),
            "",
        ]
        if broken_json:
            options += BROKEN
        arguments = draw(st.sampled_from(options))
        calls.append(
            Call(f"call_{position}_{draw(st.sampled_from(['a', 'bb', 'c-9']))}", name, arguments)
        )
    return calls


def expected_status(call: Call, earlier_writes: int) -> set[Status]:
    """The answers a call may get, from what it is (the promise's truthful half)."""
    if call.name == "no_such_tool":
        return {Status.REFUSED}
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return {Status.ERROR}
    takes = {"tag", "n"} if call.name == "count" else {"tag"}
    if not isinstance(value, dict) or "tag" not in value or not set(value) <= takes:
        return {Status.ERROR}
    if call.name == "explode":
        return {Status.ERROR}
    if call.name == "save":
        return {Status.OK} if earlier_writes == 0 else {Status.REFUSED}
    return {Status.OK}


def check_promise(
    api: str, calls: list[Call], turn: fanout.Turn, log: list[tuple[str, int]]
) -> None:
    """One answer per call, in order, accepted strictly; each run got exactly its arguments."""
    assert [r.tool_use_id for r in turn.results] == [c.id for c in calls]
    assert transcript_errors(api, calls, answers_of(api, turn)) == []
    writes = 0
    for call, result in zip(calls, turn.results, strict=True):
        assert result.status in expected_status(call, writes), (call, result)
        writes += call.name == "save" and result.status is Status.OK
    saved = [tag for tag, _ in log if tag.startswith("save ")]
    ok_saves = [c for c, r in zip(calls, turn.results, strict=True) if c.name == "save"
                and r.status is Status.OK]  # fmt: skip
    assert saved == [f"save {json.loads(c.arguments)['tag']}" for c in ok_saves]
    ran = {tag: n for tag, n in log if not tag.startswith("save ")}
    assert len(ran) == len([t for t, _ in log if not t.startswith("save ")])  # each ran once
    for call, result in zip(calls, turn.results, strict=True):
        if call.name == "count" and result.status is Status.OK:
            sent = json.loads(call.arguments)
            assert ran.pop(sent["tag"]) == sent.get("n", 0)
    assert ran == {}, f"tools ran that no complete call asked for: {ran}"


# -- what holds ----------------------------------------------------------------------


@settings(max_examples=45, deadline=None, derandomize=True)
@given(
    mode=st.sampled_from(MODES),
    data=st.data(),
    piece=st.integers(1, 9),
    cuts=st.lists(st.integers(1, 64), min_size=1, max_size=6),
)
def test_any_well_formed_stream_cut_at_any_byte_answers_every_call_once(
    mode: tuple[str, bool], data: st.DataObject, piece: int, cuts: list[int]
) -> None:
    """Any message, its bytes cut anywhere (down to one byte a read), through the real SDK
    stream or its helper: one answer per emitted call, in order, in a transcript the strict
    rules accept, and every tool run with exactly the arguments the model finished.

    (Anthropic's helper parses each call's JSON itself and raises on text that is not
    JSON, so its messages carry valid arguments only; the raw stream carries anything.)
    """
    api, helper = mode
    calls = data.draw(emitted_calls(broken_json=not (api == ANTHROPIC and helper)))
    chunks = split(encode(api, EVENTS[api](calls, piece)), cuts)
    log: list[tuple[str, int]] = []

    async def main() -> tuple[fanout.Turn, BaseException | None, list[str] | None]:
        return await stream_turn(api, helper, Body(chunks), Runner(tagged_registry(log)))

    turn, raised, final = trio.run(main)
    assert raised is None
    check_promise(api, calls, turn, log)
    if final is not None:
        assert final == [c.id for c in calls]


def calls_begun_and_completed(api: str, events: list[dict[str, Any]]) -> tuple[list[str], set[str]]:
    """Which calls the delivered ``events`` opened, in order, and which they completed
    (Chat Completions: the next call opened, or the choice finished)."""
    begun: list[str] = []
    completed: set[str] = set()
    for event in events:
        if api == ANTHROPIC and event["type"] == "content_block_start":
            if event["content_block"]["type"] == "tool_use":
                begun.append(event["content_block"]["id"])
        elif api == ANTHROPIC and event["type"] == "content_block_stop" and event["index"]:
            completed.add(begun[event["index"] - 1])
        elif api == CHAT:
            choice = event["choices"][0]
            opened = [c["id"] for c in choice["delta"].get("tool_calls", ()) if "id" in c]
            if opened or choice["finish_reason"]:
                completed.update(begun)
            begun += opened
        elif event["type"] == "response.output_item.added":
            begun.append(event["item"]["call_id"])
        elif event["type"] == "response.output_item.done":
            completed.add(event["item"]["call_id"])
    return begun, completed


@settings(max_examples=45, deadline=None, derandomize=True)
@given(
    mode=st.sampled_from(MODES),
    data=st.data(),
    at=st.floats(0, 1),
    drop=st.booleans(),
)
def test_a_stream_that_stops_at_any_byte_answers_every_call_begun(
    mode: tuple[str, bool], data: st.DataObject, at: float, drop: bool
) -> None:
    """The connection ends cleanly or breaks at any byte: exactly the calls whose opening
    event arrived whole are answered, once each, in order; complete ones are answered for
    what they are (reads run with their exact arguments), half-written ones are answered
    error and never run, and only the SDK's own error escapes."""
    api, helper = mode
    calls = data.draw(emitted_calls(broken_json=not (api == ANTHROPIC and helper), max_size=6))
    events = EVENTS[api](calls, 5)
    ends = [len(encode(api, events[: k + 1], done=False)) for k in range(len(events))]
    whole = encode(api, events)
    cut = int(at * len(whole))
    # A cut inside an event's closing blank line leaves whether it was delivered to the
    # SSE reader's end-of-stream flush; keep the property to cuts that say.
    assume(all(not (end - 2 < cut < end) for end in ends))
    delivered = [e for e, end in zip(events, ends, strict=True) if end <= cut]
    begun, completed = calls_begun_and_completed(api, delivered)
    log: list[tuple[str, int]] = []

    async def main() -> tuple[fanout.Turn, BaseException | None]:
        body = Body(split(whole[:cut], [7, 1, 13]), ending="drop" if drop else "end")
        runner = Runner(tagged_registry(log))
        turn, raised, _ = await stream_turn(api, helper, body, runner, finish=False)
        return turn, raised

    turn, raised = trio.run(main)
    if raised is not None:
        assert isinstance(raised, SDK_ERRORS), repr(raised)
    assert [r.tool_use_id for r in turn.results] == begun
    by_id = {c.id: c for c in calls}
    for result in turn.results:
        call = by_id[result.tool_use_id]
        if result.tool_use_id in completed:
            allowed = expected_status(call, 0) | (
                {Status.REFUSED} if call.name == "save" else set()
            )
            assert result.status in allowed, (call, result)
        elif call.name == "no_such_tool":  # refused for that, complete or not
            assert result.status is Status.REFUSED, (call, result)
        else:
            assert result.status is Status.ERROR, (call, result)
            told = json.loads(result.content)
            assert told["started"] is False
            assert "ended before" in told["message"] or "broke off" in told["message"]
    ran = [(tag, n) for tag, n in log if not tag.startswith("save ")]
    expected_runs = []
    for result in turn.results:
        call = by_id[result.tool_use_id]
        if call.name == "count" and result.status is Status.OK:
            sent = json.loads(call.arguments)
            expected_runs.append((sent["tag"], sent.get("n", 0)))
    assert sorted(ran) == sorted(expected_runs)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    api=st.sampled_from([ANTHROPIC, CHAT, RESPONSES]),
    data=st.data(),
    gaps=st.lists(st.sampled_from([0, 1, 3]), min_size=1, max_size=5),
    timeout_tenths=st.integers(1, 120),
)
def test_a_deadline_at_any_point_of_a_paced_stream_answers_every_call_begun(
    api: str, data: st.DataObject, gaps: list[int], timeout_tenths: int
) -> None:
    """Events paced at whole tenths of a (mock) second, the turn's deadline at any
    half-tenth: the turn returns by its deadline, and exactly the calls begun before it
    are answered, once each, in order; a call still being written is answered timed_out,
    never run."""
    calls = data.draw(emitted_calls(broken_json=True, max_size=5))
    events = EVENTS[api](calls, 6)
    timeout = timeout_tenths / 10 - 0.05
    times, now = [], 0.0
    for k in range(len(events)):
        now += gaps[k % len(gaps)] / 10
        times.append(now)
    delivered = [e for e, at in zip(events, times, strict=True) if at < timeout]
    begun, completed = calls_begun_and_completed(api, delivered)
    log: list[tuple[str, int]] = []

    async def paced() -> Any:
        for event, at in zip(events, times, strict=True):
            await trio.sleep_until(at)
            yield event

    async def main() -> tuple[fanout.Turn, float]:
        runner = Runner(tagged_registry(log), turn_timeout=timeout)
        turn = await runner.run_stream(paced(), decoder_for(api))
        return turn, trio.current_time()

    turn, returned_at = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert returned_at <= timeout + 1e-9
    if len(delivered) == len(events):
        check_promise(api, calls, turn, log)
        return
    assert [r.tool_use_id for r in turn.results] == begun
    by_id = {c.id: c for c in calls}
    for result in turn.results:
        call = by_id[result.tool_use_id]
        if result.tool_use_id in completed:
            allowed = expected_status(call, 0) | {Status.TIMED_OUT, Status.REFUSED}
            assert result.status in allowed, (call, result)
        else:
            assert result.status is Status.TIMED_OUT, (call, result)
            assert json.loads(result.content)["started"] is False
            assert all(tag != call.as_input().get("tag") for tag, _ in log)


@pytest.mark.parametrize("api", [ANTHROPIC, CHAT, RESPONSES])
async def test_very_many_streamed_calls_are_all_answered_and_accepted(api: str) -> None:
    """Very many calls in one streamed message, over loopback with the real client: the next
    request holds exactly one answer per call, and the strict fake accepts it."""
    calls = [Call(f"call_{i}", "count", json.dumps({"tag": f"t{i}", "n": i})) for i in range(150)]
    chunks = split(encode(api, EVENTS[api](calls, 11)), [4096])
    log: list[tuple[str, int]] = []
    runner = Runner(tagged_registry(log))
    async with serve_hostile(Hostile(chunks, calls)) as server:
        turn, final = await loopback_turn(api, server.url, runner)
        await send_next_request(api, server.url, calls, turn)
    assert server.rejections == []
    assert len(server.requests) == 2
    assert final == [c.id for c in calls]
    assert sorted(log) == sorted((f"t{i}", i) for i in range(150))


async def loopback_turn(api: str, url: str, runner: Runner) -> tuple[fanout.Turn, list[str]]:
    """The documented helper loop's first half, against the loopback fake."""
    prompt: Any = [{"role": "user", "content": PROMPT}]
    if api == ANTHROPIC:
        claude = anthropic.AsyncAnthropic(api_key="test", base_url=url, max_retries=0)
        async with claude.messages.stream(model="m", max_tokens=64, messages=prompt) as stream:
            turn = await runner.run_stream(stream, fanout.AnthropicStream())
            return turn, final_ids(api, await stream.get_final_message())
    gpt = openai.AsyncOpenAI(api_key="test", base_url=f"{url}/v1", max_retries=0)
    if api == CHAT:
        async with gpt.chat.completions.stream(model="m", messages=prompt) as chat:
            turn = await runner.run_stream(chat, fanout.ChatCompletionsStream())
            return turn, final_ids(api, await chat.get_final_completion())
    async with gpt.responses.stream(model="m", input=prompt) as responses:
        turn = await runner.run_stream(responses, fanout.ResponsesStream())
        return turn, final_ids(api, await responses.get_final_response())


async def send_next_request(api: str, url: str, emitted: list[Call], turn: fanout.Turn) -> None:
    """The loop's second half: the answers go back to the fake, which checks them strictly
    (the assistant turn sent is the one the model emitted)."""
    head: Any = assistant_with(api, emitted)
    answers = answers_of(api, turn, head[1:] if api == RESPONSES else head[-1])
    try:
        if api == ANTHROPIC:
            claude = anthropic.AsyncAnthropic(api_key="test", base_url=url, max_retries=0)
            await claude.messages.create(model="m", max_tokens=64, messages=[*head, answers])
            return
        gpt = openai.AsyncOpenAI(api_key="test", base_url=f"{url}/v1", max_retries=0)
        if api == CHAT:
            await gpt.chat.completions.create(model="m", messages=[*head, *answers])
        else:
            await gpt.responses.create(
                model="m", input=answers, previous_response_id="resp_hostile"
            )
    except (anthropic.BadRequestError, openai.BadRequestError):
        pass  # the fake recorded why in its rejections; the test asserts on them


@pytest.mark.parametrize("api", [ANTHROPIC, CHAT, RESPONSES])
async def test_tools_failing_while_the_stream_still_runs_are_answered_and_accepted(
    api: str,
) -> None:
    """Tools raise while later calls are still being written (the default on_failure):
    each failure is that call's answer, later calls still run, the next request is
    accepted."""
    calls = [
        Call(f"call_{i}", "explode" if i % 2 else "count", json.dumps({"tag": f"t{i}"}))
        for i in range(8)
    ]
    chunks = split(encode(api, EVENTS[api](calls, 3)), [40])
    log: list[tuple[str, int]] = []
    async with serve_hostile(Hostile(chunks, calls, gap=0.001)) as server:
        turn, final = await loopback_turn(api, server.url, Runner(tagged_registry(log)))
        await send_next_request(api, server.url, calls, turn)
    assert server.rejections == []
    assert final == [c.id for c in calls]
    assert [r.status for r in turn.results] == [Status.OK, Status.ERROR] * 4
    assert sorted(log) == [(f"t{i}", 0) for i in range(0, 8, 2)]


@pytest.mark.parametrize("mode", MODES)
async def test_a_caller_cancelling_a_hung_stream_gets_every_call_seen_answered(
    mode: tuple[str, bool],
) -> None:
    """The stream stalls after two calls began (one complete, one half-written) and the
    caller cancels: Cancelled propagates, nothing hangs, both ids are answered once, the
    complete call's answer is its own and the half-written one never ran."""
    api, helper = mode
    calls = [
        Call("call_0", "count", '{"tag": "t0", "n": 3}'),
        Call("call_1", "count", '{"tag": "t1", "n": 4}'),
    ]
    events = EVENTS[api](calls, 4)
    opening = next(i for i, e in enumerate(events) if '"call_1"' in json.dumps(e))
    keep = events[: opening + 2]  # call_1 opened and its first argument piece sent
    log: list[tuple[str, int]] = []
    answered = trio.Event()

    class FirstAnswered:
        def on_event(self, event: fanout.Event) -> None:
            if event.kind is fanout.EventKind.ANSWERED and event.call_id == "call_0":
                answered.set()

    runner = Runner(tagged_registry(log), instruments=[FirstAnswered()])
    built: list[fanout.Turn] = []
    body = Body(split(encode(api, keep, done=False), [9]), ending="hang")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream_turn, api, helper, body, runner, built)
            await answered.wait()
            await trio.sleep(0.05)  # let the stream reach its hang
            nursery.cancel_scope.cancel()
    (turn,) = built
    assert [r.tool_use_id for r in turn.results] == ["call_0", "call_1"]
    first, second = turn.results
    assert (first.status, first.content) == (Status.OK, "t0=3")
    assert second.status is Status.CANCELLED
    assert json.loads(second.content)["message"] == "the caller cancelled the turn"
    assert log == [("t0", 3)]


async def test_a_repeated_id_through_the_sdk_is_a_typed_error_with_unique_answers() -> None:
    """Two streamed blocks with one id cannot be answered validly: run() raises
    InvalidTurnError (a typed fanout error), and no id is answered twice."""
    calls = [Call("dup", "count", '{"tag": "t0"}'), Call("dup", "count", '{"tag": "t1"}')]
    for api in (ANTHROPIC, CHAT, RESPONSES):
        body = Body(split(encode(api, EVENTS[api](calls, 3)), [5]))
        turn, raised, _ = await stream_turn(api, False, body, Runner(tagged_registry([])))
        assert isinstance(raised, fanout.InvalidTurnError), (api, raised)
        ids = [r.tool_use_id for r in turn.results]
        assert ids == ["dup"], api


async def test_anthropic_deltas_after_a_block_stops_do_not_change_what_ran() -> None:
    """Argument text that arrives after its block's stop is not part of the call: the call
    ran once, at its stop, with the arguments complete then."""
    call = Call("call_0", "count", '{"tag": "t0", "n": 2}')
    events = [anthropic_message_start(), *anthropic_block(0, call, 5)]
    late = {"type": "input_json_delta", "partial_json": ', "n": 99}'}
    events += [{"type": "content_block_delta", "index": 0, "delta": late}, *anthropic_end()]
    log: list[tuple[str, int]] = []
    body = Body(split(encode(ANTHROPIC, events), [3]))
    turn, raised, _ = await stream_turn(ANTHROPIC, False, body, Runner(tagged_registry(log)))
    assert raised is None
    assert [(r.tool_use_id, r.status, r.content) for r in turn.results] == [
        ("call_0", Status.OK, "t0=2")
    ]
    assert log == [("t0", 2)]


async def test_raw_anthropic_stream_answers_json_cut_off_by_max_tokens_as_error() -> None:
    """The raw stream's half of the max_tokens case: a block stopped with its JSON cut off
    is answered error and never run (the helper's half is the next test)."""
    call = Call("call_0", "count", '{"tag": "t0", "n": 12')
    events = [anthropic_message_start(), *anthropic_block(0, call, 4), *anthropic_end("max_tokens")]
    log: list[tuple[str, int]] = []
    body = Body(split(encode(ANTHROPIC, events), [6]))
    turn, raised, _ = await stream_turn(ANTHROPIC, False, body, Runner(tagged_registry(log)))
    assert raised is None
    assert [r.status for r in turn.results] == [Status.ERROR]
    assert log == []


@pytest.mark.parametrize("api", [CHAT, RESPONSES])
async def test_unknown_events_and_foreign_choices_change_no_answer(api: str) -> None:
    """Events of kinds fanout does not know, and a second choice's tool calls (n > 1), are
    skipped: the answers are those of the first choice's calls alone."""
    calls = [Call("call_0", "count", '{"tag": "t0", "n": 1}')]
    events = EVENTS[api](calls, 3)
    if api == CHAT:
        other = chat_chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "other",
                        "type": "function",
                        "function": {"name": "count", "arguments": "{}"},
                    }
                ]
            }
        )
        other["choices"][0]["index"] = 1
        events.insert(2, other)
    else:
        events.insert(
            1,
            {
                "type": "response.reasoning_summary_text.delta",
                "item_id": "rs",
                "output_index": 0,
                "summary_index": 0,
                "delta": "hmm",
            },
        )
        events.insert(
            2,
            {
                "type": "response.function_call_arguments.delta",
                "item_id": "fc_nobody",
                "output_index": 7,
                "delta": "{}",
            },
        )
    log: list[tuple[str, int]] = []
    body = Body(split(encode(api, events), [2]))
    turn, raised, _ = await stream_turn(api, False, body, Runner(tagged_registry(log)))
    assert raised is None
    assert [(r.tool_use_id, r.content) for r in turn.results] == [("call_0", "t0=1")]
    assert log == [("t0", 1)]


# -- bugs: minimal repros --------------------------------------------------------------


async def test_helper_stream_answers_a_call_whose_json_was_cut_off_by_max_tokens_as_error() -> None:
    """messages.stream(): the model hit max_tokens inside a tool_use block, so its JSON ends
    at '{"tag": "t0", "n": 12' (the model may have been writing 120). The SDK's snapshot is
    a partial parse, {"tag": "t0", "n": 12}; the call must be answered error and not run,
    as the raw stream answers it."""
    call = Call("call_0", "count", '{"tag": "t0", "n": 12')
    events = [anthropic_message_start(), *anthropic_block(0, call, 4), *anthropic_end("max_tokens")]
    log: list[tuple[str, int]] = []
    body = Body(split(encode(ANTHROPIC, events), [6]))
    turn, raised, _ = await stream_turn(ANTHROPIC, True, body, Runner(tagged_registry(log)))
    assert raised is None
    assert log == [], f"a tool ran with arguments the model never finished: {log}"
    assert [r.status for r in turn.results] == [Status.ERROR]


@pytest.mark.parametrize("api", [ANTHROPIC, RESPONSES])
async def test_a_reused_block_key_begins_a_call_of_its_own(api: str) -> None:
    """Two calls streamed under one key (Anthropic: block index 0 twice; Responses: two
    function_call items with one item id), as a proxy that renumbers badly sends them. The
    SDK's final message holds both calls, so the next request must answer both (or the
    turn must raise a typed error); fanout answers only the first and the fake refuses."""
    first = Call("call_0", "count", '{"tag": "t0"}')
    second = Call("call_1", "count", '{"tag": "t1"}')
    if api == ANTHROPIC:
        second = Call("call_1", "count", "")  # no deltas: the SDK's snapshot stays valid
        events = [anthropic_message_start(), *anthropic_block(0, first, 5)]
        start = {"type": "tool_use", "id": second.id, "name": second.name, "input": {}}
        events += [
            {"type": "content_block_start", "index": 0, "content_block": start},
            {"type": "content_block_stop", "index": 0},
            *anthropic_end(),
        ]
    else:
        events = EVENTS[RESPONSES]([first, second], 5)
        for event in events:
            for item in [event.get("item"), *event.get("response", {}).get("output", [])]:
                if item:
                    item["id"] = "fc_0"
            if event.get("item_id"):
                event["item_id"] = "fc_0"
    emitted = [first, Call(second.id, second.name, second.arguments or "{}")]
    hostile = Hostile(split(encode(api, events), [64]), emitted)
    async with serve_hostile(hostile) as server:
        turn, final = await loopback_turn(api, server.url, Runner(tagged_registry([])))
        await send_next_request(api, server.url, emitted, turn)
    assert final == ["call_0", "call_1"]  # what the SDK hands the caller to send back
    assert server.rejections == []


async def test_interleaved_chat_deltas_run_each_call_with_all_its_arguments() -> None:
    """Chat Completions: two calls opened, then their arguments by index, interleaved. The
    OpenAI SDK accumulates by index (n=5 and n=7); fanout, which took a call complete
    when the next began, started both with empty arguments and single-flight merged
    them. Each now runs with what the SDK gathered."""
    calls = [
        Call("call_0", "count", '{"tag": "t0", "n": 5}'),
        Call("call_1", "count", '{"tag": "t1", "n": 7}'),
    ]
    events = [
        chat_chunk({"role": "assistant", "content": None}),
        chat_call_head(0, Call("call_0", "count", "")),
        chat_call_head(1, Call("call_1", "count", "")),
        chat_call_piece(0, calls[0].arguments),
        chat_call_piece(1, calls[1].arguments),
        chat_chunk({}, "tool_calls"),
    ]
    log: list[tuple[str, int]] = []
    chunks = split(encode(CHAT, events), [17])
    state = ChatCompletionStreamState()
    gpt = openai_client(Body(chunks))
    prompt: Any = [{"role": "user", "content": PROMPT}]
    async with await gpt.chat.completions.create(model="m", messages=prompt, stream=True) as s:

        async def kept() -> Any:
            async for chunk in s:
                state.handle_chunk(chunk)
                yield chunk

        turn = await Runner(tagged_registry(log)).run_stream(kept(), fanout.ChatCompletionsStream())
    sdk_calls = state.get_final_completion().choices[0].message.tool_calls or []
    assert [json.loads(c.function.arguments) for c in sdk_calls] == [
        {"tag": "t0", "n": 5},
        {"tag": "t1", "n": 7},
    ]
    answers = [(r.status.value, r.content) for r in turn.results]
    assert answers == [("ok", "t0=5"), ("ok", "t1=7")], answers
    assert sorted(log) == [("t0", 5), ("t1", 7)], f"the tools ran with {log}"


async def test_cancel_siblings_mid_stream_answers_the_later_calls_given_the_message() -> None:
    """on_failure='cancel_siblings': a tool fails while the model is still writing. The
    documented loop then takes stream.get_final_message(), which holds every call: the
    turn reads the message to its end (cancelled in the middle of a read, the SDK's
    stream was closed, and its final message held the first call alone); the answers
    must cover them all (cancelled, saying why), or the API refuses the request."""
    calls = [
        Call("call_0", "explode", '{"tag": "t0"}'),
        Call("call_1", "count", '{"tag": "t1"}'),
        Call("call_2", "count", '{"tag": "t2"}'),
    ]
    chunks = [encode(ANTHROPIC, [e]) for e in EVENTS[ANTHROPIC](calls, 4)]
    runner = Runner(tagged_registry([]), on_failure="cancel_siblings")
    async with serve_hostile(Hostile(chunks, calls, gap=0.02)) as server:
        turn, final = await loopback_turn(ANTHROPIC, server.url, runner)
        await send_next_request(ANTHROPIC, server.url, calls, turn)
    assert final == [c.id for c in calls]  # the SDK's final message, whole
    # The turn read only what came before it stopped; the adapter, given the final
    # message, answers the rest (cancelled, never run).
    head = assistant_with(ANTHROPIC, calls)
    assert answered_ids(ANTHROPIC, answers_of(ANTHROPIC, turn, head[-1])) == [c.id for c in calls]
    assert server.rejections == []


async def test_a_turn_deadline_mid_stream_answers_the_later_calls_given_the_message() -> None:
    """The README's streaming loop with turn_timeout shorter than the message: the turn
    returns at its deadline, the loop reads the SDK's final message (every call), and the
    next request must answer each of them; the strict fake refuses the missing ones."""
    calls = [Call(f"call_{i}", "count", json.dumps({"tag": f"t{i}"})) for i in range(3)]
    chunks = [encode(ANTHROPIC, [e]) for e in EVENTS[ANTHROPIC](calls, 4)]
    runner = Runner(tagged_registry([]), turn_timeout=0.3)
    async with serve_hostile(Hostile(chunks, calls, gap=0.03)) as server:
        with trio.fail_after(10):
            turn, final = await loopback_turn(ANTHROPIC, server.url, runner)
        await send_next_request(ANTHROPIC, server.url, calls, turn)
    assert set(final) <= {c.id for c in calls}  # the SDK's snapshot, as far as it read
    # The turn read only what came before it stopped; the adapter, given the final
    # message, answers the rest (cancelled, never run).
    head = assistant_with(ANTHROPIC, calls)
    assert answered_ids(ANTHROPIC, answers_of(ANTHROPIC, turn, head[-1])) == [c.id for c in calls]
    assert server.rejections == []


@pytest.mark.parametrize("api", [ANTHROPIC, RESPONSES])
async def test_an_unhashable_index_does_not_escape_the_turn(api: str) -> None:
    """A stream event whose index (Anthropic) or item id (Responses) is a list: the SDK
    passes it through unvalidated. The decoders promise never to raise; the turn may end
    with a typed fanout error or the call answered, but not a bare TypeError."""
    call = Call("call_0", "count", '{"tag": "t0"}')
    if api == ANTHROPIC:
        events = [anthropic_message_start(), *anthropic_block(0, call, 5), *anthropic_end()]
        for event in events:
            if "index" in event:
                event["index"] = [0]
    else:
        events = EVENTS[RESPONSES]([call], 5)
        for event in events:
            if "item" in event:
                event["item"] = {**event["item"], "id": ["fc"]}
    _, raised, _ = await stream_turn(
        api, False, Body(split(encode(api, events), [8])), Runner(tagged_registry([]))
    )
    assert raised is None or isinstance(raised, fanout.FanoutError), repr(raised)


async def test_a_call_batched_with_a_repeated_id_is_answered_truthfully(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """One Chat chunk completes call 'a' and opens a second 'a' and a 'b': the turn raises
    InvalidTurnError (right), but the first 'a', complete and valid, is answered as if the
    caller had cancelled, which nobody did."""
    chunks = [
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "a",
                                "type": "function",
                                "function": {"name": "count", "arguments": '{"tag": "t0"}'},
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "a",
                                "type": "function",
                                "function": {"name": "count", "arguments": '{"tag": "t1"}'},
                            },
                            {
                                "index": 2,
                                "id": "b",
                                "type": "function",
                                "function": {"name": "count", "arguments": '{"tag": "t2"}'},
                            },
                        ]
                    },
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]

    async def stream() -> Any:
        for chunk in chunks:
            yield chunk

    turn = Runner(tagged_registry([])).stream_turn(stream(), fanout.ChatCompletionsStream())
    with pytest.raises(fanout.InvalidTurnError):
        await turn.run()
    assert [r.tool_use_id for r in turn.results][:1] == ["a"]
    assert "the caller cancelled" not in turn.results[0].content
