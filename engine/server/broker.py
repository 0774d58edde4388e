"""The state behind the wire APIs: one LogManager root seen as a single-node Kafka cluster.

Topics are the root's partition directories: a topic with N partitions has
directories 0..N-1. Creating a topic first stores its partition count durably in
the root, then creates the directories; a crash in between is finished at the next
start (every recorded topic gets its missing partitions), so a topic never comes
back with fewer partitions than it was created with. Creation runs off the event
loop, one creation per topic at a time.

The cluster id is kept in the root's metadata store, so clients see the same
cluster after a restart.

Kafka's internal topics (`__consumer_offsets`, `__transaction_state`,
`__share_group_state`) are not client topics here: the coordinators keep their state
in the coordinator store, not in them. None is ever created (CreateTopics, auto-
creation), and clients may not write or read one (check_client_topic); one already
in the root (a copied Kafka log.dir, or a topic an older server created) is still
described by Metadata, marked internal.

The group and transaction coordinators live here too, over one store in the root
(`coordinator.lmdb`, see coordinator_store).

Appends wake long-polling fetches per partition: a fetch registers an event on the
partitions it reads, and an append sets the events of the partitions it wrote.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import os
import resource
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from oncelog.errors import LogDirectoryError, OncelogError
from oncelog.layout import InvalidTopicError, TopicPartition, validate_topic_partition
from oncelog.log import Log
from oncelog.log_manager import LogManager, UnknownTopicOrPartitionError
from oncelog.segments import file_cache
from oncelog.server.acl_store import AclStore
from oncelog.server.acls import InvalidAclError, normal_host
from oncelog.server.authorization import Access, Authorizer
from oncelog.server.codec import Request
from oncelog.server.coordinator_store import CoordinatorStore
from oncelog.server.credentials import SASL_MECHANISMS, SCRAM_MECHANISMS, CredentialStore
from oncelog.server.errors import InternalTopicError, InvalidPartitionsError, TopicExistsError
from oncelog.server.group_coordinator import GroupCoordinator
from oncelog.server.group_state import GroupLimits
from oncelog.server.listeners import PLAINTEXT, Listener
from oncelog.server.rate_limited_log import RateLimitedLog
from oncelog.server.tls import PrincipalRule, TlsFiles
from oncelog.server.topic_configs import checked
from oncelog.server.txn_coordinator import TransactionCoordinator
from oncelog.server.unsent import UnsentBytes
from oncelog.storage.partition_store import STORE_WRITERS

_T = TypeVar("_T")
log = logging.getLogger("oncelog.server")
NODE_ID: Final = 0
CLUSTER_ID_NAME: Final = "kafka-cluster-id"
# Where each topic's partition count is kept in the root (root_value names).
TOPIC_PARTITIONS_PREFIX: Final = "kafka-topic-partitions/"
# A topic being deleted, and its partition count: stored before any partition goes, so a
# crash part way finishes the delete at the next start (never leaves half a topic).
TOPIC_DELETING_PREFIX: Final = "kafka-topic-deleting/"
MAX_PARTITIONS_PER_TOPIC: Final = 10_000
# File descriptors one partition may hold open: its active segment's .log always; its active
# segment's .txnindex once an aborted transaction's marker is in it. Its directory lock is the
# root's lock table's (one descriptor in all). Held by the process, not by a partition: the
# metadata stores open for writing (three each, at most partition_store.STORE_WRITERS), and
# sealed segments being read (the segment file cache: a quarter of the limit,
# segments.file_cache); those kept for connections and the process itself are reserved:
# together what bounds the partitions a server may create (max_partitions_for).
FDS_PER_PARTITION: Final = 2
FDS_PER_STORE_WRITER: Final = 3
FDS_RESERVED: Final = 1024
# Fetches read and framed at once: a read is CPU (CRCs) and copies, so more than the
# machine's few cores only adds reads held in memory at the same time.
FETCH_THREADS: Final = 2
LOGIN_THREADS: Final = 1
# Kafka's internal topics (org.apache.kafka.common.internals.Topic.INTERNAL_TOPICS).
INTERNAL_TOPICS: Final = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


def is_internal_topic(topic: str) -> bool:
    """Whether `topic` is one of Kafka's internal topics, which clients neither create, write nor read."""
    return topic in INTERNAL_TOPICS


