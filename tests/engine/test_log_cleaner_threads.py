"""The LogManager's cleaning: one pass on every compacted partition, and the background cleaner."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest

from oncelog import LogConfig, LogManager, TopicPartition
from oncelog.log_cleaner_threads import BackgroundCleaner, Throttle
from oncelog.segments.batch import encode_batch

CONFIG = LogConfig(segment_bytes=4096, retention_ms=None)
WAIT_S = 120.0  # a bound for a busy machine, never a measurement


def _fill(manager: LogManager, topic: str, rounds: int = 30) -> None:
    log = manager.log(topic, 0)
    for round_ in range(rounds):
        for key in range(3):
            log.append(encode_batch([(f"k{key}".encode(), f"{round_}".encode())], timestamp_ms=1))
    log.roll()


def test_a_manager_pass_cleans_the_compacted_topics_and_leaves_the_others(tmp_path: Path) -> None:
    with LogManager.open(tmp_path, CONFIG, progress=False) as manager:
        manager.set_topic_config("changelog", cleanup_policy="compact")
        _fill(manager, "changelog")
        _fill(manager, "events")
        totals = manager.clean()
        assert totals.segments_rewritten > 0 and totals.records_removed > 0
        assert manager.log("events", 0).cleanable_part().first_dirty == 0  # never cleaned
        assert manager.log("changelog", 0).cleanable_part().dirty_bytes == 0


def test_the_background_cleaner_cleans_a_due_log_reports_its_totals_and_stops_with_the_manager(
    tmp_path: Path,
) -> None:
    manager = LogManager.open(tmp_path, CONFIG, progress=False)
    try:
        manager.set_topic_config("changelog", cleanup_policy="compact")
        _fill(manager, "changelog")
        cleaner = manager.start_cleaner(threads=2, backoff_ms=20)
        with pytest.raises(ValueError, match="already running"):
            manager.start_cleaner()
        deadline = time.monotonic() + WAIT_S
        while cleaner.status().passes == 0 and time.monotonic() < deadline:
            cleaner.wake()
            time.sleep(0.02)
        status = cleaner.status()
        assert status.passes >= 1 and status.totals.records_removed > 0 and status.last_error is None
        assert not manager.log("changelog", 0).cleaning_due()[0]
    finally:
        manager.close()
    assert manager.cleaner is None
    assert not [t for t in threading.enumerate() if t.name.startswith("oncelog-cleaner")]


def test_the_throttle_sleeps_the_bytes_past_its_rate_and_ends_a_pass_once_stopping() -> None:
    stopping = threading.Event()
    slept: list[float] = []

    class Recording(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            slept.append(timeout or 0.0)
            return stopping.is_set()

    throttle = Throttle(1_000_000, Recording())
    throttle(0)
    throttle(2_000_000)  # two seconds' worth at once: it waits about that long
    assert slept[0] <= slept[1] and 0 < slept[1] <= 2.0
    stopping.set()
    with pytest.raises(BaseException) as stopped:
        throttle(1)
    assert type(stopped.value).__name__ == "_Stopped"


def test_a_cleaner_refuses_a_thread_count_or_cap_that_cannot_work() -> None:
    for options in ({"threads": 0}, {"io_bytes_per_s": 0}, {"backoff_ms": 0}):
        with pytest.raises(ValueError):
            BackgroundCleaner(dict, **options)  # type: ignore[arg-type]


def test_a_log_whose_pass_fails_is_set_aside_and_the_others_are_still_cleaned(tmp_path: Path) -> None:
    manager = LogManager.open(tmp_path, CONFIG, progress=False)
    try:
        for topic in ("broken", "healthy"):
            manager.set_topic_config(topic, cleanup_policy="compact")
        _fill(manager, "broken", rounds=60)  # the dirtier: picked first
        _fill(manager, "healthy")
        broken = manager.log("broken", 0).segments[0].path
        with open(broken, "r+b") as file:  # a flipped byte below the recovery point
            file.seek(70)
            byte = file.read(1)
            file.seek(70)
            file.write(bytes([byte[0] ^ 0xFF]))
        cleaner = manager.start_cleaner(backoff_ms=20)
        deadline = time.monotonic() + WAIT_S
        while manager.log("healthy", 0).cleaning_due()[0] and time.monotonic() < deadline:
            cleaner.wake()
            time.sleep(0.02)
        status = cleaner.status()
        assert not manager.log("healthy", 0).cleaning_due()[0]
        assert status.uncleanable == (TopicPartition("broken", 0),)
        assert status.last_error is not None and "CRC mismatch" in status.last_error
    finally:
        with contextlib.suppress(Exception):
            manager.close()
