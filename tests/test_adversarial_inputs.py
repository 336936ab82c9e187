"""Hostile values for every public constructor and function: a typed error, or a run that answers.

The project's standard: bad input is a ``fanout.FanoutError`` (usually a
``ConfigurationError`` naming the option) or an explicit error result, never a
bare ``TypeError``/``ValueError``/``OverflowError`` from deep inside, never a
hang, and never a value accepted silently that then misbehaves. The property
tests below throw NaN, infinities, negatives, bools, strings, ``str``
subclasses, containers, denormals and 1e308 at each option and check exactly
that: either the error names the option, or the value is one the option's
documented rule allows and a turn run with it answers every call once, in
order (on trio's MockClock, so nothing here sleeps for real).

Ints too large for a float (``10**400``) have a test of their own
(``test_ints_too_large_for_a_float_are_configuration_errors``): every numeric
check shared one flaw with them. Each break found is kept as a minimal repro,
each red before its fix.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fanout
from fanout._budget import MAX_WAIT, usable_wait
from fanout._canonical import SHORTEST_CAP
from fanout.http import parse_rate_limit_headers
from fanout.redis import LocalFallback, RedisIdempotencyStore, RedisScope
from tests.test_headers import HEADER_NAMES

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

HUGE = 10**400  # an int no float can hold

_SETTINGS = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class _Text(str):
    """A ``str`` subclass: a value that passes ``isinstance(v, str)`` but is not a number."""


class _Float(float):
    """A ``float`` subclass: a number, and should be treated as one."""


_ODD_VALUES = [
    True,
    False,
    None,
    "1",
    _Text("2"),
    b"1",
    [],
    {},
    (1,),
    object(),
    math.nan,
    math.inf,
    -math.inf,
    -1,
    -0.0,
    0,
    5e-324,
    1e-300,
    1e308,
    2**63,
    10**30,
    _Float(2.5),
]

# Numbers and non-numbers an option may be handed; ints stay within float range.
HOSTILE = st.one_of(
    st.sampled_from(_ODD_VALUES),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite_positive(value: object) -> bool:
    return _is_number(value) and 0 < value < math.inf  # type: ignore[operator]


def _finite_non_negative(value: object) -> bool:
    return _is_number(value) and 0 <= value < math.inf  # type: ignore[operator]


def _whole_at_least(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _attempt(make: Any) -> tuple[Any, BaseException | None]:
    """What ``make()`` returned, or the exception it raised (checked by the caller)."""
    try:
        return make(), None
    except Exception as error:  # every kind is judged by the caller, bare ones included
        return None, error


def _names_option(error: BaseException, option: str) -> None:
    """A typed error whose message says which option was wrong."""
    assert isinstance(error, fanout.FanoutError), f"{type(error).__name__}: {error}"
    assert option in str(error), f"{option!r} not named in {error}"


@pytest.fixture(autouse=True)
def _quiet_fanout_log() -> Iterator[None]:
    """Calls that fail inside fanout log a traceback; the answers are what is checked here."""
    logger = logging.getLogger("fanout")
    before = logger.disabled
    logger.disabled = True
    yield
    logger.disabled = before


def _registry(**tool_options: Any) -> fanout.Registry:
    registry = fanout.Registry()

    async def echo(x: int = 0) -> str:
        await trio.sleep(0.05)
        return f"x={x}"

    options = {"kind": fanout.Kind.READS, **tool_options}
    registry.add(echo, name="echo", **options)
    return registry


def _run_answers_every_call(
    runner: fanout.Runner, n: int = 4, **turn_options: Any
) -> list[fanout.ToolResult]:
    """Run ``n`` calls under a mock clock; each id answered once, in order, with a real status."""
    calls = [fanout.ToolCall(f"c{i}", "echo", {"x": i}) for i in range(n)]
    out: list[fanout.ToolResult] = []

    async def main() -> None:
        with trio.fail_after(10**6):  # a mock-clock bound: a hang fails, it does not block
            turn = await runner.run_turn(calls, **turn_options)
        out.extend(turn.results)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [r.tool_use_id for r in out] == [c.id for c in calls]
    for result in out:
        assert isinstance(result.status, fanout.Status)
        assert isinstance(result.content, str)
        if result.retry_after_ms is not None:
            assert isinstance(result.retry_after_ms, int)
            assert 0 <= result.retry_after_ms <= 7 * 24 * 3600 * 1000
    return out


# --- Scope -----------------------------------------------------------------------

# None is each option's default (not told), except quota_horizon's.
_SCOPE_RULES = {
    "rate": lambda v: v is None or _finite_positive(v),
    "burst": lambda v: v is None or (_is_number(v) and 1 <= v < math.inf),
    "max_concurrency": lambda v: v is None or _whole_at_least(v, 1),
    "max_waiters": lambda v: v is None or _whole_at_least(v, 0),
    "quota_horizon": lambda v: _is_number(v) and v > 0,
    "slack": lambda v: v is None or _finite_non_negative(v),
}


@_SETTINGS
@given(option=st.sampled_from(sorted(_SCOPE_RULES)), value=HOSTILE)
def test_scope_numeric_options_refuse_or_answer(option: str, value: Any) -> None:
    """Every numeric Scope option: a ConfigurationError naming it, or a value its rule
    allows and a turn on the scope that answers every call."""
    scope, error = _attempt(lambda: fanout.Scope("s", **{option: value}))
    if error is not None:
        _names_option(error, option)
        assert not _SCOPE_RULES[option](value), f"{option}={value!r} should be accepted"
        return
    assert _SCOPE_RULES[option](value), f"{option}={value!r} was accepted"
    _run_answers_every_call(fanout.Runner(_registry(scopes=["s"]), scopes=[scope]))


@_SETTINGS
@given(limit=HOSTILE, per=HOSTILE)
def test_scope_window_refuses_or_answers(limit: Any, per: Any) -> None:
    """``limit=``/``per=``: a ConfigurationError naming one of them (or their ratio's
    ``rate``), or a window that answers every call."""
    scope, error = _attempt(lambda: fanout.Scope("s", limit=limit, per=per))
    if error is not None:
        assert isinstance(error, fanout.ConfigurationError), repr(error)
        assert any(word in str(error) for word in ("limit", "per", "rate")), str(error)
        return
    assert _is_number(limit)
    assert 1 <= limit < math.inf
    assert _finite_positive(per)
    assert math.isfinite(limit / per)
    _run_answers_every_call(fanout.Runner(_registry(scopes=["s"]), scopes=[scope]))


_CHOICES = {"trust": ("stricter", "config", "headers"), "window": ("auto", "bucket", "fixed")}


@_SETTINGS
@given(
    option=st.sampled_from(["trust", "window", "learn"]),
    value=st.one_of(
        st.sampled_from(
            [
                "",
                "STRICTER",
                "auto ",
                _Text("config"),
                _Text("fixed"),
                1,
                0,
                None,
                [],
                {},
                "yes",
                "false",
                True,
                False,
            ]
        ),
        st.text(max_size=8),
    ),
)
def test_scope_choices_refuse_or_answer(option: str, value: Any) -> None:
    """``trust``, ``window`` and ``learn`` take their documented values only (a ``str``
    subclass of one is that value); nothing truthy stands in for a bool."""
    scope, error = _attempt(lambda: fanout.Scope("s", **{option: value}))
    if error is not None:
        _names_option(error, option)
        return
    if option == "learn":
        assert isinstance(value, bool)
    else:
        assert value in _CHOICES[option]
    _run_answers_every_call(fanout.Runner(_registry(scopes=["s"]), scopes=[scope]))


@_SETTINGS
@given(name=st.one_of(st.sampled_from(["", None, 3, b"s", ["s"], _Text("ok")]), st.text()))
def test_scope_name_refuses_or_answers(name: Any) -> None:
    """A scope's name is a non-empty string (a ``str`` subclass will do)."""
    scope, error = _attempt(lambda: fanout.Scope(name))
    if error is not None:
        _names_option(error, "name")
        assert not (isinstance(name, str) and name)
        return
    assert isinstance(name, str)
    assert name
    registry = _registry(scopes=[name])
    _run_answers_every_call(fanout.Runner(registry, scopes=[scope]))


