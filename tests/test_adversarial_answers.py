"""Adversarial property tests of promise 1: every tool_use_id gets exactly one honest answer.

The other suites generate turns of well-behaved tools and faults at the seams.
These generate what a hostile world hands fanout instead: return values of
every shape (objects whose dunders raise, generators, closed coroutines,
pydantic models, bytes, NaN, huge text, text that looks like fanout's own
block marker), exceptions of every kind (unprintable, huge, cyclic, base
exceptions, groups), ids, names and arguments a model should never send,
SDK messages that are malformed, tools that cancel their own scopes, and a
caller who may or may not cancel. Each example asserts the promise itself:
nothing escapes, one answer per id in the model's order, each answer valid
and true (ok only when the tool returned, never "the caller cancelled" when
it did not, never a placeholder), and capped.

Where the promise was seen to break, a minimal repro is kept below, one
per bug, each of which failed before its fix.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import attrs
import pydantic
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fanout
from fanout import EventKind, Kind, Registry, Runner, Scope, Status, Text, ToolCall

EXAMPLES = 40
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- what a turn must look like, whatever happened ------------------------------------------


@attrs.define
class Played:
    """A turn after it ran: what escaped it (if anything) and when it returned."""

    turn: fanout.Turn
    escaped: BaseException | None
    returned_at: float
    caller_cancelled: bool = False


def play(
    runner: Runner,
    calls: list[ToolCall],
    *,
    hosted: bool = False,
    cancel_at: float | None = None,
    autojump: float = 0.0,
) -> Played:
    """Run one turn under a MockClock, catching whatever escapes the caller's code.

    ``autojump`` > 0 lets a worker thread (a sync tool) finish before virtual time jumps.
    """
    turn = runner.turn(calls)
    escaped: BaseException | None = None
    caller_cancelled = False

    async def run_it() -> None:
        nonlocal escaped, caller_cancelled
        try:
            with trio.move_on_after(math.inf if cancel_at is None else cancel_at) as scope:
                await turn.run()
            caller_cancelled = scope.cancelled_caught
        except BaseException as exc:  # the promise: nothing escapes; record it to assert on
            escaped = exc

    async def main() -> float:
        nonlocal escaped
        if hosted:
            try:
                async with runner:
                    await run_it()
            except BaseException as exc:  # escaping the runner's nursery counts too
                escaped = escaped or exc
        else:
            await run_it()
        return trio.current_time()

    returned_at = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=autojump))
    return Played(turn, escaped, returned_at, caller_cancelled)


def body(result: fanout.ToolResult) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(result.content)
    return parsed


def assert_every_id_answered_once(calls: list[ToolCall], played: Played) -> None:
    """Promise 1's shape: nothing escaped, one final answer per id, in the model's order."""
    assert played.escaped is None, f"escaped turn.run(): {played.escaped!r}"
    turn = played.turn
    assert [r.tool_use_id for r in turn.results] == [c.id for c in calls]
    answered = [e.call_id for e in turn.trace if e.kind is EventKind.ANSWERED]
    assert sorted(answered) == sorted(c.id for c in calls), "an id answered twice or never"
    for result in turn.results:
        result.content.encode("utf-8")  # a request to a model must be able to carry it
        if result.is_error:
            payload = body(result)
            assert payload["status"] == result.status.value
            assert isinstance(payload["started"], bool)
            assert "has not finished" not in payload["message"], "a placeholder, not an answer"


def assert_nobody_blamed_the_caller(played: Played) -> None:
    """No answer says the caller cancelled when it did not."""
    for result in played.turn.results:
        if result.is_error:
            assert "caller cancelled" not in body(result)["message"], result.content


# -- hostile things a tool can hand back ---------------------------------------------------


class RaisesEverywhere:
    """An object whose every dunder a serialiser might try raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __len__(self) -> int:
        raise RuntimeError("no len")

    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError("no iter")

    def __bool__(self) -> bool:
        raise RuntimeError("no bool")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq")

    def __hash__(self) -> int:
        raise RuntimeError("no hash")


class StrReturnsNonText:
    """``__str__`` returning an int makes ``str()`` raise TypeError; ``repr`` still works."""

    def __str__(self) -> str:
        return 5  # type: ignore[return-value]

    def __repr__(self) -> str:
        return "StrReturnsNonText()"


class Model(pydantic.BaseModel):
    name: str
    score: float
    tags: list[str] = []


async def _never_run() -> str:
    return "never"


def _closed_coroutine() -> Any:
    coroutine = _never_run()
    coroutine.close()  # closed, so no "never awaited" warning leaks into other tests
    return coroutine


def _self_containing() -> Any:
    looped: dict[str, Any] = {}
    looped["me"] = [looped]
    return looped


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


