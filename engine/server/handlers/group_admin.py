"""The operator's group APIs on the wire: ListGroups (16), DescribeGroups (15), DeleteGroups
(42) and OffsetDelete (47), translated to and from oncelog.server.group_admin.

Versions differ only in fields (`build` keeps the ones a version has): ListGroups v4 adds
the states filter and each group's state, v5 the types filter and type; DescribeGroups
v3 adds authorized operations, v4 members' group instance ids.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.server import group_admin
from oncelog.server.broker import Broker
from oncelog.server.codec import NO_THROTTLE, OPERATIONS_OMITTED, Request, build, nested, response_type

# Asked for: every operation Kafka defines on a group (READ 3, DELETE 6, DESCRIBE 8), all
# allowed while the server has no ACLs.
GROUP_OPERATIONS: Final = (1 << 3) | (1 << 6) | (1 << 8)


async def handle_list_groups(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    listed = group_admin.list_groups(
        broker.groups, getattr(body, "states_filter", ()), getattr(body, "types_filter", ())
    )
    group_type = nested(response, "groups")
    groups = tuple(
        build(
            group_type,
            group_id=each.group_id,
            protocol_type=each.protocol_type,
            group_state=each.state,
            group_type=each.group_type,
        )
        for each in listed
    )
    return build(response, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, groups=groups)


async def handle_describe_groups(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    group_type = nested(response, "groups")
    member_type = nested(group_type, "members")
    operations = (
        GROUP_OPERATIONS if getattr(body, "include_authorized_operations", False) else OPERATIONS_OMITTED
    )
    described = []
    for group_id in body.groups:
        summary = group_admin.describe_group(broker.groups, group_id)
        members = tuple(
            build(
                member_type,
                member_id=member.member_id,
                group_instance_id=member.instance_id,
                client_id=member.client_id,
                client_host=member.client_host,
                member_metadata=member.metadata,
                member_assignment=member.assignment,
            )
            for member in summary.members
        )
        described.append(
            build(
                group_type,
                error_code=ErrorCode.none,
                group_id=group_id,
                group_state=summary.state,
                protocol_type=summary.protocol_type,
                protocol_data=summary.protocol_name,
                members=members,
                authorized_operations=operations,
            )
        )
    return build(response, throttle_time=NO_THROTTLE, groups=tuple(described))


async def handle_delete_groups(broker: Broker, request: Request) -> Any:
    response = response_type(request.api_key, request.api_version)
    for group_id in request.body.groups_names:
        # After the offsets of a transaction whose commit was answered, as OffsetCommit waits.
        await broker.transactions.offsets_settled(group_id)
    answers = group_admin.delete_groups(broker.groups, list(request.body.groups_names))
    result_type = nested(response, "results")
    results = tuple(
        build(result_type, group_id=group_id, error_code=code) for group_id, code in answers.items()
    )
    return build(response, throttle_time=NO_THROTTLE, results=results)


async def handle_offset_delete(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    # After the offsets of a transaction whose commit was answered, as OffsetCommit waits.
    await broker.transactions.offsets_settled(body.group_id)
    partitions: dict[tuple[str, int], ErrorCode] = {}
    for topic in body.topics:
        for each in topic.partitions:
            known = broker.has_partition(topic.name, each.partition_index)
            partitions[(topic.name, each.partition_index)] = (
                ErrorCode.none if known else ErrorCode.unknown_topic_or_partition
            )
    existing = [key for key, code in partitions.items() if code == ErrorCode.none]
    group_error, answers = group_admin.delete_offsets(broker.groups, body.group_id, existing)
    if group_error != ErrorCode.none:
        return build(response, error_code=group_error, throttle_time=NO_THROTTLE, topics=())
    partitions.update(answers)
    topic_type = nested(response, "topics")
    partition_type = nested(topic_type, "partitions")
    by_topic: dict[str, list[Any]] = {}
    for (name, partition), code in partitions.items():
        by_topic.setdefault(name, []).append(
            build(partition_type, partition_index=partition, error_code=code)
        )
    topics = tuple(build(topic_type, name=name, partitions=tuple(parts)) for name, parts in by_topic.items())
    return build(response, error_code=ErrorCode.none, throttle_time=NO_THROTTLE, topics=topics)
