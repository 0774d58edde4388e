"""The arguments and help text of `oncelog groups`; the command itself is `oncelog.cli.groups`."""

from __future__ import annotations

import argparse
from typing import Any

from oncelog.cli.parsers.topics import add_bootstrap

DESCRIPTION = """\
Look at and reset the consumer groups of a running server over the Kafka protocol.

  list                  every group, its state and protocol type
  describe GROUP        its state, members (client, host, partitions) and, per
                        partition, the committed offset, the end offset and the lag
  reset-offsets GROUP   move its committed offsets: --to-earliest, --to-latest,
                        --to-datetime 2026-11-27T12:00:00Z (the first record at or after
                        it) or --to-offset N (clamped to the partition's range); of
                        --topic T (repeatable; default: every topic it has offsets of)

reset-offsets prints what it would do and changes nothing unless --execute is given;
a group with members is refused (stop its consumers first), as Kafka refuses it."""


EPILOG = """\
examples:
  oncelog groups --bootstrap 127.0.0.1:9092 list
  oncelog groups describe billing
  oncelog groups reset-offsets billing --topic orders --to-datetime 2026-11-27T00:00:00Z
  oncelog groups reset-offsets billing --topic orders --to-earliest --execute

Exit status: 0, or 2 if the server refused a request or could not be reached."""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "groups",
        help="list, describe and reset the offsets of a running server's consumer groups",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    add_bootstrap(parser)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="every group, its state and protocol type")
    describe = actions.add_parser("describe", help="a group's members, offsets and lag")
    describe.add_argument("group")
    reset = actions.add_parser("reset-offsets", help="move a group's committed offsets (dry run by default)")
    reset.add_argument("group")
    reset.add_argument("--topic", action="append", default=[], metavar="TOPIC")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-datetime", metavar="ISO-8601", help="e.g. 2026-11-27T12:00:00Z")
    target.add_argument("--to-offset", type=int, metavar="N")
    reset.add_argument("--execute", action="store_true", help="apply it (without: print the plan only)")
    parser.set_defaults(handler="oncelog.cli.groups")
