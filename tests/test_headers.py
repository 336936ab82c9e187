"""Tests for fanout._headers: every dialect parsed, every lie ignored, nothing raises."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import format_datetime

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fanout._headers import (
    MAX_WAIT,
    SCOPE_NAME,
    RateLimitInfo,
    parse_duration,
    parse_rate_limit_headers,
    parse_retry_after,
)

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z, the client's wall clock in these tests


def http_date(epoch: float) -> str:
    return format_datetime(datetime.fromtimestamp(epoch, UTC), usegmt=True)


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def parse(headers: dict[str, str], **kwargs: float) -> RateLimitInfo:
    return parse_rate_limit_headers(headers, now=kwargs.pop("now", NOW), **kwargs)


# --- Retry-After and retry-after-ms ------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [("120", 120.0), ("0", 0.0), (" 1.5 ", 1.5)])
def test_retry_after_delta_seconds(value: str, expected: float) -> None:
    """Retry-After as delta seconds, integer or decimal, is taken as is."""
    assert parse({"Retry-After": value}).retry_after == expected


@pytest.mark.parametrize("skew", [3600.0, -3600.0])
def test_retry_after_date_measured_against_server_date(skew: float) -> None:
    """An HTTP-date is measured against the Date header, so a clock an hour off still waits 5s."""
    server_now = NOW - skew
    headers = {"Date": http_date(server_now), "Retry-After": http_date(server_now + 5)}
    assert parse(headers).retry_after == 5.0


def test_retry_after_date_without_date_header_uses_now() -> None:
    """Without a Date header, an HTTP-date Retry-After is measured against now."""
    assert parse({"Retry-After": http_date(NOW + 42)}).retry_after == 42.0


def test_retry_after_date_with_garbage_date_header_uses_now() -> None:
    """An unparsable Date header is ignored and now is used instead."""
    headers = {"Date": "yesterday-ish", "Retry-After": http_date(NOW + 42)}
    assert parse(headers).retry_after == 42.0


@pytest.mark.parametrize(
    "value", ["Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994", http_date(784111777)]
)
def test_retry_after_accepts_all_three_http_date_formats(value: str) -> None:
    """IMF-fixdate, RFC 850 and asctime dates are all read as GMT."""
    assert parse_retry_after(value, now=784111777 - 3) == 3.0


def test_retry_after_date_in_the_past_clamps_to_zero() -> None:
    """A Retry-After date already passed means retry now, not a negative wait."""
    assert parse({"Retry-After": http_date(NOW - 60)}).retry_after == 0.0


def test_retry_after_ms_alone() -> None:
    """retry-after-ms is milliseconds."""
    assert parse({"retry-after-ms": "1500"}).retry_after == 1.5


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-ms-retry-after-ms": "250", "Retry-After": "1"}, 0.25),  # Azure
        ({"x-amz-retry-after": "1500", "Retry-After": "2"}, 1.5),  # AWS
        ({"X-Retry-In": "52.631578ms", "Retry-After": "1"}, 0.052631578),  # Traefik
        ({"X-Retry-In": "1m0.5s"}, 60.5),
        ({"retry-after-ms": "100", "x-ms-retry-after-ms": "200", "X-Retry-In": "3s"}, 0.1),
        ({"x-ms-retry-after-ms": "soon", "X-Retry-In": "3s", "Retry-After": "9"}, 3.0),
        ({"X-Retry-In": "later", "Retry-After": "9"}, 9.0),
        ({"X-Retry-In": "-5s", "Retry-After": "9"}, 0.0),
    ],
)
def test_finer_waits_than_retry_after_are_preferred(
    headers: dict[str, str], expected: float
) -> None:
    """A wait in milliseconds (retry-after-ms, Azure's, AWS's), then Traefik's Go duration,
    then Retry-After: the first usable, most precise first. Traefik rounds Retry-After up to
    whole seconds, so a 53 ms wait read from it is a second's."""
    assert parse(headers).retry_after == pytest.approx(expected)


