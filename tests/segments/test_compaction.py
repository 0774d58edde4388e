"""The compaction codec: a batch rebuilt with a subset of its records, read back by kafka-python.

kafka-python's DefaultRecordBatch is the independent decoder: whatever subset is kept,
with or without a new delete horizon and in every codec, it must read the kept records
with their original offsets, timestamps, keys, values and headers, and the batch must
keep the header fields producer state and readers rely on.
"""

from __future__ import annotations

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.compaction import (
    DELETE_HORIZON_MASK,
    delete_horizon_ms,
    rebuild_batch,
    record_spans,
    records_body,
)
from oncelog.segments.errors import CorruptRecordError
from oncelog.segments.records import Record

T0 = 1_700_000_000_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]

records_strategy = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=40)),
        st.one_of(st.none(), st.binary(max_size=300)),
        st.integers(-10_000, 10_000),
        st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=8))), max_size=2),
    ),
    min_size=1,
    max_size=30,
)


def _batch(
    specs: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]], codec: str
) -> RecordBatch:
    records = [
        Record(n, T0 + ts, key, value, tuple(headers)) for n, (key, value, ts, headers) in enumerate(specs)
    ]
    data = encode_batch(
        records,
        base_offset=500,
        producer_id=42,
        producer_epoch=3,
        base_sequence=17,
        is_transactional=True,
        compression=None if codec == "none" else codec,
        partition_leader_epoch=4,
    )
    return RecordBatch(data)


def _theirs(
    data: bytes,
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]:
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in DefaultRecordBatch(data)]


@settings(max_examples=150, deadline=None)
@given(
    specs=records_strategy,
    keep=st.lists(st.booleans(), min_size=30, max_size=30),
    codec=st.sampled_from(CODECS),
    horizon=st.booleans(),
)
def test_a_rebuilt_batch_holds_the_kept_records_as_kafka_python_reads_them(
    specs: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]],
    keep: list[bool],
    codec: str,
    horizon: bool,
) -> None:
    batch = _batch(specs, codec)
    body = records_body(batch)
    spans = list(record_spans(body, batch.records_count))
    kept = [span for span, k in zip(spans, keep, strict=False) if k]
    rebuilt = rebuild_batch(batch, body, kept, horizon_ms=T0 + 86_400_000 if horizon else None)
    ours = RecordBatch(rebuilt)
    ours.validate()  # length and CRC
    ours.check_records(exact=False)  # a leader's compacted batch: offset deltas increase, within the range
    expected = [r for r, k in zip(_theirs(bytes(batch.buffer)), keep, strict=False) if k]
    assert _theirs(rebuilt) == expected
    assert [(r.offset, r.timestamp_ms, r.key, r.value) for r in ours.records()] == [e[:4] for e in expected]
    h, o = batch.header, ours.header
    assert (o.base_offset, o.last_offset_delta, o.producer_id, o.producer_epoch, o.base_sequence) == (
        h.base_offset, h.last_offset_delta, h.producer_id, h.producer_epoch, h.base_sequence,
    )  # fmt: skip
    assert o.partition_leader_epoch == h.partition_leader_epoch and o.records_count == len(kept)
    assert ours.is_transactional and delete_horizon_ms(ours) == (T0 + 86_400_000 if horizon else None)
    if kept:
        assert ours.compression == batch.compression
        assert o.max_timestamp == max(e[1] for e in expected)


def test_a_batch_with_every_record_cleaned_is_an_empty_uncompressed_header() -> None:
    batch = _batch([(b"k", b"v", 0, []), (b"j", None, 5, [])], "lz4")
    empty = RecordBatch(rebuild_batch(batch, records_body(batch), []))
    empty.validate()
    assert (
        empty.size == fmt.HEADER_SIZE
        and empty.records_count == 0
        and empty.compression == fmt.COMPRESSION_NONE
    )
    assert empty.last_offset == batch.last_offset and empty.last_sequence == batch.last_sequence
    assert empty.max_timestamp == batch.max_timestamp  # as Kafka's empty batch keeps it
    assert list(DefaultRecordBatch(bytes(empty.buffer))) == []


def test_a_log_append_time_batch_keeps_its_max_timestamp_which_every_record_reads() -> None:
    data = bytearray(encode_batch([(b"k", b"v"), (b"j", b"w")], timestamp_ms=T0))
    data[fmt.ATTRIBUTES_OFFSET + 1] |= fmt.TIMESTAMP_TYPE_MASK
    fmt.INT64.pack_into(data, fmt.MAX_TIMESTAMP_OFFSET, T0 + 999)
    fmt.UINT32.pack_into(data, fmt.CRC_OFFSET, crc32c.crc32c(bytes(data[fmt.ATTRIBUTES_OFFSET :])))
    batch = RecordBatch(bytes(data))
    body = records_body(batch)
    rebuilt = RecordBatch(rebuild_batch(batch, body, list(record_spans(body, 2))[1:], horizon_ms=T0 + 5))
    assert rebuilt.max_timestamp == T0 + 999 and rebuilt.is_log_append_time
    assert rebuilt.attributes & DELETE_HORIZON_MASK


def test_a_batch_already_holding_a_horizon_cannot_be_given_another() -> None:
    batch = _batch([(b"k", None, 0, [])], "none")
    body = records_body(batch)
    once = RecordBatch(rebuild_batch(batch, body, list(record_spans(body, 1)), horizon_ms=T0))
    with pytest.raises(AssertionError, match="set once"):
        rebuild_batch(once, records_body(once), list(record_spans(records_body(once), 1)), horizon_ms=T0 + 1)


@pytest.mark.parametrize("cut", [1, 5, 9])
def test_records_that_do_not_fit_their_batch_are_corrupt(cut: int) -> None:
    batch = _batch([(b"key", b"value", 0, []), (b"k2", b"v2", 0, [])], "none")
    body = records_body(batch)
    with pytest.raises(CorruptRecordError):
        list(record_spans(body[:-cut], 2))
    with pytest.raises(CorruptRecordError):
        list(record_spans(body + b"\x00", 2))
