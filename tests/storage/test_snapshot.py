"""Producer-state snapshot files: oncelog's own format and Kafka's v1 (issue 3, brief §3/§5).

Mirrors engine/storage/snapshot.py. The oncelog format must keep every producer's full
5-batch window and refuse any damaged or foreign file; the Kafka v1 reader is
checked against real broker output, whose logs are replayed here header by header
with `iter_batches`, independently of the loader.
"""

from __future__ import annotations

import os
import shutil
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c
import msgpack
import numpy as np
import pytest

from oncelog.errors import CorruptSnapshotError
from oncelog.pid_map import DuplicateProducerError
from oncelog.producer_replay import ReplayBuffer
from oncelog.producer_state import (
    PRODUCER_DTYPE,
    UNKNOWN_APPEND_MS,
    WINDOW,
    BatchMetadata,
    ProducerStateManager,
    first_sequence_of,
)
from oncelog.segments import iter_batches
from oncelog.segments.format import Buffer
from oncelog.storage import snapshot as snapshots
from oncelog.storage.fs import DelegatingFileHandle, DelegatingFileSystem, FileHandle, OsFileSystem

# The v1 layout written out here, independently of engine/storage/snapshot.py.
V1_PREFIX = struct.Struct(">hI")
V1_COUNT = struct.Struct(">i")
V1_ENTRY = struct.Struct(">qhiqiqiq")
assert V1_ENTRY.size == 46
ONCELOG_VERSION = 0x6F6D
# oncelog's first layout, written by hand here: 172-byte rows with each batch's first
# sequence and the newest batch timestamp, and no append time.
ONCELOG_V1_VERSION = 0x6F6C
ONCELOG_V1_ROW = struct.Struct(f"<qqqihBB{WINDOW}i{WINDOW}i{WINDOW}q{WINDOW}i{WINDOW}q")
assert ONCELOG_V1_ROW.size == 172
ONCELOG_V1_FIELDS = (
    "[('producer_id', '<i8'), ('last_activity_ms', '<i8'), ('txn_first_offset', '<i8'), "
    "('coordinator_epoch', '<i4'), ('producer_epoch', '<i2'), ('window_count', '|u1'), "
    "('live', '|u1'), ('first_sequence', '<i4', (5,)), ('last_sequence', '<i4', (5,)), "
    "('last_offset', '<i8', (5,)), ('offset_delta', '<i4', (5,)), ('max_timestamp_ms', '<i8', (5,))]"
)

T0 = 1_700_000_000_000


# -- helpers ----------------------------------------------------------------------
def fixtures_root() -> Path:
    configured = os.environ.get("ONCELOG_FIXTURES")
    if configured:
        return Path(configured)
    # tests/recovery/<this file> -> repo -> its parent holds shared/fixtures/kafka.
    return Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "kafka"


ROOT = fixtures_root()


def fixture_snapshot_params() -> list[object]:
    found = sorted(ROOT.glob("*/*/*.snapshot")) if ROOT.is_dir() else []
    if not found:
        # An empty parametrisation would be skipped silently; make it fail instead.
        return [pytest.param(None, id="fixtures-missing")]
    return [pytest.param(p, id=str(p.relative_to(ROOT))) for p in found]


def windowed_rows() -> tuple[np.ndarray, dict[int, tuple[BatchMetadata, ...]]]:
    """Rows for producers with 1, 3, 5 and 8 batches (the last two hold full windows)."""
    manager = ProducerStateManager(16)
    replay = ReplayBuffer(manager, now_ms=T0)
    expected: dict[int, list[BatchMetadata]] = {}
    offset = 0
    for pid, batches in ((7, 1), (8, 3), (9, 5), (2**40, 8)):
        seq = 0
        for n in range(batches):
            count = n % 3 + 1
            meta = BatchMetadata(seq, seq + count - 1, offset, offset + count - 1, T0 + offset)
            replay.replay_batch(pid, 3, meta[0], meta[1], meta[2], meta[3], meta[4], False)
            expected.setdefault(pid, []).append(meta)
            seq += count
            offset += count
    replay.flush()
    return manager.live_rows(), {pid: tuple(metas[-WINDOW:]) for pid, metas in expected.items()}


