"""The `oncelog` command line: `dump` (inspect segment files) and `demo`.

`oncelog dump` is modelled on Kafka's `kafka-dump-log.sh` (DumpLogSegments): one
line per batch with every header field, and with `--records` one line per record;
a transaction index (`.txnindex`) is dumped one line per aborted transaction.
It is strictly read-only: files are opened through the filesystem seam with
`writable=False` and segments are streamed with `scan_file`, so memory stays
bounded whatever the segment size and nothing on disk is ever created or changed.
It never opens a `Log` (which would take the directory lock and recover).

Exit status: 0 when everything was dumped, 2 for bad input (a missing path, a
directory without segments, a file that is not a segment, a corrupt or torn batch,
a corrupt transaction index entry).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from oncelog.cli import bench as bench_cli
from oncelog.cli import recover as cli_recover
from oncelog.cli import stat as cli_stat
from oncelog.cli import torture as torture_cli
from oncelog.cli import verify as cli_verify
from oncelog.errors import CorruptRecordError, OncelogError
from oncelog.recovery.fs import DEFAULT_FS, FileSystem, ReadOnlyFileSystem
from oncelog.recovery.snapshot import SNAPSHOT_SUFFIX
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, TruncatedBatchError, UnwrittenSpaceError
from oncelog.segments.records import Record
from oncelog.segments.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    parse_segment_file_name,
    scan_file,
    zeros_to_end,
)
from oncelog.segments.txn_index import ENTRY, ENTRY_SIZE, TXN_INDEX_SUFFIX, AbortedTxn, TransactionIndex
from oncelog.segments.txn_index import VERSION as TXN_INDEX_VERSION
from oncelog.tools import dump_state

EXIT_OK = 0
EXIT_BAD_INPUT = 2

# Key and payload are shown up to this many characters.
MAX_SHOWN_CHARS = 200

# Kafka's ControlRecordType. Only ABORT and COMMIT (transaction markers) are decoded;
# the others (KRaft's __cluster_metadata) are shown by number and name.
CONTROL_TYPE_NAMES = {
    fmt.CONTROL_TYPE_ABORT: "ABORT",
    fmt.CONTROL_TYPE_COMMIT: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_END_TXN_MARKER_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

PROG = "oncelog"

DESCRIPTION = """\
oncelog: a durable on-disk log engine storing Apache Kafka v2 record batches.

Tools for looking at oncelog (and Kafka) data directories."""

EPILOG = """\
examples:
  oncelog dump data/orders-0/00000000000000000000.log
  oncelog dump --records /var/lib/kafka/orders-0 | head -50
  oncelog dump data/orders-0/00000000000000000000.txnindex
  oncelog demo --data-dir ./data/demo

Run `oncelog <command> --help` for the options of a command."""

DUMP_DESCRIPTION = """\
Print the record batches of a segment file (%020d.log) or of every segment of a
partition directory (in offset order), one line per batch, like Kafka's
kafka-dump-log.sh (DumpLogSegments). Strictly read-only: nothing is created or
modified and the log is not opened (no lock taken), so it is safe on a live or
damaged log.

Each batch line shows its header: baseOffset, lastOffset, count, producer id,
epoch and sequences, partitionLeaderEpoch, isTransactional, isControl, its byte
position in the file, its max timestamp (CreateTime or LogAppendTime), size,
compression codec, stored CRC and whether it is valid (CRC-32C and structure).
With --records, a transaction marker (a control record) is shown as
`endTxnMarker: COMMIT|ABORT coordinatorEpoch: N`. A summary line ends each file.

A transaction index (%020d.txnindex: the aborted transactions whose ABORT marker
is in that segment) is dumped one line per entry, as Kafka does:
`version: 0 producerId: P firstOffset: F lastOffset: L lastStableOffset: S`.
For a directory, each segment's index (if it has one) follows its batches. A
partial entry at the end (a crash mid-append leaves one) is ignored, as the
engine ignores it. The last stable offset of the log itself is not shown: that
needs the producer state, which only opening the log recovers.

