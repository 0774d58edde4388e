"""What a directory given as ROOT is, and whether serve, users and acls may use it.

Shared by `recover`, `serve`, `users` and `acls`; light, so that `users` and `acls`
do not load the wire server to check their argument.
"""

from __future__ import annotations

import contextlib
import os
from typing import Literal

from oncelog.layout import parse_partition_dir_name
from oncelog.root_config import ROOT_LOCK_FILE, ROOT_METADATA_DIR
from oncelog.segments.segment import LOG_SUFFIX
from oncelog.server.security_store import is_security_entry


def directory_kind(path: str) -> Literal["partition", "root"] | None:
    """What `path` holds: segments (a partition), a root's entries or partitions, or neither."""
    names = os.listdir(path)
    if any(name.endswith(LOG_SUFFIX) for name in names):
        return "partition"
    if ROOT_METADATA_DIR in names or ROOT_LOCK_FILE in names:
        return "root"
    for name in names:
        if parse_partition_dir_name(name) is not None and os.path.isdir(os.path.join(path, name)):
            return "root"
    return None


def unservable_root(root: str) -> str | None:
    """Why ROOT cannot be served, or None: it must be missing, empty, or a LogManager root."""
    if not os.path.lexists(root):
        return None  # created
    if not os.path.isdir(root):
        return f"{root} is not a directory"
    try:
        kind = directory_kind(root)
        # A new root may already hold its users (`oncelog users ROOT add` before the first serve).
        empty = all(is_security_entry(name) for name in os.listdir(root))
    except OSError as exc:
        return f"cannot list {root}: {exc.strerror or exc}"
    if kind == "partition":
        return f"{root} is a partition directory; serve the root that holds it"
    if kind is None and not empty:
        return f"{root} is neither a LogManager root nor empty (a typo?); give a root or a new directory"
    return None


def security_root_problem(root: str, *, creating: bool) -> str | None:
    """Why `oncelog users` or `oncelog acls` may not keep ROOT's security store, or None; a
    missing ROOT is made when `creating` (its first users or ACLs, before its first serve)."""
    try:
        if creating and not os.path.lexists(root):
            with contextlib.suppress(FileExistsError):  # (the other command may make it at the same time)
                os.mkdir(root)
        if not os.path.isdir(root):
            return f"{root} is not a directory"
        if directory_kind(root) != "root":
            return unservable_root(root)  # a new root is fine; a partition or a stranger's directory not
    except OSError as exc:
        return str(exc)
    return None
