"""The checks a batch must pass before the log accepts it (brief §4, "Batch validation")."""

from __future__ import annotations

from typing import Literal

from oncelog.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from oncelog.recovery.fs import Buffer
from oncelog.segments.batch import RecordBatch

Origin = Literal["client", "replication"]


def validate_batch(buffer: Buffer, origin: Origin, max_batch_bytes: int) -> RecordBatch:
    """Parse and check one batch; raises without side effects.

    Replication (and recovery) accepts what a leader or the log itself stored, so
    only the structure and CRC are checked there: compacted logs legally hold
    batches whose count is below lastOffsetDelta + 1, and control batches.
    """
    if len(buffer) > max_batch_bytes:
        raise RecordTooLargeError(f"batch of {len(buffer)} bytes exceeds max_batch_bytes={max_batch_bytes}")
    batch = RecordBatch(buffer)
    if batch.size != len(buffer):
        raise CorruptRecordError(f"buffer holds {len(buffer)} bytes but its batchLength says {batch.size}")
    batch.validate()
    if origin == "replication":
        return batch
    if batch.records_count <= 0 or batch.last_offset_delta + 1 != batch.records_count:
        raise InvalidRecordError(
            f"recordsCount {batch.records_count} must equal lastOffsetDelta + 1 "
            f"({batch.last_offset_delta + 1})"
        )
    if batch.is_control:
        raise InvalidRecordError("clients may not append control batches")
    if batch.producer_id >= 0 and batch.base_sequence < 0:
        raise InvalidRecordError(f"producer {batch.producer_id} sent baseSequence {batch.base_sequence}")
    return batch
