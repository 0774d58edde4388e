"""The arguments and help text of `oncelog torture`; the command itself is `oncelog.cli.torture`."""

from __future__ import annotations

import argparse
from typing import Any

# The code's values, repeated here so that --help imports nothing heavy;
# tests/cli/test_cli_help.py checks each against the code.
FAULT_CLASSES = (
    "kill",
    "drop",
    "torn",
    "dirent",
    "bitflip",
    "enospc",
    "eio",
    "misdirect",
    "lost",
    "cleaning",
)
PLANTED_BUGS = 18  # oncelog.torture.selftest.PLANTED


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


_ALL_CAUGHT = f'{{"planted": {PLANTED_BUGS}, "caught": {PLANTED_BUGS}, "missed": []}}'


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
        default=",".join(FAULT_CLASSES),
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
        help=f"plant {PLANTED_BUGS} known bugs in turn and check the harness catches each "
        "(exit 1 if one is missed)",
    )
    parser.set_defaults(handler="oncelog.cli.torture")
