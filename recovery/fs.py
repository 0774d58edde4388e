"""The filesystem seam: every byte oncelog persists goes through `FileSystem`.

`OsFileSystem` is the real thing. The fault-injecting twin (`oncelog.recovery.torture.faultfs`) implements the
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

import contextlib
import ctypes
import errno
import mmap
import os
import stat
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol, TypeVar

import crc32c
import lmdb

from oncelog.errors import CorruptMetadataError
from oncelog.recovery.os_locks import OsLockTable, flock_file
from oncelog.segments.files import Buffer as Buffer
from oncelog.segments.files import FileHandle as FileHandle
from oncelog.segments.files import MappedRegion as MappedRegion
from oncelog.segments.files import SegmentFileSystem

T = TypeVar("T")

_LIBC = ctypes.CDLL(None, use_errno=True)

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


class _OpenEnvironments:
    """py-lmdb refuses a second open of one environment in a process ("already open in this
    process"), read-only or not. So opens of one store take turns: a later one waits, up to
    TURN_WAIT_S, for the earlier to close (a tool's short read-only look beside a log's
    store opened for its first commit), and only then meets LMDB's refusal."""

    TURN_WAIT_S = 5.0

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._open: set[object] = set()

    def enter(self, path: str) -> object:
        # The directory's identity, as py-lmdb's guard keys on its files': one stat, where
        # realpath took one per path component. (A store not there yet is not open.)
        try:
            found = os.stat(path)
        except OSError:
            key: object = os.path.realpath(path)
        else:
            key = (found.st_dev, found.st_ino)
        deadline = time.monotonic() + self.TURN_WAIT_S
        with self._changed:
            while key in self._open and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            self._open.add(key)  # (if still open, LMDB's own refusal names the store)
        return key

    def leave(self, key: object) -> None:
        with self._changed:
            self._open.discard(key)
            self._changed.notify_all()

    def reset_after_fork(self) -> None:
        # The child's turns start afresh: a parent thread may have held the condition.
        self._changed = threading.Condition()
        self._open = set()


_ENVIRONMENTS = _OpenEnvironments()
os.register_at_fork(after_in_child=_ENVIRONMENTS.reset_after_fork)


class LmdbStore:
    """A metadata store in LMDB. Its errors are the seam's (see MetadataStore).

    Full disks: data.mdb is written with pwrite (writemap=False) and only read through
    its mapping, so a full disk fails the commit (ENOSPC). LMDB does write lock.mdb
    (its reader table) through a shared mapping of a file it grows with ftruncate,
    during the open itself: on a full disk that was SIGBUS. So its blocks are
    reserved before LMDB opens it, large enough that LMDB keeps it as it is.
    """

    # The map is address space, not disk: data.mdb grows only by the pages commits write.
    # Metadata is mostly a handful of keys; a store that outgrows the map (transactional
    # ids by the hundred thousand, a mass retire) doubles it, up to MAX_MAP_BYTES.
    MAP_BYTES = 16 * 1024 * 1024
    MAX_MAP_BYTES = 4 * 1024 * 1024 * 1024
    # LMDB's lock file holds a header and a 64-byte slot per reader: 8 KiB for its
    # default 126 readers on x86-64. A larger file is used as it is (its spare slots
    # are more readers), so a little more covers a platform with a larger header.
    LOCK_FILE_BYTES = 12 * 1024

    def __init__(self, path: str):
        self.path = path
        check_lmdb_files(path)
        # Growing the map needs no transaction open in this process: every one takes this.
        self._txn_lock = threading.Lock()
        self._create_dir(path)  # first: its turn is then keyed on the directory it opens
        # Its turn ends at close, or when the store is dropped unclosed (its environment
        # closes with it): a leaked store must not hold every later open of it waiting.
        self._leave = weakref.finalize(self, _ENVIRONMENTS.leave, _ENVIRONMENTS.enter(path))
        try:
            with _lmdb_errors(path):
                self._env = self._open_env(path)
        except BaseException:
            self._leave()
            raise

    def _create_dir(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def _open_env(self, path: str) -> lmdb.Environment:
        _reserve_lock_file(os.path.join(path, LMDB_LOCK_FILE), self.LOCK_FILE_BYTES)
        # sync and metasync: a commit returns only once it is durable, which is
        # what lets the recovery point promise "everything below me was fsynced".
        # writemap=False (py-lmdb's default, kept explicit): no writes through a mapping
        # of data.mdb. The path as bytes: LMDB encodes a str as strict UTF-8, which a
        # directory name that is not UTF-8 (surrogate-escaped by Python) would fail.
        return lmdb.open(
            os.fsencode(path),
            map_size=self.MAP_BYTES,
            subdir=True,
            sync=True,
            metasync=True,
            max_dbs=0,
            writemap=False,
        )

    def get(self, key: str) -> bytes | None:
        value = self._run(lambda txn: txn.get(key.encode()), write=False)
        return None if value is None else bytes(value)

    def put(self, values: Mapping[str, bytes]) -> None:
        def put_all(txn: lmdb.Transaction) -> None:
            for key, value in values.items():
                txn.put(key.encode(), value)

        self._run(put_all, write=True)

    def delete(self, keys: Sequence[str]) -> None:
        def delete_all(txn: lmdb.Transaction) -> None:
            for key in keys:
                txn.delete(key.encode())

        self._run(delete_all, write=True)

    def update(self, key: str, change: Callable[[bytes | None], bytes | None]) -> bytes | None:
        encoded = key.encode()

        # A write transaction: LMDB serialises writers across processes, so nobody
        # commits between this read and this write.
        def read_and_write(txn: lmdb.Transaction) -> bytes | None:
            old = txn.get(encoded)
            new = change(None if old is None else bytes(old))
            if new is None:
                txn.delete(encoded)
            else:
                txn.put(encoded, new)
            return new

        return self._run(read_and_write, write=True)

    def keys(self, prefix: str) -> list[str]:
        encoded = prefix.encode()

        def scan(txn: lmdb.Transaction) -> list[str]:
            found: list[str] = []
            cursor = txn.cursor()
            if cursor.set_range(encoded):
                for key in cursor.iternext(keys=True, values=False):
                    if not bytes(key).startswith(encoded):
                        break
                    found.append(bytes(key).decode())
            return found

        return self._run(scan, write=False)

    def items(self, prefix: str) -> list[tuple[str, bytes]]:
        encoded = prefix.encode()

        def scan(txn: lmdb.Transaction) -> list[tuple[str, bytes]]:
            found: list[tuple[str, bytes]] = []
            cursor = txn.cursor()
            if cursor.set_range(encoded):
                for key, value in cursor.iternext(keys=True, values=True):
                    if not bytes(key).startswith(encoded):
                        break
                    found.append((bytes(key).decode(), bytes(value)))
            return found

        return self._run(scan, write=False)

    def _run(self, body: Callable[[lmdb.Transaction], T], *, write: bool) -> T:
        """`body` in one transaction (committed if `write`), growing the map when it is full."""
        with _lmdb_errors(self.path), self._txn_lock:
            while True:
                try:
                    with self._env.begin(write=write) as txn:
                        return body(txn)
                except lmdb.MapFullError:
                    # The transaction was aborted: nothing of it is in the store.
                    map_bytes = int(self._env.info()["map_size"])
                    if map_bytes >= self.MAX_MAP_BYTES:
                        raise
                    self._env.set_mapsize(min(2 * map_bytes, self.MAX_MAP_BYTES))
                except lmdb.MapResizedError:
                    self._env.set_mapsize(0)  # another process grew the map: take its size

    def close(self) -> None:
        with self._txn_lock:
            try:
                self._env.close()
            finally:
                self._leave()


class ReadOnlyLmdbStore(LmdbStore):
    """An existing LMDB store opened for reading only: it creates and changes nothing.

    LMDB is opened with `readonly=True, lock=False`, so not even `lock.mdb` is created
    or touched: the store may belong to a live log in another process, or sit on a
    read-only mount. The price of lock=False: this reader takes no slot in LMDB's
    reader table, so writers do not know of it. Each get or keys is one short read
    transaction that sees the last completed commit (a commit in progress is
    invisible); a writer that commits twice during one such read may reuse the pages
    it is reading. Fine for a snapshot view of a handful of keys; not for a reader
    that must stay exact under a busy writer. Errors are the seam's (see MetadataStore).
    """

    def _create_dir(self, path: str) -> None:
        pass  # creates nothing

    def _open_env(self, path: str) -> lmdb.Environment:
        try:
            data = os.stat(os.path.join(path, LMDB_DATA_FILE))
        except OSError:
            data = None
        if data is None or not stat.S_ISREG(data.st_mode) or data.st_size == 0:
            # An empty data file is what a writer opening a new store leaves before its
            # first commit: LMDB would start it afresh, so there is no store to read.
            raise FileNotFoundError(errno.ENOENT, "no metadata store", path)
        return lmdb.open(os.fsencode(path), readonly=True, lock=False, create=False, subdir=True, max_dbs=0)

    def put(self, values: Mapping[str, bytes]) -> None:
        raise read_only_error("put into the metadata store", self.path)

    def delete(self, keys: Sequence[str]) -> None:
        raise read_only_error("delete from the metadata store", self.path)

    def update(self, key: str, change: Callable[[bytes | None], bytes | None]) -> bytes | None:
        raise read_only_error("update the metadata store", self.path)


LMDB_DATA_FILE = "data.mdb"
LMDB_LOCK_FILE = "lock.mdb"
# What LMDB raises for a file that is not a store of its own (wrong magic or version,
# a page that is not where its parent says): damage, not an I/O failure.
_LMDB_DAMAGE = (
    lmdb.InvalidError,
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.VersionMismatchError,
    lmdb.IncompatibleError,
    lmdb.PanicError,
    lmdb.BadChecksumError,
)


@contextlib.contextmanager
def _lmdb_errors(path: str) -> Iterator[None]:
    """LMDB's errors as the seam's: damage is CorruptMetadataError, the rest OSError; both name `path`."""
    try:
        yield
    except _LMDB_DAMAGE as exc:
        reason = f"not a readable LMDB store ({_lmdb_reason(exc, path)})"
        raise CorruptMetadataError(reason, path=path) from exc
    except lmdb.Error as exc:
        code = errno.ENOSPC if isinstance(exc, _LMDB_NO_SPACE) else errno.EIO
        raise OSError(code, f"metadata store {path}: {_lmdb_reason(exc, path)}", path) from exc


# LMDB's errors that mean "no room": the disk (ENOSPC) or the store's own map.
_LMDB_NO_SPACE = (lmdb.DiskError, lmdb.MapFullError)


def _reserve_lock_file(path: str, size: int) -> None:
    """Create LMDB's lock file if missing, `size` bytes (at least) with their blocks reserved.

    Called before LMDB opens the file, and opens it only when it lacks blocks: LMDB's
    locks are fcntl locks, which a process loses when it closes *any* descriptor of
    the file, so a descriptor opened and closed while LMDB holds the file open in this
    process would silently unlock the environment for every other process.
    """
    with contextlib.suppress(FileNotFoundError):
        found = os.stat(path)
        if found.st_blocks * 512 >= max(size, found.st_size):
            return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        # Blocks only: bytes already there (another process's reader table) are kept.
        os.posix_fallocate(fd, 0, max(size, os.fstat(fd).st_size))
    finally:
        os.close(fd)


def _lmdb_reason(exc: lmdb.Error, path: str) -> str:
    """LMDB's message without the path it starts with (the caller names the path)."""
    message = str(exc)
    head, sep, rest = message.partition(": ")
    return rest if sep and os.path.normpath(head) == os.path.normpath(path) else message


# The fields of an LMDB meta page (the first two pages of data.mdb) that say which
# pages the newest commit uses, in LMDB's native layout on 64-bit machines: the page
# header (pgno, pad, flags, lower, upper), then magic, version, address, mapsize, the
# free-page tree (whose first field is the page size), the main tree, last page, txnid.
_LMDB_META = struct.Struct("=10xH4xIIQQI44x48xQQ")
_LMDB_META_PAGE_FLAG = 0x08
_LMDB_MAGIC = 0xBEEFC0DE


def check_lmdb_files(path: str) -> None:
    """Raise CorruptMetadataError unless `path` can be opened as an LMDB store without harm.

    LMDB maps its data file and trusts its meta pages: a file cut short after its
    first commit makes the first read past the end kill the process with SIGBUS.
    So the newest meta page must describe pages that are all in the file. Missing
    pieces are fine (LMDB creates them); a file where a directory belongs is not.
    """
    _inspect_lmdb_files(path, fingerprint=False)


# A store whose pages in use pass this is not fingerprinted (a partition's holds a few
# pages: 32 KiB in the benchmark's).
MAX_FINGERPRINT_BYTES = 1024 * 1024
_STORE_VERSION = struct.Struct(">QQI")


def lmdb_store_version(path: str) -> bytes | None:
    """FileSystem.store_version for an LMDB store: its newest commit's transaction id,
    and the size and CRC-32C of every page that commit uses. Of the bytes, not of the
    file's name or times: a bit flipped in a page since (which leaves the size, inode
    and mtime alone) is another version. None: no store, or one too large to read."""
    return _inspect_lmdb_files(path, fingerprint=True)


def _inspect_lmdb_files(path: str, *, fingerprint: bool) -> bytes | None:
    try:
        found = os.lstat(path)
    except OSError:  # missing is fine (as os.path.lexists says)
        pass
    else:
        if not stat.S_ISDIR(found.st_mode) and not os.path.isdir(path):  # (a link to one is fine)
            raise CorruptMetadataError("a file where the metadata store's directory should be", path=path)
    if os.path.isdir(os.path.join(path, LMDB_LOCK_FILE)):
        raise CorruptMetadataError(f"{LMDB_LOCK_FILE} is a directory", path=path)
    data = os.path.join(path, LMDB_DATA_FILE)
    try:
        # (Linux opens a directory read-only: fstat below tells.)
        fd = os.open(data, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    try:
        return _inspect_lmdb_data(fd, path, fingerprint=fingerprint)
    finally:
        os.close(fd)


def _inspect_lmdb_data(fd: int, path: str, *, fingerprint: bool) -> bytes | None:
    opened = os.fstat(fd)
    if stat.S_ISDIR(opened.st_mode):
        raise CorruptMetadataError(f"{LMDB_DATA_FILE} is a directory", path=path)
    size = opened.st_size
    if size == 0:
        return None  # never committed: LMDB starts it afresh, as it would a missing one
    head = os.pread(fd, 8192 + _LMDB_META.size, 0)  # both meta pages, for pages of up to 8 KiB
    first = _lmdb_meta(head)
    page_bytes = first[0] if first is not None else 0
    second = None
    if page_bytes >= 512 and page_bytes & (page_bytes - 1) == 0:
        if page_bytes + _LMDB_META.size <= len(head):
            second = _lmdb_meta(head[page_bytes:])
        else:
            second = _lmdb_meta(os.pread(fd, _LMDB_META.size, page_bytes))
    if first is None or second is None:
        raise CorruptMetadataError(f"{LMDB_DATA_FILE} is not an LMDB file ({size} bytes)", path=path)
    # LMDB reads the meta page with the higher txnid.
    _, last_page, txnid = max(first, second, key=lambda meta: meta[2])
    needed = (last_page + 1) * page_bytes
    if size < needed:
        raise CorruptMetadataError(
            f"{LMDB_DATA_FILE} is truncated: {size} bytes, but its newest commit (txn {txnid}) uses {needed}",
            path=path,
        )
    if not fingerprint or needed > MAX_FINGERPRINT_BYTES:
        return None
    used = os.pread(fd, needed, 0)
    if len(used) != needed:  # (cut since the fstat)
        return None
    return _STORE_VERSION.pack(txnid, needed, crc32c.crc32c(used))


def _lmdb_meta(raw: bytes) -> tuple[int, int, int] | None:
    """(page size, last page, txnid) of a meta page; None if it is not one (LMDB checks the rest)."""
    if len(raw) < _LMDB_META.size:
        return None
    flags, magic, _, _, _, page_bytes, last_page, txnid = _LMDB_META.unpack_from(raw)
    if not flags & _LMDB_META_PAGE_FLAG or magic != _LMDB_MAGIC:
        return None
    return page_bytes, last_page, txnid


def read_only_error(what: str, path: str, other: str | None = None) -> PermissionError:
    """The error a read-only seam raises for a call that would create or change `path`."""
    return PermissionError(errno.EROFS, f"read-only: {what} refused", path, None, other)


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

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def mkdir(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def remove_dir(self, path: str) -> None:
        os.rmdir(path)

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

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

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

    def fsync_dir(self, path: str) -> None:
        raise read_only_error("fsync_dir", path)
