"""Streaming turns: does a turn take ``max(generation, tools)`` rather than their sum?

A loopback server streams an Anthropic Messages reply holding N ``tool_use``
blocks over T seconds, the blocks spaced evenly (block k closes at ``T·k/N``),
read by the real ``anthropic.AsyncAnthropic`` client. Every tool makes one
request to a throttled API (``fanout.testing.serve_throttled``, RATE/s, burst
BURST, LATENCY each) through ``fanout.http_client``. Three runs per (N, T),
each on a fresh server and runner, real time:

* **streaming**: ``runner.run_stream(stream, fanout.AnthropicStream())``;
* **whole message**: read the stream to its end, then ``runner.run_turn``;
* **tools alone**: the same N calls with no stream at all.

Turn latency is measured from the moment the model's server began streaming
(its clock, the same trio clock as the client's) to the last answer, so the
SDK's time to hand over the first event counts too.

Two yardsticks. The issue's **ideal**, ``max(T, tools alone)``, counts the
tools from the message's first moment with every call known at once, which
no streaming client can have: the first call exists only when its block
closes at ``T/N``, and on a rate-limited API every call after the burst
queues behind it, so each starts ``T/N`` later than in the tools-alone run;
and the last call's request can only be made once its block closes at T.
The **best possible** is the least latency any client could reach: each
request sent the moment its call exists *and* the API's bucket (full at the
start) holds a token, answered LATENCY later, worked out exactly
(``best_possible``). The ratio to the best possible is what fanout's
scheduling and the stream's decoding cost; the ratio to the ideal adds the
``T/N`` (or LATENCY) that no client can avoid. On ``MockClock`` the streaming
turn meets the best possible exactly (``tests/test_streaming.py``).

Every point runs twice: with the API stating its limits in OpenAI-style
headers (fanout configured with the same limits also obeys what the headers
say), and with the API stating nothing (fanout's configured bucket alone), to
tell the cost of streaming apart from the cost of reading the headers.

``python -m benchmarks.bench_stream`` writes ``benchmarks/results/stream.md``
and ``stream.png``; ``--quick`` runs one small point once (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import statistics
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anthropic
import attrs
import h11
import trio

import fanout
from fanout.testing import HeaderStyle, ServerConfig, serve_throttled

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

RATE, BURST, LATENCY = 4.0, 2, 0.05
POINTS = [(8, 2.0), (16, 4.0), (8, 0.5), (16, 2.0)]
HEADERS: dict[HeaderStyle, str] = {
    "openai": "the API states its limits (OpenAI-style headers)",
    "none": "the API states no limits (fanout's configured bucket alone)",
}
REPEATS = 3
RESULTS = Path(__file__).parent / "results"


def _timeline(n: int, seconds: float) -> list[tuple[float, str, dict[str, Any]]]:
    """When each event of the message is sent: block k from ``T·(k-1)/N`` to ``T·k/N``."""
    message = {"id": "msg_bench", "type": "message", "role": "assistant", "model": "bench",
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
    events = [(0.0, "message_start", {"message": message})]
    step = seconds / n
    for k in range(n):
        block = {"type": "tool_use", "id": f"toolu_{k:02d}", "name": "fetch", "input": {}}
        events.append((step * k, "content_block_start", {"index": k, "content_block": block}))
        for i, piece in enumerate(['{"item', f'": {k}', "}"], start=1):
            delta = {"type": "input_json_delta", "partial_json": piece}
            events.append((step * (k + i / 4), "content_block_delta", {"index": k, "delta": delta}))
        events.append((step * (k + 1), "content_block_stop", {"index": k}))
    end = {"stop_reason": "tool_use", "stop_sequence": None}
    events.append((seconds, "message_delta", {"delta": end, "usage": {"output_tokens": 1}}))
    events.append((seconds, "message_stop", {}))
    return [(at, name, {"type": name, **data}) for at, name, data in events]


def earliest_starts(exists: list[float], rate: float, burst: float) -> list[float]:
    """When requests can start, the earliest: each once it ``exists`` and a bucket of
    ``burst`` tokens refilled at ``rate`` (full at 0) holds a token.

    GCRA's virtual scheduling of the API's own bucket. The requests exist in
    order and cost one token each, so starting each as early as both allow
    is optimal.
    """
    full_at, starts = 0.0, []  # when the bucket would be full again
    for at in exists:
        start = max(at, full_at - (burst - 1) / rate)
        full_at = max(full_at, start) + 1 / rate
        starts.append(start)
    return starts


def best_possible(mode: str, n: int, seconds: float) -> float:
    """The least latency of ``mode`` any client could reach, from the stream's start:
    each call exists once its block closed (streaming), once the message ended (whole),
    or at once (alone), and its answer comes LATENCY after its request starts."""
    exists = {
        "streaming": [seconds * (k + 1) / n for k in range(n)],
        "whole": [seconds] * n,
        "alone": [0.0] * n,
    }[mode]
    return max(earliest_starts(exists, RATE, BURST)) + LATENCY


async def _stream_message(
    n: int, seconds: float, began: list[float], stream: trio.SocketStream
) -> None:
    """Answer one request with the paced message, as Anthropic's server-sent events;
    ``began`` gets the moment the message starts."""
    conn = h11.Connection(h11.SERVER)
    async with stream:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.EndOfMessage):
                break
        headers = [("content-type", "text/event-stream")]
        await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
        start = trio.current_time()
        began.append(start)
        for at, name, data in _timeline(n, seconds):
            await trio.sleep_until(start + at)
            sse = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            await stream.send_all(conn.send(h11.Data(sse)) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")


@attrs.frozen
class _Model:
    """A client of the loopback 'model', and when each of its messages began streaming."""

    client: anthropic.AsyncAnthropic
    began: list[float]


@asynccontextmanager
async def _model(n: int, seconds: float) -> AsyncIterator[_Model]:
    """A loopback 'model' that streams the N calls over T seconds, and its client."""
    began: list[float] = []
    async with trio.open_nursery() as nursery:
        handler = partial(_stream_message, n, seconds, began)
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        client = anthropic.AsyncAnthropic(
            api_key="bench", base_url=f"http://127.0.0.1:{port}", max_retries=0
        )
        try:
            yield _Model(client, began)
        finally:
            nursery.cancel_scope.cancel()


def _registry(http: Any) -> fanout.Registry:
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS, scopes=["api"], timeout=30)
    async def fetch(item: int) -> str:
        response = await http.get(f"/items/{item}")
        response.raise_for_status()
        return f"item {item}"

    return registry


async def _one(mode: str, n: int, seconds: float, headers: HeaderStyle) -> tuple[float, int]:
    """One turn in ``mode``, on a fresh API and runner: seconds from first event to answers,
    and how many requests the API refused 429 (fanout waited and retried them)."""
    config = ServerConfig(
        rate=RATE, burst=BURST, latency=LATENCY, headers=headers, retry_after_precise=True
    )
    async with serve_throttled(config) as api, _model(n, seconds) as model:
        http = fanout.http_client(base_url=api.url)
        scope = fanout.Scope("api", rate=RATE, burst=BURST)
        runner = fanout.Runner(_registry(http), scopes=[scope], turn_timeout=120, inline_wait=120)
        async with http:
            if mode == "alone":
                began = trio.current_time()
                calls = [fanout.ToolCall(f"toolu_{k:02d}", "fetch", {"item": k}) for k in range(n)]
                turn: fanout.Turn = await runner.run_turn(calls)
            else:
                turn, began = await _turn_from_stream(mode, runner, model)
            elapsed = trio.current_time() - began
        statuses = {result.status for result in turn.results}
        if statuses != {fanout.Status.OK} or len(turn.results) != n:
            raise RuntimeError(f"{mode} N={n}: answers {statuses}")
        return elapsed, sum(record.status == 429 for record in api.records)


async def _turn_from_stream(
    mode: str, runner: fanout.Runner, model: _Model
) -> tuple[fanout.Turn, float]:
    """The turn of the model's message, streamed or whole, and when the message began."""
    async with await model.client.messages.create(
        model="bench", max_tokens=1024, messages=[{"role": "user", "content": "go"}], stream=True
    ) as stream:
        turn: fanout.Turn
        if mode == "streaming":
            turn = await runner.run_stream(stream, fanout.AnthropicStream())
        else:
            decoder = fanout.AnthropicStream()
            calls = [call async for event in stream for call in decoder.feed(event)]
            turn = await runner.run_turn(calls)
    return turn, model.began[-1]