MARKER = "\x00fanout-blocks\x00"
plain_text = st.text(max_size=40)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    plain_text,
    st.sampled_from(["\ud800", "a\udfffb", "\x00", MARKER + '[{"type":"text","text":"x"}]']),
    st.binary(max_size=12),
    st.builds(bytearray, st.binary(max_size=6)),
    st.builds(RaisesEverywhere),
    st.builds(StrReturnsNonText),
    st.builds(lambda: (i for i in range(3))),
    st.builds(_closed_coroutine),
    st.builds(Model, name=plain_text, score=st.floats(allow_nan=True)),
    st.builds(ValueError, plain_text),
    st.builds(lambda: object()),
    st.builds(lambda: range(3)),
    st.builds(lambda: memoryview(b"abc")),
    st.builds(complex, st.floats(allow_nan=False), st.floats(allow_nan=False)),
)
keys = st.one_of(
    plain_text,
    st.integers(-5, 5),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
    st.tuples(st.integers(0, 2), plain_text),
    st.frozensets(st.integers(0, 3), max_size=2),
    st.builds(lambda: object()),
)
structures = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(keys, inner, max_size=4),
        st.frozensets(st.integers() | plain_text, max_size=4),
        st.sets(st.integers(-3, 3), max_size=3),
    ),
    max_leaves=14,
)
huge = st.one_of(
    st.integers(0, 60_000).map(lambda n: "x" * n),
    st.integers(0, 20_000).map(lambda n: "é\U0001f600" * n),
    st.integers(0, 5_000).map(lambda n: list(range(n))),
    st.integers(0, 2_000).map(lambda n: {f"k{i}": "v" * 10 for i in range(n)}),
)
containing_itself = st.sampled_from(["self", 150, 200, 201, 5_000]).map(
    lambda what: _self_containing() if what == "self" else _deep(what)
)
outputs = st.one_of(structures, huge, containing_itself)


def _one_tool_registry(fn: Any, *, kind: Kind = Kind.READS, **options: Any) -> Registry:
    """``t`` (the tool under test) beside ``sibling``, a read that always answers ok."""
    reg = Registry()
    reg.add(fn, name="t", kind=kind, **options)

    async def sibling() -> str:
        await trio.sleep(0.5)
        return "sibling fine"

    reg.add(sibling, name="sibling", kind=Kind.READS)
    return reg


def _holds_itself_or_nests_past_200(value: Any) -> bool:
    seen: set[int] = set()

    def walk(item: Any, depth: int) -> bool:
        if isinstance(item, str | bytes):
            return False
        if isinstance(item, Mapping | list | tuple | set | frozenset):
            if id(item) in seen or depth >= 200:
                return True
            seen.add(id(item))
            items = list(item.values()) if isinstance(item, Mapping) else list(item)
            found = any(walk(child, depth + 1) for child in items)
            seen.discard(id(item))
            return found
        return False

    return walk(value, 0)


@PROPERTY
@given(output=outputs, cap=st.sampled_from([64, 300, 8000]), hosted=st.booleans())
def test_whatever_a_tool_returns_is_one_ok_answer_within_the_cap(
    output: Any, cap: int, hosted: bool
) -> None:
    """A tool that returns is ok, whatever it returned; its answer is valid, capped, its own.

    The only exception the README allows: output that contains itself or nests past
    200 levels is an error answer saying it cannot be written as JSON.
    """

    async def t() -> Any:
        return output

    calls = [ToolCall("toolu_a", "t"), ToolCall("toolu_b", "sibling")]
    played = play(Runner(_one_tool_registry(t), max_output_chars=cap), calls, hosted=hosted)
    assert_every_id_answered_once(calls, played)
    assert_nobody_blamed_the_caller(played)
    answer, sibling = played.turn.results
    assert (sibling.status, sibling.content) == (Status.OK, "sibling fine")
    if answer.status is not Status.OK:
        assert answer.status is Status.ERROR
        assert "cannot be written as JSON" in body(answer)["message"]
        assert _holds_itself_or_nests_past_200(output)
        return
    assert len(answer.content) <= cap
    assert answer.parts is None, "a tool's own text was taken for content blocks"
    if isinstance(output, str):
        text = output.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        text = " " + text if text.startswith(MARKER) else text
        if len(text) <= cap:
            assert answer.content == text
        else:
            assert answer.content.startswith(text[:10])
            assert "[truncated by fanout:" in answer.content
        return
    json.loads(answer.content)  # non-text output is always valid JSON, even when cut


parts = st.one_of(
    st.builds(fanout.Text, st.text(max_size=300)),
    st.builds(fanout.Image, st.binary(max_size=50).map(lambda tail: b"GIF89a" + tail)),
    st.builds(fanout.Document, st.text(max_size=40), st.just("text/plain")),
)


