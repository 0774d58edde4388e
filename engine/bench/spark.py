"""The Spark figures of `oncelog bench --spark`: reading a topic as a DataFrame vs parquet.

Both sides run on one Spark session in this process (`spark_master` of the settings,
local[2] by default; `oncelog bench --spark --spark-master spark://host:7077` for a
standalone cluster, whose workers must see the scratch directory, so pass --dir on a
shared filesystem, and have oncelog installed). The oncelog source reads an
8-partition topic of N records (`spark_records`: ~100-byte random values, 1,000
records a batch, record timestamps increasing by 1 ms per offset from the same
base in every partition); the reference is `spark.read.parquet` of the very same
rows, written by Spark from the oncelog read. The session sets
spark.sql.python.filterPushdown.enabled=true, so the source is offered the filters.

Rows, each timed on both sides, interleaved, for `repeats` rounds after a warm-up:

  full rows            `write.format("noop")`: every column of every row produced;
                       ratio >= 1.
  sum(offset)          `selectExpr("sum(offset)").collect()`: parquet reads one
                       column, this source produces all (no column pruning in the
                       Python Data Source API); reported.
  partition = 3        one of the 8 partitions, then a noop write (every column of
                       the selected rows produced); ratio >= 1.
  offset >= N          N = per-partition count - a tenth of it, so 10% of every
                       partition qualifies; noop write; ratio >= 1.
  timestamp >= T       T = the base + N ms: the same 10% by timestamp; noop write;
                       ratio >= 0.8.
  sum(length(value))   one column on parquet's side, as sum(offset); reported.

The filtered rows time `df.where(...).write.format("noop")`: a noop write makes
Spark produce every column of every row that passes, where a count() would let
parquet read no column at all.

Each row gets fresh DataFrames on both sides: Spark (pyspark 4.3 here) keeps the reader
that a pushed filter planned on the DataFrame's relation, so a later query on the same
DataFrame without that filter would read the filtered rows only.

Before its timing each row checks its answer: the row count (or the aggregate)
from the oncelog DataFrame, from the parquet one and from the data's construction
must agree, or the row fails (AssertionError) rather than report a fast, wrong
figure (a filter pushed down wrongly, say).

Each row is parquet's time over ours (higher is better): the value is the topic's
records per second through the query (all N, whatever the filter selects), the
reference the same for parquet, both from the median round. A note gives each
row's spread: the lowest and highest of the per-round ratios.

Only the Spark rows: `python -m oncelog.bench.spark [--quick] [--scale S] [--master URL]`.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from oncelog.bench.harness import (
    BenchResults,
    BenchSettings,
    Progress,
    Target,
    count_label,
    make_row,
    settings_for,
    timed,
)
from oncelog.bench.sigint import sigint_deferred
from oncelog.config import LogConfig
from oncelog.log_manager import LogManager
from oncelog.segments.batch import encode_batch
from oncelog.segments.records import Record

TOPIC = "bench"
PARTITIONS = 8
RECORDS_PER_BATCH = 1000
VALUE_BYTES = 100
SELECTED_PARTITION = 3
SELECTED_FRACTION = 10  # the offset and timestamp rows select 1/10 of every partition
BASE_TIMESTAMP_MS = 1_700_000_000_000  # record timestamp = this + its offset (ms)


@dataclass(frozen=True)
class Layout:
    """The topic the figures read: PARTITIONS x per_partition records, offsets 0 up."""

    per_partition: int

    @property
    def records(self) -> int:
        return self.per_partition * PARTITIONS

    @property
    def offset_cut(self) -> int:
        """N of `offset >= N`: a tenth of every partition is at or above it."""
        return self.per_partition - self.per_partition // SELECTED_FRACTION

    @property
    def selected(self) -> int:
        """Records at or above offset_cut, over all partitions."""
        return (self.per_partition - self.offset_cut) * PARTITIONS

    @property
    def timestamp_cut_ms(self) -> int:
        return BASE_TIMESTAMP_MS + self.offset_cut


@dataclass(frozen=True)
class Query:
    name: str
    select: Callable[[Any], Any]  # the DataFrame the row times, from the side's whole topic
    full_rows: bool  # timed as a noop write; otherwise a one-value aggregate, collected
    expected: int  # rows of select(df) when full_rows, else the aggregate's value
    target: Target

    def run(self, df: Any) -> None:
        frame = self.select(df)
        if self.full_rows:
            frame.write.format("noop").mode("overwrite").save()
        else:
            frame.collect()

    def answer(self, df: Any) -> int:
        frame = self.select(df)
        return int(frame.count() if self.full_rows else frame.collect()[0][0])


def queries(layout: Layout) -> list[Query]:
    from pyspark.sql import functions as F

    n = layout.per_partition
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    cut = epoch + datetime.timedelta(milliseconds=layout.timestamp_cut_ms)
    return [
        Query("full rows, noop write", lambda df: df, True, layout.records, Target(min_ratio=1.0)),
        Query(
            "sum(offset)",
            lambda df: df.selectExpr("sum(offset)"),
            False,
            PARTITIONS * n * (n - 1) // 2,
            Target(),
        ),
        Query(
            f"partition = {SELECTED_PARTITION} (1 of {PARTITIONS}), noop write",
            lambda df: df.where(F.col("partition") == SELECTED_PARTITION),
            True,
            n,
            Target(min_ratio=1.0),
        ),
        Query(
            f"offset >= {layout.offset_cut:,} (10% of each partition), noop write",
            lambda df: df.where(F.col("offset") >= layout.offset_cut),
            True,
            layout.selected,
            Target(min_ratio=1.0),
        ),
        Query(
            "timestamp >= T (10% of records), noop write",
            lambda df: df.where(F.col("timestamp") >= F.lit(cut)),
            True,
            layout.selected,
            Target(min_ratio=0.8),
        ),
        Query(
            "sum(length(value))",
            lambda df: df.selectExpr("sum(length(value))"),
            False,
            layout.records * VALUE_BYTES,
            Target(),
        ),
    ]


def spark_session(master: str) -> Any:
    """A quiet session on `master` whose Python workers run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master(master)
        .appName("oncelog-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def build_topic(root: str, layout: Layout) -> None:
    """Every partition: offsets 0 .. per_partition - 1, timestamp BASE_TIMESTAMP_MS + offset."""
    with LogManager.open(root, LogConfig(segment_bytes=256 << 20), progress=False) as manager:
        for p in range(PARTITIONS):
            log = manager.log(TOPIC, p)
            for first in range(0, layout.per_partition, RECORDS_PER_BATCH):
                count = min(RECORDS_PER_BATCH, layout.per_partition - first)
                values = os.urandom(count * VALUE_BYTES)
                log.append(
                    encode_batch(
                        [
                            Record(
                                0,
                                BASE_TIMESTAMP_MS + first + i,
                                b"key-%08d" % (first + i),
                                values[i * VALUE_BYTES : (i + 1) * VALUE_BYTES],
                            )
                            for i in range(count)
                        ]
                    )
                )


def spark_read_figures(
    settings: BenchSettings, directory: str, results: BenchResults, progress: Progress
) -> None:
    import oncelog.spark

    layout = Layout(settings.spark_records // PARTITIONS)
    root = os.path.join(directory, "root")
    progress(f"  {layout.records:,} records in {PARTITIONS} partitions; Spark on {settings.spark_master}")
    built = time.perf_counter()
    build_topic(root, layout)
    progress(f"  topic built in {time.perf_counter() - built:.1f} s")
    spark: Any = None
    spreads: list[str] = []
    quiet = _Py4jQuiet()
    logging.getLogger().addFilter(quiet)
    try:
        # A Ctrl-C while the JVM starts would leave it running, half started: it waits for that.
        with sigint_deferred():
            spark = spark_session(settings.spark_master)
        oncelog.spark.register(spark)

        def load_ours() -> Any:
            return spark.read.format("oncelog").option("topic", TOPIC).load(root)

        parquet_path = os.path.join(directory, "parquet")
        load_ours().write.parquet(parquet_path)  # the same rows, written by Spark
        for query in queries(layout):
            # Fresh DataFrames for each row: Spark keeps the reader a pushed filter planned
            # on the DataFrame's relation, and a later query without that filter reuses it.
            theirs = spark.read.parquet(parquet_path)
            ours_s, theirs_s = _measure(query, load_ours(), theirs, settings.repeats)
            row = make_row(
                f"Spark read {count_label(layout.records)} records, {query.name}, vs spark.read.parquet",
                layout.records / statistics.median(ours_s),
                "records/s",
                layout.records / statistics.median(theirs_s),
                query.target,
            )
            results.rows.append(row)
            rounds = [t / o for o, t in zip(ours_s, theirs_s, strict=True)]
            spread = f"{min(rounds):.3g}-{max(rounds):.3g}"
            spreads.append(f"{query.name}: {spread}")
            progress(f"  {query.name}: ratio {row.ratio:.3g} (rounds {spread})")
    finally:
        try:
            if spark is not None:
                spark.stop()
        finally:
            logging.getLogger().removeFilter(quiet)
    results.notes.append(
        f"Spark read vs parquet, per-round ratio min-max over {settings.repeats} rounds: {'; '.join(spreads)}"
    )


class _Py4jQuiet(logging.Filter):
    """py4j logs every call a Ctrl-C interrupts to the root logger, with a traceback (the
    error reaches the bench anyway): not those."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}py4j{os.sep}" not in record.pathname


def _measure(query: Query, ours: Any, theirs: Any, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds of `repeats` runs of `query` on each side, interleaved, once its answers are checked."""
    answers = (query.answer(ours), query.answer(theirs))
    if answers != (query.expected, query.expected):
        raise AssertionError(
            f"Spark row {query.name!r}: oncelog answers {answers[0]:,}, parquet {answers[1]:,}, "
            f"the data {query.expected:,}"
        )
    query.run(ours)  # warm up the Python workers and the JVM
    query.run(theirs)
    ours_s: list[float] = []
    theirs_s: list[float] = []
    for _ in range(repeats):
        ours_s.append(timed(lambda: query.run(ours)))
        theirs_s.append(timed(lambda: query.run(theirs)))
    return ours_s, theirs_s


def main(argv: Sequence[str] | None = None) -> int:
    """Only the Spark rows: the same table as `oncelog bench`, without the other figures."""
    from oncelog.bench.report import print_report

    parser = argparse.ArgumentParser(prog="python -m oncelog.bench.spark", description=main.__doc__)
    parser.add_argument("--quick", action="store_true", help="the --quick settings of oncelog bench")
    parser.add_argument("--scale", type=float, default=1.0, help="scale the record count, in (0, 1]")
    parser.add_argument("--master", help="the Spark master URL (default: local[2])")
    parser.add_argument("--dir", help="where the scratch topic and parquet go (default: the temp dir)")
    args = parser.parse_args(argv)
    if not 0 < args.scale <= 1:
        parser.error("--scale must be in (0, 1]")
    settings = settings_for(args.quick, args.scale)
    if args.master:
        settings = replace(settings, spark_master=args.master)
    started = time.perf_counter()

    def progress(message: str) -> None:
        print(f"bench: {time.perf_counter() - started:6.1f} s  {message}", file=sys.stderr, flush=True)

    results = BenchResults(settings)
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-spark-", dir=args.dir) as scratch:
        spark_read_figures(settings, scratch, results, progress)
    results.elapsed_s = time.perf_counter() - started
    print_report(results, [f"oncelog bench, Spark rows only, {settings.mode} run"], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
