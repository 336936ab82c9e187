"""Read the numbers a server puts in its rate-limit headers, and trust nothing else.

A 429 is only useful if we learn *how long* to wait and *how fast* we may go,
and servers say so in a dozen dialects. This module turns any of them into one
frozen `RateLimitInfo`. It is pure: no I/O, no trio, no clock of its own. The
caller passes the wall-clock ``now`` (epoch seconds), so tests are exact.

Three facts shape every line:

* **Client clocks skew.** An absolute time (an HTTP-date, an epoch, an RFC 3339
  stamp) is measured against the response's own ``Date`` header when it has a
  parseable one, so the server's clock is compared with the server's clock
  (the HTTP transport passes a reading finer than ``Date``'s whole second,
  `fanout._server_clock`). Only without ``Date`` do we fall back to ``now``.
* **Servers lie, proxies mangle.** Values can be negative, NaN, ``1e400``,
  thirty years long, or repeated and comma-joined by ``httpx.Headers``.
* **Fail closed.** An unparsable value is ignored (``None``), never guessed at;
  a malformed structured field is dropped whole, not half-trusted. Negative
  waits and counts clamp to 0; a wait longer than ``max_wait`` is absurd and
  dropped. No input makes this module raise.

Precedence. ``retry_after``: a wait in milliseconds (``retry-after-ms``, as the
OpenAI and Anthropic SDKs read it; Azure's ``x-ms-retry-after-ms``; AWS's
``x-amz-retry-after``), else Traefik's ``X-Retry-In`` (a Go duration), else
``Retry-After``: the more precise first. ``limit``, ``remaining`` and
``reset_after`` are chosen per field from the first family that gives a valid
value, in this order:

1. the current IETF draft's structured ``RateLimit`` / ``RateLimit-Policy``, or
   draft 7's (``RateLimit: limit=10, remaining=3, reset=1``, ``RateLimit-Policy:
   10;w=1``);
2. the older draft's ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (reset:
   delta, or an epoch as GitLab's);
3. ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (reset: delta or epoch;
   Discord's ``-Reset-After`` first; the limit a list with its window, as
   Envoy's), then X's ``x-rate-limit-*``;
4. ``anthropic-ratelimit-requests-*`` (reset is RFC 3339);
5. OpenAI's ``x-ratelimit-*-requests`` (reset is a Go duration like ``6m0s``);
6. Shopify's fill level, ``X-Shopify-Shop-Api-Call-Limit: used/size`` (no reset).

``window`` travels with ``limit``: it is reported only by the family that gave
the limit, so `RateLimitInfo.rate` never divides one policy's quota by another's
window. Token families (``*-tokens``) are ignored: fanout meters requests.

Repeated headers. ``httpx.Headers`` joins them with ", ". A joined plain number
(``"5, 5"``) is garbage and ignored. Fields whose grammar is a list
(``RateLimit-Limit``, ``X-RateLimit-Limit`` as Envoy writes it, the structured
fields) are parsed as lists. A joined
HTTP-date yields its first date, which ``email.utils`` reads on its own.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, TypeVar

import attrs

from ._budget import MAX_WAIT
from ._values import RateLimitInfo

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "MAX_WAIT",
    "SCOPE_NAME",
    "RateLimitInfo",
    "http_date",
    "parse_duration",
    "parse_rate_limit_headers",
    "parse_retry_after",
]


_T = TypeVar("_T")
_MAX_LEN = 1000  # a longer value is not a rate-limit header; don't spend time on it
_EPOCH_S = 1e9  # 2001-09-09 as an epoch; as a delta, 31 years. No window is that long.
_EPOCH_MS = 1e12  # the same instant in milliseconds


# --- scalars -----------------------------------------------------------------

# ASCII digits only: float() alone would take "nan", "inf", "1_0" and "١٢".
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def _number(value: str | None) -> float | None:
    """A finite decimal number, or None. ``"1e400"`` overflows to inf and is dropped."""
    if value is None or len(value) > _MAX_LEN:
        return None
    text = value.strip()
    if not _NUMBER.fullmatch(text):
        return None
    number = float(text)
    return number if math.isfinite(number) else None


def _clamped(seconds: float | None) -> float | None:
    """Negative clamps to 0 (the moment has passed); NaN and inf are dropped."""
    if seconds is None or not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def _wait(seconds: float | None, max_wait: float) -> float | None:
    seconds = _clamped(seconds)
    return seconds if seconds is not None and seconds <= max_wait else None


# A server's ``Date`` changes once a second and comes with every response: the last
# few are remembered rather than read again (some microseconds each).
@functools.lru_cache(maxsize=16)
def http_date(value: str | None) -> float | None:
    """Epoch seconds of an IMF-fixdate, RFC 850 or asctime date, or None."""
    if value is None or len(value) > _MAX_LEN:
        return None
    try:
        parsed = parsedate_to_datetime(value)
        if parsed.tzinfo is None:  # asctime and "-0000" name no zone; HTTP-dates are GMT
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def _rfc3339(value: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp; one without an offset is a guess, so None."""
    if value is None or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
        return parsed.timestamp() if parsed.tzinfo is not None else None
    except (TypeError, ValueError, OverflowError):
        return None


