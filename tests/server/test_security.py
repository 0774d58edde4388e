"""TLS and SASL with real clients: confluent-kafka, kafka-python and aiokafka, unmodified.

Each client, on each of three listeners (SASL_SSL with SCRAM-SHA-512, SASL_PLAINTEXT with
PLAIN, SSL with a client certificate), produces idempotently, consumes in a group and
commits, and runs a transaction a read_committed reader then sees. The hostile half:
wrong passwords, unknown users, a mechanism not enabled, requests before the login, a
10 MB token and garbage instead of a TLS handshake are each refused, the server stays
up, and nothing is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import trustme
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from in_process import InProcessServer
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import ClusterAuthorizationFailedError
from kio.index import load_request_schema
from wire_client import decode_response, encode_request, request_body

from oncelog.server import credentials as credentials_module
from oncelog.server.acl_store import AclStore
from oncelog.server.acls import CLUSTER_NAME, Acl, Operation, PatternType, Permission, ResourceType
from oncelog.server.broker import ServeConfig
from oncelog.server.credentials import CredentialStore, credential_from_password
from oncelog.server.group_state import GroupLimits
from oncelog.server.listeners import PLAINTEXT, SASL_PLAINTEXT, SASL_SSL, SSL, Listener
from oncelog.server.tls import TlsFiles, parse_principal_rule
from oncelog.storage.fs import DEFAULT_FS

USER, PASSWORD = "alice", "correct horse battery staple"
OTHER_USER = "bob"  # logs in as well, but is no super user
CLIENT_CN = "billing-service"
TIMEOUT_S: Final = 20.0
FAST_GROUPS: Final = GroupLimits(min_session_timeout_ms=1_000, initial_rebalance_delay_ms=100)
_names = itertools.count()


@dataclass(frozen=True)
class Certificates:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


@dataclass
class Secured:
    server: InProcessServer
    certs: Certificates
    ports: dict[str, int]

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def end_offset(self, topic: str) -> int:
        return self.server.manager.log(topic, 0).log_end_offset


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    directory = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert(f"{CLIENT_CN}@example.com", common_name=CLIENT_CN)
    paths = {}
    for name, blob in [
        ("ca.pem", ca.cert_pem),
        ("server.pem", server.cert_chain_pems[0]),
        ("server.key", server.private_key_pem),
        ("client.pem", client.cert_chain_pems[0]),
        ("client.key", client.private_key_pem),
    ]:
        path = directory / name
        blob.write_to_path(str(path))
        paths[name] = str(path)
    return Certificates(
        paths["ca.pem"], paths["server.pem"], paths["server.key"], paths["client.pem"], paths["client.key"]
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, certs: Certificates) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured") / "root"
    root.mkdir()
    store = CredentialStore.open(DEFAULT_FS, str(root))
    for user in (USER, OTHER_USER):
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            store.put(user, mechanism, credential_from_password(mechanism, PASSWORD, 4096))
    # The client certificate's principal is no super user: ACLs of every kind let it run
    # the three flows (alice, a super user, needs none).
    AclStore(store.store).add(
        Acl(kind, name, PatternType.LITERAL, f"User:{CLIENT_CN}", "*", Operation.ALL, Permission.ALLOW)
        for kind, name in (
            (ResourceType.TOPIC, "*"),
            (ResourceType.GROUP, "*"),
            (ResourceType.TRANSACTIONAL_ID, "*"),
            (ResourceType.CLUSTER, CLUSTER_NAME),
        )
    )
    store.close()
    config = ServeConfig(
        listen_port=0,
        listeners=(
            Listener(SASL_SSL, "127.0.0.1", 0),
            Listener(SASL_PLAINTEXT, "127.0.0.1", 0),
            Listener(SSL, "127.0.0.1", 0),
            Listener(PLAINTEXT, "127.0.0.1", 0),
        ),
        tls=TlsFiles(certs.server_cert, certs.server_key, certs.ca),
        principal_rules=(parse_principal_rule("RULE:^CN=([^,]+).*$/$1/"),),
        sasl_mechanisms=("PLAIN", "SCRAM-SHA-512"),
        failed_authentication_delay_ms=50,
        groups=FAST_GROUPS,
        super_users=(f"User:{USER}",),
    )
    with InProcessServer(root, config) as running:
        ports = {listener.name: listener.port for listener in running.server.listeners}
        yield Secured(running, certs, ports)


# -- each client's settings for each listener ----------------------------------------------------

SECURED_LISTENERS: Final = [
    pytest.param(SASL_SSL, "SCRAM-SHA-512", id="SASL_SSL-SCRAM-SHA-512"),
    pytest.param(SASL_PLAINTEXT, "PLAIN", id="SASL_PLAINTEXT-PLAIN"),
    pytest.param(SSL, None, id="SSL-client-certificate"),
]


def confluent_settings(
    secured: Secured, listener: str, mechanism: str | None, password: str = PASSWORD
) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "bootstrap.servers": secured.bootstrap(listener),
        "security.protocol": listener,
    }
    if mechanism is not None:
        settings |= {"sasl.mechanism": mechanism, "sasl.username": USER, "sasl.password": password}
    if listener in (SSL, SASL_SSL):
        settings["ssl.ca.location"] = secured.certs.ca
    if listener == SSL:
        settings |= {
            "ssl.certificate.location": secured.certs.client_cert,
            "ssl.key.location": secured.certs.client_key,
        }
    return settings


def _python_client_settings(secured: Secured, listener: str, mechanism: str | None) -> dict[str, Any]:
    """What kafka-python and aiokafka share: the listener and the SASL login."""
    settings: dict[str, Any] = {
        "bootstrap_servers": secured.bootstrap(listener),
        "security_protocol": listener,
    }
    if mechanism is not None:
        settings |= {
            "sasl_mechanism": mechanism,
            "sasl_plain_username": USER,
            "sasl_plain_password": PASSWORD,
        }
    return settings


def kafka_python_settings(secured: Secured, listener: str, mechanism: str | None) -> dict[str, Any]:
    settings = _python_client_settings(secured, listener, mechanism)
    if listener in (SSL, SASL_SSL):
        settings["ssl_cafile"] = secured.certs.ca
    if listener == SSL:
        settings |= {"ssl_certfile": secured.certs.client_cert, "ssl_keyfile": secured.certs.client_key}
    return settings


def aiokafka_settings(secured: Secured, listener: str, mechanism: str | None) -> dict[str, Any]:
    settings = _python_client_settings(secured, listener, mechanism)
    if listener in (SSL, SASL_SSL):
        context = ssl.create_default_context(cafile=secured.certs.ca)
        if listener == SSL:
            context.load_cert_chain(secured.certs.client_cert, secured.certs.client_key)
        settings["ssl_context"] = context
    return settings


# -- the three flows, per client: idempotent produce, group consume, a transaction --------------


def confluent_flows(
    secured: Secured, listener: str, mechanism: str | None, topic: str
) -> tuple[list[int], list[bytes], list[bytes]]:
    settings = confluent_settings(secured, listener, mechanism)
    offsets: list[int] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        offsets.append(msg.offset())

    producer = Producer(settings | {"enable.idempotence": True, "acks": "all"})
    for n in range(5):
        producer.produce(topic, b"idempotent-%d" % n, on_delivery=delivered)
    assert producer.flush(TIMEOUT_S) == 0
    group = f"group-{topic}"
    consumer = Consumer(
        settings | {"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([topic])
    seen = _poll_confluent(consumer, 5)
    consumer.commit(asynchronous=False)
    committed = consumer.committed([ConfluentTopicPartition(topic, 0)], timeout=TIMEOUT_S)[0].offset
    consumer.close()
    assert committed == 5
    txn = Producer(settings | {"transactional.id": f"txn-{topic}"})
    txn.init_transactions(TIMEOUT_S)
    txn.begin_transaction()
    for n in range(3):
        txn.produce(topic, b"transactional-%d" % n)
    txn.commit_transaction(TIMEOUT_S)
    reader = Consumer(
        settings
        | {"group.id": f"reader-{topic}", "isolation.level": "read_committed", "enable.auto.commit": False}
    )
    reader.assign([ConfluentTopicPartition(topic, 0, 5)])
    committed_values = _poll_confluent(reader, 3)
    reader.close()
    return offsets, seen, committed_values


def _poll_confluent(consumer: Consumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None:
            assert msg.error() is None, msg.error()
            values.append(msg.value())
    return values


def kafka_python_flows(
    secured: Secured, listener: str, mechanism: str | None, topic: str
) -> tuple[list[int], list[bytes], list[bytes]]:
    settings = kafka_python_settings(secured, listener, mechanism)
    producer = KafkaProducer(**settings, enable_idempotence=True, acks="all")
    futures = [producer.send(topic, b"idempotent-%d" % n, partition=0) for n in range(5)]
    offsets = [future.get(TIMEOUT_S).offset for future in futures]
    producer.close()
    consumer = KafkaConsumer(
        topic, **settings, group_id=f"group-{topic}", auto_offset_reset="earliest", enable_auto_commit=False
    )
    seen = _poll_kafka_python(consumer, 5)
    consumer.commit()
    assert consumer.committed(KafkaTopicPartition(topic, 0)) == 5
    consumer.close()
    txn = KafkaProducer(**settings, transactional_id=f"txn-{topic}")
    txn.init_transactions()
    txn.begin_transaction()
    for n in range(3):
        txn.send(topic, b"transactional-%d" % n, partition=0)
    txn.commit_transaction()
    txn.close()
    reader = KafkaConsumer(**settings, isolation_level="read_committed", enable_auto_commit=False)
    tp = KafkaTopicPartition(topic, 0)
    reader.assign([tp])
    reader.seek(tp, 5)
    committed_values = _poll_kafka_python(reader, 3)
    reader.close()
    return offsets, seen, committed_values


def _poll_kafka_python(consumer: KafkaConsumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < count and time.monotonic() < deadline:
        for records in consumer.poll(200).values():
            values.extend(record.value for record in records)
    return values


async def _aiokafka_flows(
    secured: Secured, listener: str, mechanism: str | None, topic: str
) -> tuple[list[int], list[bytes], list[bytes]]:
    settings = aiokafka_settings(secured, listener, mechanism)
    producer = AIOKafkaProducer(**settings, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        offsets = [
            (await producer.send_and_wait(topic, b"idempotent-%d" % n, partition=0)).offset for n in range(5)
        ]
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, **settings, group_id=f"group-{topic}", auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        seen = await _poll_aiokafka(consumer, 5)
        await consumer.commit()
        assert await consumer.committed(AioTopicPartition(topic, 0)) == 5
    finally:
        await consumer.stop()
    txn = AIOKafkaProducer(**settings, transactional_id=f"txn-{topic}")
    await txn.start()
    try:
        async with txn.transaction():
            for n in range(3):
                await txn.send(topic, b"transactional-%d" % n, partition=0)
    finally:
        await txn.stop()
    reader = AIOKafkaConsumer(**settings, isolation_level="read_committed", enable_auto_commit=False)
    await reader.start()
    try:
        tp = AioTopicPartition(topic, 0)
        reader.assign([tp])
        reader.seek(tp, 5)
        committed_values = await _poll_aiokafka(reader, 3)
    finally:
        await reader.stop()
    return offsets, seen, committed_values


async def _poll_aiokafka(consumer: AIOKafkaConsumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < count and time.monotonic() < deadline:
        for records in (await consumer.getmany(timeout_ms=200)).values():
            values.extend(record.value for record in records)
    return values


def aiokafka_flows(
    secured: Secured, listener: str, mechanism: str | None, topic: str
) -> tuple[list[int], list[bytes], list[bytes]]:
    return asyncio.run(_aiokafka_flows(secured, listener, mechanism, topic))


FLOWS: Final[
    dict[str, Callable[[Secured, str, str | None, str], tuple[list[int], list[bytes], list[bytes]]]]
] = {
    "confluent": confluent_flows,
    "kafka-python": kafka_python_flows,
    "aiokafka": aiokafka_flows,
}


@pytest.mark.parametrize("client", list(FLOWS))
@pytest.mark.parametrize(("listener", "mechanism"), SECURED_LISTENERS)
def test_each_client_produces_consumes_in_a_group_and_runs_a_transaction_over_each_secured_listener(
    secured: Secured, client: str, listener: str, mechanism: str | None
) -> None:
    topic = f"secure-{client}-{listener.lower()}-{next(_names)}"
    offsets, seen, committed_values = FLOWS[client](secured, listener, mechanism, topic)
    assert offsets == [0, 1, 2, 3, 4]
    assert seen == [b"idempotent-%d" % n for n in range(5)]
    assert committed_values == [b"transactional-%d" % n for n in range(3)]
    assert secured.end_offset(topic) == 9  # 5 idempotent, 3 transactional, 1 COMMIT marker


def test_an_ssl_client_is_the_principal_its_certificate_names(secured: Secured) -> None:
    producer = Producer(confluent_settings(secured, SSL, None) | {"client.id": "principal-probe"})
    topic = f"principal-{next(_names)}"
    producer.produce(topic, b"x")
    assert producer.flush(TIMEOUT_S) == 0
    sessions = [c.session for c in secured.server.server._connections if c.session.listener.name == SSL]
    assert sessions and {s.principal for s in sessions} == {f"User:{CLIENT_CN}"}


# -- refusals -------------------------------------------------------------------------------------


def _confluent_fails_to_produce(settings: dict[str, Any], topic: str) -> str:
    """The error a producer with `settings` ends with; asserts nothing was delivered."""
    errors: list[str] = []
    producer = Producer(
        settings | {"message.timeout.ms": 3000, "error_cb": lambda err: errors.append(str(err))}
    )
    delivered: list[KafkaError | None] = []
    producer.produce(topic, b"must not land", on_delivery=lambda err, msg: delivered.append(err))
    producer.flush(10)
    assert delivered and delivered[0] is not None, "a refused client delivered a message"
    return " ".join(errors)


@pytest.mark.parametrize(
    ("listener", "mechanism", "password", "expected"),
    [
        (SASL_SSL, "SCRAM-SHA-512", "wrong password", "Authentication failed"),
        (SASL_PLAINTEXT, "PLAIN", "wrong password", "Invalid username or password"),
        (SASL_SSL, "SCRAM-SHA-256", PASSWORD, "mechanism"),  # enabled here: PLAIN and SCRAM-SHA-512
    ],
    ids=["scram-wrong-password", "plain-wrong-password", "mechanism-not-enabled"],
)
def test_a_client_that_fails_to_log_in_writes_nothing_and_the_server_serves_on(
    secured: Secured, listener: str, mechanism: str, password: str, expected: str
) -> None:
    topic = f"refused-{next(_names)}"
    errors = _confluent_fails_to_produce(confluent_settings(secured, listener, mechanism, password), topic)
    assert expected.lower() in errors.lower(), errors
    assert not secured.server.server.broker.has_partition(topic, 0)
    good = Producer(
        confluent_settings(secured, listener, "SCRAM-SHA-512" if listener == SASL_SSL else "PLAIN")
    )
    good.produce(f"after-{topic}", b"fine")
    assert good.flush(TIMEOUT_S) == 0


def test_an_unknown_user_gets_the_same_answer_as_a_wrong_password(secured: Secured) -> None:
    settings = confluent_settings(secured, SASL_PLAINTEXT, "PLAIN") | {"sasl.username": "mallory"}
    topic = f"unknown-{next(_names)}"
    assert "invalid username or password" in _confluent_fails_to_produce(settings, topic).lower()
    assert not secured.server.server.broker.has_partition(topic, 0)


def test_an_ssl_client_without_a_certificate_is_refused_at_the_handshake(secured: Secured) -> None:
    settings = confluent_settings(secured, SSL, None)
    del settings["ssl.certificate.location"], settings["ssl.key.location"]
    topic = f"no-cert-{next(_names)}"
    _confluent_fails_to_produce(settings, topic)
    assert not secured.server.server.broker.has_partition(topic, 0)


def _frame(api_key: int, version: int, body: Any, correlation_id: int = 1) -> bytes:
    """A request as kio (generated from Kafka's specs) encodes it, framed."""
    return encode_request(api_key, version, correlation_id, body)


def _bytes_until_closed(sock: socket.socket) -> bytes:
    """Every byte the server sends until it closes the connection (a reset counts as a close);
    fails if it keeps the connection open past TIMEOUT_S."""
    sock.settimeout(TIMEOUT_S)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    sock.settimeout(TIMEOUT_S)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"closed after {len(data)} of {size} bytes"
        data += chunk
    return data


def _read_frame(sock: socket.socket) -> bytes:
    return _read_exactly(sock, struct.unpack(">i", _read_exactly(sock, 4))[0])


def test_a_request_before_the_login_closes_the_connection_unanswered(secured: Secured) -> None:
    with socket.create_connection(("127.0.0.1", secured.ports[SASL_PLAINTEXT])) as sock:
        sock.sendall(_frame(3, 1, request_body(3, 1, "before-login")))
        assert _bytes_until_closed(sock) == b""


def test_a_10_mb_sasl_token_is_refused_unread(secured: Secured) -> None:
    with socket.create_connection(("127.0.0.1", secured.ports[SASL_PLAINTEXT])) as sock:
        sock.sendall(_frame(17, 1, load_request_schema(17, 1)(mechanism="PLAIN")))
        assert _read_frame(sock)[:4] == struct.pack(">i", 1)  # the handshake's answer (correlation id 1)
        token = b"\0" + USER.encode() + b"\0" + b"p" * (10 * 1024 * 1024)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed while we still send
            sock.sendall(_frame(36, 0, load_request_schema(36, 0)(auth_bytes=token), correlation_id=2))
        # Read, the server would answer SASL_AUTHENTICATION_FAILED; refused at its size prefix, nothing.
        assert _bytes_until_closed(sock) == b""
    producer = Producer(confluent_settings(secured, SASL_PLAINTEXT, "PLAIN"))
    producer.produce(f"after-token-{next(_names)}", b"fine")
    assert producer.flush(TIMEOUT_S) == 0


def test_garbage_instead_of_a_tls_handshake_is_dropped_and_tls_clients_carry_on(secured: Secured) -> None:
    for listener in (SASL_SSL, SSL):
        with socket.create_connection(("127.0.0.1", secured.ports[listener])) as sock:
            sock.sendall(os.urandom(4096))
            assert len(_bytes_until_closed(sock)) < 64  # at most a TLS alert, then closed
    producer = Producer(confluent_settings(secured, SASL_SSL, "SCRAM-SHA-512"))
    producer.produce(f"after-garbage-{next(_names)}", b"fine")
    assert producer.flush(TIMEOUT_S) == 0


def test_plaintext_still_serves_anonymously_beside_the_secured_listeners(secured: Secured) -> None:
    producer = Producer({"bootstrap.servers": secured.bootstrap(PLAINTEXT)})
    producer.produce(f"plain-{next(_names)}", b"fine")
    assert producer.flush(TIMEOUT_S) == 0


def test_metadata_advertises_the_listener_the_client_came_in_on(secured: Secured) -> None:
    for listener, mechanism in [(SASL_SSL, "SCRAM-SHA-512"), (SSL, None), (SASL_PLAINTEXT, "PLAIN")]:
        consumer = Consumer(confluent_settings(secured, listener, mechanism) | {"group.id": "metadata-probe"})
        brokers = consumer.list_topics(timeout=TIMEOUT_S).brokers
        consumer.close()
        assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", secured.ports[listener])]


# -- SCRAM credentials from an admin client (KIP-554) --------------------------------------------


def test_a_super_user_adds_and_removes_a_scram_user_from_an_admin_client(secured: Secured) -> None:
    admin = AdminClient(confluent_settings(secured, SASL_SSL, "SCRAM-SHA-512"))
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    for future in admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("carol", info, b"carol-pw")]
    ).values():
        future.result(TIMEOUT_S)
    described = admin.describe_user_scram_credentials(["carol"])["carol"].result(TIMEOUT_S)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_512, 8192)
    ]
    carol = confluent_settings(secured, SASL_SSL, "SCRAM-SHA-512") | {
        "sasl.username": "carol",
        "sasl.password": "carol-pw",
    }
    producer = Producer(carol)
    producer.produce(f"carol-{next(_names)}", b"hello")
    assert producer.flush(TIMEOUT_S) == 0
    deletion = UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512)
    for future in admin.alter_user_scram_credentials([deletion]).values():
        future.result(TIMEOUT_S)
    with pytest.raises(KafkaException, match=r"RESOURCE_NOT_FOUND|not found|no SCRAM"):
        admin.describe_user_scram_credentials(["carol"])["carol"].result(TIMEOUT_S)
    assert "authentication failed" in _confluent_fails_to_produce(carol, f"carol-gone-{next(_names)}").lower()


