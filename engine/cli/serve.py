"""`oncelog serve ROOT`: a single-node Kafka broker over a LogManager root."""

from __future__ import annotations

import argparse
import contextlib
import os
import ssl
from typing import Any, TextIO

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK
from oncelog.cli.recover import directory_kind
from oncelog.errors import LogDirLockedError, OncelogError
from oncelog.log_manager import LogManager, PartitionRecoveryError
from oncelog.server.acl_store import AclStore
from oncelog.server.app import run_server, tls_context
from oncelog.server.broker import (
    MAX_PARTITIONS_PER_TOPIC,
    ServeConfig,
    raise_open_files_limit,
)
from oncelog.server.credentials import SASL_MECHANISMS, SCRAM_MECHANISMS
from oncelog.server.group_state import GroupLimits
from oncelog.server.listeners import PLAINTEXT, SSL, Listener, parse_address, parse_listener, with_advertised
from oncelog.server.security_store import STORE_DIR as SECURITY_DIR
from oncelog.server.security_store import StoreNotPrivateError, check_private, is_security_entry
from oncelog.server.tls import TlsFiles, parse_principal_rule
from oncelog.storage.fs import DEFAULT_FS

DESCRIPTION = """\
Serve ROOT to unmodified Kafka clients (librdkafka/confluent-kafka, kafka-python,
aiokafka, kcat) over Kafka's wire protocol, as a single-node cluster (node id 0).

Clients produce idempotently (enable.idempotence=true) and transactionally
(transactional.id), and consume in both isolation levels, with assign() or in
consumer groups (subscribe(), the classic protocol) whose committed offsets are fenced
by generation. Committed offsets, group generations and transaction states are kept
in ROOT/coordinator.lmdb and survive kill -9; transactions a crash left decided are
finished before the port opens. Topic configs, topic ids (Metadata 10+), fetch
sessions and the KIP-848 consumer protocol are not served.

Topics are created on first use with --partitions partitions (Kafka's
auto.create.topics.enable). On start every partition is recovered in parallel (crash
recovery after a kill) and a summary is printed before the port opens. SIGTERM or
Ctrl-C answers the requests in hand, closes every log cleanly and exits 0.

When an acknowledgement is sent: acks=1 and acks=all once the batch is in the page
cache (it survives kill -9 of the server); with --fsync-acks, acks=all once it is
fsynced (it survives power loss). acks=0 gets no response.

Connections: at most --max-connections, and --max-connections-per-ip from one client
address; a connection past either is closed at once. A new connection must send a
complete request within --first-request-ms; after that it may idle between requests
for 10 minutes (Kafka's connections.max.idle.ms). Kafka's internal topics
(__consumer_offsets, __transaction_state) are neither created, written nor read by
clients: the coordinators keep their state in ROOT/coordinator.lmdb.

Security: each --listener is one of Kafka's security protocols. PLAINTEXT serves
anyone (principal User:ANONYMOUS) and, on an address other machines can reach, starts
only if ACLs decide what anonymous clients may do, or with --allow-anonymous (as does
SSL without --ssl-ca). SSL is TLS 1.2+
(--ssl-cert, --ssl-key); with --ssl-ca every client must show a certificate that CA
signed, and its subject is its principal
(User:CN=...,O=..., or as --ssl-principal-rule maps it). SASL_PLAINTEXT and SASL_SSL
log clients in with --sasl-mechanisms (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) against the
users `oncelog users ROOT add` stores in ROOT/security.lmdb (salted and iterated SCRAM
credentials, never a password; the store must be readable by the server's user alone,
or serve refuses to start); nothing but ApiVersions is served before the login, and a
failed login is answered after a delay and closed. Use SASL_PLAINTEXT with PLAIN only
on a trusted network: the password crosses it in the clear.

Authorization: with a listener that names its clients (SASL, SSL with --ssl-ca), a
--super-user, or once the root has held an ACL, every request is authorized as Kafka's
authorizer does it, against the ACLs `oncelog acls ROOT add` and CreateAcls store in
ROOT/security.lmdb (deny wins; no ACL, no access); --super-user principals need none."""

