"""The many-partition figures of `oncelog bench`: opening 1,000 partitions with a LogManager.

Each figure is the LogManager's parallel open of a root of small partitions, against
the reference of the same partitions opened one `Log.open` after another in the same
run (what a broker without the manager would do). Two states of the root:

- clean: every partition closed cleanly (its marker present, nothing to validate);
- unclean: every partition a copy of one taken while its log was open after appends
  past its last flush (no marker, a tail past the recovery point to validate, producer
  state to replay), as a kill -9 of the whole broker leaves them.

Only the opens are timed; the setup is built to cost little and to leave the timed
region as after a reboot:

- Every root is built before any is opened, and none is deleted before the step ends.
  On ext4 without a journal (the CI machine's disk), creating a file probes, from the
  start of its block group, every free inode deleted in the last minute (six while
  its inode table block is dirty) and skips it (fs/ext4/ialloc.c, recently_deleted).
  Deleting a root of 1,000 partitions (13,000 inodes) and copying the image in again,
  as this step did for every unclean open, cost 5-10 s of system time per copy instead
  of about 1 s, more with each round, and slowed the file creations inside the timed
  opens and the closes as well: the step took 120-150 s.
- A root's partitions are cloned from an image held in memory: its directories, the
  files the engine writes (copied, one write each) and the files it only reads (sealed
  segments and snapshots, which the engine replaces by rename, never in place:
  hard-linked, as the recovery figures link theirs). The step checks at its end that
  no linked file was written. The clean root is cloned from a clean image (the unclean
  one recovered and closed once) behind a root store a LogManager created first, which
  is what a LogManager's own open and close of 1,000 partitions left, at a fraction of
  the cost.
- Rounds alternate which side opens first, after one untimed open of each on the
  clean root: a process's first open of a root grows its heap (about 4 page faults a
  partition more than later ones), and was the manager's in every first round.
- `os.sync()` before each timed open: what setup and the previous close wrote is on
  disk before the clock starts. Closing is not timed; the sequential reference's logs
  are closed in parallel, as a LogManager closes its own.

Beside the open times: descriptors and resident memory per idle partition (what the
open added to the process, divided by the partitions), and, in a full run, a root of ten
times the partitions opened clean and unclean, read from and closed under the process's
own limits.

Conventions (ratio, medians) are those of oncelog.bench.harness.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import os
import resource
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

from oncelog.bench.harness import (
    KIB,
    BenchResults,
    BenchSettings,
    Progress,
    Target,
    make_row,
    median,
    now_ms,
)
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.log_manager import LogManager, default_recovery_threads
from oncelog.segments.batch import encode_batch
from oncelog.segments.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    parse_segment_file_name,
    segment_file_name,
)
from oncelog.segments.txn_index import TXN_INDEX_SUFFIX
from oncelog.storage.log_dirs import LEGACY_LOCK_FILE
from oncelog.storage.snapshot import SNAPSHOT_SUFFIX

TOPIC = "bench"
# Issue 28's targets: a clean open of 1,000 partitions, and of 10,000.
OPEN_1000_CLEAN_S = 0.5
OPEN_10000_CLEAN_S = 5.0
# A small partition: a few producers, one sealed segment and a short active one.
CONFIG = LogConfig(segment_bytes=16 * 1024)
PRODUCERS = 4
FLUSHED_BATCHES = 40  # below the recovery point once flushed
UNFLUSHED_BATCHES = 8  # the tail an unclean open validates and replays
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


def partition_open_figures(
    settings: BenchSettings, directory: str, results: BenchResults, progress: Progress
) -> None:
    count, rounds = settings.partitions, settings.partition_rounds
    unclean = os.path.join(directory, "image")
    unclean_image(unclean)
    clean = os.path.join(directory, "clean-image")
    clean_image(unclean, clean)
    images = {"clean": PartitionImage.read(clean), "unclean": PartitionImage.read(unclean)}
    # One clean root serves every clean open (an open and close leaves it clean again); each
    # unclean open, managed or sequential, gets a fresh crash image.
    roots = {
        "clean": [os.path.join(directory, "clean")],
        "unclean": [os.path.join(directory, f"unclean-{n}") for n in range(2 * rounds)],
    }
    progress(f"  {1 + 2 * rounds} roots of {count} partitions, {rounds} rounds of each open")
    for state, paths in roots.items():  # every root before any open: see the module docstring
        for root in paths:
            build_root(root, images[state], count, root_store=state == "clean")
    idle: dict[str, list[IdleCost]] = {"clean": [], "unclean": []}
    clean_open_s = 0.0
    for state, paths in roots.items():
        managed, sequential, threads = _open_rounds(paths, state, rounds, idle[state])
        if state == "clean":
            clean_open_s = median(managed)
        # Issue 28's target, for 1,000 partitions (scaled with the count in a scaled run).
        target = (
            Target(max_value=OPEN_1000_CLEAN_S * count / 1000, max_ratio=0.5)
            if state == "clean"
            else Target()
        )
        results.rows.append(
            make_row(
                f"open {count:,} partitions, {state} ({threads} threads vs one Log.open at a time)",
                median(managed),
                "s",
                median(sequential),
                target,
                # Each round's pair in turn: the reference's fsyncs vary from round to round.
                [ours / theirs for ours, theirs in zip(managed, sequential, strict=True)],
            )
        )
    _idle_rows(os.path.join(roots["clean"][0], f"{TOPIC}-0"), count, idle["clean"], results)
    for image in images.values():
        image.check_unwritten()
    for paths in roots.values():
        for root in paths:
            shutil.rmtree(root, ignore_errors=True)
    # Written back, the deleted inodes slow the next step's file creations for a minute
    # (see the module docstring), not for up to six.
    os.sync()
    if settings.mode.startswith("full"):
        descriptors = {state: median([cost.descriptors for cost in costs]) for state, costs in idle.items()}
        _ten_times_the_partitions(directory, images, count, clean_open_s, descriptors, results, progress)


def _open_rounds(
    paths: list[str], state: str, rounds: int, idle: list[IdleCost]
) -> tuple[list[float], list[float], int]:
    """`rounds` managed and sequential opens of the roots `paths` (in turn): their times,
    and the manager's thread count; each managed open's idle cost goes into `idle`."""
    fresh = itertools.cycle(paths)
    managed: list[float] = []
    sequential: list[float] = []
    threads = 0
    if state == "clean":
        # Untimed, both sides: the process's first open of a root grows its heap (about
        # 4 page faults a partition more than any later one), whichever side it is.
        _time_manager_open(paths[0], state)
        _time_sequential_open(paths[0], state)
    for n in range(rounds):
        # Interleaved, so drift in the machine hits both alike, and each side first in
        # every other round, so neither always opens just after the other closed.
        if n % 2:
            sequential.append(_time_sequential_open(next(fresh), state))
        opened = _time_manager_open(next(fresh), state)
        managed.append(opened.elapsed_s)
        threads = opened.threads
        idle.append(opened.idle)
        if not n % 2:
            sequential.append(_time_sequential_open(next(fresh), state))
    return managed, sequential, threads


def _idle_rows(partition: str, count: int, idle: list[IdleCost], results: BenchResults) -> None:
    """Descriptors and resident memory per idle partition, against what the partition has on disk."""
    results.rows.append(
        make_row(
            f"descriptors per idle partition, {count:,} open (vs its files)",
            median([cost.descriptors for cost in idle]),
            "fds",
            len(os.listdir(partition)),
            Target(max_value=1),
        )
    )
    results.rows.append(
        make_row(
            f"memory per idle partition, {count:,} open (vs its bytes on disk)",
            median([cost.resident_bytes for cost in idle]) / KIB,
            "KiB",
            _bytes_on_disk(partition) / KIB,
            Target(max_value=64),
        )
    )


def _ten_times_the_partitions(
    directory: str,
    images: dict[str, PartitionImage],
    count: int,
    clean_open_s: float,
    descriptors: dict[str, float],
    results: BenchResults,
    progress: Progress,
) -> None:
    """Ten times the partitions, clean and unclean, under the process's limits: each root
    opens, serves a read from every hundredth partition, and closes. The clean open is timed
    against ten times the smaller root's (1.0: opening scales linearly). A root whose
    partitions would need more descriptors than the soft limit (at the per-partition count
    measured on the smaller root) is not opened: a row says how far it is over."""
    many = 10 * count
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    progress(f"  {many:,} partitions: clean and unclean roots")
    elapsed: dict[str, float] = {}
    for state in ("clean", "unclean"):
        needed = int(many * descriptors[state]) + _descriptors()
        if limit != resource.RLIM_INFINITY and needed > limit:
            results.rows.append(
                make_row(
                    f"descriptors {many:,} {state} partitions need (vs the soft open-files limit)",
                    needed,
                    "fds",
                    limit,
                    Target(max_ratio=1.0),
                )
            )
            results.notes.append(
                f"manager: {many:,} {state} partitions were not opened: at "
                f"{descriptors[state]:.2f} descriptors each they need about {needed:,}, over the "
                f"limit of {limit:,}"
            )
            continue
        root = os.path.join(directory, f"{state}-x10")
        build_root(root, images[state], many, root_store=state == "clean")
        opened = _time_manager_open(root, state, read_every=100)
        elapsed[state] = opened.elapsed_s
        shutil.rmtree(root, ignore_errors=True)
        os.sync()
    if "clean" in elapsed:
        results.rows.append(
            make_row(
                f"open {many:,} partitions, clean (vs 10x the {count:,}-partition open)",
                elapsed["clean"],
                "s",
                10 * clean_open_s,
                Target(max_value=OPEN_10000_CLEAN_S * many / 10_000),
            )
        )
    for state, seconds in elapsed.items():
        results.notes.append(
            f"manager: {many:,} partitions opened {state} in {seconds:.2f} s; a read from every "
            "100th partition returned its batches"
        )


def _bytes_on_disk(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(path, name))
        for name in os.listdir(path)
        if os.path.isfile(os.path.join(path, name))
    )


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


def clean_image(unclean: str, clean: str) -> None:
    """The unclean image recovered and closed: a partition as a clean shutdown leaves it."""
    shutil.copytree(unclean, clean)
    Log.open(clean, CONFIG).close()


@dataclasses.dataclass(frozen=True)
class PartitionImage:
    """A partition directory held in memory, to clone many times cheaply."""

    path: str
    directories: tuple[str, ...]  # relative to `path`, parents first
    linked: tuple[str, ...]  # files the engine only reads: hard-linked
    copied: tuple[tuple[str, bytes, int], ...]  # (relative path, contents, mode)
    linked_signature: tuple[tuple[int, int, int], ...]  # (size, mtime_ns, inode) of each linked file

    @classmethod
    def read(cls, path: str) -> PartitionImage:
        names = os.listdir(path)
        bases = sorted(b for name in names if (b := parse_segment_file_name(name, LOG_SUFFIX)) is not None)
        # The sealed segments' files (the active segment's are cut and rebuilt) and the
        # snapshots (written to a temporary file and renamed over, never in place).
        read_only = {segment_file_name(base, suffix) for base in bases[:-1] for suffix in SEGMENT_SUFFIXES}
        read_only.update(name for name in names if name.endswith(SNAPSHOT_SUFFIX))
        directories: list[str] = []
        linked: list[str] = []
        copied: list[tuple[str, bytes, int]] = []
        for folder, subfolders, files in os.walk(path):
            subfolders.sort()
            relative = os.path.relpath(folder, path)
            if relative != ".":
                directories.append(relative)
            for name in sorted(files):
                if relative == "." and name == LEGACY_LOCK_FILE:
                    # The lock file of the Log that wrote the image (outside a root): a managed
                    # partition has none, its mark (a directory) is made at its first lock.
                    continue
                if relative == "." and name in read_only:
                    linked.append(name)
                    continue
                source = os.path.join(folder, name)
                with open(source, "rb") as file:
                    data = file.read()
                mode = os.stat(source).st_mode & 0o777
                copied.append((name if relative == "." else os.path.join(relative, name), data, mode))
        return cls(path, tuple(directories), tuple(linked), tuple(copied), _signature(path, tuple(linked)))

    def clone(self, target: str) -> None:
        os.mkdir(target)
        for relative in self.directories:
            os.mkdir(os.path.join(target, relative))
        for relative in self.linked:
            os.link(os.path.join(self.path, relative), os.path.join(target, relative))
        for relative, data, mode in self.copied:
            fd = os.open(os.path.join(target, relative), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)

    def check_unwritten(self) -> None:
        """Raise if an open wrote a hard-linked file (which every clone would then share)."""
        if _signature(self.path, self.linked) != self.linked_signature:
            raise AssertionError(
                f"an open wrote one of {', '.join(self.linked)}, which it should only read: "
                "the partitions shared it through hard links"
            )


def _signature(path: str, names: tuple[str, ...]) -> tuple[tuple[int, int, int], ...]:
    stats = [os.stat(os.path.join(path, name)) for name in names]
    return tuple((stat.st_size, stat.st_mtime_ns, stat.st_ino) for stat in stats)


def build_root(root: str, image: PartitionImage, count: int, *, root_store: bool = False) -> None:
    """A new root (which must not exist) of `count` clones of the image; `root_store` makes
    it a root a LogManager has opened and closed: first its own files (its lock and store),
    as before any partition, and in each partition the mark of a directory locked through
    the root's table (oncelog.storage.log_dirs), which a partition's first managed open
    makes once (a mkdir each: 0.85 s of a first open of 10,000, measured) and none after."""
    os.makedirs(root)
    if root_store:
        LogManager.open(root, CONFIG, progress=False).close()
    for partition in range(count):
        path = os.path.join(root, f"{TOPIC}-{partition}")
        image.clone(path)
        if root_store:
            os.mkdir(os.path.join(path, LEGACY_LOCK_FILE))


def fill_root(root: str, image: str, count: int, *, clean: bool) -> None:
    """`count` copies of the image under `root`, replacing what is there; `clean` opens and
    closes them first. (The pytest-benchmark suite's setup; `oncelog bench` builds its
    roots once each, see the module docstring.)"""
    shutil.rmtree(root, ignore_errors=True)
    build_root(root, PartitionImage.read(image), count)
    if clean:
        LogManager.open(root, CONFIG, progress=False).close()
    # What the copies wrote is on disk before the clock starts, as after a reboot.
    os.sync()


@dataclasses.dataclass(frozen=True)
class IdleCost:
    """What an open, idle partition costs the process: descriptors and resident memory."""

    descriptors: float
    resident_bytes: float


@dataclasses.dataclass(frozen=True)
class ManagedOpen:
    elapsed_s: float
    threads: int
    idle: IdleCost


_ROOT_FIXED: dict[str, IdleCost] = {}


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _root_fixed_cost(root: str) -> IdleCost:
    """What a LogManager of an empty root holds (its lock, lock table, stores): no partition's."""
    manager = LogManager.open(root, CONFIG, progress=False)  # once first: imports, first-use caches
    manager.close()
    gc.collect()
    descriptors, resident = _descriptors(), _resident_bytes()
    manager = LogManager.open(root, CONFIG, progress=False)
    gc.collect()
    fixed = IdleCost(_descriptors() - descriptors, max(_resident_bytes() - resident, 0))
    manager.close()
    shutil.rmtree(root, ignore_errors=True)
    return fixed


