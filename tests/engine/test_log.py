"""Log: append, read, roll, reopen and fail closed (issue 2, brief §3-§5).

Each class is one concept; each test name reads as a sentence of the spec.
Batches are built with `encode_batch`, but every on-disk check reads the files
raw and decodes them with struct, independently of the engine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import crc32c
import pytest
from doubles import FsyncFailingFileSystem

from oncelog.config import LogConfig
from oncelog.errors import (
    CorruptLogError,
    CorruptRecordError,
    InvalidRecordError,
    LogClosedError,
    LogFailedError,
    NotASegmentError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from oncelog.log import Log
from oncelog.results import AppendResult, FetchResult
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.records import Record

# Header layout written out here, independently of segments/format.py.
BASE_OFFSET = struct.Struct(">q")
LENGTH_AT = 8
MAGIC_AT = 16
CRC_AT = 17
ATTRIBUTES_AT = 21
LAST_OFFSET_DELTA_AT = 23
MAX_TIMESTAMP_AT = 35
RECORDS_COUNT_AT = 57
HEADER_SIZE = 61
LOG_APPEND_TIME_BIT = 0x08
CONTROL_BIT = 0x20

T0 = 1_700_000_000_000


# -- helpers --------------------------------------------------------------------
def make_batch(
    count: int = 1,
    *,
    base_offset: int = 0,
    timestamp_ms: int = T0,
    value_size: int = 10,
    tag: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    records = [
        (f"k{tag}-{i}".encode(), bytes([(tag + i) % 256]) * value_size)  # key, value
        for i in range(count)
    ]
    return encode_batch(
        records,
        base_offset=base_offset,
        timestamp_ms=timestamp_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def fix_crc(buf: bytearray) -> bytearray:
    struct.pack_into(">I", buf, CRC_AT, crc32c.crc32c(bytes(buf[ATTRIBUTES_AT:])))
    return buf


def dir_digest(directory: Path) -> dict[str, str]:
    """sha256 of every file in the directory, by name."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()  # name -> digest
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def log_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def raw_batches(directory: Path) -> Iterator[tuple[Path, int, bytes]]:
    """(file, position, bytes) of every batch in every .log file, walked by length field.

    An open log's active segment file is pre-allocated past its data: the walk ends
    at the first all-zero header, and everything after it must be zeros (unwritten).
    """
    for path in log_files(directory):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            if data[pos : pos + MAGIC_AT + 1] == bytes(MAGIC_AT + 1):
                assert data[pos:] == bytes(len(data) - pos), f"non-zero bytes past the data of {path}"
                break
            size = int.from_bytes(data[pos + LENGTH_AT : pos + LENGTH_AT + 4], "big") + 12
            yield path, pos, data[pos : pos + size]
            pos += size


def read_all(log: Log, start: int | None = None) -> list[RecordBatch]:
    offset = log.log_start_offset if start is None else start
    out: list[RecordBatch] = []
    while offset < log.log_end_offset:
        fetched = log.read(offset)
        assert fetched.batches, f"read({offset}) returned nothing below {log.log_end_offset}"
        out.extend(fetched.batches)
        offset = fetched.next_offset
    return out


def all_records(log: Log) -> list[Record]:
    return [r for b in read_all(log) for r in b.records()]


def small_index_config(**overrides: int | str) -> LogConfig:
    # Small pre-allocated indexes keep whole-directory hashing cheap.
    return LogConfig(segment_index_bytes=4096, **overrides)  # type: ignore[arg-type]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topic-0"


@pytest.fixture
def log(log_dir: Path) -> Iterator[Log]:
    opened = Log.open(log_dir, small_index_config())
    yield opened
    opened.close()


# -- the package -----------------------------------------------------------------
class TestPackage:
    def test_log_and_log_config_are_importable_from_oncelog(self) -> None:
        import oncelog

        assert getattr(oncelog, "Log", None) is Log
        assert oncelog.LogConfig is LogConfig


# -- opening ---------------------------------------------------------------------
class TestOpen:
    def test_open_creates_a_missing_directory_and_starts_empty(self, tmp_path: Path) -> None:
        target = tmp_path / "a" / "b" / "t-3"
        with Log.open(target) as opened:
            assert target.is_dir()
            assert opened.log_start_offset == 0
            assert opened.log_end_offset == 0
            assert len(opened.segments) == 1
            assert opened.read(0).batches == []

    def test_a_log_file_with_a_non_numeric_name_raises_not_a_segment_naming_the_file(
        self,
        log_dir: Path,
    ) -> None:
        log_dir.mkdir()
        (log_dir / "not-a-segment.log").write_bytes(make_batch())
        with pytest.raises(NotASegmentError) as info:
            Log.open(log_dir)
        assert "not-a-segment.log" in str(info.value)
        assert info.value.path is not None and info.value.path.endswith("not-a-segment.log")

    def test_a_log_file_with_a_short_numeric_name_is_not_a_segment(self, log_dir: Path) -> None:
        log_dir.mkdir()
        (log_dir / "00042.log").write_bytes(b"")
        with pytest.raises(NotASegmentError, match=r"00042\.log"):
            Log.open(log_dir)


