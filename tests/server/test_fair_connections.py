"""No peer holds connection slots for long without asking anything, and no address takes them all.

A new connection must send one complete request within first_request_ms; after that a
client may idle between requests up to idle_ms (Kafka's connections.max.idle.ms), and
each later request must arrive within frame_read_ms of its first byte. One client
address holds at most connections_per_ip connections (a quarter of max_connections by
default). The hostile peers are raw sockets; the client that must still be served is
confluent-kafka. Limits are shortened, and each test waits for the outcome with a
generous deadline instead of timing it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from in_process import InProcessServer
from serve_process import ServeProcess
from wire_client import WireSocket, decode_response, encode_request, one_batch, request_body

from oncelog.server.broker import ServeConfig

TOPIC = "fair"
OTHER_ADDRESS = "127.0.0.2"  # any 127.x is a source address on Linux's loopback
DEADLINE_S = 30.0


def _answered(sock: WireSocket, correlation_id: int) -> bool:
    """Whether an ApiVersions request on `sock` is answered (the connection is open and served)."""
    try:
        sock.send_raw(encode_request(18, 3, correlation_id, request_body(18, 3, TOPIC)))
        return decode_response(18, 3, sock.read_frame())[0] == correlation_id
    except OSError:
        return False


def _closed_while_trickling(sock: WireSocket, data: bytes) -> bool:
    """Send `data` a byte at a time; True once the server has closed the connection before the end.

    False if DEADLINE_S passes first.
    """
    deadline = time.monotonic() + DEADLINE_S
    for position in range(len(data) - 1):  # never the last byte: the request is never complete
        if time.monotonic() > deadline:
            return False
        try:
            sock.send_raw(data[position : position + 1])
        except OSError:
            return True
        if sock.closed_by_peer(timeout_s=0.2):
            return True
    return False


def test_a_connection_that_sends_nothing_is_closed_after_first_request_ms(tmp_path: Path) -> None:
    config = ServeConfig(listen_port=0, first_request_ms=500)  # idle_ms stays 10 minutes
    with InProcessServer(tmp_path / "root", config) as running, WireSocket(running.bootstrap) as sock:
        assert sock.closed_by_peer(timeout_s=DEADLINE_S)


def test_a_connection_that_trickles_its_first_request_is_closed_after_first_request_ms(
    tmp_path: Path,
) -> None:
    # Only first_request_ms can close it within the deadline: a frame may take 10 minutes.
    config = ServeConfig(listen_port=0, first_request_ms=500, frame_read_ms=600_000)
    # A Produce of a 20 KiB batch: a byte every 0.2 s would take over an hour to send.
    body = request_body(0, 9, TOPIC)
    records = one_batch(b"x" * 20_000)
    partition = type(body.topic_data[0].partition_data[0])(index=0, records=records)
    body = type(body)(
        transactional_id=None,
        acks=1,
        timeout=body.timeout,
        topic_data=(type(body.topic_data[0])(name=TOPIC, partition_data=(partition,)),),
    )
    with InProcessServer(tmp_path / "root", config) as running, WireSocket(running.bootstrap) as sock:
        assert _closed_while_trickling(sock, encode_request(0, 9, 1, body))
        assert TOPIC not in running.server.broker.topics()  # nothing was created or written


def test_after_its_first_request_a_connection_may_idle_longer_than_first_request_ms(tmp_path: Path) -> None:
    config = ServeConfig(listen_port=0, first_request_ms=300)
    with InProcessServer(tmp_path / "root", config) as running, WireSocket(running.bootstrap) as sock:
        assert _answered(sock, 1)
        time.sleep(1.5)  # five times first_request_ms: idle producers are legitimate
        assert _answered(sock, 2)


def test_after_its_first_request_a_request_that_stalls_is_closed_after_frame_read_ms(tmp_path: Path) -> None:
    config = ServeConfig(listen_port=0, frame_read_ms=500)  # idle_ms stays 10 minutes
    with InProcessServer(tmp_path / "root", config) as running, WireSocket(running.bootstrap) as sock:
        assert _answered(sock, 1)
        sock.send_raw(encode_request(18, 3, 2, request_body(18, 3, TOPIC))[:2])  # half a size prefix
        assert sock.closed_by_peer(timeout_s=DEADLINE_S)


def test_by_default_one_address_may_hold_a_quarter_of_the_connections() -> None:
    assert ServeConfig().connections_per_ip == 1024  # of 4096
    assert ServeConfig(max_connections=10).connections_per_ip == 2
    assert ServeConfig(max_connections=3).connections_per_ip == 1
    assert ServeConfig(max_connections=10, max_connections_per_ip=7).connections_per_ip == 7
    for bad in (0, -1):
        with pytest.raises(ValueError, match="must be positive"):
            ServeConfig(max_connections_per_ip=bad)
    with pytest.raises(ValueError, match="must be positive"):
        ServeConfig(first_request_ms=0)


def _round_trip_confluent(bootstrap: str, topic: str, count: int) -> list[bytes | None]:
    """Produce `count` values idempotently, then read them back with assign(); the values read."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2})
    failures: list[KafkaError] = []
    for n in range(count):
        producer.produce(
            topic, value=b"v%d" % n, on_delivery=lambda err, _: failures.append(err) if err else None
        )
    assert producer.flush(DEADLINE_S) == 0 and failures == []
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"unused-{topic}", "enable.auto.commit": False}
    )
    values: list[bytes | None] = []
    try:
        consumer.assign([ConfluentTopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < count and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=count - len(values), timeout=0.5):
                assert msg.error() is None, msg.error()
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_one_address_past_its_cap_is_refused_while_another_still_connects_and_a_client_produces_and_consumes(
    tmp_path: Path,
) -> None:
    # 32 connections in all, so 8 per address; the first request may take 2 minutes, so the
    # hog's silent connections keep their slots for the whole test.
    flags = ("--max-connections", "32", "--first-request-ms", "120000")
    with ServeProcess(tmp_path / "root", *flags) as server:
        hogs = [WireSocket(server.bootstrap, source_host=OTHER_ADDRESS) for _ in range(8)]
        try:
            with WireSocket(server.bootstrap, source_host=OTHER_ADDRESS) as ninth:
                assert ninth.closed_by_peer(timeout_s=DEADLINE_S)
            assert _answered(hogs[0], 1)  # the hog's own connections are held, not closed
            with WireSocket(server.bootstrap) as other:  # from 127.0.0.1
                assert _answered(other, 2)
            values = _round_trip_confluent(server.bootstrap, TOPIC, 20)
            assert values == [b"v%d" % n for n in range(20)]
        finally:
            for sock in hogs:
                sock.close()
        # The hog's slots are freed once its connections close.
        deadline = time.monotonic() + DEADLINE_S
        served_again = False
        while not served_again and time.monotonic() < deadline:
            with WireSocket(server.bootstrap, source_host=OTHER_ADDRESS) as again:
                served_again = _answered(again, 3)
        assert served_again
        assert server.wait_for_output(f"refusing a connection from {OTHER_ADDRESS}:"), server.log()
