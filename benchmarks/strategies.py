"""Seven ways to run a turn's N tool calls, each making one HTTP request per call.

Every strategy gets the same calls, the same server and an httpx client over
the same ``RecordingTransport``, and answers each call with a
``CallOutcome``. Peers are written the way their authors and the seeds
recommend, and given every advantage that is honest: each answers every id
(exceptions are caught per call, so one failure never loses the others'
answers), retries honour ``Retry-After`` where the approach says to, and
the limit-aware ones are told the server's *true* limits.

Deadlines (the deadline scenario) use each approach's own mechanism: none
for the naive loops, stamina's ``timeout``, a per-call ``move_on_after`` for
the seeds' loop (as the seeds advise), the turn and tool timeouts for fanout.
"""

from __future__ import annotations

import email.utils
import functools
import math
import random
import time
from collections.abc import Awaitable, Callable

import aiometer
import attrs
import httpx
import stamina
import trio

import fanout

from .harness import CallOutcome, RecordingTransport
from .scenarios import Scenario

__all__ = ["STRATEGIES", "Setting", "Strategy", "configured_scope", "parse_retry_after"]

_TIMEOUT = 30.0  # httpx's own timeout: generous, the server never hangs
_NO_DEADLINE = 120.0  # fanout's turn timeout when the scenario has no deadline


@attrs.frozen
class Setting:
    """What one strategy run is given: the scenario, where to send, and the wire."""

    scenario: Scenario
    url: str
    key: str
    origin: float
    transport: RecordingTransport

    def client(self) -> httpx.AsyncClient:
        """A plain httpx client for the peers, over the recording transport."""
        return httpx.AsyncClient(
            transport=self.transport, base_url=self.url, headers=self.headers, timeout=_TIMEOUT
        )

    @property
    def headers(self) -> dict[str, str]:
        """The API key travels in ``x-api-key``; a fresh key is a fresh bucket."""
        return {"x-api-key": self.key}

    def now(self) -> float:
        """Seconds since the run began."""
        return trio.current_time() - self.origin

    def remaining(self) -> float | None:
        """Seconds until the turn's deadline, or None when there is none."""
        deadline = self.scenario.deadline
        return None if deadline is None else max(0.0, deadline - self.now())

    def ids(self) -> list[str]:
        return [f"call-{i}" for i in range(self.scenario.calls)]


@attrs.frozen
class Strategy:
    """A named way of running the calls; ``run`` returns one outcome per call it answered."""

    name: str
    label: str
    description: str
    run: Callable[[Setting], Awaitable[list[CallOutcome]]]


class Throttled(Exception):
    """A 429 or 503, with the server's Retry-After in seconds when it gave one."""

    def __init__(self, status: int, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


def parse_retry_after(response: httpx.Response) -> float | None:
    """Retry-After as a careful peer reads it: delta seconds, or an HTTP-date.

    The date is compared with the local clock, as most clients do (fanout
    compares it with the response's own ``Date``, so clock skew cannot stretch it).
    """
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _path(i: int) -> str:
    return f"/item/{i}"


async def _get_or_raise(client: httpx.AsyncClient, i: int) -> None:
    """One request; a 429/503 raises ``Throttled``, any other non-200 ``HTTPStatusError``."""
    response = await client.get(_path(i))
    if response.status_code in (429, 503):
        raise Throttled(response.status_code, parse_retry_after(response))
    response.raise_for_status()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, Throttled):
        return str(exc.status)
    if isinstance(exc, httpx.HTTPStatusError):
        return str(exc.response.status_code)
    return type(exc).__name__


async def _answer(setting: Setting, i: int, attempt: Callable[[], Awaitable[None]]) -> CallOutcome:
    """Run one call's attempt(s) and turn whatever happens into its answer."""
    call_id = f"call-{i}"
    try:
        await attempt()
    except Exception as exc:
        return CallOutcome(call_id, False, _describe(exc), setting.now())
    return CallOutcome(call_id, True, "ok", setting.now())


async def _all_at_once(
    setting: Setting, one: Callable[[httpx.AsyncClient, int], Awaitable[None]]
) -> list[CallOutcome]:
    """Start every call at once in a nursery; collect each call's answer."""
    outcomes: list[CallOutcome] = []
    async with setting.client() as client:

        async def call(i: int) -> None:
            outcomes.append(await _answer(setting, i, functools.partial(one, client, i)))

        async with trio.open_nursery() as nursery:
            for i in range(setting.scenario.calls):
                nursery.start_soon(call, i)
    return outcomes


