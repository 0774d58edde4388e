"""`oncelog stat ROOT`: one row per partition, and the partition discovery `oncelog verify` shares.

A row: topic, partition, segments, bytes, log start and end offsets, producers, open
transactions and whether the last shutdown was clean. The end offset comes from a
scan of the batch headers of the last segment. Producers and open transactions are
rebuilt in memory as the loader rebuilds them: the newest readable snapshot at or
below the end (oncelog's or Kafka's v1), then the batch headers after it, through
the engine's own rules (`apply_batch`, `apply_marker`). Expiry is not applied: the
directory does not say its `producer_expiration_ms`.

Strictly read-only, like `oncelog dump` and `oncelog verify`: files are opened
through the filesystem seam with `writable=False`, LMDB metadata with
`readonly=True, lock=False` (which creates nothing: the seam's store opens read-write
and would create `lock.mdb`), and no `Log` is opened.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import os
import struct
from typing import Any, Literal, NamedTuple, TextIO

import lmdb

from oncelog.errors import CorruptRecordError, CorruptSnapshotError
from oncelog.layout import TopicPartition, is_pending_delete, parse_partition_dir_name
from oncelog.log import CLEAN_SHUTDOWN_FILE, METADATA_DIR
from oncelog.producer_state import BatchMetadata, WorkingState, apply_batch, apply_marker
from oncelog.recovery.fs import DEFAULT_FS, FileSystem
from oncelog.recovery.loader import (
    CLIENT_ONLY_KEY,
    LOG_START_KEY,
    RECOVERY_POINT_KEY,
    RECOVERY_POSITION_KEY,
    RECOVERY_SEGMENT_KEY,
    RecoveryPoint,
)
from oncelog.recovery.snapshot import list_snapshot_offsets, read_snapshot
from oncelog.segments.batch import RecordBatch, UnwrittenSpaceError
from oncelog.segments.control import decode_txn_marker
from oncelog.segments.segment import LOG_SUFFIX, parse_segment_file_name, scan_file, segment_file_name

EXIT_OK, EXIT_BAD_INPUT = 0, 2
KAFKA_CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"  # in each Kafka log.dir after a clean stop
KAFKA_LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
# A LogManager commits `delete/<topic>-<partition>` to its root's store before deleting a
# partition's files (engine/log_manager.py's DELETE_INTENT_PREFIX; repeated here so the
# tools do not import the manager): such a directory may be half gone, and is skipped.
DELETE_INTENT_PREFIX = b"delete/"
_OFFSET = struct.Struct(">q")  # how the loader stores offsets in LMDB

# -- discovery and metadata (shared with `oncelog verify`) ------------------------------


class BadInputError(Exception):
    """ROOT is missing, or holds neither segments nor partition directories."""


class Partition(NamedTuple):
    path: str
    tp: TopicPartition | None  # None when the directory's name is not `<topic>-<partition>`
    root: str  # the directory holding it, where Kafka keeps its checkpoints

    @property
    def label(self) -> str:
        return str(self.tp) if self.tp is not None else os.path.basename(self.path)


class PartitionMeta(NamedTuple):
    """What an oncelog directory's LMDB store says; a Kafka directory has none."""

    oncelog: bool
    clean_shutdown: bool
    recovery_point: RecoveryPoint | None
    client_only: bool
    log_start_offset: int | None
    error: str | None = None


