"""Adversarial: many OS processes share one ``RedisScope``; is the limit ever exceeded?

Promise 3 says many processes sharing one key share one limiter on Redis.
These tests generate the conditions (2-6 workers, rates, bursts, windows,
caps, call durations, staggered starts, workers SIGKILLed at random points,
Redis frozen with SIGSTOP for a while) with Hypothesis, run real worker
processes (``tests/adversarial_redis_worker.py``) against a real server, and
check every admitted start, stamped on ``CLOCK_MONOTONIC`` (one clock for every
process on one machine), against the bound:

- a bucket: at most ``burst + rate * (dt + JITTER)`` starts in any span ``dt``;
- a window (``limit=N, per=W``): the (i+N)-th start at least ``W - JITTER``
  after the i-th;
- a cap: at most ``C`` tools running at once (no tolerance: a tool's start
  stamp is written after its lease is granted and its end stamp before the
  lease is given back, so the stamped spans lie inside the leases);
- no lease left live on Redis once every process is gone and ``lease_ttl``
  has passed; no start while Redis is frozen (fail closed).

Why ``JITTER`` is needed, and why 0.1 s: the scripts book starts on Redis's
clock, and a worker starts a booked call only after the reply reached it and
its sleep ended, so every start is *later* than its booking, by a delay in
[0, JITTER]. Late starts can bunch: two bookings 1/rate apart may start closer
if the first was delayed more. So the starts in ``[a_i, a_j]`` were booked in
``[a_i - JITTER, a_j]``, whence ``burst + rate * (a_j - a_i + JITTER)``. The
delay is a reply on loopback, a trio wake-up and (for a booking that waited)
one more round trip to confirm it; on this 2-core box running up to six
workers, a pytest process and the server, a delay of up to 0.1 s is
scheduling, not a limiter bug. Rates here are at most 12/s, so the
tolerance is at most 1.2 tokens, and a rate shared wrongly (each process
taking its own, say) overruns it by far over a run of seconds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.redis_support import RedisServer, unique_prefix

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

pytestmark = [pytest.mark.redis, pytest.mark.realtime]  # Redis keeps its own time

WORKER = Path(__file__).with_name("adversarial_redis_worker.py")
SCOPE = "adversarial-api"
JITTER = 0.1  # seconds a start may lag its booking (module docstring)
READY_WITHIN = 30.0  # seconds for every worker to import and connect, on a loaded box

FEW = settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """One server for the module; each example has its own key prefix."""
    redis = RedisServer()
    try:
        yield redis
    finally:
        redis.stop()


# -- the fleet ---------------------------------------------------------------------------


@attrs.define
class Record:
    """What one worker stamped: its starts, ends, and tally (None if it was killed)."""

    starts: dict[str, float] = attrs.field(factory=dict)
    ends: dict[str, float] = attrs.field(factory=dict)
    tally: dict[str, int] | None = None
    killed_at: float | None = None


@attrs.define
class Outcome:
    """Every worker's record, and when the run began (monotonic)."""

    records: list[Record]
    begin: float
    paused: list[tuple[float, float]]  # (SIGSTOP, SIGCONT) of Redis, monotonic

    def starts(self) -> list[float]:
        return sorted(t for r in self.records for t in r.starts.values())

    def spans(self) -> list[tuple[float, float]]:
        """Each tool's (start, end); a killed worker's open calls end at its kill."""
        spans = []
        for record in self.records:
            for call, start in record.starts.items():
                end = record.ends.get(call, record.killed_at)
                spans.append((start, math.inf if end is None else end))
        return spans

    def tally(self, status: str) -> int:
        return sum((r.tally or {}).get(status, 0) for r in self.records)


def _read(path: Path) -> tuple[bool, Record]:
    record, ready = Record(), False
    for line in path.read_text().splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "READY":
            ready = True
        elif kind in ("S", "E"):
            call, _, stamp = rest.partition(" ")
            (record.starts if kind == "S" else record.ends)[call] = float(stamp)
        elif kind == "DONE":
            record.tally = json.loads(rest)
    return ready, record


