"""Unclean recovery: its cost must follow the tail, not the log size (brief §11).

A log of N sealed segments plus the same active segment is copied while open (a
crash image), then opened. 10 and 100 segments are benchmarked side by side; the
time ratio should be near 1 (target <= 1.3), and the bytes scanned equal.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from oncelog import Log, LogConfig
from oncelog.segments import encode_batch

SEGMENT_BYTES = 2 * 1024 * 1024
CONFIG = LogConfig(segment_bytes=SEGMENT_BYTES)
BATCH = encode_batch(
    [(b"k", b"v" * 16_000)], producer_id=5, producer_epoch=0, base_sequence=0, timestamp_ms=1
)


def _crash_image(tmp_path: Path, sealed_segments: int) -> Path:
    live = tmp_path / "live-0"
    log = Log.open(live, CONFIG)
    sequence = 0
    producer_ids = range(100, 200)  # 100 producers, so replay restores real state
    while len(log.segments) <= sealed_segments:
        pid = producer_ids[sequence % len(producer_ids)]
        log.append_records(
            [(b"k", b"v" * 16_000)], producer_id=pid, producer_epoch=0, base_sequence=sequence // 100
        )
        sequence += 1
    # The same tail for every N: fill the active segment to ~90%.
    while log.active_segment.size < SEGMENT_BYTES * 0.9 - len(BATCH):
        pid = producer_ids[sequence % len(producer_ids)]
        log.append_records(
            [(b"k", b"v" * 16_000)], producer_id=pid, producer_epoch=0, base_sequence=sequence // 100
        )
        sequence += 1
    image = tmp_path / "image"
    shutil.copytree(live, image)  # taken while the log is open: an unclean image
    log.close()
    return image


@pytest.mark.parametrize("sealed_segments", [10, 100])
def test_unclean_recovery(benchmark: BenchmarkFixture, tmp_path: Path, sealed_segments: int) -> None:
    image = _crash_image(tmp_path, sealed_segments)
    benchmark.group = "unclean recovery, same tail"
    rounds: list[Path] = []

    def setup() -> tuple[tuple[Path], dict[str, object]]:
        target = tmp_path / f"round-{len(rounds)}"
        shutil.copytree(image, target)
        # Write the copy back now, as after a power loss: otherwise recovery's fsyncs
        # pay for writing back the copy of every sealed segment, which grows with N.
        os.sync()
        rounds.append(target)
        return (target,), {}

    def recover(target: Path) -> None:
        Log.open(target, CONFIG).close()

    benchmark.pedantic(recover, setup=setup, rounds=7, warmup_rounds=1)
    with Log.open(image, CONFIG) as log:
        report = log.recovery_report
        assert not report.clean and report.segments_scanned == 1
        benchmark.extra_info["bytes_scanned"] = report.bytes_scanned
        benchmark.extra_info["segments"] = len(log.segments)
