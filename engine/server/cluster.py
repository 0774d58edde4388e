"""The cluster-level APIs: ApiVersions (18), Metadata (3), FindCoordinator (10), CreateTopics (19).

One node (id 0) leads every partition and is every coordinator. Leader epochs are
reported as -1 (unknown), so clients skip the epoch validation (KIP-320) that a
single node with no leader changes has no use for.

Kafka's internal topics: Metadata marks them is_internal and describes one only if
the root holds it; named and absent, it is INVALID_TOPIC_EXCEPTION (not a name a
client topic may have here, so librdkafka fails a producer's messages at once instead
of waiting topic.metadata.propagation.max.ms for it to appear), and it is never
auto-created.
CreateTopics refuses one with INVALID_REQUEST, Kafka's answer for its own internal
metadata topic (ControllerApis.createTopics), unless it exists (TOPIC_ALREADY_EXISTS).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.layout import InvalidTopicError
from oncelog.server.broker import (
    NODE_ID,
    Broker,
    InternalTopicError,
    InvalidPartitionsError,
    TopicExistsError,
    is_internal_topic,
)
from oncelog.server.errors import error_code_for
from oncelog.server.protocol import API_VERSIONS_KEY, APIS, NO_THROTTLE, Request, build, nested, response_type

_GROUP_KEY = 0
_TRANSACTION_KEY = 1


async def handle_api_versions(broker: Broker, request: Request) -> Any:
    """Every advertised range; a version this server does not know gets a v0 body with error 35."""
    version = request.api_version if request.body is not None else 0
    code = ErrorCode.none if request.body is not None else ErrorCode.unsupported_version
    response = response_type(API_VERSIONS_KEY, version)
    key_type = nested(response, "api_keys")
    keys = tuple(
        build(key_type, api_key=spec.key, min_version=spec.advertised[0], max_version=spec.advertised[1])
        for spec in APIS.values()
    )
    return build(response, error_code=code, api_keys=keys, throttle_time=NO_THROTTLE)


async def handle_metadata(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    broker_type = nested(response, "brokers")
    topic_type = nested(response, "topics")
    partition_type = nested(topic_type, "partitions")
    host, port = broker.config.advertised
    # v0 asks for every topic with an empty list; v1+ with null.
    if body.topics is None or (request.api_version == 0 and not body.topics):
        names = list(broker.topics())
        auto_create = False
    else:
        names = [wanted.name for wanted in body.topics]
        auto_create = getattr(body, "allow_auto_topic_creation", True)
    topics = []
    for name in names:
        try:
            count = await broker.partition_count(name, auto_create=auto_create)
            code = ErrorCode.none if count is not None else ErrorCode.unknown_topic_or_partition
        except (InvalidTopicError, InternalTopicError, OncelogError, InvalidPartitionsError) as exc:
            count, code = None, error_code_for(exc)  # a creation that failed is logged where it failed
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
        topics.append(
            build(
                topic_type,
                error_code=code,
                name=name,
                is_internal=is_internal_topic(name),
                partitions=partitions,
            )
        )
    return build(
        response,
        throttle_time=NO_THROTTLE,
        brokers=(build(broker_type, node_id=NODE_ID, host=host, port=port, rack=None),),
        cluster_id=broker.cluster_id,
        controller_id=NODE_ID,
        topics=tuple(topics),
    )


async def handle_find_coordinator(broker: Broker, request: Request) -> Any:
    """This node coordinates every group (key type 0) and transactional id (1); v4+ asks for many keys."""
    body = request.body
    response = response_type(request.api_key, request.api_version)
    host, port = broker.config.advertised
    key_type = getattr(body, "key_type", _GROUP_KEY)
    code = ErrorCode.none if key_type in (_GROUP_KEY, _TRANSACTION_KEY) else ErrorCode.invalid_request
    message = (
        None
        if code == ErrorCode.none
        else f"key type {key_type} is neither a group (0) nor a transaction (1)"
    )
    found = {
        "error_code": code,
        "error_message": message,
        "node_id": NODE_ID if code == ErrorCode.none else -1,
        "host": host if code == ErrorCode.none else "",
        "port": port if code == ErrorCode.none else -1,
    }
    if not hasattr(body, "coordinator_keys"):  # v0-3: one key
        return build(response, throttle_time=NO_THROTTLE, **found)
    coordinator_type = nested(response, "coordinators")
    coordinators = tuple(build(coordinator_type, key=key, **found) for key in body.coordinator_keys)
    return build(response, throttle_time=NO_THROTTLE, coordinators=coordinators)


async def handle_create_topics(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    topic_type = nested(response, "topics")
    topics = []
    names = [wanted.name for wanted in body.topics]
    for wanted in body.topics:
        if names.count(wanted.name) > 1:
            topics.append(
                build(
                    topic_type,
                    name=wanted.name,
                    error_code=ErrorCode.invalid_request,
                    error_message=f"the request names topic {wanted.name!r} more than once",
                    num_partitions=-1,
                    replication_factor=-1,
                    configs=None,
                )
            )
            continue
        count = wanted.num_partitions
        if count == -1:
            count = len(wanted.assignments) or broker.config.partitions
        code, message = ErrorCode.none, None
        if wanted.replication_factor not in (-1, 1):
            code = ErrorCode.invalid_replication_factor
            message = f"replication factor {wanted.replication_factor} on a single node; use 1 or -1"
        elif wanted.configs:
            code = ErrorCode.invalid_config
            message = "topic configs are not supported yet; create the topic without them"
        else:
            try:
                await broker.create_topic(wanted.name, count, validate_only=body.validate_only)
            except InternalTopicError as exc:
                code, message = ErrorCode.invalid_request, str(exc)
            except (TopicExistsError, InvalidPartitionsError, InvalidTopicError, OncelogError) as exc:
                code, message = error_code_for(exc), str(exc)
        ok = code == ErrorCode.none
        topics.append(
            build(
                topic_type,
                name=wanted.name,
                error_code=code,
                error_message=message,
                num_partitions=count if ok else -1,
                replication_factor=1 if ok else -1,
                configs=() if ok else None,
            )
        )
    return build(response, throttle_time=NO_THROTTLE, topics=tuple(topics))
