"""Whether a stated ``q`` per ``w`` is what the server's own counts show.

An IETF ``RateLimit-Policy: "d";q=5;w=1`` says the server allows ``q``
requests per ``w`` seconds, and a learning scope paces at ``q / w``
(`fanout._learning`, source 1). ``w`` is whole seconds: a token bucket of 5
refilled at 10/s is full again in half a second, and can only state
``q=5;w=1``. Taken as the rate, 5/s, it was a ceiling never passed: 13 of
the 22 calls that can finish under 2 s deadlines, and 1.84 times the
fastest for the issue's medium row (10/s, burst 4, a cap of 4, 400 ms).

The counts the server states with each answer say which it is. A window of
``q`` per ``w``, fixed or sliding, counts every request it took in the
window so far: an answer that says ``r`` remain was counted with at most
``q - r`` of ours in its window, itself among them. Where our ``m``-th latest
request before it (``m = q - r``) was surely counted too, the window began
after that one reached the server: a fixed window's edge lies in the *span*
from that request's arrival to the count (a sliding log's window reaches
back less than ``w``, so the span is a window or more long, and says
nothing). Fixed windows' edges are ``w`` apart, one lattice of them, so
(`StatedPolicy.refuted`) no window of ``q`` per ``w`` counted what the
server stated where

- no lattice of edges ``w`` apart meets every span shorter than ``w``, or
- more spans than such a lattice can hold follow one another with no
  overlap: ``k`` of them, each beginning where the one before ended (at the
  same request) or later, need ``k`` edges between the first's beginning
  and the last's end.

A bucket paced at ``q / w`` below its refill states ``q - 1`` at every
answer: each request the first of its window, edges a pace apart.

Each answer's span is found as it is read, and kept (`_KEPT`), each check
as it comes: a few microseconds an answer, not a replay of the last 64.
Each span is read as leniently as the clocks allow, so that an honest
window is never refuted: from when the earlier request was sent (it
arrived no sooner than that, by the least time on the way in, the same for
all, which moves every edge alike), to the latest the count can have been
taken (`ScopeFront._check_policy`: as the request arrived, up to how much
later one may arrive than another; as the server answered, by the time the
answer was read). Only requests sent ``together`` or more before it are
surely counted before it (the spread of arrivals), and only those whose
answers are read (a window counts the others too, which only makes the
span longer). Two spans follow one another at the same request only where
counts are taken as requests arrive. A server that counts before the
request (``r = q`` to one that found the window empty) has one more in each
span. Requests of other processes sharing the limit only lower ``r``.
"""

from __future__ import annotations

import bisect
import collections
import math

import attrs

__all__ = ["StatedPolicy"]

_KEPT = 64  # admitted answers, spans and chains of them kept
_NOISE = 1e-9  # seconds: float noise at an edge


@attrs.frozen
class _Span:
    """A fixed window's edge lies in ``(since, until]``: after the earlier request (the
    answer numbered ``left``) arrived, by the count stated to the one numbered ``right``."""

    left: int
    right: int
    since: float
    until: float