@PROPERTY
@given(
    blocks=st.one_of(parts, st.lists(parts, min_size=1, max_size=5)),
    cap=st.sampled_from([64, 300]),
)
def test_content_blocks_come_back_whole_and_text_is_cut_within_the_cap(
    blocks: Any, cap: int
) -> None:
    """Blocks are carried intact to every adapter; only their text is cut, with a marker."""

    async def t() -> Any:
        return blocks

    calls = [ToolCall("toolu_a", "t")]
    played = play(Runner(_one_tool_registry(t), max_output_chars=cap), calls)
    assert_every_id_answered_once(calls, played)
    (answer,) = played.turn.results
    assert answer.status is Status.OK
    given_parts = [blocks] if not isinstance(blocks, list) else blocks
    # A text block of white space alone is not sent (Anthropic refuses one).
    given_parts = [p for p in given_parts if not isinstance(p, fanout.Text) or p.text.strip()]
    kept = answer.parts or []
    assert [type(p) for p in kept] == [type(p) for p in given_parts][: len(kept)]
    for original, back in zip(given_parts, kept, strict=False):
        if not isinstance(original, fanout.Text):
            assert back == original, "an image or document was altered"
    text_total = sum(len(p.text) for p in kept if isinstance(p, fanout.Text))
    assert text_total <= max(cap, 60)
    (block,) = fanout.anthropic_tool_results(played.turn)["content"]
    assert isinstance(block["content"], list) or not given_parts
    for inner in block["content"] if isinstance(block["content"], list) else []:
        assert inner["type"] != "text" or inner["text"].strip(), "a blank text block was sent"
    json.dumps(fanout.openai_tool_messages(played.turn))


# -- hostile things a tool can raise -------------------------------------------------------


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise ValueError("__str__ exploded")


class ExitsWhenPrintedError(Exception):
    """An exception whose ``__str__`` and ``__repr__`` raise ``SystemExit``: it was answered
    as fanout failing ("a failure of the runtime"), not as the tool's error."""

    def __str__(self) -> str:
        raise SystemExit("printing me exits")

    def __repr__(self) -> str:
        raise SystemExit("printing me exits")


class ReprRaisesError(Exception):
    """An exception whose ``__str__`` and ``__repr__`` raise: trio writes a nursery body's
    exception with ``repr``, and an idle-watched tool raising this broke the watch's
    nursery (an open runner's trio run died)."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class SurrogateError(Exception):
    def __str__(self) -> str:
        return "bad \ud800 text"


class StrReturnsNonTextError(Exception):
    def __str__(self) -> str:
        return 5  # type: ignore[return-value]


class HugeMessageError(Exception):
    def __str__(self) -> str:
        return "no credentials here " * 1_000


class Shutdown(BaseException):
    """A library's own BaseException, neither Cancelled nor KeyboardInterrupt."""


def _cyclic_causes() -> BaseException:
    first, second = ValueError("first"), KeyError("second")
    first.__cause__, second.__cause__ = second, first
    return first


def _nested_group() -> BaseException:
    inner = ExceptionGroup("inner", [ValueError("a"), UnprintableError()])
    return BaseExceptionGroup("outer", [inner, Shutdown("stop"), SystemExit(2)])


raised = st.one_of(
    st.builds(ValueError, st.text(max_size=20)),
    st.builds(UnprintableError),
    st.builds(ExitsWhenPrintedError),
    st.builds(ReprRaisesError),
    st.builds(SurrogateError),
    st.builds(HugeMessageError),
    st.builds(StrReturnsNonTextError),
    st.builds(lambda: TypeError(*range(2_000))),
    st.builds(lambda: OSError(104, "connection reset", "/tmp/x")),
    st.builds(lambda: SystemExit(3)),
    st.builds(lambda: SystemExit("bye")),
    st.builds(lambda: Shutdown("library shutting down")),
    st.builds(lambda: MemoryError()),
    st.builds(lambda: RecursionError("too deep")),
    st.builds(lambda: StopIteration(1)),
    st.builds(lambda: trio.TooSlowError()),
    st.builds(lambda: trio.BrokenResourceError("gone")),
    st.builds(_cyclic_causes),
    st.builds(_nested_group),
    st.builds(lambda: ExceptionGroup("two", [ValueError("a"), KeyError("b")])),
    st.builds(lambda: BaseExceptionGroup("base", [Shutdown("x")])),
)


