"""Producer table at 1M producers (brief §6, §11; issue 4).

- Expiring 1% of 1M producers pops only the due head of the ring; the reference
  is Kafka's method, a scan of every producer (here a vectorised numpy scan,
  which is kinder to the reference than Kafka's per-entry loop).
- Snapshot write and load of 1M producers, each with a full 5-batch window.
- Resident memory per producer (the growth of the process's resident set).
- Append cost of a known producer with 1M producers present, against 10 present.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from oncelog import Log, LogConfig
from oncelog.bench.recovery import EXPIRATION_MS, NOW_MS, producer_table_rows, resident_bytes_per_producer
from oncelog.producer_state import PRODUCER_DTYPE, WINDOW, ProducerStateManager
from oncelog.segments import encode_batch
from oncelog.storage import snapshot as snapshots
from oncelog.storage.fs import OsFileSystem

MILLION = 1_000_000


def producer_rows(count: int, expired_fraction: float = 0.0) -> np.ndarray:
    return producer_table_rows(count, expired_fraction)


@pytest.fixture(scope="module")
def rows_with_one_percent_expired() -> np.ndarray:
    return producer_rows(MILLION, expired_fraction=0.01)


def test_expire_one_percent_of_a_million(
    benchmark: BenchmarkFixture, rows_with_one_percent_expired: np.ndarray
) -> None:
    benchmark.group = "expire 1% of 1M producers"
    manager = ProducerStateManager(MILLION, EXPIRATION_MS)

    def setup() -> tuple[tuple[()], dict[str, object]]:
        manager.load_rows(rows_with_one_percent_expired)
        # Steady state: the backstop full pass ran 2 s ago (nothing was idle long
        # enough, or due, then), so the timed call only pops the due head of the ring.
        assert manager.expire(NOW_MS - 2000) == 0
        return (), {}

    expired = benchmark.pedantic(lambda: manager.expire(NOW_MS), setup=setup, rounds=5)
    assert expired == MILLION // 100
    assert len(manager) == MILLION - MILLION // 100


def test_backstop_full_pass_of_a_million(
    benchmark: BenchmarkFixture, rows_with_one_percent_expired: np.ndarray
) -> None:
    """The full pass that bounds late expiry, run at most every 10 minutes."""
    benchmark.group = "expire 1% of 1M producers"
    manager = ProducerStateManager(MILLION, EXPIRATION_MS)

    def setup() -> tuple[tuple[()], dict[str, object]]:
        manager.load_rows(rows_with_one_percent_expired)
        return (), {}

    expired = benchmark.pedantic(lambda: manager.expire(NOW_MS, exhaustive=True), setup=setup, rounds=5)
    assert expired == MILLION // 100


def test_reference_full_scan_of_a_million(
    benchmark: BenchmarkFixture, rows_with_one_percent_expired: np.ndarray
) -> None:
    benchmark.group = "expire 1% of 1M producers"
    table = rows_with_one_percent_expired

    def full_scan() -> int:
        due = NOW_MS - table["last_append_ms"] >= EXPIRATION_MS
        return int(np.count_nonzero(due & (table["txn_first_offset"] < 0)))

    assert benchmark.pedantic(full_scan, rounds=5) == MILLION // 100


def test_snapshot_write_a_million(benchmark: BenchmarkFixture, tmp_path: Path) -> None:
    benchmark.group = "snapshot of 1M producers"
    rows = producer_rows(MILLION)
    fs = OsFileSystem()
    benchmark.pedantic(lambda: snapshots.write_snapshot(fs, str(tmp_path), 0, rows), rounds=3)
    assert os.path.getsize(tmp_path / snapshots.snapshot_file_name(0)) > MILLION * PRODUCER_DTYPE.itemsize


def test_snapshot_load_a_million(benchmark: BenchmarkFixture, tmp_path: Path) -> None:
    benchmark.group = "snapshot of 1M producers"
    fs = OsFileSystem()
    snapshots.write_snapshot(fs, str(tmp_path), 0, producer_rows(MILLION))
    manager = ProducerStateManager(MILLION, EXPIRATION_MS)

    def load() -> None:
        # As the loader does it: rows read straight into the producer table.
        manager.load_rows(snapshots.read_snapshot(fs, str(tmp_path), 0, into=manager.table))

    benchmark.pedantic(load, rounds=3)
    assert len(manager) == MILLION
    assert manager.get(1000 + 3 * 123_456) is not None


def test_memory_per_producer_at_a_million(benchmark: BenchmarkFixture) -> None:
    benchmark.group = "memory per producer"
    rows = producer_rows(MILLION)
    per_producer = benchmark.pedantic(lambda: resident_bytes_per_producer(rows), rounds=1)
    benchmark.extra_info["bytes_per_producer"] = round(per_producer, 1)
    assert per_producer <= 200, per_producer


@pytest.mark.parametrize("present", [10, MILLION])
def test_append_with_many_producers_present(
    benchmark: BenchmarkFixture, tmp_path: Path, present: int
) -> None:
    benchmark.group = "append of a known producer, by producers present"
    directory = tmp_path / f"p-{present}"
    config = LogConfig(producer_capacity=MILLION, producer_expiration_ms=EXPIRATION_MS)
    # Seed the producer state: a clean close leaves a snapshot at the log end,
    # which is replaced by one holding `present` producers.
    with Log.open(directory, config, clock=lambda: NOW_MS) as seed:
        seed.append_records([(b"seed", b"")], timestamp_ms=NOW_MS)
    snapshots.write_snapshot(OsFileSystem(), str(directory), 1, producer_rows(present))
    log = Log.open(directory, config, clock=lambda: NOW_MS)
    assert log.recovery_report.clean and log.recovery_report.snapshot_offset == 1
    assert len(log._producers) == present
    pid = 1000 + 3 * (present - 1)  # the newest producer: known, at the tail of the ring
    batches = [
        encode_batch(
            [(b"k", b"v" * 100)],
            producer_id=pid,
            producer_epoch=0,
            base_sequence=WINDOW + n,
            timestamp_ms=NOW_MS,
        )
        for n in range(2000 * 6)
    ]
    rounds = iter(range(6))

    def run() -> None:
        start = next(rounds) * 2000
        for batch in batches[start : start + 2000]:
            log.append(batch)

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    assert log.log_end_offset == 1 + 2000 * 6
    log.close()
