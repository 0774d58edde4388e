"""Streaming: a growing log read with restarts, and a stream written exactly once (issue 9).

Queries run with Trigger.AvailableNow on a checkpoint: each run reads what was there
when it started, in micro-batches capped by maxOffsetsPerTrigger, and a restart on the
same checkpoint resumes after the last committed batch.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession

import oncelog.spark
from oncelog import Log, LogConfig, LogManager
from oncelog.segments.batch import encode_batch

SOURCE, COPY = "src", "copy"
CONFIG = LogConfig(segment_bytes=4096)


def grow(root: Path, first: int, count: int, *, aborted: bool = False) -> list[bytes]:
    """Append `count` records per partition (2 partitions); returns the committed values."""
    committed = []
    with LogManager.open(root, CONFIG, progress=False) as manager:
        for p in range(2):
            log = manager.log(SOURCE, p)
            values = [b"p%d-%d" % (p, n) for n in range(first, first + count)]
            for i in range(0, count, 5):
                log.append(encode_batch([(None, v) for v in values[i : i + 5]]))
            committed += values
            if aborted:  # a transaction the coordinator aborts: never delivered
                pid = 1000 + first + p
                log.append(
                    encode_batch(
                        [(None, b"aborted")],
                        producer_id=pid,
                        producer_epoch=0,
                        base_sequence=0,
                        is_transactional=True,
                    )
                )
                log.write_txn_marker(pid, 0, commit=False, coordinator_epoch=0)
    return committed


def run_stream_to_files(spark: SparkSession, root: Path, sink: Path, checkpoint: Path) -> list[int]:
    """One AvailableNow run into a parquet sink; returns the rows of each micro-batch."""
    query = (
        spark.readStream.format("oncelog")
        .option("topic", SOURCE)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "30")
        .load(str(root))
        .selectExpr("value", "partition", "offset")
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    return [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]


def test_a_growing_log_is_delivered_exactly_once_across_restarts(spark: SparkSession, tmp_path: Path) -> None:
    oncelog.spark.register(spark)
    root, sink, checkpoint = tmp_path / "root", tmp_path / "sink", tmp_path / "checkpoint"
    expected = grow(root, 0, 40)
    first = run_stream_to_files(spark, root, sink, checkpoint)
    assert sum(first) == 80 and max(first) <= 30  # maxOffsetsPerTrigger honoured
    expected += grow(root, 40, 25, aborted=True)
    second = run_stream_to_files(spark, root, sink, checkpoint)  # the restart
    assert sum(second) == 50, second
    delivered = [bytes(row.value) for row in spark.read.parquet(str(sink)).collect()]
    assert Counter(delivered) == Counter(expected)


def test_a_stream_written_into_a_log_is_exactly_once_across_restarts(
    spark: SparkSession, tmp_path: Path
) -> None:
    oncelog.spark.register(spark)
    root, checkpoint = tmp_path / "root", tmp_path / "checkpoint"

    def copy() -> None:
        query = (
            spark.readStream.format("oncelog")
            .option("topic", SOURCE)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "25")
            .load(str(root))
            .selectExpr("key", "value")
            .writeStream.format("oncelog")
            .option("topic", COPY)
            .option("numPartitions", "3")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(str(root))
        )
        query.awaitTermination()
        assert query.exception() is None

    expected = grow(root, 0, 30)
    copy()
    expected += grow(root, 30, 10)
    copy()
    copied: list[bytes] = []
    for p in range(3):
        with Log.open(root / f"{COPY}-{p}", CONFIG) as log:
            assert log.last_stable_offset == log.log_end_offset
            fetched = log.read(0, max_bytes=1 << 24, isolation="read_committed")
            copied += [r.value or b"" for r in fetched.records()]
    assert Counter(copied) == Counter(expected)
