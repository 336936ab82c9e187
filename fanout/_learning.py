"""Learning a scope's rate from what the server does, when nobody configured it.

Three sources, in order of trust:

1. **A stated window.** A limit with a window (``RateLimit-Policy:
   "x";q=100;w=60``) *is* the rate, ``limit / window``, and a ceiling never
   exceeded.
2. **How ``Remaining`` refills.** Between two responses whose requests
   reached the server at ``t1`` and ``t2``, with ``n`` requests of ours
   admitted in between, the server's bucket went from ``r1`` to ``r2`` (each
   floored, so up to one token more): ``rate >= (r2 - r1 + n - 1) / (t2 -
   t1)``, the span widened by twice the spread of the scope's latencies so
   far (the later request may have reached the server that much later, and
   a few samples see less than the whole spread); with no
   ``- 1`` when the first answer found the bucket full (``Remaining`` one
   below the limit is then exact). That bound holds
   whatever the server's burst, and whether or not its
   bucket was full on the way; the learner keeps the best bound seen, so the
   estimate only ever rises with evidence. Where the bucket was found drawn
   down at both answers and never full between, it did not spill, and the
   same counts bound the rate from above, ``(r2 + 1 - r1 + n) / (t2 -
   t1)``: growth never passes that, and a rate above it comes down to it
   before any 429. A rate grown past the refill proven while the bucket was
   found full comes back to that refill at the first answer that surely
   found it drawn down. The stated limit is the burst.
   Until a bound exists, a burst's worth per reset (at least a second) is
   the first guess: 429s correct it downward (AIMD), the refill upward. A
   server that states its limit and what remains but no reset and no
   window (Shopify's fill level) states no rate at all: it is learned as
   below, from its 429s, with the stated burst.
3. **429s alone.** With no numbers at all, the rate is found from which
   requests the server admitted and which it refused. After the probe comes
   a *slow start*, as TCP's: the rate grows by one request per latency with
   each success (doubling per round trip), paced one at a time, so the first
   429 finds few requests in flight (after a probe as wide as the scope's
   cap, the next wave goes whole: no more can be in flight than the probe
   was). A 429 means the server's bucket was
   empty when that request arrived: an *anchor*. The ``n``-th request
   admitted ``t`` after it proves ``rate >= (n - 1) / t`` (less than a token
   was left; a bucket that filled up in between only admits fewer), whatever
   the burst and whatever wait the server imposed: the rate never drops
   below the best such *floor*. Only requests sent after the 429 was read
   count, over a span widened by how much later one may reach the server
   than another: one sent sooner may have got there first. A 429 is one
   congestion event with every 429 of a request sent before it, or sooner
   after it than the slower rate allows; those sent before it was read
   spend one of learning's 429s between them (`RateLearner.on_throttled`).
   After the first, the rate drops to a burst's worth a second (the
   requests admitted so far), then grows e-fold every half second. From the
   second on, it is *fitted*: every answer is replayed against token buckets
   of each rate (`fanout._bucket_fit`), at once (the requests still in
   flight make that fit slow) and again when they have answered. The rate
   settles between the slowest and the fastest that fit, nearer the
   slowest, grows only slowly after, and never past the fastest; where
   every rate down to the slowest tried fits (a large burst spent slowly
   explains any rate), the slowest proves nothing, and it settles at half
   the fastest, growing from there towards it quickly while learning has
   a 429 left to spend. A fit made at a 429, before the requests still
   out have answered, reads them as never sent (a cautious rate until
   they answer), except at the last 429 learning may spend: then they
   count as admitted. This is
   AIMD whose decrease lands on evidence instead of a blind half. A
   server whose 429s state a wait may count in a window instead, which a
   bucket explains only as a deep burst refilled slowly: where its second
   wait ends shows it (`fanout._window_fit`), and the scope counts in it;
   unless the waits are whole seconds and a much slower bucket fits too:
   then it is paced at its average, one request at a time, until a 429
   shows it is that bucket.
   One that states no wait either and refuses three in a row after a run
   it admitted may be a window that shut: it is tried once it may have
   reopened, at times twice as far apart, one request each (a refusal
   then is the scope's probe, not the call's try), and when it takes one
   again it is paced at the run per that time, a window's average, below
   any floor (a window's reopening is no bucket's refill); so is every
   time it shuts again (two 429s in a row then). Once no token bucket
   explains the answers, the scope counts in that window (whole seconds
   where they fit), until it refuses one: then it is a bucket again.
   Calls that would start past their deadlines at the rate learned so far
   press it up to what they need, as far as the answers allow, where a 429
   costs them little (`RateLearner.press`).

A response never resets the estimate: only new evidence moves it.
"""

from __future__ import annotations

import bisect
import collections
import math
from typing import TYPE_CHECKING

import attrs

from ._bucket_fit import AnswerLog
from ._window_fit import WindowGuess, closure_before, explained_by_window

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["TOGETHER", "RateLearner", "SentAround", "whole_seconds"]

_DECREASE = 0.5  # multiplicative decrease on a 429 when the server gave no numbers
_DECREASE_KNOWN = 0.8  # gentler when it did: the stated rate is already close
_BELOW_MEASURED = 0.9  # a 429 lands this far below the refill measured before it
_MIN_RATE = 0.1  # requests a second: never learn a rate of zero
_STEP = 0.05  # additive increase per success, as a share of the reference rate
_BASELINE = 0.5  # seconds: the shortest span a refill is measured over
_GROWTH = 0.5  # seconds: after the first 429, the rate grows e-fold in this long, then slower
_SETTLED = 60.0  # seconds: from the second 429 on, it grows e-fold only in this long
_PHASE_ONE = 1.0  # seconds: after the first 429, a burst's worth a second is the first guess
_SHORTEST = 1e-3  # seconds: a round trip counted as no shorter
_KEPT = 512  # admissions remembered since the last anchor
_EXACT_KEPT = 32  # answers that found the bucket full, remembered to measure from
_EXACT_APART = _BASELINE / 16  # seconds: and kept this far apart, but for the latest two
_SPREADS = 10  # a shorter span than _BASELINE counts if this many latency spreads long
# A refill bound's span is widened by the latency spread seen so far, this many times:
# the spread of a few samples is short of the whole. Widened by it once, a rate
# measured over seconds ended a few thousandths over the server's, and requests
# taking 0-20 ms on their way to it drew a 429 in 6 of 32 runs (none now).
_SPREAD_MARGIN = 2.0
_FIT_SHARE = 0.3  # where between the slowest and fastest rate that fit to settle
_FLOORED_SHARE = 0.5  # of the fastest rate that fits, when no slower rate is ruled out
_LEAP = 8.0  # but at most this times the slowest (a sparse log fits rates far apart)
_ON_TIME = 1e-6  # seconds: a request paced at the slower rate may be sent this much early
_REFUSALS = 3  # 429s learning may spend (the probe's count once); then it grows only on proof
_WINDOW_ONLY = 0.5  # a window is taken only where every bucket that fits is this much slower
# A window shown by whole-second waits is doubted where a bucket this much slower fits too:
# over 1,600 drawn windows, buckets fitted theirs at 0.69 of it or more; the buckets that
# flooded a window they passed for, at 0.17-0.53.
_WINDOW_DOUBTED = 0.6
_CLOSED = 3  # 429s in a row, none admitted between, that show a server closed (a window)
_CLOSED_AGAIN = 2  # as many, once it has shut and reopened
# Seconds: windows are whole seconds (the IETF policy's ``w``, Kong's, Envoy's units),
# so one shut is tried no sooner than this after its run began.
_SHORTEST_WINDOW = 1.0
# A window's edge is that many seconds after the run's first request *arrived*, a little
# after it was sent: probed at 4.000 s, a window of 20 per 4 s refused the probe, and
# was found only at 8 s (2.5 times the minimum, in real time). A twentieth later each.
_PAST_EDGE = 1.05
# A rate pressed by calls that would start past their deadlines (`RateLearner.press`) is
# tried only where a 429 costs a wait of at most this share of the time they have left.
_PRESS_WAIT = 0.1
_PRESS_STEP = 1.1  # a pressed rate moves by this factor at least
TOGETHER = 5e-3  # seconds: requests sent this close reach the server in either order
# A stated policy's rate is a floor while its whole-second window may hide this much more
# (`RateLearner.stated_floor`): a window of up to 11 s.
_HIDDEN = 1.1

# Requests of ours sent up to one of them, itself included; True when counted as they left.
_Count = tuple[float, bool]


