"""A root's identity: a random id in `<root>/root.id`, so a process can tell it opened the right root.

Spark plans on the driver and reads or writes in executors, other processes and often
other machines. A root path means the same directory everywhere only when every
machine mounts one shared filesystem at that path; a local directory of the same name,
or a relative path resolved against an executor's own working directory, is another
root. So the driver reads the root's id once, carries it in the plan, and every task
checks the root it opens has that id before it reads or writes a byte
(`check_root_identity`); a missing root or a different one is refused with both paths
named, never created.

The id is created once, by whoever first writes the root (a LogManager's open, a
Spark write's driver), under `root.id.lock` so two first writers agree, and written
tmp file -> fsync -> rename -> fsync(root). It never changes afterwards. A root no
writer ever touched (a Kafka log.dir read in place) has no id; readers then check
only that the root and its partitions exist.

File format: one line, `oncelog-root <32 hex digits>`.
"""

from __future__ import annotations

import os
import re
import socket
import uuid

from oncelog.errors import CorruptMetadataError, LogDirectoryError
from oncelog.lock_wait import wait_while_locked
from oncelog.storage.fs import FileSystem
from oncelog.storage.log_dirs import lock_dir

ROOT_ID_FILE = "root.id"
ROOT_ID_LOCK_FILE = "root.id.lock"
_TMP_SUFFIX = ".tmp"
_PREFIX = "oncelog-root "
_LINE = re.compile(r"oncelog-root ([0-9a-f]{32})\n")
_MAX_FILE_BYTES = 256
# Two first writers wait for each other only for the milliseconds of one small write.
_LOCK_TIMEOUT_S = 10.0
# Shown to the operator whenever a root is not the one the driver planned on.
SHARED_ROOT_HINT = (
    "the root must be on a filesystem every executor mounts at the same path (NFS, CephFS, Lustre), "
    "with working flock and fsync; see the README, Running on a cluster"
)


class RootIdentityError(LogDirectoryError):
    """The root a process opened is missing, or not the root the plan was made on."""


def read_root_id(fs: FileSystem, root: str) -> str | None:
    """The root's id, or None if it has none. Read-only. LogDirectoryError if `root` is missing
    or not a directory; CorruptMetadataError if the id file does not parse."""
    check_root_directory(fs, root)
    path = os.path.join(root, ROOT_ID_FILE)
    try:
        handle = fs.open(path, writable=False)
    except FileNotFoundError:
        return None
    try:
        raw = handle.pread(_MAX_FILE_BYTES, 0)
    finally:
        handle.close()
    match = _LINE.fullmatch(raw.decode("ascii", "replace"))
    if match is None:
        raise CorruptMetadataError(f"not an oncelog root id ({raw[:64]!r})", path=path)
    return match.group(1)


def ensure_root_id(fs: FileSystem, root: str) -> str:
    """The root's id, created durably if it has none (the root directory must exist)."""
    found = read_root_id(fs, root)
    if found is not None:
        return found

    lock_path = os.path.join(root, ROOT_ID_LOCK_FILE)
    lock = wait_while_locked(
        f"the id of {root}",
        lambda: lock_dir(fs, lock_path, f"another process is creating the id of {root}"),
        _LOCK_TIMEOUT_S,
    )
    try:
        found = read_root_id(fs, root)  # a first writer that held the lock made it meanwhile
        if found is not None:
            return found
        root_id = uuid.uuid4().hex
        _write_root_id(fs, root, root_id)
    finally:
        lock.release()
    assert read_root_id(fs, root) == root_id, root
    return root_id


def _write_root_id(fs: FileSystem, root: str, root_id: str) -> None:
    path = os.path.join(root, ROOT_ID_FILE)
    tmp_path = path + _TMP_SUFFIX
    handle = fs.open(tmp_path, create=True)
    try:
        handle.truncate(0)
        handle.pwritev([f"{_PREFIX}{root_id}\n".encode("ascii")], 0)
        # fsync before rename: a crash must not leave root.id naming empty or partial bytes.
        handle.fsync()
    finally:
        handle.close()
    # rename: the id appears whole or not at all.
    fs.rename(tmp_path, path)
    # fsync(root): a power loss must not forget the id while data written under it survives.
    fs.fsync_dir(root)


def check_root_directory(fs: FileSystem, root: str) -> None:
    """LogDirectoryError in one line if `root` does not exist or is not a directory."""
    if not fs.exists(root):
        raise LogDirectoryError("no such directory: there is no oncelog root here", path=root)
    if not fs.exists(os.path.join(root, "")):
        raise LogDirectoryError("this is a file, not an oncelog root directory", path=root)


def check_partition_present(fs: FileSystem, directory: str, planned_on: str) -> None:
    """Refuse a partition directory the driver on `planned_on` planned with that is not here:
    a task never creates one (deleted since planning, or another directory at the root's path)."""
    if not fs.exists(os.path.join(directory, "")):
        raise RootIdentityError(
            f"partition {os.path.basename(directory)} is missing on host {socket.gethostname()}, though "
            f"the driver on host {planned_on} planned with it (deleted since, or {SHARED_ROOT_HINT})",
            path=directory,
        )


def check_root_identity(fs: FileSystem, root: str, expected_id: str | None, planned_on: str) -> None:
    """Refuse a root that is not the one planned on host `planned_on` with id `expected_id`.

    None as the expected id: the root had none when planned; it must still exist.
    """
    here = socket.gethostname()
    try:
        found = read_root_id(fs, root)
    except LogDirectoryError as exc:
        if isinstance(exc, CorruptMetadataError):
            raise
        raise RootIdentityError(
            f"{exc.reason} on host {here}, but the driver on host {planned_on} planned this query on "
            f"the root at this path; {SHARED_ROOT_HINT}",
            path=root,
        ) from None
    if expected_id is not None and found != expected_id:
        raise RootIdentityError(
            f"host {here} has {'a root without an id' if found is None else f'the root {found}'} at this "
            f"path, but the driver on host {planned_on} planned on the root {expected_id} at the same "
            f"path: they are different directories; {SHARED_ROOT_HINT}",
            path=root,
        )
