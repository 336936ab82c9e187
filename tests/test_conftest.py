"""The test suite's own promise: a test marked ``redis`` fails when it would skip."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

SAMPLE = """
import pytest

@pytest.fixture
def server():
    pytest.skip("no redis-server")

@pytest.mark.redis
def test_skips_in_its_body():
    pytest.skip("no redis-server")

@pytest.mark.redis
def test_skips_in_a_fixture(server):
    pass

@pytest.mark.redis
@pytest.mark.skipif(True, reason="no redis-server")
def test_skips_by_marker():
    pass

@pytest.mark.redis
@pytest.mark.xfail(reason="a known bug")
def test_expected_to_fail():
    assert False

def test_not_about_redis(server):
    pass
"""


def test_a_skipped_redis_test_fails_and_other_skips_stay_skips(pytester: pytest.Pytester) -> None:
    """Every way a Redis test can skip becomes a failure; xfail and unmarked skips are untouched."""
    pytester.makeconftest("from tests.conftest import pytest_runtest_makereport")
    pytester.makeini("[pytest]\nmarkers = redis: a Redis test\n")
    pytester.makepyfile(SAMPLE)
    result = pytester.runpytest("-p", "no:trio")
    result.assert_outcomes(failed=1, errors=2, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines(["*a Redis test must not skip; it said: Skipped: no redis-server*"])
