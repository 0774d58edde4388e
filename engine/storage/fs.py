"""The filesystem seam: every byte oncelog persists goes through `FileSystem`.

`OsFileSystem` is the real thing. The fault-injecting twin (`oncelog.torture.faultfs`) implements the
same two protocols and keeps unsynced state in memory, so it can materialise any
crash state a Linux filesystem may legally leave. For that to be possible the
engine must never touch `os`, `open()` or `mmap` for persistent data directly.

`DelegatingFileSystem` forwards every call (subclass it to observe or fail some);
`ReadOnlyFileSystem` is one that refuses every call that would create or change
anything, for the tools that inspect a log (`oncelog dump`, `verify`, `stat`).

The interface is deliberately positional (pread/pwrite at explicit offsets, no
file cursor): the twin then needs no cursor state, and every write names the
exact bytes it may tear.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from oncelog.errors import read_only_error
from oncelog.segments.files import FileHandle as FileHandle
from oncelog.segments.files import MappedRegion as MappedRegion
from oncelog.segments.files import SegmentFileSystem
from oncelog.segments.format import Buffer
from oncelog.storage.lmdb_store import LmdbStore, ReadOnlyLmdbStore, lmdb_store_version
from oncelog.storage.os_locks import OsLockTable, flock_file

_LIBC = ctypes.CDLL(None, use_errno=True)
# data_end walks at most this many data stretches past the start before it gives up and
# says the file's size (a file written sparsely everywhere is read, not walked).
_MAX_DATA_STRETCHES = 64

# Linux caps one writev() at IOV_MAX (1024) buffers.
_IOV_MAX = 1024


class MetadataStore(Protocol):
    """Small durable key/value metadata (recovery point, start offset, ...).

    `put` is one atomic, durable commit: after a crash either all of it or none of
    it is there. The OS implementation is LMDB; the fault twin models the commit.
    Every call raises CorruptMetadataError (naming `path`) if the store turns out to
    be damaged, and OSError for any other failure (an I/O error, a full disk).
    """

    @property
    def path(self) -> str:
        """The store's directory: what errors about it name."""
        ...

    def get(self, key: str) -> bytes | None: ...

    def put(self, values: Mapping[str, bytes]) -> None: ...

    def delete(self, keys: Sequence[str]) -> None:
        """Remove `keys` (absent ones are ignored) in one atomic, durable commit."""
        ...

    def keys(self, prefix: str) -> list[str]:
        """Every key starting with `prefix`, sorted."""
        ...

    def items(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every (key, value) whose key starts with `prefix`, sorted by key: one read."""
        ...

    def update(self, key: str, change: Callable[[bytes | None], bytes | None]) -> bytes | None:
        """Read `key`, store `change(old)` (None deletes it), in one atomic, durable commit.

        Read and write are one transaction: processes sharing the store (LMDB allows it)
        never interleave between them. Returns the new value.
        """
        ...

    def generation(self) -> int:
        """A number that changes with every commit to the store, by this process or another;
        reads no value (a cache of values checks it before each use)."""
        ...

    def close(self) -> None: ...


class DirLock(Protocol):
    def release(self) -> None: ...


class LockTable(Protocol):
    """Exclusive locks on many directories through one open file (see `os_locks`)."""

    def lock(self, directory: str) -> DirLock:
        """Lock the directory `directory`; BlockingIOError if another table, or this one, holds it."""
        ...

    def close(self) -> None:
        """Release every lock still held through the table."""
        ...


class PendingSync(Protocol):
    def wait(self) -> None:
        """Return once the sync is done; raise its error if it failed (to every caller)."""
        ...

    def join(self) -> BaseException | None:
        """Return once the sync is done: its error if it failed (not raised)."""
        ...


class BackgroundSync:
    """A sync on a thread of its own, started at once (FileSystem.start_sync_filesystem)."""

    def __init__(self, sync: Callable[[str], None], path: str):
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(sync, path), name="oncelog-syncfs", daemon=True
        )
        self._thread.start()

    def _run(self, sync: Callable[[str], None], path: str) -> None:
        try:
            sync(path)
        except BaseException as exc:  # raised to every waiter instead
            self._error = exc
        finally:
            self._done.set()

    def join(self) -> BaseException | None:
        self._done.wait()
        return self._error

    def wait(self) -> None:
        error = self.join()
        if isinstance(error, OSError):  # a new one each time: waiters on two threads raise it
            raise OSError(error.errno, error.strerror or str(error), error.filename) from error
        if error is not None:
            raise error


class EverySync:
    """Several pending syncs, waited for as one (every filesystem a set of paths is on)."""

    def __init__(self, syncs: Sequence[PendingSync]):
        self._syncs = syncs

    def join(self) -> BaseException | None:
        errors = [sync.join() for sync in self._syncs]  # (all of them: none left running)
        return next((error for error in errors if error is not None), None)

    def wait(self) -> None:
        self.join()
        for sync in self._syncs:
            sync.wait()


class FinishedSync:
    """A sync that was done before it was handed over."""

    def wait(self) -> None:
        return None

    def join(self) -> BaseException | None:
        return None


class DirListing(NamedTuple):
    """A directory's names, sorted, and those the listing itself says are not regular
    files (links, directories, anything else): no stat each."""

    names: list[str]
    irregular: frozenset[str]


class FileSystem(SegmentFileSystem, Protocol):
    """The whole seam: segment files' part (open, exists, unlink, fsync_dir) and the rest."""

    def open_store(self, path: str, *, readonly: bool = False) -> MetadataStore:
        """Open the metadata store kept in directory `path`, creating it if missing.

        CorruptMetadataError (an OncelogError naming `path`) if what is there is not a
        readable store: garbage or a truncated file, a file where the directory should
        be. OSError for any other failure. A store whose data file is missing or empty
        is missing: it is created afresh (callers that must notice that look at its keys).

        `readonly` opens an existing store for reading and creates nothing (no
        directory, no lock file): FileNotFoundError if there is none, and `put`/`delete`
        raise PermissionError. Each read sees the last commit a writer completed (one in
        progress is invisible): a snapshot view, for tools that look at a live or
        damaged log without changing it.
        """
        ...

    def store_version(self, path: str) -> bytes | None:
        """A token for the last commit of the store in directory `path`: it differs after
        any later commit and when the store is replaced; None if there is no store.

        Reads no value and opens no store (a clean open compares it with the one its
        clean-shutdown marker recorded). CorruptMetadataError as `open_store` for a
        damaged store; OSError for any other failure.
        """
        ...

    def lock(self, path: str) -> DirLock:
        """Take an exclusive lock on the file `path`; BlockingIOError if already held."""
        ...

    def lock_table(self, path: str, *, every_shard: bool = False) -> LockTable:
        """Open (creating) the lock table directory `path`: locks on many directories
        through a few descriptors, all of them opened now if `every_shard` (os_locks)."""
        ...

    def listdir(self, path: str) -> list[str]: ...

    def list_entries(self, path: str) -> DirListing:
        """`listdir`'s names, and which are not regular files, in one listing."""
        ...

    def filesystem_of(self, path: str) -> int:
        """Which filesystem holds `path` (its st_dev): one sync_filesystem of a path makes
        every path with the same answer durable."""
        ...

    def is_dir(self, path: str) -> bool:
        """True if `path` is a directory (or a link to one); False if missing or anything else."""
        ...

    def mkdir(self, path: str) -> None:
        """Create `path` and missing parents; no error if it exists."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomic replace; durable only after fsync_dir of dst's directory."""
        ...

    def remove_dir(self, path: str) -> None:
        """Remove the empty directory `path`; durable only after fsync_dir of its parent."""
        ...

    def sync_filesystem(self, path: str) -> None:
        """Make every change on the filesystem holding `path` durable (syncfs(2)).

        One journal commit for many directories, where an fsync of each would commit
        the journal once per directory.
        """
        ...

    def start_sync_filesystem(self, path: str) -> PendingSync:
        """`sync_filesystem(path)`, started now: on a thread of its own on the OS (a syncfs
        waits on the disk with the GIL let go, while Python goes on); done before this
        returns where a thread would make runs irreproducible (the fault-injecting twin)."""
        ...


# The mapping calls themselves, so a mapping keeps no descriptor: Python's mmap.mmap
# dup()s the file's descriptor for the mapping's life, which cost every index and every
# active segment one more descriptor than its open file.
_MMAP = _LIBC.mmap
_MMAP.restype = ctypes.c_void_p
_MMAP.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_MUNMAP = _LIBC.munmap
_MUNMAP.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MSYNC = _LIBC.msync
_MSYNC.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_MS_SYNC = 4  # Linux's value, what mmap.mmap.flush passes
_MAP_FAILED = ctypes.c_void_p(-1).value


class OsMappedRegion:
    """A shared mapping made with mmap(2) directly: it outlives the descriptor it was made from.

    Callers drop every view of `buffer` before `close` (the segment and index code clear
    theirs first): after munmap a view left behind would fault, not raise.
    """

    def __init__(self, fd: int, size: int, *, writable: bool, path: str):
        assert size > 0, (path, size)
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        address = _MMAP(None, size, prot, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            code = ctypes.get_errno()
            raise OSError(code, f"mmap of {size} bytes failed: {os.strerror(code)}", path)
        self._address: int | None = address
        self._size = size
        self._path = path
        view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
        self._view = view if writable else view.toreadonly()

    @property
    def buffer(self) -> memoryview:
        return self._view

    def flush(self) -> None:
        if self._address is not None and _MSYNC(self._address, self._size, _MS_SYNC) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"msync failed: {os.strerror(code)}", self._path)

    def close(self) -> None:
        address, self._address = self._address, None
        if address is None:
            return
        self._view.release()
        self._view = memoryview(b"")
        if _MUNMAP(address, self._size) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"munmap failed: {os.strerror(code)}", self._path)