Exit status is 2 if PATH does not exist, holds no segments, or a file is not a
segment (an empty file is one only if named %020d.log), has an impossible batch
header or ends in the middle of a batch, or a transaction index has an entry
with a bad version or out of order, a snapshot is corrupt (bad CRC, length or
header) or an index has entries out of order; what was readable is printed
first and the error (file and byte position) goes to stderr. A batch whose CRC
does not match is shown with `isvalid: false` and does not change the exit
status."""

DUMP_EPILOG = """\
examples:
  oncelog dump data/orders-0/00000000000000000000.log
  oncelog dump data/orders-0                    # every segment, in offset order
  oncelog dump --records data/orders-0 | head   # records too (key, payload, headers)
  oncelog dump data/orders-0/00000000000000000000.txnindex   # aborted transactions
  oncelog dump --producers --indexes data/orders-0   # + newest snapshot, offset/time indexes
  oncelog dump --snapshot data/orders-0/00000000000000000042.snapshot"""

DEMO_DESCRIPTION = """\
Run the oncelog demo: create a log in DATA_DIR, append to it, crash-recover it
and read it back, printing what happens along the way."""

DEMO_EPILOG = """\
example:
  oncelog demo --data-dir ./data/demo"""


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=formatter
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    dump = commands.add_parser(
        "dump",
        help="print the record batches (and optionally records) of segment files",
        description=DUMP_DESCRIPTION,
        epilog=DUMP_EPILOG,
        formatter_class=formatter,
    )
    dump.add_argument(
        "path",
        metavar="PATH",
        nargs="?",
        help="a segment file (%%020d.log), a transaction index (%%020d.txnindex), an offset or time "
        "index (.index, .timeindex), a producer snapshot (%%020d.snapshot) or a partition directory",
    )
    dump.add_argument(
        "--snapshot",
        metavar="FILE",
        help="print the producer-state snapshot FILE (oncelog's or Kafka's): one line per producer "
        "(id, epoch, coordinator epoch, open transaction, newest batch); oncelog's snapshots keep "
        "up to 5 batches per producer, printed indented after it",
    )
    dump.add_argument(
        "--producers",
        action="store_true",
        help="after the segments, print the newest producer snapshot of the directory the same way",
    )
    dump.add_argument(
        "--indexes",
        action="store_true",
        help="after each segment, print its offset index (`offset: N position: P`) and time index "
        "(`timestamp: T offset: N`) entries, up to any zero-filled tail",
    )
    dump.add_argument(
        "--records",
        action="store_true",
        help="after each batch, print one line per record: offset, timestamp, key and value "
        "sizes, sequence, header keys, key and payload (UTF-8, escaped, truncated to "
        f"{MAX_SHOWN_CHARS} characters); control records are decoded as transaction markers",
    )
    dump.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="skip the CRC-32C and structure check of each batch (faster on big segments); "
        "the batch lines then have no isvalid field",
    )
    dump.set_defaults(handler=_run_dump)

    demo = commands.add_parser(
        "demo",
        help="run the end-to-end demo in a scratch data directory",
        description=DEMO_DESCRIPTION,
        epilog=DEMO_EPILOG,
        formatter_class=formatter,
    )
    demo.add_argument(
        "--data-dir",
        default=os.path.join(".", "data", "demo"),
        help="where the demo keeps its log (default: %(default)s); it is deleted first, so it must be "
        "missing, empty, or an earlier demo's",
    )
    demo.set_defaults(handler=_run_demo)
    torture_cli.add_parser(commands, formatter)
    bench_cli.add_parser(commands, formatter)
    cli_verify.add_parser(commands, formatter)
    cli_stat.add_parser(commands, formatter)
    cli_recover.add_parser(commands, formatter)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run the command line; returns the exit status (0 ok, 2 bad input or corruption)."""
    stdout = sys.stdout if out is None else out
    stderr = sys.stderr if err is None else err
    # Library warnings (a torn tail cut on open, say) reach the operator as one line each.
    logging.basicConfig(level=logging.WARNING, format="oncelog: %(levelname)s: %(message)s", stream=stderr)
    parser = build_parser()
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # --help, or a usage error (argparse prints it)
        return _exit_code(exc)
    for stream in (stdout, stderr):
        if isinstance(stream, io.TextIOWrapper):
            # Paths that are not UTF-8 reach Python as surrogate escapes: print their bytes back.
            stream.reconfigure(errors="surrogateescape")
    try:
        status: int = args.handler(args, stdout, stderr)
    except BrokenPipeError:
        # The reader went away (`oncelog dump ... | head`): not an error.
        _silence_stdout(stdout)
        return EXIT_OK
    except OncelogError as exc:
        # Bad input or damaged files a command did not report itself: one line naming
        # the file (the library's errors do), never a traceback.
        print(f"{PROG} {args.command}: {type(exc).__name__}: {exc}", file=stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(f"{PROG} {args.command}: {where}{exc.strerror or exc}", file=stderr)
        return EXIT_BAD_INPUT
    return status


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return EXIT_OK
    if isinstance(exc.code, int):
        return exc.code
    return EXIT_BAD_INPUT


def _silence_stdout(stream: TextIO) -> None:
    """Point fd 1 at /dev/null so the interpreter's final flush does not fail again."""
    if stream is not sys.stdout and stream is not sys.__stdout__:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


# -- demo ---------------------------------------------------------------------------


def _run_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        from oncelog.cli.demo import run_demo, unusable_data_dir
    except ModuleNotFoundError as exc:
        if exc.name != "oncelog.cli.demo":
            raise
        print(f"{PROG} demo: the demo is not installed ({exc})", file=err)
        return 1
    why = unusable_data_dir(args.data_dir)
    if why is not None:
        print(f"{PROG} demo: {why}", file=err)
        return EXIT_BAD_INPUT
    return int(run_demo(args.data_dir))


# -- dump ---------------------------------------------------------------------------


@dataclass
class _FileSummary:
    batches: int = 0
    records: int = 0
    bytes: int = 0
    last_offset: int | None = None


def _run_dump(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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


def dump_file(
    path: str,
    out: TextIO,
    err: TextIO,
    *,
    records: bool = False,
    validate: bool = True,
    fs: FileSystem = DEFAULT_FS,
) -> bool:
    """Dump one segment file to `out`; returns False (after reporting to `err`) on error."""
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
        try:
            for position, batch in scan_file(handle, 0, size):
                print(_batch_line(batch, position, validate), file=out)
                summary.batches += 1
                summary.bytes = position + batch.size
                summary.last_offset = batch.last_offset
                if records:
                    summary.records += _dump_records(batch, out)
        except CorruptRecordError as exc:
            start = exc.position or 0
            if isinstance(exc, UnwrittenSpaceError) and zeros_to_end(handle, start, size):
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
    return f"Summary: {summary.batches} batches, {counted}{summary.bytes} bytes, last offset {last}"


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
        f" position: {position} {batch.timestamp_type}: {batch.max_timestamp}"
        f" size: {batch.size} magic: {batch.magic} compresscodec: {batch.compression_name}"
        f" crc: {batch.crc}"  # unpacked as u32: unsigned decimal, like Kafka
    )
    if validate:
        line += f" isvalid: {_bool(batch.is_valid())}"
    return line


def _dump_records(batch: RecordBatch, out: TextIO) -> int:
    """Print the batch's records; returns how many were decoded."""
    count = 0
    try:
        for record in batch.records():
            print(_record_line(batch, record), file=out)
            count += 1
    except CorruptRecordError as exc:
        print(f"| corrupt records: {exc}", file=out)
    return count


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
    if key is None or len(key) < _CONTROL_KEY.size:
        return ""
    _, control_type = _CONTROL_KEY.unpack_from(key)
    value = record.value
    is_marker = control_type in (fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT)
    if is_marker and value is not None and len(value) >= _END_TXN_MARKER_VALUE.size:
        _, coordinator_epoch = _END_TXN_MARKER_VALUE.unpack_from(value)
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
