"""Open descriptors of sealed segments: a bounded, least-recently-used cache.

A log keeps its active segment's file open (appends write to it). A sealed segment's
`.log` is opened only when it is read, through a `CachedFile`, and the descriptor is
kept in one process-wide `FileCache` for the next read; when the cache holds
`capacity` descriptors, the least recently used one nobody is using is closed. So the
descriptors a process holds no longer grow with every roll: a broker that rolls for
months stays within its open-files limit, and reading an old segment again costs one
open().

Every call through a `CachedFile` pins its descriptor for the call's length, so an
eviction (from any thread) never closes a descriptor a read or write is using: its
number could otherwise be reused by another open() before the call reached the kernel.
When every descriptor is pinned the cache runs over its capacity for that moment
rather than fail the read.

An eviction closes a descriptor and changes nothing else: the segment that owns the
file may be in use by another thread (its owner's lock is not the evicting thread's).
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Final

from oncelog.segments.errors import out_of_descriptors
from oncelog.segments.files import FileHandle, MappedRegion, SegmentFileSystem
from oncelog.segments.format import Buffer

# The share of the open-files limit the cache may take by default: the rest is for the
# active segments, metadata stores, locks, sockets and the process itself.
DEFAULT_LIMIT_SHARE: Final = 4
MIN_CAPACITY: Final = 8
MAX_DEFAULT_CAPACITY: Final = 4096


def default_capacity(open_files_limit: int | None = None) -> int:
    """A quarter of the soft open-files limit, within [MIN_CAPACITY, MAX_DEFAULT_CAPACITY]."""
    if open_files_limit is None:
        open_files_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if open_files_limit == resource.RLIM_INFINITY:
            return MAX_DEFAULT_CAPACITY
    return max(MIN_CAPACITY, min(open_files_limit // DEFAULT_LIMIT_SHARE, MAX_DEFAULT_CAPACITY))


class FileCache:
    """Descriptors of `CachedFile`s, at most `capacity` open when none is in use."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"a file cache holds at least one descriptor, got capacity {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        # Files holding a descriptor, least recently used first.
        self._open: OrderedDict[CachedFile, None] = OrderedDict()
        self.opens = 0
        self.evictions = 0

    @property
    def open_count(self) -> int:
        return len(self._open)

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's may have been held by a thread the
        child does not have). The descriptors are the child's copies and stay cached."""
        self._lock = threading.Lock()

    def resize(self, capacity: int) -> None:
        """Change the bound; descriptors past it close now (those not in use)."""
        if capacity < 1:
            raise ValueError(f"a file cache holds at least one descriptor, got capacity {capacity}")
        with self._lock:
            self.capacity = capacity
            evicted = self._evict_locked()
        _close_evicted(evicted)

    def acquire(self, file: CachedFile) -> FileHandle:
        """The file's descriptor, opened if needed and pinned until `release`.

        No I/O runs under the cache's lock (opens and closes go through the seam, where the
        torture harness may pause a thread): two threads opening one file at once keep the
        first descriptor and close the other.
        """
        with self._lock:
            handle = file._handle
            if handle is not None:
                if file in self._open:
                    self._open.move_to_end(file)
                file._pins += 1
                return handle
        try:
            opened = file._fs.open(file.path, writable=file.writable)
        except OSError as exc:
            named = out_of_descriptors(exc, "reopening a sealed segment", file.path)
            if named is exc:
                raise
            raise named from exc
        spare: FileHandle | None = None
        with self._lock:
            handle = file._handle
            if handle is None:
                handle = file._handle = opened
                self.opens += 1
                self._open[file] = None
            else:
                spare = opened  # another thread opened it meanwhile
                if file in self._open:
                    self._open.move_to_end(file)
            file._pins += 1
            evicted = self._evict_locked()
        if spare is not None:
            spare.close()
        _close_evicted(evicted)
        return handle

    def release(self, file: CachedFile) -> None:
        with self._lock:
            assert file._pins > 0, file.path
            file._pins -= 1
            evicted = self._evict_locked() if file._pins == 0 else []
        _close_evicted(evicted)

    def adopt(self, file: CachedFile, handle: FileHandle) -> None:
        """Take an already open descriptor (a segment just sealed) as the file's, evictable."""
        with self._lock:
            assert file._handle is None, file.path
            file._handle = handle
            self._open[file] = None
            evicted = self._evict_locked()
        _close_evicted(evicted)

    def discard(self, file: CachedFile) -> FileHandle | None:
        """Stop caching the file; its descriptor, if open, is the caller's to close."""
        with self._lock:
            assert file._pins == 0, f"{file.path} closed while in use"
            self._open.pop(file, None)
            handle, file._handle = file._handle, None
            return handle

    def _evict_locked(self) -> list[tuple[CachedFile, FileHandle]]:
        """Take the least recently used descriptors nobody is using out of the cache, down to
        the capacity; the caller closes them once the lock is released."""
        evicted: list[tuple[CachedFile, FileHandle]] = []
        if len(self._open) <= self.capacity:
            return evicted
        for victim in list(self._open):
            if len(self._open) <= self.capacity:
                break
            if victim._pins:
                continue  # in use: closing it could hand its number to another open()
            del self._open[victim]
            handle, victim._handle = victim._handle, None
            self.evictions += 1
            if handle is not None:
                evicted.append((victim, handle))
        return evicted


