"""A scope's link to Redis, on a mock clock: failures fail fast, one call probes, recovery is told.

No server is needed: the operations are stand-ins that answer, raise or hang,
so every time and count is exact.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
import trio

import fanout
from fanout._redis import RedisLink
from fanout.redis import LocalFallback


def _link(fallback: LocalFallback | None = None) -> RedisLink:
    return RedisLink(cast("Any", None), "api", 0.1, 1.0, fallback)


async def _refused() -> None:
    await trio.lowlevel.checkpoint()
    raise OSError("connection refused")


async def _hangs() -> None:
    await trio.sleep_forever()


async def test_a_failure_fails_fast_until_one_call_probes_and_the_recovery_is_told(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis refuses at 0: calls fail without asking it until 1.0 s later, when one call
    asks again; its success ends the outage (counted and logged)."""
    caplog.set_level(logging.WARNING, logger="fanout")
    link = _link()
    ran: list[float] = []

    async def answers() -> str:
        ran.append(trio.current_time())
        await trio.lowlevel.checkpoint()
        return "ok"

    with pytest.raises(fanout.LimiterUnavailableError) as failed:
        await link.run("reserve", _refused)
    assert str(failed.value) == (
        "the shared limiter of scope 'api' is unavailable: Redis failed (OSError)"
    )
    await trio.sleep(0.4)
    with pytest.raises(fanout.LimiterUnavailableError) as fast:
        await link.run("reserve", answers)
    assert str(fast.value) == (
        "the shared limiter of scope 'api' is unavailable: Redis failed recently; "
        "fanout asks it again in 0.60s"
    )
    assert ran == []
    await trio.sleep(0.6)
    assert await link.run("reserve", answers) == "ok"
    assert ran == [1.0]
    assert (link.failures, link.recoveries) == (1, 1)
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == [
        "scope 'api': the shared limiter of scope 'api' is unavailable: Redis failed (OSError) "
        "(on reserve: OSError('connection refused')); refusing its calls (fail closed) "
        "until Redis answers",
        "scope 'api': Redis answers again after 1.0s; shared limits resume",
    ]


async def test_an_operation_that_never_answers_fails_at_op_timeout(autojump_clock: Any) -> None:
    """A silent Redis costs op_timeout (0.1 s), then the call is refused, naming the wait."""
    link = _link(LocalFallback(share=0.5))
    with pytest.raises(fanout.LimiterUnavailableError, match=r"did not answer within 0\.1s"):
        await link.run("acquire", _hangs)
    assert trio.current_time() == 0.1
    assert link.failures == 1


async def test_cleanup_runs_shielded_and_never_raises(autojump_clock: Any) -> None:
    """run_quietly runs even in a cancelled scope, and says whether the operation ran."""
    link = _link()
    done: list[str] = []

    async def release() -> None:
        await trio.sleep(0.05)
        done.append("released")

    with trio.CancelScope() as cancelled:
        cancelled.cancel()
        assert await link.run_quietly("release", release) is True
        assert await link.run_quietly("release", _refused) is False
    assert done == ["released"]
    assert trio.current_time() == 0.05


async def test_the_fast_failure_reads_the_outage_once(autojump_clock: Any) -> None:
    """Two calls when a probe is due: one probes and ends the outage while the other, which
    found Redis down, checkpoints; that one still says so with a true wait."""
    link = _link()
    outcomes: list[str] = []

    async def ask() -> None:
        try:
            await link.run("reserve", trio.lowlevel.checkpoint)
        except fanout.LimiterUnavailableError as exc:
            outcomes.append(str(exc).rpartition(": ")[2])
        else:
            outcomes.append("ran")

    for _ in range(10):
        with pytest.raises(fanout.LimiterUnavailableError):
            await link.run("reserve", _refused)
        await trio.sleep(1.0)  # the probe is due
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            nursery.start_soon(ask)
        assert sorted(outcomes) == ["Redis failed recently; fanout asks it again in 1.00s", "ran"]
        outcomes.clear()


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_a_fallback_share_outside_zero_to_one_is_refused(share: float) -> None:
    """A share must be in (0, 1]: anything else is a ConfigurationError naming it."""
    with pytest.raises(fanout.ConfigurationError, match=r"a fallback share must be in \(0, 1\]"):
        LocalFallback(share=share)
