"""What a query plans to read (issue 27): empty reads, options checked as spark-sql-kafka does,
roots resolved on the driver, and filters on partition, offset and timestamp pushed down.

Pushdown is checked the only way that matters: every filter, on its boundaries, gives
the same rows with pushdown on and off (Spark's `spark.sql.python.filterPushdown.enabled`),
and the same as the filter applied in Python to a full read.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

import oncelog.spark
from oncelog import LogConfig, LogManager
from oncelog.segments.batch import encode_batch
from oncelog.segments.records import Record

TOPIC = "events"
T0 = 1_700_000_000_000
PARTITIONS = 3
PER_PARTITION = 60
PUSHDOWN = oncelog.spark.FILTER_PUSHDOWN_CONF


def _stamp(partition: int, offset: int) -> int:
    """Timestamps that rise with the offset but jitter back (clients' clocks)."""
    return T0 + offset * 10 - (offset % 4) * 15 + partition


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plans") / "root"
    config = LogConfig(segment_bytes=1024, index_interval_bytes=100)
    with LogManager.open(path, config, progress=False) as manager:
        for p in range(PARTITIONS):
            log = manager.log(TOPIC, p)
            for first in range(0, PER_PARTITION, 3):
                records = [Record(i, _stamp(p, first + i), None, b"v%d" % (first + i)) for i in range(3)]
                log.append(encode_batch(records))
        manager.log("empty", 0)
    return path


def load(
    spark: SparkSession, root: Path | str, topic: str = TOPIC, *, pushdown: bool = True, **options: Any
) -> DataFrame:
    oncelog.spark.register(spark, filter_pushdown=pushdown)
    reader = spark.read.format("oncelog").option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(root))


def keys(df: DataFrame) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())


# -- empty reads ---------------------------------------------------------------------------
def test_an_empty_topic_reads_as_no_rows_with_the_schema(spark: SparkSession, root: Path) -> None:
    df = load(spark, root, "empty")
    assert df.count() == 0 and df.collect() == []
    assert [f.name for f in df.schema.fields][:5] == ["key", "value", "topic", "partition", "offset"]


def test_a_partition_whose_last_stable_offset_is_0_reads_as_no_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    # What a driver crash in the middle of an exactly-once write leaves: an open transaction first.
    with LogManager.open(tmp_path, LogConfig(), progress=False) as manager:
        log = manager.log("t", 0)
        log.append(
            encode_batch(
                [(None, b"x")], producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True
            )
        )
    assert load(spark, tmp_path, "t").count() == 0
    assert load(spark, tmp_path, "t", isolation="read_uncommitted").count() == 1


def test_starting_at_the_end_reads_no_rows(spark: SparkSession, root: Path) -> None:
    at_end = json.dumps({TOPIC: {str(p): PER_PARTITION for p in range(PARTITIONS)}})
    assert load(spark, root, startingOffsets=at_end).count() == 0


def test_filters_that_match_nothing_read_no_rows(spark: SparkSession, root: Path) -> None:
    assert load(spark, root).filter("partition = 99").count() == 0
    assert load(spark, root).filter("offset > 5 and offset < 6").count() == 0


