"""LogSegment: one `%020d.log` file with its `.index` and `.timeindex`.

The segment knows byte positions and offsets. It does not validate batches (the
log does that before `append`) and it does not decide what a bad batch means: the
scan raises, and the loader decides whether that is a torn tail or corruption.
All I/O goes through the filesystem seam.

Descriptors: the active segment keeps its `.log` open (and nothing else: its indexes
are mappings, which need none). A sealed segment holds none until it is read; its
`.log` then goes through the process's bounded FileCache. Its indexes are mapped when
first used (page cache, no descriptor); its owner unmaps them between operations
(`unmap_sealed_indexes`), so mappings do not grow with the segments either.

Long on purpose: one class keeps a file, its two indexes and the cursor the compiled
append shares (size, next offset, index positions, the mapping); append, recovery
(rebuild, load_from_indexes, cut_at) and reads each move that cursor, and the rules
that keep it consistent read best side by side.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from oncelog.segments import cursor as cur
from oncelog.segments import format as fmt
from oncelog.segments.batch import (
    MIN_BATCH_LENGTH,
    RecordBatch,
    TailChecks,
    TruncatedBatchError,
    batch_size_at,
    client_append_problem,
    walk_whole_batches,
)
from oncelog.segments.cursor import mapped_address
from oncelog.segments.errors import CorruptLogError, CorruptRecordError, TooManyOpenFilesError
from oncelog.segments.file_cache import CachedFile
from oncelog.segments.files import FileHandle, MappedRegion, SegmentFileSystem
from oncelog.segments.format import Buffer
from oncelog.segments.index import OffsetIndex, TimeIndex, TimestampOffset
from oncelog.segments.reservation import next_reservation
from oncelog.segments.txn_index import TXN_INDEX_SUFFIX, TransactionIndex

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

# Whole-segment scans (recovery, rebuilds) read in chunks of this size, so memory
# stays bounded whatever the segment size.
SCAN_CHUNK_BYTES = 8 * 1024 * 1024
# Writes of at least this many bytes go to pwrite (both append paths): a write() fills
# fresh page cache faster than page faults on a mapping do (measured at 16 KiB: 1.4 vs
# 0.8 GB/s on one machine, 2.6 vs 2.0 GB/s on another), and the syscall's cost is small
# next to the copy. Smaller ones are copied into the mapping, with no syscall at all.
# Either way the bytes land in space allocated ahead (`_grow`): a pwrite there skips the
# delayed allocation and the size update that extending the file costs (16 KiB on ext4:
# 4.4 µs against 5.6 µs for an appending write()).
WRITE_SYSCALL_MIN_BYTES = 8 * 1024
# The active segment is written through a shared mapping of reserved space (see
# reservation), grown by at least this much at a time (and by at most MAX_GROW_BYTES,
# so an idle partition pins little page cache and disk).
MIN_GROW_BYTES = 1024 * 1024
# Each extension of the file costs the kernel more than the bytes it adds (measured:
# 1 MiB steps halve the copy rate of 32 MiB ones), so steps double up to this.
MAX_GROW_BYTES = 32 * 1024 * 1024
# Recovery reads the pre-allocated zeros back to tell them from damage, this much at a time.
_ZERO_SCAN_BYTES = 1024 * 1024
_ZERO_PAGE_BYTES = 4096
_ZERO_PAGE = bytes(_ZERO_PAGE_BYTES)
_ZERO_CHUNK = bytes(_ZERO_SCAN_BYTES)

_SIZE, _MAPPED_BYTES, _NEXT_OFFSET = cur.SEG_SIZE, cur.SEG_MAPPED_BYTES, cur.SEG_NEXT_OFFSET
_FIRST_TS, _HAS_FIRST_TS = cur.SEG_FIRST_BATCH_TS, cur.SEG_HAS_FIRST_TS
_MAX_TS, _OFFSET_OF_MAX_TS = cur.SEG_MAX_TS, cur.SEG_OFFSET_OF_MAX_TS
_BYTES_SINCE_INDEX, _INDEX_INTERVAL = cur.SEG_BYTES_SINCE_INDEX, cur.SEG_INDEX_INTERVAL
_UNFLUSHED = cur.SEG_UNFLUSHED
_PREFIX_PACK_INTO = fmt.SIZE_AND_MAGIC_STRUCT.pack_into
_PREFIX_PACK = fmt.SIZE_AND_MAGIC_STRUCT.pack
_NO_LEADER_EPOCH = fmt.NO_PARTITION_LEADER_EPOCH
_MAGIC = fmt.MAGIC_V2


# A new segment's scalars before any batch (see LogSegment.__init__): no timestamp, no
# descriptor to pwrite to, no offset limit yet; the rest zero (not unflushed, nothing
# mapped, no first batch's timestamp, from which time-based rolling counts, as Kafka's).
_CURSOR_TEMPLATE = cur.new_cursor(cur.SEG_FIELDS)
_CURSOR_TEMPLATE[cur.SEG_MAX_TS] = fmt.NO_TIMESTAMP
_CURSOR_TEMPLATE[cur.SEG_WRITE_FD] = -1
_CURSOR_TEMPLATE[cur.SEG_LAST_OFFSET_LIMIT] = -1
_NO_VIEW = memoryview(b"")  # the write view of a segment with no write mapping (shared: empty, never written)


def _offset_limit(base_offset: int) -> int:
    """The last offset a segment at `base_offset` may hold while its indexes have room."""
    return min(base_offset + fmt.INT32_MAX, fmt.MAX_OFFSET)


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def _index_path(directory: str, base_offset: int, suffix: str) -> str:
    return os.path.join(directory, segment_file_name(base_offset, suffix))


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


class _RebuildChecks(NamedTuple):
    validate: bool
    first_base_offset: int | None
    client_only: bool


# A clean open reads its active segment's tail (about index_interval_bytes) in one read
# up to this size; a longer one is read as a recovery scan reads.
CLEAN_TAIL_READ_BYTES = 1024 * 1024

# What the compiled tail scan walks at a time (whole batches; a larger one goes to Python).
TAIL_SCAN_CHUNK_BYTES = 1024 * 1024
# Why the compiled tail scan stopped (oncelog._append's SCAN_*; a test compares them): the
# chunk ended, a batch it leaves to the reference loop, its rows buffer is full.
TAIL_SCAN_END, TAIL_SCAN_PYTHON, TAIL_SCAN_ROWS_FULL = 0, 1, 2


class TailScan(Protocol):
    """Recovery's compiled loop (oncelog._append.scan_tail) and who takes its rows.

    `scan` checks and indexes the common batches of `chunk` as `_rebuild_batches` does,
    writes one row each into its rows buffer, and returns (batches, bytes, why it
    stopped: TAIL_SCAN_*); `on_rows(n)` then takes the first n rows."""

    def scan(
        self,
        chunk: Buffer,
        file_position: int,
        segment: Any,
        offset_index: Any,
        time_index: Any,
        *,
        client_only: bool,
        first_base_offset: int,
    ) -> tuple[int, int, int]: ...

    def on_rows(self, count: int) -> None: ...


def scan_file(
    handle: FileHandle,
    start: int,
    end: int,
    chunk_bytes: int = SCAN_CHUNK_BYTES,
    take_at_most: Callable[[], int | None] | None = None,
) -> Iterator[ScannedBatch]:
    """Yield the batches in [start, end) of a file, reading `chunk_bytes` at a time.

    `take_at_most`, asked before each chunk after the first: the largest batch the
    caller may still take (None: any). Given a number, only that much and the next
    header are read, and the scan ends at a larger batch, which is never read.

    Headers only: no CRC check. Raises TruncatedBatchError when the range ends
    inside a batch and CorruptRecordError when a header is impossible, each with
    the file and absolute position.
    """
    assert chunk_bytes >= fmt.HEADER_SIZE, chunk_bytes  # a chunk must hold a header
    pos = start
    while pos < end:
        at_most = take_at_most() if pos != start and take_at_most is not None else None
        assert at_most is None or at_most >= 0, at_most
        want = min(chunk_bytes if at_most is None else at_most + fmt.HEADER_SIZE, end - pos)
        view = memoryview(handle.pread(want, pos))
        if len(view) < want:
            end = pos + len(view)  # the file is shorter than the caller thought
        used = 0
        try:
            while len(view) - used >= fmt.SIZE_AND_MAGIC_BYTES:
                size = batch_size_at(view, used)
                if size > len(view) - used:
                    break
                yield ScannedBatch(pos + used, RecordBatch.of_sized_view(view[used : used + size]))
                used += size
            if used == 0:
                # The next batch alone is larger than a chunk: read exactly it.
                size = batch_size_at(view, 0)
                if at_most is not None and size > at_most:
                    return  # the caller would not take it
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


def zeros_to_end(handle: FileHandle, start: int, end: int) -> bool:
    """True if bytes [start, end) of the file are all zeros, read a chunk at a time.

    Where `scan_file` meets zeros (UnwrittenSpaceError), zeros up to the end are
    pre-allocated space never written, not damage; anything else after them is.
    """
    end = min(end, handle.data_end(start))  # past it the file reads as zeros: no need to read it
    while start < end:
        chunk = handle.pread(min(_ZERO_SCAN_BYTES, end - start), start)
        if not chunk or chunk != _ZERO_CHUNK[: len(chunk)]:
            return False
        start += len(chunk)
    return True


def check_client_appended(batch: RecordBatch, previous_last_offset: int | None) -> None:
    """Raise unless `batch` looks as a client append left it (client_append_problem)."""
    problem = client_append_problem(batch.header, previous_last_offset)
    if problem is not None:
        raise CorruptRecordError(problem)


class LogSegment:
    # The scalars the compiled append shares, in the cursor array (segments.cursor).
    next_offset = cur.CursorField[int](cur.SEG_NEXT_OFFSET)  # one past the last offset held
    max_timestamp_ms = cur.CursorField[int](cur.SEG_MAX_TS)
    offset_of_max_timestamp = cur.CursorField[int](cur.SEG_OFFSET_OF_MAX_TS)
    bytes_since_last_index_entry = cur.CursorField[int](cur.SEG_BYTES_SINCE_INDEX)
    index_interval_bytes = cur.CursorField[int](cur.SEG_INDEX_INTERVAL)
    # The last offset this segment may take before it must roll.
    last_offset_limit = cur.CursorField[int](cur.SEG_LAST_OFFSET_LIMIT)
    _mapped_bytes = cur.CursorField[int](cur.SEG_MAPPED_BYTES)

    def __init__(
        self,
        fs: SegmentFileSystem,
        directory: str,
        base_offset: int,
        handle: FileHandle,
        offset_index: OffsetIndex | None,
        time_index: TimeIndex | None,
        index_interval_bytes: int,
        max_segment_bytes: int = fmt.INT32_MAX,
        max_index_bytes: int = 0,
        *,
        size: int | None = None,
    ):
        self.fs = fs
        self.directory = directory
        self.base_offset = base_offset
        # The scalars start from a template (one copy, not a dozen descriptor stores: a
        # log opened with 100 sealed segments makes 100 of these), then this segment's own.
        self.cursor = _CURSOR_TEMPLATE.copy()
        self._cursor_view = c = cur.cursor_view(self.cursor)
        c[cur.SEG_BASE_OFFSET] = c[cur.SEG_NEXT_OFFSET] = c[cur.SEG_OFFSET_OF_MAX_TS] = base_offset
        c[cur.SEG_INDEX_INTERVAL] = index_interval_bytes
        # A handle that does not say (an older double) gets every write through the seam.
        direct = getattr(handle, "direct_write_fd", None)
        fd = direct() if direct is not None else -1
        if isinstance(fd, int) and fd >= 0:
            c[cur.SEG_WRITE_FD] = fd
        self._handle: FileHandle = handle
        # None until first used (a sealed segment opened lazily, see open()).
        self._offset_index = offset_index
        self._time_index = time_index
        self._max_index_bytes = max_index_bytes
        # Told when a sealed segment's indexes are mapped: the owner bounds how many stay
        # mapped (each is one of the process's vm.max_map_count mappings).
        self.on_indexes_mapped: Callable[[LogSegment], None] | None = None
        # Aborted transactions whose ABORT marker is in this segment; no I/O until used.
        # (Its path beside the .log's: the same as joining the directory, without the join.)
        log_path = handle.path
        txn_path = (
            log_path[: -len(LOG_SUFFIX)] + TXN_INDEX_SUFFIX
            if log_path.endswith(LOG_SUFFIX)
            else _index_path(directory, base_offset, TXN_INDEX_SUFFIX)
        )
        self.txn_index = TransactionIndex(fs, txn_path, base_offset)
        self.size = handle.size() if size is None else size
        # Pre-allocation never goes past the size the log rolls at.
        self.max_segment_bytes = max_segment_bytes
        if offset_index is None or time_index is None:
            c[cur.SEG_LAST_OFFSET_LIMIT] = _offset_limit(base_offset)  # (as _update_last_offset_limit)
        else:
            self._update_last_offset_limit()
        # The write mapping: bytes [0, _mapped_bytes) of the file, allocated on disk (none yet).
        self._write_region: MappedRegion | None = None
        self._write_view = _NO_VIEW
        # A lazily opened sealed segment learns its largest timestamp when its indexes are
        # first mapped; the cursor keeps it after they are unmapped again (between operations).
        self._max_timestamp_known = offset_index is not None

    def shared_cursors(self) -> dict[str, object]:
        """The cursors of the segment and its indexes, which the compiled append shares."""
        return {
            "segment": self.cursor,
            "offset_index": self.offset_index.cursor,
            "time_index": self.time_index.cursor,
        }

    @property
    def size(self) -> int:
        """The logical end: bytes past it are not part of the log."""
        size: int = self._cursor_view[_SIZE]
        return size if size >= 0 else self._size_on_first_use()

    @size.setter
    def size(self, value: int) -> None:
        self._cursor_view[_SIZE] = value

    def _size_on_first_use(self) -> int:
        """A trusted sealed segment's size, read when first needed (`open_trusted`)."""
        path = self.path
        try:
            size = self.fs.file_size(path)
        except FileNotFoundError as error:
            known: int = self._cursor_view[_SIZE]
            if known >= 0:
                return known  # a deletion read it just before it removed the file
            raise CorruptLogError(
                "a sealed segment listed when the log opened is gone", path=path, position=0
            ) from error
        assert size >= 0, (path, size)
        self._cursor_view[_SIZE] = size
        return size

    @property
    def first_batch_timestamp_ms(self) -> int | None:
        view = self._cursor_view
        value: int = view[cur.SEG_FIRST_BATCH_TS]
        return value if view[cur.SEG_HAS_FIRST_TS] else None

    @first_batch_timestamp_ms.setter
    def first_batch_timestamp_ms(self, value: int | None) -> None:
        self._cursor_view[cur.SEG_HAS_FIRST_TS] = value is not None
        self._cursor_view[cur.SEG_FIRST_BATCH_TS] = 0 if value is None else value

    @property
    def unflushed(self) -> bool:
        return bool(self._cursor_view[cur.SEG_UNFLUSHED])

    @unflushed.setter
    def unflushed(self, value: bool) -> None:
        self._cursor_view[cur.SEG_UNFLUSHED] = int(value)

    @property
    def path(self) -> str:
        return self._handle.path

    @classmethod
    def open_trusted(
        cls,
        fs: SegmentFileSystem,
        directory: str,
        log_path: str,
        base_offset: int,
        next_base_offset: int,
        limits: tuple[int, int, int],
        *,
        listed_regular: bool = False,
    ) -> LogSegment:
        """A sealed segment below the recovery point, trusted: its .log at `log_path` (in
        `directory`) is opened when first read, its size read when first needed, and its
        indexes mapped and sanity-checked when first used, as Kafka's LazyIndex does. So
        opening a log costs no I/O per sealed segment. `limits`: (index_interval_bytes,
        max_segment_bytes, max_index_bytes). `listed_regular`: the directory listing said
        the .log is a regular file; otherwise (a link, say) its size is read now, so one
        that is not there (a dangling link) fails the open, where it is named."""
        size = -1 if listed_regular else fs.file_size(log_path)
        handle = CachedFile(fs, log_path)
        segment = cls(fs, directory, base_offset, handle, None, None, *limits, size=size)
        segment.next_offset = next_base_offset
        return segment

    @classmethod
    def open(
        cls,
        fs: SegmentFileSystem,
        directory: str,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        create: bool = False,
        sealed: bool = False,
        max_segment_bytes: int = fmt.INT32_MAX,
    ) -> LogSegment:
        """Open (or create) a segment (a trusted sealed one: open_trusted)."""
        log_path = os.path.join(directory, segment_file_name(base_offset, LOG_SUFFIX))
        limits = (index_interval_bytes, max_segment_bytes, max_index_bytes)
        is_new = not fs.exists(log_path)
        if is_new and not create:  # listed, yet not there: a dangling or looping link, say
            raise FileNotFoundError(errno.ENOENT, "no such segment file", log_path)
        if is_new:
            # A crash inside delete() (the .log goes first) can leave a dead segment's
            # indexes at this base: a new segment must not take their entries for its own.
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                stale = _index_path(directory, base_offset, suffix)
                if fs.exists(stale):
                    fs.unlink(stale)
        handle = fs.open(log_path, create=True)
        offset_index: OffsetIndex | None = None
        time_index: TimeIndex | None = None
        try:
            index_path = _index_path(directory, base_offset, INDEX_SUFFIX)
            time_index_path = _index_path(directory, base_offset, TIME_INDEX_SUFFIX)
            offset_index = OffsetIndex(fs, index_path, base_offset, max_index_bytes, sealed=sealed)
            time_index = TimeIndex(fs, time_index_path, base_offset, max_index_bytes, sealed=sealed)
            if is_new:
                # Without this a power loss can drop the new files' directory entries
                # even after their data is fsynced (KAFKA-3968).
                fs.fsync_dir(directory)
        except BaseException:
            # A full disk while reserving the indexes: close what was opened. The files
            # left are an empty segment, which the next open takes as the active one.
            for index in (offset_index, time_index):
                if index is not None:
                    index.close(trim=False)
            handle.close()
            raise
        return cls(fs, directory, base_offset, handle, offset_index, time_index, *limits)

    # -- indexes, mapped on first use for a lazily opened segment --------------------
    @property
    def offset_index(self) -> OffsetIndex:
        index = self._offset_index
        return index if index is not None else self._load_lazy_indexes()[0]

    @property
    def time_index(self) -> TimeIndex:
        index = self._time_index
        return index if index is not None else self._load_lazy_indexes()[1]

    @property
    def indexes_loaded(self) -> bool:
        return self._offset_index is not None

    def _load_lazy_indexes(self) -> tuple[OffsetIndex, TimeIndex]:
        """Map a sealed segment's indexes; rebuild them from the log if they fail the sanity check."""
        directory, base = self.directory, self.base_offset
        offset_index = OffsetIndex(
            self.fs, _index_path(directory, base, INDEX_SUFFIX), base, self._max_index_bytes, sealed=True
        )
        time_index = TimeIndex(
            self.fs, _index_path(directory, base, TIME_INDEX_SUFFIX), base, self._max_index_bytes, sealed=True
        )
        self._offset_index, self._time_index = offset_index, time_index
        if self.on_indexes_mapped is not None:
            self.on_indexes_mapped(self)
        next_offset = self.next_offset
        if self.load_from_indexes(next_offset):
            self._max_timestamp_known = True
            return offset_index, time_index
        log.warning("rebuilding the indexes of %s: they fail the sanity check", self.path)
        size = self.size
        # Only the offset and time indexes: the transaction index (fsynced at the seal) does
        # not depend on them, and rebuilding it needs the producers' state at this base.
        error = self.rebuild(validate=False, keep_txn_index=True)
        problem: CorruptLogError | None = None
        if error is not None:
            # Below the recovery point, so it was fsynced: corruption, not a torn write.
            problem = CorruptLogError(
                f"{error.reason} (found rebuilding its indexes)", path=self.path, position=self.size
            )
        elif self.next_offset != next_offset:
            problem = CorruptLogError(
                f"its batches end at offset {self.next_offset}, but the next segment starts at {next_offset}",
                path=self.path,
                position=self.size,
            )
        if problem is not None:
            # The segment as it was: a later clean close must not cut the file at the damage
            # (the batches after it are good) nor keep the half-rebuilt indexes.
            self.size, self.next_offset = size, next_offset
            for index in (self._offset_index, self._time_index):
                if index is not None:
                    index.close(trim=False)
            self._offset_index = self._time_index = None
            raise problem
        self.seal()
        self._max_timestamp_known = True
        return offset_index, time_index

    # -- appends -----------------------------------------------------------------
    # Writes go into space allocated ahead of the end: small ones are copies into a
    # shared mapping of it (no syscall per batch), large ones pwrites into it. Either
    # way the bytes are in the page cache (they survive a kill -9) once the call
    # returns. Space past `size` is zeros, which recovery cuts like any torn tail;
    # sealing and closing trim the file to `size`.

    def append(self, buffers: Sequence[Buffer], metas: Sequence[BatchMeta]) -> None:
        """Write the batches (given as buffers) at the end, then index them.

        A failure (a full disk) comes before the indexes and `size` change, and
        leaves the segment as it was apart from bytes past `size`.
        """
        position = self.size
        expected = sum(meta.size for meta in metas)
        end = position + expected
        # Room for an entry per batch first, so indexing them below cannot fail half way.
        self.offset_index.reserve_room(len(metas))
        self.time_index.reserve_room(len(metas))
        if end > self._mapped_bytes:
            self._grow(end)
        if expected >= WRITE_SYSCALL_MIN_BYTES:
            written = self._handle.pwritev(buffers, position)
            assert written == expected, (self.path, written, expected)
        else:
            view = self._write_view
            at = position
            for buffer in buffers:
                stop = at + len(buffer)
                view[at:stop] = buffer
                at = stop
            assert at == end, (self.path, at - position, expected)
        for meta in metas:
            self._index_batch(position, meta)
            position += meta.size
        self.size = position
        self.unflushed = True

    def append_stamped(
        self, buffer: Buffer, base_offset: int, last_offset: int, max_timestamp_ms: int
    ) -> None:
        """Write one whole batch at the end with its base offset and leader epoch stamped.

        Log.append's single-batch route. A small batch is copied into the mapping
        and its 17-byte prefix (no CRC covers it) overwritten in place; a large one
        goes to pwritev as the new prefix plus a view of the rest. The indexing is
        _index_batch's, inlined.
        """
        c = self._cursor_view  # the scalars read and written directly: this is the Python hot path
        position = c[_SIZE]
        size = len(buffer)
        end = position + size
        if c[_BYTES_SINCE_INDEX] > c[_INDEX_INTERVAL] and not self.indexes_full:
            # This batch gets index entries: room for them first, so a failure to grow an
            # index (a full disk, no descriptor to reopen it with) comes before the write.
            self.offset_index.reserve_room(1)
            self.time_index.reserve_room(1)
        if end > c[_MAPPED_BYTES]:
            self._grow(end)
        if size >= WRITE_SYSCALL_MIN_BYTES:
            prefix = _PREFIX_PACK(base_offset, size - fmt.LOG_OVERHEAD, _NO_LEADER_EPOCH, _MAGIC)
            written = self._handle.pwritev([prefix, memoryview(buffer)[fmt.SIZE_AND_MAGIC_BYTES :]], position)
            assert written == size, (self.path, written, size)
        else:
            view = self._write_view
            # The body first, the prefix (length and magic) last: a reader of the live
            # file (another process, through the page cache) never sees a batch header
            # before the bytes it announces are there.
            prefix_end = position + fmt.SIZE_AND_MAGIC_BYTES
            # (A slice of a small batch copies faster than a memoryview of it is made.)
            view[prefix_end:end] = buffer[fmt.SIZE_AND_MAGIC_BYTES :]
            _PREFIX_PACK_INTO(view, position, base_offset, size - fmt.LOG_OVERHEAD, _NO_LEADER_EPOCH, _MAGIC)
        if not c[_HAS_FIRST_TS]:
            c[_FIRST_TS], c[_HAS_FIRST_TS] = max_timestamp_ms, 1
        if max_timestamp_ms > c[_MAX_TS]:
            c[_MAX_TS], c[_OFFSET_OF_MAX_TS] = max_timestamp_ms, last_offset
        if c[_BYTES_SINCE_INDEX] > c[_INDEX_INTERVAL]:
            self._index_batch(position, BatchMeta(last_offset, max_timestamp_ms, size))
        else:
            c[_BYTES_SINCE_INDEX] += size
            c[_NEXT_OFFSET] = last_offset + 1
        c[_SIZE] = end
        c[_UNFLUSHED] = 1

    def _grow(self, end: int) -> None:
        """Reserve and map at least up to byte `end` (and some room beyond it)."""
        if self._write_region is None and not self.indexes_full:
            # The first mapping since the open: the indexes, which wait for their first
            # entry (index.py), get theirs too, so the compiled path finds all three ready.
            # Not yet if no descriptor is free to open them with: the entry that needs them
            # reserves them (and reports that), a write that does not need them goes on.
            with contextlib.suppress(TooManyOpenFilesError):
                self.offset_index.reserve_room(1)
                self.time_index.reserve_room(1)
        reserved = self._mapped_bytes
        target = next_reservation(reserved, end, self.max_segment_bytes, MIN_GROW_BYTES, MAX_GROW_BYTES)
        # Blocks first (a mapped write to a page without one would be SIGBUS, not an
        # error), with the old mapping still in place: a full disk changes nothing.
        # [0, reserved) was reserved when it was mapped; after a release, all of the file is.
        self._handle.allocate(target, start=reserved)
        self._release_mapping()
        region = self._handle.mmap(target, writable=True)
        self._write_region, self._write_view, self._mapped_bytes = region, region.buffer, target
        self.cursor[cur.SEG_WRITE_ADDR] = mapped_address(region.buffer)
        self.cursor[cur.SEG_POPULATED] = 0  # a new mapping: its pages are faulted in afresh

    def _release_mapping(self) -> None:
        if self._write_region is not None:
            self.cursor[cur.SEG_WRITE_ADDR] = 0  # before the unmap: the compiled path writes through it
            self._write_view = _NO_VIEW
            self._write_region.close()
            self._write_region = None
            self._mapped_bytes = 0

    def _trim_file(self) -> None:
        """Unmap and cut the pre-allocated space past the logical end."""
        self._release_mapping()
        if self._handle.size() > self.size:
            self._handle.truncate(self.size)

    def _index_batch(self, position: int, meta: BatchMeta) -> None:
        # The cursor's slots directly: recovery's rebuild calls this for every batch.
        c = self._cursor_view
        last_offset, max_timestamp_ms = meta.last_offset, meta.max_timestamp_ms
        if not c[_HAS_FIRST_TS]:
            c[_FIRST_TS], c[_HAS_FIRST_TS] = max_timestamp_ms, 1
        if max_timestamp_ms > c[_MAX_TS]:
            c[_MAX_TS], c[_OFFSET_OF_MAX_TS] = max_timestamp_ms, last_offset
        # Kafka's rule: an entry for this batch once more than the interval has been
        # written since the last one. A full index just gets sparser; the log rolls
        # before the next append.
        if c[_BYTES_SINCE_INDEX] > c[_INDEX_INTERVAL] and not self.indexes_full:
            self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(c[_MAX_TS], c[_OFFSET_OF_MAX_TS])
            c[_BYTES_SINCE_INDEX] = 0
            if self.offset_index.is_full or self.time_index.is_full:  # only now may the limit change
                self._update_last_offset_limit()
        c[_BYTES_SINCE_INDEX] += meta.size
        c[_NEXT_OFFSET] = last_offset + 1

    def _update_last_offset_limit(self) -> None:
        # Index entries hold offsets relative to the base as i32, a full index must roll,
        # and no offset may reach the i64 log end's limit: all three caps in one number
        # the append path compares against (past it, the request path decides).
        self.last_offset_limit = -1 if self.indexes_full else _offset_limit(self.base_offset)

    @property
    def indexes_full(self) -> bool:
        offset_index, time_index = self._offset_index, self._time_index
        if offset_index is None or time_index is None:
            return False  # not mapped yet: a lazily opened segment is sealed and takes no appends
        return offset_index.is_full or time_index.is_full

    # -- loading -----------------------------------------------------------------
    def rebuild(
        self,
        *,
        validate: bool,
        on_batch: Callable[[int, RecordBatch], None] | None = None,
        first_base_offset: int | None = None,
        client_only: bool = False,
        keep_txn_index: bool = False,
        tail_scan: TailScan | None = None,
    ) -> CorruptRecordError | None:
        """Rescan the whole file, rebuilding both indexes and the in-memory state.

        With `validate`, each batch's CRC is checked too. Scanning stops at the first
        bad or truncated batch, which is returned (not raised): whether it is a torn
        tail to cut or corruption to report is the loader's decision. `size` then
        ends at the last good batch. The transaction index is emptied too, for the
        caller to refill from the markers it replays, unless `keep_txn_index`.

        Given `tail_scan` (the compiled loop, with validation), it takes the common
        batches a chunk at a time and hands their rows to its `on_rows`; every batch
        it leaves (a marker, a transactional batch, anything that fails a check) goes
        through the loop below and `on_batch`, one at a time, as without it.
        """
        self.offset_index.reset()
        self.time_index.reset()
        if not keep_txn_index:
            self.txn_index.reset()  # the loader re-adds the ABORT markers it replays from this segment
        self._update_last_offset_limit()
        # Past data_end the file reads as zeros (space reserved ahead and never written, which
        # a crash leaves behind): the scan would stop there, so it need not read that far.
        size_on_disk = min(self._handle.size(), self._handle.data_end(0))
        self.size = 0
        self.next_offset = self.base_offset
        self.max_timestamp_ms = fmt.NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_timestamp_ms = None
        self.bytes_since_last_index_entry = 0
        checks = _RebuildChecks(validate, first_base_offset, client_only)
        try:
            if tail_scan is None or not validate:
                self._rebuild_batches(0, size_on_disk, checks, on_batch, one=False)
                return None
            position = 0
            while position < size_on_disk:
                position = self._scan_compiled(tail_scan, position, size_on_disk, checks)
                if position < size_on_disk:
                    position = self._rebuild_batches(position, size_on_disk, checks, on_batch, one=True)
        except CorruptRecordError as exc:
            if exc.path is None:
                return CorruptRecordError(str(exc), path=self.path, position=self.size)
            return exc
        return None

    def _scan_compiled(self, tail_scan: TailScan, position: int, end: int, checks: _RebuildChecks) -> int:
        """Where the compiled loop stopped, from `position`: the end, or a batch it leaves.

        It reads with pread, a chunk at a time, as the reference loop does: a read error
        is an OSError (through a mapping it would be SIGBUS)."""
        while position < end:
            wanted = min(TAIL_SCAN_CHUNK_BYTES, end - position)
            chunk = self._handle.pread(wanted, position)
            taken, used, stop = tail_scan.scan(
                chunk,
                position,
                self.cursor,
                self.offset_index.cursor,
                self.time_index.cursor,
                client_only=checks.client_only,
                first_base_offset=-1 if checks.first_base_offset is None else checks.first_base_offset,
            )
            assert 0 <= used <= len(chunk) and self.size == position + used, (self.path, position, used)
            if taken:
                tail_scan.on_rows(taken)
            if self.indexes_full:
                self._update_last_offset_limit()
            position += used
            if stop != TAIL_SCAN_ROWS_FULL and (stop == TAIL_SCAN_PYTHON or taken == 0):
                break  # the batch there goes through the reference loop
            if len(chunk) < wanted:
                break  # the file ended early: the reference loop says where and how
        return position

    def _rebuild_batches(
        self,
        start: int,
        end: int,
        checks: _RebuildChecks,
        on_batch: Callable[[int, RecordBatch], None] | None,
        *,
        one: bool,
    ) -> int:
        """The reference loop from `start`: every batch to the end (or `one`); where it stopped."""
        cursor = self._cursor_view
        for position, batch in scan_file(self._handle, start, end):
            if checks.validate:
                batch.validate()
            h = batch.header  # fields at C speed: this loop is recovery's hot path
            prev_last_offset = cursor[_NEXT_OFFSET] - 1
            last_offset = h.base_offset + h.last_offset_delta
            if h.base_offset <= prev_last_offset or last_offset < h.base_offset:
                raise CorruptRecordError(
                    f"offsets {h.base_offset}..{last_offset} do not follow {prev_last_offset}"
                )
            if last_offset - self.base_offset > fmt.INT32_MAX:
                # A segment rolls before its offsets leave the index's i32 (baseOffset is outside
                # the CRC: a flipped bit there shows as this).
                raise CorruptRecordError(
                    f"offset {last_offset} is past what a segment based at {self.base_offset} can hold"
                )
            if checks.client_only:
                check_client_appended(batch, prev_last_offset if position > 0 else None)
            first_base_offset = checks.first_base_offset
            if position == 0 and first_base_offset is not None and h.base_offset != first_base_offset:
                raise CorruptRecordError(
                    f"first batch starts at offset {h.base_offset}, not at the segment's "
                    f"base {first_base_offset}"
                )
            size = h.batch_length + fmt.LOG_OVERHEAD
            self._index_batch(position, BatchMeta(last_offset, h.max_timestamp, size))
            cursor[_SIZE] = position + size
            if on_batch is not None:
                on_batch(position, batch)
            if one:
                return position + size
        return end

    def load_from_indexes(self, next_base_offset: int | None, *, client_only: bool = False) -> bool:
        """Trust the indexes of a segment closed cleanly; False if they fail a sanity check.

        A sealed segment ends where the next one starts, so nothing is read. The
        active one (`next_base_offset` None) reads only its tail after the last
        offset index entry, at most about `index_interval_bytes` plus a batch, and
        checks it as an unclean open would (`client_only`: the log holds only client
        appends, so no batch may look otherwise: client_append_problem).
        """
        last_entry = self.offset_index.last_entry()
        last_time = self.time_index.last_entry()
        entries = self.offset_index.entries
        # An entry at or past the end, or a time entry in an empty segment: the .log was
        # cut or emptied behind the index's back. A time entry comes with the first offset
        # entry, and with a close or seal of stamped batches: without one, none is stamped
        # (-1), which is checked below, or the time index was lost.
        if (entries and last_entry.position >= self.size) or (self.size == 0 and last_time is not None):
            return False
        if last_time is None and entries:
            return False
        # The first batch (position 0, offset base) never gets an entry, so a real
        # entry points past both; anything else is a damaged index.
        if entries and (last_entry.position <= 0 or last_entry.offset <= self.base_offset):
            return False
        end = next_base_offset
        if end is not None and last_entry.offset >= end:
            return False
        if last_time is not None:
            if last_time.offset < self.base_offset or (end is not None and last_time.offset >= end):
                return False
            self.max_timestamp_ms, self.offset_of_max_timestamp = last_time
        if end is not None:
            # A sealed segment's newest timestamp is its last time entry's, and retention
            # deletes by it: a flipped bit must not pass for it (Kafka trusts the entry).
            unstamped = TimestampOffset(fmt.NO_TIMESTAMP, self.base_offset)
            if self.size and not self._time_entry_matches_log(last_time or unstamped):
                return False
            self.next_offset = end
            return True
        closed_at = None  # the close's time entry, if there is one
        if last_time is not None and (not entries or last_time.offset > last_entry.offset):
            closed_at = last_time
            # The close's time entry (an indexed batch's comes with its offset entry, at or
            # below it): dropped, as an unclean open's rebuild has none, so both fill the
            # index alike; the next entry takes its slot. The tail walk finds what it held.
            self.time_index.drop_last_entry()
            self._update_last_offset_limit()  # (the index may no longer be full)
            before = self.time_index.last_entry()
            self.max_timestamp_ms, self.offset_of_max_timestamp = (
                before if before is not None else (fmt.NO_TIMESTAMP, self.base_offset)
            )
        self.next_offset = self.base_offset
        # The tail is short, so check it fully: bytes appended behind a clean close's back
        # must not slip in unvalidated. The batch the last entry names must be there, with
        # the last offset the entry gives.
        checks = TailChecks(
            first_base_offset=None if entries or not client_only else self.base_offset,
            first_last_offset=last_entry.offset if entries else None,
            client_only=client_only,
            segment_base_offset=self.base_offset,
            # A batch that would have been indexed: entries were dropped (a full index takes none).
            index_interval_bytes=None if self.indexes_full else self.index_interval_bytes,
        )
        if not self._walk_clean_tail(last_entry.position, checks):
            return False
        if last_time is not None and last_time.offset >= self.next_offset:
            return False  # a time entry past the batches
        if last_time is None and self.max_timestamp_ms != fmt.NO_TIMESTAMP:
            return False  # stamped batches, and no time entry: the time index was lost
        if closed_at is not None and closed_at != (self.max_timestamp_ms, self.offset_of_max_timestamp):
            return False  # the close wrote the newest timestamp there, and the batches disagree
        # As appending left it: the bytes from the last indexed batch's start.
        self.bytes_since_last_index_entry = self.size - last_entry.position
        if self.size:
            self.first_batch_timestamp_ms = self._first_batch_timestamp()
        return True

    def _time_entry_matches_log(self, entry: TimestampOffset) -> bool:
        """Whether a sealed segment's last time entry holds its newest timestamp, as far as
        a few batch headers tell: the batch it names ends at its offset with its timestamp
        (a flipped bit fails this), and no batch after the last offset entry is newer (a
        lost or zeroed last entry leaves an older one last). Without timestamps (-1) the
        entry names the base offset, not a batch's last (none was ever newer)."""
        timestamp_ms, offset = entry
        if timestamp_ms != fmt.NO_TIMESTAMP:
            named = self._last_batch_header_up_to(offset, start=self.offset_index.lookup(offset).position)
            if named is None or named[0] + named[6] != offset or named[8] != timestamp_ms:
                return False
        newest = fmt.NO_TIMESTAMP
        for header in self._headers_from(self.offset_index.last_entry().position, to_end=True):
            if header is None:
                return False
            newest = max(newest, int(header[8]))
        return newest <= timestamp_ms

    def _last_batch_header_up_to(self, last_offset: int, *, start: int) -> tuple[Any, ...] | None:
        """The header of the first batch from `start` whose last offset is `last_offset` or
        more; None if there is none."""
        for header in self._headers_from(start, to_end=False):
            if header is None or header[0] + header[6] >= last_offset:
                return header
        return None

    # Batch headers a check reads one at a time past its first read, at most.
    _HEADER_READS_MAX = 64

    def _headers_from(self, start: int, *, to_end: bool) -> Iterator[tuple[Any, ...] | None]:
        """The headers of the batches from `start` (a position an index entry gave) on:
        one read reaching an index interval past it, then a read per header (not
        scan_file, which reads every batch whole: a check of 1 MiB batches would read
        them all). None last if
        one is not a batch's (or `to_end` and they do not end at the segment's end, or
        more than _HEADER_READS_MAX more reads would be needed: then what is known ends)."""
        size, header_bytes = self.size, fmt.HEADER_SIZE
        if not 0 <= start <= size:
            yield None  # a damaged index entry
            return
        nearby = self._handle.pread(min(size - start, self.index_interval_bytes + header_bytes), start)
        position, reads = start, 0
        while position + header_bytes <= size:
            at = position - start
            raw = nearby[at : at + header_bytes]
            if len(raw) < header_bytes:
                reads += 1
                if reads > self._HEADER_READS_MAX:
                    return  # (no verdict: a tail this long is not what appending leaves)
                raw = self._handle.pread(header_bytes, position)
                if len(raw) < header_bytes:
                    break
            header = fmt.HEADER_STRUCT.unpack_from(raw)
            if header[1] < MIN_BATCH_LENGTH or header[3] != fmt.MAGIC_V2:
                break
            yield header
            position += header[1] + fmt.LOG_OVERHEAD
        if position != size or not to_end:
            yield None

    def _walk_clean_tail(self, start: int, checks: TailChecks) -> bool:
        """load_from_indexes' check of the bytes from `start` to the end (walk_whole_batches),
        applied; False if they fail it. In one read up to CLEAN_TAIL_READ_BYTES, else
        batch by batch (a scan's chunks: memory stays bounded), with the same checks."""
        length = self.size - start
        if length <= CLEAN_TAIL_READ_BYTES:
            tail = self._handle.pread(length, start)
            walked = walk_whole_batches(
                tail, self.next_offset, self.max_timestamp_ms, self.offset_of_max_timestamp, checks
            )
            if walked is None or len(tail) != length:
                return False
            self.next_offset, self.max_timestamp_ms, self.offset_of_max_timestamp = walked
            return True
        for position, batch in self.scan(start):
            # Past the first batch: each starts right after the one before (client
            # appends), or at least after it.
            interval = checks.index_interval_bytes
            if interval is not None and position - start > interval:
                return False  # (as walk_whole_batches: an index entry was dropped)
            batch_checks = (
                checks
                if position == start
                else TailChecks(
                    self.next_offset if checks.client_only else None,
                    None,
                    checks.client_only,
                    checks.segment_base_offset,
                )
            )
            walked = walk_whole_batches(
                batch.buffer,
                self.next_offset,
                self.max_timestamp_ms,
                self.offset_of_max_timestamp,
                batch_checks,
            )
            if walked is None:
                return False
            self.next_offset, self.max_timestamp_ms, self.offset_of_max_timestamp = walked
        return True

    def _first_batch_timestamp(self) -> int:
        header = self._handle.pread(fmt.HEADER_SIZE, 0)
        return int(fmt.HEADER_STRUCT.unpack_from(header)[8])

    def delete(self) -> None:
        """Close and remove the segment's files."""
        paths = [
            self.path,
            _index_path(self.directory, self.base_offset, INDEX_SUFFIX),
            _index_path(self.directory, self.base_offset, TIME_INDEX_SUFFIX),
            self.txn_index.path,
        ]
        # Read before the file goes: a reader still holding this segment may ask. (A file
        # already gone has no size to keep, and is deleted all the same.)
        with contextlib.suppress(CorruptLogError):
            self.size  # noqa: B018
        self.close(durable=False)
        for path in paths:
            if self.fs.exists(path):
                self.fs.unlink(path)
        # fsync(dir): a deleted segment must not reappear after a crash and be replayed.
        self.fs.fsync_dir(self.directory)

    def newest_timestamp_ms(self) -> int:
        """The largest batch timestamp in the segment (mapping a lazy segment's time index)."""
        if self._offset_index is None and not self._max_timestamp_known:
            self._load_lazy_indexes()  # a lazily opened segment learns its max timestamp there
        return self.max_timestamp_ms

    def age_reference_ms(self) -> int:
        """What retention ages the segment by: its newest batch timestamp or, when no batch
        is stamped (-1), when its file was last written, as Kafka does; -1 if unknown."""
        newest = self.newest_timestamp_ms()
        return newest if newest != fmt.NO_TIMESTAMP else self.fs.modified_ms(self.path)

    def batch_start_at_or_after(self, offset: int) -> tuple[int, int]:
        """(position, kept end): where the first batch whose last offset is at or after
        `offset` starts (the size when none does), and the offset after the batches before
        it (the segment's base when there are none).

        Truncation cuts there, so a cut that falls inside a batch takes the whole batch.
        The kept end is the next batch's base offset unless a leader's log has a gap
        there (compaction): then it is below it, and it is what the log ends at, what
        recovery finds the kept batches end at.
        """
        entry = self.offset_index.lookup(offset - 1)  # a batch wholly before `offset`, or the start
        kept_end = self.base_offset
        for position, batch in scan_file(self._handle, entry.position, self.size):
            if batch.last_offset >= offset:
                return position, kept_end
            kept_end = batch.last_offset + 1
        return self.size, kept_end

    def cut_at(self, position: int, next_offset: int) -> None:
        """Cut the segment at a batch boundary: file, indexes and transaction index, then fsync."""
        assert 0 <= position <= self.size, (self.path, position, self.size)
        self.size = position
        self.next_offset = next_offset
        self.truncate_to_size()
        # fsync: the cut must stay cut, or a crash brings back the batches a follower dropped.
        self._handle.fsync()

    def trailing_zero_bytes(self) -> int:
        """How many of the bytes past the logical end are a run of zeros at the end of the file.

        That run is pre-allocated space never written (or pages a power loss left
        unwritten), not damage; the bytes before it are a torn or garbage tail.
        Read backwards a chunk at a time, so the cost follows the run's length.
        """
        on_disk = self._handle.size()
        # Past data_end the file reads as zeros (space allocated ahead, never written): unread.
        end = max(self.size, min(on_disk, self._handle.data_end(self.size)))
        while end > self.size:
            start = max(self.size, end - _ZERO_SCAN_BYTES)
            chunk = self._handle.pread(end - start, start)
            if chunk == _ZERO_CHUNK[: len(chunk)]:
                end = start
                continue
            # Page-sized compares against zeros (memcmp) from the end, then a
            # byte-wise strip of the one page that holds the last non-zero byte.
            stop = len(chunk)
            while stop > 0:
                page_start = max(0, stop - _ZERO_PAGE_BYTES)
                page = chunk[page_start:stop]
                if page != _ZERO_PAGE[: len(page)]:
                    return on_disk - (start + page_start + len(page.rstrip(b"\0")))
                stop = page_start
            end = start
        return on_disk - self.size

    def truncate_to_size(self) -> int:
        """Cut the file at the logical size; returns the bytes removed."""
        on_disk = self._handle.size()
        self._release_mapping()
        if on_disk > self.size:
            self._handle.truncate(self.size)
        self.offset_index.truncate_to_position(self.size)
        self.time_index.truncate_to_offset(self.next_offset)
        self.txn_index.truncate_to(self.next_offset)
        # Counted from the last entry kept, as appending left it: the next entry lands
        # where an unclean open's rebuild would put it (and a clean open expects it).
        self.bytes_since_last_index_entry = self.size - self.offset_index.last_entry().position
        self._update_last_offset_limit()
        return on_disk - self.size

    # -- reads -------------------------------------------------------------------
    def scan(self, start_position: int = 0, end_position: int | None = None) -> Iterator[ScannedBatch]:
        """Batches between two positions (default: the whole segment), headers only."""
        end = self.size if end_position is None else end_position
        return scan_file(self._handle, start_position, end)

    def read(
        self, start_offset: int, max_bytes: int, max_offset: int | None = None, *, contiguous: bool = False
    ) -> list[ScannedBatch]:
        """Whole batches (with their positions) from the one holding `start_offset`.

        At most about `max_bytes`, but at least one batch when any qualifies, even
        if it alone is larger, so a reader always makes progress. Batches whose
        last offset reaches `max_offset` are left out.

        `contiguous` (a log written only by client appends): every batch walked,
        the skipped ones before `start_offset` included, must start right after
        the one before it, the first where the index entry says. baseOffset is
        outside the CRC, so a flipped bit there would otherwise pass as a batch
        at other offsets. Raises CorruptRecordError naming the position.
        """
        end = self.size
        entry = self.offset_index.lookup(start_offset)
        out: list[ScannedBatch] = []
        taken = 0
        chunk = self.index_interval_bytes + max_bytes + fmt.HEADER_SIZE
        # The walk starts at a batch whose last offset is the entry's (or at the segment's first batch).
        expected_last = entry.offset if entry.position > 0 else None
        expected_base = self.base_offset if entry.position == 0 else None

        def take_at_most() -> int | None:
            # Once a batch is taken, only what still fits is read (and the next header):
            # reading a chunk to look at the batch after the limit, only to drop it, cost
            # a fetch a megabyte of fresh memory per partition.
            return max_bytes - taken if out else None

        for scanned in scan_file(self._handle, entry.position, end, chunk, take_at_most):
            h = scanned.batch.header
            last_offset = h.base_offset + h.last_offset_delta
            if contiguous:
                if (expected_base is not None and h.base_offset != expected_base) or (
                    expected_last is not None and last_offset != expected_last
                ):
                    raise CorruptRecordError(
                        f"batch claims offsets {h.base_offset}..{last_offset}, but the batches around it "
                        f"place it at {expected_base if expected_base is not None else '?'}.."
                        f"{expected_last if expected_last is not None else '?'}",
                        path=self.path,
                        position=scanned.position,
                    )
                expected_base, expected_last = last_offset + 1, None
            if last_offset < start_offset:
                continue
            if max_offset is not None and last_offset >= max_offset:
                break
            size = h.batch_length + fmt.LOG_OVERHEAD
            if out and taken + size > max_bytes:
                break
            out.append(scanned)
            taken += size
            if taken >= max_bytes:
                break
        return out

    def find_offset_for_timestamp(self, timestamp_ms: int) -> TimestampOffset | None:
        """The first record with a timestamp at or after `timestamp_ms`, if any."""
        if self._max_timestamp_known and self.max_timestamp_ms < timestamp_ms:
            return None  # (a sealed segment's known from an earlier use: its indexes stay unmapped)
        time_index = self.time_index  # maps a lazy segment's indexes, and so reads its max timestamp
        if self.max_timestamp_ms < timestamp_ms:
            return None
        hint = time_index.lookup_before(timestamp_ms)
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
        """fdatasync the segment file.

        The active segment's indexes are not fsynced here: after a crash the loader
        rebuilds them from the log, and trim() (on seal and close) makes them
        durable exactly when a later open will trust them.
        """
        # Cleared first: an append racing this fsync (group commit runs it outside the
        # log's lock) sets it again, and the next flush covers that append.
        self.unflushed = False
        # fdatasync: without it a power loss may drop batches acknowledged as durable. Data
        # only: the blocks and the size (reserved ahead) are data to it; the times are not.
        self._handle.fdatasync()

    def seal(self) -> None:
        """Called when the segment stops being active: trim the file, final time entry, trim indexes."""
        self.cursor[cur.SEG_WRITE_FD] = -1  # no more appends: the compiled path writes nothing here
        if self._handle.size() > self.size or self._write_region is not None:
            self._trim_file()
            # fsync: the cut pre-allocated space must stay cut once the recovery point
            # passes this segment, or a clean open would take the zeros as batches.
            self._handle.fsync()
            self.unflushed = False
        # fsync: the recovery point is about to pass this segment, and recovery rebuilds
        # only the tail's transaction index; a lost entry would serve aborted data.
        self.txn_index.flush()
        self.txn_index.close()  # its entries stay in memory; a sealed segment keeps no descriptor
        offset_index, time_index = self._offset_index, self._time_index
        if (
            offset_index is not None
            and time_index is not None
            and not (offset_index.is_sealed and time_index.is_sealed)
        ):
            if self.max_timestamp_ms != fmt.NO_TIMESTAMP:
                time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)
            offset_index.trim()
            time_index.trim()
        self.park_descriptor()

    def unmap_sealed_indexes(self) -> None:
        """Unmap a sealed segment's indexes (mapped again on next use). The owner calls this
        between operations, never while one is using them."""
        offset_index, time_index = self._offset_index, self._time_index
        if (
            offset_index is None
            or time_index is None
            or not (offset_index.is_sealed and time_index.is_sealed)
        ):
            return
        self._offset_index = self._time_index = None
        offset_index.close(trim=False)
        time_index.close(trim=False)

    def park_descriptor(self) -> None:
        """For a segment that takes no more appends (sealed, or about to be validated and
        sealed): its `.log` descriptor joins the bounded file cache, to be closed when the
        cache needs room and opened again by the next read."""
        self.cursor[cur.SEG_WRITE_FD] = -1  # the compiled path never writes to a parked file
        if not isinstance(self._handle, CachedFile):
            self._handle = CachedFile.adopting(self.fs, self._handle)

    def close(self, *, durable: bool = True) -> None:
        """Close the files; `durable` also writes the final time entry and trims the indexes.

        A failed log closes with durable=False: no fsync is attempted, and the
        next open rebuilds what it cannot trust.
        """
        self.cursor[cur.SEG_WRITE_FD] = -1  # the descriptor is about to close (and its number be reused)
        try:
            self._release_mapping()
            # (A trusted segment whose size was never read was never touched: nothing to trim.)
            if durable and self._cursor_view[_SIZE] >= 0 and self._handle.size() > self.size:
                self._trim_file()
                # fsync: the clean-shutdown marker promises the file ends at its last batch.
                self._handle.fsync()
            if self._offset_index is not None and self._time_index is not None:
                if durable and not self._time_index.is_sealed and self.max_timestamp_ms != fmt.NO_TIMESTAMP:
                    # For a reader that takes the newest timestamp from the index (Kafka's
                    # clean load does); this module's next clean open drops it again.
                    self._time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)
                self._offset_index.close(trim=durable)
                self._time_index.close(trim=durable)
        finally:
            try:
                if durable:
                    # fsync: the clean-shutdown marker promises every index is on disk.
                    self.txn_index.flush()
            finally:
                self.txn_index.close()
                self._handle.close()

    def __repr__(self) -> str:
        return f"LogSegment({self.path}, base={self.base_offset}, next={self.next_offset}, size={self.size})"