def _close_evicted(evicted: list[tuple[CachedFile, FileHandle]]) -> None:
    for _, handle in evicted:
        handle.close()


# The process's cache: descriptors are a process-wide resource.
SEGMENT_FILES: Final = FileCache(default_capacity())
# A child forked while another thread held the lock would wait on it forever.
os.register_at_fork(after_in_child=SEGMENT_FILES.reset_after_fork)


class CachedFile:
    """A FileHandle whose descriptor lives in a FileCache: opened on use, closed on eviction.

    For sealed segments, which are read and, rarely, cut (truncation) or fsynced. The
    compiled append never writes to one (`direct_write_fd` is -1).
    """

    def __init__(
        self,
        fs: SegmentFileSystem,
        path: str,
        *,
        cache: FileCache = SEGMENT_FILES,
        writable: bool = True,
    ):
        self._fs = fs
        self._path = path
        self._cache = cache
        self.writable = writable
        self._handle: FileHandle | None = None
        self._pins = 0

    @classmethod
    def adopting(
        cls, fs: SegmentFileSystem, handle: FileHandle, *, cache: FileCache = SEGMENT_FILES
    ) -> CachedFile:
        """A CachedFile that starts with `handle` open (and evictable)."""
        file = cls(fs, handle.path, cache=cache)
        cache.adopt(file, handle)
        return file

    @property
    def path(self) -> str:
        return self._path

    @property
    def is_open(self) -> bool:
        return self._handle is not None

    @contextlib.contextmanager
    def _pinned(self) -> Iterator[FileHandle]:
        """The descriptor, opened if the cache closed it, and kept from eviction meanwhile."""
        handle = self._cache.acquire(self)
        try:
            yield handle
        finally:
            self._cache.release(self)

    def size(self) -> int:
        with self._pinned() as handle:
            return handle.size()

    def pread(self, size: int, offset: int) -> bytes:
        with self._pinned() as handle:
            return handle.pread(size, offset)

    def pread_into(self, buffer: memoryview, offset: int) -> int:
        with self._pinned() as handle:
            return handle.pread_into(buffer, offset)

    def data_end(self, start: int) -> int:
        with self._pinned() as handle:
            return handle.data_end(start)

    def direct_write_fd(self) -> int:
        return -1  # the number may be closed and reused at any eviction

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        with self._pinned() as handle:
            return handle.pwritev(buffers, offset)

    def truncate(self, size: int) -> None:
        with self._pinned() as handle:
            handle.truncate(size)

    def allocate(self, size: int, *, start: int = 0) -> None:
        with self._pinned() as handle:
            handle.allocate(size, start=start)

    def fsync(self) -> None:
        # The same inode whatever descriptor: Linux's fsync covers pages written through any.
        with self._pinned() as handle:
            handle.fsync()

    def fdatasync(self) -> None:
        with self._pinned() as handle:
            handle.fdatasync()

    def mmap(self, size: int, *, writable: bool) -> MappedRegion:
        with self._pinned() as handle:
            return handle.mmap(size, writable=writable)  # a mapping outlives its descriptor

    def close(self) -> None:
        handle = self._cache.discard(self)
        if handle is not None:
            handle.close()

    def __repr__(self) -> str:
        return f"CachedFile({self._path}, open={self.is_open})"
