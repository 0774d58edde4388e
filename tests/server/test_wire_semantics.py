"""What the wire answers mean, checked against the engine behind them (server in this process).

Kafka's answers for idempotent produce, acks, long-poll fetch, and connection limits;
each test looks at the log itself as well as at the response.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from in_process import InProcessServer
from kio.index import load_request_schema
from wire_client import WireSocket, decode_response, encode_request, request_body

from oncelog.segments import encode_batch
from oncelog.server.broker import ServeConfig
from oncelog.server.protocol import build, nested

TOPIC = "semantics"


def _produce_body(records: bytes, *, acks: int = -1, topic: str = TOPIC) -> Any:
    cls: Any = load_request_schema(0, 9)
    topic_type = nested(cls, "topic_data")
    partition = build(nested(topic_type, "partition_data"), index=0, records=records)
    return build(
        cls,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(build(topic_type, name=topic, partition_data=(partition,)),),
    )


def _produce(sock: WireSocket, records: bytes, *, acks: int = -1, correlation_id: int = 1) -> Any:
    sock.send_raw(encode_request(0, 9, correlation_id, _produce_body(records, acks=acks)))
    _, body = decode_response(0, 9, sock.read_frame())
    return body.responses[0].partition_responses[0]


def _idempotent(pid: int, epoch: int, sequence: int, value: bytes = b"v", count: int = 1) -> bytes:
    return encode_batch(
        [(b"k", value)] * count, producer_id=pid, producer_epoch=epoch, base_sequence=sequence, timestamp_ms=1
    )


@pytest.fixture
def server(tmp_path: Path) -> Any:
    with InProcessServer(tmp_path / "root") as running:
        yield running


def test_a_retried_idempotent_batch_is_answered_with_the_original_offset_and_stored_once(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        first = _produce(sock, _idempotent(1000, 0, 0, count=3))
        second = _produce(sock, _idempotent(1000, 0, 3, count=2))
        retry = _produce(sock, _idempotent(1000, 0, 0, count=3))
    assert (first.error_code, first.base_offset) == (0, 0)
    assert (second.error_code, second.base_offset) == (0, 3)
    assert (retry.error_code, retry.base_offset) == (0, 0)
    assert server.manager.log(TOPIC, 0).log_end_offset == 5


def test_a_sequence_gap_is_out_of_order_and_a_lower_epoch_is_fenced(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        assert _produce(sock, _idempotent(2000, 3, 0)).error_code == 0
        gap = _produce(sock, _idempotent(2000, 3, 5))
        zombie = _produce(sock, _idempotent(2000, 2, 1))
    assert (gap.error_code, gap.base_offset) == (45, -1)  # OUT_OF_ORDER_SEQUENCE_NUMBER
    assert (zombie.error_code, zombie.base_offset) == (47, -1)  # INVALID_PRODUCER_EPOCH
    assert server.manager.log(TOPIC, 0).log_end_offset == 1


def test_a_batch_over_the_size_limit_is_message_too_large(tmp_path: Path) -> None:
    with InProcessServer(tmp_path / "root") as running:
        running.manager.set_topic_config(TOPIC, max_batch_bytes=1024)
        with WireSocket(running.bootstrap) as sock:
            _produce(sock, _idempotent(1, 0, 0))  # creates the topic with the small limit
            answer = _produce(sock, encode_batch([(b"k", b"x" * 4000)]))
        assert (answer.error_code, answer.base_offset) == (10, -1)


def test_acks_0_gets_no_response_but_the_batch_is_written(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        sock.send_raw(encode_request(0, 9, 41, _produce_body(_idempotent(3000, 0, 0), acks=0)))
        sock.send_raw(encode_request(18, 3, 42, request_body(18, 3, TOPIC)))
        correlation_id, _ = decode_response(18, 3, sock.read_frame())
    assert correlation_id == 42  # the first frame back answers the second request
    assert server.manager.log(TOPIC, 0).log_end_offset == 1


def test_with_fsync_acks_an_acks_all_answer_means_the_batch_is_fsynced(tmp_path: Path) -> None:
    config = ServeConfig(listen_port=0, fsync_acks=True)
    with InProcessServer(tmp_path / "root", config) as running, WireSocket(running.bootstrap) as sock:
        for sequence in range(5):
            assert _produce(sock, _idempotent(4000, 0, sequence)).error_code == 0
            log = running.manager.log(TOPIC, 0)
            assert log.recovery_point >= log.log_end_offset == sequence + 1
        # acks=1 does not wait for the fsync.
        assert _produce(sock, _idempotent(4000, 0, 5), acks=1).error_code == 0


def test_without_fsync_acks_an_answer_does_not_wait_for_an_fsync(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        for sequence in range(3):
            _produce(sock, _idempotent(5000, 0, sequence))
    log = server.manager.log(TOPIC, 0)
    assert log.recovery_point < log.log_end_offset  # what the test above would notice


def _fetch_body(offset: int, *, max_wait_ms: int, min_bytes: int, isolation: int = 0) -> Any:
    cls: Any = load_request_schema(1, 12)
    topic_type = nested(cls, "topics")
    partition = build(
        nested(topic_type, "partitions"), partition=0, fetch_offset=offset, partition_max_bytes=1 << 20
    )
    return build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=1 << 20,
        isolation_level=isolation,
        topics=(build(topic_type, topic=TOPIC, partitions=(partition,)),),
        forgotten_topics_data=(),
        rack_id="",
    )


def test_a_long_poll_fetch_is_woken_by_an_append_on_another_connection(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        _produce(sock, _idempotent(6000, 0, 0))

    def append_later() -> None:
        time.sleep(0.3)
        with WireSocket(server.bootstrap) as other:
            _produce(other, _idempotent(6000, 0, 1, value=b"late"))

    appender = threading.Thread(target=append_later)
    with WireSocket(server.bootstrap, timeout_s=30) as sock:
        started = time.monotonic()
        appender.start()
        sock.send_raw(encode_request(1, 12, 7, _fetch_body(1, max_wait_ms=10_000, min_bytes=1)))
        _, body = decode_response(1, 12, sock.read_frame())
        waited_s = time.monotonic() - started
    appender.join()
    partition = body.responses[0].partitions[0]
    assert 0.25 <= waited_s < 5, waited_s
    assert partition.high_watermark == 2 and b"late" in partition.records


def test_a_fetch_with_nothing_new_waits_max_wait_then_answers_empty(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        _produce(sock, _idempotent(7000, 0, 0))
        started = time.monotonic()
        sock.send_raw(encode_request(1, 12, 8, _fetch_body(1, max_wait_ms=400, min_bytes=1)))
        _, body = decode_response(1, 12, sock.read_frame())
        waited_s = time.monotonic() - started
    assert 0.35 <= waited_s < 3, waited_s
    assert body.responses[0].partitions[0].records == b""


def test_a_fetch_past_the_end_is_offset_out_of_range(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        _produce(sock, _idempotent(8000, 0, 0))
        sock.send_raw(encode_request(1, 12, 9, _fetch_body(5, max_wait_ms=0, min_bytes=0)))
        _, body = decode_response(1, 12, sock.read_frame())
    partition = body.responses[0].partitions[0]
    assert (partition.error_code, partition.high_watermark) == (1, 1)


def test_an_idle_connection_is_closed(tmp_path: Path) -> None:
    config = ServeConfig(listen_port=0, idle_ms=300)
    with InProcessServer(tmp_path / "root", config) as running, WireSocket(running.bootstrap) as sock:
        assert sock.closed_by_peer(timeout_s=5)


def test_connections_past_the_limit_are_refused_and_the_others_keep_working(tmp_path: Path) -> None:
    config = dataclasses.replace(ServeConfig(listen_port=0), max_connections=2)
    with (
        InProcessServer(tmp_path / "root", config) as running,
        WireSocket(running.bootstrap) as first,
        WireSocket(running.bootstrap) as second,
    ):
        time.sleep(0.2)  # both accepted
        with WireSocket(running.bootstrap) as third:
            assert third.closed_by_peer(timeout_s=5)
        for n, sock in enumerate((first, second)):
            sock.send_raw(encode_request(18, 3, n, request_body(18, 3, TOPIC)))
            assert decode_response(18, 3, sock.read_frame())[0] == n
