"""The operator's record and cluster APIs (issue 31): DeleteRecords, DescribeCluster and
DescribeLogDirs, with the admin clients of confluent-kafka, kafka-python and aiokafka.

DeleteRecords is held to what Kafka promises: the new low watermark is answered, a
consumer reading from the beginning starts there, and it survives a SIGKILL; an offset
past the high watermark and an unknown partition are refused by name.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Final

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.records_to_delete import RecordsToDelete
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import UnknownTopicOrPartitionError
from serve_process import ServeProcess
from wire_client import WireSocket, request_body

TIMEOUT_S: Final = 30.0
TOPIC: Final = "trimmed"
RECORDS: Final = 20
DESCRIBE_CLUSTER: Final = 60
MISMATCHED_ENDPOINT_TYPE, UNSUPPORTED_ENDPOINT_TYPE = 114, 115


def _produce(bootstrap: str, topic: str, partitions: int, count: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1})
    for partition in range(partitions):
        for n in range(count):
            producer.produce(topic, value=b"%d" % n, partition=partition)
    assert producer.flush(TIMEOUT_S) == 0


def _first_offset_read(bootstrap: str, topic: str, partition: int) -> int:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.assign([TopicPartition(topic, partition)])  # no committed offset: reset to the earliest
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                return int(message.offset())
        raise AssertionError("nothing read")
    finally:
        consumer.close()


def test_each_clients_delete_records_moves_the_low_watermark_for_good_and_refuses_by_name(
    tmp_path: Path,
) -> None:
    with ServeProcess(tmp_path / "root") as running:
        _produce(running.bootstrap, TOPIC, 3, RECORDS)
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        (deleted,) = admin.delete_records([TopicPartition(TOPIC, 0, 5)]).values()
        assert deleted.result(TIMEOUT_S).low_watermark == 5
        (refused,) = admin.delete_records([TopicPartition(TOPIC, 1, RECORDS + 1)]).values()
        with pytest.raises(KafkaException) as error:
            refused.result(TIMEOUT_S)
        assert error.value.args[0].name() == "OFFSET_OUT_OF_RANGE"

        kafka_admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        try:  # -1: up to the high watermark
            answers = kafka_admin.delete_records({KafkaTopicPartition(TOPIC, 1): -1})
            assert answers[KafkaTopicPartition(TOPIC, 1)]["low_watermark"] == RECORDS
            # Sent to the node by hand (librdkafka refuses an unknown topic before sending).
            with pytest.raises(UnknownTopicOrPartitionError):
                unknown = KafkaTopicPartition("no-such-topic", 0)
                kafka_admin.delete_records({unknown: 1}, partition_leader_id=0)
        finally:
            kafka_admin.close()

        async def aio_delete() -> dict[AioTopicPartition, int]:
            aio_admin = AIOKafkaAdminClient(bootstrap_servers=running.bootstrap)
            await aio_admin.start()
            try:
                return await aio_admin.delete_records(
                    {AioTopicPartition(TOPIC, 2): RecordsToDelete(before_offset=7)}
                )
            finally:
                await aio_admin.close()

        assert asyncio.run(aio_delete()) == {AioTopicPartition(TOPIC, 2): 7}
        assert _first_offset_read(running.bootstrap, TOPIC, 0) == 5
        running.restart()  # SIGKILL: the answered low watermarks were stored
        low = {
            p: Consumer({"bootstrap.servers": running.bootstrap, "group.id": "wm"}).get_watermark_offsets(
                TopicPartition(TOPIC, p), timeout=TIMEOUT_S
            )[0]
            for p in range(3)
        }
        assert low == {0: 5, 1: RECORDS, 2: 7}
        assert _first_offset_read(running.bootstrap, TOPIC, 2) == 7


def test_the_cluster_is_one_node_that_is_also_its_controller_and_its_log_dir_holds_each_partitions_bytes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    with ServeProcess(root) as running:
        _produce(running.bootstrap, "sized", 2, 5)
        host, port = running.bootstrap.rsplit(":", 1)
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        cluster = admin.describe_cluster().result(TIMEOUT_S)
        assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, host, int(port))]
        assert cluster.controller.id == 0 and cluster.cluster_id

        kafka_admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        try:
            described = kafka_admin.describe_cluster()
            assert (described["controller_id"], described["cluster_id"]) == (0, cluster.cluster_id)
            (node,) = kafka_admin.describe_log_dirs()
            (result,) = node["log_dirs"]
        finally:
            kafka_admin.close()
        assert (node["broker"], result["error_code"], result["log_dir"]) == (0, 0, str(root))
        assert 0 < result["usable_bytes"] <= result["total_bytes"]
        on_disk = {
            p: sum(
                os.path.getsize(root / f"sized-{p}" / name)
                for name in os.listdir(root / f"sized-{p}")
                if name.endswith(".log")
            )
            for p in range(2)
        }
        (topic,) = [t for t in result["topics"] if t["name"] == "sized"]
        # A segment's file is preallocated: the size answered is of its batches, at most the file's.
        sizes = {p["partition_index"]: p["partition_size"] for p in topic["partitions"]}
        assert set(sizes) == {0, 1} and all(0 < sizes[p] <= on_disk[p] for p in sizes)

        async def aio_cluster() -> dict[str, object]:
            aio_admin = AIOKafkaAdminClient(bootstrap_servers=running.bootstrap)
            await aio_admin.start()
            try:
                return await aio_admin.describe_cluster()
            finally:
                await aio_admin.close()

        described_by_aio = asyncio.run(aio_cluster())
        assert described_by_aio["cluster_id"] == cluster.cluster_id and described_by_aio["controller_id"] == 0


def test_describe_cluster_answers_broker_endpoints_only(tmp_path: Path) -> None:
    # KIP-919: a broker asked for controller endpoints says so; an unknown type is unsupported.
    with ServeProcess(tmp_path / "root") as running, WireSocket(running.bootstrap) as sock:
        answers = {
            endpoint_type: sock.request(
                DESCRIBE_CLUSTER,
                1,
                type(request_body(DESCRIBE_CLUSTER, 1, ""))(
                    include_cluster_authorized_operations=False, endpoint_type=endpoint_type
                ),
            )
            for endpoint_type in (1, 2, 0)
        }
    assert (answers[1].error_code, len(answers[1].brokers)) == (0, 1)
    assert (answers[2].error_code, answers[2].brokers) == (MISMATCHED_ENDPOINT_TYPE, ())
    assert (answers[0].error_code, answers[0].brokers) == (UNSUPPORTED_ENDPOINT_TYPE, ())
