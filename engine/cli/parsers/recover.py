"""The arguments and help text of `oncelog recover`; the command itself is `oncelog.cli.recover`."""

from __future__ import annotations

import argparse
from typing import Any

from oncelog.cli.parsers.values import seconds

# The code's values, repeated here so that --help imports nothing heavy;
# tests/cli/test_cli_help.py checks each against the code.
MAX_RECOVERY_THREADS = 64
PARTITION_LOCK_TIMEOUT_S = 10.0


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
        type=seconds,
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
    parser.set_defaults(handler="oncelog.cli.recover")
