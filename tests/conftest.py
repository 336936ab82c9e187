"""Say at the top of every run which Redis-compatible server the Redis tests start."""

from __future__ import annotations

import os

import pytest

from tests.redis_support import ENV_SERVER, ENV_URL, engines


def pytest_report_header() -> list[str]:
    """One line per server binary the tests may use, the first being the one they use."""
    try:
        found = engines()
    except pytest.fail.Exception as exc:  # a misconfiguration: each Redis test fails with it
        return [f"redis servers: {exc}"]
    if not found:
        fallback = os.environ.get(ENV_URL) or f"none: the Redis tests will fail ({ENV_URL} unset)"
        return [f"redis servers: no binary; {ENV_URL}: {fallback}"]
    forced = f" ({ENV_SERVER}={os.environ[ENV_SERVER]})" if os.environ.get(ENV_SERVER) else ""
    return [
        f"redis servers{forced}: "
        + "; ".join(f"{e.name} from {e.origin} ({e.server})" for e in found)
    ]
