"""Cross-checks against kafka-python's independent v2 codec and real Kafka segments.

kafka-python (kafka.record.default_records) was written from Kafka's protocol spec by
other people, so agreement with it in both directions is evidence of byte
compatibility that our own round trips cannot give.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import decode_varint as kafka_decode_varint
from kafka.record.util import encode_varint as kafka_encode_varint

from oncelog.bench.references import kafka_python_batch
from oncelog.segments.batch import RecordBatch, encode_batch, iter_batches
from oncelog.segments.records import Record, decode_varint, encode_varint

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

COMPAT_SETTINGS = settings(
    deadline=None,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

Header = tuple[str, bytes | None]

nullable_bytes = st.none() | st.binary(max_size=12)
header_lists = st.lists(st.tuples(st.text(max_size=6), nullable_bytes), max_size=3)
Spec = tuple[bytes | None, bytes | None, list[Header]]
record_specs = st.tuples(nullable_bytes, nullable_bytes, header_lists)


def _many_records(count: int, payload: bytes) -> list[Spec]:
    """A long batch built cheaply from one drawn payload (drawing 500 records is slow)."""
    return [
        (
            None if i % 3 == 0 else i.to_bytes(2, "big"),
            None if i % 11 == 0 else payload + bytes([i % 256]),
            [("i", payload), ("n", None)] if i % 50 == 0 else [],
        )
        for i in range(count)
    ]


# Mostly short batches of drawn records, sometimes 400..500 records.
record_lists = st.lists(record_specs, min_size=1, max_size=20) | st.builds(
    _many_records, st.integers(400, 500), st.binary(max_size=4)
)
producer_ids = st.just(-1) | st.integers(0, 2**63 - 1)
producer_epochs = st.integers(0, 32767)
base_sequences = st.integers(0, 2**31 - 1)
timestamps = st.integers(0, 2**45)
timestamp_jitter = st.lists(st.integers(-100_000, 100_000), min_size=1, max_size=20)


def make_stamps(base_ts: int, jitter: list[int], count: int) -> list[int]:
    """Non-negative timestamps, out of order where the jitter says so."""
    return [max(0, base_ts + i + jitter[i % len(jitter)]) for i in range(count)]


def kafka_records(batch: DefaultRecordBatch) -> list[Record]:
    return [Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]


def assert_same_header(ours: RecordBatch, theirs: DefaultRecordBatch) -> None:
    assert ours.base_offset == theirs.base_offset
    assert ours.size == theirs.size_in_bytes
    assert ours.partition_leader_epoch == theirs.leader_epoch
    assert ours.magic == theirs.magic == 2
    assert ours.crc == theirs.crc
    assert ours.attributes == theirs.attributes
    assert ours.last_offset_delta == theirs.last_offset_delta
    assert ours.last_offset == theirs.last_offset
    assert ours.compression == theirs.compression_type
    assert ours.is_log_append_time == (theirs.timestamp_type == 1)
    assert ours.is_transactional == theirs.is_transactional
    assert ours.is_control == theirs.is_control_batch
    assert ours.base_timestamp == theirs.first_timestamp
    assert ours.max_timestamp == theirs.max_timestamp
    assert ours.producer_id == theirs.producer_id
    assert ours.producer_epoch == theirs.producer_epoch
    assert ours.base_sequence == theirs.base_sequence
    assert ours.last_sequence == theirs.last_sequence
    assert ours.records_count == theirs.records_count


def build_with_kafka_python(
    specs: list[Spec],
    stamps: list[int],
    *,
    compression: int,
    transactional: bool,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> bytes:
    assert len(specs) == len(stamps)
    return kafka_python_batch(
        specs,
        stamps,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=transactional,
    )


# -- varints ----------------------------------------------------------------------------


@settings(deadline=None)
@given(st.integers(-(2**63), 2**63 - 1))
def test_varints_match_kafka_python_in_both_directions(value: int) -> None:
    theirs = bytearray()
    kafka_encode_varint(value, theirs.append)
    assert encode_varint(value) == bytes(theirs)
    assert decode_varint(bytes(theirs), 0) == (value, len(theirs))
    assert kafka_decode_varint(bytearray(encode_varint(value)), 0) == (value, len(theirs))


# -- (a) kafka-python builds, oncelog reads ---------------------------------------------


@COMPAT_SETTINGS
@given(
    specs=record_lists,
    base_ts=timestamps,
    jitter=timestamp_jitter,
    producer_id=producer_ids,
    producer_epoch=producer_epochs,
    base_sequence=base_sequences,
    transactional=st.booleans(),
)
def test_kafka_python_batches_decode_identically_in_oncelog(
    specs: list[Spec],
    base_ts: int,
    jitter: list[int],
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool,
) -> None:
    stamps = make_stamps(base_ts, jitter, len(specs))
    raw = build_with_kafka_python(
        specs,
        stamps,
        compression=0,
        transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    ours = RecordBatch(raw)
    theirs = DefaultRecordBatch(raw)
    assert theirs.validate_crc()
    ours.validate()
    assert_same_header(ours, theirs)
    assert ours.producer_id == producer_id
    assert ours.producer_epoch == producer_epoch
    assert ours.base_sequence == base_sequence
    assert ours.is_transactional is transactional
    assert ours.records_count == len(specs)
    expected = [
        Record(i, ts, key, value, tuple(headers))
        for i, ((key, value, headers), ts) in enumerate(zip(specs, stamps, strict=True))
    ]
    assert list(ours.records()) == expected
    assert kafka_records(theirs) == expected


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
@COMPAT_SETTINGS
@given(
    specs=st.lists(record_specs, min_size=1, max_size=40),
    producer_id=producer_ids,
    base_sequence=base_sequences,
)
def test_compressed_kafka_python_batches_decode_identically_in_oncelog(
    codec: str,
    specs: list[Spec],
    producer_id: int,
    base_sequence: int,
) -> None:
    # A compressible value in every record, so kafka-python keeps the compression.
    specs = [(k, (v or b"") + b"compressible " * 20, h) for k, v, h in specs]
    stamps = [1_700_000_000_000 + i for i in range(len(specs))]
    raw = build_with_kafka_python(
        specs,
        stamps,
        compression=CODECS[codec],
        transactional=False,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=base_sequence,
    )
    ours = RecordBatch(raw)
    theirs = DefaultRecordBatch(raw)
    assert ours.compression == CODECS[codec]
    ours.validate()
    assert_same_header(ours, theirs)
    expected = [
        Record(i, ts, key, value, tuple(headers))
        for i, ((key, value, headers), ts) in enumerate(zip(specs, stamps, strict=True))
    ]
    assert list(ours.records()) == expected
    assert kafka_records(theirs) == expected


# -- (b) oncelog builds, kafka-python reads ---------------------------------------------


@pytest.mark.parametrize("codec", list(CODECS))
@COMPAT_SETTINGS
@given(
    specs=record_lists,
    base_ts=timestamps,
    jitter=timestamp_jitter,
    base_offset=st.integers(0, 2**62),
    leader_epoch=st.integers(-1, 2**31 - 1),
    producer_id=producer_ids,
    producer_epoch=producer_epochs,
    base_sequence=base_sequences,
    transactional=st.booleans(),
)
def test_oncelog_batches_validate_and_decode_identically_in_kafka_python(
    codec: str,
    specs: list[Spec],
    base_ts: int,
    jitter: list[int],
    base_offset: int,
    leader_epoch: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool,
) -> None:
    stamps = make_stamps(base_ts, jitter, len(specs))
    records = [
        Record(0, ts, key, value, tuple(headers))
        for (key, value, headers), ts in zip(specs, stamps, strict=True)
    ]
    raw = encode_batch(
        records,
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=transactional,
        compression=codec,
        partition_leader_epoch=leader_epoch,
    )
    theirs = DefaultRecordBatch(raw)
    assert theirs.validate_crc() is True
    ours = RecordBatch(raw)
    assert_same_header(ours, theirs)
    assert theirs.base_offset == base_offset
    assert theirs.leader_epoch == leader_epoch
    assert theirs.compression_type == CODECS[codec]
    assert theirs.producer_id == producer_id
    assert theirs.producer_epoch == producer_epoch
    assert theirs.base_sequence == base_sequence
    assert theirs.is_transactional is transactional
    assert theirs.first_timestamp == stamps[0]
    assert theirs.max_timestamp == max(stamps)
    expected = [r._replace(offset=base_offset + i) for i, r in enumerate(records)]
    assert kafka_records(theirs) == expected
    assert list(ours.records()) == expected


def test_log_append_time_batch_decodes_identically_in_both() -> None:
    import struct

    import crc32c

    raw = bytearray(
        encode_batch(
            [Record(0, 100 + i, None, b"v%d" % i, ()) for i in range(5)],
            base_offset=9,
            compression="lz4",
        )
    )
    struct.pack_into(">h", raw, 21, struct.unpack_from(">h", raw, 21)[0] | 0x08)
    struct.pack_into(">q", raw, 35, 777_777)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    theirs = DefaultRecordBatch(bytes(raw))
    assert theirs.validate_crc()
    assert theirs.timestamp_type == 1
    ours = RecordBatch(bytes(raw))
    ours.validate()
    assert_same_header(ours, theirs)
    assert [r.timestamp_ms for r in ours.records()] == [777_777] * 5
    assert list(ours.records()) == kafka_records(theirs)


# -- real Kafka segments ----------------------------------------------------------------


def _fixture_root() -> Path:
    configured = os.environ.get("ONCELOG_FIXTURES")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "kafka"


FIXTURE_ROOT = _fixture_root()
FIXTURE_LOGS = sorted(FIXTURE_ROOT.glob("*/*/*.log")) if FIXTURE_ROOT.is_dir() else []


@pytest.mark.parametrize(
    "log_path",
    FIXTURE_LOGS,
    ids=[str(p.relative_to(FIXTURE_ROOT)) for p in FIXTURE_LOGS],
)
def test_real_kafka_segment_decodes_identically_to_kafka_python(log_path: Path) -> None:
    data = log_path.read_bytes()
    batches = list(iter_batches(data))
    assert batches, f"{log_path} holds no batches"
    assert sum(b.size for b in batches) == len(data)
    assert int(log_path.stem) <= batches[0].base_offset
    previous_last = -1
    for ours in batches:
        ours.validate()
        assert ours.base_offset > previous_last
        previous_last = ours.last_offset
        theirs = DefaultRecordBatch(ours.buffer.tobytes())
        assert theirs.validate_crc()
        assert_same_header(ours, theirs)
        records = list(ours.records())
        assert records == kafka_records(theirs)
        assert len(records) == ours.records_count
        if ours.is_log_append_time:
            assert all(r.timestamp_ms == ours.max_timestamp for r in records)


def test_real_kafka_fixtures_cover_the_quirks_the_brief_names() -> None:
    assert FIXTURE_LOGS, f"no Kafka fixtures under {FIXTURE_ROOT}"
    batches = [b for path in FIXTURE_LOGS for b in iter_batches(path.read_bytes())]
    assert any(b.is_control for b in batches)
    assert any(b.compression == 3 for b in batches)
    assert any(b.is_log_append_time for b in batches)
    assert any(b.producer_id == -1 and b.base_sequence == 0 for b in batches)
    assert any(b.producer_id >= 0 and b.base_sequence >= 0 for b in batches)
