"""Loading a partition directory: find the segments, check them, cut a torn tail.

This is the minimal loader of issue 2. Sealed segments were fsynced when they
rolled, so their indexes are trusted after a sanity check. The active segment may
end in a torn write, so it is rescanned with CRC checks and cut at the first bad
batch: a crash mid-write leaves a truncated or zero-filled tail, which is EOF, not
corruption. (Issue 3 adds the recovery point and snapshots, and tells corruption
below the recovery point apart from a torn tail.)
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from oncelog.config import LogConfig
from oncelog.errors import NotASegmentError
from oncelog.recovery.fs import FileSystem
from oncelog.segments.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    parse_segment_file_name,
    segment_file_name,
)

log = logging.getLogger(__name__)


def list_segment_bases(fs: FileSystem, directory: str) -> list[int]:
    bases = []
    for name in fs.listdir(directory):
        if not name.endswith(LOG_SUFFIX):
            continue
        base = parse_segment_file_name(name, LOG_SUFFIX)
        if base is None:
            raise NotASegmentError(
                "a .log file whose name is not a 20-digit base offset", path=os.path.join(directory, name)
            )
        bases.append(base)
    return sorted(bases)


class LoadReport(NamedTuple):
    """What loading a partition directory found and did."""

    segments: int
    indexes_rebuilt: int
    # Bytes cut from the end of the active segment, and why.
    truncated_bytes: int = 0
    tail_error: str | None = None


def load_segments(fs: FileSystem, directory: str, config: LogConfig) -> tuple[list[LogSegment], LoadReport]:
    bases = list_segment_bases(fs, directory)
    if not bases:
        return [_open(fs, directory, 0, config, create=True)], LoadReport(1, 0)
    segments: list[LogSegment] = []
    rebuilt = 0
    truncated = 0
    tail_error: str | None = None
    try:
        for n, base in enumerate(bases):
            indexes_present = all(
                fs.exists(os.path.join(directory, segment_file_name(base, suffix)))
                for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
            )
            segment = _open(fs, directory, base, config)
            segments.append(segment)
            if n < len(bases) - 1:
                rebuilt += _load_sealed(segment, indexes_present, next_base=bases[n + 1])
            else:
                truncated, tail_error = _recover_active(segment)
                rebuilt += 1
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return segments, LoadReport(len(segments), rebuilt, truncated, tail_error)


def _open(
    fs: FileSystem, directory: str, base: int, config: LogConfig, *, create: bool = False
) -> LogSegment:
    return LogSegment.open(
        fs,
        directory,
        base,
        index_interval_bytes=config.index_interval_bytes,
        max_index_bytes=config.segment_index_bytes,
        create=create,
    )


def _load_sealed(segment: LogSegment, indexes_present: bool, next_base: int) -> int:
    """Trust the indexes of a sealed segment if they look sane; returns 1 if rebuilt."""
    last_entry = segment.offset_index.last_entry()
    last_time = segment.time_index.last_entry()
    sane = (
        indexes_present
        and last_entry.position < max(segment.size, 1)
        and last_entry.offset < next_base
        and (last_time is not None or segment.size == 0)
    )
    if sane:
        segment.next_offset = segment.base_offset
        for _, batch in segment.scan(last_entry.position):
            segment.next_offset = batch.last_offset + 1
        assert last_time is not None or segment.size == 0
        if last_time is not None:
            segment.max_timestamp_ms, segment.offset_of_max_timestamp = last_time
        segment.seal()
        return 0
    log.info("rebuilding indexes of %s", segment.path)
    error = segment.rebuild(validate=False)
    if error is not None:
        raise error
    segment.seal()
    return 1


def _recover_active(segment: LogSegment) -> tuple[int, str | None]:
    """Rescan the active segment with CRC checks and cut it at the first bad batch."""
    error = segment.rebuild(validate=True)
    if error is None:
        return 0, None
    removed = segment.truncate_to_size()
    log.warning("cut %d bytes of torn tail from %s: %s", removed, segment.path, error)
    return removed, str(error)
