"""Directory locks on the real OS: one lock file each, or one lock table for many.

A lock file (`flock` on `<dir>/.lock`) costs a descriptor for as long as it is held. A
broker with 10,000 idle partitions cannot pay that, so a LogManager keeps one lock
table: a directory at the root of SHARDS files, on one of which each partition
directory is an open-file-description byte-range lock (`F_OFD_SETLK`) of one byte at the
directory's inode number. Such a lock belongs to the descriptor's open file
description, not to the process, so

- another process, or another table opened in this one (a `Log.open` beside the
  manager), conflicts with it, as two `flock`s would;
- closing some other descriptor of the file does not drop it (POSIX `fcntl` locks would
  be dropped: that is why they are not used);
- it goes when the process dies, or the table is closed.

Two locks through one table do not conflict in the kernel, so the table refuses a second
lock of a directory it holds itself. An inode number is stable while the directory
exists and unique on its filesystem, so no registry of slots is needed; a directory made
anew after a delete may get another number, and `lock` checks, after locking, that the
directory it stat'ed is still the one at the path. A directory on another filesystem
than the table (a mount point, a btrfs subvolume: numbers there repeat) is locked by
`flock` on the directory itself, a descriptor it alone costs. The root's filesystem must
keep inode numbers stable and the same for every client (not overlayfs without `xino`,
CIFS with `noserverino`, FUSE without `use_ino`).

A forked child shares the table's open file description, and so its locks: the child
must not unlock them (the parent still holds the partitions), so tables inherited
through fork forget their locks without unlocking, and close only the child's descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import struct
import threading
import weakref

# struct flock on Linux (x86-64 and arm64 alike): l_type, l_whence, l_start, l_len, l_pid.
_FLOCK = struct.Struct("hhqqi4x")
_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
# l_start + l_len must fit in a signed 64-bit offset.
_MAX_OFFSET = (1 << 63) - 2
# The kernel keeps one list of byte-range locks per file and walks all of it for each lock
# (measured: 4.5 us a lock among 1,000, 63 among 10,000, 309 among 30,000), so a table is
# this many files, a directory's shard being its inode number's remainder.
SHARDS = 64
# A directory replaced this many times while being locked is reported busy.
_RELOCK_ATTEMPTS = 8


class OsDirLock:
    """A held `flock`: the descriptor is the lock."""

    def __init__(self, fd: int):
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1


def flock_file(path: str) -> OsDirLock:
    """An exclusive `flock` on `path` (created if missing); BlockingIOError if held."""
    return _flock(os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644))


def _flock(fd: int) -> OsDirLock:
    """An exclusive `flock` on the open `fd`, which the lock then owns (closed if refused)."""
    try:
        # flock locks the open file description, so a second open in this very
        # process conflicts too, not only another process.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return OsDirLock(fd)


class _TableLock:
    def __init__(self, table: OsLockTable, offset: int):
        self._table = table
        self._offset: int | None = offset

    def release(self) -> None:
        offset, self._offset = self._offset, None
        if offset is not None:
            self._table.unlock(offset)


class OsLockTable:
    """Exclusive locks on directories through the shard files of the table directory `path`.

    `every_shard` opens all SHARDS files now (a LogManager: a fixed cost, whatever its
    partitions); otherwise each is opened by the first lock that needs it.
    """

    def __init__(self, path: str, *, every_shard: bool = False):
        self.path = path
        # Not made durable: the table matters only to live processes (no lock outlives a crash).
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
        self._device = os.stat(path).st_dev
        if not stat.S_ISDIR(os.stat(path).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "a lock table is a directory", path)
        self._fds: dict[int, int] = {}  # shard -> its file's descriptor
        self._held: set[int] = set()  # the offsets locked through this table
        self._mutex = threading.Lock()
        self._closed = False
        self._inherited = False  # in a forked child: the locks are the parent's
        _TABLES.add(self)
        if every_shard:
            try:
                with self._mutex:
                    for shard in range(SHARDS):
                        self._shard_fd(shard)
            except BaseException:
                self.close()
                raise

    def lock(self, directory: str) -> OsDirLock | _TableLock:
        """Lock `directory`; BlockingIOError if another table (or this one) holds it.

        FileNotFoundError / NotADirectoryError if there is no directory at the path.
        """
        if _OFD_SETLK is None:  # no open-file-description locks (not Linux): a descriptor each
            return _flock_directory(directory)
        for _ in range(_RELOCK_ATTEMPTS):
            device, inode = _directory_id(directory)
            if device != self._device:  # its inode numbers may repeat the table's filesystem's
                return _flock_directory(directory)
            offset = inode % _MAX_OFFSET
            self._lock_offset(offset, directory)
            try:
                if _directory_id(directory) == (device, inode):
                    return _TableLock(self, offset)
            except BaseException:
                self.unlock(offset)
                raise
            # Deleted and made anew between the stat and the lock: the lock is on the old one.
            self.unlock(offset)
        raise BlockingIOError(errno.EWOULDBLOCK, "the directory keeps being replaced", directory)

    def unlock(self, offset: int) -> None:
        with self._mutex:
            if offset not in self._held:
                return
            self._held.discard(offset)
            fd = self._fds.get(offset % SHARDS, -1)
            if fd >= 0 and not self._inherited:
                fcntl.fcntl(fd, _OFD_SETLK or 0, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, offset, 1, 0))

    def close(self) -> None:
        """Close the table: every lock still held through it goes."""
        with self._mutex:
            fds, self._fds = list(self._fds.values()), {}
            self._held.clear()
            self._closed = True
        for fd in fds:
            # Closing a shard's descriptor drops its byte-range locks (in a forked child,
            # the parent's descriptor keeps them).
            os.close(fd)

    def _shard_fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is None:
            name = os.path.join(self.path, f"{shard:02x}")
            fd = self._fds[shard] = os.open(name, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        return fd

    def _lock_offset(self, offset: int, directory: str) -> None:
        request = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
        with self._mutex:
            if self._closed:
                raise ValueError(f"the lock table {self.path} is closed")
            if self._inherited:
                raise ValueError(f"the lock table {self.path} belongs to the parent process")
            if offset in self._held:
                raise BlockingIOError(errno.EWOULDBLOCK, "already locked through this lock table", directory)
            try:
                fcntl.fcntl(self._shard_fd(offset % SHARDS), _OFD_SETLK or 0, request)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    raise BlockingIOError(errno.EWOULDBLOCK, "locked by another holder", directory) from None
                raise
            self._held.add(offset)


def _flock_directory(path: str) -> OsDirLock:
    return _flock(os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)))


def _directory_id(path: str) -> tuple[int, int]:
    found = os.stat(path)
    if not stat.S_ISDIR(found.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
    return found.st_dev, found.st_ino


_TABLES: weakref.WeakSet[OsLockTable] = weakref.WeakSet()


def _inherit_after_fork() -> None:
    for table in list(_TABLES):
        table._inherited = True
        table._mutex = threading.Lock()  # another thread of the parent may have held it


os.register_at_fork(after_in_child=_inherit_after_fork)
