"""A full disk is LogFailedError, never SIGBUS, and loses nothing acknowledged.

The engine writes the active segment's .log, .index and .timeindex through shared
mappings, and LMDB writes its lock file through one. A mapped write to a page with
no disk block kills the process with SIGBUS once the filesystem is full, so every
one of those files has its blocks reserved before it is mapped (segments.reservation).

Two kinds of test: a LogManager filling a real 6 MiB tmpfs in a child process (a
SIGBUS shows as exit status -7 instead of killing pytest), and the fault-injecting
twin, which tracks which bytes of each file have blocks and records every mapping
that could fault (`sigbus_risks`), deterministically, with the disk filling at each
step that needs space.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from log_helpers import read_all

from oncelog import Log, LogConfig, encode_batch
from oncelog.errors import LogFailedError
from oncelog.log_manager import LogManager
from oncelog.segments.index import INDEX_MIN_GROW_BYTES
from oncelog.storage.fs import OsFileSystem
from oncelog.torture.faultfs import FaultFileSystem

T0 = 1_700_000_000_000
TMPFS_BYTES = 6 * 1024 * 1024
CHILD = Path(__file__).with_name("full_disk_child.py")
D = "/data/t-0"
# An index entry per batch and indexes larger than one reservation step: the indexes
# grow while the log is open, as a busy partition's do.
CONFIG = LogConfig(segment_bytes=48 * 1024, index_interval_bytes=0, segment_index_bytes=32 * 1024)


def clock() -> int:
    return T0


# -- a real, small tmpfs -------------------------------------------------------------------
@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs (the tests run as root), unmounted afterwards whatever happens."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount_point)], check=True
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_log_manager_filling_a_real_tmpfs_gets_log_failed_error_not_sigbus_and_keeps_every_ack(
    small_tmpfs: Path,
) -> None:
    root, filler = small_tmpfs / "root", small_tmpfs / "filler"
    child = subprocess.run(
        [sys.executable, str(CHILD), str(root), str(filler)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode != -signal.SIGBUS, f"SIGBUS: {child.stderr[-2000:]}"
    assert child.returncode == 0, child.stderr[-2000:]
    report = json.loads(child.stdout)
    assert report["filled"], "the filler never met a full disk"
    # Every partition appended until the disk was full, then failed closed with a named error.
    partitions = [name for name in report["failed"] if name != "close"]
    assert len(partitions) == 8, report["failed"]
    assert all(message.startswith("LogFailedError") for message in report["failed"].values()), report
    assert report["late"].startswith("LogFailedError"), report["late"]
    assert all(len(acked) > 10 for acked in report["acked"].values())

    filler.unlink()  # space is freed: everything acknowledged must come back
    with LogManager.open(root, progress=False) as manager:
        for name, acked in report["acked"].items():
            log = manager.log("t", int(name), create=False)
            stored = {}
            offset = log.log_start_offset
            while offset < log.log_end_offset:
                fetched = log.read(offset)
                for batch in fetched.batches:
                    stored[batch.base_offset] = hashlib.sha256(bytes(batch.buffer)[8:]).hexdigest()
                offset = fetched.next_offset
            assert [stored.get(base) for base, _ in acked] == [digest for _, digest in acked], name
            # ... and the log takes appends again.
            log.append(encode_batch([(b"k", b"after")], timestamp_ms=T0))


def test_a_metadata_store_commit_on_a_full_real_disk_is_an_enospc_os_error_naming_the_store(
    small_tmpfs: Path,
) -> None:
    # writemap=False: LMDB writes data.mdb with pwrite, so a full disk fails the commit
    # (and the engine, seeing an OSError, fails the log closed) instead of faulting.
    path = small_tmpfs / "meta.lmdb"
    store = OsFileSystem().open_store(str(path))
    store.put({"kept": b"v"})
    with open(small_tmpfs / "filler", "wb") as filler, pytest.raises(OSError) as full:
        while True:
            filler.write(bytes(64 * 1024))
    assert full.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as failed:
        store.put({f"k{n}": bytes(4096) for n in range(64)})  # pages LMDB must add to data.mdb
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(path), failed.value
    assert store.get("kept") == b"v" and store.get("k0") is None  # the commit is all or nothing
    store.close()


# -- the twin: which bytes have blocks, deterministically ----------------------------------
def small_batch(n: int, tag: int = 0) -> bytes:
    return encode_batch([(b"k%d-%d" % (tag, n), bytes([n % 251 + 1]) * 8)], timestamp_ms=T0 + n)


def large_batch(n: int) -> bytes:
    # Past WRITE_SYSCALL_MIN_BYTES: written with pwritev, not through the mapping.
    return encode_batch([(b"large-%d" % n, bytes([n % 251 + 1]) * 16_384)], timestamp_ms=T0 + n)


def stored(offset: int, data: bytes) -> bytes:
    """The batch as the log keeps it: the base offset stamped, the rest as sent."""
    return offset.to_bytes(8, "big") + data[8:]


def file_size(fs: FaultFileSystem, path: str) -> int:
    handle = fs.open(path, writable=False)
    try:
        return handle.size()
    finally:
        handle.close()


def test_every_file_the_engine_maps_for_writing_has_its_blocks_reserved_through_a_workload() -> None:
    fs = FaultFileSystem(5)
    log = Log.open(D, CONFIG, fs=fs, clock=clock)
    index_sizes: set[int] = set()
    for n in range(2_000):
        if n % 97 == 0:
            log.append_batches([small_batch(n, tag=1), small_batch(n, tag=2), small_batch(n, tag=3)])
        elif n % 331 == 0:
            log.append(large_batch(n))
        else:
            log.append(small_batch(n))
        if n % 50 == 0:
            index_sizes.add(file_size(fs, log.active_segment.offset_index.path))
        if n % 400 == 399:
            log.truncate_to(log.log_end_offset - 7)
        if n % 700 == 699:
            log.close()
            log = Log.open(D, CONFIG, fs=fs, clock=clock)
    # The active offset index grew past its first reservation while the log was open.
    assert max(index_sizes) > INDEX_MIN_GROW_BYTES, sorted(index_sizes)
    assert len(log.segments) >= 4
    end = log.log_end_offset
    log.flush()
    for mode in ("kill", "drop"):
        crashed = fs.crash(mode)  # type: ignore[arg-type]
        recovered = Log.open(D, CONFIG, fs=crashed, clock=clock)
        assert recovered.log_end_offset == end
        for n in range(700):
            recovered.append(small_batch(n, tag=4))
        recovered.roll()
        recovered.truncate_to(recovered.log_end_offset - 3)
        recovered.close()
        assert crashed.sigbus_risks == [], crashed.sigbus_risks[:3]
    log.close()
    assert fs.sigbus_risks == [], fs.sigbus_risks[:3]


def active_path(suffix: str) -> Callable[[Log], Callable[[str], bool]]:
    """The active segment's file with `suffix`, as it is when the fault is armed."""

    def target(log: Log) -> Callable[[str], bool]:
        path = os.path.join(D, f"{log.active_segment.base_offset:020d}{suffix}")
        return lambda candidate: candidate == path

    return target


