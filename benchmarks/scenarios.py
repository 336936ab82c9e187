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

With jitter
-----------

The server jitters an admitted request's *answer*: the k-th request a key
admits takes ``L + u_k``, where ``u_k`` is the k-th draw of
``Random(seed).uniform(0, jitter)`` from that key's own generator (a refused
request draws nothing). Whatever the order, a client's k-th admission starts
no earlier than ``t_k`` above, so no client finishes before::

    T_min = max over k of (t_k + L + u_k)

and the optimal schedule finishes exactly then (``tests/test_pacing.py``
runs it against the server). The least latency alone, ``u_k = 0``, is also a
lower bound, but looser by up to the jitter (2.55 s against 2.60 s for the
jitter row): a client that met the exact minimum would have read as 1.02x.
"""

from __future__ import annotations

import math
import random
from typing import Literal

import attrs

__all__ = [
    "FULL",
    "QUICK",
    "Scenario",
    "earliest_starts",
    "jittered_makespan",
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


def jittered_makespan(
    n: int,
    *,
    rate: float,
    burst: float,
    latency: float,
    jitter: float,
    seed: int,
    concurrency: int | None = None,
) -> float:
    """The fastest possible makespan when the server jitters its answers (module docstring)."""
    draws = random.Random(seed)
    starts = earliest_starts(n, rate=rate, burst=burst, latency=latency, concurrency=concurrency)
    return max((start + latency + draws.uniform(0, jitter) for start in starts), default=0.0)


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


Model = Literal["bucket", "fixed", "sliding", "concurrency"]


@attrs.frozen
class Scenario:
    """One workload: the calls, the server's true limits, and what peers are told.

    ``model`` is how the server limits (``fanout._throttle_server``): a token
    bucket, a fixed window or a sliding log of ``burst`` per ``burst/rate``
    s, or only an in-flight cap (``concurrency``: the server has no rate,
    and ``rate`` is what peers are told, ``max_in_flight / latency``).
    ``reset`` is what a bucket's Reset header means (until full, or until
    the next token); ``headers`` the header style (``none``: no state
    headers, only 429s). ``max_in_flight`` is the server's in-flight cap
    (503 beyond it), None for none. ``deadline`` is each call's deadline in
    seconds from the start of the turn (None: no deadline). ``jitter`` adds
    uniform latency; ``connect_delay`` holds back the first request of each
    connection; ``seed`` seeds the jitter (each key draws its own, in order).
    ``fixed_delay`` is the naive retry's sleep;
    ``retry_after_precise`` makes the server send fractional Retry-After
    seconds instead of whole ones (the quick run uses it to stay quick).
    ``window_phase``: a fixed window's first began that share of one before
    the first request (windows keyed by the clock). ``slowapi``: the server
    writes its headers as slowapi does (its reset a float epoch a second past
    the window's end, what remains read once the handler ran).
    """

    name: str
    title: str
    calls: int
    rate: float
    burst: int
    latency: float
    max_in_flight: int | None = None
    retry_after: Literal["seconds", "http-date", "ms", "absent"] = "seconds"
    retry_after_precise: bool = False
    deadline: float | None = None
    fixed_delay: float = 1.0
    model: Model = "bucket"
    reset: Literal["full", "next"] = "full"
    headers: Literal["draft", "x", "ietf", "none"] = "draft"
    jitter: float = 0.0
    connect_delay: float = 0.0
    seed: int = 0
    window_phase: float = 0.0
    slowapi: bool = False
    why: str = ""

    @property
    def min_makespan(self) -> float:
        """The fastest any client could finish (with jitter: the server's own draws)."""
        if self.model == "concurrency":
            assert self.max_in_flight is not None
            return self.connect_delay + math.ceil(self.calls / self.max_in_flight) * self.latency
        if self.model in ("fixed", "sliding"):
            # burst requests per window, windows following each other from the first
            # request (a fixed window's, from its phase before it).
            window = self.burst / self.rate
            windows = (self.calls - 1) // self.burst
            first = max(0.0, windows - self.window_phase) * window if windows else 0.0
            return self.connect_delay + self.latency + first
        if self.jitter:
            return self.connect_delay + jittered_makespan(
                self.calls, rate=self.rate, burst=self.burst, latency=self.latency,
                jitter=self.jitter, seed=self.seed, concurrency=self.max_in_flight,
            )  # fmt: skip
        return self.connect_delay + min_makespan(
            self.calls,
            rate=self.rate,
            burst=self.burst,
            latency=self.latency,
            concurrency=self.max_in_flight,
        )

    @property
    def told_rate(self) -> float | None:
        """The rate a user configures: none for an API limited only by concurrency."""
        return None if self.model == "concurrency" else self.rate

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
        if self.model == "concurrency":
            text = f"no rate, latency {self.latency * 1000:g} ms"
        else:
            text = f"{self.rate:g}/s, burst {self.burst}, latency {self.latency * 1000:g} ms"
        if self.jitter:
            text += f" + up to {self.jitter * 1000:g} ms"
        if self.max_in_flight is not None:
            text += f", at most {self.max_in_flight} in flight (503 beyond)"
        if self.deadline is not None:
            text += f", deadline {self.deadline:g} s per call"
        return text

    def formula_text(self) -> str:
        """The minimum makespan with this scenario's numbers filled in."""
        if self.jitter:
            return (
                f"max over k of (t_k + L + u_k), u_k the server's k-th jitter draw "
                f"(seed {self.seed}) = {self.min_makespan:.3f} s"
            )
        n, b, r, lat = self.calls, self.burst, self.rate, self.latency
        if self.model == "fixed" and self.window_phase:
            w, p = b / r, self.window_phase
            return (
                f"L + (⌊(N - 1)/B⌋ - phase)·W = {lat:g} + (⌊{n - 1}/{b}⌋ - {p:g})·{w:g} "
                f"= {self.min_makespan:.3f} s"
            )
        parts = [f"(N - B)/R = ({n} - {b})/{r:g} = {max(0.0, (n - b) / r):.3f} s"]
        if self.max_in_flight is not None:
            c = self.max_in_flight
            waves = (n - 1) // c
            parts.append(f"⌊(N - 1)/C⌋·L = ⌊{n - 1}/{c}⌋·{lat:g} = {waves * lat:.3f} s")
        return f"L + max({'; '.join(parts)}) = {self.min_makespan:.3f} s"

    def server_args(self) -> list[str]:
        """The throttling server's command-line flags for these limits."""
        rate = "none" if self.model == "concurrency" else f"{self.rate:g}"
        args = [
            "--rate", rate,
            "--burst", str(self.burst),
            "--latency", f"{self.latency:g}",
            "--jitter", f"{self.jitter:g}",
            "--seed", str(self.seed),
            "--connect-delay", f"{self.connect_delay:g}",
            "--retry-after", self.retry_after,
            "--headers", self.headers,
            "--model", "bucket" if self.model == "concurrency" else self.model,
            "--reset", self.reset,
        ]  # fmt: skip
        if self.max_in_flight is not None:
            args += ["--max-in-flight", str(self.max_in_flight)]
        if self.retry_after_precise:
            args.append("--retry-after-precise")
        if self.window_phase:
            args += ["--window-phase", f"{self.window_phase:g}"]
        if self.slowapi:
            args += ["--reset-as-epoch", "--reset-precise", "--reset-late", "1",
                     "--state-at-answer"]  # fmt: skip
        return args


# The server matrix: the semantics real APIs use (``fanout._throttle_server``),
# each a column of the README's headline table. The shared shape: 60 calls,
# 20/s with a burst of 10, 50 ms latency, Retry-After in whole seconds rounded
# up, and the draft headers an independent server sends (RateLimit-Limit: B,
# RateLimit-Remaining, RateLimit-Reset in whole seconds).
_SHAPE: dict[str, object] = {"calls": 60, "rate": 20, "burst": 10, "latency": 0.05}

FULL: tuple[Scenario, ...] = (
    Scenario(
        "bucket-full", "token bucket, Reset = until full", **_SHAPE,  # type: ignore[arg-type]
        why="Anthropic, OpenAI: Reset is when the bucket is full again; Remaining 0 means "
        "the next token is 1/R away, not a Reset away.",
    ),
    Scenario(
        "bucket-next", "token bucket, Reset = next token", **_SHAPE,  # type: ignore[arg-type]
        reset="next", headers="x",
        why="Envoy's local limiter: X-RateLimit-Reset is the time to the next refill.",
    ),
    Scenario(
        "bucket-deep", "token bucket, burst of 1.5 s (Reset 2 s)", calls=100, rate=20, burst=30,
        latency=0.05,
        why="A burst worth more than a second of rate: Reset (until full) says 2 s when the "
        "bucket is spent while Retry-After says 1 s; a window it is not.",
    ),
    Scenario(
        "bucket-one", "token bucket, burst of one, 20/s", calls=30, rate=20, burst=1,
        latency=0.05,
        why="A bucket that holds one request: each token is taken as the bucket fills, so "
        "a request that leaves a ms late costs the server that ms of refill, and the next "
        "one, on time, arrives early.",
    ),
    Scenario(
        "fixed", "fixed window, 10 per second", calls=60, rate=10, burst=10, latency=0.05,
        model="fixed",
        why="express-rate-limit: 10 per window of 1 s from the first request; "
        "Remaining 0 does mean 'wait for Reset'.",
    ),
    Scenario(
        "fixed-clock", "fixed window, 20 per 2 s, keyed by the clock", calls=100, rate=10,
        burst=20, latency=0.05, model="fixed", window_phase=0.6,
        why="Kong, Envoy's global limit: windows keyed by the clock, so the first request "
        "lands 1.2 s into one; Reset, rounded up, says when it ends.",
    ),
    Scenario(
        "sliding", "sliding log, 10 per second", calls=60, rate=10, burst=10, latency=0.05,
        model="sliding",
        why="At most 10 in any second.",
    ),
    Scenario(
        "fixed-late", "fixed window, 10 per second, its reset a second late", calls=60,
        rate=10, burst=10, latency=0.05, model="fixed", headers="x", slowapi=True,
        why="slowapi (FastAPI) and the limits library: X-RateLimit-Reset is a float epoch "
        "a second past the window's end, Retry-After the wait rounded up.",
    ),
    Scenario(
        "fixed-bare", "fixed window, 10 per second, stating nothing", calls=60, rate=10,
        burst=10, latency=0.05, model="fixed", retry_after="absent", headers="none",
        why="django-ratelimit, slowapi with its headers off: a window whose 429s say "
        "nothing at all, not even when to try again.",
    ),
    Scenario(
        "concurrency", "concurrency only, 503", calls=40, rate=20, burst=10, latency=0.2,
        max_in_flight=4, model="concurrency",
        why="No rate at all: 4 in flight, 503 beyond with Retry-After until a slot frees.",
    ),
    Scenario(
        "retry-ms", "Retry-After in ms, no state headers", **_SHAPE,  # type: ignore[arg-type]
        retry_after="ms", headers="none",
        why="Azure's retry-after-ms; nothing else to learn from.",
    ),
    Scenario(
        "http-date", "Retry-After as an HTTP-date", **_SHAPE,  # type: ignore[arg-type]
        retry_after="http-date", headers="none",
        why="An absolute HTTP-date (whole seconds), read against the response's Date.",
    ),
    Scenario(
        "bare-429", "bare 429s (no Retry-After, no headers)", **_SHAPE,  # type: ignore[arg-type]
        retry_after="absent", headers="none",
        why="Stripe, nginx: only the status says 'too fast'.",
    ),
    Scenario(
        "jitter", "latency jitter 0-100 ms", **_SHAPE, jitter=0.1,  # type: ignore[arg-type]
        why="Requests that left in order arrive out of step.",
    ),
    Scenario(
        "slow-connect", "slow first connection (+100 ms)", **_SHAPE,  # type: ignore[arg-type]
        connect_delay=0.1,
        why="A TLS handshake: the first request of each connection arrives late, so the "
        "server's bucket refills later than the client thinks.",
    ),
    Scenario(
        "eight", "8 calls, 5/s", calls=8, rate=5, burst=5, latency=0.05,
        why="Issue 13's first row, the seeds' example: a turn of eight calls against 5/s.",
    ),
    Scenario(
        "forty", "40 calls, 10/s, C=4, 400 ms", calls=40, rate=10, burst=10, latency=0.4,
        max_in_flight=4,
        why="Issue 13's second row: 10/s at 400 ms keeps 4 in flight, and the server "
        "enforces 4 (503 beyond), so rate and concurrency bind together.",
    ),
    Scenario(
        "two-hundred", "200 calls, 50/s, B=20, C=16", calls=200, rate=50, burst=20,
        latency=0.1, max_in_flight=16,
        why="Issue 13's large turn: rate and concurrency both bind.",
    ),
    Scenario(
        "deadline-2s", "every call under a 2 s deadline", calls=40, rate=10, burst=10,
        latency=0.1, deadline=2.0,
        why="More calls than 2 s of rate can carry: at most B + ⌊(D - L)·R⌋ = 29 can "
        "finish in time; the rest must be answered by their deadline, not after it.",
    ),
    Scenario(
        "deadline-30", "30 calls, 2 s deadlines, B=5, 200 ms", calls=30, rate=10, burst=5,
        latency=0.2, deadline=2.0,
        why="Issue 13's deadline row: 23 of 30 can finish. A small burst and a longer "
        "latency: learning has less time to find the rate before the deadline.",
    ),
)  # fmt: skip

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
