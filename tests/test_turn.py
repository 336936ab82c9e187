"""The turn runtime: phases, deadlines, cancellation and answers, on a mock clock."""

from __future__ import annotations

import gc
import json
import math
import threading
import time
from typing import Any

import pytest
import trio
import trio.testing

import fanout
from fanout import Kind, Registry, RetryPolicy, Runner, Status, ToolCall, TransientError
from fanout.idempotency import ReadCache


def call(id: str, name: str, arguments: Any = None) -> ToolCall:
    return ToolCall(id, name, {} if arguments is None else arguments)


def body(result: fanout.ToolResult) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(result.content)
    return parsed


@pytest.fixture
def registry() -> Registry:
    reg = Registry()

    @reg.tool(kind=Kind.READS, timeout=None)
    async def sleep_for(seconds: float) -> str:
        await trio.sleep(seconds)
        return f"slept {seconds}"

    @reg.tool(kind=Kind.READS, timeout=3)
    async def hang() -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    @reg.tool(kind=Kind.PURE)
    async def boom() -> str:
        raise ValueError("bad input: x must be positive")

    @reg.tool(kind=Kind.MUTATING, timeout=None)
    async def write(key: str, seconds: float = 0) -> str:
        await trio.sleep(seconds)
        return f"wrote {key}"

    return reg


async def test_turn_finishes_at_its_longest_call(registry: Registry, autojump_clock: Any) -> None:
    """N concurrent reads of known durations end when the longest one does."""
    runner = Runner(registry)
    start = trio.current_time()
    turn = await runner.run_turn([call(f"c{i}", "sleep_for", {"seconds": i}) for i in (3, 1, 2)])
    assert trio.current_time() - start == 3
    assert [r.content for r in turn.results] == ["slept 3", "slept 1", "slept 2"]
    finished = {e.call_id: e.time for e in turn.trace if e.kind is fanout.EventKind.ANSWERED}
    assert finished == {"c3": 3.0, "c1": 1.0, "c2": 2.0}


async def test_hung_tool_times_out_exactly_at_its_own_deadline(
    registry: Registry, autojump_clock: Any
) -> None:
    """A tool that never returns is answered timed_out at start + its timeout."""
    turn = await Runner(registry).run_turn(
        [call("h", "hang"), call("s", "sleep_for", {"seconds": 1})]
    )
    assert trio.current_time() == 3
    hung, fine = turn.results
    assert hung.status is Status.TIMED_OUT
    assert body(hung)["message"] == "the call's own timeout of 3s passed"
    assert body(hung)["started"] is True
    assert fine.status is Status.OK
    answered = [e for e in turn.trace if e.kind is fanout.EventKind.ANSWERED and e.call_id == "h"]
    assert [e.time for e in answered] == [3.0]


@pytest.mark.parametrize(("since", "deadline"), [(0.0, 10.0), (None, 11.0), (5.0, 11.0)])
async def test_a_turn_s_deadline_counts_from_since(
    registry: Registry, autojump_clock: Any, since: float | None, deadline: float
) -> None:
    """Built at 0 and run at 1 s, a turn's deadline counts from ``since`` where that is
    earlier than its run (`Runner.run_turn` passes when it was called: building 10,000
    calls took 32 ms in real time, and their answers came that late past the caller's
    deadline), else from its run."""
    turn = Runner(registry).turn([call("b", "sleep_for", {"seconds": 50})], timeout=10)
    await trio.sleep(1)
    await turn.run(since=since)
    assert trio.current_time() == deadline
    assert turn.results[0].status is Status.TIMED_OUT


@pytest.mark.parametrize("since", [math.nan, math.inf, -math.inf, 10**400, "0", True])
async def test_a_since_that_is_no_time_is_refused_before_anything_runs(
    registry: Registry, autojump_clock: Any, since: Any
) -> None:
    """``since`` that is not a finite time is a UsageError, and the turn is left unrun:
    no call started, none answered."""
    turn = Runner(registry).turn([call("b", "sleep_for", {"seconds": 1})])
    with pytest.raises(fanout.UsageError, match="since must be"):
        await turn.run(since=since)
    assert not [e for e in turn.trace if e.kind is fanout.EventKind.STARTED]


