"""ACLs over the wire, with real clients: what a principal may not do, it cannot do.

One server with a SASL_PLAINTEXT listener (PLAIN): alice is a super user and sets up the
topics and ACLs; bob is what the ACLs say he is. Each test names its own topics, groups
and transactional ids, so the ACLs one test adds decide nothing in another.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import TopicAuthorizationFailedError as AioTopicAuthorizationFailed
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
)
from confluent_kafka.admin import ResourceType as ConfluentResourceType
from in_process import InProcessServer
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KafkaResourceType
from kafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    SecurityDisabledError,
    TopicAuthorizationFailedError,
)
from kio.index import load_request_schema
from wire_client import WireSocket

from oncelog.log_manager import LogManager
from oncelog.server.acls import Acl, Operation, PatternType, Permission, ResourceType
from oncelog.server.broker import ServeConfig
from oncelog.server.codec import build, nested
from oncelog.server.credentials import CredentialStore, credential_from_password
from oncelog.server.group_state import GroupLimits
from oncelog.server.listeners import SASL_PLAINTEXT, Listener
from oncelog.server.tls import ANONYMOUS
from oncelog.storage.fs import DEFAULT_FS

PASSWORD: Final = "correct horse battery staple"
TIMEOUT_S: Final = 20.0
_names = itertools.count()
# kafka-python's filter of every ACL.
EVERY_ACL: Final = ACLFilter(
    None,
    None,
    ACLOperation.ANY,
    ACLPermissionType.ANY,
    ResourcePatternFilter(KafkaResourceType.ANY, None, ACLResourcePatternType.ANY),
)


@dataclass
class Guarded:
    server: InProcessServer
    root: Path

    @property
    def bootstrap(self) -> str:
        return self.server.bootstrap

    def confluent(self, user: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": SASL_PLAINTEXT,
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": PASSWORD,
        }

    def python(self, user: str) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": SASL_PLAINTEXT,
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": user,
            "sasl_plain_password": PASSWORD,
        }

    def grant(self, *acls: Acl) -> None:
        self.server.server.broker.authorizer.store.add(acls)

    def end_offset(self, topic: str) -> int:
        return self.server.manager.log(topic, 0).log_end_offset

    def end_offset_once_markers_are_written(self, topic: str, expected: int) -> int:
        """The end offset, once it reaches `expected` or TIMEOUT_S passed: a commit is answered
        before its markers are written (they follow in the background, as Kafka's do)."""
        deadline = time.monotonic() + TIMEOUT_S
        while self.end_offset(topic) < expected and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.end_offset(topic)

    def produce_as_alice(self, topic: str, count: int = 1) -> None:
        producer = Producer(self.confluent("alice"))
        for n in range(count):
            producer.produce(topic, b"by-alice-%d" % n, partition=0)
        assert producer.flush(TIMEOUT_S) == 0


def bob(
    kind: ResourceType, name: str, *operations: Operation, deny: bool = False, prefixed: bool = False
) -> list[Acl]:
    pattern = PatternType.PREFIXED if prefixed else PatternType.LITERAL
    permission = Permission.DENY if deny else Permission.ALLOW
    return [Acl(kind, name, pattern, "User:bob", "*", op, permission) for op in operations]


def fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    root = tmp_path_factory.mktemp("guarded") / "root"
    root.mkdir()
    store = CredentialStore.open(DEFAULT_FS, str(root))
    for user in ("alice", "bob", "carol"):
        store.put(user, "SCRAM-SHA-512", credential_from_password("SCRAM-SHA-512", PASSWORD, 4096))
    store.close()
    config = ServeConfig(
        listen_port=0,
        listeners=(Listener(SASL_PLAINTEXT, "127.0.0.1", 0),),
        sasl_mechanisms=("PLAIN",),
        failed_authentication_delay_ms=10,
        groups=GroupLimits(min_session_timeout_ms=1_000, initial_rebalance_delay_ms=100),
        super_users=("User:alice",),
    )
    with InProcessServer(root, config) as running:
        yield Guarded(running, root)


def _confluent_produce_error(settings: dict[str, Any], topic: str) -> KafkaError | None:
    errors: list[KafkaError | None] = []
    producer = Producer(settings | {"message.timeout.ms": 10_000})
    producer.produce(topic, b"by-bob", partition=0, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(TIMEOUT_S)
    assert len(errors) == 1
    return errors[0]


# -- Produce ----------------------------------------------------------------------------------


def test_a_principal_without_write_cannot_produce_and_nothing_is_written(guarded: Guarded) -> None:
    topic = fresh("no-write")
    guarded.produce_as_alice(topic)
    guarded.grant(*bob(ResourceType.TOPIC, topic, Operation.READ))  # Read, and Describe by it: no Write
    error = _confluent_produce_error(guarded.confluent("bob"), topic)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    producer = KafkaProducer(**guarded.python("bob"), retries=0, max_block_ms=10_000)
    with pytest.raises(TopicAuthorizationFailedError):
        producer.send(topic, b"by-bob", partition=0).get(TIMEOUT_S)
    producer.close()
    assert guarded.end_offset(topic) == 1


def test_a_principal_with_write_produces_idempotently(guarded: Guarded) -> None:
    topic = fresh("may-write")
    guarded.produce_as_alice(topic)
    guarded.grant(*bob(ResourceType.TOPIC, topic, Operation.WRITE))
    settings = guarded.confluent("bob") | {"enable.idempotence": True}
    assert _confluent_produce_error(settings, topic) is None
    assert guarded.end_offset(topic) == 2


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic(guarded: Guarded) -> None:
    # InitProducerId without a transactional id (KIP-679). carol may only Describe the topic:
    # its metadata comes back, the producer id does not, and librdkafka fails fatally.
    topic = fresh("idempotent")
    guarded.produce_as_alice(topic)
    carol = [
        Acl(ResourceType.TOPIC, topic, PatternType.LITERAL, "User:carol", "*", op, Permission.ALLOW)
        for op in (Operation.DESCRIBE, Operation.WRITE)
    ]
    guarded.grant(carol[0])
    fatal: list[KafkaError] = []
    producer = Producer(
        guarded.confluent("carol")
        | {"enable.idempotence": True, "message.timeout.ms": 5_000, "error_cb": fatal.append}
    )
    try:
        producer.produce(topic, b"by-carol", partition=0)
        producer.flush(TIMEOUT_S)
    except KafkaException as exc:  # librdkafka raises the fatal error from the poll that met it
        fatal.append(exc.args[0])
    assert [e.code() for e in fatal if e.fatal()] == [KafkaError.CLUSTER_AUTHORIZATION_FAILED], fatal
    guarded.grant(carol[1])  # Write on one topic is enough
    assert _confluent_produce_error(guarded.confluent("carol") | {"enable.idempotence": True}, topic) is None
    assert guarded.end_offset(topic) == 2


def test_a_deny_wins_over_a_wider_allow(guarded: Guarded) -> None:
    prefix = fresh("deny")
    audit = f"{prefix}-audit"
    other = f"{prefix}-other"
    guarded.produce_as_alice(audit)
    guarded.produce_as_alice(other)
    guarded.grant(
        *bob(ResourceType.TOPIC, prefix, Operation.ALL, prefixed=True),
        *bob(ResourceType.TOPIC, audit, Operation.WRITE, deny=True),
    )
    assert _confluent_produce_error(guarded.confluent("bob"), other) is None
    error = _confluent_produce_error(guarded.confluent("bob"), audit)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert (guarded.end_offset(other), guarded.end_offset(audit)) == (2, 1)


# -- Fetch and Metadata -----------------------------------------------------------------------


def test_without_describe_a_principal_does_not_see_the_topic_in_metadata(guarded: Guarded) -> None:
    hidden = fresh("hidden")
    visible = fresh("visible")
    guarded.produce_as_alice(hidden)
    guarded.produce_as_alice(visible)
    guarded.grant(*bob(ResourceType.TOPIC, visible, Operation.READ))
    listed = AdminClient(guarded.confluent("bob")).list_topics(timeout=TIMEOUT_S).topics
    assert visible in listed and hidden not in listed
    named = AdminClient(guarded.confluent("bob")).list_topics(hidden, timeout=TIMEOUT_S).topics[hidden]
    assert named.error is not None and named.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert hidden in AdminClient(guarded.confluent("alice")).list_topics(timeout=TIMEOUT_S).topics


def test_without_read_a_principal_cannot_fetch(guarded: Guarded) -> None:
    topic = fresh("describe-only")
    guarded.produce_as_alice(topic, 3)
    group = fresh("reader-group")
    # Describe: the topic's metadata comes back, so each client goes on to fetch, and is refused.
    guarded.grant(
        *bob(ResourceType.TOPIC, topic, Operation.DESCRIBE), *bob(ResourceType.GROUP, group, Operation.READ)
    )
    consumer = Consumer(guarded.confluent("bob") | {"group.id": group, "enable.auto.commit": False})
    consumer.assign([ConfluentTopicPartition(topic, 0, 0)])
    error = None
    deadline = time.monotonic() + TIMEOUT_S
    while error is None and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None:
            assert msg.error() is not None, "a record of a topic bob may not read reached him"
            error = msg.error()
    consumer.close()
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    reader = KafkaConsumer(**guarded.python("bob"), enable_auto_commit=False)
    reader.assign([KafkaTopicPartition(topic, 0)])
    reader.seek(KafkaTopicPartition(topic, 0), 0)
    with pytest.raises(TopicAuthorizationFailedError):
        for _ in range(20):
            assert not reader.poll(timeout_ms=500), "a record of a topic bob may not read reached him"
    reader.close()

    async def aiokafka_fetch() -> None:
        aio = AIOKafkaConsumer(**guarded.python("bob"), enable_auto_commit=False)
        await aio.start()
        try:
            aio.assign([KafkaTopicPartition(topic, 0)])
            aio.seek(KafkaTopicPartition(topic, 0), 0)
            with pytest.raises(AioTopicAuthorizationFailed):
                for _ in range(20):
                    assert not await aio.getmany(timeout_ms=500)
        finally:
            await aio.stop()

    asyncio.run(aiokafka_fetch())


# -- Groups -----------------------------------------------------------------------------------


def test_a_principal_cannot_commit_offsets_for_a_group_it_may_not_read(guarded: Guarded) -> None:
    topic = fresh("commit")
    group = fresh("forbidden-group")
    guarded.produce_as_alice(topic, 2)
    guarded.grant(*bob(ResourceType.TOPIC, topic, Operation.READ))
    consumer = KafkaConsumer(**guarded.python("bob"), group_id=group, enable_auto_commit=False)
    tp = KafkaTopicPartition(topic, 0)
    consumer.assign([tp])
    with pytest.raises(GroupAuthorizationFailedError):
        consumer.commit({tp: _offset_and_metadata(2)})
    consumer.close()
    assert guarded.server.server.broker.groups.committed(group) == {}
    # With Read on the group the same commit lands.
    guarded.grant(*bob(ResourceType.GROUP, group, Operation.READ))
    consumer = KafkaConsumer(**guarded.python("bob"), group_id=group, enable_auto_commit=False)
    consumer.assign([tp])
    consumer.commit({tp: _offset_and_metadata(2)})
    consumer.close()
    assert guarded.server.server.broker.groups.committed(group)[(topic, 0)].offset == 2


def _offset_and_metadata(offset: int) -> Any:
    from kafka.structs import OffsetAndMetadata

    return OffsetAndMetadata(offset, "", -1)


def test_a_consumer_cannot_join_a_group_it_may_not_read(guarded: Guarded) -> None:
    topic = fresh("join")
    guarded.produce_as_alice(topic)
    guarded.grant(*bob(ResourceType.TOPIC, topic, Operation.READ))
    consumer = Consumer(guarded.confluent("bob") | {"group.id": fresh("closed-group")})
    consumer.subscribe([topic])
    error = None
    deadline = time.monotonic() + TIMEOUT_S
    while error is None and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is not None:
            error = msg.error()
        assert msg is None or msg.error() is not None, "a member of a group bob may not read got records"
    consumer.close()
    assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED


# -- Transactions -----------------------------------------------------------------------------


def test_a_principal_cannot_fence_a_transactional_id_it_may_not_write(guarded: Guarded) -> None:
    topic = fresh("txn")
    txn_id = fresh("payments-tx")
    guarded.grant(*bob(ResourceType.TOPIC, topic, Operation.WRITE))
    owner = Producer(guarded.confluent("alice") | {"transactional.id": txn_id})
    owner.init_transactions(TIMEOUT_S)
    owner.begin_transaction()
    owner.produce(topic, b"owned", partition=0)
    zombie = Producer(guarded.confluent("bob") | {"transactional.id": txn_id})
    with pytest.raises(KafkaException) as refused:
        zombie.init_transactions(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    owner.commit_transaction(TIMEOUT_S)  # not fenced: its epoch is still the newest
    assert guarded.end_offset_once_markers_are_written(topic, 2) == 2  # the record and its commit marker


def test_with_write_on_the_transactional_id_a_principal_runs_a_transaction(guarded: Guarded) -> None:
    topic = fresh("txn-ok")
    txn_id = fresh("bob-tx")
    guarded.produce_as_alice(topic)  # bob may not create it
    guarded.grant(
        *bob(ResourceType.TOPIC, topic, Operation.WRITE),
        *bob(ResourceType.TRANSACTIONAL_ID, txn_id, Operation.WRITE),
    )
    producer = Producer(guarded.confluent("bob") | {"transactional.id": txn_id})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"mine", partition=0)
    producer.commit_transaction(TIMEOUT_S)
    assert guarded.end_offset_once_markers_are_written(topic, 3) == 3  # alice's record, bob's, its marker


# -- The ACL APIs, and changes that take effect at once ---------------------------------------


def test_an_acl_removed_over_the_wire_stops_an_open_connection_at_its_next_request(guarded: Guarded) -> None:
    topic = fresh("revoked")
    guarded.produce_as_alice(topic)
    admin = AdminClient(guarded.confluent("alice"))
    binding = AclBinding(
        ConfluentResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        "User:bob",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    for future in admin.create_acls([binding]).values():
        assert future.result(TIMEOUT_S) is None
    producer = Producer(guarded.confluent("bob") | {"message.timeout.ms": 10_000})
    outcomes: list[KafkaError | None] = []
    producer.produce(topic, b"allowed", partition=0, on_delivery=lambda err, msg: outcomes.append(err))
    producer.flush(TIMEOUT_S)
    deleted = admin.delete_acls(
        [
            AclBindingFilter(
                ConfluentResourceType.TOPIC,
                topic,
                ResourcePatternType.MATCH,
                "User:bob",
                None,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
        ]
    )
    assert [b.name for b in next(iter(deleted.values())).result(TIMEOUT_S)] == [topic]
    producer.produce(topic, b"revoked", partition=0, on_delivery=lambda err, msg: outcomes.append(err))
    producer.flush(TIMEOUT_S)
    assert outcomes[0] is None
    assert outcomes[1] is not None and outcomes[1].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert guarded.end_offset(topic) == 2


def test_confluent_and_kafka_python_admins_create_describe_and_delete_acls(guarded: Guarded) -> None:
    group = fresh("admin-group")
    admin = KafkaAdminClient(**guarded.python("alice"))
    acl = ACL(
        "User:bob",
        "*",
        ACLOperation.READ,
        ACLPermissionType.ALLOW,
        ResourcePattern(KafkaResourceType.GROUP, group, ACLResourcePatternType.PREFIXED),
    )
    created = admin.create_acls([acl])
    assert created["failed"] == [] and len(created["succeeded"]) == 1
    described, error = admin.describe_acls(
        ACLFilter(
            "User:bob",
            None,
            ACLOperation.ANY,
            ACLPermissionType.ANY,
            ResourcePatternFilter(KafkaResourceType.GROUP, group, ACLResourcePatternType.ANY),
        )
    )
    assert error.errno == 0 and [(a.resource_pattern.resource_name, a.operation) for a in described] == [
        (group, ACLOperation.READ)
    ]
    confluent = AdminClient(guarded.confluent("alice"))
    found = confluent.describe_acls(
        AclBindingFilter(
            ConfluentResourceType.GROUP,
            f"{group}-member",
            ResourcePatternType.MATCH,
            None,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    ).result(TIMEOUT_S)
    assert [(b.name, b.resource_pattern_type) for b in found] == [(group, ResourcePatternType.PREFIXED)]
    deleted = admin.delete_acls(
        [
            ACLFilter(
                None,
                None,
                ACLOperation.ANY,
                ACLPermissionType.ANY,
                ResourcePatternFilter(KafkaResourceType.GROUP, group, ACLResourcePatternType.PREFIXED),
            )
        ]
    )
    assert [len(matched) for _, matched, _ in deleted] == [1]
    admin.close()
    assert not [a for a in guarded.server.server.broker.authorizer.store.current()[0].acls if a.name == group]


def test_a_principal_without_alter_on_the_cluster_cannot_change_acls(guarded: Guarded) -> None:
    admin = AdminClient(guarded.confluent("bob"))
    mine = AclBinding(
        ConfluentResourceType.TOPIC,
        "*",
        ResourcePatternType.LITERAL,
        "User:bob",
        "*",
        AclOperation.ALL,
        AclPermissionType.ALLOW,
    )
    with pytest.raises(KafkaException) as refused:
        next(iter(admin.create_acls([mine]).values())).result(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # DescribeAcls answers CLUSTER_AUTHORIZATION_FAILED at the top; librdkafka drops that error
    # (rd_kafka_DescribeAclsResponse_parse reads it and returns an empty list), kafka-python raises it.
    python_admin = KafkaAdminClient(**guarded.python("bob"))

    with pytest.raises(ClusterAuthorizationFailedError):
        python_admin.describe_acls(EVERY_ACL)
    python_admin.close()
    stored = guarded.server.server.broker.authorizer.store.current()[0].acls
    assert not [a for a in stored if a.resource_type is ResourceType.TOPIC and a.name == "*"]


def test_an_acl_added_by_another_process_takes_effect_without_a_reconnect(guarded: Guarded) -> None:
    topic = fresh("by-cli")
    guarded.produce_as_alice(topic)
    producer = Producer(
        guarded.confluent("bob") | {"message.timeout.ms": 10_000, "topic.metadata.refresh.interval.ms": 200}
    )
    outcomes: list[KafkaError | None] = []
    producer.produce(topic, b"refused", partition=0, on_delivery=lambda err, msg: outcomes.append(err))
    producer.flush(TIMEOUT_S)
    assert outcomes[0] is not None and outcomes[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    oncelog = Path(sys.executable).parent / "oncelog"
    subprocess.run(
        [
            oncelog,
            "acls",
            str(guarded.root),
            "add",
            "--allow-principal",
            "User:bob",
            "--operation",
            "write",
            "--topic",
            topic,
        ],
        check=True,
        timeout=60,
        capture_output=True,
    )
    # librdkafka refuses produce() at once while its metadata says the topic is unauthorized,
    # until its next metadata refresh over the same connection says otherwise.
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            producer.produce(
                topic, b"allowed", partition=0, on_delivery=lambda err, msg: outcomes.append(err)
            )
            break
        except KafkaException:
            producer.poll(0.1)
    producer.flush(TIMEOUT_S)
    assert outcomes[1:] == [None]
    assert guarded.end_offset(topic) == 2


def test_a_server_that_authorizes_nothing_refuses_the_acl_apis_and_stores_nothing(tmp_path: Path) -> None:
    # Found by a red-team run: an anonymous CreateAcls on an open server was stored, and the
    # first ACL switched authorization on for everyone, for good.
    with InProcessServer(tmp_path / "open") as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        anyone = AclBinding(
            ConfluentResourceType.TOPIC,
            "*",
            ResourcePatternType.LITERAL,
            "User:*",
            "*",
            AclOperation.ALL,
            AclPermissionType.DENY,
        )
        with pytest.raises(KafkaException) as refused:
            next(iter(admin.create_acls([anyone]).values())).result(TIMEOUT_S)
        assert refused.value.args[0].code() == KafkaError.SECURITY_DISABLED
        python_admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)

        with pytest.raises(SecurityDisabledError):
            python_admin.describe_acls(EVERY_ACL)
        python_admin.close()
        acls, ever = running.server.broker.authorizer.store.current()
        assert len(acls) == 0 and not ever


def test_metadata_reports_the_operations_the_principal_has_when_asked(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LogManager.open(root, progress=False) as manager:
        manager.log("shared", 0, create=True)
    # A super user switches authorization on; the anonymous clients of this PLAINTEXT listener
    # then have what the ACLs give them.
    with InProcessServer(root, ServeConfig(listen_port=0, super_users=("User:admin",))) as running:
        running.server.broker.authorizer.store.add(
            [
                Acl(
                    ResourceType.TOPIC,
                    "shared",
                    PatternType.LITERAL,
                    ANONYMOUS,
                    "*",
                    Operation.READ,
                    Permission.ALLOW,
                ),
                Acl(
                    ResourceType.CLUSTER,
                    "kafka-cluster",
                    PatternType.LITERAL,
                    ANONYMOUS,
                    "*",
                    Operation.DESCRIBE,
                    Permission.ALLOW,
                ),
            ]
        )
        request = load_request_schema(3, 9)
        body = build(
            request,
            topics=(build(nested(request, "topics"), name="shared"),),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=True,
            include_topic_authorized_operations=True,
        )
        with WireSocket(running.bootstrap) as sock:
            answer = sock.request(3, 9, body)
    assert answer.topics[0].error_code == 0
    assert answer.topics[0].topic_authorized_operations == (1 << Operation.READ) | (1 << Operation.DESCRIBE)
    assert answer.cluster_authorized_operations == 1 << Operation.DESCRIBE
