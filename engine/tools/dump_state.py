"""`oncelog dump` of producer-state snapshots and of offset/time indexes (read-only).

- A snapshot (`%020d.snapshot`, oncelog's format or Kafka's v1) is printed one line
  per producer, as Kafka's DumpLogSegments prints one:
  `producerId: P producerEpoch: E coordinatorEpoch: C currentTxnFirstOffset: T
  lastTimestamp: L lastAppend: A firstSequence: F lastSequence: S lastOffset: O
  offsetDelta: D` (the fields of its newest batch). lastTimestamp is the newest
  batch's timestamp, from the client's clock; lastAppend is when the engine last
  appended for the producer, on its own clock, which is what expiry reads
  (`unknown` in Kafka's snapshots and oncelog's first version: the next open
  counts it as the open's time). oncelog's own format keeps up to 5 batches per
  producer: those follow the producer line, indented, oldest first.
- An offset index (`.index`, 8-byte entries) is printed `offset: N position: P` and
  a time index (`.timeindex`, 12-byte entries) `timestamp: T offset: N`, as Kafka
  prints them. The files are parsed with struct; a zero-filled tail (pre-allocated
  space) ends the entries. Entries out of order are corruption.

Everything here opens files with `writable=False` and never opens a `Log`.
"""

from __future__ import annotations

import os
import struct
from typing import TextIO

import numpy as np

from oncelog.errors import CorruptSnapshotError
from oncelog.producer_state import first_sequence_of
from oncelog.segments.index import OffsetIndex, TimeIndex
from oncelog.segments.segment import INDEX_SUFFIX, TIME_INDEX_SUFFIX, parse_segment_file_name
from oncelog.storage.fs import DEFAULT_FS, FileSystem
from oncelog.storage.snapshot import (
    ONCELOG_V1_VERSION,
    ONCELOG_VERSION,
    SNAPSHOT_SUFFIX,
    list_snapshot_offsets,
    read_snapshot,
)

PROG = "oncelog"
_VERSION = struct.Struct(">h")
_OFFSET_ENTRY = OffsetIndex.ENTRY  # relative offset, position
_TIME_ENTRY = TimeIndex.ENTRY  # timestamp, relative offset


def _complain(err: TextIO, out: TextIO, message: str) -> bool:
    out.flush()
    print(f"{PROG} dump: {message}", file=err)
    return False


# -- snapshots ------------------------------------------------------------------------


def dump_snapshot(path: str, out: TextIO, err: TextIO, *, fs: FileSystem = DEFAULT_FS) -> bool:
    """Dump one producer-state snapshot; False (after reporting to `err`) if unreadable or corrupt."""
    directory, name = os.path.split(path)
    offset = parse_segment_file_name(name, SNAPSHOT_SUFFIX)
    if offset is None:
        return _complain(err, out, f"not a snapshot file name (%020d{SNAPSHOT_SUFFIX}): {path}")
    try:
        handle = fs.open(path, writable=False)
        try:
            head = handle.pread(_VERSION.size, 0)
        finally:
            handle.close()
        rows = read_snapshot(fs, directory or ".", offset)
    except CorruptSnapshotError as exc:
        return _complain(err, out, f"corrupt snapshot {path}: {exc}")
    except OSError as exc:
        return _complain(err, out, f"cannot read {path}: {exc.strerror or exc}")
    windows = len(head) == _VERSION.size and _VERSION.unpack(head)[0] in (ONCELOG_VERSION, ONCELOG_V1_VERSION)
    print(f"Dumping {path}", file=out)
    for line in snapshot_lines(rows, windows=windows):
        print(line, file=out)
    print(f"Summary: {len(rows)} producers, state as of offset {offset}", file=out)
    return True