# -- 1. naive ----------------------------------------------------------------


async def naive(setting: Setting) -> list[CallOutcome]:
    """Fire every call at once; a 429 is the call's answer."""
    return await _all_at_once(setting, _get_or_raise)


# -- 2. naive with fixed-delay retries ----------------------------------------


async def naive_fixed_retry(setting: Setting) -> list[CallOutcome]:
    """Fire every call at once; on 429/503 sleep a fixed delay and try again (5 attempts).

    Every call that failed together wakes together: the thundering herd.
    """
    delay = setting.scenario.fixed_delay

    async def one(client: httpx.AsyncClient, i: int) -> None:
        for attempt in range(5):
            try:
                return await _get_or_raise(client, i)
            except Throttled:
                if attempt == 4:
                    raise
                await trio.sleep(delay)

    return await _all_at_once(setting, one)


# -- 3 and 4. stamina, alone and under aiometer --------------------------------


def _stamina_hook(exc: Exception) -> bool | float:
    """stamina's backoff hook: retry throttling, for as long as Retry-After says if it says."""
    if isinstance(exc, Throttled):
        return exc.retry_after if exc.retry_after is not None else True
    return False


async def _with_stamina(setting: Setting, client: httpx.AsyncClient, i: int) -> None:
    """One call under stamina's defaults (10 attempts, exponential backoff with jitter).

    With a deadline, stamina's ``timeout`` is the time left until it.
    """
    remaining = setting.remaining()
    # stamina's timeout must be positive; a call that starts at its deadline gets one attempt.
    timeout = 45.0 if remaining is None else max(remaining, 1e-3)
    async for attempt in stamina.retry_context(on=_stamina_hook, timeout=timeout):
        with attempt:
            await _get_or_raise(client, i)


async def stamina_all_at_once(setting: Setting) -> list[CallOutcome]:
    """Fire every call at once, each retried by stamina."""
    return await _all_at_once(setting, functools.partial(_with_stamina, setting))


async def aiometer_stamina(setting: Setting) -> list[CallOutcome]:
    """aiometer paces starts to the true limits (max_at_once, max_per_second); stamina retries.

    aiometer spaces starts evenly at ``1/rate`` (GCRA without a burst), so it
    never uses the server's burst.
    """
    scenario = setting.scenario
    async with setting.client() as client:
        jobs = [
            functools.partial(
                _answer, setting, i, functools.partial(_with_stamina, setting, client, i)
            )
            for i in range(scenario.calls)
        ]
        return await aiometer.run_all(
            jobs, max_at_once=scenario.max_in_flight, max_per_second=scenario.rate
        )


# -- 5. the seeds' semaphore and full-jitter loop --------------------------------


async def semaphore_jitter(setting: Setting) -> list[CallOutcome]:
    """The seeds' recipe, in our words: a semaphore sized to the tightest limit;
    on 429/503 honour Retry-After, else sleep a full-jitter backoff
    (uniform in [0, 2**attempt]); five attempts; a timeout around each call.

    As in the seeds, the retry sleeps while holding the semaphore slot.
    """
    scenario = setting.scenario
    slots = trio.Semaphore(scenario.semaphore_size)
    rng = random.Random(0)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        async with slots:
            for attempt in range(5):
                try:
                    return await _get_or_raise(client, i)
                except Throttled as throttled:
                    if attempt == 4:
                        raise
                    delay = throttled.retry_after or rng.uniform(0, 2**attempt)
                    await trio.sleep(delay)

    async def with_timeout(client: httpx.AsyncClient, i: int) -> None:
        remaining = setting.remaining()
        with trio.move_on_after(math.inf if remaining is None else remaining):
            return await one(client, i)
        raise TimeoutError("timed out")

    return await _all_at_once(setting, with_timeout)


# -- 6 and 7. fanout ---------------------------------------------------------------


