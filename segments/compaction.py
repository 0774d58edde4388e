"""What log compaction does to one batch: its records' keys, and the batch rebuilt with fewer.

Pure functions over bytes; no I/O. The cleaner (oncelog.log_cleaner) decides which
records stay; this module reads the records' keys and writes the batch that keeps them.

A rebuilt batch keeps everything a reader or producer state relies on: its base offset
and lastOffsetDelta (offsets never change, so a batch may now hold fewer records than
its offset range), its producer id, epoch and base sequence (so the producer's last
sequence is still base + lastOffsetDelta), its partition leader epoch and its
attributes. Each kept record's bytes are copied as they were, except its timestamp
delta when the base timestamp moves. A batch may keep no records at all: a producer's
last batch is kept empty (KAFKA-5490), so its sequence and epoch survive.

KIP-534's delete horizon: attribute bit 6 says the base timestamp is no longer the
first record's time but the time after which the batch's tombstones and transaction
markers may be removed. Each kept record's timestamp delta is rewritten relative to
it, so every record keeps its own timestamp.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import crc32c

from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch
from oncelog.segments.compression import MAX_DECOMPRESSED_BYTES, compress, decompress
from oncelog.segments.errors import CorruptRecordError
from oncelog.segments.records import _varint, encode_varint

DELETE_HORIZON_MASK = 0x40  # attributes bit 6 (KIP-534)
_new_tuple = tuple.__new__  # a RecordSpan without the Python-level NamedTuple __new__


class RecordSpan(NamedTuple):
    """Where one record sits in a batch's (inflated) records, and what the cleaner reads of it."""

    start: int  # its length varint
    end: int  # one past its last byte
    offset_delta: int
    timestamp_delta: int
    timestamp_end: int  # one past its timestamp delta: the bytes from here on are kept as they are
    key: bytes | None
    value_is_null: bool  # a tombstone


def delete_horizon_ms(batch: RecordBatch) -> int | None:
    """The batch's delete horizon (KIP-534), or None when it has none yet."""
    return batch.base_timestamp if batch.attributes & DELETE_HORIZON_MASK else None


def records_body(batch: RecordBatch, max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """The batch's records, inflated when compressed."""
    body = bytes(batch.buffer[fmt.HEADER_SIZE :])
    codec = batch.compression
    return body if codec == fmt.COMPRESSION_NONE else decompress(codec, body, max_decompressed_bytes)


def record_spans(body: bytes, count: int) -> Iterator[RecordSpan]:
    """Each of the `count` records in `body`, in order. CorruptRecordError when they do not fit.

    The cleaner's hot loop: one- and two-byte varints come from the codec's lookup tables
    (segments.records), as the read path's do.
    """
    varint, new_span, size, pos = _varint, _new_tuple, len(body), 0
    for index in range(count):
        length, at = varint(body, pos, 5)
        end = at + length
        if length <= 0 or end > size:
            raise CorruptRecordError(f"record {index} of {count} has length {length}, past the records")
        timestamp_delta, timestamp_end = varint(body, at + 1, 10)  # (after the unused attributes byte)
        offset_delta, at = varint(body, timestamp_end, 5)
        key_length, at = varint(body, at, 5)
        if key_length < -1:
            raise CorruptRecordError(f"record {index} of {count} has key length {key_length}")
        key = None if key_length < 0 else body[at : at + key_length]
        if key_length > 0:
            at += key_length
        value_length, at = varint(body, at, 5)
        if at + max(value_length, 0) > end:
            raise CorruptRecordError(f"record {index} of {count}: its value runs past the record")
        yield new_span(
            RecordSpan, (pos, end, offset_delta, timestamp_delta, timestamp_end, key, value_length < 0)
        )
        pos = end
    if pos != size:
        raise CorruptRecordError(f"{size - pos} bytes after the last of {count} records")


def rebuild_batch(
    batch: RecordBatch,
    body: bytes,
    kept: Sequence[RecordSpan],
    *,
    horizon_ms: int | None = None,
) -> bytes:
    """The batch holding only `kept` (spans of `body`, its inflated records, in order).

    `horizon_ms` sets the delete horizon (the batch must not have one yet); None keeps the
    batch's own base timestamp and horizon. A CreateTime batch's max timestamp becomes the
    largest kept record's; a LogAppendTime one keeps its own (every record reads it).
    An empty `kept` gives the header alone, with recordsCount 0.
    """
    h = batch.header
    attributes = h.attributes
    base_timestamp = h.base_timestamp
    if not kept:
        attributes &= ~fmt.COMPRESSION_MASK  # no records to inflate (Kafka's empty batch header)
    if horizon_ms is not None:
        assert not attributes & DELETE_HORIZON_MASK, "a batch's delete horizon is set once"
        attributes |= DELETE_HORIZON_MASK
        base_timestamp = horizon_ms
    parts: list[bytes] = []
    max_timestamp = fmt.NO_TIMESTAMP
    for span in kept:
        timestamp = h.base_timestamp + span.timestamp_delta
        max_timestamp = max(max_timestamp, timestamp)
        if base_timestamp == h.base_timestamp:
            parts.append(body[span.start : span.end])
            continue
        rest = body[span.timestamp_end : span.end]
        inner = b"\x00" + encode_varint(timestamp - base_timestamp) + rest
        parts.append(encode_varint(len(inner)) + inner)
    if not kept or attributes & fmt.TIMESTAMP_TYPE_MASK:
        max_timestamp = h.max_timestamp
    raw = b"".join(parts)
    codec = attributes & fmt.COMPRESSION_MASK
    records = compress(codec, raw) if kept and codec != fmt.COMPRESSION_NONE else raw
    covered = fmt.CRC_COVERED_HEADER_STRUCT.pack(
        attributes,
        h.last_offset_delta,
        base_timestamp,
        max_timestamp,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
        len(kept),
    )
    length = fmt.HEADER_SIZE - fmt.LOG_OVERHEAD + len(records)
    prefix = fmt.SIZE_AND_MAGIC_STRUCT.pack(h.base_offset, length, h.partition_leader_epoch, fmt.MAGIC_V2)
    crc = crc32c.crc32c(records, crc32c.crc32c(covered))
    return b"".join((prefix, fmt.UINT32.pack(crc), covered, records))