EPILOG = """\
exit status:
  0  stopped by SIGTERM or SIGINT, every log closed cleanly
  1  a partition failed to recover (each is named, with the file and position), or a
     log failed while serving (an fsync, say) and could not be closed cleanly
  2  bad input: a bad address, ROOT in use by another process, ROOT a file, a partition
     directory or a non-empty directory that is not a root

examples:
  oncelog serve /var/lib/oncelog
  oncelog serve data --listen 0.0.0.0:9092 --advertise broker1.example.com:9092
  oncelog serve data --partitions 6 --fsync-acks
  oncelog serve data --max-connections 8192 --max-connections-per-ip 512
  oncelog serve data --listener SASL_SSL://0.0.0.0:9093 --advertise SASL_SSL://broker1.example.com:9093 \
      --ssl-cert server.pem --ssl-key server.key --sasl-mechanisms SCRAM-SHA-512
  oncelog serve data --listener SSL://0.0.0.0:9094 --ssl-cert server.pem --ssl-key server.key \
      --ssl-ca clients-ca.pem --ssl-principal-rule 'RULE:^CN=([^,]+).*$/$1/'"""

EXIT_FAILED = 1
DEFAULT_LISTEN = "127.0.0.1:9092"
_DEFAULT_GROUPS = GroupLimits()
_DEFAULTS = ServeConfig()


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve a root to Kafka clients over the Kafka wire protocol",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("root", metavar="ROOT", help="the LogManager root to serve (created if missing)")
    parser.add_argument(
        "--listen",
        default=None,
        metavar="HOST:PORT",
        help="one PLAINTEXT listener (shorthand for --listener PLAINTEXT://HOST:PORT; "
        "the default when no --listener is given: 127.0.0.1:9092; port 0 picks a free one)",
    )
    parser.add_argument(
        "--advertise",
        action="append",
        default=[],
        metavar="[NAME://]HOST:PORT",
        help="the address Metadata gives clients that came in on listener NAME (repeatable; "
        "a bare HOST:PORT when there is one listener; default: the listen address)",
    )
    _add_security_arguments(parser)
    parser.add_argument(
        "--partitions",
        type=int,
        default=1,
        help=f"partitions of a topic created on first use (1..{MAX_PARTITIONS_PER_TOPIC}; "
        "default: %(default)s)",
    )
    parser.add_argument(
        "--no-auto-create",
        action="store_true",
        help="answer UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist instead of creating it",
    )
    parser.add_argument(
        "--fsync-acks",
        action="store_true",
        help="answer acks=all only once the batch is fsynced (a group commit), so it survives power loss",
    )
    parser.add_argument(
        "--group-initial-rebalance-delay-ms",
        type=int,
        default=_DEFAULT_GROUPS.initial_rebalance_delay_ms,
        metavar="MS",
        help="how long the first rebalance of an empty group waits for more members "
        "(Kafka's group.initial.rebalance.delay.ms; default: %(default)s)",
    )
    parser.add_argument(
        "--group-min-session-timeout-ms",
        type=int,
        default=_DEFAULT_GROUPS.min_session_timeout_ms,
        metavar="MS",
        help="the shortest session.timeout.ms a consumer may ask for (default: %(default)s)",
    )
    parser.add_argument(
        "--transaction-max-timeout-ms",
        type=int,
        default=_DEFAULTS.transaction_max_timeout_ms,
        metavar="MS",
        help="the longest transaction.timeout.ms a producer may ask for; an open transaction is "
        "aborted once its own timeout passes (default: %(default)s)",
    )
    _add_connection_arguments(parser)
    parser.add_argument("--threads", type=int, default=None, help="partitions recovered at once on start")
    parser.add_argument("--no-progress", action="store_true", help="no recovery progress bar on stderr")
    parser.set_defaults(handler=run)


def _add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """Listeners, TLS and SASL (see the `security` section of --help)."""
    parser.add_argument(
        "--listener",
        action="append",
        default=[],
        metavar="NAME://HOST:PORT",
        help="a listener, NAME one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL (repeatable, one per name)",
    )
    parser.add_argument(
        "--ssl-cert", metavar="FILE", help="the server certificate (PEM) of SSL and SASL_SSL listeners"
    )
    parser.add_argument("--ssl-key", metavar="FILE", help="its private key (PEM)")
    parser.add_argument(
        "--ssl-ca",
        metavar="FILE",
        help="clients must show a certificate this CA (PEM) signed (mTLS); on an SSL listener its "
        "subject is the client's principal",
    )
    parser.add_argument(
        "--ssl-principal-rule",
        action="append",
        default=[],
        metavar="RULE",
        help="map a client certificate's subject to a principal as Kafka's ssl.principal.mapping.rules "
        "(RULE:pattern/replacement/[L|U] or DEFAULT; repeatable, the first match wins)",
    )
    parser.add_argument(
        "--sasl-mechanisms",
        default=",".join(SCRAM_MECHANISMS),
        metavar="LIST",
        help=f"SASL mechanisms enabled on SASL listeners, comma-separated, of {', '.join(SASL_MECHANISMS)} "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--super-user",
        action="append",
        default=[],
        metavar="User:NAME",
        help="a principal allowed everything whatever the ACLs say, as Kafka's super.users (repeatable)",
    )
    parser.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="serve a PLAINTEXT listener on an address other machines can reach with no ACLs (anyone "
        "who can connect may then produce, read and fence transactional ids)",
    )


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


