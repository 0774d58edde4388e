"""partition_reader: a partition's batches over [start, end), read-only, with no Log opened.

The oracle is the engine's own read path: `Log.read` walked over the same range
(and `FetchResult.records()` for read_committed). The range's end comes from
`stat_partition`, as the Spark source computes it, and reads run while a Log
holds the directory's lock and appends.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.config import LogConfig
from oncelog.errors import CorruptRecordError, OffsetOutOfRangeError
from oncelog.log import Log
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.records import Record
from oncelog.storage.fs import DEFAULT_FS, DelegatingFileHandle, DelegatingFileSystem, FileHandle
from oncelog.tools.partition_dirs import Partition
from oncelog.tools.partition_reader import (
    AbortedRange,
    OffsetBelowLogStartError,
    aborted_transactions,
    committed_batches,
    index_floor_position,
    read_batches,
)
from oncelog.tools.partition_stat import PartitionStat, stat_partition

T0 = 1_700_000_000_000
# Small segments and a dense index: every read crosses segments and starts from an index entry.
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=300)
READ_ALL = 1 << 30


def stat(directory: Path) -> PartitionStat:
    return stat_partition(DEFAULT_FS, Partition(str(directory), None, str(directory.parent)), {})


def open_log(directory: Path, config: LogConfig = CONFIG) -> Log:
    return Log.open(directory, config, clock=lambda: T0)


def fill(log: Log, batches: int, *, tag: str = "r", pid: int = 5) -> None:
    """Batches of 1-6 records, some compressed, from one idempotent producer."""
    state = log.producer_state(pid)
    sequence = 0 if state is None else state.last_sequence + 1
    for n in range(batches):
        count = 1 + n % 6
        records = [(f"{tag}{n}-{i}".encode(), bytes([n % 251]) * (20 + 7 * i)) for i in range(count)]
        compression = ("lz4", None, "zstd", None)[n % 4]
        batch = encode_batch(
            records,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=sequence,
            timestamp_ms=T0 + n,
            compression=compression,
        )
        log.append(batch)
        sequence += count


def log_read(log: Log, start: int, end: int) -> list[tuple[int, bytes]]:
    """(base offset, bytes) of the batches Log.read serves for [start, end)."""
    out: list[tuple[int, bytes]] = []
    offset = start
    while offset < end:
        fetched = log.read(offset, READ_ALL)
        batches = [batch for batch in fetched.batches if batch.base_offset < end]
        out += [(batch.base_offset, batch.buffer.tobytes()) for batch in batches]
        if len(batches) < len(fetched.batches) or not fetched.batches:
            break
        offset = fetched.next_offset
    return out


def ours(directory: Path, start: int, end: int, **kwargs: object) -> list[tuple[int, bytes]]:
    return [
        (b.base_offset, b.buffer.tobytes()) for b in read_batches(None, str(directory), start, end, **kwargs)
    ]  # type: ignore[arg-type]


def files_digest(directory: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Log]]:
    """A closed-then-reopened multi-segment log, left open (its lock held) for the module."""
    directory = tmp_path_factory.mktemp("reader") / "orders-0"
    with open_log(directory) as log:
        fill(log, 150)
    log = open_log(directory)
    assert len(log.segments) >= 5
    yield directory, log
    log.close()


class TestRanges:
    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def test_every_range_reads_what_log_read_serves(
        self, written: tuple[Path, Log], data: st.DataObject
    ) -> None:
        directory, log = written
        end_offset = log.log_end_offset
        start = data.draw(st.integers(0, end_offset - 1), label="start")
        end = data.draw(st.integers(start + 1, end_offset), label="end")
        assert ours(directory, start, end) == log_read(log, start, end)

    def test_a_range_starting_mid_batch_includes_the_batch_holding_start(
        self, written: tuple[Path, Log]
    ) -> None:
        directory, log = written
        batch = next(b for b in log.read(40, READ_ALL).batches if b.records_count > 2)
        got = list(read_batches(None, str(directory), batch.base_offset + 1, batch.base_offset + 2))
        assert [b.base_offset for b in got] == [batch.base_offset]

    def test_a_range_across_segments_reads_every_segment_it_covers(self, written: tuple[Path, Log]) -> None:
        directory, log = written
        bases = [segment.base_offset for segment in log.segments]
        start, end = bases[1] - 1, bases[3] + 1
        got = ours(directory, start, end)
        assert got == log_read(log, start, end)
        assert {offset for offset, _ in got} >= {bases[1], bases[2], bases[3]}

    def test_the_whole_log_reads_to_the_end_stat_reports(self, written: tuple[Path, Log]) -> None:
        directory, log = written
        summary = stat(directory)
        got = list(read_batches(None, str(directory), summary.log_start_offset, summary.log_end_offset))
        assert got[-1].last_offset + 1 == summary.log_end_offset == log.log_end_offset
        assert [b.base_offset for b in got] == [offset for offset, _ in log_read(log, 0, log.log_end_offset)]

    def test_an_empty_range_reads_nothing(self, written: tuple[Path, Log]) -> None:
        directory, _ = written
        assert list(read_batches(None, str(directory), 7, 7)) == []
        with pytest.raises(ValueError):
            read_batches(None, str(directory), 8, 7)

    def test_reading_writes_nothing(self, written: tuple[Path, Log]) -> None:
        directory, log = written
        before = files_digest(directory)
        list(read_batches(None, str(directory), 0, log.log_end_offset, isolation="read_committed"))
        assert files_digest(directory) == before


class TestConcurrentWriter:
    def test_a_read_while_the_log_appends_stops_at_end(self, tmp_path: Path) -> None:
        directory = tmp_path / "live-0"
        with open_log(directory) as log:
            fill(log, 30)
            end = stat(directory).log_end_offset
            reader = read_batches(None, str(directory), 0, end)
            first = next(reader)
            fill(log, 30, tag="more")  # appends and rolls while the read is under way
            rest = list(reader)
            assert [(b.base_offset, b.buffer.tobytes()) for b in [first, *rest]] == log_read(log, 0, end)
            assert rest[-1].last_offset + 1 == end < log.log_end_offset

    def test_the_active_segments_preallocated_zeros_are_never_parsed(self, tmp_path: Path) -> None:
        directory = tmp_path / "zeros-0"
        with open_log(directory, LogConfig()) as log:  # one big active segment
            fill(log, 10)
            active = directory / f"{log.active_segment.base_offset:020d}.log"
            assert active.stat().st_size > log.active_segment.size  # space allocated ahead
            end = log.log_end_offset
            assert ours(directory, 0, end) == log_read(log, 0, end)

    def test_data_cut_below_end_is_out_of_range(self, tmp_path: Path) -> None:
        directory = tmp_path / "cut-0"
        with open_log(directory) as log:
            fill(log, 40)
            end = stat(directory).log_end_offset
            log.truncate_to(end - 20)
            with pytest.raises(OffsetOutOfRangeError, match="truncated or deleted meanwhile"):
                list(read_batches(None, str(directory), end - 30, end))


class TestLogStart:
    def test_a_start_below_the_first_segment_is_out_of_range_with_the_earliest_offset(
        self, tmp_path: Path
    ) -> None:
        directory = tmp_path / "retained-0"
        with open_log(directory) as log:
            fill(log, 60)
            log.delete_records(log.segments[2].base_offset)
            first = log.log_start_offset
            assert not (directory / f"{0:020d}.log").exists()
            with pytest.raises(OffsetBelowLogStartError) as caught:
                read_batches(None, str(directory), 0, log.log_end_offset)  # raised at the call
            assert caught.value.log_start_offset == first
            assert caught.value.directory == str(directory) and str(first) in str(caught.value)
            assert ours(directory, first, first + 1) == log_read(log, first, first + 1)

    def test_a_start_below_the_stored_log_start_is_out_of_range_though_its_segment_remains(
        self, tmp_path: Path
    ) -> None:
        directory = tmp_path / "deleted-0"
        with open_log(directory) as log:
            fill(log, 20)
            log.delete_records(3)  # inside the first segment, which stays
        assert (directory / f"{0:020d}.log").exists()
        with pytest.raises(OffsetBelowLogStartError) as caught:
            read_batches(None, str(directory), 2, 5)
        assert caught.value.log_start_offset == 3
        assert read_batches(None, str(directory), 2, 5, log_start=0) is not None  # the caller's start wins


class TestCorruption:
    def test_a_flipped_bit_raises_corrupt_record_naming_file_and_position(self, tmp_path: Path) -> None:
        directory = tmp_path / "flip-0"
        with open_log(directory) as log:
            fill(log, 40)
            segment = log.segments[1]
            position, victim = list(segment.scan())[3]
            end = log.log_end_offset
        path = directory / f"{segment.base_offset:020d}.log"
        raw = bytearray(path.read_bytes())
        raw[position + victim.size - 3] ^= 0x10
        path.write_bytes(raw)
        with pytest.raises(CorruptRecordError, match="CRC") as caught:
            list(read_batches(None, str(directory), 0, end))
        assert caught.value.path == str(path) and caught.value.position == position
        # A range that does not reach the damaged batch reads fine.
        assert ours(directory, 0, victim.base_offset)

    def test_a_batch_whose_offset_was_flipped_is_refused(self, tmp_path: Path) -> None:
        directory = tmp_path / "offset-0"
        with open_log(directory) as log:
            fill(log, 40)
            segment = log.segments[1]
            position, victim = list(segment.scan())[2]
            end = log.log_end_offset
        path = directory / f"{segment.base_offset:020d}.log"
        raw = bytearray(path.read_bytes())
        raw[position : position + 8] = struct.pack(">q", victim.base_offset - 5)  # outside the CRC
        path.write_bytes(raw)
        with pytest.raises(CorruptRecordError, match="do not fit") as caught:
            list(read_batches(None, str(directory), 0, end))
        assert caught.value.position == position


# -- read_committed ------------------------------------------------------------------------------
def transactional(log: Log, pid: int, sequence: int, count: int) -> int:
    records = [(f"p{pid}s{sequence + i}".encode(), b"t" * 12) for i in range(count)]
    log.append(
        encode_batch(
            records,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=sequence,
            is_transactional=True,
            timestamp_ms=T0,
        )
    )
    return sequence + count


def interleaved_transactions(log: Log) -> None:
    """Three transactional producers, aborts and commits interleaved with plain data, over several rolls."""
    sequences = {1: 0, 2: 0, 3: 0}
    script = [(1, 3), (2, 2), ("plain", 2), (1, 4), (3, 1), ("abort", 1), ("roll", 0), (2, 5), (3, 2)]
    script += [
        ("commit", 3),
        ("plain", 3),
        (1, 2),
        ("abort", 2),
        ("roll", 0),
        (1, 1),
        ("commit", 1),
        ("plain", 1),
    ]
    script += [(2, 3), (3, 4), ("abort", 3), ("commit", 2)]
    for action, arg in script:
        if action == "plain":
            log.append(encode_batch([(b"plain", b"x")] * arg, timestamp_ms=T0))
        elif action == "roll":
            log.roll()
        elif action in ("abort", "commit"):
            log.write_txn_marker(arg, 0, commit=action == "commit", coordinator_epoch=0)
        else:
            assert isinstance(action, int)
            sequences[action] = transactional(log, action, sequences[action], arg)


def committed_records(log: Log, start: int, end: int) -> tuple[list[Record], set[tuple[int, int]]]:
    """What Log.read(read_committed) serves for [start, end): records and aborted (pid, first offset)."""
    records: list[Record] = []
    aborted: set[tuple[int, int]] = set()
    offset = start
    while offset < end:
        fetched = log.read(offset, READ_ALL, isolation="read_committed")
        records += [r for r in fetched.records() if r.offset < end]
        aborted |= {(pid, first) for pid, first in fetched.aborted_transactions}
        if not fetched.batches:
            break
        offset = fetched.next_offset
    return records, aborted


@pytest.fixture(scope="module")
def transactions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Log]]:
    directory = tmp_path_factory.mktemp("txn") / "txn-0"
    log = open_log(directory)
    interleaved_transactions(log)
    yield directory, log
    log.close()


class TestReadCommitted:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def test_committed_rows_equal_log_reads(
        self, transactions: tuple[Path, Log], data: st.DataObject
    ) -> None:
        directory, log = transactions
        stable = stat(directory).last_stable_offset
        assert stable == log.last_stable_offset
        start = data.draw(st.integers(0, stable - 1), label="start")
        end = data.draw(st.integers(start + 1, stable), label="end")
        expected, expected_aborted = committed_records(log, start, end)
        batches = list(read_batches(None, str(directory), start, end, isolation="read_committed"))
        assert not any(batch.is_control for batch in batches)
        rows = [r for batch in batches for r in batch.records() if start <= r.offset < end]
        assert rows == expected
        # Log.read reports those overlapping whole fetches, which reach past `end`.
        found = aborted_transactions(None, str(directory), start, end)
        assert {(txn.producer_id, txn.first_offset) for txn in found} == {
            (pid, first) for pid, first in expected_aborted if first < end
        }

    def test_aborted_data_is_left_out_and_committed_data_kept(self, transactions: tuple[Path, Log]) -> None:
        directory, log = transactions
        end = log.last_stable_offset
        keys = {
            r.key
            for b in read_batches(None, str(directory), 0, end, isolation="read_committed")
            for r in b.records()
        }
        aborted = {b"p1s0", b"p1s6", b"p2s0", b"p2s6", b"p3s3", b"p3s6"}  # first and last of each
        assert not keys & aborted
        assert {b"p3s0", b"p3s2", b"p1s7", b"p1s9", b"p2s7", b"p2s9", b"plain"} <= keys
        uncommitted = {r.key for b in read_batches(None, str(directory), 0, end) for r in b.records()}
        assert aborted <= uncommitted

    def test_the_aborted_ranges_span_their_markers(self, transactions: tuple[Path, Log]) -> None:
        directory, log = transactions
        found = aborted_transactions(None, str(directory), 0, log.log_end_offset)
        assert [(txn.producer_id, txn.first_offset) for txn in found] == [(1, 0), (2, 3), (3, 33)]
        assert all(txn.first_offset < txn.last_offset for txn in found)

    def test_the_filter_drops_a_producers_batches_until_its_abort_marker(self) -> None:
        data = [
            RecordBatch(
                encode_batch(
                    [(b"a", b"1")],
                    base_offset=0,
                    producer_id=9,
                    producer_epoch=0,
                    base_sequence=0,
                    is_transactional=True,
                )
            ),
            RecordBatch(encode_batch([(b"b", b"2")], base_offset=1)),
            RecordBatch(
                encode_batch(
                    [(b"c", b"3")],
                    base_offset=3,
                    producer_id=9,
                    producer_epoch=0,
                    base_sequence=1,
                    is_transactional=True,
                )
            ),
        ]
        aborted = [AbortedRange(9, 0, 2)]
        # Without the marker batch in the stream, producer 9 stays "aborting" (Kafka's rule).
        assert [b.base_offset for b in committed_batches(data, aborted)] == [1]
        assert [b.base_offset for b in committed_batches(data, [])] == [0, 1, 3]


# -- the .index lookup -----------------------------------------------------------------------------
class BytesHandle:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def size(self) -> int:
        return len(self.data)

    def pread(self, size: int, offset: int) -> bytes:
        return self.data[offset : offset + size]


ENTRY = struct.Struct(">ii")


@pytest.mark.parametrize(
    ("entries", "zeros", "relative", "expected"),
    [
        ([], 10, 5, 0),
        ([(4, 100), (9, 250), (15, 400)], 50, 3, 0),
        ([(4, 100), (9, 250), (15, 400)], 50, 4, 100),
        ([(4, 100), (9, 250), (15, 400)], 50, 14, 250),
        ([(4, 100), (9, 250), (15, 400)], 50, 10**6, 400),
        ([(4, 100), (9, 250), (15, 400)], 0, 15, 400),
        ([(0, 0), (9, 250)], 7, 8, 0),  # a first entry (0, 0) is an entry, not the zero tail
        ([(0, 0), (9, 250)], 7, 9, 250),
    ],
)
def test_index_floor_position(
    entries: list[tuple[int, int]], zeros: int, relative: int, expected: int
) -> None:
    data = b"".join(ENTRY.pack(*entry) for entry in entries) + bytes(8 * zeros)
    assert index_floor_position(BytesHandle(data), relative) == expected  # type: ignore[arg-type]


class ReadRecorder(DelegatingFileSystem):
    """Records the position of every pread of a `.log` file."""

    def __init__(self) -> None:
        super().__init__()
        self.log_reads: list[int] = []

    def wrap(self, handle: FileHandle) -> FileHandle:
        recorder = self

        class Recording(DelegatingFileHandle):
            def pread(self, size: int, offset: int) -> bytes:
                if handle.path.endswith(".log"):
                    recorder.log_reads.append(offset)
                return super().pread(size, offset)

        return Recording(handle)


@pytest.mark.parametrize("live", [True, False], ids=["open-preallocated-index", "closed-trimmed-index"])
def test_a_read_deep_into_a_segment_starts_at_its_index_entry(tmp_path: Path, live: bool) -> None:
    directory = tmp_path / "deep-0"
    log = open_log(directory, LogConfig(index_interval_bytes=300))
    try:
        fill(log, 200)
        assert len(log.segments) == 1
        start, end = log.log_end_offset - 3, log.log_end_offset
        expected = log_read(log, start, end)
        entry = log.active_segment.offset_index.lookup(start)
        if not live:
            log.close()
        recorder = ReadRecorder()
        got = [
            (b.base_offset, b.buffer.tobytes()) for b in read_batches(recorder, str(directory), start, end)
        ]
    finally:
        log.close()
    assert got == expected
    assert entry.position > 0 and min(recorder.log_reads) == entry.position


def test_a_damaged_index_entry_falls_back_to_the_segment_start(tmp_path: Path) -> None:
    directory = tmp_path / "index-0"
    with open_log(directory) as log:
        fill(log, 40)
        end = log.log_end_offset
        expected = log_read(log, 0, end)
    index = directory / f"{0:020d}.index"
    raw = bytearray(index.read_bytes())
    assert len(raw) >= 16
    raw[4:8] = struct.pack(">i", 7)  # the first entry now points inside a batch
    index.write_bytes(raw)
    assert ours(directory, 0, end) == expected


# -- real Kafka directories ------------------------------------------------------------------------
def kafka_fixtures_root() -> Path:
    """As tests/conftest.py finds them; not imported from it, since `conftest` may name tests/spark's."""
    configured = os.environ.get("ONCELOG_FIXTURES")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "kafka"


def kafka_partitions() -> list[Path]:
    return sorted({log.parent for log in kafka_fixtures_root().glob("*/*/*.log")})


class OpenRecorder(DelegatingFileSystem):
    """Records how every file was opened."""

    def __init__(self) -> None:
        super().__init__()
        self.modes: list[tuple[str, bool, bool]] = []

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        self.modes.append((path, create, writable))
        return super().open(path, create=create, writable=writable)


@pytest.mark.parametrize("directory", kafka_partitions(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_kafka_directories_read_every_batch_in_place_read_only(directory: Path) -> None:
    """Read the shared fixture itself (never a copy): every batch, in order, opened read-only."""
    summary = stat(directory)
    raw: list[bytes] = []
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        position = 0
        while position < len(data):
            size = int.from_bytes(data[position + 8 : position + 12], "big") + 12
            raw.append(data[position : position + size])
            position += size
    recorder = OpenRecorder()
    got = list(read_batches(recorder, str(directory), summary.log_start_offset, summary.log_end_offset))
    assert [b.buffer.tobytes() for b in got] == raw
    assert recorder.modes and not any(create or writable for _, create, writable in recorder.modes)
