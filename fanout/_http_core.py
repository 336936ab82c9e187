"""What fanout's HTTP transports do, once, for httpx and httpx2 alike.

httpx and httpx2 share one shape (a transport is ``handle_async_request``
and ``aclose``; a response body is an async byte stream) but not one class
tree. Everything fanout adds lives here, written against that shape; each
library's transport (`fanout._http`, `fanout.httpx2`) is a thin seam that
names its own exception and stream classes. For each request sent from
inside a tool call, `HttpCore`:

* charges the request to the call's scopes and budget first. The runner
  reserved one token when it admitted the attempt, which pays for the first
  request; each further request reserves again, so a tool making three
  requests is charged three times. A request whose wait does not fit the
  budget (or the inline threshold) is never sent: ``NotSentError``;
* learns the credentials the request carries, its body's too (`fanout._secrets`), so the
  call's answer is scrubbed of them even when a server echoes them back;
* adds ``Idempotency-Key`` (the call's key) to requests of mutating calls;
* reads the rate-limit headers of the response into the scopes. A scope the
  server names is a name from outside: it is used only if it is short and
  plain (`fanout._headers`) and holds no credential, else it reads
  ``REDACTED``;
* turns the rate's refusals (429, and a 403 that says it is one:
  `_refused_for_rate`) and an overload with a Retry-After (503, 529) into
  ``RateLimitedError`` with the parsed wait and the bucket the server named,
  so the runner's retry policy applies; 408, 500, 502, 503, 504 and 529
  otherwise become ``TransientError``; ``x-should-retry`` (or Stripe's
  ``Stripe-Should-Retry``) overrides either way;
* turns a transport error, while sending or while the tool reads the
  response *body* (a reset, a bad chunk), into ``TransientError`` with a
  redacted message, so a read is retried. For a write that had left, the
  server may have acted: the context is marked ``effect_unknown`` and its
  answer is not kept for replay;
* writes no credential anywhere: URLs and messages are redacted before they
  reach an event or an exception.

Outside a tool call the transport simply forwards the request.
"""

from __future__ import annotations

import base64
import functools
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attrs
import trio

from ._admission import take_tokens
from ._budget import MAX_WAIT, Verdict, usable_wait
from ._context import maybe_current_call
from ._credentials import CredentialNames, cookies_set, credentials_in
from ._events import EventDetail, EventKind
from ._exceptions import ConfigurationError, NotSentError, RateLimitedError, TransientError
from ._headers import http_date, parse_rate_limit_headers
from ._library_log import scrub_library_log
from ._logs import log_failure
from ._pools import PoolLoads, PoolUse
from ._redact import REDACTED, read_as_credentials, redact_text, redact_url
from ._retry_info import read_capped, retry_delay
from ._scope import ScopeLike, quota_horizon, scopes_named, scopes_stated
from ._secrets import Secret, learn
from ._server_clock import ServerClock
from ._slots import Leaving
from ._validate import require_at_least
from ._values import Kind, Status

if TYPE_CHECKING:
    from collections.abc import MutableMapping
    from types import ModuleType

    from ._context import CallContext
    from ._values import RateLimitInfo

__all__ = [
    "GuardedBody",
    "HttpCore",
    "Seam",
    "TransportBase",
    "charge_mounted",
    "charged_client",
    "server_scope",
]

_log = logging.getLogger("fanout")

# Worth another try: a server's failure or its overload (529: Anthropic's), or its
# timeout waiting for the request (408), as the OpenAI and Anthropic SDKs retry them.
_TRANSIENT = frozenset({408, 500, 502, 503, 504, 529})
# An overloaded server: with a ``Retry-After``, the wait is its to say, as a 429's.
_OVERLOADED = frozenset({503, 529})
_CLOCKS = 256  # servers whose clocks are remembered
# Seconds a refusal's body may take to arrive for the wait it states: a few hundred
# bytes that do not come within this long are not worth the call's budget.
_BODY_WAIT = 1.0
# A refusal's body is read off (`_read_off`) if it comes within this long and is this short.
_READ_OFF = 0.05
_READ_OFF_BYTES = 16_384
# Calls of a turn per set of pools. httpcore looks at every connection of a pool
# each time a request starts or ends, so a pool's cost per request grows with its
# connections: ten thousand hung calls on four pools spent 13 s starting, most of
# it there (`benchmarks/bench_deadline.py`). Positions past the first set's get
# pools of their own; a turn this size or smaller uses the first set alone.
_CALLS_PER_SET = 256


class _Request(Protocol):
    @property
    def method(self) -> str: ...
    @property
    def url(self) -> Any: ...
    @property
    def headers(self) -> MutableMapping[str, str]: ...
    @property
    def content(self) -> bytes: ...


class _Response(Protocol):
    stream: Any

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> MutableMapping[str, str]: ...
    async def aclose(self) -> None: ...


def _set_cookie_lines(headers: MutableMapping[str, str]) -> list[str]:
    """A response's ``Set-Cookie`` lines, each apart: read as one header, they are joined
    with commas, which a cookie's ``Expires`` date holds too."""
    each = getattr(headers, "multi_items", None)  # httpx's and httpx2's headers
    if each is None:
        line = headers.get("set-cookie")
        return [] if line is None else [line]
    return [value for name, value in each() if name.lower() == "set-cookie"]


