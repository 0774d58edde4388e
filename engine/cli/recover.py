"""`oncelog recover ROOT`: run crash recovery now, print what it did, and close cleanly.

ROOT is a LogManager root (`<topic>-<partition>/` directories) or one partition
directory. Recovery is exactly what opening does (tail-only validation, index
rebuilds, producer-state replay, a fresh snapshot); closing afterwards leaves every
partition with a clean-shutdown marker, so the next open is fast. Unlike `dump`,
`verify` and `stat`, this command writes: it takes the root's lock first, so it
refuses to run beside a live process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any, Literal, TextIO

from oncelog.config import LogConfig, OnCorruption
from oncelog.errors import (
    CorruptLogError,
    LogDirectoryError,
    LogDirLockedError,
    OncelogError,
)
from oncelog.layout import TopicPartition, parse_partition_dir_name
from oncelog.log import Log
from oncelog.log_manager import (
    MAX_RECOVERY_THREADS,
    PARTITION_LOCK_TIMEOUT_S,
    LogManager,
    PartitionRecoveryError,
)
from oncelog.recovery.loader import RecoveryReport
from oncelog.recovery_progress import RecoverySummary
from oncelog.root_config import ROOT_LOCK_FILE, ROOT_METADATA_DIR
from oncelog.segments.segment import LOG_SUFFIX

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

DESCRIPTION = """\
Run crash recovery on ROOT now and print a summary.

ROOT is a root of <topic>-<partition>/ directories (as LogManager keeps them) or a
single partition directory. Each partition is recovered as an open would recover it:
batches past the recovery point are validated (size, magic, CRC, offsets), a torn
tail is cut, indexes that fail their sanity check are rebuilt, producer state is
replayed from the newest snapshot, and everything validated is fsynced. The logs are
then closed cleanly, so the next open skips recovery.

Corruption below a partition's recovery point (a CRC mismatch in data that was
fsynced) is not a torn tail: that partition fails with the file and position, and
nothing is cut unless --truncate-corrupt is given.

A partition with segments but no metadata store (a Kafka directory, or a lost
meta.lmdb) has every segment validated, and the summary says so. A root whose own
metadata store was lost is refused unless --recreate-metadata is given; a damaged
store is refused. A directory that is neither a root nor a partition directory is
refused unless --create is given (recovering it would make it a new, empty root)."""

EPILOG = """\
exit status:
  0  every partition recovered (torn tails cut are listed)
  1  a partition failed to recover (each is named, with the file and position)
  2  bad input: ROOT missing, not a directory, neither a root nor a partition (without
     --create), in use by another process, or unusable as it is: a metadata store that is
     damaged or lost, a .lock that is a directory (one line names the path)

