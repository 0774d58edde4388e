"""What librdkafka's own test suite found in `oncelog serve` (issue 31), each held with
confluent-kafka (librdkafka 2.x) as the suite's tests met it:

- 0053: records without timestamps (-1) come in a batch whose header says maxTimestamp 0;
  Kafka stores them with the header set right, and so must this server.
- 0082: a Fetch's response stays within the request's max_bytes except for one whole
  batch, the first partition's with data (KIP-74): librdkafka takes a larger response
  (past receive.message.max.bytes) for a broken connection, and reconnects in a loop.
- 0102: a static member (group.instance.id) that restarts while its group is Stable gets
  its assignment back; the other members see no rebalance (KIP-345).
- SIGTERM while a consumer waits in JoinGroup: the wait is answered NOT_COORDINATOR at
  once, as Kafka answers when it unloads its groups, instead of holding the drain to its
  deadline and then cancelling the handler (a CancelledError traceback in the log).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from serve_process import ServeProcess

TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root: Path = tmp_path_factory.mktemp("findings-root")
    with ServeProcess(root) as served:
        yield served


def _consume(bootstrap: str, topic: str, count: int, **config: object) -> list[tuple[int, tuple[int, int]]]:
    """(offset, timestamp) of the first `count` records of partition 0, read with assign()."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", **config})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, tuple[int, int]]] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append((message.offset(), message.timestamp()))
        return got
    finally:
        consumer.close()


def test_0053_records_without_timestamps_are_stored_and_their_header_is_set_right(
    server: ServeProcess,
) -> None:
    topic = "untimed"
    delivered: list[tuple[object, int]] = []
    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 20})
    for n in range(3):
        producer.produce(
            topic, value=b"v%d" % n, timestamp=-1, on_delivery=lambda e, m: delivered.append((e, m.offset()))
        )
    assert producer.flush(TIMEOUT_S) == 0
    assert delivered == [(None, 0), (None, 1), (None, 2)]  # refused before: INVALID_RECORD
    assert _consume(server.bootstrap, topic, 3) == [(n, (TIMESTAMP_CREATE_TIME, -1)) for n in range(3)]
    # What is on disk (read beside the server, with struct): each header says what its
    # records hold, firstTimestamp and maxTimestamp -1.
    stored = _stored_timestamps(server.root / f"{topic}-0" / f"{0:020d}.log")
    assert stored and set(stored) == {(-1, -1)}


def _stored_timestamps(segment: Path) -> list[tuple[int, int]]:
    """(firstTimestamp, maxTimestamp) of each batch in a segment file, up to its unwritten space."""
    data = segment.read_bytes()
    found = []
    at = 0
    while at + 61 <= len(data):
        (length,) = struct.unpack_from(">i", data, at + 8)
        if length <= 0:
            break  # the segment's reserved, unwritten space
        found.append(struct.unpack_from(">qq", data, at + 27))
        at += 12 + length
    return found


def test_0082_a_fetch_past_max_bytes_is_one_whole_batch_and_the_consumer_reads_every_record(
    server: ServeProcess,
) -> None:
    # 0082 at a third of its size: batches of one 300 KiB record in three partitions; each
    # partition may take 20 MB, the response 400,000 bytes, and librdkafka refuses a
    # response frame past 400,512. Two partitions' batches in one response pass it.
    topic, partitions, per_partition, value_bytes = "fetch-max-bytes", 3, 4, 300 * 1024
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": server.bootstrap, "batch.num.messages": 1})
    for partition in range(partitions):
        for n in range(per_partition):
            producer.produce(topic, value=bytes([n]) * value_bytes, partition=partition)
            producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": server.bootstrap,
            "group.id": f"{topic}-reader",
            "max.partition.fetch.bytes": 20_000_000,
            "fetch.max.bytes": 400_000,
            "message.max.bytes": 400_000,  # (librdkafka wants it at most fetch.max.bytes)
            "receive.message.max.bytes": 400_512,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        read: set[tuple[int, int]] = set()
        errors: list[KafkaError] = []
        deadline = time.monotonic() + 3 * TIMEOUT_S
        while len(read) < partitions * per_partition and not errors and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                errors.append(message.error())
                continue
            read.add((message.partition(), message.offset()))
        assert errors == []
        assert read == {(p, n) for p in range(partitions) for n in range(per_partition)}
    finally:
        consumer.close()


