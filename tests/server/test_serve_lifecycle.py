"""The server process as an operator sees it: start, SIGTERM, SIGKILL, restart, addresses, topics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.index import load_request_schema
from serve_process import ServeProcess, free_port
from wire_client import WireSocket, decode_response, encode_request, request_body

from oncelog.server.codec import build, nested


def _produce_confluent(bootstrap: str, topic: str, count: int) -> list[int]:
    offsets: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2})
    for n in range(count):
        producer.produce(
            topic, value=b"m%d" % n, on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset())
        )
    assert producer.flush(30) == 0
    return offsets


def _metadata(bootstrap: str, topic: str, *, create: bool) -> Any:
    cls: Any = load_request_schema(3, 9)
    body = build(
        cls,
        topics=(build(nested(cls, "topics"), name=topic),),
        allow_auto_topic_creation=create,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    with WireSocket(bootstrap) as sock:
        sock.send_raw(encode_request(3, 9, 3, body))
        return decode_response(3, 9, sock.read_frame())[1]


def _cluster_id(server: ServeProcess) -> str:
    found = re.findall(r"cluster id (\S+)", server.log())
    assert found, server.log()
    return found[-1]


def test_sigterm_answers_in_hand_closes_every_log_cleanly_and_exits_0(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path / "root").start()
    assert _produce_confluent(server.bootstrap, "drain", 200) == list(range(200))
    idle = [WireSocket(server.bootstrap) for _ in range(3)]  # open connections do not hold it up
    assert server.terminate() == 0
    for sock in idle:
        sock.close()
    assert "every log closed cleanly" in server.log()
    assert "Traceback" not in server.log() and "ERROR" not in server.log(), server.log()
    server.start()
    try:
        assert "1 clean, 0 unclean" in server.log(), server.log()
    finally:
        assert server.terminate() == 0


def test_after_sigkill_the_next_start_recovers_and_prints_the_summary(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path / "root").start()
    try:
        assert _produce_confluent(server.bootstrap, "killed", 300) == list(range(300))
        server.restart()  # SIGKILL, then start on the same port
        assert "0 clean, 1 unclean" in server.log(), server.log()
        assert _produce_confluent(server.bootstrap, "killed", 1) == [300]
    finally:
        server.terminate()


def test_the_cluster_id_survives_restarts_and_metadata_reports_it(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path / "root").start()
    try:
        first = _cluster_id(server)
        assert len(first) == 22
        server.restart()
        assert _cluster_id(server) == first
        assert _metadata(server.bootstrap, "any", create=False).cluster_id == first
    finally:
        server.terminate()


def test_metadata_advertises_the_advertise_address_not_the_listen_one(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "root", "--advertise", "broker-7.example.com:19999") as server:
        body = _metadata(server.bootstrap, "adv", create=True)
    assert [(b.node_id, b.host, b.port) for b in body.brokers] == [(0, "broker-7.example.com", 19999)]
    assert [p.leader_id for p in body.topics[0].partitions] == [0]


def test_a_second_server_on_the_same_root_is_refused_with_exit_2(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "root") as first:
        second = ServeProcess(tmp_path / "root")
        try:
            second.start()
            raise AssertionError("a second server started on a locked root")
        except RuntimeError:
            pass
        assert second.proc is not None and second.proc.wait(30) == 2
        assert "already open" in second.log() or "another" in second.log(), second.log()
        assert first.proc is not None and first.proc.poll() is None


def test_without_auto_create_an_unknown_topic_is_unknown_to_produce_and_metadata(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "root", "--no-auto-create") as server:
        assert [t.error_code for t in _metadata(server.bootstrap, "nope", create=True).topics] == [3]
        with WireSocket(server.bootstrap) as sock:
            sock.send_raw(encode_request(0, 9, 8, request_body(0, 9, "nope")))
            _, body = decode_response(0, 9, sock.read_frame())
        assert body.responses[0].partition_responses[0].error_code == 3
        assert not (server.root / "nope-0").exists()


def test_auto_created_topics_get_the_partitions_option(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "root", "--partitions", "4") as server:
        body = _metadata(server.bootstrap, "four", create=True)
    assert [p.partition_index for p in body.topics[0].partitions] == [0, 1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "root").iterdir() if p.name.startswith("four-")) == [
        "four-0",
        "four-1",
        "four-2",
        "four-3",
    ]


def test_an_admin_client_creates_topics_and_gets_kafkas_errors(tmp_path: Path) -> None:
    port = free_port()
    with ServeProcess(tmp_path / "root", port=port) as server:
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        futures = admin.create_topics([NewTopic("made", num_partitions=3, replication_factor=1)])
        futures["made"].result(30)
        assert len(admin.list_topics(timeout=10).topics["made"].partitions) == 3
        again = admin.create_topics([NewTopic("made", num_partitions=3, replication_factor=1)])
        try:
            again["made"].result(30)
            raise AssertionError("creating an existing topic succeeded")
        except Exception as exc:  # KafkaException wrapping TOPIC_ALREADY_EXISTS
            assert "TOPIC_ALREADY_EXISTS" in str(exc) or "already exists" in str(exc)
        triple = admin.create_topics([NewTopic("triple", num_partitions=1, replication_factor=3)])
        try:
            triple["triple"].result(30)
            raise AssertionError("replication factor 3 on one node succeeded")
        except Exception as exc:
            assert "REPLICATION_FACTOR" in str(exc).upper()
        # The partitions survive a restart.
        server.restart()
        assert (
            len(
                AdminClient({"bootstrap.servers": server.bootstrap})
                .list_topics(timeout=10)
                .topics["made"]
                .partitions
            )
            == 3
        )
