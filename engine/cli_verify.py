"""`oncelog verify ROOT`: check every byte of a partition directory or of a root of them.

Every segment is streamed batch by batch (`scan_file`: bounded reads) and each batch
checked: size, magic, CRC-32C, offsets increasing across batches and segments. Each
segment's `.index` is walked alongside its batches, then its `.timeindex` and
`.txnindex` checked, and every producer snapshot's CRC. A problem is one line naming
the file and the byte position in it.

What is corruption follows what opening the log would do (recovery/loader.py): a
tail that recovery cuts (a batch cut short at the end of the last segment; in an
oncelog directory, anything bad past the recovery point in the last segment) and an
index that recovery rebuilds are warnings. Anything else is corruption.

Strictly read-only, like `oncelog dump`: files are opened through the filesystem seam
with `writable=False`, LMDB metadata read-only (cli_stat.read_partition_meta), and no
`Log` is opened. Partition discovery is shared with `oncelog stat` (cli_stat).
"""

from __future__ import annotations

import argparse
import bisect
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, TextIO

import numpy as np

from oncelog.cli_stat import (
    BadInputError,
    Partition,
    PartitionMeta,
    find_partitions,
    read_partition_meta,
    segment_bases,
)
from oncelog.errors import CorruptRecordError, CorruptSnapshotError
from oncelog.recovery.fs import DEFAULT_FS, DelegatingFileSystem, FileHandle, FileSystem
from oncelog.recovery.loader import RecoveryPoint
from oncelog.recovery.snapshot import list_snapshot_offsets, read_snapshot, snapshot_file_name
from oncelog.segments.batch import RecordBatch, TruncatedBatchError, UnwrittenSpaceError
from oncelog.segments.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    check_client_appended,
    scan_file,
    segment_file_name,
)
from oncelog.segments.txn_index import ENTRY_SIZE, TXN_INDEX_SUFFIX, TransactionIndex

EXIT_OK, EXIT_CORRUPT, EXIT_BAD_INPUT = 0, 1, 2
CORRUPT, WARNING = "CORRUPT", "WARNING"
_OFFSET_ENTRY = struct.Struct(">ii")  # .index: relative offset, position in the .log
_TIME_ENTRY = struct.Struct(">qi")  # .timeindex: timestamp, relative offset
_INDEX_CHUNK_ENTRIES = 64 * 1024  # index files are read this many entries at a time
_CHUNK_BYTES = 1 << 20


class Problem(NamedTuple):
    severity: str
    path: str
    position: int | None
    reason: str
    offset: int | None = None  # base offset of the batch, when there is one

    def __str__(self) -> str:
        where = self.path if self.position is None else f"{self.path} position {self.position}"
        batch = "" if self.offset is None else f"batch at offset {self.offset}: "
        return f"{self.severity} {where}: {batch}{self.reason}"


@dataclass
class VerifyTotals:
    partitions: int = 0
    segments: int = 0
    batches: int = 0
    bytes: int = 0
    corrupt: int = 0
    warnings: int = 0

    def __str__(self) -> str:
        found = f"{self.corrupt} corrupt, {self.warnings} warnings"
        return (
            f"verified {self.partitions} partitions, {self.segments} segments, {self.batches} batches, "
            f"{self.bytes} bytes: {found if self.corrupt or self.warnings else 'no problems'}"
        )


class ReadOnlyFileSystem(DelegatingFileSystem):
    """Hands out read-only handles only: code given it can never create or change a file."""

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        return self.inner.open(path, writable=False)


def zeros_to_end(handle: FileHandle, start: int, end: int) -> bool:
    """True if bytes [start, end) are all zero (read a chunk at a time)."""
    zeros = bytes(_CHUNK_BYTES)
    while start < end:
        chunk = handle.pread(min(_CHUNK_BYTES, end - start), start)
        if not chunk or chunk != zeros[: len(chunk)]:
            return False
        start += len(chunk)
    return True


