"""What kio cannot do, done with kafka-python's classes generated from the same JSON specs.

Two cases, both rare, neither touching a record batch's bytes:

1. Unknown tagged fields. A flexible request may carry tagged fields its receiver
   does not know, and Kafka ignores them; librdkafka 2.x sends one (tag 0) in
   Metadata v9. kio refuses such a request, so it is decoded here, its unknown tags
   dropped, and re-encoded at the same version for kio to decode.
2. Versions advertised but not served, answered with UNSUPPORTED_VERSION (35) in
   every entry. ApiVersions advertises every API from v0 because librdkafka before
   2.11.1 enables features by exact-version overlap (KAFKA-18659). kio's specs begin
   where Kafka 4 does (Produce v3, Fetch v4, ListOffsets v1, OffsetCommit v2,
   OffsetFetch v1, CreateTopics v2), so a client that still sends an older version is
   answered through kafka-python's classes, generated from the same JSON specs and
   reaching back to v0: the request is decoded, and the response names every topic and
   partition it asked for, each with error 35. Nothing is read from or written to a log.

The registry (`api_registry`) names, per API, the class for case 1 and the answer
(UnsupportedAnswer) for case 2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kafka.protocol.admin import (
    CreateAclsRequest,
    CreateAclsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

UNSUPPORTED_VERSION: Final = 35


class FallbackDecodeError(Exception):
    """kafka-python could not decode the frame either: it is malformed."""


def without_unknown_tags(request_type: Any, api_key: int, api_version: int, frame: bytes) -> bytes:
    """`frame` (header and body, no size prefix) re-encoded by `request_type` (kafka-python's
    request class of the API) without tagged fields its spec lacks."""
    try:
        request = request_type[api_version].decode(frame, header=True)
        _drop_unknown_tags(request)
        _drop_unknown_tags(request.header)
        return bytes(request.encode(header=True))
    except Exception as exc:  # kafka-python raises several kinds on a garbled frame
        raise FallbackDecodeError(f"API {api_key} v{api_version} does not decode: {exc!r}") from exc


def _drop_unknown_tags(entity: Any) -> None:
    if getattr(entity, "unknown_tags", None):
        entity.unknown_tags = {}
    for name in getattr(entity, "fields", ()) or ():
        value = getattr(entity, name, None)
        for item in value if isinstance(value, list) else [value]:
            if hasattr(item, "unknown_tags"):
                _drop_unknown_tags(item)


def unsupported_version_response(
    answer: UnsupportedAnswer, api_key: int, api_version: int, frame: bytes
) -> bytes:
    """The framed response (size prefix included) refusing `frame`'s version entry by entry."""
    try:
        request = answer.request[api_version].decode(frame, header=True)
    except Exception as exc:  # kafka-python raises several kinds on a garbled body
        raise FallbackDecodeError(f"API {api_key} v{api_version} does not decode: {exc!r}") from exc
    response = answer.build(answer.response[api_version], request)
    response.with_header(correlation_id=request.header.correlation_id)
    return bytes(response.encode(header=True, framed=True))


def _produce(response: Any, request: Any) -> Any:
    topic = response.TopicProduceResponse
    partition = topic.PartitionProduceResponse
    return response(
        responses=[
            topic(
                name=t.name,
                partition_responses=[
                    partition(index=p.index, error_code=UNSUPPORTED_VERSION, base_offset=-1)
                    for p in t.partition_data
                ],
            )
            for t in request.topic_data
        ],
        throttle_time_ms=0,
    )


def _fetch(response: Any, request: Any) -> Any:
    topic = response.FetchableTopicResponse
    partition = topic.PartitionData
    return response(
        throttle_time_ms=0,
        responses=[
            topic(
                topic=t.topic,
                partitions=[
                    partition(
                        partition_index=p.partition,
                        error_code=UNSUPPORTED_VERSION,
                        high_watermark=-1,
                        records=b"",
                    )
                    for p in t.partitions
                ],
            )
            for t in request.topics
        ],
    )


def _list_offsets(response: Any, request: Any) -> Any:
    topic = response.ListOffsetsTopicResponse
    partition = topic.ListOffsetsPartitionResponse
    return response(
        topics=[
            topic(
                name=t.name,
                partitions=[
                    partition(
                        partition_index=p.partition_index,
                        error_code=UNSUPPORTED_VERSION,
                        old_style_offsets=[],
                    )
                    for p in t.partitions
                ],
            )
            for t in request.topics
        ],
    )


