"""The operator's group APIs on the wire: ListGroups (16), DescribeGroups (15), DeleteGroups
(42) and OffsetDelete (47), translated to and from oncelog.server.group_admin.

Versions differ only in fields (`build` keeps the ones a version has): ListGroups v4 adds
the states filter and each group's state, v5 the types filter and type; DescribeGroups
v3 adds authorized operations, v4 members' group instance ids.

Authorization, as Kafka's: ListGroups lists every group to a principal with Describe on
the cluster, else only the groups it may Describe; DescribeGroups needs Describe on each
group, DeleteGroups Delete on each (GROUP_AUTHORIZATION_FAILED in that group's entry);
OffsetDelete needs Delete on the group (GROUP_AUTHORIZATION_FAILED at the top) and Read
on each topic (TOPIC_AUTHORIZATION_FAILED per partition).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.server import group_admin
from oncelog.server.acls import GROUP_OPERATIONS, Operation, ResourceType
from oncelog.server.broker import Broker
from oncelog.server.codec import NO_THROTTLE, OPERATIONS_OMITTED, Request, build, nested, response_type


async def handle_list_groups(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    listed = group_admin.list_groups(
        broker.groups, getattr(body, "states_filter", ()), getattr(body, "types_filter", ())
    )
    group_type = nested(response, "groups")
    access = broker.access(request)
    every = access.cluster(Operation.DESCRIBE)
    groups = tuple(
        build(
            group_type,
            group_id=each.group_id,
            protocol_type=each.protocol_type,
            group_state=each.state,
            group_type=each.group_type,
        )
        for each in listed
        if every or access.group(Operation.DESCRIBE, each.group_id)
    )
    return build(response, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, groups=groups)


async def handle_describe_groups(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    group_type = nested(response, "groups")
    member_type = nested(group_type, "members")
    access = broker.access(request)
    with_operations = getattr(body, "include_authorized_operations", False)
    described = []
    for group_id in body.groups:
        if not access.group(Operation.DESCRIBE, group_id):
            described.append(_undescribed(group_type, group_id))
            continue
        operations = (
            access.operations(ResourceType.GROUP, group_id, GROUP_OPERATIONS)
            if with_operations
            else OPERATIONS_OMITTED
        )
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


def _undescribed(group_type: Any, group_id: str) -> Any:
    return build(
        group_type,
        error_code=ErrorCode.group_authorization_failed,
        group_id=group_id,
        group_state="",
        protocol_type="",
        protocol_data="",
        members=(),
        authorized_operations=OPERATIONS_OMITTED,
    )


async def handle_delete_groups(broker: Broker, request: Request) -> Any:
    response = response_type(request.api_key, request.api_version)
    access = broker.access(request)
    named = list(dict.fromkeys(request.body.groups_names))
    allowed = [group_id for group_id in named if access.group(Operation.DELETE, group_id)]
    for group_id in allowed:
        # After the offsets of a transaction whose commit was answered, as OffsetCommit waits.
        await broker.transactions.offsets_settled(group_id)
    answers = group_admin.delete_groups(broker.groups, allowed)
    result_type = nested(response, "results")
    results = tuple(
        build(
            result_type,
            group_id=group_id,
            error_code=answers.get(group_id, ErrorCode.group_authorization_failed),
        )
        for group_id in named
    )
    return build(response, throttle_time=NO_THROTTLE, results=results)


async def handle_offset_delete(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    access = broker.access(request)
    if not access.group(Operation.DELETE, body.group_id):
        code = ErrorCode.group_authorization_failed
        return build(response, error_code=code, throttle_time=NO_THROTTLE, topics=())
    # After the offsets of a transaction whose commit was answered, as OffsetCommit waits.
    await broker.transactions.offsets_settled(body.group_id)
    partitions: dict[tuple[str, int], ErrorCode] = {}
    for topic in body.topics:
        readable = access.topic(Operation.READ, topic.name)
        for each in topic.partitions:
            if not readable:
                code = ErrorCode.topic_authorization_failed
            elif broker.has_partition(topic.name, each.partition_index):
                code = ErrorCode.none
            else:
                code = ErrorCode.unknown_topic_or_partition
            partitions[(topic.name, each.partition_index)] = code
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
