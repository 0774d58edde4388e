"""The exactly-once write protocol without Spark: attempts, decisions, fencing, re-runs.

Each test plays what Spark does (tasks' attempts, some failing; the driver's commit or
abort) against a real root, then reads back with the engine in read_committed.
"""

from __future__ import annotations

import multiprocessing
import shutil
import time
from pathlib import Path

import pytest
from kafka.partitioner.default import murmur2 as kafka_murmur2

from oncelog import InvalidProducerEpochError, Log, LogConfig
from oncelog.layout import TopicPartition
from oncelog.results import Isolation
from oncelog.root_identity import RootIdentityError
from oncelog.spark.partitioner import murmur2, partition_for_key
from oncelog.spark.transactional_writes import (
    TaskWriter,
    WritePlan,
    abort_stale_writes,
    ensure_topic,
    finish_write,
    prepare_write_root,
    topic_partitions,
)
from oncelog.spark.write_registry import WriteAbortedError, WriteDecidedError, WriteRegistry, check_write_id

TOPIC = "orders"


def values(log: Log, isolation: Isolation) -> list[bytes]:
    out: list[bytes] = []
    offset = log.log_start_offset
    while True:
        fetched = log.read(offset, max_bytes=1 << 20, isolation=isolation)
        if not fetched.batches:
            return out
        out += [r.value or b"" for r in fetched.records()]
        offset = fetched.next_offset


def read_topic(
    root: Path, partitions: int, isolation: Isolation = "read_committed", *, all_closed: bool = True
) -> list[bytes]:
    out: list[bytes] = []
    for p in range(partitions):
        path = root / f"{TOPIC}-{p}"
        if path.exists():
            with Log.open(path, LogConfig()) as log:
                out += values(log, isolation)
                if all_closed:
                    assert log.last_stable_offset == log.log_end_offset, "a transaction was left open"
    return out


def run_attempt(
    root: Path,
    write_id: str,
    attempt: str,
    rows: list[bytes],
    *,
    partitions: int = 3,
    fail_after: int | None = None,
    job: str = "job-a",
) -> str:
    """One task attempt; `fail_after` rows it stops as a crashed attempt would (no finish)."""
    writer = TaskWriter(
        str(root),
        TOPIC,
        write_id,
        job,
        attempt,
        new_topic_partitions=partitions,
        batch_records=7,
        max_pending_bytes=500,
    )
    for n, value in enumerate(rows):
        if fail_after is not None and n == fail_after:
            writer.close()
            return attempt
        writer.add(value, value)
    writer.finish()
    return attempt


def rows_of(task: int, count: int = 40) -> list[bytes]:
    return [b"t%d-r%d" % (task, n) for n in range(count)]