def test_a_stream_of_a_topic_not_created_yet_waits_for_it(spark: SparkSession, tmp_path: Path) -> None:
    LogManager.open(tmp_path, LogConfig(), progress=False).close()
    oncelog.spark.register(spark)
    stream = spark.readStream.format("oncelog").option("topic", "later").load(str(tmp_path))
    seen: list[int] = []
    query = (
        stream.writeStream.foreachBatch(lambda batch, _: seen.append(batch.count()))
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None and sum(seen) == 0


# -- options -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffset": "earliest"}, "unknown option startingoffset .*did you mean startingOffsets"),
        ({"isolaton": "bogus"}, "unknown option isolaton .*did you mean isolation"),
        ({"isolation": "bogus"}, "option isolation must be read_committed or read_uncommitted"),
        ({"writeId": "w"}, "option writeid is for writes"),
        (
            {
                "startingOffsets": json.dumps({TOPIC: {"0": 30}}),
                "endingOffsets": json.dumps({TOPIC: {"0": 20}}),
            },
            r"option startingOffsets \(30\) is after endingOffsets \(20\) for events-0",
        ),
        (
            {"startingOffsets": json.dumps({TOPIC: {"1": 500}})},
            "startingOffsets: offset 500 of events-1 is past",
        ),
        ({"endingOffsets": json.dumps({TOPIC: {"2": 500}})}, "endingOffsets: offset 500 of events-2 is past"),
        ({"startingOffsets": json.dumps({TOPIC: {"7": 0}})}, r"names partition\(s\) \[7\] of events"),
    ],
)
def test_a_bad_option_fails_the_query_naming_it(
    spark: SparkSession, root: Path, options: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        load(spark, root, **options).collect()


@pytest.mark.parametrize(
    "options",
    [
        {"endingOffsets": json.dumps({TOPIC: {"0": 500}})},
        {"startingOffsets": json.dumps({TOPIC: {"0": 40}}), "endingOffsets": json.dumps({TOPIC: {"0": 30}})},
    ],
)
def test_a_bad_offset_fails_even_where_a_filter_skips_its_partition(
    spark: SparkSession, root: Path, options: dict[str, str]
) -> None:
    with pytest.raises(Exception, match="events-0"):
        load(spark, root, **options).filter("partition = 2").collect()


def test_failOnDataLoss_false_clamps_offsets_past_the_end(spark: SparkSession, root: Path) -> None:
    df = load(
        spark,
        root,
        failOnDataLoss="false",
        startingOffsets=json.dumps({TOPIC: {"0": 500, "1": 50}}),
        endingOffsets=json.dumps({TOPIC: {"1": 500}}),
    )
    assert keys(df) == [(1, o) for o in range(50, PER_PARTITION)] + [(2, o) for o in range(PER_PARTITION)]


def test_a_missing_root_or_a_file_is_one_clear_line(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(Exception, match=f"{tmp_path / 'nope'}: no such directory: there is no oncelog root"):
        load(spark, tmp_path / "nope").collect()
    (tmp_path / "file").write_text("x")
    with pytest.raises(Exception, match=f"{tmp_path / 'file'}: this is a file, not an oncelog root"):
        load(spark, tmp_path / "file").collect()
    frame = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception, match="file"):
        frame.write.format("oncelog").mode("append").option("topic", "t").save(str(tmp_path / "file"))


# -- roots resolved on the driver ----------------------------------------------------------
def test_a_relative_root_means_the_drivers_working_directory(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver's Python planning workers run in the driver JVM's directory, this process's.
    cwd = Path(os.getcwd())
    relative = os.path.relpath(tmp_path / "rel" / "root", cwd)
    oncelog.spark.register(spark)
    frame = spark.createDataFrame([(b"v%d" % n,) for n in range(20)], "value binary")
    frame.write.format("oncelog").mode("append").option("topic", "t").option("numPartitions", "2").save(
        relative
    )
    assert sorted(p.name for p in (tmp_path / "rel" / "root").glob("t-*")) == ["t-0", "t-1"]
    assert load(spark, relative, "t").count() == 20


# -- pushdown ------------------------------------------------------------------------------
def _boundaries() -> list[str]:
    middle_ms = _stamp(1, PER_PARTITION // 2)
    at = dt.datetime.fromtimestamp(middle_ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    before = dt.datetime.fromtimestamp((middle_ms - 1) / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    expressions = []
    for op in ("=", "<", "<=", ">", ">="):
        expressions += [f"partition {op} {v}" for v in (0, 1, 2)]
        expressions += [f"offset {op} {v}" for v in (0, 29, 30, PER_PARTITION - 1, PER_PARTITION)]
        expressions += [f"timestamp {op} timestamp'{t}'" for t in (at, before)]
    expressions += [
        "partition in (0, 2)",
        "offset in (0, 31, 59, 80)",
        f"timestamp in (timestamp'{at}', timestamp'{before}')",
        "partition = 1 and offset >= 10 and offset < 20",
        f"partition >= 1 and timestamp >= timestamp'{at}' and offset <= 50",
        "offset <=> 12",
        "not (partition = 1)",
    ]
    return expressions


def _each_filtered(
    frame: Callable[[], DataFrame], expressions: list[str]
) -> dict[int, list[tuple[int, int]]]:
    """Rows under each expression, in one job (a union of one filtered scan each). Each scan
    gets a frame of its own: Spark 4.1-4.3 share one scan's pushdown with every other scan of
    the same loaded frame (see test_spark_shares_a_pushed_down_plan_across_one_loaded_frame)."""
    parts = [
        frame().filter(e).selectExpr(f"{n} AS e", "partition", "offset") for n, e in enumerate(expressions)
    ]
    union = functools.reduce(DataFrame.unionAll, parts)
    found: dict[int, list[tuple[int, int]]] = {n: [] for n in range(len(expressions))}
    for row in union.collect():
        found[row.e].append((row.partition, row.offset))
    return {n: sorted(rows) for n, rows in found.items()}


def test_every_filter_gives_the_same_rows_with_and_without_pushdown(spark: SparkSession, root: Path) -> None:
    full = load(spark, root).selectExpr("partition", "offset", "unix_micros(timestamp) AS ts").collect()
    assert len(full) == PARTITIONS * PER_PARTITION
    reference = spark.createDataFrame(
        [(r.partition, r.offset, r.ts) for r in full], "partition int, offset bigint, ts bigint"
    ).selectExpr("partition", "offset", "timestamp_micros(ts) AS timestamp")
    expressions = _boundaries()
    expected = _each_filtered(lambda: reference, expressions)
    try:
        spark.conf.set(PUSHDOWN, "true")
        with_pushdown = _each_filtered(lambda: load(spark, root), expressions)
        spark.conf.set(PUSHDOWN, "false")
        without = _each_filtered(lambda: load(spark, root, pushdown=False), expressions)
    finally:
        spark.conf.set(PUSHDOWN, "true")
    for n, expression in enumerate(expressions):
        assert with_pushdown[n] == expected[n] == without[n], expression
    assert sum(map(len, expected.values())) > len(expressions) * 20  # the boundaries select rows


def test_a_partition_filter_plans_only_that_partition(spark: SparkSession, root: Path) -> None:
    whole = {"maxRecordsPerPartition": PER_PARTITION}  # a task per partition, none packed
    assert load(spark, root, **whole).rdd.getNumPartitions() == PARTITIONS
    assert load(spark, root, **whole).filter("partition = 1").rdd.getNumPartitions() == 1
    narrowed = load(spark, root, maxRecordsPerPartition=10).filter("offset >= 50")
    assert narrowed.rdd.getNumPartitions() == PARTITIONS  # one range of 10 per partition, not 6
    assert load(spark, root).rdd.getNumPartitions() == 1  # small ranges: packed into one task
    assert load(spark, root, minPartitions=3).rdd.getNumPartitions() == 3


def test_spark_shares_a_pushed_down_plan_across_one_loaded_frame(spark: SparkSession, root: Path) -> None:
    # Spark 4.1-4.3 keep the read planned by the last pushdown on the loaded relation, and a
    # later query of the same frame with no pushable filter reuses it. This is why register()
    # leaves pushdown off unless asked. When a Spark upgrade makes this test fail, the bug is
    # fixed: pushdown can then be on by default.
    frame = load(spark, root)
    assert frame.filter("partition = 1").count() == PER_PARTITION
    assert frame.count() == PER_PARTITION  # not PARTITIONS * PER_PARTITION: Spark's bug
    assert load(spark, root).count() == PARTITIONS * PER_PARTITION  # a new frame is planned anew
    # Within one query too (a union of one frame's filters): Spark re-applies every filter the
    # reader narrowed by, so rows may go missing but never break their own filter.
    frame = load(spark, root)
    a = frame.where("partition = 0").selectExpr("'a' AS side", "partition")
    b = frame.where("partition = 1").selectExpr("'b' AS side", "partition")
    rows = a.unionAll(b).collect()
    assert rows and all((row.side == "a") == (row.partition == 0) for row in rows)


def test_register_leaves_the_sessions_pushdown_alone_unless_asked(spark: SparkSession) -> None:
    spark.conf.set(PUSHDOWN, "false")
    oncelog.spark.register(spark)
    assert spark.conf.get(PUSHDOWN) == "false"
    oncelog.spark.register(spark, filter_pushdown=True)
    assert spark.conf.get(PUSHDOWN) == "true"


def test_reads_work_with_pythons_filter_pushdown_off(spark: SparkSession, root: Path) -> None:
    spark.conf.set(PUSHDOWN, "false")
    try:
        df = load(spark, root, pushdown=False)
        assert df.filter("partition = 1").count() == PER_PARTITION
    finally:
        spark.conf.set(PUSHDOWN, "true")