def raise_open_files_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (as Kafka's docs ask); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # keep the soft limit; max_partitions_for budgets within it
    return soft


def max_partitions_for(open_files_limit: int, max_connections: int) -> int:
    """How many partitions fit the file descriptors left after connections, the segment file
    cache and the process's own."""
    left = (
        open_files_limit
        - FDS_RESERVED
        - max_connections
        - file_cache.default_capacity(open_files_limit)
        - FDS_PER_STORE_WRITER * STORE_WRITERS.capacity
    )
    return max(left // FDS_PER_PARTITION, 1)


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """How `oncelog serve` listens, advertises and answers."""

    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    # Where Metadata tells clients to connect next; the listen address if None.
    advertise_host: str | None = None
    advertise_port: int | None = None
    partitions: int = 1
    auto_create_topics: bool = True
    # acks=all is answered only once the batch is fsynced (group commit) when set.
    fsync_acks: bool = False
    max_connections: int = 4096
    # Connections one client address may hold (Kafka's max.connections.per.ip); None for a
    # quarter of max_connections, so one client cannot take every slot (connections_per_ip).
    max_connections_per_ip: int | None = None
    # A new connection must have sent one complete request within this, or it is closed: a
    # peer that connects and sends nothing, or trickles its first request, holds no slot long.
    first_request_ms: int = 10_000
    # Kafka's connections.max.idle.ms: how long a connection may wait between requests (idle
    # producers and consumers are legitimate).
    idle_ms: int = 600_000
    # A request's bytes, its size prefix included, must all arrive within this once its first has.
    frame_read_ms: int = 30_000
    # A response must be taken by the client within this, or the connection is closed.
    write_timeout_ms: int = 60_000
    # Kafka's fetch.max.wait upper bound; a client asking longer waits this long.
    max_fetch_wait_ms: int = 30_000
    # Bytes all connections may hold for responses their clients have not taken (see unsent).
    max_unsent_bytes: int = 256 * 1024 * 1024
    # How often retention (retention_ms, retention_bytes) runs: Kafka's log.retention.check.interval.ms.
    retention_check_ms: int = 300_000
    # The background cleaner of compacted topics: Kafka's log.cleaner.threads (0: none, as
    # log.cleaner.enable=false), log.cleaner.io.max.bytes.per.second (None: no cap) and
    # log.cleaner.backoff.ms (how long a thread sleeps when no log is due).
    cleaner_threads: int = 1
    cleaner_io_bytes_per_s: int | None = None
    cleaner_backoff_ms: int = 15_000
    groups: GroupLimits = field(default_factory=GroupLimits)
    # Kafka's transaction.max.timeout.ms: a producer asking for more gets INVALID_TRANSACTION_TIMEOUT.
    transaction_max_timeout_ms: int = 900_000
    # Kafka's transactional.id.expiration.ms: an id with no transaction open this long is forgotten.
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    # Every listener (see listeners); none: one PLAINTEXT listener at listen_host:listen_port.
    listeners: tuple[Listener, ...] = ()
    # The certificate and key of the SSL and SASL_SSL listeners, and the CA of client certificates.
    tls: TlsFiles | None = None
    # Kafka's ssl.principal.mapping.rules, applied to a client certificate's subject.
    principal_rules: tuple[PrincipalRule, ...] = ()
    # Kafka's sasl.enabled.mechanisms.
    sasl_mechanisms: tuple[str, ...] = SCRAM_MECHANISMS
    # Kafka's connection.failed.authentication.delay.ms: a failed login is answered this late.
    failed_authentication_delay_ms: int = 100
    # Kafka's super.users: principals (`User:NAME`) allowed everything, the cluster's admin APIs included.
    super_users: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.sasl_mechanisms) - set(SASL_MECHANISMS)
        if unknown or not self.sasl_mechanisms:
            raise ValueError(
                f"SASL mechanisms must be some of {', '.join(SASL_MECHANISMS)}, "
                f"got {', '.join(self.sasl_mechanisms) or 'none'}"
            )
        if self.tls is None and any(listener.uses_tls for listener in self.all_listeners):
            raise ValueError(
                "an SSL or SASL_SSL listener needs a certificate and its key (--ssl-cert, --ssl-key)"
            )
        for principal in self.super_users:
            if (
                not principal.startswith("User:")
                or len(principal) == len("User:")
                or not principal.isprintable()
            ):
                raise ValueError(f"a super user is a principal such as User:alice, got {principal!r}")
        if (
            self.cleaner_threads < 0
            or self.cleaner_backoff_ms <= 0
            or (self.cleaner_io_bytes_per_s is not None and self.cleaner_io_bytes_per_s <= 0)
        ):
            raise ValueError("cleaner threads must be 0 or more, its backoff and I/O cap positive")
        if self.failed_authentication_delay_ms < 0:
            raise ValueError("the failed authentication delay must be 0 or more")
        if not 1 <= self.partitions <= MAX_PARTITIONS_PER_TOPIC:
            raise ValueError(f"partitions must be 1..{MAX_PARTITIONS_PER_TOPIC}, got {self.partitions}")
        if not 0 <= self.listen_port <= 65535:
            raise ValueError(f"listen port must be 0..65535, got {self.listen_port}")
        positive = (
            self.max_connections,
            self.connections_per_ip,
            self.first_request_ms,
            self.idle_ms,
            self.frame_read_ms,
            self.write_timeout_ms,
            self.max_unsent_bytes,
        )
        durations = (
            self.retention_check_ms,
            self.transaction_max_timeout_ms,
            self.transactional_id_expiration_ms,
        )
        if min(positive) <= 0 or min(durations) <= 0:
            raise ValueError(
                "connection limits, timeouts, max unsent bytes and the retention interval must be positive"
            )

    @property
    def connections_per_ip(self) -> int:
        """The most connections one client address may hold."""
        if self.max_connections_per_ip is not None:
            return self.max_connections_per_ip
        return max(self.max_connections // 4, 1)

    @property
    def advertised(self) -> tuple[str, int]:
        """What the first listener advertises."""
        return self.all_listeners[0].advertised

    @property
    def authenticates_clients(self) -> bool:
        """Whether some listener names its clients: SASL, or SSL with client certificates."""
        return any(
            listener.uses_sasl or (listener.uses_tls and self.tls is not None and self.tls.ca is not None)
            for listener in self.all_listeners
        )

    @property
    def all_listeners(self) -> tuple[Listener, ...]:
        if self.listeners:
            return self.listeners
        return (
            Listener(PLAINTEXT, self.listen_host, self.listen_port, self.advertise_host, self.advertise_port),
        )


@functools.lru_cache(maxsize=1024)
def _acl_host(address: str) -> str:
    """A client's address as ACLs hold hosts (acls.normal_host); as it is if it is none."""
    try:
        return normal_host(address.partition("%")[0])
    except InvalidAclError:
        return address  # (no ACL holds it: only `*` applies)


def new_cluster_id() -> str:
    """A Kafka-style cluster id: a random UUID in unpadded url-safe base64 (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


class Broker:
    def __init__(self, manager: LogManager, config: ServeConfig):
        self.manager = manager
        self.config = config
        # Partitions in all: what the open-files limit leaves room for (raise it first).
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        # Sized when first imported, perhaps before `serve` raised the limit.
        file_cache.SEGMENT_FILES.resize(file_cache.default_capacity(soft_limit))
        self.max_partitions = max_partitions_for(soft_limit, config.max_connections)
        self.cluster_id = manager.root_value(CLUSTER_ID_NAME, new_cluster_id().encode()).decode("ascii")
        self._partitions: dict[str, int] = {}
        self._logs: dict[TopicPartition, Log] = {}
        # Topic creations, deletions and growths, one at a time: each is judged against the
        # topics as they are when it runs, and none sees another's half-done work.
        self._topic_changes = asyncio.Lock()
        self._watchers: dict[TopicPartition, set[asyncio.Event]] = {}
        self.stopping = False
        # Response bytes written to connections whose clients have not read them yet.
        self.bytes_unsent = 0
        # Requests answered although bytes followed their body (Kafka ignores such bytes).
        self.requests_with_trailing_bytes = 0
        # Warnings a client can repeat at will (a topic that cannot be created, refused
        # connections): once a minute per topic or address.
        self.warnings = RateLimitedLog(log)
        # Bytes held for responses whose clients have not taken them yet, and their limit.
        self.unsent = UnsentBytes(config.max_unsent_bytes)
        # Fetch reads and framing run on their own threads, never the loop's, and never
        # queue an append behind a 50 MB read.
        self._fetch_threads = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="oncelog-fetch")
        # SASL logins (PBKDF2, SCRAM) on their own threads: strangers' logins never queue an append.
        self._login_threads = ThreadPoolExecutor(LOGIN_THREADS, thread_name_prefix="oncelog-login")
        self._interrupted_deletes: list[str] = []
        self._finish_creations()
        self.coordinator_store = CoordinatorStore.open(manager.fs, manager.root)
        self.credentials = CredentialStore.open(manager.fs, manager.root)
        self.authorizer = Authorizer(
            AclStore(self.credentials.store),
            config.super_users,
            config.authenticates_clients,
        )
        self.groups = GroupCoordinator(self.coordinator_store, config.groups)
        self.transactions = TransactionCoordinator(
            self.coordinator_store,
            manager.producer_ids,
            self.groups,
            self._write_marker,
            self.in_thread,
            self.appended,
            sync_partition=self._sync_partition,
            topic_exists=lambda topic: topic in self._partitions,
            max_timeout_ms=config.transaction_max_timeout_ms,
            expiration_ms=config.transactional_id_expiration_ms,
        )
        for topic in self._interrupted_deletes:
            self._forget_topic(topic)
            self._deleted(topic)

    def _finish_creations(self) -> None:
        """Load every topic; finish the deletes a crash interrupted, and give a recorded topic
        the partitions a crash kept it from creating."""
        for name, value in self.manager.root_values(TOPIC_DELETING_PREFIX).items():
            topic = name[len(TOPIC_DELETING_PREFIX) :]
            log.info("finishing the delete of topic %r that a stop interrupted", topic)
            self._delete_partitions(topic, int(value))
            self._interrupted_deletes.append(topic)  # offsets forgotten once the coordinators load
        on_disk: dict[str, int] = {}
        for tp in self.manager.logs():
            on_disk[tp.topic] = max(on_disk.get(tp.topic, 0), tp.partition + 1)
        recorded = {
            name[len(TOPIC_PARTITIONS_PREFIX) :]: int(value)
            for name, value in self.manager.root_values(TOPIC_PARTITIONS_PREFIX).items()
            if name[len(TOPIC_PARTITIONS_PREFIX) :]
            not in self._interrupted_deletes  # (gone: its count goes last)
        }
        counts = {
            topic: max(recorded.get(topic, 0), on_disk.get(topic, 0))
            for topic in set(on_disk) | set(recorded)
        }
        total = sum(counts.values())
        if total > self.max_partitions and total > len(self.manager.logs()):
            # Partitions to make, past the budget: a stray directory such as `orders-12345678`
            # would otherwise be filled in with twelve million partitions before the first request.
            topic = max(counts, key=lambda t: counts[t])
            raise LogDirectoryError(
                f"topic {topic!r} would have {counts[topic]} partitions (its highest partition directory "
                f"or its recorded count), the root {total} in all, past the server's budget of "
                f"{self.max_partitions}: a stray directory? Remove it, or raise the open-files limit",
                path=os.path.join(self.manager.root, f"{topic}-{counts[topic] - 1}"),
            )
        for topic, count in sorted(counts.items()):
            for partition in range(count):
                self.manager.log(topic, partition, create=True)
            self._partitions[topic] = count

    # -- topics ----------------------------------------------------------------------------
    def topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        return dict(sorted(self._partitions.items()))

    def has_partition(self, topic: str, partition: int) -> bool:
        return 0 <= partition < self._partitions.get(topic, 0)

    def total_partitions(self) -> int:
        return sum(self._partitions.values())

    async def partition_count(self, topic: str, *, auto_create: bool) -> int | None:
        """`topic`'s partition count, creating it with the default count if allowed; None if absent.

        InvalidTopicError for a name no partition directory can have, InternalTopicError for
        an internal topic the root does not hold (never created).
        """
        count = self._partitions.get(topic)
        if count is not None:
            return count
        validate_topic_partition(topic, 0)
        self.check_client_topic(topic)  # not a name a client topic may have here
        if not (auto_create and self.config.auto_create_topics):
            return None
        try:
            with contextlib.suppress(TopicExistsError):  # created meanwhile by another request
                await self.create_topic(topic, self.config.partitions)
        except (OncelogError, InvalidPartitionsError) as exc:  # past the partition budget, say
            self.warnings.warning(
                ("auto-create", topic), "creating topic %r on first use failed: %s", topic, exc
            )
            raise
        return self._partitions.get(topic)

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        *,
        validate_only: bool = False,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Create `topic` with `partitions` partitions off the event loop; raises what CreateTopics
        says (InvalidConfigError for an override LogConfig refuses). `overrides`: exactly the
        LogConfig overrides it gets (CreateTopics); None keeps what the root holds for it (a
        topic made on first use, after LogManager.set_topic_config, say)."""
        async with self._topic_changes:  # judged against the topics as they are once it runs
            self._check_new_topic(topic, partitions)
            checked(self.manager.config, overrides or {})  # InvalidConfigError names a value it cannot take
            if validate_only:
                return
            self._partitions[topic] = await self.in_thread(
                lambda: self._create_partitions(topic, partitions, overrides)
            )

    async def delete_topic(self, topic: str) -> None:
        """Delete `topic` and its partitions, crash-safe (TOPIC_DELETING_PREFIX); it is not served
        from the start. UnknownTopicOrPartitionError if absent, InternalTopicError for Kafka's."""
        self.check_client_topic(topic)
        async with self._topic_changes:
            count = self._partitions.pop(topic, None)
            if count is None:
                raise UnknownTopicOrPartitionError(f"no topic {topic!r}")
            await self.in_thread(lambda: self._delete_partitions(topic, count))
            self._forget_topic(topic)  # on the loop: the coordinators are the loop's
            await self.in_thread(lambda: self._deleted(topic))

    def _delete_partitions(self, topic: str, count: int) -> None:
        """Delete a topic's partitions and configs (in a worker thread, or at start), marked
        first: a stop part way finishes the delete at the next start."""
        self.manager.set_root_values({TOPIC_DELETING_PREFIX + topic: str(count).encode()})
        for partition in range(count):
            self._logs.pop(TopicPartition(topic, partition), None)
            with contextlib.suppress(UnknownTopicOrPartitionError):  # (gone before a crash)
                self.manager.delete_log(topic, partition)
        self.manager.reset_topic_config(topic)

    def _forget_topic(self, topic: str) -> None:
        """The groups' committed offsets of a deleted topic, and those transactions hold for it,
        forgotten (as Kafka cleans them): a topic made again under the name starts anew."""
        self.transactions.drop_topic_offsets(topic)
        self.transactions.drop_topic_ends(topic)
        for group_id, group in list(self.groups.groups.items()):
            stale = [key for key in group.offsets if key[0] == topic]
            if stale:
                self.groups.remove_offsets(group_id, stale)

    def _deleted(self, topic: str) -> None:
        # Last, in one commit: the topic's count, and the mark that it was being deleted.
        self.manager.set_root_values(
            {TOPIC_PARTITIONS_PREFIX + topic: None, TOPIC_DELETING_PREFIX + topic: None}
        )

    async def add_partitions(self, topic: str, count: int, *, validate_only: bool = False) -> None:
        """Grow `topic` to `count` partitions (CreatePartitions). InvalidPartitionsError unless it
        grows within the budget; UnknownTopicOrPartitionError if absent."""
        self.check_client_topic(topic)
        async with self._topic_changes:
            current = self._partitions.get(topic)
            if current is None:
                raise UnknownTopicOrPartitionError(f"no topic {topic!r}")
            if not current < count <= MAX_PARTITIONS_PER_TOPIC:
                raise InvalidPartitionsError(
                    f"topic {topic!r} has {current} partitions; it can grow to more, not {count}"
                )
            if self.total_partitions() + count - current > self.max_partitions:
                raise InvalidPartitionsError(
                    f"{count - current} more partitions would pass this server's {self.max_partitions} "
                    f"(its open-files limit); {self.total_partitions()} exist"
                )
            if not validate_only:
                self._partitions[topic] = await self.in_thread(lambda: self._grow(topic, count))

    def _grow(self, topic: str, count: int) -> int:
        # The count first, durably: a crash part way leaves partitions the next start makes.
        self.manager.set_root_values({TOPIC_PARTITIONS_PREFIX + topic: str(count).encode()})
        for partition in range(count):
            self.manager.log(topic, partition, create=True)
        return count

    def _check_new_topic(self, topic: str, partitions: int) -> None:
        validate_topic_partition(topic, 0)
        if topic in self._partitions:
            raise TopicExistsError(
                f"topic {topic!r} already exists with {self._partitions[topic]} partitions"
            )
        self.check_client_topic(topic)
        if not 1 <= partitions <= MAX_PARTITIONS_PER_TOPIC:
            raise InvalidPartitionsError(
                f"partitions must be 1..{MAX_PARTITIONS_PER_TOPIC}, got {partitions}"
            )
        if self.total_partitions() + partitions > self.max_partitions:
            raise InvalidPartitionsError(
                f"{partitions} more partitions would pass this server's {self.max_partitions} "
                f"(its open-files limit); {self.total_partitions()} exist"
            )
        # Kafka refuses names that differ only by '.' and '_' (they collide in its metrics).
        collides = topic.replace(".", "_")
        for existing in self._partitions:
            if existing != topic and existing.replace(".", "_") == collides:
                raise InvalidTopicError(f"topic {topic!r} collides with existing topic {existing!r}")

    def _create_partitions(self, topic: str, partitions: int, overrides: Mapping[str, Any] | None) -> int:
        """Create the partitions; the count created (a failed earlier attempt's, if one was recorded)."""
        # Its configs before its count (both durable): a topic that exists has the configs it
        # was created with; a failed creation's are replaced.
        name = TOPIC_PARTITIONS_PREFIX + topic
        if overrides is not None and name not in self.manager.root_values(name):  # (a prefix)
            self.manager.replace_topic_config(topic, overrides)
        # The count first, durably: a crash part way leaves a topic the next start finishes.
        count = int(self.manager.root_value(TOPIC_PARTITIONS_PREFIX + topic, str(partitions).encode()))
        for partition in range(count):
            self.manager.log(topic, partition, create=True)
        return count

    @staticmethod
    def check_client_topic(topic: str) -> None:
        """InternalTopicError if `topic` is not one clients may create, write or read."""
        if is_internal_topic(topic):
            raise InternalTopicError(
                f"{topic} is one of Kafka's internal topics; this server keeps that state in "
                "coordinator.lmdb, and no client may create, write or read the topic"
            )

    def client_log(self, topic: str, partition: int) -> Log:
        """The log of a partition a client may write or read: `log`, refusing internal topics."""
        self.check_client_topic(topic)
        return self.log(topic, partition)

    def log(self, topic: str, partition: int) -> Log:
        """The log of an existing partition; UnknownTopicOrPartitionError otherwise."""
        tp = TopicPartition(topic, partition)
        found = self._logs.get(tp)
        if found is not None:
            return found
        count = self._partitions.get(topic)
        if count is None or not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition}")
        found = self._logs[tp] = self.manager.log(topic, partition, create=False)
        return found

    def _write_marker(
        self, tp: TopicPartition, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> int:
        """Write a transaction marker to `tp` (in a worker thread); its offset. Not fsynced here:
        the completion naming it is stored first, then `_sync_partition` (txn_coordinator, step 5)."""
        target = self.log(tp.topic, tp.partition)
        written = target.write_txn_marker(
            producer_id, producer_epoch, commit=commit, coordinator_epoch=coordinator_epoch
        )
        return written.first_offset

    def _sync_partition(self, tp: TopicPartition, end_offset: int) -> None:
        """fsync `tp` below `end_offset` (in a worker thread): the markers a stored completion
        names. Through the log's group commit, outside its append lock: the next transaction's
        appends to the partition (on the event loop) do not wait for the fsync, and markers of
        transactions ending together share one."""
        self.log(tp.topic, tp.partition).wait_durable(end_offset)

    def restore_lost_markers(self) -> list[tuple[TopicPartition, int]]:
        """Write again each marker of a stored end that a crash took (in a thread, at start).

        A completion is stored before its markers are fsynced, naming each marker's offset
        (txn_coordinator). If the producer's transaction is open in the partition below
        that offset, the marker was lost (with everything after it): the transaction's data
        there is this end's, and gets the outcome stored for it. Runs before orphans are
        aborted and unfinished ends completed, which would otherwise end that data with
        another outcome. Returns what was written.
        """
        restored = []
        for tp, producer_id, epoch, commit, offset in self.transactions.last_end_markers():
            try:
                target = self.log(tp.topic, tp.partition)  # (an unclean open fsyncs what it kept)
            except UnknownTopicOrPartitionError:
                continue
            first = target.open_transactions().get(producer_id)
            if first is None or first >= offset:
                continue
            state = target.producer_state(producer_id)
            assert state is not None  # an open transaction is a known producer's
            if state.producer_epoch > epoch:  # not this end's data: a newer epoch wrote it
                log.warning("%s: producer %d's open transaction is not the stored end's", tp, producer_id)
                continue
            self._marker_at_start(target, producer_id, epoch, commit=commit)
            restored.append((tp, producer_id))
        return restored

    def _marker_at_start(self, target: Log, producer_id: int, epoch: int, *, commit: bool) -> None:
        """A marker written at start, with a coordinator epoch no older than the producer's
        last marker's, and fsynced before the port opens: a crash after it finds the marker on
        disk, or writes it again."""
        state = target.producer_state(producer_id)
        assert state is not None  # a producer with a transaction open
        coordinator_epoch = max(self.transactions.coordinator_epoch, state.coordinator_epoch)
        target.write_txn_marker(producer_id, epoch, commit=commit, coordinator_epoch=coordinator_epoch)
        target.flush()

    def abort_orphan_transactions(self) -> list[tuple[TopicPartition, int]]:
        """Abort every transaction open in a log that no stored transaction will end (in a thread).

        A transaction is open in a partition only while a coordinator's record holds it, unless
        that record was lost (coordinator.lmdb deleted or restored from an old copy): then
        nothing would ever end it and it would hold read_committed readers back for ever.
        Each such transaction gets an ABORT marker at its producer's own epoch, with a
        coordinator epoch no older than the producer's last marker's. Returns what was aborted.
        """
        aborted = []
        for topic, count in self.topics().items():
            for partition in range(count):
                tp = TopicPartition(topic, partition)
                target = self.log(topic, partition)
                for producer_id in target.open_transactions():
                    if self.transactions.holds(producer_id, tp):
                        continue
                    state = target.producer_state(producer_id)
                    assert state is not None  # an open transaction is a known producer's
                    self._marker_at_start(target, producer_id, state.producer_epoch, commit=False)
                    aborted.append((tp, producer_id))
        return aborted

    # -- fetch wake-ups --------------------------------------------------------------------
    def watch(self, partitions: Iterable[TopicPartition]) -> asyncio.Event:
        """An event that the next append to any of `partitions` sets; unwatch it when done."""
        event = asyncio.Event()
        if self.stopping:
            event.set()
        for tp in partitions:
            self._watchers.setdefault(tp, set()).add(event)
        return event

    def unwatch(self, partitions: Iterable[TopicPartition], event: asyncio.Event) -> None:
        for tp in partitions:
            watchers = self._watchers.get(tp)
            if watchers is not None:
                watchers.discard(event)
                if not watchers:
                    del self._watchers[tp]

    def appended(self, partitions: Iterable[TopicPartition]) -> None:
        """Wake the fetches waiting on `partitions`."""
        for tp in partitions:
            for event in self._watchers.get(tp, ()):
                event.set()

    def stop(self) -> None:
        """Begin a shutdown: waiting fetches return at once with what they have, and waiting
        JoinGroups and SyncGroups with NOT_COORDINATOR (GroupCoordinator.stop)."""
        self.stopping = True
        self.groups.stop()
        for watchers in self._watchers.values():
            for event in watchers:
                event.set()
        self.unsent.wake_all()

    def close(self) -> None:
        """Close the coordinators' store and the fetch threads (the logs are the LogManager's to close)."""
        self._fetch_threads.shutdown(wait=True)
        self._login_threads.shutdown(wait=True)
        self.coordinator_store.close()
        self.credentials.close()

    def access(self, request: Request) -> Access:
        """What `request`'s principal, from its address, may do (authorization)."""
        # (An ACL names a host by its address; a request's client_host is Kafka's "/address".)
        return self.authorizer.access(request.session, _acl_host(request.client_host.removeprefix("/")))

    def advertised_for(self, session: Any) -> tuple[str, int]:
        """The address of the listener a request came in on (its session's), as Metadata gives it."""
        listener = getattr(session, "listener", None)
        return listener.advertised if isinstance(listener, Listener) else self.config.advertised

    async def in_thread(self, call: Callable[[], _T]) -> _T:
        """Run blocking engine work (appends, topic creation, an fsync wait) off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, call)

    async def in_login_thread(self, call: Callable[[], _T]) -> _T:
        """Run a SASL login's work off the event loop, on the login threads."""
        return await asyncio.get_running_loop().run_in_executor(self._login_threads, call)

    async def in_fetch_thread(self, call: Callable[[], _T]) -> _T:
        """Run a fetch's reads and framing off the event loop, on the fetch threads."""
        return await asyncio.get_running_loop().run_in_executor(self._fetch_threads, call)
