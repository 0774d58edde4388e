"""RecordBatch: the zero-copy view of one v2 batch, iter_batches and encode_batch (brief §3)."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from oncelog.bench.references import kafka_python_batch
from oncelog.errors import CorruptRecordError
from oncelog.segments.batch import (
    RecordBatch,
    TailChecks,
    TruncatedBatchError,
    batch_size_at,
    encode_batch,
    iter_batches,
    walk_whole_batches,
)
from oncelog.segments.records import Record

# Field offsets and struct formats written out here, independently of segments/format.py.
HEADER_FIELDS = [
    ("base_offset", 0, ">q"),
    ("batch_length", 8, ">i"),
    ("partition_leader_epoch", 12, ">i"),
    ("magic", 16, ">b"),
    ("crc", 17, ">I"),
    ("attributes", 21, ">h"),
    ("last_offset_delta", 23, ">i"),
    ("base_timestamp", 27, ">q"),
    ("max_timestamp", 35, ">q"),
    ("producer_id", 43, ">q"),
    ("producer_epoch", 51, ">h"),
    ("base_sequence", 53, ">i"),
    ("records_count", 57, ">i"),
]
HEADER_SIZE = 61

SAMPLE_BASE_OFFSET = 1_234_567_890_123
SAMPLE_PRODUCER_ID = 987_654_321_987
SAMPLE_EPOCH = 7
SAMPLE_BASE_SEQUENCE = 42
SAMPLE_LEADER_EPOCH = 5
SAMPLE_RECORDS = [
    Record(0, 1_700_000_000_500, b"key-0", b"value-0", (("h", b"1"),)),
    Record(0, 1_700_000_000_100, None, b"value-1", ()),
    Record(0, 1_700_000_000_900, b"key-2", None, (("trace", None),)),
    Record(0, 1_700_000_000_300, b"", b"", ()),
]


def sample_batch(**overrides: object) -> bytes:
    kwargs: dict[str, object] = {
        "base_offset": SAMPLE_BASE_OFFSET,
        "producer_id": SAMPLE_PRODUCER_ID,
        "producer_epoch": SAMPLE_EPOCH,
        "base_sequence": SAMPLE_BASE_SEQUENCE,
        "is_transactional": True,
        "partition_leader_epoch": SAMPLE_LEADER_EPOCH,
    }
    kwargs.update(overrides)
    records = kwargs.pop("records", SAMPLE_RECORDS)
    return encode_batch(records, **kwargs)  # type: ignore[arg-type]


def simple_batch(count: int, base_offset: int = 0, **kwargs: object) -> bytes:
    records = [(f"k{i}".encode(), f"v{i}".encode() * (i + 1)) for i in range(count)]
    kwargs.setdefault("timestamp_ms", 1_000)
    return encode_batch(records, base_offset=base_offset, **kwargs)  # type: ignore[arg-type]


def patch(raw: bytes, offset: int, fmt: str, value: int, *, recompute_crc: bool = True) -> bytes:
    """Overwrite one header field and (by default) recompute the CRC over bytes [21, end)."""
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, offset, value)
    if recompute_crc:
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def unpack(raw: bytes, offset: int, fmt: str) -> int:
    return int(struct.unpack_from(fmt, raw, offset)[0])


# -- header fields ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "offset", "fmt"), HEADER_FIELDS)
def test_header_property_matches_the_bytes_at_its_offset(name: str, offset: int, fmt: str) -> None:
    raw = sample_batch()
    assert getattr(RecordBatch(raw), name) == unpack(raw, offset, fmt)


def test_header_holds_the_values_the_batch_was_built_with() -> None:
    raw = sample_batch()
    batch = RecordBatch(raw)
    assert batch.base_offset == SAMPLE_BASE_OFFSET
    assert batch.batch_length == len(raw) - 12
    assert batch.size == len(raw)
    assert batch.partition_leader_epoch == SAMPLE_LEADER_EPOCH
    assert batch.magic == 2
    assert batch.crc == crc32c.crc32c(raw[21:])
    assert batch.compute_crc() == batch.crc
    assert batch.last_offset_delta == len(SAMPLE_RECORDS) - 1
    assert batch.base_timestamp == SAMPLE_RECORDS[0].timestamp_ms
    assert batch.max_timestamp == max(r.timestamp_ms for r in SAMPLE_RECORDS)
    assert batch.producer_id == SAMPLE_PRODUCER_ID
    assert batch.producer_epoch == SAMPLE_EPOCH
    assert batch.base_sequence == SAMPLE_BASE_SEQUENCE
    assert batch.records_count == len(SAMPLE_RECORDS)


@settings(deadline=None, max_examples=200)
@given(
    base_offset=st.integers(0, 2**63 - 1),
    producer_id=st.integers(-1, 2**63 - 1),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
    leader_epoch=st.integers(-1, 2**31 - 1),
    timestamp=st.integers(-1, 2**50),
    count=st.integers(1, 20),
    transactional=st.booleans(),
)
def test_header_fields_round_trip_through_encode_batch(
    base_offset: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    leader_epoch: int,
    timestamp: int,
    count: int,
    transactional: bool,
) -> None:
    raw = encode_batch(
        [(None, b"v")] * count,
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=transactional,
        timestamp_ms=timestamp,
        partition_leader_epoch=leader_epoch,
    )
    batch = RecordBatch(raw)
    for name, offset, fmt in HEADER_FIELDS:
        assert getattr(batch, name) == unpack(raw, offset, fmt), name
    assert batch.base_offset == base_offset
    assert batch.producer_id == producer_id
    assert batch.producer_epoch == producer_epoch
    assert batch.base_sequence == base_sequence
    assert batch.partition_leader_epoch == leader_epoch
    assert batch.base_timestamp == timestamp
    assert batch.max_timestamp == timestamp
    assert batch.records_count == count
    assert batch.last_offset == base_offset + count - 1
    assert batch.is_transactional is transactional
    batch.validate()


def test_header_is_61_bytes_and_records_follow_it() -> None:
    raw = encode_batch([(None, b"v")], timestamp_ms=0)
    # one record: length 7 (zigzag 0e), attrs, tsDelta, offsetDelta, key -1, value len 1, "v",
    # header count 0
    assert raw[HEADER_SIZE:] == bytes([14, 0, 0, 0, 1, 2]) + b"v" + b"\x00"
    assert RecordBatch(raw).batch_length == HEADER_SIZE - 12 + 8


# -- derived fields ---------------------------------------------------------------------


def test_last_offset_is_base_offset_plus_last_offset_delta() -> None:
    batch = RecordBatch(simple_batch(5, base_offset=100))
    assert batch.last_offset_delta == 4
    assert batch.last_offset == 104


def test_single_record_batch_last_offset_is_its_base_offset() -> None:
    batch = RecordBatch(simple_batch(1, base_offset=77))
    assert batch.last_offset == 77


@pytest.mark.parametrize(
    ("base_sequence", "count", "expected_last"),
    [
        (0, 1, 0),
        (10, 5, 14),
        (2**31 - 3, 3, 2**31 - 1),
        (2**31 - 1, 1, 2**31 - 1),
        (2**31 - 1, 2, 0),
        (2**31 - 1, 3, 1),
        (2**31 - 2, 10, 7),
    ],
)
def test_last_sequence_wraps_from_int32_max_to_zero(
    base_sequence: int, count: int, expected_last: int
) -> None:
    raw = simple_batch(count, producer_id=1, producer_epoch=0, base_sequence=base_sequence)
    assert RecordBatch(raw).last_sequence == expected_last


def test_last_sequence_of_a_batch_without_sequence_is_no_sequence() -> None:
    assert RecordBatch(simple_batch(3)).last_sequence == -1


def test_last_sequence_uses_last_offset_delta_not_records_count() -> None:
    # A compacted batch keeps its lastOffsetDelta while losing records.
    raw = patch(simple_batch(2, producer_id=1, producer_epoch=0, base_sequence=100), 23, ">i", 9)
    batch = RecordBatch(raw)
    assert batch.records_count == 2
    assert batch.last_sequence == 109
    assert batch.last_offset == 9


def test_non_transactional_batch_has_no_transactional_or_control_flag() -> None:
    batch = RecordBatch(simple_batch(2))
    assert batch.attributes == 0
    assert batch.is_transactional is False
    assert batch.is_control is False
    assert batch.is_log_append_time is False
    assert batch.timestamp_type == "CreateTime"


def test_transactional_batch_sets_attribute_bit_4() -> None:
    raw = simple_batch(2, producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True)
    batch = RecordBatch(raw)
    assert unpack(raw, 21, ">h") & 0x10
    assert batch.attributes == 0x10
    assert batch.is_transactional is True
    assert batch.is_control is False


def test_control_attribute_bit_5_makes_a_control_batch() -> None:
    raw = patch(simple_batch(1), 21, ">h", 0x20 | 0x10)
    batch = RecordBatch(raw)
    assert batch.is_control is True
    assert batch.is_transactional is True
    assert batch.compression == 0
    batch.validate()


@pytest.mark.parametrize(
    ("codec", "code"),
    [(None, 0), ("none", 0), ("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4), (3, 3)],
)
def test_compression_flag_is_attribute_bits_0_to_2(codec: str | int | None, code: int) -> None:
    raw = simple_batch(3, compression=codec)
    batch = RecordBatch(raw)
    assert unpack(raw, 21, ">h") & 0x07 == code
    assert batch.compression == code
    assert batch.compression_name == ["none", "gzip", "snappy", "lz4", "zstd"][code]
    assert batch.is_transactional is False


def test_compression_bits_do_not_leak_into_other_flags() -> None:
    raw = simple_batch(2, compression="zstd", producer_id=1, producer_epoch=0, base_sequence=0)
    batch = RecordBatch(raw)
    assert batch.attributes == 4
    assert not batch.is_transactional
    assert not batch.is_control
    assert not batch.is_log_append_time


def test_unknown_compression_name_is_rejected_by_encode_batch() -> None:
    with pytest.raises(ValueError):
        simple_batch(1, compression="brotli")
    with pytest.raises(ValueError):
        simple_batch(1, compression=5)


def test_encode_batch_rejects_an_empty_batch() -> None:
    with pytest.raises(ValueError):
        encode_batch([], timestamp_ms=0)


# -- buffer and zero copy ---------------------------------------------------------------


def test_batch_buffer_is_exactly_the_batch_when_bytes_trail_it() -> None:
    raw = sample_batch()
    batch = RecordBatch(raw + b"trailing bytes that belong to no batch" + simple_batch(2))
    assert batch.size == len(raw)
    assert batch.buffer.tobytes() == raw
    assert len(batch.buffer) == len(raw)
    assert [r.value for r in batch.records()] == [r.value for r in SAMPLE_RECORDS]
    batch.validate()


def test_batch_buffer_shares_memory_with_a_bytearray_input() -> None:
    data = bytearray(sample_batch())
    batch = RecordBatch(data)
    assert isinstance(batch.buffer, memoryview)
    assert batch.buffer.obj is data
    before = batch.buffer[-1]
    data[-1] ^= 0xFF
    assert batch.buffer[-1] == data[-1] == before ^ 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        batch.validate()


def test_iter_batches_views_share_memory_with_the_bytearray() -> None:
    first, second = simple_batch(2), simple_batch(3, base_offset=2)
    data = bytearray(first + second)
    batches = list(iter_batches(data))
    assert batches[1].buffer.obj is data
    data[len(first) + 70] ^= 0x01
    assert batches[1].buffer[70] == data[len(first) + 70]
    assert batches[0].is_valid()
    assert not batches[1].is_valid()


def test_record_batch_accepts_bytes_bytearray_and_memoryview() -> None:
    raw = sample_batch()
    for buffer in (raw, bytearray(raw), memoryview(raw)):
        batch = RecordBatch(buffer)
        assert batch.buffer.tobytes() == raw
        assert batch.records_count == len(SAMPLE_RECORDS)


# -- validate() -------------------------------------------------------------------------


def test_valid_batch_passes_validate() -> None:
    batch = RecordBatch(sample_batch())
    batch.validate()
    assert batch.is_valid() is True


@pytest.mark.parametrize("compression", [None, "gzip", "lz4"])
def test_any_bit_flip_in_crc_covered_bytes_fails_validate(compression: str | None) -> None:
    raw = sample_batch(compression=compression)
    for position in range(21, len(raw)):
        for bit in (position % 8, 7 - position % 8):
            flipped = bytearray(raw)
            flipped[position] ^= 1 << bit
            batch = RecordBatch(bytes(flipped))
            with pytest.raises(CorruptRecordError, match="CRC"):
                batch.validate()
            assert batch.is_valid() is False


def test_any_bit_flip_in_the_stored_crc_fails_validate() -> None:
    raw = sample_batch()
    for position in range(17, 21):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[position] ^= 1 << bit
            with pytest.raises(CorruptRecordError, match="CRC"):
                RecordBatch(bytes(flipped)).validate()


@settings(deadline=None)
@given(st.integers(0, 2**63 - 1))
def test_base_offset_is_not_covered_by_the_crc(new_base_offset: int) -> None:
    raw = patch(sample_batch(), 0, ">q", new_base_offset, recompute_crc=False)
    batch = RecordBatch(raw)
    batch.validate()
    assert batch.base_offset == new_base_offset
    expected = [new_base_offset + i for i in range(len(SAMPLE_RECORDS))]
    assert [r.offset for r in batch.records()] == expected


def test_flipping_every_base_offset_byte_keeps_the_crc_valid() -> None:
    raw = sample_batch()
    for position in range(8):
        flipped = bytearray(raw)
        flipped[position] ^= 0x5A
        batch = RecordBatch(bytes(flipped))
        batch.validate()
        assert batch.base_offset != SAMPLE_BASE_OFFSET


def test_partition_leader_epoch_is_not_covered_by_the_crc() -> None:
    raw = patch(sample_batch(), 12, ">i", 123_456, recompute_crc=False)
    batch = RecordBatch(raw)
    batch.validate()
    assert batch.partition_leader_epoch == 123_456


@pytest.mark.parametrize("magic", [0, 1, 3, -1])
def test_wrong_magic_is_corrupt(magic: int) -> None:
    raw = patch(sample_batch(), 16, ">b", magic, recompute_crc=False)
    with pytest.raises(CorruptRecordError, match="magic") as info:
        RecordBatch(raw)
    assert not isinstance(info.value, TruncatedBatchError)
    with pytest.raises(CorruptRecordError, match="magic"):
        list(iter_batches(raw))


def test_negative_last_offset_delta_fails_validate() -> None:
    raw = patch(simple_batch(1), 23, ">i", -1)
    with pytest.raises(CorruptRecordError, match="lastOffsetDelta"):
        RecordBatch(raw).validate()


def test_records_count_beyond_last_offset_delta_fails_validate() -> None:
    raw = patch(simple_batch(3), 23, ">i", 1)
    with pytest.raises(CorruptRecordError, match="recordsCount"):
        RecordBatch(raw).validate()


def test_negative_records_count_fails_validate() -> None:
    raw = patch(simple_batch(3), 57, ">i", -1)
    with pytest.raises(CorruptRecordError, match="recordsCount"):
        RecordBatch(raw).validate()


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_compression_codec_fails_validate(codec: int) -> None:
    raw = patch(simple_batch(2), 21, ">h", codec)
    batch = RecordBatch(raw)
    assert batch.compression == codec
    with pytest.raises(CorruptRecordError, match="compression"):
        batch.validate()
    with pytest.raises(CorruptRecordError):
        list(batch.records())


def test_compacted_batch_with_fewer_records_than_offsets_is_valid() -> None:
    raw = patch(simple_batch(2), 23, ">i", 10)
    batch = RecordBatch(raw)
    batch.validate()
    assert batch.last_offset == 10
    assert len(list(batch.records())) == 2


# -- truncation and impossible lengths --------------------------------------------------


@pytest.mark.parametrize("keep", [0, 1, 12, 16, 17, 30, 60, 61, -1])
def test_truncated_batch_raises_truncated_error(keep: int) -> None:
    raw = sample_batch()
    with pytest.raises(TruncatedBatchError) as info:
        RecordBatch(raw[:keep])
    assert isinstance(info.value, CorruptRecordError)
    assert info.value.position == 0


@pytest.mark.parametrize("length", [-1, -(2**31), 0, 1, 48])
def test_impossible_batch_length_is_corrupt_not_truncated(length: int) -> None:
    raw = patch(sample_batch(), 8, ">i", length, recompute_crc=False)
    with pytest.raises(CorruptRecordError, match="batchLength") as info:
        RecordBatch(raw)
    assert not isinstance(info.value, TruncatedBatchError)
    with pytest.raises(CorruptRecordError) as info:
        batch_size_at(raw)
    assert not isinstance(info.value, TruncatedBatchError)


def test_minimum_batch_length_of_a_bare_header_is_accepted_as_a_size() -> None:
    raw = patch(sample_batch(), 8, ">i", 49, recompute_crc=False)
    assert batch_size_at(raw) == HEADER_SIZE
    assert RecordBatch(raw).size == HEADER_SIZE


def test_batch_length_larger_than_the_buffer_is_truncated() -> None:
    raw = patch(sample_batch(), 8, ">i", 2**31 - 1, recompute_crc=False)
    with pytest.raises(TruncatedBatchError):
        RecordBatch(raw)


def test_batch_size_at_reads_the_length_at_a_position() -> None:
    first, second = simple_batch(1), simple_batch(4)
    buf = first + second
    assert batch_size_at(buf) == len(first)
    assert batch_size_at(buf, len(first)) == len(second)


# -- iter_batches -----------------------------------------------------------------------


def test_iter_batches_yields_concatenated_batches_in_order_with_their_positions() -> None:
    raws = [
        simple_batch(1, base_offset=0),
        simple_batch(5, base_offset=1, compression="gzip"),
        sample_batch(base_offset=6),
        simple_batch(2, base_offset=10, compression="lz4"),
    ]
    buf = b"".join(raws)
    batches = list(iter_batches(buf))
    assert len(batches) == len(raws)
    position = 0
    for batch, raw in zip(batches, raws, strict=True):
        assert batch.buffer.tobytes() == raw == buf[position : position + batch.size]
        position += batch.size
        batch.validate()
    assert position == len(buf)
    assert [b.base_offset for b in batches] == [0, 1, 6, 10]


def test_iter_batches_starts_at_the_given_position() -> None:
    first, second, third = simple_batch(1), simple_batch(2, base_offset=1), simple_batch(3, 3)
    buf = first + second + third
    batches = list(iter_batches(buf, len(first)))
    assert [b.base_offset for b in batches] == [1, 3]
    assert list(iter_batches(buf, len(buf))) == []


def test_iter_batches_of_an_empty_buffer_yields_nothing() -> None:
    assert list(iter_batches(b"")) == []


@pytest.mark.parametrize("keep", [1, 16, 17, 40, 61, 62, -1])
def test_truncated_trailing_batch_raises_truncated_error_with_its_position(keep: int) -> None:
    complete = [simple_batch(1), simple_batch(3, base_offset=1)]
    torn = sample_batch(base_offset=4)
    prefix = b"".join(complete)
    buf = prefix + torn[:keep]
    seen: list[int] = []
    with pytest.raises(TruncatedBatchError) as info:
        for batch in iter_batches(buf):
            seen.append(batch.base_offset)
    assert seen == [0, 1]
    assert info.value.position == len(prefix)


def test_iter_batches_reports_the_position_of_a_corrupt_header() -> None:
    first = simple_batch(2)
    bad = patch(simple_batch(2, base_offset=2), 8, ">i", 3, recompute_crc=False)
    seen = []
    with pytest.raises(CorruptRecordError) as info:
        for batch in iter_batches(first + bad + simple_batch(1, base_offset=4)):
            seen.append(batch.base_offset)
    assert seen == [0]
    assert not isinstance(info.value, TruncatedBatchError)
    assert info.value.position == len(first)


def test_iter_batches_does_not_check_crcs() -> None:
    raw = bytearray(simple_batch(2))
    raw[-1] ^= 0xFF
    (batch,) = iter_batches(bytes(raw))
    assert batch.is_valid() is False


# -- records() --------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "gzip", "snappy", "lz4", "zstd"])
def test_records_decode_what_encode_batch_wrote(compression: str | None) -> None:
    batch = RecordBatch(sample_batch(compression=compression))
    assert list(batch.records()) == [
        Record(SAMPLE_BASE_OFFSET + i, r.timestamp_ms, r.key, r.value, r.headers)
        for i, r in enumerate(SAMPLE_RECORDS)
    ]


def test_records_without_own_timestamp_get_timestamp_ms() -> None:
    raw = encode_batch([(b"k", b"v"), (None, b"w", [("h", b"x")])], timestamp_ms=55)
    assert list(RecordBatch(raw).records()) == [
        Record(0, 55, b"k", b"v", ()),
        Record(1, 55, None, b"w", (("h", b"x"),)),
    ]


def test_records_count_larger_than_the_body_is_corrupt() -> None:
    raw = patch(simple_batch(2), 57, ">i", 1_000_000)
    batch = RecordBatch(raw)
    with pytest.raises(CorruptRecordError):
        list(batch.records())


def test_records_count_smaller_than_the_body_is_corrupt() -> None:
    raw = patch(simple_batch(3), 57, ">i", 2)
    batch = RecordBatch(raw)
    with pytest.raises(CorruptRecordError):
        list(batch.records())


@pytest.mark.parametrize("compression", [None, "lz4", "gzip"])
def test_log_append_time_makes_every_record_report_max_timestamp(compression: str | None) -> None:
    raw = sample_batch(compression=compression)
    attributes = unpack(raw, 21, ">h")
    append_time = 1_800_000_000_000
    raw = patch(raw, 35, ">q", append_time)
    raw = patch(raw, 21, ">h", attributes | 0x08)
    batch = RecordBatch(raw)
    batch.validate()
    assert batch.is_log_append_time is True
    assert batch.timestamp_type == "LogAppendTime"
    assert batch.is_transactional is True
    assert batch.compression == attributes & 0x07
    records = list(batch.records())
    assert [r.timestamp_ms for r in records] == [append_time] * len(SAMPLE_RECORDS)
    assert [r.value for r in records] == [r.value for r in SAMPLE_RECORDS]


def test_create_time_records_keep_their_own_timestamps() -> None:
    batch = RecordBatch(sample_batch())
    assert batch.is_log_append_time is False
    assert [r.timestamp_ms for r in batch.records()] == [r.timestamp_ms for r in SAMPLE_RECORDS]


def test_max_timestamp_is_the_largest_record_timestamp_not_the_last() -> None:
    batch = RecordBatch(sample_batch())
    assert SAMPLE_RECORDS[-1].timestamp_ms < batch.max_timestamp
    assert batch.max_timestamp == 1_700_000_000_900
    assert batch.base_timestamp == 1_700_000_000_500


def test_records_above_max_decompressed_bytes_are_corrupt() -> None:
    raw = encode_batch([(None, bytes(100_000))], timestamp_ms=0, compression="zstd")
    batch = RecordBatch(raw)
    assert batch.size < 10_000
    with pytest.raises(CorruptRecordError):
        list(batch.records(max_decompressed_bytes=50_000))
    assert len(next(batch.records(max_decompressed_bytes=200_000)).value or b"") == 100_000


def test_repr_names_the_offsets() -> None:
    text = repr(RecordBatch(simple_batch(3, base_offset=40)))
    assert "base_offset=40" in text
    assert "last_offset=42" in text


def test_records_are_decoded_lazily_so_those_before_a_corrupt_one_are_yielded() -> None:
    # `oncelog dump` prints the records it could decode before reporting corruption.
    raw = bytearray(encode_batch([(None, b"a"), (None, b"b"), (None, b"c")], timestamp_ms=0))
    assert raw[-3:] == b"\x02c\x00"  # the last value's length (1), the value, no headers
    raw[-3] = 0x7F  # the last value's length becomes -64
    records = RecordBatch(bytes(raw)).records()
    assert [next(records).value, next(records).value] == [b"a", b"b"]
    with pytest.raises(CorruptRecordError, match="negative length"):
        next(records)


# -- encode_batch: the one-pass path and the general path -------------------------------


def test_bytes_like_keys_and_values_encode_as_their_bytes() -> None:
    expected = encode_batch([(b"k", b"v", [("h", b"x")])], timestamp_ms=9)
    assert encode_batch([(bytearray(b"k"), memoryview(b"v"), [("h", b"x")])], timestamp_ms=9) == expected
    assert encode_batch([(b"k", b"v", [("h", bytearray(b"x"))])], timestamp_ms=9) == expected
    assert encode_batch([[(b"k", b"v", (("h", b"x"),))][0]], timestamp_ms=9) == expected


def test_encode_batch_takes_any_iterable_of_records() -> None:
    expected = encode_batch([(None, b"0"), (None, b"1")], timestamp_ms=9)
    assert encode_batch(((None, str(i).encode()) for i in range(2)), timestamp_ms=9) == expected


def test_mixed_record_shapes_keep_their_own_or_the_default_timestamps() -> None:
    records = [
        Record(0, 500, None, b"a"),
        (b"k", b"b"),
        (None, b"c", [("h", None)]),
        Record(0, 100, None, b"d"),
        Record(0, None, None, b"e"),  # type: ignore[arg-type]
    ]
    batch = RecordBatch(encode_batch(records, timestamp_ms=300))
    assert (batch.base_timestamp, batch.max_timestamp) == (500, 500)
    assert [r.timestamp_ms for r in batch.records()] == [500, 300, 300, 100, 300]
    assert [r.value for r in batch.records()] == [b"a", b"b", b"c", b"d", b"e"]


@pytest.mark.parametrize(
    ("records", "error", "match"),
    [
        ([(None, "text")], TypeError, "bytes or None"),
        ([(None, "text"), 5], TypeError, "a record is"),  # shapes are checked before types
        ([[None, b"v"]], TypeError, "a record is"),
        ([(None, b"v", [["h", b"x"]])], TypeError, "a header is"),
        ([(None, b"v", b"x")], TypeError, "a header is"),
        ([(None, b"v", None)], TypeError, "not iterable"),
        ([(None, b"v", [("h", "text")])], TypeError, None),
        ([(None, b"v", [("\ud800", None)])], UnicodeEncodeError, None),
    ],
)
def test_bad_records_raise_what_the_general_path_raises(
    records: list[object], error: type[Exception], match: str | None
) -> None:
    with pytest.raises(error, match=match):
        encode_batch(records, timestamp_ms=0)


# -- varint boundaries, against kafka-python ---------------------------------------------


@pytest.mark.parametrize("size", [0, 55, 56, 57, 63, 64, 8183, 8184, 8191, 8192, 20_000])
def test_key_value_and_record_lengths_at_varint_boundaries_match_kafka_python(size: int) -> None:
    # A record of an n-byte null-key value is n + 7 or so bytes: 56/57 and 8184 put the
    # record length, not the value length, on the 64 and 8192 boundaries.
    payload = bytes(i % 251 for i in range(size))
    specs: list[tuple[bytes | None, bytes | None]] = [(None, payload), (payload, None), (payload, payload)]
    ours = encode_batch(specs, timestamp_ms=1_700_000_000_000, partition_leader_epoch=0)
    assert ours == kafka_python_batch(specs, 1_700_000_000_000)
    assert [(r.key, r.value) for r in RecordBatch(ours).records()] == specs
    theirs = DefaultRecordBatch(ours)
    assert [(r.key, r.value) for r in theirs] == specs


def test_offset_deltas_past_the_two_byte_varints_match_kafka_python() -> None:
    specs: list[tuple[bytes | None, bytes | None]] = [(None, None)] * 8200
    ours = encode_batch(specs, base_offset=7, timestamp_ms=0, partition_leader_epoch=0)
    assert ours[8:] == kafka_python_batch(specs, 0)[8:]  # kafka-python's base offset is 0
    assert [r.offset for r in RecordBatch(ours).records()] == list(range(7, 8207))


# -- walk_whole_batches: a clean open's check of its active segment's tail ------------------
def _reference_walk(
    buffer: bytes, next_offset: int, max_ts: int, offset_of_max_ts: int, checks: TailChecks
) -> tuple[int, int, int] | None:
    """The check batch by batch, from the header layout written out in this file."""
    at, previous_last = 0, None
    while at < len(buffer):
        if len(buffer) - at < HEADER_SIZE:
            return None
        fields = {name: struct.unpack_from(f, buffer, at + off)[0] for name, off, f in HEADER_FIELDS}
        size = fields["batch_length"] + 12
        if fields["batch_length"] < HEADER_SIZE - 12 or at + size > len(buffer):
            return None
        crc_ok = crc32c.crc32c(buffer[at + 21 : at + size]) == fields["crc"]
        delta, count, base = fields["last_offset_delta"], fields["records_count"], fields["base_offset"]
        last = base + delta
        if not (
            fields["magic"] == 2
            and crc_ok
            and delta >= 0
            and 0 <= count <= delta + 1
            and fields["attributes"] & 7 <= 4
            and base >= next_offset
        ):
            return None
        if at == 0 and checks.first_base_offset is not None and base != checks.first_base_offset:
            return None
        if at == 0 and checks.first_last_offset is not None and last != checks.first_last_offset:
            return None
        if checks.client_only and (
            fields["partition_leader_epoch"] != -1
            or (previous_last is not None and base != previous_last + 1)
        ):
            return None
        previous_last, next_offset = last, last + 1
        if fields["max_timestamp"] > max_ts:
            max_ts, offset_of_max_ts = fields["max_timestamp"], last
        at += size
    return next_offset, max_ts, offset_of_max_ts


_DAMAGE = st.one_of(
    st.none(),
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 7)),
    st.tuples(st.just("cut"), st.integers(1, 10**6)),
    st.tuples(st.just("swap"), st.integers(0, 10**6)),
)


@settings(max_examples=400, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=0, max_size=6),
    gaps=st.lists(st.integers(-3, 3), min_size=6, max_size=6),
    stamps=st.lists(st.integers(0, 50), min_size=6, max_size=6),
    epochs=st.lists(st.sampled_from([-1, -1, -1, 0, 7]), min_size=6, max_size=6),
    damage=_DAMAGE,
    first=st.tuples(st.sampled_from([None, 100, 101]), st.sampled_from([None, 100, 101, 103])),
    client_only=st.booleans(),
)
def test_the_clean_tail_walk_agrees_with_a_batch_by_batch_check_on_sound_and_damaged_tails(
    sizes: list[int],
    gaps: list[int],
    stamps: list[int],
    epochs: list[int],
    damage: tuple[object, ...] | None,
    first: tuple[int | None, int | None],
    client_only: bool,
) -> None:
    parts, offset = [], 100
    for n, records in enumerate(sizes):
        offset = max(0, offset + gaps[n]) if n else offset  # gaps, and offsets going back
        ts = 1_700_000_000_000 + stamps[n]
        parts.append(
            encode_batch(
                [(b"k", b"v" * n)] * records,
                base_offset=offset,
                timestamp_ms=ts,
                producer_id=n,
                partition_leader_epoch=epochs[n],
            )
        )
        offset += records
    buffer = bytearray(b"".join(parts))
    if damage is not None and buffer:
        kind, where = damage[0], int(damage[1]) % len(buffer)  # type: ignore[call-overload]
        if kind == "flip":
            buffer[where] ^= 1 << int(damage[2])  # type: ignore[call-overload]
        elif kind == "cut":
            del buffer[where:]
        else:
            buffer[where : where + 4] = b"\0\0\0\0"
    checks = TailChecks(first[0], first[1], client_only)
    start = (97, 1_700_000_000_010, 96)
    expected = _reference_walk(bytes(buffer), *start, checks)
    walked = walk_whole_batches(bytes(buffer), *start, checks)
    assert (None if walked is None else tuple(walked)) == expected


def test_an_empty_tail_walks_to_what_it_was_given() -> None:
    walked = walk_whole_batches(b"", 5, 7, 4)
    assert walked is not None and tuple(walked) == (5, 7, 4)
