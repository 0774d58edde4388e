"""Produce (API 0, v3-9): a client's record batch, as sent, into Log.append_batches.

Kafka's rules for the request: acks is -1, 0 or 1 (INVALID_REQUIRED_ACKS otherwise,
nothing written); from v3 each partition carries exactly one v2 batch (INVALID_RECORD
otherwise); a partition named twice is appended once, with the last of its entries
(Kafka keys the request by partition); acks=0 gets no response. Every check of the
batch and of its producer's sequence and epoch is the engine's. A duplicate (a retry
of one of the producer's last 5 batches) is answered as Kafka answers it: success,
with the offsets of the original append.

Authorization, as Kafka's: a transactional batch needs Write on the request's transactional
id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED on every partition), and every batch Write on
its topic (else TOPIC_AUTHORIZATION_FAILED, before the topic's existence is looked at;
idempotence needs nothing more, KIP-679). A topic the request would auto-create needs
Create on the cluster or the topic, else UNKNOWN_TOPIC_OR_PARTITION. Nothing refused is
written.

A batch for one of Kafka's internal topics is INVALID_TOPIC_EXCEPTION, as Kafka answers
a client's append to one (ReplicaManager.appendToLocalLog), and creates nothing.

A transactional batch is appended only while its producer's transaction is open at
its epoch and holds the partition (AddPartitionsToTxn), else INVALID_TXN_STATE: a
batch stored outside a transaction its coordinator will end would hold the
partition's last stable offset forever (Kafka's partition verification, KIP-890,
refuses it likewise). The end of the transaction waits for such appends in flight, so
none lands after its marker.

Validation walks every record: a request of small uncompressed batches (at most
INLINE_RECORDS records and INLINE_BYTES bytes) for topics that store batches as sent is
appended on the event loop, where it takes a few ms and a thread hop would cost more
than it; anything larger, compressed or to be recompressed (a topic's compression.type)
is appended in a worker thread, so no request stalls the other connections.

When the answer is sent: acks=1 and acks=all once the batch is in the page cache (it
survives a kill -9 of the server); with --fsync-acks, acks=all once a group commit has
fsynced it (it survives power loss).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import struct
from dataclasses import dataclass
from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.errors import KeylessRecordError, OncelogError
from oncelog.layout import InvalidTopicError, TopicPartition
from oncelog.log import Log
from oncelog.segments import format as fmt
from oncelog.server.acls import Operation
from oncelog.server.authorization import Access
from oncelog.server.broker import Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, nested, response_type
from oncelog.server.errors import InternalTopicError, InvalidPartitionsError, error_code_for

log = logging.getLogger("oncelog.server")
_BATCH_LENGTH = struct.Struct(">i")  # at offset 8; the batch is 12 bytes longer
_ATTRIBUTES = struct.Struct(">h")
_COUNT = struct.Struct(">i")
_PRODUCER = struct.Struct(">qh")  # producer id, epoch
# Records in a Produce request validated on the event loop rather than in a thread (~10 ms).
INLINE_RECORDS: Final = 20_000
INLINE_BYTES: Final = 1024 * 1024  # (a CRC and a copy of 1 MiB: well under a millisecond)
ACKS_NONE: Final = 0
ACKS_LEADER: Final = 1
ACKS_ALL: Final = -1


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


def is_transactional(records: bytes) -> bool:
    if len(records) < fmt.HEADER_SIZE:
        return False  # the engine names what is wrong with it
    return bool(_ATTRIBUTES.unpack_from(records, fmt.ATTRIBUTES_OFFSET)[0] & fmt.TRANSACTIONAL_MASK)


@dataclass(slots=True)
class _Outcome:
    partition: int
    code: ErrorCode
    records: bytes | None = None
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    # The log and the end offset the batch (or the original of a duplicate) reaches.
    log: Log | None = None
    end_offset: int = 0
    written: bool = False
    # The producer whose open transaction admitted this batch (released once appended).
    transactional_pid: int = -1
    # KIP-467: the records that made the batch invalid (their index in it), and why.
    record_errors: tuple[tuple[int, str], ...] = ()
    message: str | None = None


async def handle_produce(broker: Broker, request: Request) -> Any:
    body = request.body
    topics: dict[str, dict[int, _Outcome]] = {}
    for topic in body.topic_data:
        entries = topics.setdefault(topic.name, {})
        for data in topic.partition_data:
            entries[data.index] = _Outcome(data.index, ErrorCode.none, data.records)  # the last entry wins
    if body.acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
        for entries in topics.values():
            for outcome in entries.values():
                outcome.code = ErrorCode.invalid_required_acks
    else:
        access = broker.access(request)
        refused = _refused(access, request.body.transactional_id, topics)
        for name, entries in topics.items():
            if name in refused:
                for outcome in entries.values():
                    outcome.code = refused[name]
            else:
                await _check_partitions(broker, name, entries, may_create=access.may_create_topic(name))
        # No await from the admission to the finally that releases it: an admitted append must be
        # released whatever happens, or its transaction's end would wait for it forever.
        _admit_transactional(broker, request.body.transactional_id, topics)
        pending = [(name, o) for name, entries in topics.items() for o in entries.values() if o.code == 0]
        try:
            if _cheap_to_validate(broker, pending):
                _append_all(broker, pending)  # a few ms at most: not worth a thread hop (~15% of the CPU)
            else:
                await broker.in_thread(lambda: _append_all(broker, pending))
        finally:
            for _, outcome in pending:
                if outcome.transactional_pid >= 0:
                    broker.transactions.appended(outcome.transactional_pid)
        broker.appended(TopicPartition(name, o.partition) for name, o in pending if o.written)
        if broker.config.fsync_acks and body.acks == ACKS_ALL:
            await _wait_durable(broker, [outcome for _, outcome in pending])
    if body.acks == ACKS_NONE:
        return None
    return _response(request, topics)


def _refused(
    access: Access, transactional_id: str | None, topics: dict[str, dict[int, _Outcome]]
) -> dict[str, ErrorCode]:
    """The topics whose batches the principal may not append, with Kafka's error: a transactional
    batch needs a transactional id in its request, and Write on it (every partition refused
    without either, whether or not the server authorizes, as Kafka answers), every batch
    Write on its topic (checked before the topic's existence, so a name says nothing of it)."""
    transactional = any(
        is_transactional(outcome.records or b"")
        for entries in topics.values()
        for outcome in entries.values()
    )
    if transactional and (
        transactional_id is None or not access.transactional_id(Operation.WRITE, transactional_id)
    ):
        return dict.fromkeys(topics, ErrorCode.transactional_id_authorization_failed)
    if not access.enforced:
        return {}
    return {
        name: ErrorCode.topic_authorization_failed
        for name in topics
        if not access.topic(Operation.WRITE, name)
    }


async def _check_partitions(
    broker: Broker, topic: str, entries: dict[int, _Outcome], *, may_create: bool
) -> None:
    """Set the error of each entry that cannot be appended: topic, partition, batch shape."""
    code = ErrorCode.none
    try:
        broker.check_client_topic(topic)
        count = await broker.partition_count(topic, auto_create=may_create)
    except (InvalidTopicError, InternalTopicError, OncelogError, InvalidPartitionsError) as exc:
        count, code = None, error_code_for(exc)  # a creation that failed is logged where it failed
    for outcome in entries.values():
        if code != ErrorCode.none:
            outcome.code = code
        elif count is None or not 0 <= outcome.partition < count:
            outcome.code = ErrorCode.unknown_topic_or_partition
        elif one_batch_error(outcome.records) is not None:
            outcome.code = ErrorCode.invalid_record


def _admit_transactional(
    broker: Broker, transactional_id: str | None, topics: dict[str, dict[int, _Outcome]]
) -> None:
    """Admit each transactional batch to its producer's open transaction, or set its error.

    The batch's producer must be the one the request's transactional id holds, else
    INVALID_PRODUCER_ID_MAPPING (Kafka's partition verification, KIP-890): a principal
    allowed to write its own transactional id cannot slip batches into another's open
    transaction by naming that transaction's producer id.
    """
    owner = None if transactional_id is None else broker.transactions.transactions.get(transactional_id)
    for topic, entries in topics.items():
        for outcome in entries.values():
            if outcome.code != ErrorCode.none or not is_transactional(outcome.records or b""):
                continue
            assert outcome.records is not None
            pid, epoch = _PRODUCER.unpack_from(outcome.records, fmt.PRODUCER_ID_OFFSET)
            if transactional_id is not None and (owner is None or owner.producer_id != pid):
                outcome.code = ErrorCode.invalid_producer_id_mapping
                continue
            outcome.code = broker.transactions.admit_append(
                pid, epoch, TopicPartition(topic, outcome.partition)
            )
            if outcome.code == ErrorCode.none:
                outcome.transactional_pid = pid


def _cheap_to_validate(broker: Broker, pending: list[tuple[str, _Outcome]]) -> bool:
    """Whether validating these batches is cheap enough to run on the event loop.

    Validation walks every record (about 0.5 µs each) and inflates compressed batches
    (up to max_decompressed_batch_bytes each), and a topic with a compression.type
    compresses each batch again: uncompressed batches of at most INLINE_RECORDS records
    and INLINE_BYTES bytes in all, for topics that store them as sent, stay on the
    loop; anything more goes to a thread.
    """
    records = size = 0
    for topic, outcome in pending:
        data = outcome.records
        if data is None or len(data) < fmt.HEADER_SIZE:
            return False
        if _ATTRIBUTES.unpack_from(data, fmt.ATTRIBUTES_OFFSET)[0] & fmt.COMPRESSION_MASK:
            return False
        try:
            if broker.log(topic, outcome.partition).config.compression_type != "producer":
                return False
        except OncelogError:
            return False  # (deleted meanwhile: _append_all answers it)
        records += _COUNT.unpack_from(data, fmt.RECORDS_COUNT_OFFSET)[0]
        size += len(data)
    return records <= INLINE_RECORDS and size <= INLINE_BYTES


def _append_all(broker: Broker, pending: list[tuple[str, _Outcome]]) -> None:
    """Append each entry's batch (in a worker thread); fills in the outcomes."""
    for topic, outcome in pending:
        assert outcome.records is not None
        try:
            target = broker.log(topic, outcome.partition)
            (result,) = target.append_batches([outcome.records])
        except OncelogError as exc:
            outcome.code = error_code_for(exc)
            if isinstance(exc, KeylessRecordError):
                where = f"{topic}-{outcome.partition}"
                outcome.message = (
                    f"Compacted topic cannot accept message without key in topic partition {where}."
                )
                outcome.record_errors = tuple((index, outcome.message) for index in exc.record_indexes)
            continue
        outcome.base_offset = result.first_offset
        outcome.log_append_time_ms = result.log_append_time_ms
        outcome.log_start_offset = target.log_start_offset
        outcome.log = target
        outcome.end_offset = result.last_offset + 1
        outcome.written = not result.duplicate


async def _wait_durable(broker: Broker, outcomes: list[_Outcome]) -> None:
    """--fsync-acks: wait for a group commit to cover every acknowledged batch.

    A duplicate waits too: its original may not be fsynced yet. A failed fsync turns
    the partition's answer into KAFKA_STORAGE_ERROR (the log now refuses appends).
    """
    ends: dict[Log, int] = {}
    for outcome in outcomes:
        if outcome.log is not None:
            ends[outcome.log] = max(outcome.end_offset, ends.get(outcome.log, 0))
    failed: dict[Log, ErrorCode] = {}
    for target, end in ends.items():
        try:
            await broker.in_thread(lambda target=target, end=end: target.wait_durable(end))  # type: ignore[misc]
        except OncelogError as exc:
            log.warning("produce: acks=all not durable in %s: %s", target.directory, exc)
            failed[target] = error_code_for(exc)
    for outcome in outcomes:
        if outcome.log is not None and outcome.log in failed:
            outcome.code = failed[outcome.log]
            outcome.base_offset = -1


def _response(request: Request, topics: dict[str, dict[int, _Outcome]]) -> Any:
    response = response_type(request.api_key, request.api_version)
    topic_type = nested(response, "responses")
    partition_type = nested(topic_type, "partition_responses")
    answers = tuple(
        build(
            topic_type,
            name=name,
            partition_responses=tuple(
                build(
                    partition_type,
                    index=outcome.partition,
                    error_code=outcome.code,
                    base_offset=outcome.base_offset if outcome.code == ErrorCode.none else -1,
                    log_append_time=_timestamp(outcome.log_append_time_ms),
                    log_start_offset=outcome.log_start_offset,
                    record_errors=_record_errors(partition_type, outcome),
                    error_message=outcome.message,
                )
                for outcome in entries.values()
            ),
        )
        for name, entries in topics.items()
    )
    return build(response, responses=answers, throttle_time=NO_THROTTLE)


def _record_errors(partition_type: Any, outcome: _Outcome) -> tuple[Any, ...]:
    """KIP-467's record errors (v8 and later; an older response has no such field)."""
    if not outcome.record_errors or "record_errors" not in {
        f.name for f in dataclasses.fields(partition_type)
    }:
        return ()
    error_type = nested(partition_type, "record_errors")
    return tuple(
        build(error_type, batch_index=index, batch_index_error_message=why)
        for index, why in outcome.record_errors
    )


def _timestamp(ms: int) -> datetime.datetime | None:
    if ms < 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
