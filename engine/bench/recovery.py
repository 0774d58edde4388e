"""The recovery and producer-table figures of `oncelog bench`.

Unclean recovery at 10, 30 and 100 sealed segments with the same tail, the tail
scan rate, snapshot write and load, memory per producer and expiry, all at 1M
producers. Conventions (ratio, targets, medians) are those of oncelog.bench.harness.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import shutil
import time
from collections.abc import Callable

import crc32c
import numpy as np

from oncelog.bench.harness import (
    GB,
    KIB,
    MIB,
    RECOVERY_SEGMENT_COUNTS,
    BenchResults,
    BenchSettings,
    Progress,
    RecoveryPoint,
    Target,
    count_label,
    make_row,
    median,
    now_ms,
    timed,
)
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.producer_state import PRODUCER_DTYPE, WINDOW, ProducerStateManager
from oncelog.recovery.loader import RecoveryReport
from oncelog.segments.batch import encode_batch
from oncelog.segments.segment import LOG_SUFFIX, SCAN_CHUNK_BYTES, parse_segment_file_name, segment_file_name
from oncelog.storage import snapshot as snapshots
from oncelog.storage.fs import OsFileSystem

# Crash images are copied this much at a time, a run of zeros this long left a hole.
_SPARSE_CHUNK_BYTES = MIB
# The producer-table figures run on a fixed clock: the table never reads the wall clock.
EXPIRATION_MS = 24 * 3600 * 1000
# Unclean recovery of the most sealed segments against the fewest: the tail decides, not the size.
RECOVERY_MAX_RATIO = 1.1
NOW_MS = 1_800_000_000_000

# -- recovery ------------------------------------------------------------------------


def _idempotent_appender(log: Log) -> Callable[[], int]:
    """Appends 16 KiB batches from 100 producers in turn (so replay restores real state)."""
    sequence = 0
    stamp_ms = now_ms()
    value = b"v" * 16_000

    def append() -> int:
        nonlocal sequence
        pid, base_sequence = 100 + sequence % 100, sequence // 100
        batch = encode_batch(
            [(b"k", value)],
            producer_id=pid,
            producer_epoch=0,
            base_sequence=base_sequence,
            timestamp_ms=stamp_ms,
        )
        log.append(batch)
        sequence += 1
        return len(batch)

    return append


def _fsync_tree(root: str, skip: frozenset[str] = frozenset()) -> None:
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if path in skip:
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _take_image(log: Log, image: str) -> None:
    # Copied while the log is open: an unclean image.
    shutil.copytree(log.directory, image, copy_function=_copy_sparse)
    _fsync_tree(image)


def _copy_sparse(source: str, destination: str) -> str:
    """Copy a file, leaving a hole where it reads a run of zeros (a MiB at a time).

    A crash leaves the space a log reserved ahead of its data allocated and never
    written, which reads as zeros and which SEEK_DATA skips, as it skips a hole; a
    plain copy would write those zeros, and recovery would have to read them back.
    """
    with open(source, "rb") as src, open(destination, "wb") as dst:
        while chunk := src.read(_SPARSE_CHUNK_BYTES):
            if chunk == bytes(len(chunk)):
                dst.seek(len(chunk), os.SEEK_CUR)
            else:
                dst.write(chunk)
        dst.truncate(src.tell())
    shutil.copystat(source, destination)
    return destination


def _clone_image(image: str, target: str) -> dict[str, tuple[int, int]]:
    """Copy the crash image to `target`, hard-linking its sealed segments (recovery only reads them).

    Returns the (size, mtime) of each linked file, to prove afterwards that it was not written.
    """
    bases = sorted(
        base for name in os.listdir(image) if (base := parse_segment_file_name(name, LOG_SUFFIX)) is not None
    )
    sealed = {segment_file_name(base, LOG_SUFFIX) for base in bases[:-1]}

    def copy(source: str, destination: str) -> str:
        if os.path.basename(source) in sealed:
            os.link(source, destination)
            return destination
        return _copy_sparse(source, destination)

    shutil.copytree(image, target, copy_function=copy)
    linked = {os.path.join(target, name): os.stat(os.path.join(target, name)) for name in sealed}
    # As after a power loss: the image is on disk, so recovery's own fsync does not pay
    # for writing back the copy.
    _fsync_tree(target, skip=frozenset(linked))
    return {path: (stat.st_size, stat.st_mtime_ns) for path, stat in linked.items()}


def _time_unclean_open(image: str, target: str, config: LogConfig) -> tuple[float, RecoveryReport]:
    """Seconds to open a fresh clone of the crash image `image`, and what recovery did."""
    linked = _clone_image(image, target)
    # Untimed: after a crash the data on disk is clean; a dirty copy would time its writeback.
    _fsync_tree(target)
    return _time_clone_open(target, linked, config)


def _time_clone_open(
    target: str, linked: dict[str, tuple[int, int]], config: LogConfig, *, remove: bool = True
) -> tuple[float, RecoveryReport]:
    """Seconds to open `target`, a synced clone of a crash image (`_clone_image`), and what
    recovery did; then the clone is removed (if `remove`)."""
    try:
        gc.collect()
        start = time.perf_counter()
        log = Log.open(target, config)
        elapsed_s = time.perf_counter() - start
        report = log.recovery_report
        log.close()
        for path, signature in linked.items():
            stat = os.stat(path)
            if (stat.st_size, stat.st_mtime_ns) != signature:
                raise AssertionError(f"recovery wrote the sealed segment {path}, which it should only read")
    finally:
        if remove:
            shutil.rmtree(target)
    if report.clean:
        raise AssertionError(f"the crash image cloned to {target} opened as a clean log")
    return elapsed_s, report


def recovery_figures(
    settings: BenchSettings, directory: str, results: BenchResults, progress: Progress
) -> None:
    segment_bytes = settings.recovery_segment_bytes
    config = LogConfig(segment_bytes=segment_bytes)
    tail_bytes = int(segment_bytes * 0.9)  # the same active segment for every image
    images: dict[int, tuple[str, int]] = {}
    counts = ", ".join(map(str, RECOVERY_SEGMENT_COUNTS))
    progress(f"  crash images with {counts} sealed segments of {segment_bytes // KIB} KiB, same tail")
    with Log.open(os.path.join(directory, "live-0"), config) as log:
        append = _idempotent_appender(log)
        batch_bytes = append()
        for sealed in RECOVERY_SEGMENT_COUNTS:
            while len(log.segments) < sealed + 1 or log.active_segment.size + batch_bytes <= tail_bytes:
                append()
            image = os.path.join(directory, f"image-{sealed}")
            _take_image(log, image)
            images[sealed] = (image, log.size_bytes)
    times: dict[int, list[float]] = {sealed: [] for sealed in images}
    scanned: dict[int, int] = {}
    progress(f"  {settings.recovery_rounds} unclean opens of each image")
    # After a crash the files are long on disk and the filesystem quiet. So every clone is
    # made and synced before the first timed open, each open starts after a sync of what
    # the last one wrote, and nothing is removed until all have run: otherwise an open's
    # own syncs wait on the journal's commit of hundreds of files made or removed just
    # before it (the more segments, the longer: measured 12-13 µs a segment, 7-9 with this).
    clones = {
        sealed: [
            (target, _clone_image(image, target))
            for n in range(settings.recovery_rounds)
            for target in [os.path.join(directory, f"open-{sealed}-{n}")]
        ]
        for sealed, (image, _) in images.items()
    }
    for n in range(settings.recovery_rounds):
        for sealed in images:  # interleaved, so drift hits every size alike
            os.sync()
            elapsed_s, report = _time_clone_open(*clones[sealed][n], config, remove=False)
            times[sealed].append(elapsed_s)
            scanned[sealed] = report.bytes_scanned
    for targets in clones.values():
        for target, _ in targets:
            shutil.rmtree(target)
    for sealed, (_, log_bytes) in images.items():
        results.recovery.append(RecoveryPoint(sealed, log_bytes, scanned[sealed], tuple(times[sealed])))
    few, many = RECOVERY_SEGMENT_COUNTS[0], RECOVERY_SEGMENT_COUNTS[-1]
    if scanned[many] > scanned[few] + 2 * batch_bytes:
        results.notes.append(
            f"recovery scanned {scanned[many]} bytes at {many} segments but {scanned[few]} at {few}: "
            "not tail-only"
        )
    results.rows.append(
        make_row(
            f"unclean recovery, {many} vs {few} sealed segments",
            median(times[many]) * 1000,
            "ms",
            median(times[few]) * 1000,
            Target(max_ratio=RECOVERY_MAX_RATIO),
            [long / short for long, short in zip(times[many], times[few], strict=True)],
        )
    )


def tail_scan_figure(
    settings: BenchSettings, directory: str, results: BenchResults, progress: Progress
) -> None:
    tail_bytes = settings.tail_scan_bytes
    config = LogConfig(segment_bytes=2 * tail_bytes)
    progress(f"  crash image with a {tail_bytes // MIB} MiB active segment of 16 KiB batches")
    with Log.open(os.path.join(directory, "live-0"), config) as log:
        append = _idempotent_appender(log)
        while log.active_segment.size < tail_bytes:
            append()
        image = os.path.join(directory, "image")
        _take_image(log, image)
        active_name = os.path.basename(log.active_segment.path)
    speeds, reference = [], []
    for _ in range(settings.recovery_rounds):
        elapsed_s, report = _time_unclean_open(image, os.path.join(directory, "open-0"), config)
        speeds.append(report.bytes_scanned / elapsed_s / GB)
        reference.append(_read_and_crc_rate(os.path.join(image, active_name), report.bytes_scanned) / GB)
    results.rows.append(
        make_row(
            "tail scan on recovery, 16 KiB batches",
            median(speeds),
            "GB/s",
            median(reference),
            Target(min_ratio=0.8),  # issue 30
        )
    )


def _read_and_crc_rate(path: str, size: int) -> float:
    """The reference: bytes/s of a plain chunked read + CRC-32C of the same bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        start = time.perf_counter()
        position = 0
        while position < size:
            chunk = os.pread(fd, min(SCAN_CHUNK_BYTES, size - position), position)
            if not chunk:
                break
            crc32c.crc32c(chunk)
            position += len(chunk)
        return position / (time.perf_counter() - start)
    finally:
        os.close(fd)


