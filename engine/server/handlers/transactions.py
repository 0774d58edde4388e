"""The transaction APIs on the wire: InitProducerId (22), AddPartitionsToTxn (24),
AddOffsetsToTxn (25), EndTxn (26) and TxnOffsetCommit (28).

An idempotent producer (no transactional id) gets a new producer id at epoch 0 on
every InitProducerId, from the root's ProducerIdManager (reserved durably in blocks,
so a crash never reissues one); Kafka does the same. A transactional id goes to the
TransactionCoordinator.

A fenced producer gets PRODUCER_FENCED (90) from the versions that know it (KIP-588:
InitProducerId v4, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn v2, TxnOffsetCommit
v3) and INVALID_PRODUCER_EPOCH (47) before them.

AddPartitionsToTxn adds nothing if one partition cannot be added: an internal topic
is TOPIC_AUTHORIZATION_FAILED (Kafka authorizes no client to write one), an unknown
or invalid one UNKNOWN_TOPIC_OR_PARTITION, and every other OPERATION_NOT_ATTEMPTED.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.layout import InvalidTopicError, TopicPartition
from oncelog.server.broker import Broker, is_internal_topic
from oncelog.server.codec import NO_THROTTLE, Request, build, milliseconds, nested, response_type
from oncelog.server.errors import error_code_for
from oncelog.server.handlers.groups import offsets_of, partition_answers
from oncelog.server.txn_state import TxnError

# The first version of each API that answers PRODUCER_FENCED, by API key.
_PRODUCER_FENCED_FROM: Final = {22: 4, 24: 2, 25: 2, 26: 2, 28: 3}


def _code(request: Request, code: ErrorCode) -> ErrorCode:
    if code == ErrorCode.producer_fenced and request.api_version < _PRODUCER_FENCED_FROM[request.api_key]:
        return ErrorCode.invalid_producer_epoch
    return code


async def handle_init_producer_id(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    producer_id, epoch, code = -1, -1, ErrorCode.none
    try:
        if body.transactional_id is None:
            lease = broker.manager.producer_ids.lease()
            producer_id, epoch = lease.producer_id, lease.producer_epoch
        elif not body.transactional_id:
            code = ErrorCode.invalid_request
        else:
            producer_id, epoch = await broker.transactions.init_producer_id(
                body.transactional_id,
                milliseconds(body.transaction_timeout),
                getattr(body, "producer_id", -1),
                getattr(body, "producer_epoch", -1),
            )
    except TxnError as exc:
        code = _code(request, exc.code)
    except OncelogError as exc:
        code = error_code_for(exc)
    return build(
        response, throttle_time=NO_THROTTLE, error_code=code, producer_id=producer_id, producer_epoch=epoch
    )


async def handle_add_partitions_to_txn(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    topics = [(topic.name, tuple(topic.partitions)) for topic in body.v3_and_below_topics]
    refused: dict[tuple[str, int], ErrorCode] = {}
    for name, partitions in topics:
        if is_internal_topic(name):  # as Kafka's handleAddPartitionsToTxnRequest answers a client
            refused |= dict.fromkeys(((name, p) for p in partitions), ErrorCode.topic_authorization_failed)
            continue
        try:
            count = await broker.partition_count(name, auto_create=False)
        except InvalidTopicError:
            count = None
        unknown = (p for p in partitions if count is None or not 0 <= p < count)
        refused |= dict.fromkeys(((name, p) for p in unknown), ErrorCode.unknown_topic_or_partition)
    code = ErrorCode.none
    if refused:
        code = ErrorCode.operation_not_attempted  # Kafka adds none when one is refused
    else:
        try:
            # The end answered before must be complete: until then its partitions are its own.
            await broker.transactions.settled(body.v3_and_below_transactional_id)
            broker.transactions.add_partitions(
                body.v3_and_below_transactional_id,
                body.v3_and_below_producer_id,
                body.v3_and_below_producer_epoch,
                [TopicPartition(name, p) for name, partitions in topics for p in partitions],
            )
        except TxnError as exc:
            code = _code(request, exc.code)
    topic_type = nested(response, "results_by_topic_v3_and_below")
    partition_type = nested(topic_type, "results_by_partition")
    results = tuple(
        build(
            topic_type,
            name=name,
            results_by_partition=tuple(
                build(
                    partition_type,
                    partition_index=p,
                    partition_error_code=refused.get((name, p), code),
                )
                for p in partitions
            ),
        )
        for name, partitions in topics
    )
    return build(response, throttle_time=NO_THROTTLE, results_by_topic_v3_and_below=results)


async def handle_add_offsets_to_txn(broker: Broker, request: Request) -> Any:
    body = request.body
    code = ErrorCode.none
    try:
        await broker.transactions.settled(body.transactional_id)
        broker.transactions.add_offsets(
            body.transactional_id, body.producer_id, body.producer_epoch, body.group_id
        )
    except TxnError as exc:
        code = _code(request, exc.code)
    return build(
        response_type(request.api_key, request.api_version), throttle_time=NO_THROTTLE, error_code=code
    )


async def handle_end_txn(broker: Broker, request: Request) -> Any:
    body = request.body
    code = ErrorCode.none
    try:
        await broker.transactions.end(
            body.transactional_id, body.producer_id, body.producer_epoch, body.committed
        )
    except TxnError as exc:
        code = _code(request, exc.code)
    except OncelogError as exc:
        code = error_code_for(exc)
    return build(
        response_type(request.api_key, request.api_version), throttle_time=NO_THROTTLE, error_code=code
    )


async def handle_txn_offset_commit(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    offsets, refused = offsets_of(broker, body.topics)
    # v3 names the consumer's generation and member: fenced like OffsetCommit (KIP-447).
    code = broker.groups.check_transactional_commit(
        body.group_id,
        getattr(body, "generation_id", -1),
        getattr(body, "member_id", ""),
        getattr(body, "group_instance_id", None),
    )
    if code == ErrorCode.none:
        try:
            await broker.transactions.settled(body.transactional_id)
            broker.transactions.commit_offsets(
                body.transactional_id, body.producer_id, body.producer_epoch, body.group_id, offsets
            )
        except TxnError as exc:
            code = _code(request, exc.code)
    return build(
        response, throttle_time=NO_THROTTLE, topics=partition_answers(response, body.topics, code, refused)
    )
