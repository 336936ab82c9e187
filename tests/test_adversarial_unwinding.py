"""Adversarial property tests of promise 1 where shedding meets calls cut off mid-work.

A scope whose calls take ``d`` seconds, ``c`` at a time, is warmed until its
latency is ``d``. Then calls there are cut off (their own timeout, an idle
timeout, the turn's deadline, the caller, a failing sibling) and unwind
however they do: slowly under a shield, raising, raising a ``BaseException``
of their own, raising what cannot be printed, or not at all (a sync tool's
thread, abandoned). Each is answered once, with the status of what cut it off.
Then a turn of identical calls there is answered by the README's rule alone:
call ``i`` waits for ``floor(i / c)`` rounds of ``d`` and is shed at once,
``rate_limited`` and never run, exactly when it would then end past its
deadline; every other call runs and is ``ok``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fanout
from fanout import EventKind, Kind, Registry, Runner, Scope, Status, ToolCall

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

CUT_OFF_BY = ("own timeout", "idle timeout", "turn deadline", "caller", "sibling")
UNWINDS = (
    "slow",
    "slow_then_raise",
    "slow_then_unprintable",
    "slow_then_base",
    "slow_then_return",  # swallows its cancellation and returns
    "sync_hung",
)


class Unprintable(Exception):
    """An error that cannot say what it is."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class ToolsOwnBaseException(BaseException):
    """A ``BaseException`` of the tool's own, raised as it unwinds."""


@attrs.define
class World:
    """The tools' side of the story: which calls' bodies ran, and what holds hung threads."""

    ran: list[str] = attrs.Factory(list)
    release: threading.Event = attrs.Factory(threading.Event)


def _registry(world: World, *, by: str, unwind: str, unwind_for: float, cut_at: float) -> Registry:
    """``warm`` takes ``QUICK`` on scope ``api``; ``cut`` never ends there on its own and is
    cut off at ``cut_at`` by ``by``, then unwinds as ``unwind`` says; ``fails`` (no scope)
    raises at ``cut_at``."""
    registry = Registry()

    @registry.tool(kind=Kind.READS, scopes=["api"], timeout=None)
    async def warm() -> str:
        await trio.sleep(QUICK)
        return "warm"

    async def cut(n: int) -> str:
        world.ran.append(f"cut {n}")
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            if unwind != "slow_then_return":
                raise
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(unwind_for)
            if unwind == "slow_then_raise":
                raise ValueError("cleanup failed")
            if unwind == "slow_then_unprintable":
                raise Unprintable
            if unwind == "slow_then_base":
                raise ToolsOwnBaseException
        return "returned, though cancelled"

    def cut_sync(n: int) -> str:
        world.ran.append(f"cut {n}")
        world.release.wait()
        return "released"

    options: dict[str, Any] = {"timeout": None}
    if by == "own timeout":
        options = {"timeout": cut_at}
    elif by == "idle timeout":
        options = {"timeout": None, "idle_timeout": cut_at}
    fn = cut_sync if unwind == "sync_hung" else cut
    registry.add(fn, name="cut", kind=Kind.READS, scopes=["api"], **options)

    @registry.tool(kind=Kind.READS, timeout=None)
    async def fails() -> str:
        await trio.sleep(cut_at)
        raise KeyError("no such record")

    return registry


QUICK = 0.4  # seconds every quick call takes: the scope's latency once warm
RATE, BURST = 5.0, 2  # the scope's told rate, where it has one


def _quick(world: World, n: int) -> Any:
    """The ``n``th later call's tool: ``QUICK`` seconds on scope ``api``."""

    async def quick() -> str:
        world.ran.append(f"quick {n}")
        await trio.sleep(QUICK)
        return f"quick {n}"

    return quick


def _body(result: fanout.ToolResult) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(result.content)
    return parsed


def _answered_at(turn: fanout.Turn) -> dict[str, float]:
    """When each call of ``turn`` was answered; each answered once."""
    answered = [(e.call_id, e.time) for e in turn.trace if e.kind is EventKind.ANSWERED]
    assert sorted(call_id for call_id, _ in answered) == sorted(r.tool_use_id for r in turn.results)
    return dict(answered)


def _assert_cut_off_honestly(by: str, cut_at: float, turn: fanout.Turn, since: float) -> None:
    """Each cut call answered once, at ``cut_at``, with what cut it off."""
    answered = _answered_at(turn)
    cut = [r for r in turn.results if r.tool_use_id.startswith("c")]
    for result in cut:
        message = _body(result)["message"]
        assert answered[result.tool_use_id] == since + cut_at, (by, result)
        if by in ("own timeout", "idle timeout", "turn deadline"):
            assert result.status is Status.TIMED_OUT, (by, result)
        elif by == "caller":
            assert (result.status, message) == (Status.CANCELLED, "the caller cancelled the turn")
        else:
            assert result.status is Status.CANCELLED, result
            assert "cancel_siblings" in message, result
        assert "caller" not in message or by == "caller", result


