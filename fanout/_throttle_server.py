"""A throttling HTTP/1.1 server on 127.0.0.1 that behaves like a rate-limited API.

fanout promises never to cause a downstream's 429s and never to wait past a
budget. Those promises are only testable against a server that throttles the
way real APIs do, keeps an exact record of when each request *started*, and
runs on trio time, so that under ``MockClock(autojump_threshold=0)`` in the
same ``trio.run`` as the client every timestamp is virtual and exact.

Per key (``x-api-key``, else ``Authorization: Bearer <key>``, else
``"anonymous"``) the server keeps a rate limiter (over it: 429) and an
in-flight cap (over it: 503). An admitted request sleeps ``latency`` plus
uniform ``jitter`` while it counts as in flight, then gets a 200. The jitter
is drawn from the key's own generator, seeded with ``seed``, in the order the
key's requests are admitted: the k-th admission of every key gets the same
draw, whatever other keys did, so a benchmark knows the fastest any client
could finish (``benchmarks/scenarios.py``).
``connect_delay`` holds back the first request of every connection (a slow
TLS handshake): it reaches the server that much later than it was sent;
``connect_jitter`` up to that much more, drawn for each connection as it is
accepted (a server that takes in some connections later than others: its
first, a thread started for it).
``rate_status`` is the status the rate refuses with: 429, 503 as nginx's
``limit_req`` and ASP.NET Core's limiter answer by default, or 403 as GitHub's
primary limit does (its rate-limit headers then say ``Remaining: 0``).

The limiter is one of the models real APIs use (``model``), each allowing
``burst`` requests at once and ``rate`` a second on average:

* ``"bucket"``: a token bucket of ``burst`` refilled continuously at ``rate``
  (Anthropic, Envoy local, Traefik);
* ``"fixed"``: ``burst`` requests per fixed window of ``burst / rate`` s,
  the first starting at the key's first request (express-rate-limit), or
  ``window_phase`` of a window before it: a counter keyed by the clock's
  second or minute (a Redis ``INCR`` per window) meets a client at any
  phase, and the client's first burst may fill the end of one window and the
  start of the next;
* ``"sliding"``: at most ``burst`` requests in any ``burst / rate`` s (a log).

A concurrency-only server is ``rate=None`` with ``max_in_flight`` (503s).

Header definitions, shared by every style (a key with ``rate=None`` gets none):

* limit = ``burst``; window = ``burst / rate`` (rounded up to whole seconds
  in the IETF policy, whose ``w`` has no sub-second precision).
* remaining = whole requests left after this request, taken at admission.
* reset = for a bucket, the time until it is full again (``reset="full"``)
  or until its next token (``reset="next"``); for a window, until the
  window ends (fixed) or its oldest request leaves it (sliding). Rounded *up*
  to whole seconds, except the ``openai`` duration (ms); ``reset_rounding``
  ``"nearest"`` or ``"down"`` rounds it as ``round()`` or ``int()`` would, so
  a bucket with tokens to spare may say 0, and an epoch or RFC 3339 time up
  to a second early (Go's ``time.RFC3339``, ``int(time.time() + ...)``). The ``shopify``
  style states no reset: only the fill level, ``limit - remaining`` of ``limit``;
  the ``azure`` style states only what remains.
* Retry-After (429) = time until a request would be admitted; (503) = time
  until the earliest in-flight request of that key is due to finish.
  ``reset_precise`` writes the X- and older-draft reset (epoch or delta) to the
  millisecond, as slowapi's float epoch does, not rounded up to the second.
  ``state_at_answer`` states an admitted request's limit and what remains as they
  are when it is answered, after its latency, as slowapi's middleware reads them
  once the handler has run: a burst's answers all say what the last left.
  ``state_on_refusals`` states them on refusals only: admitted answers carry
  no state headers. ``close_each`` closes each connection after its answer
  (``Connection: close``, as an HTTP/1.0 server): every request opens one.
  ``reset_late`` adds that many seconds to every reset, as slowapi's ``1 +``
  does: its ``X-RateLimit-Reset`` is the window's end plus a second, and its
  ``Retry-After``, the whole seconds (``int``) of that, the wait rounded up.
* Date = the server's wall clock (``date_skew`` ahead of it), written for
  each answer, or every ``date_every`` s and sent until the next, as uvicorn
  (under FastAPI and Starlette) writes its once a second.

The key is recorded for accounting (tests read it from the records) but never
sent back: bodies carry no key, and a scope header without a configured scope
name carries a short hash of it, so a client that echoes responses into a
transcript cannot leak the credential that way.

Run it alone for benchmarks: ``python -m fanout._throttle_server --rate 10``.
"""

