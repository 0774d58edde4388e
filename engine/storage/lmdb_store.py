"""The LMDB metadata store: the `MetadataStore` the OS filesystem seam opens.

One LMDB environment per log directory (`meta.lmdb/`) holds what a log records about
itself durably, and per root the PID allocator and leases. A commit is atomic and
durable (LMDB's two meta pages, fsynced). Reads of a store's newest commit without
opening it (`lmdb_store_version`) let a clean open trust the copy its marker carried.

py-lmdb refuses a second open of one environment in a process; `_OpenEnvironments`
makes such opens take turns.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import crc32c
import lmdb

from oncelog.errors import CorruptMetadataError, read_only_error

T = TypeVar("T")


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

    def generation(self) -> int:
        # The newest commit's transaction id, from the meta pages every process shares.
        with _lmdb_errors(self.path):
            return int(self._env.info()["last_txnid"])

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
    data = os.path.join(path, LMDB_DATA_FILE)
    try:
        # (Linux opens a directory read-only: fstat below tells.)
        fd = os.open(data, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        # No data file: a missing store is fine (as os.path.lexists says), anything where
        # its directory should be (a file, a dangling or looping link) is not.
        _check_store_directory(path)
        if isinstance(exc, FileNotFoundError):
            return None
        raise
    try:
        _check_lock_file(path)  # (a data file opened: `path` is a directory)
        return _inspect_lmdb_data(fd, path, fingerprint=fingerprint)
    finally:
        os.close(fd)


def _check_store_directory(path: str) -> None:
    try:
        found = os.lstat(path)
    except OSError:  # missing is fine (as os.path.lexists says)
        return
    if not stat.S_ISDIR(found.st_mode) and not os.path.isdir(path):  # (a link to one is fine)
        raise CorruptMetadataError("a file where the metadata store's directory should be", path=path)
    _check_lock_file(path)


def _check_lock_file(path: str) -> None:
    if os.path.isdir(os.path.join(path, LMDB_LOCK_FILE)):
        raise CorruptMetadataError(f"{LMDB_LOCK_FILE} is a directory", path=path)


def _inspect_lmdb_data(fd: int, path: str, *, fingerprint: bool) -> bytes | None:
    opened = os.fstat(fd)
    if stat.S_ISDIR(opened.st_mode):
        raise CorruptMetadataError(f"{LMDB_DATA_FILE} is a directory", path=path)
    size = opened.st_size
    if size == 0:
        return None  # never committed: LMDB starts it afresh, as it would a missing one
    # Both meta pages (for pages of up to 8 KiB), and with a fingerprint wanted the pages
    # in use too, which a partition's store (a few pages) has in the same read.
    head = os.pread(fd, max(8192 + _LMDB_META.size, min(size, 64 * 1024) if fingerprint else 0), 0)
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
    used = head[:needed] if needed <= len(head) else os.pread(fd, needed, 0)
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
