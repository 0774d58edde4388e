"""Batch and streaming readers: offset ranges planned on the driver, rows read in tasks.

Tasks read partition files read-only (engine/tools/partition_reader.py): no lock is taken,
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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, Filter, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from oncelog.layout import TopicPartition
from oncelog.root_identity import check_partition_present, check_root_identity
from oncelog.spark.arrow_batches import arrow_batches
from oncelog.spark.options import ReadOptions
from oncelog.spark.planning import (
    DataLossError,
    OffsetRange,
    PartitionBounds,
    batch_ranges,
    check_offset_partitions,
    partition_bounds,
    partition_numbers,
    resolve,
    split_ranges,
    timestamp_search,
)
from oncelog.spark.pushdown import ScanBounds, push_filters
from oncelog.storage.fs import DEFAULT_FS, ReadOnlyFileSystem
from oncelog.tools.partition_reader import AbortedRange, OffsetBelowLogStartError, read_batches


@dataclass(frozen=True)
class RangePartition(InputPartition):
    partition: int
    start: int
    end: int
    # Aborted transactions planning saw as markers, overlapping the range (their
    # .txnindex entries may not be written yet).
    aborted: tuple[tuple[int, int, int], ...] = ()


def range_partitions(ranges: list[OffsetRange], bounds: dict[int, PartitionBounds]) -> list[RangePartition]:
    out = []
    for r in ranges:
        seen = bounds[r.partition].aborted if r.partition in bounds else ()
        overlapping = tuple(t for t in seen if t[1] < r.end and t[2] >= r.start)
        out.append(RangePartition(r.partition, r.start, r.end, overlapping))
    return out


@dataclass(frozen=True)
class PackedRanges(InputPartition):
    """Several small ranges read by one task, one after the other."""

    ranges: tuple[RangePartition, ...]


# Ranges smaller than this are read several to a task, up to this many offsets in all: a
# Spark task costs tens of milliseconds whatever it reads (its Python worker, the reader's
# pickle, the scheduling), as much as reading ~100k records here. Never above
# maxRecordsPerPartition, and never into fewer tasks than minPartitions.
PACK_RECORDS = 250_000


def pack_ranges(parts: list[RangePartition], max_records: int, min_tasks: int) -> list[InputPartition]:
    """`parts` as tasks: each range of PACK_RECORDS or more alone, the smaller ones packed in
    plan order into tasks of at most PACK_RECORDS (and `max_records`) offsets."""
    limit = min(PACK_RECORDS, max_records)
    tasks: list[InputPartition] = []
    pack: list[RangePartition] = []
    packed = 0
    for part in parts:
        size = part.end - part.start
        if size >= limit:
            tasks.append(part)
            continue
        if pack and packed + size > limit:
            tasks.append(pack[0] if len(pack) == 1 else PackedRanges(tuple(pack)))
            pack, packed = [], 0
        pack.append(part)
        packed += size
    if pack:
        tasks.append(pack[0] if len(pack) == 1 else PackedRanges(tuple(pack)))
    return tasks if len(tasks) >= min_tasks else list(parts)


def read_partition(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """A task's rows. Spark hands a read with nothing planned one InputPartition(None): no rows."""
    if isinstance(partition, RangePartition):
        return read_range(options, partition)
    if isinstance(partition, PackedRanges):
        return (batch for part in partition.ranges for batch in read_range(options, part))
    if partition.value is None:
        return iter(())
    raise TypeError(f"not an oncelog input partition: {partition!r}")


def read_range(options: ReadOptions, part: RangePartition) -> Iterator[pa.RecordBatch]:
    tp = TopicPartition(options.topic, part.partition)
    directory = os.path.join(options.root, str(tp))
    fs = ReadOnlyFileSystem(DEFAULT_FS)
    if options.planned_on is not None:
        # The root this task sees must be the driver's: same path is not same directory.
        check_root_identity(fs, options.root, options.root_id, options.planned_on)
        check_partition_present(fs, directory, options.planned_on)
    aborted = [AbortedRange(*t) for t in part.aborted]
    start = part.start
    try:
        batches = read_batches(
            fs, directory, start, part.end, isolation=options.isolation, extra_aborted=aborted
        )
    except OffsetBelowLogStartError as exc:
        # Retention or delete_records moved the log start after planning.
        if options.fail_on_data_loss:
            raise DataLossError(f"{tp}: {exc}; set failOnDataLoss=false to skip lost offsets") from exc
        start = exc.log_start_offset
        if start >= part.end:
            return
        batches = read_batches(
            fs, directory, start, part.end, isolation=options.isolation, extra_aborted=aborted
        )
    # Stored batches are whole: the first and last may hold offsets outside the range (a
    # range split inside a batch); arrow_batches drops those rows, they belong next door.
    max_rows = options.max_rows_per_arrow_batch
    yield from arrow_batches(
        batches, options.topic, part.partition, max_rows=max_rows, start=start, end=part.end
    )


class OncelogBatchReader(DataSourceReader):
    """A batch read; filters are not pushed (Spark's python filter pushdown is off)."""

    def __init__(self, options: ReadOptions):
        self.options = options
        self.scan = ScanBounds()

    def partitions(self) -> list[InputPartition]:
        options = self.options
        numbers = partition_numbers(options.root, options.topic)
        check_offset_partitions(options, numbers)
        wanted = {n for n in numbers if self.scan.wants_partition(n)}
        # Offsets the options name are checked whatever the filters keep: a bad option fails
        # the same with and without pushdown.
        named = {n for spec in (options.starting, options.ending) if isinstance(spec, dict) for n in spec}
        bounds = partition_bounds(
            options.root, options.topic, options.isolation, numbers=sorted(wanted | named)
        )
        search = timestamp_search(options.root, options.topic)
        ranges = batch_ranges(options, bounds, self.scan, search)
        parts = range_partitions(ranges, {bound.partition: bound for bound in bounds})
        return pack_ranges(parts, options.max_records_per_partition, options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)


class OncelogFilteringReader(OncelogBatchReader):
    """A batch read that takes Spark's filters on partition, offset and timestamp (pushdown.py).

    Every filter is handed back to Spark, even those the narrowed ranges apply exactly:
    Spark 4.1-4.3 keep the plan of a relation's last pushdown and reuse it for its other
    scans (a union or self-join of one loaded DataFrame, a view queried twice), so a scan
    may read ranges narrowed for another. Evaluated again by Spark, no row can then
    contradict its own filter; what is narrowed away is still missing (README, Spark).
    """

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        self.scan, _ = push_filters(filters)
        return filters


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
        # A topic not created yet has no partitions: the stream waits for it.
        bounds = partition_bounds(
            self.options.root, self.options.topic, self.options.isolation, missing_ok=True
        )
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
            if offset > bound.log_end:
                # The log was truncated or deleted and recreated under the query.
                if self.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{self.options.topic}-{p}: the query is at offset {offset} but the log ends at "
                        f"{bound.log_end}; set failOnDataLoss=false to restart it from {bound.earliest}"
                    )
                offset = bound.earliest
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
    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        bounds = self._bounds()
        starts = self._checked_starts(self._unwrap(start), bounds)
        # A partition gone since `end` was planned (deleted) is skipped.
        ranges = [
            OffsetRange(p, starts[p], stop)
            for p, stop in self._unwrap(end).items()
            if p in starts and stop > starts[p]
        ]
        split = split_ranges(ranges, 1, self.options.max_records_per_partition)
        return pack_ranges(range_partitions(split, bounds), self.options.max_records_per_partition, 1)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)

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
