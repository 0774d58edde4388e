"""Partition directory names: `<topic>-<partition>`, Kafka's topic rules (engine/layout.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.layout import (
    InvalidTopicError,
    TopicPartition,
    parse_partition_dir_name,
    partition_dir_name,
)

topics = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=249).filter(lambda t: t not in (".", ".."))
partitions = st.integers(min_value=0, max_value=2**31 - 1)


@given(topics, partitions)
def test_every_legal_name_round_trips(topic: str, partition: int) -> None:
    assert parse_partition_dir_name(partition_dir_name(topic, partition)) == TopicPartition(topic, partition)


def test_the_partition_is_the_number_after_the_last_dash() -> None:
    assert parse_partition_dir_name("my-topic-12") == TopicPartition("my-topic", 12)
    assert str(TopicPartition("my-topic", 12)) == "my-topic-12"


@pytest.mark.parametrize(
    "name",
    [
        "meta.lmdb",
        ".lock",
        "topic",
        "topic-",
        "-3",
        "topic-01",
        "topic-x",
        "t-0.abc-delete",
        "a/b-0",
        "t-2147483648",
    ],
)
def test_root_wide_entries_and_malformed_names_are_not_partitions(name: str) -> None:
    assert parse_partition_dir_name(name) is None


@pytest.mark.parametrize(
    ("topic", "partition"),
    [("", 0), (".", 0), ("..", 0), ("a b", 0), ("é", 0), ("x" * 250, 0), ("t", -1), ("t", True)],
)
def test_illegal_topics_and_partitions_are_refused_with_the_rule(topic: str, partition: int) -> None:
    with pytest.raises(InvalidTopicError):
        partition_dir_name(topic, partition)