def test_a_principal_that_is_no_super_user_can_neither_see_nor_change_credentials(secured: Secured) -> None:
    bob = confluent_settings(secured, SASL_SSL, "SCRAM-SHA-512") | {"sasl.username": OTHER_USER}
    admin = AdminClient(bob)
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(OTHER_USER, info, b"taken-over")]
    )
    with pytest.raises(KafkaException, match=r"CLUSTER_AUTHORIZATION_FAILED|[Aa]uthoriz"):
        futures[OTHER_USER].result(TIMEOUT_S)
    with pytest.raises(KafkaException, match=r"CLUSTER_AUTHORIZATION_FAILED|[Aa]uthoriz"):
        admin.describe_user_scram_credentials([USER])[USER].result(TIMEOUT_S)
    # Every user (the request-level error, as Kafka answers; confluent-kafka's binding crashes on
    # that answer, so kafka-python asks).
    settings = kafka_python_settings(secured, SASL_SSL, "SCRAM-SHA-512") | {"sasl_plain_username": OTHER_USER}
    kafka_admin = KafkaAdminClient(**settings)
    with pytest.raises(ClusterAuthorizationFailedError):
        kafka_admin.describe_user_scram_credentials()
    kafka_admin.close()
    store = secured.server.server.broker.credentials
    assert store.check_plain(OTHER_USER, PASSWORD) and not store.check_plain(OTHER_USER, "taken-over")


