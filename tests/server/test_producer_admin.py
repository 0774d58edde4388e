"""DescribeProducers, ListTransactions and DescribeTransactions (issue 31, KIP-664) with
kafka-python's admin client (the one of the three that offers them), against a
transaction a confluent producer holds open and then commits."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import TransactionalIdNotFoundError
from serve_process import ServeProcess

TIMEOUT_S: Final = 30.0


def test_an_open_transaction_and_its_producer_are_described_then_listed_complete(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "root") as running:
        creator = AdminClient({"bootstrap.servers": running.bootstrap})
        creator.create_topics([NewTopic("t", 2, 1)])["t"].result(TIMEOUT_S)
        producer = Producer({"bootstrap.servers": running.bootstrap, "transactional.id": "orders"})
        producer.init_transactions(TIMEOUT_S)
        producer.begin_transaction()
        producer.produce("t", value=b"one", partition=1)
        assert producer.flush(TIMEOUT_S) == 0
        admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        try:
            ((listing,),) = admin.list_transactions().values()
            assert (listing.transactional_id, listing.state.value) == ("orders", "Ongoing")
            assert admin.list_transactions(state_filters=["CompleteCommit"]) in ({}, {0: []})
            (described,) = admin.describe_transactions(["orders"]).values()
            assert (described.state.value, described.producer_id) == ("Ongoing", listing.producer_id)
            assert {(tp.topic, tp.partition) for tp in described.topic_partitions} == {("t", 1)}
            producers = admin.describe_producers([KafkaTopicPartition("t", 1), KafkaTopicPartition("t", 0)])
            (open_here,) = producers[KafkaTopicPartition("t", 1)].active_producers
            assert (open_here.producer_id, open_here.current_transaction_start_offset) == (
                listing.producer_id,
                0,
            )
            assert producers[KafkaTopicPartition("t", 0)].active_producers == []
            with pytest.raises(TransactionalIdNotFoundError):
                admin.describe_transactions(["no-such-id"])

            producer.commit_transaction(TIMEOUT_S)
            deadline = time.monotonic() + TIMEOUT_S  # the markers are written after the answer
            while time.monotonic() < deadline:
                ((listing,),) = admin.list_transactions().values()
                if listing.state.value == "CompleteCommit":
                    break
                time.sleep(0.05)
            assert listing.state.value == "CompleteCommit"
            (after,) = admin.describe_producers([KafkaTopicPartition("t", 1)]).values()
            assert [p.current_transaction_start_offset for p in after.active_producers] == [-1]
        finally:
            admin.close()