RequestT = TypeVar("RequestT", bound=_Request)
ResponseT = TypeVar("ResponseT", bound=_Response)
_RequestIn = TypeVar("_RequestIn", bound=_Request, contravariant=True)
_ResponseOut = TypeVar("_ResponseOut", bound=_Response, covariant=True)


class _Pool(Protocol[_RequestIn, _ResponseOut]):
    async def handle_async_request(self, request: _RequestIn) -> _ResponseOut: ...
    async def aclose(self) -> None: ...


class GuardedBody:
    """A response body whose transport errors become ``TransientError``.

    A seam mixes it into its library's async byte stream class, so the
    library's ``Response`` accepts it as its own.
    """

    def __init__(
        self,
        inner: Any,
        errors: type[Exception],
        fail: Callable[[Exception], TransientError],
        closed: Callable[[], None],
    ) -> None:
        self._inner = inner
        self._errors = errors
        self._fail = fail
        self._closed = closed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except self._errors as exc:
            raise self._fail(exc) from None

    async def aclose(self) -> None:
        # Once its connection is the pool's again: told before, a request sent meanwhile
        # took that connection for idle, found it busy and opened one (`fanout._pools`).
        try:
            await self._inner.aclose()
        finally:
            self._closed()


@attrs.define
class _Place:
    """A request's place on the wire of each of its scopes (`fanout._slots`), and in the
    connection pool it goes through (`fanout._pools`), given back once; ``leaving``
    says how it left each scope, keyed by the scope's id."""

    scopes: tuple[ScopeLike, ...] = ()
    leaving: dict[int, Leaving] = attrs.field(factory=dict)
    pooled: PoolUse[Any] | None = None

    @classmethod
    async def take(
        cls, scopes: tuple[ScopeLike, ...], admitted_at: float, context: CallContext
    ) -> _Place:
        """A place on each scope for a request of a call admitted at ``admitted_at``;
        cancelled part way, the places taken are given back. A wait for a token as it
        leaves is told to the call's instruments, as any wait for tokens is, and judged
        against its budget (`_afford_wait`)."""
        place = cls()
        try:
            for scope in scopes:
                on_wait = functools.partial(_afford_wait, context, scope.name)
                place.leaving[id(scope)] = await scope.request_leaving(admitted_at, on_wait)
                place.scopes += (scope,)
        except BaseException:
            place.give_back()
            raise
        return place

    def give_back(self) -> None:
        scopes, self.scopes = self.scopes, ()
        for scope in scopes:
            scope.request_back()
        if self.pooled is not None:
            self.pooled.release()

    async def leave_or_recharge(self, context: CallContext) -> None:
        """Go on with a token on every scope: where a refusal overruled the one the call
        took while it waited for its place, hand the place on, book a token anew,
        and wait for a place again.

        Held while it waited for its new token, its place stopped the calls
        queued behind it at the cap, each holding a token of the log it waited
        on: against a cap of one and a fixed window, one request went out a
        window for three windows.
        """
        while overruled := tuple(s for s in self.scopes if self.leaving[id(s)].overruled):
            self.scopes = tuple(s for s in self.scopes if s not in overruled)
            for scope in overruled:
                scope.request_back(sent=False)
            await _charge(context, overruled)
            retaken = await _Place.take(overruled, trio.current_time(), context)
            self.scopes += retaken.scopes
            self.leaving.update(retaken.leaving)


@attrs.frozen
class Seam:
    """What one HTTP library calls the things the core needs.

    ``not_sent``: transport errors that mean the request never left (no
    connection was made), so even a write had no effect.
    """

    transport_error: type[Exception]
    not_sent: tuple[type[Exception], ...]
    not_read: type[Exception]  # what reading a streamed request's body raises
    body: type[GuardedBody]
    pool: Callable[..., Any]  # the library's own connection-pooling transport class
    limits: Callable[..., Any]  # the library's pool limits class
    ssl_context: Callable[..., Any]  # the library's ``create_ssl_context``
    # The library's own loggers: its own logs every request's URL; its connection
    # pool's (httpcore's) log the headers at DEBUG, which a server may echo a key in.
    loggers: tuple[str, ...]

    @classmethod
    def of(cls, library: ModuleType, body: type[GuardedBody]) -> Seam:
        """The seam of an httpx-shaped library (httpx, httpx2): same names, other classes."""
        return cls(
            transport_error=library.TransportError,
            not_sent=(library.ConnectError, library.ConnectTimeout, library.PoolTimeout),
            not_read=library.RequestNotRead,
            body=body,
            pool=library.AsyncHTTPTransport,
            limits=library.Limits,
            ssl_context=library.create_ssl_context,
            loggers=(library.__name__, *_pool_loggers(library.__name__)),
        )


def _pool_loggers(library: str) -> tuple[str, ...]:
    """The loggers of the connection pool under ``library`` (httpcore's, named per module:
    a filter on a parent does not see a child's records)."""
    pool = {"httpx": "httpcore", "httpx2": "httpcore2"}.get(library)
    if pool is None:
        return ()
    parts = ("connection", "http11", "http2", "proxy", "socks")
    # HTTP/2's header compression (hpack, under either pool) logs every header it adds
    # to its table at DEBUG: ``Adding (b'x-api-key', b'<the key>')``.
    return (*(f"{pool}.{part}" for part in parts), "hpack.hpack", "hpack.table")


