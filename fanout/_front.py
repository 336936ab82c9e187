"""The scope front: every rule about a scope, once, over a small backend.

A scope's limits live somewhere (this process, or Redis for many processes);
what fanout *does* with them does not depend on where. The front holds that:
validation, cost checks, shedding by budget with an honest drain estimate,
the probe, learning, reading rate-limit headers by what they can mean, the
retry budget, the latency it has seen, and statistics. A ``Backend`` holds
only slots (acquire, release) and tokens (reserve, refund, confirm, drain,
block, sync). ``Scope`` and ``RedisScope`` are this front over a local or a
Redis backend, so both kinds behave alike.

How headers are read (see RATE-LIMIT-SEMANTICS in the design notes):
``Remaining`` with a known rate *syncs* the bucket to the server's count,
refilled at the rate since the request was sent, minus what this process
started since; it never blocks until ``Reset``, because on a token bucket
``Reset`` is "until full" and the next token is ``1/rate`` away.

An API that counts "N per W seconds" in windows (fixed or sliding) is served
by a sliding log instead of the bucket (``_window``): each token comes back
W seconds after it was spent. It is told (``limit=N, per=W``), or learned
from 429s inside windows answers reported spent (`fanout._window_watch`).
``window="fixed"`` keeps the bucket and makes ``Remaining: 0`` wait for the
reset.

What the front reads answers against lives in its parts: what this process
booked and sent (`fanout._outgoing`), the counts answers stated
(`fanout._stated_counts`), and a told bucket counted again as requests leave
(`fanout._told_counts`).
"""

from __future__ import annotations

import collections
import contextlib
import math
from typing import TYPE_CHECKING, Any, Literal, get_args

import attrs
import trio

from ._backend import Backend, SlotHolder
from ._bucket import Booking, BucketStatistics, ServerCount
from ._budget import CLOCK_NOISE, QUOTA_HORIZON, Verdict, usable_wait
from ._exceptions import ConfigurationError
from ._lags import Lags, Sight
from ._learning import TOGETHER, RateLearner
from ._ledger import Ledger
from ._outgoing import Outgoing
from ._probe import Probe
from ._retry import RetryBudget
from ._slots import LearnedCap, Leaving
from ._stated_counts import StatedCounts
from ._stated_policy import StatedPolicy
from ._told_counts import DepartureGate, WireCount
from ._trio_runs import RunSeen
from ._validate import (
    flag,
    one_of,
    optional_at_least,
    optional_count,
    optional_non_negative,
    optional_positive,
)
from ._window import Arrivals, past_reset
from ._window_watch import WindowWatch

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ._budget import Budget
    from ._values import RateLimitInfo

__all__ = [
    "ScopeFront",
    "ScopeStatistics",
    "Trust",
    "WindowKind",
]

Trust = Literal["stricter", "config", "headers"]
WindowKind = Literal["auto", "bucket", "fixed"]

_MAX_LAG = 1.0  # seconds; a longer delay before a first request is the tool's, not the network's
_TOOK_FULL_FOR = 1.0  # seconds a booking that took a full bucket waits to be sent (`headers_left`)
# Seconds sooner than its log a told window must be freed by a whole-second reset not yet
# seen rounded down (`_reset_lead`).
_RESET_LEAD = 0.5
# Calls a scope told its concurrency (and no rate) probes with at once: a server
# whose burst is one answers the others 429, three at most, one congestion event
# that spends one of the 429s learning may (`fanout._learning`).
_PROBE_WIDTH = 4
# Calls a scope told nothing probes with (`fanout._probe`): one alone lost the
# refill of the server's full bucket while it was answered. A server whose burst or
# in-flight cap is one refuses the second: a 429 or a 503 spent.
_BLIND_PROBE_WIDTH = 2
# Calls finished before the quickest of them is taken as a floor for the next.
_QUICKEST_AFTER = 8


@attrs.frozen
class ScopeStatistics:
    """A snapshot of one scope, cheap and safe to take from any task.

    ``in_flight`` counts calls holding a slot; ``waiting`` counts calls queued
    for a slot, the probe or tokens. A call that holds its slot while it
    waits for a token is in both: it occupies capacity and is not yet running.
    ``on_the_wire`` counts this process's requests sent through fanout's HTTP
    transport whose answers are not yet read; ``max_concurrency`` is the cap
    in force, a lower one 503s showed included (`fanout._slots`).
    """

    name: str
    in_flight: int
    max_concurrency: int | None
    waiting: int
    bucket: BucketStatistics
    exhausted_until: float | None
    latency: float | None
    shed: int
    requests: int
    retries: int
    retries_refused: int
    slack: float = 0.0
    on_the_wire: int = 0


def _horizon(_: object, __: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigurationError(f"quota_horizon must be a positive number, not {value!r}")


def _retry_budget(_: object, __: attrs.Attribute[RetryBudget], value: RetryBudget) -> None:
    if not isinstance(value, RetryBudget):
        raise ConfigurationError(f"retry_budget must be a RetryBudget, not {value!r}")


def _rounded_up(info: RateLimitInfo) -> RateLimitInfo:
    """``info``, its whole-second reset of 0 with less than its limit remaining read as a
    second.

    Nothing remains, so the bucket is not full, nor its next token come, nor
    its window over: a reset of 0 was rounded down (``int()``) or to the
    nearest second (``round()``), and is under a second. Read as now, each
    wait for it ended at once into a 429 (four against a bucket at 2/s whose
    reset to its next token was rounded to the nearest second). So with less
    than the limit remaining (requests counted, the bucket not full, the
    window not over): read as now, a learned log freed a token the server
    still counted at each such answer (`SlidingLog.sync`), and a window of 3
    per 1.5 s, or a bucket of 4 at 3.5/s taken for one, drew four 429s.
    """
    remaining = info.remaining
    short = remaining is not None and remaining < max(1.0, info.limit or 0.0)
    if info.reset_after == 0 and not info.reset_exact and short:
        return attrs.evolve(info, reset_after=1.0)
    return info


def _fastest(info: RateLimitInfo) -> float:
    """The fastest rate a stated ``limit`` per ``window`` allows.

    Windows are whole seconds (sub-second precision is not supported), so
    a server whose bucket refills in 0.4 s states ``w=1``: the true window
    is in ``(w - 1, w]``, and only a rate above ``limit / (w - 1)``
    contradicts the statement.
    """
    assert info.limit is not None
    assert info.window is not None
    return info.limit / (info.window - 1) if info.window > 1 else math.inf


def _default_of(field: attrs.Attribute[Any], owner: object) -> object:
    """What ``field`` of ``owner`` holds as it is built."""
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]  # a class, typed as a function
        return default.factory(owner) if default.takes_self else default.factory()
    return default


