"""A fetch keeps to max_bytes in all, as KIP-74 says (issue 31, finding 0082).

Only the first partition with data may go past the limits, to return one whole batch
(so a batch larger than them never stalls a consumer); every later partition adds
batches only while they fit in what is left of max_bytes and in its
partition_max_bytes. Sizes are read from raw Fetch responses (kio's codec); real
clients with small fetch limits then read every partition whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
import pytest
from fetch_requests import batch_sizes, fetch, fetch_body, preload, records_by_partition
from in_process import InProcessServer
from wire_client import WireSocket

from oncelog.server.broker import ServeConfig

TOPIC = "limits"
PARTITIONS = 4
BATCHES = 3  # per partition
VALUE_BYTES = 300_000
MAX_BYTES = 1_000_000


@pytest.fixture(scope="module")
def limits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessServer, int]]:
    root: Path = tmp_path_factory.mktemp("limits-root")
    batch_bytes = preload(root, TOPIC, PARTITIONS, BATCHES, VALUE_BYTES)
    with InProcessServer(root, ServeConfig(listen_port=0)) as running:
        yield running, batch_bytes


def _all_partitions(offset: int = 0) -> dict[str, list[tuple[int, int]]]:
    return {TOPIC: [(partition, offset) for partition in range(PARTITIONS)]}


def test_after_the_first_partition_with_data_only_batches_that_fit_in_max_bytes_are_added(
    limits: tuple[InProcessServer, int],
) -> None:
    running, batch_bytes = limits
    body = fetch_body(_all_partitions(), max_bytes=MAX_BYTES, partition_max_bytes=1 << 20)
    with WireSocket(running.bootstrap) as sock:
        records = records_by_partition(fetch(sock, body))
    # Three batches fit in 1,000,000 bytes; a fourth, from any partition, would not.
    assert BATCHES * batch_bytes <= MAX_BYTES < (BATCHES + 1) * batch_bytes
    assert batch_sizes(records[(TOPIC, 0)]) == [batch_bytes] * BATCHES
    assert [records[(TOPIC, p)] for p in range(1, PARTITIONS)] == [b""] * (PARTITIONS - 1)
    assert sum(len(r) for r in records.values()) <= MAX_BYTES  # four batches before the fix


def test_partition_max_bytes_leaves_room_that_later_partitions_fill_with_whole_batches(
    limits: tuple[InProcessServer, int],
) -> None:
    running, batch_bytes = limits
    body = fetch_body(_all_partitions(), max_bytes=MAX_BYTES, partition_max_bytes=batch_bytes + 10)
    with WireSocket(running.bootstrap) as sock:
        records = records_by_partition(fetch(sock, body))
    sizes = [batch_sizes(records[(TOPIC, p)]) for p in range(PARTITIONS)]
    # One batch a partition by partition_max_bytes, until max_bytes leaves no room for another.
    assert sizes == [[batch_bytes]] * BATCHES + [[]] * (PARTITIONS - BATCHES)
    assert sum(len(r) for r in records.values()) <= MAX_BYTES


def test_the_first_partition_with_data_returns_one_whole_batch_larger_than_every_limit(
    limits: tuple[InProcessServer, int],
) -> None:
    running, batch_bytes = limits
    # Partition 0 is read at its end (no data): the exception passes to partition 1.
    offsets = {TOPIC: [(0, BATCHES), (1, 0), (2, 0)]}
    body = fetch_body(offsets, max_bytes=1000, partition_max_bytes=1000)
    with WireSocket(running.bootstrap) as sock:
        records = records_by_partition(fetch(sock, body))
    assert [batch_sizes(records[(TOPIC, p)]) for p in range(3)] == [[], [batch_bytes], []]


def _expected_values() -> dict[bytes, bytes]:
    return {
        f"{partition}-{n}".encode(): bytes([n % 251]) * VALUE_BYTES
        for partition in range(PARTITIONS)
        for n in range(BATCHES)
    }


def test_a_confluent_consumer_with_small_fetch_limits_reads_every_partition_whole(
    limits: tuple[InProcessServer, int],
) -> None:
    running, _ = limits
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": running.bootstrap,
            "group.id": "limits-confluent",
            "enable.auto.commit": False,
            "message.max.bytes": 1000,  # fetch.max.bytes may not be below it
            "fetch.max.bytes": 100_000,
            "max.partition.fetch.bytes": 100_000,
            "log_level": 3,
        }
    )
    seen: dict[bytes, bytes] = {}
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        for _ in range(200):
            for message in consumer.consume(20, 0.2):
                assert message.error() is None, message.error()
                seen[message.key()] = message.value()
            if len(seen) == PARTITIONS * BATCHES:
                break
    finally:
        consumer.close()
    assert seen == _expected_values()


def test_a_kafka_python_consumer_with_small_fetch_limits_reads_every_partition_whole(
    limits: tuple[InProcessServer, int],
) -> None:
    running, _ = limits
    consumer: Any = kafka.KafkaConsumer(
        bootstrap_servers=running.bootstrap,
        enable_auto_commit=False,
        fetch_max_bytes=100_000,
        max_partition_fetch_bytes=100_000,
        consumer_timeout_ms=10_000,
    )
    try:
        consumer.assign([kafka.TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        for p in range(PARTITIONS):
            consumer.seek(kafka.TopicPartition(TOPIC, p), 0)
        seen: dict[bytes, bytes] = {}
        for message in consumer:
            seen[message.key] = message.value
            if len(seen) == PARTITIONS * BATCHES:
                break
    finally:
        consumer.close()
    assert seen == _expected_values()