@PROPERTY
@given(
    exc=raised,
    hosted=st.booleans(),
    sync=st.booleans(),
    kind=st.sampled_from([Kind.READS, Kind.MUTATING]),
    idle=st.sampled_from([None, 5.0]),
)
def test_whatever_a_tool_raises_is_that_calls_error_and_no_one_elses(
    exc: BaseException, hosted: bool, sync: bool, kind: Kind, idle: float | None
) -> None:
    """Any exception but Cancelled/KeyboardInterrupt/GeneratorExit: that call's own error,
    started, named by its type; the sibling still ok; nothing escapes the caller; with
    an idle timeout too (the tool then runs beside its idle watch)."""

    async def t_async() -> str:
        raise exc

    def t_sync() -> str:
        raise exc

    reg = _one_tool_registry(t_async, kind=kind, idle_timeout=idle)
    if sync:
        # A worker thread: virtual time jumps only after 50 ms of real idleness (autojump).
        reg = _one_tool_registry(t_sync, kind=kind, timeout=None, idle_timeout=idle)
    calls = [ToolCall("toolu_a", "t"), ToolCall("toolu_b", "sibling")]
    played = play(Runner(reg), calls, hosted=hosted, autojump=0.05 if sync else 0.0)
    assert_every_id_answered_once(calls, played)
    assert_nobody_blamed_the_caller(played)
    answer, sibling = played.turn.results
    assert (sibling.status, sibling.content) == (Status.OK, "sibling fine")
    assert answer.status is Status.ERROR
    payload = body(answer)
    assert payload["started"] is True
    # PEP 479: a StopIteration leaving a coroutine becomes RuntimeError before fanout sees it.
    named = ("RuntimeError",) if isinstance(exc, StopIteration) else ()
    assert payload["message"].startswith((type(exc).__name__, *named))
    assert "fanout failed" not in payload["message"], "the tool's error blamed on fanout"
    assert len(payload["message"]) <= 500


# -- tools that cancel their own scopes, and callers who may or may not cancel -------------


behaviours = st.one_of(
    st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.3, 1.0, 4.0])),
    st.tuples(st.just("hang"), st.none()),
    st.tuples(st.just("own_scope"), st.sampled_from([0.0, 0.5])),
    st.tuples(st.just("move_on"), st.sampled_from([0.1, 2.0])),
    st.tuples(st.just("cancel_own_nursery"), st.none()),
    st.tuples(st.just("fail_after"), st.sampled_from([0.0, 0.5])),
)


async def _behave(what: str, detail: Any) -> str:
    """What one call does; every branch but ``hang`` and ``fail_after`` returns text."""
    if what == "hang":
        await trio.sleep_forever()
    if what == "own_scope":
        with trio.CancelScope() as own:
            own.cancel()
            await trio.sleep(10)
        await trio.sleep(detail)
        return "cancelled its own scope, then returned"
    if what == "move_on":
        with trio.move_on_after(detail):
            await trio.sleep(1.0)
        return "moved on"
    if what == "cancel_own_nursery":
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
        return "cancelled its own nursery"
    await trio.sleep(detail)
    if what == "fail_after":
        raise ValueError("failed on its own")
    return "slept"


@PROPERTY
@given(
    spec=st.lists(behaviours, min_size=1, max_size=6),
    turn_timeout=st.sampled_from([1.5, 3.0]),
    cancel_at=st.none() | st.sampled_from([0.0, 0.25, 0.8, 2.0, 10.0]),
    on_failure=st.sampled_from(["continue", "cancel_siblings"]),
    hosted=st.booleans(),
)
def test_cancelled_says_caller_only_when_the_caller_cancelled(
    spec: list[tuple[str, Any]],
    turn_timeout: float,
    cancel_at: float | None,
    on_failure: Literal["continue", "cancel_siblings"],
    hosted: bool,
) -> None:
    """A tool cancelling its own scope is still ok; "the caller cancelled" appears exactly
    when the caller's scope fired while the call was unanswered, never otherwise."""
    reg = Registry()

    async def act(n: int) -> str:
        what, detail = spec[n]
        return await _behave(what, detail)

    reg.add(act, name="act", kind=Kind.READS, timeout=None)
    calls = [ToolCall(f"toolu_{i}", "act", {"n": i}) for i in range(len(spec))]
    runner = Runner(reg, turn_timeout=turn_timeout, on_failure=on_failure)
    played = play(runner, calls, hosted=hosted, cancel_at=cancel_at)
    assert_every_id_answered_once(calls, played)
    assert played.returned_at <= played.turn.deadline
    blamed = [r.is_error and "caller cancelled" in body(r)["message"] for r in played.turn.results]
    if not played.caller_cancelled:
        assert not any(blamed)
    for (what, _), result, caller in zip(spec, played.turn.results, blamed, strict=True):
        if result.status is Status.OK:
            assert what not in ("hang", "fail_after")
        elif caller:
            assert result.status is Status.CANCELLED


# -- ids, names and arguments a model should never send ------------------------------------

