"""`oncelog dump`: print segments, transaction indexes, offset/time indexes and snapshots.

Modelled on Kafka's `kafka-dump-log.sh` (DumpLogSegments): one line per batch with
every header field, and with `--records` one line per record; a transaction index
(`.txnindex`) is dumped one line per aborted transaction. Strictly read-only: files
are opened through the filesystem seam with `writable=False` and segments are
streamed with `scan_file`, so memory stays bounded whatever the segment size and
nothing on disk is created or changed. It never opens a `Log` (which would take
the directory lock and recover).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TextIO

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK, PROG
from oncelog.cli.parsers.dump import MAX_SHOWN_CHARS
from oncelog.errors import CorruptRecordError
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, TruncatedBatchError
from oncelog.segments.compaction import delete_horizon_ms
from oncelog.segments.control import CONTROL_KEY, CONTROL_TYPE_NAMES, END_TXN_MARKER_VALUE
from oncelog.segments.records import Record
from oncelog.segments.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    parse_segment_file_name,
    scan_file,
)
from oncelog.segments.txn_index import ENTRY, ENTRY_SIZE, TXN_INDEX_SUFFIX, AbortedTxn, TransactionIndex
from oncelog.segments.txn_index import VERSION as TXN_INDEX_VERSION
from oncelog.storage.fs import DEFAULT_FS, FileSystem, ReadOnlyFileSystem
from oncelog.storage.snapshot import SNAPSHOT_SUFFIX
from oncelog.tools import dump_state
from oncelog.tools.partition_dirs import unwritten_tail

# Key and payload are shown up to this many characters.


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


@dataclass
class _FileSummary:
    batches: int = 0
    records: int = 0
    bytes: int = 0
    last_offset: int | None = None
    gap_offsets: int = 0  # offsets in the file's range that no batch holds


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    path: str | None = args.path
    if path is None and args.snapshot is None:
        print(f"{PROG} dump: give a PATH or --snapshot FILE (see --help)", file=err)
        return EXIT_BAD_INPUT
    status = EXIT_OK if path is None else _dump_path(path, args, out, err)
    if args.snapshot is not None and not dump_state.dump_snapshot(args.snapshot, out, err):
        status = EXIT_BAD_INPUT
    return status


def _dump_path(path: str, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if path.endswith(SNAPSHOT_SUFFIX) and not os.path.isdir(path):
        return EXIT_OK if dump_state.dump_snapshot(path, out, err) else EXIT_BAD_INPUT
    if path.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX)) and os.path.isfile(path):
        return EXIT_OK if dump_state.dump_index(path, out, err) else EXIT_BAD_INPUT
    files = _segment_files(path, err)
    if files is None:
        return EXIT_BAD_INPUT
    status = EXIT_OK
    next_bases = _next_bases(files)
    for file_path in files:
        if file_path.endswith(TXN_INDEX_SUFFIX):
            ok = dump_txn_index(file_path, out, err, fs=DEFAULT_FS)
        else:
            ok = dump_file(
                file_path,
                out,
                err,
                records=args.records,
                validate=args.validate,
                fs=DEFAULT_FS,
                next_base=next_bases.get(file_path),
            )
            if args.indexes and not dump_state.dump_segment_indexes(file_path, out, err):
                ok = False
        if not ok:
            status = EXIT_BAD_INPUT
    if args.producers:
        directory = path if os.path.isdir(path) else os.path.dirname(path) or "."
        if not dump_state.dump_newest_snapshot(directory, out, err):
            status = EXIT_BAD_INPUT
    return status


def _segment_files(path: str, err: TextIO) -> list[str] | None:
    """The files to dump for PATH, or None (after printing why) if there are none.

    For a directory: its segments in offset order, each followed by its transaction
    index if it has one.
    """
    if os.path.isdir(path):
        try:
            names = DEFAULT_FS.listdir(path)
        except OSError as exc:
            print(f"{PROG} dump: cannot list {path}: {exc.strerror or exc}", file=err)
            return None
        if not any(name.endswith(LOG_SUFFIX) for name in names):
            print(f"{PROG} dump: no {LOG_SUFFIX} segment files in directory {path}", file=err)
            return None
        kinds = (LOG_SUFFIX, TXN_INDEX_SUFFIX)
        wanted = [name for name in names if name.endswith(kinds)]

        def order(name: str) -> tuple[int, int, int, str]:
            kind = 0 if name.endswith(LOG_SUFFIX) else 1
            base = parse_segment_file_name(name, kinds[kind])
            return (0, base, kind, name) if base is not None else (1, 0, kind, name)

        return [os.path.join(path, name) for name in sorted(wanted, key=order)]
    if not os.path.exists(path):
        print(f"{PROG} dump: no such file or directory: {path}", file=err)
        return None
    # Any other file given explicitly is attempted: if it is not a segment, the scan says so.
    return [path]


def _next_bases(files: list[str]) -> dict[str, int]:
    """Each segment file's next segment's base offset, where one follows it (the end of its range)."""
    bases = [
        (path, base)
        for path in files
        if (base := parse_segment_file_name(os.path.basename(path), LOG_SUFFIX)) is not None
    ]
    return {path: bases[n + 1][1] for n, (path, _) in enumerate(bases[:-1])}


def dump_file(
    path: str,
    out: TextIO,
    err: TextIO,
    *,
    records: bool = False,
    validate: bool = True,
    fs: FileSystem = DEFAULT_FS,
    next_base: int | None = None,
) -> bool:
    """Dump one segment file to `out`; returns False (after reporting to `err`) on error.

    `next_base`: the next segment's base offset, when the file is dumped with its directory:
    offsets between the file's last batch and it are shown as a gap too.
    """
    try:
        handle = fs.open(path, writable=False)
    except OSError as exc:
        print(f"{PROG} dump: cannot open {path}: {exc.strerror or exc}", file=err)
        return False
    summary = _FileSummary()
    try:
        base = parse_segment_file_name(os.path.basename(path), LOG_SUFFIX)
        print(f"Dumping {path}", file=out)
        print(f"Log starting offset: {'unknown' if base is None else base}", file=out)
        size = handle.size()
        expected = base  # the offset the next batch starts at if nothing is missing
        try:
            for position, batch in scan_file(handle, 0, size):
                if expected is not None and batch.base_offset > expected:
                    summary.gap_offsets += _gap_line(expected, batch.base_offset - 1, out)
                expected = batch.last_offset + 1 if expected is None else max(expected, batch.last_offset + 1)
                print(_batch_line(batch, position, validate), file=out)
                summary.batches += 1
                summary.bytes = position + batch.size
                summary.last_offset = batch.last_offset
                if records:
                    summary.records += _dump_records(batch, out)
        except CorruptRecordError as exc:
            start = exc.position or 0
            if unwritten_tail(exc, handle, start):
                # A live log's pre-allocated space, or what a crash left of it: the data ends here.
                print(_summary_line(summary, records), file=out)
                print(f"{size - start} bytes of unwritten space follow the last batch", file=out)
                return True
            print(_summary_line(summary, records), file=out)
            out.flush()
            print(f"{PROG} dump: {_describe_error(exc, path, size, summary)}", file=err)
            return False
        except OSError as exc:
            print(_summary_line(summary, records), file=out)
            out.flush()
            print(f"{PROG} dump: cannot read {path}: {exc.strerror or exc}", file=err)
            return False
    finally:
        handle.close()
    if expected is not None and next_base is not None and next_base > expected:
        summary.gap_offsets += _gap_line(expected, next_base - 1, out)
    print(_summary_line(summary, records), file=out)
    if size == 0 and base is None:
        # An empty segment is a fresh active one; an empty file by any other name is no segment.
        print(f"{PROG} dump: not a Kafka v2 segment: {path} is empty and not named %020d.log", file=err)
        return False
    return True


def dump_txn_index(path: str, out: TextIO, err: TextIO, *, fs: FileSystem = DEFAULT_FS) -> bool:
    """Dump one transaction index (`.txnindex`) to `out`, one line per aborted transaction.

    Returns False (after reporting to `err`) if it cannot be read or an entry is corrupt;
    the entries before the corrupt one are printed first.
    """
    try:
        handle = fs.open(path, writable=False)
    except OSError as exc:
        print(f"{PROG} dump: cannot open {path}: {exc.strerror or exc}", file=err)
        return False
    print(f"Dumping {path}", file=out)
    base = parse_segment_file_name(os.path.basename(path), TXN_INDEX_SUFFIX)
    # An unconventional name has no base offset to check entries against: use 0.
    index = TransactionIndex(ReadOnlyFileSystem(fs), path, 0 if base is None else base)
    try:
        size = handle.size()
        try:
            entries = index.entries()
        except CorruptRecordError as exc:
            # The entries before the bad one passed the same checks: show them.
            good = handle.pread(exc.position or 0, 0)
            shown = [AbortedTxn(*fields[1:]) for fields in ENTRY.iter_unpack(good)]
            for txn in shown:
                print(_txn_line(txn), file=out)
            print(_txn_summary_line(len(shown), len(good), size), file=out)
            out.flush()
            print(f"{PROG} dump: corrupt transaction index: {exc}", file=err)
            return False
    except OSError as exc:
        out.flush()
        print(f"{PROG} dump: cannot read {path}: {exc.strerror or exc}", file=err)
        return False
    finally:
        index.close()
        handle.close()
    for txn in entries:
        print(_txn_line(txn), file=out)
    print(_txn_summary_line(len(entries), len(entries) * ENTRY_SIZE, size), file=out)
    return True


def _txn_line(txn: AbortedTxn) -> str:
    # Kafka's DumpLogSegments format; every entry the engine accepts is version 0.
    return (
        f"version: {TXN_INDEX_VERSION} producerId: {txn.producer_id} firstOffset: {txn.first_offset}"
        f" lastOffset: {txn.last_offset} lastStableOffset: {txn.last_stable_offset}"
    )


def _txn_summary_line(entries: int, entry_bytes: int, file_size: int) -> str:
    line = f"Summary: {entries} aborted transactions, {entry_bytes} bytes"
    partial = file_size % ENTRY_SIZE
    if partial and entry_bytes == file_size - partial:
        line += f" (a partial entry of {partial} bytes at the end is ignored, as a crash mid-append leaves)"
    return line


def _describe_error(
    exc: CorruptRecordError,
    path: str,
    file_size: int,
    summary: _FileSummary,
) -> str:
    where = str(exc)
    if exc.path is None:  # scan_file names the file; be safe if it ever does not
        where = f"{path} at position {summary.bytes}: {where}"
    truncated = isinstance(exc, TruncatedBatchError)
    # At the very start, the wrong magic or too few bytes to hold a size and magic
    # means this is no segment at all (a torn first batch still has both).
    at_start = summary.batches == 0 and (exc.position or 0) == 0
    if at_start and (not truncated or file_size < fmt.SIZE_AND_MAGIC_BYTES):
        return f"not a Kafka v2 segment: {where}"
    if truncated:
        return f"file ends in the middle of a batch: {where}"
    return f"corrupt batch header: {where}"


def _summary_line(summary: _FileSummary, records: bool) -> str:
    counted = f"{summary.records} records, " if records else ""
    last = "none" if summary.last_offset is None else str(summary.last_offset)
    gaps = f", {summary.gap_offsets} offsets in no batch" if summary.gap_offsets else ""
    return f"Summary: {summary.batches} batches, {counted}{summary.bytes} bytes, last offset {last}{gaps}"


def _gap_line(first: int, last: int, out: TextIO) -> int:
    """Print that no batch holds offsets [first, last]; how many offsets that is."""
    count = last - first + 1
    print(f"gap: offsets {first}..{last} ({_offsets(count)}) are in no batch", file=out)
    return count


def _offsets(count: int) -> str:
    return f"{count} offset" if count == 1 else f"{count} offsets"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _batch_line(batch: RecordBatch, position: int, validate: bool) -> str:
    line = (
        f"baseOffset: {batch.base_offset} lastOffset: {batch.last_offset}"
        f" count: {batch.records_count}"
        f" baseSequence: {batch.base_sequence} lastSequence: {batch.last_sequence}"
        f" producerId: {batch.producer_id} producerEpoch: {batch.producer_epoch}"
        f" partitionLeaderEpoch: {batch.partition_leader_epoch}"
        f" isTransactional: {_bool(batch.is_transactional)}"
        f" isControl: {_bool(batch.is_control)}"
    )
    horizon = delete_horizon_ms(batch)
    if horizon is not None:  # KIP-534: the base timestamp is the delete horizon (Kafka's field name)
        line += f" deleteHorizonMs: {horizon}"
    line += (
        f" position: {position} {batch.timestamp_type}: {batch.max_timestamp}"
        f" size: {batch.size} magic: {batch.magic} compresscodec: {batch.compression_name}"
        f" crc: {batch.crc}"  # unpacked as u32: unsigned decimal, like Kafka
    )
    if validate:
        line += f" isvalid: {_bool(batch.is_valid())}"
    # Offsets of the batch's range without a record: compaction removed them (it keeps
    # lastOffsetDelta), or, at all of them, left the batch empty.
    without = batch.last_offset - batch.base_offset + 1 - batch.records_count
    if without > 0:
        line += f" offsetsWithoutRecord: {without}"
    if batch.records_count == 0:
        line += " emptyBatch: true"
    return line


def _dump_records(batch: RecordBatch, out: TextIO) -> int:
    """Print the batch's records, and the offsets between them that hold none (a compacted
    batch keeps its offset range); returns how many records were decoded."""
    count = 0
    expected = batch.base_offset
    try:
        for record in batch.records():
            if record.offset > expected:
                _record_gap_line(expected, record.offset - 1, out)
            expected = max(expected, record.offset + 1)
            print(_record_line(batch, record), file=out)
            count += 1
    except CorruptRecordError as exc:
        print(f"| corrupt records: {exc}", file=out)
        return count
    if expected <= batch.last_offset:
        _record_gap_line(expected, batch.last_offset, out)
    return count


def _record_gap_line(first: int, last: int, out: TextIO) -> None:
    print(f"| gap: offsets {first}..{last} ({_offsets(last - first + 1)}) have no record", file=out)


def _record_line(batch: RecordBatch, record: Record) -> str:
    if batch.base_sequence >= 0:
        delta = record.offset - batch.base_offset
        sequence = (batch.base_sequence + delta) % (fmt.INT32_MAX + 1)
    else:
        sequence = fmt.NO_SEQUENCE
    header_keys = ", ".join(_shown(key.encode("utf-8")) for key, _ in record.headers)
    prefix = (
        f"| offset: {record.offset} {batch.timestamp_type}: {record.timestamp_ms}"
        f" keySize: {_size(record.key)} valueSize: {_size(record.value)}"
        f" sequence: {sequence} headerKeys: [{header_keys}]"
    )
    if batch.is_control:
        marker = _control_fields(record)
        if marker.startswith("endTxnMarker"):
            return f"{prefix} {marker}"
        if marker:
            prefix += f" {marker}"
    return f"{prefix} key: {_shown(record.key)} payload: {_shown(record.value)}"


def _control_fields(record: Record) -> str:
    """`endTxnMarker: ... coordinatorEpoch: N` for a decodable transaction marker,
    `controlType: N (NAME)` for another control record, "" if the key is unreadable."""
    key = record.key
    if key is None or len(key) < CONTROL_KEY.size:
        return ""
    _, control_type = CONTROL_KEY.unpack_from(key)
    value = record.value
    is_marker = control_type in (fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT)
    if is_marker and value is not None and len(value) >= END_TXN_MARKER_VALUE.size:
        _, coordinator_epoch = END_TXN_MARKER_VALUE.unpack_from(value)
        name = CONTROL_TYPE_NAMES[control_type]
        return f"endTxnMarker: {name} coordinatorEpoch: {coordinator_epoch}"
    name = CONTROL_TYPE_NAMES.get(control_type, "UNKNOWN")
    return f"controlType: {control_type} ({name})"


def _size(data: bytes | None) -> int:
    return -1 if data is None else len(data)


def _shown(data: bytes | None) -> str:
    """UTF-8 text on one line: bad bytes and non-printable characters escaped, truncated."""
    if data is None:
        return "null"
    # A character is at most 4 bytes, so this slice holds more than enough to show.
    text = bytes(data[: 4 * MAX_SHOWN_CHARS + 4]).decode("utf-8", errors="backslashreplace")
    shown = "".join(c if c.isprintable() else _escape(c) for c in text[:MAX_SHOWN_CHARS])
    if len(text) > MAX_SHOWN_CHARS:
        shown += "..."
    return shown


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
