"""The budget: which waits are slept, which are not and why, and which waits are usable."""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio
from hypothesis import example, given
from hypothesis import strategies as st

from fanout import Budget, ConfigurationError, Verdict
from fanout._answers import milliseconds
from fanout._budget import MAX_WAIT, usable_wait

anything = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
)


@given(anything)
@example(math.nan)
@example(True)
@example(10**400)  # no float holds it: float() raised OverflowError, "fanout failed"
@example(-(10**400))
def test_a_usable_wait_is_a_number_between_zero_and_a_week(value: Any) -> None:
    """Any value a tool or server gives is None, or seconds clamped into [0, MAX_WAIT]."""
    wait = usable_wait(value)
    unsaid = isinstance(value, float) and math.isnan(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or unsaid:
        assert wait is None
    else:
        assert wait == float(min(max(value, 0), MAX_WAIT))


@given(anything)
@example(math.nan)
def test_the_model_is_told_the_usable_wait_in_whole_milliseconds_rounded_up(value: Any) -> None:
    """retry_after_ms is the usable wait rounded up to a millisecond, never shorter."""
    wait, ms = usable_wait(value), milliseconds(value)
    assert (ms is None) == (wait is None)
    if wait is not None and ms is not None:
        assert ms / 1000 >= wait
        assert ms - 1 < wait * 1000


async def test_verdicts_in_order_past_deadline_ends_late_too_long(autojump_clock: Any) -> None:
    """Past the deadline wins over ending late, which wins over too long; else sleep."""
    await trio.sleep(10)
    budget = Budget(deadline=15.0, inline_wait=2.0)
    assert budget.judge(5.0) is Verdict.PAST_DEADLINE  # ends exactly at the deadline
    assert budget.judge(4.0, latency=2.0) is Verdict.ENDS_LATE
    assert budget.judge(3.0, latency=1.0) is Verdict.TOO_LONG
    assert budget.judge(2.0, latency=1.0) is Verdict.SLEEP
    assert budget.judge(0.0, latency=100.0) is Verdict.SLEEP  # a zero wait is always tried
    assert budget.judge(-1.0) is Verdict.SLEEP
    assert budget.judge(math.nan) is Verdict.PAST_DEADLINE


async def test_work_that_ends_exactly_at_the_deadline_is_in_time(autojump_clock: Any) -> None:
    """A call of 100 ms whose token comes at 1.9 s ends at 2.0 s: in time, even when the
    times are sums of clock readings with float noise; a hair longer ends late."""
    await trio.sleep(0.1)
    budget = Budget(deadline=2.1)
    assert budget.judge(1.9, latency=0.1) is Verdict.SLEEP
    assert budget.judge(1.9, latency=1.2000000000000002 - 1.1) is Verdict.SLEEP
    assert budget.judge(1.9, latency=0.1 + 1e-6) is Verdict.ENDS_LATE
    assert budget.judge(2.0) is Verdict.PAST_DEADLINE  # a wait that ends there still does not fit


async def test_patience_is_the_deadline_or_the_inline_wait_whichever_is_first(
    autojump_clock: Any,
) -> None:
    """patience() is now + inline_wait, capped at the deadline; without inline_wait the deadline."""
    await trio.sleep(10)
    assert Budget(deadline=15.0, inline_wait=2.0).patience() == 12.0
    assert Budget(deadline=11.0, inline_wait=2.0).patience() == 11.0
    assert Budget(deadline=15.0).patience() == 15.0


async def test_a_budget_starting_now_is_capped_by_its_turn(autojump_clock: Any) -> None:
    """starting_now is now + timeout, never past the turn's deadline; no timeout is the turn's."""
    await trio.sleep(1)
    assert Budget.starting_now(3, turn_deadline=10).deadline == 4.0
    assert Budget.starting_now(30, turn_deadline=10).deadline == 10
    assert Budget.starting_now(None, turn_deadline=10).deadline == 10


def test_explanations_say_why_in_the_models_words() -> None:
    """Each verdict not slept has its own words, naming the latency or the inline limit."""
    budget = Budget(deadline=5.0, inline_wait=1.5)
    assert budget.explain(Verdict.PAST_DEADLINE) == "past the call's deadline"
    assert budget.explain(Verdict.TOO_LONG) == "longer than fanout waits inline (1.5s)"
    assert budget.explain(Verdict.ENDS_LATE, latency=0.25) == (
        "but calls there take about 0.250s and it would end past its deadline"
    )


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "2"])
def test_a_bad_inline_wait_is_a_configuration_error(bad: Any) -> None:
    """inline_wait must be a finite number >= 0; anything else is refused at construction."""
    with pytest.raises(ConfigurationError):
        Budget(deadline=1.0, inline_wait=bad)