class TransportBase(Generic[RequestT, ResponseT]):
    """A ``FanoutTransport``: a seam mixes it with its library's base transport.

    Wraps ``transport``, or without one spreads requests over ``pools`` of the
    library's connection pools (``pool_options`` configure each; `fanout._pools`
    picks one with a connection idle): a pool gets slower as many concurrent
    requests share it, and at 200 concurrent calls four pools beat one
    (``benchmarks/bench_http.py``). The pools do
    not cap connections unless ``limits=`` says so: a scope's
    ``max_concurrency`` is where calls queue, charged to their budgets, and
    a second queue inside the library would hide those waits (and, at a
    thousand hung calls, take over a second to unwind at the deadline
    against a fifth of that uncapped: ``benchmarks/bench_deadline.py``).
    Each keeps 20 idle connections, as httpx does by default: kept without
    bound, the connections a burst of 200 calls opened stayed, and httpcore
    looked at every one of them at each later request (2.5x the CPU).
    ``secret_headers`` and ``secret_params`` name request headers and query
    parameters that carry credentials, besides the built-in ones.
    ``wall_clock`` is only for reading HTTP-dates and epoch resets; every
    wait is measured on trio's clock.
    """

    seam: Seam

    def __init__(
        self,
        transport: _Pool[RequestT, ResponseT] | None = None,
        *,
        pools: int = 4,
        secret_headers: Iterable[str] = (),
        secret_params: Iterable[str] = (),
        wall_clock: Callable[[], float] = time.time,
        **pool_options: Any,
    ) -> None:
        require_at_least("pools", pools, 1)
        if not callable(wall_clock):
            raise ConfigurationError(f"wall_clock must be a function, not {wall_clock!r}")
        for logger in self.seam.loggers:
            scrub_library_log(logger)
        if transport is not None:
            transports: tuple[_Pool[RequestT, ResponseT], ...] = (transport,)
        else:
            pool_options.setdefault(
                "limits", self.seam.limits(max_connections=None, max_keepalive_connections=20)
            )
            # One TLS context for every pool: each reads the CA bundle (some 20 ms) otherwise.
            pool_options["verify"] = self.seam.ssl_context(
                verify=pool_options.get("verify", True),
                cert=pool_options.pop("cert", None),
                trust_env=pool_options.get("trust_env", True),
            )
            transports = tuple(self.seam.pool(**pool_options) for _ in range(pools))
        credentials = CredentialNames.adding(secret_headers, secret_params)
        read_as_credentials(credentials.headers, credentials.params)  # in every text, by shape
        for pool in transports:
            learn(_proxy_credentials(pool), pinned=True)
        self._core = HttpCore(
            self.seam, transports, wall_clock=wall_clock, credentials=credentials,
            more=None if transport is not None else lambda: self.seam.pool(**pool_options),
        )  # fmt: skip

    async def handle_async_request(self, request: RequestT) -> ResponseT:
        return await self._core.handle(request)

    async def aclose(self) -> None:
        await self._core.aclose()


def _proxy_credentials(transport: object) -> set[Secret]:
    """The credentials a proxying transport sends its proxy with every request.

    httpcore adds a proxy's ``Proxy-Authorization`` (and a SOCKS proxy its user
    and password) below this transport, where no request it sees carries them:
    a proxy's 407 quoting ``user:password`` reached the model. Read where
    httpcore keeps them (it has no public way in); a transport of another
    shape has none to give.
    """
    pool = getattr(transport, "_pool", None)
    headers = getattr(pool, "_proxy_headers", None) or ()
    auth = getattr(pool, "_proxy_auth", None)
    try:
        pairs = [(bytes(name).decode("latin-1"), bytes(value).decode("latin-1"))
                 for name, value in headers]  # fmt: skip
        if isinstance(auth, tuple) and len(auth) == 2:
            user, password = (bytes(part).decode("utf-8", "replace") for part in auth)
            pairs.append(("Proxy-Authorization", f"Basic {_basic(user, password)}"))
    except (TypeError, ValueError):  # not httpcore's shape after all
        return set()
    return credentials_in(pairs, "", CredentialNames())


def _basic(user: str, password: str) -> str:
    """A Basic credential's base64, as a SOCKS proxy's user and password would read."""
    return base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


_Client = TypeVar("_Client")

# The client options httpx gives the transport it builds, and the proxies' it mounts.
_POOL_OPTIONS = ("verify", "cert", "trust_env", "http1", "http2", "limits")