# -- appending -------------------------------------------------------------------
class TestAppendAssignsOffsets:
    @pytest.mark.parametrize("carried_base", [0, 7, 123_456_789, 2**62, -5])
    def test_appends_get_consecutive_offsets_whatever_base_offset_the_batch_carried(
        self,
        log: Log,
        carried_base: int,
    ) -> None:
        expected = 0
        for count in (1, 3, 1, 5, 2):
            result = log.append(make_batch(count, base_offset=carried_base))
            assert (result.first_offset, result.last_offset) == (expected, expected + count - 1)
            expected += count
        assert log.log_end_offset == expected
        read_offsets = [r.offset for r in all_records(log)]
        assert read_offsets == list(range(expected))

    def test_append_result_carries_first_and_last_offset_and_no_append_time(self, log: Log) -> None:
        log.append(make_batch(2))
        result = log.append(make_batch(4))
        assert isinstance(result, AppendResult)
        assert result.first_offset == 2
        assert result.last_offset == 5
        assert result.log_append_time_ms == -1
        assert result.duplicate is False

    def test_the_stored_batch_differs_from_the_input_only_in_its_base_offset(
        self,
        log: Log,
        log_dir: Path,
    ) -> None:
        log.append(make_batch(3, tag=1))
        sent = make_batch(4, base_offset=999_999, tag=2)
        log.append(sent)
        log.flush()
        stored = [raw for _, _, raw in raw_batches(log_dir)]
        assert len(stored) == 2
        assert stored[1][:8] == BASE_OFFSET.pack(3)
        assert stored[1][8:] == sent[8:]
        assert len(stored[1]) == len(sent)

    def test_a_batch_already_carrying_the_right_base_offset_is_stored_unchanged(
        self,
        log: Log,
        log_dir: Path,
    ) -> None:
        sent = make_batch(2, base_offset=0)
        log.append(sent)
        assert log.active_segment.size == len(sent)
        # The file is pre-allocated past the data: the batch, then nothing but zeros.
        data = log_files(log_dir)[0].read_bytes()
        assert data[: len(sent)] == sent
        assert data[len(sent) :] == bytes(len(data) - len(sent))
        log.close()
        assert log_files(log_dir)[0].read_bytes() == sent

    def test_append_batches_writes_every_batch_and_returns_one_result_each(
        self,
        log: Log,
        log_dir: Path,
    ) -> None:
        counts = [1, 4, 2, 3, 1, 5]
        sent = [make_batch(c, base_offset=77, tag=i) for i, c in enumerate(counts)]
        results = log.append_batches(sent)
        assert len(results) == len(counts)
        first = 0
        for result, count in zip(results, counts, strict=True):
            assert result == AppendResult(first, first + count - 1, -1, False)
            first += count
        stored = [raw for _, _, raw in raw_batches(log_dir)]
        assert [s[8:] for s in stored] == [b[8:] for b in sent]
        assert [BASE_OFFSET.unpack(s[:8])[0] for s in stored] == [r.first_offset for r in results]

    def test_append_batches_of_nothing_writes_nothing(self, log: Log, log_dir: Path) -> None:
        before = dir_digest(log_dir)
        assert log.append_batches([]) == []
        assert dir_digest(log_dir) == before
        assert log.log_end_offset == 0

    def test_append_accepts_bytearray_and_memoryview(self, log: Log) -> None:
        log.append(bytearray(make_batch(2)))
        log.append(memoryview(make_batch(3)))
        assert log.log_end_offset == 5
        assert all(b.is_valid() for b in read_all(log))


class TestAppendRecords:
    def test_keys_values_and_headers_round_trip_through_read(self, log: Log) -> None:
        records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
            (b"key-1", b"value-1", [("h1", b"x"), ("h2", None)]),
            (None, b"no key", []),
            (b"no value", None, [("\u00e9t\u00e9", b"\x00\xff")]),
            (None, None, []),
            (b"", b"", [("", b"")]),
        ]
        result = log.append_records(records, timestamp_ms=T0 + 5)
        assert (result.first_offset, result.last_offset) == (0, 4)
        got = list(log.read(0).records())
        assert [(r.key, r.value, list(r.headers)) for r in got] == [tuple(r) for r in records]
        assert [r.offset for r in got] == [0, 1, 2, 3, 4]
        assert {r.timestamp_ms for r in got} == {T0 + 5}

    def test_records_without_a_timestamp_get_the_log_clock(self, log_dir: Path) -> None:
        with Log.open(log_dir, small_index_config(), clock=lambda: 424_242) as timed:
            timed.append_records([(b"k", b"v")])
            (record,) = timed.read(0).records()
        assert record.timestamp_ms == 424_242

    def test_append_records_with_a_producer_stores_pid_epoch_and_sequence(self, log: Log) -> None:
        records = [(b"a", b"1"), (b"b", b"2")]
        log.append_records(records, producer_id=9, producer_epoch=3, base_sequence=0)
        (batch,) = log.read(0).batches
        assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (9, 3, 0)
        assert batch.last_sequence == 1

    def test_compressed_records_round_trip(self, log: Log) -> None:
        records = [(f"k{i}".encode(), b"payload " * 20) for i in range(30)]
        log.append_records(records, compression="gzip", timestamp_ms=T0)
        (batch,) = log.read(0).batches
        assert batch.compression == 1
        assert [(r.key, r.value) for r in log.read(0).records()] == records