def run_fleet(
    server: RedisServer,
    prefix: str,
    configs: Sequence[dict[str, Any]],
    *,
    stagger: Sequence[float] = (),
    kills: Sequence[tuple[int, float]] = (),
    pause: tuple[float, float] | None = None,
) -> Outcome:
    """Start one worker per config, begin them together once all are ready (each
    ``stagger[i]`` s late), SIGKILL worker i at ``begin + at`` for each ``(i, at)``,
    freeze Redis at ``begin + pause[0]`` for ``pause[1]`` s; every process is gone
    on return, whatever happens."""
    with tempfile.TemporaryDirectory(prefix="fanout-adv-") as folder:
        paths = [Path(folder) / f"w{i}.log" for i in range(len(configs))]
        processes: list[subprocess.Popen[str]] = []
        killed: dict[int, float] = {}
        paused: list[tuple[float, float]] = []
        try:
            for path, config in zip(paths, configs, strict=True):
                full = {"url": server.url, "prefix": prefix, "record": str(path), **config}
                processes.append(
                    subprocess.Popen(
                        [sys.executable, str(WORKER), json.dumps(full)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        text=True,
                    )
                )
            deadline = time.monotonic() + READY_WITHIN
            while not all(p.exists() and _read(p)[0] for p in paths):
                dead = [p.returncode for p in processes if p.poll() is not None]
                assert not dead, f"a worker exited before it was ready: {dead}"
                assert time.monotonic() < deadline, "workers not ready in time"
                time.sleep(0.05)
            begin = time.monotonic() + 0.2
            for i, process in enumerate(processes):
                assert process.stdin is not None
                process.stdin.write(f"{begin + (stagger[i] if i < len(stagger) else 0.0)}\n")
                process.stdin.flush()
            events: list[tuple[float, str, int]] = [(begin + at, "kill", i) for i, at in kills]
            if pause is not None:
                events += [(begin + pause[0], "stop", 0), (begin + sum(pause), "cont", 0)]
            for at, what, i in sorted(events):
                time.sleep(max(0.0, at - time.monotonic()))
                if what == "kill":
                    processes[i].kill()
                    killed[i] = time.monotonic()
                elif what == "stop":
                    # Stamped before the signal: a start is judged against the earliest
                    # the freeze and the thaw can have taken effect.
                    paused.append((time.monotonic(), math.inf))
                    server.freeze()
                else:
                    paused[-1] = (paused[-1][0], time.monotonic())
                    server.thaw()
            longest = max(c.get("duration", 2.0) for c in configs) + 20.0
            for process in processes:
                process.wait(timeout=max(1.0, begin + longest - time.monotonic()))
        finally:
            server.thaw()
            for process in processes:
                if process.poll() is None:
                    process.kill()
                process.wait()
        records = []
        for i, path in enumerate(paths):
            record = _read(path)[1]
            record.killed_at = killed.get(i)
            records.append(record)
        for i, process in enumerate(processes):
            if i not in killed:
                assert process.returncode == 0, f"worker {i} failed: {process.returncode}"
        return Outcome(records, begin, paused)


# -- the bounds --------------------------------------------------------------------------


def bucket_excess(starts: Sequence[float], rate: float, burst: float) -> float:
    """The most starts in any span beyond ``burst + rate * (span + JITTER)`` (<= 0: held)."""
    worst = -math.inf
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            worst = max(worst, (j - i + 1) - (burst + rate * (starts[j] - first + JITTER)))
    return worst


def tightest_window(starts: Sequence[float], limit: int) -> float:
    """The shortest span holding ``limit + 1`` starts (inf if there are not so many)."""
    return min(
        (starts[i + limit] - starts[i] for i in range(len(starts) - limit)), default=math.inf
    )


def most_in_flight(spans: Sequence[tuple[float, float]]) -> int:
    """The most spans open at once; an end at the same instant as a start comes first."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    live = most = 0
    for _, step in edges:
        live += step
        most = max(most, live)
    return most


def live_leases(server: RedisServer, prefix: str) -> list[str]:
    """Leases on Redis not yet expired, on the server's clock, read with the server's cli."""
    assert server.engine.cli is not None, "the server has no cli beside it"
    script = (
        "local t = redis.call('TIME') "
        "return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. t[1] .. '.' .. "
        "string.format('%06d', tonumber(t[2])), '+inf')"
    )
    key = f"{prefix}{{{SCOPE}}}:leases"
    done = subprocess.run(
        [server.engine.cli, "-p", str(server.port), "EVAL", script, "1", key],
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    return [line for line in done.stdout.splitlines() if line.strip()]


def wait_until_no_leases(server: RedisServer, prefix: str, within: float) -> list[str]:
    """Poll (bounded by ``within`` s) until no lease is live; what is live at the end."""
    deadline = time.monotonic() + within
    while (held := live_leases(server, prefix)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return held


# -- generated conditions ----------------------------------------------------------------


@st.composite
def bucket_runs(draw: st.DrawFn) -> dict[str, Any]:
    workers = draw(st.integers(2, 6))
    cap = draw(st.sampled_from([None, 1, 2, 3, 4]))
    return {
        "workers": workers,
        "rate": draw(st.sampled_from([4.0, 6.0, 8.0, 12.0])),
        "burst": draw(st.integers(1, 6)),
        "cap": cap,
        "latency": draw(st.sampled_from([0.005, 0.03, 0.1, 0.25])),
        "calls": draw(st.integers(1, 8)),
        "stagger": [draw(st.sampled_from([0.0, 0.0, 0.05, 0.3])) for _ in range(workers)],
        "kills": sorted(
            {
                (i, draw(st.floats(0.1, 1.3).map(lambda x: round(x, 2))))
                for i in draw(st.sets(st.integers(0, workers - 1), max_size=workers - 1))
            }
        ),
    }


def _scope(run: dict[str, Any], **more: Any) -> dict[str, Any]:
    scope: dict[str, Any] = {"lease_ttl": 1.0, "op_timeout": 0.25, **more}
    if run.get("cap") is not None:
        scope["max_concurrency"] = run["cap"]
    return scope


@FEW
@given(run=bucket_runs())
def test_a_shared_bucket_and_cap_hold_across_processes_killed_at_random(
    server: RedisServer, run: dict[str, Any]
) -> None:
    """Processes sharing a told bucket (and maybe a cap), some SIGKILLed mid-run: the
    merged starts keep the bucket's bound, the tools in flight the cap, and no lease
    outlives its process by more than ``lease_ttl``."""
    prefix = unique_prefix()
    config = {
        "scope": _scope(run, rate=run["rate"], burst=run["burst"]),
        "calls": run["calls"], "latency": run["latency"], "duration": 1.5,
    }  # fmt: skip
    outcome = run_fleet(
        server, prefix, [config] * run["workers"], stagger=run["stagger"], kills=run["kills"]
    )
    starts = outcome.starts()
    assert starts, "nothing ran at all"
    assert bucket_excess(starts, run["rate"], run["burst"]) <= 1e-9
    if run["cap"] is not None:
        assert most_in_flight(outcome.spans()) <= run["cap"]
        assert wait_until_no_leases(server, prefix, within=1.0 + 1.0) == []


@st.composite
def window_runs(draw: st.DrawFn) -> dict[str, Any]:
    workers = draw(st.integers(2, 6))
    return {
        "workers": workers,
        "limit": draw(st.integers(1, 6)),
        "per": draw(st.sampled_from([0.3, 0.5, 0.8])),
        "cap": draw(st.sampled_from([None, 2, 3])),
        "latency": draw(st.sampled_from([0.005, 0.05, 0.2])),
        "calls": draw(st.integers(1, 6)),
        "stagger": [draw(st.sampled_from([0.0, 0.1, 0.25])) for _ in range(workers)],
        "kills": sorted(
            {
                (i, draw(st.floats(0.1, 1.3).map(lambda x: round(x, 2))))
                for i in draw(st.sets(st.integers(0, workers - 1), max_size=workers - 1))
            }
        ),
    }


@FEW
@given(run=window_runs())
def test_a_shared_window_holds_across_processes_killed_at_random(
    server: RedisServer, run: dict[str, Any]
) -> None:
    """Processes sharing a told window ``limit`` per ``per``: never ``limit + 1`` starts
    within ``per - JITTER`` of each other, whoever started them or was killed."""
    prefix = unique_prefix()
    config = {
        "scope": _scope(run, limit=run["limit"], per=run["per"]),
        "calls": run["calls"], "latency": run["latency"], "duration": 1.5,
    }  # fmt: skip
    outcome = run_fleet(
        server, prefix, [config] * run["workers"], stagger=run["stagger"], kills=run["kills"]
    )
    starts = outcome.starts()
    assert len(starts) >= run["limit"], "the first window's worth never ran"
    assert tightest_window(starts, run["limit"]) >= run["per"] - JITTER
    if run["cap"] is not None:
        assert most_in_flight(outcome.spans()) <= run["cap"]


@st.composite
def paused_runs(draw: st.DrawFn) -> dict[str, Any]:
    workers = draw(st.integers(2, 5))
    return {
        "workers": workers,
        "rate": draw(st.sampled_from([6.0, 10.0])),
        "burst": draw(st.integers(1, 4)),
        "cap": draw(st.sampled_from([None, 2, 3])),
        "latency": draw(st.sampled_from([0.01, 0.1, 0.4])),
        "calls": draw(st.integers(1, 6)),
        "pause_at": draw(st.sampled_from([0.3, 0.7, 1.0])),
        "pause_for": draw(st.sampled_from([0.3, 0.6, 1.2])),  # 1.2: past lease_ttl
    }


@FEW
@given(run=paused_runs())
def test_a_frozen_redis_admits_no_start_and_the_limits_hold_through_it(
    server: RedisServer, run: dict[str, Any]
) -> None:
    """Redis frozen (SIGSTOP) mid-run: no tool starts while it cannot answer (fail
    closed: a start needs an answer given before the freeze, so none later than
    ``JITTER`` into it), calls in the freeze are refused, and across it the bucket's
    bound and the cap still hold (Redis's clock ran on while frozen)."""
    prefix = unique_prefix()
    config = {
        "scope": _scope(run, rate=run["rate"], burst=run["burst"]),
        "calls": run["calls"], "latency": run["latency"], "duration": 2.5,
    }  # fmt: skip
    outcome = run_fleet(
        server, prefix, [config] * run["workers"], pause=(run["pause_at"], run["pause_for"])
    )
    ((stopped, resumed),) = outcome.paused
    starts = outcome.starts()
    inside = [t - stopped for t in starts if stopped + JITTER < t < resumed]
    assert inside == [], "tools started while Redis was frozen"
    assert bucket_excess(starts, run["rate"], run["burst"]) <= 1e-9
    if run["cap"] is not None:
        assert most_in_flight(outcome.spans()) <= run["cap"]
        assert wait_until_no_leases(server, prefix, within=2.0) == []


@st.composite
def hold_runs(draw: st.DrawFn) -> dict[str, Any]:
    holders = draw(st.integers(1, 4))
    return {
        "holders": holders,
        "cap": draw(st.integers(holders, holders + 1)),
        "ttl": draw(st.sampled_from([0.5, 1.0])),
        "victims": draw(st.sets(st.integers(0, holders - 1), min_size=1)),
        "kill_at": draw(st.sampled_from([0.3, 0.8])),
    }


@settings(FEW, max_examples=2)
@given(run=hold_runs())
def test_slots_of_holders_killed_mid_call_come_back_and_are_not_over_given(
    server: RedisServer, run: dict[str, Any]
) -> None:
    """Holders take every slot but maybe one and hold them; some are SIGKILLed mid-call.
    A runner process keeps asking meanwhile: it never has more in flight than the cap
    leaves it, and once the victims' leases expire (``lease_ttl`` after the kill, plus a
    renewal period it may have just pushed), it takes their slots; at the end no lease
    is left."""
    prefix = unique_prefix()
    ttl, cap = run["ttl"], run["cap"]
    per_holder = cap // run["holders"] if cap // run["holders"] else 1
    holder = {
        "scope": {"max_concurrency": cap, "lease_ttl": ttl}, "calls": per_holder,
        "latency": 0.0, "mode": "hold", "turn_timeout": 600.0, "duration": 0.0,
    }  # fmt: skip
    runner = {
        "scope": {"max_concurrency": cap, "lease_ttl": ttl}, "calls": cap, "latency": 0.05,
        "duration": run["kill_at"] + 2 * ttl + 1.5, "turn_timeout": 5.0, "inline_wait": None,
    }  # fmt: skip
    configs = [holder] * run["holders"] + [runner]
    survivors = [i for i in range(run["holders"]) if i not in run["victims"]]
    kills = [(i, run["kill_at"]) for i in sorted(run["victims"])]
    # Survivors that hold are stopped too, last, so that the run ends; their kill is
    # counted in the spans and their leases must expire as well.
    kills += [(i, runner["duration"] + 0.5) for i in survivors]
    outcome = run_fleet(
        server, prefix, configs, stagger=[0.0] * run["holders"] + [0.3], kills=kills
    )
    spans = outcome.spans()
    assert most_in_flight(spans) <= cap
    killed_at = outcome.begin + run["kill_at"]
    freed = sum(per_holder for _ in run["victims"])
    latest = killed_at + ttl + ttl / 3 + JITTER + 0.3  # expiry, a renewal just made, a poll
    runner_spans = [
        (start, end) for start, end in spans[-len(outcome.records[-1].starts) :] if start > latest
    ]
    held_by_survivors = per_holder * len(survivors)
    # Once the victims' leases expired, the runner's turns of ``cap`` calls fill every
    # slot the survivors do not hold, the victims' among them.
    assert most_in_flight(runner_spans) == cap - held_by_survivors
    assert freed >= 1
    assert wait_until_no_leases(server, prefix, within=ttl + 1.0) == []


def test_a_call_in_flight_across_a_short_freeze_keeps_its_slot(server: RedisServer) -> None:
    """Cap 1, ``lease_ttl=0.5``: a holder's call runs 3 s; Redis freezes 0.4 s (just past
    ``op_timeout``) under it. The holder's renewal failed, and its link then refused to
    ask Redis for ``recheck_after`` (1 s), longer than the lease lived: the lease lapsed
    at most ``ttl`` after Redis resumed, though the call was still running, and a second
    process that began 0.6 s after the resume (its own link never failed) took the slot:
    two in flight under a cap of one, whenever ``lease_ttl`` was under about 1.5 x
    ``recheck_after``. A renewal now asks Redis even while its link waits."""
    prefix = unique_prefix()
    scope = {"max_concurrency": 1, "lease_ttl": 0.5, "op_timeout": 0.25, "recheck_after": 1.0}
    holder = {"scope": scope, "calls": 1, "latency": 3.0, "duration": 0.1}
    second = {"scope": scope, "calls": 1, "latency": 0.05, "duration": 0.5, "inline_wait": None}
    outcome = run_fleet(server, prefix, [holder, second], stagger=[0.0, 1.5], pause=(0.5, 0.4))
    assert outcome.records[0].starts, "the holder never started"
    assert most_in_flight(outcome.spans()) <= 1
