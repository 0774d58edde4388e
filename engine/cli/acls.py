"""`oncelog acls ROOT add|remove|list`: the ACLs `oncelog serve` decides every request by."""

from __future__ import annotations

import argparse
import os
from typing import TextIO

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK, PROG
from oncelog.cli.roots import security_root_problem
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
    check_acl,
    normal_host,
    normal_host_filter,
)
from oncelog.server.security_store import STORE_DIR, StoreNotPrivateError, open_security_store
from oncelog.storage.fs import DEFAULT_FS

# Kafka's kafka-acls.sh operation names, without the underscores' case.
OPERATIONS = {op.name.replace("_", "").lower(): op for op in Operation if op > Operation.ANY}
PATTERNS = {"literal": PatternType.LITERAL, "prefixed": PatternType.PREFIXED}
FILTER_PATTERNS = {**PATTERNS, "any": PatternType.ANY, "match": PatternType.MATCH}


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
    if args.action == "add":
        try:  # everything that can be refused is, before the root or its store is made
            for acl in _new_acls(args):
                check_acl(acl)
        except InvalidAclError as exc:
            print(f"{PROG} acls: {exc}", file=err)
            return EXIT_BAD_INPUT
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
