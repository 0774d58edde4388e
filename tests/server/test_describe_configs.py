"""DescribeConfigs (issue 31) with the admin clients of confluent-kafka, kafka-python and
aiokafka: a topic's override and defaults with their sources, the broker's read-only
configs, and the refusals by name (an unknown topic, another broker, a broker logger).

The override is set on the root with LogManager.set_topic_config before the server
starts (what AlterConfigs will do over the wire), so the sources are checked both ways.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType
from kafka.admin import ConfigResource as KafkaConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from serve_process import ServeProcess
from wire_client import WireSocket, request_body

from oncelog.log_manager import LogManager

TIMEOUT_S: Final = 30.0
TOPIC: Final = "configured"
DESCRIBE_CONFIGS: Final = 32
INVALID_REQUEST: Final = 42


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root: Path = tmp_path_factory.mktemp("configs")
    with LogManager.open(root, progress=False) as manager:
        manager.log(TOPIC, 0, create=True)
        manager.set_topic_config(TOPIC, retention_ms=60_000, flush_messages=10)
    with ServeProcess(root) as running:
        yield running


@pytest.fixture(scope="module")
def admin(server: ServeProcess) -> AdminClient:
    """One confluent admin client (its futures fail once it is gone)."""
    return AdminClient({"bootstrap.servers": server.bootstrap})


def _described(admin: AdminClient, resource: ConfigResource) -> Any:
    """The configs of `resource` (librdkafka takes one broker resource a call)."""
    (future,) = admin.describe_configs([resource]).values()
    return future.result(TIMEOUT_S)


def test_a_topics_override_is_dynamic_and_the_rest_are_the_roots_defaults_in_kafkas_words(
    admin: AdminClient,
) -> None:
    entries = _described(admin, ConfigResource(ResourceType.TOPIC, TOPIC))
    dynamic = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    default = ConfigSource.DEFAULT_CONFIG.value
    assert {name: (e.value, e.source) for name, e in entries.items() if e.source == dynamic} == {
        "retention.ms": ("60000", dynamic),
        "flush.messages": ("10", dynamic),
    }
    assert (entries["segment.bytes"].value, entries["segment.bytes"].source) == (str(1024**3), default)
    assert entries["max.message.bytes"].value == "1048588"  # Kafka's default, and LogConfig's
    assert entries["retention.bytes"].value == "-1"  # no limit, as Kafka writes it
    assert entries["flush.ms"].value == str(2**63 - 1)  # never forced, as Kafka writes it
    assert entries["cleanup.policy"].value == "delete"
    assert not any(e.is_read_only for e in entries.values())
    # Synonyms, as Kafka names them: the override, then the broker default it replaces.
    synonyms = entries["retention.ms"].synonyms
    assert [(s.name, s.value, s.source) for s in synonyms.values()] == [
        ("retention.ms", "60000", dynamic),
        ("log.retention.ms", str(7 * 24 * 3600 * 1000), default),
    ]
    assert [(s.name, s.source) for s in entries["segment.bytes"].synonyms.values()] == [
        ("log.segment.bytes", default)
    ]


def test_the_brokers_configs_are_read_only_and_other_resources_are_refused_by_name(
    server: ServeProcess, admin: AdminClient
) -> None:
    host, port = server.bootstrap.rsplit(":", 1)
    broker = _described(admin, ConfigResource(ResourceType.BROKER, "0"))
    assert broker["broker.id"].value == "0" and broker["log.dirs"].value == str(server.root)
    assert broker["advertised.listeners"].value == f"PLAINTEXT://{host}:{port}"
    assert all(
        e.is_read_only and e.source == ConfigSource.STATIC_BROKER_CONFIG.value for e in broker.values()
    )
    with pytest.raises(KafkaException) as refused:
        _described(admin, ConfigResource(ResourceType.TOPIC, "no-such-topic"))
    assert refused.value.args[0].name() == "UNKNOWN_TOPIC_OR_PART"
    # Another broker id, and a broker logger, sent by hand (a client routes those to that broker).
    body = request_body(DESCRIBE_CONFIGS, 4, TOPIC)
    resource = type(body.resources[0])
    body = type(body)(
        resources=(
            resource(resource_type=4, resource_name="7", configuration_keys=None),
            resource(resource_type=8, resource_name="0", configuration_keys=None),
        ),
        include_synonyms=False,
        include_documentation=False,
    )
    with WireSocket(server.bootstrap) as sock:
        answered = sock.request(DESCRIBE_CONFIGS, 4, body)
        # An empty list of keys asks for every config, as null does (Kafka's reading).
        everything = type(body)(
            resources=(resource(resource_type=2, resource_name=TOPIC, configuration_keys=()),),
            include_synonyms=False,
            include_documentation=False,
        )
        (all_configs,) = sock.request(DESCRIBE_CONFIGS, 4, everything).results
    assert [(r.error_code, bool(r.error_message), r.configs) for r in answered.results] == [
        (INVALID_REQUEST, True, ()),
        (INVALID_REQUEST, True, ()),
    ]
    assert all_configs.error_code == 0 and "retention.ms" in {c.name for c in all_configs.configs}


def test_kafka_python_and_aiokafka_read_the_same_configs(server: ServeProcess) -> None:
    kafka_admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        described = kafka_admin.describe_configs([KafkaConfigResource(ConfigResourceType.TOPIC, TOPIC)])
    finally:
        kafka_admin.close()
    retention = described["topic"][TOPIC]["retention.ms"]
    assert (retention["value"], retention["config_source"], retention["config_type"]) == (
        "60000",
        "DYNAMIC_TOPIC_CONFIG",
        "LONG",
    )

    async def aio_describe() -> Any:
        admin = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap)
        await admin.start()
        try:
            return await admin.describe_configs([AioConfigResource(AioConfigResourceType.TOPIC, TOPIC)])
        finally:
            await admin.close()

    (response,) = asyncio.run(aio_describe())
    (resource,) = response.resources
    assert resource[0] == 0 and resource[3] == TOPIC
    values = {entry[0]: (entry[1], entry[3]) for entry in resource[4]}
    assert values["retention.ms"] == ("60000", 1) and values["segment.bytes"] == (str(1024**3), 5)
