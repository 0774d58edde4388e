"""Produce (API 0, v3-9): a client's record batch, as sent, into Log.append_batches.

Kafka's rules for the request: from v3 each partition carries exactly one v2 batch
(INVALID_RECORD otherwise); acks=0 gets no response. Every check of the batch and of
its producer's sequence and epoch is the engine's (`Log.append_batches`). A
duplicate (a retry of one of the producer's last 5 batches) is answered as Kafka
answers it: success, with the offsets of the original append.

When the answer is sent: acks=1 and acks=all once the batch is in the page cache
(it survives a kill -9 of the server); with --fsync-acks, acks=all once a group
commit has fsynced it (it survives power loss).
"""

from __future__ import annotations

import datetime
import logging
import struct
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.layout import InvalidTopicError
from oncelog.log import Log
from oncelog.server.broker import Broker
from oncelog.server.errors import error_code_for
from oncelog.server.protocol import Request, build, nested, response_type

log = logging.getLogger("oncelog.serve")
_BATCH_LENGTH = struct.Struct(">i")  # at offset 8; the batch is 12 bytes longer
_ACKS_NONE = 0
_ACKS_ALL = -1


def one_batch_error(records: bytes | None) -> str | None:
    """Why `records` is not exactly one batch (Kafka's rule from Produce v3), or None."""
    if not records:
        return "no record batch"
    if len(records) < 12:
        return f"{len(records)} bytes are too few for a record batch"
    (length,) = _BATCH_LENGTH.unpack_from(records, 8)
    if length + 12 != len(records):
        return f"the batch declares {length + 12} bytes but the partition's records hold {len(records)}"
    return None


async def handle_produce(broker: Broker, request: Request) -> Any:
    body = request.body
    outcomes: list[tuple[str, list[_Outcome]]] = []
    for topic in body.topic_data:
        outcomes.append(
            (
                topic.name,
                [_append_one(broker, topic.name, data.index, data.records) for data in topic.partition_data],
            )
        )
    if any(outcome.written for _, partitions in outcomes for outcome in partitions):
        broker.appended()
    if broker.config.fsync_acks and body.acks == _ACKS_ALL:
        await _wait_durable(broker, [outcome for _, partitions in outcomes for outcome in partitions])
    if body.acks == _ACKS_NONE:
        return None
    response = response_type(request.api_key, request.api_version)
    topic_type = nested(response, "responses")
    partition_type = nested(topic_type, "partition_responses")
    topics = tuple(
        build(
            topic_type,
            name=name,
            partition_responses=tuple(
                build(
                    partition_type,
                    index=outcome.partition,
                    error_code=outcome.code,
                    base_offset=outcome.base_offset,
                    log_append_time=_timestamp(outcome.log_append_time_ms),
                    log_start_offset=outcome.log_start_offset,
                    record_errors=(),
                    error_message=None,
                )
                for outcome in partitions
            ),
        )
        for name, partitions in outcomes
    )
    return build(response, responses=topics, throttle_time=datetime.timedelta(0))


@dataclass(slots=True)
class _Outcome:
    partition: int
    code: ErrorCode
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    # The log and the end offset the batch (or the original of a duplicate) reaches.
    log: Log | None = None
    end_offset: int = 0
    written: bool = False


def _append_one(broker: Broker, topic: str, partition: int, records: bytes | None) -> _Outcome:
    try:
        count = broker.partition_count(topic, auto_create=True)
    except InvalidTopicError:
        return _Outcome(partition, ErrorCode.invalid_topic_exception)
    except OncelogError as exc:
        log.warning("produce: creating topic %r failed: %s", topic, exc)
        return _Outcome(partition, error_code_for(exc))
    if count is None or not 0 <= partition < count:
        return _Outcome(partition, ErrorCode.unknown_topic_or_partition)
    if one_batch_error(records) is not None:
        return _Outcome(partition, ErrorCode.invalid_record)
    assert records is not None
    try:
        target = broker.log(topic, partition)
        (result,) = target.append_batches([records])
    except OncelogError as exc:
        return _Outcome(partition, error_code_for(exc))
    return _Outcome(
        partition,
        ErrorCode.none,
        result.first_offset,
        result.log_append_time_ms,
        target.log_start_offset,
        target,
        result.last_offset + 1,
        written=not result.duplicate,
    )


async def _wait_durable(broker: Broker, outcomes: list[_Outcome]) -> None:
    """--fsync-acks: wait for a group commit to cover every acknowledged batch.

    A duplicate waits too: its original may not be fsynced yet. A failed fsync turns
    the partition's answer into KAFKA_STORAGE_ERROR (the log now refuses appends).
    """
    ends: dict[int, tuple[Log, int]] = {}
    for outcome in outcomes:
        if outcome.log is not None:
            held = ends.get(id(outcome.log))
            ends[id(outcome.log)] = (outcome.log, max(outcome.end_offset, held[1] if held else 0))
    failed: dict[int, ErrorCode] = {}
    for key, (target, end) in ends.items():
        try:
            await broker.in_thread(lambda target=target, end=end: target.wait_durable(end))  # type: ignore[misc]
        except OncelogError as exc:
            log.warning("produce: acks=all not durable in %s: %s", target.directory, exc)
            failed[key] = error_code_for(exc)
    for outcome in outcomes:
        if outcome.log is not None and id(outcome.log) in failed:
            outcome.code = failed[id(outcome.log)]
            outcome.base_offset = -1


def _timestamp(ms: int) -> datetime.datetime | None:
    if ms < 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
