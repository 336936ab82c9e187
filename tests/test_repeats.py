"""Coalescing, the read cache and idempotency: execution counts, not only outputs."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
import trio
import trio.testing

import fanout
from fanout import Kind, Registry, Run, Runner, Status, ToolCall
from fanout.idempotency import MemoryIdempotencyStore, idempotency_key


@pytest.fixture
def executions() -> Counter[str]:
    return Counter()


@pytest.fixture
def runner(executions: Counter[str]) -> Runner:
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def search(query: str, limit: int = 10) -> dict[str, Any]:
        executions["search"] += 1
        await trio.sleep(1)
        return {"query": query, "limit": limit, "hits": executions["search"]}

    @reg.tool(kind=Kind.READS, cache_ttl=60)
    async def profile(user: str) -> str:
        executions["profile"] += 1
        return f"{user} v{executions['profile']}"

    @reg.tool(kind=Kind.READS, cache_ttl=60)
    async def prices(sku: str) -> str:
        executions["prices"] += 1
        return f"{sku} v{executions['prices']}"

    @reg.tool(kind=Kind.MUTATING, invalidates=["profile"])
    async def rename(user: str, name: str) -> str:
        executions["rename"] += 1
        return f"renamed {user} to {name}"

    @reg.tool(kind=Kind.MUTATING)
    async def send_invoice(customer: str, amount: int) -> str:
        executions["send_invoice"] += 1
        await trio.sleep(2)
        return f"invoice #{executions['send_invoice']} for {customer}"

    @reg.tool(kind=Kind.PURE, repeatable=True)
    async def roll_die() -> int:
        executions["roll_die"] += 1
        return executions["roll_die"]

    @reg.tool(kind=Kind.MUTATING, timeout=1)
    async def slow_write(key: str) -> str:
        executions["slow_write"] += 1
        await trio.sleep(5)
        return "written"

    @reg.tool(kind=Kind.MUTATING)
    async def whoami() -> str:
        return fanout.current_call().idempotency_key

    return Runner(reg, mutating="serial")


async def test_identical_reads_in_a_turn_run_once(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """Two identical searches: one execution, both ids answered with the same content."""
    turn = await runner.run_turn(
        [
            ToolCall("a", "search", {"query": "refunds"}),
            ToolCall("b", "search", {"query": "other"}),
            ToolCall("c", "search", {"query": "refunds"}),
        ]
    )
    assert executions["search"] == 2
    a, b, c = turn.results
    assert [r.tool_use_id for r in turn.results] == ["a", "b", "c"]
    assert a.content == c.content
    assert a.status is c.status is Status.OK
    assert b.content != a.content
    coalesced = [e for e in turn.trace if e.kind is fanout.EventKind.COALESCED]
    assert [(e.call_id, e.detail["leader"]) for e in coalesced] == [("c", "a")]


async def test_argument_order_and_spacing_do_not_matter(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """{"query":..,"limit":..} and the same keys reversed are one call (OpenAI JSON strings too)."""
    message = {
        "role": "assistant",
        "tool_calls": [
            {"id": "x", "type": "function",
             "function": {"name": "search", "arguments": '{"query": "q", "limit": 2}'}},
            {"id": "y", "type": "function",
             "function": {"name": "search", "arguments": '{"limit":2,"query":"q"}'}},
        ],
    }  # fmt: skip
    turn = await runner.run_turn(fanout.calls_from_openai(message))
    assert executions["search"] == 1
    assert turn.results[0].content == turn.results[1].content


async def test_cached_read_runs_zero_times_within_ttl_and_once_after(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """A read with cache_ttl=60 is answered from the run's cache until the TTL passes."""
    run = Run()
    first = await runner.run_turn([ToolCall("p1", "profile", {"user": "ada"})], run=run)
    await trio.sleep(59)
    second = await runner.run_turn([ToolCall("p2", "profile", {"user": "ada"})], run=run)
    assert executions["profile"] == 1
    assert second.results[0].content == first.results[0].content == "ada v1"
    assert [e.kind for e in second.trace if e.call_id == "p2"][:2] == [
        fanout.EventKind.QUEUED,
        fanout.EventKind.CACHE_HIT,
    ]
    await trio.sleep(1)
    third = await runner.run_turn([ToolCall("p3", "profile", {"user": "ada"})], run=run)
    assert executions["profile"] == 2
    assert third.results[0].content == "ada v2"