@pytest.mark.parametrize(
    ("level", "limit", "remaining"),
    [
        ("32/40", 40.0, 8.0),
        (" 0 / 40 ", 40.0, 40.0),
        ("41/40", 40.0, 0.0),  # over full reads as nothing left, never negative
        ("32/0", None, None),  # a bucket of nothing is no bucket
        ("32", None, None),
        ("x/40", None, None),
        ("32/", None, None),
        ("1e400/40", None, None),
    ],
)
def test_a_fill_level_is_a_limit_and_what_remains(
    level: str, limit: float | None, remaining: float | None
) -> None:
    """Shopify's ``X-Shopify-Shop-Api-Call-Limit: used/size``: the size is the limit, and
    size less used remains. It states no reset."""
    info = parse({"X-Shopify-Shop-Api-Call-Limit": level})
    assert (info.limit, info.remaining, info.reset_after) == (limit, remaining, None)


def test_retry_after_ms_takes_precedence() -> None:
    """When both are valid, the more precise retry-after-ms wins over Retry-After."""
    assert parse({"Retry-After": "2", "retry-after-ms": "1250"}).retry_after == 1.25


@pytest.mark.parametrize("bad_ms", ["soon", "nan", "1e400", str(MAX_WAIT * 1000 + 1)])
def test_invalid_retry_after_ms_falls_back_to_retry_after(bad_ms: str) -> None:
    """An unusable retry-after-ms is ignored and Retry-After is used."""
    assert parse({"Retry-After": "2", "retry-after-ms": bad_ms}).retry_after == 2.0


# --- the older IETF draft ----------------------------------------------------


def test_older_draft_with_policy_window() -> None:
    """RateLimit-Limit "100, 100;w=60" gives limit 100 and window 60, hence the rate."""
    info = parse(
        {"RateLimit-Limit": "100, 100;w=60", "RateLimit-Remaining": "7", "RateLimit-Reset": "12"}
    )
    assert (info.limit, info.window, info.remaining, info.reset_after) == (100.0, 60.0, 7.0, 12.0)
    assert info.rate == 100 / 60


def test_older_draft_plain_limit_has_no_window() -> None:
    """A bare RateLimit-Limit states no window, so the rate is unknown."""
    info = parse({"RateLimit-Limit": "100"})
    assert (info.limit, info.window, info.rate) == (100.0, None, None)


def test_older_draft_reset_may_be_an_epoch_as_gitlab_sends() -> None:
    """GitLab's RateLimit-Reset is epoch seconds, measured against the server's Date;
    a small number is still delta seconds."""
    date = "Tue, 14 Nov 2023 22:13:20 GMT"  # 1_700_000_000
    gitlab = {"RateLimit-Limit": "600", "RateLimit-Remaining": "0", "Date": date}
    assert parse({**gitlab, "RateLimit-Reset": "1700000042"}).reset_after == 42.0
    assert parse({**gitlab, "RateLimit-Reset": "1700000042000"}).reset_after == 42.0
    assert parse({**gitlab, "RateLimit-Reset": "42"}).reset_after == 42.0


