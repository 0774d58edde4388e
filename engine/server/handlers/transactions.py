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
or one the principal may not Write is TOPIC_AUTHORIZATION_FAILED (Kafka authorizes no
client to write an internal one), an unknown or invalid one UNKNOWN_TOPIC_OR_PARTITION,
and every other OPERATION_NOT_ATTEMPTED.

Authorization, as Kafka's: everything that names a transactional id needs Write on it
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED: at the top, or on every partition where the
answer has no error at the top), so a principal cannot fence an id it may not write.
InitProducerId without one needs IdempotentWrite on the cluster or Write on some topic
(CLUSTER_AUTHORIZATION_FAILED). AddOffsetsToTxn and TxnOffsetCommit need Read on the
group (GROUP_AUTHORIZATION_FAILED), TxnOffsetCommit Read on each topic.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.layout import InvalidTopicError, TopicPartition
from oncelog.server.acls import Operation, ResourceType
from oncelog.server.authorization import Access
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


def _may_write_id(broker: Broker, request: Request, transactional_id: str) -> bool:
    return broker.access(request).transactional_id(Operation.WRITE, transactional_id)


def _init_refusal(access: Access, transactional_id: str | None) -> ErrorCode | None:
    if transactional_id is None:
        if access.cluster(Operation.IDEMPOTENT_WRITE) or access.any_of_type(
            Operation.WRITE, ResourceType.TOPIC
        ):
            return None
        return ErrorCode.cluster_authorization_failed
    if transactional_id and not access.transactional_id(Operation.WRITE, transactional_id):
        return ErrorCode.transactional_id_authorization_failed
    return None


async def handle_init_producer_id(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    producer_id, epoch, code = -1, -1, ErrorCode.none
    refusal = _init_refusal(broker.access(request), body.transactional_id)
    try:
        if refusal is not None:
            code = refusal
        elif body.transactional_id is None:
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
    access = broker.access(request)
    if not access.transactional_id(Operation.WRITE, body.v3_and_below_transactional_id):
        every = ((name, p) for name, partitions in topics for p in partitions)
        refused = dict.fromkeys(every, ErrorCode.transactional_id_authorization_failed)
        topics_to_check: list[tuple[str, tuple[int, ...]]] = []
    else:
        topics_to_check = topics
    for name, partitions in topics_to_check:
        if is_internal_topic(name) or not access.topic(Operation.WRITE, name):  # (internal: as Kafka)
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
    access = broker.access(request)
    try:
        if not access.transactional_id(Operation.WRITE, body.transactional_id):
            raise TxnError(ErrorCode.transactional_id_authorization_failed, "not allowed")
        if not access.group(Operation.READ, body.group_id):
            raise TxnError(ErrorCode.group_authorization_failed, "not allowed")
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
        if not _may_write_id(broker, request, body.transactional_id):
            raise TxnError(ErrorCode.transactional_id_authorization_failed, "not allowed")
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
    access = broker.access(request)
    denied = None
    if not access.transactional_id(Operation.WRITE, body.transactional_id):
        denied = ErrorCode.transactional_id_authorization_failed
    elif not access.group(Operation.READ, body.group_id):
        denied = ErrorCode.group_authorization_failed
    if denied is not None:
        return build(
            response, throttle_time=NO_THROTTLE, topics=partition_answers(response, body.topics, denied, {})
        )
    offsets, refused = offsets_of(broker, access, body.topics)
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