# -- reading ---------------------------------------------------------------------
class TestRead:
    def test_read_returns_whole_batches_from_the_one_holding_the_start(self, log: Log) -> None:
        for i in range(4):
            log.append(make_batch(5, tag=i))
        fetched = log.read(7)
        assert isinstance(fetched, FetchResult)
        assert fetched.batches[0].base_offset == 5
        assert fetched.batches[0].last_offset == 9
        assert fetched.start_offset == 7
        assert fetched.next_offset == 20
        assert fetched.log_end_offset == 20

    def test_records_of_a_read_in_the_middle_of_a_batch_start_at_the_requested_offset(
        self,
        log: Log,
    ) -> None:
        for i in range(3):
            log.append(make_batch(5, tag=i))
        assert [r.offset for r in log.read(7).records()] == list(range(7, 15))
        assert [r.offset for r in log.read(14).records()] == [14]

    def test_read_returns_one_whole_batch_even_when_max_bytes_is_smaller(self, log: Log) -> None:
        big = make_batch(3, value_size=2000)
        log.append(big)
        log.append(make_batch(1))
        fetched = log.read(0, max_bytes=10)
        assert len(fetched.batches) == 1
        assert bytes(fetched.batches[0].buffer[8:]) == big[8:]
        assert fetched.batches[0].size == len(big)
        fetched.batches[0].validate()
        assert fetched.next_offset == 3

    def test_read_stops_before_the_batch_that_would_exceed_max_bytes(self, log: Log) -> None:
        sizes = []
        for i in range(6):
            batch = make_batch(1, value_size=100, tag=i)
            sizes.append(len(batch))
            log.append(batch)
        limit = sizes[0] + sizes[1] + sizes[2] // 2
        fetched = log.read(0, max_bytes=limit)
        assert [b.base_offset for b in fetched.batches] == [0, 1]
        assert fetched.size_bytes <= limit
        assert fetched.next_offset == 2

    def test_read_at_the_log_end_returns_no_batches(self, log: Log) -> None:
        log.append(make_batch(3))
        fetched = log.read(3)
        assert fetched.batches == []
        assert list(fetched.records()) == []
        assert fetched.next_offset == 3
        assert fetched.log_end_offset == 3

    @pytest.mark.parametrize("offset", [-1, 6, 10**12])
    def test_read_outside_the_log_raises_offset_out_of_range(self, log: Log, offset: int) -> None:
        log.append(make_batch(5))
        with pytest.raises(OffsetOutOfRangeError):
            log.read(offset)

    def test_read_below_a_log_start_above_zero_raises_offset_out_of_range(
        self,
        log_dir: Path,
    ) -> None:
        config = small_index_config(segment_bytes=1024)
        with Log.open(log_dir, config) as first:
            for i in range(12):
                first.append(make_batch(1, value_size=200, tag=i))
            bases = [s.base_offset for s in first.segments]
            first.delete_records(bases[1])  # the first segment goes, and the start is durable
        assert len(bases) >= 3
        assert not (log_dir / f"{bases[0]:020d}.log").exists()
        with Log.open(log_dir, config) as reopened:
            assert reopened.log_start_offset == bases[1]
            with pytest.raises(OffsetOutOfRangeError):
                reopened.read(bases[1] - 1)
            assert reopened.read(bases[1]).batches[0].base_offset == bases[1]
            assert reopened.log_end_offset == 12

    def test_max_offset_leaves_out_batches_that_reach_it(self, log: Log) -> None:
        for i in range(3):
            log.append(make_batch(3, tag=i))  # 0..2, 3..5, 6..8
        assert [b.base_offset for b in log.read(0, max_offset=6).batches] == [0, 3]
        assert [b.base_offset for b in log.read(0, max_offset=5).batches] == [0]
        assert [b.base_offset for b in log.read(0, max_offset=9).batches] == [0, 3, 6]
        assert log.read(0, max_offset=2).batches == []
        assert log.read(4, max_offset=6).next_offset == 6

    def test_read_batches_are_views_of_exactly_one_batch_each(self, log: Log) -> None:
        sent = [make_batch(i + 1, tag=i) for i in range(5)]
        log.append_batches(sent)
        fetched = log.read(0)
        assert [bytes(b.buffer[8:]) for b in fetched.batches] == [s[8:] for s in sent]
        for batch in fetched.batches:
            batch.validate()

    def test_every_offset_reads_back_its_own_batch(self, log: Log) -> None:
        counts = [1, 2, 5, 1, 3, 4, 1]
        log.append_batches([make_batch(c, tag=i) for i, c in enumerate(counts)])
        for offset in range(sum(counts)):
            first = log.read(offset, max_bytes=1).batches[0]
            assert first.base_offset <= offset <= first.last_offset
            assert next(iter(log.read(offset).records())).offset == offset


class TestOffsetForTimestamp:
    def test_finds_the_first_record_at_or_after_the_timestamp(self, log: Log) -> None:
        log.append(make_batch(2, timestamp_ms=100))
        log.append(make_batch(3, timestamp_ms=300))
        log.append(make_batch(1, timestamp_ms=300))
        log.append(make_batch(1, timestamp_ms=500))
        assert log.offset_for_timestamp(0) == (100, 0)
        assert log.offset_for_timestamp(100) == (100, 0)
        assert log.offset_for_timestamp(101) == (300, 2)
        assert log.offset_for_timestamp(300) == (300, 2)
        assert log.offset_for_timestamp(301) == (500, 6)
        assert log.offset_for_timestamp(501) is None


# -- rejection -------------------------------------------------------------------
def _bit_flip_in_body(good: bytes) -> bytes:
    buf = bytearray(good)
    buf[-3] ^= 0x10
    return bytes(buf)


def _wrong_magic(good: bytes) -> bytes:
    buf = bytearray(good)
    buf[MAGIC_AT] = 1
    return bytes(buf)


def _truncated(good: bytes) -> bytes:
    return good[: len(good) - 7]


def _header_only(good: bytes) -> bytes:
    return good[:30]


def _trailing_bytes(good: bytes) -> bytes:
    return good + b"\x00\x01\x02"


def _length_too_small(good: bytes) -> bytes:
    buf = bytearray(good)
    struct.pack_into(">i", buf, LENGTH_AT, len(good) - 12 - 4)
    return bytes(buf)


def _control_batch(good: bytes) -> bytes:
    buf = bytearray(good)
    attributes = struct.unpack_from(">h", buf, ATTRIBUTES_AT)[0] | CONTROL_BIT
    struct.pack_into(">h", buf, ATTRIBUTES_AT, attributes)
    return bytes(fix_crc(buf))


def _count_below_delta(good: bytes) -> bytes:
    buf = bytearray(good)
    struct.pack_into(">i", buf, RECORDS_COUNT_AT, 2)  # 3 records, lastOffsetDelta 2
    return bytes(fix_crc(buf))


def _delta_above_count(good: bytes) -> bytes:
    buf = bytearray(good)
    struct.pack_into(">i", buf, LAST_OFFSET_DELTA_AT, 9)
    return bytes(fix_crc(buf))