def _create_topics(response: Any, request: Any) -> Any:
    result = response.CreatableTopicResult
    return response(
        topics=[
            result(name=t.name, error_code=UNSUPPORTED_VERSION, error_message="use CreateTopics v2 or later")
            for t in request.topics
        ],
    )


def _offset_commit(response: Any, request: Any) -> Any:
    topic = response.OffsetCommitResponseTopic
    partition = topic.OffsetCommitResponsePartition
    return response(
        topics=[
            topic(
                name=t.name,
                partitions=[
                    partition(partition_index=p.partition_index, error_code=UNSUPPORTED_VERSION)
                    for p in t.partitions
                ],
            )
            for t in request.topics
        ],
    )


def _offset_fetch(response: Any, request: Any) -> Any:
    topic = response.OffsetFetchResponseTopic
    partition = topic.OffsetFetchResponsePartition
    return response(
        topics=[
            topic(
                name=t.name,
                partitions=[
                    partition(
                        partition_index=p, committed_offset=-1, metadata="", error_code=UNSUPPORTED_VERSION
                    )
                    for p in t.partition_indexes
                ],
            )
            for t in request.topics or []
        ],
    )


def _describe_log_dirs(response: Any, request: Any) -> Any:
    # v0 has no request-wide error code: one log directory entry carries it.
    result = response.DescribeLogDirsResult
    return response(results=[result(error_code=UNSUPPORTED_VERSION, log_dir="", topics=[])])


def _delete_topics(response: Any, request: Any) -> Any:
    result = response.DeletableTopicResult
    return response(
        responses=[result(name=name, error_code=UNSUPPORTED_VERSION) for name in request.topic_names]
    )


def _describe_configs(response: Any, request: Any) -> Any:
    result = response.DescribeConfigsResult
    return response(
        results=[
            result(
                error_code=UNSUPPORTED_VERSION,
                error_message="use DescribeConfigs v1 or later",
                resource_type=r.resource_type,
                resource_name=r.resource_name,
                configs=[],
            )
            for r in request.resources
        ],
    )


def _describe_acls(response: Any, request: Any) -> Any:
    return response(
        error_code=UNSUPPORTED_VERSION, error_message="use DescribeAcls v1 or later", resources=[]
    )


def _create_acls(response: Any, request: Any) -> Any:
    result = response.AclCreationResult
    return response(
        results=[
            result(error_code=UNSUPPORTED_VERSION, error_message="use CreateAcls v1 or later")
            for _ in request.creations
        ],
    )


def _delete_acls(response: Any, request: Any) -> Any:
    result = response.DeleteAclsFilterResult
    return response(
        filter_results=[
            result(
                error_code=UNSUPPORTED_VERSION, error_message="use DeleteAcls v1 or later", matching_acls=[]
            )
            for _ in request.filters
        ],
    )


@dataclass(frozen=True, slots=True)
class UnsupportedAnswer:
    """How to answer an API's old versions: kafka-python's request and response classes,
    and the response naming every entry of the request with UNSUPPORTED_VERSION."""

    request: Any
    response: Any
    build: Callable[[Any, Any], Any]


PRODUCE = UnsupportedAnswer(ProduceRequest, ProduceResponse, _produce)
FETCH = UnsupportedAnswer(FetchRequest, FetchResponse, _fetch)
LIST_OFFSETS = UnsupportedAnswer(ListOffsetsRequest, ListOffsetsResponse, _list_offsets)
OFFSET_COMMIT = UnsupportedAnswer(OffsetCommitRequest, OffsetCommitResponse, _offset_commit)
OFFSET_FETCH = UnsupportedAnswer(OffsetFetchRequest, OffsetFetchResponse, _offset_fetch)
CREATE_TOPICS = UnsupportedAnswer(CreateTopicsRequest, CreateTopicsResponse, _create_topics)
DESCRIBE_LOG_DIRS = UnsupportedAnswer(DescribeLogDirsRequest, DescribeLogDirsResponse, _describe_log_dirs)
DESCRIBE_CONFIGS = UnsupportedAnswer(DescribeConfigsRequest, DescribeConfigsResponse, _describe_configs)
DELETE_TOPICS = UnsupportedAnswer(DeleteTopicsRequest, DeleteTopicsResponse, _delete_topics)
DESCRIBE_ACLS = UnsupportedAnswer(DescribeAclsRequest, DescribeAclsResponse, _describe_acls)
CREATE_ACLS = UnsupportedAnswer(CreateAclsRequest, CreateAclsResponse, _create_acls)
DELETE_ACLS = UnsupportedAnswer(DeleteAclsRequest, DeleteAclsResponse, _delete_acls)