def find_partitions(root: str, fs: FileSystem) -> list[Partition]:
    """ROOT itself if it holds segments, else its `<topic>-<partition>` subdirectories."""
    if not os.path.exists(root):
        raise BadInputError(f"no such file or directory: {root}")
    if not os.path.isdir(root):
        raise BadInputError(f"not a directory: {root} (give a partition directory or a root of them)")
    path = os.path.normpath(root)
    try:
        names = fs.listdir(path)
    except OSError as exc:
        raise BadInputError(f"cannot list {root}: {exc.strerror or exc}") from exc
    if any(name.endswith(LOG_SUFFIX) for name in names):
        absolute = os.path.abspath(path)
        tp = parse_partition_dir_name(os.path.basename(absolute))
        return [Partition(path, tp, os.path.dirname(absolute))]
    found = []
    deleting = _delete_intents(os.path.join(path, METADATA_DIR)) if METADATA_DIR in names else set()
    for name in names:
        # Root-wide entries (.lock, meta.lmdb, producer_ids.lmdb, checkpoints) never parse;
        # a `<tp>.<hex>-delete` directory or a delete intent's is no longer part of the root.
        tp = None if is_pending_delete(name) or name in deleting else parse_partition_dir_name(name)
        if tp is not None and os.path.isdir(os.path.join(path, name)):
            found.append(Partition(os.path.join(path, name), tp, path))
    if not found:
        raise BadInputError(f"no {LOG_SUFFIX} segments and no <topic>-<partition> directories in {root}")
    return sorted(found, key=lambda p: (p.tp.topic, p.tp.partition) if p.tp else ("", 0))


def segment_bases(names: list[str]) -> tuple[list[int], list[str]]:
    """(sorted base offsets of the segments, `.log` names that are not `%020d.log`)."""
    bases: list[int] = []
    bad: list[str] = []
    for name in names:
        base = parse_segment_file_name(name, LOG_SUFFIX)
        if base is not None:
            bases.append(base)
        elif name.endswith(LOG_SUFFIX):
            bad.append(name)
    return sorted(bases), bad


def read_partition_meta(fs: FileSystem, directory: str) -> PartitionMeta:
    if not fs.exists(os.path.join(directory, METADATA_DIR)):
        return PartitionMeta(False, False, None, False, None)
    clean = fs.exists(os.path.join(directory, CLEAN_SHUTDOWN_FILE))
    try:
        stored = _read_store(os.path.join(directory, METADATA_DIR))
    except lmdb.Error as exc:
        return PartitionMeta(True, clean, None, False, None, error=f"cannot read {METADATA_DIR}: {exc}")
    point = None
    if RECOVERY_POINT_KEY in stored:
        segment = stored.get(RECOVERY_SEGMENT_KEY)
        point = RecoveryPoint(stored[RECOVERY_POINT_KEY], segment, stored.get(RECOVERY_POSITION_KEY, 0))
    return PartitionMeta(True, clean, point, stored.get(CLIENT_ONLY_KEY) == 1, stored.get(LOG_START_KEY))


def _read_store(path: str) -> dict[str, int]:
    # readonly + lock=False: LMDB then creates and writes nothing. A writer may commit
    # meanwhile; LMDB's two meta pages let a reader see the old commit or the new one.
    keys = (RECOVERY_POINT_KEY, RECOVERY_SEGMENT_KEY, RECOVERY_POSITION_KEY, CLIENT_ONLY_KEY, LOG_START_KEY)
    env = lmdb.open(path, readonly=True, lock=False, create=False, subdir=True, max_dbs=0)
    try:
        with env.begin() as txn:
            raw = {key: txn.get(key.encode()) for key in keys}
    finally:
        env.close()
    return {key: int(_OFFSET.unpack(v)[0]) for key, v in raw.items() if v is not None and len(v) == 8}


def _delete_intents(store: str) -> set[str]:
    """The partition directories a LogManager root is deleting (read-only, see _read_store)."""
    try:
        env = lmdb.open(store, readonly=True, lock=False, create=False, subdir=True, max_dbs=0)
    except lmdb.Error:
        return set()  # not a LogManager's store: nothing to skip
    try:
        with env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(DELETE_INTENT_PREFIX):
                return set()
            keys = (bytes(key) for key in cursor.iternext(keys=True, values=False))
            intents = [key for key in keys if key.startswith(DELETE_INTENT_PREFIX)]
    finally:
        env.close()
    return {key[len(DELETE_INTENT_PREFIX) :].decode("utf-8", errors="replace") for key in intents}


