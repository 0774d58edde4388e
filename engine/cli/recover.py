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
from typing import Any, TextIO

from oncelog.cli.roots import directory_kind
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
    LogManager,
    PartitionRecoveryError,
)
from oncelog.recovery.loader import RecoveryReport
from oncelog.recovery_progress import RecoverySummary

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


_TRUNCATE_HINT = (
    "oncelog recover: corruption below a recovery point is not a torn write; `oncelog verify` shows it, "
    "and --truncate-corrupt cuts the log there (the data after it is lost)"
)


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
    try:
        return manager.recovery_summary
    finally:
        manager.close()  # (a Ctrl-C between the two included: every log closed cleanly)


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
