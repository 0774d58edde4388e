"""The operator's group APIs (issue 31): ListGroups, DescribeGroups, DeleteGroups and
OffsetDelete, with the admin clients of confluent-kafka, kafka-python and aiokafka, and an
admin's offset reset read back by a new consumer.

One `oncelog serve` process for the module (confluent consumers beside an in-process
server can deadlock on the GIL), with a short initial rebalance delay; each test uses
its own topics and groups. Subscriptions are read from members' metadata by
`subscription_topics`, checked here against kafka-python's encoder of them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import GroupSubscribedToTopicError, NoError, UnknownTopicOrPartitionError
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription
from kafka.structs import OffsetAndMetadata
from serve_process import ServeProcess

from oncelog.server.group_admin import subscription_topics

TIMEOUT_S: Final = 30.0
_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root: Path = tmp_path_factory.mktemp("group-admin")
    with ServeProcess(root, "--group-initial-rebalance-delay-ms", "300") as running:
        yield running


def create_topics(bootstrap: str, *topics: str, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        future.result(TIMEOUT_S)


def subscribed_consumer(
    bootstrap: str,
    group: str,
    topic: str,
    client_id: str = "admin-test",
    read: list[tuple[int, bytes]] | None = None,
) -> Consumer:
    """A confluent consumer of `topic` in `group`, polled until it holds its partitions;
    what those polls read goes into `read` as (offset, value)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + TIMEOUT_S
    while not consumer.assignment() and time.monotonic() < deadline:
        message = consumer.poll(0.1)
        if read is not None and message is not None and message.error() is None:
            read.append((message.offset(), message.value()))
    assert consumer.assignment(), "no assignment"
    return consumer


