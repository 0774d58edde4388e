"""Durable appends: 16 threads sharing fsyncs (group commit) against one thread (brief §11).

Each appender calls `Log.append(batch, durable=True)`, which returns once its
batch is fsynced. One thread pays an fsync per append; 16 threads waiting at
once share one fsync per round, so the target is >= 4x the one-thread rate.
Run on the real disk (pytest's tmp_path), not tmpfs, or fsync costs nothing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from oncelog import LogConfig
from oncelog.log import Log
from oncelog.segments import encode_batch

APPENDS_PER_ROUND = 320
BATCH = encode_batch([(b"key", b"v" * 100)], timestamp_ms=int(time.time() * 1000))


@pytest.mark.parametrize("threads", [1, 16])
def test_durable_appends(benchmark: BenchmarkFixture, tmp_path: Path, threads: int) -> None:
    benchmark.group = "durable appends (fsync each), 320 per round"
    log = Log.open(tmp_path / "durable-0", LogConfig())
    per_thread = APPENDS_PER_ROUND // threads

    def appender() -> None:
        for _ in range(per_thread):
            log.append(BATCH, durable=True)

    def run() -> None:
        pool = [threading.Thread(target=appender) for _ in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    assert log.recovery_point == log.log_end_offset == 6 * APPENDS_PER_ROUND
    log.close()