def read_kafka_log_starts(fs: FileSystem, root: str) -> dict[TopicPartition, int]:
    """Kafka's `log-start-offset-checkpoint`: version 0, a count, then `topic partition offset` lines."""
    path = os.path.join(root, KAFKA_LOG_START_CHECKPOINT)
    if not fs.exists(path):
        return {}
    handle = fs.open(path, writable=False)
    try:
        lines = handle.pread(handle.size(), 0).decode("utf-8", errors="replace").splitlines()
    finally:
        handle.close()
    starts = {}
    for line in lines[2:] if lines[:1] == ["0"] else ():
        fields = line.split()
        if len(fields) == 3 and fields[1].isdigit() and fields[2].lstrip("-").isdigit():
            starts[TopicPartition(fields[0], int(fields[1]))] = int(fields[2])
    return starts


# -- one partition's row --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PartitionStat:
    topic: str
    partition: int | None
    segments: int
    size_bytes: int  # of the segment files' data (pre-allocated space not counted)
    log_start_offset: int
    log_end_offset: int
    producers: int
    open_transactions: int
    last_stable_offset: int  # first offset of the oldest open transaction, else the end
    clean_shutdown: bool
    format: str  # "oncelog" or "kafka"
    path: str
    notes: tuple[str, ...] = ()  # what could not be read (a torn tail, a corrupt snapshot)


class _Replay:
    """Producer state in memory, rebuilt as the loader rebuilds it (LogLoader._apply)."""

    def __init__(self, snapshot_offset: int | None, rows: Any) -> None:
        self.start = snapshot_offset
        self.states: dict[int, WorkingState] = {}
        for row in rows if rows is not None else ():
            pid = int(row["producer_id"])
            self.states[pid] = WorkingState(
                pid,
                int(row["producer_epoch"]),
                [],  # the dedupe window does not change the counts
                int(row["last_activity_ms"]),
                int(row["coordinator_epoch"]),
                int(row["txn_first_offset"]),
            )

    def apply(self, batch: RecordBatch) -> None:
        h = batch.header
        if h.producer_id < 0 or (self.start is not None and h.base_offset < self.start):
            return
        w = self.states.get(h.producer_id) or WorkingState(
            h.producer_id, h.producer_epoch, [], h.max_timestamp
        )
        if batch.is_control:
            marker = decode_txn_marker(batch)
            if marker is None:
                return  # an empty control batch, or not a marker: the loader skips it too
            apply_marker(w, h.producer_epoch, h.base_offset, h.max_timestamp, marker)
        else:
            meta = BatchMetadata(
                h.base_sequence, batch.last_sequence, h.base_offset, batch.last_offset, h.max_timestamp
            )
            apply_batch(w, h.producer_epoch, meta, False, batch.is_transactional)
        self.states[h.producer_id] = w

    def open_transactions(self) -> list[int]:
        return [w.txn_first_offset for w in self.states.values() if w.txn_first_offset >= 0]


class _Scanned(NamedTuple):
    end_offset: int  # one past the last good batch
    data_bytes: int  # where the last good batch ends
    error: str | None


def _scan(fs: FileSystem, path: str, base: int, replay: _Replay) -> _Scanned:
    """Replay a segment's batch headers; stop at pre-allocated zeros or the first bad header."""
    end_offset, data = base, 0
    handle = fs.open(path, writable=False)
    try:
        for position, batch in scan_file(handle, 0, handle.size()):
            replay.apply(batch)
            end_offset, data = batch.last_offset + 1, position + batch.size
    except CorruptRecordError as exc:
        if not isinstance(exc, UnwrittenSpaceError):
            return _Scanned(end_offset, data, str(exc))
    finally:
        handle.close()
    return _Scanned(end_offset, data, None)


