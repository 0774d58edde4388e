"""A client batch's header maxTimestamp must be its records' largest timestamp.

Found by red-teaming `oncelog serve`: a batch whose header said maxTimestamp 0 over
records at T+10s was stored, and ListOffsets by time then skipped its records (the
time index and the segment scan trust the header). Kafka's broker rewrites the field;
oncelog keeps the client's bytes, so it refuses the batch on both append paths.
Batches are built by kafka-python (an independent encoder) and patched here.
"""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from oncelog.errors import InvalidRecordError
from oncelog.log import Log
from oncelog.segments import RecordBatch
from oncelog.segments.records import check_records

T0 = 1_700_000_000_000
MAX_TIMESTAMP_AT = 35
GZIP, LZ4 = 1, 3


def kafka_python_batch(timestamps: list[int], codec: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for n, timestamp in enumerate(timestamps):
        builder.append(n, timestamp=timestamp, key=b"k%d" % n, value=b"v%d" % n, headers=[])
    return bytes(builder.build())


def with_max_timestamp(batch: bytes, max_timestamp: int) -> bytes:
    """The batch with its header's maxTimestamp replaced and its CRC made right again."""
    data = bytearray(batch)
    struct.pack_into(">q", data, MAX_TIMESTAMP_AT, max_timestamp)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


@pytest.fixture
def log(tmp_path: Path) -> Log:
    opened = Log.open(tmp_path / "t-0")
    opened.append(kafka_python_batch([T0]))
    return opened


@pytest.mark.parametrize("codec", [0, GZIP, LZ4], ids=["uncompressed", "gzip", "lz4"])
@pytest.mark.parametrize("lie", [0, T0 + 5_000, T0 + 10_001, -1], ids=["zero", "below", "above", "none"])
def test_a_header_max_timestamp_that_is_not_the_records_largest_is_refused_on_both_paths(
    log: Log, codec: int, lie: int
) -> None:
    forged = with_max_timestamp(kafka_python_batch([T0, T0 + 10_000, T0 + 7_000], codec), lie)
    end = log.log_end_offset
    with pytest.raises(InvalidRecordError, match="maxTimestamp"):
        log.append(forged)
    with pytest.raises(InvalidRecordError, match="maxTimestamp"):
        log.append_batches([forged])
    assert log.log_end_offset == end


def test_records_out_of_time_order_with_the_right_maximum_are_accepted(log: Log) -> None:
    batch = kafka_python_batch([T0 + 9_000, T0 + 30_000, T0 - 5_000])
    assert RecordBatch(batch).max_timestamp == T0 + 30_000
    result = log.append(batch)
    found = log.offset_for_timestamp(T0 + 10_000)
    # The first record at or after the time is the batch's second (its first is at T0 + 9 s).
    assert found is not None and (found.timestamp_ms, found.offset) == (T0 + 30_000, result.first_offset + 1)


def test_stored_data_replicated_or_recovered_is_not_held_to_the_rule(log: Log) -> None:
    forged = struct.pack(">q", 1) + with_max_timestamp(kafka_python_batch([T0, T0 + 10]), T0)[8:]
    assert log.append_batches([forged], origin="replication")[0].first_offset == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=30))
def test_the_record_walk_returns_the_largest_timestamp_delta(deltas: list[int]) -> None:
    batch = kafka_python_batch([T0 + d for d in deltas])
    header = RecordBatch(batch).header
    got = check_records(batch, 61, len(deltas), len(deltas) - 1, exact=True)
    assert header.base_timestamp + got == T0 + max(deltas) == header.max_timestamp
