"""Promises 1 and 2 against anything: hostile tools and faults injected at every seam.

Hypothesis generates what can go wrong (outputs of every shape, exceptions
whose ``__str__`` raises, signals with absurd waits, scopes, stores and
instruments that raise, hang or return garbage, a transport that refuses,
resets mid-body, hangs or answers with garbage headers) and each example asserts the
promise itself: the turn returns by its deadline, nothing escapes it, every
id gets exactly one answer in order, each answer is valid and says what
really happened (never "the caller cancelled" when nobody did), and no
answer is written after its call's deadline.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
from typing import TYPE_CHECKING, Any

import httpx
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import fanout
from fanout import Kind, Registry, Runner, Scope, ToolCall
from fanout.idempotency import Claim, MemoryIdempotencyStore, StoredAnswer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

EXAMPLES = int(os.environ.get("FANOUT_EXAMPLES", "150"))


class Unprintable:
    """An object that refuses every way of being printed."""

    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class UnprintableError(Exception):
    """An exception whose message cannot be printed."""

    def __str__(self) -> str:
        raise ValueError("__str__ exploded")


def _self_containing() -> Any:
    looped: list[Any] = []
    looped.append(looped)
    return looped


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "é" * 3]),
    st.binary(max_size=8),
    st.builds(Unprintable),
)
hashable_keys = st.one_of(
    st.text(max_size=5),
    st.integers(-3, 3),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
    st.tuples(st.integers(0, 2), st.text(max_size=2)),
    st.frozensets(st.integers(0, 3), max_size=2),
)
outputs = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(hashable_keys, inner, max_size=4),
        st.frozensets(st.integers() | st.text(max_size=3), max_size=4),
    ),
    max_leaves=12,
) | st.sampled_from(["self", "deep"]).map(
    lambda kind: _self_containing() if kind == "self" else _deep(5_000)
)

waits = st.one_of(
    st.none(),
    st.sampled_from([-1, -1e-9, 0, 0.3, 1.5, 1e308, 1e306, math.inf, -math.inf, math.nan]),
    st.sampled_from(["5", b"1", [], True]),
)
raised = st.one_of(
    st.builds(ValueError, st.text(max_size=10)),
    st.builds(UnprintableError),
    st.builds(lambda: SystemExit(3)),
    st.builds(lambda: ExceptionGroup("two", [ValueError("a"), KeyError("b")])),
    st.builds(lambda w: fanout.RateLimitedError(retry_after=w), waits),
    st.builds(lambda w, s: fanout.RateLimitedError(retry_after=w, scope=s), waits, st.text()),
    st.builds(lambda w: fanout.QuotaExhaustedError(reset_after=w), waits),
    st.builds(lambda w: fanout.TransientError("reset", retry_after=w), waits),
    st.builds(lambda: fanout.RateLimitedError("no retry", retryable=False)),
)
behaviours = st.one_of(
    st.tuples(st.just("return"), outputs),
    st.tuples(st.just("raise"), raised),
    st.tuples(st.just("hang"), st.none()),
    st.tuples(st.just("sleep"), st.sampled_from([0.2, 1.0, 4.0])),
)


class Faults:
    """Which seam fails how, drawn per example; every fault fires at most ``budget`` times."""

    def __init__(self, plan: dict[str, str], budget: int) -> None:
        self.plan = plan
        self.budget = budget

    async def hit(self, seam: str) -> Any:
        """Raise, hang or hand back garbage, as the plan says for ``seam``."""
        fault = self.plan.get(seam, "none")
        if fault == "none" or self.budget <= 0:
            return None
        self.budget -= 1
        if fault == "raise":
            raise RuntimeError(f"injected fault in {seam}")
        if fault == "unavailable":
            raise fanout.LimiterUnavailableError(f"injected outage in {seam}")
        if fault == "hang":
            await trio.sleep_forever()
        if fault == "slow":
            await trio.sleep(1.5)
        return math.nan


class FaultyScope(Scope):
    """A real scope whose awaited methods may raise, hang or return garbage first."""

    faults: Faults

    async def acquire_slot(self, holder: Any, deadline: float) -> bool:
        garbage = await self.faults.hit("acquire_slot")
        return await super().acquire_slot(holder, deadline) if garbage is None else garbage

    async def release_slot(self, holder: Any) -> None:
        try:
            await self.faults.hit("release_slot")
        finally:
            await super().release_slot(holder)

    async def reserve(self, cost: float, max_wait: float) -> Any:
        garbage = await self.faults.hit("reserve")
        return await super().reserve(cost, max_wait) if garbage is None else garbage

    async def refund(self, booking: Any) -> None:
        try:
            await self.faults.hit("refund")
        finally:
            await super().refund(booking)

    async def confirm(self, booking: Any) -> bool:
        garbage = await self.faults.hit("confirm")
        return await super().confirm(booking) if garbage is None else garbage

    async def wait_for(self, cost: float) -> float:
        garbage = await self.faults.hit("wait_for")
        return await super().wait_for(cost) if garbage is None else garbage

    async def on_throttled(
        self, wait: float | None, *, sent_at: float | None = None, arriving: bool = False
    ) -> None:
        await self.faults.hit("on_throttled")
        await super().on_throttled(wait, sent_at=sent_at, arriving=arriving)

    async def block_until(self, when: float) -> None:
        await self.faults.hit("block_until")
        await super().block_until(when)

    async def request_leaving(self, admitted_at: float = -math.inf, on_wait: Any = None) -> Any:
        garbage = await self.faults.hit("request_leaving")
        if garbage is not None:
            return garbage
        return await super().request_leaving(admitted_at, on_wait)

    async def observe_headers(self, info: Any, **options: Any) -> None:
        await self.faults.hit("observe_headers")
        await super().observe_headers(info, **options)


class FaultyStore(MemoryIdempotencyStore):
    """The in-memory store, with faults on its calls."""

    faults: Faults

    async def claim(self, key: str, *, lease: float) -> Claim:
        await self.faults.hit("claim")
        return await super().claim(key, lease=lease)

    async def renew(self, key: str, *, lease: float) -> bool:
        await self.faults.hit("renew")
        return await super().renew(key, lease=lease)

    async def finish(self, key: str, answer: StoredAnswer, *, ttl: float) -> None:
        await self.faults.hit("finish")
        await super().finish(key, answer, ttl=ttl)

    async def abandon(self, key: str) -> None:
        await self.faults.hit("abandon")
        await super().abandon(key)


class FaultyInstrument:
    """An instrument that raises on some kinds of event."""

    def __init__(self, kinds: frozenset[str]) -> None:
        self.kinds = kinds

    def on_event(self, event: fanout.Event) -> None:
        if event.kind.value in self.kinds:
            raise UnprintableError()


class _BrokenBody(httpx.AsyncByteStream):
    """A response body whose connection resets after its first chunk."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"partial": '
        raise httpx.ReadError("connection reset by peer")