def test_discord_s_reset_after_is_preferred_to_its_epoch() -> None:
    """Discord sends both: ``X-RateLimit-Reset-After`` to the millisecond, and the reset as
    an epoch with decimals; a garbled Reset-After leaves the epoch to say."""
    date = "Tue, 14 Nov 2023 22:13:20 GMT"  # 1_700_000_000
    discord = {"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "0", "Date": date}
    both = {**discord, "X-RateLimit-Reset": "1700000002.5", "X-RateLimit-Reset-After": "1.234"}
    assert parse(both).reset_after == 1.234
    assert parse({**both, "X-RateLimit-Reset-After": "soon"}).reset_after == 2.5
    assert parse({**discord, "X-RateLimit-Reset-After": "0.5"}).reset_after == 0.5


_DATE = {"Date": "Tue, 14 Nov 2023 22:13:20 GMT"}  # 1_700_000_000


@pytest.mark.parametrize(
    ("headers", "exact"),
    [
        ({"X-RateLimit-Reset": "1700000002.0534"}, True),  # slowapi: a float epoch
        ({"X-RateLimit-Reset": "1700000002.0"}, True),  # written as a float, however whole
        ({"X-RateLimit-Reset": "1700000002"}, False),  # GitHub: whole seconds
        ({"X-RateLimit-Reset": "1700000002500"}, True),  # epoch milliseconds
        ({"X-RateLimit-Reset": "3"}, False),
        ({"X-RateLimit-Reset-After": "1.234", "X-RateLimit-Reset": "1700000009"}, True),
        ({"X-RateLimit-Reset-After": "soon", "X-RateLimit-Reset": "1700000009"}, False),
        ({"RateLimit-Reset": "0.75"}, True),
        ({"RateLimit-Reset": "1700000042"}, False),  # GitLab
        ({"x-ratelimit-reset-requests": "1.7s"}, True),  # OpenAI's durations
        ({"x-ratelimit-reset-requests": "20ms"}, True),
        ({"x-ratelimit-reset-requests": "6m0s"}, False),
        ({"RateLimit": '"d";r=0;t=3', "RateLimit-Policy": '"d";q=5;w=10'}, False),
        ({"X-RateLimit-Reset": "never"}, False),  # no reset, nothing exact about it
        ({"X-RateLimit-Reset": "1700999999.5"}, False),  # a wait past MAX_WAIT is dropped
    ],
)
def test_a_reset_given_finer_than_whole_seconds_is_read_as_exact(
    headers: dict[str, str], exact: bool
) -> None:
    """``reset_exact``: a reset with a fraction, or in milliseconds, was not rounded up to
    the second; one in whole seconds may have been, by up to a second."""
    assert parse({**_DATE, **headers}).reset_exact is exact


def test_older_draft_window_parameter_spelled_out() -> None:
    """The earliest drafts' "window=" is read like "w="."""
    assert parse({"RateLimit-Limit": "10, 10;window=1, 50;window=60"}).window == 1.0


# --- the current IETF draft (structured fields) ------------------------------


def test_a_policy_on_bytes_or_concurrency_is_not_read_as_requests() -> None:
    """The current draft's ``qu`` names what a policy counts. fanout meters requests: a
    policy on content bytes or concurrent requests, and the state named after it, are left
    out (read, a spent byte quota blocked requests, and a cap of 4 in flight became a
    burst of 4)."""
    policy = '"bytes";q=1000000;w=60;qu="content-bytes", "req";q=100;w=60'
    info = parse({"RateLimit-Policy": policy, "RateLimit": '"bytes";r=0;t=5, "req";r=50;t=30'})
    assert (info.limit, info.window, info.remaining, info.reset_after) == (100.0, 60.0, 50.0, 30.0)
    conc = {"RateLimit-Policy": '"conc";q=4;qu="concurrent-requests"', "RateLimit": '"conc";r=0'}
    assert (parse(conc).limit, parse(conc).remaining) == (None, None)
    said = {"RateLimit-Policy": '"req";q=100;w=60;qu="requests"', "RateLimit": '"req";r=5'}
    assert (parse(said).limit, parse(said).remaining) == (100.0, 5.0)


def test_structured_policy_and_state() -> None:
    """RateLimit-Policy gives limit and window, RateLimit gives remaining and reset."""
    info = parse({"RateLimit-Policy": '"burst";q=100;w=60', "RateLimit": '"burst";r=50;t=30'})
    assert (info.limit, info.window, info.remaining, info.reset_after) == (100.0, 60.0, 50.0, 30.0)


def test_structured_parameters_fanout_does_not_read_are_ignored() -> None:
    """A parameter of another meaning (a partition key, a quota unit) spoils nothing."""
    info = parse({"RateLimit-Policy": '"burst";q=100;qu="requests";w=60;pk=:YWJj:'})
    assert (info.limit, info.window) == (100.0, 60.0)


def test_structured_policy_accepts_l_for_q() -> None:
    """An "l" parameter is accepted where "q" is expected."""
    assert parse({"RateLimit-Policy": '"burst";l=100;w=60'}).limit == 100.0


def test_structured_picks_the_policy_the_state_names() -> None:
    """With several policies, the one the RateLimit field names is used."""
    headers = {
        "RateLimit-Policy": '"burst";q=10;w=1, "day";q=1000;w=86400',
        "RateLimit": '"day";r=500;t=3600',
    }
    info = parse(headers)
    assert (info.limit, info.window, info.remaining) == (1000.0, 86400.0, 500.0)


def test_structured_picks_the_most_restrictive_policy_otherwise() -> None:
    """Without a named match, the policy with the lowest q/w is used."""
    headers = {"RateLimit-Policy": '"burst";q=10;w=1, "day";q=1000;w=86400, "hour";q=5'}
    info = parse(headers)
    assert (info.limit, info.window) == (1000.0, 86400.0)


def test_structured_state_closest_to_exhaustion_wins() -> None:
    """With several RateLimit items, the one with the least remaining is used."""
    info = parse({"RateLimit": '"day";r=500;t=3600, "burst";r=2;t=1'})
    assert (info.remaining, info.reset_after) == (2.0, 1.0)


def test_structured_token_names_accepted() -> None:
    """Policy names as tokens as well as strings are matched."""
    info = parse({"RateLimit-Policy": "burst;q=100;w=60", "RateLimit": "burst;r=1;t=2"})
    assert (info.limit, info.remaining) == (100.0, 1.0)


@pytest.mark.parametrize(
    "policy",
    [
        '"burst;q=100;w=60',  # unterminated string
        '"burst";q=100;w=60,',  # trailing comma
        '"burst";q=abc;w=60',  # q is a token, not a number
        '"burst";q=100;w=60, "day";q=?1',  # one bad policy spoils the field
        '"burst";q=100;w=60 garbage',
        '"burst" ;q=100;w=60',  # no space is allowed before a parameter
    ],
)
def test_malformed_structured_policy_ignored_entirely(policy: str) -> None:
    """A malformed RateLimit-Policy is dropped whole and the next family is used."""
    info = parse({"RateLimit-Policy": policy, "X-RateLimit-Limit": "7"})
    assert (info.limit, info.window) == (7.0, None)


def test_malformed_structured_state_ignored_but_policy_kept() -> None:
    """A malformed RateLimit field does not spoil a well-formed RateLimit-Policy."""
    info = parse({"RateLimit-Policy": '"b";q=100;w=60', "RateLimit": '"b";r=fifty;t=30'})
    assert (info.limit, info.remaining, info.reset_after) == (100.0, None, None)


# --- X-RateLimit-* -----------------------------------------------------------


def test_x_ratelimit_reset_as_delta() -> None:
    """A small X-RateLimit-Reset is delta seconds."""
    info = parse(
        {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"}
    )
    assert (info.limit, info.remaining, info.reset_after) == (60.0, 0.0, 30.0)


def test_x_ratelimit_reset_as_epoch_seconds() -> None:
    """A value >= 1e9 is an epoch timestamp, measured against now without a Date header."""
    assert parse({"X-RateLimit-Reset": str(int(NOW) + 45)}).reset_after == 45.0


def test_x_ratelimit_reset_as_epoch_milliseconds() -> None:
    """A value >= 1e12 is an epoch in milliseconds."""
    assert parse({"X-RateLimit-Reset": str(int(NOW * 1000) + 2500)}).reset_after == 2.5


def test_x_ratelimit_epoch_measured_against_date_header() -> None:
    """An epoch reset is measured against the server's Date, not the skewed client clock."""
    server_now = NOW - 3600
    headers = {"Date": http_date(server_now), "X-RateLimit-Reset": str(int(server_now) + 10)}
    assert parse(headers).reset_after == 10.0


# --- vendor families ---------------------------------------------------------


def test_anthropic_requests_family() -> None:
    """anthropic-ratelimit-requests-* with an RFC 3339 reset measured against now."""
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": rfc3339(NOW + 30),
        "anthropic-ratelimit-tokens-remaining": "1",
    }
    info = parse(headers)
    assert (info.limit, info.remaining, info.reset_after) == (50.0, 49.0, 30.0)


def test_anthropic_reset_measured_against_date_header() -> None:
    """The RFC 3339 reset is measured against the Date header when there is one."""
    server_now = NOW + 3600
    headers = {
        "Date": http_date(server_now),
        "anthropic-ratelimit-requests-reset": rfc3339(server_now + 8),
    }
    assert parse(headers).reset_after == 8.0


def test_anthropic_reset_without_offset_ignored() -> None:
    """A timestamp with no UTC offset is a guess, so it is ignored."""
    assert parse({"anthropic-ratelimit-requests-reset": "2027-01-15T08:00:30"}).reset_after is None


def test_openai_requests_family() -> None:
    """x-ratelimit-*-requests with a Go duration reset; token headers are ignored."""
    headers = {
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-reset-requests": "120ms",
        "x-ratelimit-remaining-tokens": "3",
    }
    info = parse(headers)
    assert (info.limit, info.remaining, info.reset_after) == (500.0, 499.0, 0.12)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("1.5ms", 0.0015),
        ("500us", 0.0005),
        ("500µs", 0.0005),
        ("2.5", 2.5),
        ("0", 0.0),
        ("-1s", 0.0),
    ],
)
def test_parse_duration(value: str, expected: float) -> None:
    """Go-style durations and bare seconds are converted to seconds."""
    assert parse_duration(value) == expected


