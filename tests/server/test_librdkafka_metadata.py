"""librdkafka's all-topics Metadata v9 carries 3 bytes after its body; Kafka ignores them, and so must we.

Before, the server closed the connection on them, so confluent-kafka's
Consumer.list_topics() failed with a transport error and a regex subscription, which
lists every topic to match its pattern, consumed nothing. The recorded request is
replayed byte for byte, then both client calls run against `oncelog serve`.
"""

from __future__ import annotations

import itertools
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from in_process import InProcessServer
from serve_process import ServeProcess
from wire_client import WireSocket, decode_response

from oncelog.server.api_registry import APIS
from oncelog.server.codec import decode_request

# Metadata v9 for all topics as confluent-kafka 2.16.1 (librdkafka 2.16.0) sends it for
# Consumer.list_topics(), recorded through a TCP proxy in front of `oncelog serve`.
# librdkafka writes a 4-byte placeholder for the topic count and, for all topics, leaves it:
# Kafka reads its first byte as a null compact array (all topics), the next three as the
# three flags and the real flags' first byte as an empty tag section; 3 bytes are left.
LIBRDKAFKA_ALL_TOPICS_METADATA_V9 = bytes.fromhex("0003000900000003000772646b61666b61000000000000000000")
TIMEOUT_S = 30.0
_numbers = itertools.count()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """`oncelog serve` whose groups start at once (no initial rebalance delay)."""
    root: Path = tmp_path_factory.mktemp("metadata-root")
    with ServeProcess(root, "--group-initial-rebalance-delay-ms", "0") as server:
        yield server


def _produce(bootstrap: str, values_by_topic: dict[str, list[bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2})
    failures: list[KafkaError] = []
    for topic, values in values_by_topic.items():
        for value in values:
            producer.produce(
                topic, value=value, on_delivery=lambda err, _: failures.append(err) if err else None
            )
    assert producer.flush(TIMEOUT_S) == 0
    assert failures == []


def test_librdkafkas_recorded_all_topics_metadata_v9_decodes_with_its_3_extra_bytes_ignored() -> None:
    request = decode_request(LIBRDKAFKA_ALL_TOPICS_METADATA_V9, APIS)
    assert (request.api_key, request.api_version, request.correlation_id, request.client_id) == (
        3,
        9,
        3,
        "rdkafka",
    )
    assert request.body.topics is None  # all topics
    assert request.trailing_bytes == 3


def test_librdkafkas_recorded_all_topics_metadata_v9_is_answered_with_every_topic_and_counted(
    tmp_path: Path,
) -> None:
    with InProcessServer(tmp_path / "root") as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        futures = admin.create_topics([NewTopic("replayed-a", 2), NewTopic("replayed-b", 1)])
        for future in futures.values():
            future.result(TIMEOUT_S)
        with WireSocket(running.bootstrap) as sock:
            for _ in range(2):  # the connection stays open and in step
                sock.send_raw(struct.pack(">i", len(LIBRDKAFKA_ALL_TOPICS_METADATA_V9)))
                sock.send_raw(LIBRDKAFKA_ALL_TOPICS_METADATA_V9)
                correlation_id, body = decode_response(3, 9, sock.read_frame())
                assert correlation_id == 3
                assert {t.name: len(t.partitions) for t in body.topics} == {"replayed-a": 2, "replayed-b": 1}
                assert all(t.error_code == 0 and not t.is_internal for t in body.topics)
        assert running.server.broker.requests_with_trailing_bytes == 2


def test_a_confluent_consumers_list_topics_lists_every_topic(served: ServeProcess) -> None:
    n = next(_numbers)
    wanted = {f"listed-{n}-{i}": [b"v"] for i in range(3)}
    _produce(served.bootstrap, wanted)
    consumer = Consumer({"bootstrap.servers": served.bootstrap, "group.id": f"lister-{n}"})
    try:
        topics = consumer.list_topics(timeout=TIMEOUT_S).topics  # Metadata v9 for all topics
    finally:
        consumer.close()
    assert set(wanted) <= set(topics)
    for name in wanted:
        assert topics[name].error is None and list(topics[name].partitions) == [0]


def test_a_regex_subscription_consumes_the_records_of_the_matching_topics_only(served: ServeProcess) -> None:
    n = next(_numbers)
    matching = {f"rx-{n}-a": [b"a0", b"a1", b"a2"], f"rx-{n}-b": [b"b0", b"b1"]}
    _produce(served.bootstrap, {**matching, f"not-rx-{n}": [b"other"]})
    expected = {(topic, value) for topic, values in matching.items() for value in values}
    consumer = Consumer(
        {
            "bootstrap.servers": served.bootstrap,
            "group.id": f"regex-{n}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    seen: set[tuple[str, bytes]] = set()
    try:
        consumer.subscribe([f"^rx-{n}-.*"])
        deadline = time.monotonic() + 60.0  # a group join and its first rebalance come first
        while seen != expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            seen.add((msg.topic(), msg.value()))
    finally:
        consumer.close()
    assert seen == expected
