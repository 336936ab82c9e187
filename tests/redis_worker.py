"""One agent process for the multi-process Redis tests: turns through ``fanout.Runner``.

Every process shares one ``RedisScope``. Its tool calls a shared downstream on
the same Redis, which stamps each start with the server's ``TIME`` and keeps
the count in flight and its peak, so the test reads what every process did
from one clock. Two modes:

- ``run``: turns of ``--calls`` calls, back to back, from ``--start-at``
  (wall clock, so all processes begin together) for ``--duration`` seconds;
  prints a JSON tally of the answers.
- ``hold``: one turn whose calls hold their slots until the process is killed.
- ``fetch``: one turn of ``--calls`` calls, each a GET from the throttling
  server at ``--api`` under one API key (``--key``); the tally adds how many
  answers of each HTTP status the server gave (``http 429``).

    python tests/redis_worker.py run --url redis://127.0.0.1:6379/0 --prefix p: ...
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import coredis
import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fanout
from fanout.redis import RedisScope

SCOPE = "shared-api"

# The downstream's door: stamp the start on the server's clock, count it in.
ENTER = """
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[1], t[1] .. '.' .. string.format('%06d', tonumber(t[2])))
local live = redis.call('INCR', KEYS[2])
if live > tonumber(redis.call('GET', KEYS[3]) or '0') then redis.call('SET', KEYS[3], live) end
return live
"""


def downstream_keys(prefix: str) -> tuple[str, str, str]:
    """Where the downstream keeps its start stamps, its in-flight count and the peak."""
    return f"{prefix}downstream:starts", f"{prefix}downstream:live", f"{prefix}downstream:peak"


async def main(options: argparse.Namespace) -> None:
    downstream: coredis.Redis[str] = coredis.Redis.from_url(options.url, decode_responses=True)
    scope = RedisScope.from_url(
        options.url, name=SCOPE, prefix=options.prefix, rate=options.rate, burst=options.burst,
        max_concurrency=options.cap or None, lease_ttl=options.lease_ttl,
    )  # fmt: skip
    keys = downstream_keys(options.prefix)
    async with downstream, scope:
        enter = downstream.register_script(ENTER)
        registry = fanout.Registry()

        @registry.tool(kind=fanout.Kind.READS, scopes=[SCOPE], timeout=None)
        async def hit(i: int) -> str:
            await enter(keys=list(keys), args=[])
            try:
                await trio.sleep(options.latency if options.mode == "run" else 3600)
            finally:
                with trio.CancelScope(shield=True):
                    await downstream.decr(keys[1])
            return f"hit {i}"

        if options.mode == "fetch":
            await fetch(options, scope)
            return
        runner = fanout.Runner(registry, scopes=[scope], turn_timeout=options.turn_timeout)
        tally: collections.Counter[str] = collections.Counter()
        await trio.sleep(max(0.0, options.start_at - time.time()))
        end = trio.current_time() + options.duration
        serial = 0
        while trio.current_time() < end:
            calls = [
                fanout.ToolCall(f"c{serial + k}", "hit", {"i": serial + k})
                for k in range(options.calls)
            ]
            serial += options.calls
            turn = await runner.run_turn(calls)
            tally.update(result.status.value for result in turn.results)
            if options.mode == "hold":
                break
    print(json.dumps(dict(tally)), flush=True)


class CountingTransport(httpx.AsyncHTTPTransport):
    """Counts the server's answers by status, under fanout's own retries."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: collections.Counter[str] = collections.Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        self.statuses[f"http {response.status_code}"] += 1
        return response


async def fetch(options: argparse.Namespace, scope: RedisScope) -> None:
    """One turn of GETs from the throttling server, every process under one key."""
    transport = CountingTransport()
    headers = {"x-api-key": options.key}
    registry = fanout.Registry()
    async with fanout.http_client(transport, base_url=options.api, headers=headers) as client:

        @registry.tool(kind=fanout.Kind.READS, scopes=[SCOPE], timeout=None)
        async def get(i: int) -> str:
            response = await client.get(f"/items/{i}")
            response.raise_for_status()
            return response.text

        runner = fanout.Runner(
            registry, scopes=[scope], inline_wait=None, turn_timeout=options.turn_timeout
        )
        await trio.sleep(max(0.0, options.start_at - time.time()))
        turn = await runner.run_turn(
            [fanout.ToolCall(f"c{i}", "get", {"i": i}) for i in range(options.calls)]
        )
    tally = collections.Counter(result.status.value for result in turn.results)
    tally.update(transport.statuses)
    print(json.dumps(dict(tally)), flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["run", "hold", "fetch"])
    parser.add_argument("--api", default="")
    parser.add_argument("--key", default="shared-key")
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--burst", type=float, default=5.0)
    parser.add_argument("--cap", type=int, default=3, help="0: no cap")
    parser.add_argument("--lease-ttl", type=float, default=1.0)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--turn-timeout", type=float, default=10.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    trio.run(main, parse(sys.argv[1:]))
