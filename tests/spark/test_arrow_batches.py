"""arrow_batches: stored batches to Arrow rows with the source's exact Spark schema.

Two oracles: the engine's record decoder (`RecordBatch.records()`, itself held to
kafka-python) for generated batches, and kafka-python's `DefaultRecordBatch` for
the real Kafka partitions under ../shared/fixtures/kafka (read in place, never
copied). No Spark session is needed except to parse the DDL.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from oncelog.errors import CorruptRecordError
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.control import encode_txn_marker
from oncelog.segments.records import Record
from oncelog.spark.arrow_batches import DDL, LOG_APPEND_TIME, SCHEMA, arrow_batches
from oncelog.storage.fs import DEFAULT_FS
from oncelog.tools.partition_dirs import Partition
from oncelog.tools.partition_reader import read_batches
from oncelog.tools.partition_stat import stat_partition

T0 = 1_700_000_000_000
INT32_MAX = 2**31 - 1
Row = tuple[Any, ...]


def fixtures_root() -> Path:
    """As tests/conftest.py finds them (`conftest` here is tests/spark's)."""
    configured = os.environ.get("ONCELOG_FIXTURES")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "kafka"


# -- the oracle ----------------------------------------------------------------------------------
def expected_rows(
    batches: Iterable[RecordBatch],
    topic: str,
    partition: int,
    start: int | None = None,
    end: int | None = None,
) -> list[Row]:
    rows = []
    for batch in batches:
        if batch.is_control:
            continue
        h = batch.header
        for r in batch.records():
            if (start is not None and r.offset < start) or (end is not None and r.offset >= end):
                continue
            delta = r.offset - h.base_offset
            sequence = -1 if h.base_sequence < 0 else (h.base_sequence + delta) % (INT32_MAX + 1)
            rows.append(
                (
                    r.key,
                    r.value,
                    topic,
                    partition,
                    r.offset,
                    r.timestamp_ms * 1000,
                    1 if batch.is_log_append_time else 0,
                    [(k, v) for k, v in r.headers],
                    h.producer_id,
                    h.producer_epoch,
                    sequence,
                )
            )
    return rows


def rows_of(tables: Iterable[pa.RecordBatch]) -> list[Row]:
    rows = []
    for table in tables:
        assert table.schema.equals(SCHEMA, check_metadata=True)
        table = table.set_column(5, "timestamp", table.column(5).cast(pa.int64()))
        for row in table.to_pylist():
            row["headers"] = [(h["key"], h["value"]) for h in row["headers"]]
            rows.append(tuple(row.values()))
    return rows


def with_log_append_time(raw: bytes, append_time_ms: int) -> bytes:
    """The batch as a broker stamps it on a LogAppendTime topic: attribute bit 3, max timestamp, CRC."""
    out = bytearray(raw)
    attributes = struct.unpack_from(">h", out, 21)[0] | 0x08
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">q", out, 35, append_time_ms)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


# -- schema -------------------------------------------------------------------------------------
SPARK_TYPE = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
        ),
        StructField("producerId", LongType()),
        StructField("producerEpoch", ShortType()),
        StructField("sequence", IntegerType()),
    ]
)


def test_schema_is_what_spark_checks_read_batches_against() -> None:
    assert SCHEMA.equals(to_arrow_schema(SPARK_TYPE, timezone="UTC"), check_metadata=True)
    # What read() yields is checked against the same schema, field by field.
    (table,) = arrow_batches([RecordBatch(encode_batch([(b"k", b"v")], timestamp_ms=T0))], "t", 0)
    assert table.schema.equals(to_arrow_schema(SPARK_TYPE, timezone="UTC"))


def test_schema_is_the_ddl_as_spark_parses_it(spark: SparkSession) -> None:
    parsed = StructType.fromDDL(DDL)
    assert parsed == SPARK_TYPE
    assert SCHEMA.equals(to_arrow_schema(parsed, timezone="UTC"), check_metadata=True)


# -- generated batches -------------------------------------------------------------------------------
header = st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=8))
record = st.builds(
    lambda key, value, headers, ts: Record(0, ts, key, value, tuple(headers)),
    st.none() | st.binary(max_size=12) | st.just(b"k" * 40),
    st.none() | st.binary(max_size=300) | st.just(b"v" * 9000),  # 9000: a 3-byte record length
    st.lists(header, max_size=3) | st.just([]),
    st.integers(T0 - 10**6, T0 + 10**9),
)
batch_spec = st.tuples(
    st.lists(record, min_size=1, max_size=30),
    st.sampled_from([None, "gzip", "snappy", "lz4", "zstd"]),
    st.sampled_from([-1, 0, 7, 2**40]),  # producer id
    st.sampled_from([0, 5, INT32_MAX - 3, INT32_MAX]),  # base sequence (wraps inside the batch)
    st.booleans(),  # LogAppendTime
    st.booleans(),  # followed by a control batch
)


