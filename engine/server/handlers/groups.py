"""The group APIs on the wire: JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13),
OffsetCommit (8) and OffsetFetch (9), translated to and from the GroupCoordinator.

Versions differ only in fields: `build` keeps the ones a version has. LeaveGroup v3+
names many members (each answered on its own); OffsetFetch v8+ names many groups.

Authorization, as Kafka's: the membership APIs and OffsetCommit need Read on the group
(GROUP_AUTHORIZATION_FAILED: at the top, or on every partition of a commit, which then
commits nothing); a commit's topics need Read (TOPIC_AUTHORIZATION_FAILED per partition,
the others committed). OffsetFetch needs Describe on the group, and lists a topic only if
the principal may Describe it: one asked for by name is TOPIC_AUTHORIZATION_FAILED, one
among "every committed partition" is left out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.server.acls import Operation
from oncelog.server.authorization import Access
from oncelog.server.broker import Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, milliseconds, nested, response_type
from oncelog.server.group_state import CommittedOffset

log = logging.getLogger("oncelog.server")
# JoinGroup v4+ hands a new member its id with MEMBER_ID_REQUIRED and expects it back (KIP-394).
_MEMBER_ID_REQUIRED_FROM = 4


def may_read_group(broker: Broker, request: Request, group_id: str) -> bool:
    return broker.access(request).group(Operation.READ, group_id)


async def handle_join_group(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    if not may_read_group(broker, request, body.group_id):
        return build(
            response,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.group_authorization_failed,
            generation_id=-1,
            protocol_type=None,
            protocol_name=None if request.api_version >= 7 else "",
            leader="",
            member_id="",
            members=(),
        )
    session_ms = milliseconds(body.session_timeout)
    # v0 has no rebalance timeout: the session timeout stands in for it, as in Kafka.
    rebalance_ms = milliseconds(getattr(body, "rebalance_timeout", body.session_timeout))
    result = await broker.groups.join(
        body.group_id,
        body.member_id,
        getattr(body, "group_instance_id", None),
        request.client_id or "",
        session_ms,
        rebalance_ms,
        body.protocol_type,
        [(protocol.name, protocol.metadata) for protocol in body.protocols],
        member_id_required=request.api_version >= _MEMBER_ID_REQUIRED_FROM,
        client_host=request.client_host,
    )
    member_type = nested(response, "members")
    return build(
        response,
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        generation_id=result.generation,
        protocol_type=result.protocol_type,
        # Before v7 a null protocol name is written as "" (Kafka's rule).
        protocol_name=result.protocol_name if request.api_version >= 7 else (result.protocol_name or ""),
        leader=result.leader,
        member_id=result.member_id,
        members=tuple(
            build(member_type, member_id=member_id, group_instance_id=instance_id, metadata=metadata)
            for member_id, instance_id, metadata in result.members
        ),
    )


async def handle_sync_group(broker: Broker, request: Request) -> Any:
    body = request.body
    if not may_read_group(broker, request, body.group_id):
        return build(
            response_type(request.api_key, request.api_version),
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.group_authorization_failed,
            protocol_type=None,
            protocol_name=None,
            assignment=b"",
        )
    result = await broker.groups.sync(
        body.group_id,
        body.generation_id,
        body.member_id,
        getattr(body, "group_instance_id", None),
        getattr(body, "protocol_type", None),
        getattr(body, "protocol_name", None),
        [(each.member_id, each.assignment) for each in body.assignments],
    )
    return build(
        response_type(request.api_key, request.api_version),
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


async def handle_heartbeat(broker: Broker, request: Request) -> Any:
    body = request.body
    if not may_read_group(broker, request, body.group_id):
        code = ErrorCode.group_authorization_failed
    else:
        code = broker.groups.heartbeat(
            body.group_id, body.generation_id, body.member_id, getattr(body, "group_instance_id", None)
        )
    return build(
        response_type(request.api_key, request.api_version), throttle_time=NO_THROTTLE, error_code=code
    )


async def handle_leave_group(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    if not may_read_group(broker, request, body.group_id):
        code = ErrorCode.group_authorization_failed
        return build(response, throttle_time=NO_THROTTLE, error_code=code, members=())
    if not hasattr(body, "members"):  # v0-2: one member
        code = broker.groups.leave(body.group_id, body.member_id, None)
        return build(response, throttle_time=NO_THROTTLE, error_code=code)
    member_type = nested(response, "members")
    answers = []
    for each in body.members:
        code = broker.groups.leave(body.group_id, each.member_id, each.group_instance_id)
        answers.append(
            build(
                member_type,
                member_id=each.member_id,
                group_instance_id=each.group_instance_id,
                error_code=code,
            )
        )
    return build(response, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, members=tuple(answers))


def offsets_of(
    broker: Broker, access: Access, topics: Any
) -> tuple[list[tuple[str, int, CommittedOffset]], dict[tuple[str, int], ErrorCode]]:
    """The offsets a commit request carries, and the partitions refused on their own.

    A topic the principal may not Read gets TOPIC_AUTHORIZATION_FAILED, a partition that
    does not exist UNKNOWN_TOPIC_OR_PARTITION and metadata past offset.metadata.max.bytes
    OFFSET_METADATA_TOO_LARGE; the others are committed (Kafka's rule).
    """
    max_metadata_bytes = broker.groups.limits.offset_metadata_max_bytes
    now_ms = broker.groups.now_ms()
    accepted: list[tuple[str, int, CommittedOffset]] = []
    refused: dict[tuple[str, int], ErrorCode] = {}
    for topic in topics:
        for each in topic.partitions:
            metadata = each.committed_metadata or ""
            if not access.topic(Operation.READ, topic.name):
                refused[(topic.name, each.partition_index)] = ErrorCode.topic_authorization_failed
            elif not broker.has_partition(topic.name, each.partition_index):
                refused[(topic.name, each.partition_index)] = ErrorCode.unknown_topic_or_partition
            elif len(metadata.encode("utf-8", "surrogatepass")) > max_metadata_bytes:
                refused[(topic.name, each.partition_index)] = ErrorCode.offset_metadata_too_large
            else:
                epoch = getattr(each, "committed_leader_epoch", -1)
                committed = CommittedOffset(each.committed_offset, epoch, metadata, now_ms)
                accepted.append((topic.name, each.partition_index, committed))
    return accepted, refused


def partition_answers(
    response: Any, topics: Any, code: ErrorCode, refused: dict[tuple[str, int], ErrorCode]
) -> Any:
    """Per-partition answers to a commit: `code`, or the partition's own refusal."""
    topic_type = nested(response, "topics")
    partition_type = nested(topic_type, "partitions")
    return tuple(
        build(
            topic_type,
            name=topic.name,
            partitions=tuple(
                build(
                    partition_type,
                    partition_index=each.partition_index,
                    error_code=refused.get((topic.name, each.partition_index), code),
                )
                for each in topic.partitions
            ),
        )
        for topic in topics
    )


async def handle_offset_commit(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    generation = getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
    access = broker.access(request)
    if not access.group(Operation.READ, body.group_id):
        code = ErrorCode.group_authorization_failed
        return build(
            response, throttle_time=NO_THROTTLE, topics=partition_answers(response, body.topics, code, {})
        )
    code = broker.groups.check_commit(
        body.group_id, generation, body.member_id, getattr(body, "group_instance_id", None)
    )
    if code == ErrorCode.none:
        # After the offsets of a transaction whose commit was answered, as they were sent.
        await broker.transactions.offsets_settled(body.group_id)
    offsets, refused = offsets_of(broker, access, body.topics)
    if code == ErrorCode.none and offsets:
        try:
            broker.groups.commit(body.group_id, offsets)
        except OncelogError as exc:  # the store could not take it: nothing committed, retriable
            log.warning("offset commit of group %r failed: %s", body.group_id, exc)
            code = ErrorCode.coordinator_not_available
    return build(
        response, throttle_time=NO_THROTTLE, topics=partition_answers(response, body.topics, code, refused)
    )


async def handle_offset_fetch(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    stable = getattr(body, "require_stable", False)
    # Offsets a commit just answered are the group's once its markers are written: a
    # consumer that fetches them right after commit_transaction returned reads them.
    one_group = not hasattr(body, "groups")  # v1-7
    for group_id in [body.group_id] if one_group else [group.group_id for group in body.groups]:
        await broker.transactions.offsets_settled(group_id)
    access = broker.access(request)
    if one_group:
        fetch = _OffsetFetch(broker, access, body.group_id, stable)
        topics = fetch.answers(body.topics, nested(response, "topics"))
        return build(response, throttle_time=NO_THROTTLE, topics=topics, error_code=fetch.group_code)
    group_type = nested(response, "groups")
    groups = []
    for group in body.groups:
        fetch = _OffsetFetch(broker, access, group.group_id, stable)
        topics = fetch.answers(group.topics, nested(group_type, "topics"))
        groups.append(build(group_type, group_id=group.group_id, topics=topics, error_code=fetch.group_code))
    return build(response, throttle_time=NO_THROTTLE, groups=tuple(groups))


class _OffsetFetch:
    """One group's answer to OffsetFetch; without Describe on the group, its error (at the top,
    or in each partition asked for where the version has no error at the top: v1)."""

    def __init__(self, broker: Broker, access: Access, group_id: str, stable: bool):
        self.broker = broker
        self.access = access
        self.group_id = group_id
        self.stable = stable
        allowed = access.group(Operation.DESCRIBE, group_id)
        self.group_code = ErrorCode.none if allowed else ErrorCode.group_authorization_failed

    def answers(self, topics: Any, topic_type: Any) -> Any:
        """The committed offsets of `topics` (every committed partition if None)."""
        if self.group_code != ErrorCode.none:
            wanted = {topic.name: list(topic.partition_indexes) for topic in topics or ()}
            return _offset_answers(topic_type, wanted, lambda name, partition: (None, self.group_code))
        committed = self.broker.groups.committed(self.group_id)
        wanted = {}
        if topics is None:
            for topic, partition in sorted(committed):
                if self.access.topic(Operation.DESCRIBE, topic):  # (left out silently, as Kafka does)
                    wanted.setdefault(topic, []).append(partition)
        else:
            for topic in topics:
                wanted.setdefault(topic.name, []).extend(topic.partition_indexes)
        return _offset_answers(
            topic_type, wanted, lambda name, partition: self._one(committed, name, partition)
        )

    def _one(
        self, committed: dict[tuple[str, int], CommittedOffset], name: str, partition: int
    ) -> tuple[CommittedOffset | None, ErrorCode]:
        if not self.access.topic(Operation.DESCRIBE, name):
            return None, ErrorCode.topic_authorization_failed
        if self.stable and self.broker.groups.pending_transactional(self.group_id, name, partition):
            return None, ErrorCode.unstable_offset_commit
        return committed.get((name, partition)), ErrorCode.none


def _offset_answers(
    topic_type: Any,
    wanted: dict[str, list[int]],
    outcome: Callable[[str, int], tuple[CommittedOffset | None, ErrorCode]],
) -> Any:
    partition_type = nested(topic_type, "partitions")
    answers = []
    for name, partitions in wanted.items():
        entries = []
        for partition in partitions:
            found, code = outcome(name, partition)
            entries.append(
                build(
                    partition_type,
                    partition_index=partition,
                    committed_offset=found.offset if found else -1,
                    committed_leader_epoch=found.leader_epoch if found else -1,
                    metadata=found.metadata if found else "",
                    error_code=code,
                )
            )
        answers.append(build(topic_type, name=name, partitions=tuple(entries)))
    return tuple(answers)
