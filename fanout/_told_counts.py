"""A told token bucket counted again as requests leave: at the gate, and on the wire.

The bucket (`fanout._bucket`) books a call's token at its admission; the
server counts the request when it arrives. In between, a tool may set up,
a connection may open, a write may stall, and requests may pass each other.
A scope told its bucket counts it twice more, the way the server sees it:

- ``DepartureGate``: as each request reaches the HTTP layer, before any
  connection is opened (`ScopeFront.request_leaving`). A burst whose tools
  set up for 0.3 s is counted then, not at its admission.
- ``WireCount``: as each request's headers reach the wire
  (`ScopeFront.wire_wait`, `ScopeFront.wire_left`), whatever order they passed
  the gate in: a request that opened a connection for 0.3 s was overtaken by
  one a token after it over a warm one.

Each is the bucket's tokens as of a time. A server's bucket that is full
when a request takes its token, or fills up before the request arrives,
stays full until then and loses the refill meanwhile: both counts owe it,
the gate by taking tokens off, the wire by moving its refill start later.
Each is checked alone against a server's bucket (`tests/test_told_counts.py`).
"""

from __future__ import annotations

import math

import attrs

from ._budget import CLOCK_NOISE
from ._learning import TOGETHER

__all__ = ["DepartureGate", "WireCount"]

_EPSILON = 1e-9  # tokens: float noise in a sum of refills, not a shortfall


def _refilled(state: tuple[float, float] | None, when: float, rate: float, burst: float) -> float:
    """What the bucket holds at ``when`` from ``state`` (its tokens, as of a time),
    refilled at ``rate`` up to ``burst``: all of its burst before any request."""
    if state is None:
        return burst
    tokens, at = state
    return min(burst, tokens + (when - at) * rate)


@attrs.define
class DepartureGate:
    """A told bucket counted as this process's requests reach the HTTP layer."""

    # Its tokens as of a time, later than now while a request waits for one (read
    # before then, it holds less: that request's token is spoken for).
    _state: tuple[float, float] | None = None
    # (admitted at, when, tokens found then) of the request that took the gate's latest
    # token: leaving later than that, it owes the refill lost past a full bucket
    # (`left_late`).
    _latest: tuple[float, float, float] | None = None

    def tokens(self, when: float, rate: float, burst: float) -> float:
        """What the bucket holds at ``when``, counted as requests leave."""
        return _refilled(self._state, when, rate, burst)

    def take(
        self, admitted_at: float, now: float, rate: float, burst: float, margin: float
    ) -> float:
        """A request of a call admitted at ``admitted_at`` leaves now: how long it waits for
        a token (and ``margin`` more, if it waits at all); the token is taken."""
        tokens = self.tokens(now, rate, burst)
        wait = 0.0
        if tokens < 1.0 - _EPSILON:
            wait = (1.0 - tokens) / rate + margin
        self._state = (tokens + wait * rate - 1.0, now + wait)
        # What it finds as it leaves; past a full bucket, ``margin`` is no token.
        self._latest = (admitted_at, now + wait, min(burst, tokens + wait * rate))
        return wait

    def give_back(self) -> None:
        """The request `take` gave a token did not leave (refused as it waited, or
        cancelled): the token is the next request's. Kept, every call after a
        refusal of a bucket of one waited a token more than the server asked."""
        if self._state is not None:
            tokens, at = self._state
            self._state = (tokens + 1.0, at)

    def left_late(self, admitted_at: float, now: float, rate: float, burst: float) -> None:
        """The request of a call admitted at ``admitted_at`` leaves ``now``; if it took the
        gate's latest token, and the bucket was full as it took it or filled up before it
        arrived (a paced bucket of one is full as each request leaves), the server's
        bucket stayed full until it arrived, and the gate owes the refill lost (up to a
        token's: later still, the next request reached the server first).

        The gate counts a request as leaving as it reaches the HTTP layer; one
        that opens a connection leaves once it is open. In real time, against
        20/s with a burst of 10, tools that set up for 0.1 s sent the burst's
        ten requests at once, their connections opened for 6 ms, and the
        server refilled from then: the eleventh, on a connection quick to
        open, came a token after the burst reached the gate, 0.9 of a token
        after the server took it in, and was refused.
        """
        latest = self._latest
        if latest is None or latest[0] != admitted_at or self._state is None:
            return
        self._latest = None
        _, when, found = latest
        lost = min(1.0, found + (now - when) * rate - burst)  # the refill past a full bucket
        if lost > 0.0:
            tokens, at = self._state
            self._state = (tokens - lost, at)

    def held(self, hold: float, now: float, rate: float, burst: float) -> None:
        """The request `take` counted as leaving now leaves ``hold`` later: its token is
        taken then. A bucket that is full meanwhile gains nothing while it waits, so
        the next request's token comes a token after this one's real departure.
        (Counted as leaving before its hold, a request held 50 ms behind a tool's
        0.1 s set-up was followed by one 50 ms after it, against 10/s: a 429.)"""
        if hold <= 0.0 or self._state is None:
            return
        _, at = self._state
        leaves = max(at, now + hold)  # held together, they leave together
        then = self.tokens(leaves, rate, burst)  # with this one's token spent
        self._state = (min(burst, then + 1.0) - 1.0, leaves)  # spent as it leaves