def _http_handler(answers: list[str]) -> Callable[[httpx.Request], Awaitable[httpx.Response]]:
    """A transport that answers each request with the next outcome of ``answers``."""
    served = itertools.count()

    async def handle(request: httpx.Request) -> httpx.Response:
        outcome = answers[next(served) % len(answers)] if answers else "ok"
        if outcome == "hang":
            await trio.sleep_forever()
        if outcome == "connect_error":
            raise httpx.ConnectError("connection refused", request=request)
        if outcome == "read_error":
            raise httpx.ReadError("connection reset", request=request)
        if outcome == "body_reset":
            return httpx.Response(200, stream=_BrokenBody())
        statuses = {"429_garbage": 429, "429_huge": 429, "503": 503, "500": 500}
        headers = {
            "429_garbage": {"retry-after": "-5", "x-ratelimit-reset": "nan", "ratelimit": ";;"},
            "429_huge": {"retry-after": "1e308", "x-ratelimit-scope": "api"},
            "503": {"retry-after": "0.5"},
        }.get(outcome, {"ratelimit-remaining": "0", "ratelimit-reset": "1"})
        return httpx.Response(statuses.get(outcome, 200), headers=headers, text="ok")

    return handle


def _registry(behaviours: list[tuple[str, Any]], answers: list[str] | None = None) -> Registry:
    reg = Registry()
    client = fanout.http_client(transport=httpx.MockTransport(_http_handler(answers or [])))

    async def fetch(n: int) -> str:
        response = await client.get(f"https://api.test/items/{n}", headers={"x-api-key": "k-123"})
        return response.text

    async def act(n: int) -> Any:
        what, detail = behaviours[n]
        if what == "raise":
            raise detail
        if what == "hang":
            await trio.sleep_forever()
        if what == "sleep":
            await trio.sleep(detail)
            return "slept"
        return detail

    def act_sync(n: int) -> Any:
        what, detail = behaviours[n]
        if what == "raise":
            raise detail
        return detail if what == "return" else "done"

    for kind in Kind:
        reg.add(act, name=f"{kind.value}_scoped", kind=kind, timeout=3, scopes=["api"])
        reg.add(act, name=f"{kind.value}_free", kind=kind, timeout=None)
    reg.add(act_sync, name="sync_tool", kind=Kind.READS, timeout=2)
    reg.add(fetch, name="http_read", kind=Kind.READS, timeout=3, scopes=["api"])
    reg.add(fetch, name="http_write", kind=Kind.MUTATING, timeout=3, scopes=["api"])
    return reg


seams = st.fixed_dictionaries(
    {
        seam: st.sampled_from(["none", "none", "raise", "unavailable", "hang", "slow", "garbage"])
        for seam in (
            "acquire_slot",
            "release_slot",
            "reserve",
            "refund",
            "confirm",
            "wait_for",
            "on_throttled",
            "block_until",
            "request_leaving",
            "observe_headers",
            "claim",
            "renew",
            "finish",
            "abandon",
        )
    }
)
tool_names = st.sampled_from(
    [f"{kind.value}_{how}" for kind in Kind for how in ("scoped", "free")]
    + ["sync_tool", "http_read", "http_write"]
)
transport_answers = st.lists(
    st.sampled_from(
        ["ok", "hang", "connect_error", "read_error", "body_reset", "429_garbage", "429_huge",
         "503", "500"]
    ),
    max_size=6,
)  # fmt: skip


