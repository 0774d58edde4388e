"""Read one partition directory's batches over an offset range, read-only, without opening a Log.

The read path of the Spark data source's tasks. A writer process may hold the
partition's lock and be appending while a task reads, so nothing here takes the
lock, maps a file or writes a byte: every file is opened through a
`ReadOnlyFileSystem`. The caller computes the range first (`stat_partition` gives
the log start, log end and last stable offset) and reads [start, end) afterwards;
the batches below `end` were complete when `end` was computed, so the read stops
right after the batch that reaches `end` and never parses the bytes a concurrent
append may be writing behind it.

- `read_batches` yields the stored batches covering [start, end) as zero-copy
  `RecordBatch` views, each CRC-checked; the first may start below `start` (the
  batch holding it, as in a Kafka fetch) and the last may reach past `end`.
- `aborted_transactions` lists the aborted transactions overlapping the range from
  the segments' `.txnindex` files (Kafka's collectAbortedTxns).
- `committed_batches` is the read_committed filter a Kafka consumer applies:
  control batches and the data of aborted transactions are dropped.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from oncelog.errors import CorruptRecordError, OffsetOutOfRangeError
from oncelog.results import ISOLATIONS, Isolation
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, TruncatedBatchError, UnwrittenSpaceError
from oncelog.segments.control import decode_txn_marker
from oncelog.segments.index import OffsetIndex
from oncelog.segments.segment import INDEX_SUFFIX, LOG_SUFFIX, scan_file, segment_file_name
from oncelog.segments.txn_index import TXN_INDEX_SUFFIX, TransactionIndex
from oncelog.storage.fs import DEFAULT_FS, FileHandle, FileSystem, ReadOnlyFileSystem
from oncelog.tools.partition_dirs import read_partition_meta, segment_bases

# Segments are read this much at a time. Smaller than a recovery scan's chunk: a task
# reading a few batches from a 1 GiB segment should not pull 8 MiB it does not need.
READ_CHUNK_BYTES = 1024 * 1024

_INDEX_ENTRY = OffsetIndex.ENTRY  # (last offset relative to the base i32, position i32)


class AbortedRange(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # offset of the ABORT marker


class OffsetBelowLogStartError(OffsetOutOfRangeError):
    """The range starts below the partition's log start: retention or delete_records removed it.

    Spark's `failOnDataLoss=false` carries on from `log_start_offset`; otherwise it is data loss.
    """

    def __init__(self, directory: str, offset: int, log_start_offset: int):
        super().__init__(
            f"offset {offset} of {directory} is below its log start offset {log_start_offset}: "
            "those records were deleted (retention or delete_records)"
        )
        self.directory = directory
        self.offset = offset
        self.log_start_offset = log_start_offset


def read_only(fs: FileSystem | None) -> ReadOnlyFileSystem:
    fs = DEFAULT_FS if fs is None else fs
    return fs if isinstance(fs, ReadOnlyFileSystem) else ReadOnlyFileSystem(fs)


def log_start_offset(fs: FileSystem | None, directory: str, bases: list[int] | None = None) -> int:
    """The first readable offset: the first segment's base, or the stored log start if later."""
    fs = read_only(fs)
    if bases is None:
        bases, _ = segment_bases(fs.listdir(directory))
    if not bases:
        raise OffsetOutOfRangeError(f"{directory} holds no {LOG_SUFFIX} segments")
    stored = read_partition_meta(fs, directory).log_start_offset  # None for a Kafka directory
    return max(bases[0], stored or 0)