class _Member:
    """A confluent consumer with a static group.instance.id, and the rebalance events it saw."""

    def __init__(self, bootstrap: str, group: str, instance: str, topic: str):
        self.events: list[tuple[str, frozenset[int]]] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.instance.id": instance,
                "session.timeout.ms": 6000,
                "max.poll.interval.ms": 9000,
                "auto.offset.reset": "earliest",
            }
        )
        self.consumer.subscribe(
            [topic],
            on_assign=lambda _, parts: self.events.append(("assign", _partitions(parts))),
            on_revoke=lambda _, parts: self.events.append(("revoke", _partitions(parts))),
        )

    def assigned(self) -> frozenset[int] | None:
        """The partitions of the last assignment, if the last event was one."""
        return self.events[-1][1] if self.events and self.events[-1][0] == "assign" else None


def _partitions(parts: list[TopicPartition]) -> frozenset[int]:
    return frozenset(part.partition for part in parts)


def _poll_until(done: object, *members: _Member) -> None:
    """Poll every member in turn (a static member that stops polling is rebalanced out) until `done()`."""
    deadline = time.monotonic() + 4 * TIMEOUT_S
    while not done() and time.monotonic() < deadline:  # type: ignore[operator]
        for member in members:
            member.consumer.poll(0.1)
    assert done(), "timed out"  # type: ignore[operator]


def test_0102_a_static_member_restarted_in_a_stable_group_gets_its_partitions_with_no_rebalance(
    server: ServeProcess,
) -> None:
    topic, group = "static-members", "static-group"
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(TIMEOUT_S)
    first = _Member(server.bootstrap, group, "consumer1", topic)
    second = _Member(server.bootstrap, group, "consumer2", topic)
    try:
        _poll_until(
            lambda: (
                first.assigned() is not None
                and second.assigned() is not None
                and first.assigned() | second.assigned() == set(range(4))  # type: ignore[operator]
                and not first.assigned() & second.assigned()
            ),  # type: ignore[operator]
            first,
            second,
        )
        held = second.assigned()
        seen_by_first = list(first.events)
        second.consumer.close()  # a static member leaves no LeaveGroup behind: the group stays Stable
        second = _Member(server.bootstrap, group, "consumer2", topic)
        _poll_until(lambda: second.assigned() is not None, first, second)
        assert second.assigned() == held
        for _ in range(20):  # a rebalance would reach the member that stayed within its polls
            first.consumer.poll(0.1)
        assert first.events == seen_by_first  # before: revoked and assigned again
    finally:
        first.consumer.close()
        second.consumer.close()


def test_sigterm_answers_a_consumer_waiting_in_join_group_and_the_drain_ends_clean(tmp_path: Path) -> None:
    topic, group = "joining", "joining-group"
    with ServeProcess(tmp_path / "root") as served:
        admin = AdminClient({"bootstrap.servers": served.bootstrap})
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(TIMEOUT_S)
        config = {
            "bootstrap.servers": served.bootstrap,
            "group.id": group,
            "session.timeout.ms": 6000,
            "max.poll.interval.ms": 300_000,  # the rebalance timeout the second join waits out
        }
        stays: list[frozenset[int]] = []
        first = Consumer(config)
        first.subscribe([topic], on_assign=lambda _, parts: stays.append(_partitions(parts)))
        deadline = time.monotonic() + 4 * TIMEOUT_S
        while not stays and time.monotonic() < deadline:
            first.poll(0.1)
        assert stays == [frozenset({0, 1})]
        # The first member is never polled again: it cannot rejoin, and the second's JoinGroup
        # waits for it (its heartbeats, from librdkafka's own thread, keep it in the group).
        second = Consumer(config)
        second.subscribe([topic])
        second.poll(2.0)
        assert served.terminate() == 0
        log = served.log()
        assert "still handling a request" not in log  # the drain ended before its deadline
        assert "Traceback" not in log and "CancelledError" not in log
        second.close()
        first.close()
