"""Kafka's internal topics through real clients: never created, written or read by a client.

The coordinators keep their state in coordinator.lmdb, so `__consumer_offsets` and
`__transaction_state` are not client topics. The module's root holds a
`__consumer_offsets` partition with one record (what a copied Kafka log.dir, or an older
server that auto-created it, leaves) and no `__transaction_state`, so each refusal is
seen for an internal topic that exists and for one that does not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from serve_process import ServeProcess

from oncelog.log_manager import LogManager
from oncelog.segments import encode_batch

PRESENT = "__consumer_offsets"  # in the root, one partition with one record
ABSENT = "__transaction_state"
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def internal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root: Path = tmp_path_factory.mktemp("internal-root")
    with LogManager.open(root, progress=False) as manager:
        manager.log(PRESENT, 0, create=True).append_batches([encode_batch([(b"k", b"v")], timestamp_ms=1)])
    with ServeProcess(root) as server:
        yield server


def _partition_dirs(server: ServeProcess, topic: str) -> list[str]:
    return sorted(p.name for p in Path(server.root).iterdir() if p.name.startswith(f"{topic}-"))


def _watermarks(server: ServeProcess, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "internal-watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(
            ConfluentTopicPartition(topic, 0), timeout=TIMEOUT_S, cached=False
        )
    finally:
        consumer.close()
    return low, high


def _error_of(future: object) -> KafkaError:
    try:
        future.result(TIMEOUT_S)  # type: ignore[attr-defined]
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        return error
    raise AssertionError("the admin request succeeded")


def test_an_admin_client_cannot_create_an_internal_topic_and_one_in_the_root_already_exists(
    internal: ServeProcess,
) -> None:
    admin = AdminClient({"bootstrap.servers": internal.bootstrap})
    for validate_only in (True, False):
        futures = admin.create_topics(
            [NewTopic(ABSENT, num_partitions=1, replication_factor=1), NewTopic(PRESENT, num_partitions=1)],
            validate_only=validate_only,
        )
        absent, present = _error_of(futures[ABSENT]), _error_of(futures[PRESENT])
        assert absent.code() == KafkaError.INVALID_REQUEST, absent
        assert "internal topics" in absent.str()
        assert present.code() == KafkaError.TOPIC_ALREADY_EXISTS, present
    assert _partition_dirs(internal, ABSENT) == []


def test_metadata_marks_an_internal_topic_internal_and_never_creates_an_absent_one(
    internal: ServeProcess,
) -> None:
    admin = AdminClient({"bootstrap.servers": internal.bootstrap})
    described = admin.describe_topics(TopicCollection([PRESENT, ABSENT]))
    present = described[PRESENT].result(TIMEOUT_S)
    assert (present.is_internal, len(present.partitions)) == (True, 1)
    assert _error_of(described[ABSENT]).code() == KafkaError.TOPIC_EXCEPTION
    # A producer's Metadata asks for auto-creation; the answer is still "not a client topic".
    producer = Producer({"bootstrap.servers": internal.bootstrap})
    asked = producer.list_topics(topic=ABSENT, timeout=TIMEOUT_S).topics[ABSENT]
    assert asked.error is not None and asked.error.code() == KafkaError.TOPIC_EXCEPTION
    listed = Consumer({"bootstrap.servers": internal.bootstrap, "group.id": "internal-list"})
    try:
        topics = listed.list_topics(timeout=TIMEOUT_S).topics
    finally:
        listed.close()
    assert PRESENT in topics and ABSENT not in topics
    assert _partition_dirs(internal, ABSENT) == []


@pytest.mark.parametrize("topic", [PRESENT, ABSENT])
def test_a_producer_to_an_internal_topic_gets_an_error_delivery_and_nothing_is_stored(
    internal: ServeProcess, topic: str
) -> None:
    before = _watermarks(internal, PRESENT)
    producer = Producer(
        {"bootstrap.servers": internal.bootstrap, "enable.idempotence": True, "message.timeout.ms": 20_000}
    )
    reports: list[KafkaError | None] = []
    for n in range(3):
        producer.produce(topic, value=b"v%d" % n, partition=0, on_delivery=lambda err, _: reports.append(err))
    assert producer.flush(TIMEOUT_S) == 0
    assert len(reports) == 3
    # Kafka's answer to a client's append to an internal topic: INVALID_TOPIC_EXCEPTION.
    assert all(err is not None and err.code() == KafkaError.TOPIC_EXCEPTION for err in reports), reports
    assert _watermarks(internal, PRESENT) == before
    assert _partition_dirs(internal, ABSENT) == []


def test_a_consumer_assigned_to_an_internal_topic_gets_an_error_and_no_record(internal: ServeProcess) -> None:
    consumer = Consumer(
        {"bootstrap.servers": internal.bootstrap, "group.id": "internal-reader", "enable.auto.commit": False}
    )
    errors: list[KafkaError] = []
    values: list[bytes | None] = []
    try:
        consumer.assign([ConfluentTopicPartition(PRESENT, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + TIMEOUT_S
        while not errors and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                errors.append(error)
            else:
                values.append(msg.value())
    finally:
        consumer.close()
    assert errors and errors[0].code() == KafkaError.TOPIC_EXCEPTION, errors
    assert values == []  # the record stored in it is never handed out


def test_a_transaction_cannot_take_in_an_internal_topic(internal: ServeProcess) -> None:
    before = _watermarks(internal, PRESENT)
    producer = Producer({"bootstrap.servers": internal.bootstrap, "transactional.id": "internal-txn"})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(PRESENT, value=b"in a transaction", partition=0)
    producer.flush(TIMEOUT_S)
    with pytest.raises(KafkaException) as raised:
        producer.commit_transaction(TIMEOUT_S)
    error: KafkaError = raised.value.args[0]
    # Kafka authorizes no client to add an internal topic to a transaction; the client may abort.
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and error.txn_requires_abort(), error
    assert _watermarks(internal, PRESENT) == before