def _finer_than_seconds(value: str | None) -> bool:
    """Whether a reset is given finer than whole seconds: with a fraction (slowapi's
    float epoch, ``1790000002.0`` too; Discord's ``1.234``), or as an epoch in
    milliseconds. A whole number may have been rounded by up to a second; such a
    value was not."""
    number = _number(value)
    if number is None or value is None:
        return False
    return number >= _EPOCH_MS or "." in value


def _delta_or_epoch(value: str | None, reference: float) -> float | None:
    """X-RateLimit-Reset: >= 1e12 is epoch ms, >= 1e9 epoch seconds, else delta seconds."""
    number = _number(value)
    if number is None:
        return None
    if number >= _EPOCH_MS:
        return number / 1000 - reference
    if number >= _EPOCH_S:
        return number - reference
    return number


_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|ns)", re.ASCII)
_DURATION = re.compile(rf"([+-]?)((?:{_DURATION_PART.pattern})+)", re.ASCII)


def parse_duration(value: str) -> float | None:
    """Seconds in a Go duration (``"6m0s"``, ``"20ms"``, ``"1h2m3.5s"``) or bare ``"2.5"``.

    Negative clamps to 0; unparsable, NaN or overflowing values give None.
    """
    if len(value) > _MAX_LEN:
        return None
    text = value.strip().replace("µ", "u").replace("μ", "u")  # Go writes micro as "µs"
    match = _DURATION.fullmatch(text)
    if match is None:
        return _clamped(_number(text))
    seconds = sum(float(n) * _UNIT[unit] for n, unit in _DURATION_PART.findall(match[2]))
    return _clamped(-seconds if match[1] == "-" else seconds)


