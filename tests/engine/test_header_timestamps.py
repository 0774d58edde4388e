"""A stored batch's header maxTimestamp is its records' largest timestamp.

Found by red-teaming `oncelog serve`: a batch whose header said maxTimestamp 0 over
records at T+10s was stored, and ListOffsets by time then skipped its records (the
time index and the segment scan trust the header). Refusing such a batch (as oncelog
did) lost librdkafka's batches of records without timestamps (its test 0053: the
header says 0 over records at -1), which Kafka accepts: its broker sets the field as
it validates. So does oncelog now, on both append paths, keeping the records' bytes.
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

from oncelog.config import LogConfig
from oncelog.errors import InvalidRecordError
from oncelog.log import Log
from oncelog.segments import RecordBatch
from oncelog.segments.records import check_records

T0 = 1_700_000_000_000
MAX_TIMESTAMP_AT = 35
GZIP, LZ4 = 1, 3
LOG_APPEND_TIME_BIT = 0x08


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
@pytest.mark.parametrize("route", ["append", "append_batches"])
def test_a_header_max_timestamp_that_is_not_the_records_largest_is_stored_set_right(
    log: Log, codec: int, lie: int, route: str
) -> None:
    honest = kafka_python_batch([T0, T0 + 10_000, T0 + 7_000], codec)
    forged = with_max_timestamp(honest, lie)
    if route == "append":
        first = log.append(forged).first_offset
    else:
        first = log.append_batches([forged])[0].first_offset
    stored = log.read(first, 1 << 20).batches[0]
    stored.validate()  # its CRC computed again over the field set right
    assert stored.max_timestamp == T0 + 10_000
    # Everything from magic on is the honest batch's (the log stamps the offset and the
    # leader epoch before it): the records untouched.
    assert bytes(stored.buffer)[16:] == honest[16:]
    found = log.offset_for_timestamp(T0 + 8_000)
    assert found is not None and (found.timestamp_ms, found.offset) == (T0 + 10_000, first + 1)


def test_librdkafkas_batch_of_records_without_timestamps_is_stored_with_max_timestamp_minus_one(
    log: Log,
) -> None:
    # librdkafka's header for records with no timestamp: firstTimestamp -1, maxTimestamp 0.
    untimed = with_max_timestamp(kafka_python_batch([-1, -1]), 0)
    assert RecordBatch(untimed).base_timestamp == -1
    first = log.append(untimed).first_offset
    stored = log.read(first, 1 << 20).batches[0]
    assert (stored.base_timestamp, stored.max_timestamp) == (-1, -1)
    assert [record.timestamp_ms for record in stored.records()] == [-1, -1]


@pytest.mark.parametrize("route", ["append", "append_batches"])
def test_a_clients_log_append_time_bit_is_the_logs_to_set(tmp_path: Path, route: str) -> None:
    # A batch flagged LogAppendTime with a far-future maxTimestamp, on a CreateTime log:
    # stored as CreateTime with its records' largest timestamp (as Kafka's topic type
    # decides), or it would stop time retention and rolls for the partition.
    flagged = bytearray(with_max_timestamp(kafka_python_batch([T0, T0 + 10]), 2**63 - 1))
    struct.pack_into(">h", flagged, 21, struct.unpack_from(">h", flagged, 21)[0] | LOG_APPEND_TIME_BIT)
    struct.pack_into(">I", flagged, 17, crc32c.crc32c(bytes(flagged[21:])))
    for timestamp_type in ("CreateTime", "LogAppendTime"):
        log = Log.open(
            tmp_path / timestamp_type, LogConfig(timestamp_type=timestamp_type), clock=lambda: T0 + 99
        )
        appended = (
            log.append(bytes(flagged)) if route == "append" else log.append_batches([bytes(flagged)])[0]
        )
        stored = log.read(appended.first_offset, 1 << 20).batches[0]
        stored.validate()
        if timestamp_type == "CreateTime":
            assert (stored.attributes & LOG_APPEND_TIME_BIT, stored.max_timestamp) == (0, T0 + 10)
        else:  # stamped by the log with its own clock
            assert (stored.attributes & LOG_APPEND_TIME_BIT, stored.max_timestamp) == (
                LOG_APPEND_TIME_BIT,
                T0 + 99,
            )
        log.close()


def test_a_largest_timestamp_past_64_bits_is_refused(log: Log) -> None:
    end = log.log_end_offset
    past = kafka_python_batch([2**63 - 10, 2**63 - 1])
    data = bytearray(past)
    struct.pack_into(">q", data, 27, 2**63 - 5)  # baseTimestamp moved up: the largest passes 2^63 - 1
    forged = with_max_timestamp(bytes(data), 0)
    with pytest.raises(InvalidRecordError, match="past a 64-bit timestamp"):
        log.append(forged)
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
