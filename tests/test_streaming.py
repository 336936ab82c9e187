"""Streaming turns: each call starts the moment its block is complete, and answers are those
of the finished message, whatever the stream does."""

from __future__ import annotations

import functools
import json
import os
import random
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from benchmarks.bench_stream import earliest_starts
from fanout import Kind, Registry, Runner, Status
from fanout._learning import TOGETHER
from fanout.testing import ServerConfig, serve_throttled

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from fanout.testing import HeaderStyle

Block = tuple[str, str, Any]  # id, tool name, arguments (a dict, or raw text)


def registry(log: list[tuple[str, float]] | None = None) -> Registry:
    reg = Registry()

    @reg.tool(kind=Kind.READS, cache_ttl=60)
    async def lookup(key: str) -> str:
        if log is not None:
            log.append((key, trio.current_time()))
        await trio.sleep(1)
        return f"value of {key}"

    @reg.tool(kind=Kind.PURE)
    async def double(x: int) -> int:
        return 2 * x

    @reg.tool(kind=Kind.READS)
    async def fails(why: str) -> str:
        raise ValueError(why)

    @reg.tool(kind=Kind.MUTATING)
    async def save(key: str) -> str:
        if log is not None:
            log.append((f"save {key}", trio.current_time()))
        return f"saved {key}"

    return reg


def _raw(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def anthropic_events(blocks: list[Block], size: int = 4) -> list[dict[str, Any]]:
    """The raw Messages stream of an assistant message holding ``blocks`` after some text."""
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 0},
    ]
    for i, (call_id, name, arguments) in enumerate(blocks, start=1):
        start = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        events.append({"type": "content_block_start", "index": i, "content_block": start})
        for piece in _pieces(_raw(arguments), size):
            delta = {"type": "input_json_delta", "partial_json": piece}
            events.append({"type": "content_block_delta", "index": i, "delta": delta})
        events.append({"type": "content_block_stop", "index": i})
    events += [
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
        {"type": "message_stop"},
    ]
    return events


def chat_events(blocks: list[Block], size: int = 4) -> list[dict[str, Any]]:
    """Chat Completions chunks of a message holding ``blocks``."""
    chunks: list[dict[str, Any]] = []
    for i, (call_id, name, arguments) in enumerate(blocks):
        for k, piece in enumerate(_pieces(_raw(arguments), size)):
            call: dict[str, Any] = {"index": i, "function": {"arguments": piece}}
            if k == 0:
                call.update(id=call_id, type="function")
                call["function"]["name"] = name
            chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return chunks


def responses_events(blocks: list[Block], size: int = 4) -> list[dict[str, Any]]:
    """Responses stream events of a response holding ``blocks`` as function calls."""
    events: list[dict[str, Any]] = []
    for i, (call_id, name, arguments) in enumerate(blocks):
        item = {"type": "function_call", "id": f"fc_{i}", "call_id": call_id, "name": name}
        events.append({"type": "response.output_item.added", "output_index": i, "item": {
            **item, "arguments": ""}})  # fmt: skip
        raw = _raw(arguments)
        for piece in _pieces(raw, size):
            events.append({
                "type": "response.function_call_arguments.delta", "item_id": f"fc_{i}",
                "output_index": i, "delta": piece,
            })  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": i, "item": {
            **item, "arguments": raw}})  # fmt: skip
    events.append({"type": "response.completed", "response": {"id": "resp_1"}})
    return events


async def paced(events: list[Any], gap: float) -> AsyncIterator[Any]:
    """The events as a stream, one every ``gap`` seconds."""
    for event in events:
        await trio.sleep(gap)
        yield event


