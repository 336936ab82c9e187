"""Redaction of URLs and free text: what a trace, a log line or an answer may say of a request."""

from __future__ import annotations

import pytest

from fanout._redact import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # A port out of range: not a URL urllib can take apart, so scrubbed as text.
        ("http://h:99999/x?api_key=sk-live-abcdef123", "http://h:99999/x?api_key=REDACTED"),
        # An IPv6 literal keeps its brackets and port; userinfo goes entirely.
        ("http://u:pw@[::1]:8080/p?token=abc&q=1", "http://[::1]:8080/p?token=REDACTED&q=1"),
        ("https://[2001:db8::1]/p", "https://[2001:db8::1]/p"),
    ],
)
def test_a_url_keeps_its_shape_and_loses_its_credentials(url: str, shown: str) -> None:
    """Credential parameters and userinfo are replaced; host, port, path and the rest stay."""
    assert redact_url(url) == shown
