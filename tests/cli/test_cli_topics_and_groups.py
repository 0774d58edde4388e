"""`oncelog topics` and `oncelog groups` (issue 31) against a running `oncelog serve`: the
weekly tasks an operator has no Java tools for, checked by what a Kafka client then sees."""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.bench.serve_process import ServeProcess
from oncelog.cli.main import main

TIMEOUT_S: Final = 30.0
T0_MS: Final = 1_790_000_000_000  # 2026-09-21T...Z; records 1 s apart from here


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root: Path = tmp_path_factory.mktemp("cli-admin")
    with ServeProcess(root, "--group-initial-rebalance-delay-ms", "300") as running:
        yield running


def oncelog(server: ServeProcess, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main([args[0], "--bootstrap", server.bootstrap, *args[1:]], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_topics_are_created_with_configs_described_altered_grown_and_deleted(server: ServeProcess) -> None:
    assert (
        oncelog(
            server, "topics", "create", "cli-orders", "--partitions", "2", "--config", "retention.ms=60000"
        )[0]
        == 0
    )
    status, listed, _ = oncelog(server, "topics", "list")
    assert status == 0 and "cli-orders\t2 partitions" in listed
    status, described, _ = oncelog(server, "topics", "describe", "cli-orders")
    assert status == 0 and "* retention.ms=60000" in described and "  segment.bytes=1073741824" in described
    status, _, _ = oncelog(
        server,
        "topics",
        "alter",
        "cli-orders",
        "--config",
        "segment.ms=3600000",
        "--delete-config",
        "retention.ms",
        "--partitions",
        "3",
    )
    assert status == 0
    _, described, _ = oncelog(server, "topics", "describe", "cli-orders")
    assert "* segment.ms=3600000" in described and "* retention.ms" not in described
    assert "cli-orders: 3 partitions" in described
    status, _, err = oncelog(server, "topics", "alter", "cli-orders", "--config", "cleanup.policy=shred")
    assert status == 2 and "cleanup.policy" in err  # refused by name, nothing applied
    assert oncelog(server, "topics", "delete", "cli-orders")[0] == 0
    assert "cli-orders" not in oncelog(server, "topics", "list")[1]
    status, _, err = oncelog(server, "topics", "describe", "cli-orders")
    assert status == 2 and err


def test_a_groups_offsets_are_reset_by_time_only_with_execute_and_a_new_consumer_starts_there(
    server: ServeProcess,
) -> None:
    topic, group = "cli-events", "cli-readers"
    assert oncelog(server, "topics", "create", topic)[0] == 0
    producer = Producer({"bootstrap.servers": server.bootstrap})
    for n in range(10):
        producer.produce(topic, value=b"%d" % n, partition=0, timestamp=T0_MS + n * 1000)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer(
        {"bootstrap.servers": server.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.commit(offsets=[TopicPartition(topic, 0, 9)], asynchronous=False)
    consumer.close()

    status, listed, _ = oncelog(server, "groups", "list")
    assert status == 0 and f"{group}\tEmpty" in listed
    status, described, _ = oncelog(server, "groups", "describe", group)
    assert status == 0 and f"{topic}-0: committed 9, end 10, lag 1" in described
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0_MS / 1000 + 4))
    status, plan, _ = oncelog(
        server, "groups", "reset-offsets", group, "--topic", topic, "--to-datetime", moment
    )
    assert status == 0 and "dry run" in plan and f"{topic}-0: 9 -> 4" in plan
    assert f"{topic}-0: committed 9" in oncelog(server, "groups", "describe", group)[1]  # nothing changed
    assert (
        oncelog(
            server, "groups", "reset-offsets", group, "--topic", topic, "--to-datetime", moment, "--execute"
        )[0]
        == 0
    )
    reader = Consumer(
        {"bootstrap.servers": server.bootstrap, "group.id": group, "auto.offset.reset": "latest"}
    )
    reader.subscribe([topic])
    first = None
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while first is None and time.monotonic() < deadline:
            message = reader.poll(0.1)
            if message is not None and message.error() is None:
                first = message.offset()
        assert first == 4
        # With a member in the group, an executed reset is refused by name.
        status, _, err = oncelog(
            server, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute"
        )
        assert status == 2 and "stop its consumers first" in err
    finally:
        reader.close()


def test_an_unreachable_server_is_one_line_and_status_2() -> None:
    out, err = io.StringIO(), io.StringIO()
    status = main(["topics", "--bootstrap", "127.0.0.1:1", "--timeout-s", "1", "list"], out=out, err=err)
    assert status == 2 and err.getvalue().count("\n") == 1 and "127.0.0.1:1" in err.getvalue()
    assert "Traceback" not in err.getvalue()


def test_help_explains_every_action() -> None:
    for command, actions in (
        ("topics", ("list", "describe", "create", "delete", "alter")),
        ("groups", ("list", "describe", "reset-offsets")),
    ):
        out = io.StringIO()
        saved, sys.stdout = sys.stdout, out
        try:
            assert main([command, "--help"], out=out) == 0
        finally:
            sys.stdout = saved
        assert all(action in out.getvalue() for action in actions)
