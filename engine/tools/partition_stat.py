"""One partition's summary for `oncelog stat`: segments, bytes, offsets, producers, transactions.

The end offset comes from a scan of the batch headers of the last segment.
Producers and open transactions are rebuilt in memory as opening the log rebuilds them
(the snapshot choice and the start-over rule are oncelog.recovery.plan's):
the newest readable snapshot at or below the end (oncelog's or Kafka's v1), then the
batch headers after it, through the engine's own rules (`apply_batch`,
`apply_marker`). Expiry is not applied: the directory does not say its
`producer_expiration_ms`. Files are only ever opened with `writable=False`.

A compacted log's dirty ratio is the cleaner's own rule (oncelog.log_cleaner's pure
`cleanable_part`) over the segment sizes, from the cleaner checkpoint (oncelog's
metadata store, or Kafka's `cleaner-offset-checkpoint`); see `_cleanable` for the limit
a reader of the directory can know.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from typing import Any, NamedTuple

from oncelog.append_rules import apply_batch, apply_marker
from oncelog.errors import CorruptRecordError, CorruptSnapshotError
from oncelog.layout import TopicPartition
from oncelog.log_cleaner import CleanablePart, cleanable_part
from oncelog.producer_state import (
    UNKNOWN_APPEND_MS,
    BatchMetadata,
    WorkingState,
)
from oncelog.recovery.plan import replay_starts_over
from oncelog.segments.batch import RecordBatch, UnwrittenSpaceError
from oncelog.segments.control import decode_txn_marker
from oncelog.segments.segment import LOG_SUFFIX, scan_file, segment_file_name
from oncelog.storage.fs import FileSystem
from oncelog.storage.snapshot import list_snapshot_offsets, read_snapshot
from oncelog.tools.partition_dirs import (
    KAFKA_CLEAN_SHUTDOWN_FILE,
    Partition,
    PartitionMeta,
    read_partition_meta,
    segment_bases,
    unwritten_tail,
)


@dataclasses.dataclass(frozen=True)
class PartitionStat:
    topic: str
    partition: int | None
    segments: int
    size_bytes: int  # of the segment files' data (pre-allocated space not counted)
    log_start_offset: int
    log_end_offset: int
    producers: int
    open_transactions: int
    last_stable_offset: int  # first offset of the oldest open transaction, else the end
    clean_shutdown: bool
    format: str  # "oncelog" or "kafka"
    path: str
    notes: tuple[str, ...] = ()  # what could not be read (a torn tail, a corrupt snapshot)
    # The metadata store exists but cannot be read (start and clean are then guesses).
    metadata_unreadable: bool = False
    # (producer id, first offset, marker offset) of the aborted transactions whose ABORT
    # marker the replay saw. The writer appends the marker before its .txnindex entry, so
    # a reader of a live (or crashed) log may find the entry missing: these cover that.
    recent_aborted: tuple[tuple[int, int, int], ...] = ()
    # Compaction. Where the last cleaning pass ended (None: never cleaned, as far as the
    # directory says); the cleanable bytes (sealed segments below the limit, _cleanable),
    # those past the checkpoint, and their ratio: the cleaner's min_cleanable_dirty_ratio
    # test, as if min_compaction_lag_ms were 0 (stat does not know the topic's).
    cleaner_checkpoint: int | None = None
    cleanable_bytes: int = 0
    dirty_bytes: int = 0
    dirty_ratio: float = 0.0
    # The earliest delete horizon (KIP-534) the last pass left: a tombstone or marker may go then.
    cleaner_delete_horizon_ms: int | None = None
    # The topic's cleanup.policy where its LogManager root stores one (None: not known).
    cleanup_policy: str | None = None
    # Whether the log is compacted: its topic says so, or a cleaning pass has run on it.
    compacted: bool = False


def stat_partition(
    fs: FileSystem,
    partition: Partition,
    kafka_starts: dict[TopicPartition, int],
    *,
    kafka_cleaned_to: dict[TopicPartition, int] | None = None,
    cleanup_policy: str | None = None,
) -> PartitionStat:
    """`kafka_starts`: the log start offsets of the Kafka log.dir holding it (read_kafka_log_starts);
    `kafka_cleaned_to`: its cleaner checkpoints (read_kafka_checkpoint of
    KAFKA_CLEANER_CHECKPOINT); `cleanup_policy`: the topic's, if known (topic_cleanup_policy).

    OSError if a file cannot be read at all (a directory named like a segment, say).
    """
    directory = partition.path
    names = fs.listdir(directory)
    bases, _ = segment_bases(names)
    meta = read_partition_meta(fs, directory)
    replay, scanned, sizes, errors = _replay_tail(fs, directory, names, bases, None)
    if replay.start is not None and replay_starts_over(replay.start, scanned.end_offset):
        # The snapshot describes data past the end (a cut tail): as opening does, start over.
        replay, scanned, sizes, errors = _replay_tail(fs, directory, names, bases, scanned.end_offset)
    notes = ([meta.error] if meta.error else []) + errors
    end = scanned.end_offset if bases else (meta.log_start_offset or 0)
    first = bases[0] if bases else end
    stored = (
        meta.log_start_offset if meta.oncelog else kafka_starts.get(partition.tp) if partition.tp else None
    )
    start = min(max(stored or 0, first), end)
    open_txns = replay.open_transactions()
    stable = min(open_txns, default=end)
    if meta.oncelog:
        cleaned_to = meta.cleaner_checkpoint
    else:
        cleaned_to = (kafka_cleaned_to or {}).get(partition.tp) if partition.tp else None
    part = _cleanable(bases, sizes, meta, stable, start, cleaned_to)
    if meta.oncelog:
        clean = meta.clean_shutdown
    else:
        clean = fs.exists(os.path.join(partition.root, KAFKA_CLEAN_SHUTDOWN_FILE))
    return PartitionStat(
        topic=partition.tp.topic if partition.tp else partition.label,
        partition=partition.tp.partition if partition.tp else None,
        segments=len(bases),
        size_bytes=sum(sizes),
        log_start_offset=start,
        log_end_offset=end,
        producers=len(replay.states),
        open_transactions=len(open_txns),
        last_stable_offset=stable,
        clean_shutdown=clean,
        format="oncelog" if meta.oncelog else "kafka",
        path=directory,
        notes=tuple(notes),
        metadata_unreadable=meta.error is not None,
        recent_aborted=tuple(replay.aborted),
        cleaner_checkpoint=cleaned_to,
        cleanable_bytes=part.cleanable_bytes if part else 0,
        dirty_bytes=part.dirty_bytes if part else 0,
        dirty_ratio=part.dirty_ratio if part else 0.0,
        cleaner_delete_horizon_ms=meta.cleaner_horizon_ms,
        cleanup_policy=cleanup_policy,
        # LogConfig.compacted: every policy but "delete" compacts.
        compacted=cleaned_to is not None or cleanup_policy not in (None, "delete"),
    )


def _cleanable(
    bases: list[int],
    sizes: list[int],
    meta: PartitionMeta,
    stable: int,
    start: int,
    cleaned_to: int | None,
) -> CleanablePart | None:
    """What a cleaning pass could take now, by the cleaner's own rule (None: no segments).

    The limit is what a reader of the directory can know, not what the live log knows:
    the rule already stops at the active segment (the last), and the recovery point
    (oncelog's, stored; a Kafka directory's is not read) and the last stable offset bound
    it as they bound the cleaner. That last stable offset is the one replayed above, from
    the newest snapshot and the batches after it: a live writer may have moved it since,
    so on a live log the figure is as of the last flush. min_compaction_lag_ms is not
    applied (the directory does not say it): the ratio is that of a topic without one.
    """
    if not bases:
        return None
    limit = min(bases[-1], stable)
    if meta.oncelog:
        limit = min(limit, meta.recovery_point.offset if meta.recovery_point is not None else start)
    return cleanable_part(
        bases,
        sizes,
        None,
        limit_offset=limit,
        first_dirty=max(cleaned_to or 0, start),
        lag_cutoff_ms=0,
    )


class _Replay:
    """Producer state in memory, rebuilt as the loader rebuilds it (LogLoader._apply)."""

    def __init__(self, snapshot_offset: int | None, rows: Any) -> None:
        self.start = snapshot_offset
        self.states: dict[int, WorkingState] = {}
        self.aborted: list[tuple[int, int, int]] = []
        for row in rows if rows is not None else ():
            pid = int(row["producer_id"])
            self.states[pid] = WorkingState(
                pid,
                int(row["producer_epoch"]),
                [],  # the dedupe window does not change the counts
                int(row["last_append_ms"]),
                int(row["coordinator_epoch"]),
                int(row["txn_first_offset"]),
                int(row["last_timestamp_ms"]),
            )

    def apply(self, batch: RecordBatch) -> None:
        h = batch.header
        if h.producer_id < 0 or (self.start is not None and h.base_offset < self.start):
            return
        # When the engine appended a replayed batch is not stored; stat does not expire.
        appended = UNKNOWN_APPEND_MS
        w = self.states.get(h.producer_id) or WorkingState(
            h.producer_id, h.producer_epoch, [], appended, last_timestamp_ms=h.max_timestamp
        )
        if batch.is_control:
            marker = decode_txn_marker(batch)
            if marker is None:
                return  # an empty control batch, or not a marker: the loader skips it too
            completed = apply_marker(
                w, h.producer_epoch, h.base_offset, h.max_timestamp, marker, append_ms=appended
            )
            if completed is not None and completed.aborted:
                self.aborted.append((completed.producer_id, completed.first_offset, completed.last_offset))
        else:
            meta = BatchMetadata(
                h.base_sequence, batch.last_sequence, h.base_offset, batch.last_offset, h.max_timestamp
            )
            apply_batch(w, h.producer_epoch, meta, False, batch.is_transactional, append_ms=appended)
        self.states[h.producer_id] = w

    def open_transactions(self) -> list[int]:
        return [w.txn_first_offset for w in self.states.values() if w.txn_first_offset >= 0]


class _Scanned(NamedTuple):
    end_offset: int  # one past the last good batch
    data_bytes: int  # where the last good batch ends
    error: str | None


def _scan(fs: FileSystem, path: str, base: int, replay: _Replay) -> _Scanned:
    """Replay a segment's batch headers; stop at pre-allocated zeros or the first bad batch.

    A batch is counted only if its CRC holds, as opening the log validates the tail: on
    a live log the last one may be the one a writer is copying in right now.
    """
    end_offset, data = base, 0
    error: str | None = None
    handle = fs.open(path, writable=False)
    try:
        for position, batch in scan_file(handle, 0, handle.size()):
            if not batch.is_valid():
                # Where opening the log would cut (a torn tail) or refuse (corruption): the
                # end is before it either way. On a live log it may be the batch being written.
                error = f"the batch at position {position} fails its CRC: being written, torn or corrupt"
                break
            replay.apply(batch)
            end_offset, data = batch.last_offset + 1, position + batch.size
    except CorruptRecordError as exc:
        at = data if exc.position is None else exc.position
        if not isinstance(exc, UnwrittenSpaceError) and not unwritten_tail(exc, handle, at):
            error = str(exc)
    finally:
        handle.close()
    return _Scanned(end_offset, data, error)


def _newest_snapshot(
    fs: FileSystem, directory: str, names: list[str], below: int | None
) -> tuple[int | None, Any]:
    """(offset, rows) of the newest readable snapshot at or below `below` (None: any)."""
    for offset in reversed(list_snapshot_offsets(fs, directory, names)):
        if below is not None and offset > below:
            continue
        try:
            return offset, read_snapshot(fs, directory, offset)
        except (CorruptSnapshotError, OSError):
            continue  # the loader sets it aside and tries the next older one
    return None, None


def _replay_tail(
    fs: FileSystem, directory: str, names: list[str], bases: list[int], below: int | None
) -> tuple[_Replay, _Scanned, list[int], list[str]]:
    """The replayed producers, the last segment's scan, each segment's data bytes, scan errors."""
    offset, rows = _newest_snapshot(fs, directory, names, below)
    replay = _Replay(offset, rows)
    # Segments wholly below the snapshot are not read, only sized.
    first_read = max(bisect.bisect_right(bases, offset) - 1, 0) if offset is not None else 0
    sizes: list[int] = []
    errors: list[str] = []
    scanned = _Scanned(bases[-1] if bases else 0, 0, None)
    for n, base in enumerate(bases):
        path = os.path.join(directory, segment_file_name(base, LOG_SUFFIX))
        if n >= first_read or n == len(bases) - 1:
            scanned = _scan(fs, path, base, replay)
            sizes.append(scanned.data_bytes)
            errors += [scanned.error] if scanned.error else []
        else:
            handle = fs.open(path, writable=False)
            try:
                sizes.append(handle.size())
            finally:
                handle.close()
    return replay, scanned, sizes, errors