examples:
  oncelog recover /var/lib/oncelog
  oncelog recover --threads 4 --json /var/lib/oncelog > recovery.json
  oncelog recover --truncate-corrupt /var/lib/oncelog/orders-3"""


_TRUNCATE_HINT = (
    "oncelog recover: corruption below a recovery point is not a torn write; `oncelog verify` shows it, "
    "and --truncate-corrupt cuts the log there (the data after it is lost)"
)


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "recover",
        help="run crash recovery on a root or partition now and print the summary (writes)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("root", metavar="ROOT", help="a LogManager root or one partition directory")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"partitions recovered at once (1..{MAX_RECOVERY_THREADS}; default: 4 per core)",
    )
    parser.add_argument(
        "--truncate-corrupt",
        action="store_true",
        help="cut a log at corruption below its recovery point instead of failing (loses the data after it)",
    )
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=PARTITION_LOCK_TIMEOUT_S,
        metavar="SECONDS",
        help="how long to wait for a partition another process is writing (default: %(default)g)",
    )
    parser.add_argument(
        "--create",
        action="store_true",
        help="make ROOT a new, empty LogManager root even though it is neither a root nor a partition "
        "directory (by default such a directory is refused: it is likely a typo)",
    )
    parser.add_argument(
        "--recreate-metadata",
        action="store_true",
        help="accept that the root's lost metadata store (its config, topic configs and pending "
        "deletes) is gone and start an empty one (by default a root that lost it is refused)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    root = args.root
    if not os.path.isdir(root):
        print(f"oncelog recover: {root} is not a directory", file=err)
        return EXIT_BAD_INPUT
    if args.threads is not None and not 1 <= args.threads <= MAX_RECOVERY_THREADS:
        print(f"oncelog recover: --threads must be 1..{MAX_RECOVERY_THREADS}", file=err)
        return EXIT_BAD_INPUT
    try:
        kind = directory_kind(root)
    except OSError as exc:
        print(f"oncelog recover: cannot list {root}: {exc.strerror or exc}", file=err)
        return EXIT_BAD_INPUT
    if kind is None and not args.create:
        print(
            f"oncelog recover: {root} is neither a LogManager root nor a partition directory "
            "(no segments, no metadata store, no <topic>-<partition> directories); "
            "--create makes it a new root",
            file=err,
        )
        return EXIT_BAD_INPUT
    on_corruption: OnCorruption = "truncate" if args.truncate_corrupt else "raise"
    try:
        progress = False if args.no_progress else None
        summary = _recover(
            root,
            kind == "partition",
            on_corruption,
            args.threads,
            progress=progress,
            lock_timeout_s=args.lock_timeout,
            recreate_metadata=args.recreate_metadata,
        )
    except LogDirLockedError as exc:
        print(f"oncelog recover: {exc}; stop the process using it first", file=err)
        return EXIT_BAD_INPUT
    except LogDirectoryError as exc:  # a damaged or lost store, a .lock that is a directory: nothing ran
        print(f"oncelog recover: {exc}", file=err)
        return EXIT_BAD_INPUT
    except PartitionRecoveryError as exc:
        for tp, failure in sorted(exc.failures.items()):
            print(f"FAILED {tp}: {type(failure).__name__}: {failure}", file=err)
        print(f"oncelog recover: {len(exc.failures)} partition(s) failed", file=err)
        if any(isinstance(failure, CorruptLogError) for failure in exc.failures.values()):
            print(_TRUNCATE_HINT, file=err)
        return EXIT_FAILED
    except OncelogError as exc:
        print(f"FAILED {root}: {type(exc).__name__}: {exc}", file=err)
        if isinstance(exc, CorruptLogError):
            print(_TRUNCATE_HINT, file=err)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(summary_json(summary), indent=2), file=out)
    else:
        print(summary, file=out)
    return EXIT_OK


def _recover(
    root: str,
    is_partition: bool,
    on_corruption: OnCorruption,
    threads: int | None,
    *,
    progress: bool | None,
    lock_timeout_s: float,
    recreate_metadata: bool,
) -> RecoverySummary:
    if is_partition:
        log = Log.open(root, LogConfig(on_corruption=on_corruption))
        log.close()
        name = os.path.basename(os.path.normpath(root))
        # A directory not named <topic>-<partition> (a standalone Log) is listed by its name.
        tp = parse_partition_dir_name(name) or TopicPartition(name, 0)
        return RecoverySummary.of({tp: log.recovery_report}, log.recovery_report.duration_s, 1)
    # The root's persisted config: recovering with another could expire producers or
    # overflow the producer table that config sized (and would replace it).
    manager = LogManager.open(
        root,
        None,
        recovery_threads=threads,
        progress=progress,
        on_corruption=on_corruption,
        lock_timeout_s=lock_timeout_s,
        recreate_metadata=recreate_metadata,
    )
    summary = manager.recovery_summary
    manager.close()
    return summary


def directory_kind(path: str) -> Literal["partition", "root"] | None:
    """What `path` holds: segments (a partition), a root's entries or partitions, or neither."""
    names = os.listdir(path)
    if any(name.endswith(LOG_SUFFIX) for name in names):
        return "partition"
    if ROOT_METADATA_DIR in names or ROOT_LOCK_FILE in names:
        return "root"
    for name in names:
        if parse_partition_dir_name(name) is not None and os.path.isdir(os.path.join(path, name)):
            return "root"
    return None


def summary_json(summary: RecoverySummary) -> dict[str, Any]:
    totals: dict[str, Any] = {
        field.name: getattr(summary, field.name)
        for field in dataclasses.fields(summary)
        if field.name != "reports"
    }
    totals["partitions_detail"] = {
        str(tp): _report_json(report) for tp, report in sorted(summary.reports.items())
    }
    return totals


def _report_json(report: RecoveryReport) -> dict[str, Any]:
    return dict(report._asdict())
