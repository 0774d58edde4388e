"""`oncelog torture`: run the crash torture harness and report it."""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from typing import Any, TextIO

from oncelog.torture.harness import TortureSummary, run_torture
from oncelog.torture.model import FAULTS
from oncelog.torture.process import run_process_mode
from oncelog.torture.selftest import run_self_test


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    faults = tuple(fault.strip() for fault in args.faults.split(",") if fault.strip())
    unknown = [fault for fault in faults if fault not in FAULTS]
    if unknown or not faults:
        print(f"oncelog torture: unknown fault classes {unknown}; choose from {', '.join(FAULTS)}", file=err)
        return 2
    if args.crashes < 1:
        print("oncelog torture: --crashes must be at least 1", file=err)
        return 2
    if args.mode == "process" and args.data_dir is not None:
        why = _unusable_data_dir(args.data_dir)
        if why is not None:
            print(f"oncelog torture: --data-dir {why}", file=err)
            return 2
    # Recovery logs every torn tail it cuts; thousands of crash states would drown the report.
    logging.getLogger("oncelog").setLevel(logging.ERROR)
    if args.self_test:
        return _self_test(args, out, err)
    if args.mode == "process":
        return _process_mode(args, out, err)
    summary = run_torture(args.seed, args.crashes, faults, progress=_progress_bar(err))
    if args.json:
        print(json.dumps(as_json(summary)), file=out)
    else:
        print_table(summary, out)
    return 1 if summary.violations else 0


def _unusable_data_dir(path: str) -> str | None:
    """Why process mode may not put its log at `path`: it must be new or an empty directory,
    since the child appends to whatever log is there and SIGKILLs itself."""
    if not os.path.lexists(path):
        return None
    if not os.path.isdir(path):
        return f"{path} exists and is not a directory"
    try:
        if os.listdir(path):
            return f"{path} is not empty (give a new or empty directory)"
    except OSError as exc:
        return f"cannot list {path}: {exc.strerror or exc}"
    return None


def _process_mode(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    with tempfile.TemporaryDirectory(prefix="oncelog-torture-") as scratch:
        directory = args.data_dir or os.path.join(scratch, "topic-0")
        summary = run_process_mode(directory, args.seed, args.crashes, progress=_progress_bar(err))
    if args.json:
        report = {
            "sigkills": summary.kills,
            "acks": summary.acks,
            "violations": len(summary.violations),
            "seconds": round(summary.seconds, 3),
            "seed": summary.seed,
        }
        print(json.dumps(report), file=out)
    else:
        print(
            f"{summary.kills} SIGKILLs, {summary.acks} acknowledged batches checked, "
            f"{len(summary.violations)} violations, seed {summary.seed}, {summary.seconds:.1f} s",
            file=out,
        )
        for violation in summary.violations:
            print(f"VIOLATION {violation.invariant}: {violation.detail}", file=out)
            print(
                f"  replay: oncelog torture --mode process --seed {summary.seed} --crashes {summary.kills}",
                file=out,
            )
    return 1 if summary.violations else 0


def _self_test(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = run_self_test(args.seed, progress=_progress_bar(err, "planted bugs"))
    if args.json:
        print(
            json.dumps({"planted": result.planted, "caught": result.caught, "missed": result.missed}),
            file=out,
        )
    else:
        for name, count in result.violations.items():
            verdict = "caught" if count else "MISSED"
            print(f"{verdict:<7} {name} ({count} violations)", file=out)
        print(f"{result.caught} of {result.planted} planted bugs caught", file=out)
    return 1 if result.missed else 0


def as_json(summary: TortureSummary) -> dict[str, object]:
    return {
        "crash_states": summary.crash_states,
        "by_fault": summary.by_fault,
        "violations": len(summary.violations),
        "seconds": round(summary.seconds, 3),
        "seed": summary.seed,
    }


def print_table(summary: TortureSummary, out: TextIO) -> None:
    violations_by_fault = {fault: 0 for fault in summary.by_fault}
    for violation in summary.violations:
        violations_by_fault[violation.fault] += 1
    print(f"{'fault':<10} {'crash states':>12} {'violations':>10}", file=out)
    for fault, states in summary.by_fault.items():
        print(f"{fault:<10} {states:>12} {violations_by_fault[fault]:>10}", file=out)
    print(f"{'total':<10} {summary.crash_states:>12} {len(summary.violations):>10}", file=out)
    print(f"seed {summary.seed}, {summary.seconds:.1f} s", file=out)
    replayed: set[str] = set()
    for violation in summary.violations:
        print(f"VIOLATION {violation.invariant}: {violation.detail}", file=out)
        if violation.replay_command not in replayed:
            replayed.add(violation.replay_command)
            print(f"  replay: {violation.replay_command}", file=out)


def _progress_bar(err: TextIO, counted: str = "crash states") -> Any:
    interactive = err.isatty()
    width = 30

    def progress(done: int, total: int) -> None:
        # On a terminal the bar redraws in place; in a log, a line every 10%.
        if interactive:
            filled = width * done // total
            end = "\n" if done == total else ""
            print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {counted}", end=end, file=err)
            err.flush()
        elif done == total or done % max(total // 10, 1) == 0:
            print(f"torture: {done}/{total} {counted}", file=err)

    return progress
