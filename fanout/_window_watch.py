"""Whether a server counts in windows: what its answers and 429s show.

A server that counts "N per W seconds" in windows (fixed or sliding) is
served by a sliding log, not the bucket (`fanout._window`). Told so, a scope
starts with one; otherwise its answers show it. An answer that says nothing
remains, with a ``Reset``, reports a window spent; a 429 that comes while
that window is still open votes for windows, where the server admitted no
more than a window allows meanwhile (`WindowWatch.could_be_windows`). Given
a rate, the second such vote counts in windows (a token bucket draws a stray
429 when requests reach it out of step); learning, the first puts the guessed
window on trial, one request at a time, and the first answer after it
reopens judges it (`WindowWatch.judge`). A learned window that draws 429s
from its second on is too short, and grows (`WindowWatch.refused_in_window`).

``WindowWatch`` keeps that evidence and says what it shows; the scope front
(`fanout._front`) acts on it: it counts in the window, or paces as a bucket.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs

from ._learning import TOGETHER, whole_seconds
from ._window import past_reset

if TYPE_CHECKING:
    from ._outgoing import Outgoing
    from ._values import RateLimitInfo

__all__ = ["WindowWatch"]

_WINDOW_VOTES = 2  # 429s inside windows reported spent that show a window, given a rate
_STEP_TOLERANCE = 0.05  # seconds: a window's length read off reported ends, rounded down to whole
# A window trial counts one request over a sliding log's limit (sent at its edge) only
# where the oldest it counts is at least this share of the window old.
_EDGE = 0.5


def _shown_length(reset: float | None, since_due: float) -> float:
    """The least a window can be long, from the ``Reset`` a request read ``since_due`` s
    after the window it is in had surely begun, when it found it just reopened (0: no reset).

    An exact reset is the rest of the window. The window began no later than
    its reported end (the one before it ended then), nor than the request
    arrived (it is in it): the time since then is the least of what went
    before. (Counted only from the reported end, a reset given to the
    millisecond is read a round trip later: 5 per 2 s was counted as 5 per
    1.932 s, and each third window's five were refused.)
    A whole number of seconds is rounded up, and just after the window
    reopened it is its length, where windows are whole seconds; the time
    since is then in the rounding (added, a log of 4 per second was counted
    as 4 per 1.005 s).
    """
    if reset is None:
        return 0.0
    if whole_seconds(reset):
        return reset
    return reset + since_due


@attrs.frozen
class _WindowTrial:
    """A learned window on trial (`WindowWatch.judge`): its guessed ``length``,
    when a request tries it (``reopens``: the end reported, or the server's wait if
    sooner), and the end the server reported for the window found spent, where it gave
    that finer than whole seconds (`RateLimitInfo.reset_exact`)."""

    length: float
    reopens: float
    reported_end: float | None


def _late_length(
    trial: _WindowTrial, sent: float, info: RateLimitInfo, now: float, oldest: float
) -> float:
    """The longest a window can be where the server reports its ends late: it let the
    trial, sent at ``sent``, in before the end it reported for the window found spent
    (``trial.reported_end``); inf where nothing shows that. ``info`` is the trial's
    answer, read at ``now``; ``oldest``: when the earliest of ours the server still
    counted then was sent.

    The server reports every end at least ``late`` (the reported end less
    ``sent``) after it came. A fixed window began when the spent one ended,
    so it is no longer than the step between the two reported ends, however
    late both are; a sliding log's oldest leaves a window after it came, so
    it is no longer than the trial's reported end less ``late``, from when
    that oldest was sent. Either way, the longer of the two. slowapi reports
    every end a second late (``1 +`` its expiry): 10 a second was read as 10
    per 1.95 s, 1.78 times the minimum. Only ends given finer than whole
    seconds (slowapi's float epochs) are read so: one rounded up by up to a
    second makes an honest window seem to reopen early, and two such ends may
    be closer than their windows' (19 per 3.11 s stepped by 3 s, its next 19
    all refused). Windows are whole seconds: the bound is rounded down to one,
    within ``_STEP_TOLERANCE`` (an end read against a server clock that moved
    between the two).
    """
    before, reset = trial.reported_end, info.reset_after
    if before is None or reset is None or not info.reset_exact:
        return math.inf
    late = before - sent
    if late <= TOGETHER:
        return math.inf
    reported = now + reset
    longest = max(reported - before, reported - late - oldest)
    whole = math.floor(longest + _STEP_TOLERANCE)
    return float(whole) if whole >= 1 else math.inf


@attrs.define
class WindowWatch:
    """The evidence that a server counts in windows, and the window it shows."""

    # 429s inside windows reported spent where a window could explain them.
    _votes: int = 0
    _refusals: int = 0  # a learned log's 429s (`refused_in_window`)
    # When the window an answer reported spent ends (a moment after), its reset, and
    # whether the server gave that finer than whole seconds.
    _open_until: float | None = None
    _reset: float = 0.0
    _reset_exact: bool = False
    trial: _WindowTrial | None = None  # a learned window on trial (`judge`)
    # The length a learned window was guessed at, where its reported ends shortened it.
    _unstepped: float | None = None
    # The least the window on trial can be long, by its 429s' exact waits (`show_length`).
    _shown: float = 0.0

    def reported_spent(self, now: float, reset: float, *, exact: bool) -> None:
        """An answer read at ``now`` said nothing remains until ``reset`` s from now
        (``exact``: finer than whole seconds).

        Tried a moment after the end it names (`past_reset`): at the end itself, a
        server counting it in the old window refused the trial, and the window was
        never learned.
        """
        self._open_until = now + past_reset(reset) if reset > 0 else None
        self._reset, self._reset_exact = reset, exact

    def counting(self) -> None:
        """The scope counts in a window now: the window reported spent is its log's."""
        self._open_until = None

    def guess(self, rate: float, burst: float) -> float:
        """How long a window the server would count in: ``burst`` per this many seconds.

        Never shorter than the reset the server gave when it reported the
        window spent: a learned rate may have crept above the window's.
        """
        return max(burst / rate, self._reset)

    def could_be_windows(self, now: float, rate: float, burst: float, outgoing: Outgoing) -> bool:
        """Whether the server admitted no more than a window allows in the window before now.

        A token bucket draws a stray 429 too (a learned rate a little above
        its own, requests out of step): then it has just admitted far more
        than its burst in the guessed window, which no window server would.
        Half a burst more is allowed, for a fixed window's edge and for
        requests it refused.
        """
        window = self.guess(rate, burst)
        started = outgoing.sent_within(math.nextafter(now - window, math.inf), now)
        return started <= 1.5 * burst

    def refused(
        self, now: float, sent: float, wait: float | None, rate: float, burst: float,
        outgoing: Outgoing, *, may_vote: bool, learning: bool,
    ) -> tuple[float | None, bool]:  # fmt: skip
        """A request sent at ``sent`` was refused at ``now``, the server's ``wait`` given
        (if any): when the window reported spent reopens, if it came inside one (the
        refused call waits for that), and whether the scope counts in windows now.

        ``may_vote``: the scope looks for windows (``window="auto"``) and, learning,
        the request was not sent blind before any answer came (a probe as wide as a
        told cap: its 429 shows a burst smaller than the probe, not a window).
        ``learning``: the first vote puts the guessed window on trial (`judge`),
        where a told rate takes `_WINDOW_VOTES`.
        """
        trial, opened = self.trial, self._open_until
        if trial is not None and sent >= trial.reopens:
            self.trial = None  # refused after the window's reported end: no window
            return None, False
        if opened is None or not now < opened or trial is not None or not may_vote:
            return None, False
        self._open_until, reported = None, opened  # one vote per reported window
        # The server's own wait, where it gives one, is when it takes a request
        # again: a window's ends with the window, but a bucket whose Reset means
        # "until full" reports a window that ends once it is full. Tried then, it
        # passed for a window (20/s with a burst of 30, its Reset 2 s: 15/s). A
        # second at least, as a congestion event holds (`RateLearner`): tried at
        # a wait of 0.4 s, a next-token bucket drew a 429 each half second.
        if wait is not None and wait > 0:
            # A moment after it, as after a reported end (`past_reset`): an HTTP-date
            # names a whole second, where a log of whole seconds whose requests went
            # on whole seconds reopens, and still counts it.
            opened = min(opened, now + past_reset(max(wait, 1.0)))
        if self._reset_exact and wait is not None and whole_seconds(wait):
            # Told to retry before the exact end it reported: the server reports its
            # ends at least that late (slowapi's, a second), and its window spans
            # less than the reset said (`could_be_windows`). Counted as said, 10 a
            # second spanned two windows, twice the limit: the 429 passed for a
            # bucket's, and each one halved the rate (3.4-3.9x in real time).
            late = reported - past_reset(wait) - now
            if late > TOGETHER:
                self._reset = max(0.0, self._reset - late)
        if self.could_be_windows(now, rate, burst, outgoing):
            self._votes += 1
        if learning and self._votes >= 1:
            exact = reported if self._reset_exact else None
            self.trial = _WindowTrial(self.guess(rate, burst), opened, exact)
            self._shown = 0.0
            return opened, False
        return opened, self._votes >= _WINDOW_VOTES

    def show_length(
        self, sent: float, now: float, wait: float, limit: float, outgoing: Outgoing
    ) -> None:
        """The least a window on trial can be long, if it is one, by a 429 to a request sent
        at ``sent`` whose exact ``wait``, read at ``now``, says when the server takes one
        again (nothing where it shows nothing). The trial's answer still judges whether it is
        one by the guessed length (`judge`): a bucket's wait is its next token,
        and judged by this length, a bucket of 13 at 2/s passed for a log.

        A log of ``limit`` frees a place as its oldest request leaves it, a
        fixed window as it ends: either way the ``limit`` latest requests the
        server had counted reach back a window from then. Counted among them,
        those sent with the refused one (it may have overtaken them) make the
        window the shortest it can be. A log of 10 per 2.07 s, guessed from
        halved rates as 1.82 s long, sent nine at once each time it reopened;
        its 429's wait of 0.25 s showed 2.07. Whole seconds, rounded up, show
        nothing; nor do requests other processes sent, which it counted too.
        An HTTP-date's wait is whole on the server's clock, not ours, and
        shows up to a second too long, as the whole-second ``Reset`` the guess
        already takes does (`guess`); so it is read on trial only,
        never to lengthen a window the scope counts in.
        """
        if not wait > 0 or whole_seconds(wait) or outgoing.others_seen():
            return
        reopens, counted = now + wait, 0.0
        for start, cost in reversed(outgoing.started_within(-math.inf, sent + TOGETHER)):
            counted += cost
            if counted >= limit:
                self._shown = max(self._shown, reopens - start)
                return

    def refused_in_window(self, length: float, limit: float) -> float | None:
        """A window this scope learned, ``length`` s long, drew a 429: from the second on,
        it is too short; the length to count in then (None: as it is).

        A bucket whose wait refilled it whole passes the window trial as a
        window does (`judge`); counted in a window a burst per a
        guessed second, a bucket of 3.2/s and burst 4 refused every other
        window's last request, twelve 429s in a turn. The log sent ``limit``
        in a window and the server took one fewer, so that many take at least
        ``limit / (limit - 1)`` windows: the window grows by that, and holds
        what started in it the longer. One 429 is allowed to a window learned
        right (a fixed window's edge), as to one told.
        """
        unstepped, self._unstepped = self._unstepped, None
        if unstepped is not None:
            # Shortened by the ends the server reported (`_late_length`), and refused:
            # it is as long as the guess after all.
            return unstepped
        self._refusals += 1
        if self._refusals < 2:
            return None
        grow = limit / (limit - 1.0) if limit > 1.0 else 2.0
        return length * grow

    def trial_due(self, sent: float) -> bool:
        """Whether a window is on trial and a request sent at ``sent`` tries it: sent once
        it reopened."""
        return self.trial is not None and sent >= self.trial.reopens

    def judge(
        self, info: RateLimitInfo, sent: float, now: float, arrived_by: float, burst: float,
        stated: float | None, outgoing: Outgoing,
    ) -> float | None:  # fmt: skip
        """A learned window is tried before it is trusted, by the first answer after it reopens
        (`trial_due`): ``info``, to a request sent at ``sent`` and read at ``now``, which
        reached the server by ``arrived_by``. The window's length if it shows one, at most
        the policy's ``stated`` window (learning's guess of ``burst`` per it); None if it
        shows a bucket.

        A token bucket whose ``Reset`` is its next token (rounded up to a
        second) reports a spent window and draws a 429 inside it just as a
        window does; taken for a window, its whole burst would go at each
        reopening and most of it be refused, every time. Until the server
        answers a request sent after the reported end, the scope sends one
        request at a time: a window shows room for all but what we sent
        within its length (``Remaining`` is its limit less those), a bucket
        shows only what it refilled, and stays a bucket.

        A window is at least as long as the ``Reset`` it gives after it
        reopened (`_shown_length`). The guess is from our first
        request to the reopening, and a window keyed by the clock began
        before that request: 20 per 2 s met at 0.6 of a window was guessed 1.1
        s long, and its next burst of 20 was refused whole (21 429s, 6 calls
        answered ``rate_limited``; with an exact reset, 1.7 s long). And at most
        as long as a stated policy's window (`RateLimit-Policy`'s ``w``): an
        HTTP-date's wait shows up to a second more than the window's end, and
        22 a second stating ``w=1`` was counted as 22 per 1.75 s.
        """
        trial, remaining, reset = self.trial, info.remaining, info.reset_after
        assert trial is not None
        assert remaining is not None
        length, reopened = trial.length, trial.reopens
        self.trial = None
        # A sliding log of ``burst`` per ``length`` has room for all but what we
        # sent in the last ``length`` (and no more: a deep bucket, 5/s with a burst
        # of 30, showed 4 after 31 in 6 s, its refill), never more than ``burst`` in it;
        # a fixed window that reopened has room for all but what went since. A
        # bucket shows only its refill. (When the guessed length reaches back
        # over a first burst, the sum alone passed any bucket for a log.)
        within = outgoing.started_by(sent) - outgoing.started_by(sent - length)
        since = outgoing.started_by(sent) - outgoing.started_by(reopened - TOGETHER)
        sliding = within <= burst + 1.0 and burst <= remaining + within <= burst + 1.0
        if sliding and within > burst:
            # One over its limit only if the oldest of them may have left the log, at
            # its edge: a bucket of 20 at 4/s whose exact Reset is its next token
            # took the trial 0.25 s after our 20 (a log of 20 per second refuses it),
            # passed for a log, and had its whole burst refused at each reopening (36
            # 429s, calls given up).
            sliding = outgoing.oldest_counted(sent, within) <= sent - length * _EDGE
        if not (sliding or remaining + since >= burst):
            self._votes = 0
            return None
        since_due = sent - reopened
        if info.reset_exact:  # read when answered; the window held it since it arrived
            since_due = max(since_due, now - arrived_by)
        length = max(length, self._shown, _shown_length(reset, since_due))
        oldest = outgoing.oldest_counted(sent, burst - remaining)
        shorter = _late_length(trial, sent, info, now, oldest)
        if shorter < length:
            length, self._unstepped = shorter, length
        return length if stated is None else min(length, stated)