def _count_zero(good: bytes) -> bytes:
    buf = bytearray(good)
    struct.pack_into(">i", buf, RECORDS_COUNT_AT, 0)
    return bytes(fix_crc(buf))


def _count_above_delta(good: bytes) -> bytes:
    buf = bytearray(good)
    struct.pack_into(">i", buf, RECORDS_COUNT_AT, 4)
    return bytes(fix_crc(buf))


def _pid_without_sequence(good: bytes) -> bytes:
    return make_batch(3, producer_id=11, producer_epoch=0, base_sequence=-1)


Expected = type[Exception] | tuple[type[Exception], ...]
BAD_BATCHES: list[tuple[str, Callable[[bytes], bytes], Expected]] = [
    ("bad-crc", _bit_flip_in_body, CorruptRecordError),
    ("wrong-magic", _wrong_magic, CorruptRecordError),
    ("truncated", _truncated, CorruptRecordError),
    ("header-only", _header_only, CorruptRecordError),
    ("trailing-bytes", _trailing_bytes, CorruptRecordError),
    ("length-too-small", _length_too_small, CorruptRecordError),
    ("control-batch", _control_batch, InvalidRecordError),
    ("count-below-delta", _count_below_delta, InvalidRecordError),
    ("delta-above-count", _delta_above_count, InvalidRecordError),
    ("count-zero", _count_zero, InvalidRecordError),
    ("count-above-delta", _count_above_delta, (InvalidRecordError, CorruptRecordError)),
    ("pid-without-sequence", _pid_without_sequence, InvalidRecordError),
]
BAD_BATCH_PARAMS = [pytest.param(m, e, id=name) for name, m, e in BAD_BATCHES]


class TestRejectedBatchLeavesTheLogUnchanged:
    @pytest.fixture
    def populated(self, log: Log, log_dir: Path) -> Log:
        log.append_batches([make_batch(2, tag=1), make_batch(3, tag=2)])
        return log

    @pytest.mark.parametrize(("mutate", "error"), BAD_BATCH_PARAMS)
    def test_a_bad_batch_raises_its_error_and_changes_no_byte(
        self,
        populated: Log,
        log_dir: Path,
        mutate: Callable[[bytes], bytes],
        error: Expected,
    ) -> None:
        before = dir_digest(log_dir)
        bad = mutate(make_batch(3, tag=9))
        with pytest.raises(error):
            populated.append(bad)
        assert dir_digest(log_dir) == before
        assert populated.log_end_offset == 5
        # The log still works after the rejection.
        assert populated.append(make_batch(1)).first_offset == 5

    @pytest.mark.parametrize(("mutate", "error"), BAD_BATCH_PARAMS)
    def test_one_bad_batch_among_good_ones_in_append_batches_writes_nothing(
        self,
        populated: Log,
        log_dir: Path,
        mutate: Callable[[bytes], bytes],
        error: Expected,
    ) -> None:
        before = dir_digest(log_dir)
        request = [make_batch(2, tag=3), make_batch(1, tag=4), mutate(make_batch(3)), make_batch(2)]
        with pytest.raises(error):
            populated.append_batches(request)
        assert dir_digest(log_dir) == before
        assert populated.log_end_offset == 5

    def test_an_oversized_batch_raises_record_too_large_and_changes_no_byte(
        self,
        log_dir: Path,
    ) -> None:
        with Log.open(log_dir, small_index_config(max_batch_bytes=500)) as limited:
            fits = make_batch(1, value_size=300)
            assert len(fits) <= 500
            limited.append(fits)
            before = dir_digest(log_dir)
            too_big = make_batch(1, value_size=600)
            assert len(too_big) > 500
            with pytest.raises(RecordTooLargeError):
                limited.append(too_big)
            with pytest.raises(RecordTooLargeError):
                limited.append_batches([fits, too_big])
            assert dir_digest(log_dir) == before
            assert limited.log_end_offset == 1

    def test_a_batch_of_exactly_max_batch_bytes_is_accepted(self, log_dir: Path) -> None:
        batch = make_batch(1, value_size=300)
        with Log.open(log_dir, small_index_config(max_batch_bytes=len(batch))) as limited:
            assert limited.append(batch).first_offset == 0

    def test_a_producer_batch_with_a_sequence_is_accepted(self, log: Log) -> None:
        result = log.append(make_batch(2, producer_id=11, producer_epoch=0, base_sequence=0))
        assert (result.first_offset, result.last_offset) == (0, 1)

    def test_an_unknown_origin_is_refused_and_writes_nothing(self, log: Log, log_dir: Path) -> None:
        before = dir_digest(log_dir)
        with pytest.raises(ValueError):
            log.append(make_batch(1), origin="leader")  # type: ignore[arg-type]
        assert dir_digest(log_dir) == before


