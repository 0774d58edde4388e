"""`oncelog groups`: list and describe the consumer groups of a running server, and reset
a group's offsets (dry run unless --execute), over the Kafka protocol (ListGroups,
DescribeGroups, OffsetFetch, ListOffsets, OffsetCommit): what `kafka-consumer-groups`
does, without Java."""

from __future__ import annotations

import argparse
import datetime
from typing import TextIO

from kafka import TopicPartition
from kafka.admin import KafkaAdminClient, OffsetSpec, OffsetTimestamp
from kafka.structs import OffsetAndMetadata

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK, PROG
from oncelog.cli.topics import run_admin


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return run_admin("groups", _ACTIONS, args, out, err)


def _list(admin: KafkaAdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    for group in sorted(admin.list_groups(), key=lambda g: g["group_id"]):
        print(
            f"{group['group_id']}\t{group.get('group_state', '?')}\t{group['protocol_type'] or '-'}", file=out
        )
    return EXIT_OK


def _describe(admin: KafkaAdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    described = admin.describe_groups([args.group])[args.group]
    print(f"group {args.group}: {described['group_state']}", file=out)
    for member in described["members"]:
        assignment = member.get("member_assignment") or {}
        owned = [
            f"{each['topic']}-{p}"
            for each in assignment.get("assigned_partitions", [])
            for p in each["partitions"]
        ]
        who = f"{member['member_id']} ({member['client_id']}, {member['client_host']})"
        print(f"  member {who}: {', '.join(owned) or '-'}", file=out)
    committed = admin.list_group_offsets({args.group: None})[args.group]
    if committed:
        ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in committed})
        for tp, meta in sorted(committed.items()):
            end, lag = ends[tp].offset, max(ends[tp].offset - meta.offset, 0)
            print(f"  {tp.topic}-{tp.partition}: committed {meta.offset}, end {end}, lag {lag}", file=out)
    return EXIT_OK


def _reset(admin: KafkaAdminClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    committed = admin.list_group_offsets({args.group: None})[args.group]
    partitions = _partitions(admin, args.topic) if args.topic else sorted(committed)
    if not partitions:
        print(f"{PROG} groups reset-offsets: {args.group} has no offsets; name --topic", file=err)
        return EXIT_BAD_INPUT
    targets = _targets(admin, args, partitions)
    print(
        f"group {args.group}: {'resetting' if args.execute else 'would reset (dry run; --execute applies)'}",
        file=out,
    )
    for tp in partitions:
        before = committed[tp].offset if tp in committed else "-"
        print(f"  {tp.topic}-{tp.partition}: {before} -> {targets[tp]}", file=out)
    if not args.execute:
        return EXIT_OK
    state = admin.describe_groups([args.group])[args.group]["group_state"]
    if state not in ("Empty", "Dead"):
        print(f"{PROG} groups reset-offsets: {args.group} is {state}: stop its consumers first", file=err)
        return EXIT_BAD_INPUT
    answers = admin.alter_group_offsets(
        args.group, {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in targets.items()}
    )
    refused = {tp: error for tp, error in answers.items() if error.__name__ != "NoError"}
    for tp, error in sorted(refused.items()):
        print(f"{PROG} groups reset-offsets: {tp.topic}-{tp.partition}: {error.__name__}", file=err)
    return EXIT_BAD_INPUT if refused else EXIT_OK


def _partitions(admin: KafkaAdminClient, topics: list[str]) -> list[TopicPartition]:
    found: list[TopicPartition] = []
    for topic in admin.describe_topics(topics):
        if topic["error_code"]:
            raise ValueError(f"no topic {topic['name']!r} (error {topic['error_code']})")
        found.extend(TopicPartition(topic["name"], p["partition_index"]) for p in topic["partitions"])
    return sorted(found)


def _targets(
    admin: KafkaAdminClient, args: argparse.Namespace, partitions: list[TopicPartition]
) -> dict[TopicPartition, int]:
    """Each partition's new offset, resolved by the server as the reset will be."""
    earliest = {
        tp: r.offset
        for tp, r in admin.list_partition_offsets({tp: OffsetSpec.EARLIEST for tp in partitions}).items()
    }
    latest = {
        tp: r.offset
        for tp, r in admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in partitions}).items()
    }
    if args.to_earliest:
        return earliest
    if args.to_latest:
        return latest
    if args.to_offset is not None:
        return {tp: min(max(args.to_offset, earliest[tp]), latest[tp]) for tp in partitions}
    moment = datetime.datetime.fromisoformat(args.to_datetime.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"--to-datetime needs a time zone (Z or +HH:MM), got {args.to_datetime!r}")
    at_ms = int(moment.timestamp() * 1000)
    found = admin.list_partition_offsets({tp: OffsetTimestamp(at_ms) for tp in partitions})
    # No record at or after the time: the end, as Kafka's tools resolve it.
    return {tp: latest[tp] if found[tp].offset < 0 else found[tp].offset for tp in partitions}


_ACTIONS = {"list": _list, "describe": _describe, "reset-offsets": _reset}