def build(specs: list[Any]) -> list[RecordBatch]:
    out: list[RecordBatch] = []
    offset = 0
    for records, compression, pid, sequence, append_time, control in specs:
        raw = encode_batch(
            records,
            base_offset=offset,
            producer_id=pid,
            producer_epoch=3 if pid >= 0 else -1,
            base_sequence=sequence if pid >= 0 else -1,
            compression=compression,
        )
        out.append(RecordBatch(with_log_append_time(raw, T0 + 77) if append_time else raw))
        offset += len(records)
        if control:
            marker = encode_txn_marker(
                1, 0, commit=True, coordinator_epoch=0, timestamp_ms=T0, base_offset=offset
            )
            out.append(RecordBatch(marker))
            offset += 1
    return out


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(specs=st.lists(batch_spec, min_size=1, max_size=12), max_rows=st.sampled_from([1, 7, 64, 65_536]))
def test_rows_equal_the_engines_decoding(specs: list[Any], max_rows: int) -> None:
    batches = build(specs)
    tables = list(arrow_batches(batches, "orders", 3, max_rows=max_rows))
    assert all(0 < t.num_rows <= max_rows for t in tables)
    assert rows_of(tables) == expected_rows(batches, "orders", 3)


def many_batches(
    counts: Iterable[int], *, value: bytes = b"x" * 100, key: bytes | None = b"key"
) -> list[RecordBatch]:
    out, offset = [], 0
    for n, count in enumerate(counts):
        records = [(key, value + bytes([i % 256])) for i in range(count)]
        raw = encode_batch(
            records,
            base_offset=offset,
            producer_id=1,
            producer_epoch=0,
            base_sequence=offset,
            timestamp_ms=T0 + n,
        )
        out.append(RecordBatch(raw))
        offset += count
    return out


@pytest.mark.parametrize(
    "counts",
    [
        [100] * 300,  # the lockstep walk, every lane to the end
        [1 + (n * 37) % 150 for n in range(200)],  # lanes finishing at different steps, a Python tail
        [5000, 3, 1],  # one long batch: the Python walk alone
    ],
    ids=["uniform", "ragged", "one-long"],
)
def test_many_batches_in_one_group(counts: list[int]) -> None:
    batches = many_batches(counts)
    tables = list(arrow_batches(batches, "t", 0))
    assert rows_of(tables) == expected_rows(batches, "t", 0)


@pytest.mark.parametrize("key", [None, b"", b"same-size", b"x" * 13], ids=["null", "empty", "short", "13B"])
def test_keys_null_empty_or_fixed_size(key: bytes | None) -> None:
    batches = many_batches([50] * 40, key=key)
    assert rows_of(arrow_batches(batches, "t", 0)) == expected_rows(batches, "t", 0)


def test_values_of_mixed_sizes_and_nulls() -> None:
    records = [
        (None if i % 5 == 0 else b"k%d" % i, None if i % 7 == 0 else b"v" * (i % 23)) for i in range(300)
    ]
    batches = [
        RecordBatch(encode_batch(records[i : i + 30], base_offset=i, timestamp_ms=T0))
        for i in range(0, 300, 30)
    ]
    rows = rows_of(arrow_batches(batches, "t", 0))
    assert rows == expected_rows(batches, "t", 0)
    assert rows[0][0] is None and rows[0][1] is None and rows[1][1] == b"v"


def test_headers_keep_order_and_null_values() -> None:
    headers = (("trace", b"42"), ("", None), ("ключ", b""), ("trace", b"43"))
    raw = encode_batch([Record(0, T0, b"k", b"v", headers), (b"k2", b"v2")], base_offset=10, timestamp_ms=T0)
    (row, plain) = rows_of(arrow_batches([RecordBatch(raw)], "t", 0))
    assert row[7] == list(headers) and plain[7] == []


def test_timestamps_are_microseconds_utc_and_log_append_time_is_type_1() -> None:
    create = encode_batch(
        [Record(0, T0 + 5, b"a", b"1", ()), Record(0, T0 - 3, b"b", b"2", ())], timestamp_ms=T0
    )
    appended = with_log_append_time(encode_batch([(b"c", b"3")], base_offset=2, timestamp_ms=T0), T0 + 999)
    (table,) = arrow_batches([RecordBatch(create), RecordBatch(appended)], "t", 0)
    assert table.column("timestamp").type == pa.timestamp("us", tz="UTC")
    assert table.column("timestamp").cast(pa.int64()).to_pylist() == [
        (T0 + 5) * 1000,
        (T0 - 3) * 1000,
        (T0 + 999) * 1000,
    ]
    assert table.column("timestampType").to_pylist() == [0, 0, LOG_APPEND_TIME]


def test_sequence_is_base_plus_delta_wrapping_after_int_max() -> None:
    raw = encode_batch([(b"k", b"v")] * 5, producer_id=4, producer_epoch=2, base_sequence=INT32_MAX - 2)
    plain = encode_batch([(b"k", b"v")] * 2, base_offset=5)
    (table,) = arrow_batches([RecordBatch(raw), RecordBatch(plain)], "t", 0)
    assert table.column("sequence").to_pylist() == [INT32_MAX - 2, INT32_MAX - 1, INT32_MAX, 0, 1, -1, -1]
    assert table.column("producerId").to_pylist() == [4] * 5 + [-1] * 2
    assert table.column("producerEpoch").to_pylist() == [2] * 5 + [-1] * 2


