"""Writing DataFrames into logs exactly once (issue 9, brief §10).

Read back with the engine in read_committed: every input row exactly once, no
transaction left open, and a re-run of the same writeId adds nothing. The retry test
runs on local[2,4] and comes last (switching sessions costs a restart).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import col, udf
from pyspark.sql.types import BinaryType

import oncelog.spark
from oncelog import Log, LogConfig
from oncelog.results import Isolation

TOPIC = "out"


def read_back(
    root: Path, isolation: Isolation = "read_committed"
) -> list[tuple[int, bytes | None, bytes, list[tuple[str, bytes | None]]]]:
    """(partition, key, value, headers) of every record; asserts nothing is left open."""
    out = []
    for path in sorted(root.glob(f"{TOPIC}-*")):
        partition = int(path.name.rsplit("-", 1)[1])
        with Log.open(path, LogConfig()) as log:
            assert log.last_stable_offset == log.log_end_offset, f"{path.name}: a transaction was left open"
            offset = log.log_start_offset
            while True:
                fetched = log.read(offset, max_bytes=1 << 20, isolation=isolation)
                if not fetched.batches:
                    break
                out += [(partition, r.key, r.value or b"", list(r.headers)) for r in fetched.records()]
                offset = fetched.next_offset
    return out


def frame(spark: SparkSession, rows: int, partitions: int = 4) -> DataFrame:
    data = [(b"k%d" % n, b"v%d" % n) for n in range(rows)]
    return spark.createDataFrame(data, "key binary, value binary").repartition(partitions)


def save(df: DataFrame, root: Path, write_id: str, **options: str) -> None:
    writer = df.write.format("oncelog").mode("append").option("topic", TOPIC).option("writeId", write_id)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save(str(root))


def test_rows_are_written_once_and_visible_after_the_commit(spark: SparkSession, tmp_path: Path) -> None:
    oncelog.spark.register(spark)
    save(frame(spark, 2000), tmp_path, "w1", numPartitions="3")
    got = read_back(tmp_path)
    assert sorted(value for _, _, value, _ in got) == sorted(b"v%d" % n for n in range(2000))
    assert {partition for partition, *_ in got} == {0, 1, 2}


def test_re_running_the_same_write_id_writes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    oncelog.spark.register(spark)
    save(frame(spark, 500), tmp_path, "w2", numPartitions="2")
    before = read_back(tmp_path, "read_uncommitted")
    save(frame(spark, 500), tmp_path, "w2", numPartitions="2")
    assert read_back(tmp_path, "read_uncommitted") == before
    save(frame(spark, 500), tmp_path, "w3")  # a new write id does write
    assert Counter(value for _, _, value, _ in read_back(tmp_path)) == Counter(
        {b"v%d" % n: 2 for n in range(500)}
    )


def test_partition_and_headers_columns_are_honoured(spark: SparkSession, tmp_path: Path) -> None:
    oncelog.spark.register(spark)
    df = spark.createDataFrame(
        [(b"v%d" % n, n % 2, [("trace", b"%d" % n)]) for n in range(100)],
        "value binary, partition int, headers array<struct<key:string,value:binary>>",
    )
    save(df, tmp_path, "w4", numPartitions="2")
    got = read_back(tmp_path)
    assert len(got) == 100
    for partition, key, value, headers in got:
        n = int(value[1:])
        assert (partition, key, headers) == (n % 2, None, [("trace", b"%d" % n)])


def test_bad_input_fails_before_anything_is_written(spark: SparkSession, tmp_path: Path) -> None:
    oncelog.spark.register(spark)
    with pytest.raises(Exception, match="value column"):
        save(spark.createDataFrame([(b"k",)], "key binary"), tmp_path, "w5")
    with pytest.raises(Exception, match="append-only"):
        frame(spark, 10).write.format("oncelog").mode("overwrite").option("topic", TOPIC).save(str(tmp_path))
    assert not list(tmp_path.glob(f"{TOPIC}-*"))


_rows_seen: Counter[tuple[int, int]] = Counter()  # per (task, attempt), in each Python worker


@udf(returnType=BinaryType())
def fail_first_attempts(value: bytes) -> bytes:
    """Fails the first attempt of tasks 1 and 3 at their 4,500th row (~5,000 each): by then
    the attempt has appended batches of 50 rows, which the commit must abort."""
    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0 and context.partitionId() in (1, 3):
        key = (context.partitionId(), context.attemptNumber())
        _rows_seen[key] += 1
        if _rows_seen[key] == 4500:
            raise RuntimeError("injected failure of a first attempt")
    return value


def test_retried_tasks_leave_every_row_exactly_once(spark_retry: SparkSession, tmp_path: Path) -> None:
    oncelog.spark.register(spark_retry)
    # Rows reach write() in Arrow batches of this many: small, so the failed attempts'
    # write() sees (and appends) rows before their UDF fails.
    spark_retry.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    df = frame(spark_retry, 20_000).withColumn("value", fail_first_attempts(col("value")))
    # Small batches appended every ~20 KB: the failed attempts leave rows in the log.
    save(df, tmp_path, "w6", numPartitions="4", batchRecords="50", maxPendingBytes="20000")
    committed = read_back(tmp_path)
    assert Counter(value for _, _, value, _ in committed) == Counter({b"v%d" % n: 1 for n in range(20_000)})
    # The failed attempts did append (and were aborted): the log holds more than the input.
    everything = read_back(tmp_path, "read_uncommitted")
    assert len(everything) > 20_000
