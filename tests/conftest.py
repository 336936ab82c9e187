"""The Redis tests' promise to a new user: they name their server, and they never skip.

A skipped Redis test is how the README's test command once passed on a fresh
machine without testing shared limits at all; so a skip of a test marked
``redis`` is reported as a failure, with the reason it gave.
"""

from __future__ import annotations

import gc
import os
from typing import TYPE_CHECKING

import pytest

from tests.redis_support import ENV_SERVER, ENV_URL, engines

if TYPE_CHECKING:
    from collections.abc import Generator, Iterator

pytest_plugins = ["pytester"]  # tests/test_conftest.py runs pytest on a sample suite


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


@pytest.fixture(autouse=True)
def _no_full_collection_over_the_suites_heap(request: pytest.FixtureRequest) -> Iterator[None]:
    """A Redis test runs with the objects earlier tests left frozen out of the collector.

    By the Redis tests the suite holds some 450,000 objects (Hypothesis's
    among them), and a full collection over them takes 260-310 ms, longer
    than a Redis scope's default ``op_timeout`` (0.25 s): one falling inside
    an operation failed it, and the scope closed, in about one run of three
    of a slice of the suite. That is the process's pause, not Redis's, and
    the README says so beside ``op_timeout``; these tests are about Redis.
    """
    if request.node.get_closest_marker("redis") is None:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A Redis test that skips fails instead (deselect with ``-m 'not redis'`` if you must)."""
    report = yield
    expected = hasattr(report, "wasxfail")  # an xfail is reported as a skip too
    if report.skipped and not expected and item.get_closest_marker("redis") is not None:
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"a Redis test must not skip; it said: {reason}"
    return report
