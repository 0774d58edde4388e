"""The root's security store, `ROOT/security.lmdb`: SASL credentials and ACLs, private to the server's user.

Its directory is mode 0700 and its files 0600 (`check_private`); `serve` refuses to start
otherwise, as ssh refuses a readable key, and so does a store that is a symbolic link
(its files would live wherever the link points). One LMDB environment per process holds
both the credentials (`credentials`) and the ACLs (`acl_store`), so they share one store.

A new store is made private before it has its name: created in a 0700 staging directory
beside it, its files made 0600, then renamed into place. Two processes creating it at
once (a `users add` and an `acls add`) each see it whole and private, never a file of
the other's still 0644.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from typing import Final

from oncelog.storage.fs import FileSystem, MetadataStore

STORE_DIR: Final = "security.lmdb"
# Where a new store is made before it has its name: no "-" in it, so never a partition
# directory's name, and a root holding only these and the store counts as new.
STAGING_PREFIX: Final = f"{STORE_DIR}.new."


class StoreNotPrivateError(Exception):
    """The security store can be read or changed by users other than the server's."""


def check_private(path: str) -> None:
    """StoreNotPrivateError unless `path` (the store's directory) and every file in it belong to
    this process's user and allow nobody else anything."""
    if os.path.islink(path):
        raise StoreNotPrivateError(
            f"{path} is a symbolic link: the security store (credentials and ACLs) must be a "
            "directory of the root itself"
        )
    for entry in [path, *(os.path.join(path, name) for name in sorted(os.listdir(path)))]:
        info = os.lstat(entry)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise StoreNotPrivateError(
                f"{entry} is mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}: the security "
                f"store (credentials and ACLs) must belong to uid {os.geteuid()} and be readable by it "
                f"alone (chmod -R go= {path})"
            )


def _create_private(fs: FileSystem, root: str, path: str) -> None:
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root)  # mode 0700
    try:
        fs.open_store(staging).close()
        for name in os.listdir(staging):
            os.chmod(os.path.join(staging, name), 0o600)
        try:
            fs.rename(staging, path)
        except OSError:
            if not os.path.isdir(path):
                raise
            return  # another process made it first: theirs is as private as ours
        # fsync(root): the store's name must survive a power loss before anything is stored in it.
        fs.fsync_dir(root)
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)


def is_security_entry(name: str) -> bool:
    """Whether `name`, in a root, is the security store or one being made."""
    return name == STORE_DIR or name.startswith(STAGING_PREFIX)


def open_security_store(fs: FileSystem, root: str) -> MetadataStore:
    """Open the root's store (created private if missing); StoreNotPrivateError if it is not private."""
    path = os.path.join(root, STORE_DIR)
    empty_directory = os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)
    if not os.path.lexists(path) or empty_directory:  # (a rename replaces an empty directory)
        _create_private(fs, root, path)
    check_private(path)  # before LMDB opens, and perhaps writes, anything in it
    store = fs.open_store(path)
    try:
        check_private(path)
    except StoreNotPrivateError:
        store.close()
        raise
    return store
