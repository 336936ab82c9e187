"""One agent process for ``tests/test_adversarial_redis.py``: turns through one ``RedisScope``.

Why a worker of its own (not ``tests/redis_worker.py``): the adversarial tests
must judge every start on ``CLOCK_MONOTONIC`` (one clock for every process
on the machine, with no Redis round trip between the start and its stamp),
must read the stamps of a process they SIGKILL, and must start every
process at once *after* all of them are ready, so that start-up is never
counted as the scope's.

So each process appends to its own record file with unbuffered ``os.write``
(a line survives a SIGKILL the moment it is written):

- ``READY <mono>`` once the scope is open and has spoken to Redis;
- ``S <call> <mono>`` as a tool starts, ``E <call> <mono>`` as it ends;
- ``DONE <json tally>`` at the end (absent when killed).

After ``READY`` it reads one line from stdin: the monotonic time to begin.
It then runs turns of ``calls`` calls back to back until ``duration``
seconds past that time (``mode=run``), or one turn whose calls hold their
slots until the process is killed (``mode=hold``).

    python tests/adversarial_redis_worker.py '<json config>'
"""

from __future__ import annotations

import collections
import gc
import itertools
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fanout
from fanout.redis import RedisScope

SCOPE = "adversarial-api"


def _writer(path: str) -> Any:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    return write


async def main(config: dict[str, Any]) -> None:
    """Run the turns the config asks for; stamp every start and end."""
    logging.basicConfig(format=f"%(relativeCreated)d {os.getpid()} %(message)s")
    gc.freeze()  # a long collection is a pause of this process, not the scope's (README)
    write = _writer(config["record"])
    serial = itertools.count()
    mode = config.get("mode", "run")
    registry = fanout.Registry()
    pid = os.getpid()

    @registry.tool(kind=fanout.Kind.READS, scopes=[SCOPE], timeout=None)
    async def hit(i: int) -> str:
        call = f"{pid}-{next(serial)}"
        write(f"S {call} {time.monotonic():.6f}")
        try:
            await trio.sleep(config["latency"] if mode == "run" else 3600)
        finally:
            write(f"E {call} {time.monotonic():.6f}")
        return f"hit {i}"

    scope = RedisScope.from_url(
        config["url"], name=SCOPE, prefix=config["prefix"], **config["scope"]
    )
    tally: collections.Counter[str] = collections.Counter()
    async with scope:
        await scope.wait_for(1)  # connected: the first call pays no connection set-up
        write(f"READY {time.monotonic():.6f}")
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        begin = float(line)
        await trio.sleep(max(0.0, begin - time.monotonic()))
        runner = fanout.Runner(
            registry, scopes=[scope], turn_timeout=config.get("turn_timeout", 10.0),
            inline_wait=config.get("inline_wait", 2.0),
        )  # fmt: skip
        end = begin + config.get("duration", 2.0)
        turns = 0
        # One turn to hold; else turns until the end, bounded however fast they go.
        while (turns == 0 if mode == "hold" else time.monotonic() < end) and turns < 1000:
            turns += 1
            calls = [fanout.ToolCall(f"c{k}", "hit", {"i": k}) for k in range(config["calls"])]
            turn = await runner.run_turn(calls)
            tally.update(result.status.value for result in turn.results)
            tally.update("unavailable" for r in turn.results if r.scope == "limiter unavailable")
            for result in turn.results:  # the first few answers of each kind but ok, to read
                told = f"{result.status.value} {result.scope}"
                if result.status is not fanout.Status.OK and tally[told] < 3:
                    tally[told] += 1
                    write(f"X {time.monotonic():.6f} {told}: {str(result.content)[:160]!r}")
            if mode == "hold":
                break
            if all(result.status is not fanout.Status.OK for result in turn.results):
                await trio.sleep(0.01)  # as an agent would, not a busy loop of refusals
    write(f"DONE {json.dumps(dict(tally))}")


if __name__ == "__main__":
    trio.run(main, json.loads(sys.argv[1]))