@pytest.mark.parametrize(
    "value", ["", "s", "1x", "1.5.5s", "1 s", "1e400", "nan", "inf", "1s2", "1" * 999 + "ms"]
)
def test_parse_duration_rejects_garbage(value: str) -> None:
    """Anything that is not a duration is None."""
    assert parse_duration(value) is None


# --- precedence --------------------------------------------------------------


def test_families_in_precedence_order_per_field() -> None:
    """Each field comes from the first family that has it: structured, older, X-, vendor."""
    headers = {
        "RateLimit": '"b";r=1',
        "RateLimit-Remaining": "2",
        "RateLimit-Reset": "3",
        "X-RateLimit-Limit": "40",
        "X-RateLimit-Reset": "4",
        "x-ratelimit-limit-requests": "50",
    }
    info = parse(headers)
    assert (info.remaining, info.reset_after, info.limit) == (1.0, 3.0, 40.0)


def test_window_travels_with_its_limit() -> None:
    """A window is only reported from the family that gave the limit."""
    headers = {"RateLimit-Limit": "0, 0;w=60", "X-RateLimit-Limit": "40"}
    info = parse(headers)
    assert (info.limit, info.window, info.rate) == (40.0, None, None)


# --- defensive rules ---------------------------------------------------------


def test_negative_values_clamp_to_zero() -> None:
    """Negative waits, resets and remaining counts clamp to 0."""
    info = parse({"Retry-After": "-5", "X-RateLimit-Remaining": "-3", "X-RateLimit-Reset": "-9"})
    assert (info.retry_after, info.remaining, info.reset_after) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "soon", "", "1_000", "١٢", "0x10"]
)
def test_non_finite_and_garbage_ignored(value: str) -> None:
    """NaN, infinities, overflowing exponents and garbage are ignored, never trusted."""
    headers = {
        "Retry-After": value,
        "X-RateLimit-Limit": value,
        "X-RateLimit-Remaining": value,
        "X-RateLimit-Reset": value,
    }
    assert parse(headers) == RateLimitInfo()


