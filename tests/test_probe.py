"""The probe's gate, on a mock clock: one call first, the rest in arrival order.

Every branch is a promise: a waiter gives up at its deadline and is forgotten;
a probe that gives up hands the probe on to the next caller; a waiter woken and
then cancelled before taking its turn passes the turn on, so nobody waits for
a turn that will never come.
"""

from __future__ import annotations

from typing import Any

import trio

from fanout._probe import Probe


async def test_the_first_call_probes_and_the_rest_wait_until_it_finishes(
    autojump_clock: Any,
) -> None:
    probe = Probe()
    passed: list[tuple[str, float]] = []

    async def call(name: str, deadline: float) -> None:
        if await probe.wait_turn(name, deadline):
            passed.append((name, trio.current_time()))
            probe.step_done()

    assert await probe.wait_turn("probe", 10.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "b", 10.0)
        await trio.sleep(0.1)
        nursery.start_soon(call, "c", 10.0)
        await trio.sleep(0.9)
        probe.finished()
    assert passed == [("b", 1.0), ("c", 1.0)]
    assert probe.is_open()


async def test_a_waiter_gives_up_at_its_deadline_and_is_forgotten(autojump_clock: Any) -> None:
    probe = Probe()
    assert await probe.wait_turn("probe", 10.0)
    assert not await probe.wait_turn("impatient", 0.5)
    assert trio.current_time() == 0.5
    probe.finished()
    assert probe.is_open()  # no turn is held for the caller that left


async def test_a_probe_that_gives_up_hands_the_probe_to_the_next_caller(
    autojump_clock: Any,
) -> None:
    probe = Probe()
    assert await probe.wait_turn("first", 10.0)
    became: list[float] = []

    async def second() -> None:
        assert await probe.wait_turn("second", 10.0)
        became.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.sleep(0.3)
        probe.abandoned("first")
    assert became == [0.3]
    assert not probe.done
    assert not probe.is_open()  # "second" probes now: a third caller waits
    probe.abandoned("not a holder")  # a stranger's word changes nothing
    assert not probe.is_open()


async def test_a_waiter_whose_deadline_comes_with_its_turn_passes_the_turn_on(
    autojump_clock: Any,
) -> None:
    """The probe finishes at 1.0, the moment the first waiter's deadline ends its wait.
    trio may run either first: the waiter gives up, or is woken and then cancelled
    before taking its turn. Either way the next waiter passes at 1.0."""
    probe = Probe()
    assert await probe.wait_turn("probe", 10.0)
    passed: list[tuple[str, float]] = []

    async def waiter(name: str, deadline: float) -> None:
        if await probe.wait_turn(name, deadline):
            passed.append((name, trio.current_time()))
            probe.step_done()

    async def finish_at(when: float) -> None:
        await trio.sleep_until(when)
        probe.finished()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, "late", 1.0)
        await trio.sleep(0.1)
        nursery.start_soon(waiter, "next", 10.0)
        nursery.start_soon(finish_at, 1.0)
    assert passed == [("next", 1.0)]