def charged_client(
    fanout_transport: Callable[..., Any],
    client_class: Callable[..., _Client],
    transport: Any,
    client_options: dict[str, Any],
    *,
    secret_headers: Iterable[str],
    secret_params: Iterable[str],
) -> _Client:
    """A ``client_class`` (an ``AsyncClient``) whose every transport is a
    ``fanout_transport`` (its library's ``FanoutTransport``, given ``secret_headers`` and
    ``secret_params``): its own, and each it mounts (`charge_mounted`).

    Given no ``transport``, the client is built as httpx builds one, so that
    the options httpx gives its own transport (``verify=False``, ``http2=True``,
    ``limits=``) reach fanout's pools, and the environment's proxies
    (``HTTPS_PROXY``, ``NO_PROXY``) are mounted while ``trust_env``: handed
    fanout's transport, httpx read neither (it verified a server told not to
    be, and sent past a proxy the environment named). Its own transport is
    then fanout's. One TLS context serves all of them.
    """
    seam: Seam = fanout_transport.seam  # type: ignore[attr-defined]

    def wrap(inner: Any, **pool_options: Any) -> Any:
        return fanout_transport(
            inner, secret_headers=secret_headers, secret_params=secret_params, **pool_options
        )

    if isinstance(transport, TransportBase):  # fanout's already: wrapped, charged twice
        return charge_mounted(client_class(transport=transport, **client_options), wrap)
    if transport is not None:
        return charge_mounted(client_class(transport=wrap(transport), **client_options), wrap)
    options = dict(client_options)
    options["verify"] = seam.ssl_context(
        verify=options.get("verify", True),
        cert=options.pop("cert", None),
        trust_env=options.get("trust_env", True),
    )
    client = client_class(**options)
    pool_options = {name: options[name] for name in _POOL_OPTIONS if name in options}
    client._transport = wrap(None, **pool_options)  # type: ignore[attr-defined]
    return charge_mounted(client, wrap)


def charge_mounted(client: _Client, wrap: Callable[[Any], Any]) -> _Client:
    """``client`` with each transport it mounted wrapped in a ``FanoutTransport`` too (by
    ``wrap``): a proxy (``proxy=``, or the environment's ``HTTPS_PROXY`` while
    ``trust_env``) or ``mounts=`` is mounted beside the client's own transport and
    takes the requests it matches past it. (A tool's requests through a proxy were
    never charged, limited nor learned from: a key the server quoted reached the model.)
    Read and set where httpx keeps them, ``_mounts``: it has no public way in.
    """
    mounts: dict[Any, Any] = client._mounts  # type: ignore[attr-defined]
    client._mounts = {  # type: ignore[attr-defined]
        pattern: mounted if mounted is None or isinstance(mounted, TransportBase)
        else wrap(mounted)
        for pattern, mounted in mounts.items()
    }  # fmt: skip
    return client


