"""Taking a directory oncelog keeps data in: creating it and locking it, errors named.

The seam reports what the OS says (OSError). Opening a log turns that into the
library's errors: LogDirLockedError while another holder has the lock,
LogDirectoryError when a path is not what it must be (a file where the directory
belongs, a directory where the lock file belongs, no permission), which no retry
fixes, and LogFailedError for an I/O failure, which reopening may.
"""

from __future__ import annotations

import errno
from typing import TypeGuard

from oncelog.errors import LogDirectoryError, LogDirLockedError, LogFailedError, OncelogError
from oncelog.recovery.fs import DirLock, FileSystem

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