def _newest_snapshot(
    fs: FileSystem, directory: str, names: list[str], below: int | None
) -> tuple[int | None, Any]:
    """(offset, rows) of the newest readable snapshot at or below `below` (None: any)."""
    for offset in reversed(list_snapshot_offsets(fs, directory, names)):
        if below is not None and offset > below:
            continue
        try:
            return offset, read_snapshot(fs, directory, offset)
        except (CorruptSnapshotError, OSError):
            continue  # the loader sets it aside and tries the next older one
    return None, None


def stat_partition(
    fs: FileSystem, partition: Partition, kafka_starts: dict[TopicPartition, int]
) -> PartitionStat:
    directory = partition.path
    names = fs.listdir(directory)
    bases, _ = segment_bases(names)
    meta = read_partition_meta(fs, directory)
    replay, scanned, sizes, errors = _replay_tail(fs, directory, names, bases, None)
    if replay.start is not None and replay.start > scanned.end_offset:
        # The snapshot describes data past the end (a cut tail): the loader starts over from an older one.
        replay, scanned, sizes, errors = _replay_tail(fs, directory, names, bases, scanned.end_offset)
    notes = ([meta.error] if meta.error else []) + errors
    end = scanned.end_offset if bases else (meta.log_start_offset or 0)
    first = bases[0] if bases else end
    stored = (
        meta.log_start_offset if meta.oncelog else kafka_starts.get(partition.tp) if partition.tp else None
    )
    start = min(max(stored or 0, first), end)
    open_txns = replay.open_transactions()
    if meta.oncelog:
        clean = meta.clean_shutdown
    else:
        clean = fs.exists(os.path.join(partition.root, KAFKA_CLEAN_SHUTDOWN_FILE))
    return PartitionStat(
        topic=partition.tp.topic if partition.tp else partition.label,
        partition=partition.tp.partition if partition.tp else None,
        segments=len(bases),
        size_bytes=sum(sizes),
        log_start_offset=start,
        log_end_offset=end,
        producers=len(replay.states),
        open_transactions=len(open_txns),
        last_stable_offset=min(open_txns, default=end),
        clean_shutdown=clean,
        format="oncelog" if meta.oncelog else "kafka",
        path=directory,
        notes=tuple(notes),
    )


def _replay_tail(
    fs: FileSystem, directory: str, names: list[str], bases: list[int], below: int | None
) -> tuple[_Replay, _Scanned, list[int], list[str]]:
    """The replayed producers, the last segment's scan, each segment's data bytes, scan errors."""
    offset, rows = _newest_snapshot(fs, directory, names, below)
    replay = _Replay(offset, rows)
    # Segments wholly below the snapshot are not read, only sized.
    first_read = max(bisect.bisect_right(bases, offset) - 1, 0) if offset is not None else 0
    sizes: list[int] = []
    errors: list[str] = []
    scanned = _Scanned(bases[-1] if bases else 0, 0, None)
    for n, base in enumerate(bases):
        path = os.path.join(directory, segment_file_name(base, LOG_SUFFIX))
        if n >= first_read or n == len(bases) - 1:
            scanned = _scan(fs, path, base, replay)
            sizes.append(scanned.data_bytes)
            errors += [scanned.error] if scanned.error else []
        else:
            handle = fs.open(path, writable=False)
            try:
                sizes.append(handle.size())
            finally:
                handle.close()
    return replay, scanned, sizes, errors


# -- the command -------------------------------------------------------------------------------

