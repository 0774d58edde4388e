"""oncelog.segments: the pure batch codec, segment files, indexes and the read path."""

from oncelog.segments.batch import RecordBatch, TruncatedBatchError, encode_batch, iter_batches
from oncelog.segments.records import Record

__all__ = ["Record", "RecordBatch", "TruncatedBatchError", "encode_batch", "iter_batches"]
