"""`oncelog serve ROOT`: a single-node Kafka broker over a LogManager root."""

from __future__ import annotations

import argparse
import os
from typing import Any, TextIO

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK
from oncelog.cli.recover import directory_kind
from oncelog.errors import LogDirLockedError, OncelogError
from oncelog.log_manager import LogManager, PartitionRecoveryError
from oncelog.server.app import run_server
from oncelog.server.broker import (
    MAX_PARTITIONS_PER_TOPIC,
    ServeConfig,
    raise_open_files_limit,
)
from oncelog.server.group_state import GroupLimits

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
clients: the coordinators keep their state in ROOT/coordinator.lmdb."""

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
  oncelog serve data --max-connections 8192 --max-connections-per-ip 512"""

EXIT_FAILED = 1
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
        default="127.0.0.1:9092",
        metavar="HOST:PORT",
        help="where to accept connections (default: %(default)s; port 0 picks a free one)",
    )
    parser.add_argument(
        "--advertise",
        default=None,
        metavar="HOST:PORT",
        help="the address Metadata tells clients to connect to (default: the --listen address)",
    )
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


def _add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection limits: how many, from one address, how soon the first request, and
    how many bytes of responses their clients have not read yet; and how often retention runs."""
    parser.add_argument(
        "--retention-check-ms",
        type=int,
        default=_DEFAULTS.retention_check_ms,
        metavar="MS",
        help="how often segments past their topic's retention.ms or retention.bytes are deleted "
        "(Kafka's log.retention.check.interval.ms; default: %(default)s)",
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


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) as (host, port); ValueError saying what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected HOST:PORT with a port in 0..65535, got {text!r}")
    return host.strip("[]"), int(port_text)


def unservable_root(root: str) -> str | None:
    """Why ROOT cannot be served, or None: it must be missing, empty, or a LogManager root."""
    if not os.path.lexists(root):
        return None  # created
    if not os.path.isdir(root):
        return f"{root} is not a directory"
    try:
        kind = directory_kind(root)
        empty = not os.listdir(root)
    except OSError as exc:
        return f"cannot list {root}: {exc.strerror or exc}"
    if kind == "partition":
        return f"{root} is a partition directory; serve the root that holds it"
    if kind is None and not empty:
        return f"{root} is neither a LogManager root nor empty (a typo?); give a root or a new directory"
    return None


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        listen_host, listen_port = parse_address(args.listen)
        advertise_host, advertise_port = parse_address(args.advertise) if args.advertise else (None, None)
        config = ServeConfig(
            listen_host=listen_host,
            listen_port=listen_port,
            advertise_host=advertise_host,
            advertise_port=advertise_port,
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
        )
    except ValueError as exc:
        print(f"oncelog serve: {exc}", file=err)
        return EXIT_BAD_INPUT
    why = unservable_root(args.root)
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
    try:
        run_server(manager, config, out)
    except OncelogError as exc:  # a damaged coordinator store, or a log that failed and could not close
        print(f"oncelog serve: {type(exc).__name__}: {exc}", file=err)
        return EXIT_FAILED
    except OSError as exc:  # the port is taken, say
        print(f"oncelog serve: cannot listen on {args.listen}: {exc.strerror or exc}", file=err)
        return EXIT_BAD_INPUT
    return EXIT_OK