class OsFile:
    def __init__(self, path: str, fd: int, writable: bool):
        self._path = path
        self._fd = fd
        self._writable = writable

    @property
    def path(self) -> str:
        return self._path

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def data_end(self, start: int) -> int:
        size = os.fstat(self._fd).st_size
        end = position = min(start, size)
        try:
            for _ in range(_MAX_DATA_STRETCHES):
                if position >= size:
                    return end
                # Unwritten allocated extents count as holes (ext4, XFS) unless the page cache
                # holds pages of them, which then count as data: never a byte that is not zero.
                position = os.lseek(self._fd, os.lseek(self._fd, position, os.SEEK_DATA), os.SEEK_HOLE)
                end = position
        except OSError as error:
            if error.errno == errno.ENXIO:  # no data past `position`
                return end
            if error.errno != errno.EINVAL:  # EINVAL: the filesystem cannot say
                raise
        return size

    def pread(self, size: int, offset: int) -> bytes:
        chunks = []
        while size > 0:
            chunk = os.pread(self._fd, size, offset)
            if not chunk:
                break
            chunks.append(chunk)
            size -= len(chunk)
            offset += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def pread_into(self, buffer: memoryview, offset: int) -> int:
        view = buffer.cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got == 0:
                break
            done += got
        return done

    def direct_write_fd(self) -> int:
        return self._fd if self._writable else -1

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        total = 0
        pending = [memoryview(b).cast("B") for b in buffers if len(b)]
        while pending:
            batch = pending[:_IOV_MAX]
            written = os.pwritev(self._fd, batch, offset)
            if written <= 0:
                raise OSError(f"pwritev wrote {written} bytes to {self._path}")
            total += written
            offset += written
            # A short write (signal, quota) is legal: resume after the written bytes.
            while written and pending:
                head = pending[0]
                if written >= len(head):
                    written -= len(head)
                    pending.pop(0)
                else:
                    pending[0] = head[written:]
                    written = 0
        return total

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def allocate(self, size: int, *, start: int = 0) -> None:
        if size > start:
            # Holes get blocks, blocks already there keep their bytes: cheap over a file
            # that is mostly reserved already.
            os.posix_fallocate(self._fd, start, size - start)

    def fsync(self) -> None:
        # Linux writes back pages dirtied through a shared mapping of the file as well.
        os.fsync(self._fd)

    def fdatasync(self) -> None:
        os.fdatasync(self._fd)

    def mmap(self, size: int, *, writable: bool) -> MappedRegion:
        return OsMappedRegion(self._fd, size, writable=writable, path=self._path)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class OsFileSystem:
    """The real operating system."""

    def open_store(self, path: str, *, readonly: bool = False) -> MetadataStore:
        return ReadOnlyLmdbStore(path) if readonly else LmdbStore(path)

    def store_version(self, path: str) -> bytes | None:
        return lmdb_store_version(path)

    def lock(self, path: str) -> DirLock:
        return flock_file(path)

    def lock_table(self, path: str, *, every_shard: bool = False) -> LockTable:
        return OsLockTable(path, every_shard=every_shard)

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        flags = os.O_RDWR if writable else os.O_RDONLY
        if create:
            flags |= os.O_CREAT
        # O_NONBLOCK: a FIFO named like a segment would block the open until a writer came
        # (a hung `oncelog verify`); for a regular file the flag changes nothing.
        fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            if stat.S_ISDIR(mode):
                # Linux opens a directory read-only; its first read would fail without a name.
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device)", path)
        return OsFile(path, fd, writable)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def modified_ms(self, path: str) -> int:
        return os.stat(path).st_mtime_ns // 1_000_000

    def filesystem_of(self, path: str) -> int:
        return os.stat(path).st_dev

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def list_entries(self, path: str) -> DirListing:
        names, irregular = [], []
        with os.scandir(path) as entries:
            for entry in entries:
                names.append(entry.name)
                if not entry.is_file(follow_symlinks=False):  # the entry's type: no stat
                    irregular.append(entry.name)
        names.sort()
        return DirListing(names, frozenset(irregular))

    def mkdir(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def remove_dir(self, path: str) -> None:
        os.rmdir(path)

    def start_sync_filesystem(self, path: str) -> PendingSync:
        return BackgroundSync(self.sync_filesystem, path)

    def sync_filesystem(self, path: str) -> None:
        syncfs = getattr(_LIBC, "syncfs", None)
        if syncfs is None:  # not Linux: sync(2) flushes every filesystem, a superset
            os.sync()
            return
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            # Since Linux 5.8 syncfs reports writeback errors of the filesystem.
            if syncfs(fd) != 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code), path)
        finally:
            os.close(fd)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


