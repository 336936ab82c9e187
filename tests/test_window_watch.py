"""What shows a server counts in windows (`fanout._window_watch`), step by step.

The scope front acts on ``WindowWatch``'s verdicts; end-to-end behaviour
against window servers is in ``tests/test_window.py`` and the sweeps. These
pin the evidence rules one at a time: a vote needs a 429 inside a window an
answer reported spent, and a server that admitted no more than a window
allows; a told rate counts in windows at the second vote, learning tries the
guess first; a learned window refused twice grows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio
import trio.testing

from fanout._outgoing import Outgoing
from fanout._values import RateLimitInfo
from fanout._window_watch import WindowWatch

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


def _run(main: Callable[[], Awaitable[None]]) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _sent(outgoing: Outgoing, *starts: float) -> None:
    for start in starts:
        outgoing.booked(start, 1.0)


def _refused_inside(
    watch: WindowWatch, outgoing: Outgoing, spent_at: float, reset: float, refused_at: float,
    limits: tuple[float, float], *, learning: bool = False,
) -> tuple[float | None, bool]:  # fmt: skip
    """An answer at ``spent_at`` reports a window spent for ``reset`` s more; a request
    sent at ``refused_at`` is refused at once: what the watch makes of it."""
    watch.reported_spent(spent_at, reset, exact=True)
    return watch.refused(refused_at, refused_at, None, *limits, outgoing,
                         may_vote=True, learning=learning)  # fmt: skip


def test_a_told_rate_counts_in_windows_at_the_second_429_inside_a_spent_window() -> None:
    """Told 10 per second: a 429 inside a window reported spent (no more than ten sent in
    the second before) is one vote; the next such window's 429 counts in windows."""

    async def main() -> None:
        watch, outgoing = WindowWatch(), Outgoing()
        _sent(outgoing, *[k / 100 for k in range(10)])
        reopens, count_now = _refused_inside(watch, outgoing, 0.1, 0.9, 0.2, (10.0, 10.0))
        assert reopens is not None
        assert reopens > 1.0
        assert not count_now
        _, count_now = _refused_inside(watch, outgoing, 1.5, 0.5, 1.6, (10.0, 10.0))
        assert count_now
        assert watch.guess(10.0, 10.0) == 1.0

    _run(main)


def test_a_429_no_window_explains_is_no_vote() -> None:
    """Thirty sent in the last second against a window of ten: a bucket's stray 429, not
    a window's; and a 429 after the reported window ended votes for nothing."""

    async def main() -> None:
        watch, outgoing = WindowWatch(), Outgoing()
        _sent(outgoing, *[k / 30 for k in range(30)])
        for _ in range(2):
            _, count_now = _refused_inside(watch, outgoing, 1.0, 0.5, 1.0, (10.0, 10.0))
            assert not count_now
        assert _refused_inside(watch, outgoing, 1.0, 0.5, 2.0, (10.0, 10.0)) == (None, False)

    _run(main)


def test_learning_tries_the_guessed_window_and_its_answer_judges_it() -> None:
    """Learning 5 per second, the first vote puts the guess on trial; only a request sent
    once the window reopened tries it. Its answer saying 4 left (room for all but the
    trial itself: a fixed window that reopened) shows a window; saying 2 (neither room
    for all, nor all but the four sent within the last second) shows a bucket."""

    async def main() -> None:
        verdicts = []
        for remaining, verdict in ((4.0, True), (2.0, False)):
            watch, outgoing = WindowWatch(), Outgoing()
            _sent(outgoing, *[k / 100 for k in range(5)])
            reopens, count_now = _refused_inside(
                watch, outgoing, 0.05, 0.95, 0.1, (5.0, 5.0), learning=True
            )
            assert reopens is not None
            assert not count_now
            assert watch.trial is not None
            assert not watch.trial_due(reopens - 0.01)
            assert watch.trial_due(reopens)
            _sent(outgoing, reopens)  # the trial
            answer = RateLimitInfo(limit=5, remaining=remaining, reset_after=1.0)
            length = watch.judge(answer, reopens, reopens + 0.05, reopens, 5.0, None, outgoing)
            assert watch.trial is None
            verdicts.append(length is not None)
            assert verdict == (length is not None)
        assert verdicts == [True, False]

    _run(main)


def test_a_learned_window_refused_twice_grows_by_its_limit_over_one_less() -> None:
    """One 429 is a fixed window's edge; the second shows the window too short: a limit
    of 5 per second takes at least 5/4 of a second."""
    watch = WindowWatch()
    assert watch.refused_in_window(1.0, 5.0) is None
    assert watch.refused_in_window(1.0, 5.0) == 1.25