@PROPERTY
@given(
    by=st.sampled_from(CUT_OFF_BY),
    unwind=st.sampled_from(UNWINDS),
    unwind_for=st.sampled_from([0.0, 0.3, 3.0, 30.0]),
    cut_at=st.sampled_from([0.1, 0.25, QUICK]),
    slots=st.integers(1, 3),
    by_rate=st.booleans(),
    cut=st.integers(1, 3),
    timeouts=st.lists(st.sampled_from([0.35, 0.95, 1.45, 2.05]), min_size=1, max_size=7),
)
def test_calls_cut_off_however_they_unwind_shed_only_what_would_end_late(
    by: str,
    unwind: str,
    unwind_for: float,
    cut_at: float,
    slots: int,
    by_rate: bool,
    cut: int,
    timeouts: list[float],
) -> None:
    """Calls cut off however they unwind are answered once, honestly; after them, identical
    calls on a scope of ``slots`` at once, or of a told rate, are shed exactly when the
    README's rule says they would end past their deadline, and every call shed never ran."""
    world = World()
    cut = min(cut, BURST if by_rate else slots)  # all cut calls start at once
    registry = _registry(world, by=by, unwind=unwind, unwind_for=unwind_for, cut_at=cut_at)
    for n, timeout in enumerate(timeouts):  # each quick call's own timeout, by name
        registry.add(_quick(world, n), name=f"quick_{n}", kind=Kind.READS,
                     scopes=["api"], timeout=timeout)  # fmt: skip
    api = Scope("api", max_concurrency=slots, learn=False)
    if by_rate:
        api = Scope("api", rate=RATE, burst=BURST, learn=False)
    turn_timeout = cut_at if by == "turn deadline" else 60
    on_failure = "cancel_siblings" if by == "sibling" else "continue"

    async def main() -> tuple[fanout.Turn, float, fanout.Turn, float]:
        # The later turn's runner does not cancel siblings: a call shed is a failure.
        runner = Runner(registry, scopes=[api], turn_timeout=60, inline_wait=None)
        cutter = Runner(registry, scopes=[api], turn_timeout=60, on_failure=on_failure)
        await runner.run_turn([ToolCall(f"w{i}", "warm", {}) for i in range(BURST)])
        assert runner.scope("api").expected_latency() == QUICK
        await trio.sleep(60)  # the bucket full again
        calls = [ToolCall(f"c{i}", "cut", {"n": i}) for i in range(cut)]
        if by == "sibling":
            calls.append(ToolCall("f", "fails", {}))
        cutting = cutter.turn(calls, timeout=turn_timeout)
        began = trio.current_time()
        with trio.move_on_after(cut_at if by == "caller" else math.inf):
            await cutting.run()
        world.ran.clear()
        await trio.sleep(60)  # every slot back, the bucket full
        later = runner.turn([ToolCall(f"q{n}", f"quick_{n}", {}) for n in range(len(timeouts))])
        since = trio.current_time()
        await later.run()
        world.release.set()
        return cutting, began, later, since

    clock = trio.testing.MockClock(autojump_threshold=0)
    try:
        cutting, began, later, since = trio.run(main, clock=clock)
    finally:
        world.release.set()
    _assert_cut_off_honestly(by, cut_at, cutting, began)
    answered = _answered_at(later)
    admitted = 0  # the calls ahead that were not shed
    for n, (timeout, result) in enumerate(zip(timeouts, later.results, strict=True)):
        waits = max(0, admitted - BURST + 1) / RATE if by_rate else (admitted // slots) * QUICK
        if waits == 0 or waits + QUICK <= timeout:  # no wait is always worth trying
            admitted += 1
            assert f"quick {n}" in world.ran
            ends_in_time = timeout >= QUICK
            assert result.status is (Status.OK if ends_in_time else Status.TIMED_OUT), result
        else:
            assert result.status is Status.RATE_LIMITED, (n, timeout, result)
            assert _body(result)["started"] is False, result
            assert answered[result.tool_use_id] == since
            assert f"quick {n}" not in world.ran


# -- a busy scope: mixed calls, deadlines and a caller who may cancel ----------------------

acts = st.one_of(
    st.tuples(st.just("return"), st.sampled_from([0.0, 0.2, 0.7, 2.5])),
    st.tuples(st.just("raise"), st.sampled_from([0.0, 0.3])),
    st.tuples(st.just("raise_base"), st.sampled_from([0.0, 0.3])),
    st.tuples(st.just("raise_unprintable"), st.sampled_from([0.0, 0.3])),
    st.tuples(st.just("throttled"), st.sampled_from([0.0, 0.2, 5.0])),
    st.tuples(st.just("hang"), st.sampled_from([0.0, 0.4, 6.0])),  # how long it unwinds
    st.tuples(st.just("hang_then_raise"), st.sampled_from([0.0, 0.4])),
    st.tuples(st.just("return_odd"), st.sampled_from([0.0, 0.2])),
    st.tuples(st.sampled_from(["sync_return", "sync_raise", "sync_hang"]), st.just(0.0)),
)
RETURNS = ("return", "return_odd", "sync_return")
busy_calls = st.lists(
    st.tuples(
        acts,
        st.sampled_from([Kind.PURE, Kind.READS, Kind.MUTATING]),
        st.sampled_from([None, 0.5, 1.2, 3.0]),  # the call's own timeout
        st.booleans(),  # on the scope
    ),
    min_size=1,
    max_size=8,
)


class Unreadable:
    """A value no serialiser can read: every dunder it might try raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __iter__(self) -> Any:
        raise RuntimeError("no iter")


def _act_sync(what: str, release: threading.Event) -> Any:
    """What one busy sync call does in its worker thread (a hung one waits for ``release``)."""
    if what == "sync_raise":
        raise Unprintable
    if what == "sync_hang":
        release.wait()
    return {"synced": what}


async def _act(what: str, detail: float) -> Any:
    """What one busy async call does once its body runs."""
    if what in ("hang", "hang_then_raise"):
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(detail)
            if what == "hang_then_raise":
                raise Unprintable
    await trio.sleep(detail)
    if what == "raise":
        raise ValueError("no such record")
    if what == "raise_base":
        raise ToolsOwnBaseException
    if what == "raise_unprintable":
        raise Unprintable
    if what == "throttled":
        raise fanout.RateLimitedError(retry_after=detail)
    if what == "return_odd":
        return Unreadable()
    return {"slept": detail}


_DRAIN = re.compile(r"needs about ([0-9.]+)s to drain, (.*); answered at once")
_LATENCY = re.compile(r"calls there take about ([0-9.]+)s")
_INLINE = re.compile(r"longer than fanout waits inline \(([0-9.]+)s\)")


def _assert_shed_honestly(message: str, *, at: float, deadline: float) -> None:
    """A call shed for its queue says why, and the numbers it gives bear that out."""
    drain = _DRAIN.search(message)
    if drain is None:
        return
    estimate, why = float(drain.group(1)), drain.group(2)
    left = deadline - at
    if why == "past the call's deadline":
        assert estimate > left - 1e-3, (message, left)
    elif (latency := _LATENCY.search(why)) is not None:
        assert estimate + float(latency.group(1)) > left - 1e-3, (message, left)
    else:
        inline = _INLINE.search(why)
        assert inline is not None, message
        assert estimate > float(inline.group(1)) - 1e-3, message


@PROPERTY
@given(
    spec=busy_calls,
    turns=st.integers(1, 3),
    rate=st.sampled_from([None, 2.0, 10.0]),
    slots=st.sampled_from([None, 1, 2]),
    turn_timeout=st.sampled_from([1.0, 2.5, 8.0]),
    inline_wait=st.sampled_from([None, 0.5, 2.0]),
    mutating=st.sampled_from(["one", "serial", "parallel"]),
    on_failure=st.sampled_from(["continue", "cancel_siblings"]),
    cancel_at=st.none() | st.sampled_from([0.0, 0.3, 1.1]),
    hosted=st.booleans(),
    idle=st.sampled_from([None, 0.4]),
    learn=st.booleans(),
)
def test_a_busy_scopes_calls_are_each_answered_once_and_truly(
    spec: list[tuple[tuple[str, float], Kind, float | None, bool]],
    turns: int,
    rate: float | None,
    slots: int | None,
    turn_timeout: float,
    inline_wait: float | None,
    mutating: Any,
    on_failure: Any,
    cancel_at: float | None,
    hosted: bool,
    idle: float | None,
    learn: bool,
) -> None:
    """Turn after turn on one scope: one answer per id, in order; ``started: false`` only for
    a call whose body never ran; ok only for a body that returned; cancelled only by the
    caller or a failed sibling; a call shed says a drain its deadline or the inline wait
    cannot hold; and nothing escapes."""
    ran: list[str] = []
    release = threading.Event()
    registry = Registry()
    for n, ((what, detail), kind, timeout, scoped) in enumerate(spec):

        async def tool(turn: int, what: str = what, detail: float = detail, n: int = n) -> Any:
            ran.append(f"{turn}/{n}")
            return await _act(what, detail)

        def sync_tool(turn: int, what: str = what, n: int = n) -> Any:
            ran.append(f"{turn}/{n}")
            return _act_sync(what, release)

        scopes = ["api"] if scoped else []
        fn = sync_tool if what.startswith("sync") else tool
        registry.add(fn, name=f"t{n}", kind=kind, timeout=timeout, scopes=scopes, idle_timeout=idle)
    burst = 1 if rate is None else 2
    api = Scope("api", rate=rate, burst=burst, max_concurrency=slots, learn=learn)
    runner = Runner(
        registry, scopes=[api], turn_timeout=turn_timeout, inline_wait=inline_wait,
        mutating=mutating, on_failure=on_failure,
    )  # fmt: skip
    played: list[tuple[fanout.Turn, float, bool, BaseException | None]] = []

    async def turn_after_turn() -> None:
        for t in range(turns):
            calls = [ToolCall(f"toolu_{n}", f"t{n}", {"turn": t}) for n in range(len(spec))]
            turn = runner.turn(calls)
            began, escaped = trio.current_time(), None
            try:
                with trio.move_on_after(math.inf if cancel_at is None else cancel_at) as scope:
                    await turn.run()
            except BaseException as exc:  # the promise: nothing escapes; asserted below
                escaped = exc
            played.append((turn, began, scope.cancelled_caught, escaped))

    async def main() -> None:
        if hosted:  # the calls unwind in the runner's nursery, beside the next turn
            async with runner:
                await turn_after_turn()
        else:
            await turn_after_turn()

    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        release.set()
    for t, (turn, began, caller_cancelled, escaped) in enumerate(played):
        assert escaped is None, repr(escaped)
        assert [r.tool_use_id for r in turn.results] == [f"toolu_{n}" for n in range(len(spec))]
        answered = _answered_at(turn)
        failed = [r for r in turn.results if r.status is not Status.OK]
        for n, (result, ((what, _), kind, timeout, _)) in enumerate(
            zip(turn.results, spec, strict=True)
        ):
            body_ran = f"{t}/{n}" in ran
            if result.status is Status.OK:
                assert body_ran, result
                assert what in RETURNS, result
                continue
            payload = _body(result)
            message = payload["message"]
            assert payload["status"] == result.status.value
            if payload["started"] is False:
                assert not body_ran, ("said not started, but its body ran", result)
            if result.status is Status.CANCELLED:
                if "caller cancelled" in message:
                    assert caller_cancelled, result
                elif "cancel_siblings" in message:
                    assert on_failure == "cancel_siblings", result
                    assert len(failed) > 1, result
                else:
                    assert "KeyboardInterrupt" not in message, result
            if result.status is Status.RATE_LIMITED:
                at = answered[result.tool_use_id]
                assert at < began + turn_timeout, ("rate_limited at the deadline", result)
                if kind is Kind.MUTATING and message.startswith("its retry"):
                    continue  # its own timeout counts from when it began, not known here
                # A write's own timeout counts from when it began, after the reads: as
                # it was shed.
                start = at if kind is Kind.MUTATING else began
                own = math.inf if timeout is None else start + timeout
                deadline = min(own, began + turn_timeout)
                assert at < deadline, ("rate_limited when its deadline had come", result)
                _assert_shed_honestly(message, at=at, deadline=deadline)


# -- writes cancelled while they held their place in line ----------------------------------


@pytest.mark.parametrize("checkpoints", range(8))
def test_writes_cancelled_by_a_failed_sibling_in_an_open_runner_log_no_failure(
    checkpoints: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Under ``cancel_siblings``, writes cancelled by a sibling's failure while they still
    held their place in line are answered cancelled (or ok, done first), and no error is
    logged for them, at whichever of the failing write's checkpoints it fails. (Their
    claim's nursery grouped the cancellations, and each was logged "failed after it was
    answered".)"""
    registry = Registry()

    @registry.tool(kind=Kind.MUTATING, timeout=None)
    async def fails() -> str:
        for _ in range(checkpoints):
            await trio.lowlevel.checkpoint()
        raise ValueError("no such account")

    @registry.tool(kind=Kind.MUTATING, scopes=["api"], timeout=None)
    async def writes(n: int) -> str:
        return f"wrote {n}"

    api = Scope("api", rate=10, burst=2, max_concurrency=2, learn=False)
    runner = Runner(registry, scopes=[api], mutating="parallel", on_failure="cancel_siblings")
    calls = [ToolCall("f", "fails"), *(ToolCall(f"w{i}", "writes", {"n": i}) for i in range(3))]

    async def main() -> fanout.Turn:
        async with runner:
            return await runner.run_turn(calls)

    with caplog.at_level(logging.ERROR, logger="fanout"):
        turn = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    failed, *written = turn.results
    assert failed.status is Status.ERROR
    assert {r.status for r in written} <= {Status.OK, Status.CANCELLED}
    assert caplog.records == []