async def test_cache_is_per_run(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """Another conversation does not see this one's cached reads."""
    await runner.run_turn([ToolCall("p1", "profile", {"user": "ada"})], run=Run())
    await runner.run_turn([ToolCall("p2", "profile", {"user": "ada"})], run=Run())
    assert executions["profile"] == 2


async def test_a_write_invalidates_the_reads_it_declares(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """rename drops cached profiles (it declares them) but not prices."""
    run = Run()
    reads = [ToolCall("p", "profile", {"user": "ada"}), ToolCall("s", "prices", {"sku": "x"})]
    await runner.run_turn(reads, run=run)
    await runner.run_turn([ToolCall("w", "rename", {"user": "ada", "name": "Ada"})], run=run)
    after = await runner.run_turn(
        [ToolCall("p2", "profile", {"user": "ada"}), ToolCall("s2", "prices", {"sku": "x"})],
        run=run,
    )
    assert executions["profile"] == 2
    assert executions["prices"] == 1
    assert [r.content for r in after.results] == ["ada v2", "x v1"]


async def test_a_write_declaring_nothing_invalidates_everything(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """By default a write makes every cached read stale: correctness over savings."""
    run = Run()
    await runner.run_turn([ToolCall("s", "prices", {"sku": "x"})], run=run)
    await runner.run_turn([ToolCall("w", "send_invoice", {"customer": "c", "amount": 1})], run=run)
    await runner.run_turn([ToolCall("s2", "prices", {"sku": "x"})], run=run)
    assert executions["prices"] == 2


async def test_a_repeatable_write_still_makes_cached_reads_stale(autojump_clock: Any) -> None:
    """A write that opts out of replay (repeatable) still changes the world: it drops the
    cached reads it declares, like any other write."""
    reg = Registry()
    count: Counter[str] = Counter()

    @reg.tool(kind=Kind.READS, cache_ttl=60)
    async def balance() -> str:
        count["balance"] += 1
        return f"balance v{count['balance']}"

    @reg.tool(kind=Kind.MUTATING, repeatable=True, invalidates=["balance"])
    async def deposit() -> str:
        return "deposited"

    runner, run = Runner(reg), Run()
    await runner.run_turn([ToolCall("b1", "balance", {})], run=run)
    await runner.run_turn([ToolCall("d", "deposit", {})], run=run)
    after = await runner.run_turn([ToolCall("b2", "balance", {})], run=run)
    assert after.results[0].content == "balance v2"


async def test_duplicate_write_in_one_turn_takes_effect_once(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """The same invoice twice in one turn: one effect, both ids answered, not refused."""
    one = Runner(runner.registry)  # policy "one" would refuse a *different* second write
    turn = await one.run_turn(
        [
            ToolCall("i1", "send_invoice", {"customer": "acme", "amount": 5}),
            ToolCall("i2", "send_invoice", {"amount": 5, "customer": "acme"}),
        ]
    )
    assert executions["send_invoice"] == 1
    assert [r.status for r in turn.results] == [Status.OK, Status.OK]
    assert turn.results[0].content == turn.results[1].content == "invoice #1 for acme"
    replayed = [e.call_id for e in turn.trace if e.kind is fanout.EventKind.REPLAYED]
    assert replayed == ["i2"]


async def test_reissued_write_in_a_later_turn_is_replayed(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """Re-issued in the next turn of the same run, a write is answered, not executed again."""
    run = Run()
    call = {"customer": "acme", "amount": 5}
    first = await runner.run_turn([ToolCall("i1", "send_invoice", call)], run=run)
    start = trio.current_time()
    again = await runner.run_turn([ToolCall("i9", "send_invoice", call)], run=run)
    assert executions["send_invoice"] == 1
    assert trio.current_time() == start
    assert again.results[0].content == first.results[0].content
    assert again.results[0].tool_use_id == "i9"
    assert fanout.EventKind.REPLAYED in [e.kind for e in again.trace]


async def test_a_different_run_executes_the_write_again(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """Idempotency is per conversation: another run's identical write is its own effect."""
    call = {"customer": "acme", "amount": 5}
    await runner.run_turn([ToolCall("i1", "send_invoice", call)], run=Run())
    await runner.run_turn([ToolCall("i1", "send_invoice", call)], run=Run())
    assert executions["send_invoice"] == 2


async def test_a_write_cut_off_is_not_replayed(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """A timed-out write has an unknown effect: its claim is released and a re-issue runs."""
    run = Run()
    first = await runner.run_turn([ToolCall("w1", "slow_write", {"key": "k"})], run=run)
    assert first.results[0].status is Status.TIMED_OUT
    assert "effect" in json.loads(first.results[0].content)
    await runner.run_turn([ToolCall("w2", "slow_write", {"key": "k"})], run=run)
    assert executions["slow_write"] == 2


async def test_identical_write_running_elsewhere_is_waited_for(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """Two turns of one run issue the same write at once: it runs once, both get its answer."""
    run = Run()
    call = {"customer": "acme", "amount": 7}
    turns: list[fanout.Turn] = []

    async def play(call_id: str) -> None:
        turns.append(await runner.run_turn([ToolCall(call_id, "send_invoice", call)], run=run))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(play, "first")
        await trio.sleep(0.5)
        nursery.start_soon(play, "second")
    assert executions["send_invoice"] == 1
    assert [t.results[0].content for t in turns] == ["invoice #1 for acme"] * 2
    # The write ends at 2.0; the second call, looking from 0.5 after pauses of
    # 0.05, 0.1, 0.2, 0.4 and 0.8 seconds, finds its answer at 2.05.
    assert trio.current_time() == 2.05


async def test_repeatable_tools_opt_out(
    runner: Runner, executions: Counter[str], autojump_clock: Any
) -> None:
    """A die roll is meant to repeat: no coalescing, no caching, each call runs."""
    turn = await runner.run_turn([ToolCall(f"d{i}", "roll_die", {}) for i in range(3)])
    assert executions["roll_die"] == 3
    assert sorted(r.content for r in turn.results) == ["1", "2", "3"]


async def test_tools_see_their_idempotency_key(runner: Runner, autojump_clock: Any) -> None:
    """current_call().idempotency_key is sha256(run id, tool, canonical arguments)."""
    turn = await runner.run_turn([ToolCall("k", "whoami", {})], run=Run("conversation-7"))
    assert turn.results[0].content == idempotency_key("conversation-7", "whoami", {})


async def test_coalescing_keeps_order_and_the_transcript_deterministic(autojump_clock: Any) -> None:
    """Followers keep their places; two equal runs give byte-identical messages."""
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def lookup(query: str) -> str:
        await trio.sleep(len(query))
        return f"results for {query}"

    calls = [
        ToolCall("z", "lookup", {"query": "qq"}),
        ToolCall("y", "lookup", {"query": "r"}),
        ToolCall("x", "lookup", {"query": "qq"}),
    ]
    messages = []
    for _ in range(2):
        turn = await Runner(reg).run_turn(calls, run=Run("same"))
        assert [r.tool_use_id for r in turn.results] == ["z", "y", "x"]
        messages.append(json.dumps(fanout.anthropic_tool_results(turn)))
    assert messages[0] == messages[1]
    blocks = json.loads(messages[0])["content"]
    assert blocks[0]["content"] == blocks[2]["content"] == "results for qq"


def _long_write_registry(executions: Counter[str]) -> Registry:
    reg = Registry()

    @reg.tool(kind=Kind.MUTATING)
    async def migrate(table: str) -> str:
        executions["migrate"] += 1
        await trio.sleep(5)
        return f"migrated {table}"

    return reg


async def _same_write_twice(first: Runner, second: Runner, run: Run) -> list[fanout.Turn]:
    """The same write from two turns of one run, the second issued at 0.5 s."""
    turns: list[fanout.Turn] = []
    call = {"table": "users"}

    async def play(runner: Runner, call_id: str) -> None:
        turns.append(await runner.run_turn([ToolCall(call_id, "migrate", call)], run=run))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(play, first, "first")
        await trio.sleep(0.5)
        nursery.start_soon(play, second, "second")
    return turns


async def test_a_write_held_elsewhere_is_waited_for_only_as_long_as_fanout_waits_inline(
    executions: Counter[str], autojump_clock: Any
) -> None:
    """Past inline_wait, the repeat is answered rate_limited, not run, and told to re-issue."""
    reg = _long_write_registry(executions)
    turns = await _same_write_twice(Runner(reg), Runner(reg, inline_wait=1.0), Run())
    first, second = sorted(turns, key=lambda t: t.results[0].tool_use_id)
    assert executions["migrate"] == 1
    assert first.results[0].content == "migrated users"
    answer = second.results[0]
    body = json.loads(answer.content)
    assert (answer.status, answer.retry_after_ms, body["started"]) == (
        Status.RATE_LIMITED, 1000, False,
    )  # fmt: skip
    # Pauses of 0.05, 0.1, 0.2 and 0.4 s fit within 1 s; the next (0.8 s) does not.
    assert "waited 0.750s for its answer, as long as fanout waits inline" in body["message"]
    answered = [e.time for e in second.trace if e.kind is fanout.EventKind.ANSWERED]
    assert answered == [0.5 + 0.75]


async def test_a_write_held_elsewhere_past_the_deadline_is_answered_timed_out(
    executions: Counter[str], autojump_clock: Any
) -> None:
    """Waiting for another holder never passes the deadline: timed_out, not run."""
    reg = _long_write_registry(executions)
    short = Runner(reg, inline_wait=None, turn_timeout=1.0)
    turns = await _same_write_twice(Runner(reg), short, Run())
    second = next(t for t in turns if t.results[0].tool_use_id == "second")
    assert executions["migrate"] == 1
    body = json.loads(second.results[0].content)
    assert (second.results[0].status, body["started"]) == (Status.TIMED_OUT, False)
    assert "waited for its answer until its deadline" in body["message"]
    answered = [e.time for e in second.trace if e.kind is fanout.EventKind.ANSWERED]
    # Deadline 1.5: after looking at 1.25, the next pause (0.8 s) would end past
    # it, so the call is answered then rather than sleeping to no purpose.
    assert answered == [1.25]


class _LapsingStore(MemoryIdempotencyStore):
    """Renewals say the claim lapsed, then fail outright."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0

    async def renew(self, key: str, *, lease: float) -> bool:
        await trio.lowlevel.checkpoint()
        self.renewals += 1
        if self.renewals == 1:
            return False
        raise ConnectionError("store went away")


async def test_a_claim_that_cannot_be_renewed_is_logged_and_the_write_still_answered(
    executions: Counter[str], autojump_clock: Any, caplog: Any
) -> None:
    """A lapsed or failing renewal warns; the write runs on to its own answer."""
    store = _LapsingStore()
    run = Run(store=store, claim_lease=3.0)  # renewed every second of the 5 s write
    turn = await Runner(_long_write_registry(executions)).run_turn(
        [ToolCall("w", "migrate", {"table": "orders"})], run=run
    )
    assert turn.results[0].content == "migrated orders"
    assert store.renewals == 4  # at 1, 2, 3 and 4 s
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings[0] == "fanout: the claim on a write's key lapsed while it ran"
    assert warnings[1:] == ["fanout: renewing a write's claim failed"] * 3


class _SilentStore(MemoryIdempotencyStore):
    """A store that never answers a claim."""

    async def claim(self, key: str, *, lease: float) -> fanout.idempotency.Claim:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


def test_a_store_that_never_answers_times_the_write_out_the_same_way_every_run() -> None:
    """The claim waits to the write's 1 s deadline: the write is answered timed_out, never run,
    and with the same words on every run (the store's silence and the deadline end together)."""
    ran: list[str] = []

    async def play() -> str:
        reg = Registry()

        @reg.tool(kind=Kind.MUTATING, timeout=1)
        async def send() -> str:
            ran.append("send")
            return "sent"

        run = Run(store=_SilentStore())
        turn = await Runner(reg).run_turn([ToolCall("w", "send", {})], run=run)
        assert trio.current_time() == 1.0
        return turn.results[0].content

    clock = trio.testing.MockClock
    answers = {trio.run(play, clock=clock(autojump_threshold=0)) for _ in range(16)}
    assert ran == []
    assert len(answers) == 1
    body = json.loads(answers.pop())
    assert (body["status"], body["message"]) == ("timed_out", "the call's own timeout of 1s passed")


_LONG = "".join(f"line {i}; " for i in range(200))  # 1,890 characters
_OUTPUTS: dict[str, Any] = {
    "text": _LONG,
    "json": {"lines": [f"line {i}" for i in range(200)]},
    "blocks": [
        fanout.Text(_LONG[:700]),
        fanout.Image(b"\x89PNG\r\n\x1a\n" + bytes(range(256))),
        fanout.Text(_LONG[700:]),
    ],
}


def _kept_answers_registry() -> Registry:
    reg = Registry()

    @reg.tool(kind=Kind.MUTATING)
    async def post(form: str) -> Any:
        return _OUTPUTS[form]

    @reg.tool(kind=Kind.READS, cache_ttl=60)
    async def fetch(form: str) -> Any:
        return _OUTPUTS[form]

    return reg


@pytest.mark.parametrize("tool", ["post", "fetch"])
@pytest.mark.parametrize("form", sorted(_OUTPUTS))
@pytest.mark.parametrize("first_cap", [300, 8000])
async def test_a_kept_answer_is_cut_to_the_replaying_runners_cap(
    tool: str, form: str, first_cap: int, autojump_clock: Any
) -> None:
    """A write replayed from the run's store, or a read from its cache, that a runner with a
    larger cap kept (cut or whole): a runner capped at 100 hands over what its own fresh
    answer would be, within its cap and marked as cut."""
    call = {"form": form}
    run = Run()
    kept = await Runner(_kept_answers_registry(), max_output_chars=first_cap).run_turn(
        [ToolCall("k1", tool, call)], run=run
    )
    small = Runner(_kept_answers_registry(), max_output_chars=100)
    again = await small.run_turn([ToolCall("k2", tool, call)], run=run)
    fresh = await small.run_turn([ToolCall("k3", tool, call)], run=Run())
    answer = again.results[0]
    kinds = [e.kind for e in again.trace]
    assert fanout.EventKind.REPLAYED in kinds or fanout.EventKind.CACHE_HIT in kinds
    assert answer.status is Status.OK
    assert answer.content == fresh.results[0].content != kept.results[0].content
    if form != "blocks":  # an image is never cut, and counts for nothing against the cap
        assert len(answer.content) <= 100
    assert "truncated" in answer.content
