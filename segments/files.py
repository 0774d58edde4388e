"""The part of the filesystem seam that segment files use.

Segment, index and transaction-index files reach the disk only through these
protocols, so the fault-injecting twin (`oncelog.torture.faultfs`) can
stand in for the OS. `oncelog.storage.fs.FileSystem` extends `SegmentFileSystem`
with the rest of the seam (metadata stores, renames, locks) and implements both.
Declared here, below everything else, so that segments import nothing else of oncelog.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from oncelog.segments.format import Buffer


class FileHandle(Protocol):
    """An open file. Positions are explicit; there is no cursor."""

    @property
    def path(self) -> str: ...

    def size(self) -> int: ...

    def pread(self, size: int, offset: int) -> bytes:
        """Up to `size` bytes at `offset`; fewer only at end of file."""
        ...

    def pread_into(self, buffer: memoryview, offset: int) -> int:
        """Fill `buffer` from `offset` (no intermediate copy); fewer bytes only at end of file."""
        ...

    def data_end(self, start: int) -> int:
        """Where the last stretch of the file at or past `start` that may hold anything but zeros
        ends: every byte from there to the end of the file reads as zero (a hole, or space
        allocated and never written). A handle that cannot tell says the file's size."""
        return self.size()

    def direct_write_fd(self) -> int:
        """The descriptor a compiled writer may pwrite() to itself, or -1: every write must
        come through this handle (a double that observes or fails writes, the fault twin).
        A handle that overrides pwritev to see writes must return -1 (the mapping for small
        writes bypasses pwritev in any case)."""
        return -1

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        """Write every buffer back to back at `offset`; returns the bytes written.

        Returns only when all bytes are in the OS page cache, so they survive a
        kill -9 of the process (not a power loss: that needs fsync).
        """
        ...

    def truncate(self, size: int) -> None: ...

    def allocate(self, size: int, *, start: int = 0) -> None:
        """Reserve disk blocks for bytes [start, size), growing the file to `size` if shorter.

        Writes through a shared mapping have no error return: a page that cannot
        get a block kills the process with SIGBUS. Reserving the blocks first turns
        a full disk into an OSError here instead. Growing a file with `truncate`
        reserves nothing (the file is sparse), and bytes already there are kept.
        """
        ...

    def fsync(self) -> None:
        """Data and metadata durable, bytes written through mappings included.

        Raises OSError on failure (then fail closed).
        """
        ...

    def fdatasync(self) -> None: ...

    def mmap(self, size: int, *, writable: bool) -> MappedRegion:
        """Map the first `size` bytes (the file must already be that long)."""
        ...

    def close(self) -> None: ...


class MappedRegion(Protocol):
    """A shared memory map: writes reach the page cache at once, like write()."""

    @property
    def buffer(self) -> memoryview: ...

    def flush(self) -> None:
        """msync: make the mapped bytes durable."""
        ...

    def close(self) -> None: ...


class SegmentFileSystem(Protocol):
    """What a segment and its indexes need: files, their existence, and durable directory entries."""

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle: ...

    def exists(self, path: str) -> bool: ...

    def file_size(self, path: str) -> int:
        """The size of the file at `path`, holding no descriptor (FileNotFoundError if none)."""
        ...

    def modified_ms(self, path: str) -> int:
        """When the file at `path` was last written, in ms since the epoch; -1 where the
        filesystem cannot tell (FileNotFoundError if none)."""
        ...

    def unlink(self, path: str) -> None: ...

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (creates, renames, unlinks) durable."""
        ...
