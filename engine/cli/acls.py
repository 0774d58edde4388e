"""`oncelog acls ROOT add|remove|list`: the ACLs `oncelog serve` decides every request by."""

from __future__ import annotations

import argparse
import os
from typing import Any, TextIO

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK, PROG
from oncelog.cli.serve import security_root_problem
from oncelog.server.acl_store import AclStore
from oncelog.server.acls import (
    CLUSTER_NAME,
    WILDCARD,
    Acl,
    AclFilter,
    InvalidAclError,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    normal_host,
    normal_host_filter,
)
from oncelog.server.security_store import STORE_DIR, StoreNotPrivateError, open_security_store
from oncelog.storage.fs import DEFAULT_FS

# Kafka's kafka-acls.sh operation names, without the underscores' case.
OPERATIONS = {op.name.replace("_", "").lower(): op for op in Operation if op > Operation.ANY}
PATTERNS = {"literal": PatternType.LITERAL, "prefixed": PatternType.PREFIXED}
FILTER_PATTERNS = {**PATTERNS, "any": PatternType.ANY, "match": PatternType.MATCH}

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
        choices=sorted(OPERATIONS),
        type=str.lower,
        help="repeatable",
    )
    _resource_arguments(add, PATTERNS, "literal", required=True)
    for name, help_text in (
        ("remove", "remove every ACL the options match"),
        ("list", "list the ACLs the options match"),
    ):
        selector = actions.add_parser(name, help=help_text)
        selector.add_argument("--principal", help="only this principal's ACLs")
        selector.add_argument("--host", help="only ACLs for this host")
        selector.add_argument("--operation", choices=sorted(OPERATIONS), type=str.lower)
        selector.add_argument("--permission", choices=("allow", "deny"), type=str.lower)
        _resource_arguments(selector, FILTER_PATTERNS, "any", required=False)
        if name == "remove":
            selector.add_argument("--all", action="store_true", help="remove every ACL the root has")
    parser.set_defaults(handler=run)


def _resource_arguments(
    parser: argparse.ArgumentParser, patterns: dict[str, PatternType], default: str, *, required: bool
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


def _resource(args: argparse.Namespace) -> tuple[ResourceType, str | None]:
    for kind, name in (
        (ResourceType.TOPIC, args.topic),
        (ResourceType.GROUP, args.group),
        (ResourceType.TRANSACTIONAL_ID, args.transactional_id),
    ):
        if name is not None:
            return kind, name
    if args.cluster:
        return ResourceType.CLUSTER, CLUSTER_NAME
    return ResourceType.ANY, None


def _new_acls(args: argparse.Namespace) -> list[Acl]:
    kind, name = _resource(args)
    assert name is not None, "add names a resource (argparse requires one)"
    principals = [(p, Permission.ALLOW) for p in args.allow_principal]
    principals += [(p, Permission.DENY) for p in args.deny_principal]
    if not principals:
        raise InvalidAclError("name at least one --allow-principal or --deny-principal")
    pattern = PATTERNS[args.resource_pattern_type]
    return [
        Acl(kind, name, pattern, principal, normal_host(host), OPERATIONS[operation], permission)
        for principal, permission in principals
        for host in args.host or [WILDCARD]
        for operation in args.operation
    ]


def _filter(args: argparse.Namespace) -> AclFilter:
    kind, name = _resource(args)
    return AclFilter(
        kind,
        name,
        FILTER_PATTERNS[args.resource_pattern_type],
        args.principal,
        normal_host_filter(args.host),
        OPERATIONS[args.operation] if args.operation else Operation.ANY,
        Permission[args.permission.upper()] if args.permission else Permission.ANY,
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    root = args.root
    why = security_root_problem(root, creating=args.action == "add")
    if why is None and args.action == "remove" and not (args.all or args.principal or _resource(args)[1]):
        why = (
            "remove needs a resource (--topic, --group, --transactional-id, --cluster), --principal, or --all"
        )
    if why is not None:
        print(f"{PROG} acls: {why}", file=err)
        return EXIT_BAD_INPUT
    if args.action != "add" and not os.path.isdir(os.path.join(root, STORE_DIR)):
        return _act(None, args, out, err)  # no ACLs yet: nothing to list or remove, nothing created
    try:
        store = open_security_store(DEFAULT_FS, root)
    except StoreNotPrivateError as exc:
        print(f"{PROG} acls: {exc}", file=err)
        return EXIT_BAD_INPUT
    try:
        return _act(AclStore(store), args, out, err)
    finally:
        store.close()


def _act(store: AclStore | None, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Do what `args` asks of `store` (None: the root has no security store yet, and gets none)."""
    try:
        if args.action == "add":
            assert store is not None, "add opens (creating) the store"
            adding = _new_acls(args)
            store.add(adding)
            for acl in adding:
                print(f"added {acl.describe()}", file=out)
            return EXIT_OK
        selector = _filter(args)
        selector.check()
        if args.action == "list":
            for acl in store.current()[0].selected(selector) if store is not None else []:
                print(acl.describe(), file=out)
            return EXIT_OK
        (removed,) = store.remove([selector]) if store is not None else [[]]
        for acl in removed:
            print(f"removed {acl.describe()}", file=out)
        print(f"{len(removed)} ACLs removed", file=out)
        return EXIT_OK
    except InvalidAclError as exc:
        print(f"{PROG} acls: {exc}", file=err)
        return EXIT_BAD_INPUT