# --- RetryPolicy and RetryBudget -----------------------------------------------------

_RETRY_RULES = {
    ("policy", "attempts"): lambda v: _whole_at_least(v, 1),
    ("policy", "base"): _finite_non_negative,
    ("policy", "cap"): _finite_non_negative,
    ("budget", "ratio"): _finite_non_negative,
    ("budget", "floor"): lambda v: _whole_at_least(v, 0),
    ("budget", "window"): _finite_positive,
}


@_SETTINGS
@given(which=st.sampled_from(sorted(_RETRY_RULES)), value=HOSTILE)
def test_retry_options_refuse_or_answer(which: tuple[str, str], value: Any) -> None:
    """RetryPolicy and RetryBudget: an error naming the option, or a run that answers,
    with a tool that fails transiently so that the retry path is taken."""
    kind, option = which
    maker: Any = fanout.RetryPolicy if kind == "policy" else fanout.RetryBudget
    made, error = _attempt(lambda: maker(**{option: value}))
    if error is not None:
        _names_option(error, option)
        assert not _RETRY_RULES[which](value)
        return
    assert _RETRY_RULES[which](value), f"{option}={value!r} was accepted"
    registry = fanout.Registry()

    @registry.tool(name="echo", kind=fanout.Kind.READS, scopes=["s"], timeout=5)
    async def flaky(x: int = 0) -> str:
        await trio.sleep(0.01)
        raise fanout.TransientError("try again")

    budget = {"retry_budget": made} if kind == "budget" else {}
    scope = fanout.Scope("s", rate=100, burst=10, **budget)
    runner = fanout.Runner(registry, scopes=[scope], retry=made if kind == "policy" else None)
    results = _run_answers_every_call(runner)
    assert all(r.status is not fanout.Status.OK for r in results)


