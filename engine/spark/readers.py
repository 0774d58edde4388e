"""Batch and streaming readers: offset ranges planned on the driver, rows read in tasks.

Tasks read partition files read-only (engine/partition_reader.py): no lock is taken,
so reads run beside a live writer, and every range ends at or below an end planned
from what was on disk then (the last stable offset for read_committed), so a batch
being appended is never parsed. Rows leave as Arrow record batches.

Streaming offsets are Kafka's JSON, `{"<topic>": {"<partition>": <next offset>}}`.
`maxOffsetsPerTrigger` caps the rows of a micro-batch, shared between partitions in
proportion to how far each is behind (as Kafka's source does);
`Trigger.AvailableNow` reads up to what was there when the query started, in capped
micro-batches.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from oncelog.layout import TopicPartition
from oncelog.partition_reader import read_batches
from oncelog.recovery.fs import DEFAULT_FS, ReadOnlyFileSystem
from oncelog.spark.arrow_batches import arrow_batches
from oncelog.spark.options import EARLIEST, ReadOptions
from oncelog.spark.planning import (
    DataLossError,
    OffsetRange,
    PartitionBounds,
    batch_ranges,
    partition_bounds,
    resolve,
    split_ranges,
)


@dataclass(frozen=True)
class RangePartition(InputPartition):
    partition: int
    start: int
    end: int


def read_range(options: ReadOptions, part: RangePartition) -> Iterator[pa.RecordBatch]:
    tp = TopicPartition(options.topic, part.partition)
    directory = os.path.join(options.root, str(tp))
    fs = ReadOnlyFileSystem(DEFAULT_FS)
    batches = read_batches(fs, directory, part.start, part.end, isolation=options.isolation)
    max_rows = options.max_rows_per_arrow_batch
    # Stored batches are whole: the first and last may hold offsets outside the range (a
    # range split inside a batch); arrow_batches drops those rows, they belong next door.
    yield from arrow_batches(
        batches, options.topic, part.partition, max_rows=max_rows, start=part.start, end=part.end
    )


class OncelogBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions):
        self.options = options

    def partitions(self) -> list[RangePartition]:
        bounds = partition_bounds(self.options.root, self.options.topic, self.options.isolation)
        return [RangePartition(r.partition, r.start, r.end) for r in batch_ranges(self.options, bounds)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition), partition
        return read_range(self.options, partition)


Offsets = dict[str, dict[str, int]]


class OncelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions):
        self.options = options
        self._available_now: dict[int, int] | None = None

    # -- offsets ---------------------------------------------------------------------
    def _wrap(self, offsets: dict[int, int]) -> Offsets:
        return {self.options.topic: {str(p): offset for p, offset in sorted(offsets.items())}}

    def _unwrap(self, offsets: Offsets) -> dict[int, int]:
        return {int(p): int(offset) for p, offset in offsets.get(self.options.topic, {}).items()}

    def _bounds(self) -> dict[int, PartitionBounds]:
        bounds = partition_bounds(self.options.root, self.options.topic, self.options.isolation)
        return {bound.partition: bound for bound in bounds}

    def initialOffset(self) -> Offsets:
        return self._wrap({p: resolve(self.options.starting, b, -1) for p, b in self._bounds().items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {p: b.latest for p, b in self._bounds().items()}

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        bounds = self._bounds()
        starts = self._checked_starts(self._unwrap(start), bounds)
        ends = {p: max(starts[p], b.latest) for p, b in bounds.items()}
        if self._available_now is not None:
            frozen = self._available_now  # what was there when the AvailableNow query started
            ends = {p: max(starts[p], min(end, frozen.get(p, starts[p]))) for p, end in ends.items()}
        if isinstance(limit, ReadMaxRows):
            ends = cap_rows(starts, ends, limit.max_rows)
        return self._wrap(ends)

    def _checked_starts(self, starts: dict[int, int], bounds: dict[int, PartitionBounds]) -> dict[int, int]:
        """Where each partition goes on; a partition new since the last batch starts at its
        earliest offset, and offsets lost to retention fail the query (failOnDataLoss)."""
        checked = {}
        for p, bound in bounds.items():
            offset = starts.get(p, bound.earliest)
            if offset < bound.earliest:
                if self.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{self.options.topic}-{p}: offsets {offset}..{bound.earliest - 1} are gone; "
                        "set failOnDataLoss=false to skip them"
                    )
                offset = bound.earliest
            checked[p] = offset
        return checked

    # -- reading ---------------------------------------------------------------------
    def partitions(self, start: Offsets, end: Offsets) -> list[RangePartition]:
        bounds = self._bounds()
        starts = self._checked_starts(self._unwrap(start), bounds)
        ranges = [
            OffsetRange(p, starts.get(p, EARLIEST), stop)
            for p, stop in self._unwrap(end).items()
            if stop > starts.get(p, stop)
        ]
        split = split_ranges(ranges, 1, self.options.max_records_per_partition)
        return [RangePartition(r.partition, r.start, r.end) for r in split]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition), partition
        return read_range(self.options, partition)

    def commit(self, end: Offsets) -> None:
        pass  # nothing to release: reads take no locks and leave nothing behind


def cap_rows(starts: dict[int, int], ends: dict[int, int], max_rows: int) -> dict[int, int]:
    """Cut the ranges to `max_rows` offsets in all, each partition's share in proportion
    to its backlog (and every partition with a backlog advancing by at least one)."""
    backlog = {p: ends[p] - starts[p] for p in ends}
    total = sum(backlog.values())
    if total <= max_rows:
        return ends
    capped = {}
    for p, behind in backlog.items():
        share = 0 if behind == 0 else max(1, int(max_rows * behind / total))
        capped[p] = starts[p] + min(behind, share)
    return capped