@attrs.frozen
class Point:
    """One (N, T) with one header style: the median of each mode over the repeats, in seconds."""

    headers: HeaderStyle
    n: int
    seconds: float
    alone: float
    streaming: float
    whole: float
    refused: dict[str, int]  # the API's 429s per mode, over all runs

    @property
    def ideal(self) -> float:
        """The issue's yardstick: ``max(T, tools alone)``."""
        return max(self.seconds, self.alone)

    @property
    def best(self) -> float:
        """The least latency any streaming client could reach (``best_possible``)."""
        return best_possible("streaming", self.n, self.seconds)


def measure(
    points: list[tuple[int, float]], repeats: int, styles: list[HeaderStyle]
) -> list[Point]:
    """Run every point ``repeats`` times per mode, interleaved, and keep the medians."""
    measured = []
    for headers, (n, seconds) in ((h, point) for h in styles for point in points):
        runs: dict[str, list[float]] = {"alone": [], "streaming": [], "whole": []}
        refused = dict.fromkeys(runs, 0)
        for _ in range(repeats):
            for mode, times in runs.items():
                elapsed, rejected = trio.run(_one, mode, n, seconds, headers)
                times.append(elapsed)
                refused[mode] += rejected
        medians = {mode: statistics.median(times) for mode, times in runs.items()}
        measured.append(Point(headers, n, seconds, **medians, refused=refused))
        print(f"{headers} N={n} T={seconds}: {medians}, {refused} refused", flush=True)
    return measured


