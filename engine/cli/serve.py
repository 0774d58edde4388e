"""`oncelog serve ROOT`: a single-node Kafka broker over a LogManager root."""

from __future__ import annotations

import argparse
import os
import signal
import ssl
from typing import Any, TextIO

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK, PROG
from oncelog.cli.interrupts import exits_at_once
from oncelog.cli.roots import unservable_root
from oncelog.errors import LogDirLockedError, OncelogError
from oncelog.log_manager import LogManager, PartitionRecoveryError
from oncelog.server.acl_store import AclStore
from oncelog.server.app import run_server, tls_context
from oncelog.server.broker import (
    ServeConfig,
    raise_open_files_limit,
)
from oncelog.server.group_state import GroupLimits
from oncelog.server.listeners import PLAINTEXT, SSL, Listener, parse_address, parse_listener, with_advertised
from oncelog.server.security_store import STORE_DIR as SECURITY_DIR
from oncelog.server.security_store import StoreNotPrivateError, check_private
from oncelog.server.tls import TlsFiles, parse_principal_rule
from oncelog.storage.fs import DEFAULT_FS

EXIT_FAILED = 1
DEFAULT_LISTEN = "127.0.0.1:9092"
_DEFAULT_GROUPS = GroupLimits()
_DEFAULTS = ServeConfig()


def listeners_from(args: argparse.Namespace) -> list[Listener]:
    """The listeners --listen, --listener and --advertise name; ValueError saying what is wrong."""
    listeners = [parse_listener(text) for text in args.listener]
    if args.listen is not None or not listeners:
        listeners.insert(0, Listener(PLAINTEXT, *parse_address(args.listen or DEFAULT_LISTEN)))
    return with_advertised(listeners, args.advertise)


def anonymous_exposure(
    listeners: list[Listener], allow_anonymous: bool, client_ca: bool, authorizing: bool
) -> str | None:
    """Why the listeners may not start as they are (a listener that serves anyone, unnamed, on an
    address others can reach: PLAINTEXT, or SSL without client certificates, while no ACLs
    decide what such a client may do), or None."""
    if allow_anonymous or authorizing:
        return None
    for listener in listeners:
        anonymous = listener.name == PLAINTEXT or (listener.name == SSL and not client_ca)
        if anonymous and not listener.loopback_only:
            return (
                f"{listener} accepts anyone who can reach it, unauthenticated, and the root has no ACLs: "
                "they could produce, read every topic and fence transactional ids. Listen on a loopback "
                "address, use an SSL listener with --ssl-ca or a SASL listener, add ACLs (`oncelog acls "
                "ROOT add`: User:ANONYMOUS then gets only what they allow), or pass --allow-anonymous to "
                "accept that"
            )
    return None


def root_has_acls(root: str) -> bool:
    """Whether ROOT's security store has ever held an ACL (then every request is authorized)."""
    path = os.path.join(root, SECURITY_DIR)
    if not os.path.isdir(path):
        return False
    try:
        store = DEFAULT_FS.open_store(path, readonly=True)
    except FileNotFoundError:
        return False  # (a directory LMDB has not written yet)
    try:
        return AclStore(store).current()[1]
    finally:
        store.close()


