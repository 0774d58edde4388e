"""The root's security store, `ROOT/security.lmdb`: SASL credentials and ACLs, private to the server's user.

Its directory is mode 0700 and its files 0600 (`check_private`); `serve` refuses to start
otherwise, as ssh refuses a readable key. One LMDB environment per process holds both the
credentials (`credentials`) and the ACLs (`acl_store`), so they share one opened store.
"""

from __future__ import annotations

import os
import stat
from typing import Final

from oncelog.storage.fs import FileSystem, MetadataStore

STORE_DIR: Final = "security.lmdb"


class StoreNotPrivateError(Exception):
    """The security store can be read or changed by users other than the server's."""


def check_private(path: str) -> None:
    """StoreNotPrivateError unless `path` (the store's directory) and every file in it belong to
    this process's user and allow nobody else anything."""
    for entry in [path, *(os.path.join(path, name) for name in sorted(os.listdir(path)))]:
        info = os.lstat(entry)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise StoreNotPrivateError(
                f"{entry} is mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}: the security "
                f"store (credentials and ACLs) must belong to uid {os.geteuid()} and be readable by it "
                f"alone (chmod -R go= {path})"
            )


def open_security_store(fs: FileSystem, root: str) -> MetadataStore:
    """Open the root's store (created private if missing); StoreNotPrivateError if it is not private."""
    path = os.path.join(root, STORE_DIR)
    if not os.path.exists(path):
        # The directory first, private: the files LMDB creates in it are then out of reach
        # of other users from the start, and made 0600 below.
        os.makedirs(path, mode=0o700, exist_ok=True)
        created = True
    else:
        created = False
    store = fs.open_store(path)
    if created:
        for name in os.listdir(path):
            os.chmod(os.path.join(path, name), 0o600)
    try:
        check_private(path)
    except StoreNotPrivateError:
        store.close()
        raise
    return store