@attrs.frozen
class SentAround:
    """What this process had sent around one of its requests, as that request's answer is
    read (`RateLearner.from_headers`): the server's count is as of that request, and
    these say which of ours the count can hold. Counted by `fanout._outgoing.Outgoing`.
    """

    # Running totals by the request's sending: every request of ours booked to start
    # by then, itself included; and where the HTTP layer tells, the requests that left
    # by then (``left_with`` of them just before it).
    started: float = 0.0
    left: float | None = None
    left_with: float = 0.0
    # Of ``started``, how many were sent with it, itself aside: the server may have
    # counted them after it, so a refill bound leaves them out.
    alongside: float = 0.0
    # Of ``alongside``, those sent within ``TOGETHER`` of it, at the same instant, in
    # whatever order the server took them.
    tied: float = 0.0
    # Of ``alongside``, how many other processes sharing the limit sent.
    others_with: float = 0.0
    # How many started after it until its answer was read: the server's bucket has
    # those less, and the refill since.
    after: float = 0.0
    # Of ``after``, how many were sent with it (as soon after it as ``alongside``
    # before): they may have reached the server first.
    after_with: float = 0.0


def whole_seconds(seconds: float) -> bool:
    """Whether a wait or reset is a whole number of seconds: rounded up, as most servers
    send them, so up to a second long (a finer one is taken as exact)."""
    return abs(seconds - round(seconds)) < 1e-9