# --- Registry.add / Registry.tool --------------------------------------------------

_TOOL_RULES = {
    "timeout": lambda v: v is None or _finite_positive(v),
    "idle_timeout": lambda v: v is None or _finite_positive(v),
    "cache_ttl": lambda v: v is None or _finite_positive(v),
    "cost": _finite_positive,
}


@_SETTINGS
@given(option=st.sampled_from(sorted(_TOOL_RULES)), value=HOSTILE)
def test_tool_numeric_options_refuse_or_answer(option: str, value: Any) -> None:
    """timeout, idle_timeout, cache_ttl and cost: an error naming the option, or a
    tool that answers every call (on a scope, so that a cost is charged)."""
    registry, error = _attempt(lambda: _registry(scopes=["s"], **{option: value}))
    if error is not None:
        _names_option(error, option)
        assert not _TOOL_RULES[option](value)
        return
    assert _TOOL_RULES[option](value), f"{option}={value!r} was accepted"
    scope = fanout.Scope("s", rate=1000, burst=1000)
    _run_answers_every_call(fanout.Runner(registry, scopes=[scope]))


@_SETTINGS
@given(value=st.one_of(st.sampled_from([math.nan, -1.0, 0, math.inf, "x", None, True]), HOSTILE))
def test_a_cost_function_returning_garbage_is_answered(value: Any) -> None:
    """A cost function that returns a non-number is each call's answer (refused, naming
    the cost or the limiter), not an exception out of the turn."""
    registry = _registry(scopes=["s"], cost=lambda arguments: value)
    scope = fanout.Scope("s", rate=1000, burst=1000)
    results = _run_answers_every_call(fanout.Runner(registry, scopes=[scope]))
    if not (_finite_positive(value) and value <= 1000):
        assert all(r.status is fanout.Status.REFUSED for r in results)


@_SETTINGS
@given(
    option=st.sampled_from(["kind", "scopes", "invalidates", "retry"]),
    value=st.sampled_from(
        ["bogus", "", "abc", [""], [3], [None], None, 3.5, [], ("a", "b"), {"a"}, _Text("pure")]
    ),
)
def test_tool_other_options_refuse_or_answer(option: str, value: Any) -> None:
    """kind, scopes, invalidates, retry: an error naming what was wrong, or a tool that
    answers. (A scopes= that is not iterable at all is a known bug, kept out here:
    ``test_tool_options_of_the_wrong_type_are_configuration_errors``.)"""
    names_option = option in ("scopes", "invalidates")
    assume(not (names_option and (value is None if option == "scopes" else False)))
    assume(not (names_option and isinstance(value, float)))
    registry, error = _attempt(lambda: _registry(**{option: value}))
    if error is not None:
        assert isinstance(error, fanout.ConfigurationError), repr(error)
        assert option.rstrip("s") in str(error) or "scope" in str(error), str(error)
        return
    _run_answers_every_call(fanout.Runner(registry))


# --- Runner and its turns ---------------------------------------------------------

_RUNNER_RULES = {
    "turn_timeout": _finite_positive,
    "inline_wait": lambda v: v is None or _finite_non_negative(v),
    "max_output_chars": lambda v: _whole_at_least(v, SHORTEST_CAP),
    "max_threads": lambda v: _whole_at_least(v, 1),
    "mutating": lambda v: v in ("one", "serial", "parallel"),
    "on_failure": lambda v: v in ("continue", "cancel_siblings"),
    "retry": lambda v: v is None,
}


