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
from oncelog.torture.selftest import PLANTED, run_self_test

DESCRIPTION = """\
Crash-torture oncelog. Each crash state runs a seeded workload of idempotent
producers (appends, retries, epoch bumps, flushes, rolls, clean reopens),
transactional producers (1-3 transactional batches, then a COMMIT or ABORT marker;
some transactions still open at the crash), follower truncations, delete_records
and retention on the in-memory fault-injecting
filesystem, crashes it in one fault class, recovers, and checks every invariant:
acknowledged-durable data and markers at or above the log start present byte for
byte (unless a completed truncation, delete_records or retention removed them; a
crash inside one leaves the old state or the new, a truncation the old log or a
prefix of it), no duplicates or
holes, the log a prefix of what was written, producer state (open transactions
included) equal to a full replay, retries answered as duplicates, nothing lost to
a second crash right after recovery, corruption reported and never served, and
read_committed returning only committed data below a last stable offset that is
the first offset of the oldest open transaction (derived from the markers in the
recovered log; checked again after the second crash and once the open
transactions are ended).

Fault classes: kill (process death at a random I/O call), drop (power loss keeps
any subset of unsynced writes), torn (a write torn at 512/4096 bytes, zeros or
garbage), dirent (unsynced directory entries vanish), bitflip (a flip in fsynced
log bytes), enospc / eio (failing writes and fsyncs, then a crash), misdirect (a
write lands at the wrong offset), lost (a whole fsynced segment or index deleted or
emptied), cleaning (a compacted log of keyed records, tombstones, retries and
transactions, killed at an I/O call of a cleaning pass: writing the .cleaned files,
a rename, a directory fsync, the new indexes, the cleaner checkpoint; then power
lost. Checked: each key's latest durable value served, or a newer one, never an
aborted record; only written records, offsets increasing, the log end never below
durable data; producers' windows in the log and their retries duplicates; at most one
record per key below the cleaner checkpoint).

Every violation prints the one command that replays it exactly; the exit status
is 1 if there was any."""

_ALL_CAUGHT = f'{{"planted": {len(PLANTED)}, "caught": {len(PLANTED)}, "missed": []}}'
EPILOG = f"""\
examples:
  oncelog torture --crashes 2000
  oncelog torture --seed 7 --crashes 500 --faults kill,torn --json
  oncelog torture --seed 1000015 --crashes 1 --faults bitflip   # replay one state
  oncelog torture --self-test --json      # {_ALL_CAUGHT}"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "torture",
        help="crash-torture the engine on a fault-injecting filesystem",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the whole run (default: %(default)s)")
    parser.add_argument(
        "--crashes", type=int, default=1000, help="crash states to explore (default: %(default)s)"
    )
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help="comma-separated fault classes, used in turn (default: all)",
    )
    parser.add_argument(
        "--mode",
        choices=["sim", "process"],
        default="sim",
        help="sim: the in-memory fault-injecting twin; process: a real child appending, "
        "running transactions and flushing on disk, SIGKILLed --crashes times (default: %(default)s)",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="process mode: where the child's log lives, a new or empty directory "
        "(default: a fresh temporary directory)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--self-test",
        action="store_true",
        help=f"plant {len(PLANTED)} known bugs in turn and check the harness catches each "
        "(exit 1 if one is missed)",
    )
    parser.set_defaults(handler=run)


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
    result = run_self_test(args.seed, progress=_progress_bar(err))
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


def _progress_bar(err: TextIO) -> Any:
    interactive = err.isatty()
    width = 30

    def progress(done: int, total: int) -> None:
        # On a terminal the bar redraws in place; in a log, a line every 10%.
        if interactive:
            filled = width * done // total
            end = "\n" if done == total else ""
            print(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} crash states", end=end, file=err
            )
            err.flush()
        elif done == total or done % max(total // 10, 1) == 0:
            print(f"torture: {done}/{total} crash states", file=err)

    return progress