def check_name(name: object) -> None:
    """A scope's name is a non-empty string."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"a scope needs a non-empty string name, not {name!r}")


@attrs.define(eq=False)
class ScopeFront:
    """The configuration and behaviour shared by every kind of scope.

    ``rate``/``burst``: the token bucket (``rate=None``: learn it when
    ``learn``); ``max_concurrency``: calls in flight; ``max_waiters``: an
    optional bound on calls queued here (None, the default: a call is shed
    only when the queue ahead cannot drain within its budget);
    ``quota_horizon``: the longest server wait still treated as throttling
    rather than an exhausted quota; ``slack``: seconds of margin for requests
    that reach the server out of step (None, the default: measured, from how
    late a call's first request leaves after its admission and from the
    earliest answer to a burst); ``trust``: when configured limits and the
    limits a server states disagree, use the stricter (default), the
    configuration, or the headers; ``window``: how the server counts
    (``"auto"``: a token bucket until 429s show windows, then a sliding log;
    ``"bucket"``: always a token bucket; ``"fixed"``: a bucket whose
    ``Remaining: 0`` waits for the reset). ``limit``/``per``: the API allows
    ``limit`` requests in any ``per`` seconds (a window, fixed or sliding):
    tokens are kept in a sliding log, instead of ``rate``/``burst``.
    """

    rate: float | None = attrs.field(default=None, kw_only=True, validator=optional_positive)
    burst: float | None = attrs.field(default=None, kw_only=True, validator=optional_count)
    max_concurrency: int | None = attrs.field(
        default=None, kw_only=True, validator=optional_at_least(1)
    )
    max_waiters: int | None = attrs.field(
        default=None, kw_only=True, validator=optional_at_least(0)
    )
    quota_horizon: float = attrs.field(default=QUOTA_HORIZON, kw_only=True, validator=_horizon)
    retry_budget: RetryBudget = attrs.field(
        factory=RetryBudget, kw_only=True, validator=_retry_budget
    )
    learn: bool = attrs.field(default=True, kw_only=True, validator=flag)
    slack: float | None = attrs.field(default=None, kw_only=True, validator=optional_non_negative)
    trust: Trust = attrs.field(default="stricter", kw_only=True, validator=one_of(get_args(Trust)))
    window: WindowKind = attrs.field(
        default="auto", kw_only=True, validator=one_of(get_args(WindowKind))
    )
    limit: float | None = attrs.field(default=None, kw_only=True, validator=optional_count)
    per: float | None = attrs.field(default=None, kw_only=True, validator=optional_positive)
    _backend: Backend = attrs.field(init=False, repr=False)
    _ledger: Ledger = attrs.field(init=False, factory=Ledger, repr=False)
    _learner: RateLearner | None = attrs.field(init=False, default=None, repr=False)
    _probe: Probe = attrs.field(init=False, factory=lambda: Probe(done=True), repr=False)
    _limits: tuple[float | None, float] = attrs.field(init=False, default=(None, 1.0), repr=False)
    # This process's bookings and requests, and other processes' starts (`Outgoing`).
    _outgoing: Outgoing = attrs.field(init=False, factory=Outgoing, repr=False)
    # The latest counts answers stated, read against what this process sent.
    _stated: StatedCounts = attrs.field(
        init=False,
        default=attrs.Factory(lambda self: StatedCounts(self._outgoing), True),
        repr=False,
    )
    # The counts stated with a policy, read for whether a window of it counted them.
    _policy: StatedPolicy = attrs.field(init=False, factory=StatedPolicy, repr=False)
    # How late requests leave and arrive, as measured: the slack (`fanout._lags`).
    _lags: Lags = attrs.field(init=False, factory=Lags, repr=False)
    # The quickest a call's first request got to its headers after its admission, and to the
    # HTTP layer: its tool's own set-up (`admission_lead`).
    _quickest_way_out: float = attrs.field(init=False, default=math.inf, repr=False)
    _quickest_set_up: float = attrs.field(init=False, default=math.inf, repr=False)
    # Bookings that took a full bucket, confirmed and not yet sent:
    # (confirmed, start, cost, the refill pause kept after it).
    _took_full: collections.deque[tuple[float, float, float, float]] = attrs.field(
        init=False, factory=collections.deque, repr=False
    )
    # The quickest a connection was opened: a round trip on the network, no server time.
    _network_trip: float = attrs.field(init=False, default=math.inf, repr=False)
    # The server states its count as it answers, not as each request arrives.
    _counts_on_answer: bool = attrs.field(init=False, default=False, repr=False)
    _emptied: bool = attrs.field(init=False, default=False, repr=False)  # said Remaining 0
    # Admitted answers read with and without a count of what remains: a server stating
    # its counts on its refusals alone gives only the latter (`_counts_on_refusals_alone`).
    _counted_admitted: bool = attrs.field(init=False, default=False, repr=False)
    _admitted_bare: bool = attrs.field(init=False, default=False, repr=False)
    # Such a server's 429 that named no wait, by when its request was sent: when its reset
    # said the quota returns (`on_throttled`).
    _refused_reset: tuple[float, float] | None = attrs.field(init=False, default=None, repr=False)
    # The server's whole-second resets may be rounded down (`_reset_read`).
    _resets_floored: bool = attrs.field(init=False, default=False, repr=False)
    _holds: list[float] = attrs.field(init=False, factory=list, repr=False)  # when each ends
    # The pause kept after the paced fill whose request is leaving now (`headers_left`).
    _leaving_pause: float = attrs.field(init=False, default=0.0, repr=False)
    _burst: tuple[float, float] | None = attrs.field(init=False, default=None, repr=False)
    # A request of the latest burst was seen reaching the server as it left (`_observe_arrival`).
    _burst_on_time: bool = attrs.field(init=False, default=False, repr=False)
    # A told bucket counted as requests reach the HTTP layer (`_departure_wait`), and as
    # their headers reach the wire (`wire_wait`): `fanout._told_counts`.
    _gate: DepartureGate = attrs.field(init=False, factory=DepartureGate, repr=False)
    _wire: WireCount = attrs.field(init=False, factory=WireCount, repr=False)
    _window_length: float | None = attrs.field(init=False, default=None, repr=False)
    _arrivals: Arrivals = attrs.field(init=False, factory=Arrivals, repr=False)
    _first_answer_at: float = attrs.field(init=False, default=math.inf, repr=False)
    # What shows the server counts in windows (`fanout._window_watch`).
    _windows: WindowWatch = attrs.field(init=False, factory=WindowWatch, repr=False)
    # Counting in a window a reopening showed (`_count_in_reopened`): its first 429 ends it.
    _window_reopened: bool = attrs.field(init=False, default=False, repr=False)
    # What the log it began holds from before (`_count_in_reopened`): the next booking
    # waits until it is held, and the first to come holds it.
    _to_hold: list[tuple[float, float]] | None = attrs.field(init=False, default=None, repr=False)
    _held: trio.Event | None = attrs.field(init=False, default=None, repr=False)
    _cap: LearnedCap = attrs.field(init=False, factory=LearnedCap, repr=False)
    # Set (and replaced) each time a learned rate rises (`rate_rising`).
    _rose: trio.Event = attrs.field(init=False, factory=trio.Event, repr=False)
    # The last moments of the calls waiting for it to rise (`pressing`).
    _pressed: list[float] = attrs.field(init=False, factory=list, repr=False)
    # When the refused requests were sent that are taken in already: told of as they
    # arrived (`on_throttled`), or 503s that showed a cap, not the rate (`_slots`).
    # Each is listed until the runner tells of it; a 503 without a wait never is, so
    # only the latest few are kept.
    _refusals_taken: collections.deque[float] = attrs.field(
        init=False, factory=lambda: collections.deque(maxlen=64), repr=False
    )
    # When the requests were sent whose 429s learning spent (three at most, `probed`).
    _spent_on: list[float] = attrs.field(init=False, factory=list, repr=False)
    # The trio.run its times were read in (`note_run`).
    _seen: RunSeen = attrs.field(init=False, factory=RunSeen, repr=False)

    if TYPE_CHECKING:
        name: str

    @property
    def told_limit(self) -> float | None:
        """The limit a server states for what this scope was told (a bucket's burst, a
        window's limit), or None when told no rate: what `scopes_stated` matches."""
        if self.rate is None and self.limit is None:
            return None
        return self.limit if self.limit is not None else self._initial_burst()

    def _initial_burst(self) -> float:
        return self.burst if self.burst is not None else max(1.0, self.rate or 1.0)

    def _told_window(self) -> float | None:
        """Check ``limit``/``per`` and read them as the rate and burst; the window, if told.

        Called by each scope kind before it builds its backend, so that the
        backend starts with a sliding log.
        """
        if self.limit is None and self.per is None:
            return None
        if self.limit is None or self.per is None:
            raise ConfigurationError("a window is told with both limit= and per= (N per W seconds)")
        if self.rate is not None or self.burst is not None:
            raise ConfigurationError(
                "tell a scope rate=/burst= (a token bucket) or limit=/per= (a window), not both"
            )
        if self.window == "bucket":
            raise ConfigurationError('limit=/per= is a window; window="bucket" contradicts it')
        self.rate, self.burst = self.limit / self.per, float(self.limit)
        return self.per

    def _build(self) -> None:
        """Build the backend from the settings told and start the front on it: each scope
        kind's own, called as it is made (after `_told_window`) and in a new trio.run."""
        raise NotImplementedError

    def note_run(self, run: object) -> None:
        """Make the scope afresh if ``run``, the trio.run going on (`fanout._trio_runs`),
        is a later one than its times were read in.

        Nearly every part of a scope keeps times on trio's clock (buckets, logs,
        holds, answers seen, learners), and a new run's clock starts elsewhere.
        The scope is made again from the settings told, as if just built (the
        rate and burst a window was read as are those it was built with):
        what was learned and counted starts over. A scope shared by runners
        is made afresh once, by the first of them to run a turn.
        """
        if self._seen.moved_to(run):
            for field in attrs.fields(ScopeFront):
                if not field.init and field.default is not attrs.NOTHING:
                    setattr(self, field.name, _default_of(field, self))
            self._build()
        self.retry_budget.note_run(run)

    def _start_front(self, backend: Backend) -> None:
        """Called by each scope kind once its backend exists."""
        check_name(self.name)
        self._backend = backend
        self._limits = (self.rate, self._initial_burst())
        self._window_length = self.per
        if self.slack is not None:
            backend.set_slack(self.slack)
        if self.rate is None and self.learn:
            told = self.max_concurrency
            width = _BLIND_PROBE_WIDTH if told is None else min(told, _PROBE_WIDTH)
            self._learner = RateLearner(probe_fills_cap=width == self.max_concurrency)
            self._probe = Probe(width=width)
            if told is None:  # the probe goes at once; past it, one at a time (`_slots`)
                self._cap.try_past(width)

    # -- admission --------------------------------------------------------

    def has_free_slot(self) -> bool:
        """Whether ``acquire_slot`` would return at once (False when only asking could tell)."""
        return self._probe.is_open() and self._backend.has_free_slot()

    def shed(self, budget: Budget) -> float | None:
        """The drain estimate if a new call must be answered now instead of queueing.

        A call is shed when the queue ahead cannot drain within its budget
        (the budget judges the estimate, with the latency seen here), or when
        the user's ``max_waiters`` bound is reached. Otherwise None.
        """
        if self.queue_full():
            self._ledger.shed += 1
            return self.drain_estimate()
        estimate = self._estimate(guess=False)
        if budget.judge(estimate, latency=self._ledger.latency) is not Verdict.SLEEP:
            self._ledger.shed += 1
            return estimate
        return None

    def queue_full(self) -> bool:
        """Whether the user's ``max_waiters`` bound is what sheds calls now."""
        return self.max_waiters is not None and self._ledger.waiting >= self.max_waiters

    def drain_estimate(self) -> float:
        """How long the calls already here need before a new one would start.

        Calls holding tokens are in the bucket's schedule already; calls
        still queued for the probe or a slot will each need a token more.
        """
        return self._estimate(guess=True)

    def _estimate(self, *, guess: bool) -> float:
        """``guess``: a hint may use a guessed rate; a decision to shed may not."""
        rate, burst = self._limits
        # A decision to shed is never taken on a rate that may still rise (`rate_rising`).
        rising = not guess and self.rate_rising() is not None
        queued = max(0.0, self._ledger.waiting - self._ledger.booked)
        if rate is not None and self._window_length is not None:
            # A window gives its tokens back a whole limit at a time: the queued calls
            # take what the log has, then ``burst`` more every window.
            windows, within = divmod(queued, burst)
            by_rate = self._backend.estimated_wait(within + 1.0) + windows * self._window_length
        else:
            by_rate = 0.0 if rising else self._backend.estimated_wait(1.0)
            if rate is not None and not rising and (guess or self._rate_is_evidence()):
                # Calls queued for a slot take the tokens at hand first; the rest wait on the rate.
                spare = max(0.0, self._backend.bucket_statistics().tokens - 1.0)
                by_rate += max(0.0, queued - spare) / rate
        return max(self._ledger.slots_estimate(self.concurrency_cap(), guess=guess), by_rate)

    def concurrency_cap(self) -> int | None:
        """The calls let in at once: the configured cap, or a lower one 503s showed (`_slots`)."""
        learned = self._cap.limit
        if learned is None:
            return self.max_concurrency
        return learned if self.max_concurrency is None else min(learned, self.max_concurrency)

    def _rate_is_evidence(self) -> bool:
        """Whether the rate was configured, stated by the server, or measured (not guessed)."""
        learner = self._learner
        return learner is None or learner.ceiling is not None or learner.measured is not None

    def note_waiting(self, delta: int) -> None:
        """Count a call that sleeps on its booked tokens, so shedding sees the whole queue."""
        self._ledger.waiting += delta
        self._ledger.booked += delta

    async def acquire_slot(self, holder: SlotHolder, deadline: float) -> bool:
        """Take a slot for ``holder``, or return False once ``deadline`` passes.

        A free slot is taken even when no time is left to wait for one.
        """
        if not await self._pass_probe(holder, deadline):
            return False
        got = False
        self._ledger.waiting += 1
        try:
            got = await self._backend.acquire_slot(holder, deadline)
        finally:
            self._ledger.waiting -= 1
            if got:
                self._ledger.in_flight += 1
            else:
                self._probe.abandoned(holder)
                self._probe.step_done()
        return got

    async def _pass_probe(self, holder: SlotHolder, deadline: float) -> bool:
        if self._probe.is_open():
            return await self._probe.wait_turn(holder, deadline)
        self._ledger.waiting += 1
        try:
            return await self._probe.wait_turn(holder, deadline)
        finally:
            self._ledger.waiting -= 1

    async def release_slot(self, holder: SlotHolder) -> None:
        """Give the slot back; safe to call from a ``finally`` under cancellation."""
        self._probe.abandoned(holder)
        self._probe.step_done()
        self._ledger.in_flight -= 1
        await self._backend.release_slot(holder)

    # -- tokens ------------------------------------------------------------

    def check_cost(self, cost: float) -> None:
        """A cost must be positive, finite, and fit the burst when the rate is known."""
        if isinstance(cost, bool) or not (cost > 0 and math.isfinite(cost)):
            raise ConfigurationError(f"a call's cost must be a positive number, not {cost!r}")
        rate, burst = self._limits
        if rate is not None and cost > burst:
            raise ConfigurationError(
                f"a call costing {cost:g} tokens can never start on scope {self.name!r}, "
                f"whose burst is {burst:g}"
            )

    async def reserve(self, cost: float, max_wait: float) -> Booking | None:
        """Book ``cost`` tokens; the booking (with its wait), or None (nothing consumed)."""
        self.check_cost(cost)
        if self._held is not None:
            await self._hold_before_booking(self._held)
        try:
            booking = await self._backend.reserve(cost, max(0.0, max_wait))
        finally:
            self._probe.step_done()
        if booking is not None:
            self._outgoing.booked(booking.start, cost)
            if booking.burst_began is not None:
                self._burst = (booking.burst_began, math.inf)  # its first answer is to come
                self._burst_on_time = False
                self._wire.new_burst()
                self._lags.new_burst()
        return booking

    async def refund(self, booking: Booking) -> None:
        """Hand back a booking whose call gave up before starting."""
        self._outgoing.unbooked(booking.starts, booking.cost)
        await self._backend.refund(booking)

    async def confirm(self, booking: Booking) -> bool:
        """Whether a booking still holds now it is due (nothing voided it meanwhile).

        A shared schedule may have moved it (`RedisBackend.confirm`): the
        start remembered for counting what started since a response's
        request is when it is confirmed, not when it was booked for.
        """
        starts = await self._backend.confirm(booking)
        if starts is None:
            return False
        now = trio.current_time()
        self._outgoing.moved(booking.starts, now, booking.cost)  # as its holder slept for it
        if booking.took_full:
            while self._took_full and self._took_full[0][0] < now - _TOOK_FULL_FOR:
                self._took_full.popleft()  # their calls never sent (or no trace told)
            # Late only past when it starts, as a shared schedule that moved it held it
            # (`RedisBackend.confirm`). Taken from where it was first booked, a shared
            # bucket of one owed a whole token for every request, and moved its
            # schedule a token later each time (2.9 times the minimum at 30/s).
            self._took_full.append((now, starts, booking.cost, booking.pause))
        return True

    def headers_left(self, admitted_at: float) -> None:
        """The first request of a call admitted at ``admitted_at`` is leaving now.

        If its token emptied a full bucket (`TokenBucket.reserve`), the
        server's bucket stayed full until this request reached it, and lost
        the refill meanwhile. Where a burst begins, the slack is the margin
        the schedule kept for that; a request later than that (a new
        connection's handshake, a busy process) owes the rest, up to its own
        cost (later still, the booking after it took the server's full
        bucket first), and what is booked after it books again. Against a
        burst of one at 20/s in real time, a request that opened a
        connection reached the server 3 ms late, the next one over a warm
        connection came 50 ms after it by the client's clock, 49.5 by the
        server's: a 429 and a second's wait.

        A booking that took the bucket just as it filled again (a burst of
        one, paced) owes all of its lateness: the slack kept after it
        (``pause``) is for what no one here sees, the way to the server and
        the server's own delay in reading it. Taken as an allowance for
        leaving late, a request 3 ms late and 3 ms slower on its way in was
        followed by one on time a token after it, and a 429 (in real time,
        5 of 35 told runs against 20/s).
        A scope that learns its rate owes nothing: its bucket is a guess
        (a guessed burst of one, and calls held under a learned cap, would
        owe tokens the server never had).
        """
        rate, burst = self._limits
        if rate is not None:  # a told bucket's departure gate owes what it lost too
            self._gate.left_late(admitted_at, trio.current_time(), rate, burst)
        self._quickest_way_out = min(self._quickest_way_out, trio.current_time() - admitted_at)
        found = None
        self._leaving_pause = 0.0
        while self._took_full and self._took_full[0][0] <= admitted_at:
            found = self._took_full.popleft()  # earlier ones' calls never sent
        if found is None or rate is None or self._learner is not None:
            return
        _, start, cost, pause = found
        self._leaving_pause = pause
        allowed = 0.0 if pause else self._margin()
        late = trio.current_time() - start - allowed
        if late > 0.0:
            self._backend.owe(min(late * rate, cost))

    def admission_lead(self) -> float:
        """How much before its token's time a call waiting for one may be let start: the
        quickest any call's first request got to its headers after its admission.

        The server counts a request when it arrives, not when its call starts.
        A call admitted at its token's time reaches the wire that much later,
        and where the bucket was full meanwhile (paced, a burst of one) the
        server lost that refill: the request owes it (`headers_left`), and the
        next token comes that much later. Every interval paid the call's way
        out again: tools that set up for 0.1 s before sending held a bucket of
        one at 10/s to one request every 0.2 s (2.0x the fastest, in real time
        as on a mock clock; 1.14x started ahead). A call let start that much
        earlier reaches the wire at its token's time; the next token still
        counts from when it really left. One quicker than the quickest so far
        leaves before its token as far as the gates that count requests as
        they leave allow (`_departure_wait`, `wire_wait`): a token after the
        request before it, without the slack a full bucket keeps, once (it is
        the quickest then). So only a told bucket counted on the wire, once a
        warm answer is in (before it, requests over reused connections are held
        for a worst case reckoned from the bucket's schedule, `warm_hold`), and
        a told window that counts requests as they leave (`window_wait`): each
        window waited out the tools' set-up, and 200 calls against 20 a second
        whose tools set up for 0.1 s took 1.12x the fastest in real time. Its
        log keeps the booking where it was made, the call knows it by when it
        was due (`CallContext.booked_by`), and its request leaves no sooner
        (`SlidingLog.departure_wait`).

        Nothing while the bucket is blocked (a 429's wait): those gates count
        tokens, not the server's wait, and a call woken inside the block is
        refused there (`TokenBucket.confirm`). It booked again for the same
        start, found no wait left before its lead, and was refused again at
        once: on a mock clock, forever.
        """
        quickest = self._quickest_way_out
        if self._window_sees_departures():
            # Only the tools' own set-up: the HTTP stack's half a ms on its way to the
            # headers is what this process varies by. Given that too, a log of one per
            # 50 ms drew a 429 in 1 of 10 real-time runs, none in 10 before. And only a
            # set-up of some ms: led by the microseconds a tool takes to hand its request
            # on, each request waited as long at its window's gate, counted as on its way
            # meanwhile, and every booking due then was refused and booked again (hostile
            # tools against 10 per 50 ms: 165 of 300 calls ok on average, 185 before).
            quickest = self._quickest_set_up if self._quickest_set_up > TOGETHER else 0.0
        elif not self._wire_counts() or self._lags.warm_fastest is None:
            return 0.0
        if not math.isfinite(quickest) or self._backend.blocked_until() > trio.current_time():
            return 0.0
        return max(0.0, quickest)

    def request_delayed(self, booked_by: float, *, first: bool = True) -> None:
        """A request whose token was due by ``booked_by`` (its call's admission, or later
        for a call let start ahead of it, for its ``first``) is on its way but not out
        yet (opening a connection, or held): a log that counts in windows holds its
        token until a window after it leaves (`SlidingLog.delayed`). A call's later
        requests only in a told window (`_window_sees_departures`)."""
        if self._counts_in_window(first=first):
            self._backend.delayed(booked_by)

    def request_left(self, booked_by: float, *, first: bool = True) -> None:
        """A request whose token was due by ``booked_by`` left now, after its
        connection's set-up or a hold (`warm_hold`): a log that counts in windows holds
        its token a window from now if that is later than its slack allowed
        (`SlidingLog.left`), and a told window counts it among the requests that left
        (`window_wait`). A bucket owes for a late request at `headers_left`."""
        if self._counts_in_window(first=first):
            self._backend.left(booked_by, anew=self.per is not None)

    def _counts_in_window(self, *, first: bool) -> bool:
        """Whether a request's way out is counted in a window: any window's of a call's
        first request; a told window's of a later one too. Left out, a tool's second
        request, which leaves as it is charged, was no departure a told window saw,
        and a call that set up for 0.3 s went 48 ms after it, against one per 0.1 s:
        a 429. (A learned window, which never waits as requests leave, counts them
        as before.)"""
        return self._window_length is not None and (first or self.per is not None)

    def wire_wait(self) -> float:
        """How long a request whose headers are leaving now waits for the told bucket's
        token, counted as the server counts it: by when requests really reached the
        wire (`wire_left`), whatever order they passed the gate in.

        The gate (`_departure_wait`) counts a request as it reaches the HTTP
        layer, before its connection is opened; one that then took 0.3 s to
        open a connection was overtaken by a request a token after it over a
        warm one, and reached a bucket of one that the other had just
        emptied: a 429. Requests that leave in the order and spacing the gate
        gave them never wait here.

        One that does waits the slack after its token too, up to ``TOGETHER``: the
        margin the bookings keep for how late the server reads a request, which a
        request paced here would leave without. Where the wire's count owed more
        than the bookings (a new connection's request, taken as read up to
        ``TOGETHER`` late, `_new_connection_read_late`), every later request
        waited here and left exactly a token after the one before; against a
        bucket of one at 20/s, in real time, one the server read 0.8 ms late over
        an open connection was followed inside its token, in 6 of 40 runs.
        """
        if not self._wire_counts():
            return 0.0
        rate, burst = self._limits
        assert rate is not None
        wait = self._wire.short_by(trio.current_time(), rate, burst)
        return wait + min(self._margin(), TOGETHER) if wait > 0.0 else 0.0

    def wire_left(self) -> float:
        """A request's headers leave now, its wait for the wire over (`wire_wait`): its
        token is taken; the tokens it found, for `wire_written`."""
        if not self._wire_counts():
            return 0.0
        rate, burst = self._limits
        assert rate is not None
        began = None if self._burst is None else self._burst[0]
        return self._wire.take(trio.current_time(), rate, burst, began)

    def wire_written(
        self, found: float, late: float, *, booked_by: float, opened: bool = False,
        connecting: float = math.inf,
    ) -> None:  # fmt: skip
        """The request whose token was due by ``booked_by``, and which found
        ``found`` tokens on the wire (`wire_left`), had its headers written ``late``
        seconds after it took its token there.

        Normally a fraction of a millisecond (the write gives other tasks a
        turn); a pause of the whole process (a full garbage collection) in
        between sends it that much later. A bucket full as it took its token
        stays full until the request arrives, and loses that refill: in real
        time, against a bucket of one at 20/s, a request whose headers took
        34 ms to write reached the server 34 ms late, and the next one, 75 ms
        after it by the client's clock, 41 ms after it by the server's: a 429.
        A told window counts it from now (`SlidingLog.written`).

        ``opened``: it opened a connection. Once a warm answer has shown how much
        later than it left on the wire a burst over new connections was read
        (`WireCount.owe_late_arrival`; a handshake the client waits out is no part of it),
        such a request is taken as read that much later still, and owes what a
        full bucket loses meanwhile; the slack keeps none of it
        (`Lags.margin`), since requests over connections already open are read
        as they leave. Kept in the slack, a server reading new connections 100 ms
        late held a bucket of one at 20/s 100 ms after every request, over
        connections long open: 3.1x the fastest.
        """
        now = trio.current_time()
        if opened:
            self._outgoing.opened(connecting, now, booked_by)
        if self._window_sees_departures():
            read_late = max(0.0, connecting + self._window_read_late() - now) if opened else 0.0
            self._backend.written(booked_by, late, read_late=read_late)
        if not self._wire_counts():
            return
        rate, burst = self._limits
        assert rate is not None
        if opened:
            late += self._new_connection_read_late()
        self._wire.written(found, late, rate, burst)

    def _new_connection_read_late(self) -> float:
        """How much later than a warm one the server reads a new connection's first request,
        whichever is more: as a burst's showed it (`WireCount.owe_late_arrival`), or as the
        quickest round trips over each show it, less the quickest connection's own
        set-up, which the request waited out before it left, and ``TOGETHER`` more.

        A burst's earliest answer shows it only where no request of the burst went
        over a reused connection (`WireCount.owe_late_arrival`): a bucket of one at 40/s, each
        second's requests a mix of the two, whose server read new connections 1 ms
        late, drew a 429 after every second's wait (twelve in 40 calls, 12.7x).

        The few ms are how unevenly a server may take in new connections, which no
        round trip shows before it happens (`Arrivals.latest_read`), and before any
        answer nothing else is known. A bucket of one at 20/s whose server read new
        connections 0-3 ms late drew a 429 from the second request, a token after
        the first, in 40 of 40 seeded turns on a mock clock; taken with how much the
        warm answers varied instead (none), one read 0.8 ms late after the first
        answers drew one from the request after it."""
        set_up = self._arrivals.measured_set_up
        connect = self._network_trip if math.isfinite(self._network_trip) else 0.0
        return max(self._wire.read_late, max(0.0, set_up - connect) + TOGETHER)

    def _window_read_late(self) -> float:
        """How much later than its connection began to open a told window's server may read
        a request over a new connection: the quickest such round trip, from then, less
        the quickest over one already open, and how much such trips vary, up to a few ms
        (`Arrivals.latest_read`); nothing before any. (Without the few ms, in real time,
        a request read 2 ms later than the quickest went a window ahead of the next: a
        429. Taken as the slowest trip, the time a request was held after its connection
        opened was taken for a late read, and held the next ones longer: 1.5-8.4x.)

        Before any answer over an open connection, that is the whole of the quickest
        round trip over a new one: a request over an open one, read at once, may
        overtake it. Against a sliding log of one per 50 ms that read each new
        connection's first request 100 ms late, the first request over a reused
        connection reached it with one sent 50 ms before over a new one: a 429, and
        a second's wait.
        """
        read = self._arrivals.latest_read
        return max(0.0, read) if math.isfinite(read) else 0.0

    def _hold_cold_unanswered(self, now: float) -> None:
        """Hold each request over a new connection not answered yet for how late its server
        may read it, as an answer now says (`_window_read_late`): one that left before any
        answer came was held for nothing. Against a fixed window of 2 per 0.1 s that read
        new connections 100 ms late, in real time, two such requests went before any
        answer, the first answer showed a round trip of 150 ms, and a request over a
        reused connection went a window after them, into the window the server counted
        them in: a 429."""
        read_late = self._window_read_late()
        for cold in self._outgoing.cold_unanswered(now):
            if cold.began + read_late > now:
                self._backend.written(cold.due, 0.0, read_late=cold.began + read_late - now)

    def _wire_counts(self) -> bool:
        """Whether the told bucket is counted by when requests reach the wire
        (`wire_wait`): as the departure gate, a told local token bucket."""
        rate, _ = self._limits
        return rate is not None and self._window_length is None and self._counts_departures()

    def window_wait(self, booked_by: float) -> float:
        """How long a request whose token was due by ``booked_by`` (`request_delayed`),
        leaving now, waits for a told window's token, counted by when this process's
        requests left (`SlidingLog.departure_wait`): as a told bucket's wait as it leaves
        (`_departure_wait`), and for the same reason, a tool's own set-up. A learned
        window is a guess; a shared one waits only while its backend counts here
        (`RedisBackend.departure_wait`): other processes' requests are not seen leaving."""
        if self.per is None:
            return 0.0
        return self._backend.departure_wait(booked_by)

    def observe_wake_lag(self, seconds: float) -> None:
        """A booking that took a full bucket was confirmed ``seconds`` after the sleep for
        it was to end (its start, unless its call was let start ahead of it,
        `admission_lead`, or slept for another scope's later token: measured from
        its own start, a bucket of one at 10/s beside one at 1/s took 0.9 s for
        lateness, and paused that long after every token).

        The server's bucket stays full until that request arrives, and loses
        its refill meanwhile. A call's own way from admission to the wire is
        its send lag (`observe_send_lag`); this is the part before it, the
        process waking the call late (a busy loop wakes sleepers a ms or two
        after their time). Paced against a burst of one at 50/s in real time,
        requests woke 0.9-2.3 ms late, and every one that woke early after
        one that woke late drew a 429 and a second's wait. Not while learning:
        that bucket's burst is a guess, and pausing after each of its guessed
        fills slowed learning from bare 429s (1.02-1.08x to 1.04-1.80x).
        """
        if self.slack is not None or self._learner is not None or not (0.0 < seconds < _MAX_LAG):
            return
        if self._lags.woke(seconds):
            self._backend.set_slack(self._measured_slack())

    def voided(self) -> trio.Event | None:
        """An event set when bookings made until now are void, or None if this
        process cannot tell (a shared bucket): a waiter wakes early to book again."""
        return self._backend.voided()

    def retimed(self, booking: Booking) -> Booking:
        """``booking`` as it stands now, moved later with the schedule since it was made
        (what the server lost to a late request, `headers_left`): its holder sleeps on
        until then (`fanout._admission.take_tokens`), and ``confirm`` refuses it before.

        The start remembered for counting what started since a response's request
        moves with it: left where it was booked, a booking moved past an answer's
        sending counted as started in the server's count and not started in the
        bucket, which read that as more tokens than the server could have, and
        voided every booking ahead.
        """
        moved = self._backend.retimed(booking)
        if moved is not booking:
            self._outgoing.moved(booking.starts, moved.starts, booking.cost)
        return moved

    async def wait_for(self, cost: float) -> float:
        """Seconds until ``cost`` tokens would be available, consuming nothing."""
        self.check_cost(cost)
        return await self._backend.wait_for(cost)

    async def _count_others(self) -> None:
        """Count what other processes sharing the bucket started, as if started here.

        The server's ``Remaining`` was drawn down by every sharer's requests:
        counting only its own, a learning process took the others' for a
        slower refill (under 1/s against a 20/s server) and booked the shared
        schedule at that pace for everyone.
        """
        self._outgoing.others_started(await self._backend.others_started())

    def _proven(self) -> float | None:
        """The rate the server's refill was shown to reach, when learning from its
        counts (`ServerCount.refilled_at_least`), never above the rate used.

        None after a 429 (the learner's numbers are being corrected), and once
        the server said nothing remains: a window spent refills all at once,
        and a refill bound measured across its reset proves no refill between
        two counts within the next one (raised by it, a scope drew a 429 from
        fixed windows and sliding logs it had not yet learned). Unless the
        server has since admitted more than a window would (`WindowWatch.could_be_windows`):
        then it refills as a bucket does, and a jittered answer that found it
        a hair short of a token (Remaining 0, where the bucket held a fraction)
        no longer keeps the probe's round trip from being made up (which cost
        a call of the 2 s deadline row in real time).
        """
        learner = self._learner
        if learner is None or learner.refusals:
            return None
        rate, burst = self._limits
        if learner.measured is None or rate is None:
            return None
        now = trio.current_time()
        if self._emptied and self._windows.could_be_windows(now, rate, burst, self._outgoing):
            return None
        return min(rate, learner.measured)

    def _crossing(self, sent: float, late: float) -> float:
        """What may have reached the server after the request sent at ``sent``: what
        started up to ``late`` s before it, or together with it (in either order),
        what took its tokens before that and has not left yet, and what left over a
        new connection before that and may have been read late (`Outgoing.cold_behind`)."""
        since = sent - max(late, TOGETHER)
        within = self._outgoing.sent_within(since, sent + TOGETHER)
        # Or, where the HTTP layer tells, as many as left together with it, if more
        # (calls booked before it whose requests left with it: `Outgoing.started_between`).
        left = self._outgoing.left_within(sent - TOGETHER, sent + TOGETHER)
        # Calls held at the wire (under a learned cap, or past the most proven there,
        # `fanout._slots`) will reach the server on tokens they took before: left
        # out, a 503's count of 8 raised the bucket to 6 while 2 such waited, and
        # the ninth request after it drew a 429.
        held = self._outgoing.parked_by(math.nextafter(since, -math.inf))
        cold = self._outgoing.cold_behind(sent, sent - since, self._arrivals.set_up)
        return max(0.0, within - 1.0, left - 1.0) + held + cold  # itself aside

    # -- what the server told us -----------------------------------------

    async def request_leaving(
        self, admitted_at: float = -math.inf, on_wait: Callable[[float], None] | None = None
    ) -> Leaving:
        """A request of this scope is about to be sent: wait for a told bucket's token as
        it leaves (`_departure_wait`; ``on_wait`` hears of the wait first, and raises to
        send nothing, the token given back), and while a cap 503s showed is full
        (`_slots`), then count it on the wire; how many others were.
        ``admitted_at``: when its call took its token (`Outgoing.parked`)."""
        first = self._outgoing.set_up(admitted_at)  # its call's first request (`attempt_began`)
        with self._outgoing.parked(admitted_at):
            wait = self._departure_wait(admitted_at)
            if wait > 0:
                try:
                    if on_wait is not None:
                        on_wait(wait)  # which may refuse it (raise)
                    await trio.sleep(wait)
                except BaseException:
                    self._gate.give_back()
                    raise
            leaving = await self._cap.sending()
        if leaving.overruled:  # it does not leave on this place (`request_back`)
            # It books again, and its first booking is no start the server saw: left
            # counted beside the second, the refill measured across the 429 that
            # overruled it counted one admission too many (6.19/s proven against 6/s,
            # a cap of 4 nobody told, on a clock that ticks).
            self._outgoing.forget_start(admitted_at)
            return leaving
        now = trio.current_time()
        if (leaving.under_cap or first) and now > admitted_at + TOGETHER:
            self._outgoing.sent_late(admitted_at, now)
        if self._learner is not None:  # only learning reads when requests left
            self._outgoing.left(now)
        return leaving

    def _departure_wait(self, admitted_at: float) -> float:
        """How long a request leaving now must wait for the told bucket to have a token,
        counted by when this process's requests leave rather than when their calls
        were admitted; the token is taken.

        The bucket books a call's first token at its admission, and the server
        counts it when the request arrives. A tool that sets up for a while
        before sending reorders the two: a burst whose tools took 0.3 s left
        the server's bucket full until then, a call admitted at its token at
        0.2 s went first, and the burst found 1.5 tokens for its two
        requests: a 429, and a second's wait. Counted as they leave, the
        burst's second request waits 0.1 s here instead. Requests that leave
        as they were admitted never wait here: the bucket already spaced
        them, and kept the slack. One that does wait keeps the spread of the
        requests' way out (`observe_write_lag`), not the whole slack: that
        is mostly the set-up that reordered them.

        Only for a told token bucket: a window counts otherwise, and a
        learned rate is a guess. Requests sent through another client are
        not seen, and take nothing here.
        """
        rate, burst = self._limits
        if rate is None or self._learner is not None or self._window_length is not None:
            return 0.0
        now = trio.current_time()
        counted = self._wire_counts() or self._window_sees_departures()
        spread = self._lags.way_out_spread(counted=counted)
        return self._gate.take(admitted_at, now, rate, burst, spread)

    def attempt_began(self, admitted_at: float) -> None:
        """A call admitted at ``admitted_at`` runs its tool: until its first request
        reaches the HTTP layer (`request_leaving`), its token is taken and the server
        has not counted it. A count read meanwhile leaves it out (`Outgoing.parked_by`): read
        as the server's own, a sibling's ``Remaining`` raised a told 5/s bucket a token
        over it while a tool's set-up held its request back 70 ms, and drew a 429.
        Kept sorted: thousands of calls may be setting up at once."""
        self._outgoing.setting_up(admitted_at)

    def attempt_ended(self, admitted_at: float) -> None:
        """The attempt `attempt_began` told of is over without sending a request through
        the HTTP layer: it is counted no longer."""
        self._outgoing.set_up(admitted_at)

    def request_back(self, *, sent: bool = True) -> None:
        """A request's answer is in, or it failed: it is off the wire. Not ``sent``: it
        waited for its place and may not use it (`Leaving.overruled`); no answer."""
        if sent:
            self._cap.answered()
        else:
            self._cap.hand_on()

    def _reset_read(self, info: RateLimitInfo) -> RateLimitInfo:
        """``info``, its reset read as late as the server may mean it.

        A reset in whole seconds (a relative one, an epoch, an RFC 3339 time) is
        taken as rounded up, as most servers round it: the window's place is back
        by then. Some round it down (Go's ``time.RFC3339``, ``int(epoch)``), up to a
        second before the place is back; once a scope has seen that, by a reset of
        0 with nothing left (`_rounded_up`) or by a 429 to a scope counting in
        windows, each of its whole-second resets is read a second later. Read as
        stated, a told window of 10 per 2 s whose reset was truncated sent a
        request at each reset and drew 5-10 429s, 1.3-1.6x the fastest. A server
        rounding up is read as before, however many answers it gives.
        """
        if info.reset_after is None or info.reset_exact:
            return info
        rounded = _rounded_up(info)
        if rounded is not info:
            self._resets_floored = True  # a reset of 0 with nothing left: rounded down
        if self._resets_floored and info.reset_after > 0 and self._window_length is not None:
            # A window's place is back only at its reset; a bucket's next token comes as
            # it refills, which its count says (read so, a bucket rounding to the nearest
            # second was learned a third slower).
            return attrs.evolve(info, reset_after=info.reset_after + 1.0)
        return rounded

    def _reset_lead(self, info: RateLimitInfo) -> float:
        """How much sooner than the log would a window's reset (read by `_reset_read`)
        must free a token to be taken (`ServerCount.reset_lead`).

        A reset in whole seconds not yet seen rounded down may be up to a second
        early. One request sent at it is a gamble: if it was rounded down, the
        server refuses it with a whole-second ``Retry-After`` that outlasts its
        window by what the rounding did not take off (sent at a truncated epoch's
        second, a request reached a window of 10 per 2 s 0.28 s before it ended
        and waited 0.72 s more: 1.09-1.19 times the fastest, one to four 429s);
        if rounded up, it frees the token that much sooner than the log (a
        window keyed by the clock, met partway: 1.05 times the fastest against
        1.26). Taken where the token comes back half a second sooner or more:
        where the gain, if rounded up, is more than the loss, if rounded down.
        """
        coarse = info.reset_after is not None and not info.reset_exact
        whole = coarse and not self._resets_floored and self._window_length is not None
        return _RESET_LEAD if whole else 0.0

    async def on_throttled(
        self, wait: float | None, *, sent_at: float | None = None, arriving: bool = False
    ) -> None:
        """A 429 (or 503 with a wait): no tokens now, nothing starts for ``wait`` s.

        ``sent_at`` is when the refused request was sent (default: now). A
        429 without a wait still drains the bucket and, when learning, slows
        the rate down (AIMD). A 429 inside a window that a response
        reported as exhausted waits for that window's end, and shows that the
        server counts in windows (module docstring): the scope turns to a
        sliding log. Given a rate it takes a second such 429: requests that
        reach a token bucket out of step, after a burst's slow first
        connection or with jitter, can draw a stray 429 there too.
        ``arriving``: the HTTP layer tells of the refusal as it arrives; the
        runner tells of it again later, and that telling changes nothing.
        A wait no server could mean is read as the runner reads one
        (`usable_wait`): an infinite one had crashed learning, which asks
        whether it is whole seconds.
        """
        now = trio.current_time()
        wait = usable_wait(wait)
        blocked_for = wait if wait is not None else 0.0
        sent = now if sent_at is None or not sent_at <= now else sent_at
        if self._window_length is not None:
            self._resets_floored = True  # the reset it went by may have been rounded down
        if sent_at is not None and sent_at in self._refusals_taken:
            # Taken in already: as it arrived (`fanout._http_core`), the runner telling
            # of it again; or a 503 over the server's cap, not its rate (`_slots`),
            # whose tokens are still there and rate stays. Its call waits out the
            # server's wait; the others go on under the cap (blocked, every call
            # waited a second the server rounded up from 0.1 s, to go out 4 at a time
            # anyway). Each telling is matched with one taken, however many left at once.
            if not arriving:
                self._refusals_taken.remove(sent_at)
            await trio.lowlevel.checkpoint()
            return
        if arriving and sent_at is not None:
            self._refusals_taken.append(sent_at)
        rate, burst = self._limits
        if rate is not None:  # a window is reported spent only once the rate is known
            reopens, count_now = self._windows.refused(
                now, sent, wait, rate, burst, self._outgoing,
                # Learning, a request sent before any answer came was sent blind (a
                # probe as wide as a told cap): its 429 shows a burst smaller than the
                # probe, not a window. (A told scope sends no probe.)
                may_vote=self.window == "auto"
                and (self._learner is None or sent > self._first_answer_at),
                learning=self._learner is not None,
            )  # fmt: skip
            if reopens is not None:
                blocked_for = max(blocked_for, reopens - now)
            if count_now:
                self._count_in_windows()
        await self._backend.drain(blocked_for)
        self._cap.throttled()
        self._late_first_arrival()
        self._first_answer_at = min(self._first_answer_at, now)  # a tool's 429 has no headers
        if self._learner is not None:
            await self._learn_refused(self._learner, sent, now, wait, blocked_for)

    async def _learn_refused(
        self, learner: RateLearner, sent: float, now: float, wait: float | None,
        blocked_for: float,
    ) -> None:  # fmt: skip
        """What a 429 to a request sent at ``sent`` teaches learning (`on_throttled`): the
        server's ``wait`` (None: it gave none), which blocks the scope ``blocked_for``
        from ``now``."""
        await self._count_others()
        self._outgoing.refused(sent)
        if self._windows.trial is not None and wait is not None:
            self._windows.show_length(sent, now, wait, learner.burst, self._outgoing)
        unknown = self._limits[0] is None
        # What the server was sent in the last second: ours, and what the
        # processes sharing the bucket started (halved from ours alone, a
        # process of four cut a 20/s scope to 1.5/s and kept the shared
        # schedule at that pace for seconds). Ours are the calls admitted
        # or, where the HTTP layer tells, the requests that left, whichever
        # are more: calls admitted long before, held at the wire by a cap
        # (`_slots`), counted as nothing sent, and a 429 cut a stated 6.5/s
        # to the least rate, 0.1/s (a call answered 78 s on, two gave up).
        ours = max(self.retry_budget.recent_requests(1.0), self._outgoing.sent_lately())
        sending = ours + self._outgoing.others_since(now - 1.0)
        # Calls admitted by then that still wait for a place (`Outgoing.parked_by`) had not
        # reached the server: counted, the first 429 after a probe's 503 showed a cap
        # of one read 24 admitted, and guessed 24/s against 2/s.
        spent, learning = learner.spent, not learner.spent_refusals
        learner.on_throttled(
            float(sending), now=now, wait=None if wait is None else blocked_for, sent_at=sent,
            started=self._outgoing.sent_by(sent),
            pending=self._outgoing.out_before(sent, self._cap.on_the_wire),
            blind=sent <= self._first_answer_at,
        )  # fmt: skip
        if learning and learner.spent > spent:  # one of the three it may spend
            self._spent_on.append(sent)
        named = self._refused_reset
        if wait is None and named is not None and named[0] == sent and not learner.refilled:
            # Its counts named no wait, but when the quota returns (`observe_headers`):
            # unless a bucket of the limit they state explains the answers, and refills
            # sooner, nothing goes before then. Sent at once at a guessed rate, a log of
            # 18 per 1.45 s refused the next, and a bucket at under 1/s fitted the two:
            # 13.5 times the fastest.
            blocked_for = max(blocked_for, named[1] - now)
            await self._backend.block_until(named[1])
        if self._window_reopened and learner.window is None:
            # Refused in a window a reopening showed: a bucket again, and empty.
            self._window_length, self._window_reopened = None, False
            self._backend.leave_window()
            await self._backend.drain(blocked_for)
        window = learner.trusted_window
        if window is not None and self._window_length is None:
            await self._count_in_learned_window(window.length, now, blocked_for)
            return
        stated = learner.policy_window
        if (
            stated is not None and self._counts_on_refusals_alone()
            and self._window_length is None
            and learner.policy_shows_window(sent, wait)
        ):  # fmt: skip
            # A policy stated on refusals alone (`observe_headers`): no admitted answer
            # will show a window (`_judge_window`), but a 429 may
            # (`RateLearner.policy_shows_window`), and the scope counts in the policy's
            # window from then, which keeps to a bucket too.
            await self._count_in_learned_window(stated, now, blocked_for)
            return
        closed = self._shut_until()
        if closed is not None:
            # Shut (`RateLearner.closed_until`): one request, once it may reopen.
            await self._backend.block_until(closed)
            self._apply_learned(tokens=1.0)
            return
        # A bucket with no rate had nothing to drain: the rate it gets now
        # starts from the empty bucket the 429 showed, not a full one.
        tokens = 0.0 if unknown else None
        rate = learner.rate
        if (
            rate is not None and blocked_for > 0 and self._window_length is None
            and not self._rate_is_evidence() and rate > learner.floor
        ):  # fmt: skip
            # A guessed rate may be many times the server's (a burst per rounded
            # Reset): refilled at it all through the wait, the bucket sent that
            # guess's worth at once when the wait ended, and most of it was
            # refused. Unproven, it holds at the wait's end (where the balance
            # is counted from, `TokenBucket.set_limits`) the one request the
            # server's wait promises.
            # A refill a stated burst showed (`RateLearner.refilled`) is there too.
            tokens = max(min(1.0, rate * blocked_for), learner.refilled * blocked_for)
        self._apply_learned(tokens=tokens)
        if self._window_length is not None and self._windows.trial is None:
            grown = self._windows.refused_in_window(self._window_length, self._limits[1])
            if grown is not None:
                self._count_in_windows(grown)

    def _late_first_arrival(self) -> None:
        """A 429 to a scope told its rate, before any warm call came back: the worst case.

        Told the server's limits, a scope that sends on its schedule is
        refused only if the server's refill runs behind it, and before a warm
        call shows how fast the server answers (`observe_call`), the burst's
        earliest answer may be all late first arrival (`warm_hold`). The
        refusal shows the worst case was the case: the slack takes it, so
        the requests after this one are not early too (a 48.6/s server
        that read new connections 145 ms late refused each request over a
        reused one, eight in a row, and a call gave up after three).
        """
        burst = self._burst
        if self._learner is not None or self.slack is not None:
            return
        if self._lags.warm_fastest is not None or burst is None or not math.isfinite(burst[1]):
            return
        if self._lags.assume(burst):
            self._backend.set_slack(self._measured_slack())

    async def _count_in_learned_window(self, length: float, now: float, wait: float) -> None:
        """A server that states nothing showed a window by its waits (`RateLearner.window`):
        count in it from the 429's ``wait`` on, with what started in the last window held
        as the server holds it.

        Left out, the new log sent its whole limit as the wait ended, and a
        sliding log, which frees a request's place only a window after it
        started, refused all but the first few. The block goes first: a shared
        log is a new one on Redis, which books at once until it holds them
        (four requests left inside the wait, and drew four 429s).
        """
        self._count_in_windows(length)
        self._apply_learned()
        await self._backend.block_until(now + wait)
        await self._backend.hold_started(self._started_in_last(length, now))

    def _started_in_last(self, length: float, now: float) -> list[tuple[float, float]]:
        """What started in the ``length`` seconds up to ``now``: what a new log must hold,
        as the server still counts it."""
        return self._outgoing.started_within(math.nextafter(now - length, math.inf), now)

    def _count_in_reopened(self) -> None:
        """Count in the window learning came to trust on an answer
        (`RateLearner._trust_reopened`), with what started in its length held as the
        server holds it.

        Its bookings are void (`use_window`), and each holder books again in
        the log; the first to come holds what started before it (phantoms, a
        trip to Redis on a shared log) and the rest wait for that, so none
        books into room those hold.
        """
        learner = self._learner
        if learner is None or self._window_length is not None:
            return
        window = learner.trusted_window
        if window is None:
            return
        now = trio.current_time()
        self._to_hold = self._started_in_last(window.length, now)
        self._held = trio.Event()
        self._count_in_windows(window.length)
        self._window_reopened = True
        self._apply_learned()

    async def _hold_before_booking(self, held: trio.Event) -> None:
        """Book only once the log holds what started before it (`_count_in_reopened`)."""
        starts, self._to_hold = self._to_hold, None
        if starts is None:
            await held.wait()
            return
        try:
            with trio.CancelScope(shield=True):  # held in part, the log would book into room
                await self._backend.hold_started(starts)
        finally:
            if self._held is held:  # not a later window's, counted in meanwhile
                self._held = None
            held.set()

    def _count_in_windows(self, length: float | None = None) -> None:
        """The server counts in windows: keep ``burst`` per the guessed window in a log."""
        if length is None:
            rate, burst = self._limits
            assert rate is not None  # a window is reported spent only once the rate is known
            length = self._windows.guess(rate, burst)
        self._window_length = length
        self._windows.counting()
        self._backend.use_window(self._window_length)

    def _judge_window(
        self, info: RateLimitInfo, sent: float, now: float, arrived_by: float
    ) -> None:
        """The answer to the request that tries a learned window (`WindowWatch.judge`):
        count in the window it shows, the log holding what went after the trial, or pace
        as a bucket again."""
        learner = self._learner
        assert learner is not None
        length = self._windows.judge(
            info, sent, now, arrived_by, learner.burst, learner.policy_window, self._outgoing
        )
        if length is None:
            self._apply_learned()
            return
        self._count_in_windows(length)
        # The new log holds what went after the trial, one at a time, while it
        # was answered; this answer's sync adds what the server had counted then.
        later = self._outgoing.started_between(sent, trio.current_time())
        self._apply_learned(tokens=learner.burst - later if later else None)

    async def block_until(self, when: float) -> None:
        """Start nothing before ``when`` (a window's reset)."""
        await self._backend.block_until(when)

    async def observe_headers(
        self,
        info: RateLimitInfo,
        *,
        sent_at: float | None = None,
        refused: bool = False,
        opened: bool | None = None,
        left_with: Leaving | None = None,
        overloaded: bool = False,
        booked_by: float | None = None,
        left_at: float | None = None,
        connecting: float | None = None,
    ) -> None:
        """Take in what a response said, read by what it can mean (module docstring).

        ``sent_at`` is when its request was sent (default: now); the server's
        count is as of then. ``refused``: the server turned the request away
        (a 429 or 503), at once, so its round trip says nothing of how long
        the server takes to answer one it admits. ``opened``: whether the
        request opened a connection (None: the transport cannot tell), so
        may have reached the server late (`fanout._window.Arrivals`).
        ``left_with``: how its request left (with how many others of the scope
        on the wire); ``overloaded``: the answer was a 503, which may show a cap
        (`_slots`), where an admitted one proves the server took that many.
        ``booked_by``: when its call's token was due, if it is the call's first
        request (a window's log holds that call's token from its arrival).
        ``left_at``: when its headers were written, if the transport said (a told
        window keeps how much round trips from then vary, `Lags.margin`).
        ``connecting``: when the connection it opened began to open (a server slow
        to take in a new connection reads its first request that much later than
        the connection began, whatever held the request after: `Arrivals`).
        """
        info = self._reset_read(info)
        now = trio.current_time()
        self._first_answer_at = min(self._first_answer_at, now)
        sent = now if sent_at is None or not sent_at <= now else sent_at
        if opened:  # it arrived
            self._outgoing.cold_answered(sent, connecting)
        overloaded_with = left_with if overloaded else None
        if left_with is not None and not refused:
            self._cap.proved(left_with)
        leaving = overloaded_with if self.learn else None
        # A 503 with no wait is the rate's while learning it (as a bare 429, once the
        # HTTP layer tells of it), whatever cap it also shows: nginx's limit_req and
        # ASP.NET Core refuse an over-rate request so by default. Left to the retries,
        # the slow start never ended (51 refused, 36 of 50 calls failed against 10/s);
        # read as a cap alone, such 503s lowered a cap of 9 one by one, each a refusal.
        # Otherwise it is taken in here, if at all: a cap it shows, never the rate.
        bare = overloaded_with is not None and info.retry_after is None
        # Under a cap already learned, it is the rate's; one that left before (of the
        # wave that showed the cap) is read against the cap, which takes the least
        # such wave shows: read as the rate's, the cap stayed at the first read (3,
        # against 2) and a call gave up after three 503s.
        rate_refused = (
            bare and self._learner is not None
            and overloaded_with is not None and overloaded_with.under_cap
        )  # fmt: skip
        cap_read = (
            not rate_refused
            and leaving is not None
            and self._cap.overloaded(leaving, now - sent, quickest=self._ledger.fastest())
        )
        rate_refused = rate_refused or (bare and not cap_read and self._learner is not None)
        forgotten = False
        if (cap_read or bare) and not rate_refused:
            self._refusals_taken.append(sent)
            if self._learner is not None:
                self._outgoing.refused(sent)  # no admission either, as a 429's is not
                forgotten = True
        if self._learner is not None:
            await self._count_others()
        # Its own token is left out of the count it states once, here or just above: left
        # out twice, the probe admitted beside a 503 over a cap of one counted as come
        # after a count it was in, and proved 3.9/s against 2/s.
        counted_at = self._counted_at(sent, now, info.remaining, refused=refused)
        if not refused:
            self._check_policy(info, sent, now)
        self._adopt_stated(info, counted_at, refused=refused and not forgotten)
        if not refused:
            if sent == sent_at:  # a round trip only where its start is known (and a time)
                self._ledger.observe_trip(now - sent)
            if left_at is not None and left_at <= now:
                self._ledger.observe_wire_trip(now - left_at, opened=opened is True)
            arrived_by = self._arrivals.arrived_by(sent, now, opened=opened, since=connecting)
            if self._window_sees_departures():
                self._hold_cold_unanswered(now)
            if self._window_length is not None:  # a log holds each token from its arrival
                await self._backend.answered(
                    sent, arrived_by, booked_by=booked_by, set_up=self._arrivals.set_up,
                    way=self._way_in(sent, now),
                )  # fmt: skip
            if self._windows.trial_due(sent) and info.remaining is not None:
                self._judge_window(info, sent, now, arrived_by)
        rate, _ = self._limits
        remaining, reset = info.remaining, info.reset_after
        self._emptied = self._emptied or (remaining is not None and remaining < 1)
        if not refused:
            self._counted_admitted = self._counted_admitted or remaining is not None
            self._admitted_bare = self._admitted_bare or remaining is None
        if remaining is not None and remaining < 1 and reset is not None:
            if rate is None or self.window == "fixed":
                await self._backend.block_until(now + reset)
                return
            # A window reported spent is tried by the first admitted answer after it
            # reopens (`_judge_window`). A server that states its counts on its refusals
            # alone never gives one: its window, reported by the very 429 that voted for
            # it, stayed on trial, one request at a time, for the rest of the turn. Its
            # reset is still when the quota returns: the wait of a 429 that names none.
            if self._window_length is None:  # a log already waits for its window
                if not self._counts_on_refusals_alone():
                    self._windows.reported_spent(now, reset, exact=info.reset_exact)
                elif refused and info.retry_after is None:
                    self._refused_reset = (sent, now + past_reset(reset))
        if remaining is not None and rate is not None:
            await self._sync_to_stated(info, rate, remaining, sent, counted_at, refused=refused)
        else:
            await trio.lowlevel.checkpoint()

    def _counts_on_refusals_alone(self) -> bool:
        """Whether a learning scope's server states its counts on its refusals alone: it
        admitted requests with no count, and never with one."""
        return self._learner is not None and self._admitted_bare and not self._counted_admitted

    async def _sync_to_stated(
        self, info: RateLimitInfo, rate: float, remaining: float, sent: float,
        counted_at: float, *, refused: bool,
    ) -> None:  # fmt: skip
        """Sync the bucket to the count an answer stated (``info``, whose ``remaining`` is
        read where the scope paces at ``rate``): as the server took it at ``counted_at``
        (`_counted_at`) for the request sent at ``sent``, less what surely took a token
        since, with what may have reached the server after it as unsure (`ServerCount`).
        """
        # As of now, when the bucket takes it in (what fell due meanwhile is in it).
        now = trio.current_time()
        late = self._arrival_spread()
        first = self._stated.counted_before(counted_at, remaining, rate, late)
        surely = max(0.0, self._outgoing.started_between(counted_at, now) - first)
        # Those that left within how much later one request may arrive than
        # another may have been counted first; their own answers will tell.
        soon = self._stated.may_have_overtaken(counted_at, now, remaining, rate, late)
        self._stated.add(counted_at, remaining, refused=refused)
        # Anything that started within the slowest latency seen before this
        # request was sent may have reached the server after it; before any
        # latency is known, what left with it (a probe two wide: each answer's
        # count, read as the other's too, let a fourth of three tokens out).
        # Fewer where the answers read already say so (`_counted_after_at_most`).
        as_answered = counted_at > sent
        before = max(self._ledger.slowest(), TOGETHER)
        if as_answered:
            # Counted as the server answered: what left before then had arrived, but
            # for how much later one may arrive than another. Within the slowest
            # latency, a told bucket synced under the server by the first answer of
            # a burst (read as of its arrival) was never lifted by the others.
            before = max(late, TOGETHER)
        unsure = min(
            self._counted_after_at_most(counted_at, before, remaining, late),
            # Those this count surely took are in it, not in the least of theirs.
            self._tied_shortfall(counted_at, before, remaining) + first,
        ) + self._outgoing.cold_behind(counted_at, before, self._arrivals.set_up)
        count = ServerCount(
            remaining,
            started_since=surely,
            # One of them is the request itself. Requests whose calls took their
            # tokens by then and still wait for a place under a learned cap will
            # reach the server too: left out, a count adopted while they waited
            # was spent twice (a fourth 429 against 8/s with a cap of 3).
            unsure=unsure + self._outgoing.parked_by(counted_at),
            elapsed=now - counted_at,
            # The request may have reached the server as late as the slowest
            # call here was slower than the fastest; a count taken as the server
            # answered, as late as the answer: no refill since is sure.
            late=max(late, now - counted_at) if as_answered else late,
            proven=self._proven(),
            crossing=self._crossing(counted_at, late),
            as_of=now,
            overtaking=min(surely, soon),
            limit=info.limit,
            reset_after=info.reset_after,
            reset_lead=self._reset_lead(info),
        )
        await self._backend.sync(count)

    def _counted_after_at_most(
        self, sent: float, before: float, remaining: float, late: float
    ) -> float:
        """How many of the requests sent up to ``before`` s ahead of the one sent at
        ``sent`` the server may have counted after it, as the answers read already allow
        (`StatedCounts.counted_after_at_most`), where they can be matched to requests.

        They are matched by when requests left, which only a learning scope keeps
        (`request_leaving`), and not where counts are kept by when they were taken
        (`_counted_at`). And only until the server first refuses or says none is
        left: a window frees places between two counts as no refill does (a sliding
        log lets go at once of a burst sent a window before), and read so after the
        first 429, a log of 23 per 3 s drew six.
        """
        rate, learner = self._limits[0], self._learner
        unmatched = learner is None or learner.refusals or self._counts_on_answer
        matched_at = None if unmatched or self._emptied else rate
        return self._stated.counted_after_at_most(sent, before, remaining, late, matched_at)

    def _tied_shortfall(self, sent: float, before: float, remaining: float) -> float:
        """How far below ``remaining`` the server's count can be, once every request sent
        up to ``before`` s ahead of the one sent at ``sent`` is answered
        (`StatedCounts.tied_shortfall`); inf where answers are not matched to when
        their requests left (`_counted_after_at_most`)."""
        if self._learner is None or self._counts_on_answer:
            return math.inf
        return self._stated.tied_shortfall(sent, before, remaining)

    def _shows_counts_on_answer(self, sent: float, remaining: float) -> bool:
        """Whether the answers read show a server that counts as it answers: a wave of
        level counts no refill at the rate in use explains (`StatedCounts.level_wave`),
        among those sent within the slowest latency, arriving as far apart as call
        durations vary."""
        rate, burst = self._limits
        if rate is None:
            return False
        within, late = self._ledger.slowest(), self._ledger.spread()
        return self._stated.level_wave(sent, remaining, rate, burst, within=within, late=late)

    def _counted_at(
        self, sent: float, now: float, remaining: float | None, *, refused: bool
    ) -> float:
        """When the server took the count an answer states: as its request arrived (read
        as of its sending, and how late it may have arrived), or, where the server
        states its count as it answers, as the soonest it can have answered.

        A handler that does its work, then reads its limiter for the headers,
        counts in each answer what arrived while it worked. Read as of each
        request's arrival, a wave of eight at 20/s that all said 2 (two were
        left once all eight were in) was taken for eight counts of one bucket
        refilling as fast as they arrived: a first guess proved 25.8/s, a 429,
        and then the answer after its wait (``Remaining: 10, Reset: 0``) made
        a fixed window of 10 a second of the bucket (2.08 times the minimum).
        So a wave no refill can explain shows it (`_shows_counts_on_answer`),
        and from then on an admitted request's count is as of the soonest its
        answer can have been written: the quickest round trip after its
        sending (not when it is read: a busy process reads it late, and a
        told bucket of 20 at 50/s took requests sent meanwhile for counted,
        and drew a 429 in one run of five), less the quickest a connection
        took to open: what left after that may not have reached the server.
        And less a margin, ``TOGETHER`` or how much round trips vary: a
        threaded server writes its answer a ms or two after its time, and a
        request sent that much before was taken for counted and let out a
        token the server did not have (a 429 under 2 s deadlines, 16 of 23
        answered where 22 can). A refused one is answered at once, as it
        arrives. Only once a round trip is known: without one, the answer's
        time says nothing of the count's.
        """
        if refused or remaining is None or not math.isfinite(self._network_trip):
            return sent
        if not self._counts_on_answer and self._shows_counts_on_answer(sent, remaining):
            self._counts_on_answer = True
            if self._learner is not None:
                self._learner.read_counts_as_answered()
        if not self._counts_on_answer or self._window_length is not None:
            return sent  # a window's log keeps its own reading (`_counted_after_at_most`)
        quickest, spread = self._ledger.quickest_trip(), self._ledger.trip_spread()
        written = now if quickest is None else sent + quickest
        margin = max(TOGETHER, spread or 0.0)
        return max(sent, min(now, written) - self._network_trip - margin)

    def observe_connect(self, seconds: float) -> None:
        """A connection of this scope's took ``seconds`` to open: a round trip on the
        network, with no server time in it (`_counted_at`)."""
        if 0.0 <= seconds < _MAX_LAG:
            self._network_trip = min(self._network_trip, seconds)

    def _take_proof(self) -> None:
        """Take in the fastest refill any process sharing the limit proved
        (`Backend.proven`), between this process's own answers."""
        if self._learner is not None and self._learner.proved_elsewhere(self._backend.proven()):
            self._apply_learned()

    def _check_policy(self, info: RateLimitInfo, sent: float, now: float) -> None:
        """Learning, an admitted answer to the request sent at ``sent``, read ``now``: where
        the counts stated with a policy (``q`` per ``w``) show no window of it counted
        them (`fanout._stated_policy`), the policy understates the rate, and is learned
        past (`RateLearner.refute_policy`)."""
        learner, limit, window, remaining = self._learner, info.limit, info.window, info.remaining
        if learner is None or limit is None or window is None or remaining is None:
            return
        late = self._arrival_spread()
        together = max(TOGETHER, late)
        # Counted as it arrived, up to how much later one may arrive than another; as the
        # server answered (`_counted_at`), by the time the answer is read.
        counted_by = now if self._counts_on_answer else min(now, sent + 2.0 * late + TOGETHER)
        if self._policy.refuted(
            limit, window, remaining, sent=sent, counted_by=counted_by, together=together,
            on_arrival=not self._counts_on_answer,
        ) and learner.refute_policy():  # fmt: skip
            self._apply_learned()

    def _adopt_stated(self, info: RateLimitInfo, sent: float, *, refused: bool = False) -> None:
        if self._learner is not None:
            first, outgoing = self._limits[0] is None, self._outgoing
            # Sent with it: up to ``TOGETHER`` before it, or as much as a request may
            # be slower on its way in than another (the spread of latencies): those
            # may have reached the server after it. Left in a count of what came
            # before it, four sent within 12 ms before one 20 ms faster made a
            # refill bound 53.9/s against 50/s, and drew a 429 (real time).
            late = self._arrival_spread()
            now = trio.current_time()
            around = outgoing.around(sent, now, together=max(TOGETHER, late), refused=refused)
            measured = self._learner.measured
            changed = self._learner.from_headers(
                info.limit, info.window, info.remaining, info.reset_after,
                at=sent, around=around, now=now, late=late, refused=refused,
            )  # fmt: skip
            # What this process proved, told to the others sharing the limit; and theirs.
            if (self._learner.measured or 0.0) > (measured or 0.0):
                self._backend.prove(self._learner.measured or 0.0)
            changed |= self._learner.proved_elsewhere(self._backend.proven())
            if changed:
                # The first answer is a probe's: what it says remains is what the
                # bucket may spend now, less the other probes it may not have counted.
                tokens = None
                if first and info.remaining is not None:
                    tokens = info.remaining - (outgoing.started - 1.0)
                self._apply_learned(tokens=tokens)
            return
        if self.trust == "config" or info.limit is None or info.limit < 1:
            return
        configured_rate, configured_burst = self.rate, self._initial_burst()
        stated_rate = info.rate
        if self.trust == "headers":
            rate = stated_rate if stated_rate is not None else configured_rate
            burst = float(info.limit)
        else:
            rate = configured_rate
            if stated_rate is not None and (rate is None or rate > _fastest(info)):
                rate = stated_rate  # the configuration is contradicted, not just rounded
            burst = min(configured_burst, float(info.limit))
        if (rate, burst) != self._limits:
            self._set(rate, burst)

    def exhaust(self, until: float) -> None:
        """The quota is spent: answer every call ``quota_exhausted`` until ``until``."""
        self._ledger.exhaust(until)
        self._backend.share_exhaustion(until)

    def exhausted_until(self) -> float | None:
        """When the spent quota returns, or None while the scope is usable."""
        return self._ledger.exhausted_until()

    def _shut_until(self) -> float | None:
        """When learning next tries a server it found shut (`RateLearner.closed_until`), or
        None: until then one request waits for that time, and its refusal is a probe."""
        closed = self._learner.closed_until if self._learner is not None else None
        return closed if closed is not None and closed > trio.current_time() else None

    def probed(self, sent_at: float | None = None) -> bool:
        """Whether a refusal of a request sent at ``sent_at`` was this scope's probe, which
        spends neither its call's attempts nor the retry budget: learning, it was sent
        before any answer came back (the first wave, up to four wide under a told cap:
        `RateLearner.on_throttled`), or while the server is shut, one request when it
        may have reopened (`RateLearner.closed_until`), or it is one of the three 429s
        learning spends finding the rate. Those came to whichever call was first in
        line: against a window of 15 per 6.4 s stating nothing, one call drew all
        three, a window apart, and was answered ``rate_limited`` with the rest ok.

        Spent, the first wave's refusals were the budget's floor: a probe four wide
        against a bucket of one drew three, learning's next two 429s were retries
        refused, and a call was answered "the downstream is failing" (`_call`).
        """
        if self._learner is None:
            return False
        blind = sent_at is not None and sent_at <= self._first_answer_at
        return blind or self._shut_until() is not None or sent_at in self._spent_on

    def observe_call(
        self, seconds: float, *, ok: bool, warm: bool = True, reused: bool = False
    ) -> None:
        """One attempt finished: its duration, the probe's end, the slack, and learning.

        Only an attempt that went fine is a sample of a call's duration: a
        429 answers at once, with none of the work's latency, and a cut-off
        attempt ends at its deadline, not its answer; as the fastest call,
        either would widen the slack by a whole latency. It only shows that
        calls take at least that long. ``warm``: no request of the attempt
        opened a connection (or the transport could not tell), so its
        duration is the server's latency, without a connection's set-up.
        ``reused``: each of its requests was seen leaving over a connection
        already open (`_observe_arrival`).
        """
        self._probe.finished()
        self._first_answer_at = min(self._first_answer_at, trio.current_time())
        if not ok:
            self._ledger.observe_cut_short(seconds)
            return
        self._ledger.observe_latency(seconds)
        lags = self._lags
        spread, first_warm = lags.warm_spread(), warm and lags.warm_fastest is None
        if warm:
            lags.warm_call(seconds)
        self._observe_arrival(seconds, warm=warm, reused=reused)
        widened = lags.warm_spread() > spread and lags.arrival > 0.0
        if (widened or first_warm) and self.slack is None and self._bucket_sees_departures():
            self._backend.set_slack(self._measured_slack())  # less of the lag is lateness
        if self._window_length is not None and self.slack is None:
            self._backend.set_slack(self._measured_slack())
        if self._learner is not None:
            now = trio.current_time()
            # The wave is what left: calls admitted behind a cap the probe's 503 showed
            # wait for a place (`Outgoing.parked_by`). Counted, 26 of them made the slow start
            # 2,700/s against a bucket of one at 2/s refusing with 503: five refusals.
            wave = self._outgoing.started - self._outgoing.parked_by(now)
            self._learner.on_success(
                began=now - seconds,
                latency=self._ledger.latency,
                wave=wave,
                late=self._arrival_spread(),
            )
            self._apply_learned()
            self._count_in_reopened()

    def _observe_arrival(self, seconds: float, *, warm: bool = False, reused: bool = False) -> None:
        """How late the first request of the latest burst reached the server, at most.

        The server refills a burst's bucket from its *first arrival*; every
        request of the burst arrives no earlier, so the earliest answer to
        any of them, less the fastest *warm* call here (one whose requests
        opened no connection), bounds how long after the burst began that
        was (the request that arrived first had at least the fastest call's
        server time and way back). It is not the spread of durations: a
        server whose response time jitters stretches the slowest answers,
        but it admitted those requests when they arrived, and the earliest
        of many answers is not stretched by much. The one answer of a burst
        of one is stretched as much as the server's time varies: a burst of
        which a request was seen leaving over a connection already open, by a
        scope that counts its requests on the wire (`_counts_departures`),
        reached the server as it left, and its answers say nothing of a late
        arrival (a bucket of one at 20/s, its answers 50 to 90 ms, kept 40 ms
        after every request: 1.5x the minimum).

        A call that opened a connection is no sample of that server time: a
        slow first connection (a TLS handshake, a server slow to read it)
        makes a whole burst's answers late, which would look like a slower
        server and no lag at all. Until a warm call is seen, the fastest of
        any call stands in, and requests over reused connections wait for
        the worst case (`warm_hold`). A told bucket that sees its requests
        leave takes no sample until then: against the fastest of calls that
        all opened connections, a burst's lag is only how much those vary,
        the same delay in each (a bucket of one against answers of 50 to 90
        ms took the first requests' spread for lateness, and kept 30 ms after
        each until the warm answers showed as much spread).
        """
        now = trio.current_time()
        lags = self._lags
        fastest = lags.warm_fastest if lags.warm_fastest is not None else self._ledger.fastest()
        # A warm call measures what a 429 made us assume the worst of (`_late_first_arrival`).
        if warm and self.slack is None and lags.measure_assumed(fastest):
            self._backend.set_slack(self._measured_slack())
        if self._burst is None or now - seconds < self._burst[0]:
            return  # no burst, or a call that began before the latest burst
        began, first = self._burst
        if self._of_burst(now - seconds):
            first = min(first, now)
            self._burst = (began, first)
            self._burst_on_time |= reused and self._bucket_sees_departures()
        cold_only = lags.warm_fastest is None and self._bucket_sees_departures()
        lag = -math.inf if self._burst_on_time or cold_only else first - began - fastest
        if self.slack is None and math.isfinite(lag) and lags.arrived_late(lag):
            self._backend.set_slack(self._measured_slack())
        if self.slack is None and math.isfinite(lag) and self._wire_counts():
            rate, burst = self._limits
            assert rate is not None
            self._wire.owe_late_arrival(first - fastest, now, rate, burst, lags.warm_spread())

    def _of_burst(self, admitted: float) -> bool:
        """Whether a call admitted at ``admitted`` (after the latest burst began) went
        out on the burst's tokens, so that its answer bounds the burst's first arrival.

        One admitted after the burst's first new token says little of it: a call
        held through a 429's wait is answered a wait later, and read as the
        burst's first answer, that wait (0.85 s) became the slack, and every
        burst after it paused that long.
        """
        assert self._burst is not None
        rate, _ = self._limits
        return rate is None or admitted < self._burst[0] + 1.0 / rate - CLOCK_NOISE

    def warm_hold(self) -> float:
        """How long a request about to leave over a reused connection waits first.

        Until a warm call (`observe_call`) shows how fast the server answers,
        the slack takes a burst's answers as a slower server, not as late
        arrivals (the fastest call so far opened a connection too). A
        request over a connection already open reaches the server at once:
        it waits for the worst case, the whole of the earliest answer's delay
        counted as a late first arrival, less the slack already kept and
        the time the tokens the bucket still holds would cover. A request
        over a new connection arrives as late as the burst did, and waits
        for nothing.

        If the server's first arrival was not late after all, it still has
        the tokens of every request held back now (this one's too), gains
        more while they wait, and one that fills up meanwhile keeps no more
        than its burst: it loses the overflow. Less than a token is cheaper
        than the 429 the wait may prevent (which costs at least the token it
        is refused for): the bucket owes it, so the next request is not
        early. A token or more, and the request leaves at once. A bucket that
        cannot say what it holds (a shared one) holds nothing back, as
        before; nor does a scope that learns its rate, whose bucket is itself
        a guess (learning paces its own start).
        """
        pause, self._leaving_pause = self._leaving_pause, 0.0  # this request's, if first
        rate, burst = self._limits
        told = rate is not None and self._learner is None
        if self.slack is not None or not told or self._lags.warm_fastest is not None:
            return 0.0
        assert rate is not None
        if self._burst is None or not math.isfinite(self._burst[1]):
            return 0.0  # the latest burst is not answered yet: how late it was is unknown
        present = self._backend.bucket_statistics().present  # after this request's own
        if present is None:
            return 0.0
        # The pause kept after this request's own paced fill is a margin for its way in,
        # not tokens the server lacks: counted as spent, the hold used it up, and a
        # request 1 ms slower on its way in than it left drew a 429 to the next.
        present += pause * rate
        now = trio.current_time()
        # The worst case is this much further behind; the tokens at hand cover some of it.
        behind = self._burst[1] - self._burst_left() - self._measured_slack()
        behind -= self._unanswered(now)
        hold = behind - max(0.0, present) / rate
        if hold <= 0.0:
            return 0.0
        held = [end for end in self._holds if end > now] + [now + hold]
        # What the server would have by the last hold's end if none of them had reached it.
        overflow = present + len(held) + (max(held) - now) * rate - burst
        if overflow >= 1.0 - 1e-9:
            return 0.0
        if overflow > 0.0:
            # Full as they leave, the server refills from the first of them to arrive,
            # as where a burst begins: the slack is kept once for each group held. (On
            # a clock that moves at every reading, 7 held at 40.2/s left over 0.2 ms,
            # and the next request, a token after, came 50 us early: a 429.)
            first = len(held) == 1  # no other hold is still running
            self._backend.owe(overflow + (self._margin() * rate if first else 0.0))
        self._holds = held
        self._gate.held(hold, now, rate, burst)
        return hold

    def warm_request_left(self) -> None:
        """A request over a reused connection left now, its hold over (`warm_hold`)."""
        self._outgoing.warm_left(trio.current_time())

    def warm_request_back(self) -> None:
        """A request `warm_request_left` told of is answered, or failed on the wire."""
        self._outgoing.warm_back(trio.current_time())

    def _unanswered(self, now: float) -> float:
        """How long a request over a reused connection has been on the wire unanswered,
        beyond how much call durations vary.

        The server takes at least that long to answer it, and so that much
        of the burst's earliest answer was no late first arrival: the worst
        case `warm_hold` waits for shrinks as the wait for a warm answer
        grows. Without this, every request over a reused connection that was
        held waited the whole worst case again until a warm call came back
        (34 calls at 49.3/s, 220 ms: a second hold of 220 ms, at 0.44 s,
        while the requests sent unheld since 0.28 s were still unanswered,
        which the worst case, a server that answers at once, would not be).
        The spread is kept back: answers that jitter make one request slower
        than the burst's first (without it, drawn servers with a slow first
        connection and jitter drew 429s they had not).
        """
        since = self._outgoing.warm_out_since()
        return 0.0 if since is None else max(0.0, now - since - self._ledger.spread())

    def _arrival_spread(self) -> float:
        """How much later than another a request may reach the server after leaving: how
        much call durations vary, or less, how much the round trips of requests read
        with when they left vary (`Ledger.trip_spread`).

        A call's duration holds a tool's work before its request leaves and
        after its answer's headers came (reading a body, parsing it), which
        vary with the tool, not the way in. Against a server that wrote each
        body apart from its headers (Nagle's algorithm held it 40 ms over a
        reused connection), durations varied by 42 ms where round trips varied
        by 4, and a learning scope's refill bounds, widened by twice that,
        held 2 s deadlines at 8.7-9.3/s against 10/s: 21 of the 23 calls that
        could finish, not 22. Round trips alone, taken before the durations
        were in, read a jittery server's spread an answer sooner than before,
        and a small fast bucket behind it was learned 22 % slower: the lesser
        of the two.
        """
        trips = self._ledger.trip_spread()
        spread = self._ledger.spread()
        return spread if trips is None else min(spread, trips)

    def _margin(self) -> float:
        """The slack in force: the one the user set, else the one measured."""
        return self.slack if self.slack is not None else self._measured_slack()

    def _measured_slack(self) -> float:
        """The margin measured so far (`Lags.margin`), by what this scope sees of its
        requests on their way."""
        windowed = self._window_length is not None
        sight = Sight(
            wire=self._wire_counts(),
            bucket_departures=self._bucket_sees_departures(),
            window_departures=self._window_sees_departures(),
            windowed=windowed,
            # Read off the ledger only where the margin asks (a window): this runs as
            # each request leaves (`headers_left`, `wire_wait`).
            answers_hold_their_own=windowed and self._answers_hold_their_own(),
            told_window=self.per is not None and self._learner is None,
        )
        return self._lags.margin(sight, self._ledger)

    def _answers_hold_their_own(self) -> bool:
        """Whether a told window that sees its requests leave has every answer back before
        its token could be taken again: each then holds its own token as long as its
        round trip shows it may have arrived late (`_way_in`), and the slack keeps no
        margin for how much round trips vary.

        Kept in the slack, that margin began every window as much later as the slowest
        answer came after the quickest: a sliding log of 10 per 0.2 s whose answers took
        50 to 100 ms held each window 46 ms longer (1.25x the fastest, in real time).
        A server whose answers vary that way took each request in as it arrived; one that
        reads some late shows it in their round trips, and those hold their tokens longer.
        """
        slowest = self._ledger.slowest_wire_trip()
        window = self._window_length
        return (
            self._window_sees_departures()
            and window is not None and slowest is not None and slowest < window
        )  # fmt: skip

    def _way_in(self, sent: float, now: float) -> float | None:
        """How much later than it was sent at ``sent`` a request answered now may have
        reached the server, next to the quickest: its round trip from its headers, less
        the quickest such trip, and the way to its headers. None where the answers do
        not hold their own tokens (`_answers_hold_their_own`)."""
        quickest = self._ledger.quickest_wire_trip()
        if quickest is None or not self._answers_hold_their_own():
            return None
        return max(0.0, now - quickest - sent)

    def _bucket_sees_departures(self) -> bool:
        """Whether this is a told bucket that sees each of its requests leave
        (`_counts_departures`): a burst's answer later than its fastest is a late
        arrival only beyond how much the server's own time varies (`_observe_arrival`)."""
        return self._counts_departures() and self._window_length is None

    def _window_sees_departures(self) -> bool:
        """Whether this is a told window that counts each request from when it leaves
        (`window_wait`). Its margin is then how much round trips vary, not the calls'
        durations, which vary with the tools' set-ups (0 to 0.3 s widened a window of
        one per 0.1 s by 0.3 s); and round trips timed from when each request's
        headers left, where the pool says, not from when the HTTP layer had it (twenty
        tools ending their set-up together reached their headers up to 30 ms apart,
        and every window of 20 per 0.4 s began that much later: 1.12-1.13x the
        fastest, 1.08-1.10x timed from the headers). The send lag it keeps stands
        for a server slow to take in a burst's new connections, as slow as this
        process was to send them (without it, a sliding log of 3 per 30 ms, 50 ms
        away, refused a fourth request in 2 of 16 real-time runs, 1 with it), which
        set-ups inflate too: once a round trip is known, no more than the quickest,
        as no request reached the server after its answer. Not a shared window,
        whose other processes' requests are not seen."""
        return self.per is not None and self._counts_departures()

    def observe_write_lag(self, seconds: float) -> None:
        """A request over an open connection got to its headers ``seconds`` after the
        HTTP layer handed it on (a busy process writes it later).

        One that gets there quicker than the burst's first reaches the server
        early by the difference: paced at a told 50/s, requests that took
        0-10 ms on their way drew a 429 in 6 of 8 runs. The bucket counts its
        refill from the spread later, once. (Call durations spread as widely
        where the server jitters its answers, which costs nothing: it took
        each request in when it arrived. A told local bucket counts requests
        on the wire instead: `Lags.way_out_spread`.)
        """
        if self.slack is not None or not (0.0 <= seconds < _MAX_LAG):
            return
        if self._lags.wrote(seconds):  # the spread grew
            self._backend.set_slack(self._measured_slack())

    def observe_send_lag(self, seconds: float, *, arrived_at: float = -math.inf) -> None:
        """A call's first request left ``seconds`` after admission let it start.

        The bucket counts a burst's refill from its first admission; the
        server, from its first request's arrival, which is at least this
        much later (the call's own set-up, a new connection). Known from the
        first request of a burst, long before any answer could show it: the
        slack needs it at once, or the first request after the burst leaves
        early and draws a 429.

        A call of the burst itself (admitted on the tokens the burst began
        with) counts from the burst's start: until an answer shows when the
        server took in its first request (``_observe_arrival``), the server
        is taken to be as slow to take in the burst's connections as this
        process was to send them. (Measured: the server reads the first of
        ten new connections a few ms after they were sent; counting from
        each call's own admission, a ms each, drew a 429 on the request
        after the burst whenever latency and ``1 / rate`` were equal.) A
        call that ``arrived_at`` the turn after the burst began (a streamed
        call, whose block closed later) counts from its arrival: the time
        it did not exist yet says nothing of how slow the sending was.

        A told scope whose requests are all seen leaving (`_counts_departures`)
        leaves out the time the tools themselves take before they send: a
        request that leaves late waits for its token as it leaves
        (`_departure_wait`), owes what a full bucket lost meanwhile
        (`headers_left`), and a log holds its token a window from then
        (`request_left`). Kept in the slack, a tool's set-up was paid again at
        every burst (and after every paced fill): a 0.3 s set-up took 1.26x the
        fastest at 50/s with a burst of 20, and 0.1 s took 2.9x with a burst of
        one. What is left is how much later than the quickest a call got there
        (and a call of the burst, than the burst's quickest): a busy process,
        which the server is taken to be as slow to read, where a set-up every
        call takes alike cancels out. A told window keeps it only up to the
        quickest round trip (`_window_sees_departures`): each request waits for
        its window as it leaves (`window_wait`).
        """
        if not (0.0 <= seconds < _MAX_LAG):
            return
        self._quickest_set_up = min(self._quickest_set_up, seconds)
        if self.slack is not None:
            return
        since = self._since_burst(trio.current_time() - seconds, arrived_at)
        if self._lags.sent(seconds, since, departures_seen=self._counts_departures()):
            self._backend.set_slack(self._measured_slack())

    def _burst_left(self) -> float:
        """When the latest burst's first request reached the HTTP layer, as far as is known:
        its start, plus the set-up its quickest call took first where that is left out
        of the slack (`observe_send_lag`). No request of it reached the server sooner:
        the time before was the tools' own, no late arrival (`warm_hold`)."""
        assert self._burst is not None
        quickest = self._lags.quickest_send
        quickest = quickest if math.isfinite(quickest) else 0.0
        return self._burst[0] + (quickest if self._counts_departures() else 0.0)

    def _counts_departures(self) -> bool:
        """Whether a request that leaves late is accounted for as it leaves: a told scope
        (a learned bucket is a guess) whose tokens no other process spends unseen."""
        return self._learner is None and not self._backend.shared

    def _since_burst(self, admitted: float, arrived: float) -> float:
        """How long after the latest burst began (or the call arrived, if later) a call
        of it, admitted then, leaves now."""
        rate, _ = self._limits
        if self._burst is None or rate is None:
            return 0.0
        began, answered = self._burst
        # Before the burst's first new token, and before its first answer: a call
        # admitted once an answer was in (a learning scope's first after its probe)
        # waited for that answer, not for the burst's sending.
        in_burst = began <= admitted < answered and self._of_burst(admitted)
        return trio.current_time() - max(began, arrived) if in_burst else 0.0

    def expected_latency(self) -> float | None:
        """The moving average of call durations here, or None before any finished."""
        return self._ledger.latency

    def quickest_call(self) -> float | None:
        """The shortest recent call duration here, or None while few calls have finished.

        A call whose turn to start comes so late that even a call this quick
        would end past its deadline is not sent (`fanout._admission`). The
        quickest of one or two calls is no floor: a scope's calls may differ
        (a 1.5 s call and then an instant one, on one tool), so it takes
        `_QUICKEST_AFTER` calls.
        """
        return self._ledger.fastest() if self._ledger.finished() >= _QUICKEST_AFTER else None

    def rate_rising(self) -> trio.Event | None:
        """While the rate is still being learned and may rise: an event set when it does.

        A learned rate is a guess or a lower bound until the server states it
        (a policy window whose whole seconds hide little, `RateLearner.stated_floor`)
        or a window is learned, and it rises with evidence as the turn goes on.
        A call whose tokens would come past its deadline
        at that rate may still fit at the rate learned a moment later: judged
        on it at once, a turn of 30 calls with 2 s deadlines against 10/s
        (burst 5) was answered ``rate_limited`` for 17 calls at the first
        guess, 5/s, and only 13 of the 23 that fit ran. Such a call waits for
        the rise instead, up to the last moment it could still start
        (`fanout._admission`). None when the rate cannot rise.
        """
        learner = self._learner
        if learner is None or self._window_length is not None:
            return None
        return None if learner.ceiling is not None and not learner.stated_floor else self._rose

    @contextlib.contextmanager
    def pressing(self, last: float) -> Iterator[None]:
        """A call waits for the learned rate to rise (`rate_rising`), until ``last``, the
        last moment it could start and end in time: while it does, the rate goes up
        to what the calls waiting so need, where learning allows (`RateLearner.press`)."""
        self._pressed.append(last)
        try:
            if self._press():
                self._apply_learned()
            yield
        finally:
            self._pressed.remove(last)

    def _press(self) -> bool:
        """Ask learning for the rate the calls waiting for a rise need (`pressing`): each
        of them, and every call queued here besides (booked, or waiting for a slot),
        started by its last moment."""
        learner = self._learner
        if learner is None or not self._pressed:
            return False
        now = trio.current_time()
        lasts = sorted(self._pressed)
        ahead = self._ledger.waiting
        need = max((ahead + k) / max(last - now, TOGETHER) for k, last in enumerate(lasts, start=1))
        pending = self._outgoing.out_before(now, self._cap.on_the_wire)
        return learner.press(need, now=now, spare=lasts[0] - now, pending=pending)

    def wait_latency(self) -> float | None:
        """The latency a wait for tokens here is judged with (would the call end late?).

        None while the rate is a guess: as for shedding (``shed``), no call is
        answered on it. Judged then, a call booked a token late (the refill
        while the probe was answered, made up once the refill measures a
        rate) was answered ``rate_limited`` at once as ending 8 ms past its
        deadline; kept, its booking moves sooner when the bucket is made up,
        and is judged there. A booking past the deadline is still not
        slept. (Judged on the usual latency, the last call of a deadline row
        whose answer comes a few ms early, as some do, was never sent: 27 ok
        where 28 can.)
        """
        return self._ledger.latency if self._rate_is_evidence() else None

    def _apply_learned(self, *, tokens: float | None = None) -> None:
        """Pace at the learned rate; one at a time on a window's trial or at a window in
        doubt (`RateLearner.trusted_window`), and once learning has spent its 429s
        unless it counts in a learned window.

        A bucket of the server's burst at a rate a window allows still sends
        what a window refuses: its burst, then a request as soon as a token
        is back, where a log of ``B`` per ``W`` takes the next only ``W``
        after the first. Against sliding logs and fixed windows of 3 per
        150 ms that learning had not found, each cycle drew a 429, ten in a
        turn. One at a time at a rate no faster than the server's, no window
        refuses a request.
        """
        learner = self._learner
        assert learner is not None
        self._press()  # calls still waiting for a rise keep pressing (`pressing`)
        if learner.rate is None or not math.isfinite(learner.rate):
            # A cost of 1e308 a call "proved" an infinite rate: nothing a bucket can
            # pace at, and set, it failed a call that had finished.
            return
        single = (
            self._windows.trial is not None
            or learner.window_in_doubt
            or (learner.spent_refusals and self._window_length is None)
        )
        burst = 1.0 if single else max(1.0, learner.paced_burst)
        self._set(learner.rate, burst, tokens=tokens)

    def _set(self, rate: float | None, burst: float, *, tokens: float | None = None) -> None:
        before = self._limits[0]
        self._limits = (rate, burst)
        if rate is not None and (before is None or rate > before):
            self._rose.set()
            self._rose = trio.Event()
        self._backend.set_limits(rate, burst, tokens=tokens)

    # -- snapshots ---------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Calls holding a slot here, from this process."""
        return self._ledger.in_flight

    def statistics(self) -> ScopeStatistics:
        """A snapshot from what this process knows; it never does I/O."""
        budget = self.retry_budget.statistics()
        bucket = self._backend.bucket_statistics()
        return ScopeStatistics(
            name=self.name, in_flight=self._ledger.in_flight,
            max_concurrency=self.concurrency_cap(), waiting=self._ledger.waiting, bucket=bucket,
            exhausted_until=self.exhausted_until(), latency=self._ledger.latency,
            shed=self._ledger.shed, requests=budget.requests, retries=budget.retries,
            retries_refused=budget.refused,
            slack=self._margin(),
            on_the_wire=self._cap.on_the_wire,
        )  # fmt: skip
