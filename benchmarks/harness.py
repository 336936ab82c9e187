"""The benchmark harness: the server in its own process, a recording transport, records.

Real time, real sockets. The throttling server runs in a separate Python
process (``python -m fanout._throttle_server``), pinned to a core of its own
when the machine has two, so that the client's CPU use cannot slow the
server down and pass for throttling. Every strategy's requests go through a
``RecordingTransport`` at the bottom of its httpx stack, which notes when
each request left and what status came back: the same ground truth for
every strategy, whatever retry logic sits above it.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import trio

import fanout

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from .scenarios import Scenario

__all__ = [
    "DEADLINE_SLACK",
    "CallOutcome",
    "RecordingTransport",
    "RunResult",
    "Sent",
    "fresh_key",
    "machine",
    "pin_to_cpu",
    "run_server",
]

# A call answered within this long after its deadline is on time: the slack
# covers the scheduler, not the strategy (fanout's own precision is measured
# separately, in bench_deadline).
DEADLINE_SLACK = 0.010

# The server is pinned to the last core; the client is not pinned, and the
# scheduler runs it wherever there is room.
_SERVER_CPU = (os.cpu_count() or 1) - 1

# Where the imported ``fanout`` lives: the server process runs from there.
_FANOUT_HOME = Path(fanout.__file__).resolve().parent.parent


def pin_to_cpu(cpu: int, pid: int = 0) -> bool:
    """Pin a process (0: this one) to one core, on a machine with at least two."""
    if not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2:
        return False
    try:
        os.sched_setaffinity(pid, {cpu})
    except OSError:
        return False
    return True


@asynccontextmanager
async def run_server(args: Sequence[str], *, ready_timeout: float = 20.0) -> AsyncIterator[str]:
    """Start the throttling server's CLI in its own process; yield its URL.

    The server prints ``READY <url>`` once it listens. It is terminated (and
    killed if it lingers) when the block ends, however it ends. It runs from
    the directory holding the ``fanout`` this process imported, so client and
    server are the same code.
    """
    argv = [sys.executable, "-m", "fanout._throttle_server", *args]
    process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, cwd=_FANOUT_HOME)
    try:
        pin_to_cpu(_SERVER_CPU, process.pid)
        assert process.stdout is not None
        buffer = b""
        with trio.fail_after(ready_timeout):
            while b"\n" not in buffer:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    raise RuntimeError(f"the throttling server exited: {' '.join(argv)}")
                buffer += chunk
        word, _, url = buffer.split(b"\n", 1)[0].decode().partition(" ")
        if word != "READY":
            raise RuntimeError(f"the throttling server said {buffer!r}, not READY <url>")
        yield url.strip()
    finally:
        process.terminate()
        with trio.move_on_after(5) as waited, trio.CancelScope(shield=True):
            await process.wait()
        if waited.cancelled_caught:
            process.kill()


def fresh_key(*parts: str) -> str:
    """An API key no request has used yet: a fresh bucket on the same server."""
    return "-".join((*parts, uuid.uuid4().hex[:8]))


@attrs.define
class Sent:
    """One request as the client put it on the wire: start, end, status.

    Times are seconds since the run began. ``status`` is None when no
    response came back (the request was cancelled or the connection failed).
    """

    start: float
    end: float | None = None
    status: int | None = None


class RecordingTransport(httpx.AsyncBaseTransport):
    """The lowest layer of every strategy's client: sends, and writes down, each request."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.origin = 0.0
        self.sent: list[Sent] = []
        # No pool limit: a strategy's concurrency must be its own choice, not
        # httpx's default cap of 100 connections.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        # Built before the clock starts: httpx loads its TLS context here (~25 ms).
        self._transport = transport or httpx.AsyncHTTPTransport(limits=limits)

    def start_clock(self) -> float:
        """Times are measured from now on; returns the origin (``trio.current_time()``)."""
        self.origin = trio.current_time()
        return self.origin

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        record = Sent(trio.current_time() - self.origin)
        self.sent.append(record)
        try:
            response = await self._transport.handle_async_request(request)
        finally:
            record.end = trio.current_time() - self.origin
        record.status = response.status_code
        return response

    async def aclose(self) -> None:
        await self._transport.aclose()


@attrs.frozen
class CallOutcome:
    """How one call ended, as the strategy answered it.

    ``status`` is a short word (``ok``, ``429``, ``timed_out``, ...);
    ``answered_at`` is seconds since the run began.
    """

    call_id: str
    ok: bool
    status: str
    answered_at: float


@attrs.frozen
class RunResult:
    """One strategy's run of one scenario: the numbers in a table row."""

    scenario: str
    strategy: str
    label: str
    calls: int
    makespan: float
    min_makespan: float
    requests: int
    throttled: int  # 429s received
    overloaded: int  # 503s received
    ok: int
    failed: int
    ok_in_time: int | None  # answered ok by the deadline; None: no deadline
    past_deadline: int | None  # None: the scenario has no deadline
    all_answered: bool
    statuses: dict[str, int]
    starts: list[tuple[float, int | None]]  # (start, status) per request, for timelines

    @property
    def ratio(self) -> float:
        return self.makespan / self.min_makespan if self.min_makespan > 0 else float("nan")

    @classmethod
    def build(
        cls,
        scenario: Scenario,
        strategy: str,
        label: str,
        *,
        call_ids: Sequence[str],
        outcomes: Sequence[CallOutcome],
        sent: Sequence[Sent],
        makespan: float,
    ) -> RunResult:
        """Tally a run: requests and refusals from the wire, answers from the strategy."""
        statuses: dict[str, int] = {}
        for outcome in outcomes:
            statuses[outcome.status] = statuses.get(outcome.status, 0) + 1
        answered = [o.call_id for o in outcomes]
        past = in_time = None
        if scenario.deadline is not None:
            late = scenario.deadline + DEADLINE_SLACK
            past = sum(1 for o in outcomes if o.answered_at > late)
            in_time = sum(1 for o in outcomes if o.ok and o.answered_at <= late)
            # An unanswered call is late too: it never got an answer at all.
            past += len(set(call_ids) - set(answered))
        return cls(
            scenario=scenario.name,
            strategy=strategy,
            label=label,
            calls=len(call_ids),
            makespan=makespan,
            min_makespan=scenario.min_makespan,
            requests=len(sent),
            throttled=sum(1 for s in sent if s.status == 429),
            overloaded=sum(1 for s in sent if s.status == 503),
            ok=sum(1 for o in outcomes if o.ok),
            failed=sum(1 for o in outcomes if not o.ok),
            ok_in_time=in_time,
            past_deadline=past,
            all_answered=sorted(answered) == sorted(call_ids),
            statuses=dict(sorted(statuses.items())),
            starts=[(s.start, s.status) for s in sent],
        )

    def to_json(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["ratio"] = self.ratio
        return data


def machine() -> dict[str, Any]:
    """Where the numbers came from: enough to judge whether they transfer."""
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "trio": trio.__version__,
        "httpx": httpx.__version__,
    }
