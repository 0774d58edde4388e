"""`oncelog users ROOT add|delete|list`: the SASL users `oncelog serve` logs clients in as."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any, TextIO

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK, PROG
from oncelog.cli.serve import security_root_problem
from oncelog.server.credentials import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    CredentialError,
    CredentialStore,
    check_user_name,
    credential_from_password,
)
from oncelog.server.security_store import STORE_DIR, StoreNotPrivateError
from oncelog.storage.fs import DEFAULT_FS

DESCRIPTION = """\
Add, delete and list the SASL users of ROOT, which `oncelog serve` logs clients in as
(SCRAM-SHA-256, SCRAM-SHA-512, and PLAIN checked against the same credentials).

  add NAME       store NAME's credentials for each --mechanism (default: both SCRAM ones);
                 the password comes from stdin (--password-stdin) or a prompt, never an
                 argument; a user that exists gets the new password
  delete NAME    remove NAME (or only its --mechanism credentials)
  list           every user and the mechanisms and iterations it has

Credentials are kept as SCRAM keeps them (a salt, an iteration count and two derived
keys), never the password, in ROOT/security.lmdb, readable by this user alone. A
running server sees a change at the next login."""

EPILOG = f"""\
examples:
  printf '%s\\n' "$ALICE_PASSWORD" | {PROG} users /var/lib/oncelog add alice --password-stdin
  {PROG} users data add svc-billing --mechanism SCRAM-SHA-512 --iterations 16384
  {PROG} users data list
  {PROG} users data delete alice

Exit status: 0; 2 for bad input (no such root, an empty password, a user to delete that
does not exist, a credential store others can read)."""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "users",
        help="add, delete and list the SASL users `oncelog serve` logs clients in as",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("root", metavar="ROOT", help="the LogManager root whose users these are")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="store a user's credentials (a new password for one that exists)")
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--mechanism",
        action="append",
        choices=SCRAM_MECHANISMS,
        help="the SCRAM mechanism to store credentials for (repeatable; default: both)",
    )
    add.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"PBKDF2 iterations ({MIN_ITERATIONS}..{MAX_ITERATIONS}; default: %(default)s)",
    )
    add.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin's first line"
    )
    delete = actions.add_parser("delete", help="remove a user, or one mechanism's credentials")
    delete.add_argument("name", metavar="NAME")
    delete.add_argument("--mechanism", choices=SCRAM_MECHANISMS, help="remove only these credentials")
    actions.add_parser("list", help="every user, its mechanisms and iterations")
    parser.set_defaults(handler=run)


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            raise CredentialError("the passwords differ")
    else:
        raise CredentialError(
            "no terminal to ask for the password on: pass it on stdin with --password-stdin"
        )
    if not password:
        raise CredentialError("the password is empty")
    return password


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    root = args.root
    why = security_root_problem(root, creating=args.action == "add")
    if why is not None:
        print(f"{PROG} users: {why}", file=err)
        return EXIT_BAD_INPUT
    if args.action != "add" and not os.path.isdir(os.path.join(root, STORE_DIR)):
        return _act(None, args, out, err)  # no users yet: nothing to list or delete, nothing created
    try:
        store = CredentialStore.open(DEFAULT_FS, root)
    except StoreNotPrivateError as exc:
        print(f"{PROG} users: {exc}", file=err)
        return EXIT_BAD_INPUT
    try:
        return _act(store, args, out, err)
    finally:
        store.close()


def _act(store: CredentialStore | None, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Do what `args` asks of `store` (None: the root has no store yet, and gets none)."""
    try:
        return _act_on(store, args, out)
    except CredentialError as exc:
        print(f"{PROG} users: {exc}", file=err)
        return EXIT_BAD_INPUT


def _act_on(store: CredentialStore | None, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "list":
        for name, mechanisms in store.users() if store is not None else ():
            kinds = ", ".join(
                f"{mechanism} ({iterations} iterations)" for mechanism, iterations in mechanisms.items()
            )
            print(f"{name}: {kinds}", file=out)
        return EXIT_OK
    if args.action == "delete":
        if store is None or not store.delete(args.name, args.mechanism):
            what = f"no {args.mechanism} credentials" if args.mechanism else "no credentials"
            raise CredentialError(f"user {args.name!r} has {what}")
        print(f"deleted {args.mechanism or 'every'} credential of {args.name!r}", file=out)
        return EXIT_OK
    assert store is not None, "add opens (creating) the store"
    check_user_name(args.name)
    password = _password(args)
    for mechanism in args.mechanism or SCRAM_MECHANISMS:
        store.put(args.name, mechanism, credential_from_password(mechanism, password, args.iterations))
        print(f"stored {mechanism} credentials of {args.name!r} ({args.iterations} iterations)", file=out)
    return EXIT_OK