@attrs.define
class WireCount:
    """A told bucket counted as requests' headers reach the wire."""

    # Its tokens as of a time, refilling from then: later than now where a request
    # that took a full bucket moved the refill on (`written`).
    _state: tuple[float, float] | None = None
    # When the latest burst's first request took its token here, and how much of its
    # late arrival this count owes already (`owe_late_arrival`).
    _burst: tuple[float, float] = (math.inf, 0.0)
    # A request after the latest burst's first found this count full again (`take`).
    _full_again: bool = False
    # How much later than they left here bursts over new connections were read, at most.
    read_late: float = 0.0

    def new_burst(self) -> None:
        """A burst begins: its first request is still to take its token here."""
        self._burst, self._full_again = (math.inf, 0.0), False

    def refills_from(self, when: float) -> float:
        """When the count refills from, as of ``when``: then, or later where a request
        that took a full bucket moved its refill on (`written`)."""
        return when if self._state is None else max(when, self._state[1])

    def tokens(self, when: float, rate: float, burst: float) -> float:
        """What the bucket holds at ``when``, counted by when requests reached the wire:
        all of its burst before the first. The server's bucket stays full until a
        request that took a full bucket is read, and a request sent meanwhile finds
        it so."""
        return _refilled(self._state, self.refills_from(when), rate, burst)

    def short_by(self, now: float, rate: float, burst: float) -> float:
        """How long until a request leaving ``now`` has a token here (0: it has one),
        counted from now. Where a late request moved the refill start past now
        (`written`), that is too short: the request asks again after it
        (`fanout._http_core`), and waits the rest then."""
        tokens = self.tokens(now, rate, burst)
        return 0.0 if tokens >= 1.0 - _EPSILON else (1.0 - tokens) / rate

    def take(self, now: float, rate: float, burst: float, burst_began: float | None) -> float:
        """A request's headers leave ``now``: its token is taken; the tokens it found.
        ``burst_began``: when the latest burst began, if one has."""
        found = self.tokens(now, rate, burst)
        self._state = (found - 1.0, self.refills_from(now))
        left, owed = self._burst
        self._full_again |= left < now and found >= burst - _EPSILON
        if burst_began is not None and burst_began <= now < left:
            self._burst = (now, owed)
        return found

    def written(self, found: float, late: float, rate: float, burst: float) -> None:
        """The request that found ``found`` tokens here (`take`) is read ``late`` seconds
        after it took its token: a bucket it found full stays so until then, and its
        refill starts that much later (up to a token's time)."""
        if self._state is None:
            return
        lost = min(1.0, found + late * rate - burst)  # the refill past a full bucket
        if lost > 0.0:
            tokens, at = self._state
            self._state = (tokens, at + lost / rate)

    def owe_late_arrival(
        self, arrived_by: float, now: float, rate: float, burst: float, spread: float
    ) -> None:
        """The latest burst's first request reached the server by ``arrived_by`` at the
        latest (its earliest answer, less the quickest warm call): this count owes the
        refill a full server's bucket lost from when that request took its token here
        until then. As a quicker warm call comes, more is owed. ``spread``: how much
        the warm answers vary.

        The slack starts the bookings after it that much later
        (`ScopeFront._observe_arrival`), but requests already booked leave on
        this count, which took the burst as arriving when it left. A server slow
        to read each new connection's first request (100 ms, a burst of 5 at
        10/s) took the burst in a token late; the requests held for the worst
        case (`ScopeFront.warm_hold`) left after one booked behind them that a
        warm answer had let go at once, 49 ms after it: a 429, in real time, one
        run in three (none in 16 now).

        The latest, not the earliest the answers allow (less how much warm calls
        vary, as the slack takes it): a burst's earliest answer is the quickest of
        many, and the warm calls' spread can be the way back's alone. Against a
        server written apart from fanout, whose answers Nagle's algorithm held 40 ms
        now and then, the earliest reading owed 62 ms of a 100 ms late burst, and 200
        calls at 50/s (B=20, C=16) drew one or two 429s in each of six runs (7 of
        10 owing nothing; 1 of 25 owing the latest). Against a server whose answers
        jitter and that read the burst on time, the latest costs up to the jitter
        once.
        """
        if self._state is None:
            return
        left, owed = self._burst
        late = arrived_by - left
        # The requests after it reach the server in an order of their own within
        # ``TOGETHER``: kept as a margin, once. (Counted to the ms, the paced requests
        # after such a burst found 1.0008-1.004 tokens, and one a ms early, 0.998.)
        # A burst read within it of leaving owes that, and as much again (or how much
        # the warm answers vary, if more) as the margin: a threaded server reads a new
        # connection's first request a ms or three late, and owing nothing, 20 calls
        # at 10/s drew a 429 in one real-time run in ten (none in 30 since). Not once
        # a request found the wire full again since: it left after the server had
        # filled up too (held for the worst case, `ScopeFront.warm_hold`), both count
        # from it, and owing the read again, a bucket of one read 5 ms late kept each
        # token 5 ms more. However little, each request that opens a connection owes
        # it too.
        self.read_late = max(self.read_late, late)
        if late > TOGETHER + CLOCK_NOISE:
            owes = late + TOGETHER
        elif self._full_again:
            owes = 0.0
        else:
            owes = max(0.0, late) + min(TOGETHER, max(late, spread))
        if owes <= owed:
            return
        tokens = self.tokens(now, rate, burst) - (owes - owed) * rate
        self._state = (max(tokens, -burst), self.refills_from(now))
        self._burst = (left, owes)
