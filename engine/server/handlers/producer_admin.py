"""What the engine knows of producers and transactions, for operators (KIP-664):
DescribeProducers (API 61, v0), ListTransactions (66, v0-1), DescribeTransactions (65, v0).

- DescribeProducers: each partition's live producers from its producer state (id, epoch,
  last sequence and timestamp, coordinator epoch, and the first offset of a transaction
  open there, -1 if none); an unknown partition is UNKNOWN_TOPIC_OR_PARTITION.
- ListTransactions: every transactional id the coordinator holds, with its state,
  filtered by states (an unknown state name is listed back in unknown_state_filters),
  producer ids and, v1+, the duration of the open transaction (KIP-994).
- DescribeTransactions: one id's state, timeout, start time, producer and partitions; an
  unknown id is TRANSACTIONAL_ID_NOT_FOUND.

Authorization, as Kafka's: DescribeProducers needs Read on each topic (TOPIC_AUTHORIZATION_FAILED
per partition); ListTransactions lists only the ids the principal may Describe;
DescribeTransactions needs Describe on each id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED in its
entry) and leaves out the topics the principal may not Describe.
"""

from __future__ import annotations

import datetime
from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.server.acls import Operation
from oncelog.server.broker import Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, nested, response_type
from oncelog.server.errors import InternalTopicError, error_code_for
from oncelog.server.txn_state import TxnState


class _NotAllowed(Exception):
    pass


_STATES: Final = {state.value for state in TxnState}
_OPEN: Final = (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


async def handle_describe_producers(broker: Broker, request: Request) -> Any:
    response = response_type(request.api_key, request.api_version)
    topic_type = nested(response, "topics")
    partition_type = nested(topic_type, "partitions")
    producer_type = nested(partition_type, "active_producers")
    topics = []
    access = broker.access(request)
    for topic in request.body.topics:
        partitions = []
        readable = access.topic(Operation.READ, topic.name)
        for index in topic.partition_indexes:
            code, message, producers = ErrorCode.none, None, ()
            try:
                if not readable:
                    raise _NotAllowed
                producers = tuple(
                    build(
                        producer_type,
                        producer_id=each.producer_id,
                        producer_epoch=each.producer_epoch,
                        last_sequence=each.last_sequence,
                        last_timestamp=each.last_timestamp_ms,
                        coordinator_epoch=each.coordinator_epoch,
                        current_txn_start_offset=each.current_txn_first_offset,
                    )
                    for each in broker.client_log(topic.name, index).producers()
                )
            except (OncelogError, InternalTopicError) as exc:
                code, message = error_code_for(exc), str(exc)
            except _NotAllowed:
                code, message = ErrorCode.topic_authorization_failed, "the principal may not Read this topic"
            partitions.append(
                build(
                    partition_type,
                    partition_index=index,
                    error_code=code,
                    error_message=message,
                    active_producers=producers,
                )
            )
        topics.append(build(topic_type, name=topic.name, partitions=tuple(partitions)))
    return build(response, throttle_time=NO_THROTTLE, topics=tuple(topics))


async def handle_list_transactions(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    state_type = nested(response, "transaction_states")
    wanted_states = set(body.state_filters)
    wanted_producers = set(body.producer_id_filters)
    min_duration_ms = getattr(body, "duration_filter", -1)
    now_ms = broker.groups.now_ms()
    access = broker.access(request)
    listed = []
    for txn in sorted(broker.transactions.transactions.values(), key=lambda t: t.transactional_id):
        if not access.transactional_id(Operation.DESCRIBE, txn.transactional_id):
            continue
        if wanted_states and txn.state.value not in wanted_states:
            continue
        if wanted_producers and txn.producer_id not in wanted_producers:
            continue
        if min_duration_ms >= 0 and not (txn.state in _OPEN and now_ms - txn.started_ms >= min_duration_ms):
            continue
        listed.append(
            build(
                state_type,
                transactional_id=txn.transactional_id,
                producer_id=txn.producer_id,
                transaction_state=txn.state.value,
            )
        )
    return build(
        response,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        unknown_state_filters=tuple(sorted(wanted_states - _STATES)),
        transaction_states=tuple(listed),
    )


async def handle_describe_transactions(broker: Broker, request: Request) -> Any:
    response = response_type(request.api_key, request.api_version)
    state_type = nested(response, "transaction_states")
    topic_type = nested(state_type, "topics")
    described = []
    access = broker.access(request)
    for transactional_id in request.body.transactional_ids:
        allowed = access.transactional_id(Operation.DESCRIBE, transactional_id)
        txn = broker.transactions.transactions.get(transactional_id) if allowed else None
        if txn is None:
            described.append(
                build(
                    state_type,
                    error_code=ErrorCode.transactional_id_not_found
                    if allowed
                    else ErrorCode.transactional_id_authorization_failed,
                    transactional_id=transactional_id,
                    transaction_state="",
                    transaction_timeout=datetime.timedelta(0),
                    transaction_start_time=_instant(-1),
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=(),
                )
            )
            continue
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(txn.partitions):
            if access.topic(Operation.DESCRIBE, tp.topic):
                by_topic.setdefault(tp.topic, []).append(tp.partition)
        described.append(
            build(
                state_type,
                error_code=ErrorCode.none,
                transactional_id=transactional_id,
                transaction_state=txn.state.value,
                transaction_timeout=datetime.timedelta(milliseconds=txn.timeout_ms),
                transaction_start_time=_instant(txn.started_ms if txn.state in _OPEN else -1),
                producer_id=txn.producer_id,
                producer_epoch=txn.producer_epoch,
                topics=tuple(
                    build(topic_type, topic=name, partitions=tuple(parts)) for name, parts in by_topic.items()
                ),
            )
        )
    return build(response, throttle_time=NO_THROTTLE, transaction_states=tuple(described))


def _instant(epoch_ms: int) -> datetime.datetime:
    """kio's timestamp field of `epoch_ms` (Kafka's -1, no transaction open, included)."""
    return datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
