"""Kafka's topic config names against LogConfig (oncelog.server.topic_configs): what is
described reads back as the same LogConfig, and what cannot be taken is refused by name."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.config import COMPRESSION_TYPES, LogConfig
from oncelog.server.topic_configs import (
    APPEND,
    DELETE,
    SET,
    SUBTRACT,
    TOPIC_CONFIGS,
    InvalidConfigError,
    altered,
    checked,
    describe_topic,
    overrides_of,
)

configs = st.builds(
    LogConfig,
    segment_bytes=st.integers(1024, 2**31 - 1),
    segment_ms=st.integers(1, 2**40),
    retention_ms=st.none() | st.integers(0, 2**40),
    retention_bytes=st.none() | st.integers(0, 2**40),
    flush_messages=st.none() | st.integers(1, 2**40),
    flush_ms=st.none() | st.integers(0, 2**40),
    timestamp_type=st.sampled_from(["CreateTime", "LogAppendTime"]),
    max_batch_bytes=st.integers(69, 2**30),
    compression_type=st.sampled_from(COMPRESSION_TYPES),
    delete_retention_ms=st.integers(0, 2**62),
)


@settings(max_examples=200, deadline=None)
@given(configs)
def test_every_described_config_reads_back_as_the_same_log_config(config: LogConfig) -> None:
    described = [(each.name, value) for each, value, _ in describe_topic(config, {})]
    overrides = overrides_of(described)
    assert checked(LogConfig(), overrides) == dataclasses.replace(LogConfig(), **overrides)
    for field in overrides:
        assert overrides[field] == getattr(config, field)
    assert {each.field for each in TOPIC_CONFIGS.values() if each.field} == set(overrides)


def test_no_limit_is_kafkas_minus_one_for_retention_and_long_max_for_the_flush_settings() -> None:
    assert overrides_of([("retention.ms", "-1"), ("retention.bytes", "-1")]) == {
        "retention_ms": None,
        "retention_bytes": None,
    }
    assert overrides_of([("flush.ms", str(2**63 - 1)), ("flush.messages", str(2**63 - 1))]) == {
        "flush_ms": None,
        "flush_messages": None,
    }
    with pytest.raises(InvalidConfigError, match=re.escape("flush.ms must be at least 0")):
        overrides_of([("flush.ms", "-1")])


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("log.retention.ms", "1", "Unknown topic config name: log.retention.ms"),
        ("cleanup.policy", "compacted", "cleanup.policy is a list of compact and delete"),
        ("cleanup.policy", "", "cleanup.policy is a list of compact and delete"),
        ("min.cleanable.dirty.ratio", "1.5", "between 0 and 1"),
        ("min.cleanable.dirty.ratio", "nan", "between 0 and 1"),
        ("min.insync.replicas", "2", "min.insync.replicas is 1"),
        ("segment.bytes", "1e9", "segment.bytes is a whole number"),
        ("message.timestamp.type", "createtime", "one of CreateTime, LogAppendTime"),
        ("retention.ms", None, "retention.ms needs a value"),
        ("compression.type", "brotli", "one of producer, uncompressed, gzip, snappy, lz4, zstd"),
        ("compression.type", "LZ4", "one of producer"),
        ("message.format.version", "newest", "a Kafka version"),
        ("delete.retention.ms", "-1", "delete.retention.ms must be at least 0"),
    ],
)
def test_a_value_or_name_this_server_cannot_take_is_refused_by_name(
    name: str, value: str | None, says: str
) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(says)):
        overrides_of([(name, value)])


def test_a_value_log_config_refuses_is_named_by_its_kafka_config() -> None:
    says = re.escape("segment.bytes=12: segment_bytes must be >= 1024")
    with pytest.raises(InvalidConfigError, match=says):
        checked(LogConfig(), overrides_of([("segment.bytes", "12")]))


def test_incremental_steps_set_delete_and_refuse_appending_to_what_is_not_a_list() -> None:
    current = {"retention_ms": 5, "segment_ms": 9}
    steps = [("retention.ms", DELETE, None), ("flush.ms", SET, "100"), ("cleanup.policy", APPEND, "delete")]
    assert altered(current, steps) == {"segment_ms": 9, "flush_ms": 100, "cleanup_policy": "delete"}
    assert current == {"retention_ms": 5, "segment_ms": 9}  # not changed in place
    for refused in (
        ("retention.ms", APPEND, "1"),
        ("cleanup.policy", SUBTRACT, "delete"),  # nothing would be left
        ("cleanup.policy", APPEND, "shred"),
        ("segment.ms", 9, "1"),
    ):
        with pytest.raises(InvalidConfigError):
            altered(current, [refused])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max.message.bytes", str(2**31)),  # an INT
        ("segment.ms", str(2**63)),  # a LONG (the compiled append takes it as one)
        ("retention.ms", str(10**30)),
        ("retention.bytes", "1_000"),  # Kafka's parser takes no underscores
        ("segment.bytes", " "),
    ],
)
def test_a_number_past_its_kafka_type_or_not_kafkas_syntax_is_refused(name: str, value: str) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(name)):
        overrides_of([(name, value)])


def test_message_format_version_is_taken_and_ignored_as_kafka_3_does() -> None:
    versions = ("0.10.0", "0.10.0.0", "3.0-IV1", "2.8")  # (librdkafka's 0092 sets 0.10.0.0)
    assert overrides_of([("message.format.version", version) for version in versions]) == {}
    described = {each.name: value for each, value, _ in describe_topic(LogConfig(), {})}
    assert described["message.format.version"] == "3.0-IV1"


def test_compression_and_tombstone_retention_are_stored_per_topic() -> None:
    assert overrides_of([("compression.type", " lz4"), ("delete.retention.ms", "900")]) == {
        "compression_type": "lz4",
        "delete_retention_ms": 900,
    }


def test_cleanup_policy_takes_either_order_and_appending_compact_to_delete_gives_both() -> None:
    assert overrides_of([("cleanup.policy", "delete, compact")]) == {"cleanup_policy": "compact,delete"}
    assert overrides_of([("cleanup.policy", "compact")]) == {"cleanup_policy": "compact"}
    assert altered({}, [("cleanup.policy", APPEND, "compact")]) == {"cleanup_policy": "compact,delete"}
    both = {"cleanup_policy": "compact,delete"}
    assert altered(both, [("cleanup.policy", SUBTRACT, "delete")]) == {"cleanup_policy": "compact"}
    assert overrides_of([("min.cleanable.dirty.ratio", "0.25"), ("min.compaction.lag.ms", "10")]) == {
        "min_cleanable_dirty_ratio": 0.25,
        "min_compaction_lag_ms": 10,
    }
