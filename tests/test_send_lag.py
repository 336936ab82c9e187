"""A call's first request that leaves late counts toward the scope's slack, before any answer."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import fanout
from fanout import Kind, Registry, Runner, Scope, ToolCall
from fanout.testing import ServerConfig, serve_throttled


async def test_a_late_first_request_widens_the_slack_before_any_answer(
    autojump_clock: Any,
) -> None:
    """Requests leaving 20 ms after admission: slack 20 ms, and the call after the burst
    starts that much later than its token, so the server never sees it early."""
    async with (
        serve_throttled(ServerConfig(rate=10, burst=2, latency=0.5)) as server,
        fanout.http_client(base_url=server.url) as client,
    ):
        reg = Registry()
        started: list[float] = []

        @reg.tool(kind=Kind.READS, scopes=["api"])
        async def fetch(n: int) -> str:
            await trio.sleep(0.02)  # the tool's own set-up before its request
            started.append(trio.current_time())
            return (await client.get(f"/items/{n}")).text

        scope = Scope("api", rate=10, burst=2)
        runner = Runner(reg, scopes=[scope], inline_wait=None)
        calls = [ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(3)]
        turn = await runner.run_turn(calls)
    assert [r.status for r in turn.results] == [fanout.Status.OK] * 3
    assert scope.statistics().slack == 0.02
    assert started[2] - started[0] == 0.1 + 0.02  # its token, plus the measured slack
    assert server.count(status=429) == 0


async def test_a_configured_slack_is_kept() -> None:
    """slack= given by the user is not replaced by a measurement."""
    scope = Scope("api", rate=10, burst=2, slack=0.0)
    scope.observe_send_lag(0.5)
    assert scope.statistics().slack == 0.0


async def test_calls_admitted_after_the_probe_answered_count_their_own_lag(
    autojump_clock: Any,
) -> None:
    """A learning scope's probe opens a burst; the calls its answer lets start are not
    part of that burst, so their lag counts from their own admission, not the probe's.

    Counted from the probe, each would have "left" a latency late: a slack of a whole
    latency, which at 5/s holds back a token: of the four the server's Remaining
    allowed after a probe of one, three started at once and one an answer later.
    (Each probe's count is read with the other as maybe not yet counted: read alone,
    the first's "4 left" let a fourth out, and it was refused.)"""
    async with (
        serve_throttled(ServerConfig(rate=5, burst=5, latency=0.05, headers="draft")) as server,
        fanout.http_client(base_url=server.url) as client,
    ):
        reg = Registry()

        @reg.tool(kind=Kind.READS, scopes=["api"])
        async def fetch(n: int) -> str:
            await trio.sleep(0.005)  # the tool's own set-up before its request
            return (await client.get(f"/items/{n}")).text

        scope = Scope("api")
        began = trio.current_time()
        runner = Runner(reg, scopes=[scope], inline_wait=None)
        turn = await runner.run_turn([ToolCall(f"c{i}", "fetch", {"n": i}) for i in range(8)])
    assert [r.status for r in turn.results] == [fanout.Status.OK] * 8
    assert scope.statistics().slack == pytest.approx(0.005)
    starts = [round(t - began, 9) for t in server.starts()]
    assert starts[:5] == [0.005] * 2 + [0.005 + 0.05 + 0.005] * 3  # the probe, then three
    assert server.count(status=429) == 0