def markdown(points: list[Point], repeats: int) -> str:
    """The report: one row per (N, T), latencies and their ratios to both yardsticks."""
    lines = [
        "## streaming turns: latency against max(T, tools alone)",
        "",
        f"A loopback server streams an Anthropic message of N `tool_use` blocks over T "
        f"seconds (block k closes at T·k/N), read by `anthropic.AsyncAnthropic`; each tool "
        f"makes one request to a throttled API ({RATE:g}/s, burst {BURST}, {LATENCY * 1000:g} "
        f"ms latency). Latency runs from the moment the server began streaming the message "
        f"to the last answer; median of {repeats} runs, real time. Ideal = max(T, tools "
        f"alone), the issue's yardstick. Best possible = the least latency any streaming "
        f"client could reach, worked out exactly: each request sent once its block has "
        f"closed and the API's bucket holds a token, answered {LATENCY * 1000:g} ms later "
        f"(the ideal does not count that the first call exists only at T/N, nor that the "
        f"last is sent at T at the earliest). The last column counts the API's 429s over "
        f"all runs of the point, streaming / whole / alone (fanout waited as told and "
        f"retried); every call was answered ok in every run.",
    ]
    for headers in dict.fromkeys(p.headers for p in points):
        lines += [
            "",
            f"### {HEADERS[headers]}",
            "",
            "| N | T | tools alone | ideal | best possible | streaming | / best | / ideal "
            "| whole message | / ideal | 429s |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        lines += [_row(p) for p in points if p.headers == headers]
    lines += ["", "![streaming vs whole message](stream.png)", ""]
    return "\n".join(lines)


def _row(p: Point) -> str:
    return (
        f"| {p.n} | {p.seconds:g} s | {p.alone:.3f} s | {p.ideal:.3f} s | {p.best:.3f} s "
        f"| {p.streaming:.3f} s | {p.streaming / p.best:.3f} | {p.streaming / p.ideal:.3f} "
        f"| {p.whole:.3f} s | {p.whole / p.ideal:.3f} | {p.refused['streaming']} / "
        f"{p.refused['whole']} / {p.refused['alone']} |"
    )


def plot(points: list[Point], path: Path) -> None:
    """Grouped bars per (N, T): ideal, best possible, streaming, whole message."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = list(dict.fromkeys(p.headers for p in points))
    fig, axes = plt.subplots(1, len(styles), figsize=(7 * len(styles), 4), squeeze=False)
    width = 0.2
    series = [("ideal max(T, tools)", "ideal", "#999999"),
              ("best possible", "best", "#cccccc"),
              ("streaming fanout", "streaming", "#2a7ab0"),
              ("whole message, then fanout", "whole", "#d08030")]  # fmt: skip
    for ax, headers in zip(axes[0], styles, strict=True):
        shown = [p for p in points if p.headers == headers]
        for offset, (label, field, colour) in enumerate(series):
            xs = [i + (offset - 1.5) * width for i in range(len(shown))]
            ax.bar(xs, [getattr(p, field) for p in shown], width, label=label, color=colour)
        ax.set_xticks(range(len(shown)), [f"N={p.n}, T={p.seconds:g} s" for p in shown])
        ax.set_ylabel("turn latency (s)")
        ax.set_title(HEADERS[headers], fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(f"Streaming turns: N calls streamed over T s, tools on a throttled API "
                 f"({RATE:g}/s, burst {BURST})")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and write ``stream.md`` and ``stream.png``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_stream")
    parser.add_argument("--quick", action="store_true", help="one small point, once")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        measured, repeats = measure([(4, 0.4)], 1, ["openai"]), 1
    else:
        measured, repeats = measure(POINTS, REPEATS, list(HEADERS)), REPEATS
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stream.md").write_text(markdown(measured, repeats))
    plot(measured, args.out / "stream.png")
    print(markdown(measured, repeats))


if __name__ == "__main__":
    main()