from __future__ import annotations

import argparse
import contextlib
import email.utils
import hashlib
import json
import math
import random
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from http import HTTPStatus
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, get_args

import attrs
import h11
import trio

from ._exceptions import UsageError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

RetryAfterFormat = Literal["seconds", "http-date", "ms", "absent"]
HeaderStyle = Literal["ietf", "draft", "x", "openai", "anthropic", "shopify", "azure", "none"]
Model = Literal["bucket", "fixed", "sliding"]
ResetMeaning = Literal["full", "next"]
ResetRounding = Literal["up", "nearest", "down"]

# Float slack: a client that sleeps exactly the advertised wait must be admitted.
_EPS = 1e-9
_ANONYMOUS = "anonymous"
_ERRORS = {403: "rate_limited", 429: "rate_limited", 500: "injected_failure", 503: "overloaded"}
_RATE_STATUSES = (403, 429, 503)  # what a rate may refuse with (module docstring)


def _ceil(value: float) -> int:
    """Round up, forgiving float noise (1.0000000000000002 is 1)."""
    return math.ceil(value - _EPS)


def _whole_seconds(value: float, rounding: ResetRounding) -> int:
    """A reset in whole seconds, rounded as the server is configured to."""
    if rounding == "nearest":
        return round(value)
    return _ceil(value) if rounding == "up" else math.floor(value + _EPS)


# A validator for "a positive number, or None for unlimited" (typed loosely for the attrs plugin).
_OPTIONAL_POSITIVE: Any = attrs.validators.optional(attrs.validators.gt(0))


def key_label(key: str) -> str:
    """A stable, non-reversible name for a key, fit to put in a response."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


@attrs.frozen
class KeyLimits:
    """The limits of one key's bucket; ``scope`` names it in the scope header."""

    rate: float | None = attrs.field(validator=_OPTIONAL_POSITIVE)
    burst: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    max_in_flight: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(1))
    )
    scope: str | None = None


def _frozen_keys(keys: Mapping[str, KeyLimits]) -> Mapping[str, KeyLimits]:
    return MappingProxyType(dict(keys))


# A finite number of seconds, 0 or more (NaN and infinity are refused).
_SECONDS = attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(math.inf))


@attrs.frozen
class ServerConfig:
    """How the server throttles. ``rate``/``burst``/``max_in_flight`` apply to
    every key not named in ``keys``; ``rate=None`` means unlimited."""

    rate: float | None = attrs.field(default=10.0, validator=_OPTIONAL_POSITIVE)
    burst: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    max_in_flight: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(1))
    )
    keys: Mapping[str, KeyLimits] = attrs.field(factory=dict, converter=_frozen_keys, hash=False)
    latency: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    jitter: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    seed: int = 0
    retry_after: RetryAfterFormat = attrs.field(
        default="seconds", validator=attrs.validators.in_(get_args(RetryAfterFormat))
    )
    retry_after_precise: bool = False
    headers: HeaderStyle = attrs.field(
        default="ietf", validator=attrs.validators.in_(get_args(HeaderStyle))
    )
    reset_as_epoch: bool = False
    reset_precise: bool = False
    state_at_answer: bool = False
    state_on_refusals: bool = False
    close_each: bool = False
    reset_late: float = attrs.field(default=0.0, validator=_SECONDS)
    reset_rounding: ResetRounding = attrs.field(
        default="up", validator=attrs.validators.in_(get_args(ResetRounding))
    )
    scope_header: str | None = None
    fail_first: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    date_skew: float = 0.0
    date_every: float = attrs.field(default=0.0, validator=_SECONDS)
    model: Model = attrs.field(default="bucket", validator=attrs.validators.in_(get_args(Model)))
    reset: ResetMeaning = attrs.field(
        default="full", validator=attrs.validators.in_(get_args(ResetMeaning))
    )
    connect_delay: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    connect_jitter: float = attrs.field(default=0.0, validator=_SECONDS)
    rate_status: int = attrs.field(default=429, validator=attrs.validators.in_(_RATE_STATUSES))
    window_phase: float = attrs.field(
        default=0.0, validator=[attrs.validators.ge(0), attrs.validators.lt(1)]
    )

    def limits_for(self, key: str) -> KeyLimits:
        """The key's own limits if configured, else the server-wide ones."""
        default = KeyLimits(self.rate, self.burst, self.max_in_flight)
        return self.keys.get(key, default)