ids = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
good_arguments = st.fixed_dictionaries(
    {"count": st.integers(-3, 3), "mode": st.sampled_from(["a", "b"])}
)
arguments = st.one_of(
    st.dictionaries(st.text(max_size=6), json_values, max_size=4),
    st.fixed_dictionaries({"count": json_values, "mode": json_values}),
    good_arguments,
    st.dictionaries(st.integers(-3, 3) | st.none() | st.tuples(st.integers()), json_values),
    st.sampled_from(["", "{", "[]", "null", '{"count": 1', "NaN", "\ud800"]),
    st.text(max_size=10),
)
names = st.sampled_from(["typed", "anything", "write", "no_such_tool", "TYPED", " typed"])


def _argument_registry() -> Registry:
    reg = Registry()

    @reg.tool(kind=Kind.PURE)
    async def typed(count: int, mode: Literal["a", "b"] = "a") -> str:
        return f"{mode}{count}"

    @reg.tool(kind=Kind.READS)
    async def anything(**kwargs: Any) -> Any:
        return kwargs

    @reg.tool(kind=Kind.MUTATING)
    async def write(**kwargs: Any) -> str:
        return "written"

    return reg


@PROPERTY
@given(
    spec=st.lists(st.tuples(ids, names, arguments), max_size=8),
    mutating=st.sampled_from(["one", "serial", "parallel"]),
)
def test_any_ids_names_and_arguments_get_one_answer_each_or_a_clear_refusal_of_the_turn(
    spec: list[tuple[str, str, Any]], mutating: Literal["one", "serial", "parallel"]
) -> None:
    """Repeated ids refuse the turn with InvalidTurnError before anything runs; otherwise each
    call gets one answer: unknown tools refused and broken arguments answered, not run."""
    calls = [ToolCall(call_id, name, args) for call_id, name, args in spec]
    runner = Runner(_argument_registry(), mutating=mutating)
    if len({c.id for c in calls}) < len(calls):
        with pytest.raises(fanout.InvalidTurnError):
            runner.turn(calls)
        return
    played = play(runner, calls)
    assert_every_id_answered_once(calls, played)
    assert_nobody_blamed_the_caller(played)
    for call, result in zip(calls, played.turn.results, strict=True):
        if call.name not in ("typed", "anything", "write"):
            assert result.status is Status.REFUSED
            assert body(result)["started"] is False
        elif not call.arguments_valid:
            assert result.status is Status.ERROR
            assert body(result)["started"] is False
        elif result.status is Status.ERROR:
            assert body(result)["started"] is False, "a call with good arguments failed"


def mostly(good: st.SearchStrategy[Any], *broken: st.SearchStrategy[Any]) -> Any:
    """``good`` about six times in seven, else one of ``broken``: most messages run."""
    return st.one_of(*([good] * 6 * len(broken)), *broken)


@PROPERTY
@given(
    blocks=st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(["tool_use", "tool_use", "text", "thinking"]),
                # Mostly well-formed (so turns run), sometimes each field broken.
                "id": mostly(ids, st.just(""), st.none(), st.integers(), st.just("dup")),
                "name": mostly(names, st.none(), st.integers(), st.just("")),
                "input": mostly(good_arguments, arguments, st.none(), st.lists(st.integers())),
            }
        ),
        max_size=6,
    )
)
def test_anthropic_messages_of_any_shape_are_refused_clearly_or_answered_block_for_block(
    blocks: list[dict[str, Any]],
) -> None:
    """calls_from_anthropic raises only FanoutError; a message it accepts gets one
    tool_result block per tool_use block, same ids, same order, is_error iff not ok."""
    message = {"role": "assistant", "content": blocks}
    try:
        calls = fanout.calls_from_anthropic(message)
        turn_calls = list(calls)
        played = play(Runner(_argument_registry()), turn_calls)
    except fanout.FanoutError:
        return
    assert_every_id_answered_once(turn_calls, played)
    reply = fanout.anthropic_tool_results(played.turn)
    json.dumps(reply)  # what is sent back must serialise
    uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
    assert [b["tool_use_id"] for b in reply["content"]] == uses
    for block, result in zip(reply["content"], played.turn.results, strict=True):
        assert block["is_error"] is (result.status is not Status.OK)


@PROPERTY
@given(
    tool_calls=st.lists(
        st.fixed_dictionaries(
            {
                "id": mostly(ids, st.just(""), st.none(), st.just("dup")),
                "type": st.sampled_from(["function", "function", "custom", "other"]),
                "function": st.fixed_dictionaries(
                    {
                        "name": st.one_of(names, st.none()),
                        "arguments": st.one_of(
                            good_arguments.map(json.dumps),
                            st.sampled_from(
                                ["{", '{"count": 2}', "[" * 5_000, '{"count": NaN}', "", "nul"]
                            ),
                            arguments.map(lambda a: a if isinstance(a, str) else repr(a)),
                        ),
                    }
                ),
            }
        ),
        max_size=6,
    )
)
def test_openai_messages_of_any_shape_are_refused_clearly_or_answered_call_for_call(
    tool_calls: list[dict[str, Any]],
) -> None:
    """calls_from_openai raises only FanoutError; one role=tool message per call, in order."""
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    try:
        calls = fanout.calls_from_openai(message)
        played = play(Runner(_argument_registry()), calls)
    except fanout.FanoutError:
        return
    assert_every_id_answered_once(calls, played)
    replies = fanout.openai_tool_messages(played.turn)
    json.dumps(replies)
    assert [r["tool_call_id"] for r in replies] == [c["id"] for c in tool_calls]


