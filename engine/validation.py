"""The checks a batch must pass before the log accepts it (brief §4, "Batch validation")."""

from __future__ import annotations

from typing import Any, Literal

import crc32c

from oncelog.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from oncelog.recovery.fs import Buffer
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch

Origin = Literal["client", "replication"]


def batch_buffer(buffer: object) -> Buffer:
    """`buffer` as the bytes of a batch: bytes, bytearray, or any C-contiguous buffer of bytes.

    TypeError, saying what is wanted, for anything else: a str, a strided (non-contiguous)
    view, a buffer of wider items (whose len() counts items, not bytes).
    """
    if type(buffer) is bytes or type(buffer) is bytearray:
        return buffer
    try:
        view = memoryview(buffer)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"a batch is bytes, bytearray or a C-contiguous buffer of bytes, got {type(buffer).__name__}"
        ) from None
    if not view.c_contiguous:
        raise TypeError("a batch must be C-contiguous bytes; this buffer is strided: pass bytes(view)")
    if view.itemsize != 1 or view.format not in ("B", "b", "c"):
        raise TypeError(
            f"a batch must be a buffer of bytes, got items of format {view.format!r} "
            f"({view.itemsize} bytes each): pass view.cast('B')"
        )
    return view if view.ndim == 1 and view.format == "B" else view.cast("B")


def validate_batch(buffer: Buffer, origin: Origin, max_batch_bytes: int) -> RecordBatch:
    """Parse and check one batch; raises without side effects.

    Replication (and recovery) accepts what a leader or the log itself stored, so
    only the structure and CRC are checked there: compacted logs legally hold
    batches whose count is below lastOffsetDelta + 1, and control batches.
    """
    if type(buffer) is not bytes:
        buffer = batch_buffer(buffer)
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


# Attribute bits a client batch may not set: the control bit, and compression codes
# past the last known one (bits 0-2 above zstd's 4).
_MAX_CODEC = max(fmt.COMPRESSION_NAMES)
_CODEC_AND_CONTROL = fmt.COMPRESSION_MASK | fmt.CONTROL_MASK
_HEADER = fmt.HEADER_STRUCT
_COPY_TO_CRC_BYTES = 1024
_CRC_START = fmt.ATTRIBUTES_OFFSET


def client_batch_header(buffer: Buffer, max_batch_bytes: int) -> tuple[Any, ...]:
    """The header fields of a client batch that passes every check; raises like validate_batch.

    The append fast path: one struct unpack and one CRC, no objects. Anything
    unusual goes to validate_batch, which names the exact problem, so the rules
    and their messages live in one place.
    """
    size = len(buffer)
    if fmt.HEADER_SIZE <= size <= max_batch_bytes:
        header = _HEADER.unpack_from(buffer)
        (_, length, _, magic, crc, attributes, last_delta, _, _, pid, _, base_sequence, count) = header
        if (
            length + fmt.LOG_OVERHEAD == size
            and magic == fmt.MAGIC_V2
            and count == last_delta + 1 > 0
            # Not a control batch, and a known codec: one mask, one compare.
            and attributes & _CODEC_AND_CONTROL <= _MAX_CODEC
            and (pid < 0 or base_sequence >= 0)
            # A slice of a small batch copies faster than a memoryview is made.
            and crc32c.crc32c(
                buffer[_CRC_START:] if size <= _COPY_TO_CRC_BYTES else memoryview(buffer)[_CRC_START:]
            )
            == crc
        ):
            return header
    validate_batch(buffer, "client", max_batch_bytes)
    raise AssertionError(f"validate_batch accepted a batch the fast check refused: {bytes(buffer[:61])!r}")