# -- index files -------------------------------------------------------------------------


class IndexEntry(NamedTuple):
    at: int  # position of the entry in the index file
    key: int  # .index: absolute offset; .timeindex: timestamp
    value: int  # .index: position in the .log; .timeindex: absolute offset


Flag = Callable[[int, str], None]  # (position in the file, reason)


def index_entries(handle: FileHandle, base: int, *, time: bool, flag: Flag) -> Iterator[IndexEntry]:
    """The entries before the zero-filled (pre-allocated) tail, each in order after the last.

    An entry out of order is flagged and skipped: `.index` entries grow strictly in
    both fields, `.timeindex` entries never decrease (Kafka's rules).
    """
    layout = _TIME_ENTRY if time else _OFFSET_ENTRY
    size = handle.size()
    whole = size - size % layout.size
    previous: IndexEntry | None = None
    zeros_at: int | None = None
    position = 0
    while position < whole:
        chunk = handle.pread(min(_INDEX_CHUNK_ENTRIES * layout.size, whole - position), position)
        usable = chunk[: len(chunk) - len(chunk) % layout.size]
        # An active index is megabytes of zeros: skip them at memcmp speed, not entry by entry.
        written = -(-len(usable.rstrip(b"\0")) // layout.size) * layout.size
        for n, (first, second) in enumerate(layout.iter_unpack(usable[:written])):
            at = position + n * layout.size
            if first == 0 and second == 0:  # no real entry is all zeros: pre-allocated space
                zeros_at = at if zeros_at is None else zeros_at
                continue
            if zeros_at is not None:
                flag(zeros_at, f"zero-filled entries are followed by an entry at position {at}")
                return
            entry = IndexEntry(at, first, base + second) if time else IndexEntry(at, base + first, second)
            problem = _entry_problem(entry, previous, base, time)
            if problem is not None:
                flag(at, problem)
                continue
            previous = entry
            yield entry
        if written < len(usable) and zeros_at is None:
            zeros_at = position + written
        if not usable:
            break
        position += len(usable)
    if size > whole and any(handle.pread(size - whole, whole)):
        flag(whole, f"a partial entry of {size - whole} bytes at the end")


def _entry_problem(entry: IndexEntry, previous: IndexEntry | None, base: int, time: bool) -> str | None:
    offset, position = (entry.value, 0) if time else (entry.key, entry.value)
    what = (
        f"(timestamp {entry.key}, offset {entry.value})"
        if time
        else f"(offset {entry.key}, position {position})"
    )
    if offset < base or position < 0:
        return f"entry {what} is below the segment's base offset {base}" + ("" if time else " or position 0")
    if previous is None:
        return None
    if time:
        disorder = entry.key < previous.key or entry.value < previous.value
    else:
        disorder = entry.key <= previous.key or entry.value <= previous.value
    return f"entry {what} is out of order after ({previous.key}, {previous.value})" if disorder else None


class OffsetIndexWalk:
    """Walks the `.index` alongside the batches: each entry must be at a batch start.

    The entry's offset is that batch's last offset: oncelog indexes each batch so, as
    Kafka's recovery does. A Kafka broker up to 3.6 indexes a follower's append of many
    batches by its last offset at its first batch's position; lookups still find every
    offset (they scan forward from the entry), so in a Kafka directory (`exact=False`) an
    entry's offset may be past its batch, never before it.
    """

    def __init__(self, entries: Iterator[IndexEntry], flag: Flag, *, exact: bool):
        self._entries, self._flag, self._exact = entries, flag, exact
        self._next = next(entries, None)

    def on_batch(self, position: int, base_offset: int, last_offset: int) -> None:
        entry = self._next
        while entry is not None and entry.value <= position:
            if entry.value < position:
                self._flag(
                    entry.at, f"offset {entry.key} -> log position {entry.value}: no batch starts there"
                )
            elif entry.key != last_offset and (self._exact or entry.key < base_offset):
                self._flag(
                    entry.at,
                    f"offset {entry.key} -> log position {position}, where the batch holds offsets "
                    f"{base_offset}..{last_offset}",
                )
            entry = self._next = next(self._entries, None)

    def finish(self, data_end: int) -> None:
        """Flag the entries past the last batch (call only when the whole .log was read)."""
        for entry in [self._next, *self._entries] if self._next is not None else ():
            self._flag(
                entry.at,
                f"offset {entry.key} -> log position {entry.value}, past the batches (end {data_end})",
            )


# -- batches -------------------------------------------------------------------------------


def batch_problem(batch: RecordBatch, position: int, base: int, prev: int | None, strict: bool) -> str | None:
    """Why a batch is bad, or None. `prev`: the last offset before it; `strict`: client appends only."""
    try:
        batch.validate()  # magic, CRC, lastOffsetDelta >= 0, recordsCount <= lastOffsetDelta + 1, codec
    except CorruptRecordError as exc:
        return exc.reason
    h = batch.header
    if h.base_offset < base:
        return f"base offset is below the segment's base offset {base}"
    if prev is not None and h.base_offset <= prev:
        return f"offsets {h.base_offset}..{batch.last_offset} do not follow the previous batch's {prev}"
    if strict:
        # Kafka's cleaner keeps a compacted batch's lastOffsetDelta with fewer records, so
        # only a log written by client appends (each checked for it) must match exactly.
        if h.records_count and h.records_count != h.last_offset_delta + 1:
            return f"recordsCount {h.records_count} is not lastOffsetDelta {h.last_offset_delta} + 1"
        try:
            check_client_appended(batch, prev if position > 0 else None)
        except CorruptRecordError as exc:
            return exc.reason
    return None


def recovery_cuts(meta: PartitionMeta, base: int, position: int, next_offset: int, truncated: bool) -> bool:
    """Would opening the log cut its last segment at `position` as a torn tail, rather than refuse?

    The loader's rule: in an oncelog directory, damage the recovery point does not cover
    (a missing point is 0); in a Kafka one, only a batch cut short by the end of the file.
    """
    if not meta.oncelog:
        return truncated
    point = meta.recovery_point or RecoveryPoint(0)
    return not point.covers(base, position) and next_offset >= point.offset


def first_rebuilt(meta: PartitionMeta, bases: list[int]) -> int | None:
    """Base of the first segment an unclean open validates and re-indexes (the loader's rule)."""
    if not meta.oncelog or meta.clean_shutdown or not bases:
        return None
    point = meta.recovery_point.offset if meta.recovery_point is not None else 0
    return bases[max(bisect.bisect_right(bases, point) - 1, 0)]


class SegmentScan(NamedTuple):
    last_offset: int | None  # of the last batch read (or the previous segment's)
    batches: int
    bytes: int  # where the last batch read ends
    complete: bool  # every byte read: batches, then zeros to the end


# -- partitions --------------------------------------------------------------------------------


class PartitionVerifier:
    """Verifies partitions one at a time, reporting each problem as it is found."""

    def __init__(self, fs: FileSystem, report: Callable[[Problem], None], on_bytes: Callable[[int], None]):
        self.fs = fs
        self.totals = VerifyTotals()
        self._report = report
        self._on_bytes = on_bytes

    def problem(
        self, severity: str, path: str, position: int | None, reason: str, offset: int | None = None
    ) -> None:
        if severity == CORRUPT:
            self.totals.corrupt += 1
        else:
            self.totals.warnings += 1
        self._report(Problem(severity, path, position, reason, offset))

    def verify(self, partition: Partition) -> None:
        self.totals.partitions += 1
        directory = partition.path
        try:
            names = self.fs.listdir(directory)
        except OSError as exc:
            self.problem(CORRUPT, directory, None, f"cannot list: {exc.strerror or exc}")
            return
        meta = read_partition_meta(self.fs, directory)
        if meta.error is not None:
            self.problem(WARNING, directory, None, meta.error)
        bases, bad = segment_bases(names)
        for name in bad:
            self.problem(CORRUPT, os.path.join(directory, name), None, "a .log whose name is no base offset")
        if not bases:
            self.problem(WARNING, directory, None, f"no {LOG_SUFFIX} segment files")
        rebuilt_from = first_rebuilt(meta, bases)
        prev: int | None = None
        for n, base in enumerate(bases):
            rebuilt = rebuilt_from is not None and base >= rebuilt_from
            prev = self._segment(directory, base, prev, meta, is_last=n == len(bases) - 1, rebuilt=rebuilt)
        self._snapshots(directory, names)

    def _segment(
        self,
        directory: str,
        base: int,
        prev: int | None,
        meta: PartitionMeta,
        *,
        is_last: bool,
        rebuilt: bool,
    ) -> int | None:
        """Check one segment and its indexes; returns the last offset so far."""
        self.totals.segments += 1
        path = os.path.join(directory, segment_file_name(base, LOG_SUFFIX))
        if prev is not None and base <= prev:
            self.problem(CORRUPT, path, 0, f"segment base offset {base} is not after the last offset {prev}")
        index_path = path[: -len(LOG_SUFFIX)] + INDEX_SUFFIX
        flag = self._index_flag(index_path, rebuilt)
        handles: list[FileHandle] = []
        try:
            handles.append(handle := self.fs.open(path, writable=False))
            index = self._open_optional(index_path)
            handles += [index] if index is not None else []
            entries = index_entries(index, base, time=False, flag=flag) if index is not None else iter(())
            walk = OffsetIndexWalk(entries, flag, exact=meta.oncelog)
            scan = self._scan(handle, base, prev, meta, is_last, walk)
            if scan.complete:
                walk.finish(scan.bytes)
            self._on_bytes(handle.size() - scan.bytes)  # zeros, or what follows the damage
        except OSError as exc:
            self.problem(CORRUPT, path, None, f"cannot read: {exc.strerror or exc}")
            return prev
        finally:
            for opened in handles:
                opened.close()
        self.totals.batches += scan.batches
        self.totals.bytes += scan.bytes
        last = scan.last_offset if scan.complete else None  # bounds what the other indexes may name
        self._time_index(path[: -len(LOG_SUFFIX)] + TIME_INDEX_SUFFIX, base, last, rebuilt)
        self._txn_index(path[: -len(LOG_SUFFIX)] + TXN_INDEX_SUFFIX, base, last, rebuilt)
        return scan.last_offset

    def _scan(
        self,
        handle: FileHandle,
        base: int,
        prev: int | None,
        meta: PartitionMeta,
        is_last: bool,
        walk: OffsetIndexWalk,
    ) -> SegmentScan:
        """Check every batch; report each problem, and go on while the headers allow."""
        path, size = handle.path, handle.size()
        batches = end = 0
        last = prev
        try:
            for position, batch in scan_file(handle, 0, size):
                problem = batch_problem(batch, position, base, last, meta.client_only)
                if problem is not None:
                    after = base if last is None else last + 1
                    if is_last and recovery_cuts(meta, base, position, after, truncated=False):
                        self.problem(WARNING, path, position, _cut(size - position, position, problem))
                        return SegmentScan(last, batches, end, False)
                    self.problem(CORRUPT, path, position, problem, batch.base_offset)
                walk.on_batch(position, batch.base_offset, batch.last_offset)
                self._on_bytes(batch.size)
                batches, end = batches + 1, position + batch.size
                last = batch.last_offset if last is None else max(last, batch.last_offset)
        except CorruptRecordError as exc:
            at = end if exc.position is None else exc.position
            if isinstance(exc, UnwrittenSpaceError) and zeros_to_end(handle, at, size):
                if not is_last:  # the engine trims a segment when it seals it
                    self.problem(
                        WARNING, path, at, f"{size - at} bytes of zeros after a sealed segment's batches"
                    )
                return SegmentScan(last, batches, end, True)
            truncated = isinstance(exc, TruncatedBatchError)
            if is_last and recovery_cuts(meta, base, at, base if last is None else last + 1, truncated):
                self.problem(WARNING, path, at, _cut(size - at, at, exc.reason))
            else:
                self.problem(CORRUPT, path, at, exc.reason)
            return SegmentScan(last, batches, end, False)
        return SegmentScan(last, batches, end, True)

    def _open_optional(self, path: str) -> FileHandle | None:
        return self.fs.open(path, writable=False) if self.fs.exists(path) else None

    def _index_flag(self, path: str, rebuilt: bool) -> Flag:
        def flag(position: int, reason: str) -> None:
            if rebuilt:
                self.problem(WARNING, path, position, f"{reason} (recovery rebuilds this index)")
            else:
                self.problem(CORRUPT, path, position, reason)

        return flag

    def _time_index(self, path: str, base: int, last: int | None, rebuilt: bool) -> None:
        flag = self._index_flag(path, rebuilt)
        try:
            handle = self._open_optional(path)
            if handle is None:
                return
            try:
                for entry in index_entries(handle, base, time=True, flag=flag):
                    if last is not None and entry.value > last:
                        flag(entry.at, f"offset {entry.value} is past the segment's last offset {last}")
            finally:
                handle.close()
        except OSError as exc:
            flag(0, f"cannot read: {exc.strerror or exc}")

    def _txn_index(self, path: str, base: int, last: int | None, rebuilt: bool) -> None:
        if not self.fs.exists(path):
            return
        flag = self._index_flag(path, rebuilt)
        # TransactionIndex opens read-write; handed a read-only seam it cannot change the file.
        index = TransactionIndex(ReadOnlyFileSystem(self.fs), path, base)
        try:
            for n, txn in enumerate(index.entries()):
                if last is not None and txn.last_offset > last:
                    flag(
                        n * ENTRY_SIZE,
                        f"marker offset {txn.last_offset} is past the segment's last offset {last}",
                    )
        except CorruptRecordError as exc:
            flag(exc.position or 0, exc.reason)
        except OSError as exc:
            flag(0, f"cannot read: {exc.strerror or exc}")
        finally:
            index.close()

    def _snapshots(self, directory: str, names: list[str]) -> None:
        for offset in list_snapshot_offsets(self.fs, directory, names):
            path = os.path.join(directory, snapshot_file_name(offset))
            try:
                rows = read_snapshot(self.fs, directory, offset)
            except CorruptSnapshotError as exc:
                self.problem(CORRUPT, path, None, str(exc).removeprefix(f"{path}: "))
                continue
            except OSError as exc:
                self.problem(CORRUPT, path, None, f"cannot read: {exc.strerror or exc}")
                continue
            if len(np.unique(rows["producer_id"])) != len(rows):
                self.problem(CORRUPT, path, None, "a producer id appears twice")


def _cut(count: int, position: int, why: str) -> str:
    return f"torn tail: recovery will cut {count} bytes at position {position} ({why})"


# -- the command -------------------------------------------------------------------------------

DESCRIPTION = """\
Check every partition under ROOT without changing anything. ROOT is a partition
directory (it holds %020d.log segments) or a root of <topic>-<partition>
directories (an oncelog LogManager root, or a Kafka log.dir); root-wide entries
(.lock, meta.lmdb, producer_ids.lmdb, Kafka's checkpoint files) are skipped, and
so are partitions being deleted (<tp>.<hex>-delete, or a LogManager delete intent).

Checked, each file streamed in bounded reads:
  - every batch of every segment: size and length, magic 2, CRC-32C, offsets
    strictly increasing across batches and segments (the first batch at or above
    its segment's base offset); in a log written only by client appends also
    recordsCount = lastOffsetDelta + 1, partitionLeaderEpoch -1 and no gaps
    (a compacted Kafka batch legally holds fewer records than offsets);
  - .index: offsets and positions strictly increasing, each entry at the start of
    the batch whose last offset it names, none past the batches;
  - .timeindex: timestamps and offsets non-decreasing, offsets within the segment;
  - .txnindex: every entry parses, in order, within its segment;
  - each producer snapshot, oncelog's or Kafka's v1: CRC, header, no producer twice.
Zeros up to the end of a segment or an index are pre-allocated space, not damage.

Each problem is one line naming the file and the byte position in it (and the
batch's base offset): CORRUPT for damage that opening the log would refuse or
serve; WARNING for what recovery repairs by itself: a torn tail of the last
segment ("recovery will cut N bytes at position P": in a Kafka directory a batch
cut short by the end of the file, in an oncelog one anything past the recovery
point), an index that an unclean open rebuilds, zeros after the batches of a
sealed segment. A summary line follows.

Strictly read-only: files are opened read-only, no lock is taken and no log is
opened, so it is safe on a live or a damaged log. A progress bar (partitions
done, bytes checked) is drawn on stderr when that is a terminal.

Exit status: 0 when no corruption was found (warnings allowed), 1 when some was
(or a file could not be read), 2 for bad input (ROOT missing, or holding neither
segments nor partition directories)."""

EPILOG = """\
examples:
  oncelog verify data/orders-0          # one partition directory
  oncelog verify /var/lib/kafka/data    # every <topic>-<partition> under a root
  oncelog verify --quiet --no-progress data || echo "corruption found"   # for cron"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "verify",
        help="check every batch, index and snapshot of a partition or a root (read-only)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("root", metavar="ROOT", help="a partition directory or a root of them")
    parser.add_argument(
        "--quiet", action="store_true", help="print only CORRUPT lines: no warnings, no summary"
    )
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="never draw the progress bar"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    fs = DEFAULT_FS
    try:
        partitions = find_partitions(args.root, fs)
    except BadInputError as exc:
        print(f"oncelog verify: {exc}", file=err)
        return EXIT_BAD_INPUT
    with _ProgressBar(out, err, len(partitions), show=args.progress and err.isatty()) as bar:

        def report(problem: Problem) -> None:
            if problem.severity == CORRUPT or not args.quiet:
                bar.print(str(problem))

        verifier = PartitionVerifier(fs, report, bar.advance)
        for partition in partitions:
            verifier.verify(partition)
            bar.partition_done()
    if not args.quiet:
        print(verifier.totals, file=out)
    return EXIT_CORRUPT if verifier.totals.corrupt else EXIT_OK


class _ProgressBar:
    """rich's bar on stderr: partitions done, bytes checked. Nothing unless `show`."""

    def __init__(self, out: TextIO, err: TextIO, partitions: int, *, show: bool):
        self._out = out
        self._progress: Any = None
        self._checked = self._shown = 0
        if not show:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("verify"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("partitions, {task.fields[mib]:.1f} MiB checked"),
            TimeElapsedColumn(),
            console=Console(file=err),
            transient=True,
        )
        self._task = self._progress.add_task("verify", total=partitions, mib=0.0)

    def __enter__(self) -> _ProgressBar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def advance(self, count: int) -> None:
        # Redrawn once a MiB, not once a batch: a segment of small batches has millions.
        self._checked += count
        if self._progress is not None and self._checked - self._shown >= _CHUNK_BYTES:
            self._shown = self._checked
            self._progress.update(self._task, mib=self._checked / 2**20)

    def partition_done(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, mib=self._checked / 2**20)

    def print(self, line: str) -> None:
        if self._progress is not None and self._out.isatty():
            # The same terminal: print above the bar rather than through it.
            self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self._out)
