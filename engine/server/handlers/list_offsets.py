"""ListOffsets (API 2, v1-7).

ListOffsets answers Kafka's special timestamps: -2 the log start, -1 the end (the
last stable offset under read_committed), -3 the record with the largest timestamp
(v7); any other timestamp gives the first offset whose timestamp is at or after it.
A topic the principal may not Describe is TOPIC_AUTHORIZATION_FAILED in each partition,
whether it exists or not.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.layout import InvalidTopicError
from oncelog.log import Log
from oncelog.server.acls import Operation
from oncelog.server.broker import Broker
from oncelog.server.codec import NO_THROTTLE, READ_COMMITTED, Request, build, nested, response_type
from oncelog.server.errors import error_code_for


class _NotAllowed(Exception):
    pass


EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3


async def handle_list_offsets(broker: Broker, request: Request) -> Any:
    body = request.body
    committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
    response = response_type(request.api_key, request.api_version)
    topic_type = nested(response, "topics")
    partition_type = nested(topic_type, "partitions")
    access = broker.access(request)
    topics = []
    for topic in body.topics:
        partitions = []
        allowed = access.topic(Operation.DESCRIBE, topic.name)
        for wanted in topic.partitions:
            try:
                if not allowed:
                    raise _NotAllowed
                code = ErrorCode.none
                timestamp, offset = lookup_offset(
                    broker.log(topic.name, wanted.partition_index), wanted.timestamp, committed
                )
            except (OncelogError, InvalidTopicError) as exc:
                code, timestamp, offset = error_code_for(exc), -1, -1
            except _NotAllowed:
                code, timestamp, offset = ErrorCode.topic_authorization_failed, -1, -1
            partitions.append(
                build(
                    partition_type,
                    partition_index=wanted.partition_index,
                    error_code=code,
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=-1,
                )
            )
        topics.append(build(topic_type, name=topic.name, partitions=tuple(partitions)))
    return build(response, throttle_time=NO_THROTTLE, topics=tuple(topics))


def lookup_offset(log: Log, timestamp: int, committed: bool) -> tuple[int, int]:
    """(timestamp, offset) answering a ListOffsets query; (-1, -1) when nothing matches."""
    end = log.last_stable_offset if committed else log.log_end_offset
    if timestamp == EARLIEST:
        return -1, log.log_start_offset
    if timestamp == LATEST:
        return -1, end
    if timestamp == MAX_TIMESTAMP:
        newest = log.max_timestamp()
        if newest is None or newest.timestamp_ms < 0 or newest.offset >= end:
            return -1, -1
        return newest.timestamp_ms, newest.offset
    if timestamp < 0:
        return -1, -1
    hit = log.offset_for_timestamp(timestamp)
    if hit is None or hit.offset >= end:
        return -1, -1
    return hit.timestamp_ms, hit.offset
