"""LogManager: many topic-partitions under one root (issue 8).

Partition directories are `<topic>-<partition>/`; one lock per root; per-topic config
overrides are durable; one ProducerIdManager per root; recovery runs in a bounded
thread pool and is summarised; deletes and opens are crash-safe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oncelog import (
    InvalidTopicError,
    Log,
    LogConfig,
    LogDirLockedError,
    LogManager,
    PartitionRecoveryError,
    TopicPartition,
    UnknownTopicOrPartitionError,
)
from oncelog.log import CLEAN_SHUTDOWN_FILE
from oncelog.recovery.faultfs import FaultFileSystem, SimulatedCrash
from oncelog.segments.batch import encode_batch

T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=256, producer_expiration_ms=10**13)


def clock() -> int:
    return T0


def batch(pid: int, seq: int, records: int = 2) -> bytes:
    values = [(b"k", b"p%d-s%d" % (pid, seq + i)) for i in range(records)]
    return encode_batch(values, producer_id=pid, producer_epoch=0, base_sequence=seq, timestamp_ms=T0)


def open_manager(root: Path | str, **kwargs: object) -> LogManager:
    return LogManager.open(root, CONFIG, clock=clock, progress=False, **kwargs)  # type: ignore[arg-type]


def contents(log: Log) -> list[bytes]:
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset)
        out += [bytes(b.buffer) for b in fetched.batches]
        offset = fetched.next_offset
    return out


class TestPartitions:
    def test_each_partition_is_a_topic_dash_partition_directory(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            manager.log("orders", 0).append(batch(1, 0))
            manager.log("orders", 1)
            manager.log("pay-ments.v2", 7)
        names = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
        assert [n for n in names if not n.endswith(".lmdb")] == ["orders-0", "orders-1", "pay-ments.v2-7"]

    def test_reopen_finds_every_partition_with_its_data_and_producer_state(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            for p in range(3):
                log = manager.log("t", p)
                for seq in range(0, 20, 2):
                    log.append(batch(p + 1, seq))
            before = {tp: contents(log) for tp, log in manager.logs().items()}
        with open_manager(tmp_path) as manager:
            logs = manager.logs()
            assert list(logs) == [TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)]
            assert {tp: contents(log) for tp, log in logs.items()} == before
            state = logs[TopicPartition("t", 2)].producer_state(3)
            assert state is not None and state.last_sequence == 19
            summary = manager.recovery_summary
            assert (summary.partitions, summary.clean, summary.unclean) == (3, 3, 0)

    def test_a_topic_whose_name_ends_in_dash_digits_round_trips(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            manager.log("a-1", 2).append(batch(1, 0))
        with open_manager(tmp_path) as manager:
            assert list(manager.logs()) == [TopicPartition("a-1", 2)]

    def test_log_returns_the_same_open_log_each_time(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            assert manager.log("t", 0) is manager.log("t", 0)

    def test_unknown_partition_without_create_is_refused(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager, pytest.raises(UnknownTopicOrPartitionError, match="t-3"):
            manager.log("t", 3, create=False)
        assert not (tmp_path / "t-3").exists()

    @pytest.mark.parametrize(
        ("topic", "partition"), [("", 0), ("..", 0), ("a/b", 0), ("x" * 250, 0), ("t", -1)]
    )
    def test_illegal_names_are_refused_before_touching_disk(
        self, tmp_path: Path, topic: str, partition: int
    ) -> None:
        with open_manager(tmp_path) as manager, pytest.raises(InvalidTopicError):
            manager.log(topic, partition)
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            ".lock",
            "meta.lmdb",
            "producer_ids.lmdb",
            "producer_ids.lock",
        ]

    def test_unrelated_entries_in_the_root_are_left_alone(self, tmp_path: Path) -> None:
        (tmp_path / "notes.txt").write_text("hello")
        (tmp_path / "not_a_partition").mkdir()
        with open_manager(tmp_path) as manager:
            assert manager.logs() == {}
        assert (tmp_path / "notes.txt").read_text() == "hello"


class TestRootLock:
    def test_a_second_manager_on_the_root_is_refused_until_the_first_closes(self, tmp_path: Path) -> None:
        first = open_manager(tmp_path)
        with pytest.raises(LogDirLockedError, match="LogManager"):
            open_manager(tmp_path)
        first.close()
        open_manager(tmp_path).close()

    def test_a_partition_of_an_open_manager_cannot_be_opened_as_a_log(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            manager.log("t", 0)
            with pytest.raises(LogDirLockedError):
                Log.open(tmp_path / "t-0", CONFIG)

    def test_a_closed_manager_refuses_work(self, tmp_path: Path) -> None:
        manager = open_manager(tmp_path)
        manager.close()
        manager.close()  # idempotent
        with pytest.raises(ValueError, match="closed"):
            manager.log("t", 0)


class TestDeleteLog:
    def test_delete_removes_the_directory_and_a_recreated_partition_starts_empty(
        self, tmp_path: Path
    ) -> None:
        with open_manager(tmp_path) as manager:
            manager.log("t", 0).append(batch(1, 0))
            manager.log("t", 1).append(batch(2, 0))
            manager.delete_log("t", 0)
            assert not (tmp_path / "t-0").exists()
            assert list(manager.logs()) == [TopicPartition("t", 1)]
            with pytest.raises(UnknownTopicOrPartitionError):
                manager.delete_log("t", 0)
        with open_manager(tmp_path) as manager:
            assert list(manager.logs()) == [TopicPartition("t", 1)]
            assert manager.log("t", 0).log_end_offset == 0

    def test_a_crash_at_any_io_call_of_a_delete_leaves_the_whole_log_or_none_of_it(self) -> None:
        root = "/root"

        def build(fs: FaultFileSystem) -> tuple[LogManager, list[bytes]]:
            manager = LogManager.open(root, CONFIG, fs=fs, clock=clock, progress=False, recovery_threads=1)
            log = manager.log("t", 0)
            for seq in range(0, 40, 2):
                log.append(batch(1, seq))
            manager.log("t", 1).append(batch(2, 0))
            manager.flush()
            return manager, contents(log)

        dry = FaultFileSystem(5)
        manager, _ = build(dry)
        start = dry.io_calls
        manager.delete_log("t", 0)
        calls = dry.io_calls - start
        assert calls > 10
        outcomes = set()
        for n in range(1, calls + 1):
            fs = FaultFileSystem(5)
            manager, before = build(fs)
            fs.kill_at(fs.io_calls + n)
            with pytest.raises(SimulatedCrash):
                manager.delete_log("t", 0)
            for mode in ("kill", "drop"):
                crashed = fs.crash(mode)  # type: ignore[arg-type]
                why = f"killed at delete I/O call {n}/{calls}, {mode}; {crashed.describe()}"
                reopened = LogManager.open(
                    root, CONFIG, fs=crashed, clock=clock, progress=False, recovery_threads=1
                )
                logs = reopened.logs()
                assert TopicPartition("t", 1) in logs, why
                if TopicPartition("t", 0) in logs:
                    assert contents(logs[TopicPartition("t", 0)]) == before, why
                    outcomes.add("kept")
                else:
                    assert not crashed.exists(f"{root}/t-0"), why
                    outcomes.add("deleted")
                reopened.close()
        assert outcomes == {"kept", "deleted"}


class TestTopicConfig:
    def test_overrides_are_durable_and_apply_to_new_and_reopened_logs(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            manager.set_topic_config("big", segment_bytes=1 << 20, retention_bytes=10_000)
            assert manager.log("big", 0).config.segment_bytes == 1 << 20
            assert manager.log("small", 0).config.segment_bytes == CONFIG.segment_bytes
        with open_manager(tmp_path) as manager:
            assert manager.topic_overrides("big") == {"segment_bytes": 1 << 20, "retention_bytes": 10_000}
            assert manager.log("big", 0).config.retention_bytes == 10_000
            assert manager.log("small", 0).config.retention_bytes is None

    def test_an_override_reaches_the_topics_open_logs_at_once(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            log = manager.log("t", 0)
            manager.set_topic_config("t", segment_bytes=1 << 20)
            for seq in range(0, 200, 2):
                log.append(batch(1, seq))
            assert len(log.segments) == 1  # at 2048 bytes it would have rolled many times
            manager.reset_topic_config("t")
            for seq in range(200, 400, 2):
                log.append(batch(1, seq))
            assert len(log.segments) > 1
            assert manager.topic_overrides("t") == {}

    def test_fields_sized_at_open_wait_for_the_reopen(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            log = manager.log("t", 0)
            manager.set_topic_config("t", producer_capacity=7)
            assert log.config.producer_capacity == CONFIG.producer_capacity
        with open_manager(tmp_path) as manager:
            assert manager.log("t", 0).config.producer_capacity == 7

    def test_unknown_fields_and_bad_values_are_refused_and_nothing_is_stored(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            with pytest.raises(ValueError, match="segment_byte"):
                manager.set_topic_config("t", segment_byte=5)
            with pytest.raises(ValueError, match="segment_bytes must be >= 1024"):
                manager.set_topic_config("t", segment_bytes=5)
            assert manager.topic_overrides("t") == {}


class TestProducerIds:
    def test_one_producer_id_manager_per_root_never_reissues_a_pid(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            first = manager.producer_ids.lease().producer_id
        with open_manager(tmp_path) as manager:
            assert manager.producer_ids.lease().producer_id > first
            pid, epoch = manager.producer_ids.init_producer_id("tx-1")
            assert manager.producer_ids.init_producer_id("tx-1") == (pid, epoch + 1)


class TestRecovery:
    def test_unclean_partitions_are_counted_and_summarised(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            for p in range(4):
                manager.log("t", p).append(batch(p + 1, 0))
        # Two partitions lose their clean-shutdown marker, as if the process died there.
        for p in (1, 3):
            os.unlink(tmp_path / f"t-{p}" / CLEAN_SHUTDOWN_FILE)
        with open_manager(tmp_path, recovery_threads=3) as manager:
            summary = manager.recovery_summary
            assert (summary.partitions, summary.clean, summary.unclean, summary.threads) == (4, 2, 2, 3)
            assert {tp for tp, r in summary.reports.items() if not r.clean} == {
                TopicPartition("t", 1),
                TopicPartition("t", 3),
            }
            assert summary.bytes_scanned == sum(r.bytes_scanned for r in summary.reports.values()) > 0
            assert "4 partitions" in str(summary) and "2 unclean" in str(summary)
            # Every marker was consumed at open: a crash now must count as unclean.
            assert not any((tmp_path / f"t-{p}" / CLEAN_SHUTDOWN_FILE).exists() for p in range(4))

    def test_a_partition_that_fails_to_open_fails_the_open_naming_it_and_releases_everything(
        self, tmp_path: Path
    ) -> None:
        with open_manager(tmp_path) as manager:
            for p in range(3):
                manager.log("t", p).append(batch(1, 0))
        squatter = Log.open(tmp_path / "t-1", CONFIG)  # another process's Log holds t-1
        with pytest.raises(PartitionRecoveryError, match="t-1") as caught:
            open_manager(tmp_path)
        assert list(caught.value.failures) == [TopicPartition("t", 1)]
        assert isinstance(caught.value.failures[TopicPartition("t", 1)], LogDirLockedError)
        squatter.close()
        # Nothing the failed open took stays locked: the root and t-0, t-2 reopen.
        with open_manager(tmp_path) as manager:
            assert len(manager.logs()) == 3

    def test_the_progress_bar_reports_partitions_on_stderr(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with open_manager(tmp_path) as manager:
            for p in range(5):
                manager.log("t", p)
        capsys.readouterr()
        LogManager.open(tmp_path, CONFIG, clock=clock, progress=True).close()
        err = capsys.readouterr().err
        assert "5/5" in err and "partitions" in err

    def test_a_crash_at_any_io_call_of_an_open_loses_nothing(self) -> None:
        root = "/root"
        fs = FaultFileSystem(11)
        manager = LogManager.open(root, CONFIG, fs=fs, clock=clock, progress=False, recovery_threads=1)
        for p in range(2):
            log = manager.log("t", p)
            for seq in range(0, 30, 2):
                log.append(batch(p + 1, seq))
        before = {tp: contents(log) for tp, log in manager.logs().items()}
        manager.close()
        dry = fs.crash("kill")
        start = dry.io_calls
        opened = LogManager.open(root, CONFIG, fs=dry, clock=clock, progress=False, recovery_threads=1)
        calls = dry.io_calls - start
        opened.close()
        assert calls > 10
        for n in range(1, calls + 1):
            twin = fs.crash("kill")
            twin.kill_at(twin.io_calls + n)
            # A crash in a recovery thread reaches the caller inside PartitionRecoveryError.
            with pytest.raises((SimulatedCrash, PartitionRecoveryError)):
                LogManager.open(root, CONFIG, fs=twin, clock=clock, progress=False, recovery_threads=1)
            for mode in ("kill", "drop"):
                crashed = twin.crash(mode)  # type: ignore[arg-type]
                why = f"killed at open I/O call {n}/{calls}, {mode}; {crashed.describe()}"
                with LogManager.open(
                    root, CONFIG, fs=crashed, clock=clock, progress=False, recovery_threads=1
                ) as reopened:
                    assert {tp: contents(log) for tp, log in reopened.logs().items()} == before, why


class TestRetention:
    def test_apply_retention_runs_every_partition_and_counts_segments(self, tmp_path: Path) -> None:
        with open_manager(tmp_path) as manager:
            manager.set_topic_config("kept", retention_bytes=None, retention_ms=None)
            manager.set_topic_config("trimmed", retention_bytes=2048)
            for topic in ("kept", "trimmed"):
                for p in range(2):
                    log = manager.log(topic, p)
                    for seq in range(0, 200, 2):
                        log.append(batch(1, seq))
            segments = {tp: len(log.segments) for tp, log in manager.logs().items()}
            deleted = manager.apply_retention(T0)
            after = {tp: len(log.segments) for tp, log in manager.logs().items()}
            assert deleted == sum(segments.values()) - sum(after.values()) > 0
            assert all(after[tp] == segments[tp] for tp in after if tp.topic == "kept")
            assert all(after[tp] < segments[tp] for tp in after if tp.topic == "trimmed")


# A child process that appends through a LogManager to 50 partitions, reports what
# it appended, then waits to be killed with SIGKILL (no close, no flush).
CHILD = textwrap.dedent(
    """
    import json, sys
    from oncelog import LogConfig, LogManager
    from oncelog.segments.batch import encode_batch
    config = LogConfig(segment_bytes=4096, producer_expiration_ms=10**13)
    manager = LogManager.open(sys.argv[1], config, progress=False)
    expected = {}
    for p in range(50):
        log = manager.log("orders", p)
        pid = manager.producer_ids.lease().producer_id
        for seq in range(0, 10 * (p % 5 + 1), 2):
            values = [(b"k", b"v%d" % (seq + i)) for i in range(2)]
            raw = encode_batch(values, producer_id=pid, producer_epoch=0, base_sequence=seq)
            result = log.append(raw)
        if p % 2 == 0:
            log.flush()
        expected[p] = [pid, seq + 1, result.first_offset, result.last_offset, raw.hex()]
    print(json.dumps(expected), flush=True)
    sys.stdin.read()
    """
)


class TestKillAndRestart:
    def test_fifty_partitions_recover_with_producer_state_intact_after_sigkill(self, tmp_path: Path) -> None:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        line = child.stdout.readline()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL
        import json

        expected = json.loads(line)
        assert len(expected) == 50
        config = LogConfig(segment_bytes=4096, producer_expiration_ms=10**13)
        with LogManager.open(tmp_path, config, progress=False) as manager:
            summary = manager.recovery_summary
            assert (summary.partitions, summary.unclean) == (50, 50)
            for p, (pid, last_seq, first, last, raw) in expected.items():
                log = manager.log("orders", int(p), create=False)
                state = log.producer_state(pid)
                assert state is not None and state.last_sequence == last_seq, p
                # The last acknowledged batch, retried, is a duplicate with its original offsets.
                retry = log.append(bytes.fromhex(raw))
                assert retry.duplicate and (retry.first_offset, retry.last_offset) == (first, last), p
                assert log.log_end_offset == last + 1, p
