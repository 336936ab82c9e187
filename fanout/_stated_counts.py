"""The counts a server's answers stated, and what each tells of the others.

A ``Remaining`` is the server's count as one request reached it. Requests
overtake each other on the way in, so a count read alone may have taken
requests sent after its own, or missed some sent before. The counts read
already say which: one higher than the refill since could make was counted
first; the least of a wave's counts is what the server held once it had
them all. ``StatedCounts`` keeps the latest counts by when each was counted,
and answers those questions for the scope front (`fanout._front`), against
what this process sent (`fanout._outgoing`).
"""

from __future__ import annotations

import collections
import math
from typing import TYPE_CHECKING

import attrs

from ._learning import TOGETHER
from ._outgoing import Outgoing

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["StatedCounts", "counted_after_at_most"]

# Counts kept to tell what the server counted first (`StatedCounts.counted_before`):
# requests that overtake one on the way in are answered about when it is, among the
# latest answers.
_COUNTS_KEPT = 64
_LEVEL_WAVE = 3  # answers stating one count that show a server counting as it answers
_LEVEL_MARGIN = 4.0  # ... where this many times the rate in use would not explain them


def _counted_first(
    counted: float, later: float, remaining: float, rate: float, late: float
) -> bool:
    """Whether a request that left ``later`` s after another, and whose answer said
    ``counted`` left, was surely counted before the other, whose answer said
    ``remaining``: higher by more than the refill between them could make a floored
    count (at ``rate``, over ``later`` and how much later one may arrive: ``late``)."""
    return counted >= remaining + rate * (later + late)


def counted_after_at_most(
    shown: Sequence[float], others: float, remaining: float, refill: float
) -> float:
    """How many of ``others`` requests sent before one whose count said ``remaining``
    can have been counted after it, where ``shown`` are the counts of those of them
    answered already, and ``refill`` the most the server refills between two counts.

    The ``j``-th counted after it found what that count left, less ``j``,
    plus the refill: fewer than ``remaining + 1 - j + refill`` (counts are
    floored). So no more of those answered than ``remaining + refill + 1 -
    min(shown)`` can be among them; all of those not answered can
    (`StatedCounts.counted_after_at_most`, and a property over generated
    buckets in ``tests/test_learning.py``).
    """
    unanswered = max(0.0, others - len(shown))
    bound = remaining + 1.0 + refill - min(shown, default=math.inf)
    if not math.isfinite(bound):  # nothing shown, or a rate or count no server meant
        return max(0.0, others)
    return unanswered + min(float(len(shown)), max(0.0, math.ceil(bound) - 1.0))


