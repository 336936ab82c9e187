"""The event contract: what the runner tells instruments, in what order, at what time.

The turns here are shared with the integration tests (``test_contrib_*.py``).
The throttled turn: one scope ``crm-key`` (1 token a second, burst 1, two in
flight); three reads of 1.5 s contending for it; a write whose first attempt
is throttled with a 0.5 s Retry-After; a second write, refused by the default
``mutating="one"`` policy; and a tool that does not exist. The HTTP turn: two
fetches through fanout's transport from the loopback throttling server.
"""

from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import attrs
import trio

import fanout
from fanout import Event, EventKind, Kind, Registry, Runner, Scope, Status, ToolCall
from fanout.testing import ServerConfig, serve_throttled

if TYPE_CHECKING:
    from collections.abc import Iterator

E = EventKind
SECRET = "sk-test-123"
SCOPE = "crm-key"
# Each line: kind, time, scope, attempt, status, wait.
Line = tuple[EventKind, float, str | None, int | None, Status | None, float | None]

# A turn admits its calls in the model's order, so r1 takes the first token,
# r2 waits for the next, and r3 waits for a slot (r1's), then for a token.
READ_FIRST: list[Line] = [
    (E.QUEUED, 0.0, None, None, None, None),
    (E.SLOT_ACQUIRED, 0.0, SCOPE, 1, None, None),
    (E.STARTED, 0.0, None, 1, None, None),
    (E.ANSWERED, 1.5, None, 1, Status.OK, None),
]
READ_SECOND: list[Line] = [
    (E.QUEUED, 0.0, None, None, None, None),
    (E.SLOT_ACQUIRED, 0.0, SCOPE, 1, None, None),
    (E.TOKEN_WAIT, 0.0, SCOPE, 1, None, 1.0),
    (E.STARTED, 1.0, None, 1, None, None),
    (E.ANSWERED, 2.5, None, 1, Status.OK, None),
]
READ_THIRD: list[Line] = [
    (E.QUEUED, 0.0, None, None, None, None),
    (E.SLOT_ACQUIRED, 1.5, SCOPE, 1, None, None),
    (E.TOKEN_WAIT, 1.5, SCOPE, 1, None, 0.5),
    (E.STARTED, 2.0, None, 1, None, None),
    (E.ANSWERED, 3.5, None, 1, Status.OK, None),
]
# The write runs in phase two, after the reads: throttled, retried, answered.
WRITE: list[Line] = [
    (E.QUEUED, 0.0, None, None, None, None),
    (E.SLOT_ACQUIRED, 3.5, SCOPE, 1, None, None),
    (E.STARTED, 3.5, None, 1, None, None),
    (E.SCOPE_BLOCKED, 3.5, SCOPE, None, None, 0.5),
    (E.RETRY_SCHEDULED, 3.5, SCOPE, 1, None, 0.5),
    (E.SLOT_ACQUIRED, 4.0, SCOPE, 2, None, None),
    (E.TOKEN_WAIT, 4.0, SCOPE, 2, None, 0.5),
    (E.STARTED, 4.5, None, 2, None, None),
    (E.ANSWERED, 5.5, None, 2, Status.OK, None),
]
REFUSED: list[Line] = [
    (E.QUEUED, 0.0, None, None, None, None),
    (E.REFUSED, 0.0, None, None, None, None),
    (E.ANSWERED, 0.0, None, None, Status.REFUSED, None),
]


