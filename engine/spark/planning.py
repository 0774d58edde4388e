"""Which offset ranges a read covers: one Spark partition per log partition, split when large.

Planning runs on the driver. It resolves the root (an absolute path, checked to be a
directory, with its id for the tasks to check: engine/root_identity.py), then reads
each partition read-only (engine/tools/partition_stat.py: no lock, nothing written, so
a live writer is never disturbed): its log start offset, its end, and its last stable
offset. A read_committed query never reads past the last stable offset; a
read_uncommitted one reads to the end. Filters Spark pushed (pushdown.py) drop
partitions and cut the ranges; a timestamp filter starts each range where the time
indexes say its records can begin. Pure apart from those reads.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from oncelog.errors import OffsetOutOfRangeError
from oncelog.layout import TopicPartition, parse_partition_dir_name
from oncelog.root_identity import read_root_id
from oncelog.spark.options import (
    EARLIEST,
    LATEST,
    Isolation,
    OffsetSpec,
    OptionError,
    ReadOptions,
    root_as_option,
)
from oncelog.spark.pushdown import ScanBounds
from oncelog.spark.transactional_writes import topic_partitions
from oncelog.storage.fs import DEFAULT_FS, FileSystem, ReadOnlyFileSystem
from oncelog.tools.partition_dirs import Partition, read_kafka_log_starts
from oncelog.tools.partition_stat import stat_partition
from oncelog.tools.timestamp_search import first_offset_at_timestamp

# The first offset of a partition's range whose records may reach a timestamp (ms).
TimestampSearch = Callable[[int, int, int, int], int]  # (partition, timestamp_ms, start, end)


def plan_read_root(options: ReadOptions, fs: FileSystem = DEFAULT_FS) -> ReadOptions:
    """The options with the root's id and the driver's host filled in, for the tasks to check;
    OptionError in one line if the root is missing or not a directory."""
    with root_as_option():
        root_id = read_root_id(ReadOnlyFileSystem(fs), options.root)
    return dataclasses.replace(options, root_id=root_id, planned_on=socket.gethostname())


class DataLossError(OffsetOutOfRangeError):
    """Offsets the query asked for are gone (retention, delete_records) and failOnDataLoss is true."""


@dataclass(frozen=True)
class PartitionBounds:
    partition: int
    earliest: int  # log start offset
    latest: int  # where this isolation may read up to (LSO or log end)
    log_end: int = 0
    # Aborted transactions seen as markers at planning (see PartitionStat.recent_aborted).
    aborted: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class OffsetRange:
    partition: int
    start: int
    end: int  # exclusive

    @property
    def size(self) -> int:
        return self.end - self.start


def partition_numbers(
    root: str, topic: str, fs: FileSystem = DEFAULT_FS, *, missing_ok: bool = False
) -> list[int]:
    """`topic`'s partitions under `root`; a topic with none raises OptionError naming the
    topics there are, unless `missing_ok` (a stream waits for the topic to appear)."""
    read_only = ReadOnlyFileSystem(fs)
    numbers = topic_partitions(root, topic, read_only)
    if not numbers and not missing_ok:
        raise OptionError(f"topic {topic} does not exist under {root} ({_topics_there(read_only, root)})")
    return numbers


def partition_bounds(
    root: str,
    topic: str,
    isolation: Isolation,
    fs: FileSystem = DEFAULT_FS,
    *,
    numbers: list[int] | None = None,
    missing_ok: bool = False,
) -> list[PartitionBounds]:
    """The bounds of `numbers` (default: every partition of `topic`, see partition_numbers), read-only."""
    read_only = ReadOnlyFileSystem(fs)
    if numbers is None:
        numbers = partition_numbers(root, topic, read_only, missing_ok=missing_ok)
    if not numbers:
        return []
    kafka_starts = read_kafka_log_starts(read_only, root)
    bounds = []
    for number in numbers:
        tp = TopicPartition(topic, number)
        stat = stat_partition(read_only, Partition(os.path.join(root, str(tp)), tp, root), kafka_starts)
        latest = stat.last_stable_offset if isolation == "read_committed" else stat.log_end_offset
        bounds.append(
            PartitionBounds(number, stat.log_start_offset, latest, stat.log_end_offset, stat.recent_aborted)
        )
    return bounds


def _topics_there(fs: FileSystem, root: str) -> str:
    topics = sorted({tp.topic for tp in map(parse_partition_dir_name, fs.listdir(root)) if tp is not None})
    if not topics:
        return "it holds no topics"
    shown = ", ".join(topics[:10]) + (f" and {len(topics) - 10} more" if len(topics) > 10 else "")
    return f"its topics: {shown}"


def timestamp_search(root: str, topic: str, fs: FileSystem = DEFAULT_FS) -> TimestampSearch:
    """The time-index search (engine/tools/timestamp_search.py) over `topic`'s partitions."""
    read_only = ReadOnlyFileSystem(fs)

    def search(partition: int, timestamp_ms: int, start: int, end: int) -> int:
        directory = os.path.join(root, str(TopicPartition(topic, partition)))
        try:
            return first_offset_at_timestamp(read_only, directory, timestamp_ms, start, end)
        except OffsetOutOfRangeError:
            return start  # retention or a truncation moved the log meanwhile: no narrowing

    return search