class HttpCore(Generic[RequestT, ResponseT]):
    """The behaviour of a ``FanoutTransport``, for any library with httpx's shape."""

    def __init__(
        self,
        seam: Seam,
        transports: Iterable[_Pool[RequestT, ResponseT]],
        *,
        wall_clock: Callable[[], float],
        credentials: CredentialNames,
        more: Callable[[], _Pool[RequestT, ResponseT]] | None = None,
    ) -> None:
        self._seam = seam
        self._transports = tuple(transports)
        # Further sets of pools, made with ``more`` as a large turn's calls need them.
        self._more = more
        self._sets: dict[int, tuple[_Pool[RequestT, ResponseT], ...]] = {}
        self._unbound = itertools.cycle(self._transports)
        self._wall_clock = wall_clock
        self._credentials = credentials
        self._clocks: dict[str, ServerClock] = {}
        self._loads = PoolLoads[_Pool[RequestT, ResponseT]]()

    def _credentials_of(self, request: RequestT, url: str) -> set[Secret]:
        """The credentials ``request`` carries, its body's among them where the library
        holds it whole (a body streamed, an iterator or a multipart upload, is not read:
        reading it here would consume it)."""
        try:
            body = request.content
        except self._seam.not_read:
            body = b""
        return credentials_in(request.headers.items(), url, self._credentials, body)

    async def handle(self, request: RequestT) -> ResponseT:
        context = maybe_current_call()
        if context is None:
            # Sent outside any call (a worker task the tools hand requests to): nothing to
            # charge, but its credentials are learned, as a call's are. (Forwarded
            # unread, a key a server echoed to such a request reached the model.)
            learn(self._credentials_of(request, str(request.url)))
            return await next(self._unbound).handle_async_request(request)
        first = context.requests == 0
        booked_by = context.booked_by  # when its token was due (`_Watch`)
        if not first:
            await _charge(context)
            booked_by = trio.current_time()
        context.requests += 1
        target = str(request.url)
        found = self._credentials_of(request, target)
        learn(found)
        context.secrets.update(secret.reveal() for secret in found)
        if context.kind is Kind.MUTATING and context.idempotency_key:
            request.headers.setdefault("Idempotency-Key", context.idempotency_key)
        url = redact_url(target, context.secrets)
        # How many other requests of each scope were on the wire: a 503 read against it
        # may show a cap on requests in flight, which later requests wait under
        # (`fanout._slots`); that wait is no lag of the network's.
        waited_from = trio.current_time()
        if first:  # its token was taken at admission: how late it leaves sizes the slack
            lag = waited_from - context.admitted_at
            for scope in context.scopes:
                scope.observe_send_lag(lag, arrived_at=context.arrived_at)
        # Its place is given back once its answer is read: handed on at the headers, the
        # next request reached a server that had not yet counted this one out, and was
        # refused. A body never closed gives it back when the attempt ends.
        place = await _Place.take(context.scopes, context.admitted_at, context)
        context.places.append(place.give_back)
        answered = False
        try:
            await place.leave_or_recharge(context)
            # Nor is it the server's: a call's duration is a sample of how fast the
            # server answers. Counted, a cap of 1 queued 50 calls for seconds, the
            # spread of "latencies" became a window's 8 s margin, which queued them
            # longer still: 198 s for what takes 8.5 (`Lags.margin`).
            context.held += trio.current_time() - waited_from
            _emit(context, EventKind.REQUEST_SENT, detail={"method": request.method, "url": url})
            watch = _watch_connections(request, context, first=first, booked_by=booked_by)
            place.pooled = use = self._loads.take(
                self._pools_for(context.call.position), _origin(request), context.call.position
            )
            held_before = context.held
            sent_at = trio.current_time()
            try:
                response = await use.pool.handle_async_request(request)
            except self._seam.transport_error as exc:
                raise self._failed(
                    context, exc, sent=not isinstance(exc, self._seam.not_sent)
                ) from None
            finally:
                watch.back()
            answered = True
        finally:
            if not answered:
                place.give_back()
        sent_at += context.held - held_before  # it left once its hold was over
        session = cookies_set(_set_cookie_lines(response.headers))
        if session:
            learn(session)
            context.secrets.update(secret.reveal() for secret in session)
        info = parse_rate_limit_headers(
            response.headers, now=self._wall_clock(),
            server_now=self._server_now(request, response.headers.get("date"), sent_at),
        )  # fmt: skip
        if info.scope is not None:
            info = attrs.evolve(info, scope=server_scope(info.scope, context.secrets))
        refused = _refused_for_rate(response.status_code, info)
        read = False
        if info.retry_after is None and (
            refused or (response.status_code in _OVERLOADED and info.should_retry is not False)
        ):
            info, read = await self._wait_in_body(response, info)
        overloaded = context.refused = response.status_code == 503
        for scope in scopes_stated(context.scopes, info):
            try:
                await scope.observe_headers(
                    info, sent_at=sent_at, refused=refused or overloaded,
                    opened=watch.opened,
                    left_with=place.leaving.get(id(scope)), overloaded=overloaded,
                    booked_by=context.booked_by if first else None, left_at=watch.left_at,
                    connecting=watch.connecting if watch.opened else None,
                )  # fmt: skip
            except Exception as exc:
                # The server answered; what a scope of yours makes of it is its own. Raised
                # to the tool, a write the server had charged was answered as the tool's
                # error, with no word of its effect, and kept for replay.
                log_failure(_log, "fanout: scope %s failed to read an answer", scope.name, exc=exc)
        if context.recorder.active:
            detail = _response_detail(response, info)
            _emit(context, EventKind.RESPONSE, scope=info.scope, detail=detail)
        signal = _signal_for(
            response.status_code, info, f"{request.method} {url}", sent_at, refused=refused
        )
        if signal is not None:
            place.give_back()
            named = scopes_named(context.scopes, info.scope)
            if isinstance(signal, RateLimitedError):
                await _tell_throttled(named, signal)
            elif overloaded:
                # A 503 with no wait: a scope learning its rate takes it as the rate's
                # refusal; any other took it in already, if at all (`observe_headers`).
                for scope in named:
                    await scope.on_throttled(None, sent_at=sent_at, arriving=True)
            if not read:
                await _read_off(response)
            await response.aclose()
            raise signal
        response.stream = self._seam.body(
            response.stream,
            self._seam.transport_error,
            lambda exc: self._failed(context, exc, sent=True, body=True),
            place.give_back,
        )
        context.answered += 1  # admitted: whatever the call does next, this one went
        return response

    async def _wait_in_body(
        self, response: ResponseT, info: RateLimitInfo
    ) -> tuple[RateLimitInfo, bool]:
        """``info`` with the wait a refusal's JSON body states (`fanout._retry_info`), if it
        states one, and whether the body was read. The body is fanout's: the refusal
        becomes a signal, never the tool's."""
        if "json" not in response.headers.get("content-type", "").lower():
            return info, False
        body = None
        with trio.move_on_after(_BODY_WAIT):
            try:
                body = await read_capped(response.stream)
            except Exception:  # broken off, or a stream of a transport's own that failed
                return info, True  # only advice was lost: a bare refusal, as it would have been
        wait = None if body is None else retry_delay(body, MAX_WAIT)
        return (info if wait is None else attrs.evolve(info, retry_after=wait)), True

    def _server_now(self, request: RequestT, date: str | None, sent: float) -> float | None:
        """The server's clock now, finer than its ``Date`` (`fanout._server_clock`)."""
        host = str(request.url.host)
        clock = self._clocks.get(host)
        if clock is None:
            if len(self._clocks) >= _CLOCKS:
                self._clocks.clear()  # many hosts: forgetting only costs precision
            clock = self._clocks[host] = ServerClock()
        return clock.read(
            http_date(date), now=trio.current_time(), sent=sent, wall=self._wall_clock()
        )

    def _failed(
        self, context: CallContext, exc: Exception, *, sent: bool, body: bool = False
    ) -> TransientError:
        """The ``TransientError`` for a transport error; a write that left has an unknown effect."""
        if sent and context.kind is Kind.MUTATING:
            context.effect_unknown = True
        where = "reading the response body" if body else "sending the request"
        message = f"{type(exc).__name__} while {where}: {exc}"
        return TransientError(redact_text(message, context.secrets))

    def _pools_for(self, position: int) -> tuple[_Pool[RequestT, ResponseT], ...]:
        """The set of pools the call at ``position`` sends through: a set serves
        `_CALLS_PER_SET` positions (`PoolLoads` picks one of it for each request)."""
        pools = self._transports
        which = position // _CALLS_PER_SET
        if which and self._more is not None:
            if which not in self._sets:
                self._sets[which] = tuple(self._more() for _ in pools)
            pools = self._sets[which]
        return pools

    async def aclose(self) -> None:
        for transport in (*self._transports, *itertools.chain(*self._sets.values())):
            await transport.aclose()