DEFAULT_FS: FileSystem = OsFileSystem()


class DelegatingFileHandle:
    """A FileHandle that forwards every call to `inner`: subclass it to observe or fail some."""

    def __init__(self, inner: FileHandle):
        self.inner = inner

    @property
    def path(self) -> str:
        return self.inner.path

    def size(self) -> int:
        return self.inner.size()

    def pread(self, size: int, offset: int) -> bytes:
        return self.inner.pread(size, offset)

    def data_end(self, start: int) -> int:
        return self.inner.data_end(start)

    def pread_into(self, buffer: memoryview, offset: int) -> int:
        return self.inner.pread_into(buffer, offset)

    def direct_write_fd(self) -> int:
        return -1  # a double sees every write: none may bypass it

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        return self.inner.pwritev(buffers, offset)

    def truncate(self, size: int) -> None:
        self.inner.truncate(size)

    def allocate(self, size: int, *, start: int = 0) -> None:
        self.inner.allocate(size, start=start)

    def fsync(self) -> None:
        self.inner.fsync()

    def fdatasync(self) -> None:
        self.inner.fdatasync()

    def mmap(self, size: int, *, writable: bool) -> MappedRegion:
        return self.inner.mmap(size, writable=writable)

    def close(self) -> None:
        self.inner.close()