# -- replication -----------------------------------------------------------------
class TestReplicationOrigin:
    def test_a_replicated_batch_keeps_its_own_offsets(self, log: Log, log_dir: Path) -> None:
        sent = make_batch(3, base_offset=0)
        assert log.append(sent, origin="replication") == AppendResult(0, 2, -1, False)
        gap = make_batch(2, base_offset=10)
        result = log.append(gap, origin="replication")
        assert (result.first_offset, result.last_offset) == (10, 11)
        assert log.log_end_offset == 12
        stored = [raw for _, _, raw in raw_batches(log_dir)]
        assert stored == [sent, gap]
        assert [b.base_offset for b in log.read(3).batches] == [10]

    def test_a_replicated_batch_below_the_log_end_is_refused_and_changes_no_byte(
        self,
        log: Log,
        log_dir: Path,
    ) -> None:
        log.append(make_batch(5, base_offset=0), origin="replication")
        before = dir_digest(log_dir)
        for base in (0, 3, 4):
            with pytest.raises(InvalidRecordError):
                log.append(make_batch(2, base_offset=base), origin="replication")
        assert dir_digest(log_dir) == before
        assert log.log_end_offset == 5

    def test_a_replicated_request_with_an_offset_going_backwards_writes_nothing(
        self,
        log: Log,
        log_dir: Path,
    ) -> None:
        before = dir_digest(log_dir)
        request = [
            make_batch(2, base_offset=0),
            make_batch(2, base_offset=5),
            make_batch(1, base_offset=3),
        ]
        with pytest.raises(InvalidRecordError):
            log.append_batches(request, origin="replication")
        assert dir_digest(log_dir) == before
        assert log.log_end_offset == 0

    def test_a_replicated_request_refused_after_a_roll_point_writes_nothing(
        self,
        log_dir: Path,
    ) -> None:
        # The second batch would roll the segment; the third goes backwards.
        with Log.open(log_dir, small_index_config(segment_bytes=1024)) as replica:
            replica.append(make_batch(1, value_size=100), origin="replication")
            before = dir_digest(log_dir)
            request = [
                make_batch(1, base_offset=1, value_size=600),
                make_batch(1, base_offset=2, value_size=600),
                make_batch(1, base_offset=0),
            ]
            with pytest.raises(InvalidRecordError):
                replica.append_batches(request, origin="replication")
            assert replica.log_end_offset == 1
            assert [s.base_offset for s in replica.segments] == [0]
            assert dir_digest(log_dir) == before

    def test_replication_accepts_control_batches_and_loose_counts(self, log: Log) -> None:
        control = _control_batch(make_batch(1))
        assert log.append(control, origin="replication").first_offset == 0
        compacted = _delta_above_count(make_batch(3, base_offset=1))
        result = log.append(compacted, origin="replication")
        assert (result.first_offset, result.last_offset) == (1, 10)
        assert log.log_end_offset == 11

    def test_replication_still_refuses_a_corrupt_batch(self, log: Log, log_dir: Path) -> None:
        before = dir_digest(log_dir)
        with pytest.raises(CorruptRecordError):
            log.append(_bit_flip_in_body(make_batch(2)), origin="replication")
        assert dir_digest(log_dir) == before


# -- LogAppendTime ---------------------------------------------------------------
class TestLogAppendTime:
    def test_log_append_time_stamps_the_clock_into_a_batch_with_a_valid_crc(
        self,
        log_dir: Path,
    ) -> None:
        now = T0 + 987_654
        config = small_index_config(timestamp_type="LogAppendTime")
        with Log.open(log_dir, config, clock=lambda: now) as stamped:
            sent = make_batch(3, timestamp_ms=1_000, base_offset=55)
            result = stamped.append(sent)
            assert result.log_append_time_ms == now
            assert (result.first_offset, result.last_offset) == (0, 2)
            (batch,) = stamped.read(0).batches
            batch.validate()
            assert batch.max_timestamp == now
            assert batch.is_log_append_time
            assert [r.timestamp_ms for r in batch.records()] == [now] * 3
            assert stamped.offset_for_timestamp(now) == (now, 0)
        ((_, _, raw),) = raw_batches(log_dir)
        assert raw[:8] == BASE_OFFSET.pack(0)
        assert struct.unpack_from(">q", raw, MAX_TIMESTAMP_AT)[0] == now
        assert struct.unpack_from(">h", raw, ATTRIBUTES_AT)[0] & LOG_APPEND_TIME_BIT
        assert struct.unpack_from(">I", raw, CRC_AT)[0] == crc32c.crc32c(raw[ATTRIBUTES_AT:])
        # Records are untouched: only the header changed.
        assert raw[HEADER_SIZE:] == sent[HEADER_SIZE:]

    def test_each_append_gets_the_clock_of_its_own_call(self, log_dir: Path) -> None:
        ticks = iter(range(T0, T0 + 1000, 10))
        config = small_index_config(timestamp_type="LogAppendTime")
        with Log.open(log_dir, config, clock=lambda: next(ticks)) as stamped:
            first = stamped.append(make_batch(1))
            second = stamped.append(make_batch(1))
            assert second.log_append_time_ms > first.log_append_time_ms
            batches = stamped.read(0).batches
            assert [b.max_timestamp for b in batches] == [
                first.log_append_time_ms,
                second.log_append_time_ms,
            ]

    def test_create_time_keeps_the_producers_timestamps(self, log_dir: Path) -> None:
        with Log.open(log_dir, small_index_config(), clock=lambda: 5) as plain:
            plain.append(make_batch(2, timestamp_ms=1_234))
            (batch,) = plain.read(0).batches
            assert batch.max_timestamp == 1_234
            assert not batch.is_log_append_time


# -- rolling ---------------------------------------------------------------------
def assert_segment_files_match_their_bases(log_dir: Path, log: Log) -> None:
    names = [p.name for p in log_files(log_dir)]
    assert names == [f"{s.base_offset:020d}.log" for s in log.segments]
    for path in log_files(log_dir):
        data = path.read_bytes()
        if data:
            assert BASE_OFFSET.unpack(data[:8])[0] == int(path.stem)


