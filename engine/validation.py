"""The checks a batch must pass before the log accepts it, as Kafka's LogValidator checks them.

Every record is checked too, on both append paths (segments.batch.check_batch_records,
Kafka's LogValidator): a batch with a right CRC over a body that does not hold its
records would otherwise be stored, take the offsets its header claims, and break
every reader after it.
"""

from __future__ import annotations

from typing import Any, Literal

import crc32c

from oncelog.compiled_append import client_batch_passes
from oncelog.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, check_batch_records
from oncelog.segments.format import Buffer
from oncelog.segments.records import check_records

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


def validate_batch(
    buffer: Buffer, origin: Origin, max_batch_bytes: int, max_decompressed_bytes: int
) -> RecordBatch:
    """Parse and check one batch and its records; raises without side effects.

    Replication accepts what a leader stored, so the append rules are not checked
    there: compacted logs legally hold batches whose count is below
    lastOffsetDelta + 1 (with gaps between the records' offset deltas), and control
    batches. The structure, the CRC and the records' framing and count still are:
    Kafka's follower checks only the batch CRC, but a leader's bytes that no reader
    can decode are no more use here than a client's.
    """
    if type(buffer) is not bytes:
        buffer = batch_buffer(buffer)
    if origin == "client" and client_batch_passes(buffer, max_batch_bytes):
        # Checked in C as the compiled append checks (the records walked at C speed: a
        # transaction's first batch in a partition takes this path, not the compiled one).
        return RecordBatch(buffer)
    if len(buffer) > max_batch_bytes:
        raise RecordTooLargeError(f"batch of {len(buffer)} bytes exceeds max_batch_bytes={max_batch_bytes}")
    batch = RecordBatch(buffer)
    if batch.size != len(buffer):
        raise CorruptRecordError(f"buffer holds {len(buffer)} bytes but its batchLength says {batch.size}")
    batch.validate()
    if origin == "replication":
        batch.check_records(exact=False, max_decompressed_bytes=max_decompressed_bytes)
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
    max_ts_delta = batch.check_records(exact=True, max_decompressed_bytes=max_decompressed_bytes)
    check_max_timestamp(batch.attributes, batch.base_timestamp, batch.max_timestamp, max_ts_delta)
    return batch


def check_max_timestamp(
    attributes: int, base_timestamp_ms: int, max_timestamp_ms: int, max_ts_delta: int
) -> None:
    """A client's header maxTimestamp must be its records' largest timestamp.

    Time lookups (ListOffsets by time, the time index) and time-based rolls and
    retention trust the header; every Kafka client writes the records' largest
    timestamp there (Kafka's broker rewrites the field; oncelog keeps the client's
    bytes, so it refuses a batch whose field lies). A LogAppendTime batch's field is
    the append time, not the records'.
    """
    if attributes & fmt.TIMESTAMP_TYPE_MASK:
        return
    if base_timestamp_ms + max_ts_delta != max_timestamp_ms:
        raise InvalidRecordError(
            f"maxTimestamp {max_timestamp_ms} in the header is not the records' largest timestamp "
            f"{base_timestamp_ms + max_ts_delta}"
        )


# Attribute bits a client batch may not set: the control bit, and compression codes
# past the last known one (bits 0-2 above zstd's 4).
_MAX_CODEC = max(fmt.COMPRESSION_NAMES)
_CODEC_AND_CONTROL = fmt.COMPRESSION_MASK | fmt.CONTROL_MASK
_HEADER = fmt.HEADER_STRUCT
_COPY_TO_CRC_BYTES = 1024
_CRC_START = fmt.ATTRIBUTES_OFFSET


def client_batch_header(buffer: Buffer, max_batch_bytes: int, max_decompressed_bytes: int) -> tuple[Any, ...]:
    """The header fields of a client batch that passes every check; raises like validate_batch.

    The single-batch route's check (Log.append): one struct unpack, one CRC and one walk over the records,
    no objects. Anything unusual in the header goes to validate_batch, which names
    the exact problem, so the rules and their messages live in one place; the
    records are checked after the header here as there, by the same function.
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
            if attributes & fmt.COMPRESSION_MASK:
                max_ts_delta = check_batch_records(
                    buffer,
                    attributes,
                    last_delta,
                    count,
                    exact=True,
                    max_decompressed_bytes=max_decompressed_bytes,
                )
            else:
                # What check_batch_records does for an uncompressed body, one call less.
                max_ts_delta = check_records(buffer, fmt.HEADER_SIZE, count, last_delta, exact=True)
            if header[7] + max_ts_delta == header[8] or attributes & fmt.TIMESTAMP_TYPE_MASK:
                return header  # (base, max) timestamps agree with the records, as check_max_timestamp asks
    validate_batch(buffer, "client", max_batch_bytes, max_decompressed_bytes)
    raise AssertionError(
        f"validate_batch accepted a batch the single-batch check refused: {bytes(buffer[:61])!r}"
    )
