"""`oncelog users ROOT add|delete|list`: the SASL users `oncelog serve` logs clients in as."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import TextIO

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK, PROG
from oncelog.cli.roots import security_root_problem
from oncelog.server.credentials import (
    SCRAM_MECHANISMS,
    CredentialError,
    CredentialStore,
    ScramCredential,
    check_user_name,
    credential_from_password,
)
from oncelog.server.security_store import STORE_DIR, StoreNotPrivateError
from oncelog.storage.fs import DEFAULT_FS


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
    credentials: dict[str, ScramCredential] = {}
    if args.action == "add":
        # Everything that can be refused is, before the root or its store is made.
        try:
            credentials = _credentials(args)
        except CredentialError as exc:
            print(f"{PROG} users: {exc}", file=err)
            return EXIT_BAD_INPUT
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
        return _act(store, args, out, err, credentials)
    finally:
        store.close()


def _credentials(args: argparse.Namespace) -> dict[str, ScramCredential]:
    """What `add` stores, by mechanism: the name checked and the password read first."""
    check_user_name(args.name)
    password = _password(args)
    mechanisms = args.mechanism or SCRAM_MECHANISMS
    return {
        mechanism: credential_from_password(mechanism, password, args.iterations) for mechanism in mechanisms
    }


def _act(
    store: CredentialStore | None,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    credentials: dict[str, ScramCredential] | None = None,
) -> int:
    """Do what `args` asks of `store` (None: the root has no store yet, and gets none)."""
    try:
        return _act_on(store, args, out, credentials or {})
    except CredentialError as exc:
        print(f"{PROG} users: {exc}", file=err)
        return EXIT_BAD_INPUT


def _act_on(
    store: CredentialStore | None,
    args: argparse.Namespace,
    out: TextIO,
    credentials: dict[str, ScramCredential],
) -> int:
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
    assert store is not None and credentials, "add made its credentials, then opened (creating) the store"
    for mechanism, credential in credentials.items():
        store.put(args.name, mechanism, credential)
        print(f"stored {mechanism} credentials of {args.name!r} ({args.iterations} iterations)", file=out)
    return EXIT_OK
