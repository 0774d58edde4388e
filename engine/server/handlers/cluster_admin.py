"""The operator's record and cluster APIs: DeleteRecords (21), DescribeCluster (60) and
DescribeLogDirs (35).

- DeleteRecords moves each partition's log start offset durably (`Log.delete_records`, in
  a worker thread: a store commit and segment deletions) and answers the new low
  watermark. Offset -1 means the high watermark, as in Kafka; past it is
  OFFSET_OUT_OF_RANGE, and Kafka's internal topics are not a client's to cut.
- DescribeCluster names the one node, which is also the controller.
- DescribeLogDirs reports the root as the one log directory, each partition's size from
  its segment files, and the filesystem's total and usable bytes (v4+).

Authorization, as Kafka's: DeleteRecords needs Delete on each topic (TOPIC_AUTHORIZATION_FAILED
per partition); DescribeLogDirs Describe on the cluster (CLUSTER_AUTHORIZATION_FAILED at the
top from v3, an empty answer before); DescribeCluster nothing, and reports the cluster
operations the principal has when asked.
"""

from __future__ import annotations

import os
from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.errors import OffsetOutOfRangeError, OncelogError
from oncelog.layout import TopicPartition
from oncelog.server.acls import CLUSTER_NAME, CLUSTER_OPERATIONS, Operation, ResourceType
from oncelog.server.broker import NODE_ID, Broker
from oncelog.server.codec import NO_THROTTLE, OPERATIONS_OMITTED, Request, build, nested, response_type
from oncelog.server.errors import InternalTopicError, error_code_for

# DeleteRecords' offset meaning "up to the high watermark".
HIGH_WATERMARK: Final = -1
# DescribeCluster's endpoint types (KIP-919).
BROKER_ENDPOINTS, CONTROLLER_ENDPOINTS = 1, 2


async def handle_delete_records(broker: Broker, request: Request) -> Any:
    wanted = [
        (TopicPartition(topic.name, each.partition_index), each.offset)
        for topic in request.body.topics
        for each in topic.partitions
    ]
    access = broker.access(request)
    answers = await broker.in_thread(
        lambda: [
            _delete_records(broker, tp, offset)
            if access.topic(Operation.DELETE, tp.topic)
            else (-1, ErrorCode.topic_authorization_failed)
            for tp, offset in wanted
        ]
    )
    response = response_type(request.api_key, request.api_version)
    topic_type = nested(response, "topics")
    partition_type = nested(topic_type, "partitions")
    by_topic: dict[str, list[Any]] = {}
    for (tp, _), (low_watermark, code) in zip(wanted, answers, strict=True):
        by_topic.setdefault(tp.topic, []).append(
            build(partition_type, partition_index=tp.partition, low_watermark=low_watermark, error_code=code)
        )
    topics = tuple(build(topic_type, name=name, partitions=tuple(parts)) for name, parts in by_topic.items())
    return build(response, throttle_time=NO_THROTTLE, topics=topics)


def _delete_records(broker: Broker, tp: TopicPartition, offset: int) -> tuple[int, ErrorCode]:
    """(the new low watermark, the error): in a worker thread."""
    try:
        log = broker.client_log(tp.topic, tp.partition)
        before = log.log_end_offset if offset == HIGH_WATERMARK else offset
        if before < 0:
            raise OffsetOutOfRangeError(f"DeleteRecords offset {offset} of {tp} is neither -1 nor an offset")
        return log.delete_records(before), ErrorCode.none
    except (OncelogError, InternalTopicError) as exc:
        return -1, error_code_for(exc)


async def handle_describe_cluster(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    host, port = broker.advertised_for(request.session)
    broker_type = nested(response, "brokers")
    asked = getattr(body, "include_cluster_authorized_operations", False)
    endpoint_type = getattr(body, "endpoint_type", BROKER_ENDPOINTS)
    if endpoint_type != BROKER_ENDPOINTS:  # KIP-919: a broker describes brokers only
        code = (
            ErrorCode.mismatched_endpoint_type
            if endpoint_type == CONTROLLER_ENDPOINTS
            else ErrorCode.unsupported_endpoint_type
        )
        return build(
            response,
            throttle_time=NO_THROTTLE,
            error_code=code,
            error_message=f"this node answers endpoint type {BROKER_ENDPOINTS} (brokers) only",
            endpoint_type=endpoint_type,
            cluster_id=broker.cluster_id,
            controller_id=-1,
            brokers=(),
            cluster_authorized_operations=OPERATIONS_OMITTED,
        )
    return build(
        response,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=endpoint_type,
        cluster_id=broker.cluster_id,
        controller_id=NODE_ID,
        brokers=(build(broker_type, broker_id=NODE_ID, host=host, port=port, rack=None, is_fenced=False),),
        cluster_authorized_operations=broker.access(request).operations(
            ResourceType.CLUSTER, CLUSTER_NAME, CLUSTER_OPERATIONS
        )
        if asked
        else OPERATIONS_OMITTED,
    )


async def handle_describe_log_dirs(broker: Broker, request: Request) -> Any:
    body = request.body
    if not broker.access(request).cluster(Operation.DESCRIBE):
        response = response_type(request.api_key, request.api_version)
        code = ErrorCode.cluster_authorization_failed
        return build(response, throttle_time=NO_THROTTLE, error_code=code, results=())
    if body.topics is None:
        wanted = [TopicPartition(t, p) for t, count in broker.topics().items() for p in range(count)]
    else:
        wanted = [
            TopicPartition(t.topic, p)
            for t in body.topics
            for p in t.partitions
            if broker.has_partition(t.topic, p)
        ]
    sizes = await broker.in_thread(lambda: _partition_sizes(broker, wanted))
    root = broker.manager.root
    disk = await broker.in_thread(lambda: os.statvfs(root))
    response = response_type(request.api_key, request.api_version)
    result_type = nested(response, "results")
    topic_type = nested(result_type, "topics")
    partition_type = nested(topic_type, "partitions")
    by_topic: dict[str, list[Any]] = {}
    for tp, size in sizes.items():
        by_topic.setdefault(tp.topic, []).append(
            build(
                partition_type,
                partition_index=tp.partition,
                partition_size=size,
                offset_lag=0,
                is_future_key=False,
            )
        )
    result = build(
        result_type,
        error_code=ErrorCode.none,
        log_dir=root,
        topics=tuple(
            build(topic_type, name=name, partitions=tuple(parts)) for name, parts in by_topic.items()
        ),
        total_bytes=disk.f_blocks * disk.f_frsize,
        usable_bytes=disk.f_bavail * disk.f_frsize,
    )
    return build(response, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, results=(result,))


def _partition_sizes(broker: Broker, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
    """Each partition's bytes in its segments (in a worker thread); one it cannot read is left out."""
    sizes: dict[TopicPartition, int] = {}
    for tp in partitions:
        try:
            sizes[tp] = broker.log(tp.topic, tp.partition).size_bytes
        except OncelogError:
            continue
    return sizes