@attrs.define(eq=False)
class StatedCounts:
    """The latest counts answers stated, each as (when counted, Remaining, refused)."""

    _outgoing: Outgoing
    _counts: collections.deque[tuple[float, float, bool]] = attrs.field(
        init=False, factory=lambda: collections.deque(maxlen=_COUNTS_KEPT)
    )

    def add(self, counted_at: float, remaining: float, *, refused: bool) -> None:
        """An answer stated ``remaining`` as counted at ``counted_at``."""
        self._counts.append((counted_at, remaining, refused))

    def counted_before(self, sent: float, remaining: float, rate: float, late: float) -> int:
        """How many requests sent after the one sent at ``sent`` the server surely counted
        before it, as their answers, read already, show.

        A request counted after it left the server's count lower, or higher by
        less than the refill between the two (at ``rate``, over how far apart
        they left and how much later one may arrive than the other: ``late``),
        since a whole count is floored. One whose count is higher by that much
        was counted first, though it left after. Taken for uncounted, a request
        that left 0.4 ms after one it overtook on the way cost a learned 5/s
        bucket a token: the sixth call went at 0.46 s for 0.26 s. At a rate set
        too low the refill is understated, and so is the server.
        """
        return sum(
            1
            for other, counted, _ in self._counts
            if other > sent and _counted_first(counted, other - sent, remaining, rate, late)
        )

    def counted_after_at_most(
        self, sent: float, before: float, remaining: float, late: float, rate: float | None
    ) -> float:
        """How many of the requests sent up to ``before`` s ahead of the one sent at
        ``sent`` the server may have counted after it, as their answers, read already,
        allow (`counted_after_at_most`, refilled at ``rate`` over how much later one may
        arrive than another: ``late``); all of them where ``rate`` is None (the
        answers cannot be matched to requests).

        Taken for all after it, seven sent over 11 ms that each said 1 was
        left (slowapi reads its count as it answers) were counted twice, and
        the scope held its tenth call for a second against a window of ten
        (1.25-1.29 times the minimum in real time, 1.12-1.13 since). Answers
        are matched to requests by when they left (`Outgoing.left`); one that
        left within ``TOGETHER`` of the span's start may have been booked
        before it, and is not counted as shown.
        """
        since = sent - before
        left = self._outgoing.left_within(since, sent)
        others = max(self._outgoing.sent_within(since, sent), left) - 1.0
        if rate is None:
            return max(0.0, others)
        shown = [
            counted
            for other, counted, refused in self._counts
            if not refused and since + TOGETHER <= other < sent
        ]
        if not 0 < len(shown) <= left - 1.0:  # not matched to requests known to have left
            return max(0.0, others)
        return counted_after_at_most(shown, others, remaining, rate * (late + TOGETHER))

    def tied_shortfall(self, sent: float, before: float, remaining: float) -> float:
        """How far below ``remaining`` the server's count can be, of the requests sent up
        to ``before`` s ahead of the one sent at ``sent``, once every one of them the
        server admitted is answered (one it refused took no token); inf until then.

        Whichever of them the server counted last found all of them counted (on
        arrival, or as it answered: either way the count was taken after each
        had arrived), and said no less than the least of their counts. So the
        server holds that least count, less what started since, whatever the
        order they reached it in. Read one by one, two probes that both said 3
        (a server that counts as it answers: each count took both) were each
        taken for one the other may have come after, and the bucket kept a token
        too few for good (8 calls at 5/s, 1.24 times the minimum).
        """
        since = sent - before
        outgoing = self._outgoing
        others = max(outgoing.sent_within(since, sent), outgoing.left_within(since, sent)) - 1.0
        answered = [counted for _, counted in self.admitted(since, sent)]
        if others <= 0 or len(answered) - 1.0 < others:  # its own is read already
            return math.inf
        return max(0.0, remaining - min(answered))

    def admitted(self, since: float, until: float) -> list[tuple[float, float]]:
        """The counts read of admitted requests (when each was counted, and what it
        said), counted from ``since`` to ``until``, both included."""
        return [
            (other, counted)
            for other, counted, refused in self._counts
            if not refused and since <= other <= until
        ]

    def may_have_overtaken(
        self, sent: float, now: float, remaining: float, rate: float, late: float
    ) -> float:
        """Tokens of requests that left after the one sent at ``sent``, so soon after it
        (within how much later one request may reach the server than another) that the
        server may have counted them first, and whose answers, read already, do not say.

        An answer says it was counted first (`_counted_first`); and counted
        after, by a count lower by at least the refill over ``late``: one counted
        first left the server a token more than its own refilled to this one's
        counting, which came at most ``late`` later, and counts are floored.
        """
        until = min(now, sent + max(TOGETHER, late))
        shown = sum(
            1
            for other, counted, _ in self._counts
            if sent < other <= until
            and (
                _counted_first(counted, other - sent, remaining, rate, late)
                or remaining >= counted + rate * late
            )
        )
        return max(0.0, self._outgoing.started_between(sent, until) - shown)

    def level_wave(
        self, sent: float, remaining: float, rate: float, burst: float, *, within: float,
        late: float,
    ) -> bool:  # fmt: skip
        """Whether the answers read show a server that counts as it answers: at least
        ``_LEVEL_WAVE`` requests, sent up to ``within`` s before the one sent at
        ``sent``, so close together that not even `_LEVEL_MARGIN` times ``rate`` could
        have refilled between their arrivals (up to ``late`` apart) what they took,
        stating one count below a full bucket.

        Counted as each arrived, ``k`` requests in a row each take a token, so
        their floored counts can all be level only where the bucket refilled
        more than ``k - 2`` tokens between the first and the last arrival. A
        bucket full on arrival states ``B - 1`` to each at a fast enough
        refill, and is left out.
        """
        if remaining >= burst - 1.0:
            return False
        since = sent - max(within, TOGETHER)
        level = [other for other, counted in self.admitted(since, sent) if counted == remaining]
        if len(level) + 1 < _LEVEL_WAVE:
            return False
        span = sent - min(level) + late + TOGETHER
        return len(level) - 1.0 > _LEVEL_MARGIN * rate * span