async def test_turn_deadline_cancels_everything_still_running(
    registry: Registry, autojump_clock: Any
) -> None:
    """At the turn deadline every unfinished call is answered timed_out, at exactly that time."""
    runner = Runner(registry, mutating="serial")
    turn = await runner.run_turn(
        [
            call("a", "sleep_for", {"seconds": 1}),
            call("b", "sleep_for", {"seconds": 50}),
            call("w1", "write", {"key": "k1", "seconds": 100}),
        ],
        timeout=10,
    )
    assert trio.current_time() == 10
    a, b, w1 = turn.results
    assert a.status is Status.OK
    assert b.status is Status.TIMED_OUT
    assert body(b)["message"] == "the turn's deadline of 10s passed"
    # b blocked phase two, so the write never started and says so.
    assert w1.status is Status.TIMED_OUT
    assert body(w1)["started"] is False
    assert "effect" not in body(w1)


async def test_started_write_cut_off_says_its_effect_is_unknown(
    registry: Registry, autojump_clock: Any
) -> None:
    """A mutating call stopped mid-flight warns that it may have taken effect."""
    turn = await Runner(registry).run_turn(
        [call("w", "write", {"key": "k", "seconds": 9})], timeout=5
    )
    (result,) = turn.results
    assert result.status is Status.TIMED_OUT
    assert body(result)["started"] is True
    assert body(result)["effect"].startswith("unknown")


async def test_sync_tool_blocking_forever_does_not_hold_the_turn(autojump_clock: Any) -> None:
    """A sync tool stuck in its thread is abandoned at its deadline."""
    release = threading.Event()
    reg = Registry()

    @reg.tool(kind=Kind.READS, timeout=4)
    def stuck() -> str:
        release.wait()
        return "too late"

    try:
        turn = await Runner(reg).run_turn([call("s", "stuck")])
        assert trio.current_time() == 4
        assert turn.results[0].status is Status.TIMED_OUT
    finally:
        release.set()


async def test_sync_tools_run_in_threads_and_return() -> None:
    """A plain function is a tool too; it runs in a worker thread and sees its context.

    Real clock on purpose: an autojumping clock would leap while trio waits
    for the thread, and this test is about the thread's answer, not timing.
    """
    reg = Registry()

    @reg.tool(kind=Kind.PURE)
    def whoami() -> str:
        return fanout.current_call().call.id

    turn = await Runner(reg).run_turn([call("me", "whoami")])
    assert turn.results[0].content == "me"


async def test_raising_tool_is_answered_error_without_traceback(
    registry: Registry, autojump_clock: Any
) -> None:
    """An exception becomes a short error naming its type and message; siblings still run."""
    turn = await Runner(registry).run_turn(
        [call("x", "boom"), call("y", "sleep_for", {"seconds": 1})]
    )
    error, ok = turn.results
    assert error.status is Status.ERROR
    assert error.is_error
    assert body(error)["message"] == "ValueError: bad input: x must be positive"
    assert "Traceback" not in error.content
    assert ok.status is Status.OK
    assert not ok.is_error


async def test_unknown_tool_is_refused_naming_the_tools(
    registry: Registry, autojump_clock: Any
) -> None:
    """An unregistered tool never runs; its answer lists the tools that exist."""
    turn = await Runner(registry).run_turn([call("u", "delete_everything")])
    (result,) = turn.results
    assert result.status is Status.REFUSED
    assert body(result)["message"] == (
        "there is no tool named 'delete_everything'; the tools are: boom, hang, sleep_for, write"
    )
    assert body(result)["started"] is False


async def test_invalid_json_arguments_answer_that_call_only(
    registry: Registry, autojump_clock: Any
) -> None:
    """Arguments that are not a JSON object fail one call; the rest run."""
    turn = await Runner(registry).run_turn(
        [ToolCall("bad", "sleep_for", '{"seconds": '), call("ok", "sleep_for", {"seconds": 1})]
    )
    bad, ok = turn.results
    assert bad.status is Status.ERROR
    assert body(bad)["started"] is False
    assert ok.status is Status.OK


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ([call("a", "boom"), call("a", "boom")], "two calls share the id 'a'"),
        ([call("", "boom")], "has no id"),
        ([call("a", "")], "has no tool name"),
    ],
)
def test_structurally_broken_turn_raises_before_running(
    registry: Registry, calls: list[ToolCall], message: str
) -> None:
    """Duplicate, missing or nameless ids are a typed error, raised before anything runs."""
    with pytest.raises(fanout.InvalidTurnError, match=message):
        Runner(registry).turn(calls)


