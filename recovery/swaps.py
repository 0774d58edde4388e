"""Finishing or undoing a cleaner's segment swap that a crash interrupted.

The cleaner (oncelog.log_cleaner) replaces a sealed segment `B.log` in four durable steps:

1. write the cleaned batches to `B.log.cleaned`, fsync it;
2. rename it `B.log.swap`, fsync the directory: from here the new segment is the truth;
3. delete `B.index` and `B.timeindex` (they describe the old file), fsync the directory;
4. rename `B.log.swap` over `B.log` (one atomic replace), fsync the directory, and build
   the new indexes.

The transaction index `B.txnindex` is kept: cleaning only removes data, and the aborted
transactions it lists are still what read_committed needs to know.

A crash leaves one of these, which an open settles before it lists segments:

| found                    | meaning                   | done at open                                |
|--------------------------|---------------------------|---------------------------------------------|
| `B.log.cleaned`          | step 1 or 2 unfinished    | delete it: `B.log` still stands             |
| `B.log.swap`             | step 2 done, 4 not        | delete B's indexes, rename it over `B.log`  |
| neither, indexes missing | step 4 done, indexes not  | nothing here: the lazy load rebuilds them   |

Both files at once cannot mean anything else: a `.cleaned` is always older than a swap of
the same base (a pass cleans one segment at a time and renames before the next).
"""

from __future__ import annotations

import os

from oncelog.segments.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, parse_segment_file_name
from oncelog.storage.fs import DirListing, FileSystem

CLEANED_SUFFIX = LOG_SUFFIX + ".cleaned"
SWAP_SUFFIX = LOG_SUFFIX + ".swap"


def swap_into_place(fs: FileSystem, directory: str, base_offset: int) -> None:
    """Steps 3 and 4 of the swap: `B.log.swap` becomes `B.log`; the caller builds the indexes."""
    stem = os.path.join(directory, f"{base_offset:020d}")
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        if fs.exists(stem + suffix):
            fs.unlink(stem + suffix)
    # fsync(dir): the old indexes must be gone before the new file takes the name, or a
    # crash could pair them with it (a sanity check cannot tell an index of the old file).
    fs.fsync_dir(directory)
    fs.rename(stem + SWAP_SUFFIX, stem + LOG_SUFFIX)
    # fsync(dir): a crash must not bring back the old segment once the swap is reported done.
    fs.fsync_dir(directory)


def settled_listing(fs: FileSystem, directory: str) -> DirListing:
    """The directory's listing once `settle_swaps` has done what it must."""
    listing = fs.list_entries(directory)
    return fs.list_entries(directory) if settle_swaps(fs, directory, listing.names) else listing


def settle_swaps(fs: FileSystem, directory: str, names: list[str]) -> bool:
    """Carry out the table above for the directory listing `names`; whether anything changed."""
    changed = False
    for name in names:
        if name.endswith(CLEANED_SUFFIX):
            fs.unlink(os.path.join(directory, name))
            changed = True
    for name in names:
        if not name.endswith(SWAP_SUFFIX):
            continue
        base = parse_segment_file_name(name[: -len(SWAP_SUFFIX)] + LOG_SUFFIX, LOG_SUFFIX)
        if base is None:
            continue  # not a cleaner's file: left alone, as any stray name is
        swap_into_place(fs, directory, base)
        changed = True
    if changed:
        # fsync(dir): a deleted .cleaned must not come back beside a later swap of its base.
        fs.fsync_dir(directory)
    return changed