class TestCommit:
    def test_only_the_winning_attempts_rows_become_visible_exactly_once(self, tmp_path: Path) -> None:
        # Task 0 fails after 25 rows (some already appended), its retry wins; task 1 wins at once.
        run_attempt(tmp_path, "w1", "0.0.0", rows_of(0), fail_after=25)
        winners = [
            run_attempt(tmp_path, "w1", "0.0.1", rows_of(0)),
            run_attempt(tmp_path, "w1", "0.1.0", rows_of(1)),
        ]
        # The failed attempt's rows are there, but nothing is visible before the commit.
        assert len(read_topic(tmp_path, 3, "read_uncommitted", all_closed=False)) > 80
        assert read_topic(tmp_path, 3, all_closed=False) == []
        markers = finish_write(str(tmp_path), "w1", winners)
        assert markers > 0
        assert sorted(read_topic(tmp_path, 3)) == sorted(rows_of(0) + rows_of(1))

    def test_re_running_a_committed_write_id_writes_nothing(self, tmp_path: Path) -> None:
        winners = [run_attempt(tmp_path, "w2", "0.0.0", rows_of(0))]
        finish_write(str(tmp_path), "w2", winners)
        before = read_topic(tmp_path, 3, "read_uncommitted")
        writer = TaskWriter(str(tmp_path), TOPIC, "w2", "job-b", "1.0.0", new_topic_partitions=3)
        assert writer.skipped
        writer.add(b"k", b"new")
        result = writer.finish()
        assert result.skipped and result.rows == 0
        assert finish_write(str(tmp_path), "w2", []) == 0
        assert read_topic(tmp_path, 3, "read_uncommitted") == before

    def test_an_earlier_decision_stands_when_the_driver_died_mid_commit(self, tmp_path: Path) -> None:
        first = run_attempt(tmp_path, "w3", "0.0.0", rows_of(0))
        run_attempt(tmp_path, "w3", "0.0.1", rows_of(0))  # a loser: aborted by the roll-forward
        with WriteRegistry.open(str(tmp_path)) as registry:
            registry.decide("w3", [first])  # the commit point, then the driver died
        # The re-run's driver sees no winners of its own (its tasks skipped): the stored decision wins.
        finish_write(str(tmp_path), "w3", [])
        assert sorted(read_topic(tmp_path, 3)) == sorted(rows_of(0))
        with WriteRegistry.open(str(tmp_path)) as registry:
            state = registry.state("w3")
        assert state.done and state.winners == (first,) and state.attempts == {}  # compacted once done

    def test_keyed_rows_land_where_kafkas_default_partitioner_puts_them(self, tmp_path: Path) -> None:
        winners = [run_attempt(tmp_path, "w4", "0.0.0", rows_of(0), partitions=5)]
        finish_write(str(tmp_path), "w4", winners)
        for p in range(5):
            with Log.open(tmp_path / f"{TOPIC}-{p}", LogConfig()) as log:
                for value in values(log, "read_committed"):
                    assert partition_for_key(value, 5) == p


class TestAbort:
    def test_abort_closes_every_attempts_transaction_and_a_re_run_starts_clean(self, tmp_path: Path) -> None:
        run_attempt(tmp_path, "w5", "0.0.0", rows_of(0))
        run_attempt(tmp_path, "w5", "0.1.0", rows_of(1), fail_after=30)
        finish_write(str(tmp_path), "w5", None)
        assert read_topic(tmp_path, 3) == []  # also checks no transaction is left open
        with WriteRegistry.open(str(tmp_path)) as registry:
            assert registry.state("w5").closed_jobs == ("job-a",)
            assert registry.stale(2**62) == []  # aborted already: not timed out again
        winners = [run_attempt(tmp_path, "w5", "1.0.0", rows_of(2), job="job-b")]  # the re-run
        finish_write(str(tmp_path), "w5", winners)
        assert sorted(read_topic(tmp_path, 3)) == sorted(rows_of(2))

    def test_a_zombie_attempt_is_fenced_after_the_commit(self, tmp_path: Path) -> None:
        zombie = TaskWriter(
            str(tmp_path), TOPIC, "w6", "job-a", "0.0.0", new_topic_partitions=1, batch_records=5
        )
        for value in rows_of(0, 10):
            zombie.add(None, value)
        zombie._drain()  # it appended (and registered its partition), then stalled
        winners = [run_attempt(tmp_path, "w6", "0.0.1", rows_of(0, 10), partitions=1)]
        finish_write(str(tmp_path), "w6", winners)
        for value in rows_of(9, 10):
            zombie.add(None, value)
        with pytest.raises(InvalidProducerEpochError):
            zombie.finish()
        assert sorted(read_topic(tmp_path, 1)) == sorted(rows_of(0, 10))

    def test_an_attempt_cannot_register_a_partition_once_the_write_is_decided(self, tmp_path: Path) -> None:
        with WriteRegistry.open(str(tmp_path)) as registry:
            registry.decide("w7", [])
            with pytest.raises(WriteDecidedError):
                registry.add_partition("w7", "job-a", "0.0.0", 5, 0, TopicPartition(TOPIC, 0), 1)


