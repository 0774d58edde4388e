"""Durable appends and group commit (brief §5 "Flush policy"; issue 6).

`Log.append(..., durable=True)` returns only once its batch is fsynced, and
appenders waiting at the same time share one fsync. These tests count the
segment fsyncs through the filesystem seam and make each one slow, so sharing
is visible without timing anything.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from pathlib import Path

import pytest

from oncelog import group_commit
from oncelog.config import LogConfig
from oncelog.errors import LogFailedError, OffsetOutOfRangeError, TruncatedBeforeDurableError
from oncelog.group_commit import CUT_HISTORY, GroupCommit
from oncelog.log import Log
from oncelog.segments.batch import encode_batch
from oncelog.storage.checkpoint import read_recovery_point
from oncelog.storage.fs import DelegatingFileHandle, DelegatingFileSystem, FileHandle
from oncelog.torture.crash_states import CrashMode
from oncelog.torture.faultfs import FaultFileSystem

T0 = 1_700_000_000_000
CONFIG = LogConfig()


def batch(tag: int) -> bytes:
    return encode_batch([(b"k", b"value-%d" % tag)], timestamp_ms=T0)


class _SlowSegmentFsync(DelegatingFileHandle):
    def __init__(self, inner: FileHandle, fs: SlowFsyncFileSystem):
        super().__init__(inner)
        self._fs = fs

    def _slow_sync(self) -> None:
        if self.path.endswith(".log"):
            with self._fs.counter_lock:
                self._fs.segment_fsyncs += 1
                fail = self._fs.fail_fsync
            time.sleep(self._fs.fsync_s)  # a disk's latency: appenders pile up behind it
            if fail:
                raise OSError(errno.EIO, os.strerror(errno.EIO), self.path)

    def fsync(self) -> None:
        self._slow_sync()
        self.inner.fsync()

    def fdatasync(self) -> None:
        self._slow_sync()
        self.inner.fdatasync()


class SlowFsyncFileSystem(DelegatingFileSystem):
    """The real OS, with segment fsyncs counted, slowed down and optionally failing."""

    def __init__(self, fsync_s: float = 0.005):
        super().__init__()
        self.fsync_s = fsync_s
        self.segment_fsyncs = 0
        self.fail_fsync = False
        self.counter_lock = threading.Lock()

    def wrap(self, handle: FileHandle) -> FileHandle:
        return _SlowSegmentFsync(handle, self)


def run_threads(threads: int, work: list[list[bytes]], log: Log) -> list[list[object]]:
    """Each thread appends its batches durably; returns each thread's results or exceptions."""
    results: list[list[object]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads)

    def appender(n: int) -> None:
        start.wait()
        for data in work[n]:
            try:
                results[n].append(log.append(data, durable=True))
            except Exception as exc:  # collected; the caller asserts on it
                results[n].append(exc)

    pool = [threading.Thread(target=appender, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in pool), "a durable appender never returned"
    return results


class TestDurableAppend:
    def test_a_durable_append_costs_one_fdatasync_and_leaves_the_recovery_point_to_its_interval(
        self, tmp_path: Path
    ) -> None:
        fs = SlowFsyncFileSystem(fsync_s=0)
        now = [T0]
        with Log.open(tmp_path / "t-0", CONFIG, fs=fs, clock=lambda: now[0]) as log:
            log.append(batch(0))
            assert fs.segment_fsyncs == 0
            result = log.append(batch(1), durable=True)
            assert fs.segment_fsyncs == 1
            # Durable, but not yet vouched for: the interval has not passed since the open.
            assert log.recovery_point == read_recovery_point(log._store).offset == 0
            now[0] += CONFIG.recovery_point_interval_ms
            later = log.append(batch(2), durable=True)
            assert fs.segment_fsyncs == 2
            assert log.recovery_point == read_recovery_point(log._store).offset == later.last_offset + 1
            assert later.last_offset == result.last_offset + 1

    def test_with_no_interval_every_durable_append_commits_the_recovery_point_past_it(
        self, tmp_path: Path
    ) -> None:
        fs = SlowFsyncFileSystem(fsync_s=0)
        config = LogConfig(recovery_point_interval_ms=0)
        with Log.open(tmp_path / "t-0", config, fs=fs, clock=lambda: T0) as log:
            result = log.append(batch(1), durable=True)
            assert fs.segment_fsyncs == 1
            assert log.recovery_point == read_recovery_point(log._store).offset == result.last_offset + 1

    def test_checkpoint_commits_what_the_last_flush_fsynced_and_nothing_past_it(self, tmp_path: Path) -> None:
        fs = SlowFsyncFileSystem(fsync_s=0)
        with Log.open(tmp_path / "t-0", CONFIG, fs=fs, clock=lambda: T0) as log:
            durable = log.append(batch(1), durable=True)
            log.append(batch(2))  # not fsynced: the point must not pass it
            assert log.checkpoint()
            assert read_recovery_point(log._store).offset == durable.last_offset + 1
            assert not log.checkpoint()  # nothing new fsynced
            assert fs.segment_fsyncs == 1

    def test_a_checkpoint_due_only_waits_out_the_interval_since_the_last_commit(self, tmp_path: Path) -> None:
        now = [T0]
        with Log.open(tmp_path / "t-0", CONFIG, clock=lambda: now[0]) as log:
            log.append(batch(1), durable=True)
            assert not log.checkpoint(due_only=True)
            now[0] += CONFIG.recovery_point_interval_ms - 1
            assert not log.checkpoint(due_only=True)
            now[0] += 1
            assert log.checkpoint(due_only=True)
            assert read_recovery_point(log._store).offset == 1

    def test_checkpoint_after_a_truncation_below_the_fsynced_end_never_commits_the_old_end(
        self, tmp_path: Path
    ) -> None:
        with Log.open(tmp_path / "t-0", CONFIG, clock=lambda: T0) as log:
            log.append(batch(1))
            log.append(batch(2), durable=True)  # fsynced to 2; the point stays at 0
            log.truncate_to(1)  # reloads, which fsyncs what it keeps and commits the point there
            assert not log.checkpoint()
            assert read_recovery_point(log._store).offset == log.log_end_offset == 1

    def test_a_durable_append_of_data_already_fsynced_takes_no_fsync(self, tmp_path: Path) -> None:
        fs = SlowFsyncFileSystem(fsync_s=0)
        with Log.open(tmp_path / "t-0", CONFIG, fs=fs) as log:
            log.append(batch(0), durable=True)
            retry = encode_batch(
                [(b"k", b"v")], producer_id=7, producer_epoch=0, base_sequence=0, timestamp_ms=T0
            )
            first = log.append(retry, durable=True)
            fsyncs = fs.segment_fsyncs
            again = log.append(retry, durable=True)  # a duplicate: its original is already durable
            assert again.duplicate and again.first_offset == first.first_offset
            assert fs.segment_fsyncs == fsyncs

    def test_acknowledged_durable_appends_survive_power_loss_on_the_twin(self) -> None:
        fs = FaultFileSystem(11)
        log = Log.open("/d/t-0", CONFIG, fs=fs, clock=lambda: T0)
        durable = [log.append(batch(n), durable=True) for n in range(20)]
        for n in range(20, 30):
            log.append(batch(n))  # not durable: power loss may take these
        crashed = fs.crash("drop")
        reopened = Log.open("/d/t-0", CONFIG, fs=crashed, clock=lambda: T0)
        assert reopened.log_end_offset >= durable[-1].last_offset + 1
        fetched = reopened.read(0, max_bytes=1 << 20)
        values = [record.value for record in fetched.records()]
        assert values[:20] == [b"value-%d" % n for n in range(20)]
        reopened.close()

    @pytest.mark.parametrize("mode", ["kill", "drop", "torn", "dirent"])
    @pytest.mark.parametrize("seed", range(8))
    def test_durable_appends_mixed_with_others_and_rolls_survive_every_power_loss_class(
        self, seed: int, mode: CrashMode
    ) -> None:
        # fdatasync, not fsync, makes a durable append durable: the twin drops whatever a
        # data sync does not cover.
        rng = random.Random(seed)
        fs = FaultFileSystem(seed)
        log = Log.open("/d/t-0", CONFIG, fs=fs, clock=lambda: T0)
        durable_end = 0
        for n in range(rng.randrange(10, 40)):
            result = log.append(batch(n), durable=rng.random() < 0.6)
            if n and rng.random() < 0.05:
                log.roll()
            durable_end = max(durable_end, log._group_commit.durable_end_offset)
            assert result.first_offset == n
        stored_point = log.recovery_point
        crashed = fs.crash(mode)
        reopened = Log.open("/d/t-0", CONFIG, fs=crashed, clock=lambda: T0)
        try:
            assert reopened.log_end_offset >= durable_end, (fs.describe(), stored_point)
            values: list[bytes | None] = []
            while len(values) < reopened.log_end_offset:
                values += [record.value for record in reopened.read(len(values), max_bytes=1 << 20).records()]
            # A prefix of what was written, holding everything acknowledged as durable.
            assert values == [b"value-%d" % n for n in range(len(values))]
            assert len(values) >= durable_end
        finally:
            reopened.close()


class TestGroupCommit:
    def test_sixteen_durable_appenders_share_fsyncs(self, tmp_path: Path) -> None:
        fs = SlowFsyncFileSystem(fsync_s=0.005)
        threads, per_thread = 16, 20
        work = [[batch(n * 1000 + k) for k in range(per_thread)] for n in range(threads)]
        with Log.open(tmp_path / "t-0", CONFIG, fs=fs) as log:
            results = run_threads(threads, work, log)
            offsets = sorted(r.first_offset for rs in results for r in rs)  # type: ignore[attr-defined]
            assert offsets == list(range(threads * per_thread))
            # One thread per fsync would need 320; sharing needs about one per round of 16.
            assert fs.segment_fsyncs <= threads * per_thread // 4, fs.segment_fsyncs
            assert log._group_commit.durable_end_offset == threads * per_thread

    def test_a_leader_delays_its_sync_only_when_others_append_durably_beside_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        delays: list[float] = []
        monkeypatch.setattr(group_commit.time, "sleep", delays.append)  # records every sleep; none is real
        with Log.open(tmp_path / "alone", CONFIG) as log:
            for n in range(20):
                log.append(batch(n), durable=True)
        assert delays == []  # an appender alone waits for nobody
        fs = SlowFsyncFileSystem(fsync_s=0.005)
        with Log.open(tmp_path / "together", CONFIG, fs=fs) as log:
            run_threads(8, [[batch(n * 100 + k) for k in range(10)] for n in range(8)], log)
        assert group_commit.COMMIT_DELAY_S in delays  # (the slow disk's own sleeps are the others)

    def test_a_failed_group_fsync_fails_its_waiters_and_closes_the_log_to_appends(
        self, tmp_path: Path
    ) -> None:
        fs = SlowFsyncFileSystem(fsync_s=0.005)
        log = Log.open(tmp_path / "t-0", CONFIG, fs=fs)
        log.append(batch(0), durable=True)
        fs.fail_fsync = True
        results = run_threads(8, [[batch(n)] for n in range(8)], log)
        outcomes = [r for rs in results for r in rs]
        # No append was acknowledged as durable: every waiter saw the failure.
        assert all(isinstance(outcome, LogFailedError) for outcome in outcomes), outcomes
        fs.fail_fsync = False
        with pytest.raises(LogFailedError):
            log.append(batch(99))  # fail closed: a later fsync may lie (fsyncgate)
        with pytest.raises(LogFailedError, match="without a flush"):
            log.close()  # it lets go of everything, and says nothing was made durable
        with Log.open(tmp_path / "t-0", CONFIG) as reopened:
            assert reopened.read(0).batches[0].records_count == 1

    def test_close_while_appenders_wait_acknowledges_only_what_it_flushed(self, tmp_path: Path) -> None:
        fs = SlowFsyncFileSystem(fsync_s=0.01)
        log = Log.open(tmp_path / "t-0", CONFIG, fs=fs)
        work = [[batch(n * 100 + k) for k in range(10)] for n in range(4)]
        closer = threading.Timer(0.03, log.close)
        closer.start()
        results = run_threads(4, work, log)
        closer.join()
        acknowledged = [r for rs in results for r in rs if not isinstance(r, Exception)]
        with Log.open(tmp_path / "t-0", CONFIG) as reopened:
            for result in acknowledged:
                assert result.last_offset < reopened.log_end_offset  # type: ignore[attr-defined]


def test_a_waiter_whose_batch_a_truncation_cut_is_told_not_acknowledged() -> None:
    commit = GroupCommit(durable_end_offset=10)
    cuts = commit.cuts  # noted before the waiter's batch (offsets 10..14) was appended
    commit.truncated(12)  # a follower cut back to 12 before the flush
    flushed: list[int] = []

    def flush() -> None:
        flushed.append(1)
        commit.mark_durable(15)  # offsets 12..14 now hold other batches, fsynced

    with pytest.raises(TruncatedBeforeDurableError):
        commit.wait(15, flush, "t-0", cuts=cuts)
    assert flushed == []
    commit.wait(15, flush, "t-0", cuts=commit.cuts)  # a batch appended after the cut is fine


def test_a_waiter_that_arrives_after_a_cut_and_a_later_flush_is_told_not_acknowledged() -> None:
    # The appender was descheduled between its append and its wait: meanwhile a
    # truncation cut its batch, other batches took its offsets, and a flush made them
    # durable. The durable end is past its batch, but the bytes there are not its own.
    commit = GroupCommit(durable_end_offset=5)
    cuts = commit.cuts  # noted before the waiter's batch (offset 5) was appended
    commit.truncated(5)
    commit.mark_durable(8)

    with pytest.raises(TruncatedBeforeDurableError):
        commit.wait(6, lambda: None, "t-0", cuts=cuts)


def test_a_cut_above_the_waiters_batch_does_not_refuse_it() -> None:
    commit = GroupCommit(durable_end_offset=0)
    cuts = commit.cuts  # the waiter's batch is offsets 0..4
    commit.mark_durable(9)
    commit.truncated(7)  # cut offsets 7..8: the waiter's batch is untouched
    commit.wait(5, lambda: None, "t-0", cuts=cuts)


def test_a_waiter_older_than_the_remembered_cuts_is_refused_rather_than_trusted() -> None:
    commit = GroupCommit(durable_end_offset=0)
    cuts = commit.cuts
    for _ in range(CUT_HISTORY + 1):
        commit.truncated(100)  # every cut above the batch, but the oldest is forgotten
    commit.mark_durable(200)
    with pytest.raises(TruncatedBeforeDurableError):
        commit.wait(5, lambda: None, "t-0", cuts=cuts)
    cuts = commit.cuts - CUT_HISTORY
    commit.wait(5, lambda: None, "t-0", cuts=cuts)  # all remembered: all above the batch


def test_a_durable_append_descheduled_before_its_wait_is_not_acknowledged_after_a_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    appended = threading.Event()
    resume = threading.Event()
    original_wait = GroupCommit.wait

    def descheduled_wait(self: GroupCommit, *args: object, **kwargs: object) -> None:
        if threading.current_thread().name == "appender":
            appended.set()
            resume.wait(10)
        original_wait(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(GroupCommit, "wait", descheduled_wait)
    with Log.open(tmp_path / "t-0", CONFIG) as log:
        for n in range(5):
            log.append(batch(n))
        log.flush()
        outcome: list[object] = []

        def append_durably() -> None:
            try:
                outcome.append(log.append(batch(99), durable=True))
            except TruncatedBeforeDurableError as exc:
                outcome.append(exc)

        appender = threading.Thread(target=append_durably, name="appender")
        appender.start()
        assert appended.wait(10)
        log.truncate_to(5)  # the appender's batch (offset 5) is cut
        for n in range(3):
            log.append(batch(100 + n))  # offsets 5..7 now hold other batches
        log.flush()
        resume.set()
        appender.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], TruncatedBeforeDurableError)
        [record] = [r for r in log.read(5).records() if r.offset == 5]
        assert record.value == b"value-100"


def test_waiting_for_offsets_past_the_log_end_is_refused_at_once(tmp_path: Path) -> None:
    with Log.open(tmp_path / "t-0", CONFIG) as log:
        log.append(batch(1))
        with pytest.raises(OffsetOutOfRangeError):
            log.wait_durable(5)
        log.wait_durable(1)
