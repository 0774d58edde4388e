"""Verify one partition directory: every batch, index and snapshot, each problem as found.

Every segment is streamed batch by batch (`scan_file`: bounded reads) and each batch
checked: size, magic, CRC-32C, offsets increasing across batches and segments, and
every record decoding (the append path's own record check). Each
segment's `.index` is walked alongside its batches (verify_indexes), then its
`.timeindex` and `.txnindex` checked, and every producer snapshot's CRC. A problem
names the file and the byte position in it.

A compacted log keeps its offsets but not every record: gaps between batches and
between the records of a batch, and empty batches, are what a cleaning leaves, and
are damage only in a log that says it holds client appends only (the cleaner clears
that flag, durably, before its first swap). Below its cleaned point (the cleaner
checkpoint) a key has at most one live record (verify_keys).

What is corruption follows what opening the log would do (recovery/loader.py): a
tail that recovery cuts (a batch cut short at the end of the last segment; in an
oncelog directory, anything bad past the recovery point in the last segment) and an
index that recovery rebuilds are warnings. Anything else is corruption, and so is a
batch whose records do not decode wherever it is: recovery reads only headers, so it
would serve that batch, and every reader would fail on it.

Strictly read-only: the verifier reads through a `ReadOnlyFileSystem`, whatever
seam it is given, and never opens a `Log`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from oncelog.errors import CorruptRecordError, CorruptSnapshotError, InvalidRecordError
from oncelog.layout import TopicPartition
from oncelog.recovery.plan import NO_RECOVERY_POINT, Verdict, first_validated, judge_bad_batch
from oncelog.recovery.swaps import CLEANING, SWAPPING
from oncelog.segment_cleaning import AbortedRanges
from oncelog.segments.batch import RecordBatch, TruncatedBatchError
from oncelog.segments.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    check_client_appended,
    scan_file,
    segment_file_name,
)
from oncelog.segments.txn_index import ENTRY_SIZE, TXN_INDEX_SUFFIX, AbortedTxn, TransactionIndex
from oncelog.storage.fs import FileHandle, FileSystem, ReadOnlyFileSystem
from oncelog.storage.snapshot import list_snapshot_offsets, read_snapshot, snapshot_file_name
from oncelog.tools.partition_dirs import (
    KAFKA_CLEANER_CHECKPOINT,
    KAFKA_LOG_START_CHECKPOINT,
    Partition,
    PartitionMeta,
    read_kafka_checkpoint,
    read_partition_meta,
    segment_bases,
    unwritten_tail,
)
from oncelog.tools.verify_indexes import Flag, OffsetIndexWalk, index_entries
from oncelog.tools.verify_keys import LiveKeyCheck

CORRUPT, WARNING = "CORRUPT", "WARNING"


class Problem(NamedTuple):
    severity: str
    path: str
    position: int | None
    reason: str
    offset: int | None = None  # base offset of the batch, when there is one

    def __str__(self) -> str:
        where = self.path if self.position is None else f"{self.path} position {self.position}"
        batch = "" if self.offset is None else f"batch at offset {self.offset}: "
        return f"{self.severity} {where}: {batch}{self.reason}"


@dataclass
class VerifyTotals:
    partitions: int = 0
    segments: int = 0
    batches: int = 0
    bytes: int = 0
    corrupt: int = 0
    warnings: int = 0

    def __str__(self) -> str:
        found = f"{self.corrupt} corrupt, {self.warnings} warnings"
        return (
            f"verified {self.partitions} partitions, {self.segments} segments, {self.batches} batches, "
            f"{self.bytes} bytes: {found if self.corrupt or self.warnings else 'no problems'}"
        )


# -- batches -------------------------------------------------------------------------------


def batch_problem(batch: RecordBatch, position: int, base: int, prev: int | None, strict: bool) -> str | None:
    """Why a batch is bad, or None. `prev`: the last offset before it; `strict`: client appends only."""
    try:
        batch.validate()  # magic, CRC, lastOffsetDelta >= 0, recordsCount <= lastOffsetDelta + 1, codec
    except CorruptRecordError as exc:
        return exc.reason
    h = batch.header
    if h.base_offset < base:
        return f"base offset is below the segment's base offset {base}"
    if prev is not None and h.base_offset <= prev:
        return f"offsets {h.base_offset}..{batch.last_offset} do not follow the previous batch's {prev}"
    if strict:
        # Kafka's cleaner keeps a compacted batch's lastOffsetDelta with fewer records, so
        # only a log written by client appends (each checked for it) must match exactly.
        if h.records_count and h.records_count != h.last_offset_delta + 1:
            return f"recordsCount {h.records_count} is not lastOffsetDelta {h.last_offset_delta} + 1"
        try:
            check_client_appended(batch, prev if position > 0 else None)
        except CorruptRecordError as exc:
            return exc.reason
    return None


def records_problem(batch: RecordBatch, strict: bool) -> str | None:
    """Why the records of a batch that passed batch_problem do not decode, or None.

    The append path's check (RecordBatch.check_records): every record's framing, the
    count, and offset deltas 0..n-1 in a log of client appends (`strict`), or only
    increasing within lastOffsetDelta where compaction may have left gaps.
    """
    try:
        batch.check_records(exact=strict)
    except CorruptRecordError as exc:
        return f"records do not decode: {exc.reason}"
    except InvalidRecordError as exc:
        return f"records break the offset rule: {exc}"
    return None


def recovery_cuts(
    meta: PartitionMeta, base: int, position: int, next_offset: int, *, truncated: bool, is_last: bool
) -> bool:
    """Is damage at `position` of segment `base` a torn tail (a warning), rather than corruption?

    In an oncelog directory, exactly what opening the log decides (the recovery
    decision, oncelog.recovery.plan). A directory without a store (a Kafka one) says
    nothing about what was fsynced: opening it would cut at any bad batch, but verify
    is stricter and calls only a batch cut short at the end of the last segment torn.
    """
    if not meta.oncelog:
        return truncated and is_last
    point = meta.recovery_point or NO_RECOVERY_POINT
    return judge_bad_batch(point, base, position, next_offset, truncate=False) is Verdict.CUT_TORN_TAIL


def first_rebuilt(meta: PartitionMeta, bases: list[int]) -> int | None:
    """Base of the first segment an open validates and re-indexes (oncelog.recovery.plan).

    None for a directory without a store: verify holds its indexes to account.
    """
    if not meta.oncelog:
        return None
    point = meta.recovery_point or NO_RECOVERY_POINT
    first = first_validated(bases, point, clean=meta.clean_shutdown, store_found=True)
    return None if first is None else bases[first]


class SegmentScan(NamedTuple):
    last_offset: int | None  # of the last batch read (or the previous segment's)
    batches: int
    bytes: int  # where the last batch read ends
    complete: bool  # every byte read: batches, then zeros to the end


# -- partitions --------------------------------------------------------------------------------


class PartitionVerifier:
    """Verifies partitions one at a time, reporting each problem as it is found."""

    def __init__(self, fs: FileSystem, report: Callable[[Problem], None], on_bytes: Callable[[int], None]):
        self.fs = fs if isinstance(fs, ReadOnlyFileSystem) else ReadOnlyFileSystem(fs)
        self.totals = VerifyTotals()
        self._report = report
        self._on_bytes = on_bytes
        self._keys: LiveKeyCheck | None = None  # the partition's, when it has a cleaned point
        self._kafka_checkpoints: dict[tuple[str, str], dict[TopicPartition, int]] = {}

    def problem(
        self, severity: str, path: str, position: int | None, reason: str, offset: int | None = None
    ) -> None:
        if severity == CORRUPT:
            self.totals.corrupt += 1
        else:
            self.totals.warnings += 1
        self._report(Problem(severity, path, position, reason, offset))

    def verify(self, partition: Partition) -> None:
        self.totals.partitions += 1
        directory = partition.path
        try:
            names = self.fs.listdir(directory)
        except OSError as exc:
            self.problem(CORRUPT, directory, None, f"cannot list: {exc.strerror or exc}")
            return
        meta = read_partition_meta(self.fs, directory)
        if meta.error is not None:
            # Opening the log would refuse it (CorruptMetadataError), or fail to read it.
            self.problem(CORRUPT, directory, None, meta.error)
        bases, bad = segment_bases(names)
        for name in bad:
            self.problem(CORRUPT, os.path.join(directory, name), None, "a .log whose name is no base offset")
        for name in sorted(names):
            if name.endswith((CLEANING, SWAPPING)):
                # What a crash mid-swap leaves; the segment checked here is the one it replaces.
                self.problem(
                    WARNING,
                    os.path.join(directory, name),
                    None,
                    "left by a cleaning a crash interrupted: the next open finishes or undoes its swap",
                )
        if not bases:
            self.problem(WARNING, directory, None, f"no {LOG_SUFFIX} segment files")
        if bases and meta.log_start_offset is not None and meta.log_start_offset < bases[0]:
            start = meta.log_start_offset
            self.problem(
                CORRUPT,
                os.path.join(directory, segment_file_name(start, LOG_SUFFIX)),
                0,
                f"offsets {start} to {bases[0] - 1} are missing: the log starts at {start} but its first "
                f"segment file starts at {bases[0]} (a lost segment)",
            )
        rebuilt_from = first_rebuilt(meta, bases)
        self._keys = self._key_check(partition, meta, bases)
        prev: int | None = None
        for n, base in enumerate(bases):
            rebuilt = rebuilt_from is not None and base >= rebuilt_from
            is_last = n == len(bases) - 1
            # Damage in a clean log's active segment fails its tail check: an open validates it then.
            judged = rebuilt or (is_last and meta.oncelog)
            prev = self._segment(directory, base, prev, meta, is_last=is_last, rebuilt=rebuilt, judged=judged)
            if self._keys is not None:
                self._keys.flush()  # this segment's repeated keys, before the next segment's problems
        self._keys = None
        self._fsynced_data_present(directory, bases, prev, meta)
        self._snapshots(directory, names)

    def _key_check(self, partition: Partition, meta: PartitionMeta, bases: list[int]) -> LiveKeyCheck | None:
        """The check of a compacted log's keys below its cleaned point; None if never cleaned.

        The cleaned point and log start are oncelog's (the partition's store) or, in a
        Kafka log.dir, its cleaner-offset-checkpoint and log-start-offset-checkpoint.
        """
        if not bases:
            return None
        if meta.oncelog:
            cleaned_to, start = meta.cleaner_checkpoint, meta.log_start_offset
        elif partition.tp is None:
            return None
        else:
            cleaned_to = self._kafka_checkpoint(partition.root, KAFKA_CLEANER_CHECKPOINT).get(partition.tp)
            start = self._kafka_checkpoint(partition.root, KAFKA_LOG_START_CHECKPOINT).get(partition.tp)
        if cleaned_to is None:
            return None

        def report(path: str, position: int, offset: int, reason: str) -> None:
            self.problem(CORRUPT, path, position, reason, offset)

        aborted = AbortedRanges(self._aborted_txns(partition.path, bases))
        return LiveKeyCheck(cleaned_to, max(start or 0, bases[0]), aborted, report)

    def _kafka_checkpoint(self, root: str, name: str) -> dict[TopicPartition, int]:
        if (root, name) not in self._kafka_checkpoints:
            try:
                self._kafka_checkpoints[root, name] = read_kafka_checkpoint(self.fs, root, name)
            except OSError as exc:
                self.problem(CORRUPT, os.path.join(root, name), None, f"cannot read: {exc.strerror or exc}")
                self._kafka_checkpoints[root, name] = {}
        return self._kafka_checkpoints[root, name]

    def _aborted_txns(self, directory: str, bases: list[int]) -> list[AbortedTxn]:
        """Every segment's aborted transactions, as far as their indexes read (_txn_index
        reports those that do not)."""
        found: list[AbortedTxn] = []
        for base in bases:
            path = os.path.join(directory, segment_file_name(base, TXN_INDEX_SUFFIX))
            if not self.fs.exists(path):
                continue
            index = TransactionIndex(self.fs, path, base)
            try:
                found += index.entries()
            except (CorruptRecordError, OSError):
                pass
            finally:
                index.close()
        return found

    def _fsynced_data_present(
        self, directory: str, bases: list[int], last: int | None, meta: PartitionMeta
    ) -> None:
        """The data ends no earlier than the recovery point: what was fsynced is still there.

        A recovery point past the data means a segment file was deleted or emptied (or a
        flush committed a point past a truncation); opening the log refuses it
        (CorruptLogError) rather than come back shorter.
        """
        point = meta.recovery_point
        if point is None:
            return
        end = (last + 1) if last is not None else (bases[-1] if bases else 0)
        if point.offset > end:
            where = segment_file_name(
                point.segment_base if point.segment_base is not None else end, LOG_SUFFIX
            )
            self.problem(
                CORRUPT,
                os.path.join(directory, where),
                None,
                f"the recovery point says offsets up to {point.offset - 1} were fsynced, but the data "
                f"ends at {end}: offsets {end} to {point.offset - 1} are missing (a lost or emptied segment)",
            )

    def _segment(
        self,
        directory: str,
        base: int,
        prev: int | None,
        meta: PartitionMeta,
        *,
        is_last: bool,
        rebuilt: bool,
        judged: bool,
    ) -> int | None:
        """Check one segment and its indexes; returns the last offset so far."""
        self.totals.segments += 1
        path = os.path.join(directory, segment_file_name(base, LOG_SUFFIX))
        if prev is not None and base <= prev:
            self.problem(CORRUPT, path, 0, f"segment base offset {base} is not after the last offset {prev}")
        elif prev is not None and meta.client_only and base > prev + 1:
            # Client appends take every offset: a gap between segments is a lost segment.
            self.problem(
                CORRUPT,
                path,
                0,
                f"offsets {prev + 1} to {base - 1} are missing before this segment (a lost segment)",
            )
        index_path = path[: -len(LOG_SUFFIX)] + INDEX_SUFFIX
        flag = self._index_flag(index_path, rebuilt)
        handles: list[FileHandle] = []
        try:
            handles.append(handle := self.fs.open(path, writable=False))
            index = self._open_optional(index_path)
            handles += [index] if index is not None else []
            entries = index_entries(index, base, time=False, flag=flag) if index is not None else iter(())
            walk = OffsetIndexWalk(entries, flag, exact=meta.oncelog)
            scan = self._scan(handle, base, prev, meta, walk, is_last=is_last, validated=judged)
            if scan.complete:
                walk.finish(scan.bytes)
            self._on_bytes(handle.size() - scan.bytes)  # zeros, or what follows the damage
        except OSError as exc:  # the segment's or its index's: name the one it is about
            where = exc.filename if isinstance(exc.filename, str) else path
            self.problem(CORRUPT, where, None, f"cannot read: {exc.strerror or exc}")
            return prev
        finally:
            for opened in handles:
                opened.close()
        self.totals.batches += scan.batches
        self.totals.bytes += scan.bytes
        if meta.client_only and not is_last and scan.complete and scan.batches == 0:
            # Client appends never seal an empty segment: its batches were lost.
            self.problem(
                CORRUPT, path, 0, "a sealed segment with no batches: its data was lost (an emptied file)"
            )
        last = scan.last_offset if scan.complete else None  # bounds what the other indexes may name
        self._time_index(path[: -len(LOG_SUFFIX)] + TIME_INDEX_SUFFIX, base, last, rebuilt)
        self._txn_index(path[: -len(LOG_SUFFIX)] + TXN_INDEX_SUFFIX, base, last, rebuilt)
        return scan.last_offset

    def _scan(
        self,
        handle: FileHandle,
        base: int,
        prev: int | None,
        meta: PartitionMeta,
        walk: OffsetIndexWalk,
        *,
        is_last: bool,
        validated: bool,
    ) -> SegmentScan:
        """Check every batch; report each problem, and go on while the headers allow."""
        path, size = handle.path, handle.size()
        batches = end = 0
        last = prev
        try:
            for position, batch in scan_file(handle, 0, size):
                problem = batch_problem(batch, position, base, last, meta.client_only)
                if problem is not None:
                    after = base if last is None else last + 1
                    cut = recovery_cuts(meta, base, position, after, truncated=False, is_last=is_last)
                    if (validated or not meta.oncelog) and cut:
                        self.problem(WARNING, path, position, _cut(size - position, position, problem))
                        return SegmentScan(last, batches, end, False)
                    self.problem(CORRUPT, path, position, problem, batch.base_offset)
                elif (problem := records_problem(batch, meta.client_only)) is not None:
                    # Never a torn tail: recovery reads headers only and would serve it.
                    self.problem(CORRUPT, path, position, problem, batch.base_offset)
                elif self._keys is not None:
                    self._keys.add(batch, path, position)
                walk.on_batch(position, batch.base_offset, batch.last_offset)
                self._on_bytes(batch.size)
                batches, end = batches + 1, position + batch.size
                last = batch.last_offset if last is None else max(last, batch.last_offset)
        except CorruptRecordError as exc:
            at = end if exc.position is None else exc.position
            if unwritten_tail(exc, handle, at):
                if not is_last:  # the engine trims a segment when it seals it
                    self.problem(
                        WARNING, path, at, f"{size - at} bytes of zeros after a sealed segment's batches"
                    )
                return SegmentScan(last, batches, end, True)
            after = base if last is None else last + 1
            truncated = isinstance(exc, TruncatedBatchError)
            if (validated or not meta.oncelog) and recovery_cuts(
                meta, base, at, after, truncated=truncated, is_last=is_last
            ):
                self.problem(WARNING, path, at, _cut(size - at, at, exc.reason))
            else:
                self.problem(CORRUPT, path, at, exc.reason)
            return SegmentScan(last, batches, end, False)
        return SegmentScan(last, batches, end, True)

    def _open_optional(self, path: str) -> FileHandle | None:
        return self.fs.open(path, writable=False) if self.fs.exists(path) else None

    def _index_flag(self, path: str, rebuilt: bool) -> Flag:
        def flag(position: int, reason: str) -> None:
            if rebuilt:
                self.problem(WARNING, path, position, f"{reason} (recovery rebuilds this index)")
            else:
                self.problem(CORRUPT, path, position, reason)

        return flag

    def _time_index(self, path: str, base: int, last: int | None, rebuilt: bool) -> None:
        flag = self._index_flag(path, rebuilt)
        try:
            handle = self._open_optional(path)
            if handle is None:
                return
            try:
                for entry in index_entries(handle, base, time=True, flag=flag):
                    if last is not None and entry.value > last:
                        flag(entry.at, f"offset {entry.value} is past the segment's last offset {last}")
            finally:
                handle.close()
        except OSError as exc:
            flag(0, f"cannot read: {exc.strerror or exc}")

    def _txn_index(self, path: str, base: int, last: int | None, rebuilt: bool) -> None:
        if not self.fs.exists(path):
            return
        flag = self._index_flag(path, rebuilt)
        # TransactionIndex opens read-write; handed the read-only seam it cannot change the file.
        index = TransactionIndex(self.fs, path, base)
        try:
            for n, txn in enumerate(index.entries()):
                if last is not None and txn.last_offset > last:
                    flag(
                        n * ENTRY_SIZE,
                        f"marker offset {txn.last_offset} is past the segment's last offset {last}",
                    )
        except CorruptRecordError as exc:
            flag(exc.position or 0, exc.reason)
        except OSError as exc:
            flag(0, f"cannot read: {exc.strerror or exc}")
        finally:
            index.close()

    def _snapshots(self, directory: str, names: list[str]) -> None:
        for offset in list_snapshot_offsets(self.fs, directory, names):
            path = os.path.join(directory, snapshot_file_name(offset))
            try:
                rows = read_snapshot(self.fs, directory, offset)
            except CorruptSnapshotError as exc:
                self.problem(CORRUPT, path, None, str(exc).removeprefix(f"{path}: "))
                continue
            except OSError as exc:
                self.problem(CORRUPT, path, None, f"cannot read: {exc.strerror or exc}")
                continue
            if len(np.unique(rows["producer_id"])) != len(rows):
                self.problem(CORRUPT, path, None, "a producer id appears twice")


def _cut(count: int, position: int, why: str) -> str:
    return f"torn tail: recovery will cut {count} bytes at position {position} ({why})"
