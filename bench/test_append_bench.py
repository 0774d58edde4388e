"""Append path: oncelog against a plain one-os.write-per-batch loop (brief §11).

Each group pairs oncelog with its reference on the same bytes, so the ratio can be
read off one pytest-benchmark table. Plain batches carry no producer id; the
idempotent group sends in-order sequences of one producer, and the duplicate
group resends batches already in the log.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from oncelog.log import Log
from oncelog.segments import encode_batch

BATCHES_PER_ROUND = 2000
ROUNDS = 10
# Current timestamps: producers stamped more than producer_expiration_ms in the past
# are expired on sight (as Kafka would at its next check), which is not the path measured.
TIMESTAMP_MS = int(time.time() * 1000)


def _batch(value_bytes: int, records: int = 1, producer_id: int = -1, sequence: int = -1) -> bytes:
    return encode_batch(
        [(b"key-0000", b"v" * value_bytes)] * records,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=sequence,
        timestamp_ms=TIMESTAMP_MS,
    )


SIZES = {"170B": _batch(90), "1KiB": _batch(940), "16KiB": _batch(16_290), "1MiB": _batch(1_048_400)}
# About 32 MiB per round at most: more would make the disk's writeback, not the
# append path, what the later rounds (and later tests) measure.
PER_ROUND = {"170B": BATCHES_PER_ROUND, "1KiB": BATCHES_PER_ROUND, "16KiB": BATCHES_PER_ROUND, "1MiB": 32}


@pytest.mark.parametrize("size", SIZES)
def test_append_one_batch_per_call(benchmark: BenchmarkFixture, log: Log, size: str) -> None:
    batch, count = SIZES[size], PER_ROUND[size]
    benchmark.group = f"append {size}"

    def run() -> None:
        for _ in range(count):
            log.append(batch)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1)
    assert log.log_end_offset == (ROUNDS + 1) * count


@pytest.mark.parametrize("size", SIZES)
def test_append_batches_one_request(benchmark: BenchmarkFixture, log: Log, size: str) -> None:
    request = [SIZES[size]] * PER_ROUND[size]
    benchmark.group = f"append {size}"
    benchmark.pedantic(lambda: log.append_batches(request), rounds=ROUNDS, warmup_rounds=1)
    assert log.log_end_offset == (ROUNDS + 1) * len(request)


@pytest.mark.parametrize("size", SIZES)
def test_reference_os_write_loop(benchmark: BenchmarkFixture, tmp_path: Path, size: str) -> None:
    batch, count = SIZES[size], PER_ROUND[size]
    benchmark.group = f"append {size}"
    fd = os.open(tmp_path / "reference.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def run() -> None:
        for _ in range(count):
            os.write(fd, batch)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1)
    os.close(fd)
    assert os.path.getsize(tmp_path / "reference.log") == (ROUNDS + 1) * count * len(batch)


def test_append_idempotent_170B(benchmark: BenchmarkFixture, log: Log) -> None:
    """One producer's in-order batches: every append checks and updates producer state."""
    benchmark.group = "append 170B"
    batches = [_batch(90, producer_id=7, sequence=n) for n in range((ROUNDS + 1) * BATCHES_PER_ROUND)]
    rounds = iter(range(ROUNDS + 1))

    def run() -> None:
        start = next(rounds) * BATCHES_PER_ROUND
        for batch in batches[start : start + BATCHES_PER_ROUND]:
            log.append(batch)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1)
    assert log.log_end_offset == len(batches)


def test_duplicate_detection_170B(benchmark: BenchmarkFixture, log: Log) -> None:
    """Retries of a producer's last 5 batches: found in the window, nothing written."""
    benchmark.group = "append 170B"
    originals = [_batch(90, producer_id=7, sequence=n) for n in range(5)]
    for batch in originals:
        log.append(batch)
    size_before = log.size_bytes

    def run() -> None:
        for n in range(BATCHES_PER_ROUND):
            assert log.append(originals[n % 5]).duplicate

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1)
    assert log.size_bytes == size_before and log.log_end_offset == 5


# A producer's batch of 100 records of 100 bytes (the codec benchmark's shape), as sent:
# the append checks every record's framing (issue 15), and decompresses the compressed ones.
HUNDRED_RECORDS = {
    codec or "none": encode_batch(
        [(b"key-0000", b"r" * 100)] * 100, timestamp_ms=TIMESTAMP_MS, compression=codec
    )
    for codec in (None, "lz4", "zstd")
}
HUNDRED_RECORD_BATCHES_PER_ROUND = 200


@pytest.mark.parametrize("codec", HUNDRED_RECORDS)
def test_append_a_batch_of_100_records(benchmark: BenchmarkFixture, log: Log, codec: str) -> None:
    """One client batch of 100 records per call: the body is walked record by record."""
    batch = HUNDRED_RECORDS[codec]
    benchmark.group = "append 100 x 100 B"

    def run() -> None:
        for _ in range(HUNDRED_RECORD_BATCHES_PER_ROUND):
            log.append(batch)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1)
    assert log.log_end_offset == (ROUNDS + 1) * HUNDRED_RECORD_BATCHES_PER_ROUND * 100


def test_reference_os_write_loop_100_records(benchmark: BenchmarkFixture, tmp_path: Path) -> None:
    batch = HUNDRED_RECORDS["none"]
    benchmark.group = "append 100 x 100 B"
    fd = os.open(tmp_path / "reference.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def run() -> None:
        for _ in range(HUNDRED_RECORD_BATCHES_PER_ROUND):
            os.write(fd, batch)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1)
    os.close(fd)


def test_append_records_encodes_100_records_of_100_bytes(benchmark: BenchmarkFixture, log: Log) -> None:
    """`append_records`: the engine builds the batch (the codec's encode path) and appends it."""
    benchmark.group = "append_records 100 x 100 B"
    records = [(None, b"r" * 100)] * 100

    def run() -> None:
        for _ in range(BATCHES_PER_ROUND // 10):
            log.append_records(records, timestamp_ms=TIMESTAMP_MS)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1)
    assert log.log_end_offset == (ROUNDS + 1) * BATCHES_PER_ROUND // 10 * 100


def test_read_and_decode_every_record(benchmark: BenchmarkFixture, log: Log) -> None:
    """Read the log back batch by batch (CRC-checked) and decode every record."""
    benchmark.group = "read and decode"
    for _ in range(BATCHES_PER_ROUND // 10):
        log.append_records([(b"k", b"r" * 100)] * 100, timestamp_ms=TIMESTAMP_MS)
    end = log.log_end_offset

    def run() -> int:
        offset, decoded = 0, 0
        while offset < end:
            fetched = log.read(offset, max_bytes=256 * 1024)
            decoded += sum(1 for _ in fetched.records())
            offset = fetched.next_offset
        return decoded

    assert benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1) == end
