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
from oncelog.config import CompressionType
from oncelog.errors import CorruptRecordError, InvalidRecordError, KeylessRecordError, RecordTooLargeError
from oncelog.segments import compaction
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, check_batch_records
from oncelog.segments.compression import compress, decompress
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


def stored_codec(compression_type: CompressionType) -> int | None:
    """The codec a log's `compression_type` stores client batches in; None: the producer's."""
    if compression_type == "producer":
        return None
    return (
        fmt.COMPRESSION_NONE
        if compression_type == "uncompressed"
        else fmt.COMPRESSION_CODES[compression_type]
    )


def validate_batch(
    buffer: Buffer,
    origin: Origin,
    max_batch_bytes: int,
    max_decompressed_bytes: int,
    codec: int | None = None,
) -> RecordBatch:
    """Parse and check one batch and its records; raises without side effects.

    `codec`: a client batch in another codec is returned recompressed into it
    (`recompressed`; LogConfig.compression_type), then held to `max_batch_bytes` again.

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
        return _stored_in(codec, RecordBatch(buffer), max_batch_bytes, max_decompressed_bytes)
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
    return _stored_in(
        codec, with_records_max_timestamp(batch, max_ts_delta), max_batch_bytes, max_decompressed_bytes
    )


def refuse_keyless(batch: RecordBatch, directory: str) -> None:
    """InvalidRecordError for a batch with a record without a key: a compacted log keeps
    each key's newest record, so one without a key could never be cleaned (Kafka's rule)."""
    body = compaction.records_body(batch)
    spans = compaction.record_spans(body, batch.records_count)
    keyless = tuple(index for index, span in enumerate(spans) if span.key is None)
    if keyless:
        raise KeylessRecordError(
            f"compacted topic cannot accept a record without a key: record {keyless[0]} of the batch "
            f"({len(keyless)} in all) for {directory}",
            keyless,
        )


def _stored_in(
    codec: int | None, batch: RecordBatch, max_batch_bytes: int, max_decompressed_bytes: int
) -> RecordBatch:
    """A checked client batch as the log stores it: in `codec` (None: as sent)."""
    if codec is None or batch.compression == codec:
        return batch
    stored = recompressed(batch, codec, max_decompressed_bytes)
    if stored.size > max_batch_bytes:
        raise RecordTooLargeError(
            f"batch of {stored.size} bytes once stored {fmt.COMPRESSION_NAMES[codec]} "
            f"exceeds max_batch_bytes={max_batch_bytes}"
        )
    return stored


def recompressed(batch: RecordBatch, codec: int, max_decompressed_bytes: int) -> RecordBatch:
    """`batch` with its records compressed with `codec` instead: the records' bytes and every
    header field are kept but the codec bits, the length and the CRC (computed again over
    bytes whose CRC and records were checked first), as Kafka's broker recompresses."""
    raw = batch.buffer
    records = bytes(raw[fmt.HEADER_SIZE :])
    if batch.compression != fmt.COMPRESSION_NONE:  # (an uncompressed body is held to max_batch_bytes alone)
        records = decompress(batch.compression, records, max_decompressed_bytes)
    body = compress(codec, records)
    stored = bytearray(raw[: fmt.HEADER_SIZE])
    stored += body
    attributes = (batch.attributes & ~fmt.COMPRESSION_MASK) | codec
    stored[fmt.ATTRIBUTES_OFFSET : fmt.ATTRIBUTES_OFFSET + 2] = attributes.to_bytes(2, "big", signed=True)
    fmt.INT32.pack_into(stored, fmt.LENGTH_OFFSET, len(stored) - fmt.LOG_OVERHEAD)
    fmt.UINT32.pack_into(stored, fmt.CRC_OFFSET, crc32c.crc32c(memoryview(stored)[fmt.ATTRIBUTES_OFFSET :]))
    return RecordBatch(stored)


def with_records_max_timestamp(batch: RecordBatch, max_ts_delta: int) -> RecordBatch:
    """`batch` with its header's maxTimestamp set to its records' largest timestamp.

    Time lookups (ListOffsets by time, the time index) and time-based rolls and
    retention trust the stored header, so it must be true. Kafka's broker sets the
    field as it validates (LogValidator), and clients rely on that: librdkafka writes
    maxTimestamp 0 over records that carry none (-1). A header that says otherwise is
    set right in a copy, its CRC computed again (over bytes whose CRC was checked
    first); the records' bytes are kept. The LogAppendTime bit is the log's to set, as
    the topic's timestamp type is Kafka's: a client's is cleared, or a batch claiming any
    maxTimestamp would be stored with it (a far future one would stop time retention and
    rolls). A LogAppendTime log stamps the bit and the append time when it appends.
    """
    largest_ms = batch.base_timestamp + max_ts_delta
    flagged = batch.attributes & fmt.TIMESTAMP_TYPE_MASK
    if largest_ms == batch.max_timestamp and not flagged:
        return batch
    if not fmt.INT64_MIN <= largest_ms <= fmt.INT64_MAX:
        raise InvalidRecordError(
            f"the records' largest timestamp {largest_ms} (baseTimestamp {batch.base_timestamp} + "
            f"delta {max_ts_delta}) is past a 64-bit timestamp"
        )
    corrected = bytearray(batch.buffer)
    if flagged:  # the log's timestamp type decides (a LogAppendTime log stamps it again)
        cleared = batch.attributes & ~fmt.TIMESTAMP_TYPE_MASK
        corrected[fmt.ATTRIBUTES_OFFSET : fmt.ATTRIBUTES_OFFSET + 2] = cleared.to_bytes(2, "big", signed=True)
    fmt.INT64.pack_into(corrected, fmt.MAX_TIMESTAMP_OFFSET, largest_ms)
    fmt.UINT32.pack_into(
        corrected, fmt.CRC_OFFSET, crc32c.crc32c(memoryview(corrected)[fmt.ATTRIBUTES_OFFSET :])
    )
    return RecordBatch(corrected)


# Attribute bits a client batch may not set: the control bit, and compression codes
# past the last known one (bits 0-2 above zstd's 4).
_MAX_CODEC = max(fmt.COMPRESSION_NAMES)
_CODEC_AND_CONTROL = fmt.COMPRESSION_MASK | fmt.CONTROL_MASK
_HEADER = fmt.HEADER_STRUCT
_COPY_TO_CRC_BYTES = 1024
_CRC_START = fmt.ATTRIBUTES_OFFSET


def client_batch_header(
    buffer: Buffer, max_batch_bytes: int, max_decompressed_bytes: int
) -> tuple[Any, ...] | None:
    """The header fields of a client batch that passes every check; raises like validate_batch.
    None: it passes once its header's maxTimestamp is set right (with_records_max_timestamp),
    which the request route (validate_batch) does.

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
            if header[7] + max_ts_delta == header[8] and not attributes & fmt.TIMESTAMP_TYPE_MASK:
                return header  # (base, max) timestamps agree with the records (with_records_max_timestamp)
    checked = validate_batch(buffer, "client", max_batch_bytes, max_decompressed_bytes)
    sent = _HEADER.unpack_from(buffer)
    if (checked.max_timestamp, checked.attributes) != (sent[8], sent[5]):
        return None  # its maxTimestamp (and timestamp type) set right, in a copy
    raise AssertionError(
        f"validate_batch accepted a batch the single-batch check refused: {bytes(buffer[:61])!r}"
    )