@attrs.frozen
class RequestRecord:
    """One request as the server saw it; times are ``trio.current_time()``."""

    n: int
    start: float
    end: float
    key: str
    method: str
    path: str
    status: int
    idempotency_key: str | None
    in_flight_at_start: int


@attrs.define
class _TokenBucket:
    """Continuous-refill token bucket: ``burst`` tokens, ``rate`` per second."""

    rate: float
    burst: int
    reset_means: ResetMeaning
    _tokens: float
    _updated: float

    @property
    def limit(self) -> int:
        return self.burst

    def _refill(self, now: float) -> None:
        elapsed = now - self._updated
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate)
        self._updated = now

    def try_take(self, now: float) -> float:
        """Take a token and return 0.0, or take none and return the wait for one."""
        self._refill(now)
        if self._tokens >= 1 - _EPS:
            self._tokens = max(self._tokens - 1, 0.0)
            return 0.0
        return (1 - self._tokens) / self.rate

    def remaining(self, now: float) -> int:
        self._refill(now)
        return math.floor(self._tokens + _EPS)

    def reset(self, now: float) -> float:
        """Until full, or until the next whole token (``reset_means``)."""
        self._refill(now)
        if self.reset_means == "next":
            return max(0.0, (math.floor(self._tokens + _EPS) + 1 - self._tokens) / self.rate)
        return (self.burst - self._tokens) / self.rate


@attrs.define
class _Window:
    """``burst`` requests per window of ``burst / rate`` s: what both window models share."""

    rate: float
    burst: int

    @property
    def limit(self) -> int:
        return self.burst

    @property
    def window(self) -> float:
        return self.burst / self.rate


@attrs.define
class _FixedWindow(_Window):
    """Windows follow each other, the first starting ``phase`` of a window before the
    first request."""

    phase: float = 0.0
    _origin: float | None = None
    _start: float = -math.inf
    _count: int = 0

    def _roll(self, now: float) -> None:
        if self._origin is None:
            self._origin = now - self.phase * self.window
        start = self._origin + math.floor((now - self._origin) / self.window + _EPS) * self.window
        if start > self._start + _EPS:
            self._start, self._count = start, 0

    def try_take(self, now: float) -> float:
        self._roll(now)
        if self._count < self.burst:
            self._count += 1
            return 0.0
        return self.reset(now)

    def remaining(self, now: float) -> int:
        self._roll(now)
        return self.burst - self._count

    def reset(self, now: float) -> float:
        self._roll(now)
        return max(self._start + self.window - now, 0.0)


@attrs.define
class _SlidingLog(_Window):
    """At most ``burst`` requests in any window, kept as a log of admissions."""

    _log: list[float] = attrs.Factory(list)

    def _forget(self, now: float) -> None:
        self._log = [t for t in self._log if t > now - self.window + _EPS]

    def try_take(self, now: float) -> float:
        self._forget(now)
        if len(self._log) < self.burst:
            self._log.append(now)
            return 0.0
        return self.reset(now)

    def remaining(self, now: float) -> int:
        self._forget(now)
        return self.burst - len(self._log)

    def reset(self, now: float) -> float:
        self._forget(now)
        return max(self._log[0] + self.window - now, 0.0) if self._log else 0.0


_Limiter = _TokenBucket | _FixedWindow | _SlidingLog


@attrs.define
class _KeyState:
    limits: KeyLimits
    bucket: _Limiter | None
    rng: random.Random  # the jitter of this key's admissions, in order
    in_flight: int = 0
    due: list[float] = attrs.Factory(list)  # expected end times of admitted requests


