"""librdkafka's own integration tests against `oncelog serve`: the fast subset (issue 31).

`make test` builds librdkafka 2.12.1 and its test runner (tests/compat/build_librdkafka.sh,
from the npm package node-rdkafka 3.6.0) and runs the numbers in librdkafka_suite.FAST
here; `make compat` runs every test meant for a real cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import librdkafka_suite as suite

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "compat"
SUITE = BUILD / suite.SUITE_DIR


@pytest.fixture(scope="module")
def built() -> Path:
    if not (SUITE / "test-runner").exists():
        pytest.fail(
            f"{SUITE / 'test-runner'} is missing: `make test` builds it (tests/compat/build_librdkafka.sh)"
        )
    return SUITE


def test_the_fast_subset_of_librdkafkas_suite_passes_against_oncelog_serve(
    built: Path, tmp_path: Path
) -> None:
    result_path = tmp_path / "result.json"
    run = subprocess.run(
        [
            *(sys.executable, str(Path(suite.__file__)), "--build", str(BUILD), "--tests", "fast"),
            *("--timeout-s", "600", "--json", str(result_path)),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    result = json.loads(result_path.read_text())
    assert result["failed"] == {}
    ran = {name[:4] for name in result["passed_tests"]}
    assert ran == set(suite.FAST) - _wholly_allowlisted(), run.stdout
    assert result["run"] == result["passed"] >= len(suite.FAST)


def _wholly_allowlisted() -> set[str]:
    return {name for name in suite.read_allowlist(suite.ALLOWLIST) if len(name) == 4}


def test_every_allowlisted_test_exists_in_the_suite_and_says_why(built: Path) -> None:
    declared = {test.name for test in suite.declared_tests(built)}
    numbers = {name[:4] for name in declared}
    for name, reason in suite.read_allowlist(suite.ALLOWLIST).items():
        assert name in declared or name in numbers, f"{name} is not a test of librdkafka 2.12.1"
        assert len(reason) > 10, name


def test_the_suites_table_is_read_with_each_tests_flags(built: Path) -> None:
    tests = {test.name: test for test in suite.declared_tests(built)}
    assert len(tests) > 150
    assert tests["0001_multiobj"].for_a_cluster
    assert not tests["0009_mock_cluster"].for_a_cluster  # TEST_F_LOCAL: librdkafka's mock
    assert not tests["0028_long_topicnames"].for_a_cluster  # TEST_F_KNOWN_ISSUE