def server_scope(name: str | None, secrets: Iterable[str]) -> str | None:
    """A scope name a server gave, fit to become a label: ``REDACTED`` if it holds a credential.

    `fanout._headers` has already held it to a short, plain pattern.
    """
    if name is None:
        return None
    return name if redact_text(name, secrets) == name else REDACTED


@attrs.define(eq=False)
class _Watch:
    """What the connection pool said of one request (`_watch_connections`).

    ``opened``: True if it opened a connection, False if it went over one
    already open, None if the pool said nothing (a window's log judges its
    arrival by that, `fanout._window.Arrivals`). The scopes it left over a
    reused connection for hear when it is back: until then, the server is
    taking at least that long (`ScopeFront.warm_request_left`).
    """

    opened: bool | None = None
    # When the request's token was due: its call's (`CallContext.booked_by`) for its first,
    # its own charge for a later one. Its scopes know its booking by it.
    booked_by: float = -math.inf
    first: bool = True
    connecting: float = math.inf  # when it began to open a connection, if it did
    # Each scope's tokens as the request took its token on the wire, and when
    # (`ScopeFront.wire_left`), until its headers are written (`written`).
    _wire: list[tuple[ScopeLike, float]] = attrs.field(factory=list)
    _wire_at: float = -math.inf
    _written_at: float = -math.inf
    _told: tuple[ScopeLike, ...] = ()
    _delayed: tuple[ScopeLike, ...] = ()

    @property
    def left_at(self) -> float | None:
        """When its headers were written (`written`), if the pool said: the server's time
        and the way back are from then. (From when they began, a request whose write
        was held 34 ms, a pause of the process, took a round trip 34 ms slower than the
        others, and a told window's margin, how much round trips vary, held every window
        after it that much longer.)"""
        return self._written_at if math.isfinite(self._written_at) else None

    def left_warm(self, scopes: tuple[ScopeLike, ...]) -> None:
        for scope in scopes:
            scope.warm_request_left()
        self._told = scopes

    def delayed(self, context: CallContext) -> None:
        """The request is on its way but not out yet: opening a connection, or held back
        (`ScopeFront.request_delayed`)."""
        if not self._delayed:
            for scope in context.scopes:
                scope.request_delayed(self.booked_by, first=self.first)
        self._delayed = context.scopes

    def took_wire(self, scopes: tuple[ScopeLike, ...]) -> None:
        """Its headers leave now: each scope counts its token on the wire
        (`ScopeFront.wire_left`)."""
        self._wire_at = trio.current_time()
        self._wire = [(scope, scope.wire_left()) for scope in scopes]

    def written(self) -> None:
        """Its headers are written: each scope that counted its token on the wire hears
        how much later than then (`ScopeFront.wire_written`)."""
        self._written_at = trio.current_time()
        late = self._written_at - self._wire_at
        for scope, found in self._wire:
            scope.wire_written(
                found, late, booked_by=self.booked_by, opened=self.opened is True,
                connecting=self.connecting,
            )  # fmt: skip
        self._wire = []

    def left(self, context: CallContext) -> None:
        """The request left now (`ScopeFront.request_left`)."""
        for scope in context.scopes:
            scope.request_left(self.booked_by, first=self.first)
        self._delayed = ()

    def back(self) -> None:
        """Its answer came, or it failed on the wire: one delayed that never left (its
        connection failed, or its call was cancelled) counts as leaving now."""
        for scope in self._told:
            scope.warm_request_back()
        self._told = ()
        for scope in self._delayed:
            scope.request_left(self.booked_by, first=self.first)
        self._delayed = ()