def commit_without_members(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """An assign-mode commit: the group gets offsets and never a member."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def aio_admin(bootstrap: str, call: str, *args: object) -> object:
    async def run() -> object:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return await getattr(admin, call)(*args)
        finally:
            await admin.close()

    return asyncio.run(run())


def test_every_client_lists_a_stable_group_and_an_offsets_only_group_with_their_states(
    server: ServeProcess,
) -> None:
    topic, live, idle = unique("listed"), unique("live"), unique("idle")
    create_topics(server.bootstrap, topic)
    commit_without_members(server.bootstrap, idle, topic, {0: 3})
    consumer = subscribed_consumer(server.bootstrap, live, topic)
    try:
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        listed = {g.group_id: g.state for g in admin.list_consumer_groups().result(TIMEOUT_S).valid}
        assert listed[live] == ConsumerGroupState.STABLE and listed[idle] == ConsumerGroupState.EMPTY
        empty_only = admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(TIMEOUT_S).valid
        assert idle in {g.group_id for g in empty_only} and live not in {g.group_id for g in empty_only}

        kafka_admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
        try:
            by_id = {g["group_id"]: g for g in kafka_admin.list_groups()}
            assert (by_id[live]["group_state"], by_id[live]["protocol_type"]) == ("Stable", "consumer")
            assert (by_id[idle]["group_state"], by_id[idle]["protocol_type"]) == ("Empty", "")
            stable = {g["group_id"] for g in kafka_admin.list_groups(states_filter=["stable"])}
            assert live in stable and idle not in stable
        finally:
            kafka_admin.close()

        assert {live: "consumer", idle: ""}.items() <= dict(
            aio_admin(server.bootstrap, "list_consumer_groups")  # type: ignore[call-overload]
        ).items()
    finally:
        consumer.close()


def test_every_client_describes_members_their_hosts_and_assignments_and_an_unknown_group_as_dead(
    server: ServeProcess,
) -> None:
    topic, group = unique("described"), unique("described-group")
    create_topics(server.bootstrap, topic)
    consumer = subscribed_consumer(server.bootstrap, group, topic, client_id="describer")
    try:
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        futures = admin.describe_consumer_groups([group, "no-such-group"])
        described = futures[group].result(TIMEOUT_S)
        assert described.state == ConsumerGroupState.STABLE and described.partition_assignor == "range"
        (member,) = described.members
        assert (member.client_id, member.host) == ("describer", "/127.0.0.1")
        assert {(tp.topic, tp.partition) for tp in member.assignment.topic_partitions} == {
            (topic, 0),
            (topic, 1),
        }
        assert futures["no-such-group"].result(TIMEOUT_S).state == ConsumerGroupState.DEAD

        kafka_admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
        try:
            found = kafka_admin.describe_groups([group])[group]
            (kafka_member,) = found["members"]
            assert kafka_member["member_metadata"]["topics"] == [topic]
            assert kafka_member["member_assignment"]["assigned_partitions"] == [
                {"topic": topic, "partitions": [0, 1]}
            ]
        finally:
            kafka_admin.close()

        # (aiokafka 0.14 decodes DescribeGroups v3 with the v2 layout: one group a request reads right.)
        (response,) = aio_admin(server.bootstrap, "describe_consumer_groups", [group])  # type: ignore[misc]
        (aio_group,) = response.groups
        assert (aio_group[1], aio_group[2], aio_group[4]) == (group, "Stable", "range")
        assert [m[1:3] for m in aio_group[5]] == [("describer", "/127.0.0.1")]
    finally:
        consumer.close()


def test_a_group_with_members_is_kept_an_unknown_one_is_not_found_and_an_empty_one_is_deleted_for_good(
    tmp_path: Path,
) -> None:
    topic, live, idle = "deleted-topic", "still-consuming", "done"
    with ServeProcess(tmp_path / "root", "--group-initial-rebalance-delay-ms", "300") as running:
        create_topics(running.bootstrap, topic)
        commit_without_members(running.bootstrap, idle, topic, {0: 4, 1: 2})
        consumer = subscribed_consumer(running.bootstrap, live, topic)
        # An offset of its own: once its member leaves, the group is kept for it whether or not
        # the kill below lands before the leave is handled (an empty group with none is dropped).
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        try:
            admin = AdminClient({"bootstrap.servers": running.bootstrap})
            futures = admin.delete_consumer_groups([live, idle, "never-was"])
            assert futures[idle].result(TIMEOUT_S) is None
            for group, code in ((live, "NON_EMPTY_GROUP"), ("never-was", "GROUP_ID_NOT_FOUND")):
                with pytest.raises(KafkaException) as refused:
                    futures[group].result(TIMEOUT_S)
                assert refused.value.args[0].name() == code
        finally:
            consumer.close()
        running.restart()  # SIGKILL: what was answered must be what is stored
        kafka_admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        try:
            groups = {g["group_id"] for g in kafka_admin.list_groups()}
            assert idle not in groups and live in groups
            assert kafka_admin.list_group_offsets({idle: None})[idle] == {}
            assert kafka_admin.delete_groups([live]) == {live: "OK"}  # no member left after its close
        finally:
            kafka_admin.close()


def test_offsets_of_topics_a_member_consumes_are_kept_and_the_others_deleted(server: ServeProcess) -> None:
    consumed, other, group = unique("consumed"), unique("other"), unique("offsets-group")
    create_topics(server.bootstrap, consumed, other)
    consumer = subscribed_consumer(server.bootstrap, group, consumed)
    try:
        consumer.commit(
            offsets=[TopicPartition(consumed, 0, 5), TopicPartition(other, 0, 7)], asynchronous=False
        )
        kafka_admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
        try:
            answers = kafka_admin.delete_group_offsets(
                group,
                [
                    KafkaTopicPartition(consumed, 0),
                    KafkaTopicPartition(other, 0),
                    KafkaTopicPartition("nope", 0),
                ],
            )
            assert answers == {
                KafkaTopicPartition(consumed, 0): GroupSubscribedToTopicError,
                KafkaTopicPartition(other, 0): NoError,
                KafkaTopicPartition("nope", 0): UnknownTopicOrPartitionError,
            }
            left = kafka_admin.list_group_offsets({group: None})[group]
            assert {tp.topic: meta.offset for tp, meta in left.items()} == {consumed: 5}
        finally:
            kafka_admin.close()
    finally:
        consumer.close()


def test_offsets_a_transaction_holds_for_a_deleted_group_do_not_bring_it_back(server: ServeProcess) -> None:
    # Kafka drops a deleted group's (or offset's) pending transactional offsets; committing
    # the transaction after the delete recreated the group here (found by red-teaming).
    topic = unique("txn-deleted")
    create_topics(server.bootstrap, topic)
    for deletion in ("group", "offsets"):
        group = unique(f"txn-deleted-{deletion}")
        commit_without_members(server.bootstrap, group, topic, {0: 2})
        producer = Producer({"bootstrap.servers": server.bootstrap, "transactional.id": group})
        producer.init_transactions(TIMEOUT_S)
        producer.begin_transaction()
        producer.produce(topic, value=b"x", partition=1)
        metadata = Consumer({"bootstrap.servers": server.bootstrap, "group.id": group})
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 7)], metadata.consumer_group_metadata(), TIMEOUT_S
        )
        metadata.close()
        kafka_admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
        try:
            if deletion == "group":
                assert kafka_admin.delete_groups([group]) == {group: "OK"}
            else:
                answer = kafka_admin.delete_group_offsets(group, [KafkaTopicPartition(topic, 0)])
                assert answer == {KafkaTopicPartition(topic, 0): NoError}
            producer.commit_transaction(TIMEOUT_S)
            assert group not in {
                g["group_id"] for g in kafka_admin.list_groups()
            }  # (its last offset went too)
            assert kafka_admin.list_group_offsets({group: None})[group] == {}
        finally:
            kafka_admin.close()


def test_an_admins_reset_of_an_empty_groups_offsets_is_where_a_new_consumer_starts(
    server: ServeProcess,
) -> None:
    topic, group = unique("reset"), unique("reset-group")
    create_topics(server.bootstrap, topic, partitions=1)
    producer = Producer({"bootstrap.servers": server.bootstrap})
    for n in range(10):
        producer.produce(topic, value=b"%d" % n, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    commit_without_members(server.bootstrap, group, topic, {0: 9})  # read to near the end
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    altered = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 3)])]
    )[group].result(TIMEOUT_S)
    assert [(tp.partition, tp.offset) for tp in altered.topic_partitions] == [(0, 3)]
    read: list[tuple[int, bytes]] = []
    consumer = subscribed_consumer(server.bootstrap, group, topic, read=read)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not read and time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                read.append((message.offset(), message.value()))
        assert read[0] == (3, b"3")
    finally:
        consumer.close()
    kafka_admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:  # kafka-python's reset, once the group is empty again: to the earliest offset
        assert kafka_admin.alter_group_offsets(
            group, {KafkaTopicPartition(topic, 0): OffsetAndMetadata(0, "", -1)}
        ) == {KafkaTopicPartition(topic, 0): NoError}
        (offset,) = kafka_admin.list_group_offsets({group: None})[group].values()
        assert offset.offset == 0
    finally:
        kafka_admin.close()


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 3),
    st.lists(st.text(min_size=0, max_size=20), max_size=8),
    st.binary(max_size=16),
)
def test_the_topics_of_a_consumer_subscription_of_every_version_are_read(
    version: int, topics: list[str], user_data: bytes
) -> None:
    encoded = ConsumerProtocolSubscription(
        version=version, topics=topics, user_data=user_data, owned_partitions=[], generation_id=1, rack_id="r"
    ).encode()
    assert subscription_topics(bytes(encoded)) == topics
    # Cut anywhere inside the topics: not a subscription, never a wrong list.
    topics_end = 6 + sum(2 + len(t.encode()) for t in topics)
    for cut in range(topics_end):
        assert subscription_topics(bytes(encoded)[:cut]) is None
