"""How a root holds many partitions: `<topic>-<partition>/` directories, as Kafka lays them out.

A root directory (a broker's log.dir) holds one directory per topic-partition, named
`<topic>-<partition>`, next to root-wide files that never parse as one (`.lock`,
`meta.lmdb`, `producer_ids.lmdb`) or anything else a name check rejects.

Pure: names only, no I/O.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# Kafka's topic rules: 1..249 characters of ASCII letters, digits, '.', '_' and '-',
# and not "." or ".." (a directory name with the partition suffix must fit 255 bytes).
MAX_TOPIC_CHARS = 249
_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_PARTITION_DIR = re.compile(r"(?P<topic>[A-Za-z0-9._-]+)-(?P<partition>0|[1-9][0-9]{0,9})")
MAX_PARTITION = 2**31 - 1  # Kafka's partition numbers are i32


class InvalidTopicError(ValueError):
    """A topic name or partition number that cannot name a partition directory."""


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def validate_topic_partition(topic: str, partition: int) -> TopicPartition:
    """The TopicPartition for `topic`/`partition`, or InvalidTopicError saying what is wrong."""
    if not isinstance(topic, str) or not 1 <= len(topic) <= MAX_TOPIC_CHARS:
        raise InvalidTopicError(f"topic must be 1..{MAX_TOPIC_CHARS} characters, got {topic!r}")
    if topic in (".", "..") or _LEGAL_TOPIC.fullmatch(topic) is None:
        raise InvalidTopicError(
            f"topic {topic!r} may hold only ASCII letters, digits, '.', '_' and '-' (and is not . or ..)"
        )
    if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition <= MAX_PARTITION:
        raise InvalidTopicError(f"partition must be an int in 0..{MAX_PARTITION}, got {partition!r}")
    return TopicPartition(topic, partition)


def partition_dir_name(topic: str, partition: int) -> str:
    return str(validate_topic_partition(topic, partition))


def parse_partition_dir_name(name: str) -> TopicPartition | None:
    """The partition a directory name holds, or None for anything else in a root.

    The partition is the digits after the last '-' (topics may contain '-').
    """
    match = _PARTITION_DIR.fullmatch(name)
    if match is None:
        return None
    topic, partition = match.group("topic"), int(match.group("partition"))
    if topic in (".", "..") or len(topic) > MAX_TOPIC_CHARS or partition > MAX_PARTITION:
        return None
    return TopicPartition(topic, partition)


def is_pending_delete(name: str) -> bool:
    """A Kafka partition directory renamed for deletion (`<topic>-<partition>.<id>-delete`).

    Kafka deletes asynchronously after this rename; such directories are never partitions.
    (oncelog's LogManager records a durable delete intent instead of renaming.)
    """
    return name.endswith("-delete") and parse_partition_dir_name(name.rsplit(".", 1)[0]) is not None