@attrs.define(eq=False)
class StatedPolicy:
    """The counts stated with one policy, and whether they refute it."""

    _policy: tuple[float, float] | None = attrs.field(init=False, default=None)
    # (sent, counted by, remaining, on arrival) of each admitted answer, in the order read.
    _read: collections.deque[tuple[float, float, float, bool]] = attrs.field(
        init=False, factory=lambda: collections.deque(maxlen=_KEPT)
    )
    # (sent, number) of the same answers, by when sent; numbered as read.
    _sent: list[tuple[float, int]] = attrs.field(init=False, factory=list)
    _numbered: int = attrs.field(init=False, default=0)
    _counts_before: bool = attrs.field(init=False, default=False)
    # Where a lattice's edges may lie, as offsets ``[lo, hi]`` on ``[0, window)``
    # (None: anywhere); and chains of spans that follow one another (first's since,
    # how many, the last).
    _phases: list[tuple[float, float]] | None = attrs.field(init=False, default=None)
    _chains: collections.deque[tuple[float, int, _Span]] = attrs.field(
        init=False, factory=lambda: collections.deque(maxlen=_KEPT)
    )
    _refuted: bool = attrs.field(init=False, default=False)

    def refuted(
        self, limit: float, window: float, remaining: float, *, sent: float, counted_by: float,
        together: float, on_arrival: bool = True,
    ) -> bool:  # fmt: skip
        """Take in an admitted answer to the request sent at ``sent`` that stated
        ``remaining`` with a policy of ``limit`` per ``window`` s, counted by
        ``counted_by`` at the latest (less the least time on the way in); True when no
        window of ``limit`` per ``window`` explains the counts stated with it so far.
        ``together``: how much sooner than another a request must have been sent to be
        surely counted first; ``on_arrival``: the count was taken as the request arrived.
        """
        numbers = (limit, window, remaining, sent, counted_by, together)
        if not all(map(math.isfinite, numbers)):
            return False  # garbage refutes nothing
        if not (limit >= 1 and window > 0 and remaining >= 0 and sent <= counted_by):
            return False
        if self._policy != (limit, window):  # another policy: its counts start afresh
            self._policy, self._counts_before = (limit, window), False
            self._read.clear()
            self._sent.clear()
            self._forget_spans()
        if self._refuted:
            return True
        answer = (sent, counted_by, remaining, on_arrival)
        self._read.append(answer)
        number = self._numbered = self._numbered + 1
        bisect.insort(self._sent, (sent, number))
        if len(self._sent) > _KEPT:
            del self._sent[0]
        together = max(0.0, together)
        if remaining >= limit and not self._counts_before:
            # It counts before the request: every span so far was a request short.
            self._counts_before = True
            self._forget_spans()
            for earlier, read in enumerate(self._read):
                self._take(limit, window, together, read, number - len(self._read) + 1 + earlier)
        else:
            self._take(limit, window, together, answer, number)
        return self._refuted

    def _forget_spans(self) -> None:
        self._phases, self._refuted = None, False
        self._chains.clear()

    def _take(
        self, limit: float, window: float, together: float,
        answer: tuple[float, float, float, bool], number: int,
    ) -> None:  # fmt: skip
        """The span of the answer numbered ``number``, if it has one shorter than
        ``window``: refuted where no lattice meets it with the others, or where it
        ends a chain too long (module docstring)."""
        at, counted_by, remaining, on_arrival = answer
        ours = limit - remaining + (1.0 if self._counts_before else 0.0)
        if ours < 1.0:
            return  # more remain than the policy holds: not this policy's count
        # Our ``m``-th latest request sent ``together`` before it, and before it at all.
        before = bisect.bisect_left(
            self._sent, (min(at - together, math.nextafter(at, -math.inf)), math.inf)
        )
        m = math.floor(ours)
        if before < m:
            return
        since, left = self._sent[before - m]
        if counted_by - since >= window - _NOISE:
            return
        span = _Span(left, number, since, counted_by)
        self._phases = _meet(self._phases, span, window)
        self._refuted = not self._phases or self._chained(span, window, on_arrival)

    def _chained(self, span: _Span, window: float, on_arrival: bool) -> bool:
        """Whether ``span`` ends a chain of spans that surely do not overlap, more than a
        lattice of edges ``window`` apart can meet from the first's beginning to its end.

        It follows a span that ends at the request it begins at (where the count
        was taken as that request arrived), or before it was sent."""
        too_long = False
        chains = self._chains
        for index, (first, count, last) in enumerate(chains):
            joined = on_arrival and span.left == last.right
            if joined or span.since >= last.until:
                chains[index] = (first, count + 1, span)
                too_long |= count + 1 > math.ceil((span.until - first) / window - _NOISE)
        chains.append((span.since, 1, span))
        return too_long


def _meet(
    phases: list[tuple[float, float]] | None, span: _Span, window: float
) -> list[tuple[float, float]]:
    """Where a lattice of edges ``window`` apart may lie (offsets on ``[0, window)``) that
    meets every span so far and ``span`` (shorter than ``window``)."""
    lo = span.since % window - _NOISE
    hi = lo + (span.until - span.since) + 2 * _NOISE
    arc = [(lo, hi)] if hi < window else [(lo, window), (0.0, hi - window)]
    if lo < 0.0:
        arc = [(0.0, hi), (window + lo, window)]
    if phases is None:
        return arc
    return [(max(a, c), min(b, d)) for a, b in phases for c, d in arc if max(a, c) <= min(b, d)]