class TestRolling:
    def test_a_segment_rolls_by_size_and_each_file_is_named_after_its_first_offset(
        self,
        log_dir: Path,
    ) -> None:
        config = small_index_config(segment_bytes=2048)
        with Log.open(log_dir, config) as rolling:
            for i in range(40):
                rolling.append(make_batch(1 + i % 3, value_size=150, tag=i))
            end = rolling.log_end_offset
            assert len(rolling.segments) >= 4
            rolling.flush()
            assert_segment_files_match_their_bases(log_dir, rolling)
            for path in log_files(log_dir):
                assert 0 < path.stat().st_size <= 2048
            assert [r.offset for r in all_records(rolling)] == list(range(end))

    def test_a_batch_larger_than_segment_bytes_gets_a_segment_of_its_own(
        self,
        log_dir: Path,
    ) -> None:
        with Log.open(log_dir, small_index_config(segment_bytes=1024)) as rolling:
            rolling.append(make_batch(1))
            rolling.append(make_batch(1, value_size=3000))
            rolling.append(make_batch(1))
            assert [s.base_offset for s in rolling.segments] == [0, 1, 2]
            assert [b.base_offset for b in read_all(rolling)] == [0, 1, 2]

    def test_append_batches_rolls_within_one_request(self, log_dir: Path) -> None:
        with Log.open(log_dir, small_index_config(segment_bytes=1024)) as rolling:
            request = [make_batch(2, value_size=200, tag=i) for i in range(10)]
            results = rolling.append_batches(request)
            assert [r.first_offset for r in results] == list(range(0, 20, 2))
            rolling.flush()
            sizes = {p.name: p.stat().st_size for p in log_files(log_dir)}
            assert all(size <= 1024 for size in sizes.values()), sizes
            assert len(rolling.segments) >= 5
            assert_segment_files_match_their_bases(log_dir, rolling)
            assert [b.base_offset for b in read_all(rolling)] == list(range(0, 20, 2))

    def test_a_segment_rolls_when_timestamps_span_more_than_segment_ms(self, log_dir: Path) -> None:
        with Log.open(log_dir, small_index_config(segment_ms=1_000)) as rolling:
            rolling.append(make_batch(1, timestamp_ms=10_000))
            rolling.append(make_batch(1, timestamp_ms=10_900))
            assert len(rolling.segments) == 1
            rolling.append(make_batch(2, timestamp_ms=12_000))
            rolling.append(make_batch(1, timestamp_ms=12_500))
            assert [s.base_offset for s in rolling.segments] == [0, 2]
            rolling.append(make_batch(1, timestamp_ms=20_000))
            assert [s.base_offset for s in rolling.segments] == [0, 2, 5]
            rolling.flush()
            assert_segment_files_match_their_bases(log_dir, rolling)

    def test_append_batches_rolls_by_time_within_one_request(self, log_dir: Path) -> None:
        with Log.open(log_dir, small_index_config(segment_ms=1_000)) as rolling:
            rolling.append(make_batch(1, timestamp_ms=10_000))
            stamps = [10_500, 12_000, 12_500, 20_000, 20_100]
            rolling.append_batches([make_batch(1, timestamp_ms=ts) for ts in stamps])
            assert [s.base_offset for s in rolling.segments] == [0, 2, 4]

    def test_a_full_index_rolls_the_segment(self, log_dir: Path) -> None:
        # 48 bytes hold 6 offset entries and 4 time entries; interval 0 indexes every batch.
        tiny = LogConfig(segment_index_bytes=48, index_interval_bytes=0)
        with Log.open(log_dir, tiny) as rolling:
            for i in range(30):
                rolling.append(make_batch(1, timestamp_ms=T0 + i, tag=i))
            assert len(rolling.segments) >= 5
            for segment in rolling.segments:
                assert segment.offset_index.entries <= 6
                assert segment.time_index.entries <= 4
            assert [b.base_offset for b in read_all(rolling)] == list(range(30))
            rolling.flush()
            assert_segment_files_match_their_bases(log_dir, rolling)

    def test_the_same_appends_with_roomy_indexes_stay_in_one_segment(self, log_dir: Path) -> None:
        with Log.open(log_dir, LogConfig(index_interval_bytes=0)) as roomy:
            for i in range(30):
                roomy.append(make_batch(1, timestamp_ms=T0 + i, tag=i))
            assert len(roomy.segments) == 1

    def test_explicit_roll_starts_a_segment_at_the_log_end(self, log: Log, log_dir: Path) -> None:
        log.append(make_batch(3))
        segment = log.roll()
        assert segment.base_offset == 3
        assert log.active_segment is segment
        assert (log_dir / f"{3:020d}.log").exists()
        assert log.append(make_batch(2)).first_offset == 3
        assert [s.base_offset for s in log.segments] == [0, 3]
        assert [b.base_offset for b in read_all(log)] == [0, 3]

    def test_roll_on_an_empty_active_segment_is_a_no_op(self, log: Log, log_dir: Path) -> None:
        assert log.roll() is log.active_segment
        assert [s.base_offset for s in log.segments] == [0]
        log.append(make_batch(1))
        log.roll()
        before = sorted(p.name for p in log_dir.iterdir())
        again = log.roll()
        assert again.base_offset == 1
        assert [s.base_offset for s in log.segments] == [0, 1]
        assert sorted(p.name for p in log_dir.iterdir()) == before

    def test_a_rolled_segment_has_trimmed_indexes(self, log: Log, log_dir: Path) -> None:
        log.append(make_batch(1))
        log.roll()
        assert (log_dir / f"{0:020d}.index").stat().st_size % 8 == 0
        assert (log_dir / f"{0:020d}.index").stat().st_size < 4096
        assert (log_dir / f"{0:020d}.timeindex").stat().st_size % 12 == 0


# -- reopening -------------------------------------------------------------------
def _fill(log: Log, batches: int, rng: random.Random) -> list[bytes]:
    sent = []
    for i in range(batches):
        count, size = rng.randint(1, 4), rng.randint(0, 300)
        batch = make_batch(count, value_size=size, tag=i, timestamp_ms=T0 + i)
        log.append(batch)
        sent.append(batch)
    return sent


def _bodies(log: Log) -> list[bytes]:
    return [bytes(b.buffer[8:]) for b in read_all(log)]


