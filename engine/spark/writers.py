"""The Spark side of exactly-once writes: batch and streaming writers.

Each task attempt appends inside its own transaction (engine/spark/transactional_writes.py);
`commit(messages)` runs on the driver side with the winning attempts' messages, and
commits exactly those, aborting every other attempt registered under the write id.

- Batch: the write id is the `writeId` option (re-running it writes nothing new), or
  a fresh one per job.
- Streaming: the write id is `<writeId or "stream">/<queryId>/<batchId>`. Spark re-runs
  a micro-batch it had not committed after a restart; that batch's write id is then
  already decided and it writes nothing twice. The query id reaches the tasks as a
  local property and the driver through the messages.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from oncelog.spark.options import OptionError, WriteOptions, root_as_option
from oncelog.spark.transactional_writes import (
    TaskWriter,
    WritePlan,
    abort_stale_writes,
    ensure_topic,
    finish_write,
    prepare_write_root,
)

_BINARY_OR_STRING = (BinaryType, StringType)


@dataclass
class AttemptMessage(WriterCommitMessage):
    write_id: str
    attempt: str
    producer_id: int
    partitions: list[tuple[str, int]]
    rows: int
    skipped: bool


def check_input_schema(schema: StructType) -> None:
    """`value` (binary or string), and optionally `key`, `partition` (int) and `headers`."""
    fields = {field.name: field.dataType for field in schema.fields}
    if "value" not in fields:
        raise OptionError("the DataFrame to write needs a value column (binary or string)")
    unknown = sorted(set(fields) - {"key", "value", "partition", "headers"})
    if unknown:
        raise OptionError(f"columns {unknown} are not written; select key, value, partition and headers")
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], _BINARY_OR_STRING):
            raise OptionError(f"column {name} must be binary or string, not {fields[name].simpleString()}")
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise OptionError(f"column partition must be int, not {fields['partition'].simpleString()}")
    if "headers" in fields and fields["headers"].simpleString() not in (
        "array<struct<key:string,value:binary>>",
        "array<struct<key:string,value:string>>",
    ):
        raise OptionError("column headers must be array<struct<key:string,value:binary>>")


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)  # bytearray from Spark's binary


def _write_rows(
    options: WriteOptions, plan: WritePlan, write_id: str, job: str, attempt: str, rows: Iterator[Any]
) -> AttemptMessage:
    writer = TaskWriter(
        options.root,
        options.topic,
        write_id,
        job,
        f"{job}/{attempt}",
        new_topic_partitions=options.new_topic_partitions,
        batch_records=options.batch_records,
        max_pending_bytes=options.max_pending_bytes,
        lock_timeout_s=options.lock_timeout_s,
        plan=plan,
    )
    try:
        if not writer.skipped:
            for row in rows:
                fields = row.asDict()
                headers = [(h["key"], _bytes(h["value"])) for h in fields.get("headers") or ()]
                writer.add(
                    _bytes(fields.get("key")), _bytes(fields["value"]), fields.get("partition"), headers
                )
        result = writer.finish()
    except BaseException:
        writer.close()
        raise
    partitions = [(tp.topic, tp.partition) for tp in result.partitions]
    return AttemptMessage(
        write_id, result.attempt, result.producer_id, partitions, result.rows, result.skipped
    )


def _attempts(messages: list[WriterCommitMessage | None]) -> list[AttemptMessage]:
    """The messages of attempts that returned (Spark passes None for the others)."""
    return [m for m in messages if isinstance(m, AttemptMessage)]


def _attempt_key() -> str:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("oncelog's Spark writer runs only inside a Spark task")
    # Unique per attempt within a job; speculative copies differ in attempt number.
    return f"{context.stageId()}.{context.partitionId()}.{context.attemptNumber()}.{context.taskAttemptId()}"


def prepare_write(options: WriteOptions) -> WritePlan:
    """Once per job, on the driver, before any task: the root with its id and registry, a
    new topic whole, abandoned writes timed out. Tasks create none of it."""
    with root_as_option():
        root_id = prepare_write_root(options.root)
    abort_stale_writes(options.root, options.transaction_timeout_s)
    count = ensure_topic(options.root, options.topic, options.new_topic_partitions, options.lock_timeout_s)
    return WritePlan(root_id, socket.gethostname(), count)


class OncelogBatchWriter(DataSourceWriter):
    def __init__(self, options: WriteOptions):
        self.options = options
        # Built once per job and pickled to every task: attempt keys never collide with
        # those of another job (a new application numbers its stages and tasks from 0 again).
        self.job = uuid.uuid4().hex
        self.plan = prepare_write(options)

    def write(self, iterator: Iterator[Any]) -> AttemptMessage:
        return _write_rows(self.options, self.plan, self.options.write_id, self.job, _attempt_key(), iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        winners = [m.attempt for m in _attempts(messages) if not m.skipped]
        finish_write(
            self.options.root, self.options.write_id, winners, lock_timeout_s=self.options.lock_timeout_s
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Spark may pass only Nones (facts: even for tasks that finished): find the
        # attempts by write id instead.
        finish_write(
            self.options.root, self.options.write_id, None, lock_timeout_s=self.options.lock_timeout_s
        )


class OncelogStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: WriteOptions):
        self.options = options
        self.prefix = options.write_id if options.user_write_id else "stream"
        # One instance serves one micro-batch's tasks (Spark builds it per batch).
        self.job = uuid.uuid4().hex
        self.plan = prepare_write(options)

    def _write_id(self, query_id: str, batch_id: int | str) -> str:
        return f"{self.prefix}/{query_id}/{batch_id}"

    def write(self, iterator: Iterator[Any]) -> AttemptMessage:
        context = TaskContext.get()
        assert context is not None
        query_id = context.getLocalProperty("sql.streaming.queryId")
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise RuntimeError("the streaming writer found no query id or batch id in its task")
        return _write_rows(
            self.options, self.plan, self._write_id(query_id, batch_id), self.job, _attempt_key(), iterator
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        present = _attempts(messages)
        if not present:
            return  # no task ran: nothing was written
        winners = [m.attempt for m in present if not m.skipped]
        finish_write(
            self.options.root, present[0].write_id, winners, lock_timeout_s=self.options.lock_timeout_s
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        for write_id in {m.write_id for m in _attempts(messages)}:
            finish_write(self.options.root, write_id, None, lock_timeout_s=self.options.lock_timeout_s)
