"""LogSegment: one `%020d.log` file with its `.index` and `.timeindex`.

The segment knows byte positions and offsets. It does not validate batches (the
log does that before `append`) and it does not decide what a bad batch means: the
scan raises, and the loader decides whether that is a torn tail or corruption.
All I/O goes through the filesystem seam.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from oncelog.errors import CorruptRecordError
from oncelog.recovery.fs import Buffer, FileHandle, FileSystem
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, TruncatedBatchError, batch_size_at
from oncelog.segments.index import OffsetIndex, TimeIndex, TimestampOffset

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

# Whole-segment scans (recovery, rebuilds) read in chunks of this size, so memory
# stays bounded whatever the segment size.
SCAN_CHUNK_BYTES = 8 * 1024 * 1024


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def parse_segment_file_name(name: str, suffix: str) -> int | None:
    """The base offset in `name`, or None if `name` is not a `%020d<suffix>` file."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    if len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


class BatchMeta(NamedTuple):
    """What the segment needs to index one appended batch."""

    last_offset: int
    max_timestamp_ms: int
    size: int


class ScannedBatch(NamedTuple):
    position: int
    batch: RecordBatch


def scan_file(
    handle: FileHandle, start: int, end: int, chunk_bytes: int = SCAN_CHUNK_BYTES
) -> Iterator[ScannedBatch]:
    """Yield the batches in [start, end) of a file, reading `chunk_bytes` at a time.

    Headers only: no CRC check. Raises TruncatedBatchError when the range ends
    inside a batch and CorruptRecordError when a header is impossible, each with
    the file and absolute position.
    """
    assert chunk_bytes >= fmt.HEADER_SIZE, chunk_bytes  # a chunk must hold a header
    pos = start
    while pos < end:
        want = min(chunk_bytes, end - pos)
        view = memoryview(handle.pread(want, pos))
        if len(view) < want:
            end = pos + len(view)  # the file is shorter than the caller thought
        used = 0
        try:
            while len(view) - used >= fmt.SIZE_AND_MAGIC_BYTES:
                size = batch_size_at(view, used)
                if size > len(view) - used:
                    break
                yield ScannedBatch(pos + used, RecordBatch(view[used : used + size]))
                used += size
            if used == 0:
                # The next batch alone is larger than a chunk: read exactly it.
                size = batch_size_at(view, 0)
                if pos + size > end:
                    raise TruncatedBatchError(f"batch of {size} bytes, {end - pos} remain", position=0)
                whole = memoryview(handle.pread(size, pos))
                if len(whole) < size:
                    raise TruncatedBatchError(f"batch of {size} bytes, {len(whole)} remain", position=0)
                yield ScannedBatch(pos, RecordBatch(whole))
                used = size
        except CorruptRecordError as exc:
            cls = type(exc)
            raise cls(exc.reason, path=handle.path, position=pos + used) from None
        pos += used


def check_client_appended(batch: RecordBatch, previous_last_offset: int | None) -> None:
    """Raise unless `batch` looks as a client append left it (fields outside the CRC)."""
    if batch.partition_leader_epoch != fmt.NO_PARTITION_LEADER_EPOCH:
        raise CorruptRecordError(
            f"batch at offset {batch.base_offset} has partitionLeaderEpoch {batch.partition_leader_epoch}, "
            "not oncelog's stamp -1"
        )
    if previous_last_offset is not None and batch.base_offset != previous_last_offset + 1:
        raise CorruptRecordError(
            f"batch at offset {batch.base_offset} leaves a gap after {previous_last_offset} "
            "in a log that has none"
        )