def next_segments_index(log: Log) -> Callable[[str], bool]:
    current = os.path.join(D, f"{log.active_segment.base_offset:020d}")
    return lambda candidate: candidate.endswith(".index") and not candidate.startswith(current)


def any_path(log: Log) -> Callable[[str], bool]:
    return lambda candidate: True


# Where the disk fills: (the seam call that fails, which file, how the log is driven there).
FULL_DISK_AT: dict[str, tuple[str, Callable[[Log], Callable[[str], bool]], str]] = {
    "growing the offset index": ("allocate", active_path(".index"), "append"),
    "growing the time index": ("allocate", active_path(".timeindex"), "append"),
    "reserving the new segment's index at a roll": ("allocate", next_segments_index, "append"),
    "reserving a new segment's log": ("allocate", lambda log: lambda path: path.endswith(".log"), "append"),
    "a large write": ("write", active_path(".log"), "append large"),
    "the snapshot at a roll": ("write", lambda log: lambda path: path.endswith(".snapshot.tmp"), "append"),
    "the recovery point commit of a flush": ("put", any_path, "flush"),
    "the snapshot of a clean close": (
        "write",
        lambda log: lambda path: path.endswith(".snapshot.tmp"),
        "close",
    ),
}


@pytest.mark.parametrize("where", FULL_DISK_AT)
def test_a_full_disk_anywhere_gives_log_failed_error_and_a_reopen_keeps_every_ack(where: str) -> None:
    op, target, drive = FULL_DISK_AT[where]
    fs = FaultFileSystem(11)
    log = Log.open(D, CONFIG, fs=fs, clock=clock)
    acked: list[tuple[int, bytes]] = []

    def append(data: bytes) -> None:
        offset = log.append(data).first_offset
        acked.append((offset, stored(offset, data)))

    for n in range(300):
        append(small_batch(n))
    fs.fail_next(op, errno.ENOSPC, target(log))
    with pytest.raises(LogFailedError, match="No space left"):
        if drive == "close":
            log.close()
        for n in range(300, 3_000):
            append(large_batch(n) if drive == "append large" else small_batch(n))
            if drive == "flush" and n % 10 == 0:
                log.flush()
    assert fs.injected and fs.injected[-1].startswith(op), fs.injected
    if drive != "close":
        with pytest.raises(LogFailedError):  # failed closed: refused until reopened
            log.append(small_batch(0, tag=9))
        crashed = fs.crash("kill")  # a kill -9 right after the failure: the page cache survives
        with pytest.raises(LogFailedError, match="without a flush"):
            log.close()  # failed earlier: lets go of everything, and says so
    else:
        crashed = fs.crash("kill")
    assert not [name for name in fs.listdir(D) if name.endswith(".tmp")]  # a failed snapshot is removed
    for twin in (fs, crashed):
        reopened = Log.open(D, CONFIG, fs=twin, clock=clock)
        recovered = read_all(reopened)
        # Everything acknowledged, in order; at most the batch whose append failed after it
        # was written whole (its index entry could not be reserved) beyond it.
        assert recovered[: len(acked)] == acked, (where, twin.describe())
        assert len(recovered) <= len(acked) + 1, where
        reopened.append(small_batch(0, tag=8))
        reopened.close()
        assert twin.sigbus_risks == [], twin.sigbus_risks[:3]
