"""The arguments and help text of `oncelog serve`; the command itself is `oncelog.cli.serve`."""

from __future__ import annotations

import argparse
from typing import Any

# The code's values, repeated here so that --help imports nothing heavy;
# tests/cli/test_cli_help.py checks each against the code.
MAX_PARTITIONS_PER_TOPIC = 10_000
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SERVE_DEFAULTS = {
    "cleaner_backoff_ms": 15_000,
    "cleaner_threads": 1,
    "first_request_ms": 10_000,
    "idle_ms": 600_000,
    "max_connections": 4096,
    "max_unsent_bytes": 256 << 20,
    "retention_check_ms": 300_000,
    "transaction_max_timeout_ms": 900_000,
}
GROUP_DEFAULTS = {"initial_rebalance_delay_ms": 3000, "min_session_timeout_ms": 6000}


DESCRIPTION = f"""\
Serve ROOT to unmodified Kafka clients (librdkafka/confluent-kafka, kafka-python,
aiokafka, kcat) over Kafka's wire protocol, as a single-node cluster (node id 0).

Clients produce idempotently (enable.idempotence=true) and transactionally
(transactional.id), and consume in both isolation levels, with assign() or in
consumer groups (subscribe(), the classic protocol) whose committed offsets are fenced
by generation. Committed offsets, group generations and transaction states are kept
in ROOT/coordinator.lmdb and survive kill -9; transactions a crash left decided are
finished before the port opens. Topic configs are served (DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs: `oncelog topics`); topic ids (Metadata 10+),
fetch sessions and the KIP-848 consumer protocol are not.

Topics are created on first use with --partitions partitions (Kafka's
auto.create.topics.enable). On start every partition is recovered in parallel (crash
recovery after a kill) and a summary is printed before the port opens. SIGTERM
answers the requests in hand, closes every log cleanly and exits 0; Ctrl-C (SIGINT)
does the same, then prints "oncelog serve: interrupted" and exits 130 (a second Ctrl-C
while it drains exits at once; a SIGINT ignored when it started, as for a background
job, stays ignored).

When an acknowledgement is sent: acks=1 and acks=all once the batch is in the page
cache (it survives kill -9 of the server); with --fsync-acks, acks=all once it is
fsynced (it survives power loss). acks=0 gets no response.

Connections: at most --max-connections, and --max-connections-per-ip from one client
address; a connection past either is closed at once. A new connection must send a
complete request within --first-request-ms; after that it may idle between requests
for {SERVE_DEFAULTS["idle_ms"] // 60_000} minutes (Kafka's connections.max.idle.ms). Kafka's internal topics
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
  0  stopped by SIGTERM, every log closed cleanly
  1  a partition failed to recover (each is named, with the file and position), or a
     log failed while serving (an fsync, say) and could not be closed cleanly
  2  bad input: a bad address, ROOT in use by another process, ROOT a file, a partition
     directory or a non-empty directory that is not a root
  130  stopped by Ctrl-C (SIGINT): every log closed cleanly, as for SIGTERM; or, during
     the start-up recovery, before the port opened (the partitions recovered by then are
     closed cleanly, the others left as they were)

examples:
  oncelog serve /var/lib/oncelog
  oncelog serve data --listen 0.0.0.0:9092 --advertise broker1.example.com:9092
  oncelog serve data --partitions 6 --fsync-acks
  oncelog serve data --max-connections 8192 --max-connections-per-ip 512
  oncelog serve data --listener SASL_SSL://0.0.0.0:9093 --advertise SASL_SSL://broker1.example.com:9093 \\
      --ssl-cert server.pem --ssl-key server.key --sasl-mechanisms SCRAM-SHA-512
  oncelog serve data --listener SSL://0.0.0.0:9094 --ssl-cert server.pem --ssl-key server.key \\
      --ssl-ca clients-ca.pem --ssl-principal-rule 'RULE:^CN=([^,]+).*$/$1/'"""


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
        default=GROUP_DEFAULTS["initial_rebalance_delay_ms"],
        metavar="MS",
        help="how long the first rebalance of an empty group waits for more members "
        "(Kafka's group.initial.rebalance.delay.ms; default: %(default)s)",
    )
    parser.add_argument(
        "--group-min-session-timeout-ms",
        type=int,
        default=GROUP_DEFAULTS["min_session_timeout_ms"],
        metavar="MS",
        help="the shortest session.timeout.ms a consumer may ask for (default: %(default)s)",
    )
    parser.add_argument(
        "--transaction-max-timeout-ms",
        type=int,
        default=SERVE_DEFAULTS["transaction_max_timeout_ms"],
        metavar="MS",
        help="the longest transaction.timeout.ms a producer may ask for; an open transaction is "
        "aborted once its own timeout passes (default: %(default)s)",
    )
    _add_connection_arguments(parser)
    parser.add_argument("--threads", type=int, default=None, help="partitions recovered at once on start")
    parser.add_argument("--no-progress", action="store_true", help="no recovery progress bar on stderr")
    parser.set_defaults(handler="oncelog.cli.serve")


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


def _add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection limits: how many, from one address, how soon the first request, and
    how many bytes of responses their clients have not read yet; how often retention runs; and
    the background cleaner of compacted topics."""
    parser.add_argument(
        "--retention-check-ms",
        type=int,
        default=SERVE_DEFAULTS["retention_check_ms"],
        metavar="MS",
        help="how often segments past their topic's retention.ms or retention.bytes are deleted "
        "(Kafka's log.retention.check.interval.ms; default: %(default)s)",
    )
    parser.add_argument(
        "--cleaner-threads",
        type=int,
        default=SERVE_DEFAULTS["cleaner_threads"],
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
        default=SERVE_DEFAULTS["cleaner_backoff_ms"],
        metavar="MS",
        help="how long a cleaner thread sleeps when no compacted topic is due "
        "(Kafka's log.cleaner.backoff.ms; default: %(default)s)",
    )
    parser.add_argument(
        "--max-unsent-bytes",
        type=int,
        default=SERVE_DEFAULTS["max_unsent_bytes"],
        metavar="BYTES",
        help="bytes all connections may hold for responses their clients have not read yet; past "
        "it a fetch is not read until some are taken, and answers without records at its "
        "max wait (default: %(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=SERVE_DEFAULTS["max_connections"],
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
        default=SERVE_DEFAULTS["first_request_ms"],
        metavar="MS",
        help="a new connection that has not sent a complete request within MS is closed "
        "(default: %(default)s)",
    )
