"""Where records at or after a timestamp can start in a partition, read-only, from its time indexes.

Kafka's ListOffsets answers "the first offset whose timestamp is >= T" the same way:
skip every sealed segment whose largest timestamp (its `.timeindex`'s last entry) is
below T, start in the next at the last time-index entry below T (every record up to
that entry's offset is older than T), and scan batch headers from there to the first
batch whose max timestamp reaches T. Records are never decoded: the answer is a
batch's base offset, a lower bound. Every record before it is older than T; records
after it may be older too (clients stamp them), which is why a Spark filter on
`timestamp` stays with Spark after planning starts the read here.

The active segment's time index lags its data, so it is never used to skip that
segment. Nothing is mapped or written (the files may be a live writer's), as in
partition_reader.
"""

from __future__ import annotations

import bisect
import os

from oncelog.segments.index import TimeIndex
from oncelog.segments.segment import TIME_INDEX_SUFFIX, segment_file_name
from oncelog.storage.fs import FileHandle, FileSystem
from oncelog.tools.partition_dirs import segment_bases
from oncelog.tools.partition_reader import read_batches, read_only

_ENTRY = TimeIndex.ENTRY  # (timestamp ms i64, offset relative to the segment's base i32)


def first_offset_at_timestamp(
    fs: FileSystem | None, directory: str, timestamp_ms: int, start: int, end: int
) -> int:
    """The base offset (at least `start`) of the first batch in [start, end) whose max timestamp
    is >= `timestamp_ms`; `end` if there is none. `end` must be at most the log end."""
    if start >= end:
        return end
    ro = read_only(fs)
    bases, _ = segment_bases(ro.listdir(directory))
    if not bases:
        return end
    first = max(bisect.bisect_right(bases, start) - 1, 0)
    for n in range(first, len(bases)):
        base = bases[n]
        if base >= end:
            return end
        sealed = n + 1 < len(bases)
        floor, last = _time_index_entries(ro, directory, base, timestamp_ms)
        if sealed and last is not None and last < timestamp_ms:
            continue  # every record of this segment is older than the target
        scan_from = max(start, base if floor is None else floor)
        scan_end = min(end, bases[n + 1]) if sealed else end
        if scan_from >= scan_end:
            continue
        for batch in read_batches(ro, directory, scan_from, scan_end):
            if batch.header.max_timestamp >= timestamp_ms:
                return max(start, batch.header.base_offset)
    return end


def _time_index_entries(
    fs: FileSystem, directory: str, base: int, timestamp_ms: int
) -> tuple[int | None, int | None]:
    """(the offset of the last entry below `timestamp_ms`, the last entry's timestamp); None where
    there is no such entry (or no time index: Kafka writes none for a segment it never indexed)."""
    path = os.path.join(directory, segment_file_name(base, TIME_INDEX_SUFFIX))
    try:
        handle = fs.open(path, writable=False)
    except FileNotFoundError:
        return None, None
    try:
        count = _entry_count(handle)
        if count == 0:
            return None, None
        last_timestamp = _entry(handle, count - 1)[0]
        # Entries grow strictly in timestamp: binary search for the last one below the target.
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            if _entry(handle, mid)[0] < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        floor = None if lo == 0 else base + _entry(handle, lo - 1)[1]
        return floor, last_timestamp
    finally:
        handle.close()


def _entry(handle: FileHandle, n: int) -> tuple[int, int]:
    raw = handle.pread(_ENTRY.size, n * _ENTRY.size)
    if len(raw) < _ENTRY.size:
        return 0, 0
    timestamp_ms, relative = _ENTRY.unpack(raw)
    return int(timestamp_ms), int(relative)


def _entry_count(handle: FileHandle) -> int:
    """Entries before the zero tail of a pre-allocated index (no real entry past the first is
    all zeros: timestamps grow strictly)."""
    lo, hi = 1, handle.size() // _ENTRY.size
    if hi == 0:
        return 0
    while lo < hi:
        mid = (lo + hi) // 2
        if _entry(handle, mid) == (0, 0):
            hi = mid
        else:
            lo = mid + 1
    return lo