DESCRIPTION = """\
Print one row per partition under ROOT: topic, partition, segments, bytes of
segment data, log start and end offsets, producers, open transactions and whether
the last shutdown was clean, then a total row. ROOT is a partition directory (it
holds %020d.log segments) or a root of <topic>-<partition> directories (an
oncelog LogManager root, or a Kafka log.dir).

- start: oncelog's stored log start offset (moved by delete_records and
  retention); in a Kafka log.dir, its log-start-offset-checkpoint; else the first
  segment's base offset.
- end: one past the last batch of the last segment, from a scan of its headers.
- producers, open txns: the newest readable producer snapshot at or below the end
  (oncelog's or Kafka's v1), then the batch headers after it, as opening the log
  would rebuild them, but without expiry (stat does not know the log's
  producer_expiration_ms). An open transaction is a producer's transactional data
  not yet closed by a COMMIT or ABORT marker.
- clean: oncelog's .clean_shutdown marker, or Kafka's .kafka_cleanshutdown in the
  log.dir; "no" also for a log that is open right now.

A torn tail or an unreadable snapshot ends the scan where it is and is noted on
stderr (`oncelog verify` tells corruption from a torn tail). Strictly read-only:
files are opened read-only and no log is opened, so it is safe on a live log.

The table is drawn with rich on a terminal and as aligned plain text otherwise;
--json prints a list of objects, one per partition (with last_stable_offset,
format, path and notes besides the columns).

Exit status: 0, or 2 for bad input (ROOT missing, or holding neither segments nor
partition directories)."""

EPILOG = """\
examples:
  oncelog stat data/orders-0
  oncelog stat /var/lib/kafka/data
  oncelog stat --json data | jq '.[] | select(.open_transactions > 0)'"""

COLUMNS = ("topic", "partition", "segments", "bytes", "start", "end", "producers", "open txns", "clean")


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "stat",
        help="one row per partition: segments, bytes, start/end offsets, producers, open transactions",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("root", metavar="ROOT", help="a partition directory or a root of them")
    parser.add_argument("--json", action="store_true", help="print a JSON list of objects, one per partition")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    fs = DEFAULT_FS
    try:
        partitions = find_partitions(args.root, fs)
    except BadInputError as exc:
        print(f"oncelog stat: {exc}", file=err)
        return EXIT_BAD_INPUT
    starts: dict[str, dict[TopicPartition, int]] = {}
    stats = []
    for partition in partitions:
        if partition.root not in starts:
            starts[partition.root] = read_kafka_log_starts(fs, partition.root)
        stat = stat_partition(fs, partition, starts[partition.root])
        for note in stat.notes:
            print(f"oncelog stat: {partition.label}: {note}", file=err)
        stats.append(stat)
    if args.json:
        print(json.dumps([dataclasses.asdict(stat) for stat in stats], indent=2), file=out)
    elif out.isatty():
        _print_rich(table_rows(stats), out)
    else:
        for line in plain_table(table_rows(stats)):
            print(line, file=out)
    return EXIT_OK


def table_rows(stats: list[PartitionStat]) -> list[list[str]]:
    """The cells of each row, the total row last."""
    rows = [
        [
            s.topic,
            "-" if s.partition is None else str(s.partition),
            str(s.segments),
            str(s.size_bytes),
            str(s.log_start_offset),
            str(s.log_end_offset),
            str(s.producers),
            str(s.open_transactions),
            "yes" if s.clean_shutdown else "no",
        ]
        for s in stats
    ]
    total = ["total", "", str(sum(s.segments for s in stats))]
    total += [str(sum(s.size_bytes for s in stats)), "", "", str(sum(s.producers for s in stats))]
    total += [str(sum(s.open_transactions for s in stats)), ""]
    return [*rows, total]


def plain_table(rows: list[list[str]]) -> list[str]:
    """Aligned columns: text left, numbers right."""
    widths = [max(len(cell) for cell in column) for column in zip(COLUMNS, *rows, strict=True)]
    lines = []
    for row in [list(COLUMNS), *rows]:
        cells = [
            c.ljust(w) if n in (0, 8) else c.rjust(w)
            for n, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _print_rich(rows: list[list[str]], out: TextIO) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for n, name in enumerate(COLUMNS):
        # Headers whole: a narrow terminal folds the long topic names instead.
        justify: Literal["left", "right"] = "right" if 0 < n < 8 else "left"
        table.add_column(
            name, justify=justify, overflow="fold", no_wrap=n > 0, min_width=8 if n == 0 else None
        )
    for row in rows[:-1]:
        table.add_row(*row)
    table.add_section()
    table.add_row(*rows[-1], style="bold")
    Console(file=out).print(table)
