"""oncelog's exceptions as Kafka error codes: one table, used by every API; and the server's own.

Below every other module of the server (it imports none of them): the broker raises
the server's exceptions, the handlers turn any exception into a code here.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from oncelog.errors import (
    CorruptLogError,
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    LogClosedError,
    LogFailedError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProducerStateFullError,
    RecordTooLargeError,
    TooManyOpenFilesError,
)
from oncelog.layout import InvalidTopicError
from oncelog.log_manager import UnknownTopicOrPartitionError


class TopicExistsError(Exception):
    """CreateTopics of a topic that exists (TOPIC_ALREADY_EXISTS)."""


class InvalidPartitionsError(Exception):
    """A partition count out of 1..MAX_PARTITIONS_PER_TOPIC or past the server budget (INVALID_PARTITIONS)."""


class InternalTopicError(Exception):
    """A client asked to create, write or read one of Kafka's internal topics.

    INVALID_TOPIC_EXCEPTION, as Kafka answers a client's append to one; CreateTopics
    answers INVALID_REQUEST, as Kafka answers for its own internal metadata topic.
    """


# Most specific first: RecordTooLargeError is an InvalidRecordError.
_CODES: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (OutOfOrderSequenceError, ErrorCode.out_of_order_sequence_number),
    (InvalidProducerEpochError, ErrorCode.invalid_producer_epoch),
    (RecordTooLargeError, ErrorCode.message_too_large),
    (CorruptRecordError, ErrorCode.corrupt_message),
    (InvalidRecordError, ErrorCode.invalid_record),
    (UnknownTopicOrPartitionError, ErrorCode.unknown_topic_or_partition),
    (InvalidTopicError, ErrorCode.invalid_topic_exception),
    # Kafka's answer to a client's append to an internal topic (ReplicaManager.appendToLocalLog).
    (InternalTopicError, ErrorCode.invalid_topic_exception),
    (TopicExistsError, ErrorCode.topic_already_exists),
    (InvalidPartitionsError, ErrorCode.invalid_partitions),
    (OffsetOutOfRangeError, ErrorCode.offset_out_of_range),
    (InvalidTxnStateError, ErrorCode.invalid_txn_state),
    # A full producer table refuses new producers until some expire. NOT_ENOUGH_REPLICAS
    # is retriable in every client, says nothing was written, and makes no client bump
    # its epoch, reset sequences or look for another coordinator: it simply retries.
    (ProducerStateFullError, ErrorCode.not_enough_replicas),
    # The log refuses appends until reopened (a failed fsync) or its bytes fail their
    # check on read: Kafka's answer for a failed log directory.
    (LogFailedError, ErrorCode.kafka_storage_error),
    (CorruptLogError, ErrorCode.kafka_storage_error),
    # A read at the open-files limit: retriable in every client (it refreshes metadata and
    # fetches again), and nothing changed in the log.
    (TooManyOpenFilesError, ErrorCode.kafka_storage_error),
    # Closed under a request during shutdown: retriable, and sends the client to
    # Metadata, then to the restarted server.
    (LogClosedError, ErrorCode.not_leader_or_follower),
)


def error_code_for(exc: BaseException) -> ErrorCode:
    """The Kafka error code a client gets for `exc` (UNKNOWN_SERVER_ERROR if unmapped)."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return ErrorCode.unknown_server_error
