"""oncelog: a durable on-disk log engine with Kafka v2 record batches."""

from oncelog import errors  # first: oncelog.segments imports it during package init
from oncelog.config import LogConfig
from oncelog.errors import (
    CorruptRecordError,
    InvalidRecordError,
    LogClosedError,
    NotASegmentError,
    OffsetOutOfRangeError,
    OncelogError,
    RecordTooLargeError,
    StorageFailedError,
)
from oncelog.segments import Record, RecordBatch, encode_batch, iter_batches

__all__ = [
    "CorruptRecordError",
    "InvalidRecordError",
    "LogClosedError",
    "LogConfig",
    "NotASegmentError",
    "OffsetOutOfRangeError",
    "OncelogError",
    "Record",
    "RecordBatch",
    "RecordTooLargeError",
    "StorageFailedError",
    "encode_batch",
    "errors",
    "iter_batches",
]
