"""Whether a window explains what a server that states nothing admitted, refused and said.

A server that counts "``L`` per ``W`` seconds" (a fixed window from the
first request, or a sliding log) and sends nothing but a ``Retry-After``
with its 429s looks, from its answers alone, like a token bucket with a
deep burst and a slow refill: ``L`` admitted at once, then a long wait.
Fitted as that bucket, a sliding log of 20 per 4 s was paced at 0.98/s,
against the 5/s it allows (5.9 times the minimum). What tells them apart is
the second wait: a bucket's is until its next token, a window's until its
oldest request leaves (a log) or until the window ends (fixed), which the
starts so far predict to the precision the server gives.

The first 429 of a burst gives the guess: ``L`` is what was admitted before
it, and the window ends when the server takes requests again, so ``W`` is
from the first request to that reopening (a rounded-up ``Retry-After``
makes it a little long, never short). The guess stands when every answer
agrees with it (no admission where the window was full, no refusal where it
had room, each allowing for ``tolerance`` of arrival spread) and the second
429's reopening is where the guess puts it.

A server that states no wait either shows a window only by shutting: a run
admitted, then refusals in a row until it takes a request again (a
`Closure`). The window is then at most the time from the run's first request
to that reopening, so the run per that time is a pace the window allows
wherever the run filled one window.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Literal

import attrs

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Closure", "WindowGuess", "closure_before", "explained_by_window"]


@attrs.frozen
class WindowGuess:
    """``limit`` requests per ``length`` seconds, counted from ``first``."""

    limit: int
    length: float
    first: float


@attrs.frozen
class Closure:
    """``admitted`` requests in a row from ``first``, then ``refused`` in a row from
    ``closed_at`` to ``last_refused``: a server that took a run of requests and then shut."""

    admitted: int
    first: float
    closed_at: float
    refused: int
    last_refused: float

    def reopened(self, at: float) -> WindowGuess:
        """The window shown by a request sent ``at`` admitted again: the run per the
        time from its first request to ``at``. A window's true length is no longer
        (the server took a request again by then), so its average rate is no
        faster than the server's. A bucket drained and refilled slowly closes too;
        its guess is a rate the next few requests test."""
        return WindowGuess(self.admitted, at - self.first, self.first)

    def whole(self, at: float) -> WindowGuess:
        """The window ``reopened`` shows, a whole number of seconds long where one fits: no
        longer than the time to ``at``, and longer than to the last refusal, which found
        it still shut. Windows are whole seconds (the IETF policy's ``w``, Kong's and
        Envoy's units), and the reopening is probed a little past one; counted in at the
        guess instead, a window of 10 per second was counted as 10 per 1.05 s, and a
        turn of 60 calls took 1.17 times the fastest, not 1.13."""
        guess = self.reopened(at)
        whole = math.floor(guess.length)
        if whole < 1 or self.first + whole <= self.last_refused:
            return guess
        return WindowGuess(self.admitted, float(whole), self.first)


def closure_before(
    answers: Sequence[tuple[float, bool]], until: float, *, tolerance: float
) -> Closure | None:
    """The closure that ``answers`` ((sent, refused), sorted by when sent) end with among
    those sent up to ``until``: None unless the last were refused after two or more
    were admitted.

    A refusal sent within ``tolerance`` before an admission in the run is
    part of the run: the two reached the server in the other order (on
    Redis, under load, a run of 8 read as one admitted, and the window was
    never found shut)."""
    before = [(sent, refused) for sent, refused in answers if sent <= until]
    refused = _refused_at_end(before)
    closed_at = len(before) - refused
    run, first = _admitted_run(before[:closed_at], tolerance)
    if refused == 0 or run < 2:
        return None
    return Closure(run, before[first][0], before[closed_at][0], refused, before[-1][0])


def _refused_at_end(answers: Sequence[tuple[float, bool]]) -> int:
    """How many of ``answers`` at its end were refused."""
    count = 0
    for _, refused in reversed(answers):
        if not refused:
            break
        count += 1
    return count


def _admitted_run(answers: Sequence[tuple[float, bool]], tolerance: float) -> tuple[int, int]:
    """How many of ``answers`` at its end were admitted, passing over refusals sent
    within ``tolerance`` before one of them; and the index of the run's first."""
    count, first, next_admitted = 0, len(answers), math.inf
    for index in range(len(answers) - 1, -1, -1):
        sent, refused = answers[index]
        if not refused:
            count, first, next_admitted = count + 1, index, sent
        elif next_admitted - sent > tolerance:
            break
    return count, first


def explained_by_window(
    answers: Sequence[tuple[float, bool]],
    guess: WindowGuess,
    refused_at: float,
    reopens: tuple[float, float],
    *,
    tolerance: float,
) -> Literal["sliding", "fixed"] | None:
    """Which window of ``guess``'s numbers explains ``answers`` ((sent, refused), sorted
    by when sent) and a 429 to the request sent at ``refused_at`` that reopens between
    ``reopens``: a sliding log, fixed windows, or neither (None)."""
    admitted = [sent for sent, refused in answers if not refused and sent >= guess.first]
    refusals = [sent for sent, refused in answers if refused and sent >= guess.first]
    if guess.limit < 2 or not admitted:
        return None
    seen = _Seen(admitted, refusals, refused_at, reopens, tolerance)
    if _sliding(seen, guess):
        return "sliding"
    if _fixed(seen, guess):
        return "fixed"
    return None


@attrs.frozen
class _Seen:
    """When admitted and refused requests were sent (sorted); the 429 to judge by, sent at
    ``refused_at``, whose wait ends between ``reopens``; how far out of step they arrive."""

    admitted: list[float]
    refusals: list[float]
    refused_at: float
    reopens: tuple[float, float]
    tolerance: float

    def reopens_at(self, when: float) -> bool:
        return self.reopens[0] - self.tolerance <= when <= self.reopens[1] + self.tolerance


def _within(starts: list[float], since: float, until: float) -> int:
    """How many of ``starts`` (sorted) are in ``(since, until)``."""
    return bisect.bisect_left(starts, until) - bisect.bisect_right(starts, since)


def _sliding(seen: _Seen, guess: WindowGuess) -> bool:
    """A log: never ``limit`` in any ``length`` before an admission, always before a refusal,
    and the refused request's wait ends as the oldest of those before it leaves."""
    limit, length, tolerance = guess.limit, guess.length, seen.tolerance
    admitted, refused_at = seen.admitted, seen.refused_at
    for sent in admitted:
        if _within(admitted, sent - length + tolerance, sent - tolerance) >= limit:
            return False
    for sent in seen.refusals:
        if _within(admitted, sent - length - tolerance, sent + tolerance) < limit:
            return False
    inside = admitted[bisect.bisect_right(admitted, refused_at - length) :]
    inside = inside[: bisect.bisect_right(inside, refused_at)]
    if len(inside) < limit:
        return False
    return seen.reopens_at(inside[len(inside) - limit] + length)


def _fixed(seen: _Seen, guess: WindowGuess) -> bool:
    """Windows end to end from the first request: never more than ``limit`` admitted in one,
    ``limit`` before each refusal in its window, and the refused request's wait ends with it.
    Requests within ``tolerance`` of a window's edge may be counted on either side of it,
    so the refused request must be clear of one: at an edge it shows no window full.
    (Refused as a guessed window opened, a bucket of 2/s passed for 8 per 0.75 s.)"""
    limit, length, first = guess.limit, guess.length, guess.first
    admitted, refused_at, tolerance = seen.admitted, seen.refused_at, seen.tolerance

    def window_of(sent: float) -> int:
        return int((sent - first) // length)

    def clear(sent: float) -> bool:
        offset = (sent - first) % length
        return tolerance < offset < length - tolerance

    counts: dict[int, int] = {}
    for sent in admitted:
        if clear(sent):
            counts[window_of(sent)] = counts.get(window_of(sent), 0) + 1
    if not clear(refused_at) or any(count > limit for count in counts.values()):
        return False
    for sent in [*seen.refusals, refused_at]:
        window = window_of(sent)
        start = first + window * length
        if clear(sent) and _within(admitted, start - tolerance, sent + tolerance) < limit:
            return False
    return seen.reopens_at(first + (window_of(refused_at) + 1) * length)