def throttled_registry() -> Registry:
    """The tools of the throttled turn."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=[SCOPE], timeout=None)
    async def lookup(query: str) -> str:
        await trio.sleep(1.5)
        return f"found {query}"

    @reg.tool(kind=Kind.MUTATING, scopes=[SCOPE], timeout=None)
    async def update(record: str, api_key: str) -> str:
        if fanout.current_call().attempt == 1:
            raise fanout.RateLimitedError(retry_after=0.5)
        await trio.sleep(1)
        return f"updated {record}"

    return reg


def throttled_calls() -> list[ToolCall]:
    return [
        ToolCall("r1", "lookup", {"query": "acme"}),
        ToolCall("r2", "lookup", {"query": "globex"}),
        ToolCall("r3", "lookup", {"query": "initech"}),
        ToolCall("w1", "update", {"record": "acme", "api_key": SECRET}),
        ToolCall("w2", "update", {"record": "globex", "api_key": SECRET}),
        ToolCall("x1", "delete_everything", {"api_key": SECRET}),
    ]


def throttled_runner(*instruments: fanout.Instrument, trace: bool = True) -> Runner:
    return Runner(
        throttled_registry(),
        scopes=[Scope(SCOPE, rate=1, burst=1, max_concurrency=2)],
        instruments=instruments,
        trace=trace,
    )


async def run_throttled_turn(*instruments: fanout.Instrument, trace: bool = True) -> fanout.Turn:
    """Run the throttled turn on a fresh runner; it ends at exactly 5.5 s."""
    return await throttled_runner(*instruments, trace=trace).run_turn(throttled_calls())


async def run_http_turn(*instruments: fanout.Instrument) -> tuple[fanout.Turn, str]:
    """Two fetches through fanout's transport from a server allowing one request a second.

    The key travels in a header and in the query string. Returns the turn
    and the server's URL (its port differs from run to run).
    """
    async with serve_throttled(ServerConfig(rate=1, burst=1, headers="none")) as server:
        auth = {"authorization": f"Bearer {SECRET}"}
        async with fanout.http_client(base_url=server.url, headers=auth) as client:
            reg = Registry()

            @reg.tool(kind=Kind.READS, scopes=[SCOPE])
            async def fetch(n: int) -> str:
                response = await client.get(f"/items/{n}", params={"api_key": SECRET})
                return f"item {n}: {response.status_code}"

            runner = Runner(reg, scopes=[Scope(SCOPE, max_concurrency=1)], instruments=instruments)
            calls = [ToolCall("h1", "fetch", {"n": 1}), ToolCall("h2", "fetch", {"n": 2})]
            return await runner.run_turn(calls), str(server.url)


def per_call(trace: tuple[Event, ...]) -> dict[str, list[Line]]:
    lines: dict[str, list[Line]] = defaultdict(list)
    for e in trace:
        if e.call_id is not None:
            lines[e.call_id].append((e.kind, e.time, e.scope, e.attempt, e.status, e.wait))
    return dict(lines)


async def test_throttled_turn_emits_exact_sequences_per_call(autojump_clock: Any) -> None:
    """Each call's events come in a fixed order, at exact times, with scope and attempt."""
    turn = await run_throttled_turn()
    assert trio.current_time() == 5.5
    lines = per_call(turn.trace)
    assert lines["r1"] == READ_FIRST
    assert lines["r2"] == READ_SECOND
    assert lines["r3"] == READ_THIRD
    assert lines["w1"] == WRITE
    assert lines["w2"] == REFUSED
    assert lines["x1"] == REFUSED


async def test_turn_events_frame_the_calls(autojump_clock: Any) -> None:
    """turn_started (with the call count) opens the trace, turn_finished (a tally) closes it."""
    trace = (await run_throttled_turn()).trace
    first, last = trace[0], trace[-1]
    assert (first.kind, first.time, first.call_id, dict(first.detail)) == (
        E.TURN_STARTED, 0.0, None, {"calls": 6}
    )  # fmt: skip
    assert (last.kind, last.time, last.call_id, dict(last.detail)) == (
        E.TURN_FINISHED, 5.5, None, {"ok": 4, "refused": 2}
    )  # fmt: skip
    assert {e.turn_id for e in trace} == {"turn-1"}


async def test_http_requests_and_responses_are_events(autojump_clock: Any) -> None:
    """Each request and response is an event; a 429's Retry-After blocks the scope, then a retry."""
    turn, base = await run_http_turn()
    lines = {
        call_id: [
            (e.kind, e.time, e.scope, e.attempt, e.status, e.wait, dict(e.detail))
            for e in turn.trace
            if e.call_id == call_id
        ]
        for call_id in ("h1", "h2")
    }

    def sent(n: int) -> dict[str, str]:
        return {"method": "GET", "url": f"{base}/items/{n}?api_key=REDACTED"}

    assert lines["h1"] == [
        (E.QUEUED, 0.0, None, None, None, None, {}),
        (E.SLOT_ACQUIRED, 0.0, SCOPE, 1, None, None, {}),
        (E.STARTED, 0.0, None, 1, None, None, {}),
        (E.REQUEST_SENT, 0.0, None, 1, None, None, sent(1)),
        (E.RESPONSE, 0.0, None, 1, None, None, {"status": 200}),
        (E.ANSWERED, 0.0, None, 1, Status.OK, None, {}),
    ]
    assert lines["h2"] == [
        (E.QUEUED, 0.0, None, None, None, None, {}),
        (E.SLOT_ACQUIRED, 0.0, SCOPE, 1, None, None, {}),
        (E.STARTED, 0.0, None, 1, None, None, {}),
        (E.REQUEST_SENT, 0.0, None, 1, None, None, sent(2)),
        (E.RESPONSE, 0.0, None, 1, None, None, {"status": 429, "retry_after": 1.0}),
        (E.SCOPE_BLOCKED, 0.0, SCOPE, None, None, 1.0, {}),
        (E.RETRY_SCHEDULED, 0.0, SCOPE, 1, None, 1.0, {}),
        (E.SLOT_ACQUIRED, 1.0, SCOPE, 2, None, None, {}),
        (E.STARTED, 1.0, None, 2, None, None, {}),
        (E.REQUEST_SENT, 1.0, None, 2, None, None, sent(2)),
        (E.RESPONSE, 1.0, None, 2, None, None, {"status": 200}),
        (E.ANSWERED, 1.0, None, 2, Status.OK, None, {}),
    ]