@_SETTINGS
@given(
    option=st.sampled_from(sorted(_RUNNER_RULES)),
    value=st.one_of(HOSTILE, st.sampled_from(["one", _Text("serial"), "cancel_siblings"])),
)
def test_runner_options_refuse_or_answer(option: str, value: Any) -> None:
    """Every Runner option: an error naming it, or a runner whose turn answers every call."""
    runner, error = _attempt(lambda: fanout.Runner(_registry(), **{option: value}))
    if error is not None:
        _names_option(error, option)
        assert not _RUNNER_RULES[option](value)
        return
    assert _RUNNER_RULES[option](value), f"{option}={value!r} was accepted"
    _run_answers_every_call(runner)


@_SETTINGS
@given(value=HOSTILE)
def test_turn_timeout_refuses_or_answers(value: Any) -> None:
    """``run_turn(timeout=...)``: an error naming ``timeout``, or a turn that answers."""
    runner = fanout.Runner(_registry())
    _, error = _attempt(lambda: runner.turn([fanout.ToolCall("c0", "echo", {})], timeout=value))
    if error is not None:
        _names_option(error, "timeout")
        assert value is not None
        assert not _finite_positive(value)
        return
    _run_answers_every_call(runner, timeout=value)


@_SETTINGS
@given(
    call_id=st.one_of(st.sampled_from(["", None, 3, _Text("a")]), st.text(max_size=5)),
    name=st.one_of(st.sampled_from(["", None, 3, ["echo"], _Text("echo"), "echo"]), st.text()),
    arguments=st.one_of(
        st.sampled_from([None, 3, [1], "{", "not json", {"x": math.nan}, {1: 2}, {"x": "1"}]),
        st.dictionaries(st.text(max_size=3), st.integers() | st.text() | st.none(), max_size=3),
    ),
)
def test_tool_calls_are_refused_or_answered(call_id: Any, name: Any, arguments: Any) -> None:
    """A call with a missing id is an InvalidTurnError; any other bad name or argument is
    that call's answer, and its well-formed sibling still runs."""
    runner = fanout.Runner(_registry())
    calls = [fanout.ToolCall(call_id, name, arguments), fanout.ToolCall("sibling", "echo", {})]
    well_formed = all(isinstance(text, str) and text for text in (call_id, name))
    turn, error = _attempt(lambda: runner.turn(calls))
    if error is not None:
        assert isinstance(error, fanout.InvalidTurnError), repr(error)
        assert not well_formed
        return
    assert well_formed
    out: list[fanout.ToolResult] = []

    async def main() -> None:
        await turn.run()
        out.extend(turn.results)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [r.tool_use_id for r in out] == [call_id, "sibling"]
    assert out[1].status is fanout.Status.OK


def test_concurrency_for_refuses_bad_numbers_by_type() -> None:
    """NaN, infinities, zero and negatives are a ConfigurationError (what held)."""
    for rate, latency in [(math.nan, 1), (1, math.inf), (0, 1), (-1, 1), (1e308, 1e308)]:
        with pytest.raises(fanout.ConfigurationError, match="rate and latency"):
            fanout.concurrency_for(rate, latency)


# --- rate-limit headers -------------------------------------------------------------

_HEADER_NAMES = HEADER_NAMES  # every name fanout reads (tests/test_headers.py)
_FRAGMENTS = st.sampled_from(
    [
        "",
        "-",
        "1e400",
        "nan",
        "inf",
        "-5",
        "0",
        "9" * 400,
        "5, 5",
        "Wed, 21 Oct 2015 07:28:00 GMT",
        "Mon, 01 Jan 0001 00:00:00 +2359",
        "Fri, 31 Dec 9999 23:59:59 -2359",
        "9999-12-31T23:59:59+00:00",
        "0001-01-01T00:00:00+23:59",
        '"b";q=100;w=0',
        '"b";r=-1;t=1e9',
        '"x";q=999999999999999;w=0.001',
        "1h2m3s",
        "99999999999999999999h",
        "\u0661\u0662",
        ";w=60",
        "\x00",
        "\u00e9",
        "1e12",
        "1e9",
        "100;w=0.001",
        ",",
    ]
)
_HEADER_VALUE = st.one_of(st.lists(_FRAGMENTS, max_size=4).map("".join), st.text(max_size=30))


