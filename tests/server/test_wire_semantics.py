"""What the wire answers mean, checked against the engine behind them (server in this process).

Kafka's answers for idempotent produce, acks, long-poll fetch, and connection limits;
each test looks at the log itself as well as at the response.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from in_process import InProcessServer
from kio.index import load_request_schema
from wire_client import WireSocket, decode_response, encode_request, request_body

from oncelog.log_manager import LogManager
from oncelog.segments import encode_batch
from oncelog.server.broker import ServeConfig
from oncelog.server.codec import build, nested

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
            assert log.durable_end_offset >= log.log_end_offset == sequence + 1
        # acks=1 does not wait for the fsync.
        assert _produce(sock, _idempotent(4000, 0, 5), acks=1).error_code == 0


def test_an_idle_partitions_recovery_point_catches_up_with_what_its_flushes_fsynced(tmp_path: Path) -> None:
    # A flush commits the point only every recovery_point_interval_ms (1 s by default), so
    # after a burst the last flushes are fsynced but not vouched for until serve's checkpoint.
    config = ServeConfig(listen_port=0, fsync_acks=True)
    with InProcessServer(tmp_path / "root", config) as running, WireSocket(running.bootstrap) as sock:
        for sequence in range(3):
            assert _produce(sock, _idempotent(4100, 0, sequence)).error_code == 0
        log = running.manager.log(TOPIC, 0)
        assert log.durable_end_offset == log.log_end_offset == 3
        deadline = time.monotonic() + 120  # a liveness bound, not a speed claim
        while log.recovery_point < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.recovery_point == 3


def test_without_fsync_acks_an_answer_does_not_wait_for_an_fsync(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        for sequence in range(3):
            _produce(sock, _idempotent(5000, 0, sequence))
    log = server.manager.log(TOPIC, 0)
    assert log.durable_end_offset < log.log_end_offset  # what the test above would notice


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
    assert 0.25 <= waited_s < 9, waited_s  # answered on the append, not at max_wait (10 s)
    assert partition.high_watermark == 2 and b"late" in partition.records


def test_a_fetch_with_nothing_new_waits_max_wait_then_answers_empty(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        _produce(sock, _idempotent(7000, 0, 0))
        started = time.monotonic()
        sock.send_raw(encode_request(1, 12, 8, _fetch_body(1, max_wait_ms=400, min_bytes=1)))
        _, body = decode_response(1, 12, sock.read_frame())
        waited_s = time.monotonic() - started
    assert 0.35 <= waited_s < 30, waited_s  # (the upper bound only says it did not hang)
    assert body.responses[0].partitions[0].records == b""


def test_a_fetch_past_the_end_is_offset_out_of_range(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        _produce(sock, _idempotent(8000, 0, 0))
        sock.send_raw(encode_request(1, 12, 9, _fetch_body(5, max_wait_ms=0, min_bytes=0)))
        _, body = decode_response(1, 12, sock.read_frame())
    partition = body.responses[0].partitions[0]
    assert (partition.error_code, partition.high_watermark) == (1, 1)


def test_a_connection_idle_after_a_request_for_idle_ms_is_closed(tmp_path: Path) -> None:
    config = ServeConfig(listen_port=0, idle_ms=300)
    with InProcessServer(tmp_path / "root", config) as running, WireSocket(running.bootstrap) as sock:
        sock.send_raw(encode_request(18, 3, 1, request_body(18, 3, TOPIC)))
        assert decode_response(18, 3, sock.read_frame())[0] == 1
        assert sock.closed_by_peer(timeout_s=30)


def test_connections_past_the_limit_are_refused_and_the_others_keep_working(tmp_path: Path) -> None:
    # Every connection comes from 127.0.0.1: let one address take both slots.
    config = dataclasses.replace(ServeConfig(listen_port=0), max_connections=2, max_connections_per_ip=2)
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


def _produce_entries(sock: WireSocket, entries: list[tuple[int, bytes]], *, acks: int = -1) -> list[Any]:
    """One Produce request naming partitions of TOPIC in this order; the answers in order."""
    cls: Any = load_request_schema(0, 9)
    topic_type = nested(cls, "topic_data")
    partition_type = nested(topic_type, "partition_data")
    body = build(
        cls,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            build(
                topic_type,
                name=TOPIC,
                partition_data=tuple(build(partition_type, index=p, records=r) for p, r in entries),
            ),
        ),
    )
    sock.send_raw(encode_request(0, 9, 5, body))
    _, response = decode_response(0, 9, sock.read_frame())
    return [p for t in response.responses for p in t.partition_responses]


@pytest.mark.parametrize("acks", [5, -7, 2])
def test_acks_other_than_minus_1_0_1_are_invalid_required_acks_and_write_nothing(
    server: Any, acks: int
) -> None:
    with WireSocket(server.bootstrap) as sock:
        (answer,) = _produce_entries(sock, [(0, _idempotent(9000, 0, 0))], acks=acks)
    assert (answer.error_code, answer.base_offset) == (21, -1)  # INVALID_REQUIRED_ACKS
    assert server.server.broker.topics().get(TOPIC) is None  # not even auto-created


def test_a_partition_named_three_times_in_one_produce_is_appended_once_with_the_last_entry(
    server: Any,
) -> None:
    entries = [(0, _idempotent(9100, 0, 0, value=b"first")), (0, _idempotent(9200, 0, 0, value=b"last"))]
    with WireSocket(server.bootstrap) as sock:
        answers = _produce_entries(sock, [entries[0], entries[0], entries[1]])
    assert [(a.index, a.error_code, a.base_offset) for a in answers] == [(0, 0, 0)]
    log = server.manager.log(TOPIC, 0)
    assert log.log_end_offset == 1
    assert [r.value for r in log.read(0).records()] == [b"last"]


def test_a_transactional_batch_in_a_request_naming_no_transactional_id_is_refused(server: Any) -> None:
    # Kafka's answer, authorizer or not: a transactional batch needs its request's transactional id.
    transactional = encode_batch(
        [(b"k", b"v")],
        producer_id=9300,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
        timestamp_ms=1,
    )
    with WireSocket(server.bootstrap) as sock:
        _produce(sock, _idempotent(9400, 0, 0))
        answer = _produce(sock, transactional)
    log = server.manager.log(TOPIC, 0)
    assert (answer.error_code, answer.base_offset) == (53, -1)  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert (log.log_end_offset, log.last_stable_offset) == (1, 1)


def _init_producer_id(sock: WireSocket, transactional_id: str | None) -> Any:
    cls: Any = load_request_schema(22, 4)
    body = build(
        cls,
        transactional_id=transactional_id,
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=-1,
    )
    sock.send_raw(encode_request(22, 4, 6, body))
    return decode_response(22, 4, sock.read_frame())[1]


def test_init_producer_id_fences_a_transactional_id_and_refuses_one_it_cannot_store(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        first = _init_producer_id(sock, "payments-writer")
        second = _init_producer_id(sock, "payments-writer")
        idempotent = _init_producer_id(sock, None)
        empty = _init_producer_id(sock, "")
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, first.producer_epoch + 1)
    assert idempotent.producer_id not in (-1, first.producer_id) and idempotent.producer_epoch == 0
    assert (empty.error_code, empty.producer_id) == (42, -1)  # INVALID_REQUEST


def _create_topics(sock: WireSocket, names: list[str], partitions: int = 1) -> list[tuple[str, int]]:
    cls: Any = load_request_schema(19, 5)
    creatable = nested(cls, "topics")
    body = build(
        cls,
        topics=tuple(
            build(
                creatable, name=n, num_partitions=partitions, replication_factor=1, assignments=(), configs=()
            )
            for n in names
        ),
        timeout=datetime.timedelta(seconds=5),
        validate_only=False,
    )
    sock.send_raw(encode_request(19, 5, 7, body))
    return [(t.name, int(t.error_code)) for t in decode_response(19, 5, sock.read_frame())[1].topics]


def test_create_topics_refuses_a_name_given_twice_and_names_that_collide_like_kafka(server: Any) -> None:
    with WireSocket(server.bootstrap) as sock:
        assert _create_topics(sock, ["twice", "twice"]) == [("twice", 42), ("twice", 42)]
        assert _create_topics(sock, ["metrics.a"]) == [("metrics.a", 0)]
        assert _create_topics(sock, ["metrics_a"]) == [("metrics_a", 17)]
        longest = "t" * 249  # Kafka's longest topic name
        assert _create_topics(sock, [longest], partitions=2) == [(longest, 0)]
    assert "twice" not in server.server.broker.topics()


def test_partitions_past_the_servers_file_budget_are_refused_and_nothing_is_created(tmp_path: Path) -> None:
    running = InProcessServer(tmp_path / "root")
    running.server.broker.max_partitions = 5
    with running, WireSocket(running.bootstrap) as sock:
        assert _create_topics(sock, ["small"], partitions=3) == [("small", 0)]
        assert _create_topics(sock, ["big"], partitions=3) == [("big", 37)]  # INVALID_PARTITIONS
    assert not (tmp_path / "root" / "big-0").exists()


def test_a_topic_whose_creation_a_crash_cut_short_gets_all_its_partitions_at_the_next_start(
    tmp_path: Path,
) -> None:
    from oncelog.log_manager import LogManager
    from oncelog.server.broker import TOPIC_PARTITIONS_PREFIX

    with LogManager.open(tmp_path / "root", progress=False) as manager:
        # What a SIGKILL after two of five partitions leaves: the count recorded, two directories.
        manager.root_value(TOPIC_PARTITIONS_PREFIX + "cut", b"5")
        manager.log("cut", 0)
        manager.log("cut", 1)
    with InProcessServer(tmp_path / "root") as running:
        assert running.server.broker.topics()["cut"] == 5
    assert sorted(p.name for p in (tmp_path / "root").iterdir() if p.name.startswith("cut-")) == [
        f"cut-{n}" for n in range(5)
    ]


def test_a_client_that_never_reads_its_responses_is_dropped_and_its_bytes_released(tmp_path: Path) -> None:
    config = ServeConfig(listen_port=0, write_timeout_ms=500)
    with InProcessServer(tmp_path / "root", config) as running:
        with WireSocket(running.bootstrap) as sock:
            for sequence in range(12):  # 12 batches of ~0.9 MB: more than the socket buffers hold
                big = encode_batch(
                    [(b"k", bytes([sequence]) * 900_000)],
                    producer_id=9500,
                    producer_epoch=0,
                    base_sequence=sequence,
                    timestamp_ms=1,
                )
                assert _produce(sock, big).error_code == 0
        with WireSocket(running.bootstrap) as idle_reader:
            idle_reader.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            for n in range(12):
                body = _fetch_body(n, max_wait_ms=0, min_bytes=0)
                idle_reader.send_raw(encode_request(1, 12, 100 + n, body))
            deadline = time.monotonic() + 10
            while running.server.broker.unsent.held_bytes == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert running.server.broker.unsent.held_bytes > 0  # a response is stuck in its socket
            deadline = time.monotonic() + 10
            while running.server.broker.unsent.held_bytes and time.monotonic() < deadline:
                time.sleep(0.05)
            assert running.server.broker.unsent.held_bytes == 0
            assert idle_reader.closed_by_peer(timeout_s=5)


def test_retention_runs_while_serving(tmp_path: Path) -> None:
    config = ServeConfig(listen_port=0, retention_check_ms=100)
    with InProcessServer(tmp_path / "root", config) as running:
        running.manager.set_topic_config(TOPIC, segment_bytes=4096, retention_bytes=8192)
        with WireSocket(running.bootstrap) as sock:
            for sequence in range(40):
                _produce(sock, _idempotent(9600, 0, sequence, value=b"x" * 1000))
        log = running.manager.log(TOPIC, 0)
        deadline = time.monotonic() + 10
        while log.log_start_offset == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.log_start_offset > 0 and log.log_end_offset == 40


def test_a_fetch_naming_a_partition_twice_reads_it_once_and_an_unknown_isolation_closes_the_connection(
    server: Any,
) -> None:
    with WireSocket(server.bootstrap) as sock:
        _produce(sock, _idempotent(9700, 0, 0))
        body = _fetch_body(0, max_wait_ms=0, min_bytes=0)
        topic = body.topics[0]
        doubled = dataclasses.replace(topic, partitions=topic.partitions * 2)
        twice = dataclasses.replace(body, topics=(doubled,))
        sock.send_raw(encode_request(1, 12, 11, twice))
        _, response = decode_response(1, 12, sock.read_frame())
        assert [len(t.partitions) for t in response.responses] == [1]
        sock.send_raw(encode_request(1, 12, 12, dataclasses.replace(body, isolation_level=5)))
        assert sock.closed_by_peer(timeout_s=5)


def _list_offsets(sock: WireSocket, timestamp: int, *, isolation: int = 0) -> tuple[int, int, int]:
    cls: Any = load_request_schema(2, 7)
    topic_type = nested(cls, "topics")
    partition = build(nested(topic_type, "partitions"), partition_index=0, timestamp=timestamp)
    body = build(
        cls,
        replica_id=-1,
        isolation_level=isolation,
        topics=(build(topic_type, name=TOPIC, partitions=(partition,)),),
    )
    sock.send_raw(encode_request(2, 7, 13, body))
    answer = decode_response(2, 7, sock.read_frame())[1].topics[0].partitions[0]
    return int(answer.error_code), answer.timestamp, answer.offset


def test_list_offsets_answers_earliest_latest_max_timestamp_and_by_time(server: Any) -> None:
    t0 = 1_700_000_000_000
    with WireSocket(server.bootstrap) as sock:
        for sequence, at in enumerate((t0, t0 + 30_000, t0 + 10_000)):
            batch = encode_batch(
                [(b"k", b"v")], producer_id=9800, producer_epoch=0, base_sequence=sequence, timestamp_ms=at
            )
            _produce(sock, batch)
        assert _list_offsets(sock, -2) == (0, -1, 0)  # earliest
        assert _list_offsets(sock, -1) == (0, -1, 3)  # latest
        assert _list_offsets(sock, -1, isolation=1) == (0, -1, 3)  # latest stable: no open transaction
        assert _list_offsets(sock, -3) == (0, t0 + 30_000, 1)  # the largest timestamp, and its offset
        assert _list_offsets(sock, t0 + 5_000) == (0, t0 + 30_000, 1)  # the first record at or after
        assert _list_offsets(sock, t0 + 60_000) == (0, -1, -1)  # none


def test_a_failed_fsync_under_fsync_acks_is_a_storage_error_and_the_log_then_refuses_appends(
    tmp_path: Path,
) -> None:
    from doubles import FsyncFailingFileSystem

    from oncelog.errors import LogFailedError

    fs = FsyncFailingFileSystem()
    running = InProcessServer(tmp_path / "root", ServeConfig(listen_port=0, fsync_acks=True), fs=fs)
    answers: list[tuple[int, int]] = []
    with (
        contextlib.suppress(LogFailedError),
        running,
        WireSocket(running.bootstrap) as sock,
    ):  # close says so too
        assert _produce(sock, _idempotent(9900, 0, 0)).error_code == 0
        fs.failing = True  # the disk starts failing fsyncs (fsyncgate)
        for sequence, acks in ((1, -1), (2, 1)):
            answer = _produce(sock, _idempotent(9900, 0, sequence), acks=acks)
            answers.append((answer.error_code, answer.base_offset))
    # KAFKA_STORAGE_ERROR: the first is not acknowledged, and the log fails closed until reopened.
    assert answers == [(56, -1), (56, -1)]


def test_a_transaction_no_stored_record_holds_is_aborted_before_the_port_opens(tmp_path: Path) -> None:
    """coordinator.lmdb lost (deleted, or restored from an old copy) while a transaction was open:
    nothing would ever end it, and read_committed readers would wait on it for ever."""
    root = tmp_path / "root"
    with LogManager.open(root, progress=False) as manager:
        log = manager.log("orphans", 0, create=True)
        lease = manager.producer_ids.lease()
        log.append_records([(b"k", b"v")], producer_id=lease.producer_id, producer_epoch=3, base_sequence=0)
        log.append_records(
            [(b"k", b"open")],
            producer_id=lease.producer_id,
            producer_epoch=3,
            base_sequence=1,
            is_transactional=True,
        )
        assert log.last_stable_offset == 1 < log.log_end_offset
    with InProcessServer(root, ServeConfig(listen_port=0)) as server:
        log = server.server.broker.log("orphans", 0)
        assert log.last_stable_offset == log.log_end_offset == 3  # the ABORT marker at offset 2
        state = log.producer_state(lease.producer_id)
        assert state is not None and state.producer_epoch == 3
        assert log.open_transactions() == {}