def read_batches(
    fs: FileSystem | None,
    directory: str,
    start: int,
    end: int,
    *,
    isolation: Isolation = "read_uncommitted",
    log_start: int | None = None,
    extra_aborted: Iterable[AbortedRange] = (),
) -> Iterator[RecordBatch]:
    """The batches covering offsets [start, end), in order, each CRC-checked.

    read_uncommitted yields every stored batch, control batches included (the
    Arrow builder turns none of them into rows); read_committed yields only data
    batches that no aborted transaction covers. `end` must be at most the log end
    (read_committed: the last stable offset) computed before the call.

    Checked now, before the first batch: a start below the log start raises
    OffsetBelowLogStartError (`log_start`: the caller's, else read from the
    directory). While reading: a bad CRC or misplaced batch raises
    CorruptRecordError naming the file and position; data ending below `end` (the
    log was cut meanwhile) raises OffsetOutOfRangeError.
    """
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation is one of {ISOLATIONS}, got {isolation!r}")
    if start > end:
        raise ValueError(f"start {start} is after end {end}")
    if start == end:
        return iter(())
    ro = read_only(fs)
    bases, _ = segment_bases(ro.listdir(directory))
    if not bases:
        raise OffsetOutOfRangeError(f"{directory} holds no {LOG_SUFFIX} segments")
    first = log_start_offset(ro, directory, bases) if log_start is None else max(log_start, bases[0])
    if start < first:
        raise OffsetBelowLogStartError(directory, start, first)
    batches = _stored_batches(ro, directory, bases, start, end)
    if isolation == "read_uncommitted":
        return batches
    # `extra_aborted`: aborts the caller saw as markers, whose index entries may not be
    # written yet (the marker goes first); a transaction in both lists is one transaction.
    indexed = aborted_transactions(ro, directory, start, end, bases=bases)
    aborted = list({(t.producer_id, t.first_offset): t for t in (*indexed, *extra_aborted)}.values())
    return committed_batches(batches, aborted)


def aborted_transactions(
    fs: FileSystem | None, directory: str, start: int, end: int, *, bases: list[int] | None = None
) -> list[AbortedRange]:
    """Aborted transactions with last_offset >= start and first_offset < end (collectAbortedTxns).

    An ABORT marker may sit in a later segment than its data, so the search goes on
    past `end`'s segment until an entry's stable offset shows that no later entry
    can overlap the range.
    """
    ro = read_only(fs)
    if bases is None:
        bases, _ = segment_bases(ro.listdir(directory))
    if end <= start or not bases:
        return []
    found: list[AbortedRange] = []
    for base in bases[max(bisect.bisect_right(bases, start) - 1, 0) :]:
        index = TransactionIndex(ro, os.path.join(directory, segment_file_name(base, TXN_INDEX_SUFFIX)), base)
        try:
            search = index.collect_aborted(start, end)
        finally:
            index.close()
        found += [AbortedRange(txn.producer_id, txn.first_offset, txn.last_offset) for txn in search.aborted]
        if search.complete:
            break
    return found


def committed_batches(
    batches: Iterable[RecordBatch], aborted: Iterable[AbortedRange]
) -> Iterator[RecordBatch]:
    """The data batches a read_committed Kafka consumer keeps (CompletedFetch's filter).

    A producer's transactional batches are dropped from its aborted transaction's
    first offset until its ABORT marker; control batches are always dropped.
    """
    pending = sorted(aborted, key=lambda txn: txn.first_offset)
    next_pending = 0
    aborting: set[int] = set()
    for batch in batches:
        h = batch.header
        last_offset = h.base_offset + h.last_offset_delta
        while next_pending < len(pending) and pending[next_pending].first_offset <= last_offset:
            aborting.add(pending[next_pending].producer_id)
            next_pending += 1
        if h.attributes & fmt.CONTROL_MASK:
            if h.producer_id in aborting:
                marker = decode_txn_marker(batch)
                if marker is not None and not marker.commit:
                    aborting.discard(h.producer_id)
            continue
        if h.attributes & fmt.TRANSACTIONAL_MASK and h.producer_id in aborting:
            continue
        yield batch


