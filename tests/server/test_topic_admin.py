"""DeleteTopics and CreatePartitions (issue 31) with the admin clients of confluent-kafka,
kafka-python and aiokafka, and a delete under SIGKILL at many moments: after the restart
the topic is gone or whole, never half.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Final

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.admin import NewPartitions as KafkaNewPartitions
from serve_process import ServeProcess

TIMEOUT_S: Final = 30.0


def _create(admin: AdminClient, topic: str, partitions: int) -> None:
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT_S)


def _produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(partitions):
        for n in range(per_partition):
            producer.produce(topic, value=b"%d" % n, partition=partition)
    assert producer.flush(TIMEOUT_S) == 0


def _end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), TIMEOUT_S)[1] for p in range(partitions)
        ]
    finally:
        consumer.close()


def _topics(admin: AdminClient) -> set[str]:
    return set(admin.list_topics(timeout=TIMEOUT_S).topics)


def test_each_clients_delete_removes_the_topic_its_files_and_groups_offsets_and_the_name_is_free_again(
    tmp_path: Path,
) -> None:
    with ServeProcess(tmp_path / "root") as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        for topic in ("by-confluent", "by-kafka-python", "by-aiokafka"):
            _create(admin, topic, 2)
            _produce(running.bootstrap, topic, 2, 3)
        consumer = Consumer(
            {"bootstrap.servers": running.bootstrap, "group.id": "reader", "enable.auto.commit": False}
        )
        consumer.commit(offsets=[TopicPartition("by-confluent", 0, 3)], asynchronous=False)
        consumer.close()

        admin.delete_topics(["by-confluent"])["by-confluent"].result(TIMEOUT_S)
        kafka_admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        try:
            kafka_admin.delete_topics(["by-kafka-python"])
            assert (
                kafka_admin.list_group_offsets({"reader": None})["reader"] == {}
            )  # forgotten with the topic
        finally:
            kafka_admin.close()

        async def aio_delete() -> None:
            aio_admin = AIOKafkaAdminClient(bootstrap_servers=running.bootstrap)
            await aio_admin.start()
            try:
                await aio_admin.delete_topics(["by-aiokafka"])
            finally:
                await aio_admin.close()

        asyncio.run(aio_delete())
        assert not {"by-confluent", "by-kafka-python", "by-aiokafka"} & _topics(admin)
        assert not [p.name for p in running.root.iterdir() if p.name.startswith("by-")]
        for topic, code in (
            ("never-was", "UNKNOWN_TOPIC_OR_PART"),
            ("__consumer_offsets", "INVALID_REQUEST"),
        ):
            with pytest.raises(KafkaException) as refused:
                admin.delete_topics([topic])[topic].result(TIMEOUT_S)
            assert refused.value.args[0].name() == code
        _create(admin, "by-confluent", 1)  # the name again: a new, empty topic
        assert _end_offsets(running.bootstrap, "by-confluent", 1) == [0]
        running.restart()
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        assert "by-kafka-python" not in _topics(admin) and "by-confluent" in _topics(admin)


def test_create_partitions_grows_a_topic_for_good_and_refuses_to_shrink_it(tmp_path: Path) -> None:
    topic = "growing"
    with ServeProcess(tmp_path / "root") as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        _create(admin, topic, 1)
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(TIMEOUT_S)
        _produce(running.bootstrap, topic, 3, 2)
        for count in (3, 2):
            with pytest.raises(KafkaException) as refused:
                admin.create_partitions([NewPartitions(topic, count)])[topic].result(TIMEOUT_S)
            assert refused.value.args[0].name() == "INVALID_PARTITIONS"
        kafka_admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        try:
            assert kafka_admin.create_partitions({topic: KafkaNewPartitions(total_count=4)})
        finally:
            kafka_admin.close()
        running.restart()  # SIGKILL: the count was stored before the partitions were made
        assert (
            len(
                AdminClient({"bootstrap.servers": running.bootstrap})
                .list_topics(timeout=TIMEOUT_S)
                .topics[topic]
                .partitions
            )
            == 4
        )
        assert _end_offsets(running.bootstrap, topic, 4) == [2, 2, 2, 0]


@pytest.mark.parametrize("delay_ms", [0, 2, 5, 10, 20, 40])
def test_a_delete_killed_at_any_moment_leaves_the_topic_gone_or_whole(tmp_path: Path, delay_ms: int) -> None:
    topic, partitions = "doomed", 4
    with ServeProcess(tmp_path / "root") as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        _create(admin, topic, partitions)
        _produce(running.bootstrap, topic, partitions, 5)
        admin.delete_topics([topic], operation_timeout=0)
        time.sleep(delay_ms / 1000)
        running.restart()  # SIGKILL somewhere in the delete (or before or after it)
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        on_disk = sorted(p.name for p in running.root.iterdir() if p.name.startswith(f"{topic}-"))
        if topic in _topics(admin):
            assert on_disk == [f"{topic}-{p}" for p in range(partitions)]
            assert _end_offsets(running.bootstrap, topic, partitions) == [5] * partitions
        else:
            assert on_disk == []
        _create(admin, "after", 1)  # the server serves on either way
