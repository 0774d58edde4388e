"""oncelog: a durable on-disk log engine with Kafka v2 record batches."""

from oncelog import errors  # first: oncelog.segments imports it during package init
from oncelog.config import LogConfig
from oncelog.errors import (
    CorruptRecordError,
    InvalidRecordError,
    LogClosedError,
    LogFailedError,
    NotASegmentError,
    OffsetOutOfRangeError,
    OncelogError,
    RecordTooLargeError,
)
from oncelog.log import Log
from oncelog.producer_state import BatchMetadata, ProducerStateEntry
from oncelog.recovery.loader import RecoveryReport
from oncelog.results import AppendResult, FetchResult
from oncelog.segments import Record, RecordBatch, encode_batch, iter_batches
from oncelog.segments.index import TimestampOffset

__all__ = [
    "AppendResult",
    "FetchResult",
    "Log",
    "TimestampOffset",
    "CorruptRecordError",
    "InvalidRecordError",
    "BatchMetadata",
    "CorruptLogError",
    "CorruptSnapshotError",
    "InvalidProducerEpochError",
    "LogClosedError",
    "LogDirLockedError",
    "LogFailedError",
    "OutOfOrderSequenceError",
    "ProducerStateEntry",
    "ProducerStateFullError",
    "RecoveryReport",
    "LogConfig",
    "NotASegmentError",
    "OffsetOutOfRangeError",
    "OncelogError",
    "Record",
    "RecordBatch",
    "RecordTooLargeError",
    "encode_batch",
    "errors",
    "iter_batches",
]
