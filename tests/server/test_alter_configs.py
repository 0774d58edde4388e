"""AlterConfigs, IncrementalAlterConfigs and CreateTopics with configs (issue 31), with the
admin clients of confluent-kafka, kafka-python and aiokafka.

A config is held to what it changes: a lowered max.message.bytes refuses a producer's
larger batch at once (the open logs follow), an AlterConfigs drops every override it does
not name (Kafka's rule), and what was answered survives a SIGKILL. Every config this
server cannot take is refused by name with INVALID_CONFIG, never ignored (but
message.format.version, which Kafka 3 takes and ignores too).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Final

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka.admin import ConfigResource as KafkaConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from serve_process import ServeProcess

from oncelog import Log, LogConfig
from oncelog.segments.batch import RecordBatch
from oncelog.segments.format import COMPRESSION_LZ4

TIMEOUT_S: Final = 30.0
DYNAMIC: Final = ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def _incremental(admin: AdminClient, topic: str, *entries: ConfigEntry) -> None:
    (future,) = admin.incremental_alter_configs(
        [ConfigResource(ResourceType.TOPIC, topic, incremental_configs=list(entries))]
    ).values()
    future.result(TIMEOUT_S)


def _overrides(admin: AdminClient, topic: str) -> dict[str, str]:
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return {name: entry.value for name, entry in future.result(TIMEOUT_S).items() if entry.source == DYNAMIC}


def _produce_error(bootstrap: str, topic: str, value_bytes: int) -> KafkaError | None:
    errors: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 1_000_000})
    producer.produce(topic, value=b"x" * value_bytes, on_delivery=lambda error, _: errors.append(error))
    producer.flush(TIMEOUT_S)
    assert len(errors) == 1
    return errors[0]


def test_an_incremental_change_applies_to_the_open_logs_at_once_and_survives_a_sigkill(
    tmp_path: Path,
) -> None:
    topic = "altered"
    with ServeProcess(tmp_path / "root") as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "3600000"})])[topic].result(
            TIMEOUT_S
        )
        assert _overrides(admin, topic) == {"retention.ms": "3600000"}
        assert _produce_error(running.bootstrap, topic, 5_000) is None
        _incremental(
            admin,
            topic,
            ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        )
        assert _overrides(admin, topic) == {"max.message.bytes": "2000"}
        refused = _produce_error(running.bootstrap, topic, 5_000)
        assert refused is not None and refused.code() == KafkaError.MSG_SIZE_TOO_LARGE
        running.restart()  # SIGKILL: what was answered is stored
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        assert _overrides(admin, topic) == {"max.message.bytes": "2000"}
        refused = _produce_error(running.bootstrap, topic, 5_000)
        assert refused is not None and refused.code() == KafkaError.MSG_SIZE_TOO_LARGE


@pytest.mark.parametrize(
    ("name", "value", "operation"),
    [
        ("no.such.config", "1", AlterConfigOpType.SET),
        ("cleanup.policy", "compacted", AlterConfigOpType.SET),
        ("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT),  # nothing would be left
        ("segment.bytes", "-5", AlterConfigOpType.SET),
        ("segment.bytes", "12", AlterConfigOpType.SET),  # a value LogConfig refuses
        ("retention.ms", "soon", AlterConfigOpType.SET),
        ("message.timestamp.type", "WallClock", AlterConfigOpType.SET),
        ("retention.ms", "1", AlterConfigOpType.APPEND),  # not a list
    ],
)
def test_a_config_this_server_cannot_take_is_refused_by_name_and_nothing_changes(
    tmp_path: Path, name: str, value: str, operation: AlterConfigOpType
) -> None:
    topic = "refusing"
    with ServeProcess(tmp_path / "root") as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "5000"})])[topic].result(TIMEOUT_S)
        with pytest.raises(KafkaException) as refused:
            _incremental(
                admin,
                topic,
                ConfigEntry("flush.messages", "7", incremental_operation=AlterConfigOpType.SET),
                ConfigEntry(name, value, incremental_operation=operation),
            )
        assert refused.value.args[0].name() == "INVALID_CONFIG" and name in refused.value.args[0].str()
        assert _overrides(admin, topic) == {
            "retention.ms": "5000"
        }  # the valid entry beside it too: not applied
        if operation != AlterConfigOpType.SET:
            return  # (a creation sets its configs)
        (created,) = admin.create_topics([NewTopic("born-refused", 1, 1, config={name: value})]).values()
        with pytest.raises(KafkaException) as not_created:
            created.result(TIMEOUT_S)
        assert not_created.value.args[0].name() == "INVALID_CONFIG"
        assert "born-refused" not in admin.list_topics(timeout=TIMEOUT_S).topics


def test_alter_configs_replaces_every_override_and_refuses_the_broker_and_unknown_topics(
    tmp_path: Path,
) -> None:
    topic = "replaced"
    with ServeProcess(tmp_path / "root") as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        config = {"retention.ms": "5000", "segment.ms": "60000"}
        admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(TIMEOUT_S)
        kafka_admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        try:  # (kafka-python's AlterConfigs sends the overrides the topic has beside the new one)
            answers = kafka_admin.alter_configs(
                [KafkaConfigResource(ConfigResourceType.TOPIC, topic, configs={"flush.ms": "1000"})],
                incremental=False,
            )
            assert answers == {"topic": {topic: "OK"}}
            assert _overrides(admin, topic) == {**config, "flush.ms": "1000"}
            refused = kafka_admin.alter_configs(
                [
                    KafkaConfigResource(ConfigResourceType.BROKER, "0", configs={"num.partitions": "3"}),
                    KafkaConfigResource(ConfigResourceType.TOPIC, "nope", configs={"retention.ms": "1"}),
                ],
                incremental=False,
                raise_on_unknown=False,
            )
            assert refused["broker"]["0"].startswith("[Error 40] InvalidConfigurationError")
            assert refused["topic"]["nope"].startswith("[Error 3] UnknownTopicOrPartitionError")
        finally:
            kafka_admin.close()

        async def aio_alter() -> Any:
            aio_admin = AIOKafkaAdminClient(bootstrap_servers=running.bootstrap)
            await aio_admin.start()
            try:
                return await aio_admin.alter_configs(
                    [
                        AioConfigResource(
                            AioConfigResourceType.TOPIC, topic, configs={"retention.bytes": "10485760"}
                        )
                    ]
                )
            finally:
                await aio_admin.close()

        (response,) = asyncio.run(aio_alter())  # AlterConfigs as sent: the one config named
        assert [r[0] for r in response.resources] == [0]
        assert _overrides(admin, topic) == {"retention.bytes": "10485760"}  # the others back to default


def test_a_topic_made_with_librdkafkas_test_configs_stores_its_batches_in_its_codec(tmp_path: Path) -> None:
    """librdkafka's own admin test (0081) creates topics with compression.type lz4 and
    delete.retention.ms; its 0092 sets message.format.version, which Kafka 3 ignores."""
    topic = "lz4-stored"
    configs = {"compression.type": "lz4", "delete.retention.ms": "900", "message.format.version": "0.10.0"}
    with ServeProcess(tmp_path / "root") as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(TIMEOUT_S)
        assert _overrides(admin, topic) == {"compression.type": "lz4", "delete.retention.ms": "900"}
        producer = Producer({"bootstrap.servers": running.bootstrap, "enable.idempotence": True})
        for n in range(20):
            producer.produce(topic, key=b"%d" % n, value=b"payload %d " % n * 30)
        assert producer.flush(TIMEOUT_S) == 0
        consumer = Consumer(
            {"bootstrap.servers": running.bootstrap, "group.id": "g", "auto.offset.reset": "earliest"}
        )
        consumer.subscribe([topic])
        values: list[bytes] = []
        try:
            while len(values) < 20:
                message = consumer.poll(TIMEOUT_S)
                assert message is not None and message.error() is None
                values.append(message.value())
        finally:
            consumer.close()
        assert values == [b"payload %d " % n * 30 for n in range(20)]
    log = Log.open(tmp_path / "root" / f"{topic}-0", LogConfig())
    try:
        stored = log.read(0, 1 << 20).batches
        assert stored and all(RecordBatch(batch.buffer).compression == COMPRESSION_LZ4 for batch in stored)
    finally:
        log.close()
