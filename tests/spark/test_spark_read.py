"""Reading logs as DataFrames: rows equal the engine's own reads (issue 9, brief §10).

A 4-partition topic holds plain, compressed, keyed and header-carrying records, a
committed, an aborted and a still-open transaction; every query is checked against
`Log.read` in the same isolation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from log_helpers import read_records
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

import oncelog.spark
from oncelog import LogConfig, LogManager
from oncelog.results import Isolation
from oncelog.segments.batch import encode_batch
from oncelog.spark.arrow_batches import DDL
from oncelog.spark.source import SCHEMA_STRING

TOPIC = "events"
T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=4096)

Row = tuple[Any, ...]


def _batch(
    pid: int, seq: int, n: int, *, txn: bool = False, compression: str | None = None, tag: str = ""
) -> bytes:
    records = [
        (
            None if i % 3 == 0 else b"k%d" % (seq + i),
            b"%s-%d-%d" % (tag.encode(), pid, seq + i),
            [("h", b"%d" % i)] if i % 2 else [],
        )
        for i in range(n)
    ]
    return encode_batch(
        records,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        is_transactional=txn,
        timestamp_ms=T0 + seq,
        compression=compression,
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("read") / "root"
    with LogManager.open(path, CONFIG, progress=False) as manager:
        plain, packed, txns, open_txn = (manager.log(TOPIC, p) for p in range(4))
        for seq in range(0, 120, 4):
            plain.append(_batch(10, seq, 4, tag="plain"))
            packed.append(_batch(11, seq, 4, compression="lz4", tag="lz4"))
        for round_ in range(6):  # committed, aborted, committed, ... interleaved with a plain producer
            txns.append(_batch(12, round_ * 3, 3, txn=True, tag="txn"))
            txns.append(_batch(13, round_ * 2, 2, tag="plain"))
            txns.write_txn_marker(12, 0, commit=round_ % 2 == 0, coordinator_epoch=0)
        for seq in range(0, 20, 4):
            open_txn.append(_batch(14, seq, 4, tag="before"))
        open_txn.append(_batch(15, 0, 3, txn=True, tag="open"))  # never ended: the LSO stays here
        for seq in range(20, 40, 4):
            open_txn.append(_batch(14, seq, 4, tag="after"))
    return path


def engine_rows(
    root: Path, isolation: Isolation, ranges: dict[int, tuple[int, int]] | None = None
) -> list[Row]:
    out: list[Row] = []
    with LogManager.open(root, CONFIG, progress=False) as manager:
        for tp, log in manager.logs().items():
            start, end = (ranges or {}).get(tp.partition, (log.log_start_offset, log.log_end_offset))
            offset = start
            while offset < end:
                fetched = log.read(offset, max_bytes=1 << 20, isolation=isolation)
                if not fetched.batches:
                    break
                headers_by_batch = {b.base_offset: b for b in fetched.batches}
                for record in fetched.records():
                    if not start <= record.offset < end:
                        continue
                    batch = next(
                        b for base, b in headers_by_batch.items() if base <= record.offset <= b.last_offset
                    )
                    sequence = (
                        -1
                        if batch.base_sequence < 0
                        else (batch.base_sequence + record.offset - batch.base_offset) % 2**31
                    )
                    out.append(
                        (
                            record.key,
                            record.value,
                            TOPIC,
                            tp.partition,
                            record.offset,
                            record.timestamp_ms,
                            1 if batch.is_log_append_time else 0,
                            [(k, v) for k, v in record.headers],
                            batch.producer_id,
                            batch.producer_epoch,
                            sequence,
                        )
                    )
                offset = fetched.next_offset
    return sorted(out, key=lambda row: (row[3], row[4]))


def spark_rows(df: DataFrame) -> list[Row]:
    rows = df.selectExpr(
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "unix_millis(timestamp) AS ts",
        "timestampType",
        "headers",
        "producerId",
        "producerEpoch",
        "sequence",
    ).collect()
    out = [
        (
            None if r.key is None else bytes(r.key),
            bytes(r.value),
            r.topic,
            r.partition,
            r.offset,
            r.ts,
            r.timestampType,
            [(h.key, None if h.value is None else bytes(h.value)) for h in r.headers],
            r.producerId,
            r.producerEpoch,
            r.sequence,
        )
        for r in rows
    ]
    return sorted(out, key=lambda row: (row[3], row[4]))


def load(spark: SparkSession, root: Path, **options: Any) -> DataFrame:
    oncelog.spark.register(spark)
    reader = spark.read.format("oncelog").option("topic", TOPIC)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(root))


def test_the_schema_is_the_kafka_sources_plus_producer_fields(spark: SparkSession, root: Path) -> None:
    assert load(spark, root).schema == StructType.fromDDL(DDL)
    assert StructType.fromDDL(DDL).simpleString() == SCHEMA_STRING


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_every_row_equals_the_engines_read(spark: SparkSession, root: Path, isolation: Isolation) -> None:
    expected = engine_rows(root, isolation)
    got = spark_rows(load(spark, root, isolation=isolation))
    assert got == expected
    values = [row[1] for row in got]
    assert any(v.startswith(b"lz4-") for v in values)
    if isolation == "read_committed":
        assert not any(v.startswith((b"open-", b"after-")) for v in values)  # past the open transaction
        assert sum(v.startswith(b"txn-") for v in values) == 3 * 3  # the 3 committed of 6 transactions
    else:
        assert any(v.startswith(b"open-") for v in values)


def test_read_committed_is_the_default(spark: SparkSession, root: Path) -> None:
    assert spark_rows(load(spark, root)) == engine_rows(root, "read_committed")


def test_offset_ranges_are_kafkas_json(spark: SparkSession, root: Path) -> None:
    starting = {TOPIC: {"0": 17, "1": -2, "2": 5}}
    ending = {TOPIC: {"0": 50, "1": 9, "3": -1}}
    df = load(
        spark,
        root,
        isolation="read_uncommitted",
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
    )
    full = engine_rows(root, "read_uncommitted")
    ends = {p: max(row[4] for row in full if row[3] == p) + 1 for p in range(4)}
    ranges = {0: (17, 50), 1: (0, 9), 2: (5, ends[2]), 3: (0, ends[3])}
    assert spark_rows(df) == engine_rows(root, "read_uncommitted", ranges)


def test_large_partitions_are_split_into_offset_ranges(spark: SparkSession, root: Path) -> None:
    df = load(spark, root, isolation="read_uncommitted", maxRecordsPerPartition=25, minPartitions=2)
    assert df.rdd.getNumPartitions() >= 120 // 25
    assert spark_rows(df) == engine_rows(root, "read_uncommitted")


def test_a_start_below_the_log_start_fails_unless_failOnDataLoss_is_false(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    with LogManager.open(root, CONFIG, progress=False) as manager:
        log = manager.log(TOPIC, 0)
        for seq in range(0, 200, 4):
            log.append(_batch(1, seq, 4))
        log.delete_records(100)
    with pytest.raises(Exception, match="failOnDataLoss"):
        load(spark, root, startingOffsets=json.dumps({TOPIC: {"0": 10}})).collect()
    df = load(spark, root, startingOffsets=json.dumps({TOPIC: {"0": 10}}), failOnDataLoss="false")
    assert [row[4] for row in spark_rows(df)] == list(range(100, 200))


def test_an_unknown_topic_or_bad_option_fails_at_planning_naming_it(spark: SparkSession, root: Path) -> None:
    oncelog.spark.register(spark)
    with pytest.raises(Exception, match=r"topic nope does not exist under .*its topics: events"):
        spark.read.format("oncelog").option("topic", "nope").load(str(root)).collect()
    with pytest.raises(Exception, match="isolation"):
        load(spark, root, isolation="dirty").collect()


def test_a_cleaned_compacted_topic_reads_with_its_gaps_and_empty_batches(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    compacted = LogConfig(segment_bytes=4096, cleanup_policy="compact")
    with LogManager.open(root, compacted, progress=False) as manager:
        log = manager.log("changelog", 0)
        for seq in range(0, 200, 4):  # 50 batches of producer 21 over 10 keys: most records go
            records = [(b"k%d" % ((seq + i) % 10), b"v%d" % (seq + i)) for i in range(4)]
            log.append(encode_batch(records, producer_id=21, producer_epoch=0, base_sequence=seq,
                                    timestamp_ms=T0 + seq, compression="lz4"))  # fmt: skip
        log.append(encode_batch([(b"k1", b"aborted")], producer_id=22, producer_epoch=0, base_sequence=0,
                                is_transactional=True, timestamp_ms=T0))  # fmt: skip
        log.write_txn_marker(22, 0, commit=False, coordinator_epoch=0)
        log.roll()
        assert log.clean().stats.batches_emptied > 0  # producer 21's window, each segment's last batch
        expected = sorted((r.offset, r.key, r.value) for r in read_records(log, "read_committed"))
    oncelog.spark.register(spark)
    df = spark.read.format("oncelog").option("topic", "changelog").load(str(root))
    rows = sorted(
        (r.offset, bytes(r.key), bytes(r.value)) for r in df.select("offset", "key", "value").collect()
    )
    assert rows == expected and len(rows) == 10  # one record per key, at its own offset
    assert b"aborted" not in [value for _, _, value in rows]