class TestFencingAndTimeouts:
    def test_a_zombie_of_an_aborted_job_cannot_register_a_new_partition(self, tmp_path: Path) -> None:
        run_attempt(tmp_path, "w9", "0.0.0", rows_of(0), partitions=1)
        finish_write(str(tmp_path), "w9", None, job="job-a")
        with WriteRegistry.open(str(tmp_path)) as registry:
            with pytest.raises(WriteDecidedError, match="aborted"):
                registry.add_partition("w9", "job-a", "0.1.0", 77, 0, TopicPartition(TOPIC, 1), 1)
            registry.add_partition("w9", "job-b", "0.1.0", 78, 0, TopicPartition(TOPIC, 1), 1)  # a re-run may

    def test_an_attempt_key_reused_with_another_producer_is_refused(self, tmp_path: Path) -> None:
        with WriteRegistry.open(str(tmp_path)) as registry:
            registry.add_partition("w10", "job-a", "0.0.0", 5, 0, TopicPartition(TOPIC, 0), 1)
            with pytest.raises(WriteDecidedError, match="another producer"):
                registry.add_partition("w10", "job-a", "0.0.0", 6, 0, TopicPartition(TOPIC, 1), 1)

    def test_an_abandoned_write_is_aborted_after_the_timeout_and_a_late_commit_fails(
        self, tmp_path: Path
    ) -> None:
        attempt = run_attempt(tmp_path, "w11", "0.0.0", rows_of(0))
        assert abort_stale_writes(str(tmp_path), 3600) == []  # young: left alone
        assert read_topic(tmp_path, 3, all_closed=False) == []
        time.sleep(0.01)
        assert abort_stale_writes(str(tmp_path), 0.001) == ["w11"]
        assert read_topic(tmp_path, 3) == []  # aborted: nothing left open, nothing visible
        with pytest.raises(WriteAbortedError):
            finish_write(str(tmp_path), "w11", [attempt])

    def test_a_finished_write_keeps_only_its_decision(self, tmp_path: Path) -> None:
        winners = [run_attempt(tmp_path, "w12", "0.0.0", rows_of(0))]
        finish_write(str(tmp_path), "w12", winners)
        with WriteRegistry.open(str(tmp_path)) as registry:
            state = registry.state("w12")
            assert state.done and state.decided and state.attempts == {}
            registry.discard("w12")
            assert registry.write_ids() == []


class TestTopics:
    def test_a_new_topic_is_created_whole_so_every_job_routes_keys_alike(self, tmp_path: Path) -> None:
        ensure_topic(str(tmp_path), TOPIC, 4, 10.0)
        assert topic_partitions(str(tmp_path), TOPIC) == [0, 1, 2, 3]
        writer = TaskWriter(str(tmp_path), TOPIC, "w13", "job-a", "0.0.0", new_topic_partitions=1)
        assert writer.partition_count == 4

    def test_large_records_are_cut_into_batches_under_the_size_limit(self, tmp_path: Path) -> None:
        writer = TaskWriter(str(tmp_path), TOPIC, "w14", "job-a", "0.0.0", new_topic_partitions=1)
        for n in range(1000):
            writer.add(None, b"%04d" % n + b"x" * 2048)
        finish_write(str(tmp_path), "w14", [writer.finish().attempt])
        assert len(read_topic(tmp_path, 1)) == 1000


def _concurrent_attempt(root: str, task: int) -> str:
    return run_attempt(Path(root), "w8", f"0.{task}.0", rows_of(task, 300), partitions=2)


class TestConcurrency:
    def test_processes_writing_the_same_partitions_at_once_wait_for_each_other(self, tmp_path: Path) -> None:
        context = multiprocessing.get_context("spawn")
        with context.Pool(3) as pool:
            winners = pool.starmap(_concurrent_attempt, [(str(tmp_path), task) for task in range(3)])
        finish_write(str(tmp_path), "w8", winners)
        assert sorted(read_topic(tmp_path, 2)) == sorted(rows_of(0, 300) + rows_of(1, 300) + rows_of(2, 300))


def test_murmur2_matches_kafka_pythons() -> None:
    for n in range(64):
        key = bytes(range(n)) + b"key-%d" % n
        assert murmur2(key) == kafka_murmur2(key) & 0xFFFFFFFF