def _time_manager_open(root: str, state: str, *, read_every: int = 0) -> ManagedOpen:
    """The open's time, and what each of its idle partitions holds beyond the root's own."""
    fixed = _ROOT_FIXED.get("cost") or _ROOT_FIXED.setdefault("cost", _root_fixed_cost(root + ".empty"))
    os.sync()  # what setup or the last close wrote is on disk before the clock starts
    gc.collect()
    descriptors, resident = _descriptors() + fixed.descriptors, _resident_bytes() + fixed.resident_bytes
    started = time.perf_counter()
    manager = LogManager.open(root, CONFIG, progress=False)
    elapsed_s = time.perf_counter() - started
    threads = manager.recovery_threads
    summary = manager.recovery_summary
    gc.collect()
    partitions = max(summary.partitions, 1)
    idle = IdleCost(
        (_descriptors() - descriptors) / partitions, max(_resident_bytes() - resident, 0) / partitions
    )
    if read_every:
        for partition in range(0, summary.partitions, read_every):
            log = manager.log(TOPIC, partition, create=False)
            if not log.read(log.log_start_offset, 1 << 20).batches:
                raise AssertionError(f"partition {partition} of {root} read back nothing")
    manager.close()
    _check_state(root, state, summary.partitions, summary.clean)
    return ManagedOpen(elapsed_s, threads, idle)


def _time_sequential_open(root: str, state: str) -> float:
    directories = sorted(
        os.path.join(root, name) for name in os.listdir(root) if name.startswith(f"{TOPIC}-")
    )
    os.sync()
    started = time.perf_counter()
    logs = [Log.open(directory, CONFIG) for directory in directories]
    elapsed_s = time.perf_counter() - started
    clean = sum(log.recovery_report.clean for log in logs)
    # Not timed: closed in parallel, as the manager closes (each close fsyncs several times).
    with ThreadPoolExecutor(default_recovery_threads()) as pool:
        for future in [pool.submit(log.close) for log in logs]:
            future.result()
    _check_state(root, state, len(logs), clean)
    return elapsed_s


def _check_state(root: str, state: str, partitions: int, clean: int) -> None:
    """Raise unless every partition opened in the state the figure is named for."""
    if clean != (partitions if state == "clean" else 0):
        raise AssertionError(f"{clean} of the {partitions} partitions of {root} opened clean, not {state}")
