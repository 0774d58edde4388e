"""Append path: oncelog against a plain one-os.write-per-batch loop (brief §11).

Each group pairs oncelog with its reference on the same bytes, so the ratio can be
read off one pytest-benchmark table.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from oncelog.log import Log
from oncelog.segments import encode_batch

BATCHES_PER_ROUND = 2000


def _batch(value_bytes: int, records: int = 1) -> bytes:
    return encode_batch(
        [(b"key-0000", b"v" * value_bytes)] * records,
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        timestamp_ms=1_700_000_000_000,
    )


SIZES = {"170B": _batch(90), "1KiB": _batch(940), "16KiB": _batch(16_290)}


@pytest.mark.parametrize("size", SIZES)
def test_append_one_batch_per_call(benchmark: BenchmarkFixture, log: Log, size: str) -> None:
    batch = SIZES[size]
    benchmark.group = f"append {size}"

    def run() -> None:
        for _ in range(BATCHES_PER_ROUND):
            log.append(batch)

    benchmark.pedantic(run, rounds=10, warmup_rounds=1)
    assert log.log_end_offset == 11 * BATCHES_PER_ROUND


@pytest.mark.parametrize("size", SIZES)
def test_append_batches_one_request(benchmark: BenchmarkFixture, log: Log, size: str) -> None:
    request = [SIZES[size]] * BATCHES_PER_ROUND
    benchmark.group = f"append {size}"
    benchmark.pedantic(lambda: log.append_batches(request), rounds=10, warmup_rounds=1)
    assert log.log_end_offset == 11 * BATCHES_PER_ROUND


@pytest.mark.parametrize("size", SIZES)
def test_reference_os_write_loop(benchmark: BenchmarkFixture, tmp_path: Path, size: str) -> None:
    batch = SIZES[size]
    benchmark.group = f"append {size}"
    fd = os.open(tmp_path / "reference.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def run() -> None:
        for _ in range(BATCHES_PER_ROUND):
            os.write(fd, batch)

    benchmark.pedantic(run, rounds=10, warmup_rounds=1)
    os.close(fd)
    assert os.path.getsize(tmp_path / "reference.log") == 11 * BATCHES_PER_ROUND * len(batch)
