"""Kafka's topic config names, and the LogConfig fields behind them.

Each Kafka topic config a client may name maps to one LogConfig field (a per-topic
override, LogManager.set_topic_config) or to a fixed value this server does not let
change (the replication settings of a single node).
Values are Kafka's strings: "-1" for no limit where LogConfig has None.

Sources are Kafka's DescribeConfigs codes: a topic's override is DYNAMIC_TOPIC_CONFIG,
the root's own value DEFAULT_CONFIG; broker configs are STATIC_BROKER_CONFIG (set on
the command line) and read-only.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from oncelog.config import COMPRESSION_TYPES, LogConfig
from oncelog.server.listeners import format_address

DYNAMIC_TOPIC_CONFIG: Final = 1
STATIC_BROKER_CONFIG: Final = 4
DEFAULT_CONFIG: Final = 5
# DescribeConfigs' config types (KIP-569).
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7
# Kafka's "never" for the flush settings (Long.MAX_VALUE).
_NEVER: Final = str(2**63 - 1)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """One Kafka topic config: its LogConfig field (None: fixed here), type, and documentation."""

    name: str
    field: str | None
    config_type: int
    documentation: str
    # The broker config Kafka names as its synonym (the default under a topic's value).
    broker_name: str = ""
    fixed: str | None = None  # the value of a config that is not a LogConfig field
    unlimited: str = "-1"  # Kafka's value for what LogConfig says with None

    def value(self, config: LogConfig) -> str:
        if self.field is None:
            assert self.fixed is not None
            return self.fixed
        value = getattr(config, self.field)
        return self.unlimited if value is None else _to_kafka(value)


def _to_kafka(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


TOPIC_CONFIGS: Final[Mapping[str, TopicConfig]] = {
    config.name: config
    for config in (
        TopicConfig(
            "retention.ms",
            "retention_ms",
            LONG,
            "Sealed segments older than this are deleted (-1: never).",
            "log.retention.ms",
        ),
        TopicConfig(
            "retention.bytes",
            "retention_bytes",
            LONG,
            "Oldest sealed segments go while the log is past this (-1: no limit).",
            "log.retention.bytes",
        ),
        TopicConfig(
            "segment.bytes",
            "segment_bytes",
            INT,
            "A segment rolls before it would pass this size.",
            "log.segment.bytes",
        ),
        TopicConfig(
            "segment.ms",
            "segment_ms",
            LONG,
            "A segment rolls once its first batch is this old.",
            "log.roll.ms",
        ),
        TopicConfig(
            "segment.index.bytes",
            "segment_index_bytes",
            INT,
            "The largest offset and time index of a segment.",
            "log.index.size.max.bytes",
        ),
        TopicConfig(
            "index.interval.bytes",
            "index_interval_bytes",
            INT,
            "Bytes between offset index entries.",
            "log.index.interval.bytes",
        ),
        TopicConfig(
            "max.message.bytes",
            "max_batch_bytes",
            INT,
            "The largest record batch a client may append.",
            "message.max.bytes",
        ),
        TopicConfig(
            "message.timestamp.type",
            "timestamp_type",
            STRING,
            "CreateTime (the client's) or LogAppendTime (the server's).",
            "log.message.timestamp.type",
        ),
        TopicConfig(
            "flush.messages",
            "flush_messages",
            LONG,
            "Appends between forced fsyncs.",
            "log.flush.interval.messages",
            unlimited=_NEVER,
        ),
        TopicConfig(
            "flush.ms",
            "flush_ms",
            LONG,
            "Time between forced fsyncs.",
            "log.flush.interval.ms",
            unlimited=_NEVER,
        ),
        TopicConfig(
            "cleanup.policy",
            "cleanup_policy",
            LIST,
            "delete: whole segments past retention go; compact: each key's newest record is kept "
            "(records need a key); compact,delete: both.",
            "log.cleanup.policy",
        ),
        TopicConfig(
            "min.cleanable.dirty.ratio",
            "min_cleanable_dirty_ratio",
            DOUBLE,
            "A compacted log is cleaned once its uncleaned part is at least this share of it.",
            "log.cleaner.min.cleanable.ratio",
        ),
        TopicConfig(
            "min.compaction.lag.ms",
            "min_compaction_lag_ms",
            LONG,
            "A record stays uncompacted at least this long.",
            "log.cleaner.min.compaction.lag.ms",
        ),
        TopicConfig(
            "max.compaction.lag.ms",
            "max_compaction_lag_ms",
            LONG,
            "A dirty compacted log is cleaned once its oldest uncleaned record is this old.",
            "log.cleaner.max.compaction.lag.ms",
        ),
        TopicConfig(
            "compression.type",
            "compression_type",
            STRING,
            "producer: batches are stored as sent; a codec: client batches are recompressed into it.",
            "compression.type",
        ),
        TopicConfig(
            "delete.retention.ms",
            "delete_retention_ms",
            LONG,
            "How long a compacted topic keeps a tombstone after the cleaning that first saw it.",
            "log.cleaner.delete.retention.ms",
        ),
        TopicConfig(
            "message.format.version",
            None,
            STRING,
            "Kafka 3 ignores it (deprecated): batches are stored in format v2 whatever it says.",
            "log.message.format.version",
            fixed="3.0-IV1",
        ),
        TopicConfig(
            "min.insync.replicas",
            None,
            INT,
            "One node holds every partition.",
            "min.insync.replicas",
            fixed="1",
        ),
        TopicConfig(
            "unclean.leader.election.enable",
            None,
            BOOLEAN,
            "One node: no leader election.",
            "unclean.leader.election.enable",
            fixed="false",
        ),
    )
}


def describe_topic(config: LogConfig, overrides: Mapping[str, Any]) -> list[tuple[TopicConfig, str, int]]:
    """(config, value, source) of every topic config, for a topic with these LogConfig overrides."""
    return [
        (each, each.value(config), DYNAMIC_TOPIC_CONFIG if each.field in overrides else DEFAULT_CONFIG)
        for each in TOPIC_CONFIGS.values()
    ]


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    name: str
    config_type: int
    value: Callable[[Any], str]  # from the broker
    documentation: str


BROKER_CONFIGS: Final = (
    BrokerConfig("broker.id", INT, lambda broker: "0", "The one node's id."),
    BrokerConfig(
        "advertised.listeners",
        STRING,
        lambda broker: ",".join(
            f"{listener.name}://{format_address(*listener.advertised)}"
            for listener in broker.config.all_listeners
        ),
        "Where clients connect, per listener (Metadata's node).",
    ),
    BrokerConfig("log.dirs", STRING, lambda broker: broker.manager.root, "The LogManager root."),
    BrokerConfig(
        "num.partitions",
        INT,
        lambda broker: str(broker.config.partitions),
        "Partitions of an auto-created topic.",
    ),
    BrokerConfig(
        "auto.create.topics.enable",
        BOOLEAN,
        lambda broker: _to_kafka(broker.config.auto_create_topics),
        "Whether a Metadata or Produce naming an unknown topic creates it.",
    ),
    BrokerConfig(
        "max.connections", INT, lambda broker: str(broker.config.max_connections), "Connections in all."
    ),
    BrokerConfig(
        "max.connections.per.ip",
        INT,
        lambda broker: str(broker.config.connections_per_ip),
        "Connections from one client address.",
    ),
    BrokerConfig(
        "group.min.session.timeout.ms",
        INT,
        lambda broker: str(broker.config.groups.min_session_timeout_ms),
        "The shortest session a consumer may ask for.",
    ),
    BrokerConfig(
        "group.initial.rebalance.delay.ms",
        INT,
        lambda broker: str(broker.config.groups.initial_rebalance_delay_ms),
        "How long an empty group's first rebalance waits for more members.",
    ),
    BrokerConfig(
        "offsets.retention.minutes",
        INT,
        lambda broker: str(broker.config.groups.offsets_retention_ms // 60_000),
        "An empty group's offsets are kept this long after its last commit.",
    ),
    BrokerConfig(
        "transaction.max.timeout.ms",
        INT,
        lambda broker: str(broker.config.transaction_max_timeout_ms),
        "The longest transaction timeout a producer may ask for.",
    ),
    BrokerConfig(
        "transactional.id.expiration.ms",
        INT,
        lambda broker: str(broker.config.transactional_id_expiration_ms),
        "An idle transactional id is forgotten after this.",
    ),
)


_DEFAULT_POLICY = LogConfig().cleanup_policy
# IncrementalAlterConfigs' operations.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_INT_FIELDS_WITH_NONE = {"retention_ms", "retention_bytes", "flush_messages", "flush_ms"}
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
_MAX_OF = {INT: 2**31 - 1, LONG: 2**63 - 1}
_STRING_CHOICES: Final[Mapping[str, tuple[str, ...]]] = {
    "timestamp_type": ("CreateTime", "LogAppendTime"),
    "compression_type": COMPRESSION_TYPES,
}
_FORMAT_VERSION = re.compile(r"[0-9]+(\.[0-9]+){1,3}(-IV[0-9]+)?")


class InvalidConfigError(ValueError):
    """A topic config this server cannot take (Kafka's INVALID_CONFIG): its name, value or operation."""


def parse_value(name: str, value: str | None) -> tuple[str | None, Any]:
    """The LogConfig field and value of Kafka's `name` = `value`; (None, None) for a fixed
    config set to the value it has here. InvalidConfigError otherwise."""
    config = TOPIC_CONFIGS.get(name)
    if config is None:
        raise InvalidConfigError(f"Unknown topic config name: {name}")
    if value is None:
        raise InvalidConfigError(f"{name} needs a value")
    if name == "message.format.version":
        if not _FORMAT_VERSION.fullmatch(value.strip()):
            raise InvalidConfigError(f"{name} is a Kafka version (3.0-IV1, 2.8, 0.10.0.0), not {value!r}")
        return None, None  # accepted and ignored, as Kafka 3 does
    if config.field is None:
        if value.strip().lower() != (config.fixed or "").lower():
            raise InvalidConfigError(f"{name} is {config.fixed} on this server and cannot be {value!r}")
        return None, None
    if config.config_type == LIST:
        return config.field, _cleanup_policy(name, value.split(","))
    if config.config_type == DOUBLE:
        return config.field, _ratio(name, value)
    if config.config_type == STRING:
        choices = _STRING_CHOICES[config.field]
        value = value.strip()  # (as Kafka reads string configs)
        if value not in choices:
            raise InvalidConfigError(f"{name} is one of {', '.join(choices)}, not {value!r}")
        return config.field, value
    if not _WHOLE_NUMBER.fullmatch(value.strip()):  # (int() would take "1_000" too; Kafka does not)
        raise InvalidConfigError(f"{name} is a whole number, not {value!r}")
    number = int(value.strip())
    if number > _MAX_OF[config.config_type]:
        kind = "an INT" if config.config_type == INT else "a LONG"
        raise InvalidConfigError(f"{name} is {kind}: at most {_MAX_OF[config.config_type]}, got {number}")
    if config.field in _INT_FIELDS_WITH_NONE and str(number) == config.unlimited:
        return config.field, None  # no limit: -1, or Long.MAX_VALUE for the flush settings
    if number < 0:
        unlimited = f" (or {config.unlimited}: no limit)" if config.field in _INT_FIELDS_WITH_NONE else ""
        raise InvalidConfigError(f"{name} must be at least 0{unlimited}, got {number}")
    return config.field, number


def _cleanup_policy(name: str, items: Iterable[str]) -> str:
    """cleanup.policy's LogConfig value for Kafka's list of policies (either order)."""
    policies = {item.strip() for item in items if item.strip()}
    if not policies or not policies <= {"compact", "delete"}:
        raise InvalidConfigError(
            f"{name} is a list of compact and delete, not {','.join(sorted(policies))!r}"
        )
    return ",".join(sorted(policies))  # "compact", "delete" or "compact,delete"


def _ratio(name: str, value: str) -> float:
    try:
        ratio = float(value.strip())
    except ValueError:
        raise InvalidConfigError(f"{name} is a number between 0 and 1, not {value!r}") from None
    if not 0.0 <= ratio <= 1.0:  # (NaN too)
        raise InvalidConfigError(f"{name} is a number between 0 and 1, not {value!r}")
    return ratio


def overrides_of(configs: Iterable[tuple[str, str | None]]) -> dict[str, Any]:
    """LogConfig overrides for Kafka (name, value) pairs (CreateTopics, AlterConfigs)."""
    overrides: dict[str, Any] = {}
    for name, value in configs:
        field, parsed = parse_value(name, value)
        if field is not None:
            overrides[field] = parsed
    return overrides


def altered(current: Mapping[str, Any], operations: Iterable[tuple[str, int, str | None]]) -> dict[str, Any]:
    """`current` overrides after IncrementalAlterConfigs' (name, operation, value) steps."""
    overrides = dict(current)
    for name, operation, value in operations:
        config = TOPIC_CONFIGS.get(name)
        if config is None:
            raise InvalidConfigError(f"Unknown topic config name: {name}")
        if operation == SET:
            field, parsed = parse_value(name, value)
            if field is not None:
                overrides[field] = parsed
        elif operation == DELETE:
            if config.field is not None:
                overrides.pop(config.field, None)
        elif operation in (APPEND, SUBTRACT):
            if config.config_type != LIST or config.field is None:
                raise InvalidConfigError(f"{name} is not a list: it cannot be appended to or subtracted from")
            now = set(str(overrides.get(config.field, _DEFAULT_POLICY)).split(","))
            given = {item.strip() for item in (value or "").split(",")}
            overrides[config.field] = _cleanup_policy(
                name, now | given if operation == APPEND else now - given
            )
        else:
            raise InvalidConfigError(f"unknown config operation {operation} for {name}")
    return overrides


def checked(base: LogConfig, overrides: Mapping[str, Any]) -> LogConfig:
    """`base` with `overrides`, each value checked on its own first so that a refusal names
    the Kafka config (InvalidConfigError), then together."""
    names = {config.field: config.name for config in TOPIC_CONFIGS.values() if config.field is not None}
    for field_name, value in overrides.items():
        try:
            dataclasses.replace(base, **{field_name: value})
        except ValueError as exc:
            raise InvalidConfigError(f"{names.get(field_name, field_name)}={value}: {exc}") from None
    try:
        return dataclasses.replace(base, **overrides)
    except ValueError as exc:
        raise InvalidConfigError(str(exc)) from None