# -- the producer table at 1M producers -----------------------------------------------


def producer_table_rows(count: int, expired_fraction: float) -> np.ndarray:
    """`count` producers with full windows, oldest first; the first fraction is expired at NOW_MS."""
    rows = np.zeros(count, PRODUCER_DTYPE)
    rows["producer_id"] = np.arange(count) * 3 + 1000
    rows["live"] = 1
    rows["window_count"] = WINDOW
    rows["txn_first_offset"] = -1
    rows["coordinator_epoch"] = -1
    activity = np.full(count, NOW_MS - 1000, dtype=np.int64)
    activity[: int(count * expired_fraction)] = NOW_MS - EXPIRATION_MS - 1
    rows["last_append_ms"] = activity
    rows["last_timestamp_ms"] = activity
    for k in range(WINDOW):
        rows["last_sequence"][:, k] = k
        rows["last_offset"][:, k] = np.arange(count) * WINDOW + k
        rows["max_timestamp_ms"][:, k] = activity
    return rows


def producer_figures(
    settings: BenchSettings, directory: str, results: BenchResults, progress: Progress
) -> None:
    count = settings.producers
    label = count_label(count)
    rows = producer_table_rows(count, expired_fraction=0.01)
    fs = OsFileSystem()
    raw_path = os.path.join(directory, "reference.bin")
    progress(f"  snapshot write and load, {settings.repeats} x each")
    write_s, raw_write_s, load_s, raw_read_s = [], [], [], []
    manager = ProducerStateManager(count, EXPIRATION_MS)
    for _ in range(settings.repeats):
        write_s.append(timed(lambda: snapshots.write_snapshot(fs, directory, 0, rows)))
        raw_write_s.append(timed(lambda: _write_and_fsync(raw_path, rows.data.cast("B"))))
        load_s.append(timed(functools.partial(_load_snapshot, manager, fs, directory)))
        raw_read_s.append(
            timed(lambda: _read_whole(os.path.join(directory, snapshots.snapshot_file_name(0))))
        )
    if len(manager) != count:
        raise AssertionError(f"the snapshot loaded {len(manager)} producers, not {count}")
    results.rows.append(
        make_row(
            f"snapshot write, {label} producers",
            median(write_s),
            "s",
            median(raw_write_s),
            Target(max_value=0.5),
        )
    )
    results.rows.append(
        make_row(
            f"snapshot load, {label} producers",
            median(load_s),
            "s",
            median(raw_read_s),
            Target(max_value=0.25),
        )
    )
    del manager
    results.rows.append(
        make_row(
            f"memory per producer, {label} producers",
            resident_bytes_per_producer(rows),
            "B",
            PRODUCER_DTYPE.itemsize,
            Target(max_value=200),
        )
    )
    _expiry_figure(settings, rows, label, results, progress)


