"""Taking a directory oncelog keeps data in: creating it and locking it, errors named.

The seam reports what the OS says (OSError). Opening a log turns that into the
library's errors: LogDirLockedError while another holder has the lock,
LogDirectoryError when a path is not what it must be (a file where the directory
belongs, a directory where the lock file belongs, no permission), which no retry
fixes, and LogFailedError for an I/O failure, which reopening may.

Where a partition's lock lives. A LogManager's root holds a lock table
(PARTITION_LOCKS_DIR, `FileSystem.lock_table`): an idle partition then costs no
descriptor for its lock. A directory whose real parent has no table is locked by its
own `.lock` file, as before tables existed. Every opener decides the same way
(`lock_log_dir`), from the directory's real path (so "." and symlinks agree), so a
Spark task's `Log.open` and a manager exclude each other:

- The manager creates the table before it locks any partition.
- An opener that found no table takes `.lock`, then looks again; a table made
  meanwhile sends it to the table (`.lock` released).
- Through the table, an opener then makes the directory's `.lock` a directory (the
  mark): a `.lock` file is locked first, so a holder from before the table still
  excludes it, and a release that knows only lock files fails on the mark by name
  instead of opening beside a manager.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TypeGuard

from oncelog.errors import LogDirectoryError, LogDirLockedError, LogFailedError, OncelogError
from oncelog.storage.fs import DirLock, FileSystem, LockTable

# What an OSError says about the path itself rather than the device. (ENOENT: a file the
# directory lists cannot be opened, a dangling link; nothing else deletes under the lock.
# EINVAL: the seam's answer for a FIFO, socket or device where a file belongs.)
_PATH_ERRNOS = frozenset(
    {
        errno.EISDIR,
        errno.ENOTDIR,
        errno.EEXIST,
        errno.ELOOP,
        errno.EACCES,
        errno.EPERM,
        errno.ENAMETOOLONG,
        errno.ENOENT,
        errno.EINVAL,
        errno.ENXIO,  # a socket where a lock file belongs
    }
)


def create_dir(fs: FileSystem, path: str) -> None:
    """Create `path` (and missing parents); nothing if it is a directory already."""
    try:
        fs.mkdir(path)
    except OSError as exc:
        raise opening_failed(exc, path) from exc


def lock_dir(fs: FileSystem, lock_path: str, held: str) -> DirLock:
    """Take the lock file `lock_path`; LogDirLockedError(`held`) if another holder has it."""
    try:
        return fs.lock(lock_path)
    except BlockingIOError:
        raise LogDirLockedError(held) from None
    except OSError as exc:
        raise opening_failed(exc, lock_path) from exc


PARTITION_LOCKS_DIR = ".partition-locks"
LEGACY_LOCK_FILE = ".lock"


def lock_log_dir(fs: FileSystem, directory: str, held: str) -> DirLock:
    """Lock the log directory `directory` (which exists) where its openers lock it (module
    docstring); LogDirLockedError(`held`) if another holder has it."""
    # The real path: "." or a symlink must find the table an absolute path finds.
    real = os.path.realpath(directory)
    table_path = os.path.join(os.path.dirname(real), PARTITION_LOCKS_DIR)
    if not fs.exists(table_path):
        lock = _lock_file_unless_marked(fs, os.path.join(real, LEGACY_LOCK_FILE), held)
        if lock is None and not fs.exists(table_path):
            # Marked, yet no table beside it: reached through a bind mount (whose real path
            # hides the root), copied out of its root, or the root's table deleted. Another
            # opener may hold it through the real table: refuse rather than guess.
            raise LogDirectoryError(
                f"marked as locked through its root's {PARTITION_LOCKS_DIR}, which is not beside it "
                f"(a bind mount, a copy, or a deleted table?); if no other process can reach it, "
                f"remove the empty directory {LEGACY_LOCK_FILE} to open it on its own",
                path=os.path.join(real, LEGACY_LOCK_FILE),
            )
        if lock is not None:
            if not fs.exists(table_path):
                return lock
            lock.release()  # a manager made its table meanwhile: lock through it, as it does
    try:
        table = fs.lock_table(table_path)
    except OSError as exc:
        raise opening_failed(exc, table_path) from exc
    try:
        return _ThenAlso(lock_in_table(fs, table, real, held), table.close)
    except BaseException:
        table.close()
        raise


def lock_in_table(fs: FileSystem, table: LockTable, directory: str, held: str) -> DirLock:
    """Lock `directory` through `table`, then mark it (module docstring)."""
    try:
        lock = table.lock(directory)
    except BlockingIOError:
        raise LogDirLockedError(held) from None
    except OSError as exc:
        raise opening_failed(exc, directory) from exc
    try:
        replaced = _mark_locked_through_table(fs, os.path.join(directory, LEGACY_LOCK_FILE), held)
    except BaseException:
        lock.release()
        raise
    return lock if replaced is None else _ThenAlso(lock, replaced.release)


def _mark_locked_through_table(fs: FileSystem, legacy: str, held: str) -> DirLock | None:
    """Make `legacy` (the directory's `.lock`) a directory, if it is not one yet; the lock
    on the file it replaced, if it did.

    A file there may be held by an opener from before the table: it is locked first
    (LogDirLockedError while that holder lives). Once a directory, a release that
    knows only lock files fails on it, by name, instead of locking a file nobody else
    looks at. One that opened the file before it was replaced and locks it only now
    would get the lock of a deleted file: so the replaced file stays locked, one
    descriptor, until this holder lets the directory go. Not made durable: after a
    crash the file may be back, and is replaced again.
    """
    if fs.is_dir(legacy):
        return None  # marked already (every open but a partition's first): one stat
    if not fs.exists(legacy):
        try:
            fs.mkdir(legacy)
            return None
        except FileExistsError:
            pass  # an older opener made its lock file meanwhile: lock it first, as below
        except OSError as exc:
            raise opening_failed(exc, legacy) from exc
    probe = _lock_file_unless_marked(fs, legacy, held)
    if probe is None:
        return None
    try:
        fs.unlink(legacy)
        fs.mkdir(legacy)
    except BaseException as exc:
        probe.release()
        if unnamed_os_error(exc):
            raise opening_failed(exc, legacy) from exc
        raise
    return probe


def _lock_file_unless_marked(fs: FileSystem, path: str, held: str) -> DirLock | None:
    """Lock the lock file `path` (created if missing); None if it is a directory, the mark
    of a directory locked through its root's table."""
    try:
        return fs.lock(path)
    except IsADirectoryError:
        return None
    except BlockingIOError:
        raise LogDirLockedError(held) from None
    except OSError as exc:
        raise opening_failed(exc, path) from exc


class _ThenAlso:
    """A lock whose release also runs `then` (even if the release fails): the lock on a
    `.lock` file the mark replaced, or closing a table opened for this lock alone."""

    def __init__(self, lock: DirLock, then: Callable[[], object]):
        self._lock = lock
        self._then = then

    def release(self) -> None:
        try:
            self._lock.release()
        finally:
            self._then()


def unnamed_os_error(exc: BaseException) -> TypeGuard[OSError]:
    """An OSError the library has not named yet (LockTimeoutError is a TimeoutError, so an
    OSError too, and already named)."""
    return isinstance(exc, OSError) and not isinstance(exc, OncelogError)


def opening_failed(exc: OSError, path: str) -> OncelogError:
    """The library's error for an OSError met while opening what lives at `path`."""
    where = exc.filename if isinstance(exc.filename, str) else path
    if exc.errno in _PATH_ERRNOS:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.EEXIST:
            reason = "a file is where a directory should be"
        return LogDirectoryError(reason, path=where)
    # An I/O error: nothing is served, and reopening retries.
    return LogFailedError(f"opening {path} failed: {exc}")


def remove_log_dir(fs: FileSystem, path: str) -> None:
    """Remove a partition directory and everything in it through the seam (one level of
    files plus its metadata store's directory)."""
    # The lock file goes last, just before the directory: until then an opener finds it
    # locked; once it is gone an opener would lock a new one in the doomed directory.
    for name in sorted(fs.listdir(path), key=lambda name: name == LEGACY_LOCK_FILE):
        child = os.path.join(path, name)
        try:
            fs.unlink(child)
        except (IsADirectoryError, PermissionError, FileNotFoundError):
            # A directory (the metadata store's): unlink refuses it (the twin reports it
            # missing, as it keeps directories apart from files).
            remove_log_dir(fs, child)
    fs.remove_dir(path)
