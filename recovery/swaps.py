"""Finishing or undoing a cleaner's segment swap that a crash interrupted.

The cleaner (oncelog.log_cleaner) replaces a sealed segment `B.log` in these durable steps:

1. write the cleaned batches to `B.log.cleaned` (and, when markers went, the transaction
   index without their entries to `B.txnindex.cleaned`), fsync them;
2. rename `B.txnindex.cleaned` to `B.txnindex.swap` and fsync the directory, then rename
   `B.log.cleaned` to `B.log.swap` and fsync the directory: from here the new segment is
   the truth;
3. rename `B.txnindex.swap` over `B.txnindex`, delete `B.index` and `B.timeindex` (they
   describe the old file), fsync the directory;
4. rename `B.log.swap` over `B.log` (one atomic replace), fsync the directory, and build
   the new indexes.

A transaction index and its log must change together: an entry whose ABORT marker is gone
would make read_committed skip the producer's later data, and a missing entry beside its
aborted data would serve that data. Its swap is durable before the log's, so a `B.log.swap`
always has its index's swap (or the index needs none).

A crash leaves one of these, which an open settles before it lists segments:

| found                              | meaning                 | done at open                           |
|------------------------------------|-------------------------|----------------------------------------|
| `B.log.cleaned`, `B.txnindex.cleaned` | step 1 or 2 unfinished | delete them: the old files stand     |
| `B.txnindex.swap`, no `B.log.swap` | step 2 unfinished       | delete it: the old files stand         |
| `B.log.swap`                       | step 2 done, 4 not      | steps 3 and 4 (an index swap first)    |
| neither, indexes missing           | step 4 done, not built  | nothing here: the lazy load builds them |
"""

from __future__ import annotations

import os

from oncelog.segments.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, parse_segment_file_name
from oncelog.segments.txn_index import TXN_INDEX_SUFFIX
from oncelog.storage.fs import DirListing, FileSystem

CLEANING = ".cleaned"  # appended to a file's name while the cleaner writes its replacement
SWAPPING = ".swap"  # appended once the replacement is whole and fsynced
CLEANED_SUFFIX = LOG_SUFFIX + CLEANING
SWAP_SUFFIX = LOG_SUFFIX + SWAPPING
_REPLACED = (LOG_SUFFIX, TXN_INDEX_SUFFIX)  # the files a cleaner writes anew
_LEFT_BY_THE_CLEANER = (CLEANING, SWAPPING)  # every name settle_swaps acts on ends in one


def swap_into_place(fs: FileSystem, directory: str, base_offset: int) -> None:
    """Steps 3 and 4 of the swap: `B.log.swap` becomes `B.log`; the caller builds the indexes."""
    stem = os.path.join(directory, f"{base_offset:020d}")
    if fs.exists(stem + TXN_INDEX_SUFFIX + SWAPPING):
        fs.rename(stem + TXN_INDEX_SUFFIX + SWAPPING, stem + TXN_INDEX_SUFFIX)
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        if fs.exists(stem + suffix):
            fs.unlink(stem + suffix)
    # fsync(dir): the new transaction index, and the old indexes gone, before the new file
    # takes the name: a crash must not pair the new file with indexes of the old one.
    fs.fsync_dir(directory)
    fs.rename(stem + SWAP_SUFFIX, stem + LOG_SUFFIX)
    # fsync(dir): a crash must not bring back the old segment once the swap is reported done.
    fs.fsync_dir(directory)


def settled_listing(fs: FileSystem, directory: str) -> DirListing:
    """The directory's listing once `settle_swaps` has done what it must."""
    listing = fs.list_entries(directory)
    return fs.list_entries(directory) if settle_swaps(fs, directory, listing.names) else listing


def _base_of(name: str, suffix: str) -> int | None:
    """The base offset of a cleaner's file `name` ending in `suffix`; None for any other name."""
    for replaced in _REPLACED:
        if name.endswith(replaced + suffix):
            stem = name[: -len(replaced + suffix)]
            return parse_segment_file_name(stem + LOG_SUFFIX, LOG_SUFFIX)
    return None


def settle_swaps(fs: FileSystem, directory: str, names: list[str]) -> bool:
    """Carry out the table above for the directory listing `names`; whether anything changed."""
    # One test per name in the common case, a directory the cleaner never left mid-swap:
    # this runs at every open, over every segment's names.
    names = [name for name in names if name.endswith(_LEFT_BY_THE_CLEANER)]
    changed = False
    swapped = {
        base
        for name in names
        if name.endswith(SWAP_SUFFIX) and (base := _base_of(name, SWAPPING)) is not None
    }
    for name in names:
        base = _base_of(name, CLEANING)
        if base is None and name.endswith(TXN_INDEX_SUFFIX + SWAPPING):
            base = _base_of(name, SWAPPING)
            if base is None or base in swapped:
                continue  # (a stray name is left alone; an index swap with its log's is done below)
        if base is not None:
            fs.unlink(os.path.join(directory, name))
            changed = True
    for base in sorted(swapped):
        swap_into_place(fs, directory, base)
        changed = True
    if changed:
        # fsync(dir): a deleted leftover must not come back beside a later swap of its base.
        fs.fsync_dir(directory)
    return changed