def _security_config(args: argparse.Namespace) -> dict[str, Any]:
    """The ServeConfig fields of the security arguments; ValueError saying what is wrong."""
    tls = None
    if args.ssl_cert or args.ssl_key or args.ssl_ca:
        if not (args.ssl_cert and args.ssl_key):
            raise ValueError("--ssl-cert and --ssl-key go together")
        tls = TlsFiles(args.ssl_cert, args.ssl_key, args.ssl_ca)
    mechanisms = tuple(name.strip().upper() for name in args.sasl_mechanisms.split(",") if name.strip())
    return {
        "tls": tls,
        "principal_rules": tuple(parse_principal_rule(rule) for rule in args.ssl_principal_rule),
        "sasl_mechanisms": mechanisms,
        "super_users": tuple(args.super_user),
    }


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The ServeConfig the arguments ask for; ValueError saying what is wrong (the TLS files
    are loaded once here, so a bad one is named before any partition is recovered)."""
    listeners = listeners_from(args)
    if args.ssl_ca is not None and not any(listener.name == SSL for listener in listeners):
        raise ValueError(
            "--ssl-ca names the clients of SSL listeners, and there is none (SASL_SSL asks none)"
        )
    config = ServeConfig(
        listen_host=listeners[0].host,
        listen_port=listeners[0].port,
        advertise_host=listeners[0].advertise_host,
        advertise_port=listeners[0].advertise_port,
        listeners=tuple(listeners),
        **_security_config(args),
        partitions=args.partitions,
        auto_create_topics=not args.no_auto_create,
        fsync_acks=args.fsync_acks,
        groups=GroupLimits(
            initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=args.group_min_session_timeout_ms,
        ),
        transaction_max_timeout_ms=args.transaction_max_timeout_ms,
        max_connections=args.max_connections,
        max_connections_per_ip=args.max_connections_per_ip,
        first_request_ms=args.first_request_ms,
        max_unsent_bytes=args.max_unsent_bytes,
        retention_check_ms=args.retention_check_ms,
        cleaner_threads=args.cleaner_threads,
        cleaner_io_bytes_per_s=args.cleaner_io_bytes_per_s,
        cleaner_backoff_ms=args.cleaner_backoff_ms,
    )
    authorizing = config.authenticates_clients or bool(config.super_users) or root_has_acls(args.root)
    exposure = anonymous_exposure(listeners, args.allow_anonymous, args.ssl_ca is not None, authorizing)
    if exposure is not None:
        raise ValueError(exposure)
    tls_files = [] if config.tls is None else [config.tls.cert, config.tls.key, config.tls.ca]
    for path in filter(None, tls_files):
        try:
            with open(path, "rb"):  # (ssl names no file when one is missing)
                pass
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        for listener in listeners:
            tls_context(config, listener)
    except ssl.SSLError as exc:  # a key that is not the certificate's, a file that is not PEM
        raise ValueError(f"the TLS files do not load: {exc}") from exc
    return config


def root_problem(root: str) -> str | None:
    """Why ROOT cannot be served (unservable_root), or its credential store is not private; None."""
    why = unservable_root(root)
    credentials = os.path.join(root, SECURITY_DIR)
    if why is None and os.path.isdir(credentials):
        try:
            check_private(credentials)
        except StoreNotPrivateError as exc:
            why = str(exc)
    return why


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        config = serve_config(args)
    except ValueError as exc:
        print(f"oncelog serve: {exc}", file=err)
        return EXIT_BAD_INPUT
    why = root_problem(args.root)  # before recovering every partition, not after
    if why is not None:
        print(f"oncelog serve: {why}", file=err)
        return EXIT_BAD_INPUT
    # Recovery and every partition's files need descriptors: take what the hard limit allows.
    raise_open_files_limit()
    try:
        manager = LogManager.open(
            args.root, recovery_threads=args.threads, progress=False if args.no_progress else None
        )
    except LogDirLockedError as exc:
        print(f"oncelog serve: {exc}; is another server using it?", file=err)
        return EXIT_BAD_INPUT
    except ValueError as exc:  # --threads out of range
        print(f"oncelog serve: {exc}", file=err)
        return EXIT_BAD_INPUT
    except PartitionRecoveryError as exc:
        for tp, failure in sorted(exc.failures.items()):
            print(f"FAILED {tp}: {type(failure).__name__}: {failure}", file=err)
        print(
            f"oncelog serve: {len(exc.failures)} partition(s) failed to recover; see `oncelog recover`",
            file=err,
        )
        return EXIT_FAILED
    try:
        print(manager.recovery_summary, file=out, flush=True)
        return _serve(manager, config, out, err)
    finally:
        manager.close()  # (run_server closed it, unless a Ctrl-C came before it started)


def _serve(manager: LogManager, config: ServeConfig, out: TextIO, err: TextIO) -> int:
    """Serve until SIGTERM (exit 0) or SIGINT (KeyboardInterrupt, after the same clean close:
    main prints the one line and exits 130)."""
    try:
        # From the stop on, a second Ctrl-C ends the process at once.
        stopped_by = run_server(manager, config, out, sigint_while_stopping=exits_at_once(PROG))
    except OncelogError as exc:  # a damaged coordinator store, or a log that failed and could not close
        print(f"oncelog serve: {type(exc).__name__}: {exc}", file=err)
        return EXIT_FAILED
    except StoreNotPrivateError as exc:  # made readable since the check at start
        print(f"oncelog serve: {exc}", file=err)
        return EXIT_BAD_INPUT
    except OSError as exc:  # the port is taken, say
        where = ", ".join(map(str, config.all_listeners))
        print(f"oncelog serve: cannot listen on {where}: {exc.strerror or exc}", file=err)
        return EXIT_BAD_INPUT
    if stopped_by == signal.SIGINT:
        raise KeyboardInterrupt  # every log is closed cleanly already
    return EXIT_OK