def _watch_connections(
    request: _Request, context: CallContext, *, first: bool, booked_by: float
) -> _Watch:
    """Have the connection pool say whether ``request`` opens a new connection.

    httpcore (and httpcore2, under httpx2) report each step of a request to
    its ``trace`` extension, and await it: ``connection.connect_tcp`` (or
    ``_unix_socket``) only when a connection is opened for it, then
    ``http11.send_request_headers`` (or ``http2.``) as it leaves. A call
    that opened a connection is not a sample of the server's latency
    (`ScopeFront.observe_call`); a request that did not open one waits
    here for its scopes' ``warm_hold`` before it leaves, and the wait is
    not counted in its call's duration (``context.held``). How long after
    it was handed on (now) such a request got to its headers is told to
    its scopes: requests that take more or less time on the way reach the
    server out of step (`ScopeFront.observe_write_lag`). A ``trace`` the
    caller set is still called. A transport that reports nothing (a mock, a
    custom one) leaves every call a sample and every request unheld, as before.
    A call's ``first`` request tells its scopes when its headers leave
    (`ScopeFront.headers_left`). Every request, once any hold and any wait
    for the wire is over (`_wait_to_leave`), tells them that it left
    (`ScopeFront.request_left`) and took its token on the wire
    (`ScopeFront.wire_left`), and once its headers are written, how much
    later (`ScopeFront.wire_written`); while it opens a connection or is
    held, that it is delayed (`ScopeFront.request_delayed`).
    """
    watch = _Watch(booked_by=booked_by, first=first)
    extensions = getattr(request, "extensions", None)
    if not isinstance(extensions, dict):
        return watch
    theirs = extensions.get("trace")
    handed_on = trio.current_time()

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event.startswith("connection.connect_") and event.endswith(".started"):
            watch.opened = context.opened_connection = True
            watch.delayed(context)
            # A server slow to take in a new connection reads its request that much after
            # the connection began, however long the request waits after: a told window's
            # room is waited for here too, before the connection begins.
            await _wait_to_leave(context, watch, opening=True)
            watch.connecting = trio.current_time()
        elif event.startswith("connection.connect_") and event.endswith(".complete"):
            for scope in context.scopes:
                scope.observe_connect(trio.current_time() - watch.connecting)
        elif event.endswith(".send_request_headers.started"):
            if first:  # its call's token: how late it leaves (`ScopeFront.headers_left`)
                for scope in context.scopes:
                    scope.headers_left(context.admitted_at)
            if not watch.opened:
                watch.opened, context.reused_connection = False, True
                for scope in context.scopes:
                    scope.observe_write_lag(trio.current_time() - handed_on)
                hold = _warm_hold(context)  # what it costs is owed there
                if hold > 0:
                    context.held += hold
                    watch.delayed(context)
                    await trio.sleep(hold)
                watch.left_warm(context.scopes)
            # After its connection's set-up, or its hold; no checkpoint after the last
            # wait: the room it waited for is its own.
            await _wait_to_leave(context, watch)
            watch.took_wire(context.scopes)
            watch.left(context)
        elif event.endswith(".send_request_headers.complete"):
            # Nothing later is ours to hear: the caller's trace alone hears the rest.
            _restore(extensions, theirs)
            watch.written()
        if theirs is not None:
            await theirs(event, info)

    extensions["trace"] = trace
    return watch


async def _wait_to_leave(context: CallContext, watch: _Watch, *, opening: bool = False) -> None:
    """Hold a request, as its headers leave, until each told bucket of its scopes has a
    token for it counted by when requests reached the wire (`ScopeFront.wire_wait`),
    and each told window has room for it counted by when requests left
    (`ScopeFront.window_wait`); ``opening``: as it begins to open a connection, until
    each told window has room (a bucket counts it as its headers leave).

    Against a sliding log of one per 50 ms that read new connections 100 ms late,
    in real time, two requests 50 ms apart as their headers left had begun their
    connections 47.7 ms apart: the server read them so, and refused the second.

    Asked again after each wait: a request that left meanwhile may have taken
    the room. The hold is not the server's time (``context.held``); a wait
    the call cannot afford sends nothing (`_afford_wait`).
    """
    while True:
        waits = [
            (max(0.0 if opening else scope.wire_wait(), scope.window_wait(watch.booked_by)),
             scope.name)
            for scope in context.scopes
        ]  # fmt: skip
        wait, scope_name = max(waits, default=(0.0, None))
        if wait <= 0:
            return
        _afford_wait(context, scope_name, wait)
        context.held += wait
        watch.delayed(context)
        await trio.sleep(wait)


def _afford_wait(context: CallContext, scope: str | None, wait: float) -> None:
    """Tell the call's instruments of a wait for a scope's token as its request leaves
    (a told bucket's, or a told window's room), or refuse to send the request.

    Judged as any wait before a request is (`Budget.judge`): one the call
    cannot afford (past its deadline, its answer past it, or longer than the
    runner waits inline) sends nothing, and the call is answered
    ``rate_limited`` with the wait at once, not ``timed_out`` at its deadline.
    """
    if context.budget.judge(wait, latency=_expected_latency(context)) is not Verdict.SLEEP:
        raise NotSentError(
            f"scope {scope!r} lets this request leave in {wait:.3f}s, more than the call "
            "can afford; it was not sent",
            status=Status.RATE_LIMITED, scope=scope, retry_after=wait,
        )  # fmt: skip
    _token_wait(context, scope, wait)


def _origin(request: _Request) -> str:
    """Where ``request`` goes, as a connection pool tells its connections apart."""
    url = request.url
    return f"{url.scheme}://{url.host}:{url.port}"


def _restore(extensions: dict[str, Any], theirs: Any) -> None:
    """Give the request back the ``trace`` it came with (none: no ``trace``)."""
    if theirs is None:
        extensions.pop("trace", None)
    else:
        extensions["trace"] = theirs