@pytest.mark.parametrize("bad", ["", "a b", "x" * 401, "é"])
def test_write_ids_are_plain_and_bounded(bad: str) -> None:
    with pytest.raises(ValueError, match="writeId"):
        check_write_id(bad)


def test_committed_attempts_free_their_producer_slots_and_aborted_ones_stay_fenced(tmp_path: Path) -> None:
    loser = TaskWriter(str(tmp_path), TOPIC, "w15", "job-a", "0.0.0", new_topic_partitions=1)
    loser.add(None, b"lost")
    loser_result = loser.finish()
    winner = TaskWriter(str(tmp_path), TOPIC, "w15", "job-a", "0.0.1", new_topic_partitions=1)
    winner.add(None, b"kept")
    winner_result = winner.finish()
    finish_write(str(tmp_path), "w15", [winner_result.attempt])
    with Log.open(tmp_path / f"{TOPIC}-0", LogConfig()) as log:
        assert log.producer_state(winner_result.producer_id) is None  # retired at its commit
        fenced = log.producer_state(loser_result.producer_id)
        assert fenced is not None and fenced.producer_epoch == 1  # kept, with the bumped epoch
        assert values(log, "read_committed") == [b"kept"]


def test_task_attempts_lease_consecutive_producer_ids(tmp_path: Path) -> None:
    pids = [TaskWriter(str(tmp_path), TOPIC, "w16", "job-a", f"0.{n}.0").producer_id for n in range(3)]
    assert pids == list(range(pids[0], pids[0] + 3))  # no block of 100 wasted per attempt


def _planned_root(root: Path, partitions: int) -> WritePlan:
    """What a write's driver makes before any task runs."""
    root_id = prepare_write_root(str(root))
    count = ensure_topic(str(root), TOPIC, partitions, 10.0)
    return WritePlan(root_id, "driver-host", count)


def test_a_task_with_the_drivers_plan_writes_into_the_drivers_root(tmp_path: Path) -> None:
    plan = _planned_root(tmp_path, 2)
    writer = TaskWriter(str(tmp_path), TOPIC, "w", "job", "job/a0", plan=plan)
    for n in range(10):
        writer.add(None, b"v%d" % n)
    finish_write(str(tmp_path), "w", [writer.finish().attempt])
    assert sorted(read_topic(tmp_path, 2)) == sorted(b"v%d" % n for n in range(10))


def test_a_task_that_finds_no_root_creates_nothing(tmp_path: Path) -> None:
    plan = _planned_root(tmp_path / "driver", 2)
    elsewhere = tmp_path / "executor"
    with pytest.raises(RootIdentityError, match=r"no such directory.*driver-host"):
        TaskWriter(str(elsewhere), TOPIC, "w", "job", "job/a0", plan=plan)
    assert not elsewhere.exists()


def test_a_task_that_finds_another_root_at_the_path_writes_nothing_there(tmp_path: Path) -> None:
    plan = _planned_root(tmp_path / "driver", 2)
    other = tmp_path / "other"
    _planned_root(other, 2)  # a root of its own, the same topic: a local disk at the same path
    before = sorted(p.name for p in other.rglob("*"))
    with pytest.raises(RootIdentityError, match="different directories"):
        TaskWriter(str(other), TOPIC, "w", "job", "job/a0", plan=plan)
    assert sorted(p.name for p in other.rglob("*")) == before


def test_a_task_never_recreates_a_partition_deleted_after_planning(tmp_path: Path) -> None:
    plan = _planned_root(tmp_path, 2)
    writer = TaskWriter(str(tmp_path), TOPIC, "w", "job", "job/a0", plan=plan)
    shutil.rmtree(tmp_path / f"{TOPIC}-1")
    for n in range(4):
        writer.add(None, b"v%d" % n, partition=n % 2)
    with pytest.raises(RootIdentityError, match=f"partition {TOPIC}-1 is missing"):
        writer.finish()
    assert not (tmp_path / f"{TOPIC}-1").exists()
