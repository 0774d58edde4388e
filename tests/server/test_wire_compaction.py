"""A compacted topic over the wire (issue 33), with confluent-kafka end to end.

An admin client creates the topic with cleanup.policy=compact; a producer writes two
values for each of 10,000 keys and then tombstones a tenth of them; the server's
background cleaner cleans it; a new consumer reading from the beginning then finds one
record per live key, its newest value, and no tombstoned key once delete.retention.ms
has passed. A record without a key is refused with Kafka's INVALID_RECORD.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from serve_process import ServeProcess

KEYS: Final = 10_000
TIMEOUT_S: Final = 30.0
CLEANED_WITHIN_S: Final = 240.0  # generous: CI shares its machine (nothing is timed)
SEGMENT_MS: Final = 1_500


def _key(n: int) -> bytes:
    return f"key-{n:05d}".encode()


def _create_compacted(bootstrap: str, topic: str) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": str(64 * 1024),
        "segment.ms": str(SEGMENT_MS),
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "0",
    }
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(TIMEOUT_S)
    return admin


def _produce_updates_and_tombstones(bootstrap: str, topic: str) -> None:
    failed: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})

    def delivered(error: KafkaError | None, _: object) -> None:
        if error is not None:
            failed.append(error)

    for version in (1, 2):
        for n in range(KEYS):
            producer.produce(topic, key=_key(n), value=f"v{version}-{n}".encode(), on_delivery=delivered)
            producer.poll(0)
    for n in range(0, KEYS, 10):
        producer.produce(topic, key=_key(n), value=None, on_delivery=delivered)
    assert producer.flush(TIMEOUT_S) == 0 and failed == []
    # The active segment is never cleaned: once segment.ms has passed, one more record rolls
    # it, so every update and tombstone above is in a sealed, cleanable segment.
    time.sleep(SEGMENT_MS / 1000 + 0.5)
    producer.produce(topic, key=b"zz-last", value=b"rolls the segment", on_delivery=delivered)
    assert producer.flush(TIMEOUT_S) == 0 and failed == []


def _read_all(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)
        consumer.assign([TopicPartition(topic, 0, 0)])
        records: list[tuple[bytes, bytes | None]] = []
        position = 0
        deadline = time.monotonic() + TIMEOUT_S
        while position < high and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            records.append((message.key(), message.value()))
            position = message.offset() + 1
        assert position >= high, f"read to {position} of {high}"
        return records
    finally:
        consumer.close()


def _one_newest_value_per_live_key(records: list[tuple[bytes, bytes | None]]) -> bool:
    expected = {_key(n): f"v2-{n}".encode() for n in range(KEYS) if n % 10}
    expected[b"zz-last"] = b"rolls the segment"
    return len(records) == len(expected) and dict(records) == expected


def test_a_compacted_topic_keeps_one_newest_value_per_live_key_for_a_new_consumer(tmp_path: Path) -> None:
    topic = "changelog"
    with ServeProcess(tmp_path / "root", "--cleaner-backoff-ms", "200") as running:
        admin = _create_compacted(running.bootstrap, topic)
        (described,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        assert described.result(TIMEOUT_S)["cleanup.policy"].value == "compact"
        _produce_updates_and_tombstones(running.bootstrap, topic)
        before = _read_all(running.bootstrap, topic)
        assert len(before) <= 2 * KEYS + KEYS // 10 + 1
        deadline = time.monotonic() + CLEANED_WITHIN_S
        records = before
        while not _one_newest_value_per_live_key(records) and time.monotonic() < deadline:
            time.sleep(0.5)
            records = _read_all(running.bootstrap, topic)
        live = {key: value for key, value in records if value is not None}
        assert _one_newest_value_per_live_key(records), (len(records), len(live))
        running.restart()  # SIGKILL: the cleaned log recovers as it was
        assert _one_newest_value_per_live_key(_read_all(running.bootstrap, topic))


def test_a_record_without_a_key_is_refused_by_a_compacted_topic_with_invalid_record(tmp_path: Path) -> None:
    topic = "keys-only"
    with ServeProcess(tmp_path / "root") as running:
        _create_compacted(running.bootstrap, topic)
        errors: list[KafkaError | None] = []
        producer = Producer({"bootstrap.servers": running.bootstrap})
        producer.produce(topic, value=b"no key", on_delivery=lambda error, _: errors.append(error))
        assert producer.flush(TIMEOUT_S) == 0  # alone: Kafka refuses the whole batch holding it
        producer.produce(topic, key=b"k", value=b"keyed", on_delivery=lambda error, _: errors.append(error))
        assert producer.flush(TIMEOUT_S) == 0
        assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD, errors
        assert errors[1] is None
        # In one batch the whole batch is refused, as Kafka refuses it (the response names the
        # keyless record, KIP-467: librdkafka's own 0011_produce_batch checks that, `make compat`).
        errors.clear()
        batching = Producer({"bootstrap.servers": running.bootstrap, "linger.ms": 1000})
        for n in range(5):
            key = None if n == 2 else f"k{n}".encode()
            batching.produce(topic, key=key, value=b"v", on_delivery=lambda error, _: errors.append(error))
        assert batching.flush(TIMEOUT_S) == 0
        codes = [error.code() if error is not None else None for error in errors]
        assert None not in codes and codes[2] == KafkaError.INVALID_RECORD, codes
        assert [key for key, _ in _read_all(running.bootstrap, topic)] == [b"k"]  # nothing of the batch