async def test_retry_and_refusals_say_why(autojump_clock: Any) -> None:
    """A retry names the signal's type; a refusal carries the sentence the model gets."""
    trace = (await run_throttled_turn()).trace
    reasons = {(e.call_id, e.kind): e.reason for e in trace if e.reason is not None}
    assert reasons == {
        ("w1", E.RETRY_SCHEDULED): "RateLimitedError",
        ("w2", E.REFUSED): (
            "update was requested in the same turn as another write (update); it was not run. "
            "Re-request it alone if still needed"
        ),
        ("x1", E.REFUSED): "there is no tool named 'delete_everything'; the tools are: "
        "lookup, update",
    }


async def test_shed_call_is_answered_at_once(autojump_clock: Any) -> None:
    """A call finding its scope's queue full is shed and answered rate_limited at once."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["bulk"])
    async def export() -> str:
        return "done"

    runner = Runner(reg, scopes=[Scope("bulk", rate=1, max_concurrency=1, max_waiters=0)])
    turn = await runner.run_turn([ToolCall("e1", "export", {})])
    assert per_call(turn.trace)["e1"] == [
        (E.QUEUED, 0.0, None, None, None, None),
        (E.SHED, 0.0, "bulk", None, None, 0.0),
        (E.ANSWERED, 0.0, "bulk", 1, Status.RATE_LIMITED, None),
    ]


async def test_exhausted_quota_is_reported_once_then_answers_later_calls(
    autojump_clock: Any,
) -> None:
    """A spent quota emits scope_exhausted once; later calls on the scope are answered at once."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["llm"])
    async def ask() -> str:
        raise fanout.QuotaExhaustedError(reset_after=60)

    @reg.tool(kind=Kind.MUTATING, scopes=["llm"])
    async def tell() -> str:
        return "told"

    turn = await Runner(reg).run_turn([ToolCall("a", "ask", {}), ToolCall("t", "tell", {})])
    lines = per_call(turn.trace)
    assert lines["a"] == [
        (E.QUEUED, 0.0, None, None, None, None),
        (E.STARTED, 0.0, None, 1, None, None),
        (E.SCOPE_EXHAUSTED, 0.0, "llm", None, None, 60.0),
        (E.ANSWERED, 0.0, "llm", 1, Status.QUOTA_EXHAUSTED, None),
    ]
    assert lines["t"] == [
        (E.QUEUED, 0.0, None, None, None, None),
        (E.ANSWERED, 0.0, "llm", 1, Status.QUOTA_EXHAUSTED, None),
    ]


async def test_events_never_carry_a_credential(autojump_clock: Any) -> None:
    """A key passed as a tool argument appears in no event; the scope's label does."""
    turn = await run_throttled_turn()
    assert "arguments" not in {field.name for field in attrs.fields(Event)}
    assert not [e for e in turn.trace if SECRET in repr(e)]
    assert {e.scope for e in turn.trace} == {None, SCOPE}


async def test_http_events_never_carry_a_credential(autojump_clock: Any) -> None:
    """A key sent in a header and in the query string appears in no event."""
    turn, _ = await run_http_turn()
    assert [r.status for r in turn.results] == [Status.OK, Status.OK]
    assert len([e for e in turn.trace if e.kind is E.REQUEST_SENT]) == 3
    assert not [e for e in turn.trace if SECRET in repr(e)]