def _expiry_figure(
    settings: BenchSettings, rows: np.ndarray, label: str, results: BenchResults, progress: Progress
) -> None:
    """Expiring 1% of the producers, against a full scan of the table."""
    count = len(rows)
    progress(f"  expire 1% of {label} producers, {settings.repeats} x")
    manager = ProducerStateManager(count, EXPIRATION_MS)
    expire_s, scan_s = [], []
    for _ in range(settings.repeats):
        manager.load_rows(rows)
        # Steady state: the backstop full pass ran 2 s ago, so the timed call only pops the due head.
        manager.expire(NOW_MS - 2000)
        gc.collect()
        start = time.perf_counter()
        expired = manager.expire(NOW_MS)
        expire_s.append(time.perf_counter() - start)
        scan_s.append(timed(lambda: _full_scan(rows)))
        if expired != count // 100:
            raise AssertionError(f"expired {expired} producers, not {count // 100}")
    results.rows.append(
        make_row(
            f"expire 1% of {label} producers",
            median(expire_s) * 1000,
            "ms",
            median(scan_s) * 1000,
            Target(max_value=1.0),  # issue 30
        )
    )


def _load_snapshot(manager: ProducerStateManager, fs: OsFileSystem, directory: str) -> None:
    manager.load_rows(snapshots.read_snapshot(fs, directory, 0, into=manager.table))


