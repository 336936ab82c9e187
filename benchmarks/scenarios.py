"""The workloads, and the fastest any client could possibly finish them.

Each scenario is N tool calls, one HTTP request each, against a server that
allows ``rate`` requests a second with a bucket of ``burst`` (it starts full),
answers every admitted request after ``latency`` seconds, and (optionally)
refuses more than ``max_in_flight`` requests in flight with a 503.

The theoretical minimum makespan
--------------------------------

Sort the requests by start time, s_0 <= s_1 <= ... <= s_{N-1}. Two limits
bind every schedule:

* **Rate.** Starting request i takes its (i+1)-th token; the bucket holds at
  most ``B`` at time 0 and gains ``R`` a second, so ``B + R*s_i >= i + 1``::

      s_i >= r_i = max(0, (i + 1 - B) / R)

* **Concurrency.** Every request takes ``L``. When request i starts, at most
  ``C`` requests may be in flight, so request i - C (started earlier, hence
  finished earlier) must be done: ``s_i >= s_{i-C} + L``.

Starting each request at the earliest instant both allow is feasible, and no
schedule can beat it (by induction on i), so ``t_i = max(r_i, t_{i-C} + L)``.
Unrolled, ``t_i = max over k of r_{i-kC} + k*L``: a convex function of k,
so its maximum is at an end, k = 0 or k = floor(i / C). The last request
answers last, so for N >= 1::

    T_min = L + max( (N - B) / R,
                     floor((N - 1) / C) * L + max(0, ((N - 1) mod C + 1 - B) / R) )

When ``B >= C`` (every scenario here) the second term is just
``(ceil(N / C) - 1) * L``: the number of full "waves" of C requests after the
first, each one latency long. Without a concurrency cap only the first term
remains: ``T_min = max(0, (N - B) / R) + L``.

``earliest_starts`` computes the same schedule by simulating a real capped
bucket and C slots; ``tests/test_benchmarks_smoke.py`` checks the two agree.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs

__all__ = [
    "FULL",
    "QUICK",
    "Scenario",
    "earliest_starts",
    "max_ok_by",
    "min_makespan",
]


def min_makespan(
    n: int, *, rate: float, burst: float, latency: float, concurrency: int | None = None
) -> float:
    """The fastest possible makespan for ``n`` requests (formula: module docstring)."""
    if n <= 0:
        return 0.0
    by_rate = max(0.0, (n - burst) / rate)
    by_slots = 0.0
    if concurrency is not None:
        waves, last_in_wave = divmod(n - 1, concurrency)
        by_slots = waves * latency + max(0.0, (last_in_wave + 1 - burst) / rate)
    return latency + max(by_rate, by_slots)


def earliest_starts(
    n: int, *, rate: float, burst: float, latency: float, concurrency: int | None = None
) -> list[float]:
    """Start times of the optimal schedule, by simulating a capped bucket and slots.

    Independent of ``min_makespan``'s algebra on purpose: it is the reference
    the formula is tested against.
    """
    starts: list[float] = []
    tokens, updated = float(burst), 0.0
    for i in range(n):
        t = starts[-1] if starts else 0.0
        if concurrency is not None and i >= concurrency:
            t = max(t, starts[i - concurrency] + latency)
        tokens = min(float(burst), tokens + (t - updated) * rate)
        updated = t
        if tokens < 1.0 - 1e-12:
            wait = (1.0 - tokens) / rate
            t += wait
            tokens, updated = 1.0, t
        tokens -= 1.0
        starts.append(t)
    return starts


def max_ok_by(
    deadline: float,
    n: int,
    *,
    rate: float,
    burst: float,
    latency: float,
    concurrency: int | None = None,
) -> int:
    """How many of ``n`` calls any client could have answered ok by ``deadline``."""
    schedule = earliest_starts(n, rate=rate, burst=burst, latency=latency, concurrency=concurrency)
    return sum(1 for start in schedule if start + latency <= deadline + 1e-9)


@attrs.frozen
class Scenario:
    """One workload: the calls, the server's true limits, and what peers are told.

    ``max_in_flight`` is the server's in-flight cap (503 beyond it), None for
    none. ``deadline`` is each call's deadline in seconds from the start of
    the turn (None: no deadline). ``fixed_delay`` is the naive retry's sleep;
    ``retry_after_precise`` makes the server send fractional Retry-After
    seconds instead of whole ones (the quick run uses it to stay quick).
    """

    name: str
    title: str
    calls: int
    rate: float
    burst: int
    latency: float
    max_in_flight: int | None = None
    retry_after: Literal["seconds", "http-date"] = "seconds"
    retry_after_precise: bool = False
    deadline: float | None = None
    fixed_delay: float = 1.0
    why: str = ""

    @property
    def min_makespan(self) -> float:
        return min_makespan(
            self.calls,
            rate=self.rate,
            burst=self.burst,
            latency=self.latency,
            concurrency=self.max_in_flight,
        )

    @property
    def max_ok(self) -> int:
        """Calls that can possibly be answered ok (all, unless a deadline cuts them)."""
        if self.deadline is None:
            return self.calls
        return max_ok_by(
            self.deadline,
            self.calls,
            rate=self.rate,
            burst=self.burst,
            latency=self.latency,
            concurrency=self.max_in_flight,
        )

    @property
    def semaphore_size(self) -> int:
        """The seeds' advice: a semaphore sized to the tightest limit (rate or in-flight)."""
        size = math.ceil(self.rate)
        if self.max_in_flight is not None:
            size = min(size, self.max_in_flight)
        return max(1, size)

    def limits_text(self) -> str:
        """The true limits in words, for tables."""
        text = f"{self.rate:g}/s, burst {self.burst}, latency {self.latency * 1000:g} ms"
        if self.max_in_flight is not None:
            text += f", at most {self.max_in_flight} in flight (503 beyond)"
        if self.deadline is not None:
            text += f", deadline {self.deadline:g} s per call"
        return text

    def formula_text(self) -> str:
        """The minimum makespan with this scenario's numbers filled in."""
        n, b, r, lat = self.calls, self.burst, self.rate, self.latency
        parts = [f"(N - B)/R = ({n} - {b})/{r:g} = {max(0.0, (n - b) / r):.3f} s"]
        if self.max_in_flight is not None:
            c = self.max_in_flight
            waves = (n - 1) // c
            parts.append(f"⌊(N - 1)/C⌋·L = ⌊{n - 1}/{c}⌋·{lat:g} = {waves * lat:.3f} s")
        return f"L + max({'; '.join(parts)}) = {self.min_makespan:.3f} s"

    def server_args(self) -> list[str]:
        """The throttling server's command-line flags for these limits."""
        args = [
            "--rate", f"{self.rate:g}",
            "--burst", str(self.burst),
            "--latency", f"{self.latency:g}",
            "--retry-after", self.retry_after,
            "--headers", "ietf",
        ]  # fmt: skip
        if self.max_in_flight is not None:
            args += ["--max-in-flight", str(self.max_in_flight)]
        if self.retry_after_precise:
            args.append("--retry-after-precise")
        return args


