"""The arguments and help text of `oncelog topics`; the command itself is `oncelog.cli.topics`."""

from __future__ import annotations

import argparse
from typing import Any

from oncelog.cli.parsers.values import positive_seconds

DESCRIPTION = """\
Manage the topics of a running server over the Kafka protocol (CreateTopics,
DeleteTopics, CreatePartitions, DescribeConfigs, IncrementalAlterConfigs).

  list                      every topic and its partition count
  describe TOPIC            its partitions, end offsets and configs (overrides marked *)
  create TOPIC              with --partitions N and --config NAME=VALUE (repeatable)
  delete TOPIC [TOPIC ...]  delete topics and their data (asks nothing: take care)
  alter TOPIC               --config NAME=VALUE sets, --delete-config NAME resets to default;
                            --partitions N grows the topic

Configs use Kafka's names (retention.ms, segment.bytes, max.message.bytes, ...); one the
server cannot take is refused with its reason, nothing is applied."""


EPILOG = """\
examples:
  oncelog topics --bootstrap 127.0.0.1:9092 list
  oncelog topics create orders --partitions 6 --config retention.ms=86400000
  oncelog topics alter orders --config max.message.bytes=2097152 --delete-config retention.ms
  oncelog topics describe orders

Exit status: 0, or 2 if the server refused a request or could not be reached."""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "topics",
        help="list, describe, create, delete and configure a running server's topics",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    add_bootstrap(parser)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="every topic and its partition count")
    describe = actions.add_parser("describe", help="a topic's partitions, end offsets and configs")
    describe.add_argument("topic")
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=1, help="how many (default: %(default)s)")
    create.add_argument("--config", action="append", default=[], metavar="NAME=VALUE")
    delete = actions.add_parser("delete", help="delete topics and their data")
    delete.add_argument("topics", nargs="+", metavar="TOPIC")
    alter = actions.add_parser("alter", help="set or reset a topic's configs, or grow it")
    alter.add_argument("topic")
    alter.add_argument("--config", action="append", default=[], metavar="NAME=VALUE")
    alter.add_argument("--delete-config", action="append", default=[], metavar="NAME")
    alter.add_argument("--partitions", type=int, default=None, help="grow the topic to this many")
    parser.set_defaults(handler="oncelog.cli.topics")


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        default="127.0.0.1:9092",
        metavar="HOST:PORT",
        help="the server to talk to (default: %(default)s, `oncelog serve`'s)",
    )
    parser.add_argument(
        "--timeout-s",
        type=positive_seconds,
        default=30.0,
        help="how long to wait for the server, to connect and for each answer (default: %(default)s)",
    )
