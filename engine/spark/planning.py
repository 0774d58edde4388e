"""Which offset ranges a read covers: one Spark partition per log partition, split when large.

Planning reads each partition read-only (engine/tools/partition_stat.py: no lock, nothing
written, so a live writer is never disturbed): its log start offset, its end, and its
last stable offset. A read_committed query never reads past the last stable offset;
a read_uncommitted one reads to the end. Pure apart from those reads.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass

from oncelog.errors import OffsetOutOfRangeError
from oncelog.layout import TopicPartition
from oncelog.recovery.fs import DEFAULT_FS, FileSystem, ReadOnlyFileSystem
from oncelog.spark.options import EARLIEST, LATEST, Isolation, OffsetSpec, OptionError, ReadOptions
from oncelog.spark.transactional_writes import topic_partitions
from oncelog.tools.partition_dirs import Partition, read_kafka_log_starts
from oncelog.tools.partition_stat import stat_partition


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


def partition_bounds(
    root: str, topic: str, isolation: Isolation, fs: FileSystem = DEFAULT_FS
) -> list[PartitionBounds]:
    """Each partition of `topic` under `root`, read-only; OptionError if the topic has none."""
    read_only = ReadOnlyFileSystem(fs)
    numbers = topic_partitions(root, topic, read_only)
    if not numbers:
        raise OptionError(f"topic {topic} has no partitions under {root}")
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


def batch_ranges(options: ReadOptions, bounds: list[PartitionBounds]) -> list[OffsetRange]:
    """The ranges of a batch read, split so no range exceeds maxRecordsPerPartition and
    there are at least minPartitions of them (split in proportion to size, as Kafka's source)."""
    whole: list[OffsetRange] = []
    for bound in bounds:
        start = resolve_start(options.starting, bound, options.fail_on_data_loss, options.topic)
        end = min(resolve(options.ending, bound, LATEST), bound.latest)
        if end > start:
            whole.append(OffsetRange(bound.partition, start, end))
    return split_ranges(whole, options.min_partitions, options.max_records_per_partition)


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
