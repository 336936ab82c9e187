"""A refusal's wait in its JSON body (Google's ``RetryInfo``, Discord's and Telegram's
``retry_after``): read where it is, and nothing a body holds makes the reading fail."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fanout._retry_info import BODY_LIMIT, read_capped, retry_delay

_TYPE = "type.googleapis.com/google.rpc.RetryInfo"


def google(delay: object, *, wrapped: bool = False, before: int = 1) -> bytes:
    """A Gemini-style 429 body: a QuotaFailure or two, then the RetryInfo."""
    others = [{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []}]
    error = {
        "code": 429,
        "status": "RESOURCE_EXHAUSTED",
        "details": [*others * before, {"@type": _TYPE, "retryDelay": delay}],
    }
    body: Any = {"error": error}
    return json.dumps([body] if wrapped else body).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (google("23s"), 23.0),
        (google("0.300s"), 0.3),
        (google(" 1.5s "), 1.5),
        (google("34s", wrapped=True), 34.0),  # some Google APIs answer with a list
        (google("2s", before=3), 2.0),
        (google("23"), None),  # a Duration always ends in "s"
        (google("-1s"), None),
        (google("1e3s"), None),
        (google("nans"), None),
        (google(23), None),
        (google({"seconds": 23}), None),
        (google("700000s"), None),  # longer than the longest believable wait
        (b'{"error": {"details": "23s"}}', None),
        (b'{"error": "quota"}', None),
        (b"[]", None),
        (b"null", None),
        (b"not json", None),
        (b"\xff\xfe\x00", None),
        (b"[" * 100_000 + b"]" * 100_000, None),  # nested past the parser's recursion
        (b'{"message": "You are being rate limited.", "retry_after": 64.57}', 64.57),  # Discord
        (b'{"ok": false, "error_code": 429, "parameters": {"retry_after": 35}}', 35.0),  # Telegram
        (b'{"retry_after": 0}', 0.0),
        (b'{"retry_after": -1, "parameters": {"retry_after": 2}}', 2.0),
        (b'{"retry_after": true}', None),
        (b'{"retry_after": "5"}', None),
        (b'{"retry_after": 1e400}', None),
        (b'{"retry_after": 1' + b"0" * 400 + b"}", None),  # too big for a float
        (b'{"retry_after": 700000}', None),
        (b'{"parameters": [35]}', None),
    ],
)
def test_the_wait_is_read_from_a_retry_info_and_nothing_else(
    body: bytes, expected: float | None
) -> None:
    assert retry_delay(body, max_wait=7 * 86400) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(
    delay=json_values | st.from_regex(r"\A-?\d{0,14}(\.\d{0,12})?s?\Z"),
    body=st.binary(max_size=200),
    other=json_values,
)
def test_no_body_makes_the_reading_fail(delay: object, body: bytes, other: object) -> None:
    """Any bytes, any JSON, and any RetryInfo value: a wait of at most ``max_wait`` or None."""
    plain = [{"retry_after": other}, {"parameters": {"retry_after": other}}]
    for candidate in (body, json.dumps(other).encode(), google(delay), *map(dumps, plain)):
        wait = retry_delay(candidate, max_wait=60.0)
        assert wait is None or 0.0 <= wait <= 60.0


def dumps(value: object) -> bytes:
    return json.dumps(value).encode()


async def chunks(*parts: bytes) -> Any:
    for part in parts:
        yield part


async def test_a_body_is_read_whole_up_to_the_limit_and_not_past_it() -> None:
    assert await read_capped(chunks(b"a" * 10, b"b" * 10), limit=20) == b"a" * 10 + b"b" * 10
    assert await read_capped(chunks(b"a" * 10, b"b" * 11), limit=20) is None
    assert await read_capped(chunks()) == b""
    assert BODY_LIMIT == 64 * 1024
