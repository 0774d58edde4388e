"""oncelog.segments: the pure batch codec, segment files, indexes and the read path."""

from oncelog.segments.batch import (
    RecordBatch,
    TruncatedBatchError,
    UnwrittenSpaceError,
    encode_batch,
    iter_batches,
)
from oncelog.segments.records import Record

__all__ = [
    "Record",
    "RecordBatch",
    "TruncatedBatchError",
    "UnwrittenSpaceError",
    "encode_batch",
    "iter_batches",
]
