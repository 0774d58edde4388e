"""Metadata (API 3, v0-9): the one node, and every topic asked for with its partitions.

One node (id 0) leads every partition. Leader epochs are reported as -1 (unknown),
so clients skip the epoch validation (KIP-320) that a single node with no leader
changes has no use for.

Kafka's internal topics: Metadata marks them is_internal and describes one only if
the root holds it; named and absent, it is INVALID_TOPIC_EXCEPTION (not a name a
client topic may have here, so librdkafka fails a producer's messages at once instead
of waiting topic.metadata.propagation.max.ms for it to appear), and it is never
auto-created.

Authorization, as Kafka's: a listing of every topic names only those the principal may
Describe; a topic asked for by name that it may not Describe is TOPIC_AUTHORIZATION_FAILED,
whether it exists or not. Auto-creation needs Create on the cluster or the topic; a
missing topic the principal may describe but not create is TOPIC_AUTHORIZATION_FAILED.
Asked for (v8+), each topic's and the cluster's authorized operations are the principal's.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.layout import InvalidTopicError
from oncelog.server.acls import CLUSTER_NAME, CLUSTER_OPERATIONS, TOPIC_OPERATIONS, Operation, ResourceType
from oncelog.server.authorization import Access
from oncelog.server.broker import NODE_ID, Broker, is_internal_topic
from oncelog.server.codec import NO_THROTTLE, OPERATIONS_OMITTED, Request, build, nested, response_type
from oncelog.server.errors import InternalTopicError, InvalidPartitionsError, error_code_for


async def handle_metadata(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    broker_type = nested(response, "brokers")
    topic_type = nested(response, "topics")
    partition_type = nested(topic_type, "partitions")
    host, port = broker.advertised_for(request.session)
    # v0 asks for every topic with an empty list; v1+ with null.
    access = broker.access(request)
    if body.topics is None or (request.api_version == 0 and not body.topics):
        names = [name for name in broker.topics() if access.topic(Operation.DESCRIBE, name)]
        auto_create = False
    else:
        names = [wanted.name for wanted in body.topics]
        auto_create = getattr(body, "allow_auto_topic_creation", True)
    topics = []
    for name in names:
        count, code = await _partitions(broker, access, name, auto_create)
        partitions = tuple(
            build(
                partition_type,
                error_code=ErrorCode.none,
                partition_index=index,
                leader_id=NODE_ID,
                leader_epoch=-1,
                replica_nodes=(NODE_ID,),
                isr_nodes=(NODE_ID,),
                offline_replicas=(),
            )
            for index in range(count or 0)
        )
        operations = OPERATIONS_OMITTED
        if (
            getattr(body, "include_topic_authorized_operations", False)
            and code != ErrorCode.topic_authorization_failed
        ):
            operations = access.operations(ResourceType.TOPIC, name, TOPIC_OPERATIONS)
        topics.append(
            build(
                topic_type,
                error_code=code,
                name=name,
                is_internal=is_internal_topic(name),
                partitions=partitions,
                topic_authorized_operations=operations,
            )
        )
    return build(
        response,
        throttle_time=NO_THROTTLE,
        brokers=(build(broker_type, node_id=NODE_ID, host=host, port=port, rack=None),),
        cluster_id=broker.cluster_id,
        controller_id=NODE_ID,
        topics=tuple(topics),
        cluster_authorized_operations=access.operations(
            ResourceType.CLUSTER, CLUSTER_NAME, CLUSTER_OPERATIONS
        )
        if getattr(body, "include_cluster_authorized_operations", False)
        else OPERATIONS_OMITTED,
    )


async def _partitions(
    broker: Broker, access: Access, name: str, auto_create: bool
) -> tuple[int | None, ErrorCode]:
    """The topic's partition count (None: none to list) and its error code."""
    if not access.topic(Operation.DESCRIBE, name):
        return None, ErrorCode.topic_authorization_failed
    may_create = auto_create and access.may_create_topic(name)
    try:
        count = await broker.partition_count(name, auto_create=may_create)
    except (InvalidTopicError, InternalTopicError, OncelogError, InvalidPartitionsError) as exc:
        return None, error_code_for(exc)  # a creation that failed is logged where it failed
    if count is not None:
        return count, ErrorCode.none
    if auto_create and not may_create and broker.config.auto_create_topics:
        return None, ErrorCode.topic_authorization_failed  # it would be created, but not for this principal
    return None, ErrorCode.unknown_topic_or_partition