def _check_info(info: fanout.http.RateLimitInfo) -> None:
    for field in ("retry_after", "limit", "remaining", "reset_after", "window"):
        value = getattr(info, field)
        assert value is None or (math.isfinite(value) and value >= 0), (field, value)
    assert info.rate is None or math.isfinite(info.rate)
    assert info.scope is None or (isinstance(info.scope, str) and len(info.scope) <= 64)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    headers=st.dictionaries(
        st.sampled_from(_HEADER_NAMES) | st.sampled_from([n.upper() for n in _HEADER_NAMES]),
        _HEADER_VALUE,
        max_size=8,
    ),
    now=st.sampled_from([0.0, 1.7e9, math.nan, math.inf, -math.inf, 1e308, -1e308]),
    max_wait=st.sampled_from([0.0, 3600.0, math.inf, math.nan, -1.0, 1e308]),
)
def test_garbage_headers_are_clamped_or_ignored(
    headers: dict[str, str], now: float, max_wait: float
) -> None:
    """Any value in any rate-limit header, against any clock: a RateLimitInfo of finite,
    non-negative numbers or None; the parser never raises."""
    _check_info(parse_rate_limit_headers(headers, now=now, max_wait=max_wait))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    pairs=st.lists(
        st.tuples(st.sampled_from(_HEADER_NAMES), _HEADER_VALUE.filter(str.isascii)), max_size=10
    )
)
def test_duplicated_headers_are_clamped_or_ignored(pairs: list[tuple[str, str]]) -> None:
    """httpx joins a repeated header with ", "; what comes of it is clamped or ignored."""
    try:
        headers = httpx.Headers(pairs + pairs)
    except Exception:
        return
    _check_info(parse_rate_limit_headers(headers, now=1.7e9))


def test_a_mapping_with_non_string_entries_is_read_as_absent() -> None:
    """Keys and values that are not strings are skipped, not raised on."""
    headers: Mapping[Any, Any] = {3: "5", "retry-after": 5, None: None, "x-ratelimit-limit": b"1"}
    info = parse_rate_limit_headers(headers, now=0.0)
    assert info == fanout.http.RateLimitInfo()


# --- HTTP transport ---------------------------------------------------------------


@_SETTINGS
@given(
    option=st.sampled_from(["secret_headers", "secret_params"]),
    value=st.sampled_from(
        ["x-key", [""], [None], [3], ["a b"], ["\u00e9"], [b"x"], ["a\nb"], [_Text("x-ok")]]
    ),
)
def test_transport_secret_names_refuse_or_accept(option: str, value: Any) -> None:
    """A credential name that cannot be a header or parameter is a ConfigurationError."""
    mock = httpx.MockTransport(lambda r: httpx.Response(200))
    transport, error = _attempt(lambda: fanout.FanoutTransport(mock, **{option: value}))
    if error is not None:
        assert isinstance(error, fanout.ConfigurationError), repr(error)
        return
    assert isinstance(transport, fanout.FanoutTransport)
    assert isinstance(value, list)
    assert all(isinstance(v, str) and v for v in value)


@pytest.mark.parametrize("pools", [0, -1, 2.0, "4", None, math.nan])
def test_transport_pools_must_be_a_whole_number(pools: Any) -> None:
    """What held: pools that are not an int >= 1 are refused, naming ``pools``."""
    with pytest.raises(fanout.ConfigurationError, match="pools"):
        fanout.FanoutTransport(pools=pools)


# --- Redis (no server needed: all of this is checked when built) ------------------

_REDIS_RULES = {
    "lease_ttl": _finite_positive,
    "op_timeout": _finite_positive,
    "recheck_after": _finite_positive,
    "rate": lambda v: v is None or _finite_positive(v),
    "max_concurrency": lambda v: v is None or _whole_at_least(v, 1),
}


@_SETTINGS
@given(option=st.sampled_from(sorted(_REDIS_RULES)), value=HOSTILE)
def test_redis_scope_options_refuse_or_accept(option: str, value: Any) -> None:
    """RedisScope options are held to Scope's rules, before any server is reached."""
    scope, error = _attempt(
        lambda: RedisScope.from_url("redis://127.0.0.1:1/0", name="s", **{option: value})
    )
    if error is not None:
        _names_option(error, option)
        assert not _REDIS_RULES[option](value)
        return
    assert _REDIS_RULES[option](value), f"{option}={value!r} was accepted"
    assert scope.name == "s"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "http://h/0",
        "redis://",
        "redis://h:port/0",
        "redis://h:99999999/0",
        "rediss://h/0?ssl_ca_certs=/does/not/exist",
        "redis://:hunter22@h:abc/0",
    ],
)
def test_unusable_redis_urls_are_configuration_errors(url: str) -> None:
    """What held: a URL fanout cannot use is refused at once, its password hidden."""
    for make in (
        lambda: RedisScope.from_url(url, name="s"),
        lambda: RedisIdempotencyStore.from_url(url),
    ):
        with pytest.raises(fanout.ConfigurationError) as caught:
            make()
        assert "hunter22" not in str(caught.value)