def test_absurd_waits_ignored() -> None:
    """A wait or reset longer than seven days is absurd and ignored."""
    too_long = str(MAX_WAIT + 1)
    info = parse({"Retry-After": too_long, "RateLimit-Reset": too_long})
    assert (info.retry_after, info.reset_after) == (None, None)
    assert parse({"Retry-After": str(MAX_WAIT)}).retry_after == MAX_WAIT


def test_max_wait_is_configurable() -> None:
    """The absurdity threshold is the caller's max_wait."""
    assert parse({"Retry-After": "61"}, max_wait=60).retry_after is None


@pytest.mark.parametrize("value", ["0", "-5"])
def test_limit_must_be_positive(value: str) -> None:
    """A limit of zero or less is not a quota and is ignored."""
    assert parse({"X-RateLimit-Limit": value}).limit is None


def test_mixed_case_keys() -> None:
    """Header names are matched case-insensitively in a plain mapping."""
    info = parse({"RETRY-AFTER": "3", "x-RateLimit-REMAINING": "2", "RateLimit-Policy": '"a";q=9'})
    assert (info.retry_after, info.remaining, info.limit) == (3.0, 2.0, 9.0)


def test_httpx_headers_input() -> None:
    """httpx.Headers are accepted as they are."""
    headers = httpx.Headers({"Retry-After": "3", "X-RateLimit-Remaining": "2"})
    info = parse_rate_limit_headers(headers, now=NOW)
    assert (info.retry_after, info.remaining) == (3.0, 2.0)