class ThrottlingServer:
    """The server's state and its records; start it with ``serve_throttled``
    or ``await nursery.start(server.serve)``."""

    def __init__(
        self, config: ServerConfig | None = None, *, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config if config is not None else ServerConfig()
        self._wall_clock = wall_clock
        self._keys: dict[str, _KeyState] = {}
        self._records: list[RequestRecord] = []
        self._arrivals = 0
        self._in_flight = 0
        self._peak: dict[str | None, int] = {}
        self._port: int | None = None
        self._connect_rng = random.Random(self.config.seed)  # drawn as connections come

    @property
    def url(self) -> str:
        if self._port is None:
            raise UsageError("the server is not listening yet")
        return f"http://127.0.0.1:{self._port}"

    @property
    def records(self) -> list[RequestRecord]:
        """Finished requests (answered or abandoned), in arrival order."""
        return sorted(self._records, key=lambda r: r.n)

    def _select(self, key: str | None) -> list[RequestRecord]:
        return [r for r in self.records if key is None or r.key == key]

    def starts(self, key: str | None = None) -> list[float]:
        return [r.start for r in self._select(key)]

    def count(self, status: int | None = None, key: str | None = None) -> int:
        return sum(1 for r in self._select(key) if status is None or r.status == status)

    def max_in_flight(self, key: str | None = None) -> int:
        """Peak number of admitted requests in flight at once (all keys if None)."""
        return self._peak.get(key, 0)

    def max_starts_in_window(self, window: float, key: str | None = None) -> int:
        """Most request starts in any half-open window ``[t, t + window)``."""
        starts = sorted(self.starts(key))
        best, lo = 0, 0
        for hi, start in enumerate(starts):
            while starts[lo] <= start - window:
                lo += 1
            best = max(best, hi - lo + 1)
        return best

    async def serve(
        self, *, port: int = 0, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on 127.0.0.1 until cancelled; ``task_status`` gets the url."""
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        self._port = listeners[0].socket.getsockname()[1]
        task_status.started(self.url)
        await trio.serve_listeners(self._serve_connection, listeners)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        """One keep-alive connection; ends on close, error or garbage (400)."""
        conn = h11.Connection(h11.SERVER)
        late = self.config.connect_delay
        if self.config.connect_jitter:
            late += self._connect_rng.uniform(0, self.config.connect_jitter)
        await trio.sleep(late)  # the first request arrives late
        async with stream:
            try:
                try:
                    while isinstance(request := await _next_event(conn, stream), h11.Request):
                        while not isinstance(await _next_event(conn, stream), h11.EndOfMessage):
                            pass  # bodies are read and discarded
                        await self._answer(conn, stream, request)
                        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                            return
                        conn.start_next_cycle()
                except h11.RemoteProtocolError as exc:
                    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        body = {"ok": False, "error": "bad_request"}
                        await self._send(conn, stream, exc.error_status_hint, [], body, close=True)
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
                return

    async def _answer(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request
    ) -> None:
        start = trio.current_time()
        self._arrivals += 1
        n = self._arrivals
        head = {name.decode("latin-1"): value.decode("latin-1") for name, value in request.headers}
        key, path = _key_from(head), request.target.decode("latin-1")
        state = self._state_for(key, start)
        in_flight_at_start = state.in_flight
        status, wait = self._admit(state, n, start)
        headers = self._limit_headers(state, start)
        if status == 200 and self.config.state_on_refusals:
            headers = []
        delay = 0.0
        if status == 200:
            body: dict[str, object] = {"ok": True, "path": path, "n": n}
            delay = self.config.latency
            if self.config.jitter:
                delay += state.rng.uniform(0, self.config.jitter)
            self._enter(state, key, start + delay)
        else:
            body = {"ok": False, "error": _ERRORS[status], "n": n}
            headers += self._refusal_headers(state, key, wait) if status != 500 else []
        try:
            await trio.sleep(delay)
            if status == 200 and self.config.state_at_answer and headers:
                headers = self._limit_headers(state, trio.current_time())
            await self._send(
                conn, stream, status, headers, body,
                close=self.config.close_each, head=request.method == b"HEAD",
            )  # fmt: skip
        finally:
            if status == 200:
                state.in_flight -= 1
                state.due.remove(start + delay)
                self._in_flight -= 1
            method, end = request.method.decode("latin-1"), trio.current_time()
            idempotency_key = head.get("idempotency-key")
            self._records.append(
                RequestRecord(
                    n, start, end, key, method, path, status, idempotency_key, in_flight_at_start
                )
            )

    def _state_for(self, key: str, now: float) -> _KeyState:
        if key not in self._keys:
            limits = self.config.limits_for(key)
            bucket: _Limiter | None = None
            if limits.rate is not None:
                bucket = self._limiter(limits.rate, limits.burst, now)
            self._keys[key] = _KeyState(limits, bucket, random.Random(self.config.seed))
        return self._keys[key]

    def _limiter(self, rate: float, burst: int, now: float) -> _Limiter:
        if self.config.model == "fixed":
            return _FixedWindow(rate, burst, self.config.window_phase)
        if self.config.model == "sliding":
            return _SlidingLog(rate, burst)
        return _TokenBucket(rate, burst, self.config.reset, float(burst), now)

    def _admit(self, state: _KeyState, n: int, now: float) -> tuple[int, float]:
        """Decide the status; refusals consume nothing. Returns (status, wait)."""
        if n <= self.config.fail_first:
            return 500, 0.0
        cap = state.limits.max_in_flight
        if cap is not None and state.in_flight >= cap:
            return 503, max(min(state.due) - now, 0.0)
        wait = state.bucket.try_take(now) if state.bucket is not None else 0.0
        return (self.config.rate_status, wait) if wait > 0 else (200, 0.0)

    def _enter(self, state: _KeyState, key: str, due: float) -> None:
        state.in_flight += 1
        state.due.append(due)
        self._in_flight += 1
        self._peak[key] = max(self._peak.get(key, 0), state.in_flight)
        self._peak[None] = max(self._peak.get(None, 0), self._in_flight)

    def _wall(self) -> float:
        """The server's (possibly skewed) wall clock, for dates only."""
        return self._wall_clock() + self.config.date_skew

    def _date(self) -> float:
        """The time its ``Date`` names: now, or with ``date_every`` when it last wrote one
        (every ``date_every`` s, half a second past the clock's seconds), as uvicorn
        writes its date once a second and sends it until the next."""
        wall, every = self._wall(), self.config.date_every
        return wall - (wall - 0.5) % every if every else wall

    def _refusal_headers(self, state: _KeyState, key: str, wait: float) -> list[tuple[str, str]]:
        cfg = self.config
        headers = []
        if cfg.scope_header is not None:
            headers.append((cfg.scope_header, state.limits.scope or key_label(key)))
        if cfg.retry_after == "seconds" and cfg.retry_after_precise:
            headers.append(("retry-after", f"{max(_ceil(wait * 1000), 1) / 1000:g}"))
        elif cfg.retry_after == "seconds":
            headers.append(("retry-after", str(max(_ceil(wait), 1))))
        elif cfg.retry_after == "ms":
            headers.append(("retry-after-ms", str(max(_ceil(wait * 1000), 1))))
        elif cfg.retry_after == "http-date":
            when = _ceil(self._wall() + wait)
            headers.append(("retry-after", email.utils.formatdate(when, usegmt=True)))
        return headers

    def _limit_headers(self, state: _KeyState, now: float) -> list[tuple[str, str]]:
        """Rate-limit headers in the configured style (definitions: module doc)."""
        bucket, style = state.bucket, self.config.headers
        if bucket is None or style == "none":
            return []
        limit, remaining = bucket.limit, bucket.remaining(now)
        until = bucket.reset(now) + self.config.reset_late
        full_at = _whole_seconds(self._wall() + until, self.config.reset_rounding)
        reset: object = _whole_seconds(until, self.config.reset_rounding)
        if style == "ietf":
            window = max(_ceil(bucket.limit / bucket.rate), 1)
            return [
                ("ratelimit-policy", f'"default";q={limit};w={window}'),
                ("ratelimit", f'"default";r={remaining};t={reset}'),
            ]
        if style == "shopify":  # the fill level only: used of size, no reset
            return [("x-shopify-shop-api-call-limit", f"{limit - remaining}/{limit}")]
        if style == "azure":  # what remains, alone
            return [("x-ratelimit-remaining-requests", str(remaining))]
        names = ("limit", "remaining", "reset")
        if style == "anthropic":
            prefix = "anthropic-ratelimit-requests-"
            reset = datetime.fromtimestamp(full_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        elif style == "openai":
            prefix, reset = "x-ratelimit-", go_duration(until)
            names = ("limit-requests", "remaining-requests", "reset-requests")
        else:
            prefix = "ratelimit-" if style == "draft" else "x-ratelimit-"
            reset = full_at if self.config.reset_as_epoch else reset  # as GitHub's, GitLab's
            if self.config.reset_precise:  # as slowapi's float epoch, Discord's reset-after
                at = self._wall() + until if self.config.reset_as_epoch else until
                reset = f"{at:.3f}"
        return [(prefix + n, str(v)) for n, v in zip(names, (limit, remaining, reset), strict=True)]

    async def _send(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        status: int,
        headers: list[tuple[str, str]],
        body: Mapping[str, object],
        *,
        close: bool = False,
        head: bool = False,
    ) -> None:
        """Send one response; ``head`` omits the body (the request was HEAD)."""
        data = json.dumps(body).encode()
        fields = [
            ("content-type", "application/json"),
            ("content-length", str(len(data))),
            ("date", email.utils.formatdate(self._date(), usegmt=True)),
            *headers,
            *([("connection", "close")] if close else []),
        ]
        response = h11.Response(
            status_code=status, headers=fields, reason=HTTPStatus(status).phrase
        )
        events = (response, h11.Data(b"" if head else data), h11.EndOfMessage())
        await stream.send_all(b"".join(conn.send(event) or b"" for event in events))


def _key_from(head: Mapping[str, str]) -> str:
    """The accounting key: ``x-api-key``, else a Bearer token, else anonymous."""
    if api_key := head.get("x-api-key", "").strip():
        return api_key
    scheme, _, token = head.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return _ANONYMOUS


def go_duration(seconds: float) -> str:
    """Format like OpenAI's reset headers (Go durations): ``20ms``, ``1.5s``, ``6m0s``."""
    ms = max(_ceil(seconds * 1000), 0)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    minutes, ms = divmod(ms, 60_000)
    hours, minutes = divmod(minutes, 60)
    text = f"{hours}h" if hours else ""
    text += f"{minutes}m" if hours or minutes else ""
    return text + f"{ms / 1000:g}s"


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> object:
    """The next h11 event, reading from the socket as needed (b"" means EOF)."""
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await stream.receive_some(65536))
    return event


@asynccontextmanager
async def serve_throttled(
    config: ServerConfig | None = None,
    *,
    port: int = 0,
    wall_clock: Callable[[], float] = time.time,
) -> AsyncIterator[ThrottlingServer]:
    """Run a ``ThrottlingServer`` on 127.0.0.1 for the duration of the block."""
    server = ThrottlingServer(config, wall_clock=wall_clock)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(server.serve, port=port))
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


def _optional(kind: Callable[[str], float]) -> Callable[[str], float | None]:
    return lambda text: None if text.lower() == "none" else kind(text)


def parse_command_line(argv: Sequence[str] | None = None) -> tuple[int, ServerConfig]:
    """The port to listen on (0: any free one) and the server's configuration."""
    p = argparse.ArgumentParser(prog="python -m fanout._throttle_server")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--rate", type=_optional(float), default=10.0, help="req/s, or 'none'")
    p.add_argument("--burst", type=int, default=10)
    p.add_argument("--max-in-flight", type=_optional(int), default=None)
    p.add_argument("--latency", type=float, default=0.0)
    p.add_argument("--jitter", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--retry-after", choices=get_args(RetryAfterFormat), default="seconds")
    p.add_argument("--retry-after-precise", action="store_true")
    p.add_argument("--headers", choices=get_args(HeaderStyle), default="ietf")
    p.add_argument("--reset-as-epoch", action="store_true")
    p.add_argument("--reset-late", type=float, default=0.0)
    p.add_argument("--reset-precise", action="store_true")
    p.add_argument("--reset-rounding", choices=get_args(ResetRounding), default="up")
    p.add_argument("--state-at-answer", action="store_true")
    p.add_argument("--state-on-refusals", action="store_true")
    p.add_argument("--close-each", action="store_true")
    p.add_argument("--scope-header", default=None)
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--date-skew", type=float, default=0.0)
    p.add_argument("--date-every", type=float, default=0.0)
    p.add_argument("--model", choices=get_args(Model), default="bucket")
    p.add_argument("--reset", choices=get_args(ResetMeaning), default="full")
    p.add_argument("--connect-delay", type=float, default=0.0)
    p.add_argument("--connect-jitter", type=float, default=0.0)
    p.add_argument("--rate-status", type=int, choices=_RATE_STATUSES, default=429)
    p.add_argument("--window-phase", type=float, default=0.0)
    args = vars(p.parse_args(argv))
    port = args.pop("port")
    return port, ServerConfig(**args)


def main(argv: Sequence[str] | None = None) -> None:
    """CLI for benchmarks: prints ``READY <url>`` once listening, serves until killed."""
    port, config = parse_command_line(argv)

    async def run() -> None:
        async with serve_throttled(config, port=port) as server:
            print(f"READY {server.url}", flush=True)
            await trio.sleep_forever()

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run)


if __name__ == "__main__":
    main()