async def test_policy_one_runs_the_first_write_and_refuses_the_rest(
    registry: Registry, autojump_clock: Any
) -> None:
    """Under 'one', later writes are refused with advice to re-request them alone."""
    turn = await Runner(registry).run_turn(
        [call("w1", "write", {"key": "a"}), call("w2", "write", {"key": "b"})]
    )
    first, second = turn.results
    assert first.content == "wrote a"
    assert second.status is Status.REFUSED
    assert "Re-request it alone" in body(second)["message"]


async def test_policy_serial_runs_writes_in_order_after_reads(
    registry: Registry, autojump_clock: Any
) -> None:
    """Under 'serial', reads run first together, then writes one after another in order."""
    turn = await Runner(registry, mutating="serial").run_turn(
        [
            call("w1", "write", {"key": "a", "seconds": 2}),
            call("r", "sleep_for", {"seconds": 1}),
            call("w2", "write", {"key": "b", "seconds": 2}),
        ]
    )
    started = {e.call_id: e.time for e in turn.trace if e.kind is fanout.EventKind.STARTED}
    assert started == {"r": 0.0, "w1": 1.0, "w2": 3.0}
    assert trio.current_time() == 5


async def test_policy_parallel_runs_writes_together(
    registry: Registry, autojump_clock: Any
) -> None:
    """Under 'parallel', writes run concurrently once the reads are done."""
    turn = await Runner(registry, mutating="parallel").run_turn(
        [
            call("w1", "write", {"key": "a", "seconds": 2}),
            call("w2", "write", {"key": "b", "seconds": 2}),
        ]
    )
    assert trio.current_time() == 2
    assert all(r.status is Status.OK for r in turn.results)


async def test_cancel_siblings_names_the_failed_call(
    registry: Registry, autojump_clock: Any
) -> None:
    """With cancel_siblings, the first failure cancels the rest, each told which call failed."""
    runner = Runner(registry, on_failure="cancel_siblings", mutating="serial")
    turn = await runner.run_turn(
        [
            call("slow", "sleep_for", {"seconds": 10}),
            call("bad", "boom"),
            call("w", "write", {"key": "k"}),
        ]
    )
    assert trio.current_time() == 0
    slow, bad, write = turn.results
    assert bad.status is Status.ERROR
    assert slow.status is Status.CANCELLED
    assert "call bad (boom) failed" in body(slow)["message"]
    assert body(slow)["started"] is True
    assert write.status is Status.CANCELLED
    assert body(write)["started"] is False


async def test_caller_cancellation_leaves_a_complete_result_list(
    registry: Registry, autojump_clock: Any
) -> None:
    """Cancelled from outside mid-turn: every id answered, and Cancelled still propagates."""
    runner = Runner(registry, mutating="serial")
    turn = runner.turn(
        [
            call("done", "sleep_for", {"seconds": 1}),
            call("running", "sleep_for", {"seconds": 100}),
            call("pending", "write", {"key": "k"}),
        ]
    )
    propagated = False
    with trio.move_on_after(5) as outer:
        try:
            await turn.run()
        except* trio.Cancelled:
            propagated = True
            raise
    assert outer.cancelled_caught
    assert propagated
    assert trio.current_time() == 5
    done, running, pending = turn.results
    assert done.status is Status.OK
    assert running.status is Status.CANCELLED
    assert body(running)["message"] == "the caller cancelled the turn"
    assert body(running)["started"] is True
    assert pending.status is Status.CANCELLED
    assert body(pending)["started"] is False


async def test_output_is_canonical_and_capped(autojump_clock: Any) -> None:
    """Non-text output is canonical JSON; output over the cap is cut with a visible marker."""
    reg = Registry()

    @reg.tool(kind=Kind.PURE)
    async def data() -> dict[str, Any]:
        return {"b": [1, 2], "a": "é"}

    @reg.tool(kind=Kind.PURE)
    async def big() -> str:
        return "x" * 500

    turn = await Runner(reg, max_output_chars=100).run_turn([call("d", "data"), call("b", "big")])
    data_result, big_result = turn.results
    assert data_result.content == '{"a":"é","b":[1,2]}'
    assert len(big_result.content) == 100
    assert big_result.content.endswith("[truncated by fanout: 443 more characters]")