def _full_scan(table: np.ndarray) -> int:
    """The reference: Kafka's method, every producer examined (vectorised here, kinder than Kafka)."""
    due = NOW_MS - table["last_append_ms"] >= EXPIRATION_MS
    return int(np.count_nonzero(due & (table["txn_first_offset"] < 0)))


def _resident_bytes() -> int:
    """The process's resident set (anonymous, file and shared pages), in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _mapping_resident_bytes(array: np.ndarray) -> int:
    """Resident bytes of the mapping that holds `array` (its Rss in /proc/self/smaps)."""
    address = array.__array_interface__["data"][0]
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header: start-end perms ...
                start, end = (int(bound, 16) for bound in first.split("-"))
                inside = start <= address < end
            elif inside and first == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping in /proc/self/smaps holds the address {address:#x}")


def _release_free_heap() -> None:
    """Collect garbage and hand glibc's free heap memory back to the kernel.

    Around the measurement, so that neither garbage left by earlier steps (which a free
    during the fill could trim, shrinking the resident set by memory that was never the
    table's) nor the fill's freed temporaries (which glibc may keep) move the figure.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


def resident_bytes_per_producer(rows: np.ndarray) -> float:
    """Resident memory a producer table filled with `rows` adds to the process, per producer.

    Measured as the growth of the process's resident set across building a
    ProducerStateManager and loading every row into it: the table, its due times and
    pid map live in anonymous mappings (lazy_memory) that tracemalloc cannot see, and
    that cost nothing until written. The manager is kept alive until after the
    second reading. The figure cannot be lower than the row the table stores for
    each producer (PRODUCER_DTYPE.itemsize): if it is, or if the table's mapping does
    not hold every loaded row, pages were never touched and this raises.
    """
    count = len(rows)
    if not count:
        raise ValueError("no rows to measure")
    row_bytes = PRODUCER_DTYPE.itemsize
    _release_free_heap()
    before = _resident_bytes()
    manager = ProducerStateManager(count, EXPIRATION_MS)
    manager.load_rows(rows, NOW_MS)
    _release_free_heap()
    after = _resident_bytes()
    table_bytes = _mapping_resident_bytes(manager.table)
    if len(manager) != count or manager.get(int(rows["producer_id"][-1])) is None:
        raise AssertionError(f"loaded {len(manager)} producers, not {count}")
    per_producer = (after - before) / count
    if table_bytes < count * row_bytes or per_producer < row_bytes:
        raise AssertionError(
            f"{per_producer:.4g} resident bytes per producer, {table_bytes / count:.4g} in the table's "
            f"mapping: less than the {row_bytes}-byte row each producer is written to, so the "
            "measurement missed pages the load wrote"
        )
    return per_producer


def _write_and_fsync(path: str, data: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_whole(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        buffer = np.empty(os.fstat(fd).st_size, dtype=np.uint8)
        view = buffer.data.cast("B")
        done = 0
        while done < len(view):
            read = os.preadv(fd, [view[done:]], done)
            if read == 0:
                break
            done += read
    finally:
        os.close(fd)