@pytest.mark.parametrize("share", [0, -0.5, 1.5, math.nan, math.inf])
def test_fallback_share_out_of_range_is_refused(share: float) -> None:
    """What held: a share outside (0, 1] is a ConfigurationError."""
    with pytest.raises(fanout.ConfigurationError, match="share"):
        LocalFallback(share=share)


# --- contrib instruments ------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -1, 2.5, "5", None])
def test_instrument_label_limits_refuse_non_counts(limit: Any) -> None:
    """What held: the Prometheus and OpenTelemetry label bounds refuse what is not an int >= 1."""
    from prometheus_client import CollectorRegistry

    from fanout.contrib.otel import OpenTelemetryInstrument
    from fanout.contrib.prometheus import PrometheusInstrument

    with pytest.raises(fanout.ConfigurationError):
        PrometheusInstrument(CollectorRegistry(), max_label_values=limit)
    with pytest.raises(fanout.ConfigurationError):
        OpenTelemetryInstrument(max_names=limit)


# =====================================================================================
# Bugs: minimal deterministic repros, expected to fail until fixed.
# =====================================================================================


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: fanout.Scope("s", rate=HUGE), id="Scope-rate"),
        pytest.param(lambda: fanout.Scope("s", rate=1, burst=HUGE), id="Scope-burst"),
        pytest.param(lambda: fanout.Scope("s", slack=HUGE), id="Scope-slack"),
        pytest.param(lambda: fanout.Scope("s", limit=HUGE, per=1), id="Scope-limit"),
        pytest.param(lambda: fanout.RetryPolicy(base=HUGE), id="RetryPolicy-base"),
        pytest.param(lambda: fanout.RetryBudget(ratio=HUGE), id="RetryBudget-ratio"),
        pytest.param(lambda: _registry(timeout=HUGE), id="tool-timeout"),
        pytest.param(lambda: _registry(cost=HUGE), id="tool-cost"),
        pytest.param(lambda: fanout.Runner(_registry(), turn_timeout=HUGE), id="turn_timeout"),
        pytest.param(lambda: fanout.Runner(_registry(), inline_wait=HUGE), id="inline_wait"),
        pytest.param(
            lambda: RedisScope.from_url("redis://h/0", name="s", lease_ttl=HUGE), id="lease_ttl"
        ),
        pytest.param(lambda: fanout.concurrency_for(HUGE, 1), id="concurrency_for"),
    ],
)
def test_ints_too_large_for_a_float_are_configuration_errors(make: Any) -> None:
    """``10**400`` passes ``0 < v < inf`` and then ``float(v)`` (or ``math.isfinite``,
    or ``limit / per``) raises OverflowError: it should be a ConfigurationError."""
    with pytest.raises(fanout.ConfigurationError):
        make()


@pytest.mark.parametrize("rate", ["10", None])
def test_concurrency_for_a_non_number_is_a_configuration_error(rate: Any) -> None:
    """``concurrency_for("10", 0.4)`` is a TypeError from ``rate > 0``, not a ConfigurationError."""
    with pytest.raises(fanout.ConfigurationError):
        fanout.concurrency_for(rate, 0.4)


def test_a_huge_cost_on_a_learning_scope_keeps_a_finished_call_ok() -> None:
    """With ``cost=1e308`` on a scope that learns, the probe call runs and returns, then
    learning computes an infinite rate and the call is answered ``error`` ("fanout failed")."""
    registry = _registry(scopes=["s"], cost=1e308)
    results = _run_answers_every_call(fanout.Runner(registry, scopes=[fanout.Scope("s")]), n=1)
    assert results[0].status is fanout.Status.OK


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"registry": object()}, id="registry"),
        pytest.param({"scopes": ["s"]}, id="scopes-of-strings"),
        pytest.param({"scopes": None}, id="scopes-None"),
        pytest.param({"instruments": 3}, id="instruments-int"),
        pytest.param({"rng": 3}, id="rng"),
        pytest.param({"trace": "no"}, id="trace-str"),
    ],
)
def test_runner_refuses_parts_of_the_wrong_type(options: dict[str, Any]) -> None:
    """Each is accepted, or fails with a bare AttributeError/TypeError, instead of a
    ConfigurationError naming the option; some only fail when a turn runs."""
    options = dict(options)
    registry = options.pop("registry", _registry())
    runner, error = _attempt(lambda: fanout.Runner(registry, **options))
    if error is None:  # accepted: then a turn must at least answer every call
        _, error = _attempt(lambda: _run_answers_every_call(runner))
    assert isinstance(error, fanout.ConfigurationError), repr(error)


