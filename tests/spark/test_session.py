"""Smoke tests of the Spark scaffolding (tests/spark/conftest.py) and of the PySpark Python
Data Source contract that ``oncelog.spark`` relies on.

The data sources here are defined at module level, so Spark pickles them by reference and the
Python workers import this module: that works only because the conftest puts this directory
on the workers' PYTHONPATH.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Row, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

# Some of the Kafka source's columns, one of each type that needs care in Arrow.
TOY_SCHEMA = (
    "key binary, value binary, partition int, offset long, timestamp timestamp, "
    "headers array<struct<key:string,value:binary>>, producerEpoch short"
)
BASE_TIMESTAMP_US = 1_700_000_000_000_000


@dataclass
class ToyPartition(InputPartition):
    partition: int
    rows: int


def toy_record(partition: int, offset: int) -> tuple[Any, ...]:
    """One row as the test expects it back (timestamp as microseconds since the epoch)."""
    key = None if offset % 2 else f"k{offset}".encode()
    headers = [("trace", bytes([partition, offset]))] if offset % 3 == 0 else []
    return (key, b"v" * (offset + 1), partition, offset, BASE_TIMESTAMP_US + offset, headers, -1)


class ToyReader(DataSourceReader):
    def __init__(self, schema: StructType, partitions: int, rows: int) -> None:
        self.schema = schema
        self.partition_count = partitions
        self.rows = rows

    def partitions(self) -> list[InputPartition]:
        return [ToyPartition(p, self.rows) for p in range(self.partition_count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ToyPartition)
        # Spark compares a yielded batch's schema with this one exactly: binary (not
        # large_binary), timestamp[us, tz=UTC], int16 for short, nullability included.
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        rows = [toy_record(partition.partition, offset) for offset in range(partition.rows)]
        columns = [list(column) for column in zip(*rows, strict=True)]
        columns[5] = [[{"key": k, "value": v} for k, v in headers] for headers in columns[5]]
        yield pa.RecordBatch.from_arrays(
            [pa.array(values, type=field.type) for values, field in zip(columns, arrow_schema, strict=True)],
            schema=arrow_schema,
        )


class ToySource(DataSource):
    """A fixed Arrow-yielding batch source: ``partitions`` splits of ``rows`` records."""

    @classmethod
    def name(cls) -> str:
        return "oncelog_toy"

    def schema(self) -> str:
        return TOY_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ToyReader(schema, int(self.options.get("partitions", "2")), int(self.options.get("rows", "3")))


@dataclass
class AttemptMessage(WriterCommitMessage):
    partition: int
    attempt: int
    rows: int


class RecordingWriter(DataSourceWriter):
    """Writes each task attempt's ids to its own file under ``path``; ``commit`` and ``abort``
    (which run in a Python worker, not in this process) record their messages as JSON."""

    def __init__(self, path: str, fail_first_attempt_of: set[int]) -> None:
        self.path = Path(path)
        self.fail_first_attempt_of = fail_first_attempt_of

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        context = TaskContext.get()
        assert context is not None
        partition, attempt = context.partitionId(), context.attemptNumber()
        rows = 0
        with open(self.path / f"p{partition}-a{attempt}.ids", "w") as out:
            for row in iterator:
                out.write(f"{row.id}\n")
                out.flush()
                rows += 1
                if attempt == 0 and partition in self.fail_first_attempt_of and rows == 10:
                    raise RuntimeError(f"injected failure: partition {partition} attempt 0")
        return AttemptMessage(partition, attempt, rows)

    def _record(self, name: str, messages: list[WriterCommitMessage | None]) -> None:
        (self.path / name).write_text(json.dumps([m and vars(m) for m in messages]))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._record("commit.json", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._record("abort.json", messages)


class RecordingSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "oncelog_toy_sink"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        fail = {int(p) for p in self.options.get("failFirstAttemptOf", "").split(",") if p}
        return RecordingWriter(self.options["path"], fail)


def test_the_shared_session_is_local_2_with_the_test_settings(spark: SparkSession) -> None:
    assert spark.sparkContext.master == "local[2]"
    assert spark.sparkContext.defaultParallelism == 2
    assert spark.sparkContext.uiWebUrl is None
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"


def test_workers_run_this_interpreter_and_import_this_module(spark: SparkSession) -> None:
    module = __name__

    def probe(_: object) -> tuple[str, str, str]:
        import pyarrow

        return (sys.executable, pyarrow.__version__, importlib.import_module(module).__file__ or "")

    seen = set(spark.sparkContext.parallelize(range(2), 2).map(probe).collect())
    assert seen == {(sys.executable, pa.__version__, __file__)}


def test_an_arrow_batch_source_round_trips_kafka_like_columns(spark: SparkSession) -> None:
    spark.dataSource.register(ToySource)
    df = spark.read.format("oncelog_toy").option("partitions", 3).option("rows", 5).load()

    assert df.schema.simpleString() == StructType.fromDDL(TOY_SCHEMA).simpleString()
    got = df.selectExpr(
        "spark_partition_id()",
        "key",
        "value",
        "partition",
        "offset",
        "unix_micros(timestamp)",
        "headers",
        "producerEpoch",
    ).collect()
    # One Spark partition per InputPartition, in the order partitions() returned them.
    assert {(row[0], row[3]) for row in got} == {(0, 0), (1, 1), (2, 2)}
    expected = [toy_record(p, o) for p in range(3) for o in range(5)]
    assert sorted((tuple(row)[1:] for row in got), key=lambda row: (row[2], row[3])) == expected


def test_the_retry_session_reruns_failed_attempts_and_commits_only_the_winners(
    spark_retry: SparkSession, tmp_path: Path
) -> None:
    assert spark_retry.sparkContext.master == "local[2,4]"
    spark_retry.dataSource.register(RecordingSink)

    df = spark_retry.range(0, 400, 1, numPartitions=4)
    df.write.format("oncelog_toy_sink").mode("append").option("failFirstAttemptOf", "1,2").save(str(tmp_path))

    committed = json.loads((tmp_path / "commit.json").read_text())
    assert [(m["partition"], m["attempt"], m["rows"]) for m in committed] == [
        (0, 0, 100),
        (1, 1, 100),
        (2, 1, 100),
        (3, 0, 100),
    ]
    assert not (tmp_path / "abort.json").exists()
    # The failed first attempts' rows stay written: the sink, not Spark, must discard them.
    assert len((tmp_path / "p1-a0.ids").read_text().split()) == 10
    winners = [tmp_path / f"p{m['partition']}-a{m['attempt']}.ids" for m in committed]
    assert sorted(int(i) for path in winners for i in path.read_text().split()) == list(range(400))