@attrs.define
class RateLearner:
    """The learned limits of one scope; ``rate`` is None while nothing is known.

    A burst of 429s from one burst of requests is one congestion event: after
    a decrease, further 429s within a second, to requests sent before the
    server's wait ended, do not decrease again. One sent after it was sent at
    the decreased rate, and its 429 is news (held for a whole second, a
    bucket of 20 at 4/s whose waits are 0.14 s refused one request in each
    of its next four refills at 10/s, before the rate came down). With no
    numbers stated, an event is told apart by when its request was sent
    (module docstring, source 3).
    """

    rate: float | None = None
    burst: float = 1.0
    ceiling: float | None = None  # the server's stated rate; never exceeded
    _ceiling_read: float = attrs.field(default=-math.inf, alias="_ceiling_read")  # read then
    policy_window: float | None = None  # the window of the policy that stated it
    measured: float | None = None  # the best lower bound from Remaining's refill
    floor: float = 0.0  # the best lower bound proven by admissions after a 429
    # The least refill a stated burst showed (`_settle_on_limit`): the server's bucket
    # holds that much more for each second of a 429's wait.
    refilled: float = 0.0
    _anchor: tuple[float, float, float] | None = attrs.field(default=None, alias="_anchor")
    # Answers that found the bucket full: when their requests were sent, and ours before.
    _exact: list[tuple[float, _Count]] = attrs.field(factory=list, alias="_exact")
    _counts_before: bool = attrs.field(default=False, alias="_counts_before")
    _paced: float | None = attrs.field(default=None, alias="_paced")  # before a proof raised it
    _reference: float = attrs.field(default=_MIN_RATE, alias="_reference")
    _hold_until: float = attrs.field(default=-math.inf, alias="_hold_until")
    _waited_until: float = attrs.field(default=-math.inf, alias="_waited_until")  # its wait
    _stated: bool = attrs.field(default=False, alias="_stated")  # a window, or a reset with counts
    _slow_start: bool = attrs.field(default=True, alias="_slow_start")
    _growth: float = attrs.field(default=_GROWTH, alias="_growth")
    _event_at: float = attrs.field(default=-math.inf, alias="_event_at")
    _quiet_until: float = attrs.field(default=-math.inf, alias="_quiet_until")
    _empty_at: float | None = attrs.field(default=None, alias="_empty_at")  # the last anchor
    _empty_seen: float = attrs.field(default=-math.inf, alias="_empty_seen")  # its 429 read
    _admitted: list[float] = attrs.field(factory=list, alias="_admitted")  # since the anchor
    _log: AnswerLog = attrs.field(factory=AnswerLog, alias="_log")
    _refit: bool = attrs.field(default=False, alias="_refit")
    _events: int = attrs.field(default=0, alias="_events")
    _cap: float = attrs.field(default=math.inf, alias="_cap")  # the fastest rate that fits
    _fastest: float = attrs.field(default=0.0, alias="_fastest")  # rate when refused, at most
    _latency: float = attrs.field(default=_BASELINE, alias="_latency")
    _headroom: bool = attrs.field(default=True, alias="_headroom")  # Remaining near full
    # An answer found the bucket drawn down a baseline after the first: the rate is near.
    _drawn: bool = attrs.field(default=False, alias="_drawn")
    # Grown past the refill proven while the bucket was found full (`on_success`).
    _grown_past: bool = attrs.field(default=False, alias="_grown_past")
    # Taken back from there (`_grown_back`): when, and from what rate.
    _taken_back: tuple[float, float] | None = attrs.field(default=None, alias="_taken_back")
    _full_since: float | None = attrs.field(default=None, alias="_full_since")  # every answer since
    # The first answer of those found drawn down since the last found full (sent alone):
    # when its request was sent, what remained, and the requests counted by then.
    _drawn_from: tuple[float, float, float] | None = attrs.field(default=None, alias="_drawn_from")
    # The fastest refill the answers found drawn down allow (`_bound_refill`).
    _refill_at_most: float = attrs.field(default=math.inf, alias="_refill_at_most")
    _refused: int = attrs.field(default=0, alias="_refused")  # 429s so far
    # A stated limit of one: True while a bucket of one explains the answers.
    _one_token: bool | None = attrs.field(default=None, alias="_one_token")
    # A stated limit of two or more, fitted as the server's burst (`_settle_on_limit`), and
    # whether the answers refuted that (then any burst is fitted, whatever is stated).
    _limit: float | None = attrs.field(default=None, alias="_limit")
    _limit_refuted: bool = attrs.field(default=False, alias="_limit_refuted")
    _spent: int = attrs.field(default=0, alias="_spent")  # of them, learning's (`on_throttled`)
    # The probe is as wide as the scope's in-flight cap: no later wave can be wider.
    probe_fills_cap: bool = False
    _wave: float = attrs.field(default=1.0, alias="_wave")  # the probe's width, all admitted
    # With no numbers: the first 429 with a wait (when sent, when the wait ends, how
    # much later the server's may have ended, and what was admitted or out before it).
    _first_wait: tuple[float, float, float, int] | None = attrs.field(
        default=None, alias="_first_wait"
    )
    window: WindowGuess | None = None  # the window the answers showed (`fanout._window_fit`)
    # Shown only by waits in whole seconds, the window is paced from then (`_doubt_window`).
    _doubted_from: float | None = attrs.field(default=None, alias="_doubted_from")
    _window_refuted: bool = attrs.field(default=False, alias="_window_refuted")
    _reopened: bool = attrs.field(default=False, alias="_reopened")  # paced as a window reopened
    # Paced as a window reopened from then: the first 429 since is that trial's.
    _trial_from: float | None = attrs.field(default=None, alias="_trial_from")
    # The window the last reopening showed, in whole seconds (`_pace_reopened`); counted
    # in once no bucket explains the answers (`_trust_reopened`), until it refuses one.
    _reopened_as: WindowGuess | None = attrs.field(default=None, alias="_reopened_as")
    _reopened_at: float = attrs.field(default=math.inf, alias="_reopened_at")  # its first admission
    closed_until: float | None = None  # with no numbers, shut: the next request waits till then
    # The fastest stated rate the server's counts refuted (`refute_policy`).
    _refuted: float = attrs.field(default=0.0, alias="_refuted")
    # With no numbers: the longest wait a 429 stated (what a 429 costs, `press`).
    _longest_wait: float = attrs.field(default=0.0, alias="_longest_wait")
    # Since the last 429, the fastest rate learning came to itself before a press, and
    # the rate last pressed to; where the press that drew learning's last 429 was
    # pressed from (`press`).
    _unpressed: float | None = attrs.field(default=None, alias="_unpressed")
    _pressed_to: float | None = attrs.field(default=None, alias="_pressed_to")
    _pressed_from: float | None = attrs.field(default=None, alias="_pressed_from")
    # The fastest rate that fits with the requests out at the last 429 as admitted.
    _pending_cap: float | None = attrs.field(default=None, alias="_pending_cap")

    @property
    def paced_burst(self) -> float:
        """The burst the local bucket may hold: the stated limit; in a slow start
        with no numbers after a probe as wide as the cap, the probe's whole wave.

        The server took that wave at once. Paced at twice it per latency, the
        next wave would all leave before its first answer anyway (no 429 is
        saved), and against the cap each slot would keep its offset to the
        end (2.075 s for 2.0). Below a wider cap, pacing is what keeps the
        first 429 to few requests in flight, and it stays.
        """
        if self._slow_start and not self._stated and self.probe_fills_cap:
            return max(self.burst, self._wave)
        return self.burst

    def policy_shows_window(self, sent: float, wait: float | None) -> bool:
        """Whether a 429 to a request sent at ``sent``, with the server's ``wait`` (None:
        none given), shows that a server stating a policy counts in its window, not in a
        bucket of its limit at its rate (read so where only its refusals state it).

        Such a bucket waits no longer than one token's refill (a second more, rounded up
        to whole seconds or to an HTTP-date's), and refuses nothing sent at its rate,
        after the policy was read. A window may do either: a log of 18 per 3 s, paced as
        a bucket, waited 2.1 s, then took two of the ten its wait had refilled. Every
        request it admits a log of the limit per the window admits too (a bucket of
        ``B`` at ``B / W`` admits whatever a log of ``B`` per ``W`` does), but counted
        in from the first 429, a bucket of 50 at 50/s met over slow new connections
        took 1.3 times the fastest.
        """
        if self.policy_window is None or self.ceiling is None:
            return False
        refill = 1.0 / self.ceiling
        return sent > self._ceiling_read or (wait is not None and wait > refill + 1.0)

    @property
    def stated_floor(self) -> bool:
        """Whether the policy's rate (the ceiling) may be well below the server's: its
        window is whole seconds, rounded up by up to one, so the server's own may be
        that much shorter (a bucket of 5 at 10/s, full in half a second, states
        ``q=5;w=1``), by ``_HIDDEN`` or more. Until its counts refute it
        (`refute_policy`), it is paced at, but a call it puts past its deadline waits
        for it to rise (`fanout._front.ScopeFront.rate_rising`): judged on it at once,
        13 of the 22 calls that can finish under 2 s deadlines ran."""
        window = self.policy_window
        if self.ceiling is None or window is None:
            return False
        return window <= 1.0 or window / (window - 1.0) >= _HIDDEN

    @property
    def refusals(self) -> int:
        """429s (and 503s) so far."""
        return self._refused

    @property
    def spent_refusals(self) -> bool:
        """Whether learning has spent the 429s it may (the probe's count once)."""
        return self._spent >= _REFUSALS

    @property
    def spent(self) -> int:
        """The 429s learning has spent so far (`on_throttled`)."""
        return self._spent

    def from_headers(
        self,
        limit: float | None,
        window: float | None,
        remaining: float | None = None,
        reset_after: float | None = None,
        *,
        at: float = 0.0,
        around: SentAround = SentAround(),
        now: float = -math.inf,
        late: float = 0.0,
        refused: bool = False,
    ) -> bool:
        """Take in one response; True when the limits changed.

        ``at`` is when its request was sent; ``around``, what else of ours was
        sent by then, with it and since, up to ``now`` (when the answer is
        read). ``late``: how much later than another a request may reach the
        server after leaving (the spread of the scope's latencies).
        ``refused``: the answer is a 429's.
        """
        started, alongside, tied = around.started, around.alongside, around.tied
        after, after_with = around.after, around.after_with
        changed = False
        if limit is not None and window is not None and limit <= self._refuted * window:
            window = None  # refuted (`refute_policy`): its limit is the burst, no rate
        if limit == 1 and self._one_token is None:
            self._one_token = True
        if limit is not None and limit >= 2 and math.isfinite(limit) and not self._limit_refuted:
            self._limit = limit
        # A bucket of one says nothing in Remaining (0 after every request, whatever
        # the rate): it is learned as a server that states nothing, from its 429s.
        # So is one that states no reset and no window: nothing gives a first rate
        # (taken as stated, nothing paced the calls: 20 429s, 5 calls given up).
        tells = (limit is not None and limit >= 2) or (remaining is not None and remaining >= 1)
        # A 429's counts alone do not make a server one that states them: one that
        # writes them only on its refusals says nothing as it admits, and is learned as
        # one that states nothing. (Taken as stating, the rate its first 429 guessed
        # stood for the turn: 4.2x the fastest against 20/s with a burst of 10.)
        stated_here = tells and reset_after is not None and not refused
        states = self._stated or stated_here or window is not None
        if states and not self._stated and self.rate is not None:
            # The first reset, after answers that stated none: the rate so far was a
            # slow start's guess, not evidence. Kept, 40/s against a bucket of 40 at
            # 2/s was halved twice into a 1 s wait that refilled 15 tokens of it.
            self.rate = self.floor or None
        self._stated = states
        if limit is not None and limit >= 1 and math.isfinite(limit) and limit != self.burst:
            self.burst, changed = float(limit), True
        policy = None
        if limit is not None and window is not None and limit >= 1 and window > 0:
            stated = limit / window
            if math.isfinite(stated) and stated > 0 and stated != self.ceiling:
                self.ceiling = self._reference = self.rate = stated
                self.policy_window, self._ceiling_read = window, now
                changed = True
            if remaining is None or self.ceiling is None:
                return changed
            # Its counts are measured all the same, the rate held at the policy's: should
            # they refute it (`refute_policy`), what they proved is there at once.
            policy = (self.rate, self._reference, changed)
        elif remaining is None or self.ceiling is not None:
            return changed
        # Near full, after what was sent with it and since (less the refill since, at
        # the present rate): the first of a burst whose others left 7 ms later said 4
        # of 5, and the slow start doubled the rate into a 429 (deadline row, real time).
        refill = (self.rate or 0.0) * max(0.0, now - at)
        self._headroom = remaining - alongside - max(0.0, after - refill) >= self.burst - 1
        # Found full on arrival, whatever reached the server since: a floored
        # ``B - 1`` after its own token is a bucket that held all ``B``; or full
        # before the requests other processes sent with it, which may have got
        # there first. (Two processes learning a 20/s server took turns at 8 and
        # 9 of 10; read as drawn down, both stayed at 11-13/s for 2.5 s.) So are
        # ours sent at the same instant: of a probe two wide, one says ``B - 2``
        # whatever the rate, and read as drawn down, it ended the slow start at
        # 6/s against 50/s (burst 3, 250-350 ms: 2.9 times the minimum, now 2.1).
        if remaining + max(tied, around.others_with) < self.burst - 1:
            self._full_since = None
            # Still drawn down a baseline after the first answer: the pace (the burst
            # spent by then) is near the server's rate, and doubling it is no longer a
            # slow start's (`on_success`). Two processes on Redis each found a 20/s
            # bucket full now and then at 16-18/s, doubled to 30-45/s, and drew a 429.
            anchor = self._anchor
            self._drawn = self._drawn or (anchor is not None and at - anchor[0] >= _BASELINE)
            if not (alongside or after_with):  # one sent with it may yet say full
                changed |= self._bound_refill(remaining, at, started, late)
        else:
            self._drawn_from = None
            if self._full_since is None:
                self._full_since = at
        # Counted by when they left, where the HTTP layer tells: a request booked
        # before this one that left after it reached the server after it.
        left = around.left
        sent = (started - alongside, False) if left is None else (left - around.left_with, True)
        changed |= self._measure(remaining, at, started, alongside, sent, late, after_with)
        if self._grown_past and not refused and remaining + tied < self.burst - 1:
            changed |= self._grown_back(now)
        if self.rate is None and reset_after is not None:
            # A burst's worth per reset (at least a second: resets are rounded up).
            guess = (limit if limit is not None else max(remaining, 1.0)) / max(reset_after, 1.0)
            if math.isfinite(guess) and guess > 0:
                self.rate = self._reference = max(guess, _MIN_RATE)
                changed = True
        if policy is not None:
            self.rate, self._reference, changed = policy
        return changed

    def refute_policy(self) -> bool:
        """The server's counts show no window of its stated policy counted them
        (`fanout._stated_policy`): it refills faster than it states, as a bucket full
        again in less than a whole second states a second. Its rate is where learning
        starts, not a ceiling: its limit is the burst, and the rate is learned from its
        counts (measured under the policy already) as where a server states no
        window. True when the limits changed."""
        if self.ceiling is None:
            return False
        self._refuted, self.ceiling = max(self._refuted, self.ceiling), None
        self.rate = max(self._refuted, self.measured or 0.0)
        return True

    def _measure(
        self,
        remaining: float,
        at: float,
        started: float,
        alongside: float,
        sent: _Count,
        late: float = 0.0,
        after_with: float = 0.0,
    ) -> bool:
        bound = self._exact_bound(remaining, at, sent, late)
        anchor = self._anchor
        if anchor is None or at < anchor[0]:
            # Not one with others sent just after it: they may have reached the server
            # first, and be in its count. Counted as come after it, one sent 0.1 ms later
            # that overtook it proved 2.18/s against 2/s (on a clock that ticks, as real
            # time does); counted as in it, where two processes share a limit, the
            # anchor held the rate they learned too low (a turn a tenth slower).
            if not after_with:
                self._anchor = (at, remaining, started)
        elif at - anchor[0] >= _BASELINE:  # over a shorter span, floored counts are noise
            then, before, started_then = anchor
            admitted = started - alongside - started_then
            # Widened by the spread of arrivals, as an exact count's span is: over half
            # a second, requests up to 65 ms slower on their way in proved 51.9/s
            # against 50/s, and drew a 429 (the 200-call row, real time).
            span = at - then + _SPREAD_MARGIN * late
            bound = max(bound, (remaining - before + admitted - 1) / span)
        return self._proved(bound)

    def proved_elsewhere(self, bound: float) -> bool:
        """Another process sharing the limit proved by its counts that the server refills
        ``bound`` tokens a second at least (`fanout._redis_scope`): taken as a count
        read here would be; True when the rate rose. Not before this scope's first
        answer (its probe is out), nor where a rate is stated.

        Its proof is the end of this scope's slow start, as an answer found drawn
        down is (`on_success`): a process that waited while the others spent the
        turn found the bucket full when its own turn came, doubled a proven 19/s
        to 33/s, and drew a 429 and a second's wait.
        """
        if self.rate is None or self.ceiling is not None or not math.isfinite(bound):
            return False
        if bound <= max(self.measured or 0.0, _MIN_RATE):
            return False  # nothing this scope had not proved (its own, come back)
        self._drawn = True
        return self._proved(bound)

    def _proved(self, bound: float) -> bool:
        """The server refills ``bound`` tokens a second at least; True when the rate rose."""
        if not (math.isfinite(bound) and bound > max(self.measured or 0.0, _MIN_RATE)):
            return False
        self.measured = bound
        if bound > self._refill_at_most:
            self._refill_at_most = math.inf  # refuted: it spilled unseen, or others refilled it
        if self.rate is None or bound > self.rate:
            self._paced = self.rate
            self.rate = self._reference = bound
            return True
        return False

    def _bound_refill(self, remaining: float, at: float, started: float, late: float) -> bool:
        """Bound the server's refill from above by an answer found drawn down; True
        when that takes back a rate past it.

        Between two answers that found the bucket drawn down, with none found
        full between, it did not spill (an answer sent with others, before or
        after it, is not taken here: one of theirs may yet say full). What it
        regained, with ``n`` requests counted here reaching it between, is
        all it refilled, so ``rate <= (r + 1 - r0 + n) / t``, ``t`` narrowed
        by the spread of arrivals. Growth never passes
        the lowest such bound (`on_success`), and before any 429 a rate above
        it, a first guess or a slow start's doubling, comes down to it: only a
        429 brought it back before, and a turn can end first. Two processes
        sharing a 20/s bucket took turns in finding it full at 18-20/s; one
        doubled to 38/s, and the next turn would have begun there. A first
        guess of 13/s against 2/s drew three 429s (now one).

        Between two answers here, the bucket may have been full where only
        another process's answer saw it, and the bound is then too low: a
        refill proven above it refutes it (`_measure`), and it never takes
        the rate below the refill proven. Nor is a bound below that proven
        refill kept: that is a window's count, falling by exactly what was
        sent until it reopens all at once, not a bucket's refill.
        """
        if not (remaining >= 0 and math.isfinite(at + started)):
            return False  # no count: garbage proves nothing either way
        late = max(0.0, late)  # a spread that is no number, or negative, narrows nothing
        drawn_from = self._drawn_from
        if drawn_from is None or at < drawn_from[0]:
            self._drawn_from = (at, remaining, started)
            return False
        then, before, sent_before = drawn_from
        span = at - then - _SPREAD_MARGIN * late
        if span < max(TOGETHER, _SPREADS * late):
            return False
        bound = (remaining + 1.0 - before + started - sent_before) / span
        if not math.isfinite(bound) or bound < max(self.measured or 0.0, _MIN_RATE):
            return False
        self._refill_at_most = min(self._refill_at_most, bound)
        if self._events or self.measured is None or self.rate is None or self.rate <= bound:
            return False
        self.rate = bound
        return True

    def _exact_bound(self, remaining: float, at: float, sent: _Count, late: float) -> float:
        """The refill bound from the answers that found the server's bucket full.

        ``Remaining: B - 1`` after a request to a bucket of ``B`` is no floor:
        the bucket held ``B`` at most, so exactly ``B - 1`` was left, and a
        later answer bounds the rate with one token less of doubt than from a
        floored count (8/s where 9.9/s was proven, at 10/s). That request was
        the first of those sent with it, so they came after it. The span is
        widened by how much later the later request may have reached the
        server after leaving (``late``, twice over, `_SPREAD_MARGIN`; at least
        ``TOGETHER``: in real time a
        request 8 ms slower on its way in proved 50.6/s against 50/s, and
        drew a 429). It is at least ``_BASELINE`` (a fixed window refills all
        at once, and over a shorter span its reset reads as a fast refill),
        except from the latest such answer, as the comment below says. Once an
        answer says ``Remaining: B``, the server counts before the request,
        and no count is exact. Records each answer that found the bucket full,
        as it goes.
        """
        if remaining >= self.burst:
            self._counts_before = True
        if self._counts_before or self.burst < 2:
            return 0.0
        full = self.burst - 1.0
        bound = 0.0
        # The latest counts sooner, for an answer that found the bucket drawn down,
        # until a first 429: a window that reset since would have found it full
        # again, and been the latest. (Found full, it shows only our own pace.)
        # And only over a span many times the spread of arrival times: in real time,
        # 0.23 s with requests 26 ms apart on their way in proved 54/s against 50/s.
        # (Twenty times, a probe's round trip under 10 ms of spread counted not: the
        # deadline row waited one more at its guess, and the bucket filled up.)
        sooner = not self._events and remaining < full
        latest = max((t for t, _ in self._exact if t < at), default=None) if sooner else None
        for then, sent_then in self._exact:
            if sent_then[1] != sent[1]:
                continue  # one counted by bookings, the other by departures
            short = then == latest and at - then > max(TOGETHER, _SPREADS * late)
            if at - then >= _BASELINE or short:
                admitted = sent[0] - sent_then[0]
                span = at - then + max(TOGETHER, _SPREAD_MARGIN * late)
                bound = max(bound, (remaining - full + admitted) / span)
        if remaining == full and all(then != at for then, _ in self._exact):
            bisect.insort(self._exact, (at, sent))
            # The latest two, and before them none closer than ``_EXACT_APART``: the
            # last few answers of a fast pace span less than ``_BASELINE``, and
            # measure nothing (eight kept, a pace kept up at every answer proved
            # under half itself, and growth stopped at twice that: 26/s against
            # 50/s, burst 3, 250-350 ms).
            kept = self._exact[-2:]
            for entry in reversed(self._exact[:-2]):
                if kept[0][0] - entry[0] >= _EXACT_APART:
                    kept.insert(0, entry)
            self._exact = kept[-_EXACT_KEPT:]
        return bound

    def read_counts_as_answered(self) -> None:
        """The server states its count as it answers (`ScopeFront._counted_at`): no
        count is exact (a bucket refills after the last request it counted), and what
        was measured from counts read as of their requests' sending is forgotten."""
        self._counts_before = True
        self._exact.clear()
        self._anchor = self._drawn_from = None
        self._refill_at_most = math.inf

    def on_throttled(
        self,
        sending_rate: float,
        *,
        now: float,
        wait: float | None,
        sent_at: float,
        started: float,
        pending: Sequence[float] = (),
        blind: bool = False,
    ) -> None:
        """A 429: decrease, once per congestion event.

        ``sending_rate`` is what we sent in the last second; ``wait`` how long
        the server said to wait (None: it said nothing; 0: its time had come,
        as an HTTP-date truncated to the second says); ``sent_at`` is
        when the refused request was sent, ``started`` how many requests of
        ours were booked to start up to then and not refused; ``pending``
        when those of them still unanswered were sent. ``blind``: the request
        was sent before any answer came (a probe's).

        The probe's 429s are one event and spend one of the three learning
        may: counted one each, four probes against a burst of one spent all
        three, and the rate grew no faster than admissions proved, which a
        bucket of one never proves past the pace it was sent at (2/s against
        40/s: 35.6 s for what takes 1.9 s). So, with no numbers stated, are
        the 429s of requests that were out before the event's first 429 was
        read: nothing could have held them, and they are one overshoot. A
        slow start at 230/s against 50/s had three out over slow new
        connections; counted one each, they left learning none, and the
        rate went to the slowest bucket that fitted, 6.9/s (2.4 times the
        fastest).
        """
        trial, self._trial_from = self._trial_from, None
        # Sent before a stated rate was read, a request was the slow start's too.
        overshot = sent_at <= self._ceiling_read or (not self._stated and sent_at < self._event_at)
        first = not (blind or overshot) or not self._refused
        if first and not (trial is not None and sent_at >= trial):
            self._spent += 1
        self._refused += 1
        if not self._stated:
            self._throttled_blind(now, sent_at, started, pending, wait=wait)
            return
        wait = wait or 0.0
        if now < self._hold_until and sent_at <= self._waited_until:
            return  # the last event's (class docstring)
        self._events += 1
        self._slow_start = self._grown_past = False
        self._hold_until = now + max(wait, 1.0)
        self._waited_until = now + max(wait, 0.0)
        if self.ceiling is not None and sent_at <= self._ceiling_read:
            # Sent before the stated rate was read (a slow start's, whose own 429 stated
            # it, as a server stating its counts on refusals alone does): no news of that
            # rate. Cut to 0.8 of it, a rate stated nowhere else was never raised again.
            self.rate, self._reference = self.ceiling, self.ceiling
            return
        rate, self._taken_back = self._refused_rate(now), None
        current = sending_rate if rate is None else min(rate, sending_rate)
        current = max(current, _MIN_RATE)
        self._reference = self.ceiling or current
        factor = _DECREASE if self.ceiling is None else _DECREASE_KNOWN
        # Under a policy's ceiling, its counts are measured only should they refute it.
        decreased, proven = current * factor, self.measured if self.ceiling is None else None
        pace = current if rate is None else max(current, rate)
        if proven is not None and proven < pace:
            # The refill measured below the pace refused is evidence, where a blind
            # half is not: against 10/s with a burst of 2, the half of 12/s was
            # 5/s, kept for the rest of the turn (a refill bound cannot rise above
            # the pace that keeps the bucket full). Less a margin: a bound over
            # floored counts ended a few thousandths above the server's rate. The
            # pace is the rate refused, where the second before it averaged slower
            # (a slow start refused at 32/s had sent 10 in that second: 5/s, where
            # 11/s was measured, against 20/s).
            decreased = max(decreased, proven * _BELOW_MEASURED)
        self.rate = max(_MIN_RATE, decreased)
        # The answers after the 429 measure afresh (the bound may have been a little
        # high): until they do, the rate is not evidence, and a wait refills it little.
        self.measured, self._anchor = None, None
        self._drawn_from = None  # a window may have reopened since
        self._exact.clear()

    def _refused_rate(self, now: float) -> float | None:
        """The rate a 429 refused: the present one, or within a second of a growth taken
        back (`_grown_back`), the rate before: the requests sent at it drew the 429.

        Read as refused at the rate taken back to, the 429 halved it: a log of
        2 a second, grown to 3/s and taken back to the 1/s proven, was paced at
        0.5/s and then at 1/s to the end (twice the minimum), where the 429 to
        3/s lands at 1.5/s and the refill proves 2/s.
        """
        taken_back = self._taken_back
        if taken_back is None or self.rate is None or now - taken_back[0] > 1.0:
            return self.rate
        return max(self.rate, taken_back[1])

    def _throttled_blind(
        self,
        now: float,
        sent_at: float,
        started: float,
        pending: Sequence[float],
        *,
        wait: float | None = None,
    ) -> None:
        """A 429 with no numbers: an anchor, and an interim rate until the answers are in;
        or, where the server has shut and states no wait, a probe once it may reopen
        (`_probe_closure`)."""
        self._log.note(sent_at, admitted=False, read=now)
        self._longest_wait = max(self._longest_wait, wait or 0.0)
        if self.window is not None and self.window is self._reopened_as:
            # A window a reopening showed refused one: the guess was wrong (`_trust_reopened`).
            self.window, self._reopened_as, self.burst = None, None, 1.0
        if self._doubted_from is not None and sent_at >= self._doubted_from - TOGETHER:
            self._refute_window()
        self._blind_event(now, sent_at, started, pending, wait=wait or 0.0)
        if wait is None:
            self._probe_closure(now, sent_at, pending)
        else:
            self.closed_until = None

    def _blind_event(
        self,
        now: float,
        sent_at: float,
        started: float,
        pending: Sequence[float],
        *,
        wait: float,
    ) -> None:
        """The 429's congestion event, if it starts one: the rate drops to a guess or a fit."""
        if sent_at < self._quiet_until - _ON_TIME:
            # Sent before we slowed down, or sooner than the slower rate allows
            # (a retry, a token left over): the same event.
            return
        self._event_at = now
        self._events += 1
        if (
            wait > 0 and self.window is None and not self._window_refuted
            and self._windowed(now, sent_at, pending, wait)
        ):  # fmt: skip
            return
        self._fastest = max(self._fastest, self.rate or 0.0)
        if self._slow_start:
            self._slow_start = False
            # Nothing is proven yet: a burst's worth a second is the first guess,
            # the requests admitted so far (``started`` leaves refused ones out)
            # less the burst (one, unless a limit was stated): the bucket was empty
            # at this 429, so the refill paid for at least part of them. (Counting
            # them all drew a fourth 429 from servers of 2/s with bursts of 6 or 7;
            # counting a stated burst of 40 at 2/s as a second's refill set 39/s,
            # and its refill over the 429's wait sent 33 at once.)
            guess = max(started - self.burst, 1.0) / _PHASE_ONE
            if self._settle_on_limit(pending):
                guess = self.rate or guess
            elif self._limit is not None:
                # No refill shown before it (a window refuses the first request past
                # its limit): the limit bounds nothing. Fitted on, a window of 24 per
                # 1.3 s its pace never filled again was paced at 1.3/s to the end.
                self._limit, self._limit_refuted = None, True
        else:
            guess = (self.rate or _MIN_RATE) * _DECREASE
        self.rate = max(_MIN_RATE, self.floor, guess)
        self._empty_at, self._empty_seen, self._admitted = sent_at, now, []
        self._refit = True
        if self._events > 1:
            # Admissions still in flight are missing from the log: the fit is
            # slower than the truth for now, a cautious rate until they answer and
            # it is made again. Once the 429s learning may spend are spent, the
            # rate must fit every request, so those out count as admitted (left
            # out, no bucket explained a 429 after a quiet round trip, the rate
            # stayed at the halved guess, and drew a fourth).
            spent = self.spent_refusals
            self._settle(pending if spent else (), out=pending)
            if pending and not spent:
                # What a pressed rate may reach until they answer (`press`): the fastest
                # rate that fits with them admitted, as most are.
                fit = self._log.fit(
                    slowest=max(self.floor, _MIN_RATE), fastest=self._fastest, pending=pending
                )
                self._pending_cap = fit.high if fit is not None and fit.bounded else None
        unpressed, self._unpressed = self._unpressed, None
        # Where a press drew learning's last 429 (`press`); once only.
        self._pressed_from = unpressed if self._spent == _REFUSALS else None
        self._quiet_until = now + 1.0 / self.rate

    def _settle_on_limit(self, pending: Sequence[float], out: Sequence[float] = ()) -> bool:
        """Settle where a bucket of the limit a 429's counts stated (its burst, two or
        more), full at our first request, fits the answers (`fanout._bucket_fit`), with
        the requests ``pending`` taken as admitted (or ``out``, if none fits without
        them); True when it bounds the rate from both sides. Where none fits (a window,
        or another process drew the bucket down), the limit is no burst: any burst is
        fitted from then on.

        ``n`` requests admitted ``t`` after the first left a bucket of ``B`` less
        than a token at a 429: ``(n - B) / t`` at least (a bucket found less than
        full admits fewer), ``(n + 1 - B) / t`` at most, from the first 429 on: at it,
        the requests still out took the bucket's tokens, and count as admitted. Guessed
        a burst's worth short of a second's refill instead, 16/s where 50/s with a
        burst of 50 had admitted 66 in 0.36 s, the rate grew from there while the
        server's bucket filled, unspent, through the 429's one-second wait, and it
        took three 429s and 1.26 times the fastest. The least rate that fits is a
        refill the server surely made in a 429's wait (`refilled`).
        """
        limit = self._limit
        if limit is None or self._one_token or self.window is not None:
            return False
        pending, out = self._unanswered(pending), self._unanswered(out)
        slowest = max(self.floor, _MIN_RATE)
        fit = self._log.fit(slowest=slowest, fastest=self._fastest, pending=pending, burst=limit)
        if fit is None and len(out) > len(pending):
            fit = self._log.fit(slowest=slowest, fastest=self._fastest, pending=out, burst=limit)
        if fit is None:
            self._limit, self._limit_refuted, self.refilled = None, True, 0.0
            return False
        if not fit.bounded or fit.floored:
            return False
        # Between the two, leaning slow, as two drains settle any burst (`_settle`);
        # towards the fastest quickly while a 429 is left to spend, as there.
        self.rate = max(self.floor, fit.low + (fit.high - fit.low) * _FIT_SHARE)
        self._cap, self.refilled = fit.high, fit.low
        self._growth = _SETTLED if self._spent >= _REFUSALS else _GROWTH
        return True

    def _unanswered(self, pending: Sequence[float]) -> list[float]:
        """``pending`` less the requests the log has answered already.

        The requests out are taken as the latest sent (`Outgoing.out_before`): with
        answers out of order, one answered is counted twice and one out not at all, and
        a bucket of its stated burst that fits two at once is a faster one (52-53/s
        against 49.9/s, burst 5, answers jittered by 113 ms). Counted once, and the
        one out missed, it is a slower one.
        """
        if not pending:
            return []
        answered = collections.Counter(
            round(sent * 1e7) for sent, refused in self._log.with_pending() if not refused
        )
        kept = []
        for sent in pending:
            key = round(sent * 1e7)
            if answered[key]:
                answered[key] -= 1
            else:
                kept.append(sent)
        return kept

    def _probe_closure(self, now: float, sent_at: float, pending: Sequence[float]) -> None:
        """When to try a server again that refused ``_CLOSED`` or more requests in a row,
        with no wait stated, after admitting a run (`fanout._window_fit.closure_before`).

        It may be a window that shut when the run filled it, and reopens when
        the run's first request leaves it: a window at least as long as the
        run took, and a whole number of seconds. So it is tried that long
        after the run began (a second at least), then twice, four times that
        (a probe refused costs a 429, one probed late a window that much
        slower: `_pace_reopened`), never sooner than it has been shut so far.
        Paced as a bucket's, whose rate each 429 cut, a window of 20 per 4 s
        drew four 429s and was tried again only at 7.7 s; tried from a short
        run's length on, one of 5 per 10 s drew nine.

        A server whose 429s state a wait, even one already come (an HTTP-date
        truncated to the second names the second going on), is not one: taken
        for one, a bucket of 50/s with a burst of 20 that refused three at once
        was paced as a shut window at 7.5/s to the end (up to 16 times the
        fastest, 13 calls given up).
        """
        planned, self.closed_until = self.closed_until, None
        if self.window is not None:
            return
        closure = closure_before(self._log.with_pending(pending), sent_at, tolerance=TOGETHER)
        if closure is None or closure.refused < _CLOSED:
            return
        span = max(closure.closed_at - closure.first, self._latency, _SHORTEST_WINDOW)
        # Shut for this long already, it is no likelier to reopen in less than as long:
        # long until the probe as planned, where it left late (a Redis round trip
        # behind, 54 ms), a window of 8 per 2 s had been shut 12 ms longer than the
        # next probe was away, and was tried at 4.2 s, not 2.1 (15.5 s for 6).
        shut_at = now if planned is None else min(now, planned)
        probe = closure.first + span * _PAST_EDGE
        while probe <= now or probe - shut_at < shut_at - closure.closed_at:
            span *= 2.0
            probe = closure.first + span * _PAST_EDGE
        self.closed_until = probe
        # One request then, and the next only once its answer may be in.
        self.rate = 1.0 / max(probe - now, self._latency)

    def _windowed(self, now: float, sent_at: float, pending: Sequence[float], wait: float) -> bool:
        """Whether the server counts in a window, by the waits of its 429s (`fanout._window_fit`).

        The first 429 with a wait gives the guess (what was admitted before it,
        to where its wait ends), read at a later one, whose wait ends where the
        guess says if it is right; then the rate is the window's, and the scope
        counts in it. A wait of whole
        seconds (``Retry-After: 3``) may have been rounded up by up to one.
        An HTTP-date's wait, read against the server's finer clock, is not
        whole: it is taken as exact, so its window is proven only where its
        end falls within ``TOGETHER`` of the guess's.
        """
        coarse = whole_seconds(wait)
        answers = self._log.with_pending(pending)
        if self._first_wait is None:
            # Admitted, and still out (a refusal comes back at once, so admitted too).
            counted = sum(not refused and sent < sent_at for sent, refused in answers)
            later = now - sent_at + (1.0 if coarse else 0.0)
            self._first_wait = (sent_at, now + wait, later, counted)
            return False
        refused_at, reopened, later, counted = self._first_wait
        # What went before the first 429, counted then (answered or out) and again now
        # that it has all answered. They differ where a request was neither answered
        # nor counted out at that 429 (in real time, on Redis: a log of 4 guessed as
        # 3), or one booked before it left after it, and was admitted a window later
        # (a log of 4 guessed as 5): the limit is not known then.
        before = [sent for sent, refused in answers if not refused and sent < refused_at]
        if len(before) < 2 or len(before) != counted:
            return False
        if self._limit is not None:
            # A bucket of the limit the counts state explained the first 429 by a refill
            # (`_settle_on_limit`), which a window never shows: paced at that refill, a
            # bucket of 7 at 23/s drew a second 429 a wait after the first, and passed
            # for 25 per 2.1 s.
            return False
        guess = WindowGuess(len(before), reopened - before[0], before[0])
        reopens = (sent_at + wait - (1.0 if coarse else 0.0), now + wait + later)
        # Only requests sent together may have reached the server in either order:
        # allowed the spread of latencies (0.27 s, with jitter), a bucket of 24/s
        # passed for 30 per 1.08 s, and the window it was counted in drew nine 429s.
        kind = explained_by_window(answers, guess, sent_at, reopens, tolerance=TOGETHER)
        if kind is None:
            return False
        rate = guess.limit / guess.length
        slowest = max(self.floor, _MIN_RATE)
        fit = self._log.fit(slowest=slowest, fastest=self._fastest, pending=pending)
        if kind == "fixed" and fit is not None and fit.high >= rate * _WINDOW_ONLY:
            # Fixed windows are matched by counts alone, and a wait in whole seconds
            # (or an HTTP-date) ends on one of their edges wherever it falls: against
            # a bucket of 20/s, the learner's own pace filled a guessed 13 per 0.5 s.
            # They are taken only where every bucket that fits is much slower.
            return False
        self.window, self.burst = guess, float(guess.limit)
        self.rate = self._cap = rate
        if coarse and fit is not None and fit.high < rate * _WINDOW_DOUBTED:
            self._doubt_window(now + wait, rate)
        return True

    def _doubt_window(self, reopens: float, rate: float) -> None:
        """A window shown only by waits in whole seconds, which a much slower bucket
        explains as well, is paced at its average from the wait's end, one request at a
        time, and not counted in (`trusted_window`).

        A wait rounded up to a second ends where a window's would over a wide
        span: 2/s with a burst of 10 passed for a log of 11 per 1.72 s, and
        each time the log reopened it sent nine requests into a bucket that
        had refilled two (15 429s, four calls given up). Paced, a window
        refuses nothing (its average is what it allows), and a bucket refuses
        one request, which shows it is one (`_refute_window`). A round trip
        apart at most: paced at the log's average (6.4/s, against a round trip
        of a quarter second), more were out when the bucket refused one, and
        the fit after it was the slower (1.44-1.52 times the minimum on drawn
        buckets, against 1.19-1.25).
        """
        self._doubted_from = reopens
        self.rate = min(rate, 1.0 / self._latency)

    @property
    def trusted_window(self) -> WindowGuess | None:
        """The window the scope counts in: one known and not in doubt."""
        return self.window if self._doubted_from is None else None

    @property
    def window_in_doubt(self) -> bool:
        """A window is known but doubted: the scope paces at its average, one at a time."""
        return self._doubted_from is not None

    def _refute_window(self) -> None:
        """A request paced at a doubted window's average was refused: the server is a
        bucket, fitted from here as one (`_blind_event`), and never taken for a window again."""
        self.window, self._doubted_from, self._window_refuted = None, None, True
        self.burst, self._cap = 1.0, math.inf

    def on_success(
        self,
        *,
        began: float | None = None,
        latency: float | None = None,
        wave: float = 1.0,
        late: float = 0.0,
    ) -> None:
        """One success: add a step of rate back, up to the server's ceiling.

        A rate measured from the server's own counts does not creep upward:
        only evidence raises it, or a server's bucket found full at every
        answer for half a second (a refill bound cannot rise above the pace
        that keeps it full). Nor does a guess while the server's
        ``Remaining`` is below its limit: the bucket is being drawn down at
        the present rate, and a faster one would empty it (the refill it
        shows will measure the true rate from below). ``began`` is when the successful request was
        sent; ``latency`` the scope's usual call duration; ``wave`` how many requests of
        ours have started so far (at the first success: the probe's width); ``late``
        how much later than another a request may reach the server after leaving.
        """
        if not self._stated:
            self._admitted_blind(began, latency, wave, late)
            return
        paced, self._paced = self._paced, None
        if self.rate is None or self.spent_refusals:
            return
        if began is None or self._anchor is None or began - self._anchor[0] < _BASELINE:
            return  # too soon for the refill to have shown: the guess stands until it could
        if self._slow_start and self._headroom and latency is not None and not self._drawn:
            # No 429 yet and the bucket is full whenever we ask: far below its rate
            # (a refill bound only proves we kept up): double per round trip. Below one
            # request in flight an answer is a round trip of its own: at most double.
            paced = self.rate if paced is None else paced
            grown = max(self.rate, paced + min(1.0 / max(latency, _SHORTEST), paced))
        elif self._full_for_a_while(began):
            # The server's bucket was full whenever we asked, for a while: a refill
            # bound only shows we kept up (stuck at 4.5/s against 30/s, burst 2). Grow
            # as after a first 429, e-fold in ``_GROWTH``, until it is drawn down, where
            # the refill bound measures its rate. (A window is full only as it reopens.)
            grown = self.rate + 1.0 / _GROWTH
            self._grown_past = True
            if not self._headroom and self.measured is not None:
                # Found full on arrival, with more in flight than it holds: the
                # answers that show it drawn down come a round trip late. Grown
                # past twice the pace proven, 30/s against 19/s drew two 429s.
                grown = min(grown, max(self.rate, 2.0 * self.measured))
        elif self._headroom and self.measured is None:
            grown = self.rate + _STEP * self._reference
        else:
            return
        # Never past the refill a drawn-down bucket allowed (`_bound_refill`).
        grown = min(grown, max(self.rate, self._refill_at_most))
        self.rate = grown if self.ceiling is None else min(grown, self.ceiling)

    def _grown_back(self, now: float) -> bool:
        """An answer found the bucket drawn down, for sure, while the rate grew past the
        refill proven (the bucket found full for a while, `on_success`): back to the
        refill proven; True when the rate fell. Growth starts again once the bucket
        has been found full for a while again.

        Its answers come a round trip late, and the rate grew e-fold in
        ``_GROWTH`` meanwhile: kept until the 429, 28/s against a bucket of 3
        went to 42/s, a 429 and a second's wait. Only sure where no request
        was sent with it (`TOGETHER`): its Remaining counts theirs or not, in
        the order the server took them. A 429 is not one here: its decrease
        lands on the refill proven (`on_throttled`), and taken back first it
        halved a pace the refill had proven instead.
        """
        self._grown_past = False
        if self.measured is None or self.rate is None or self.rate <= self.measured:
            return False
        self._taken_back = (now, self.rate)
        self.rate = self.measured
        return True

    def _full_for_a_while(self, began: float) -> bool:
        """Whether every answer found the server's bucket full for ``_BASELINE``, in at
        most one congestion event: the 429s of a probe sent blind are one, and a scope
        that drew them at once stayed at half a guess (1.1/s against 23/s, burst 2)."""
        full = self._full_since
        return self._events <= 1 and full is not None and began - full >= _BASELINE

    def _admitted_blind(
        self, began: float | None, latency: float | None, wave: float, late: float
    ) -> None:
        """An admission with no numbers: a bound to prove, and the rate grows."""
        if began is not None:
            self._log.note(began, admitted=True)
        # Sent within ``TOGETHER`` of the anchor, a request may have reached the
        # server before it: two admitted 0.1 ms after a refused one "proved" 5,000/s,
        # and the rate never dropped below it (56 429s, 38 calls given up). So may
        # one sent before the anchor's 429 was read, where the anchor went over a new
        # connection: one 46 ms on its way proved 136/s against 50/s for the ten
        # sent after it over warm ones, and drew a 429 a second to the end. The span
        # is widened by how much later one request may arrive than another, as a
        # refill bound's is. Nor is a floor proven once a window reopened: it
        # refills all at once.
        if (
            self._empty_at is not None
            and began is not None
            and began > self._empty_at + TOGETHER
            and began >= self._empty_seen
            and not self._reopened
        ):
            bisect.insort(self._admitted, began)
            del self._admitted[:-_KEPT]
            since = self._empty_at - _SPREAD_MARGIN * late
            proven = max((n / (t - since) for n, t in enumerate(self._admitted)), default=0.0)
            self.floor = max(self.floor, proven)
        if latency is not None:
            self._latency = max(latency, _SHORTEST)
        if self._slow_start:
            # One request per latency more with each success: doubling per round trip.
            # The probe's round trip carried its whole wave (two, or as many as a
            # told concurrency allows, up to four): starting from one request per
            # latency instead, the next wave went at (w + 1) per latency, not 2w,
            # and its stagger stayed in every later wave of a concurrency cap.
            if self.rate is None:
                self._wave = max(1.0, wave)
            self.rate = (self.rate or self._wave / self._latency) + 1.0 / self._latency
        elif self.window is not None:
            return  # counted in a window (`_windowed`), or paced at its average: its rate
        elif self.rate is not None and began is not None and began > self._event_at:
            if self._refit:
                # Every request sent before the event has answered by now: fit.
                self._refit, self._pending_cap = False, None
                self._settle()
                # "Sooner than the slower rate allows" means the rate just fitted:
                # kept at the interim guess's interval, a 429 drawn at the fitted,
                # faster rate was merged into the old event and slowed nothing.
                self._quiet_until = self._event_at + 1.0 / self.rate
            # Grow e-fold in ``_growth`` seconds (successes come at the rate);
            # a request sent before the last event says nothing of the new rate.
            grown = self.rate + 1.0 / self._growth if self._spent < _REFUSALS else self.rate
            self.rate = max(min(grown, self._cap), self.floor)
            if self.closed_until is not None or self._reopened:
                self._pace_reopened(began)
                self._trust_reopened()

    def _pace_reopened(self, began: float) -> None:
        """The first admission after ``_CLOSED`` 429s in a row, sent at ``began``: a window
        that states nothing may have reopened (`fanout._window_fit.Closure.reopened`).

        Every 429 in a shut window is one more congestion event, and a
        bucket fitted to them is one that refilled nothing for as long: a
        window of 20 per 4 s was paced at 0.23/s (22 times the minimum), and
        one of 30 per 10 s so slowly that 58 of 135 calls would not fit the
        turn. Paced at the window's average instead, no faster than its
        server allows where the run filled one window, a window refuses
        nothing; a slow bucket refuses the next request or so, and that 429
        fits it closely.

        A fixed window need not begin with our first request (a counter
        keyed by the clock's second): an edge inside the run, or between it
        and the probe, makes the guess too fast. The window then shuts
        again, and every later closure is paced in turn (two 429s in a row
        show it, once the server has shut and reopened): its run began as a
        window did. The floor proven since the last 429 goes: it read a
        window's reopening as a bucket's refill, and held the pace over the
        window's (30 per 10 s met at 0.8 of a window: 68 429s, and 40 of 100
        calls answered rate_limited; now nine, and none).
        """
        closure = closure_before(
            self._log.with_pending(), math.nextafter(began, -math.inf), tolerance=TOGETHER
        )
        if closure is None or closure.refused < (_CLOSED_AGAIN if self._reopened else _CLOSED):
            return
        self._reopened, self.closed_until = True, None
        guess, self._reopened_as = closure.reopened(began), closure.whole(began)
        self._reopened_at = began
        self.rate = self._cap = guess.limit / guess.length
        self.floor = min(self.floor, self.rate)
        # A 429 at this pace is news, where the events before it ended later, and
        # the first is the trial's: it spends none of learning's 429s (counted, a
        # bucket of 2/s it refused was then paced at the slowest rate that fit,
        # 0.67/s, as learning that has spent them is).
        self._quiet_until = self._trial_from = began

    def _trust_reopened(self) -> None:
        """Count in the window a reopening showed (`_pace_reopened`) once no token bucket
        explains the answers: a window, not a slow bucket that shut the same way.

        Paced at its average, a window's turn ends a window's length after
        its last window opened, where counted in it, each window's requests go
        as it opens: a fixed window of 10 per second stating nothing, 60 calls
        at 50 ms, took 1.25 times the fastest paced, 1.13 counted in on a mock
        clock and 1.14-1.17 in real time (aiometer told its limits: 1.19). A
        bucket that shut refuses a request or two of the pace first, so it is
        never counted in as a window.

        The window is a guess: one keyed by the clock may have begun before
        our first request, and its run then spanned an edge, or the window is
        longer than its reopening showed. A run that spanned an edge counted
        up to two windows' worth, so the window is counted in only once the
        pace has had more than half its count admitted since it reopened, more
        than a window of half as many takes: 9 per 2 s met at 0.7 of a window
        was guessed 18 per 4 s, and counted in with half of it admitted, eight
        requests went at once and were refused. Its first 429 ends it
        (`_throttled_blind`): the scope is a bucket again, paced by the
        closures that follow, as before it was counted in.
        """
        guess = self._reopened_as
        if guess is None or self.window is not None or self._window_refuted:
            return
        answers = self._log.with_pending()
        trial = sum(not refused and sent >= self._reopened_at for sent, refused in answers)
        if trial <= guess.limit / 2:
            return
        if self._log.fit(slowest=_MIN_RATE, fastest=self._fastest) is not None:
            return
        self.window, self.burst = guess, float(guess.limit)

    def press(
        self, need: float, *, now: float, spare: float, pending: Sequence[float] = ()
    ) -> bool:
        """Calls that would start past their deadlines at the present rate need ``need``
        a second, and have ``spare`` seconds before the first of them must start
        (`ScopeFront.pressing`): with no numbers, the rate goes up to that need where
        the answers allow it; True when it rose. ``pending``: when the requests out
        now were sent (taken as admitted).

        After a first 429 the rate drops to a guess (a burst's worth a second) and
        grows e-fold each half second: cautious for a turn of minutes, where a 429
        costs more than the time a slow rate loses. Calls under a deadline lose
        that time for sure: bare 429s from 20/s with a burst of 2 left 10 of the 31
        calls that could end within 1.5 s answered ok, the rest answered at their
        last moment, the rate still climbing. Their need is tried instead, up to
        half the pace the first 429 refused (as TCP's slow start halves its window),
        then up to the fastest rate that fits the answers (with those still out
        taken as admitted, until they answer): a 429 at it is one of the three
        learning spends, and its fit brings the rate back. Only where a 429 costs
        little of the time the calls have: a stated wait of a second (a server
        rounding up) would cost them all of it.
        """
        if self._stated or self._slow_start or not self._events or self.rate is None:
            return False
        if self._longest_wait > _PRESS_WAIT * spare:
            return False
        if self.window is not None or self.closed_until is not None or self._reopened:
            return False  # a window is paced at its own rate, a shut one probed
        if self._refused_in_a_row(pending):
            # Nothing admitted between the last two 429s: a window that shut, or a rate
            # far below the pressed one. Pressed on, a sliding log of 4 a second drew a
            # third at once, was taken for a window that shut, and probed a second on.
            return False
        if self._spent < _REFUSALS:
            ceiling = self._cap if math.isfinite(self._cap) else self._fastest * _DECREASE
            if self._pending_cap is not None:
                ceiling = max(ceiling, self._pending_cap)
        else:
            # A press drew learning's last 429: the rate is the slowest that fits
            # (`_settle`), which may be far under the rate learning had come to before
            # the press. No lower than that rate: the press was the gamble, not it.
            # (Taken to the slowest that fits, 46 of 49 calls ran against 20/s with a
            # burst of 10, where 48 ran before; against 5/s with a burst of one, 6 of 15
            # where 7 ran.) Not where the answers rule that rate out, and only until the
            # next 429: a fourth is the last a press draws.
            pressed_from = self._pressed_from
            if self._spent > _REFUSALS or pressed_from is None or pressed_from > self._cap:
                return False
            ceiling = pressed_from
        target = min(need, ceiling)
        # Raised by a tenth at least (or to the ceiling): each call that starts waiting
        # presses again, and a rate rising by a hair at each wakes every call waiting
        # to book again.
        if not (math.isfinite(target) and target > self.rate):
            return False
        if target < min(self.rate * _PRESS_STEP, ceiling):
            return False
        if self.rate != self._pressed_to:  # learning's own rate, not a press's
            self._unpressed = max(self._unpressed or 0.0, self.rate)
        self.rate = self._pressed_to = target
        # A 429 to a request sent at the pressed rate is news (`_blind_event`).
        self._quiet_until = min(self._quiet_until, now + 1.0 / target)
        return True

    def _refused_in_a_row(self, pending: Sequence[float] = ()) -> bool:
        """Whether the last two answers by sending are both 429s, with the requests sent
        at ``pending`` and not answered yet taken as admitted."""
        latest = self._log.with_pending(pending)[-2:]
        return len(latest) == 2 and all(refused for _, refused in latest)

    def _settle(self, pending: Sequence[float] = (), out: Sequence[float] = ()) -> None:
        """Move the rate to what the answers so far allow (`fanout._bucket_fit`), with
        the requests ``pending`` (sent then, not yet answered) as admitted; ``out``
        are all those not yet answered, admitted if a bucket of one needs them so."""
        if self._settle_on_limit(pending, out):
            return
        slowest = max(self.floor, _MIN_RATE)
        fit = None
        if self._one_token:
            # A stated burst of one bounds the rate from both sides (`fanout._bucket_fit`);
            # once no bucket of one explains the answers (a fixed window of one admits
            # two at its edge), any burst is fitted from then on. Read as never sent,
            # the request out just before a 429 left a gap no rate explains, and the
            # 429 at 21/s against 20/s fitted any burst at 11.9-20.7/s: it settled
            # at 14.5/s, where the admissions of a bucket of one had proved 17/s.
            fit = self._log.fit(slowest=slowest, fastest=self._fastest, pending=pending, burst=1.0)
            if fit is None and len(out) > len(pending):
                fit = self._log.fit(slowest=slowest, fastest=self._fastest, pending=out, burst=1.0)
            self._one_token = fit is not None
        if fit is None:
            fit = self._log.fit(slowest=slowest, fastest=self._fastest, pending=pending)
        if fit is None:
            if self._events > 1:
                # No bucket explains the answers (a window that states nothing
                # refills all at once): growing e-fold each half second from here
                # drew a 429 a window, a fourth among them.
                self._growth = _SETTLED
            return
        low, high = fit.low, fit.high
        if fit.floored:
            # Every rate down to the slowest tried fits (a large burst spent slowly
            # explains the answers at any rate): ``low`` proves nothing, only
            # ``high`` does. Taken as the rate, ``low`` crawled at 0.09/s, one call
            # per 11 s, against 7.8/s; half the fastest fit is at most twice slow.
            share = high * _FLOORED_SHARE
            if self._events > 1 and not self._refit:
                # Every answer of the event is in: the fit is the evidence, not the
                # halved guess the event's first fit (missing them) left.
                self.rate = max(self.floor, share)
            else:
                self.rate = max(self.floor, min(self.rate or high, share))
            if fit.bounded and self._events > 1:
                # Never past the fastest; a 429 learning may still spend finds where
                # below it (growing slowly from half of it had crawled at 1.6/s
                # against 10/s for 15 s), then, once spent, growth is slow.
                self._cap = high
                self._growth = _SETTLED if self._spent >= _REFUSALS else _GROWTH
        elif fit.bounded and self._spent >= _REFUSALS:
            # The answers bound the rate from both sides and the 429s learning may
            # spend are spent: the slowest rate they fit (leaning towards the
            # fastest rate refused drew a fourth). An unbounded fit's slowest
            # rate proves nothing yet, and does not lower the rate: after a wide
            # probe spent the three at once, it had slowed a 40/s server's
            # scope to 0.09/s.
            self.rate = max(self.floor, low)
            self._growth, self._cap = _SETTLED, high
        elif fit.bounded and self._events > 1:
            # Two drains bound the rate from both sides: settle, lean slow,
            # and never grow past the fastest rate the answers allow.
            lean = min(low + (high - low) * _FIT_SHARE, low * _LEAP)
            self.rate = max(self.floor, lean)
            self._growth, self._cap = _SETTLED, high
        else:
            self.rate = max(self.rate or _MIN_RATE, low)