@pytest.mark.parametrize(
    "turn", [pytest.param({"run": 3}, id="run"), pytest.param({"calls": 3}, id="calls")]
)
def test_a_turn_of_the_wrong_type_is_a_typed_error(turn: dict[str, Any]) -> None:
    """``runner.turn(calls, run=3)`` is an AttributeError; ``runner.turn(3)`` a TypeError."""
    runner = fanout.Runner(_registry())
    turn = dict(turn)
    calls = turn.pop("calls", [fanout.ToolCall("c0", "echo", {})])
    with pytest.raises(fanout.FanoutError):
        runner.turn(calls, **turn)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"scopes": 3}, id="scopes-int"),
        pytest.param({"scopes": None}, id="scopes-None"),
        pytest.param({"invalidates": 3.5}, id="invalidates-float"),
        pytest.param({"repeatable": "no"}, id="repeatable-str"),
        pytest.param({"description": 3}, id="description-int"),
    ],
)
def test_tool_options_of_the_wrong_type_are_configuration_errors(options: dict[str, Any]) -> None:
    """``scopes=3`` is a TypeError from ``tuple(3)``; ``repeatable="no"`` is taken as True."""
    with pytest.raises(fanout.ConfigurationError):
        _registry(**options)


def test_a_tool_result_with_an_unknown_status_is_a_typed_error() -> None:
    """``ToolResult("a", "bogus", "x")`` raises the enum's bare ValueError."""
    with pytest.raises(fanout.FanoutError):
        fanout.ToolResult("a", "bogus", "x")


def test_a_tool_result_whose_content_is_not_text_is_refused_when_made() -> None:
    """``ToolResult("a", "ok", 3)`` is accepted; the adapters then raise AttributeError
    (``content.startswith`` in ``parts_of``)."""
    result, error = _attempt(lambda: fanout.ToolResult("a", "ok", 3))
    if error is None:
        fanout.anthropic_tool_results([result])
    assert isinstance(error, fanout.FanoutError), repr(error)


class _RaisingDict(dict):  # type: ignore[type-arg]
    """A dict subclass whose reading methods raise."""

    def keys(self) -> Any:
        raise RuntimeError("keys")

    def __iter__(self) -> Any:
        raise RuntimeError("iter")


def test_arguments_that_raise_when_read_are_that_calls_error() -> None:
    """``ToolCall("a", "echo", <dict subclass whose keys() raises>)`` raises out of the
    converter's ``dict(value)``; it should be an invalid-arguments call, answered error."""
    call = fanout.ToolCall("a", "echo", _RaisingDict(x=1))
    assert not call.arguments_valid


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: RedisScope.from_url("redis://[::1/0", name="s"), id="bad-ipv6"),
        pytest.param(lambda: RedisScope.from_url(3, name="s"), id="url-int"),
        pytest.param(
            lambda: RedisScope.from_url("redis://h/0", name="s", cluster="yes"), id="cluster-str"
        ),
        pytest.param(lambda: RedisScope.from_url("redis://h/notanumber", name="s"), id="db-text"),
        pytest.param(lambda: RedisScope(None, "s"), id="client-None"),
    ],
)
def test_bad_redis_urls_and_flags_are_configuration_errors(make: Any) -> None:
    """``redis://[::1/0`` is urlsplit's ValueError, ``cluster="yes"`` a KeyError, a
    database path ``notanumber`` is silently database 0."""
    with pytest.raises(fanout.ConfigurationError):
        make()


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"op_timeout": math.nan}, id="op_timeout-nan"),
        pytest.param({"op_timeout": -1}, id="op_timeout-negative"),
        pytest.param({"op_timeout": "x"}, id="op_timeout-str"),
        pytest.param({"op_timeout": True}, id="op_timeout-bool"),
        pytest.param({"prefix": 3}, id="prefix-int"),
    ],
)
def test_idempotency_store_options_are_checked_like_the_scopes(options: dict[str, Any]) -> None:
    """RedisScope refuses ``op_timeout=nan``; the store takes it, and ``prefix=3``, silently."""
    with pytest.raises(fanout.ConfigurationError, match=next(iter(options))):
        RedisIdempotencyStore.from_url("redis://h/0", **options)


@pytest.mark.parametrize("share", ["0.5", None, True])
def test_fallback_share_of_the_wrong_type_is_a_configuration_error(share: Any) -> None:
    """``LocalFallback(share="0.5")`` is a TypeError; ``share=True`` passes as 1."""
    with pytest.raises(fanout.ConfigurationError):
        LocalFallback(share=share)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"pools": True}, id="pools-bool"),
        pytest.param({"wall_clock": 3}, id="wall_clock-int"),
        pytest.param({"secret_headers": 3}, id="secret_headers-int"),
    ],
)
def test_transport_options_of_the_wrong_type_are_configuration_errors(
    options: dict[str, Any],
) -> None:
    """``FanoutTransport(wall_clock=3)`` is accepted, and then every response with a
    rate-limit reset fails its call with "TypeError: 'int' object is not callable"."""
    with pytest.raises(fanout.ConfigurationError):
        fanout.FanoutTransport(**options)