def resolve(spec: OffsetSpec, bound: PartitionBounds, default: int) -> int:
    """An offset spec for one partition: earliest/latest or its JSON entry (default if absent)."""
    offset = spec.get(bound.partition, default) if isinstance(spec, dict) else spec
    if offset == EARLIEST:
        return bound.earliest
    if offset == LATEST:
        return bound.latest
    return offset


def resolve_start(spec: OffsetSpec, bound: PartitionBounds, fail_on_data_loss: bool, topic: str) -> int:
    start = resolve(spec, bound, EARLIEST)
    if start < bound.earliest:
        if fail_on_data_loss:
            raise DataLossError(
                f"{topic}-{bound.partition}: offsets {start}..{bound.earliest - 1} are gone "
                f"(the log starts at "
                f"{bound.earliest}); set failOnDataLoss=false to read from {bound.earliest}"
            )
        start = bound.earliest
    return start


def batch_ranges(
    options: ReadOptions,
    bounds: list[PartitionBounds],
    scan: ScanBounds | None = None,
    search: TimestampSearch | None = None,
) -> list[OffsetRange]:
    """The ranges of a batch read, cut to the pushed filters (`scan`; `search` finds where a
    timestamp bound starts), split so no range exceeds maxRecordsPerPartition and there
    are at least minPartitions of them (split in proportion to size, as Kafka's source).
    Every bound's offsets are checked, those of partitions the filters drop too."""
    scan = scan or ScanBounds()
    whole: list[OffsetRange] = []
    for bound in bounds:
        start, end = checked_batch_range(options, bound)
        if not scan.wants_partition(bound.partition) or scan.is_empty:
            continue
        start, end = scan.narrow(start, end)
        if scan.timestamp_low_ms is not None and search is not None and end > start:
            start = search(bound.partition, scan.timestamp_low_ms, start, end)
        if end > start:
            whole.append(OffsetRange(bound.partition, start, end))
    return split_ranges(whole, options.min_partitions, options.max_records_per_partition)


def check_offset_partitions(options: ReadOptions, numbers: list[int]) -> None:
    """Offsets given as JSON must name partitions the topic has."""
    for name, spec in (("startingOffsets", options.starting), ("endingOffsets", options.ending)):
        if isinstance(spec, dict):
            unknown = sorted(set(spec) - set(numbers))
            if unknown:
                raise OptionError(
                    f"option {name} names partition(s) {unknown} of {options.topic}, which has "
                    f"partitions {numbers}"
                )


def checked_batch_range(options: ReadOptions, bound: PartitionBounds) -> tuple[int, int]:
    """[start, end) for one partition from startingOffsets and endingOffsets, as spark-sql-kafka
    checks them: offsets past the log end, and a start after the end, fail with the option
    named (failOnDataLoss=false clamps them to what the log holds instead)."""
    name = f"{options.topic}-{bound.partition}"
    start = resolve_start(options.starting, bound, options.fail_on_data_loss, options.topic)
    end = resolve(options.ending, bound, LATEST)
    lenient = "; set failOnDataLoss=false to read what the log holds"
    for option, offset in (("startingOffsets", start), ("endingOffsets", end)):
        if offset > bound.log_end and options.fail_on_data_loss:
            raise DataLossError(
                f"option {option}: offset {offset} of {name} is past its log end {bound.log_end}{lenient}"
            )
    if start > end and options.fail_on_data_loss:
        raise OptionError(
            f"option startingOffsets ({start}) is after endingOffsets ({end}) for {name}{lenient}"
        )
    # read_committed stops at the last stable offset: an open transaction's data is not readable yet.
    return start, min(end, bound.latest)


def split_ranges(ranges: list[OffsetRange], min_partitions: int, max_records: int) -> list[OffsetRange]:
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for whole in ranges:
        wanted = max(
            math.ceil(whole.size / max_records), round(min_partitions * whole.size / total) if total else 1
        )
        parts = max(1, min(wanted, whole.size))
        step = whole.size / parts
        bounds = [whole.start + round(step * i) for i in range(parts)] + [whole.end]
        out.extend(OffsetRange(whole.partition, a, b) for a, b in itertools.pairwise(bounds) if b > a)
    return out
