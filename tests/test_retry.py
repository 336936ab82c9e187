"""Retry policy and retry budget: backoff within its ceiling, and retries bounded per window."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from fanout import ConfigurationError, RetryBudget, RetryBudgetStatistics, RetryPolicy, Scope


@given(
    retry=st.integers(0, 200),
    base=st.floats(0, 5),
    cap=st.floats(0, 60),
    seed=st.integers(0, 2**32),
)
def test_backoff_stays_within_its_ceiling_for_every_jitter(
    retry: int, base: float, cap: float, seed: int
) -> None:
    """full jitter is in [0, c], equal in [c/2, c], none is c, where c = min(cap, base * 2**n)."""
    ceiling = min(cap, base * 2.0 ** min(retry, 64))
    full = RetryPolicy(base=base, cap=cap, jitter="full").backoff(retry, random.Random(seed))
    equal = RetryPolicy(base=base, cap=cap, jitter="equal").backoff(retry, random.Random(seed))
    none = RetryPolicy(base=base, cap=cap, jitter="none").backoff(retry, random.Random(seed))
    assert 0.0 <= full <= ceiling
    assert ceiling / 2 <= equal <= ceiling
    assert none == ceiling


@pytest.mark.parametrize("options", [{"jitter": "some"}, {"attempts": 0}, {"base": -1.0}])
def test_a_bad_policy_is_a_configuration_error(options: dict[str, Any]) -> None:
    """An unknown jitter, zero attempts or a negative base are refused when the policy is made."""
    with pytest.raises(ConfigurationError):
        RetryPolicy(**options)


async def test_a_budget_allows_floor_plus_ratio_of_requests_in_its_window(
    autojump_clock: Any,
) -> None:
    """floor + ratio * requests retries per window; refusals are counted; old ones forgotten."""
    budget = RetryBudget(ratio=0.5, floor=1, window=10.0)
    for _ in range(4):
        budget.record_request()
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]
    assert budget.statistics() == RetryBudgetStatistics(requests=4, retries=3, refused=1)
    await trio.sleep(10)  # the window has moved past every request and retry
    assert budget.statistics() == RetryBudgetStatistics(requests=0, retries=0, refused=1)
    assert budget.recent_requests(10) == 0
    assert budget.try_spend() is True  # the floor again


async def test_only_a_learning_scope_s_first_wave_is_its_probe(autojump_clock: Any) -> None:
    """A refusal of a request sent before any answer came back is the probe's, which spends
    no retry budget, on a scope that learns its limits; a told scope's first wave is
    its calls', and a 429 to it shows the limits it was told are wrong."""
    learning, told = Scope("api"), Scope("api", rate=5.0, burst=5.0)
    await trio.sleep(0.2)
    for scope in (learning, told):
        await scope.on_throttled(None, sent_at=0.0)  # the first answer, at 0.2
    assert learning.probed(sent_at=0.0)
    assert learning.probed(sent_at=0.2)  # sent as it came: it could not know
    assert not learning.probed(sent_at=0.3)
    assert not learning.probed()  # a tool's own 429: when it was sent is not known
    assert not told.probed(sent_at=0.0)


async def test_only_the_three_429s_learning_spends_are_the_scope_s(autojump_clock: Any) -> None:
    """The 429s learning spends finding the limits (three, the probe's counted once) are the
    scope's, not the attempts of the calls they came to: a window of 15 per 6.4 s stating
    nothing sent all three to one call, which was answered rate_limited. Past the three,
    a 429 is the call's again: exempt, a server refusing for good would be retried on
    every call without end."""
    learning = Scope("api")
    await trio.sleep(0.2)
    await learning.on_throttled(None, sent_at=0.0)  # the probe's: one of the three
    probed = []
    for sent in (2.0, 4.0, 6.0, 8.0):
        await trio.sleep_until(sent)
        await learning.on_throttled(0.1, sent_at=sent)
        probed.append(learning.probed(sent_at=sent))
    assert probed == [True, True, False, False]
    assert not learning.probed(sent_at=5.0)  # no 429 of a request sent then