# -- instruments that fail -----------------------------------------------------------------


class RaisingInstrument:
    """Raises ``error`` on every event of the kinds named."""

    def __init__(self, kinds: frozenset[EventKind], error: BaseException) -> None:
        self.kinds, self.error = kinds, error

    def on_event(self, event: fanout.Event) -> None:
        if event.kind in self.kinds:
            raise self.error


def _mixed_registry() -> Registry:
    reg = Registry()

    @reg.tool(kind=Kind.READS, timeout=1)
    async def slow() -> str:
        await trio.sleep(5)
        return "never"

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def fast() -> str:
        return "fast"

    @reg.tool(kind=Kind.READS)
    async def fails() -> str:
        raise ValueError("own failure")

    @reg.tool(kind=Kind.MUTATING)
    async def write() -> str:
        return "written"

    return reg


MIXED_CALLS = [
    ToolCall("toolu_slow", "slow"),
    ToolCall("toolu_fast", "fast"),
    ToolCall("toolu_fails", "fails"),
    ToolCall("toolu_write", "write"),
    ToolCall("toolu_unknown", "missing"),
]


@PROPERTY
@given(
    kinds=st.frozensets(st.sampled_from(list(EventKind)), min_size=1),
    error=st.sampled_from(
        [RuntimeError("x"), UnprintableError(), ExceptionGroup("g", [OSError("disk")])]
    ),
    hosted=st.booleans(),
)
def test_an_instrument_that_raises_an_exception_costs_no_call_its_answer(
    kinds: frozenset[EventKind], error: Exception, hosted: bool
) -> None:
    """Instruments raising ordinary exceptions on any events: the transcript is untouched."""
    runner = Runner(
        _mixed_registry(),
        scopes=[Scope("api", rate=5, burst=1)],
        turn_timeout=3,
        instruments=[RaisingInstrument(kinds, error)],
    )
    logging.disable(logging.CRITICAL)
    try:
        played = play(runner, MIXED_CALLS, hosted=hosted)
    finally:
        logging.disable(logging.NOTSET)
    assert_every_id_answered_once(MIXED_CALLS, played)
    assert [r.status for r in played.turn.results] == [
        Status.TIMED_OUT,
        Status.OK,
        Status.ERROR,
        Status.OK,
        Status.REFUSED,
    ]


# -- the breaks these found: one repro each, each red before its fix ---------------------------


class EvilInt(int):
    """An int subclass whose conversion back to int raises (a proxy, a lazy number)."""

    def __int__(self) -> int:
        raise RuntimeError("lazy value failed to load")

    def __index__(self) -> int:
        raise RuntimeError("lazy value failed to load")