def test_max_rows_splits_across_and_inside_stored_batches() -> None:
    batches = many_batches([100, 100, 100, 500, 10])
    sizes = [t.num_rows for t in arrow_batches(batches, "t", 0, max_rows=150)]
    assert sizes == [100, 100, 100, 150, 150, 150, 50, 10]
    assert rows_of(arrow_batches(batches, "t", 0, max_rows=150)) == expected_rows(batches, "t", 0)


def test_start_and_end_cut_the_first_and_last_stored_batch() -> None:
    batches = many_batches([10, 10, 10])  # offsets 0..29
    rows = rows_of(arrow_batches(batches, "t", 0, start=7, end=23))
    assert [row[4] for row in rows] == list(range(7, 23))
    assert rows == expected_rows(batches, "t", 0, start=7, end=23)
    assert list(arrow_batches(batches, "t", 0, start=30)) == []


def test_control_batches_give_no_rows() -> None:
    marker = encode_txn_marker(1, 0, commit=False, coordinator_epoch=0, timestamp_ms=T0, base_offset=0)
    assert list(arrow_batches([RecordBatch(marker)], "t", 0)) == []


# -- corrupt bodies -------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(
    records=st.lists(record, min_size=1, max_size=8),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3),
)
def test_a_damaged_body_raises_corrupt_record_exactly_when_the_engine_does(
    records: list[Record], flips: list[tuple[int, int]]
) -> None:
    raw = bytearray(encode_batch(records, timestamp_ms=T0))
    for at, byte in flips:
        raw[61 + at % (len(raw) - 61)] = byte
    batch = RecordBatch(bytes(raw))  # the CRC is not checked here: the reader checked it before
    try:
        expected = expected_rows([batch], "t", 0)
    except CorruptRecordError:
        with pytest.raises(CorruptRecordError):
            list(arrow_batches([batch], "t", 0))
        return
    assert rows_of(arrow_batches([batch], "t", 0)) == expected


def test_a_huge_record_count_is_refused_before_sizing_anything() -> None:
    raw = bytearray(encode_batch([(b"k", b"v")], timestamp_ms=T0))
    struct.pack_into(">i", raw, 57, 2**30)
    with pytest.raises(CorruptRecordError, match="recordsCount"):
        list(arrow_batches([RecordBatch(bytes(raw))], "t", 0))


# -- real Kafka partitions --------------------------------------------------------------------------
def kafka_partitions() -> list[Path]:
    return sorted({log.parent for log in fixtures_root().glob("*/*/*.log")})


def kafka_python_rows(directory: Path, topic: str, partition: int) -> Iterator[Row]:
    """Every data record of the partition, decoded by kafka-python from the raw segment bytes."""
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        position = 0
        while position < len(data):
            size = int.from_bytes(data[position + 8 : position + 12], "big") + 12
            batch = DefaultRecordBatch(data[position : position + size])
            position += size
            if batch.is_control_batch:
                continue
            for r in batch:
                delta = r.offset - batch.base_offset
                sequence = (
                    -1 if batch.base_sequence < 0 else batch._increment_sequence(batch.base_sequence, delta)
                )
                yield (
                    r.key,
                    r.value,
                    topic,
                    partition,
                    r.offset,
                    r.timestamp * 1000,
                    batch.timestamp_type,
                    list(r.headers),
                    batch.producer_id,
                    batch.producer_epoch,
                    sequence,
                )


@pytest.mark.parametrize("directory", kafka_partitions(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_kafka_partitions_read_as_kafka_python_decodes_them(directory: Path) -> None:
    summary = stat_partition(DEFAULT_FS, Partition(str(directory), None, str(directory.parent)), {})
    topic, _, number = directory.name.rpartition("-")
    start, end = summary.log_start_offset, summary.log_end_offset
    batches = read_batches(None, str(directory), start, end)
    got = rows_of(arrow_batches(batches, topic, int(number), max_rows=1000, start=start, end=end))
    assert got == list(kafka_python_rows(directory, topic, int(number)))


def test_the_kafka_fixtures_cover_lz4_and_log_append_time() -> None:
    """The comparison above is only as good as what the fixtures hold."""
    attributes = set()
    for directory in kafka_partitions():
        for segment in directory.glob("*.log"):
            data = segment.read_bytes()
            position = 0
            while position < len(data):
                attributes.add(struct.unpack_from(">h", data, position + 21)[0])
                position += int.from_bytes(data[position + 8 : position + 12], "big") + 12
    assert any(a & 0x07 == 3 for a in attributes), "no lz4 batch"
    assert any(a & 0x08 and not a & 0x20 for a in attributes), "no LogAppendTime data batch"
    assert any(a & 0x20 for a in attributes), "no control batch"