def test_a_transport_with_a_bad_wall_clock_is_refused_when_made() -> None:
    """``wall_clock=3`` was accepted, and then every 200 carrying an epoch reset was
    answered ``error`` ("'int' object is not callable"). It is refused when made."""
    with pytest.raises(fanout.ConfigurationError, match="wall_clock"):
        fanout.FanoutTransport(httpx.MockTransport(lambda r: httpx.Response(200)), wall_clock=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param("prometheus-bool", id="prometheus-max_label_values-bool"),
        pytest.param("prometheus-namespace", id="prometheus-namespace-int"),
        pytest.param("otel-bool", id="otel-max_names-bool"),
        pytest.param("logging-level", id="logging-level-str"),
    ],
)
def test_instrument_options_of_the_wrong_type_are_configuration_errors(make: str) -> None:
    """``max_label_values=True`` passes ``isinstance(v, int)``; ``namespace=3`` is a
    TypeError; ``LoggingInstrument(level="x")`` is accepted and then logs nothing."""
    from prometheus_client import CollectorRegistry

    from fanout.contrib.logging import LoggingInstrument
    from fanout.contrib.otel import OpenTelemetryInstrument
    from fanout.contrib.prometheus import PrometheusInstrument

    builders = {
        "prometheus-bool": lambda: PrometheusInstrument(CollectorRegistry(), max_label_values=True),
        "prometheus-namespace": lambda: PrometheusInstrument(CollectorRegistry(), namespace=3),
        "otel-bool": lambda: OpenTelemetryInstrument(max_names=True),
        "logging-level": lambda: LoggingInstrument(level="x"),  # type: ignore[arg-type]
    }
    with pytest.raises(fanout.ConfigurationError):
        builders[make]()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    waits=st.lists(
        st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.just(1e308), max_size=4
    ),
    learn=st.booleans(),
)
def test_any_wait_told_to_a_scope_is_read_as_the_runner_reads_it(
    waits: list[float | None], learn: bool
) -> None:
    """``Scope.on_throttled`` is public: told any wait (NaN, infinite, negative, huge), in
    any order, a scope blocks for what ``usable_wait`` makes of it, at most ``MAX_WAIT``
    and then a token at the least rate learning goes down to (0.1/s), and never raises.
    An infinite wait to a learning scope raised ``OverflowError``."""

    async def main() -> None:
        scope = fanout.Scope("api") if learn else fanout.Scope("api", rate=5.0, burst=5.0)
        for wait in waits:
            await scope.on_throttled(wait, sent_at=trio.current_time())
            usable = usable_wait(wait)
            blocked = await scope.wait_for(1.0)
            assert 0.0 <= blocked <= MAX_WAIT + 10.0
            if not learn and usable is not None:
                assert blocked >= usable

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class _ProxyText(str):
    """A ``str`` subclass whose own methods raise (a lazy proxy whose backend went away)."""

    __slots__ = ()

    def __hash__(self) -> int:
        raise RuntimeError("proxy gone")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("proxy gone")

    def __len__(self) -> int:
        raise RuntimeError("proxy gone")

    def __repr__(self) -> str:
        raise RuntimeError("proxy gone")


@given(ids=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4), proxy=st.data())
def test_ids_and_names_of_a_str_subclass_are_read_as_their_text(
    ids: list[str], proxy: st.DataObject
) -> None:
    """Ids and names that are ``str`` subclasses with raising methods: the turn reads their
    plain text, answers each distinct id once under it, and a repeated id is an
    ``InvalidTurnError``, never the subclass's own exception."""
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS)
    async def t() -> str:
        return "x"

    wrapped = [proxy.draw(st.booleans()) for _ in ids]
    calls = [
        fanout.ToolCall(_ProxyText(i) if w else i, _ProxyText("t") if w else "t")
        for i, w in zip(ids, wrapped, strict=True)
    ]

    async def main() -> list[fanout.ToolResult]:
        return list((await fanout.Runner(registry).run_turn(calls)).results)

    if len(set(ids)) < len(ids):
        with pytest.raises(fanout.InvalidTurnError, match="share the id"):
            trio.run(main)
        return
    results = trio.run(main)
    assert [(type(r.tool_use_id), r.tool_use_id, r.content) for r in results] == [
        (str, i, "x") for i in ids
    ]