class TestReopen:
    def test_reopen_after_close_keeps_every_batch_and_the_log_end(self, log_dir: Path) -> None:
        config = small_index_config(segment_bytes=4096, index_interval_bytes=256)
        with Log.open(log_dir, config) as first:
            sent = _fill(first, 60, random.Random(1))
            end = first.log_end_offset
            segments = [s.base_offset for s in first.segments]
        assert len(segments) > 2
        with Log.open(log_dir, config) as again:
            assert again.log_end_offset == end
            assert [s.base_offset for s in again.segments] == segments
            assert _bodies(again) == [s[8:] for s in sent]
            assert again.append(make_batch(2)).first_offset == end
            assert again.offset_for_timestamp(T0 + 30) is not None

    def test_reopen_with_a_default_config_reads_what_a_small_config_wrote(
        self,
        log_dir: Path,
    ) -> None:
        with Log.open(log_dir, small_index_config(segment_bytes=2048)) as first:
            sent = _fill(first, 30, random.Random(2))
            end = first.log_end_offset
        with Log.open(log_dir) as again:
            assert again.log_end_offset == end
            assert _bodies(again) == [s[8:] for s in sent]

    def test_a_copy_taken_while_the_log_is_open_keeps_every_appended_batch(
        self,
        tmp_path: Path,
        log_dir: Path,
    ) -> None:
        # Copying the files of a live log is what a kill -9 leaves: page cache, no close.
        config = small_index_config(segment_bytes=4096, index_interval_bytes=256)
        live = Log.open(log_dir, config)
        try:
            sent = _fill(live, 50, random.Random(3))
            end = live.log_end_offset
            crashed = tmp_path / "crashed-0"
            shutil.copytree(log_dir, crashed)
        finally:
            live.close()
        with Log.open(crashed, config) as recovered:
            assert recovered.log_end_offset == end
            assert _bodies(recovered) == [s[8:] for s in sent]
            assert recovered.append(make_batch(1)).first_offset == end

    def test_a_copy_taken_right_after_a_roll_keeps_every_batch(
        self,
        tmp_path: Path,
        log_dir: Path,
    ) -> None:
        live = Log.open(log_dir, small_index_config())
        try:
            sent = _fill(live, 5, random.Random(4))
            live.roll()
            end = live.log_end_offset
            crashed = tmp_path / "crashed-0"
            shutil.copytree(log_dir, crashed)
        finally:
            live.close()
        with Log.open(crashed, small_index_config()) as recovered:
            assert recovered.log_end_offset == end
            assert _bodies(recovered) == [s[8:] for s in sent]
            assert recovered.append(make_batch(1)).first_offset == end


class TestReopenEdgeCases:
    def test_reopen_after_a_roll_and_close_keeps_the_empty_active_segment(
        self,
        log_dir: Path,
    ) -> None:
        with Log.open(log_dir, small_index_config()) as first:
            first.append(make_batch(3))
            first.roll()
        with Log.open(log_dir, small_index_config()) as again:
            assert [s.base_offset for s in again.segments] == [0, 3]
            assert again.log_end_offset == 3
            assert again.append(make_batch(1)).first_offset == 3
            assert [b.base_offset for b in read_all(again)] == [0, 3]

    def test_missing_indexes_of_sealed_segments_are_rebuilt(self, log_dir: Path) -> None:
        config = small_index_config(segment_bytes=2048, index_interval_bytes=128)
        with Log.open(log_dir, config) as first:
            sent = _fill(first, 40, random.Random(7))
            end = first.log_end_offset
            bases = [s.base_offset for s in first.segments]
        assert len(bases) >= 3
        for base in bases[:-1]:
            (log_dir / f"{base:020d}.index").unlink()
            (log_dir / f"{base:020d}.timeindex").unlink()
        with Log.open(log_dir, config) as again:
            assert again.log_end_offset == end
            assert _bodies(again) == [s[8:] for s in sent]
            for offset in range(end):
                first_batch = again.read(offset, max_bytes=1).batches[0]
                assert first_batch.base_offset <= offset <= first_batch.last_offset
            assert again.offset_for_timestamp(T0 + 20) is not None