def snapshot_lines(rows: np.ndarray, *, windows: bool) -> list[str]:
    """One line per producer (its newest batch), then, if `windows`, each kept batch indented."""
    lines = []
    for row in rows:
        count = int(row["window_count"])
        newest = count - 1
        first_seq, last_seq, last_offset, delta = -1, -1, -1, -1
        if count:
            last_seq = int(row["last_sequence"][newest])
            last_offset = int(row["last_offset"][newest])
            delta = int(row["offset_delta"][newest])
            first_seq = first_sequence_of(last_seq, delta)
        appended = int(row["last_append_ms"])
        lines.append(
            f"producerId: {int(row['producer_id'])} producerEpoch: {int(row['producer_epoch'])}"
            f" coordinatorEpoch: {int(row['coordinator_epoch'])}"
            f" currentTxnFirstOffset: {int(row['txn_first_offset'])}"
            f" lastTimestamp: {int(row['last_timestamp_ms'])}"
            f" lastAppend: {appended if appended >= 0 else 'unknown'}"
            f" firstSequence: {first_seq} lastSequence: {last_seq}"
            f" lastOffset: {last_offset} offsetDelta: {delta}"
        )
        if windows:
            for i in range(count):
                last_i, delta_i = int(row["last_sequence"][i]), int(row["offset_delta"][i])
                lines.append(
                    f"    batch: {i} firstSequence: {first_sequence_of(last_i, delta_i)}"
                    f" lastSequence: {last_i}"
                    f" lastOffset: {int(row['last_offset'][i])}"
                    f" offsetDelta: {int(row['offset_delta'][i])}"
                    f" maxTimestamp: {int(row['max_timestamp_ms'][i])}"
                )
    return lines


def dump_newest_snapshot(directory: str, out: TextIO, err: TextIO, *, fs: FileSystem = DEFAULT_FS) -> bool:
    """Dump the newest snapshot in a partition directory (a line saying so if there is none)."""
    try:
        offsets = list_snapshot_offsets(fs, directory)
    except OSError as exc:
        return _complain(err, out, f"cannot list {directory}: {exc.strerror or exc}")
    if not offsets:
        print(f"No producer snapshot ({SNAPSHOT_SUFFIX}) in {directory}", file=out)
        return True
    return dump_snapshot(os.path.join(directory, f"{offsets[-1]:020d}{SNAPSHOT_SUFFIX}"), out, err, fs=fs)


# -- offset and time indexes -----------------------------------------------------------


def dump_segment_indexes(log_path: str, out: TextIO, err: TextIO, *, fs: FileSystem = DEFAULT_FS) -> bool:
    """Dump the `.index` and `.timeindex` beside a segment file, those that exist."""
    stem = log_path[: -len(".log")] if log_path.endswith(".log") else log_path
    ok = True
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        if fs.exists(stem + suffix):
            ok = dump_index(stem + suffix, out, err, fs=fs) and ok
    return ok


def dump_index(path: str, out: TextIO, err: TextIO, *, fs: FileSystem = DEFAULT_FS) -> bool:
    """Dump one `.index` or `.timeindex`; False (after reporting) on a read error or disorder."""
    is_time = path.endswith(TIME_INDEX_SUFFIX)
    suffix = TIME_INDEX_SUFFIX if is_time else INDEX_SUFFIX
    entry = _TIME_ENTRY if is_time else _OFFSET_ENTRY
    base = parse_segment_file_name(os.path.basename(path), suffix)
    base = 0 if base is None else base
    try:
        handle = fs.open(path, writable=False)
        try:
            data = handle.pread(handle.size(), 0)
        finally:
            handle.close()
    except OSError as exc:
        return _complain(err, out, f"cannot read {path}: {exc.strerror or exc}")
    count = len(data) // entry.size
    partial = len(data) - count * entry.size
    # A zero-filled tail is pre-allocated space, not entries.
    zero = bytes(entry.size)
    while count and data[(count - 1) * entry.size : count * entry.size] == zero:
        count -= 1
    print(f"Dumping {path}", file=out)
    previous: tuple[int, int] | None = None
    for n in range(count):
        first, second = entry.unpack_from(data, n * entry.size)
        if is_time:
            key, line = (first, base + second), f"timestamp: {first} offset: {base + second}"
        else:
            key, line = (base + first, second), f"offset: {base + first} position: {second}"
        if previous is not None and (key[0] < previous[0] or key[1] < previous[1]):
            print(f"Summary: {n} entries", file=out)
            what = "timestamp/offset" if is_time else "offset/position"
            return _complain(
                err, out, f"corrupt index {path} at position {n * entry.size}: {what} {key} after {previous}"
            )
        previous = key
        print(line, file=out)
    summary = f"Summary: {count} entries"
    if count * entry.size + partial < len(data):
        summary += f", then {len(data) - count * entry.size - partial} bytes of zero-filled space"
    if partial:
        summary += f" (a partial entry of {partial} bytes at the end is ignored)"
    print(summary, file=out)
    return True
