"""Sparse offset and time indexes, memory-mapped, in Kafka's on-disk layout.

- `.index`: 8-byte entries (relative offset of a batch's last offset i32, file
  position of that batch i32).
- `.timeindex`: 12-byte entries (max timestamp so far i64, relative offset i32).

While the segment is active an index is written through a shared mapping of space
reserved ahead of its entries (see reservation: a mapped write to a block never
reserved is SIGBUS on a full disk), in steps up to `max_index_bytes`, and trimmed to
its entries when the segment is closed or rolled, as Kafka does, so a closed index's
size is its entry count. A sealed index is mapped read-only; so is an active one as a
clean close left it, but only once first read or written (its open reads just the last
entry). Neither keeps a descriptor: the file is opened for each change of its size or
mapping and closed again (a mapping outlives its descriptor), so a log of many segments
holds no index files open; what a mapping holds is page cache, which the kernel
reclaims. A reserved file left by a crash has a zero-filled tail, found by binary
search; the loader rebuilds the active segment's indexes after a crash anyway, and
sanity-checks a sealed one's last entry (as Kafka does) rather than reading every entry.

Lookups binary-search the mapped bytes with struct, because numpy's searchsorted on
big-endian fields would first copy the whole column.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from typing import NamedTuple

from oncelog.segments import cursor as cur
from oncelog.segments.errors import out_of_descriptors
from oncelog.segments.files import FileHandle, MappedRegion, SegmentFileSystem
from oncelog.segments.reservation import next_reservation

# An active index's file is reserved in steps (see reservation): the first one page,
# each next one as large as the file so far, at most this much at a time.
INDEX_MIN_GROW_BYTES = 4096
INDEX_MAX_GROW_BYTES = 1024 * 1024


class OffsetPosition(NamedTuple):
    offset: int
    position: int


class TimestampOffset(NamedTuple):
    timestamp_ms: int
    offset: int


class IndexFullError(Exception):
    """Internal: the caller must roll the segment before appending another entry."""


class _MappedIndex:
    ENTRY = struct.Struct(">ii")
    # The scalars the compiled append shares, in the cursor array (segments.cursor).
    _entries = cur.CursorField[int](cur.IDX_ENTRIES)
    _max_entries = cur.CursorField[int](cur.IDX_MAX_ENTRIES)
    # Entries the file (and the mapping) holds; all reserved when it is writable.
    _capacity = cur.CursorField[int](cur.IDX_CAPACITY)

    def __init__(
        self, fs: SegmentFileSystem, path: str, base_offset: int, max_index_bytes: int, *, sealed: bool
    ):
        """Open (creating) an index file.

        A sealed segment's index is mapped read-only at its size: opening a log of many
        segments then costs no truncates and reserves nothing. An active one takes
        entries up to `max_index_bytes`, each written through a writable mapping over
        reserved blocks, reserved in steps. Opened as a clean close left it (its size its
        entries), it stays mapped read-only until its first entry: an idle partition
        reserves nothing and maps nothing twice, and reopening 10,000 of them neither
        allocates blocks a close freed nor waits for them (a third of an index's open).
        """
        self.path = path
        self._fs = fs
        self.base_offset = base_offset
        self.max_index_bytes = max_index_bytes
        self.cursor = cur.new_cursor(cur.IDX_FIELDS)
        self._cursor_view = cur.cursor_view(self.cursor)
        self._region: MappedRegion | None = None
        self._view: memoryview = memoryview(b"")
        self.is_sealed = True
        # The entry before the last, as the unmapped open read it (drop_last_entry).
        self._before_last: tuple[int, int] | None = None
        try:
            handle = self._open_handle(create=True)  # (not _opened: its generator is paid at every open)
            try:
                if not sealed and self._open_unmapped(handle):
                    self._writable_on_first_entry()
                    return
                entries_on_disk = handle.size() // self.ENTRY.size
                self._map(handle, entries_on_disk, writable=False)
                self.max_entries = entries_on_disk
                self.entries = self._entries_before_zero_tail(entries_on_disk)
                if not sealed:
                    if self.entries == entries_on_disk:
                        self._writable_on_first_entry()
                    else:
                        self._make_writable(handle)  # (a crash's zero tail: the map covers it)
            finally:
                handle.close()
        except BaseException:
            # A full disk while reserving: nothing stays mapped.
            self._unmap()
            raise

    def _open_unmapped(self, handle: FileHandle) -> bool:
        """Take an active index as a clean close left it (whole entries, the last one not
        zero) from one read of its last two entries, and map it only when first read or
        written: an idle partition's open then maps neither index (a third of its
        segment's open). False, with nothing changed, for anything else (a crash's zero
        tail, a torn entry)."""
        size = handle.size()
        entry_bytes = self.ENTRY.size
        if size % entry_bytes:
            return False
        entries = size // entry_bytes
        last = (0, 0)
        if entries:
            read_bytes = entry_bytes * min(entries, 2)
            raw = handle.pread(read_bytes, size - read_bytes)
            if len(raw) != read_bytes:
                return False
            last = self.ENTRY.unpack_from(raw, read_bytes - entry_bytes)
            if not any(last) and not self._zero_entry_is_real(entries):
                return False
            if entries > 1:
                self._before_last = self.ENTRY.unpack_from(raw)
        self._capacity = entries
        self.max_entries = entries
        c = self._cursor_view
        c[cur.IDX_ENTRIES], (c[cur.IDX_LAST_FIRST], c[cur.IDX_LAST_SECOND]) = entries, last
        return True

    def _readable_view(self) -> memoryview:
        """The mapped entries, mapping them read-only first if the open left them unmapped."""
        if self._region is None and self._capacity:
            with self._opened() as handle:
                self._map(handle, self._capacity, writable=False)
        return self._view

    @contextlib.contextmanager
    def _opened(self, *, create: bool = False) -> Iterator[FileHandle]:
        """The index file, open only for the change being made."""
        handle = self._open_handle(create=create)
        try:
            yield handle
        finally:
            handle.close()

    def _open_handle(self, *, create: bool) -> FileHandle:
        try:
            return self._fs.open(self.path, create=create)
        except OSError as exc:
            named = out_of_descriptors(exc, "reopening an index", self.path)
            if named is exc:
                raise
            raise named from exc

    def _map(self, handle: FileHandle, capacity: int, *, writable: bool) -> None:
        """Map the first `capacity` entries, cutting or extending the file to exactly them."""
        self._unmap()
        size = capacity * self.ENTRY.size
        if handle.size() != size:
            handle.truncate(size)
        self._capacity = capacity
        if capacity:
            self._region = handle.mmap(size, writable=writable)
            self._view = self._region.buffer
            if writable:
                self.cursor[cur.IDX_ADDR] = cur.mapped_address(self._view)

    def _reserve(self, needed: int, limit: int, handle: FileHandle | None = None) -> None:
        """Map the file writable over at least `needed` entries (`limit` at most), reserved first.

        The blocks are reserved while the old mapping is still in place, so a full disk
        (OSError) leaves the index as it was.
        """
        if handle is None:
            with self._opened() as opened:
                self._reserve(needed, limit, opened)
            return
        capacity = self._capacity
        if needed > capacity:
            entry = self.ENTRY.size
            capacity = next_reservation(
                capacity, needed, limit, INDEX_MIN_GROW_BYTES // entry, INDEX_MAX_GROW_BYTES // entry
            )
        if capacity:
            handle.allocate(capacity * self.ENTRY.size)
        self._map(handle, capacity, writable=True)

    def _writable_on_first_entry(self) -> None:
        """Active, still mapped read-only at exactly its entries: the first entry (or
        reserve_room) finds no capacity, or no writable mapping, and reserves."""
        assert self._capacity == self._entries, (self.path, self._capacity, self._entries)
        self.max_entries = max(self.max_index_bytes // self.ENTRY.size, self._capacity)
        self.is_sealed = False

    @property
    def _mapped_writable(self) -> bool:
        return bool(self._cursor_view[cur.IDX_ADDR])

    def _make_writable(self, handle: FileHandle | None = None) -> None:
        """Ready the index for appends: up to `max_index_bytes` of entries, reserved in steps."""
        max_entries = max(self.max_index_bytes // self.ENTRY.size, self._capacity)
        self._reserve(min(self._entries + 1, max_entries), max_entries, handle)
        self.max_entries = max_entries
        self.is_sealed = False

    def reserve_room(self, count: int) -> None:
        """Reserve blocks for `count` more entries (as many as the index takes), so
        appending them cannot fail."""
        needed = min(self._entries + count, self._max_entries)
        if needed > self._capacity or not self._mapped_writable:
            self._reserve(needed, self._max_entries)

    def _entries_before_zero_tail(self, entries: int) -> int:
        """Entries before a zero-filled tail (a pre-allocated file left by a crash).

        Binary search: the zeros are a suffix, and no real entry is all zeros but a
        time index's lone first one (`_zero_entry_is_real`). O(log n), so opening a log
        does not cost a pass over every index.
        """
        if not entries or any(self._entry(entries - 1)) or self._zero_entry_is_real(entries):
            return entries  # no zero tail (every index a clean close left): one read
        lo, hi = 0, entries - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if any(self._entry(mid)):
                lo = mid + 1
            else:
                hi = mid
        return lo

    # Whether an index's first entry may be all zeros (see TimeIndex).
    FIRST_ENTRY_MAY_BE_ZERO = False

    def _zero_entry_is_real(self, entries: int) -> bool:
        """Whether a file of `entries` entries ending in an all-zero one holds it for real:
        only a lone first entry, in a file trimmed to it (a close or seal trims; a crash
        leaves a reservation of 4 entries or more)."""
        return self.FIRST_ENTRY_MAY_BE_ZERO and entries == 1

    def _entry(self, n: int) -> tuple[int, int]:
        first, second = self.ENTRY.unpack_from(self._readable_view(), n * self.ENTRY.size)
        return int(first), int(second)

    max_entries = _max_entries

    @property
    def entries(self) -> int:
        return self._entries

    @entries.setter
    def entries(self, value: int) -> None:
        # Entries dropped (a cut, a reset): the last one's fields come from the mapping again.
        self._entries = value
        if value:
            c = self._cursor_view
            c[cur.IDX_LAST_FIRST], c[cur.IDX_LAST_SECOND] = self._entry(value - 1)

    def drop_last_entry(self) -> None:
        """Forget the last entry: the next one takes its slot. Read from the mapping, or
        as the unmapped open read it (an idle partition's open maps nothing)."""
        n = self._entries
        assert n, self.path
        if self._region is not None or n == 1:
            self.entries = n - 1
            return
        assert self._before_last is not None and not self._mapped_writable, self.path
        c = self._cursor_view
        c[cur.IDX_ENTRIES], (c[cur.IDX_LAST_FIRST], c[cur.IDX_LAST_SECOND]) = n - 1, self._before_last
        self._before_last = None

    @property
    def is_full(self) -> bool:
        # One slot stays free for the entry written when the segment is sealed.
        c = self._cursor_view
        return bool(c[cur.IDX_ENTRIES] >= c[cur.IDX_MAX_ENTRIES] - 1)

    def _last_entry_fields(self) -> tuple[int, int] | None:
        """The last entry's two fields, kept in the cursor by both append paths: every
        append compares against them."""
        c = self._cursor_view
        return (c[cur.IDX_LAST_FIRST], c[cur.IDX_LAST_SECOND]) if c[cur.IDX_ENTRIES] else None

    def _append(self, first: int, second: int) -> None:
        n = self._entries
        if n >= self._capacity or not self._mapped_writable:
            if n >= self._max_entries:
                raise IndexFullError(self.path)
            # Reserve more first: on a full disk an OSError here, not SIGBUS at the write below.
            self._reserve(n + 1, self._max_entries)
        self.ENTRY.pack_into(self._view, n * self.ENTRY.size, first, second)
        c = self._cursor_view
        c[cur.IDX_ENTRIES], c[cur.IDX_LAST_FIRST], c[cur.IDX_LAST_SECOND] = n + 1, first, second

    def _floor(self, key: int, strict: bool) -> int:
        """Index of the last entry whose first field is <= key (< key if strict); -1 if none."""
        lo, hi = 0, self.entries
        unpack = self.ENTRY.unpack_from
        size = self.ENTRY.size
        view = self._readable_view()
        while lo < hi:
            mid = (lo + hi) // 2
            probe = unpack(view, mid * size)[0]
            if probe < key or (not strict and probe == key):
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    def reset(self) -> None:
        """Drop every entry, ready to be rebuilt (a sealed index is made writable again)."""
        if self.is_sealed:
            self._make_writable()
        self.entries = 0

    def _unmap(self) -> None:
        if self._region is not None:
            self.cursor[cur.IDX_ADDR] = 0  # before the unmap: the compiled path writes through it
            self._view = memoryview(b"")
            self._region.close()
            self._region = None

    def trim(self) -> None:
        """Shrink the file to its entries, durably; the index takes no more appends.

        Done when a segment is sealed, so a closed index's size is its entry count,
        as in Kafka.
        """
        with self._opened() as handle:
            self._map(handle, self.entries, writable=False)
            self.max_entries = self.entries
            self.is_sealed = True
            # fsync: a crash must not bring back the zero-filled reserved tail, and on
            # Linux it also writes back the entries written through the mapping.
            handle.fsync()

    def close(self, *, trim: bool = True) -> None:
        """Trim the file to its entries (unless `trim` is False) and unmap."""
        try:
            if trim and not self.is_sealed:
                self.trim()
        finally:
            self._unmap()


class OffsetIndex(_MappedIndex):
    ENTRY = struct.Struct(">ii")

    def append(self, last_offset: int, position: int) -> None:
        rel = last_offset - self.base_offset
        last = self._last_entry_fields()
        if last is not None:
            prev_rel, prev_pos = last
            # Assert before writing: a non-monotone entry would mislead every lookup.
            assert rel > prev_rel and position > prev_pos, (self.path, rel, position, prev_rel, prev_pos)
        self._append(rel, position)

    def lookup(self, offset: int) -> OffsetPosition:
        """The last entry at or below `offset`; scanning from its position finds `offset`."""
        n = self._floor(offset - self.base_offset, strict=False)
        if n < 0:
            return OffsetPosition(self.base_offset, 0)
        rel, position = self._entry(n)
        return OffsetPosition(self.base_offset + rel, position)

    def last_entry(self) -> OffsetPosition:
        last = self._last_entry_fields()  # (from the cursor: an unmapped index stays unmapped)
        if last is None:
            return OffsetPosition(self.base_offset, 0)
        rel, position = last
        return OffsetPosition(self.base_offset + rel, position)

    def truncate_to_position(self, position: int) -> None:
        """Drop entries that point at or past `position` (the log was cut there)."""
        while self.entries and self._entry(self.entries - 1)[1] >= position:
            self.entries -= 1


class TimeIndex(_MappedIndex):
    ENTRY = struct.Struct(">qi")
    # (0 ms, relative offset 0): the first batch stamped 0 (clients may send it). Any later
    # entry has a larger relative offset, so only the first can be all zeros.
    FIRST_ENTRY_MAY_BE_ZERO = True

    def maybe_append(self, timestamp_ms: int, offset: int) -> None:
        """Add an entry only when the timestamp grows (Kafka's rule)."""
        last = self._last_entry_fields()
        if last is not None and last[0] >= timestamp_ms:
            return
        rel = offset - self.base_offset
        assert rel >= 0, (self.path, offset)
        self._append(timestamp_ms, rel)

    def lookup_before(self, timestamp_ms: int) -> TimestampOffset | None:
        """The last entry with a timestamp strictly below `timestamp_ms`.

        Every batch up to that entry's offset has a max timestamp below the target,
        so a search for the first record at or after the target may start there.
        """
        n = self._floor(timestamp_ms, strict=True)
        if n < 0:
            return None
        ts, rel = self._entry(n)
        return TimestampOffset(ts, self.base_offset + rel)

    def last_entry(self) -> TimestampOffset | None:
        last = self._last_entry_fields()  # (from the cursor: an unmapped index stays unmapped)
        if last is None:
            return None
        ts, rel = last
        return TimestampOffset(ts, self.base_offset + rel)

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries at or past `offset`."""
        while self.entries and self.base_offset + self._entry(self.entries - 1)[1] >= offset:
            self.entries -= 1
