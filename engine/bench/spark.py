"""The Spark figure of `oncelog bench --spark`: reading N records as a DataFrame vs parquet.

Both sides run on one local[2] session in this process: the oncelog source reads a
4-partition topic of N records (~100-byte values, 1,000 records a batch), and the
reference is `spark.read.parquet` of the very same rows, written by Spark. Each side
is timed twice per round, interleaved: a full scan (`write.format("noop")`, every
column produced) and `sum(length(value))` (parquet reads one column, this source
always produces all: the Python Data Source API has no column pruning). The row is
parquet's time over ours, so higher is better; the target is >= 0.5.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from oncelog.bench.harness import BenchResults, BenchSettings, Progress, Target, make_row
from oncelog.config import LogConfig
from oncelog.log_manager import LogManager
from oncelog.segments.batch import encode_batch

TOPIC = "bench"
PARTITIONS = 4
RECORDS_PER_BATCH = 1000
VALUE_BYTES = 100


def spark_session() -> Any:
    """A quiet local[2] session whose Python workers run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("oncelog-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def build_topic(root: str, records: int) -> None:
    per_partition = records // PARTITIONS
    with LogManager.open(root, LogConfig(segment_bytes=256 << 20), progress=False) as manager:
        for p in range(PARTITIONS):
            log = manager.log(TOPIC, p)
            for first in range(0, per_partition, RECORDS_PER_BATCH):
                count = min(RECORDS_PER_BATCH, per_partition - first)
                values = [(b"key-%08d" % (first + i), os.urandom(VALUE_BYTES)) for i in range(count)]
                log.append(encode_batch(values))


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def spark_read_figures(
    settings: BenchSettings, directory: str, results: BenchResults, progress: Progress
) -> None:
    import oncelog.spark

    records = settings.spark_records
    root = os.path.join(directory, "root")
    progress(f"  {records:,} records in {PARTITIONS} partitions; starting Spark (local[2])")
    build_topic(root, records)
    spark = spark_session()
    try:
        oncelog.spark.register(spark)
        ours = spark.read.format("oncelog").option("topic", TOPIC).load(root)
        parquet_path = os.path.join(directory, "parquet")
        ours.write.parquet(parquet_path)  # the same rows, written by Spark
        theirs = spark.read.parquet(parquet_path)
        queries: dict[str, Callable[[Any], object]] = {
            "full scan (noop sink)": lambda df: df.write.format("noop").mode("overwrite").save(),
            "sum(length(value))": lambda df: df.selectExpr("sum(length(value))").collect(),
        }
        for name, query in queries.items():
            query(ours), query(theirs)  # warm up the Python workers and the JVM
            ours_s: list[float] = []
            theirs_s: list[float] = []
            for _ in range(settings.repeats):
                ours_s.append(_timed(lambda q=query: q(ours)))  # type: ignore[misc]
                theirs_s.append(_timed(lambda q=query: q(theirs)))  # type: ignore[misc]
            rate = records / statistics.median(ours_s)
            reference = records / statistics.median(theirs_s)
            results.rows.append(
                make_row(
                    f"Spark read {records:,} records, {name}, vs spark.read.parquet",
                    rate,
                    "records/s",
                    reference,
                    Target(min_ratio=0.5),
                )
            )
    finally:
        spark.stop()