def test_repeated_numeric_header_is_garbage() -> None:
    """httpx joins a repeated header with ", "; a joined number is ambiguous and ignored."""
    headers = httpx.Headers(
        [("Retry-After", "5"), ("retry-after", "5"), ("x-should-retry", "true")]
    )
    assert parse_rate_limit_headers(headers, now=NOW) == RateLimitInfo(should_retry=True)


def test_non_string_keys_and_values_ignored() -> None:
    """A plain mapping holding non-strings does not make the parser raise."""
    headers: dict[object, object] = {1: "2", "Retry-After": 3, "x-ratelimit-remaining": "4"}
    assert parse_rate_limit_headers(headers, now=NOW) == RateLimitInfo(remaining=4.0)  # type: ignore[arg-type]


def test_huge_values_ignored_quickly() -> None:
    """Megabyte-long header values are ignored without trying to parse them."""
    huge = "9" * 1_000_000
    assert parse({"Retry-After": huge, "RateLimit": huge, "Date": huge}) == RateLimitInfo()


def test_no_headers_means_nothing_known() -> None:
    """A response without rate-limit headers gives an all-None info."""
    assert parse({"content-type": "text/plain"}) == RateLimitInfo()


# --- scope and x-should-retry ------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-RateLimit-Scope": "  user  "}, "user"),
        ({"RateLimit-Scope": "org"}, "org"),
        ({"x-ratelimit-resource": "core"}, "core"),
        ({"x-ratelimit-scope": "", "x-ratelimit-resource": "search"}, "search"),
        ({"x-ratelimit-scope": "bad\x00", "x-ratelimit-resource": "search"}, "search"),
        ({"x-ratelimit-scope": "é"}, None),
        ({"x-ratelimit-scope": "a" * 65}, None),
        ({"x-ratelimit-scope": "a" * 64}, "a" * 64),
        ({"x-ratelimit-scope": "org:123/search-v2.1_x"}, "org:123/search-v2.1_x"),
        ({"x-ratelimit-scope": "Bearer sk-abc"}, None),
        ({"x-ratelimit-scope": "key=abc"}, None),
        ({"x-ratelimit-scope": '"quoted"'}, None),
        ({"x-ratelimit-scope": "-leading"}, None),
        ({"x-ratelimit-scope": "a;b", "ratelimit-scope": "ok"}, "ok"),
    ],
)
def test_scope(headers: dict[str, str], expected: str | None) -> None:
    """The first scope header that is a plain name of at most 64 characters names the bucket."""
    assert parse(headers).scope == expected