def whole_message(blocks: list[Block]) -> dict[str, Any]:
    content = [{"type": "text", "text": "Hi"}] + [
        {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
        for call_id, name, arguments in blocks
    ]
    return {"role": "assistant", "content": content}


FORMATS: dict[str, tuple[Callable[..., list[Any]], Callable[[], fanout.StreamDecoder]]] = {
    "anthropic": (anthropic_events, fanout.AnthropicStream),
    "chat": (chat_events, fanout.ChatCompletionsStream),
    "responses": (responses_events, fanout.ResponsesStream),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
async def test_reads_start_as_their_blocks_complete_and_writes_at_the_end(
    fmt: str, autojump_clock: Any
) -> None:
    """Each read starts when its block closes, mid-stream; the write waits for the message."""
    log: list[tuple[str, float]] = []
    blocks: list[Block] = [
        ("c1", "lookup", {"key": "a"}),
        ("c2", "save", {"key": "b"}),
        ("c3", "lookup", {"key": "c"}),
    ]
    make_events, decoder = FORMATS[fmt]
    events = make_events(blocks, size=100)  # one piece per call: exact timings below
    turn = await Runner(registry(log)).run_stream(paced(events, 0.25), decoder())
    assert [r.status for r in turn.results] == [Status.OK] * 3
    starts = dict(log)
    end_of_stream = 0.25 * len(events)
    assert starts["save b"] == max(end_of_stream, starts["c"] + 1)  # after the reads end
    assert starts["a"] < starts["c"] <= end_of_stream
    closes = [i for i, e in enumerate(events) if _closes_a_call(fmt, e)]
    assert [starts["a"], starts["c"]] == [0.25 * (closes[0] + 1), 0.25 * (closes[2] + 1)]


def _closes_a_call(fmt: str, event: dict[str, Any]) -> bool:
    """Whether ``event`` completes a call: its block's end, or (Chat Completions, which
    has none) the start of the next call or the end of the choice."""
    if fmt == "anthropic":
        return event["type"] == "content_block_stop" and event["index"] > 0
    if fmt == "responses":
        return bool(event["type"] == "response.output_item.done")
    choice = event["choices"][0]
    calls = choice["delta"].get("tool_calls", [])
    next_call = bool(calls and "id" in calls[0] and calls[0]["index"] > 0)
    return choice.get("finish_reason") is not None or next_call


blocks_strategy = st.lists(
    st.tuples(
        st.sampled_from(["lookup", "double", "fails", "save", "nope"]),
        st.one_of(
            st.fixed_dictionaries({"key": st.sampled_from(["a", "b"])}),
            st.fixed_dictionaries({"x": st.integers(-3, 3)}),
            st.fixed_dictionaries({"why": st.text(max_size=5)}),
            st.just('{"key": "a"'),  # malformed: never closed
        ),
    ),
    max_size=7,
)


@settings(max_examples=int(os.environ.get("FANOUT_EXAMPLES", "150")), deadline=None)
@given(
    spec=blocks_strategy,
    fmt=st.sampled_from(sorted(FORMATS)),
    mutating=st.sampled_from(["one", "serial", "parallel"]),
    size=st.integers(1, 12),
    gap=st.sampled_from([0.0, 0.1, 0.7]),
    seed=st.integers(0, 2**32),
)
def test_a_streamed_message_gets_the_answers_of_the_whole_message(
    spec: list[tuple[str, Any]], fmt: str, mutating: str, size: int, gap: float, seed: int
) -> None:
    """The same message, streamed in any pieces or given whole: byte-identical answers."""
    blocks = [(f"call_{i}", name, arguments) for i, (name, arguments) in enumerate(spec)]
    make_events, decoder = FORMATS[fmt]

    async def main() -> tuple[str, str]:
        options: dict[str, Any] = {"mutating": mutating, "turn_timeout": 10_000}
        runner = Runner(registry(), rng=random.Random(seed), **options)
        streamed = await runner.run_stream(paced(make_events(blocks, size), gap), decoder())
        calls = [fanout.ToolCall(call_id, name, arguments) for call_id, name, arguments in blocks]
        whole = await Runner(registry(), rng=random.Random(seed), **options).run_turn(calls)
        return (
            json.dumps(fanout.anthropic_tool_results(streamed)),
            json.dumps(fanout.anthropic_tool_results(whole)),
        )

    streamed, whole = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert streamed == whole


class _LibraryAbort(BaseException):
    """A library's own ``BaseException``, neither a cancellation nor an interrupt."""


@pytest.mark.parametrize(
    "error",
    [ConnectionError("the connection dropped"), SystemExit(2), GeneratorExit(), _LibraryAbort()],
    ids=["connection", "system-exit", "generator-exit", "library"],
)
async def test_a_stream_that_breaks_off_answers_what_arrived_then_raises(
    error: BaseException, autojump_clock: Any
) -> None:
    """Complete reads run, the half-written call is answered error, writes refused, then
    the stream's error is raised: whatever it is, but a cancellation or an interrupt.
    (A ``SystemExit`` from the stream was taken for fanout failing: every call was
    answered "a failure of the runtime", and ``run()`` returned.)"""
    blocks: list[Block] = [
        ("c1", "lookup", {"key": "a"}),
        ("c2", "save", {"key": "b"}),
        ("c3", "lookup", {"key": "c"}),
    ]
    events = anthropic_events(blocks)
    cut = next(i for i, e in enumerate(events) if e.get("index") == 3 and "delta" in e)

    async def broken() -> AsyncIterator[Any]:
        for event in events[: cut + 1]:
            yield event
        raise error

    turn = Runner(registry()).stream_turn(broken(), fanout.AnthropicStream())
    with pytest.raises(type(error)):
        await turn.run()
    read, write, partial = turn.results
    assert read.status is Status.OK
    assert write.status is Status.REFUSED
    assert "broke off" in json.loads(write.content)["message"]
    assert partial.status is Status.ERROR
    message = json.loads(partial.content)["message"]
    assert f"the stream broke off ({type(error).__name__}" in message


async def test_a_keyboard_interrupt_from_the_stream_goes_up_and_says_so(
    autojump_clock: Any,
) -> None:
    """Ctrl-C delivered while the SDK reads the stream: it goes on up as itself, and the
    calls seen are answered as stopped by it, not by the caller cancelling."""
    events = anthropic_events([("c1", "lookup", {"key": "a"}), ("c2", "lookup", {"key": "b"})])
    cut = next(i for i, e in enumerate(events) if e.get("index") == 2 and "delta" in e)

    async def interrupted() -> AsyncIterator[Any]:
        for event in events[: cut + 1]:
            yield event
        await trio.sleep(0.01)
        raise KeyboardInterrupt

    turn = Runner(registry()).stream_turn(interrupted(), fanout.AnthropicStream())
    with pytest.raises(KeyboardInterrupt):
        await turn.run()
    assert [r.tool_use_id for r in turn.results] == ["c1", "c2"]
    for result in turn.results:
        assert result.status is Status.CANCELLED
        assert "KeyboardInterrupt" in json.loads(result.content)["message"]


async def test_a_message_that_ends_mid_call_answers_it_error(autojump_clock: Any) -> None:
    """A tool_use block never stopped: answered error, never lost; the rest runs."""
    events = anthropic_events([("c1", "double", {"x": 2}), ("c2", "double", {"x": 3})])
    events = [e for e in events if not (e["type"] == "content_block_stop" and e["index"] == 2)]
    turn = await Runner(registry()).run_stream(paced(events, 0.0), fanout.AnthropicStream())
    done, unfinished = turn.results
    assert (done.status, done.content) == (Status.OK, "4")
    assert unfinished.status is Status.ERROR
    assert "ended before this call's arguments were complete" in unfinished.content


async def test_the_deadline_covers_the_stream(autojump_clock: Any) -> None:
    """A stream slower than the turn's deadline: the running read and the half-written call
    are both answered timed_out at the deadline."""
    events = anthropic_events([("c1", "lookup", {"key": "a"}), ("c2", "lookup", {"key": "b"})])
    turn = await Runner(registry(), turn_timeout=2).run_stream(
        paced(events, 0.15), fanout.AnthropicStream()
    )
    assert trio.current_time() == 2.0
    running, half_written = turn.results
    assert (running.tool_use_id, running.status) == ("c1", Status.TIMED_OUT)
    assert json.loads(running.content)["started"] is True
    assert (half_written.tool_use_id, half_written.status) == ("c2", Status.TIMED_OUT)
    assert json.loads(half_written.content)["started"] is False


async def test_a_caller_cancelling_mid_stream_gets_every_id_seen_answered(
    autojump_clock: Any,
) -> None:
    """Cancelled mid-stream: the finished read's answer, the rest cancelled, none lost."""
    events = anthropic_events([("c1", "double", {"x": 1}), ("c2", "lookup", {"key": "b"})])
    turn = Runner(registry()).stream_turn(paced(events, 0.5), fanout.AnthropicStream())
    with trio.move_on_after(len(events) * 0.5 - 0.75):
        await turn.run()
    first, second = turn.results
    assert first.status is Status.OK
    assert second.status is Status.CANCELLED
    assert json.loads(second.content)["message"] == "the caller cancelled the turn"


async def test_a_repeated_id_in_a_stream_raises_after_answering(autojump_clock: Any) -> None:
    """Two blocks with one id: InvalidTurnError, raised once the first is answered."""
    events = anthropic_events([("c1", "double", {"x": 1}), ("c1", "double", {"x": 2})])
    turn = Runner(registry()).stream_turn(paced(events, 0.0), fanout.AnthropicStream())
    with pytest.raises(fanout.InvalidTurnError):
        await turn.run()
    assert [(r.tool_use_id, r.content) for r in turn.results] == [("c1", "2")]


async def test_a_repeat_arriving_after_its_leader_finished_shares_its_answer(
    autojump_clock: Any,
) -> None:
    """Single-flight across arrivals: the later identical read runs zero more times."""
    log: list[tuple[str, float]] = []
    blocks: list[Block] = [("c1", "lookup", {"key": "a"}), ("c2", "lookup", {"key": "a"})]
    events = anthropic_events(blocks, size=100)
    turn = await Runner(registry(log)).run_stream(paced(events, 1.0), fanout.AnthropicStream())
    assert [key for key, _ in log] == ["a"]
    assert [r.content for r in turn.results] == ["value of a", "value of a"]


def _ending_in_reverse(events: list[dict[str, Any]], ends: Callable[[Any], bool]) -> list[Any]:
    """The same events, every call's ending moved after all the rest of its message, the
    last call begun ending first: interleaved blocks, as a model may stream them."""
    endings = [event for event in events if ends(event)]
    others = [event for event in events if not ends(event)]
    return others[:-1] + endings[::-1] + others[-1:]


@pytest.mark.parametrize("fmt", ["anthropic", "responses"])
@pytest.mark.parametrize("mutating", ["one", "serial"])
async def test_interleaved_calls_are_answered_in_the_order_they_began(
    fmt: str, mutating: str, autojump_clock: Any
) -> None:
    """Blocks that end in the reverse of the order they began: the answers, and which write
    runs first (or alone), are the finished message's, as `run_turn` gives them."""
    blocks: list[Block] = [
        ("c1", "lookup", {"key": "a"}), ("c2", "save", {"key": "x"}),
        ("c3", "double", {"x": 2}), ("c4", "save", {"key": "y"}),
    ]  # fmt: skip
    make_events, decoder = FORMATS[fmt]
    events = _ending_in_reverse(make_events(blocks), functools.partial(_closes_a_call, fmt))
    log: list[tuple[str, float]] = []
    streamed = await Runner(registry(log), mutating=mutating).run_stream(
        paced(events, 0.1), decoder()
    )
    whole_log: list[tuple[str, float]] = []
    calls = [fanout.ToolCall(call_id, name, arguments) for call_id, name, arguments in blocks]
    whole = await Runner(registry(whole_log), mutating=mutating).run_turn(calls)
    assert [r.tool_use_id for r in streamed.results] == ["c1", "c2", "c3", "c4"]
    assert [c.position for c in streamed.calls] == [0, 1, 2, 3]
    assert streamed.results == whole.results
    assert [key for key, _ in log if key.startswith("save")] == [
        key for key, _ in whole_log if key.startswith("save")
    ]


async def _request_starts(
    closes_at: list[float],
    headers: HeaderStyle,
    rate: float,
    burst: int,
    latency: float,
    setup: float = 0.0,
) -> list[float]:
    """A fetch per block, block k closing at ``closes_at[k]``, against an API of ``rate``/s
    and ``burst`` (fanout told the same), each request ``setup`` s after its call starts:
    when each request reached the API."""
    blocks: list[Block] = [(f"c{k}", "fetch", {"n": k}) for k in range(len(closes_at))]
    events = anthropic_events(blocks, size=100)
    closes = [i for i, event in enumerate(events) if _closes_a_call("anthropic", event)]

    async def closing_on_time() -> AsyncIterator[Any]:
        for i, event in enumerate(events):
            if i in closes:
                await trio.sleep_until(began + closes_at[closes.index(i)])
            yield event

    config = ServerConfig(rate=rate, burst=burst, latency=latency, headers=headers)
    async with (
        serve_throttled(config) as api,
        fanout.http_client(base_url=api.url) as client,
    ):
        reg = Registry()

        @reg.tool(kind=Kind.READS, scopes=["api"], timeout=60)
        async def fetch(n: int) -> str:
            await trio.sleep(setup)
            return (await client.get(f"/items/{n}")).text

        runner = Runner(reg, scopes=[fanout.Scope("api", rate=rate, burst=burst)], inline_wait=60)
        began = trio.current_time()
        turn = await runner.run_stream(closing_on_time(), fanout.AnthropicStream())
    assert [r.status for r in turn.results] == [Status.OK] * len(closes_at)
    assert api.count(status=429) == 0
    return [record.start - began for record in api.records]


@pytest.mark.parametrize("headers", ["openai", "ietf", "x", "draft", "none"])
async def test_calls_start_as_their_blocks_close_or_the_apis_bucket_allows(
    headers: HeaderStyle, autojump_clock: Any
) -> None:
    """Eight blocks closing every 1/16 s, against an API of 4/s, burst 2: each request starts
    the moment its block closes, or the API's bucket holds a token, whatever the headers say
    (a whole Remaining is the count rounded down, not a token lost per response)."""
    starts = await _request_starts([k / 16 for k in range(1, 9)], headers, 4, 2, 0.05)
    # Two at once as blocks 1 and 2 close; then one per 0.25 s from the first. The second
    # goes over the connection the first opened, answered by then (`fanout._pools`), on
    # a token the bucket still held, and its answer shows how soon the API answers a
    # request over an open connection: none waits for the worst case of a first request
    # that reached the API late (README, "Slack sizes itself"). Through the pool its
    # place in the turn named, the fifth was the first over a reused connection, and
    # waited 0.05 s. The first took a full bucket over a new connection, which the API
    # may read ``TOGETHER`` late: every request after the two waits that much more.
    expected = [k / 16 + (TOGETHER if k > 2 else 0.0) for k in (1, 2, 5, 9, 13, 17, 21, 25)]
    assert starts == pytest.approx(expected, abs=1e-9)


async def test_a_streamed_call_of_the_burst_measures_its_send_lag_from_its_arrival(
    autojump_clock: Any,
) -> None:
    """Requests leaving 1/1024 s after admission: the second call of the burst, whose block
    closed 1/16 s after the first's, left 1/1024 s late, not 1/16 s; and it went over the
    first's connection, whose warm answer shows that lag was its tool's, not lateness on
    the way in. So every request reaches the API 1/1024 s after its earliest start, not
    a block later. (Through the pool its place in the turn named, the second opened a
    connection too, and the calls after the burst started the 1/1024 s after their tokens,
    the fifth 0.05 s: the worst case of a slow first connection.) The requests after the
    two go ``TOGETHER`` later still, as above."""
    setup = 1 / 1024
    closes_at = [k / 16 for k in range(1, 9)]
    starts = await _request_starts(closes_at, "none", 4, 2, 0.05, setup)
    best = earliest_starts(closes_at, 4, 2)
    expected = [at + setup + (TOGETHER if k > 1 else 0.0) for k, at in enumerate(best)]
    assert starts == pytest.approx(expected, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.integers(0, 40), min_size=1, max_size=10),
    rate=st.sampled_from([2, 4, 8]),
    burst=st.integers(1, 4),
    headers=st.sampled_from(["openai", "ietf", "x", "draft", "none"]),
    latency=st.sampled_from([1 / 64, 1 / 16, 3 / 32, 1 / 4, 1 / 2]),
)
def test_any_stream_gets_the_earliest_starts_the_api_allows(
    gaps: list[int], rate: int, burst: int, headers: HeaderStyle, latency: float
) -> None:
    """Blocks closing at any times (multiples of 1/64 s): each request starts as early as its
    block and the API's bucket allow, and no 429, whatever the headers say and however long
    the answers take against a token's time. A request over a reused connection sent before
    any such call answered may wait, at most the burst's earliest answer (a latency here),
    in case the burst's first request was slow to reach the API over its new connection."""
    closes_at = [sum(gaps[: k + 1]) / 64 for k in range(len(gaps))]
    starts = trio.run(
        _request_starts, closes_at, headers, rate, burst, latency,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )  # fmt: skip
    best = earliest_starts(closes_at, rate, burst)
    late = [start - at for start, at in zip(starts, best, strict=True)]
    assert min(late) >= -1e-9
    assert max(late) <= latency + 1e-9


@pytest.mark.parametrize(
    "event",
    [None, 42, "text", {"type": "content_block_delta"}, {"type": "content_block_stop", "index": 9},
     {"choices": "x"}, {"type": "response.output_item.done", "item": None}],
)  # fmt: skip
def test_decoders_skip_events_they_cannot_read(event: Any) -> None:
    """Hostile or unknown events are skipped, never raised."""
    for _, decoder in FORMATS.values():
        reader = decoder()
        assert reader.feed(event) == []
        assert reader.unfinished() == []


async def _events(events: list[Any]) -> Any:
    for event in events:
        await trio.lowlevel.checkpoint()
        yield event


async def test_a_streamed_call_without_an_id_spoils_the_stream_and_never_runs() -> None:
    """A ``tool_use`` block with ``"id": ""``: `run_turn` refuses the finished message, and
    the stream ran it (a write, answered with an empty id that no API takes back)."""
    ran: list[str] = []
    reg = Registry()

    @reg.tool(kind=Kind.MUTATING)
    async def send_email(to: str) -> str:
        ran.append(to)
        return "sent"

    block = {"type": "tool_use", "id": "", "name": "send_email", "input": {}}
    events = [
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": '{"to": "a@b.c"}'}},
        {"type": "content_block_stop", "index": 0},
    ]  # fmt: skip
    with pytest.raises(fanout.InvalidTurnError, match="has no id"):
        await Runner(reg).run_stream(_events(events), fanout.AnthropicStream())
    assert ran == []


@pytest.mark.parametrize(
    "event",
    [
        {"choices": [{"index": 0, "delta": {"tool_calls": 7}}]},
        {"choices": 5},
    ],
)
async def test_an_event_a_decoder_cannot_read_is_an_invalid_turn(event: Any) -> None:
    """A chunk no SDK writes (``"tool_calls": 7``): ``run_stream`` raised a bare
    ``TypeError``; every error fanout raises is a ``FanoutError``."""
    with pytest.raises(fanout.InvalidTurnError, match="cannot be read"):
        await Runner(Registry()).run_stream(_events([event]), fanout.ChatCompletionsStream())


async def test_a_stream_read_from_memory_lets_other_tasks_run() -> None:
    """A stream whose events are all at hand never waits; the turn yields to trio every
    few events, so its deadline can stop it (100,000 pieces of one message held a 0.5 s
    turn for 2.1 s, and nothing else ran meanwhile)."""
    ticks = 0
    seen: list[int] = []
    block = {"type": "tool_use", "id": "toolu_1", "name": "nothing", "input": {}}
    start = {"type": "content_block_start", "index": 0, "content_block": block}
    piece = {"type": "content_block_delta", "index": 0,
             "delta": {"type": "input_json_delta", "partial_json": " "}}  # fmt: skip

    class AtHand:
        def __aiter__(self) -> AtHand:
            self.left = 1000
            return self

        async def __anext__(self) -> Any:
            if self.left == 0:
                raise StopAsyncIteration
            self.left -= 1
            seen.append(ticks)
            return start if self.left == 999 else piece

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await trio.lowlevel.checkpoint()
            ticks += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await Runner(Registry()).run_stream(AtHand(), fanout.AnthropicStream())
        nursery.cancel_scope.cancel()
    assert seen[-1] - seen[0] >= 5  # it yields every 64 events: other tasks ran meanwhile


async def test_a_stream_whose_iterator_cannot_be_made_raises_its_error() -> None:
    """``__aiter__`` raising was taken for fanout failing: logged, and ``run_stream``
    returned a turn of no calls, as if the model had called nothing."""

    class Closed:
        def __aiter__(self) -> Any:
            raise ConnectionError("the stream was closed by the server")

    with pytest.raises(ConnectionError, match="closed by the server"):
        await Runner(Registry()).run_stream(Closed(), fanout.AnthropicStream())


async def test_a_cancellation_the_stream_kept_and_raised_is_its_error_not_the_callers(
    autojump_clock: Any,
) -> None:
    """A stream (a retry helper around an SDK's) raises a ``Cancelled`` it kept from an
    earlier, finished timeout: its calls are answered, and ``run`` raises the stream's
    error, which is no cancellation (raised as itself, it went through the caller's own
    scopes and ended ``trio.run``)."""
    kept: list[trio.Cancelled] = []
    with trio.move_on_after(0.001):
        try:
            await trio.sleep(1)
        except trio.Cancelled as cancelled:
            kept.append(cancelled)
            raise
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS)
    async def lookup(x: int) -> str:
        return "found"

    async def events() -> Any:
        block = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"x": 1}}
        yield {"type": "content_block_start", "index": 0, "content_block": block}
        yield {"type": "content_block_stop", "index": 0}
        raise kept[0]

    turn = fanout.Runner(registry).stream_turn(events(), fanout.AnthropicStream())
    raised: BaseException | None = None
    try:
        await turn.run()
    except BaseException as exc:  # caught whatever it is: a Cancelled would end the test
        raised = exc
    assert isinstance(raised, RuntimeError), repr(raised)
    assert "raised a cancellation" in str(raised)
    assert [(r.tool_use_id, r.status) for r in turn.results] == [("toolu_1", fanout.Status.OK)]