class LogSegment:
    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        base_offset: int,
        handle: FileHandle,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        index_interval_bytes: int,
    ):
        self.fs = fs
        self.directory = directory
        self.base_offset = base_offset
        self._handle = handle
        self.offset_index = offset_index
        self.time_index = time_index
        self.index_interval_bytes = index_interval_bytes
        # Logical end of the segment: bytes past it are not part of the log.
        self.size = handle.size()
        self.next_offset = base_offset  # one past the last offset held
        self.max_timestamp_ms = fmt.NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset
        # Time-based rolling counts from the first batch's timestamp, as Kafka does,
        # so a restart does not reset the clock.
        self.first_batch_timestamp_ms: int | None = None
        self.bytes_since_last_index_entry = 0
        self.unflushed = False

    @property
    def path(self) -> str:
        return self._handle.path

    @classmethod
    def open(
        cls,
        fs: FileSystem,
        directory: str,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        create: bool = False,
        sealed: bool = False,
    ) -> LogSegment:
        log_path = os.path.join(directory, segment_file_name(base_offset, LOG_SUFFIX))
        is_new = not fs.exists(log_path)
        if is_new and not create:
            raise FileNotFoundError(log_path)
        handle = fs.open(log_path, create=True)
        join = os.path.join
        offset_index = OffsetIndex(
            fs,
            join(directory, segment_file_name(base_offset, INDEX_SUFFIX)),
            base_offset,
            max_index_bytes,
            sealed=sealed,
        )
        time_index = TimeIndex(
            fs,
            join(directory, segment_file_name(base_offset, TIME_INDEX_SUFFIX)),
            base_offset,
            max_index_bytes,
            sealed=sealed,
        )
        if is_new:
            # Without this a power loss can drop the new files' directory entries
            # even after their data is fsynced (KAFKA-3968).
            fs.fsync_dir(directory)
        return cls(fs, directory, base_offset, handle, offset_index, time_index, index_interval_bytes)

    # -- appends -----------------------------------------------------------------
    def append(self, buffers: Sequence[Buffer], metas: Sequence[BatchMeta]) -> None:
        """Write the batches (given as buffers) at the end, then index them.

        The indexes and in-memory state change only after the write returned, so
        a failed write leaves the segment as it was (apart from bytes past `size`,
        which are not part of the log and are cut by recovery).
        """
        position = self.size
        expected = sum(meta.size for meta in metas)
        written = self._handle.pwritev(buffers, position)
        assert written == expected, (self.path, written, expected)
        for meta in metas:
            self._index_batch(position, meta)
            position += meta.size
        self.size = position
        self.unflushed = True

    def _index_batch(self, position: int, meta: BatchMeta) -> None:
        if self.first_batch_timestamp_ms is None:
            self.first_batch_timestamp_ms = meta.max_timestamp_ms
        if meta.max_timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = meta.max_timestamp_ms
            self.offset_of_max_timestamp = meta.last_offset
        # Kafka's rule: an entry for this batch once more than the interval has been
        # written since the last one. A full index just gets sparser; the log rolls
        # before the next append.
        if self.bytes_since_last_index_entry > self.index_interval_bytes and not self.indexes_full:
            self.offset_index.append(meta.last_offset, position)
            self.time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += meta.size
        self.next_offset = meta.last_offset + 1

    @property
    def indexes_full(self) -> bool:
        return self.offset_index.is_full or self.time_index.is_full

    # -- loading -----------------------------------------------------------------
    def rebuild(
        self,
        *,
        validate: bool,
        on_batch: Callable[[int, RecordBatch], None] | None = None,
        first_base_offset: int | None = None,
        client_only: bool = False,
    ) -> CorruptRecordError | None:
        """Rescan the whole file, rebuilding both indexes and the in-memory state.

        With `validate`, each batch's CRC is checked too. Scanning stops at the first
        bad or truncated batch, which is returned (not raised): whether it is a torn
        tail to cut or corruption to report is the loader's decision. `size` then
        ends at the last good batch.
        """
        self.offset_index.reset()
        self.time_index.reset()
        size_on_disk = self._handle.size()
        self.size = 0
        self.next_offset = self.base_offset
        self.max_timestamp_ms = fmt.NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_timestamp_ms = None
        self.bytes_since_last_index_entry = 0
        prev_last_offset = self.base_offset - 1
        try:
            for position, batch in scan_file(self._handle, 0, size_on_disk):
                if validate:
                    batch.validate()
                if batch.base_offset <= prev_last_offset or batch.last_offset < batch.base_offset:
                    raise CorruptRecordError(
                        f"offsets {batch.base_offset}..{batch.last_offset} do not follow {prev_last_offset}"
                    )
                if client_only:
                    check_client_appended(batch, prev_last_offset if position > 0 else None)
                if position == 0 and first_base_offset is not None and batch.base_offset != first_base_offset:
                    raise CorruptRecordError(
                        f"first batch starts at offset {batch.base_offset}, not at the segment's "
                        f"base {first_base_offset}"
                    )
                prev_last_offset = batch.last_offset
                self._index_batch(position, BatchMeta(batch.last_offset, batch.max_timestamp, batch.size))
                self.size = position + batch.size
                if on_batch is not None:
                    on_batch(position, batch)
        except CorruptRecordError as exc:
            if exc.path is None:
                return CorruptRecordError(str(exc), path=self.path, position=self.size)
            return exc
        return None

    def load_from_indexes(self, next_base_offset: int | None) -> bool:
        """Trust the indexes of a segment closed cleanly; False if they fail a sanity check.

        A sealed segment ends where the next one starts, so nothing is read. The
        active one (`next_base_offset` None) reads only its tail after the last
        offset index entry, at most about `index_interval_bytes` plus a batch.
        """
        last_entry = self.offset_index.last_entry()
        last_time = self.time_index.last_entry()
        if self.size > 0 and (last_time is None or last_entry.position >= self.size):
            return False
        if next_base_offset is not None and last_entry.offset >= next_base_offset:
            return False
        if last_time is not None:
            self.max_timestamp_ms, self.offset_of_max_timestamp = last_time
        if next_base_offset is not None:
            self.next_offset = next_base_offset
            return True
        self.next_offset = self.base_offset
        self.bytes_since_last_index_entry = 0
        for position, batch in self.scan(last_entry.position):
            # The tail is short, so check it fully: bytes appended behind a clean
            # close's back must not slip in unvalidated.
            if not batch.is_valid() or batch.base_offset < self.next_offset:
                return False
            self.next_offset = batch.last_offset + 1
            if batch.max_timestamp > self.max_timestamp_ms:
                self.max_timestamp_ms, self.offset_of_max_timestamp = batch.max_timestamp, batch.last_offset
            self.bytes_since_last_index_entry = self.size - position
        if self.size:
            self.first_batch_timestamp_ms = self._first_batch_timestamp()
        return True

    def _first_batch_timestamp(self) -> int:
        header = self._handle.pread(fmt.HEADER_SIZE, 0)
        return int(fmt.HEADER_STRUCT.unpack_from(header)[8])

    def delete(self) -> None:
        """Close and remove the segment's files."""
        paths = [self.path, self.offset_index.path, self.time_index.path]
        self.close(durable=False)
        for path in paths:
            if self.fs.exists(path):
                self.fs.unlink(path)
        # fsync(dir): a deleted segment must not reappear after a crash and be replayed.
        self.fs.fsync_dir(self.directory)

    def truncate_to_size(self) -> int:
        """Cut the file at the logical size; returns the bytes removed."""
        on_disk = self._handle.size()
        if on_disk > self.size:
            self._handle.truncate(self.size)
        self.offset_index.truncate_to_position(self.size)
        self.time_index.truncate_to_offset(self.next_offset)
        return on_disk - self.size

    # -- reads -------------------------------------------------------------------
    def scan(self, start_position: int = 0, end_position: int | None = None) -> Iterator[ScannedBatch]:
        """Batches between two positions (default: the whole segment), headers only."""
        end = self.size if end_position is None else end_position
        return scan_file(self._handle, start_position, end)

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> list[ScannedBatch]:
        """Whole batches (with their positions) from the one holding `start_offset`.

        At most about `max_bytes`, but at least one batch when any qualifies, even
        if it alone is larger, so a reader always makes progress. Batches whose
        last offset reaches `max_offset` are left out.
        """
        end = self.size
        start = self.offset_index.lookup(start_offset).position
        out: list[ScannedBatch] = []
        taken = 0
        chunk = self.index_interval_bytes + max_bytes + fmt.HEADER_SIZE
        for scanned in scan_file(self._handle, start, end, chunk):
            batch = scanned.batch
            if batch.last_offset < start_offset:
                continue
            if max_offset is not None and batch.last_offset >= max_offset:
                break
            if out and taken + batch.size > max_bytes:
                break
            out.append(scanned)
            taken += batch.size
            if taken >= max_bytes:
                break
        return out

    def find_offset_for_timestamp(self, timestamp_ms: int) -> TimestampOffset | None:
        """The first record with a timestamp at or after `timestamp_ms`, if any."""
        if self.max_timestamp_ms < timestamp_ms:
            return None
        hint = self.time_index.lookup_before(timestamp_ms)
        start = self.offset_index.lookup(hint.offset).position if hint else 0
        for _, batch in scan_file(self._handle, start, self.size):
            if batch.max_timestamp < timestamp_ms:
                continue
            for record in batch.records():
                if record.timestamp_ms >= timestamp_ms:
                    return TimestampOffset(record.timestamp_ms, record.offset)
        return None

    # -- durability and lifecycle -----------------------------------------------
    def flush(self) -> None:
        """fsync the segment file.

        The active segment's indexes are not fsynced here: after a crash the loader
        rebuilds them from the log, and trim() (on seal and close) makes them
        durable exactly when a later open will trust them.
        """
        # fsync: without it a power loss may drop batches acknowledged as durable.
        self._handle.fsync()
        self.unflushed = False

    def seal(self) -> None:
        """Called when the segment stops being active: final time entry, trim indexes."""
        if self.offset_index.is_sealed and self.time_index.is_sealed:
            return
        if self.max_timestamp_ms != fmt.NO_TIMESTAMP:
            self.time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)
        self.offset_index.trim()
        self.time_index.trim()

    def close(self, *, durable: bool = True) -> None:
        """Close the files; `durable` also writes the final time entry and trims the indexes.

        A failed log closes with durable=False: no fsync is attempted, and the
        next open rebuilds what it cannot trust.
        """
        try:
            # The final time entry lets the next clean open take the max timestamp from the index.
            if durable and not self.time_index.is_sealed and self.max_timestamp_ms != fmt.NO_TIMESTAMP:
                self.time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)
            self.offset_index.close(trim=durable)
            self.time_index.close(trim=durable)
        finally:
            self._handle.close()

    def __repr__(self) -> str:
        return f"LogSegment({self.path}, base={self.base_offset}, next={self.next_offset}, size={self.size})"