@pytest.mark.parametrize("name", ["X-Should-Retry", "Stripe-Should-Retry"])
@pytest.mark.parametrize(
    ("value", "expected"), [("true", True), (" FALSE ", False), ("yes", None), ("1", None)]
)
def test_should_retry(name: str, value: str, expected: bool | None) -> None:
    """x-should-retry (Stripe's: stripe-should-retry) is true or false, case-insensitively;
    anything else is unknown."""
    assert parse({name: value}).should_retry is expected


def test_should_retry_prefers_the_sdks_header_and_skips_a_garbled_one() -> None:
    """x-should-retry is read first; a value it cannot read leaves Stripe's to say."""
    assert parse({"x-should-retry": "true", "stripe-should-retry": "false"}).should_retry is True
    assert parse({"x-should-retry": "maybe", "stripe-should-retry": "false"}).should_retry is False


# --- the value type ----------------------------------------------------------


@pytest.mark.parametrize("field", ["retry_after", "limit", "remaining", "reset_after", "window"])
@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_rate_limit_info_rejects_impossible_values(field: str, value: float) -> None:
    """RateLimitInfo itself refuses negative, NaN and infinite numbers."""
    with pytest.raises(ValueError, match=field):
        RateLimitInfo(**{field: value})


def test_rate_is_unknown_without_both_parts() -> None:
    """rate is limit / window, and None when either is missing."""
    assert RateLimitInfo(limit=10, window=2).rate == 5.0
    assert RateLimitInfo(limit=10).rate is None
    assert RateLimitInfo(window=2).rate is None


# --- properties --------------------------------------------------------------

HEADER_NAMES = [
    "date",
    "retry-after",
    "retry-after-ms",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-scope",
    "ratelimit-scope",
    "x-ratelimit-resource",
    "x-should-retry",
    "stripe-should-retry",
    "x-ms-retry-after-ms",
    "x-amz-retry-after",
    "x-retry-in",
    "x-shopify-shop-api-call-limit",
    "x-ratelimit-reset-after",
]

numbers = st.one_of(
    st.floats().map(str),
    st.floats().map(repr),
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda x: f"{x:f}"),
    st.sampled_from(["1e400", "-1e400", "1e-400", "nan", "-0", ".5", "5.", "+3"]),
)
epochs = st.floats(min_value=-1e11, max_value=1e11, allow_nan=False)
dates = st.datetimes(timezones=st.just(UTC)).map(lambda d: format_datetime(d, usegmt=True))
stamps = st.datetimes(timezones=st.timezones()).map(datetime.isoformat)
durations = st.lists(
    st.tuples(numbers, st.sampled_from(["h", "m", "s", "ms", "us", "µs", "ns"])), max_size=4
).map(lambda parts: "".join(n + u for n, u in parts))
structured = st.lists(
    st.tuples(
        st.sampled_from(['"a"', '"b"', "c", "1", "?1"]),
        st.lists(st.tuples(st.sampled_from("qlwrt"), numbers), max_size=4),
    ),
    max_size=3,
).map(lambda items: ", ".join(n + "".join(f";{k}={v}" for k, v in ps) for n, ps in items))
values = st.one_of(st.text(), numbers, dates, stamps, durations, structured)
names = st.one_of(
    st.sampled_from(HEADER_NAMES),
    st.sampled_from(HEADER_NAMES).map(str.upper),
    st.sampled_from(HEADER_NAMES).map(str.title),
    st.text(),
)


def assert_sane(info: RateLimitInfo, max_wait: float) -> None:
    for value in (info.retry_after, info.limit, info.remaining, info.reset_after, info.window):
        assert value is None or (math.isfinite(value) and value >= 0)
    for wait in (info.retry_after, info.reset_after):
        assert wait is None or wait <= max_wait
    assert info.rate is None or (math.isfinite(info.rate) and info.rate > 0)
    assert info.scope is None or SCOPE_NAME.fullmatch(info.scope)


