"""oncelog: a durable on-disk log engine with Kafka v2 record batches."""

from oncelog import errors  # first: oncelog.segments imports it during package init
from oncelog.config import LogConfig
from oncelog.errors import (
    CorruptLogError,
    CorruptMetadataError,
    CorruptRecordError,
    CorruptSnapshotError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    LockTimeoutError,
    LogClosedError,
    LogDirectoryError,
    LogDirLockedError,
    LogFailedError,
    MetadataMissingError,
    MetadataWriteError,
    NotASegmentError,
    OffsetOutOfRangeError,
    OncelogError,
    OutOfOrderSequenceError,
    ProducerIdsExhaustedError,
    ProducerStateFullError,
    RecordTooLargeError,
    RetriableError,
    TransactionCoordinatorFencedError,
    TruncatedBeforeDurableError,
)
from oncelog.layout import InvalidTopicError, TopicPartition
from oncelog.log import Log
from oncelog.log_manager import LogManager, PartitionRecoveryError, UnknownTopicOrPartitionError
from oncelog.producer_ids import ProducerIdManager, ProducerLease
from oncelog.producer_state import BatchMetadata, ProducerStateEntry
from oncelog.recovery.loader import RecoveryReport
from oncelog.recovery_progress import RecoverySummary
from oncelog.results import AppendResult, FetchResult
from oncelog.segments import Record, RecordBatch, encode_batch, iter_batches
from oncelog.segments.index import TimestampOffset

__all__ = [
    "LockTimeoutError",
    "UnknownTopicOrPartitionError",
    "TopicPartition",
    "RecoverySummary",
    "PartitionRecoveryError",
    "LogManager",
    "InvalidTopicError",
    "AppendResult",
    "BatchMetadata",
    "CorruptLogError",
    "CorruptMetadataError",
    "CorruptRecordError",
    "CorruptSnapshotError",
    "FetchResult",
    "InvalidProducerEpochError",
    "InvalidRecordError",
    "InvalidTxnStateError",
    "Log",
    "LogClosedError",
    "LogConfig",
    "LogDirectoryError",
    "LogDirLockedError",
    "MetadataMissingError",
    "MetadataWriteError",
    "LogFailedError",
    "NotASegmentError",
    "OffsetOutOfRangeError",
    "OncelogError",
    "OutOfOrderSequenceError",
    "ProducerIdManager",
    "ProducerLease",
    "ProducerStateEntry",
    "ProducerIdsExhaustedError",
    "ProducerStateFullError",
    "Record",
    "RecordBatch",
    "RecordTooLargeError",
    "RecoveryReport",
    "RetriableError",
    "TransactionCoordinatorFencedError",
    "TruncatedBeforeDurableError",
    "TimestampOffset",
    "encode_batch",
    "errors",
    "iter_batches",
]
