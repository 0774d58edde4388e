"""What any Python data source costs Spark on a full read: a floor for the Spark rows.

    .venv/bin/python bench/spark_floor.py

One local[2] session reads the same 1M rows (8 partitions, 100-byte values) three ways,
alternating, 7 rounds after a warm-up, each as `write.format("noop")`: the `floor`
source, which re-yields Arrow batches decoded once in advance (so it measures only
Spark taking rows from a Python worker), the oncelog source, and spark.read.parquet;
then one partition's 125k rows the same three ways (`partition = 3` for oncelog, with
pushdown, and parquet). Prints each one's median time and range.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

RECORDS_PER_PARTITION = 125_000
TASKS = 4  # as many as the oncelog read plans for these 1M records (readers.PACK_RECORDS)
_decoded: list[pa.RecordBatch] = []


def _batches(root: str) -> list[pa.RecordBatch]:
    if not _decoded:
        from oncelog.spark.options import read_options
        from oncelog.spark.planning import plan_read_root
        from oncelog.spark.readers import RangePartition, read_range

        options = plan_read_root(read_options({"path": root, "topic": "bench"}))
        _decoded.extend(read_range(options, RangePartition(0, 0, RECORDS_PER_PARTITION)))
    return _decoded


class FloorReader(DataSourceReader):
    def __init__(self, root: str, tasks: int, copies: int):
        self.root, self.tasks, self.copies = root, tasks, copies

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(n) for n in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for _ in range(self.copies):  # one partition's decoded rows, `copies` times per task
            yield from _batches(self.root)


class FloorSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "oncelog_floor"

    def schema(self) -> str:
        from oncelog.spark.arrow_batches import DDL

        return DDL

    def reader(self, schema: Any) -> DataSourceReader:
        tasks = int(self.options.get("tasks", TASKS))
        return FloorReader(self.options["path"], tasks, int(self.options.get("copies", 8 // tasks)))


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import oncelog.spark
    from oncelog.bench.spark import Layout, build_topic

    here = os.path.dirname(os.path.abspath(__file__))
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.executorEnv.PYTHONPATH", here)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FloorSource)
    oncelog.spark.register(spark)
    with tempfile.TemporaryDirectory() as root:
        build_topic(root, Layout(RECORDS_PER_PARTITION))
        spark.read.format("oncelog").option("topic", "bench").load(root).write.parquet(root + "/parquet")
        oncelog.spark.register(spark, filter_pushdown=True)

        def floor() -> Any:
            return spark.read.format("oncelog_floor")  # a reader of its own: option() changes it

        def ours() -> Any:
            return spark.read.format("oncelog").option("topic", "bench")

        reads: dict[str, Callable[[], Any]] = {
            "1M rows, floor": lambda: floor().load(root),
            "1M rows, oncelog": lambda: ours().load(root),
            "1M rows, parquet": lambda: spark.read.parquet(root + "/parquet"),
            "125k rows, floor (1 task)": lambda: floor().option("tasks", 1).option("copies", 1).load(root),
            "125k rows, oncelog p = 3": lambda: ours().load(root).where("partition = 3"),
            "125k rows, parquet p = 3": lambda: spark.read.parquet(root + "/parquet").where("partition = 3"),
        }
        times: dict[str, list[float]] = {name: [] for name in reads}
        for rounds in range(8):
            for name, read in reads.items():
                started = time.perf_counter()
                read().write.format("noop").mode("overwrite").save()
                if rounds:  # the first round warms the workers up
                    times[name].append(time.perf_counter() - started)
        for name, spent in times.items():
            print(f"{name:30} median {statistics.median(spent):.3f} s  ({min(spent):.3f}-{max(spent):.3f})")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
