"""LogLoader: snapshots on roll, unclean recovery of the tail only, damaged tails (issue 3, brief §5).

Mirrors recovery/loader.py; test names follow Kafka's LogLoaderTest. A crash is
simulated by copying the partition directory while its Log is still open (the
copy holds exactly what the page cache held, and no clean-shutdown marker), or by
a child process that calls os._exit without closing. Producer state after
recovery is compared with a replay of the recovered .log files done here, header
by header with `iter_batches`, independently of the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import random
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from doubles import FsyncFailingFileSystem

from oncelog.config import LogConfig
from oncelog.errors import CorruptLogError, LogDirLockedError, LogFailedError
from oncelog.log import Log
from oncelog.results import AppendResult
from oncelog.segments import RecordBatch, encode_batch, iter_batches
from oncelog.storage import snapshot as snapshots
from oncelog.storage.checkpoint import RECOVERY_POINT_KEY, read_offset
from oncelog.storage.fs import (
    DelegatingFileSystem,
    FileHandle,
    MetadataStore,
    OsFileSystem,
)

T0 = 1_700_000_000_000
HEADER_SIZE = 61
LENGTH_AT = 8
# baseOffset, batchLength, partitionLeaderEpoch and magic: all zeros only where nothing was written.
UNWRITTEN_HEADER = 17
WINDOW = 5
MARKER = ".clean_shutdown"

# ~2 KiB segments of ~150-byte batches: a dozen batches per segment, no index
# entries (the interval is 4 KiB), so the whole active segment is the tail.
# Batch timestamps here are pinned to 2023 and the Kafka fixtures date from 2024, while
# the logs run on the wall clock with Kafka's default expiration: expiry reads the
# engine's clock, so no producer here expires.
# Every flush commits its recovery point (recovery_point_interval_ms=0): these tests damage
# bytes a flush vouched for, which must be reported. A lagging point: TestALaggingRecoveryPoint.
CONFIG = LogConfig(segment_bytes=2048, segment_index_bytes=4096, recovery_point_interval_ms=0)


# -- producers and batches ------------------------------------------------------------
@dataclass
class Sent:
    producer_id: int
    producer_epoch: int
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    data: bytes


@dataclass
class Producers:
    """Idempotent producers with their next sequence; remembers every batch sent."""

    epochs: dict[int, int] = field(default_factory=dict)
    sequences: dict[int, int] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)

    def batch(self, pid: int, count: int = 1, value_size: int = 60, timestamp_ms: int = T0) -> bytes:
        seq = self.sequences.get(pid, 0)
        records = [
            (f"k{pid}-{seq + i}".encode(), bytes([(pid + seq + i) % 256]) * value_size) for i in range(count)
        ]
        return encode_batch(
            records,
            producer_id=pid,
            producer_epoch=self.epochs.setdefault(pid, 0),
            base_sequence=seq,
            timestamp_ms=timestamp_ms,
        )

    def append(self, log: Log, pid: int, count: int = 1, value_size: int = 60) -> AppendResult:
        seq = self.sequences.get(pid, 0)
        data = self.batch(pid, count, value_size, T0 + len(self.sent))
        result = log.append(data)
        assert not result.duplicate
        self.sequences[pid] = seq + count
        self.sent.append(
            Sent(pid, self.epochs[pid], seq, seq + count - 1, result.first_offset, result.last_offset, data)
        )
        return result

    def bump_epoch(self, pid: int) -> None:
        self.epochs[pid] = self.epochs.get(pid, 0) + 1
        self.sequences[pid] = 0

    def workload(
        self, log: Log, rng: random.Random, batches: int, pids: Sequence[int] = (11, 12, 13)
    ) -> None:
        for _ in range(batches):
            pid = rng.choice(pids)
            if rng.random() < 0.05:
                self.bump_epoch(pid)
            self.append(log, pid, rng.randint(1, 3), rng.randint(20, 60))


# -- producer state, from the engine and from an independent replay --------------------------
State = dict[int, tuple[int, int, int, int, tuple[tuple[int, int, int, int, int], ...]]]


def engine_state(log: Log) -> State:
    """pid -> (epoch, last sequence, last offset, last batch timestamp, window) as the Log reports it."""
    return {
        e.producer_id: (
            e.producer_epoch,
            e.last_sequence,
            e.last_offset,
            e.last_timestamp_ms,
            tuple(tuple(b) for b in e.batches),
        )
        for e in log.producers()
    }


def replay_state(directory: Path) -> State:
    """The same, by replaying every batch of every .log file from offset 0 (brief §4 rules)."""
    epochs: dict[int, int] = {}
    windows: dict[int, list[tuple[int, int, int, int, int]]] = {}
    activity: dict[int, int] = {}
    for log_file in sorted(directory.glob("*.log")):
        # A crash image's active segment is pre-allocated past its data: stop at the zeros.
        for batch in iter_batches(log_file.read_bytes(), until_unwritten=True):
            pid = batch.producer_id
            if pid < 0:
                continue
            if epochs.get(pid) != batch.producer_epoch:
                epochs[pid] = batch.producer_epoch
                windows[pid] = []
            # Kafka's lastTimestamp: the newest batch's, even if an older one had a later time.
            activity[pid] = batch.max_timestamp
            if batch.is_control:
                continue
            window = windows[pid]
            window.append(
                (
                    batch.base_sequence,
                    batch.last_sequence,
                    batch.base_offset,
                    batch.last_offset,
                    batch.max_timestamp,
                )
            )
            del window[:-WINDOW]
    state: State = {}
    for pid, window in windows.items():
        last = window[-1] if window else (-1, -1, -1, -1, -1)
        state[pid] = (epochs[pid], last[1], last[3], activity[pid], tuple(window))
    return state


def full_replay_by_engine(directory: Path, scratch: Path) -> State:
    """The engine's own full replay: a copy without any snapshot must replay from offset 0."""
    shutil.copytree(directory, scratch)
    for snapshot_file in scratch.glob("*.snapshot"):
        snapshot_file.unlink()
    with Log.open(scratch, CONFIG) as replayed:
        assert replayed.recovery_report.snapshot_offset is None
        return engine_state(replayed)


# -- files --------------------------------------------------------------------------
def crash_copy(source: Path, target: Path) -> Path:
    """What a crash (kill -9) leaves: every file as the page cache holds it, no marker."""
    shutil.copytree(source, target)
    assert not (target / MARKER).exists()
    return target


def segment_path(directory: Path, base: int) -> Path:
    return directory / f"{base:020d}.log"


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}.snapshot"


def snapshot_offsets(directory: Path) -> list[int]:
    return sorted(int(p.name[:20]) for p in directory.glob("*.snapshot"))


def batch_positions(log_file: Path) -> list[tuple[int, int, int]]:
    """(position, size, base offset) of every batch in a .log file, walked by length field.

    The walk ends at the first all-zero header: an open (or crashed) log's active
    segment file is pre-allocated past its data, and that space is zeros.
    """
    data = log_file.read_bytes()
    out = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + UNWRITTEN_HEADER] == bytes(UNWRITTEN_HEADER):
            break
        size = int.from_bytes(data[pos + LENGTH_AT : pos + LENGTH_AT + 4], "big") + 12
        out.append((pos, size, int.from_bytes(data[pos : pos + 8], "big", signed=True)))
        pos += size
    return out


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x5A
    path.write_bytes(bytes(data))


