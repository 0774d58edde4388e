"""Disk blocks reserved ahead of writes made through a shared mapping.

A write through a shared mapping has no error return: when the page it lands on has
no disk block and the filesystem is full, the kernel kills the process with SIGBUS.
So every file the engine writes through a mapping (the active segment's .log,
.index and .timeindex) has the blocks of all it maps reserved first
(`FileHandle.allocate`, posix_fallocate), where a full disk is an ENOSPC that the
log turns into LogFailedError. A file grown with ftruncate is sparse: growing is not
reserving. The .log's large batches, written with pwrite, go into the same reserved
space: a write there is cheaper than one that extends the file.

Reservations grow in steps that double, so an idle partition holds little disk and
a busy one extends its files a few times per segment.
"""

from __future__ import annotations


def next_reservation(reserved: int, needed: int, limit: int, min_step: int, max_step: int) -> int:
    """How much to reserve once `reserved` units no longer hold `needed`.

    One step more, as large as what is reserved already (at least `min_step`, at most
    `max_step`), and never past `limit` unless `needed` itself is.
    """
    step = min(max(reserved, min_step), max_step)
    return max(needed, min(reserved + step, limit))