def _add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection limits: how many, from one address, how soon the first request, and
    how many bytes of responses their clients have not read yet; how often retention runs; and
    the background cleaner of compacted topics."""
    parser.add_argument(
        "--retention-check-ms",
        type=int,
        default=_DEFAULTS.retention_check_ms,
        metavar="MS",
        help="how often segments past their topic's retention.ms or retention.bytes are deleted "
        "(Kafka's log.retention.check.interval.ms; default: %(default)s)",
    )
    parser.add_argument(
        "--cleaner-threads",
        type=int,
        default=_DEFAULTS.cleaner_threads,
        metavar="N",
        help="threads cleaning compacted topics (cleanup.policy=compact) in the background; 0: none "
        "(Kafka's log.cleaner.threads; default: %(default)s)",
    )
    parser.add_argument(
        "--cleaner-io-bytes-per-s",
        type=int,
        default=None,
        metavar="BYTES",
        help="the most bytes per second the cleaner reads and writes, all threads together "
        "(Kafka's log.cleaner.io.max.bytes.per.second; default: no cap)",
    )
    parser.add_argument(
        "--cleaner-backoff-ms",
        type=int,
        default=_DEFAULTS.cleaner_backoff_ms,
        metavar="MS",
        help="how long a cleaner thread sleeps when no compacted topic is due "
        "(Kafka's log.cleaner.backoff.ms; default: %(default)s)",
    )
    parser.add_argument(
        "--max-unsent-bytes",
        type=int,
        default=_DEFAULTS.max_unsent_bytes,
        metavar="BYTES",
        help="bytes all connections may hold for responses their clients have not read yet; past "
        "it a fetch is not read until some are taken, and answers without records at its "
        "max wait (default: %(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=_DEFAULTS.max_connections,
        metavar="N",
        help="connections open at once; one more is closed as soon as it is accepted (default: %(default)s)",
    )
    parser.add_argument(
        "--max-connections-per-ip",
        type=int,
        default=None,
        metavar="N",
        help="connections open at once from one client address (Kafka's max.connections.per.ip; "
        "default: a quarter of --max-connections)",
    )
    parser.add_argument(
        "--first-request-ms",
        type=int,
        default=_DEFAULTS.first_request_ms,
        metavar="MS",
        help="a new connection that has not sent a complete request within MS is closed "
        "(default: %(default)s)",
    )


def unservable_root(root: str) -> str | None:
    """Why ROOT cannot be served, or None: it must be missing, empty, or a LogManager root."""
    if not os.path.lexists(root):
        return None  # created
    if not os.path.isdir(root):
        return f"{root} is not a directory"
    try:
        kind = directory_kind(root)
        # A new root may already hold its users (`oncelog users ROOT add` before the first serve).
        empty = all(is_security_entry(name) for name in os.listdir(root))
    except OSError as exc:
        return f"cannot list {root}: {exc.strerror or exc}"
    if kind == "partition":
        return f"{root} is a partition directory; serve the root that holds it"
    if kind is None and not empty:
        return f"{root} is neither a LogManager root nor empty (a typo?); give a root or a new directory"
    return None


def security_root_problem(root: str, *, creating: bool) -> str | None:
    """Why `oncelog users` or `oncelog acls` may not keep ROOT's security store, or None; a
    missing ROOT is made when `creating` (its first users or ACLs, before its first serve)."""
    try:
        if creating and not os.path.lexists(root):
            with contextlib.suppress(FileExistsError):  # (the other command may make it at the same time)
                os.mkdir(root)
        if not os.path.isdir(root):
            return f"{root} is not a directory"
        if directory_kind(root) != "root":
            return unservable_root(root)  # a new root is fine; a partition or a stranger's directory not
    except OSError as exc:
        return str(exc)
    return None


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
    print(manager.recovery_summary, file=out, flush=True)
    return _serve(manager, config, out, err)


def _serve(manager: LogManager, config: ServeConfig, out: TextIO, err: TextIO) -> int:
    try:
        run_server(manager, config, out)
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
    return EXIT_OK
