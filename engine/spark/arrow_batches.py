"""Turn stored Kafka v2 batches into pyarrow RecordBatches with the source's Spark schema.

The rows follow Spark's Kafka source (key, value, topic, partition, offset,
timestamp, timestampType, headers) plus producerId, producerEpoch and sequence.
Spark checks the Arrow schema of what `read()` yields against
`to_arrow_schema(schema, timezone="UTC")` exactly, so SCHEMA is spelled out here
field by field (all nullable, timestamps in microseconds with tz UTC, the
headers' list item named "element") and a test holds it to Spark's.

Stored batches are grouped (up to `max_rows` records), their bodies joined into
one buffer and decoded by record_columns without a Python object per record; the
columns are then built from numpy arrays and byte ranges. Imports pyarrow and
numpy, never pyspark.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from oncelog.errors import CorruptRecordError
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch
from oncelog.segments.compression import decompress
from oncelog.spark.record_columns import PAD, Bytes, Ints, RecordFields, decode_fields, gather

DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>, producerId bigint, "
    "producerEpoch smallint, sequence int"
)

HEADER_STRUCT = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_STRUCT, nullable=True))
SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", HEADERS_TYPE),
        pa.field("producerId", pa.int64()),
        pa.field("producerEpoch", pa.int16()),
        pa.field("sequence", pa.int32()),
    ]
)

CREATE_TIME, LOG_APPEND_TIME = 0, 1  # timestampType, as Spark's Kafka source numbers them

# A group's joined bodies stay below this, so every binary column's int32 offsets fit
# (Spark wants `binary`, not `large_binary`) and memory stays bounded.
MAX_GROUP_BYTES = 64 * 1024 * 1024
_SEQUENCE_MOD = fmt.INT32_MAX + 1
_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


def arrow_batches(
    batches: Iterable[RecordBatch],
    topic: str,
    partition: int,
    *,
    max_rows: int = 65_536,
    start: int | None = None,
    end: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Rows of the data records of `batches`, at most `max_rows` per Arrow batch.

    Control batches give no rows. Records with an offset below `start` or at or
    above `end` are left out: a read of [start, end) gets whole stored batches,
    the first and last of which may reach past the range.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be positive, got {max_rows}")
    group: list[tuple[RecordBatch, bytes | memoryview]] = []
    rows = size = 0
    for batch in batches:
        h = batch.header
        if h.attributes & fmt.CONTROL_MASK or h.records_count <= 0:
            continue
        if start is not None and h.base_offset + h.last_offset_delta < start:
            continue
        if end is not None and h.base_offset >= end:
            continue
        body: bytes | memoryview = batch.buffer[fmt.HEADER_SIZE :]
        codec = h.attributes & fmt.COMPRESSION_MASK
        if codec != fmt.COMPRESSION_NONE:
            body = decompress(codec, bytes(body))
        # Each record takes at least 7 bytes: a corrupt count must not size the arrays.
        if h.records_count * 7 > len(body):
            raise CorruptRecordError(
                f"recordsCount {h.records_count} of the batch at offset {h.base_offset} cannot fit "
                f"its {len(body)} bytes of records"
            )
        if group and (rows + h.records_count > max_rows or size + len(body) > MAX_GROUP_BYTES):
            yield from _emit(group, topic, partition, max_rows, start, end)
            group, rows, size = [], 0, 0
        group.append((batch, body))
        rows += h.records_count
        size += len(body)
    if group:
        yield from _emit(group, topic, partition, max_rows, start, end)


def _emit(
    group: list[tuple[RecordBatch, bytes | memoryview]],
    topic: str,
    partition: int,
    max_rows: int,
    start: int | None,
    end: int | None,
) -> Iterator[pa.RecordBatch]:
    table = _decode_group(group, topic, partition, start, end)
    # A group holds more than max_rows only when one stored batch does: slices are zero-copy.
    for at in range(0, table.num_rows, max_rows):
        yield table.slice(at, max_rows) if table.num_rows > max_rows else table


def _decode_group(
    group: list[tuple[RecordBatch, bytes | memoryview]],
    topic: str,
    partition: int,
    start: int | None,
    end: int | None,
) -> pa.RecordBatch:
    # Per batch: base offset, attributes, base and max timestamp, pid, epoch, base sequence, count.
    per_batch = np.array(
        [(h[0], h[5], h[7], h[8], h[9], h[10], h[11], h[12]) for h in (batch.header for batch, _ in group)],
        dtype=np.int64,
    )
    counts = per_batch[:, 7]
    sizes = np.fromiter((len(body) for _, body in group), dtype=np.int64, count=len(group))
    joined = b"".join([*(body for _, body in group), PAD])
    body_end = np.cumsum(sizes)
    try:
        fields = decode_fields(joined, body_end - sizes, body_end, counts)
    except CorruptRecordError as exc:
        first, last = group[0][0], group[-1][0]
        raise CorruptRecordError(
            f"{exc.reason} (in the batches at offsets {first.base_offset}..{last.last_offset})"
        ) from None

    batch_of = np.repeat(np.arange(len(group)), counts)
    offsets = per_batch[batch_of, 0] + fields.offset_delta
    keep = np.ones(len(offsets), dtype=bool)
    if start is not None:
        keep &= offsets >= start
    if end is not None:
        keep &= offsets < end
    ts_delta, offset_delta = fields.timestamp_delta, fields.offset_delta
    if keep.all():
        kept = None
    else:  # only the first and last stored batch of a range reach past it
        kept = keep
        offsets, batch_of, ts_delta, offset_delta = (
            offsets[keep],
            batch_of[keep],
            ts_delta[keep],
            offset_delta[keep],
        )
    append_time = (per_batch[batch_of, 1] & fmt.TIMESTAMP_TYPE_MASK) != 0
    # LogAppendTime: every record has the batch's max timestamp, the broker's append time.
    timestamps = np.where(append_time, per_batch[batch_of, 3], per_batch[batch_of, 2] + ts_delta)
    base_sequence = per_batch[batch_of, 6]
    # A record's sequence is its batch's base plus its offset delta, wrapping after Int.MAX.
    sequence = np.where(base_sequence < 0, fmt.NO_SEQUENCE, (base_sequence + offset_delta) % _SEQUENCE_MOD)
    buf = np.frombuffer(joined, dtype=np.uint8)
    n = len(offsets)
    columns = [
        _binary(buf, fields.key_start, fields.key_length, kept, pa.binary()),
        _binary(buf, fields.value_start, fields.value_length, kept, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets, type=pa.int64()),
        pa.array(timestamps * 1000, type=pa.int64()).view(_TIMESTAMP_TYPE),
        pa.array(np.where(append_time, LOG_APPEND_TIME, CREATE_TIME).astype(np.int32), type=pa.int32()),
        _header_lists(buf, fields, kept),
        pa.array(per_batch[batch_of, 4], type=pa.int64()),
        pa.array(per_batch[batch_of, 5].astype(np.int16), type=pa.int16()),
        pa.array(sequence.astype(np.int32), type=pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def _binary(buf: Bytes, start: Ints, length: Ints, keep: Any, kind: pa.DataType) -> pa.Array:
    """A binary (or string) array of the byte ranges [start, start + length); length -1 is null."""
    if keep is not None:
        start, length = start[keep], length[keep]
    offsets, data = gather(buf, start, length)
    nulls = length < 0
    null_count = int(np.count_nonzero(nulls))
    validity = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if null_count else None
    return pa.Array.from_buffers(
        kind, len(start), [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=null_count
    )


def _header_lists(buf: Bytes, fields: RecordFields, keep: Any) -> pa.Array:
    counts = fields.header_count
    key_start, key_length = fields.header_key_start, fields.header_key_length
    value_start, value_length = fields.header_value_start, fields.header_value_length
    if keep is not None:
        header_keep = np.repeat(keep, counts)
        counts = counts[keep]
        key_start, key_length = key_start[header_keep], key_length[header_keep]
        value_start, value_length = value_start[header_keep], value_length[header_keep]
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    keys = _binary(buf, key_start, key_length, None, pa.string())
    try:
        keys.validate(full=True)  # header keys are UTF-8 strings: Arrow checks the bytes here
    except pa.ArrowInvalid as exc:
        raise CorruptRecordError(f"a header key is not UTF-8: {exc}") from None
    values = _binary(buf, value_start, value_length, None, pa.binary())
    items = pa.StructArray.from_arrays([keys, values], fields=list(HEADER_STRUCT))
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), items, type=HEADERS_TYPE)