async def _fanout(setting: Setting, scope: fanout.Scope) -> list[CallOutcome]:
    """The turn through fanout: one tool, one scope, a patient runner (inline_wait=None)."""
    scenario = setting.scenario
    timeout = scenario.deadline if scenario.deadline is not None else _NO_DEADLINE
    client = fanout.http_client(
        setting.transport, base_url=setting.url, headers=setting.headers, timeout=_TIMEOUT,
    )  # fmt: skip
    registry = fanout.Registry()

    @registry.tool(kind=fanout.Kind.READS, scopes=[scope.name], timeout=timeout)
    async def fetch(n: int) -> str:
        response = await client.get(_path(n))
        response.raise_for_status()
        return response.text

    runner = fanout.Runner(registry, scopes=[scope], inline_wait=None, turn_timeout=timeout)
    calls = [fanout.ToolCall(f"call-{i}", "fetch", {"n": i}) for i in range(scenario.calls)]
    async with client:
        turn = await runner.run_turn(calls)
    answered = {
        event.call_id: event.time - setting.origin
        for event in turn.trace
        if event.kind is fanout.EventKind.ANSWERED and event.call_id is not None
    }
    return [
        CallOutcome(
            r.tool_use_id, r.status is fanout.Status.OK, r.status.value, answered[r.tool_use_id]
        )
        for r in turn.results
    ]


def configured_scope(s: Scenario) -> fanout.Scope:
    """The scope a user builds from the README, told the true limits: rate, burst, and the
    in-flight cap where the API has one; an API that counts in windows is told "N per W
    seconds" (and its in-flight cap). Nothing else: slack is measured, shedding is by budget.
    ``tests/test_told_sweep.py`` runs this same scope against generated servers."""
    if s.model in ("fixed", "sliding"):
        return fanout.Scope(
            "api", limit=s.burst, per=s.burst / s.rate, max_concurrency=s.max_in_flight
        )
    # An API documented to have no rate is told so (learn=False), as the README says.
    return fanout.Scope(
        "api", rate=s.told_rate, burst=s.burst, max_concurrency=s.max_in_flight,
        learn=s.told_rate is not None,
    )  # fmt: skip


async def fanout_configured(setting: Setting) -> list[CallOutcome]:
    """fanout told the true limits, as the README says (``configured_scope``)."""
    return await _fanout(setting, configured_scope(setting.scenario))


async def fanout_learned(setting: Setting) -> list[CallOutcome]:
    """fanout told no rate and no burst: it probes once, then learns from what the server does.

    Headers cannot state a concurrency cap, so where the API documents one
    the scope is given it, as a user reading the docs would.
    """
    s = setting.scenario
    scope = fanout.Scope("api", max_concurrency=s.max_in_flight)
    return await _fanout(setting, scope)


async def fanout_learned_uncapped(setting: Setting) -> list[CallOutcome]:
    """fanout told nothing at all, not even a documented cap: it learns the cap from 503s."""
    return await _fanout(setting, fanout.Scope("api"))


STRATEGIES: tuple[Strategy, ...] = (
    Strategy("naive", "naive fan-out", "all at once, no retry", naive),
    Strategy(
        "naive_fixed_retry",
        "naive + fixed-delay retry",
        "all at once; 5 attempts, fixed delay, Retry-After ignored (thundering herd)",
        naive_fixed_retry,
    ),
    Strategy(
        "stamina",
        "all at once + stamina",
        "all at once; stamina defaults, Retry-After honoured via its backoff hook",
        stamina_all_at_once,
    ),
    Strategy(
        "aiometer_stamina",
        "aiometer + stamina",
        "aiometer max_at_once/max_per_second = true limits; stamina retries",
        aiometer_stamina,
    ),
    Strategy(
        "semaphore_jitter",
        "semaphore + full jitter",
        "the seeds' loop: semaphore sized to the limit, Retry-After else full jitter",
        semaphore_jitter,
    ),
    Strategy(
        "fanout_configured",
        "fanout (limits configured)",
        "Scope(rate, burst, max_concurrency) = true limits",
        fanout_configured,
    ),
    Strategy(
        "fanout_learned",
        "fanout (learning from headers)",
        "Scope() with no rate: probe, then learn from headers and 429s",
        fanout_learned,
    ),
    Strategy(
        "fanout_learned_uncapped",
        "fanout (learning, cap not told)",
        "Scope() with no rate and no max_concurrency: the cap too is learned, from 503s",
        fanout_learned_uncapped,
    ),
)