@given(st.dictionaries(names, values, max_size=12), st.floats(), st.floats(0, 1e10))
def test_parse_rate_limit_headers_never_raises(
    headers: dict[str, str], now: float, max_wait: float
) -> None:
    """Any headers and any clock give finite, non-negative numbers and waits within max_wait."""
    assert_sane(parse_rate_limit_headers(headers, now=now, max_wait=max_wait), max_wait)


@given(st.dictionaries(st.sampled_from(HEADER_NAMES), values, min_size=1), epochs.map(abs))
def test_real_header_names_with_default_max_wait(headers: dict[str, str], now: float) -> None:
    """Real header names with hostile values never escape the defensive rules."""
    assert_sane(parse_rate_limit_headers(headers, now=now), MAX_WAIT)


@given(st.one_of(st.text(), numbers, durations))
def test_parse_duration_never_raises(value: str) -> None:
    """parse_duration returns None or a finite, non-negative number of seconds."""
    result = parse_duration(value)
    assert result is None or (math.isfinite(result) and result >= 0)


@given(st.integers(0, 10_000), st.integers(0, 59), st.integers(0, 59))
def test_parse_duration_adds_its_parts(h: int, m: int, s: int) -> None:
    """A composed hours-minutes-seconds duration is the sum of its parts."""
    assert parse_duration(f"{h}h{m}m{s}s") == h * 3600 + m * 60 + s


@given(st.one_of(st.text(), numbers, dates), st.floats(), st.one_of(st.none(), st.text(), dates))
def test_parse_retry_after_never_raises(value: str, now: float, date: str | None) -> None:
    """parse_retry_after returns None or a finite, non-negative number of seconds."""
    result = parse_retry_after(value, now=now, date=date)
    assert result is None or (math.isfinite(result) and result >= 0)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # express-rate-limit's draft-7: a dictionary, and a policy item that is its quota.
        (
            {"RateLimit": "limit=10, remaining=3, reset=1", "RateLimit-Policy": "10;w=1"},
            (10.0, 3.0, 1.0, 1.0),
        ),
        ({"RateLimit": "limit=10, remaining=3, reset=1"}, (10.0, 3.0, 1.0, None)),
        # Of two policies, the one the state's limit is.
        (
            {"RateLimit": "limit=10, remaining=3, reset=1", "RateLimit-Policy": "100;w=60, 10;w=1"},
            (10.0, 3.0, 1.0, 1.0),
        ),
        # Draft 6's policy beside the older draft's fields: its window.
        (
            {"RateLimit-Policy": "10;w=1", "RateLimit-Limit": "10", "RateLimit-Remaining": "4"},
            (10.0, 4.0, None, 1.0),
        ),
        # Envoy's global rate limit: the limit a list with its window and name.
        (
            {"X-RateLimit-Limit": '10, 10;w=1;name="per-key"', "X-RateLimit-Remaining": "3",
             "X-RateLimit-Reset": "1"},
            (10.0, 3.0, 1.0, 1.0),
        ),
        # X (Twitter): x-rate-limit-*, the reset an epoch.
        (
            {"x-rate-limit-limit": "900", "x-rate-limit-remaining": "0",
             "x-rate-limit-reset": "1700000600", "date": "Tue, 14 Nov 2023 22:13:20 GMT"},
            (900.0, 0.0, 600.0, None),
        ),
        # A dictionary that is not a rate limit's says nothing.
        ({"RateLimit": "garbage==", "RateLimit-Policy": "10;w=1"}, (10.0, None, None, 1.0)),
    ],
)  # fmt: skip
def test_the_dialects_an_outside_server_spoke(
    headers: dict[str, str], expected: tuple[float | None, ...]
) -> None:
    """draft-7's ``RateLimit`` dictionary and bare-quota policy, Envoy's list-form
    ``X-RateLimit-Limit`` and X's ``x-rate-limit-*`` were each read as nothing: a learning
    scope met those servers as if they stated nothing (1.27x, 1.59x, five 429s)."""
    info = parse_rate_limit_headers(headers, now=1_700_000_000.0)
    assert (info.limit, info.remaining, info.reset_after, info.window) == expected