async def test_turn_runs_once(registry: Registry, autojump_clock: Any) -> None:
    """Running a turn twice is a programming error, not a second set of answers."""
    turn = await Runner(registry).run_turn([call("a", "boom")])
    with pytest.raises(RuntimeError, match="runs once"):
        await turn.run()


async def test_failing_instrument_costs_no_answer(registry: Registry, autojump_clock: Any) -> None:
    """An instrument that raises is logged and ignored; the call is still answered."""

    class Broken:
        def on_event(self, event: fanout.Event) -> None:
            raise RuntimeError("instrument bug")

    turn = await Runner(registry, instruments=[Broken()]).run_turn(
        [call("s", "sleep_for", {"seconds": 1})]
    )
    assert turn.results[0].content == "slept 1"


async def test_error_messages_are_scrubbed_of_credentials(autojump_clock: Any) -> None:
    """A tool error quoting a bearer token or an api_key parameter reaches the model redacted."""
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def leaky() -> str:
        raise RuntimeError(
            "GET https://api.test/x?api_key=abc123secret with Bearer sk-live-0123456789"
        )

    turn = await Runner(reg).run_turn([call("l", "leaky")])
    message = body(turn.results[0])["message"]
    assert "abc123secret" not in message
    assert "sk-live-0123456789" not in message
    assert message.startswith("RuntimeError: GET https://api.test/x?api_key=REDACTED")


async def test_hostile_values_are_answered_not_crashed(autojump_clock: Any) -> None:
    """NaN arguments, NaN output, self-containing output and huge output each get an answer."""
    reg = Registry()

    @reg.tool(kind=Kind.PURE)
    async def echo(x: float) -> dict[str, float]:
        return {"x": x}

    @reg.tool(kind=Kind.PURE)
    async def loop() -> list[Any]:
        looped: list[Any] = []
        looped.append(looped)
        return looped

    @reg.tool(kind=Kind.PURE)
    async def huge() -> str:
        return "y" * 10_000_000

    message = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "echo", "arguments": '{"x": NaN}'},
            },
            {"id": "b", "type": "function", "function": {"name": "loop", "arguments": "{}"}},
            {"id": "c", "type": "function", "function": {"name": "huge", "arguments": "{}"}},
        ],
    }
    turn = await Runner(reg).run_turn(fanout.calls_from_openai(message))
    nan, looped, big = turn.results
    assert nan.status is Status.OK
    assert nan.content == '{"x":"NaN"}'
    assert looped.status is Status.ERROR
    assert "cannot be written as JSON" in body(looped)["message"]
    assert big.status is Status.OK
    assert 7990 < len(big.content) <= 8000
    assert big.content.endswith("more characters]")


def test_a_turn_not_yet_run_answers_every_call_cancelled(registry: Registry) -> None:
    """`results` is complete before `run()`: each call is cancelled, not started, not lost."""
    turn = Runner(registry).turn([call("a", "sleep_for", {"seconds": 1}), call("b", "boom")])
    assert [r.status for r in turn.results] == [Status.CANCELLED, Status.CANCELLED]
    for result in turn.results:
        assert body(result)["message"] == "the turn has not finished running this call"
        assert body(result)["started"] is False