class LazyMapping(Mapping[str, Any]):
    """A read-only mapping that fails when read (a lazy record whose backend went away)."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("backend gone")

    def __iter__(self) -> Iterator[str]:
        return iter(["a"])

    def __len__(self) -> int:
        return 1


class UnreadableList(list[Any]):
    """A list that raises as it is read (a lazy page whose backend went away)."""

    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError("backend gone")

    def __len__(self) -> int:
        raise RuntimeError("backend gone")


class UnreadableTuple(tuple[Any, ...]):
    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError("backend gone")


@pytest.mark.parametrize(
    "output",
    [
        [object(), EvilInt(3)],
        LazyMapping(),
        UnreadableList([1, 2]),
        UnreadableTuple((Text("a"),)),
        {"page": UnreadableList([1])},
    ],
    ids=["int-subclass", "mapping", "list", "tuple-of-parts", "nested-list"],
)
async def test_output_that_cannot_be_read_is_not_reported_as_the_tool_raising(
    output: Any, autojump_clock: Any
) -> None:
    """The tool *returned*; the README says such objects are written by str() or type name.

    Today ``_canonical._plain`` raises (``int(value)``, ``value.items()``), ``success``
    only catches ValueError, and ``_run_tool``'s ``except Exception`` answers it with
    "the tool raised an error; fix the arguments".
    """
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def t() -> Any:
        return output

    (result,) = (await Runner(reg).run_turn([ToolCall("a", "t")])).results
    assert result.status is Status.OK


async def test_a_huge_int_is_an_ok_answer(autojump_clock: Any) -> None:
    """README: only self-containing or over-deep output is an error; a big int is neither.

    ``json`` and ``_spelling`` raise ValueError (Python's int max str digits), which
    ``success`` reports as "cannot be written as JSON".
    """
    reg = Registry()

    @reg.tool(kind=Kind.PURE)
    async def factorial() -> int:
        return math.factorial(2_000)  # 5,736 digits

    (result,) = (await Runner(reg).run_turn([ToolCall("a", "factorial")])).results
    assert result.status is Status.OK


async def test_one_call_with_a_huge_int_key_spoils_only_itself(autojump_clock: Any) -> None:
    """DESIGN: a single bad call is answered error and the rest run.

    ``_binding.bind`` says it never raises, but ``_short(name)`` (``repr`` of a
    5,001-digit int) raises ValueError from ``Turn._register``: the turn fails
    internally and its sibling is answered "fanout failed" without running.
    """
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def t(x: int = 0) -> str:
        return "ran"

    turn = await Runner(reg).run_turn([ToolCall("a", "t", {10**5000: 1}), ToolCall("b", "t")])
    bad, sibling = turn.results
    assert bad.status is Status.ERROR
    assert body(bad)["started"] is False
    assert (sibling.status, sibling.content) == (Status.OK, "ran")


async def test_answers_stay_within_max_output_chars_after_scrubbing(autojump_clock: Any) -> None:
    """A tool echoing a query string: ``&token=1`` becomes ``&token=REDACTED`` after the cap.

    ``_answers.success`` cuts to the cap; ``Turn._answer`` then ``scrubbed()`` it, and each
    short credential value grows to "REDACTED": 100 chars cap, 180 chars answer.
    """
    reg = Registry()

    @reg.tool(kind=Kind.READS)
    async def echo() -> str:
        return "&token=1" * 12  # 96 characters, under the cap

    turn = await Runner(reg, max_output_chars=100).run_turn([ToolCall("a", "echo")])
    assert len(turn.results[0].content) <= 100


def test_a_long_exception_message_is_answered_in_linear_time() -> None:
    """A tool raising with 200,000 characters of ``a-a-a-...@`` is answered at once.

    ``describe`` redacts the whole message before ``failure`` cuts it to 500
    characters, and the userinfo shape's scheme, unbounded (``[a-z0-9+.-]*://``),
    ran from every word to the text's end: quadratic, 20,000 characters took 0.8 s
    and this message would take over a minute, with the event loop blocked and no
    deadline able to stop it. This is a guard against that complexity, not a speed
    target: linear, it takes a few tens of milliseconds, far under the bound.
    """
    reg = Registry()

    @reg.tool(kind=Kind.READS, timeout=1)
    async def t() -> str:
        raise ValueError("a-" * 100_000 + "@")

    async def main() -> fanout.Turn:
        return await Runner(reg).run_turn([ToolCall("a", "t")])

    began = time.perf_counter()
    turn = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    elapsed = time.perf_counter() - began
    assert turn.results[0].status is Status.ERROR
    assert elapsed < 5.0, f"answering one exception took {elapsed:.2f}s of CPU"


async def test_a_tool_raising_generator_exit_is_that_calls_error_only(autojump_clock: Any) -> None:
    """README: a tool that raises anything at all is that call's error.

    ``_call._invoke`` re-raises GeneratorExit alongside Cancelled; the turn takes it
    for a crash of fanout, so the healthy sibling is answered "fanout failed".
    """

    async def t() -> str:
        raise GeneratorExit

    calls = [ToolCall("a", "t"), ToolCall("b", "sibling")]
    turn = await Runner(_one_tool_registry(t)).run_turn(calls)
    assert turn.results[0].status is Status.ERROR
    assert (turn.results[1].status, turn.results[1].content) == (Status.OK, "sibling fine")


def test_a_tool_reraising_a_stale_cancelled_does_not_blame_the_caller() -> None:
    """A tool keeps a ``Cancelled`` from its own scope and raises it later (a retry helper
    that saves the last exception). Nobody cancelled the turn, yet every call, including a
    sibling that would have been ok, says "the caller cancelled the turn", and nothing
    propagates: the caller cannot even tell.

    ``Turn._interrupted`` (_turn.py:617) falls back to "the caller" for any Cancelled
    that no reason of the turn's own explains.
    """

    async def t() -> str:
        saved: BaseException | None = None
        with trio.CancelScope() as own:
            own.cancel()
            try:
                await trio.sleep(1)
            except trio.Cancelled as exc:
                saved = exc
                raise
        assert saved is not None
        raise saved

    calls = [ToolCall("a", "t"), ToolCall("b", "sibling")]
    played = play(Runner(_one_tool_registry(t)), calls)
    assert not played.caller_cancelled
    assert_nobody_blamed_the_caller(played)


@pytest.mark.parametrize("kind", [EventKind.TURN_STARTED, EventKind.ANSWERED])
def test_an_instrument_raising_a_base_exception_costs_no_call_its_answer(kind: EventKind) -> None:
    """README: whatever an instrument does, nothing but Cancelled/KeyboardInterrupt escapes.

    ``Recorder.emit`` (_events.py:199) catches ``Exception`` only. TURN_STARTED is
    emitted before ``_run_to_the_end``'s try (_turn.py:184), so every id keeps the
    placeholder "the turn has not finished running this call"; on ANSWERED the
    ``finally`` loop answering the rest (_turn.py:194-196) stops at the first id.
    """
    runner = Runner(
        _mixed_registry(),
        turn_timeout=3,
        instruments=[RaisingInstrument(frozenset({kind}), SystemExit(1))],
    )
    logging.disable(logging.CRITICAL)
    try:
        played = play(runner, MIXED_CALLS)
    finally:
        logging.disable(logging.NOTSET)
    assert_every_id_answered_once(MIXED_CALLS, played)


class SlotFailsHard(Scope):
    """A scope whose slot raises a BaseException (a limiter library shutting down)."""

    async def acquire_slot(self, holder: Any, deadline: float) -> bool:
        raise Shutdown("limiter shut down")


def test_an_open_runner_survives_a_base_exception_in_a_call() -> None:
    """Without ``async with runner`` the same turn answers every id and nothing escapes;
    with it, ``Turn._run_hosted`` (_turn.py:409) catches only ``Exception``, and the
    runner's nursery raises a BaseExceptionGroup into the caller's code."""
    reg = Registry()

    @reg.tool(kind=Kind.READS, scopes=["api"])
    async def limited() -> str:
        return "ran"

    calls = [ToolCall("a", "limited")]
    runner = Runner(reg, scopes=[SlotFailsHard("api", max_concurrency=1)])
    logging.disable(logging.CRITICAL)
    try:
        unhosted = play(runner, calls)
        assert_every_id_answered_once(calls, unhosted)  # holds
        hosted = play(
            Runner(reg, scopes=[SlotFailsHard("api", max_concurrency=1)]), calls, hosted=True
        )
    finally:
        logging.disable(logging.NOTSET)
    assert_every_id_answered_once(calls, hosted)


def _interrupting_registry(after: float) -> Registry:
    reg = _mixed_registry()

    @reg.tool(kind=Kind.READS)
    async def interrupts() -> str:
        await trio.sleep(after)
        raise KeyboardInterrupt

    return reg


def _keyboard_interrupt_in(exc: BaseException | None) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_keyboard_interrupt_in(inner) for inner in exc.exceptions)
    return isinstance(exc, KeyboardInterrupt)


@PROPERTY
@given(
    after=st.sampled_from([0.0, 0.1, 0.5]),
    kinds=st.frozensets(st.sampled_from(list(EventKind)), max_size=3),
    hosted=st.booleans(),
)
def test_a_keyboard_interrupt_goes_up_and_no_answer_blames_the_caller(
    after: float, kinds: frozenset[EventKind], hosted: bool
) -> None:
    """A ``KeyboardInterrupt`` raised in a tool (as Ctrl-C is delivered to whatever task
    runs), or by an instrument on any event: it goes on up, as itself out of
    ``run()`` (a turn's nurseries wrapped it in groups, which ``except
    KeyboardInterrupt`` did not catch), and every id is answered once, none by the
    caller cancelling: nothing cancelled the turn but the interrupt."""
    calls = [*MIXED_CALLS, ToolCall("toolu_interrupts", "interrupts")]
    instruments = [RaisingInstrument(kinds, KeyboardInterrupt())] if kinds else []
    runner = Runner(
        _interrupting_registry(after), scopes=[Scope("api", rate=5, burst=1)],
        turn_timeout=3, instruments=instruments,
    )  # fmt: skip
    turn = runner.turn(calls)
    escaped: list[BaseException] = []

    async def main() -> None:
        try:
            if hosted:  # the calls run in the runner's nursery, which it ends too
                async with runner:
                    with contextlib.suppress(trio.Cancelled, BaseExceptionGroup):
                        await turn.run()
            else:
                await turn.run()
        except BaseException as exc:
            escaped.append(exc)

    logging.disable(logging.CRITICAL)
    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        logging.disable(logging.NOTSET)
    assert len(escaped) == 1
    assert _keyboard_interrupt_in(escaped[0]), escaped
    if not hosted:  # hosted, out of the runner's nursery: trio's group, not the turn's
        assert type(escaped[0]) is KeyboardInterrupt
    assert [r.tool_use_id for r in turn.results] == [c.id for c in calls]
    for result in turn.results:
        if result.is_error:
            assert "the caller cancelled" not in body(result)["message"], result