def read_everything(log: Log) -> list[RecordBatch]:
    out: list[RecordBatch] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset)
        assert fetched.batches, f"nothing read at {offset} below {log.log_end_offset}"
        out.extend(fetched.batches)
        offset = fetched.next_offset
    return out


def copy_fixture(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    shutil.copytree(source, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return target


def fixtures_root() -> Path:
    configured = os.environ.get("ONCELOG_FIXTURES")
    if configured:
        return Path(configured)
    # tests/recovery/<this file> -> repo -> its parent holds shared/fixtures/kafka.
    return Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "kafka"


FIXTURES = fixtures_root()


def fixture_partition_params() -> list[object]:
    found = sorted({p.parent for p in FIXTURES.glob("*/*/*.log")}) if FIXTURES.is_dir() else []
    if not found:
        return [pytest.param(None, id="fixtures-missing")]
    return [pytest.param(p, id=str(p.relative_to(FIXTURES))) for p in found]


# -- a log with several segments, shared by many tests ---------------------------------
@dataclass
class OpenLog:
    log: Log
    directory: Path
    producers: Producers


@pytest.fixture
def rolled(tmp_path: Path) -> Iterator[OpenLog]:
    """An open log of ~5 segments and 3 producers, flushed: the recovery point is the end."""
    directory = tmp_path / "topic-0"
    log = Log.open(directory, CONFIG)
    producers = Producers()
    producers.workload(log, random.Random(3), 50)
    log.flush()
    assert len(log.segments) >= 4
    try:
        yield OpenLog(log, directory, producers)
    finally:
        log.close()


# -- snapshots -----------------------------------------------------------------------
class TestProducerSnapshots:
    def test_a_snapshot_is_written_at_every_segment_base_on_roll(self, rolled: OpenLog) -> None:
        bases = [segment.base_offset for segment in rolled.log.segments]
        assert set(bases) <= set(snapshot_offsets(rolled.directory))
        assert not list(rolled.directory.glob("*.tmp"))

    def test_each_roll_snapshot_holds_the_state_as_of_its_base(self, rolled: OpenLog) -> None:
        for segment in rolled.log.segments[1:]:
            rows = snapshots.read_snapshot(OsFileSystem(), str(rolled.directory), segment.base_offset)
            last_offsets = {int(r["producer_id"]): int(r["last_offset"][r["window_count"] - 1]) for r in rows}
            sent_before = [s for s in rolled.producers.sent if s.last_offset < segment.base_offset]
            expected: dict[int, int] = {}
            for s in sent_before:
                expected[s.producer_id] = s.last_offset
            assert last_offsets == expected, segment.base_offset

    def test_close_writes_a_snapshot_at_the_log_end(self, rolled: OpenLog) -> None:
        end = rolled.log.log_end_offset
        expected = engine_state(rolled.log)
        rolled.log.close()
        assert snapshot_path(rolled.directory, end).exists()
        with Log.open(rolled.directory, CONFIG) as reopened:
            report = reopened.recovery_report
            assert report.clean
            assert report.snapshot_offset == end
            assert (report.segments_scanned, report.batches_replayed) == (0, 0)
            assert engine_state(reopened) == expected

    def test_stray_snapshots_and_tmp_files_are_removed_at_load(self, rolled: OpenLog) -> None:
        rolled.log.close()
        rows = snapshots.read_snapshot(OsFileSystem(), str(rolled.directory), rolled.log.log_end_offset)
        snapshots.write_snapshot(OsFileSystem(), str(rolled.directory), 3, rows[:0])
        (rolled.directory / "00000000000000000005.snapshot.tmp").write_bytes(b"half")
        with Log.open(rolled.directory, CONFIG) as reopened:
            keep = {s.base_offset for s in reopened.segments} | {reopened.log_end_offset}
            assert set(snapshot_offsets(rolled.directory)) <= keep
            assert 3 not in snapshot_offsets(rolled.directory)
            assert not list(rolled.directory.glob("*.tmp"))


# -- unclean reopen ----------------------------------------------------------------------
class TestRecoveryAfterUncleanShutdown:
    def test_copy_while_open_recovers_state_equal_to_a_full_replay_scanning_one_segment(
        self, rolled: OpenLog, tmp_path: Path
    ) -> None:
        active_base = rolled.log.active_segment.base_offset
        assert snapshot_path(rolled.directory, active_base).exists()
        end = rolled.log.log_end_offset
        data_size = rolled.log.active_segment.size
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        # The open active segment's file runs past its data into pre-allocated zeros.
        file_size = segment_path(copy, active_base).stat().st_size
        assert file_size > data_size
        expected = replay_state(copy)
        engine_reference = full_replay_by_engine(copy, tmp_path / "no-snapshots")
        assert engine_reference == expected
        with Log.open(copy, CONFIG) as recovered:
            report = recovered.recovery_report
            assert report.clean is False
            assert report.segments_scanned == 1
            assert report.snapshot_offset == active_base
            assert (report.truncated_bytes, report.tail_error) == (0, None)
            assert report.zero_tail_bytes == file_size - data_size
            assert report.bytes_scanned == data_size
            assert segment_path(copy, active_base).stat().st_size == data_size
            assert recovered.log_end_offset == end
            assert engine_state(recovered) == expected

    def test_unflushed_appends_survive_a_process_crash(self, rolled: OpenLog, tmp_path: Path) -> None:
        producers = rolled.producers
        for pid in (11, 12, 13, 14):
            producers.append(rolled.log, pid, 2)
        assert rolled.log.recovery_point < rolled.log.log_end_offset
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        with Log.open(copy, CONFIG) as recovered:
            assert recovered.log_end_offset == rolled.log.log_end_offset
            assert recovered.recovery_report.segments_scanned == 1
            assert engine_state(recovered) == replay_state(copy) == engine_state(rolled.log)

    def test_recovered_log_reads_back_every_batch_byte_for_byte(
        self, rolled: OpenLog, tmp_path: Path
    ) -> None:
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        with Log.open(copy, CONFIG) as recovered:
            batches = read_everything(recovered)
        sent = rolled.producers.sent
        assert [(b.base_offset, b.last_offset) for b in batches] == [
            (s.first_offset, s.last_offset) for s in sent
        ]
        # Only the 8-byte base offset differs from what the client sent.
        assert [bytes(b.buffer[8:]) for b in batches] == [s.data[8:] for s in sent]

    def test_retries_of_each_producers_last_five_batches_are_duplicates_after_recovery(
        self, rolled: OpenLog, tmp_path: Path
    ) -> None:
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        with Log.open(copy, CONFIG) as recovered:
            end = recovered.log_end_offset
            for pid in (11, 12, 13):
                epoch = rolled.producers.epochs[pid]
                last_five = [
                    s for s in rolled.producers.sent if s.producer_id == pid and s.producer_epoch == epoch
                ]
                for s in last_five[-WINDOW:]:
                    result = recovered.append(s.data)
                    assert result.duplicate, (pid, s.first_sequence)
                    assert (result.first_offset, result.last_offset) == (s.first_offset, s.last_offset)
            assert recovered.log_end_offset == end

    def test_appends_continue_after_recovery_with_the_next_sequence(
        self, rolled: OpenLog, tmp_path: Path
    ) -> None:
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        end = rolled.log.log_end_offset
        with Log.open(copy, CONFIG) as recovered:
            result = rolled.producers.append(recovered, 12, 2)
            assert (result.first_offset, result.last_offset) == (end, end + 1)

    def test_a_child_process_that_exits_without_close_loses_no_appended_batch(self, tmp_path: Path) -> None:
        directory = tmp_path / "topic-0"
        child = r"""
import json, os, sys
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments import encode_batch
config = LogConfig(segment_bytes=2048, segment_index_bytes=4096)
log = Log.open(sys.argv[1], config)
sequences = {}
for i in range(int(sys.argv[2])):
    pid, count = 500 + i % 4, 1 + i % 3
    seq = sequences.get(pid, 0)
    records = [(b"k%d-%d" % (i, n), b"v" * 70) for n in range(count)]
    batch = encode_batch(records, producer_id=pid, producer_epoch=1, base_sequence=seq, timestamp_ms=1000 + i)
    result = log.append(batch)
    sequences[pid] = seq + count
    print(json.dumps([pid, seq, result.first_offset, result.last_offset]), flush=True)
    if i == 30:
        log.flush()
os._exit(0)
"""
        done = subprocess.run(
            [sys.executable, "-c", child, str(directory), "45"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        appended = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(appended) == 45
        assert not (directory / MARKER).exists()
        expected = replay_state(directory)
        with Log.open(directory, CONFIG) as recovered:
            report = recovered.recovery_report
            assert report.clean is False
            assert len(recovered.segments) > 1
            assert snapshot_path(directory, recovered.active_segment.base_offset).exists()
            assert report.segments_scanned == 1
            assert report.snapshot_offset == recovered.active_segment.base_offset
            assert recovered.log_end_offset == appended[-1][3] + 1
            assert engine_state(recovered) == expected
            for pid, seq, first, last in appended:
                batch = recovered.read(first).batches[0]
                assert (batch.base_offset, batch.last_offset) == (first, last)
                assert (batch.producer_id, batch.base_sequence) == (pid, seq)
            last_of = {pid: (seq, last) for pid, seq, _, last in appended}
            for pid, (seq, last) in last_of.items():
                entry = recovered.producer_state(pid)
                assert entry is not None
                assert entry.last_offset == last
                assert entry.batches[-1].first_sequence == seq

    def test_a_crash_right_after_a_roll_recovers_from_the_roll_snapshot_reading_nothing(
        self, rolled: OpenLog, tmp_path: Path
    ) -> None:
        rolled.log.roll()
        base = rolled.log.active_segment.base_offset
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        with Log.open(copy, CONFIG) as recovered:
            report = recovered.recovery_report
            assert (report.snapshot_offset, report.segments_scanned) == (base, 1)
            assert (report.bytes_scanned, report.batches_replayed) == (0, 0)
            assert recovered.log_end_offset == base
            assert engine_state(recovered) == replay_state(copy)

    @pytest.mark.parametrize("crash_on", ["rename", "store"])
    def test_a_crash_during_recovery_then_recovery_again_gives_the_same_log(
        self, rolled: OpenLog, tmp_path: Path, crash_on: str
    ) -> None:
        rolled.producers.append(rolled.log, 13, 2)  # unflushed
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        active = segment_path(copy, rolled.log.active_segment.base_offset)
        with active.open("ab") as f:
            f.write(bytes(500))
        fs = _CrashingFileSystem(crash_on)
        with pytest.raises(LogFailedError, match="simulated crash"):
            Log.open(copy, CONFIG, fs=fs)
        with Log.open(copy, CONFIG) as recovered:
            assert recovered.recovery_report.clean is False
            assert recovered.log_end_offset == rolled.log.log_end_offset
            assert engine_state(recovered) == engine_state(rolled.log) == replay_state(copy)

    def test_a_second_crash_right_after_recovery_loses_nothing_recovery_exposed(
        self, rolled: OpenLog, tmp_path: Path
    ) -> None:
        rolled.producers.append(rolled.log, 11, 3)  # unflushed
        first = crash_copy(rolled.directory, tmp_path / "first")
        with Log.open(first, CONFIG) as recovered:
            end = recovered.log_end_offset
            state = engine_state(recovered)
            second = crash_copy(first, tmp_path / "second")
        with Log.open(second, CONFIG) as again:
            assert again.recovery_report.clean is False
            assert again.log_end_offset == end
            assert engine_state(again) == state
            assert engine_state(again) == replay_state(second)


# -- snapshot fallback -----------------------------------------------------------------
def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _corrupt(path: Path) -> None:
    flip_byte(path, path.stat().st_size - 3)


class TestSnapshotFallback:
    @pytest.mark.parametrize("damage", [_truncate, _empty, _corrupt], ids=["truncated", "empty", "corrupt"])
    def test_a_bad_newest_snapshot_falls_back_to_the_next_older_one(
        self, rolled: OpenLog, tmp_path: Path, damage: Callable[[Path], None]
    ) -> None:
        bases = [s.base_offset for s in rolled.log.segments]
        newest, older = bases[-1], bases[-2]
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        bad = snapshot_path(copy, newest)
        damage(bad)
        bad_bytes = bad.read_bytes()
        expected = replay_state(copy)
        with Log.open(copy, CONFIG) as recovered:
            report = recovered.recovery_report
            assert report.snapshot_offset == older
            assert engine_state(recovered) == expected
            assert recovered.log_end_offset == rolled.log.log_end_offset
        set_aside = copy / (bad.name + ".corrupt")
        assert set_aside.read_bytes() == bad_bytes
        assert not bad.exists()

    def test_all_snapshots_bad_means_a_full_replay(self, rolled: OpenLog, tmp_path: Path) -> None:
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        for snapshot_file in copy.glob("*.snapshot"):
            _corrupt(snapshot_file)
        expected = replay_state(copy)
        with Log.open(copy, CONFIG) as recovered:
            assert recovered.recovery_report.snapshot_offset is None
            assert engine_state(recovered) == expected
        assert len(list(copy.glob("*.snapshot.corrupt"))) == len(rolled.log.segments)

    def test_a_clean_close_snapshot_that_is_corrupt_falls_back_to_the_active_segment_base(
        self, rolled: OpenLog
    ) -> None:
        expected = engine_state(rolled.log)
        end = rolled.log.log_end_offset
        active_base = rolled.log.active_segment.base_offset
        rolled.log.close()
        _corrupt(snapshot_path(rolled.directory, end))
        with Log.open(rolled.directory, CONFIG) as reopened:
            assert reopened.recovery_report.snapshot_offset == active_base
            assert engine_state(reopened) == expected


def test_a_snapshot_naming_one_producer_twice_is_set_aside_and_every_producer_still_dedupes(
    tmp_path: Path,
) -> None:
    # Its CRC is right, so only the pid map's load notices. Everything that load placed
    # before it noticed must go: a stale key would hand a replayed producer a slot outside
    # the ring, and that producer would be forgotten at the next snapshot.
    config = LogConfig(producer_capacity=1000)
    directory = tmp_path / "log"

    def batch(pid: int) -> bytes:
        return encode_batch([(b"k", b"v")], producer_id=pid, producer_epoch=0, base_sequence=0)

    with Log.open(directory, config) as log:
        first = {pid: log.append(batch(pid)).first_offset for pid in range(100, 140)}
        end = log.log_end_offset
    path = snapshot_path(directory, end)
    rows = snapshots.decode_snapshot(path.read_bytes(), end).copy()
    rows["producer_id"][-1] = rows["producer_id"][0]
    path.write_bytes(snapshots.encode_snapshot(end, rows))
    for _ in range(2):  # the open that sets it aside, then a clean reopen of what that wrote
        with Log.open(directory, config) as log:
            assert len(list(log.producers())) == 40
            retries = {pid: log.append(batch(pid)) for pid in first}
            assert {pid: (r.first_offset, r.duplicate) for pid, r in retries.items()} == {
                pid: (offset, True) for pid, offset in first.items()
            }
    assert (directory / (path.name + ".corrupt")).exists()


class TestSnapshotPastTheLogEnd:
    def test_a_valid_snapshot_at_a_later_offset_than_the_log_end_is_ignored(
        self, rolled: OpenLog, tmp_path: Path
    ) -> None:
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        active_base = rolled.log.active_segment.base_offset
        rows = snapshots.read_snapshot(OsFileSystem(), str(copy), active_base)
        far = rolled.log.log_end_offset + 1000
        snapshots.write_snapshot(OsFileSystem(), str(copy), far, rows)
        expected = replay_state(copy)
        with Log.open(copy, CONFIG) as recovered:
            report = recovered.recovery_report
            assert report.snapshot_offset is not None
            assert report.snapshot_offset <= recovered.log_end_offset
            assert engine_state(recovered) == expected
        assert far not in snapshot_offsets(copy)

    def test_a_valid_snapshot_past_the_log_end_is_ignored_on_a_clean_open_too(self, rolled: OpenLog) -> None:
        expected = engine_state(rolled.log)
        end = rolled.log.log_end_offset
        rolled.log.close()
        older = rolled.log.segments[1].base_offset
        rows = snapshots.read_snapshot(OsFileSystem(), str(rolled.directory), older)
        snapshots.write_snapshot(OsFileSystem(), str(rolled.directory), end + 5, rows)
        with Log.open(rolled.directory, CONFIG) as reopened:
            assert reopened.recovery_report.snapshot_offset == end
            assert engine_state(reopened) == expected
        assert end + 5 not in snapshot_offsets(rolled.directory)

    def test_a_snapshot_past_a_log_cut_short_under_it_is_ignored(self, rolled: OpenLog) -> None:
        log = rolled.log
        active_base = log.active_segment.base_offset
        end = log.log_end_offset
        log.close()
        assert snapshot_path(rolled.directory, end).exists()
        # The active segment loses its last two batches; the snapshot at the old end now lies.
        active = segment_path(rolled.directory, active_base)
        positions = batch_positions(active)
        assert len(positions) >= 3
        cut_at, _, new_end = positions[-2]
        with active.open("r+b") as f:
            f.truncate(cut_at)
        (rolled.directory / MARKER).unlink()
        expected = replay_state(rolled.directory)
        # Those batches were fsynced (close flushed them): losing them is corruption,
        # reported by default; the snapshot past the cut is then ignored on request.
        with pytest.raises(CorruptLogError):
            Log.open(rolled.directory, CONFIG)
        truncating = dataclasses.replace(CONFIG, on_corruption="truncate")
        with Log.open(rolled.directory, truncating) as reopened:
            assert reopened.log_end_offset == new_end
            report = reopened.recovery_report
            assert report.snapshot_offset is not None and report.snapshot_offset <= new_end
            assert engine_state(reopened) == expected
        assert end not in snapshot_offsets(rolled.directory)


# -- damaged tails -------------------------------------------------------------------------
def _garbage(good_next: bytes) -> bytes:
    return random.Random(7).randbytes(777)


def _zeros(good_next: bytes) -> bytes:
    return bytes(4096)


def _torn_batch(good_next: bytes) -> bytes:
    return good_next[: len(good_next) // 2]


def _header_only(good_next: bytes) -> bytes:
    return good_next[:HEADER_SIZE]


def _bad_crc_batch(good_next: bytes) -> bytes:
    out = bytearray(good_next)
    out[-1] ^= 0xFF
    return bytes(out)


def _good_then_zeros(good_next: bytes) -> bytes:
    # A whole valid batch whose bytes happen to be on disk, then zeros: the batch is kept.
    return good_next + bytes(100)


TAILS = [
    pytest.param(_garbage, 0, id="random-garbage"),
    pytest.param(_zeros, 0, id="zeros"),
    pytest.param(_torn_batch, 0, id="torn-batch"),
    pytest.param(_header_only, 0, id="header-only"),
    pytest.param(_bad_crc_batch, 0, id="bad-crc-batch"),
    pytest.param(_good_then_zeros, 1, id="whole-batch-then-zeros"),
]


class TestDamagedTail:
    @pytest.mark.parametrize(("damage", "kept_batches"), TAILS)
    def test_a_damaged_tail_is_truncated_to_exactly_the_last_good_batch(
        self, rolled: OpenLog, tmp_path: Path, damage: Callable[[bytes], bytes], kept_batches: int
    ) -> None:
        end = rolled.log.log_end_offset
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        active = segment_path(copy, rolled.log.active_segment.base_offset)
        good_size = rolled.log.active_segment.size
        assert active.stat().st_size > good_size  # pre-allocated zeros follow the data
        nxt = Producers(dict(rolled.producers.epochs), dict(rolled.producers.sequences))
        next_batch = bytearray(nxt.batch(11, 2))
        next_batch[:8] = end.to_bytes(8, "big")  # as the log would have stamped it
        tail = damage(bytes(next_batch))
        # Where a torn write lands: right after the data, over the pre-allocated zeros.
        with active.open("r+b") as f:
            f.seek(good_size)
            f.write(tail)
        file_size = active.stat().st_size
        assert file_size >= good_size + len(tail)
        kept = len(next_batch) * kept_batches
        # Damage runs from the first bad byte to the last non-zero one; zeros after it are no data.
        damaged = len(tail[kept:].rstrip(b"\0"))
        with Log.open(copy, CONFIG) as recovered:
            report = recovered.recovery_report
            assert report.clean is False
            assert report.truncated_bytes == damaged
            assert report.zero_tail_bytes == file_size - good_size - kept - damaged
            assert report.segments_scanned == 1
            assert recovered.log_end_offset == end + 2 * kept_batches
            assert active.stat().st_size == good_size + kept
            assert (report.tail_error is not None) == (damaged > 0)
            result = recovered.append(rolled.producers.batch(13, 1))
            assert result.first_offset == end + 2 * kept_batches
            read_everything(recovered)
        assert [p[2] for p in batch_positions(active)][-1] == end + 2 * kept_batches
        with Log.open(copy, CONFIG) as reopened:
            assert reopened.recovery_report.clean
            assert engine_state(reopened) == replay_state(copy)

    def test_an_unflushed_last_batch_torn_by_the_crash_is_cut(self, rolled: OpenLog, tmp_path: Path) -> None:
        end = rolled.log.log_end_offset
        rolled.producers.append(rolled.log, 12, 3, value_size=80)  # above the recovery point
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        active = segment_path(copy, rolled.log.active_segment.base_offset)
        position, size, base = batch_positions(active)[-1]
        assert base == end
        assert position + size == rolled.log.active_segment.size
        file_size = active.stat().st_size
        # The last 10 bytes never reached the disk: they read as the pre-allocated zeros.
        with active.open("r+b") as f:
            f.seek(position)
            torn = f.read(size - 10)
            f.write(bytes(10))
        assert torn[-1] != 0  # so the damage ends exactly where the tear starts
        with Log.open(copy, CONFIG) as recovered:
            report = recovered.recovery_report
            assert recovered.log_end_offset == end
            assert report.truncated_bytes == size - 10
            assert report.zero_tail_bytes == file_size - position - (size - 10)
            assert report.tail_error is not None
            assert active.stat().st_size == position
            entry = recovered.producer_state(12)
            assert entry is not None
            assert entry.last_offset < end
            assert engine_state(recovered) == replay_state(copy)
            # The producer's retry of the lost batch is accepted, at the log end.
            result = recovered.append(rolled.producers.sent[-1].data)
            assert not result.duplicate
            assert result.first_offset == end

    @pytest.mark.parametrize("fill", [0x00, 0xA5], ids=["zeros", "garbage"])
    def test_bytes_appended_behind_a_clean_close_are_cut(self, rolled: OpenLog, fill: int) -> None:
        end = rolled.log.log_end_offset
        active = segment_path(rolled.directory, rolled.log.active_segment.base_offset)
        rolled.log.close()
        size = active.stat().st_size
        assert size == rolled.log.active_segment.size  # a clean close trims the pre-allocated space
        with active.open("ab") as f:
            f.write(bytes([fill]) * 300)
        with Log.open(rolled.directory, CONFIG) as reopened:
            report = reopened.recovery_report
            assert reopened.log_end_offset == end
            # Zeros are counted as the zero tail, anything else as damage.
            damaged = 300 if fill else 0
            assert (report.truncated_bytes, report.zero_tail_bytes) == (damaged, 300 - damaged)
            assert (report.tail_error is not None) == bool(fill)
        assert active.stat().st_size == size


# -- corruption below the recovery point ------------------------------------------------
class TestCorruptionBelowTheRecoveryPoint:
    def _flip_early_batch_of_active_segment(self, rolled: OpenLog) -> tuple[Path, int, int]:
        log = rolled.log
        active = segment_path(rolled.directory, log.active_segment.base_offset)
        log.close()
        positions = batch_positions(active)
        assert len(positions) >= 3
        position, _, base = positions[1]
        flip_byte(active, position + HEADER_SIZE + 2)  # inside the records: CRC-covered
        return active, position, base

    def test_a_bit_flip_below_the_recovery_point_raises_naming_the_file_and_position(
        self, rolled: OpenLog
    ) -> None:
        active, position, _ = self._flip_early_batch_of_active_segment(rolled)
        with pytest.raises(CorruptLogError) as info:
            Log.open(rolled.directory, CONFIG)
        assert info.value.path == str(active)
        assert info.value.position == position
        assert active.name in str(info.value)
        assert str(position) in str(info.value)
        # Nothing was cut, and the directory is not left locked.
        assert len(batch_positions(active)) >= 3
        with pytest.raises(CorruptLogError):
            Log.open(rolled.directory, CONFIG)

    def test_a_bit_flip_below_the_recovery_point_after_a_crash_raises(
        self, rolled: OpenLog, tmp_path: Path
    ) -> None:
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        active = segment_path(copy, rolled.log.active_segment.base_offset)
        position = batch_positions(active)[1][0]
        flip_byte(active, position + HEADER_SIZE + 2)
        with pytest.raises(CorruptLogError) as info:
            Log.open(copy, CONFIG)
        assert (info.value.path, info.value.position) == (str(active), position)

    def test_a_followers_fsynced_batch_overwritten_by_a_later_one_of_its_size_is_reported(
        self, tmp_path: Path
    ) -> None:
        # A follower's offsets may skip, so only the recovery point's offset tells that the
        # batch ending at its position is not the one fsynced (found by a red-team pass).
        def batch(offset: int, value: bytes) -> bytes:
            return encode_batch(
                [(b"k", value)], base_offset=offset, timestamp_ms=T0, partition_leader_epoch=3
            )

        first, fsynced, later = batch(0, b"A" * 40), batch(1, b"B" * 40), batch(2, b"C" * 40)
        log = Log.open(tmp_path / "t-0", CONFIG)
        for data in (first, fsynced):
            log.append_batches([data], origin="replication")
            log.flush()
        log.append_batches([later], origin="replication")
        copy = crash_copy(tmp_path / "t-0", tmp_path / "crashed")
        log.close()
        active = segment_path(copy, 0)
        data = bytearray(active.read_bytes())
        # The later batch's write landed on the fsynced one's place, and not on its own.
        data[len(first) : len(first) + len(later)] = later
        data[len(first) + len(fsynced) : len(first) + len(fsynced) + len(later)] = bytes(len(later))
        active.write_bytes(bytes(data))
        with pytest.raises(CorruptLogError) as info:
            Log.open(copy, CONFIG)
        assert info.value.path == str(active)

    def test_on_corruption_truncate_cuts_the_log_at_the_bad_batch(self, rolled: OpenLog) -> None:
        active, position, base = self._flip_early_batch_of_active_segment(rolled)
        size = active.stat().st_size
        config = LogConfig(
            segment_bytes=2048,
            segment_index_bytes=4096,
            on_corruption="truncate",
            recovery_point_interval_ms=0,
        )
        data = active.read_bytes()
        with Log.open(rolled.directory, config) as cut:
            report = cut.recovery_report
            assert cut.log_end_offset == base
            # All cut; a run of zeros ending the file (here the last record's empty
            # header count) is reported as the zero tail, the rest as damage.
            assert report.truncated_bytes == len(data[position:].rstrip(b"\0"))
            assert report.truncated_bytes + report.zero_tail_bytes == size - position
            assert report.tail_error is not None
            assert active.stat().st_size == position
            assert engine_state(cut) == replay_state(rolled.directory)
            assert cut.append(rolled.producers.batch(99)).first_offset == base
        assert batch_positions(active)[-1][0] == position  # the new batch took its place

    def test_a_bit_flip_in_a_sealed_segment_is_not_scanned_but_is_never_served(
        self, rolled: OpenLog, tmp_path: Path
    ) -> None:
        clean_copy = crash_copy(rolled.directory, tmp_path / "unflipped")
        with Log.open(clean_copy, CONFIG) as unflipped:
            expected_scan = unflipped.recovery_report.bytes_scanned
        copy = crash_copy(rolled.directory, tmp_path / "crashed")
        sealed = segment_path(copy, 0)
        position, _, base = batch_positions(sealed)[2]
        flip_byte(sealed, position + HEADER_SIZE + 2)
        with Log.open(copy, CONFIG) as recovered:
            report = recovered.recovery_report
            assert report.segments_scanned == 1
            assert report.bytes_scanned == expected_scan
            assert report.bytes_scanned < sum(s.size for s in recovered.segments)
            assert recovered.log_end_offset == rolled.log.log_end_offset
            with pytest.raises(CorruptLogError) as info:
                recovered.read(base)
            assert (info.value.path, info.value.position) == (str(sealed), position)
            # A read starting before the bad batch must not serve it either.
            with pytest.raises(CorruptLogError):
                recovered.read(0, max_bytes=1 << 20)
            # Batches of other segments are still served.
            assert recovered.read(recovered.active_segment.base_offset).batches

    def test_a_bit_flip_in_a_sealed_segment_after_a_clean_close_is_never_served(
        self, rolled: OpenLog
    ) -> None:
        rolled.log.close()
        sealed = segment_path(rolled.directory, 0)
        position, _, base = batch_positions(sealed)[1]
        flip_byte(sealed, position + HEADER_SIZE + 2)
        with Log.open(rolled.directory, CONFIG) as reopened:
            assert reopened.recovery_report.clean
            with pytest.raises(CorruptLogError) as info:
                reopened.read(base)
            assert info.value.position == position


# -- the clean-shutdown marker ---------------------------------------------------------------
class _CrashingFileSystem(DelegatingFileSystem):
    """The real OS, raising at the first call of `crash_on` once armed (a crash while loading)."""

    def __init__(self, crash_on: str) -> None:
        super().__init__()
        self.crash_on = crash_on
        self.crashed = False

    def _maybe_crash(self, name: str) -> None:
        if name == self.crash_on and not self.crashed:
            self.crashed = True
            raise OSError(errno.EIO, "simulated crash while loading")

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        if path.endswith(".log"):
            self._maybe_crash("open")
        return self.inner.open(path, create=create, writable=writable)

    def open_store(self, path: str, *, readonly: bool = False) -> MetadataStore:
        self._maybe_crash("store")
        return self.inner.open_store(path, readonly=readonly)

    def store_version(self, path: str) -> bytes | None:
        self._maybe_crash("store")  # what a clean open reads of the store
        return self.inner.store_version(path)

    def listdir(self, path: str) -> list[str]:
        self._maybe_crash("listdir")
        return self.inner.listdir(path)

    def rename(self, src: str, dst: str) -> None:
        self._maybe_crash("rename")
        self.inner.rename(src, dst)


class TestCleanShutdownMarker:
    def test_a_clean_close_makes_the_next_open_clean_and_scan_nothing(self, rolled: OpenLog) -> None:
        rolled.log.close()
        assert (rolled.directory / MARKER).exists()
        with Log.open(rolled.directory, CONFIG) as reopened:
            report = reopened.recovery_report
            assert report.clean is True
            assert (report.segments_scanned, report.truncated_bytes) == (0, 0)
            # Deleted as soon as it was read: a crash from here on is unclean.
            assert not (rolled.directory / MARKER).exists()

    def test_a_missing_marker_makes_the_open_unclean(self, rolled: OpenLog) -> None:
        expected = engine_state(rolled.log)
        rolled.log.close()
        (rolled.directory / MARKER).unlink()
        with Log.open(rolled.directory, CONFIG) as reopened:
            assert reopened.recovery_report.clean is False
            assert reopened.recovery_report.segments_scanned == 1
            assert engine_state(reopened) == expected

    @pytest.mark.parametrize("crash_on", ["store", "listdir", "open"])
    def test_a_crash_while_loading_is_still_unclean_on_the_next_open(
        self, rolled: OpenLog, crash_on: str
    ) -> None:
        expected = engine_state(rolled.log)
        end = rolled.log.log_end_offset
        rolled.log.close()
        fs = _CrashingFileSystem(crash_on)
        with pytest.raises(LogFailedError, match="simulated crash"):
            Log.open(rolled.directory, CONFIG, fs=fs)
        assert fs.crashed
        assert not (rolled.directory / MARKER).exists()
        with Log.open(rolled.directory, CONFIG) as reopened:
            assert reopened.recovery_report.clean is False
            assert reopened.log_end_offset == end
            assert engine_state(reopened) == expected


# -- recovery cost ----------------------------------------------------------------------------
class TestRecoveryCostIsTailOnly:
    def _crash_with(self, tmp_path: Path, sealed_segments: int) -> tuple[Log, Path]:
        directory = tmp_path / f"sealed-{sealed_segments}"
        producers = Producers()
        with Log.open(directory, CONFIG) as log:
            for _ in range(sealed_segments):
                producers.append(log, 6, 1, 40)
                log.roll()
            for n in range(5):  # the same tail, byte for byte but for offsets, in both logs
                producers.append(log, 7 + n % 2, 2, 100)
            log.flush()
            assert len(log.segments) == sealed_segments + 1
            copy = crash_copy(directory, tmp_path / f"crashed-{sealed_segments}")
        return Log.open(copy, CONFIG), copy

    def test_recovery_of_100_segments_reads_no_more_than_recovery_of_10_with_the_same_tail(
        self, tmp_path: Path
    ) -> None:
        small, small_dir = self._crash_with(tmp_path, 9)
        big, big_dir = self._crash_with(tmp_path, 99)
        try:
            for log, directory in ((small, small_dir), (big, big_dir)):
                report = log.recovery_report
                assert report.clean is False
                assert report.segments_scanned == 1
                assert report.snapshot_offset == log.active_segment.base_offset
                # Exactly the active segment is read, however long the log.
                assert report.bytes_scanned == log.active_segment.size
                assert report.batches_replayed == 5
                assert engine_state(log) == replay_state(directory)
            assert big.recovery_report.bytes_scanned == small.recovery_report.bytes_scanned
            assert big.size_bytes > 5 * small.recovery_report.bytes_scanned
        finally:
            small.close()
            big.close()


# -- single writer ------------------------------------------------------------------------------
LOCK_CHILD = r"""
import sys
from oncelog.errors import LogDirLockedError
from oncelog.log import Log
try:
    Log.open(sys.argv[1]).close()
except LogDirLockedError:
    print("locked")
else:
    print("opened")
"""


class TestSingleWriter:
    def test_a_second_open_in_this_process_raises_until_the_first_closes(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        first = Log.open(directory, CONFIG)
        try:
            with pytest.raises(LogDirLockedError):
                Log.open(directory, CONFIG)
            # The refused open changed nothing: the first log still works.
            assert Producers().append(first, 1).first_offset == 0
        finally:
            first.close()
        with Log.open(directory, CONFIG) as second:
            assert second.log_end_offset == 1

    def test_an_open_from_another_process_raises_until_the_first_closes(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"

        def open_in_child() -> str:
            done = subprocess.run(
                [sys.executable, "-c", LOCK_CHILD, str(directory)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()

        with Log.open(directory, CONFIG):
            assert open_in_child() == "locked"
        assert open_in_child() == "opened"


# -- flush policy ------------------------------------------------------------------------------
class TestALaggingRecoveryPoint:
    """The default: a flush fsyncs the segment alone, and the recovery point moves only every
    recovery_point_interval_ms, at rolls, at a clean close and on Log.checkpoint()."""

    LAGGING = dataclasses.replace(CONFIG, recovery_point_interval_ms=60_000)

    def _durable_batches(self, directory: Path, count: int) -> tuple[Log, list[AppendResult]]:
        producers = Producers()
        log = Log.open(directory, self.LAGGING, clock=lambda: T0)
        results = []
        for _ in range(count):
            results.append(producers.append(log, 1))
            log.flush()
        assert log.recovery_point == 0  # fsynced, not vouched for
        return log, results

    def test_a_kill_after_durable_appends_keeps_every_one_though_the_point_lags(self, tmp_path: Path) -> None:
        log, results = self._durable_batches(tmp_path / "t-0", 5)
        copy = crash_copy(tmp_path / "t-0", tmp_path / "crashed")
        log.close()
        with Log.open(copy, self.LAGGING) as reopened:
            assert reopened.recovery_report.clean is False
            assert reopened.log_end_offset == results[-1].last_offset + 1

    def test_a_bit_flip_past_the_lagging_point_is_cut_as_a_torn_tail_with_what_follows_it(
        self, tmp_path: Path
    ) -> None:
        log, results = self._durable_batches(tmp_path / "t-0", 5)
        copy = crash_copy(tmp_path / "t-0", tmp_path / "crashed")
        log.close()
        active = segment_path(copy, 0)
        position, _, base = batch_positions(active)[2]
        flip_byte(active, position + HEADER_SIZE + 2)
        # Kafka's answer too: nothing tells these fsynced bytes from a torn unsynced tail.
        with Log.open(copy, self.LAGGING) as reopened:
            assert reopened.log_end_offset == base == results[2].first_offset
            assert reopened.recovery_report.truncated_bytes > 0

    def test_a_bit_flip_below_a_checkpointed_point_is_still_reported(self, tmp_path: Path) -> None:
        log, _ = self._durable_batches(tmp_path / "t-0", 5)
        assert log.checkpoint()
        copy = crash_copy(tmp_path / "t-0", tmp_path / "crashed")
        log.close()
        active = segment_path(copy, 0)
        position = batch_positions(active)[2][0]
        flip_byte(active, position + HEADER_SIZE + 2)
        with pytest.raises(CorruptLogError) as info:
            Log.open(copy, self.LAGGING)
        assert (info.value.path, info.value.position) == (str(active), position)

    def test_a_clean_close_commits_the_point_at_the_end(self, tmp_path: Path) -> None:
        log, results = self._durable_batches(tmp_path / "t-0", 3)
        log.close()
        store = OsFileSystem().open_store(str(tmp_path / "t-0" / "meta.lmdb"))
        try:
            assert read_offset(store, RECOVERY_POINT_KEY) == results[-1].last_offset + 1
        finally:
            store.close()


class TestFlushPolicy:
    def test_flush_messages_advances_the_recovery_point_every_three_messages(self, tmp_path: Path) -> None:
        config = LogConfig(segment_index_bytes=4096, flush_messages=3, recovery_point_interval_ms=0)
        producers = Producers()
        with Log.open(tmp_path / "t-0", config) as log:
            points = []
            for _ in range(7):
                producers.append(log, 1)
                points.append(log.recovery_point)
            assert points == [0, 0, 3, 3, 3, 6, 6]
            producers.append(log, 1, 4)  # one batch of 4 messages crosses the threshold
            assert log.recovery_point == 11
            # The recovery point is durable in the metadata store.
            copy = crash_copy(tmp_path / "t-0", tmp_path / "copy")
        store = OsFileSystem().open_store(str(copy / "meta.lmdb"))
        try:
            assert read_offset(store, RECOVERY_POINT_KEY) == 11
        finally:
            store.close()

    def test_flush_ms_flushes_once_the_injected_clock_has_moved_far_enough(self, tmp_path: Path) -> None:
        now = [T0]
        config = LogConfig(segment_index_bytes=4096, flush_ms=100, recovery_point_interval_ms=0)
        producers = Producers()
        with Log.open(tmp_path / "t-0", config, clock=lambda: now[0]) as log:
            now[0] += 50
            producers.append(log, 1)
            assert log.recovery_point == 0
            now[0] += 49
            producers.append(log, 1)
            assert log.recovery_point == 0
            now[0] += 1
            producers.append(log, 1)
            assert log.recovery_point == 3
            now[0] += 99
            producers.append(log, 1)
            assert log.recovery_point == 3
            now[0] += 1
            producers.append(log, 1)
            assert log.recovery_point == 5

    def test_without_a_policy_only_flush_moves_the_recovery_point(self, tmp_path: Path) -> None:
        producers = Producers()
        with Log.open(
            tmp_path / "t-0", LogConfig(segment_index_bytes=4096, recovery_point_interval_ms=0)
        ) as log:
            for _ in range(20):
                producers.append(log, 1)
            assert log.recovery_point == 0
            log.flush()
            assert log.recovery_point == 20


# -- fsync failure --------------------------------------------------------------------------
class TestFsyncFailure:
    @pytest.mark.parametrize("fail_in", ["flush", "roll"])
    def test_after_a_failed_fsync_appends_fail_until_reopen_which_recovers_everything(
        self, tmp_path: Path, fail_in: str
    ) -> None:
        directory = tmp_path / "t-0"
        fs = FsyncFailingFileSystem()
        producers = Producers()
        log = Log.open(directory, CONFIG, fs=fs)
        try:
            producers.workload(log, random.Random(5), 30)
            end = log.log_end_offset
            expected = engine_state(log)
            fs.failing = True
            with pytest.raises(LogFailedError):
                if fail_in == "flush":
                    log.flush()
                else:
                    log.roll()
            fs.failing = False  # a retried fsync would "succeed": fail closed anyway
            with pytest.raises(LogFailedError):
                log.append(producers.batch(11))
            with pytest.raises(LogFailedError):
                log.flush()
            assert log.log_end_offset == end
        finally:
            with pytest.raises(LogFailedError, match="without a flush"):
                log.close()  # failed earlier: it lets go of everything, and says so
        with Log.open(directory, CONFIG) as reopened:
            assert reopened.recovery_report.clean is False
            assert reopened.log_end_offset == end
            assert engine_state(reopened) == expected == replay_state(directory)
            assert [(b.base_offset, b.last_offset) for b in read_everything(reopened)] == [
                (s.first_offset, s.last_offset) for s in producers.sent
            ]
            assert producers.append(reopened, 11).first_offset == end

    def test_closing_a_failed_log_leaves_no_marker_and_releases_the_directory_while_fsync_still_fails(
        self, tmp_path: Path
    ) -> None:
        fs = FsyncFailingFileSystem()
        log = Log.open(tmp_path / "t-0", CONFIG, fs=fs)
        Producers().append(log, 1)
        fs.failing = True
        with pytest.raises(LogFailedError):
            log.flush()
        with contextlib.suppress(OSError, LogFailedError):
            log.close()  # it may report the failure, but must still let go of the directory
        assert not (tmp_path / "t-0" / MARKER).exists()
        fs.failing = False
        with Log.open(tmp_path / "t-0", CONFIG) as reopened:
            assert reopened.recovery_report.clean is False
            assert reopened.log_end_offset == 1


# -- real Kafka partitions ------------------------------------------------------------------
class TestKafkaFixtures:
    def test_promotions_fixture_recovers_producers_45_and_46(self, tmp_path: Path) -> None:
        partition = copy_fixture(FIXTURES / "flink-on-prem" / "promotions-0", tmp_path)
        with Log.open(partition, LogConfig()) as log:
            p45, p46 = log.producer_state(45), log.producer_state(46)
            assert p45 is not None and p46 is not None
            assert (p45.producer_epoch, p45.last_sequence, p45.last_offset) == (0, 2, 26)
            assert (p46.producer_epoch, p46.last_sequence, p46.last_offset) == (0, 25, 28)
            # No recovery point came with the copy, so its one segment is validated and
            # replayed from its start (as Kafka's recoverSegment rebuilds a segment's
            # transaction index from the state at its base), not from the v1 snapshot at 29.
            assert log.recovery_report.snapshot_offset is None
            assert log.recovery_report.batches_replayed > 0
            assert log.log_end_offset == 29
            # Kafka keeps each producer's last batch: retrying it is a duplicate.
            last_46 = log.read(27).batches[0]
            assert (last_46.producer_id, last_46.base_offset) == (46, 27)
            result = log.append(bytes(last_46.buffer))
            assert result.duplicate
            assert (result.first_offset, result.last_offset) == (27, 28)
            assert log.log_end_offset == 29

    @pytest.mark.parametrize("source", fixture_partition_params())
    def test_every_fixture_recovers_each_producers_last_batch(
        self, tmp_path: Path, source: Path | None
    ) -> None:
        assert source is not None, f"no Kafka fixtures under {FIXTURES}"
        partition = copy_fixture(source, tmp_path)
        last: dict[int, tuple[int, int, int]] = {}
        for log_file in sorted(partition.glob("*.log")):
            for batch in iter_batches(log_file.read_bytes()):
                if batch.producer_id >= 0 and not batch.is_control:
                    last[batch.producer_id] = (batch.producer_epoch, batch.last_sequence, batch.last_offset)
        with Log.open(partition, LogConfig()) as log:
            assert log.recovery_report.clean is False  # no oncelog marker in a Kafka directory
            got = {}
            for entry in log.producers():
                if entry.producer_id in last:
                    got[entry.producer_id] = (entry.producer_epoch, entry.last_sequence, entry.last_offset)
            assert got == last


# -- fsynced data that is gone: a lost or emptied segment file --------------------------------
def _lost(path: Path) -> None:
    path.unlink()


def _emptied(path: Path) -> None:
    path.write_bytes(b"")


class TestLostSegments:
    """A stored recovery point above the data found: CorruptLogError, never a shorter log."""

    @staticmethod
    def build(directory: Path) -> list[Path]:
        with Log.open(directory, CONFIG) as log:
            Producers().workload(log, random.Random(3), 45)
            log.flush()
            assert log.recovery_point == log.log_end_offset
        return sorted(directory.glob("*.log"))

    @pytest.mark.parametrize("damage", [_lost, _emptied], ids=["deleted", "emptied"])
    @pytest.mark.parametrize("clean", [True, False], ids=["after-clean-close", "after-crash"])
    def test_a_lost_newest_segment_is_corruption_naming_the_missing_offsets(
        self, tmp_path: Path, damage: Callable[[Path], None], clean: bool
    ) -> None:
        directory = tmp_path / "t-0"
        segments = self.build(directory)
        with Log.open(directory, CONFIG) as log:
            end, newest_base = log.log_end_offset, log.active_segment.base_offset
        damage(segments[-1])
        if not clean:
            (directory / MARKER).unlink()
        with pytest.raises(CorruptLogError) as raised:
            Log.open(directory, CONFIG)
        message = str(raised.value)
        # An emptied file after a crash is caught first where the recovery point's position
        # falls in it: no batch ends there.
        assert f"offsets {newest_base} to {end - 1} were fsynced" in message or (
            f"should end at offset {end}" in message
        )
        assert raised.value.path == str(segment_path(directory, newest_base))
        # Nothing was changed by the refusal: the same open refuses again.
        with pytest.raises(CorruptLogError):
            Log.open(directory, CONFIG)

    def test_the_loss_is_accepted_only_by_opting_in_and_then_reported_and_durable(
        self, tmp_path: Path
    ) -> None:
        directory = tmp_path / "t-0"
        segments = self.build(directory)
        with Log.open(directory, CONFIG) as log:
            newest_base = log.active_segment.base_offset
        segments[-1].unlink()
        with Log.open(directory, dataclasses.replace(CONFIG, on_corruption="truncate")) as log:
            assert log.log_end_offset == newest_base
            assert log.recovery_report.tail_error is not None
            assert "fsynced data missing" in log.recovery_report.tail_error
            assert log.recovery_point == newest_base
            Producers().append(log, 99)  # takes offset newest_base: the loss is accepted
        with Log.open(directory, CONFIG) as reopened:  # and durable: no complaint again
            assert reopened.log_end_offset == newest_base + 1

    def test_a_lost_middle_segment_is_never_served_as_a_shorter_log(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        segments = self.build(directory)
        assert len(segments) >= 3
        missing_base = int(segments[1].name[:20])
        segments[1].unlink()
        with Log.open(directory, CONFIG) as log:
            with pytest.raises(CorruptLogError):
                read_everything(log)
            with pytest.raises(CorruptLogError):
                log.read(missing_base)

    def test_a_lost_first_segment_is_corruption_not_a_later_start(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        segments = self.build(directory)
        second_base = int(segments[1].name[:20])
        segments[0].unlink()
        with pytest.raises(CorruptLogError, match=f"offsets 0 to {second_base - 1} are missing"):
            Log.open(directory, CONFIG)
        with Log.open(directory, dataclasses.replace(CONFIG, on_corruption="truncate")) as log:
            assert log.log_start_offset == second_base
            assert log.recovery_report.tail_error is not None
        with Log.open(directory, CONFIG) as log:  # accepted durably
            assert log.log_start_offset == second_base

    def test_a_followers_lost_first_segment_is_corruption_not_a_later_start(self, tmp_path: Path) -> None:
        # A follower keeps its leader's offsets and may hold gaps, but its log still starts
        # where the store says: a first segment that begins later was lost.
        directory = tmp_path / "t-0"
        with Log.open(directory, CONFIG) as replica:
            for offset in range(60):
                batch = encode_batch([(b"k", b"v" * 60)], base_offset=offset, timestamp_ms=1_700_000_000_000)
                replica.append(batch, origin="replication")
        segments = sorted(directory.glob("*.log"))
        assert len(segments) >= 3
        second_base = int(segments[1].name[:20])
        segments[0].unlink()
        with pytest.raises(CorruptLogError, match=f"offsets 0 to {second_base - 1} are missing"):
            Log.open(directory, CONFIG)

    def test_a_kafka_directory_may_start_past_zero(self, tmp_path: Path) -> None:
        # No store, so nothing says where it started: retention in Kafka deleted the rest.
        directory = tmp_path / "t-0"
        self.build(directory)
        segments = sorted(directory.glob("*.log"))
        shutil.rmtree(directory / "meta.lmdb")
        segments[0].unlink()
        with Log.open(directory, CONFIG) as log:
            assert log.log_start_offset == int(segments[1].name[:20])

    def test_an_emptied_sealed_segment_is_never_read_as_a_gap(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        segments = self.build(directory)
        emptied_base = int(segments[1].name[:20])
        segments[1].write_bytes(b"")
        with Log.open(directory, CONFIG) as log:
            # Its index names batches the emptied file lacks: rebuilt, it ends too soon.
            with pytest.raises(CorruptLogError, match=f"batches end at offset {emptied_base}, but the next"):
                log.read(emptied_base)
            assert log.read(0).batches  # the segments around it still serve
