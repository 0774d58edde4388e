"""A produce request after its checks: each batch's offsets and state, and the bytes to write.

The log plans a request (offsets, producer rules) with no I/O and no state
change, then writes it; these are the plan's pieces. Stamping rewrites only the
17 bytes no CRC covers, so the body goes to the kernel as the client sent it
(LogAppendTime is the one case that copies, because it changes CRC-covered fields).
"""

from __future__ import annotations

import crc32c

from oncelog.producer_state import CompletedTxn, WorkingState
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch
from oncelog.segments.format import Buffer


class PlannedBatch:
    """One batch of a request after checks: where it goes, or the duplicate it is."""

    __slots__ = ("base", "batch", "completed", "duplicate", "last", "max_ts", "producer_after", "replicated")

    def __init__(
        self,
        batch: RecordBatch,
        base: int,
        last: int,
        max_ts: int,
        duplicate: bool,
        producer_after: WorkingState | None = None,
        replicated: bool = False,
        completed: CompletedTxn | None = None,
    ):
        self.batch = batch
        self.base = base
        self.last = last
        self.max_ts = max_ts
        self.duplicate = duplicate
        # The producer's state once this batch is written (None: no producer id).
        self.producer_after = producer_after
        self.replicated = replicated
        # The transaction a marker closed (None for data, and for an empty transaction).
        self.completed = completed


def stamped_buffers(p: PlannedBatch, log_append_time: bool) -> list[Buffer]:
    """The batch's bytes with its base offset set (and its timestamp on LogAppendTime)."""
    buf = p.batch.buffer
    if p.replicated:
        return [buf]  # a follower stores its leader's bytes as they are
    # Like a Kafka broker, stamp the fields outside the CRC: the offset, and the
    # partition leader epoch (oncelog has none: -1). Only these 17 bytes are new.
    prefix = fmt.SIZE_AND_MAGIC_STRUCT.pack(
        p.base, p.batch.batch_length, fmt.NO_PARTITION_LEADER_EPOCH, fmt.MAGIC_V2
    )
    if not log_append_time:
        if buf[: fmt.SIZE_AND_MAGIC_BYTES] == prefix:
            return [buf]
        return [prefix, buf[fmt.SIZE_AND_MAGIC_BYTES :]]
    # LogAppendTime changes CRC-covered fields, so this path copies the batch.
    out = bytearray(buf)
    out[: fmt.SIZE_AND_MAGIC_BYTES] = prefix
    attributes = p.batch.attributes | fmt.TIMESTAMP_TYPE_MASK
    out[fmt.ATTRIBUTES_OFFSET : fmt.ATTRIBUTES_OFFSET + 2] = attributes.to_bytes(2, "big", signed=True)
    fmt.INT64.pack_into(out, fmt.MAX_TIMESTAMP_OFFSET, p.max_ts)
    fmt.UINT32.pack_into(out, fmt.CRC_OFFSET, crc32c.crc32c(memoryview(out)[fmt.ATTRIBUTES_OFFSET :]))
    return [out]
