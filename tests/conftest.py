"""Suite-wide checks, and how the suite's units of work are shared by two workers.

The compatibility tests read real Kafka partition directories from
../shared/fixtures/kafka (or $ONCELOG_FIXTURES). Without them those tests would
prove nothing, so a missing fixture tree fails the run instead of skipping.

`make test` runs the suite on two pytest-xdist workers with `--dist loadscope`, which
this file's scheduler (HeavyFirstScheduling) carries out: each module is one unit of
work, run on one worker, so that its module fixtures (a server, a Spark cluster) start
once; a test function named in HEAVY_S is a unit of its own (its parameters shared out).
Units go out heaviest first, by HEAVY_S, so that no long unit starts last while the
other worker idles. (Not `--dist loadgroup`: pytest 9.2 ignores the node ids xdist 3.8
renames for it, and every test became a unit, its module fixtures started on both workers.)
"""

from __future__ import annotations

from typing import Any

import pytest
from kafka_fixtures import kafka_fixtures_root
from xdist.scheduler import LoadScopeScheduling

# Units of work heavier than most: seconds on the project's 2-core VM with two workers
# (--durations, 2026-11-29). A key with "::" is a test function, a unit of its own.
HEAVY_S: dict[str, float] = {
    "tests/spark/test_spark_cluster.py": 190,
    "tests/cli/test_cli_bench_wire.py": 90,
    "tests/spark/test_spark_plans.py": 90,
    "tests/packaging/test_wheel.py": 75,
    "tests/compat/test_librdkafka_suite.py": 60,
    "tests/cli/test_cli_bench.py": 55,
    "tests/server/test_eos_end_to_end.py": 55,
    "tests/server/test_kill9_end_to_end.py": 47,
    "tests/server/test_groups.py": 47,
    "tests/spark/test_session.py": 45,
    "tests/server/test_wire_transactions.py": 40,
    "tests/server/test_frame_bounds.py": 37,
    "tests/tools/test_partition_reader.py": 32,
    "tests/cli/test_cli_interrupt.py": 31,
    "tests/spark/test_spark_write.py": 31,
    "tests/server/test_real_clients.py": 30,
    "tests/spark/test_spark_stream.py": 29,
    "tests/torture/test_torture.py::test_two_thousand_crash_states_across_every_fault_class_find_"
    "no_violation": 22,
    "tests/cli/test_demo.py": 28,
    "tests/engine/test_compiled_append.py": 28,
    "tests/server/test_security.py": 27,
    "tests/spark/test_arrow_batches.py": 27,
    "tests/server/test_topic_admin.py": 26,
    "tests/engine/test_descriptors.py": 25,
    "tests/segments/test_index.py": 25,
    "tests/torture/test_torture.py": 45,
    "tests/torture/test_torture.py::test_the_self_test_catches_the_planted_bug": 5,
}


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: itself (each of its parameters) if HEAVY_S names
    its function, else its module."""
    return nodeid if nodeid.split("[", 1)[0] in HEAVY_S else nodeid.split("::", 1)[0]


def weight_s(unit: str) -> float:
    return HEAVY_S.get(unit.split("[", 1)[0], 0.0)


class HeavyFirstScheduling(LoadScopeScheduling):
    """xdist's loadscope with this suite's units (unit_of); units go out in collection
    order (`--no-loadscope-reorder`), which pytest_collection_modifyitems sorts."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


@pytest.hookimpl(optionalhook=True)  # (a run with -p no:xdist does not know the hook)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "loadscope":
        return None  # another distribution asked for: xdist's own
    return HeavyFirstScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heaviest unit first (stable: a unit's tests keep their order, and stay together)."""
    first_seen: dict[str, int] = {}
    for n, item in enumerate(items):
        first_seen.setdefault(unit_of(item.nodeid), n)

    def order(item: pytest.Item) -> tuple[float, int]:
        unit = unit_of(item.nodeid)
        return -weight_s(unit), first_seen[unit]

    items.sort(key=order)


def pytest_sessionstart(session: pytest.Session) -> None:
    root = kafka_fixtures_root()
    if not any(root.glob("*/*/*.log")):
        raise pytest.UsageError(
            f"no Kafka fixtures under {root}: run from a checkout with ../shared beside it "
            "or set ONCELOG_FIXTURES to the directory holding <cluster>/<topic-partition>/*.log"
        )