def test_pipelined_requests_over_tls_are_each_answered(secured: Secured) -> None:
    # Clients pipeline (librdkafka sends Metadata and InitProducerId back to back). Over TLS the
    # transport once paused the connection with nothing buffered, and the next request waited
    # for ever.
    context = ssl.create_default_context(cafile=secured.certs.ca)
    count = 200
    with (
        socket.create_connection(("127.0.0.1", secured.ports[SASL_SSL]), timeout=TIMEOUT_S) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        body = request_body(18, 3, "pipelined")
        sock.sendall(b"".join(_frame(18, 3, body, correlation_id=n) for n in range(count)))
        answered = [struct.unpack(">i", _read_frame(sock)[:4])[0] for _ in range(count)]
    assert answered == list(range(count))


# -- what the red team found: strangers' logins, handshakes and slots ----------------------------


def _sasl_authenticate(sock: socket.socket, mechanism: str, token: bytes) -> Any:
    """SaslHandshake for `mechanism`, then one SaslAuthenticate (v1) with `token`: its decoded answer."""
    sock.sendall(_frame(17, 1, load_request_schema(17, 1)(mechanism=mechanism)))
    _read_frame(sock)
    sock.sendall(_frame(36, 1, load_request_schema(36, 1)(auth_bytes=token), correlation_id=2))
    return decode_response(36, 1, _read_frame(sock))[1]


def test_a_token_larger_than_any_login_fails_unparsed_and_closes(secured: Secured) -> None:
    with socket.create_connection(("127.0.0.1", secured.ports[SASL_PLAINTEXT])) as sock:
        answer = _sasl_authenticate(sock, "SCRAM-SHA-512", b"n,,n=alice,r=" + b"x" * 100_000)
        assert answer.error_code == 58 and "100013-byte" in answer.error_message
        assert _bytes_until_closed(sock) == b""


def test_an_unknown_scram_user_gets_a_challenge_like_any_other(secured: Secured) -> None:
    # Nothing tells a stranger which users exist: the login fails at the proof, as a wrong password does.
    challenges = []
    for user in (USER, "mallory"):
        with socket.create_connection(("127.0.0.1", secured.ports[SASL_PLAINTEXT])) as sock:
            answer = _sasl_authenticate(sock, "SCRAM-SHA-512", b"n,,n=" + user.encode() + b",r=abcdefgh")
            assert answer.error_code == 0, answer
            challenges.append(answer.auth_bytes)
    assert all(c.startswith(b"r=abcdefgh") and b",s=" in c and b",i=" in c for c in challenges)


def test_an_unknown_plain_user_costs_the_same_hashing_as_a_known_one(
    secured: Secured, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[str] = []
    real = credentials_module.credential_from_password

    def counting(mechanism: str, password: str, iterations: int, salt: bytes | None = None) -> Any:
        hashed.append(password)
        return real(mechanism, password, iterations, salt)

    monkeypatch.setattr(credentials_module, "credential_from_password", counting)
    store = secured.server.server.broker.credentials
    assert not store.check_plain("mallory", "guess-1") and not store.check_plain(USER, "guess-2")
    assert hashed == ["guess-1", "guess-2"]


@pytest.fixture
def tight(tmp_path: Path, certs: Certificates) -> Iterator[InProcessServer]:
    config = ServeConfig(
        listen_port=0,
        listeners=(Listener(SSL, "127.0.0.1", 0), Listener(SASL_PLAINTEXT, "127.0.0.1", 0)),
        tls=TlsFiles(certs.server_cert, certs.server_key, certs.ca),
        max_connections=8,
        max_connections_per_ip=2,
        first_request_ms=1000,
    )
    with InProcessServer(tmp_path / "root", config) as running:
        yield running


def test_connections_still_in_their_tls_handshake_count_against_the_limits(
    tight: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    port = tight.server.listeners[0].port
    stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # no ClientHello
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while tight.server._per_host.get("127.0.0.1", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the server has accepted both
        with (
            caplog.at_level(logging.WARNING, logger="oncelog.server"),
            socket.create_connection(("127.0.0.1", port)) as third,
        ):
            assert _bytes_until_closed(third) == b""
        assert "2 connections open from this address (limit 2)" in caplog.text  # refused, not timed out
    finally:
        for sock in stalled:
            sock.close()


def test_a_sasl_connection_that_does_not_log_in_loses_its_slot_however_chatty(tight: InProcessServer) -> None:
    port = tight.server.listeners[1].port
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        deadline = time.monotonic() + TIMEOUT_S
        closed = False
        while not closed and time.monotonic() < deadline:
            try:
                sock.sendall(_frame(18, 3, request_body(18, 3, "chatty")))
                _read_frame(sock)
            except (AssertionError, ConnectionError, OSError):
                closed = True
            time.sleep(0.1)
        assert closed, "an unauthenticated connection kept its slot by sending ApiVersions"