def _stored_batches(
    fs: ReadOnlyFileSystem, directory: str, bases: list[int], start: int, end: int
) -> Iterator[RecordBatch]:
    first = max(bisect.bisect_right(bases, start) - 1, 0)
    previous_last: int | None = None  # last offset of the batch before, to check placement
    for n in range(first, len(bases)):
        base = bases[n]
        next_base = bases[n + 1] if n + 1 < len(bases) else None
        path = os.path.join(directory, segment_file_name(base, LOG_SUFFIX))
        try:
            handle = fs.open(path, writable=False)
        except FileNotFoundError:
            # Listed a moment ago, gone now: retention deleted it under us.
            raise OffsetBelowLogStartError(directory, start, log_start_offset(fs, directory)) from None
        try:
            from_position = _start_position(fs, handle, directory, base, start) if n == first else 0
            try:
                for position, batch in scan_file(handle, from_position, handle.size(), READ_CHUNK_BYTES):
                    h = batch.header
                    if h.base_offset >= end:
                        return  # a gap (a compacted Kafka log) ends just below `end`
                    last_offset = h.base_offset + h.last_offset_delta
                    _check_placement(batch, base, next_base, previous_last, path, position)
                    previous_last = last_offset
                    if last_offset < start:
                        continue
                    try:
                        batch.validate()
                    except CorruptRecordError as exc:
                        raise CorruptRecordError(exc.reason, path=path, position=position) from None
                    yield batch
                    # Stop before parsing what follows: it may be an append in progress.
                    if last_offset + 1 >= end:
                        return
            except (TruncatedBatchError, UnwrittenSpaceError):
                # Where this segment's data ends: a torn or pre-allocated tail. A later
                # segment (a roll happened) carries on; otherwise the data is short.
                pass
        finally:
            handle.close()
    reached = start if previous_last is None else max(previous_last + 1, start)
    raise OffsetOutOfRangeError(
        f"{directory} holds offsets only up to {reached}, below the end {end} of the range read "
        f"from {start}: the log was truncated or deleted meanwhile"
    )


def _check_placement(
    batch: RecordBatch, base: int, next_base: int | None, previous_last: int | None, path: str, position: int
) -> None:
    """baseOffset is outside the CRC: refuse a batch whose offsets do not fit where it sits."""
    h = batch.header
    last_offset = h.base_offset + h.last_offset_delta
    misplaced = (
        h.base_offset < base
        or (previous_last is not None and h.base_offset <= previous_last)
        or (next_base is not None and last_offset >= next_base)
    )
    if misplaced:
        after = "" if previous_last is None else f" after offset {previous_last}"
        raise CorruptRecordError(
            f"batch claims offsets {h.base_offset}..{last_offset}, which do not fit{after} in the "
            f"segment {base}..{'' if next_base is None else next_base - 1}",
            path=path,
            position=position,
        )


def _start_position(fs: ReadOnlyFileSystem, log: FileHandle, directory: str, base: int, offset: int) -> int:
    """Where to start scanning for `offset`: its `.index` floor entry, checked against the batch there.

    The index is only a hint. An entry whose batch does not start at or below
    `offset` (a damaged index, or one the writer is cutting) falls back to the
    segment's start, which is always right, only slower.
    """
    path = os.path.join(directory, segment_file_name(base, INDEX_SUFFIX))
    try:
        index = fs.open(path, writable=False)
    except FileNotFoundError:
        return 0  # Kafka writes no .index for a segment it never indexed
    try:
        position = index_floor_position(index, offset - base)
    finally:
        index.close()
    if position <= 0:
        return 0
    header = log.pread(fmt.HEADER_SIZE, position)
    if len(header) < fmt.HEADER_SIZE:
        return 0
    batch_base, _, _, magic, *_ = fmt.HEADER_STRUCT.unpack_from(header)
    return position if magic == fmt.MAGIC_V2 and base <= batch_base <= offset else 0


def index_floor_position(index: FileHandle, relative_offset: int) -> int:
    """The position of the last `.index` entry whose relative offset is <= `relative_offset`; 0 if none.

    Read with a pread per probe of a binary search, never mapped: the file may be
    an active segment's, pre-allocated and being written. Its entries are followed
    by zeros, and no real entry is all zeros except possibly the first (the first
    batch, at position 0, which says nothing a scan from 0 would not), so an
    all-zero entry past the first counts as "after every entry".
    """
    entry_size = _INDEX_ENTRY.size
    lo, hi = 0, index.size() // entry_size
    while lo < hi:
        mid = (lo + hi) // 2
        raw = index.pread(entry_size, mid * entry_size)
        rel, position = _INDEX_ENTRY.unpack(raw) if len(raw) == entry_size else (0, 0)
        # The first entry may be (0, 0); anywhere else that is the zero tail.
        if rel <= relative_offset and (mid == 0 or (rel, position) != (0, 0)):
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return 0
    raw = index.pread(entry_size, (lo - 1) * entry_size)
    return int(_INDEX_ENTRY.unpack(raw)[1]) if len(raw) == entry_size else 0
