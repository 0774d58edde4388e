"""The many-partition figures of `oncelog bench`: opening 1,000 partitions with a LogManager.

Each figure is the LogManager's parallel open of a root of small partitions, against
the reference of the same partitions opened one `Log.open` after another in the same
run (what a broker without the manager would do). Two states of the root:

- clean: every partition closed cleanly (its marker present, nothing to validate);
- unclean: every partition a copy of one taken while its log was open after appends
  past its last flush (no marker, a tail past the recovery point to validate, producer
  state to replay), as a kill -9 of the whole broker leaves them.

Conventions (ratio, medians) are those of oncelog.bench.harness.
"""

from __future__ import annotations

import os
import shutil
import time

from oncelog.bench.harness import BenchResults, BenchSettings, Progress, Target, make_row, median, now_ms
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.log_manager import LogManager
from oncelog.segments.batch import encode_batch

TOPIC = "bench"
# A small partition: a few producers, one sealed segment and a short active one.
CONFIG = LogConfig(segment_bytes=16 * 1024)
PRODUCERS = 4
FLUSHED_BATCHES = 40  # below the recovery point once flushed
UNFLUSHED_BATCHES = 8  # the tail an unclean open validates and replays


def partition_open_figures(
    settings: BenchSettings, directory: str, results: BenchResults, progress: Progress
) -> None:
    count = settings.partitions
    image = os.path.join(directory, "image")
    unclean_image(image)
    root = os.path.join(directory, "root")
    progress(f"  {count} partitions, {settings.partition_rounds} rounds of each open")
    for state in ("clean", "unclean"):
        managed: list[float] = []
        sequential: list[float] = []
        threads = 0
        if state == "clean":
            fill_root(root, image, count, clean=True)  # each clean open and close leaves it clean again
        for _ in range(settings.partition_rounds):
            # Interleaved, so drift in the machine hits both alike.
            if state == "unclean":
                fill_root(root, image, count, clean=False)
            elapsed_s, threads = _time_manager_open(root)
            managed.append(elapsed_s)
            if state == "unclean":
                fill_root(root, image, count, clean=False)
            sequential.append(_time_sequential_open(root))
        results.rows.append(
            make_row(
                f"open {count:,} partitions, {state} ({threads} threads vs one Log.open at a time)",
                median(managed),
                "s",
                median(sequential),
                Target(),
            )
        )
    shutil.rmtree(root, ignore_errors=True)


def unclean_image(image: str) -> None:
    """A partition directory copied while its log is open with an unflushed tail."""
    live = image + "-live"
    with Log.open(live, CONFIG) as log:
        sequence = [0] * PRODUCERS
        for n in range(FLUSHED_BATCHES + UNFLUSHED_BATCHES):
            if n == FLUSHED_BATCHES:
                log.flush()
            pid = n % PRODUCERS
            values = [(b"key", b"v" * 200) for _ in range(2)]
            log.append(
                encode_batch(
                    values,
                    producer_id=pid,
                    producer_epoch=0,
                    base_sequence=sequence[pid],
                    timestamp_ms=now_ms(),
                )
            )
            sequence[pid] += 2
        shutil.copytree(live, image)  # while open: no clean-shutdown marker, tail past the recovery point
    shutil.rmtree(live)


def fill_root(root: str, image: str, count: int, *, clean: bool) -> None:
    """`count` copies of the image under `root`; `clean` opens and closes them first."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    for partition in range(count):
        shutil.copytree(image, os.path.join(root, f"{TOPIC}-{partition}"))
    if clean:
        LogManager.open(root, CONFIG, progress=False).close()
    # What the copies wrote is on disk before the clock starts, as after a reboot.
    os.sync()


def _time_manager_open(root: str) -> tuple[float, int]:
    started = time.perf_counter()
    manager = LogManager.open(root, CONFIG, progress=False)
    elapsed_s = time.perf_counter() - started
    threads = manager.recovery_threads
    manager.close()
    return elapsed_s, threads


def _time_sequential_open(root: str) -> float:
    directories = sorted(
        os.path.join(root, name) for name in os.listdir(root) if name.startswith(f"{TOPIC}-")
    )
    started = time.perf_counter()
    logs = [Log.open(directory, CONFIG) for directory in directories]
    elapsed_s = time.perf_counter() - started
    for log in logs:
        log.close()
    return elapsed_s