async def test_a_turn_that_fanout_breaks_answers_error_and_returns(
    registry: Registry, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A read cache that fails while calls are checked: every call is answered error naming
    fanout's failure (not the caller), the failure is logged, and run() returns."""

    class UnreadableCache(ReadCache):
        def get(self, key: str) -> str | None:
            raise OSError("cache unreadable")

    reg = Registry()

    @reg.tool(kind=Kind.READS, cache_ttl=60)
    async def cached() -> str:
        return "value"

    run = fanout.Run()
    run.cache = UnreadableCache()
    turn = await Runner(reg).run_turn([call("a", "cached"), call("b", "cached")], run=run)
    assert [r.status for r in turn.results] == [Status.ERROR, Status.ERROR]
    assert body(turn.results[0])["message"] == (
        "fanout failed while handling this call (OSError: cache unreadable); it was not finished"
    )
    assert trio.current_time() == 0
    assert "fanout: a turn failed" in caplog.text


class CollectorSeen:
    """An instrument noting, for each kind of event, whether the cyclic collector was on."""

    def __init__(self) -> None:
        self.seen: dict[fanout.EventKind, set[bool]] = {}

    def on_event(self, event: fanout.Event) -> None:
        self.seen.setdefault(event.kind, set()).add(gc.isenabled())


@pytest.mark.parametrize("scoped", [False, True])
@pytest.mark.parametrize("collecting", [True, False])
async def test_calls_are_checked_with_the_collector_paused_and_run_with_it_as_it_was(
    autojump_clock: Any, scoped: bool, collecting: bool
) -> None:
    """A turn checks its calls with the cyclic collector paused; they run (scoped or not)
    with it as it was, and it is left as it was: off stays off."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=("api",) if scoped else ())
    async def read(n: int) -> str:
        return f"read {n}"

    seen = CollectorSeen()
    (gc.enable if collecting else gc.disable)()
    try:
        turn = await Runner(reg, instruments=[seen]).run_turn(
            [call(f"c{i}", "read", {"n": i}) for i in range(3)]
        )
        assert gc.isenabled() is collecting
    finally:
        gc.enable()
    assert [r.content for r in turn.results] == ["read 0", "read 1", "read 2"]
    assert seen.seen[fanout.EventKind.QUEUED] == {False}
    assert seen.seen[fanout.EventKind.STARTED] == {collecting}
    assert seen.seen[fanout.EventKind.ANSWERED] == {collecting}


def test_a_turns_calls_are_built_with_the_collector_paused(registry: Registry) -> None:
    """Building a turn's calls (their idempotency keys read the arguments) runs with the
    cyclic collector paused, and turns it back on."""
    seen: list[bool] = []

    class Spy:
        def __str__(self) -> str:
            seen.append(gc.isenabled())
            return "spy"

    Runner(registry).turn([call("c1", "sleep_for", {"seconds": Spy()})])
    assert seen == [False]
    assert gc.isenabled()


# --- found from outside: hosted runners, the caller's cancellation, late results -----


async def test_a_call_answered_cancelled_while_it_waited_never_runs(autojump_clock: Any) -> None:
    """Under cancel_siblings, in an open runner: write a holds the scope's one slot and
    fails; write b, waiting for the slot, is answered cancelled, not started. The slot a
    gave back woke b before its cancellation came, and b charged the card."""
    charged: list[str] = []
    reg = Registry()

    @reg.tool(kind=Kind.MUTATING, scopes=["payments"])
    async def charge(card: str) -> str:
        if card == "bad":
            await trio.sleep(1)
            raise ValueError("card declined")
        charged.append(card)
        return f"charged {card}"

    scope = fanout.Scope("payments", max_concurrency=1)
    calls = [ToolCall("a", "charge", {"card": "bad"}), ToolCall("b", "charge", {"card": "4242"})]
    for hosted in (False, True):
        runner = Runner(reg, scopes=[scope], mutating="parallel", on_failure="cancel_siblings")
        if hosted:
            async with runner:
                turn = await runner.run_turn(calls)
                await trio.sleep(2)
        else:
            turn = await runner.run_turn(calls)
        b = json.loads(turn.results[1].content)
        assert (b["status"], b["started"]) == ("cancelled", False)
        assert charged == []


async def test_a_serial_write_unwinding_past_the_deadline_holds_the_runner_not_the_turn(
    autojump_clock: Any,
) -> None:
    """An open runner, writes one at a time: a write that takes 100 s to unwind once
    cancelled held ``run_turn`` 100 s past its 5 s deadline; reads did not."""
    reg = Registry()

    @reg.tool(kind=Kind.MUTATING)
    async def slow_write() -> str:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(100)
        return "never"

    for mutating in ("one", "serial"):
        async with Runner(reg, turn_timeout=5, mutating=mutating) as runner:
            began = trio.current_time()
            turn = await runner.run_turn([ToolCall("w", "slow_write", {})])
            assert trio.current_time() - began == 5 + 0.0  # at its deadline, exactly
            assert turn.results[0].status is Status.TIMED_OUT


async def test_a_caller_cancelling_is_said_even_when_a_call_unwinds_past_the_deadline(
    autojump_clock: Any,
) -> None:
    """The caller cancels at 0.5 s (deadline 2 s); a call takes 5 s to unwind: its answer
    said "the turn's deadline of 2s passed"."""
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def stubborn() -> str:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(5)
        return "never"

    @reg.tool(kind=Kind.READS)
    async def quick() -> str:
        await trio.sleep_forever()
        return "never"

    turn = Runner(reg, turn_timeout=2).turn(
        [ToolCall("s", "stubborn", {}), ToolCall("q", "quick", {})]
    )
    with trio.move_on_after(0.5):
        await turn.run()
    for result in turn.results:
        body = json.loads(result.content)
        assert (body["status"], body["message"]) == ("cancelled", "the caller cancelled the turn")


async def test_a_read_that_ran_beside_a_write_is_not_cached(autojump_clock: Any) -> None:
    """A cached read times out and its tool returns later, after a write in the same turn
    changed what it read: its late result went into the cache, and the next turn's read
    was answered from before the write."""
    balance = {"value": 100}
    reg = Registry()

    @reg.tool(kind=Kind.READS, cache_ttl=60, timeout=1)
    async def get_balance() -> str:
        seen = balance["value"]
        with trio.CancelScope(shield=True):
            await trio.sleep(3)
        return f"balance {seen}"

    @reg.tool(kind=Kind.MUTATING)
    async def withdraw(amount: int) -> str:
        balance["value"] -= amount
        return f"withdrew {amount}"

    run = fanout.Run()
    async with Runner(reg, turn_timeout=30) as runner:
        await runner.run_turn(
            [ToolCall("r1", "get_balance", {}), ToolCall("w1", "withdraw", {"amount": 70})],
            run=run,
        )
        await trio.sleep(5)
        assert len(run.cache) == 0
        turn = await runner.run_turn([ToolCall("r2", "get_balance", {})], run=run)
    assert fanout.EventKind.CACHE_HIT not in [e.kind for e in turn.trace]


async def test_a_write_that_returns_after_its_timeout_is_replayed_with_its_own_answer(
    autojump_clock: Any,
) -> None:
    """A write passes its timeout (answered timed_out) and then returns from a shielded
    commit: the timed_out answer was stored as the tool's and replayed for a day; a
    re-issue is now answered with what the write really did, and does not run again."""
    charged: list[int] = []
    reg = Registry()

    @reg.tool(kind=Kind.MUTATING, timeout=1)
    async def charge(amount: int) -> str:
        with trio.CancelScope(shield=True):
            await trio.sleep(2)
            charged.append(amount)
        return f"charged {amount}"

    run = fanout.Run()
    async with Runner(reg) as runner:
        first = await runner.run_turn([ToolCall("c1", "charge", {"amount": 5})], run=run)
        assert first.results[0].status is Status.TIMED_OUT
        await trio.sleep(5)
        again = await runner.run_turn([ToolCall("c2", "charge", {"amount": 5})], run=run)
    assert (again.results[0].status, again.results[0].content) == (Status.OK, "charged 5")
    assert charged == [5]


async def test_a_tool_raising_a_group_with_a_kept_cancellation_is_its_own_error(
    autojump_clock: Any,
) -> None:
    """A tool raises ``BaseExceptionGroup([a Cancelled it kept, ValueError])``: that call's
    error; the sibling's answer is its own (both were "the caller cancelled the turn")."""
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def helper_pool() -> str:
        with trio.CancelScope() as inner:
            inner.cancel()
            try:
                await trio.sleep(1)
            except trio.Cancelled as exc:
                kept = exc
        raise BaseExceptionGroup("pool", [kept, ValueError("boom")])

    @reg.tool(kind=Kind.READS)
    async def healthy() -> str:
        await trio.sleep(1)
        return "fine"

    turn = await Runner(reg).run_turn(
        [ToolCall("h", "helper_pool", {}), ToolCall("ok", "healthy", {})]
    )
    assert [r.status for r in turn.results] == [Status.ERROR, Status.OK]
    assert "caller" not in turn.results[0].content


def test_a_sync_tool_that_waited_for_a_thread_did_not_start() -> None:
    """A sync tool that ignores its cancellation keeps its worker thread after its call is
    answered; a later call of a sync tool waits for a thread, and, timed out waiting, was
    answered "started" though it never ran."""
    stuck = threading.Event()
    ran: list[str] = []
    reg = Registry()

    @reg.tool(kind=Kind.READS, timeout=1)
    def blocking() -> str:
        stuck.wait()  # a client with no timeout of its own
        return "late"

    @reg.tool(kind=Kind.READS, timeout=1)
    def quick() -> str:
        ran.append("quick")
        return "fine"

    async def main() -> tuple[fanout.Turn, fanout.Turn]:
        runner = Runner(reg, max_threads=1)
        first = await runner.run_turn([ToolCall("a", "blocking", {})])
        return first, await runner.run_turn([ToolCall("b", "quick", {})])

    try:
        first, second = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.05))
    finally:
        stuck.set()
    assert json.loads(first.results[0].content)["started"] is True
    answer = json.loads(second.results[0].content)
    assert (answer["status"], answer["started"]) == ("timed_out", False)
    assert ran == []