def rows_by_pid(rows: np.ndarray) -> dict[int, tuple[BatchMetadata, ...]]:
    manager = ProducerStateManager(max(len(rows), 1))
    manager.load_rows(rows)
    return {entry.producer_id: entry.batches for entry in manager.entries()}


def with_valid_crc(version: int, body: bytes) -> bytes:
    return V1_PREFIX.pack(version, crc32c.crc32c(body)) + body


def oncelog_body(header: dict[str, object], rows: bytes) -> bytes:
    packed = msgpack.packb(header)
    return struct.pack(">I", len(packed)) + packed + rows


def kafka_v1(entries: Sequence[tuple[int, int, int, int, int, int, int, int]]) -> bytes:
    body = V1_COUNT.pack(len(entries)) + b"".join(V1_ENTRY.pack(*e) for e in entries)
    return with_valid_crc(1, body)


def flip_bit(data: bytes, position: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[position] ^= 1 << bit
    return bytes(out)


# -- the oncelog format --------------------------------------------------------------
class TestOncelogFormatRoundTrip:
    def test_encode_then_decode_gives_back_every_row_byte_for_byte(self) -> None:
        rows, _ = windowed_rows()
        decoded = snapshots.decode_snapshot(snapshots.encode_snapshot(42, rows), 42)
        assert decoded.dtype == PRODUCER_DTYPE
        assert len(decoded) == 4
        assert decoded.tobytes() == rows.tobytes()

    def test_full_five_batch_windows_survive_the_round_trip(self) -> None:
        rows, expected = windowed_rows()
        decoded = snapshots.decode_snapshot(snapshots.encode_snapshot(100, rows), 100)
        assert rows_by_pid(decoded) == expected
        assert [int(n) for n in decoded["window_count"]] == [1, 3, 5, 5]
        # The 8-batch producer keeps its newest 5 (sequences 6..14), not only the last one as Kafka v1.
        window = rows_by_pid(decoded)[2**40]
        sequences = [(b.first_sequence, b.last_sequence) for b in window]
        assert sequences == [(6, 6), (7, 8), (9, 11), (12, 12), (13, 14)]

    def test_an_empty_producer_table_round_trips(self) -> None:
        rows = np.zeros(0, PRODUCER_DTYPE)
        decoded = snapshots.decode_snapshot(snapshots.encode_snapshot(0, rows), 0)
        assert len(decoded) == 0

    def test_write_then_read_gives_back_every_row(self, tmp_path: Path) -> None:
        rows, expected = windowed_rows()
        path = snapshots.write_snapshot(OsFileSystem(), str(tmp_path), 17, rows)
        assert Path(path) == tmp_path / "00000000000000000017.snapshot"
        read = snapshots.read_snapshot(OsFileSystem(), str(tmp_path), 17)
        assert read.tobytes() == rows.tobytes()
        assert rows_by_pid(read) == expected

    def test_the_file_starts_with_oncelog_version_and_a_crc32c_of_the_rest(self, tmp_path: Path) -> None:
        rows, _ = windowed_rows()
        data = snapshots.encode_snapshot(5, rows)
        version, crc = V1_PREFIX.unpack_from(data)
        assert version == ONCELOG_VERSION
        assert crc == crc32c.crc32c(data[6:])


class TestOncelogFormatRejectsDamage:
    @pytest.fixture
    def good(self) -> bytes:
        rows, _ = windowed_rows()
        return snapshots.encode_snapshot(64, rows)

    def test_an_empty_file_is_corrupt(self) -> None:
        with pytest.raises(CorruptSnapshotError):
            snapshots.decode_snapshot(b"", 64)

    @pytest.mark.parametrize("keep", [1, 5, 6, 9, 40, -160, -1])
    def test_a_truncated_file_is_corrupt(self, good: bytes, keep: int) -> None:
        with pytest.raises(CorruptSnapshotError):
            snapshots.decode_snapshot(good[:keep], 64)

    def test_a_file_with_trailing_bytes_is_corrupt(self, good: bytes) -> None:
        with pytest.raises(CorruptSnapshotError):
            snapshots.decode_snapshot(good + b"\x00", 64)

    def test_every_single_bit_flip_is_detected(self, good: bytes) -> None:
        missed = []
        for position in range(len(good)):
            for bit in (0, 7):
                try:
                    snapshots.decode_snapshot(flip_bit(good, position, bit), 64)
                except CorruptSnapshotError:
                    continue
                missed.append((position, bit))
        assert missed == []

    @pytest.mark.parametrize("version", [0, 2, 3, ONCELOG_VERSION + 1, -1])
    def test_an_unknown_version_with_a_valid_crc_is_corrupt(self, good: bytes, version: int) -> None:
        with pytest.raises(CorruptSnapshotError, match="version"):
            snapshots.decode_snapshot(with_valid_crc(version, good[6:]), 64)

    @pytest.mark.parametrize("asked", [0, 63, 65, 2**40])
    def test_a_header_for_another_offset_is_corrupt(self, good: bytes, asked: int) -> None:
        with pytest.raises(CorruptSnapshotError, match="offset"):
            snapshots.decode_snapshot(good, asked)

    def test_a_row_count_that_disagrees_with_the_rows_is_corrupt(self) -> None:
        rows, _ = windowed_rows()
        header = {
            "offset": 1,
            "producers": 5,
            "row_bytes": PRODUCER_DTYPE.itemsize,
            "fields": str(PRODUCER_DTYPE.descr),
        }
        data = with_valid_crc(ONCELOG_VERSION, oncelog_body(header, rows.tobytes()))
        with pytest.raises(CorruptSnapshotError):
            snapshots.decode_snapshot(data, 1)

    def test_a_different_row_layout_is_refused_not_misread(self) -> None:
        rows, _ = windowed_rows()
        header = {
            "offset": 1,
            "producers": 4,
            "row_bytes": PRODUCER_DTYPE.itemsize,
            "fields": "something else",
        }
        data = with_valid_crc(ONCELOG_VERSION, oncelog_body(header, rows.tobytes()))
        with pytest.raises(CorruptSnapshotError, match="layout"):
            snapshots.decode_snapshot(data, 1)

    @pytest.mark.parametrize("field", ["window_count", "live", "negative_producer_id"])
    def test_rows_breaking_their_invariants_are_corrupt_even_with_a_valid_crc(self, field: str) -> None:
        rows, _ = windowed_rows()
        if field == "window_count":
            rows["window_count"][0] = WINDOW + 1
        elif field == "live":
            rows["live"][1] = 0
        else:
            rows["producer_id"][1] = -5
        with pytest.raises(CorruptSnapshotError):
            snapshots.decode_snapshot(snapshots.encode_snapshot(3, rows), 3)

    def test_a_producer_id_twice_is_refused_by_the_table_load_without_a_sort(self) -> None:
        # Decoding is a view of the bytes; the pid map's bulk load catches the duplicate.
        rows, _ = windowed_rows()
        rows["producer_id"][1] = rows["producer_id"][0]
        decoded = snapshots.decode_snapshot(snapshots.encode_snapshot(3, rows), 3)
        with pytest.raises(DuplicateProducerError):
            ProducerStateManager(16).load_rows(decoded)

    def test_a_header_that_is_not_msgpack_is_corrupt(self) -> None:
        body = struct.pack(">I", 4) + b"\xc1\xc1\xc1\xc1"
        with pytest.raises(CorruptSnapshotError):
            snapshots.decode_snapshot(with_valid_crc(ONCELOG_VERSION, body), 0)

    def test_a_header_length_past_the_end_is_corrupt(self) -> None:
        body = struct.pack(">I", 10_000) + b"\x80"
        with pytest.raises(CorruptSnapshotError):
            snapshots.decode_snapshot(with_valid_crc(ONCELOG_VERSION, body), 0)


# -- oncelog's first layout: read, never written ------------------------------------------
def oncelog_v1_snapshot(offset: int, producers: Sequence[tuple[int, int, int, list[BatchMetadata]]]) -> bytes:
    """A snapshot in oncelog's first layout; producers are (pid, epoch, last batch timestamp, window)."""
    rows = b""
    for pid, epoch, timestamp, window in producers:
        pad = [0] * (WINDOW - len(window))
        rows += ONCELOG_V1_ROW.pack(
            pid,
            timestamp,
            -1,
            -1,
            epoch,
            len(window),
            1,
            *[m.first_sequence for m in window],
            *pad,
            *[m.last_sequence for m in window],
            *pad,
            *[m.last_offset for m in window],
            *pad,
            *[m.last_offset - m.first_offset for m in window],
            *pad,
            *[m.max_timestamp_ms for m in window],
            *pad,
        )
    header = {"offset": offset, "producers": len(producers), "row_bytes": 172, "fields": ONCELOG_V1_FIELDS}
    return with_valid_crc(ONCELOG_V1_VERSION, oncelog_body(header, rows))


class TestOncelogFirstLayout:
    def test_a_first_version_snapshot_loads_with_full_windows_and_the_load_time_as_append_time(
        self, tmp_path: Path
    ) -> None:
        # Two records per batch from 2**31 - 3 on: the second batch straddles the wrap.
        firsts = [(2**31 - 3 + 2 * n) % 2**31 for n in range(5)]
        window = [BatchMetadata(f, (f + 1) % 2**31, 10 * n, 10 * n + 1, T0 + n) for n, f in enumerate(firsts)]
        data = oncelog_v1_snapshot(77, [(9, 4, T0 - 5, window), (2**40, 0, T0 - 7, [])])
        (tmp_path / "00000000000000000077.snapshot").write_bytes(data)
        rows = snapshots.read_snapshot(OsFileSystem(), str(tmp_path), 77)
        assert rows.dtype == PRODUCER_DTYPE
        assert list(rows["last_timestamp_ms"]) == [T0 - 5, T0 - 7]
        assert list(rows["last_append_ms"]) == [UNKNOWN_APPEND_MS] * 2
        manager = ProducerStateManager(4)
        manager.load_rows(rows, T0 + 123)
        entry = manager.get(9)
        assert entry is not None
        assert (entry.producer_epoch, entry.batches) == (4, tuple(window))
        assert (entry.last_append_ms, entry.last_timestamp_ms) == (T0 + 123, T0 - 5)
        empty = manager.get(2**40)
        assert empty is not None and empty.batches == ()

    def test_a_first_version_snapshot_read_into_the_table_is_converted_too(self, tmp_path: Path) -> None:
        data = oncelog_v1_snapshot(3, [(9, 0, T0, [BatchMetadata(0, 0, 2, 2, T0)])])
        (tmp_path / "00000000000000000003.snapshot").write_bytes(data)
        manager = ProducerStateManager(4)
        manager.load_rows(
            snapshots.read_snapshot(OsFileSystem(), str(tmp_path), 3, into=manager.table), T0 + 1
        )
        entry = manager.get(9)
        assert entry is not None
        assert (entry.batches, entry.last_append_ms) == ((BatchMetadata(0, 0, 2, 2, T0),), T0 + 1)

    def test_a_first_version_snapshot_with_the_new_layout_name_is_refused(self) -> None:
        data = oncelog_v1_snapshot(3, [(9, 0, T0, [])])
        relabelled = with_valid_crc(ONCELOG_VERSION, data[6:])
        with pytest.raises(CorruptSnapshotError, match="layout"):
            snapshots.decode_snapshot(relabelled, 3)

    def test_new_snapshots_are_written_in_the_current_version(self) -> None:
        rows, _ = windowed_rows()
        assert (
            V1_PREFIX.unpack_from(snapshots.encode_snapshot(1, rows))[0]
            == ONCELOG_VERSION
            != ONCELOG_V1_VERSION
        )


# -- Kafka's v1 format -----------------------------------------------------------------
class TestKafkaV1Decode:
    def test_entries_become_one_batch_windows(self) -> None:
        # pid, epoch, lastSeq, lastOffset, offsetDelta, timestamp, coordinatorEpoch, txnFirstOffset
        data = kafka_v1(
            [
                (45, 0, 2, 26, 0, T0 + 1, -1, -1),
                (46, 3, 25, 28, 1, T0 + 2, 7, 20),
            ]
        )
        rows = snapshots.decode_snapshot(data, 29)
        assert list(rows["last_append_ms"]) == [UNKNOWN_APPEND_MS] * 2  # Kafka does not store it
        manager = ProducerStateManager(4)
        load_time = T0 + 10**9
        manager.load_rows(rows, load_time)
        p45, p46 = manager.get(45), manager.get(46)
        assert p45 is not None and p46 is not None
        assert p45.producer_epoch == 0
        assert p45.batches == (BatchMetadata(2, 2, 26, 26, T0 + 1),)
        assert p46.producer_epoch == 3
        assert p46.batches == (BatchMetadata(24, 25, 27, 28, T0 + 2),)
        assert (p46.last_timestamp_ms, p46.coordinator_epoch, p46.current_txn_first_offset) == (T0 + 2, 7, 20)
        # Unknown append times count as the load's: the latest they could have been.
        assert (p45.last_append_ms, p46.last_append_ms) == (load_time, load_time)

    def test_an_entry_without_a_sequence_has_an_empty_window(self) -> None:
        rows = snapshots.decode_snapshot(kafka_v1([(5, 1, -1, -1, 0, T0, 2, 100)]), 0)
        assert int(rows["window_count"][0]) == 0
        manager = ProducerStateManager(1)
        manager.load_rows(rows)
        entry = manager.get(5)
        assert entry is not None
        assert (entry.producer_epoch, entry.last_sequence, entry.batches) == (1, -1, ())

    def test_a_first_sequence_straddling_the_wrap_is_taken_modulo_2_to_the_31(self) -> None:
        rows = snapshots.decode_snapshot(kafka_v1([(5, 0, 1, 10, 3, T0, -1, -1)]), 0)
        manager = ProducerStateManager(1)
        manager.load_rows(rows, T0)
        entry = manager.get(5)
        assert entry is not None
        assert entry.batches == (BatchMetadata(2**31 - 2, 1, 7, 10, T0),)

    @pytest.mark.parametrize("producer_id", [-1, -5, -(2**63)])
    def test_a_v1_entry_with_a_negative_producer_id_is_corrupt(self, producer_id: int) -> None:
        # Kafka writes none; in the pid map ~-1 is the empty bucket and expiry would find
        # a slot with no producer.
        data = kafka_v1([(5, 0, 1, 10, 0, T0, -1, -1), (producer_id, 0, 1, 10, 0, T0, -1, -1)])
        with pytest.raises(CorruptSnapshotError, match="rows fail their invariants"):
            snapshots.decode_snapshot(data, 0)

    def test_an_empty_v1_snapshot_has_no_producers(self) -> None:
        assert len(snapshots.decode_snapshot(kafka_v1([]), 13)) == 0

    @pytest.mark.parametrize("cut", [1, 46])
    def test_a_v1_entry_count_that_disagrees_with_the_bytes_is_corrupt(self, cut: int) -> None:
        data = kafka_v1([(1, 0, 0, 0, 0, T0, -1, -1), (2, 0, 0, 1, 0, T0, -1, -1)])
        body = data[6:-cut]
        with pytest.raises(CorruptSnapshotError):
            snapshots.decode_snapshot(with_valid_crc(1, body), 0)

    def test_a_v1_snapshot_with_a_bad_crc_is_corrupt(self) -> None:
        data = kafka_v1([(1, 0, 0, 0, 0, T0, -1, -1)])
        with pytest.raises(CorruptSnapshotError, match="CRC"):
            snapshots.decode_snapshot(flip_bit(data, len(data) - 1), 0)


@dataclass(frozen=True)
class LastBatch:
    epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    max_timestamp: int


def replay_last_batches(partition: Path, end_offset: int) -> dict[int, LastBatch]:
    """Each producer's last non-control batch below `end_offset`, walking the raw .log files."""
    last: dict[int, LastBatch] = {}
    for log_file in sorted(partition.glob("*.log")):
        for batch in iter_batches(log_file.read_bytes()):
            if batch.base_offset >= end_offset or batch.producer_id < 0 or batch.is_control:
                continue
            last[batch.producer_id] = LastBatch(
                batch.producer_epoch,
                batch.last_sequence,
                batch.last_offset,
                batch.last_offset_delta,
                batch.max_timestamp,
            )
    return last


class TestKafkaV1FixturesAgreeWithTheirLogs:
    @pytest.mark.parametrize("snapshot_file", fixture_snapshot_params())
    def test_every_producer_in_the_snapshot_matches_its_last_batch_in_the_log(
        self, snapshot_file: Path | None
    ) -> None:
        assert snapshot_file is not None, f"no Kafka fixtures under {ROOT}"
        offset = int(snapshot_file.name.removesuffix(".snapshot"))
        data = snapshot_file.read_bytes()
        assert V1_PREFIX.unpack_from(data)[0] == 1, "the fixtures are Kafka v1 snapshots"
        rows = snapshots.decode_snapshot(data, offset, str(snapshot_file))
        replayed = replay_last_batches(snapshot_file.parent, offset)

        in_snapshot = {int(pid) for pid in rows["producer_id"]}
        # Every producer that wrote a data batch below the snapshot offset is in it.
        assert set(replayed) <= in_snapshot
        for row in rows:
            pid = int(row["producer_id"])
            if pid not in replayed:
                continue  # a producer whose batches were deleted with older segments
            want = replayed[pid]
            assert int(row["window_count"]) == 1, pid
            got = LastBatch(
                int(row["producer_epoch"]),
                int(row["last_sequence"][0]),
                int(row["last_offset"][0]),
                int(row["offset_delta"][0]),
                int(row["max_timestamp_ms"][0]),
            )
            assert got == want, pid
            first = first_sequence_of(int(row["last_sequence"][0]), int(row["offset_delta"][0]))
            assert first == (want.last_sequence - want.offset_delta) % 2**31
            assert int(row["last_timestamp_ms"]) == want.max_timestamp
            assert int(row["last_append_ms"]) == UNKNOWN_APPEND_MS

    def test_the_promotions_fixture_holds_producers_45_and_46(self) -> None:
        snapshot_file = ROOT / "flink-on-prem" / "promotions-0" / "00000000000000000029.snapshot"
        rows = snapshots.read_snapshot(OsFileSystem(), str(snapshot_file.parent), 29)
        by_pid = {int(r["producer_id"]): (int(r["last_sequence"][0]), int(r["last_offset"][0])) for r in rows}
        assert by_pid == {45: (2, 26), 46: (25, 28)}

    def test_reading_a_fixture_snapshot_from_a_copy_does_not_change_it(self, tmp_path: Path) -> None:
        source = ROOT / "flink-on-prem" / "promotions-0" / "00000000000000000029.snapshot"
        target = tmp_path / source.name
        shutil.copyfile(source, target)
        target.chmod(target.stat().st_mode | stat.S_IWUSR)
        snapshots.read_snapshot(OsFileSystem(), str(tmp_path), 29)
        assert target.read_bytes() == source.read_bytes()


# -- writing, listing, setting aside ---------------------------------------------------
class _RecordingHandle(DelegatingFileHandle):
    def __init__(self, inner: FileHandle, calls: list[tuple[str, ...]]) -> None:
        super().__init__(inner)
        self._calls = calls

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        self._calls.append(("write", os.path.basename(self.path)))
        return self.inner.pwritev(buffers, offset)

    def fsync(self) -> None:
        self._calls.append(("fsync", os.path.basename(self.path)))
        self.inner.fsync()

    def fdatasync(self) -> None:
        self._calls.append(("fsync", os.path.basename(self.path)))
        self.inner.fdatasync()


class RecordingFileSystem(DelegatingFileSystem):
    """The real OS, logging the calls that order a durable write."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, ...]] = []

    def wrap(self, handle: FileHandle) -> FileHandle:
        return _RecordingHandle(handle, self.calls)

    def rename(self, src: str, dst: str) -> None:
        self.calls.append(("rename", os.path.basename(src), os.path.basename(dst)))
        self.inner.rename(src, dst)

    def fsync_dir(self, path: str) -> None:
        self.calls.append(("fsync_dir", path))
        self.inner.fsync_dir(path)


class TestWriteSnapshot:
    def test_write_leaves_no_tmp_file_and_the_file_decodes(self, tmp_path: Path) -> None:
        rows, expected = windowed_rows()
        snapshots.write_snapshot(OsFileSystem(), str(tmp_path), 9, rows)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["00000000000000000009.snapshot"]
        data = (tmp_path / "00000000000000000009.snapshot").read_bytes()
        assert rows_by_pid(snapshots.decode_snapshot(data, 9)) == expected

    def test_write_goes_tmp_then_fsync_then_rename_then_fsync_of_the_directory(self, tmp_path: Path) -> None:
        fs = RecordingFileSystem()
        rows, _ = windowed_rows()
        snapshots.write_snapshot(fs, str(tmp_path), 9, rows)
        name = "00000000000000000009.snapshot"
        assert fs.calls == [
            ("write", name + ".tmp"),
            ("fsync", name + ".tmp"),
            ("rename", name + ".tmp", name),
            ("fsync_dir", str(tmp_path)),
        ]

    def test_writing_again_at_the_same_offset_replaces_the_snapshot(self, tmp_path: Path) -> None:
        rows, _ = windowed_rows()
        snapshots.write_snapshot(OsFileSystem(), str(tmp_path), 9, rows)
        snapshots.write_snapshot(OsFileSystem(), str(tmp_path), 9, rows[:1])
        assert len(snapshots.read_snapshot(OsFileSystem(), str(tmp_path), 9)) == 1
        assert not list(tmp_path.glob("*.tmp"))

    def test_a_stale_tmp_file_from_a_crash_is_overwritten_not_appended_to(self, tmp_path: Path) -> None:
        (tmp_path / "00000000000000000009.snapshot.tmp").write_bytes(b"\xff" * 5000)
        rows, _ = windowed_rows()
        snapshots.write_snapshot(OsFileSystem(), str(tmp_path), 9, rows)
        assert snapshots.read_snapshot(OsFileSystem(), str(tmp_path), 9).tobytes() == rows.tobytes()

    def test_list_snapshot_offsets_sees_only_20_digit_snapshot_names_in_order(self, tmp_path: Path) -> None:
        rows, _ = windowed_rows()
        for offset in (30, 2, 100):
            snapshots.write_snapshot(OsFileSystem(), str(tmp_path), offset, rows)
        for stray in (
            "00000000000000000007.snapshot.tmp",
            "00000000000000000008.snapshot.corrupt",
            "0009.snapshot",
            "0000000000000000000x.snapshot",
            "00000000000000000011.log",
        ):
            (tmp_path / stray).write_bytes(b"")
        assert snapshots.list_snapshot_offsets(OsFileSystem(), str(tmp_path)) == [2, 30, 100]

    def test_set_aside_renames_to_corrupt_and_keeps_the_bytes(self, tmp_path: Path) -> None:
        rows, _ = windowed_rows()
        snapshots.write_snapshot(OsFileSystem(), str(tmp_path), 4, rows)
        before = (tmp_path / "00000000000000000004.snapshot").read_bytes()
        snapshots.set_aside(OsFileSystem(), str(tmp_path), 4)
        assert not (tmp_path / "00000000000000000004.snapshot").exists()
        assert (tmp_path / "00000000000000000004.snapshot.corrupt").read_bytes() == before
        assert snapshots.list_snapshot_offsets(OsFileSystem(), str(tmp_path)) == []
