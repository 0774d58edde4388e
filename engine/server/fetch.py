"""Fetch (API 1, v4-12): stored batches, as they are on disk, with no fetch sessions.

Every response lists every requested partition once (session id 0: no incremental
fetches; a partition named twice is read once, at its last entry's offset, as Kafka
keys the request by partition). The response waits up to max_wait_ms for
min_bytes, woken by appends to its partitions only.
Limits are Kafka's (KIP-74): partition_max_bytes per partition, max_bytes in all,
but the first partition with data returns at least one whole batch, so a batch
larger than the limits never stalls a consumer.

read_committed stops at the last stable offset and lists the aborted transactions
the returned batches overlap; the consumer drops their records.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.layout import InvalidTopicError, TopicPartition
from oncelog.results import Isolation
from oncelog.server.broker import Broker, InternalTopicError
from oncelog.server.errors import error_code_for
from oncelog.server.protocol import (
    NO_THROTTLE,
    READ_COMMITTED,
    MalformedRequestError,
    Request,
    build,
    nested,
    response_type,
)

# The most one fetch response carries, whatever the client asks: Kafka's fetch.max.bytes.
MAX_FETCH_BYTES = 55 * 1024 * 1024
# Response bytes all connections may hold that their clients have not yet read; past it a
# fetch returns at most one batch per response (clients that do not read cannot fill memory).
MAX_RESPONSE_BYTES_IN_FLIGHT = 256 * 1024 * 1024


async def handle_fetch(broker: Broker, request: Request) -> Any:
    body = request.body
    if body.isolation_level not in (0, READ_COMMITTED):
        raise MalformedRequestError(f"Fetch isolation_level {body.isolation_level} is neither 0 nor 1")
    isolation: Isolation = "read_committed" if body.isolation_level == READ_COMMITTED else "read_uncommitted"
    wanted = _wanted(body)
    partitions = list(wanted)
    wait_s = min(body.max_wait.total_seconds(), broker.config.max_fetch_wait_ms / 1000)
    deadline = time.monotonic() + max(wait_s, 0.0)
    while True:
        event = broker.watch(partitions)  # before reading: an append after the read sets it
        try:
            read = _read_all(broker, request, wanted, isolation)
            remaining = deadline - time.monotonic()
            if read.total_bytes >= body.min_bytes or read.failed or remaining <= 0 or broker.stopping:
                break
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                read = _read_all(broker, request, wanted, isolation)
                break
        finally:
            broker.unwatch(partitions, event)
    response = response_type(request.api_key, request.api_version)
    return build(
        response,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(read.topics),
    )


def _wanted(body: Any) -> dict[TopicPartition, tuple[int, int]]:
    """(fetch offset, partition max bytes) per partition; a partition named twice counts once (the last)."""
    wanted: dict[TopicPartition, tuple[int, int]] = {}
    for topic in body.topics:
        for partition in topic.partitions:
            tp = TopicPartition(topic.topic, partition.partition)
            wanted[tp] = (partition.fetch_offset, partition.partition_max_bytes)
    return wanted


class _Read(NamedTuple):
    topics: list[Any]
    total_bytes: int
    failed: bool


def _read_all(
    broker: Broker, request: Request, wanted: dict[TopicPartition, tuple[int, int]], isolation: Isolation
) -> _Read:
    """Every wanted partition's response, within the request's and the server's byte budgets."""
    body = request.body
    response = response_type(request.api_key, request.api_version)
    topic_type = nested(response, "responses")
    partition_type = nested(topic_type, "partitions")
    aborted_type = nested(partition_type, "aborted_transactions")
    # What other connections have not yet taken counts against this response too.
    budget = min(max(body.max_bytes, 0), MAX_FETCH_BYTES, MAX_RESPONSE_BYTES_IN_FLIGHT - broker.bytes_unsent)
    total = 0
    failed = False
    by_topic: dict[str, list[Any]] = {}
    for tp, (fetch_offset, partition_max_bytes) in wanted.items():
        limit = min(max(partition_max_bytes, 0), budget - total)
        # KIP-74: the first partition with data returns one whole batch whatever the limits.
        fields = _read_one(broker, tp, fetch_offset, limit, total, isolation)
        total += len(fields["records"])
        failed = failed or fields["error_code"] != ErrorCode.none
        aborted = fields.pop("aborted", None)
        by_topic.setdefault(tp.topic, []).append(
            build(
                partition_type,
                partition_index=tp.partition,
                aborted_transactions=(
                    tuple(build(aborted_type, producer_id=pid, first_offset=first) for pid, first in aborted)
                    if aborted is not None
                    else None
                ),
                **fields,
            )
        )
    topics = [build(topic_type, topic=name, partitions=tuple(parts)) for name, parts in by_topic.items()]
    return _Read(topics, total, failed)


def _read_one(
    broker: Broker,
    tp: TopicPartition,
    fetch_offset: int,
    limit: int,
    sent_so_far: int,
    isolation: Isolation,
) -> dict[str, Any]:
    """The fields of one partition's response (plus "aborted": (pid, first offset) pairs)."""
    try:
        target = broker.client_log(tp.topic, tp.partition)  # no client reads an internal topic
        high_watermark = target.log_end_offset
        stable = target.last_stable_offset
        start = target.log_start_offset
    except (OncelogError, InvalidTopicError, InternalTopicError) as exc:
        return {"error_code": error_code_for(exc), "high_watermark": -1, "records": b""}
    fields: dict[str, Any] = {
        "error_code": ErrorCode.none,
        "high_watermark": high_watermark,
        "last_stable_offset": stable,
        "log_start_offset": start,
        "records": b"",
        "aborted": [] if isolation == "read_committed" else None,
    }
    if limit <= 0 and sent_so_far > 0:
        return fields
    try:
        fetched = target.read(fetch_offset, max(limit, 1), isolation=isolation)
    except OncelogError as exc:
        fields["error_code"] = error_code_for(exc)
        fields["aborted"] = None
        return fields
    if fetched.batches:
        fields["records"] = b"".join(batch.buffer for batch in fetched.batches)
    if isolation == "read_committed":
        fields["aborted"] = list(fetched.aborted_transactions)
    return fields