def test_a_sync_write_answered_not_started_never_runs() -> None:
    """Sync writes cut off by their timeouts as their threads are handed them: every one
    answered ``"started": false`` never ran. (Marked started only as the thread ran it, a
    write cut off in between was answered so, and then charged the card.)"""
    ran: set[str] = set()
    lock = threading.Lock()
    reg = Registry()

    @reg.tool(kind=Kind.MUTATING, timeout=0.001, repeatable=True)
    def charge(card: str) -> str:
        with lock:
            ran.add(card)
        return f"charged {card}"

    async def main() -> fanout.Turn:
        calls = [ToolCall(f"c{i}", "charge", {"card": f"card-{i}"}) for i in range(40)]
        async with Runner(reg, mutating="parallel", max_threads=4) as runner:
            return await runner.run_turn(calls)

    turn = trio.run(main)
    for result in turn.results:
        body = json.loads(result.content) if result.is_error else {"started": True}
        card = "card-" + result.tool_use_id[1:]
        if body["started"] is False:
            assert card not in ran, f"{result.tool_use_id} answered not started, and ran"


def test_a_sync_call_answered_while_it_waited_for_a_thread_never_runs() -> None:
    """Under ``cancel_siblings`` in an open runner, a sync call waiting for the one
    worker thread is answered "cancelled, not started" when the call holding the thread
    fails; the thread given back woke it before its cancellation came, and it ran.
    (Woken first, it has started, and says so.)"""
    ran: list[str] = []
    reg = Registry()

    @reg.tool(kind=Kind.READS, timeout=5)
    def lookup() -> str:
        time.sleep(0.05)
        raise RuntimeError("lookup failed")

    @reg.tool(kind=Kind.READS, timeout=5)
    def charge() -> str:
        ran.append("charged")
        return "charged"

    async def main() -> fanout.Turn:
        runner = Runner(reg, on_failure="cancel_siblings", max_threads=1)
        async with runner:
            turn = await runner.run_turn([ToolCall("a", "lookup", {}), ToolCall("b", "charge", {})])
        await trio.sleep(0.1)  # a thread it was let start would have run by now
        return turn

    # Which of the two trio wakes first, the failed call or the write its thread went
    # to, is drawn at random each run: one run in two showed it.
    for _ in range(12):
        turn = trio.run(main)
        answer = json.loads(turn.results[1].content)
        assert answer["status"] == "cancelled"
        if answer["started"] is False:
            assert ran == []
        ran.clear()


