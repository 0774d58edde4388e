"""The arguments and help text of `oncelog acls`; the command itself is `oncelog.cli.acls`."""

from __future__ import annotations

import argparse
from typing import Any

from oncelog.cli.exits import PROG

# The code's values, repeated here so that --help imports nothing heavy;
# tests/cli/test_cli_help.py checks each against the code.
OPERATION_NAMES = (
    "all",
    "alter",
    "alterconfigs",
    "clusteraction",
    "create",
    "createtokens",
    "delete",
    "describe",
    "describeconfigs",
    "describetokens",
    "idempotentwrite",
    "read",
    "write",
)
PATTERN_NAMES = ("literal", "prefixed")
FILTER_PATTERN_NAMES = ("any", "literal", "match", "prefixed")
CLUSTER_NAME = "kafka-cluster"


DESCRIPTION = """\
Add, remove and list the ACLs of ROOT, which `oncelog serve` authorizes every request by,
as Kafka's kafka-acls.sh does (the same options).

  add      allow (--allow-principal) or deny (--deny-principal) each --operation on
           the resource (--topic, --group, --transactional-id or --cluster), from
           --host (default: every host); --resource-pattern-type prefixed names every
           resource whose name starts with the one given
  remove   remove every ACL the options match (a missing option matches anything;
           give at least a resource or a principal, or --all)
  list     the ACLs the options match, one a line

Deny wins over allow; an ALLOW of Read, Write, Delete or Alter also allows Describe.
Principals are `User:NAME` (a SASL user, or a client certificate's mapped name) and
`User:*` for everyone; `--super-user` principals of `serve` need no ACL. A running server
applies a change at each connection's next request. Once a root has held an ACL, its
server authorizes every request (removing the last ACL denies everyone but super users)."""


EPILOG = f"""\
examples:
  {PROG} acls data add --allow-principal User:alice --operation Write --operation Describe --topic orders
  {PROG} acls data add --allow-principal User:billing --operation Read --group billing- \\
      --resource-pattern-type prefixed
  {PROG} acls data add --allow-principal User:etl --operation Write --transactional-id etl-1
  {PROG} acls data add --deny-principal User:mallory --operation All --topic '*'
  {PROG} acls data list --topic orders --resource-pattern-type match
  {PROG} acls data remove --principal User:alice

Exit status: 0; 2 for bad input (no such root, an ACL Kafka would refuse, a remove that
names nothing, a security store others can read)."""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "acls",
        help="add, remove and list the ACLs `oncelog serve` authorizes requests by",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("root", metavar="ROOT", help="the LogManager root whose ACLs these are")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="store ACLs: each principal, operation and host on the resource")
    add.add_argument("--allow-principal", action="append", default=[], metavar="PRINCIPAL")
    add.add_argument("--deny-principal", action="append", default=[], metavar="PRINCIPAL")
    add.add_argument("--host", action="append", default=[], help="a client address (default: * , every host)")
    add.add_argument(
        "--operation",
        action="append",
        required=True,
        choices=OPERATION_NAMES,
        type=str.lower,
        help="repeatable",
    )
    _resource_arguments(add, PATTERN_NAMES, "literal", required=True)
    for name, help_text in (
        ("remove", "remove every ACL the options match"),
        ("list", "list the ACLs the options match"),
    ):
        selector = actions.add_parser(name, help=help_text)
        selector.add_argument("--principal", help="only this principal's ACLs")
        selector.add_argument("--host", help="only ACLs for this host")
        selector.add_argument("--operation", choices=OPERATION_NAMES, type=str.lower)
        selector.add_argument("--permission", choices=("allow", "deny"), type=str.lower)
        _resource_arguments(selector, FILTER_PATTERN_NAMES, "any", required=False)
        if name == "remove":
            selector.add_argument("--all", action="store_true", help="remove every ACL the root has")
    parser.set_defaults(handler="oncelog.cli.acls")


def _resource_arguments(
    parser: argparse.ArgumentParser, patterns: tuple[str, ...], default: str, *, required: bool
) -> None:
    resource = parser.add_mutually_exclusive_group(required=required)
    resource.add_argument("--topic", metavar="NAME")
    resource.add_argument("--group", metavar="NAME")
    resource.add_argument("--transactional-id", metavar="NAME")
    resource.add_argument("--cluster", action="store_true", help=f"the cluster ({CLUSTER_NAME})")
    parser.add_argument(
        "--resource-pattern-type",
        choices=sorted(patterns),
        default=default,
        type=str.lower,
        help=f"literal: the name (* is every resource); prefixed: every name starting with it "
        f"(default: {default})",
    )
