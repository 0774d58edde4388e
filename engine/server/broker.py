"""The state behind the wire APIs: one LogManager root seen as a single-node Kafka cluster.

Topics are the root's partition directories: a topic with N partitions has
directories 0..N-1. Topics are created whole (every partition, each directory
fsynced by LogManager.log) on first use or by CreateTopics. The cluster id is kept in
the root's metadata store so clients see the same cluster after a restart.

Appends wake long-polling fetches through one asyncio.Event that is replaced on
every append: a fetch waits on the event current when it last read.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from oncelog.layout import MAX_PARTITION, validate_topic_partition
from oncelog.log import Log
from oncelog.log_manager import LogManager, UnknownTopicOrPartitionError

_T = TypeVar("_T")
NODE_ID: Final = 0
CLUSTER_ID_NAME: Final = "kafka-cluster-id"
# CreateTopics and auto-creation refuse more partitions than this per topic: each is a
# directory with open files and mappings.
MAX_PARTITIONS_PER_TOPIC: Final = 10_000


class TopicExistsError(Exception):
    """CreateTopics of a topic that exists (TOPIC_ALREADY_EXISTS)."""


class InvalidPartitionsError(Exception):
    """A partition count outside 1..MAX_PARTITIONS_PER_TOPIC (INVALID_PARTITIONS)."""


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
    max_connections: int = 1000
    # Kafka's connections.max.idle.ms.
    idle_ms: int = 600_000
    # A request's bytes must arrive within this once its size prefix has.
    frame_read_ms: int = 30_000
    # Kafka's fetch.max.wait upper bound; a client asking longer waits this long.
    max_fetch_wait_ms: int = 30_000

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= MAX_PARTITIONS_PER_TOPIC:
            raise ValueError(f"partitions must be 1..{MAX_PARTITIONS_PER_TOPIC}, got {self.partitions}")
        if not 0 <= self.listen_port <= 65535:
            raise ValueError(f"listen port must be 0..65535, got {self.listen_port}")
        if self.max_connections < 1 or self.idle_ms <= 0 or self.frame_read_ms <= 0:
            raise ValueError("max_connections, idle_ms and frame_read_ms must be positive")

    @property
    def advertised(self) -> tuple[str, int]:
        host = self.advertise_host or self.listen_host
        port = self.advertise_port if self.advertise_port is not None else self.listen_port
        return host, port


def new_cluster_id() -> str:
    """A Kafka-style cluster id: a random UUID in unpadded url-safe base64 (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


class Broker:
    def __init__(self, manager: LogManager, config: ServeConfig):
        self.manager = manager
        self.config = config
        self.cluster_id = manager.root_value(CLUSTER_ID_NAME, new_cluster_id().encode()).decode("ascii")
        self._partitions: dict[str, int] = {}
        for tp in manager.logs():
            self._partitions[tp.topic] = max(self._partitions.get(tp.topic, 0), tp.partition + 1)
        self._appended = asyncio.Event()
        self.stopping = False

    # -- topics ----------------------------------------------------------------------------
    def topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        return dict(sorted(self._partitions.items()))

    def partition_count(self, topic: str, *, auto_create: bool) -> int | None:
        """`topic`'s partition count, creating it with the default count if allowed; None if absent.

        InvalidTopicError for a name no partition directory can have.
        """
        count = self._partitions.get(topic)
        if count is not None:
            return count
        validate_topic_partition(topic, 0)
        if not (auto_create and self.config.auto_create_topics):
            return None
        self.create_topic(topic, self.config.partitions)
        return self.config.partitions

    def create_topic(self, topic: str, partitions: int, *, validate_only: bool = False) -> None:
        validate_topic_partition(topic, 0)
        if topic in self._partitions:
            raise TopicExistsError(
                f"topic {topic!r} already exists with {self._partitions[topic]} partitions"
            )
        if not 1 <= partitions <= min(MAX_PARTITIONS_PER_TOPIC, MAX_PARTITION + 1):
            raise InvalidPartitionsError(
                f"partitions must be 1..{MAX_PARTITIONS_PER_TOPIC}, got {partitions}"
            )
        if validate_only:
            return
        for partition in range(partitions):
            self.manager.log(topic, partition, create=True)
        self._partitions[topic] = partitions

    def log(self, topic: str, partition: int) -> Log:
        """The log of an existing partition; UnknownTopicOrPartitionError otherwise."""
        count = self._partitions.get(topic)
        if count is None or not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition}")
        return self.manager.log(topic, partition, create=False)

    # -- fetch wake-ups --------------------------------------------------------------------
    def appended(self) -> None:
        """Wake every fetch waiting for data."""
        if not self._appended.is_set():
            self._appended.set()
            self._appended = asyncio.Event()

    def append_event(self) -> asyncio.Event:
        """The event the next append sets; take it before reading, wait on it after."""
        return self._appended

    def stop(self) -> None:
        """Begin a shutdown: waiting fetches return at once with what they have."""
        self.stopping = True
        self.appended()

    async def in_thread(self, call: Callable[[], _T]) -> _T:
        """Run a blocking engine call (an fsync wait) off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, call)
