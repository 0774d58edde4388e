"""The reference codec the encode and decode figures are measured against: kafka-python's.

One builder for the `oncelog bench` harness, the pytest-benchmark suite and the
tests that cross-check the codec against an independent implementation.
kafka-python (a dependency of oncelog: the server's fallback codec) is imported on first use.
"""

from __future__ import annotations

from collections.abc import Sequence

Headers = list[tuple[str, bytes | None]]
# (key, value) or (key, value, headers)
ReferenceRecord = tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Headers]


def kafka_python_batch(
    records: Sequence[ReferenceRecord],
    timestamp_ms: int | Sequence[int],
    *,
    compression: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytes:
    """One v2 batch built by kafka-python's DefaultRecordBatchBuilder, offsets from 0.

    `timestamp_ms` is every record's, or one per record; `compression` is the
    attributes' codec number (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd).
    """
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for offset, record in enumerate(records):
        stamp = timestamp_ms if isinstance(timestamp_ms, int) else timestamp_ms[offset]
        headers: Headers = record[2] if len(record) == 3 else []
        appended = builder.append(offset, timestamp=stamp, key=record[0], value=record[1], headers=headers)
        assert appended is not None, "kafka-python refused a record"
    return bytes(builder.build())