@contextlib.contextmanager
def _events_built(field: str) -> Iterator[list[Any]]:
    """The ``field`` of every Event constructed inside the block, in order."""
    built: list[Any] = []
    init = Event.__init__.__code__

    def watch(frame: Any, what: str, _: Any) -> None:
        if what == "call" and frame.f_code is init:
            built.append(frame.f_locals[field])

    sys.setprofile(watch)
    try:
        yield built
    finally:
        sys.setprofile(None)


async def test_instrumentation_off_builds_no_event(autojump_clock: Any) -> None:
    """With trace=False and no instruments, no Event is ever constructed."""
    with _events_built("time") as built:
        turn = await run_throttled_turn(trace=False)
        assert [r.status for r in turn.results] == [Status.OK] * 4 + [Status.REFUSED] * 2
        assert turn.trace == ()
        assert built == []
        # The watch does see events when something listens: the zero above is real.
        trace = (await run_throttled_turn()).trace
    assert built == [event.time for event in trace]
    assert len(built) == 31


async def test_a_trace_nobody_reads_builds_no_event_while_the_turn_runs(
    autojump_clock: Any,
) -> None:
    """With only the trace listening, events are built when it is read, each once, in order."""
    with _events_built("kind") as built:
        turn = await run_throttled_turn()
        assert built == []
        first = turn.trace
        again = turn.trace
    assert built == [event.kind for event in first]
    assert len(first) == 31
    assert all(a is b for a, b in zip(first, again, strict=True))


async def test_noop_instrument_sees_each_event_once(autojump_clock: Any) -> None:
    """An instrument gets every event the trace holds, the same objects, in order."""

    class Collect:
        def __init__(self) -> None:
            self.seen: list[Event] = []

        def on_event(self, event: Event) -> None:
            self.seen.append(event)

    collect = Collect()
    turn = await run_throttled_turn(collect)
    assert len(collect.seen) == len(turn.trace) == 31
    assert all(a is b for a, b in zip(collect.seen, turn.trace, strict=True))


async def test_failing_instrument_costs_no_answer(autojump_clock: Any, caplog: Any) -> None:
    """An instrument that raises is logged and skipped; every call is still answered."""

    class Broken:
        def on_event(self, event: Event) -> None:
            raise RuntimeError("exporter down")

    turn = await run_throttled_turn(Broken())
    assert [r.status for r in turn.results] == [Status.OK] * 4 + [Status.REFUSED] * 2
    failures = [r for r in caplog.records if r.name == "fanout"]
    assert len(failures) == len(turn.trace)
    assert failures[0].getMessage().endswith("failed on turn_started")


async def test_every_detail_key_is_a_documented_key_of_its_kind(autojump_clock: Any) -> None:
    """Each detail key an event carries is one EventDetail documents, with a plain value."""
    documented = set(fanout.EventDetail.__annotations__)
    throttled = await run_throttled_turn()
    http, _ = await run_http_turn()
    keys: dict[EventKind, set[str]] = defaultdict(set)
    for event in (*throttled.trace, *http.trace):
        keys[event.kind] |= set(event.detail)
        assert all(isinstance(v, str | int | float) for v in event.detail.values())
    assert set().union(*keys.values()) <= documented
    assert keys[E.TURN_STARTED] == {"calls"}
    assert keys[E.TURN_FINISHED] == {"ok", "refused"}
    assert keys[E.REQUEST_SENT] == {"method", "url"}
    assert keys[E.RESPONSE] == {"status", "retry_after"}
    assert keys[E.QUEUED] == keys[E.ANSWERED] == set()


async def test_no_event_holds_a_secret_the_model_put_in_a_tool_s_name(autojump_clock: Any) -> None:
    """A registered secret in the name of a tool the model asked for (no such tool): the
    answer shows the name scrubbed, and so do the trace and what an instrument is
    handed. (They had the name raw, in ``tool`` and in the refusal's ``reason``.)"""
    secret = "Rg7registeredPW9-events"
    fanout.register_secret(secret)
    seen: list[fanout.Event] = []

    class Keep:
        def on_event(self, event: fanout.Event) -> None:
            seen.append(event)

    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS)
    async def known() -> str:
        return "ok"

    for instruments in ([], [Keep()]):
        turn = await fanout.Runner(registry, instruments=instruments).run_turn(
            [fanout.ToolCall(f"id-{secret}", f"tool-{secret}"), fanout.ToolCall("k", "known")]
        )
        assert secret not in turn.results[0].content
        assert all(secret not in repr(event) for event in turn.trace)
    assert seen
    assert all(secret not in repr(event) for event in seen)