def test_sync_writes_answered_at_their_deadline_while_they_waited_never_run() -> None:
    """Sync writes waiting for a thread past their timeouts are answered and cancelled a
    batch at a time; one woken by a freed thread before its cancellation ran, answered
    "timed_out, not started"."""
    ran: set[str] = set()
    lock = threading.Lock()
    reg = Registry()

    @reg.tool(kind=Kind.MUTATING, timeout=0.3)
    def charge(card: str) -> str:
        with lock:
            ran.add(card)
        time.sleep(0.004)
        return f"charged {card}"

    async def main() -> fanout.Turn:
        calls = [ToolCall(f"c{i}", "charge", {"card": f"card-{i}"}) for i in range(200)]
        async with Runner(reg, mutating="parallel", max_threads=2, turn_timeout=5) as runner:
            turn = await runner.run_turn(calls)
        await trio.sleep(0.1)
        return turn

    for _ in range(12):
        turn = trio.run(main)
        not_started = [
            "card-" + r.tool_use_id[1:]
            for r in turn.results
            if r.is_error and json.loads(r.content)["started"] is False
        ]
        assert not_started, "no call waited past its timeout: the test shows nothing"
        assert ran.isdisjoint(not_started)
        ran.clear()


def _hogging_the_thread(release: threading.Event, *, timeout: float) -> Registry:
    """A registry whose ``hog`` keeps its worker thread, ignoring its cancellation, until
    ``release`` is set (a client with no timeout of its own)."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, timeout=timeout)
    def hog() -> str:
        release.wait(3)
        return "held"

    return reg


def test_a_sync_write_that_ran_and_then_waited_for_a_thread_says_it_started() -> None:
    """A sync write's first attempt runs and fails; its retry waits for the one thread
    (held by a tool that ignores its cancellation) until its deadline. Each attempt took
    the call for not started again, and the write that had run was answered "not
    started"."""
    ran: list[str] = []
    release = threading.Event()
    reg = _hogging_the_thread(release, timeout=0.3)

    @reg.tool(kind=Kind.MUTATING, timeout=1.0, retry=RetryPolicy(attempts=3, base=0.2, cap=0.2))
    def charge(amount: int) -> str:
        ran.append("charged")
        raise TransientError("the gateway hiccuped")

    async def main() -> fanout.Turn:
        runner = Runner(reg, max_threads=1, turn_timeout=5)
        turns: list[fanout.Turn] = []

        async def write() -> None:
            turns.append(await runner.run_turn([ToolCall("w", "charge", {"amount": 5})]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await trio.sleep(0.05)  # the write's first attempt has run
            await runner.run_turn([ToolCall("h", "hog", {})])  # and the thread is taken
        return turns[0]

    try:
        turn = trio.run(main)
    finally:
        release.set()
    assert ran
    assert json.loads(turn.results[0].content)["started"] is True


def test_an_idle_timeout_before_a_thread_came_says_the_tool_never_started() -> None:
    """A sync write with an idle timeout waits for the one thread, held by a tool that
    ignores its cancellation: answered at the idle timeout, it never ran, and says so
    (it said "started", its effect unknown)."""
    ran: list[str] = []
    release = threading.Event()
    reg = _hogging_the_thread(release, timeout=0.1)

    @reg.tool(kind=Kind.MUTATING, timeout=2, idle_timeout=0.3)
    def charge() -> str:
        ran.append("charged")
        return "charged"

    async def main() -> fanout.Turn:
        runner = Runner(reg, max_threads=1, turn_timeout=5)
        await runner.run_turn([ToolCall("h", "hog", {})])
        return await runner.run_turn([ToolCall("w", "charge", {})])

    try:
        turn = trio.run(main)
    finally:
        release.set()
    answer = json.loads(turn.results[0].content)
    assert (answer["status"], answer["started"]) == ("timed_out", False)
    assert "effect" not in answer
    assert ran == []


async def test_calls_sharing_a_run_that_failed_share_its_answer_under_cancel_siblings(
    autojump_clock: Any,
) -> None:
    """Three identical writes share one run, which charges and then fails: each is given
    the run's answer. (The first follower's failure was taken for a sibling's, and the
    others were answered "cancelled, not started" beside a write that had run.)"""
    reg = Registry()
    ran: list[int] = []

    @reg.tool(kind=Kind.MUTATING)
    async def charge(amount: int) -> str:
        ran.append(amount)
        await trio.sleep(0.1)
        raise RuntimeError("the receipt printer jammed")

    runner = Runner(reg, on_failure="cancel_siblings", mutating="parallel")
    turn = await runner.run_turn([ToolCall(f"c{i}", "charge", {"amount": 5}) for i in range(3)])
    assert ran == [5]
    for result in turn.results:
        answer = json.loads(result.content)
        assert (answer["status"], answer["started"]) == ("error", True)
        assert "jammed" in answer["message"]