def parse_retry_after(value: str, *, now: float, date: str | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta seconds or an HTTP-date.

    An HTTP-date is measured against ``date`` (the response's ``Date`` header)
    when it parses, else against ``now``: a skewed client clock then cannot
    stretch or shrink the server's intended wait. A date in the past means 0.
    """
    delay = _number(value)
    if delay is None and (target := http_date(value)) is not None:
        server_now = http_date(date)
        delay = target - (now if server_now is None else server_now)
    return _clamped(delay)


# --- structured fields (RFC 8941), just enough for RateLimit and RateLimit-Policy ---

_SF_KEY = r"[a-z*][a-z0-9_.*-]*"
_SF_BARE = (
    r'"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"'  # string
    r"|-?\d{1,15}(?:\.\d{1,3})?"  # integer or decimal
    r"|[A-Za-z*][\w!#$%&'*+.^`|~:/-]*"  # token
    r"|:[A-Za-z0-9+/=]*:"  # byte sequence
    r"|\?[01]"  # boolean
)
_SF_PARAM = re.compile(rf";[ ]*({_SF_KEY})(?:=({_SF_BARE}))?", re.ASCII)
_SF_ITEM = re.compile(rf"({_SF_BARE})((?:{_SF_PARAM.pattern})*)", re.ASCII)
_SF_COMMA = re.compile(r"[ \t]*,[ \t]*")

_Item = tuple[float | str, dict[str, float]]
_SF_MEMBER = re.compile(rf"({_SF_KEY})(?:=({_SF_BARE}))?((?:{_SF_PARAM.pattern})*)", re.ASCII)


def _sf_bare(text: str) -> float | str:
    """A bare item's value: numbers as float, strings unescaped, anything else as text."""
    if text[0] == '"':
        return re.sub(r'\\(["\\])', r"\1", text[1:-1])
    if text[0] == "-" or text[0].isdigit():
        return float(text)
    return text


def _sf_list(
    value: str | None, numeric: frozenset[str], *, other_units: set[str] | None = None
) -> list[_Item] | None:
    """An RFC 8941 list of items keeping only the ``numeric`` parameters.

    None when the field is absent or malformed anywhere, including a numeric
    parameter that is not a number: such a field is dropped whole. Given
    ``other_units``, an item whose quota unit (``qu``) is not ``"requests"``
    (content bytes, concurrent requests) is left out, its name added there.
    """
    if value is None or len(value) > _MAX_LEN:
        return None
    text, pos, items = value.strip(" \t"), 0, []
    while True:
        item = _SF_ITEM.match(text, pos)
        if item is None:
            return None
        params: dict[str, float] = {}
        unit: float | str = "requests"
        for key, raw in _SF_PARAM.findall(item[2]):
            if key == "qu" and other_units is not None:
                unit = _sf_bare(raw) if raw else ""
            if key not in numeric:
                continue
            number = _sf_bare(raw) if raw else None
            if not isinstance(number, float):
                return None  # a quota that is not a number spoils the whole field
            params[key] = number
        if unit == "requests":
            items.append((_sf_bare(item[1]), params))
        elif other_units is not None:
            other_units.add(str(_sf_bare(item[1])))
        pos = item.end()
        comma = _SF_COMMA.match(text, pos)
        if comma is None:
            return items if pos == len(text) else None
        pos = comma.end()


def _sf_dictionary(value: str | None) -> dict[str, float | str] | None:
    """An RFC 8941 dictionary (``limit=10, remaining=3, reset=1``): each member's value,
    its parameters left out; None when the field is absent or malformed anywhere."""
    if value is None or len(value) > _MAX_LEN:
        return None
    text, pos, members = value.strip(" \t"), 0, {}
    while True:
        member = _SF_MEMBER.match(text, pos)
        if member is None:
            return None
        members[member[1]] = _sf_bare(member[2]) if member[2] else "?1"
        pos = member.end()
        comma = _SF_COMMA.match(text, pos)
        if comma is None:
            return members if pos == len(text) else None
        pos = comma.end()


# --- families -----------------------------------------------------------------


@attrs.frozen
class _Quota:
    """One family's answer, already held to the same rules as every other."""

    limit: float | None = None
    remaining: float | None = None
    reset_after: float | None = None
    window: float | None = None
    reset_exact: bool = False


_NO_QUOTA = _Quota()


def _positive(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) and x > 0 else None


def _quota(
    limit: float | None,
    remaining: float | None,
    reset_after: float | None,
    max_wait: float,
    window: float | None = None,
    *,
    reset_exact: bool = False,
) -> _Quota:
    limit = _positive(limit)
    reset_after = _wait(reset_after, max_wait)
    return _Quota(
        limit=limit,
        remaining=_clamped(remaining),
        reset_after=reset_after,
        window=_positive(window) if limit is not None else None,
        reset_exact=reset_exact and reset_after is not None,
    )


# A family reads its headers' values, in the order `_FAMILIES` names them, given the
# server's time now (``reference``) and the longest believable wait.
_Values = tuple[str | None, ...]
_Family = Callable[[_Values, float, float], _Quota]
_REMEMBERED = 256  # answers kept by each family that does not read the clock


def _untimed(read: Callable[[_Values, float], _Quota]) -> _Family:
    """A family whose answer depends on its values alone: the same values, which a
    server repeats from response to response, are read once (`_REMEMBERED`)."""
    remembered = functools.lru_cache(maxsize=_REMEMBERED)(read)

    def family(values: _Values, reference: float, max_wait: float) -> _Quota:
        return remembered(values, max_wait)

    return family


@_untimed
def _structured(values: _Values, max_wait: float) -> _Quota:
    """``RateLimit-Policy: "burst";q=100;w=60`` and ``RateLimit: "burst";r=50;t=30``;
    and the draft before it (express-rate-limit's ``draft-7``): ``RateLimit: limit=10,
    remaining=3, reset=1``, a dictionary, with ``RateLimit-Policy: 10;w=1``, whose
    items are the quotas themselves. (Read as nothing, a learning scope met such a
    server as if it stated nothing: 57 % of what could finish under 2 s deadlines.)"""
    policy, current = values
    # fanout meters requests: a policy on content bytes or concurrent requests (draft
    # ``qu``) is not its to keep, nor the state named after it.
    other_units: set[str] = set()
    policies = _sf_list(policy, _POLICY_PARAMS, other_units=other_units) or []
    states = [s for s in _sf_list(current, _STATE_PARAMS) or [] if s[0] not in other_units]
    named = _sf_dictionary(current) if not states else None
    if named is not None and {"limit", "remaining", "reset"} & named.keys():
        # Named by its limit, it ranks first the policy that is that quota (`10;w=1`).
        stated = next((v for _, v in _numbers(named, limit="q")), "")
        states = [(stated, dict(_numbers(named, remaining="r", reset="t")))]
        policies = policies or ([(0.0, {"q": stated})] if isinstance(stated, float) else [])
    # The state closest to running out is the one that will bite first.
    name, state = min(states, key=lambda s: s[1].get("r", math.inf), default=(None, {}))
    ranked: list[tuple[tuple[bool, float], float, float | None]] = []
    for policy_name, params in policies:
        q, w = params.get("q", params.get("l")), params.get("w")
        if q is None and isinstance(policy_name, float) and policy_name > 0:
            q = policy_name  # the earlier draft's policy item is its quota: ``10;w=1``
        if q is not None and q > 0:
            # The policy the state names, else the most restrictive: lowest q/w, no w last.
            rank = (policy_name != name, q / w if w is not None and w > 0 else math.inf)
            ranked.append((rank, q, w))
    _, limit, window = min(ranked, key=lambda r: r[0], default=(None, None, None))
    return _quota(limit, state.get("r"), state.get("t"), max_wait, window)


def _numbers(members: dict[str, float | str], **keys: str) -> list[tuple[str, float]]:
    """The numeric members among ``keys``, each under the name ``keys`` gives it."""
    return [(keys[k], v) for k, v in members.items() if k in keys and isinstance(v, float)]


@functools.lru_cache(maxsize=_REMEMBERED)
def _limit_and_window(limit_field: str | None) -> tuple[float | None, float | None]:
    """``RateLimit-Limit: 100, 100;w=60``: the limit, and the window given with it."""
    items = _sf_list(limit_field, _LIMIT_PARAMS) or []
    limit = items[0][0] if items and isinstance(items[0][0], float) else None
    windows = (p.get("w", p.get("window")) for value, p in items if value == limit)
    return limit, next((w for w in windows if w is not None), None)


def _older_draft(values: _Values, reference: float, max_wait: float) -> _Quota:
    """``RateLimit-Limit: 100, 100;w=60`` plus ``RateLimit-Remaining`` / ``-Reset``.

    The draft's reset is delta seconds; GitLab sends an epoch there, read as
    ``X-RateLimit-Reset``'s is (taken for a delta, it was a wait of 51 years
    and dropped, and with it the only clue to the rate).
    """
    limit_field, remaining_field, reset_field = values
    limit, window = _limit_and_window(limit_field)
    reset = _delta_or_epoch(reset_field, reference)
    exact = _finer_than_seconds(reset_field)
    return _quota(limit, _number(remaining_field), reset, max_wait, window, reset_exact=exact)


def _x_ratelimit(values: _Values, reference: float, max_wait: float) -> _Quota:
    """``X-RateLimit-*``; Discord's ``X-RateLimit-Reset-After`` (delta seconds, to the
    millisecond) is preferred to its ``-Reset`` epoch, which a whole-second ``Date``
    measures less finely. The limit may be a list with its window, as Envoy's global
    rate limit writes it (``10, 10;w=1;name="per-key"``: dropped as no number, a
    learning scope took 1.59 times the fastest against 1.05 with a plain ``10``)."""
    limit_field, remaining, reset, reset_after = values
    delta, given = _number(reset_after), reset_after
    if _wait(delta, max_wait) is None:
        delta, given = _delta_or_epoch(reset, reference), reset
    exact = _finer_than_seconds(given)
    limit, window = _limit_and_window(limit_field)
    return _quota(limit, _number(remaining), delta, max_wait, window, reset_exact=exact)


def _x_dashed(values: _Values, reference: float, max_wait: float) -> _Quota:
    """X's (Twitter's) ``x-rate-limit-limit`` / ``-remaining`` / ``-reset`` (an epoch):
    read as ``X-RateLimit-*`` is. (Unread, a window of 10 per 3 s drew five 429s.)"""
    return _x_ratelimit((*values, None), reference, max_wait)


def _anthropic(values: _Values, reference: float, max_wait: float) -> _Quota:
    limit, remaining, reset = values
    reset_at = _rfc3339(reset)
    return _quota(
        _number(limit),
        _number(remaining),
        None if reset_at is None else reset_at - reference,
        max_wait,
    )


@_untimed
def _openai(values: _Values, max_wait: float) -> _Quota:
    limit, remaining, reset = values
    return _quota(
        _number(limit),
        _number(remaining),
        None if reset is None else parse_duration(reset),
        max_wait,
        # "1.7s", "20ms": finer than whole seconds ("6m0s" is not).
        reset_exact=reset is not None and ("." in reset or reset.rstrip().endswith("ms")),
    )


@_untimed
def _fill_level(values: _Values, max_wait: float) -> _Quota:
    """Shopify's ``X-Shopify-Shop-Api-Call-Limit: 32/40``: a leaky bucket holding 40
    requests has 32 in it, so 8 more fit now. It states no reset and no rate (2/s,
    learned from how the level drains)."""
    (level,) = values
    used, slash, size = (level or "").partition("/")
    if not slash:
        return _NO_QUOTA
    used_n, size_n = _number(used), _positive(_number(size))
    if used_n is None or size_n is None:
        return _NO_QUOTA
    return _quota(size_n, size_n - used_n, None, max_wait)


_POLICY_PARAMS = frozenset("qlw")
_STATE_PARAMS = frozenset("rt")
_LIMIT_PARAMS = frozenset({"w", "window"})

# Each family in order of precedence, with the headers it reads. A family none of whose
# headers came says nothing (`_NO_QUOTA`), so it is not asked.
_FAMILIES: tuple[tuple[_Family, tuple[str, ...]], ...] = (
    (_structured, ("ratelimit-policy", "ratelimit")),
    (_older_draft, ("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset")),
    (
        _x_ratelimit,
        (
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "x-ratelimit-reset-after",
        ),
    ),
    (_x_dashed, ("x-rate-limit-limit", "x-rate-limit-remaining", "x-rate-limit-reset")),
    (
        _anthropic,
        (
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ),
    ),
    (
        _openai,
        (
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ),
    ),
    (_fill_level, ("x-shopify-shop-api-call-limit",)),
)
_FAMILY_OF = {name: family for family, names in _FAMILIES for name in names}


# --- the rest ---------------------------------------------------------------

_SCOPE_HEADERS = ("x-ratelimit-scope", "ratelimit-scope", "x-ratelimit-resource")
SCOPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63}", re.ASCII)
"""A scope name a server may give: a letter or digit, then up to 63 of ``A-Za-z0-9_.:/-``."""


def _scope(h: Mapping[str, str]) -> str | None:
    """The first scope header that is a plain, short name (`SCOPE_NAME`); others are ignored.

    The name becomes a label (in answers, events, metrics), so anything
    looser is refused: no spaces, quotes, ``=``, ``;`` or control characters.
    Whether it holds a credential the HTTP layer checks, which knows them.
    """
    for name in _SCOPE_HEADERS:
        if name in h and SCOPE_NAME.fullmatch(text := h[name].strip()):
            return text
    return None


# Waits finer than ``Retry-After``'s whole seconds, the first usable one preferred:
# milliseconds (OpenAI's and Anthropic's SDKs, Azure, AWS), then Traefik's Go duration.
_RETRY_AFTER_MS = ("retry-after-ms", "x-ms-retry-after-ms", "x-amz-retry-after")
_RETRY_IN = "x-retry-in"


def _retry_after(h: Mapping[str, str], reference: float, max_wait: float) -> float | None:
    """The most precise usable wait (`_RETRY_AFTER_MS`, `_RETRY_IN`), else ``Retry-After``.

    A server that rounds ``Retry-After`` up to whole seconds (Traefik does)
    would make a 50 ms wait a second's; its finer header says the real one.
    ``reference`` is the server's time now (from its ``Date``, else our clock).
    """
    for name in _RETRY_AFTER_MS:
        milliseconds = _number(h.get(name))
        if milliseconds is not None and (wait := _wait(milliseconds / 1000, max_wait)) is not None:
            return wait
    duration = h.get(_RETRY_IN)
    if duration is not None and (wait := _wait(parse_duration(duration), max_wait)) is not None:
        return wait
    value = h.get("retry-after")
    seconds = None if value is None else parse_retry_after(value, now=reference)
    return _wait(seconds, max_wait)


_SHOULD_RETRY = {"true": True, "false": False}
# Whether to retry at all: OpenAI's and Anthropic's name, then Stripe's.
_SHOULD_RETRY_HEADERS = ("x-should-retry", "stripe-should-retry")


def _first(values: Iterable[_T | None]) -> _T | None:
    return next((v for v in values if v is not None), None)


def parse_rate_limit_headers(
    headers: Mapping[str, str],
    *,
    now: float,
    max_wait: float = MAX_WAIT,
    server_now: float | None = None,
) -> RateLimitInfo:
    """Everything the response's headers say about waiting and quota; see the module docstring.

    ``headers`` is an ``httpx.Headers`` or any mapping, keys in any case (one
    header given in two cases: the later wins). ``now`` is wall-clock epoch
    seconds, used only when there is no ``Date``. ``server_now`` replaces the
    ``Date`` header's whole second with a finer reading of the server's clock
    (`fanout._server_clock`), when the caller has one.
    """
    h = {k.lower(): v for k, v in headers.items() if isinstance(k, str) and isinstance(v, str)}
    if server_now is None:
        server_now = http_date(h.get("date"))
    reference = now if server_now is None else server_now
    told = {_FAMILY_OF[name] for name in h if name in _FAMILY_OF}
    quotas = tuple(
        family(tuple(map(h.get, names)), reference, max_wait) if family in told else _NO_QUOTA
        for family, names in _FAMILIES
    )
    with_limit = next((q for q in quotas if q.limit is not None), _NO_QUOTA)
    with_reset = next((q for q in quotas if q.reset_after is not None), _NO_QUOTA)
    should_retry = _first(
        _SHOULD_RETRY.get(h.get(name, "").strip().lower()) for name in _SHOULD_RETRY_HEADERS
    )
    return RateLimitInfo(
        retry_after=_retry_after(h, reference, max_wait),
        limit=with_limit.limit,
        remaining=_first(q.remaining for q in quotas),
        reset_after=with_reset.reset_after,
        window=with_limit.window,
        scope=_scope(h),
        should_retry=should_retry,
        reset_exact=with_reset.reset_exact,
    )
