"""Descriptors stay bounded however many segments a log rolls (issue 28).

A running log used to keep five descriptors per rolled segment, so a small open-files
limit failed a roll with EMFILE. Now sealed segments are opened when read, through a
bounded cache sized from the limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHILD = Path(__file__).with_name("many_rolls_child.py")
ROLLS = 10_000
LIMIT = 256


def run_child(directory: Path, rolls: int, *options: str) -> dict[str, Any]:
    """The child's report; an EMFILE (or any failure) in it fails the test with its traceback."""
    child = subprocess.run(
        [sys.executable, str(CHILD), str(directory), str(rolls), str(LIMIT), *options],
        capture_output=True,
        text=True,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    report: dict[str, Any] = json.loads(child.stdout)
    return report


@pytest.fixture
def fast_directory(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs when there is one: 10,000 rolls are 40,000 fsyncs."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="oncelog-rolls-") as directory:
            yield Path(directory)
    else:
        yield tmp_path


def test_10000_rolls_under_an_open_files_limit_of_256_read_back_everything(fast_directory: Path) -> None:
    report = run_child(fast_directory / "t-0", ROLLS)
    expected = [str(n) for n in range(ROLLS)]
    assert report["segments"] == ROLLS + 1
    assert report["first_read"] == expected
    assert report["second_read"] == expected
    # The cache's share of the limit, plus the process's own and the log's fixed few.
    assert report["cache_capacity"] == LIMIT // 4
    assert report["most_descriptors"] <= LIMIT // 4 + 32


def test_a_log_whose_every_segment_is_validated_opens_under_a_small_limit(fast_directory: Path) -> None:
    # A lost metadata store (or a Kafka directory): every segment is validated at the open,
    # one at a time, each handing its descriptor to the cache once it is checked.
    rolls = 600
    report = run_child(fast_directory / "t-0", rolls, "--lose-store")
    expected = [str(n) for n in range(rolls)]
    assert report["first_read"] == expected
    assert report["second_read"] == expected
    assert report["most_descriptors"] <= LIMIT // 4 + 32


def fill_root(root: Path, partitions: int) -> None:
    """`partitions` partitions of a few segments each (a producer's batches rolled over)."""
    from oncelog import LogConfig, LogManager, encode_batch

    with LogManager.open(root, LogConfig(segment_bytes=1024), progress=False) as manager:
        for partition in range(partitions):
            log = manager.log("t", partition)
            for seq in range(0, 40, 4):
                values = [(b"k", b"v" * 40) for _ in range(4)]
                log.append(encode_batch(values, producer_id=7, producer_epoch=0, base_sequence=seq))
            assert len(log.segments) > 2


def idle_descriptors(root: Path) -> tuple[int, int]:
    """Descriptors an open LogManager of `root` adds to the process, and its partitions."""
    from oncelog import LogConfig, LogManager

    before = len(os.listdir("/proc/self/fd"))
    with LogManager.open(root, LogConfig(segment_bytes=1024), progress=False) as manager:
        return len(os.listdir("/proc/self/fd")) - before, len(manager.logs())


def test_an_idle_partition_of_a_manager_holds_one_descriptor_its_active_segment(tmp_path: Path) -> None:
    fill_root(tmp_path / "few", 5)
    fill_root(tmp_path / "many", 45)
    few, few_partitions = idle_descriptors(tmp_path / "few")
    many, many_partitions = idle_descriptors(tmp_path / "many")
    assert (few_partitions, many_partitions) == (5, 45)
    # What the root itself holds (its lock, lock table, stores) is the same for both.
    assert many - few == many_partitions - few_partitions