FULL: tuple[Scenario, ...] = (
    Scenario(
        "eight-at-5ps",
        "8 calls vs 5/s",
        calls=8,
        rate=5,
        burst=5,
        latency=0.05,
        why="The seeds' example: a turn of eight calls against an API rated 5/s. "
        "Burst 5 (one second's worth, as most APIs allow).",
    ),
    Scenario(
        "forty-at-10ps-400ms",
        "40 calls vs 10/s, 400 ms latency",
        calls=40,
        rate=10,
        burst=10,
        latency=0.4,
        max_in_flight=4,
        why="Little's law: 10/s at 0.4 s keeps concurrency_for(10, 0.4) = 4 in flight; the "
        "server enforces 4 (503 beyond), so more slots only earn 503s.",
    ),
    Scenario(
        "two-hundred-at-50ps",
        "200 calls vs 50/s",
        calls=200,
        rate=50,
        burst=50,
        latency=0.05,
        why="A large turn (or a batch): rate, not latency, decides. Burst 50.",
    ),
    Scenario(
        "http-date",
        "Retry-After as an HTTP-date",
        calls=20,
        rate=5,
        burst=5,
        latency=0.05,
        retry_after="http-date",
        why="The server states Retry-After as an absolute HTTP-date (whole seconds); "
        "clients must parse a date, not a number.",
    ),
    Scenario(
        "deadline-2s",
        "every call under a 2 s deadline",
        calls=40,
        rate=10,
        burst=10,
        latency=0.1,
        deadline=2.0,
        why="More calls than 2 s of rate can carry: at most B + ⌊(D - L)·R⌋ = 29 can "
        "finish in time; the rest must be answered by their deadline, not after it.",
    ),
)

# The quick run: the same shapes in miniature, with fractional Retry-After. Burst
# equals rate because the server states its window in whole seconds: a smaller
# burst would advertise a lower rate than it enforces.
QUICK: tuple[Scenario, ...] = (
    Scenario(
        "quick-burst",
        "12 calls vs 8/s (quick)",
        calls=12,
        rate=8,
        burst=8,
        latency=0.02,
        retry_after_precise=True,
        fixed_delay=0.2,
    ),
    Scenario(
        "quick-deadline",
        "14 calls vs 8/s under a 0.6 s deadline (quick)",
        calls=14,
        rate=8,
        burst=8,
        latency=0.02,
        max_in_flight=3,
        retry_after_precise=True,
        deadline=0.6,
        fixed_delay=0.2,
    ),
)
