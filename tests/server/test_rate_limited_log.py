"""RateLimitedLog on an injected clock: one line per key per minute, and a count of what was held back.

Then at the server's sites, with the broker's limiter on the same clock: a topic whose
creation fails, asked for by a real client, and connections refused past an address's cap.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from in_process import InProcessServer
from wire_client import WireSocket, decode_response, encode_request, request_body

from oncelog.server.broker import ServeConfig
from oncelog.server.rate_limited_log import RateLimitedLog

LOGGER = "oncelog.test.rate_limited"
MINUTE_MS = 60_000


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def limited(clock: FakeClock) -> RateLimitedLog:
    return RateLimitedLog(logging.getLogger(LOGGER), interval_ms=MINUTE_MS, clock=clock)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_the_first_warning_about_a_topic_is_logged_and_its_repeats_within_the_minute_are_not(
    caplog: pytest.LogCaptureFixture, clock: FakeClock, limited: RateLimitedLog
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    logged = []
    for _ in range(700):
        logged.append(limited.warning(("auto-create", "t1"), "creating topic %r failed: %s", "t1", "full"))
        clock.now_ms += 50  # 35 s in all
    assert logged == [True] + [False] * 699
    assert _lines(caplog) == ["creating topic 't1' failed: full"]
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.WARNING]


def test_the_first_warning_after_the_minute_says_how_many_were_held_back(
    caplog: pytest.LogCaptureFixture, clock: FakeClock, limited: RateLimitedLog
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    limited.warning("refused 10.0.0.9", "refusing a connection from %s", "10.0.0.9")
    for _ in range(41):
        clock.now_ms += 1000
        limited.warning("refused 10.0.0.9", "refusing a connection from %s", "10.0.0.9")
    clock.now_ms += MINUTE_MS - 41_000 - 1
    assert not limited.warning("refused 10.0.0.9", "refusing a connection from %s", "10.0.0.9")
    clock.now_ms += 1  # the minute is over
    assert limited.warning("refused 10.0.0.9", "refusing a connection from %s", "10.0.0.9")
    assert _lines(caplog) == [
        "refusing a connection from 10.0.0.9",
        "refusing a connection from 10.0.0.9 (42 more like this since the last such line, not logged)",
    ]
    # A new minute starts with nothing held back.
    clock.now_ms += MINUTE_MS
    limited.warning("refused 10.0.0.9", "refusing a connection from %s", "10.0.0.9")
    assert _lines(caplog)[-1] == "refusing a connection from 10.0.0.9"


def test_each_topic_and_address_has_its_own_minute(
    caplog: pytest.LogCaptureFixture, clock: FakeClock, limited: RateLimitedLog
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    for _ in range(3):
        for key in ("topic a", "topic b", "address 127.0.0.2"):
            limited.warning(key, "about %s", key)
        clock.now_ms += 10
    assert _lines(caplog) == ["about topic a", "about topic b", "about address 127.0.0.2"]


def test_a_full_table_forgets_its_oldest_key_first(
    caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    limited = RateLimitedLog(logging.getLogger(LOGGER), interval_ms=MINUTE_MS, max_keys=2, clock=clock)
    for key in ("first", "second", "third"):  # the third pushes "first" out
        limited.warning(key, "%s", key)
        clock.now_ms += 1
    assert not limited.warning("third", "%s", "third")
    assert limited.warning("first", "%s", "first")  # forgotten: logged again within its minute
    assert _lines(caplog) == ["first", "second", "third", "first"]


def test_other_levels_are_limited_the_same_way(
    caplog: pytest.LogCaptureFixture, clock: FakeClock, limited: RateLimitedLog
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    assert limited.log(logging.INFO, "k", "idle %d", 1)
    assert not limited.log(logging.INFO, "k", "idle %d", 2)
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER] == [
        (logging.INFO, "idle 1")
    ]


@pytest.mark.parametrize(("interval_ms", "max_keys"), [(0, 10), (-1, 10), (MINUTE_MS, 0)])
def test_a_window_or_table_that_is_not_positive_is_refused(interval_ms: int, max_keys: int) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        RateLimitedLog(logging.getLogger(LOGGER), interval_ms=interval_ms, max_keys=max_keys)


# -- at the server's sites: a topic that cannot be created, connections refused -------------------

SERVE_LOGGER = "oncelog.server"


def _serve_lines(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SERVE_LOGGER and words in r.getMessage()]


def _held_back(line: str) -> int:
    found = re.search(r"\((\d+) more like this", line)
    assert found, line
    return int(found.group(1))


def test_a_topic_that_cannot_be_created_is_warned_about_once_a_minute_however_often_clients_ask(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    caplog.set_level(logging.WARNING, SERVE_LOGGER)
    running = InProcessServer(tmp_path / "root")
    running.server.broker.max_partitions = 0  # no partition fits the budget: every creation fails
    running.server.broker.warnings = RateLimitedLog(logging.getLogger(SERVE_LOGGER), clock=clock)
    with running:
        producer = Producer({"bootstrap.servers": running.bootstrap})  # asks for auto-creation
        for _ in range(20):
            answer = producer.list_topics(topic="uncreatable", timeout=30).topics["uncreatable"]
            assert answer.error is not None and answer.error.code() == KafkaError.INVALID_PARTITIONS
        assert len(_serve_lines(caplog, "'uncreatable'")) == 1
        clock.now_ms += MINUTE_MS
        producer.list_topics(topic="uncreatable", timeout=30)
    lines = _serve_lines(caplog, "'uncreatable'")
    assert len(lines) == 2
    assert _held_back(lines[1]) >= 19  # librdkafka may ask again on its own, never less
    assert not (tmp_path / "root" / "uncreatable-0").exists()


def test_connections_refused_from_one_address_are_warned_about_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    caplog.set_level(logging.WARNING, SERVE_LOGGER)
    running = InProcessServer(tmp_path / "root", ServeConfig(listen_port=0, max_connections_per_ip=1))
    running.server.broker.warnings = RateLimitedLog(logging.getLogger(SERVE_LOGGER), clock=clock)
    with running, WireSocket(running.bootstrap) as holder:
        holder.send_raw(encode_request(18, 3, 1, request_body(18, 3, "t")))
        assert decode_response(18, 3, holder.read_frame())[0] == 1  # its one slot is taken
        for _ in range(10):
            with WireSocket(running.bootstrap) as refused:
                assert refused.closed_by_peer(timeout_s=30)
        assert len(_serve_lines(caplog, "refusing a connection from 127.0.0.1")) == 1
        clock.now_ms += MINUTE_MS
        with WireSocket(running.bootstrap) as refused:
            assert refused.closed_by_peer(timeout_s=30)
    lines = _serve_lines(caplog, "refusing a connection from 127.0.0.1")
    assert len(lines) == 2 and _held_back(lines[1]) == 9
    assert "1 connections open from this address (limit 1)" in lines[0]