class TestTornTail:
    @staticmethod
    def _tails() -> list[tuple[str, bytes]]:
        half = make_batch(4, value_size=100, tag=7)
        return [
            ("garbage", random.Random(5).randbytes(3000)),
            ("zeros", bytes(4096)),
            ("half-batch", half[: len(half) // 2]),
            ("header-fragment", half[:10]),
            ("one-byte", b"\x00"),
            ("whole-batch-with-bad-crc", _bit_flip_in_body(half)),
            ("batch-going-backwards", make_batch(1, base_offset=0)),
        ]

    @pytest.mark.parametrize("name", [name for name, _ in _tails()])
    def test_reopen_cuts_a_torn_tail_and_appends_continue_after_the_last_whole_batch(
        self,
        log_dir: Path,
        name: str,
    ) -> None:
        tail = dict(self._tails())[name]
        config = small_index_config(segment_bytes=4096)
        with Log.open(log_dir, config) as first:
            sent = _fill(first, 25, random.Random(6))
            end = first.log_end_offset
        last = log_files(log_dir)[-1]
        intact = last.read_bytes()
        with last.open("ab") as f:
            f.write(tail)
        with Log.open(log_dir, config) as recovered:
            assert recovered.log_end_offset == end
            assert last.read_bytes() == intact
            assert _bodies(recovered) == [s[8:] for s in sent]
            result = recovered.append(make_batch(2, tag=99))
            assert result.first_offset == end
            assert [r.offset for r in recovered.read(end).records()] == [end, end + 1]
        with Log.open(log_dir, config) as again:
            assert again.log_end_offset == end + 2

    def test_a_cut_below_the_recovery_point_is_corruption_unless_truncation_is_asked_for(
        self,
        log_dir: Path,
    ) -> None:
        with Log.open(log_dir, small_index_config()) as first:
            first.append(make_batch(2, tag=1))
            first.append(make_batch(3, tag=2))
            sizes = [b.size for b in first.read(0).batches]
        path = log_files(log_dir)[0]
        data = path.read_bytes()
        # close() fsynced both batches, so losing part of the second is not a torn write.
        path.write_bytes(data[: sizes[0] + sizes[1] - 5])
        with pytest.raises(CorruptLogError) as raised:
            Log.open(log_dir, small_index_config())
        assert raised.value.path == str(path)
        assert raised.value.position == sizes[0]
        config = dataclasses.replace(small_index_config(), on_corruption="truncate")
        with Log.open(log_dir, config) as recovered:
            assert recovered.log_end_offset == 2
            assert path.stat().st_size == sizes[0]
            assert recovered.append(make_batch(1)).first_offset == 2


# -- closing and failing ---------------------------------------------------------
class TestClosed:
    @pytest.mark.parametrize(
        "operation",
        [
            pytest.param(lambda lg: lg.append(make_batch(1)), id="append"),
            pytest.param(lambda lg: lg.append_batches([make_batch(1)]), id="append_batches"),
            pytest.param(lambda lg: lg.append_records([(b"k", b"v")]), id="append_records"),
            pytest.param(lambda lg: lg.read(0), id="read"),
            pytest.param(lambda lg: lg.offset_for_timestamp(0), id="offset_for_timestamp"),
            pytest.param(lambda lg: lg.roll(), id="roll"),
            pytest.param(lambda lg: lg.flush(), id="flush"),
        ],
    )
    def test_operations_after_close_raise_log_closed(
        self,
        log_dir: Path,
        operation: Callable[[Log], object],
    ) -> None:
        closed = Log.open(log_dir, small_index_config())
        closed.append(make_batch(1))
        closed.close()
        with pytest.raises(LogClosedError):
            operation(closed)

    def test_close_twice_is_harmless_and_the_context_manager_closes(self, log_dir: Path) -> None:
        with Log.open(log_dir, small_index_config()) as managed:
            managed.append(make_batch(1))
        with pytest.raises(LogClosedError):
            managed.read(0)
        managed.close()


class TestFsyncFailureFailsClosed:
    def test_flush_goes_through_the_seam(self, log_dir: Path) -> None:
        fs = FsyncFailingFileSystem()
        with Log.open(log_dir, small_index_config(), fs=fs) as seamed:
            seamed.append(make_batch(1))
            calls = fs.fsync_calls
            seamed.flush()
            assert fs.fsync_calls > calls

    def test_a_failed_fsync_raises_storage_failed_and_later_appends_are_refused(
        self,
        log_dir: Path,
    ) -> None:
        fs = FsyncFailingFileSystem()
        failing = Log.open(log_dir, small_index_config(), fs=fs)
        try:
            failing.append(make_batch(2))
            fs.failing = True
            with pytest.raises(LogFailedError):
                failing.flush()
            # Fail closed: even once fsync would work again, nothing is accepted.
            fs.failing = False
            with pytest.raises(LogFailedError):
                failing.append(make_batch(1))
            with pytest.raises(LogFailedError):
                failing.append_batches([make_batch(1)])
            with pytest.raises(LogFailedError):
                failing.append_records([(b"k", b"v")])
            with pytest.raises(LogFailedError):
                failing.flush()
            with pytest.raises(LogFailedError):
                failing.roll()
            assert failing.log_end_offset == 2
        finally:
            with pytest.raises(LogFailedError, match="without a flush"):
                failing.close()  # failed earlier: it lets go of everything, and says so
        with Log.open(log_dir, small_index_config()) as reopened:
            assert reopened.log_end_offset == 2
            assert reopened.append(make_batch(1)).first_offset == 2

    def test_a_failed_fsync_during_a_roll_fails_closed(self, log_dir: Path) -> None:
        fs = FsyncFailingFileSystem()
        failing = Log.open(log_dir, small_index_config(segment_bytes=1024), fs=fs)
        try:
            failing.append(make_batch(1, value_size=600))
            fs.failing = True
            with pytest.raises(LogFailedError):
                failing.append(make_batch(1, value_size=600))
            fs.failing = False
            with pytest.raises(LogFailedError):
                failing.append(make_batch(1))
            assert failing.log_end_offset == 1
        finally:
            with pytest.raises(LogFailedError, match="without a flush"):
                failing.close()  # failed earlier: it lets go of everything, and says so


# -- the largest offsets --------------------------------------------------------------------
class TestOffsetLimits:
    """Offsets are i64, and so is the log end one past the last: 2^63-1 can never be taken."""

    def test_a_replicated_batch_running_past_2_to_the_63_is_refused_and_changes_nothing(
        self, log: Log, log_dir: Path
    ) -> None:
        before = dir_digest(log_dir)
        two_records = encode_batch([(b"k", b"v"), (b"k", b"w")], base_offset=2**63 - 1)
        with pytest.raises(InvalidRecordError, match="past the largest"):
            log.append(two_records, origin="replication")
        with pytest.raises(InvalidRecordError):
            log.append(encode_batch([(b"k", b"v")], base_offset=2**63 - 1), origin="replication")
        assert dir_digest(log_dir) == before
        assert log.log_end_offset == 0

    def test_a_log_that_reaches_the_largest_offset_refuses_more_and_still_closes_and_reopens(
        self, log_dir: Path
    ) -> None:
        with Log.open(log_dir, small_index_config()) as log:
            log.append(encode_batch([(b"k", b"v")]), origin="replication")
            last = encode_batch([(b"k", b"v")], base_offset=2**63 - 2)
            assert log.append(last, origin="replication").first_offset == 2**63 - 2
            assert log.log_end_offset == 2**63 - 1
            # A batch far past the segment's i32 relative offsets got a segment of its own.
            assert [s.base_offset for s in log.segments] == [0, 2**63 - 2]
            with pytest.raises(InvalidRecordError):
                log.append(encode_batch([(b"k", b"next")]))
        with Log.open(log_dir, small_index_config()) as reopened:
            assert reopened.log_end_offset == 2**63 - 1
            assert [b.base_offset for b in reopened.read(2**63 - 2).batches] == [2**63 - 2]
            assert reopened.read(0).batches[0].base_offset == 0