class DelegatingFileSystem:
    """A FileSystem that forwards every call to `inner` (default: the OS).

    Subclass it to observe or fail some calls; override `wrap` to do the same for
    the handles it opens.
    """

    def __init__(self, inner: FileSystem | None = None):
        self.inner: FileSystem = inner or OsFileSystem()

    def wrap(self, handle: FileHandle) -> FileHandle:
        return handle

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        return self.wrap(self.inner.open(path, create=create, writable=writable))

    def open_store(self, path: str, *, readonly: bool = False) -> MetadataStore:
        return self.inner.open_store(path, readonly=readonly)

    def store_version(self, path: str) -> bytes | None:
        return self.inner.store_version(path)

    def lock(self, path: str) -> DirLock:
        return self.inner.lock(path)

    def lock_table(self, path: str, *, every_shard: bool = False) -> LockTable:
        return self.inner.lock_table(path, every_shard=every_shard)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def is_dir(self, path: str) -> bool:
        return self.inner.is_dir(path)

    def file_size(self, path: str) -> int:
        return self.inner.file_size(path)

    def modified_ms(self, path: str) -> int:
        return self.inner.modified_ms(path)

    def filesystem_of(self, path: str) -> int:
        return self.inner.filesystem_of(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def list_entries(self, path: str) -> DirListing:
        # The names through this object's listdir, so a subclass that observes or fails
        # listings sees this one too.
        names = self.listdir(path)
        return DirListing(names, self.inner.list_entries(path).irregular.intersection(names))

    def mkdir(self, path: str) -> None:
        self.inner.mkdir(path)

    def rename(self, src: str, dst: str) -> None:
        self.inner.rename(src, dst)

    def unlink(self, path: str) -> None:
        self.inner.unlink(path)

    def remove_dir(self, path: str) -> None:
        self.inner.remove_dir(path)

    def sync_filesystem(self, path: str) -> None:
        self.inner.sync_filesystem(path)

    def start_sync_filesystem(self, path: str) -> PendingSync:
        # A subclass that watches or fails sync_filesystem gets it run on a thread, as
        # the OS would; else the inner filesystem starts its own (the twin: inline).
        if type(self).sync_filesystem is not DelegatingFileSystem.sync_filesystem:
            return BackgroundSync(self.sync_filesystem, path)
        return self.inner.start_sync_filesystem(path)

    def fsync_dir(self, path: str) -> None:
        self.inner.fsync_dir(path)


class ReadOnlyFileSystem(DelegatingFileSystem):
    """The seam for tools that must change nothing: reads pass through, nothing else does.

    Every file is opened read-only and never created, whatever the caller asks (a
    handle's writes then fail), and metadata stores only with `readonly=True`. Every
    call that would create, change or sync anything raises PermissionError naming
    the path. Code that opens files read-write by habit (TransactionIndex) can be
    handed it to prove it writes nothing.
    """

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        return self.wrap(self.inner.open(path, writable=False))

    def open_store(self, path: str, *, readonly: bool = False) -> MetadataStore:
        if not readonly:
            raise read_only_error("open_store read-write", path)
        return self.inner.open_store(path, readonly=True)

    def lock(self, path: str) -> DirLock:
        raise read_only_error("lock", path)

    def lock_table(self, path: str, *, every_shard: bool = False) -> LockTable:
        raise read_only_error("lock_table", path)

    def mkdir(self, path: str) -> None:
        raise read_only_error("mkdir", path)

    def rename(self, src: str, dst: str) -> None:
        raise read_only_error("rename", src, dst)

    def unlink(self, path: str) -> None:
        raise read_only_error("unlink", path)

    def remove_dir(self, path: str) -> None:
        raise read_only_error("remove_dir", path)

    def sync_filesystem(self, path: str) -> None:
        raise read_only_error("sync_filesystem", path)

    def start_sync_filesystem(self, path: str) -> PendingSync:
        raise read_only_error("sync_filesystem", path)

    def fsync_dir(self, path: str) -> None:
        raise read_only_error("fsync_dir", path)
