"""DeleteTopics (API 20, v1-6) and CreatePartitions (37, v0-3): a topic's lifecycle after its
creation (CreateTopics is create_topics).

- DeleteTopics: the topic stops being served at once, then its partitions, configs and
  records go (Broker.delete_topic: crash-safe, a delete a stop interrupted finishes at the
  next start), and the groups' committed offsets of it are forgotten, as Kafka cleans
  them. By name only (v6 by topic id is UNKNOWN_TOPIC_ID: no topic ids are served);
  Kafka's internal topics are INVALID_REQUEST; a topic named twice INVALID_REQUEST.
  Open transactions on it end without markers there (the partitions are gone).
- CreatePartitions grows a topic; its count is stored before the partitions are made.
  Fewer or as many partitions, or more than the server's budget, is INVALID_PARTITIONS;
  a replica assignment other than this one node INVALID_REPLICA_ASSIGNMENT.

Authorization, as Kafka's: DeleteTopics needs Delete on the cluster, or Describe and Delete
on the topic (a topic the principal may not Describe is TOPIC_AUTHORIZATION_FAILED whether
it exists or not; one it may describe but not delete is too, once it is known to exist);
CreatePartitions needs Alter on the topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.layout import InvalidTopicError
from oncelog.log_manager import UnknownTopicOrPartitionError
from oncelog.server.acls import Operation
from oncelog.server.authorization import Access
from oncelog.server.broker import NODE_ID, Broker
from oncelog.server.codec import NO_THROTTLE, Request, build, nested, response_type
from oncelog.server.errors import InternalTopicError, InvalidPartitionsError, error_code_for
from oncelog.server.txn_state import TxnError

NO_TOPIC_ID: Final = uuid.UUID(int=0)


async def handle_delete_topics(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    answer_type = nested(response, "responses")
    if hasattr(body, "topics"):  # v6: by name or by topic id
        wanted = [(each.name, each.topic_id) for each in body.topics]
    else:
        wanted = [(name, None) for name in body.topic_names]
    names = [name for name, _ in wanted]
    access = broker.access(request)
    answers = []
    for name, topic_id in wanted:
        refusal = None if name is None else _delete_refusal(broker, access, name)
        message: str | None
        if refusal is not None:
            code, message = refusal, "the principal may not delete this topic (it needs Describe and Delete)"
        else:
            code, message = await _delete(broker, name, topic_id, names.count(name))
        answers.append(
            build(
                answer_type,
                name=name,
                topic_id=topic_id or NO_TOPIC_ID,
                error_code=code,
                error_message=message,
            )
        )
    return build(response, throttle_time=NO_THROTTLE, responses=tuple(answers))


def _delete_refusal(broker: Broker, access: Access, name: str) -> ErrorCode | None:
    if access.cluster(Operation.DELETE):
        return None
    if not access.topic(Operation.DESCRIBE, name):
        return ErrorCode.topic_authorization_failed
    if name in broker.topics() and not access.topic(Operation.DELETE, name):
        return ErrorCode.topic_authorization_failed
    return None


async def _delete(
    broker: Broker, name: str | None, topic_id: uuid.UUID | None, times_named: int
) -> tuple[ErrorCode, str | None]:
    if name is None:
        return ErrorCode.unknown_topic_id, f"topic ids are not served here ({topic_id}): name the topic"
    if times_named > 1:
        return ErrorCode.invalid_request, f"the request names topic {name!r} more than once"
    try:
        await broker.delete_topic(name)
    except InternalTopicError as exc:
        return ErrorCode.invalid_request, str(exc)
    except (UnknownTopicOrPartitionError, InvalidTopicError, OncelogError) as exc:
        return error_code_for(exc), str(exc)
    except TxnError as exc:  # a transaction's offsets of it not stored: the next start finishes the delete
        return exc.code, str(exc)
    return ErrorCode.none, None


async def handle_create_partitions(broker: Broker, request: Request) -> Any:
    body = request.body
    response = response_type(request.api_key, request.api_version)
    result_type = nested(response, "results")
    names = [each.name for each in body.topics]
    access = broker.access(request)
    results = []
    for each in body.topics:
        code, message = ErrorCode.none, None
        if not access.topic(Operation.ALTER, each.name):
            code, message = ErrorCode.topic_authorization_failed, "the principal may not Alter this topic"
        elif names.count(each.name) > 1:
            code, message = ErrorCode.invalid_request, f"the request names topic {each.name!r} more than once"
        elif each.assignments is not None and any(list(a.broker_ids) != [NODE_ID] for a in each.assignments):
            code, message = ErrorCode.invalid_replica_assignment, f"every replica is on node {NODE_ID}"
        else:
            try:
                await broker.add_partitions(each.name, each.count, validate_only=body.validate_only)
            except InternalTopicError as exc:
                code, message = ErrorCode.invalid_request, str(exc)
            except (
                InvalidPartitionsError,
                UnknownTopicOrPartitionError,
                InvalidTopicError,
                OncelogError,
            ) as exc:
                code, message = error_code_for(exc), str(exc)
        results.append(build(result_type, name=each.name, error_code=code, error_message=message))
    return build(response, throttle_time=NO_THROTTLE, results=tuple(results))