def _play(
    calls_spec: list[tuple[str, tuple[str, Any]]],
    plan: dict[str, str],
    policy: dict[str, Any],
    broken_events: frozenset[str],
    seed: int,
    hosted: bool,
    answers: list[str],
    limits: dict[str, Any],
) -> tuple[list[ToolCall], fanout.Turn, float, bool]:
    behaviours = [behaviour for _, behaviour in calls_spec]
    calls = [ToolCall(f"toolu_{i:02d}", name, {"n": i}) for i, (name, _) in enumerate(calls_spec)]
    faults = Faults(plan, budget=3)
    scope = FaultyScope("api", max_concurrency=2, **limits)
    scope.faults = faults
    store = FaultyStore()
    store.faults = faults
    runner = Runner(
        _registry(behaviours, answers),
        scopes=[scope],
        rng=random.Random(seed),
        instruments=[FaultyInstrument(broken_events)],
        **policy,
    )
    turn = runner.turn(calls, run=fanout.Run(store=store, claim_lease=1.0))
    escaped = False

    async def play() -> float:
        nonlocal escaped
        try:
            await turn.run()
        except BaseException:
            escaped = True
        return trio.current_time()

    async def main() -> float:
        if not hosted:
            return await play()
        async with runner:
            return await play()

    trio._core._run._r.seed(seed)
    returned = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return calls, turn, returned, escaped


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    calls_spec=st.lists(st.tuples(tool_names, behaviours), max_size=8),
    plan=seams,
    policy=st.fixed_dictionaries(
        {
            "mutating": st.sampled_from(["one", "serial", "parallel"]),
            "on_failure": st.sampled_from(["continue", "cancel_siblings"]),
            "turn_timeout": st.sampled_from([1.0, 5.0]),
            "inline_wait": st.sampled_from([None, 0.0, 2.0]),
        }
    ),
    broken_events=st.frozensets(st.sampled_from([k.value for k in fanout.EventKind])),
    seed=st.integers(0, 2**32),
    hosted=st.booleans(),
    answers=transport_answers,
    # A token bucket told its limits, a window told its limit, or nothing told (learning).
    limits=st.sampled_from([{"rate": 5, "burst": 2}, {"limit": 2, "per": 0.4}, {}]),
)
def test_every_call_answered_truthfully_whatever_fails(
    calls_spec: list[tuple[str, tuple[str, Any]]],
    plan: dict[str, str],
    policy: dict[str, Any],
    broken_events: frozenset[str],
    seed: int,
    hosted: bool,
    answers: list[str],
    limits: dict[str, Any],
) -> None:
    """Hostile tools and faults at every seam: the turn returns on time, every id answered."""
    calls, turn, returned, escaped = _play(
        calls_spec, plan, policy, broken_events, seed, hosted, answers, limits
    )
    assert not escaped
    assert returned <= turn.deadline
    assert [r.tool_use_id for r in turn.results] == [c.id for c in calls]
    for result in turn.results:
        result.content.encode("utf-8")  # no lone surrogate can reach a request to a model
        if result.is_error:
            payload = json.loads(result.content)
            assert isinstance(payload["started"], bool)
            assert "caller cancelled" not in payload["message"]
            if result.retry_after_ms is not None:
                assert 0 <= result.retry_after_ms <= 7 * 24 * 3600 * 1000
    answered = [e for e in turn.trace if e.kind is fanout.EventKind.ANSWERED]
    assert sorted(e.call_id or "" for e in answered) == sorted(c.id for c in calls)
    assert all(e.time <= turn.deadline for e in answered)


async def test_a_scope_that_overrides_its_awaited_methods_admits_every_call(
    autojump_clock: Any,
) -> None:
    """A subclass of ``Scope`` overriding its awaited methods with their documented
    signatures (as ``FaultyScope`` does), no fault planned: six calls paced at 5/s are
    all answered ok. Admission once passed ``confirm`` a keyword such an override did
    not take, and every call that waited for a token was refused as a limiter fault,
    which the property above counts as an answer."""
    scope = FaultyScope("api", rate=5, burst=2, max_concurrency=2)
    scope.faults = Faults({}, budget=0)
    runner = Runner(_registry([("return", "done")] * 6), scopes=[scope], inline_wait=None)
    name = f"{Kind.READS.value}_scoped"
    turn = await runner.run_turn([ToolCall(f"c{i}", name, {"n": i}) for i in range(6)])
    assert [r.status for r in turn.results] == [fanout.Status.OK] * 6
    assert abs(trio.current_time() - 0.8) < 1e-9  # two at once, then one every 0.2 s