def _warm_hold(context: CallContext) -> float:
    """The longest ``warm_hold`` of the call's scopes, if the call can afford it.

    A call that would then end at or past its deadline (or wait longer than
    the runner waits inline) is sent at once instead: the worst case is
    only a possibility, and the deadline is certain.
    """
    hold = max((scope.warm_hold() for scope in context.scopes), default=0.0)
    if hold <= 0:
        return 0.0
    latency = _expected_latency(context)
    budget = context.budget
    fits = budget.judge(hold, latency=latency) is Verdict.SLEEP and budget.fits(hold + latency)
    return hold if fits else 0.0


def _expected_latency(context: CallContext) -> float:
    """How long the call's request is expected to take once it leaves: the slowest of
    its scopes' latencies (0 where none is known yet), for judging a wait before it."""
    return max((scope.expected_latency() or 0.0 for scope in context.scopes), default=0.0)


async def _charge(context: CallContext, scopes: tuple[ScopeLike, ...] | None = None) -> None:
    """Reserve a token on each scope (default: all the call's) for a request, within budget:
    one after the first, or one a refusal overruled while it waited to leave."""
    shortfall = await take_tokens(
        context.scopes if scopes is None else scopes, 1.0, budget=context.budget,
        patience=context.budget.patience(),
        on_wait=lambda wait, scope: _token_wait(context, scope, wait),
    )  # fmt: skip
    if shortfall is not None:
        raise NotSentError(
            f"a further request of this call would wait {shortfall.needed:.3f}s on scope "
            f"{shortfall.scope!r}, more than it can afford; it was not sent",
            status=Status.RATE_LIMITED, scope=shortfall.scope, retry_after=shortfall.needed,
        )  # fmt: skip


def _token_wait(context: CallContext, scope: str | None, wait: float) -> None:
    """Tell the call's instruments of a wait for a scope's tokens."""
    _emit(context, EventKind.TOKEN_WAIT, wait=wait, scope=scope)


async def _read_off(response: ResponseT) -> None:
    """Read a refusal's body, if short and at hand, before it is closed: a response closed
    unread closes its connection, and the next request opens one. (Against a server that
    read each new connection's first request late, every 429 so led to the next: the new
    connection's request arrived late beside one sent over an open one.)"""
    with trio.move_on_after(_READ_OFF):
        try:
            await read_capped(response.stream, _READ_OFF_BYTES)
        except Exception:  # broken off: the connection goes, as it would have
            return


async def _tell_throttled(scopes: tuple[ScopeLike, ...], signal: RateLimitedError) -> None:
    """The scopes take in a refusal as it arrives, not once the call's task gets to it.

    Between the two, the attempt ends, and a learning scope's probe opens on
    its end: a call queued behind it went out at once, before the 429 had
    emptied the bucket, and drew a fourth. The runner tells the scopes again
    (`ScopeFront.on_throttled` takes a refusal in once); a wait past a quota's
    horizon is the runner's to answer.
    """
    wait = usable_wait(signal.retry_after)
    if wait is not None and wait > quota_horizon(scopes):
        return
    for scope in scopes:
        await scope.on_throttled(wait, sent_at=signal.sent_at, arriving=True)


def _refused_for_rate(status: int, info: RateLimitInfo) -> bool:
    """Whether a response is the rate's refusal: a ``429``, or a ``403`` that says so.

    GitHub refuses over its primary limit with a ``403`` whose
    ``X-RateLimit-Remaining`` is 0, and over its secondary limits with a ``403``
    and a ``Retry-After``. Read as final, every call past the limit failed
    with "Forbidden" and nothing waited. A ``403`` with neither is a permission
    refusal (or a limit that does not say so, as django-ratelimit's): final.
    """
    if status == 429:
        return True
    return status == 403 and (info.retry_after is not None or info.remaining == 0)


def _signal_for(
    status: int, info: RateLimitInfo, what: str, sent_at: float, *, refused: bool
) -> RateLimitedError | TransientError | None:
    """The exception a response's status and headers call for, if any; ``refused``:
    the rate refused it (`_refused_for_rate`)."""
    retry = info.should_retry
    if refused or (status in _OVERLOADED and info.retry_after is not None):
        return RateLimitedError(
            f"{what} answered {status}", retry_after=info.retry_after, scope=info.scope,
            retryable=retry is not False, sent_at=sent_at,
        )  # fmt: skip
    if retry is False:
        return None
    if status in _TRANSIENT or (retry is True and status >= 400):
        return TransientError(f"{what} answered {status}")
    return None


def _response_detail(response: _Response, info: RateLimitInfo) -> EventDetail:
    detail = EventDetail(status=response.status_code)
    if info.limit is not None:
        detail["limit"] = info.limit
    if info.remaining is not None:
        detail["remaining"] = info.remaining
    if info.reset_after is not None:
        detail["reset_after"] = info.reset_after
    if info.retry_after is not None:
        detail["retry_after"] = info.retry_after
    if info.window is not None:
        detail["window"] = info.window
    return detail


def _emit(context: CallContext, kind: EventKind, **fields: Any) -> None:
    context.recorder.emit(
        kind, call_id=context.call.id, tool=context.call.name, attempt=context.attempt, **fields
    )
