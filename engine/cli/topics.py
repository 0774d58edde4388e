"""`oncelog topics`: list, describe, create, delete and configure the topics of a running
server (`oncelog serve`, or any Kafka broker) over the Kafka wire protocol, with the admin
APIs every Kafka tool uses: the operator's weekly tasks without Java tools."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from kafka import TopicPartition
from kafka.admin import (
    ConfigResource,
    ConfigResourceType,
    KafkaAdminClient,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)
from kafka.errors import KafkaError

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK, PROG


def connect(args: argparse.Namespace) -> KafkaAdminClient:
    timeout_ms = max(int(args.timeout_s * 1000), 1)
    return KafkaAdminClient(
        bootstrap_servers=args.bootstrap,
        client_id=f"{PROG}-cli",
        request_timeout_ms=timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
    )


def parse_configs(pairs: list[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--config takes NAME=VALUE, got {pair!r}")
        configs[name] = value
    return configs


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return run_admin("topics", _ACTIONS, args, out, err)


Action = Callable[[KafkaAdminClient, argparse.Namespace, TextIO, TextIO], int]


def run_admin(
    command: str, actions: Mapping[str, Action], args: argparse.Namespace, out: TextIO, err: TextIO
) -> int:
    """Connect, run the action, close: a refusal or an unreachable server is one line and status 2."""
    try:
        admin = connect(args)
    except KafkaError as exc:
        print(f"{PROG} {command}: cannot reach {args.bootstrap}: {exc}", file=err)
        return EXIT_BAD_INPUT
    try:
        return actions[args.action](admin, args, out, err)
    except (KafkaError, ValueError) as exc:
        print(f"{PROG} {command} {args.action}: {exc}", file=err)
        return EXIT_BAD_INPUT
    finally:
        admin.close()


def _list(admin: KafkaAdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    for topic in sorted(admin.describe_topics(), key=lambda t: t["name"]):
        print(f"{topic['name']}\t{len(topic['partitions'])} partitions", file=out)
    return EXIT_OK


def _describe(admin: KafkaAdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    (topic,) = admin.describe_topics([args.topic])
    if topic["error_code"]:
        print(f"{PROG} topics describe: {args.topic}: error {topic['error_code']}", file=err)
        return EXIT_BAD_INPUT
    partitions = sorted(p["partition_index"] for p in topic["partitions"])
    print(f"topic {args.topic}: {len(partitions)} partitions", file=out)
    ends = admin.list_partition_offsets({_tp(args.topic, p): OffsetSpec.LATEST for p in partitions})
    starts = admin.list_partition_offsets({_tp(args.topic, p): OffsetSpec.EARLIEST for p in partitions})
    for p in partitions:
        start, end = starts[_tp(args.topic, p)].offset, ends[_tp(args.topic, p)].offset
        print(f"  partition {p}: offsets {start}..{end}", file=out)
    described = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, args.topic)], config_filter="all"
    )
    print("configs (* set on this topic):", file=out)
    for name, entry in sorted(described["topic"][args.topic].items()):
        dynamic = entry["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        print(f"  {'*' if dynamic else ' '} {name}={entry['value']}", file=out)
    return EXIT_OK


def _create(admin: KafkaAdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    topic = NewTopic(args.topic, args.partitions, 1, topic_configs=parse_configs(args.config))
    admin.create_topics([topic])
    print(f"created {args.topic} with {args.partitions} partitions", file=out)
    return EXIT_OK


def _delete(admin: KafkaAdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    admin.delete_topics(args.topics)
    for topic in args.topics:
        print(f"deleted {topic}", file=out)
    return EXIT_OK


def _alter(admin: KafkaAdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    changes: dict[str, Any] = {name: ("SET", value) for name, value in parse_configs(args.config).items()}
    changes.update({name: ("DELETE", None) for name in args.delete_config})
    if changes:
        resource = ConfigResource(ConfigResourceType.TOPIC, args.topic, configs=changes)
        answers = admin.alter_configs([resource], incremental=True, raise_on_unknown=False)
        answer = answers["topic"][args.topic]
        if answer != "OK":
            print(f"{PROG} topics alter: {args.topic}: {answer}", file=err)
            return EXIT_BAD_INPUT
        print(f"altered {args.topic}: {', '.join(sorted(changes))}", file=out)
    if args.partitions is not None:
        admin.create_partitions({args.topic: NewPartitions(total_count=args.partitions)})
        print(f"{args.topic} now has {args.partitions} partitions", file=out)
    return EXIT_OK


def _tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic, partition)


_ACTIONS = {"list": _list, "describe": _describe, "create": _create, "delete": _delete, "alter": _alter}
