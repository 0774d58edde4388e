"""The units of work `make test`'s two workers share (tests/conftest.py schedules them).

Each test module is one unit, run on one worker, so its module fixtures start once; a
test function named in HEAVY_S is a unit per parameter. Units go out heaviest first.
"""

from __future__ import annotations

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
