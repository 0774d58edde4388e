"""FaultFileSystem, the fault-injecting twin of the seam (issue 5, brief §9).

The first half pins the crash model on single files; the second runs the real Log
on the twin, crashes it in every fault class over many seeds, and checks the
invariants that need no full checker: every batch acknowledged durable (covered
by a completed flush()) is back at its offset byte for byte, the log is a prefix
of what was appended, and a flipped bit in fsynced data is reported, never served.
Every assertion message carries the twin's `describe()`, which starts with the seed.
"""

from __future__ import annotations

import errno
import os
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from log_helpers import read_all

from oncelog import CorruptLogError, Log, LogConfig, encode_batch
from oncelog.errors import CorruptMetadataError, CorruptRecordError
from oncelog.storage.fs import OsFileSystem
from oncelog.torture.crash_states import CrashMode
from oncelog.torture.faultfs import FaultFileSystem, SimulatedCrash

D = "/data/topic-0"
F = D + "/f"
T0 = 1_700_000_000_000
SEEDS = range(30)
# Every flush commits its recovery point (recovery_point_interval_ms=0): these tests damage
# what a flush vouched for, which must be reported. The default lags: tests/recovery/test_loader.py.
CONFIG = LogConfig(segment_bytes=2048, segment_index_bytes=4096, recovery_point_interval_ms=0)


def clock() -> int:
    return T0


def content(fs: FaultFileSystem, path: str) -> bytes | None:
    if not fs.exists(path):
        return None
    handle = fs.open(path, writable=False)
    try:
        return handle.pread(handle.size() + 1, 0)
    finally:
        handle.close()


def tree(fs: FaultFileSystem, root: str = "/data") -> dict[str, bytes]:
    """Every file under `root` with its bytes (what a reader of the twin sees)."""
    out: dict[str, bytes] = {}
    for name in fs.listdir(root):
        path = os.path.join(root, name)
        try:
            data = content(fs, path)
        except IsADirectoryError:
            out.update(tree(fs, path))
            continue
        assert data is not None
        out[path] = data
    return out


def new_file(fs: FaultFileSystem, data: bytes = b"", *, sync: bool = True, sync_dir: bool = True) -> None:
    fs.mkdir(D)
    handle = fs.open(F, create=True)
    if data:
        handle.pwritev([data], 0)
    if sync:
        handle.fsync()
    handle.close()
    if sync_dir:
        fs.fsync_dir(D)


def write(fs: FaultFileSystem, data: bytes, offset: int, *, sync: bool = False, path: str = F) -> None:
    handle = fs.open(path)
    handle.pwritev([data], offset)
    if sync:
        handle.fsync()
    handle.close()


# -- the model, one file at a time ------------------------------------------------------------
def test_write_without_fsync_is_lost_on_drop_only_sometimes_and_never_on_kill() -> None:
    outcomes = set()
    for seed in SEEDS:
        fs = FaultFileSystem(seed)
        new_file(fs, b"old-")
        write(fs, b"new", 4)
        assert content(fs.crash("kill"), F) == b"old-new", fs.describe()
        dropped = fs.crash("drop")
        assert content(dropped, F) in (b"old-", b"old-new"), dropped.describe()
        outcomes.add(content(dropped, F))
    assert outcomes == {b"old-", b"old-new"}


def test_write_and_fsync_survive_every_mode_except_the_flipped_bit() -> None:
    data = bytes(range(256)) * 20
    for seed in SEEDS:
        fs = FaultFileSystem(seed)
        new_file(fs, data)
        for mode in ("kill", "drop", "torn", "dirent", "misdirect"):
            crashed = fs.crash(mode)
            assert content(crashed, F) == data, crashed.describe()
        flipped = fs.crash("bitflip")
        after = content(flipped, F)
        assert after is not None and len(after) == len(data), flipped.describe()
        diff = int.from_bytes(after, "big") ^ int.from_bytes(data, "big")
        assert bin(diff).count("1") == 1, flipped.describe()
        (fault,) = flipped.faults
        assert fault.kind == "bitflip" and fault.path == F and after[fault.offset] != data[fault.offset]


def test_created_file_without_fsync_dir_can_vanish_on_dirent_or_drop_but_survives_after_fsync_dir() -> None:
    vanished_on_drop = 0
    for seed in SEEDS:
        fs = FaultFileSystem(seed)
        new_file(fs, b"synced data, unsynced name", sync_dir=False)
        assert content(fs.crash("kill"), F) == b"synced data, unsynced name"
        gone = fs.crash("dirent")
        assert not gone.exists(F) and gone.listdir(D) == [], gone.describe()
        vanished_on_drop += not fs.crash("drop").exists(F)
        fs.fsync_dir(D)
        for mode in ("drop", "torn", "dirent"):
            assert content(fs.crash(mode), F) == b"synced data, unsynced name", fs.describe()
    assert 0 < vanished_on_drop < len(SEEDS)


def test_rename_without_fsync_dir_can_revert_but_never_half_happens() -> None:
    tmp = D + "/f.tmp"
    reverted = 0
    for seed in SEEDS:
        fs = FaultFileSystem(seed)
        new_file(fs, b"old")
        handle = fs.open(tmp, create=True)
        handle.pwritev([b"new"], 0)
        handle.fsync()
        handle.close()
        fs.fsync_dir(D)
        fs.rename(tmp, F)
        assert fs.listdir(D) == ["f"] and content(fs, F) == b"new"
        back = fs.crash("dirent")
        assert (content(back, F), content(back, tmp)) == (b"old", b"new"), back.describe()
        dropped = fs.crash("drop")
        state = (content(dropped, F), content(dropped, tmp))
        # Atomic rename: either the old pair of names or the new one, never a mix.
        assert state in ((b"old", b"new"), (b"new", None)), dropped.describe()
        reverted += state == (b"old", b"new")
        fs.fsync_dir(D)
        assert (content(fs.crash("dirent"), F), content(fs.crash("drop"), tmp)) == (b"new", None)
    assert 0 < reverted < len(SEEDS)


def test_torn_writes_put_zeros_or_garbage_on_512_or_4096_byte_boundaries() -> None:
    data = bytes([0xA5]) * 3 * 4096
    fills: set[str] = set()
    sectors: set[int] = set()
    for seed in SEEDS:
        fs = FaultFileSystem(seed)
        new_file(fs)
        write(fs, data, 0)
        torn = fs.crash("torn")
        after = content(torn, F)
        assert after is not None and len(after) == len(data), torn.describe()
        (fault,) = [f for f in torn.faults if f.kind == "torn"]
        sector = int(fault.detail.split("-byte")[0])
        sectors.add(sector)
        damaged = 0
        for start in range(0, len(data), sector):
            piece = after[start : start + sector]
            if piece == data[start : start + sector]:
                continue
            damaged += 1
            # A piece is all new bytes or all fill: nothing tears inside a sector.
            assert piece.count(0xA5) < len(piece) // 8 or piece == bytes(sector), torn.describe()
            fills.add("zeros" if piece == bytes(sector) else "garbage")
        assert damaged >= 1, torn.describe()
    assert sectors == {512, 4096} and fills == {"zeros", "garbage"}


def test_fsync_eio_then_a_successful_fsync_still_loses_the_data_fsyncgate() -> None:
    for seed in range(10):
        fs = FaultFileSystem(seed)
        new_file(fs, b"old")
        fs.fail_next("fsync", errno.EIO)
        handle = fs.open(F)
        handle.pwritev([b"NEW"], 0)
        with pytest.raises(OSError) as failed:
            handle.fsync()
        assert failed.value.errno == errno.EIO and f"seed={seed}" in str(failed.value)
        handle.fsync()  # "succeeds": the kernel already marked the pages clean
        handle.close()
        assert content(fs, F) == b"NEW"  # still in the page cache...
        assert content(fs.crash("kill"), F) == b"NEW"  # ...which a kill -9 keeps
        for mode in ("drop", "torn", "misdirect"):
            crashed = fs.crash(mode)
            assert content(crashed, F) == b"old", crashed.describe()  # but the disk never got it


def test_enospc_on_write_raises_oserror_and_changes_nothing() -> None:
    fs = FaultFileSystem(7)
    new_file(fs, b"kept")
    before = tree(fs.crash("kill"))
    fs.fail_next("write", errno.ENOSPC)
    handle = fs.open(F)
    with pytest.raises(OSError) as failed:
        handle.pwritev([b"more bytes"], 4)
    assert failed.value.errno == errno.ENOSPC and "seed=7" in str(failed.value)
    assert handle.size() == 4 and content(fs, F) == b"kept"
    assert tree(fs.crash("kill")) == before and tree(fs.crash("drop")) == before
    handle.pwritev([b"!"], 4)  # one failure, then writes work again
    assert content(fs, F) == b"kept!"
    assert "ENOSPC" in fs.describe()


def test_error_rates_fail_writes_and_fsyncs_reproducibly() -> None:
    def errors(seed: int) -> list[int]:
        fs = FaultFileSystem(seed)
        new_file(fs)
        fs.write_error_rate = fs.fsync_error_rate = 0.3
        handle = fs.open(F)
        out = []
        for n in range(40):
            try:
                handle.pwritev([b"x"], n) if n % 2 else handle.fsync()
                out.append(0)
            except OSError as exc:
                assert f"seed={seed}" in str(exc)
                out.append(exc.errno or -1)
        return out

    assert errors(3) == errors(3)
    assert {errno.ENOSPC, errno.EIO, 0} <= set(errors(3) + errors(4))


def scripted_io(fs: FaultFileSystem, progress: list[str]) -> None:
    """A fixed sequence of I/O calls, noting each one that returned."""
    fs.mkdir(D)
    progress.append("mkdir")
    handle = fs.open(F, create=True)
    progress.append("open")
    handle.truncate(8192)
    progress.append("truncate")
    region = handle.mmap(8192, writable=True)
    region.buffer[:4] = b"MMAP"
    handle.pwritev([b"w"], 9000)
    progress.append("write")
    handle.fsync()
    progress.append("fsync")
    region.close()
    fs.fsync_dir(D)
    progress.append("fsync_dir")
    fs.rename(F, D + "/g")
    progress.append("rename")
    store = fs.open_store(D + "/meta")
    progress.append("open_store")
    store.put({"k": b"v"})
    progress.append("put")
    fs.unlink(D + "/g")
    progress.append("unlink")


def test_kill_at_raises_simulated_crash_at_exactly_the_nth_io_call() -> None:
    dry = FaultFileSystem(0)
    full: list[str] = []
    scripted_io(dry, full)
    assert dry.io_calls == len(full) == 10
    assert not issubclass(SimulatedCrash, OSError)
    for n in range(1, dry.io_calls + 1):
        fs = FaultFileSystem(0)
        fs.kill_at(n)
        progress: list[str] = []
        with pytest.raises(SimulatedCrash, match="seed=0"):
            scripted_io(fs, progress)
        assert fs.io_calls == n and progress == full[: n - 1] and fs.dead, fs.describe()
        with pytest.raises(SimulatedCrash):
            fs.fsync_dir("/")  # the process is dead: nothing more reaches the disk
        fs.crash("kill")  # and its last state can still be crashed


def test_mapped_writes_are_read_back_at_once_and_unsynced_until_fsync() -> None:
    lost = 0
    for seed in SEEDS:
        fs = FaultFileSystem(seed)
        new_file(fs, bytes(8192))
        handle = fs.open(F)
        region = handle.mmap(8192, writable=True)
        array = np.frombuffer(region.buffer, dtype=">i4")
        array[1025] = 7  # the second page
        assert handle.pread(4, 4100) == struct.pack(">i", 7)
        assert content(fs.crash("kill"), F) == content(fs, F)
        lost += content(fs.crash("drop"), F) == bytes(8192)
        handle.fsync()
        for mode in ("drop", "torn", "misdirect"):
            assert (content(fs.crash(mode), F) or b"")[4100:4104] == struct.pack(">i", 7), fs.describe()
        handle.pwritev([b"\1\2\3\4"], 0)  # a write() shows through the mapping
        assert bytes(array[:1]) == b"\1\2\3\4"
        del array
        region.close()
        handle.close()
    assert 0 < lost < len(SEEDS)


def test_blocks_come_from_writes_and_allocate_never_from_a_growing_truncate() -> None:
    fs = FaultFileSystem(3)
    new_file(fs, b"x" * 100)  # pwritev: bytes 0-99 have blocks
    handle = fs.open(F)
    assert fs.unreserved(F, 0, 100) is None
    handle.truncate(8192)  # sparse: the file grows, no block comes with it
    assert handle.size() == 8192 and fs.unreserved(F, 0, 8192) == (100, 8192)
    handle.allocate(4096, start=1000)
    assert fs.unreserved(F, 0, 8192) == (100, 1000)
    handle.allocate(6000)  # from 0: the holes get blocks, the file keeps its size
    assert handle.size() == 8192 and fs.unreserved(F, 0, 8192) == (6000, 8192)
    handle.truncate(2000)  # a cut frees what lies past it...
    handle.truncate(8192)  # ...so growing back is sparse again
    assert fs.unreserved(F, 0, 8192) == (2000, 8192)
    handle.allocate(10_000, start=8192)  # allocate grows the file, reading as zeros
    assert handle.size() == 10_000 and content(fs, F) == b"x" * 100 + bytes(9_900)
    assert fs.unreserved(F, 0, 10_000) == (2000, 8192)
    assert fs.sigbus_risks == []  # nothing mapped yet


def test_a_writable_mapping_over_sparse_space_and_a_write_through_it_are_sigbus_risks() -> None:
    fs = FaultFileSystem(4)
    new_file(fs, b"head")
    handle = fs.open(F)
    handle.truncate(8192)  # the old way to grow an index: sparse
    region = handle.mmap(8192, writable=True)
    assert len(fs.sigbus_risks) == 1 and "no blocks at (4, 8192)" in fs.sigbus_risks[0]
    assert "seed=4" in fs.sigbus_risks[0]
    region.buffer[5000:5004] = b"boom"
    handle.fsync()  # takes the mapped write in
    assert (
        len(fs.sigbus_risks) == 2
        and "mapped write" in fs.sigbus_risks[1]
        and "(5000, 5004)" in fs.sigbus_risks[1]
    )
    region.close()
    # Reserved first, mapped, written: nothing to report. Read-only mappings never are.
    handle.allocate(8192)
    region = handle.mmap(8192, writable=True)
    region.buffer[6000:6004] = b"fine"
    handle.fsync()
    handle.mmap(8192, writable=False).close()
    assert len(fs.sigbus_risks) == 2
    # A mapping left reaching past a cut: touching it is SIGBUS whatever the disk holds.
    handle.truncate(4096)
    assert len(fs.sigbus_risks) == 3 and "outlives its cut to 4096" in fs.sigbus_risks[2]
    region.close()
    handle.close()


def test_a_crash_forgets_every_reservation() -> None:
    fs = FaultFileSystem(5)
    new_file(fs)
    handle = fs.open(F)
    handle.allocate(8192)
    handle.fsync()
    handle.close()
    crashed = fs.crash("kill")
    assert crashed.unreserved(F, 0, 8192) == (0, 8192)
    crashed.open(F).mmap(8192, writable=True).close()
    assert len(crashed.sigbus_risks) == 1 and fs.sigbus_risks == []


def test_the_write_error_rate_fails_allocates_and_store_commits_as_a_full_disk_does() -> None:
    fs = FaultFileSystem(8, write_error_rate=0.5)
    fs.mkdir(D)
    handle = fs.open(F, create=True)
    store = fs.open_store(D + "/meta")
    failed: dict[str, set[int | None]] = {"allocate": set(), "put": set()}
    for n in range(60):
        try:
            handle.allocate(4096 * (n + 1))
        except OSError as exc:
            failed["allocate"].add(exc.errno)
        try:
            store.put({"k": b"v"})
        except OSError as exc:
            failed["put"].add(exc.errno)
    assert failed == {"allocate": {errno.ENOSPC, errno.EIO}, "put": {errno.ENOSPC, errno.EIO}}
    # A failed allocate reserves nothing and grows nothing.
    fs.write_error_rate = 1.0
    size = handle.size()
    with pytest.raises(OSError):
        handle.allocate(size + 4096, start=size)
    assert handle.size() == size and fs.unreserved(F, size, size + 4096) == (size, size + 4096)


def test_misdirected_write_lands_whole_at_another_sector_offset() -> None:
    for seed in SEEDS:
        fs = FaultFileSystem(seed)
        new_file(fs, bytes(4 * 4096))
        write(fs, b"X" * 100, 8192)
        crashed = fs.crash("misdirect")
        after = content(crashed, F)
        (fault,) = crashed.faults
        wrong = int(fault.detail.rsplit(" ", 1)[1])
        # At the file's start (the only other write position here) or whole sectors away.
        assert after is not None and wrong != 8192 and wrong % 512 == 0, crashed.describe()
        assert after[wrong : wrong + 100] == b"X" * 100 and after[8192:8292] != b"X" * 100, crashed.describe()


def test_same_seed_gives_byte_identical_crash_states() -> None:
    def states(seed: int) -> list[tuple[dict[str, bytes], str]]:
        fs = FaultFileSystem(seed)
        Workload(seed, fs).run(batches=30)
        return [
            (tree(c), c.describe()) for c in (fs.crash(m) for m in ("drop", "torn", "misdirect", "bitflip"))
        ]

    assert states(11) == states(11)
    assert states(11) != states(12)


def test_is_dir_tells_directories_from_files_and_missing_names_as_the_os_does(tmp_path: Path) -> None:
    twin, real = FaultFileSystem(0), OsFileSystem()
    for fs, root in ((twin, D), (real, str(tmp_path))):
        fs.mkdir(root + "/sub")
        fs.open(root + "/file", create=True).close()
        answers = [fs.is_dir(root + name) for name in ("", "/sub", "/file", "/missing", "/file/below")]
        assert answers == [True, True, False, False, False], fs


def test_a_listing_names_directories_as_not_regular_files_as_the_os_does(tmp_path: Path) -> None:
    twin, real = FaultFileSystem(0), OsFileSystem()
    for fs, root in ((twin, D), (real, str(tmp_path))):
        fs.mkdir(root + "/sub")
        fs.open(root + "/file", create=True).close()
        listing = fs.list_entries(root)
        assert (listing.names, listing.irregular) == (["file", "sub"], {"sub"}), fs


def test_namespace_matches_the_os_seam() -> None:
    fs = FaultFileSystem(0)
    fs.mkdir(D + "/sub")
    fs.mkdir(D)  # idempotent
    assert fs.exists("/data") and fs.exists(D + "/sub") and not fs.exists(F)
    with pytest.raises(FileNotFoundError):
        fs.open(F)
    with pytest.raises(FileNotFoundError):
        fs.listdir("/nowhere")
    lock = fs.lock(D + "/.lock")
    with pytest.raises(BlockingIOError):
        fs.lock(D + "/.lock")
    lock.release()
    fs.lock(D + "/.lock").release()
    fs.open_store(D + "/meta.lmdb").put({"k": b"v"})
    assert fs.listdir(D) == [".lock", "meta.lmdb", "sub"]
    assert fs.open_store(D + "/meta.lmdb").get("k") == b"v"
    assert fs.crash("drop").open_store(D + "/meta.lmdb").get("k") == b"v"  # put is durable at once
    assert not fs.exists("data/topic-0")  # paths are strings: relative is not absolute
    read_only = fs.open(D + "/.lock", writable=False)
    with pytest.raises(OSError):
        read_only.pwritev([b"x"], 0)


def test_sync_filesystem_makes_every_unsynced_file_and_name_durable_at_once() -> None:
    for seed in SEEDS:
        fs = FaultFileSystem(seed)
        new_file(fs, b"unsynced name", sync_dir=False)
        fs.mkdir("/other")
        handle = fs.open("/other/g", create=True)
        handle.pwritev([b"unsynced data"], 0)
        handle.close()
        fs.sync_filesystem(D)
        for mode in ("drop", "torn", "dirent"):
            crashed = fs.crash(mode)
            assert content(crashed, F) == b"unsynced name", crashed.describe()
            assert content(crashed, "/other/g") == b"unsynced data", crashed.describe()


def test_store_delete_and_keys_and_remove_dir_match_the_os_seam(tmp_path: Path) -> None:
    for fs, root in ((FaultFileSystem(0), D), (OsFileSystem(), str(tmp_path))):
        store = fs.open_store(root + "/meta.lmdb")
        store.put({"a/1": b"x", "a/2": b"y", "b/1": b"z"})
        assert store.keys("a/") == ["a/1", "a/2"] and store.keys("c") == []
        store.delete(["a/1", "missing"])
        assert store.keys("") == ["a/2", "b/1"] and store.get("a/1") is None
        store.close()
        fs.mkdir(root + "/empty/inner")
        with pytest.raises(OSError):
            fs.remove_dir(root + "/empty")  # not empty
        fs.remove_dir(root + "/empty/inner")
        fs.remove_dir(root + "/empty")
        assert not fs.exists(root + "/empty")


def test_a_file_where_a_store_belongs_is_corrupt_metadata_on_the_twin_as_on_the_os(tmp_path: Path) -> None:
    for fs, root in ((FaultFileSystem(0), D), (OsFileSystem(), str(tmp_path))):
        fs.mkdir(root)
        fs.open(root + "/meta.lmdb", create=True).close()
        for readonly in (False, True):
            with pytest.raises(CorruptMetadataError) as raised:
                fs.open_store(root + "/meta.lmdb", readonly=readonly)
            assert raised.value.path == root + "/meta.lmdb"
        store = fs.open_store(root + "/other.lmdb")
        assert store.path == root + "/other.lmdb"  # what its errors name
        store.close()


# -- the real engine on the twin ------------------------------------------------------------------
@dataclass
class Workload:
    """Idempotent and plain appends with random flushes, rolls and clean reopens."""

    seed: int
    fs: FaultFileSystem
    written: list[tuple[int, bytes]] = field(default_factory=list)  # (base offset, bytes as stored)
    durable: int = 0  # how many of `written` a completed flush() covered
    log: Log | None = None

    def run(self, batches: int = 45, *, close: bool = False) -> None:
        rng = random.Random(self.seed)
        sequences = {1: 0, 2: 0, 3: 0}
        self.log = Log.open(D, CONFIG, fs=self.fs, clock=clock)
        for n in range(batches):
            pid = rng.choice((1, 2, 3, -1))
            count = rng.randint(1, 3)
            records = [(b"k%d" % n, rng.randbytes(rng.randint(10, 150))) for _ in range(count)]
            if pid < 0:
                data = encode_batch(records, timestamp_ms=T0 + n)
            else:
                data = encode_batch(
                    records,
                    producer_id=pid,
                    producer_epoch=0,
                    base_sequence=sequences[pid],
                    timestamp_ms=T0 + n,
                )
            result = self.log.append(data)
            assert not result.duplicate
            if pid >= 0:
                sequences[pid] += count
            self.written.append((result.first_offset, struct.pack(">q", result.first_offset) + data[8:]))
            if rng.random() < 0.15:
                self.log.flush()
                self.durable = len(self.written)
            if rng.random() < 0.04:
                self.log.close()
                self.durable = len(self.written)
                self.log = Log.open(D, CONFIG, fs=self.fs, clock=clock)
        if close:
            self.log.close()
            self.durable = len(self.written)


def check_recovered(crashed: FaultFileSystem, work: Workload, *, everything: bool) -> None:
    """The flushed prefix is back byte for byte; the log is a prefix of what was written."""
    why = crashed.describe()
    log = Log.open(D, CONFIG, fs=crashed, clock=clock)
    got = read_all(log)
    for n, (have, want) in enumerate(zip(got, work.written, strict=False)):
        if have != want:
            kind = "acknowledged-durable" if n < work.durable else "unflushed"
            what = "other bytes" if have[0] == want[0] else f"offset {have[0]} (a hole: not a prefix)"
            raise AssertionError(f"the {kind} batch at offset {want[0]} came back as {what}; {why}")
    assert len(got) >= work.durable, f"lost {work.durable - len(got)} acknowledged-durable batches; {why}"
    if everything:
        assert len(got) == len(work.written), f"lost {len(work.written) - len(got)} appended batches; {why}"
    # The recovered log takes appends and survives a clean reopen unchanged.
    log.append(encode_batch([(b"after", b"recovery")], timestamp_ms=T0))
    log.close()
    reopened = Log.open(D, CONFIG, fs=crashed, clock=clock)
    assert reopened.recovery_report.clean and read_all(reopened)[:-1] == got, why
    reopened.close()


def test_log_runs_on_the_twin_and_reopens_on_it() -> None:
    fs = FaultFileSystem(5)
    work = Workload(5, fs)
    work.run(batches=60, close=True)
    log = Log.open(D, CONFIG, fs=fs, clock=clock)
    assert log.recovery_report.clean and len(log.segments) > 3
    assert read_all(log) == work.written
    log.close()
    assert ".clean_shutdown" in fs.listdir(D) and "meta.lmdb" in fs.listdir(D)


@pytest.mark.parametrize("mode", ["kill", "drop", "torn", "dirent"])
@pytest.mark.parametrize("seed", SEEDS)
def test_acknowledged_durable_batches_survive_a_crash(mode: CrashMode, seed: int) -> None:
    fs = FaultFileSystem(seed)
    work = Workload(seed, fs)
    work.run()
    check_recovered(fs.crash(mode), work, everything=mode in ("kill", "dirent"))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_misdirected_write_is_cut_as_a_torn_tail_or_reported(seed: int) -> None:
    fs = FaultFileSystem(seed)
    work = Workload(seed, fs)
    work.run()
    crashed = fs.crash("misdirect")
    try:
        check_recovered(crashed, work, everything=False)
    except CorruptLogError:
        # It landed on fsynced bytes below the recovery point: reported, as it must be.
        (fault,) = [f for f in crashed.faults if f.kind == "misdirect"]
        assert int(fault.detail.rsplit(" ", 1)[1]) < fault.offset, crashed.describe()


@pytest.mark.parametrize("seed", range(12))
def test_killed_at_any_io_call_then_power_loss_keeps_what_was_flushed(seed: int) -> None:
    dry = FaultFileSystem(seed)
    Workload(seed, dry).run(batches=25, close=True)
    for n in sorted(random.Random(seed).sample(range(1, dry.io_calls + 1), 6)):
        fs = FaultFileSystem(seed)
        fs.kill_at(n)
        work = Workload(seed, fs)
        with pytest.raises(SimulatedCrash):
            work.run(batches=25, close=True)
        for mode in ("kill", "drop"):
            check_recovered(fs.crash(mode), work, everything=False)


@pytest.mark.parametrize("seed", range(10))
def test_a_second_crash_during_or_after_recovery_loses_nothing_it_must_keep(seed: int) -> None:
    fs = FaultFileSystem(seed)
    work = Workload(seed, fs)
    work.run()
    first = fs.crash("drop")  # every crash state is all durable: copies of it are identical
    # Right after recovery: a power loss keeps everything recovery served (KAFKA-10101).
    after = first.crash("kill")
    exposed = read_all(Log.open(D, CONFIG, fs=after, clock=clock))
    second = after.crash("drop")
    kept = read_all(Log.open(D, CONFIG, fs=second, clock=clock))
    assert kept == exposed, f"a crash right after recovery lost what it served; {second.describe()}"
    # During recovery (and its close): the flushed prefix survives a kill then a power loss.
    calls = after.io_calls
    for n in sorted(random.Random(seed).sample(range(1, calls + 1), min(4, calls))):
        again = first.crash("kill")
        again.kill_at(n)
        with pytest.raises(SimulatedCrash):
            Log.open(D, CONFIG, fs=again, clock=clock).close()
        check_recovered(again.crash("drop"), work, everything=False)


def batch_spans(data: bytes) -> list[tuple[int, int, int]]:
    """(position, size, base offset) of each batch in a segment's bytes.

    The active segment's file is pre-allocated past its data: the walk ends at the
    first all-zero 17-byte header (unwritten space).
    """
    spans, position = [], 0
    while position + 12 <= len(data):
        if data[position : position + 17] == bytes(17):
            break
        base, length = struct.unpack_from(">qi", data, position)
        spans.append((position, length + 12, base))
        position += length + 12
    return spans


def field_at(byte: int) -> str:
    """The v2 batch header field holding byte `byte` of a batch."""
    fields = [(8, "baseOffset"), (12, "batchLength"), (16, "partitionLeaderEpoch"), (17, "magic")]
    return next((name for end, name in fields if byte < end), "crc" if byte < 21 else "the CRC-covered part")


def is_log(path: str) -> bool:
    return path.endswith(".log")


# 46, 58 and 73 flip batchLength or magic of a batch in a sealed segment (seen while
# writing this: the read path raised CorruptRecordError there, not CorruptLogError).
# 335 and 671 flip a sealed batch's baseOffset (outside the CRC) so that it claims
# the offsets of the batch after it; reads served it until they checked the chain
# of offsets from the index entry on.
@pytest.mark.parametrize("seed", [*SEEDS, 46, 58, 73, 335, 671])
def test_a_flipped_bit_in_flushed_log_data_is_reported_never_served(seed: int) -> None:
    fs = FaultFileSystem(seed)
    work = Workload(seed, fs)
    work.run()
    work.log.flush()  # type: ignore[union-attr]
    flipped = fs.crash("bitflip", target=is_log)
    (fault,) = flipped.faults
    original = content(fs, fault.path)
    assert original is not None
    spans = batch_spans(original)
    data_end = spans[-1][0] + spans[-1][1] if spans else 0
    if fault.offset >= data_end:
        check_flip_in_unwritten_space(flipped, work, original, data_end, fault.offset)
        return
    position, size, base = next(s for s in spans if s[0] <= fault.offset < s[0] + s[1])
    at = fault.offset - position
    why = f"flip in {field_at(at)} (byte {at}) of the {size}-byte batch at offset {base} in {fault.path}"
    why += f"; {flipped.describe()}"
    try:
        log = Log.open(D, CONFIG, fs=flipped, clock=clock)
    except CorruptLogError:
        return  # reported at open
    cut = log.recovery_report.truncated_bytes
    assert cut == 0, f"recovery cut {cut} bytes of fsynced data as a torn tail, silently; {why}"
    expected = dict(work.written)
    caught = False
    for offset, _ in work.written:
        try:
            fetched = log.read(offset, max_bytes=1)
        except CorruptLogError:
            caught = caught or offset == base
            continue
        except CorruptRecordError as exc:
            raise AssertionError(f"read({offset}) raised {exc!r}, not CorruptLogError; {why}") from None
        for batch in fetched.batches:
            served = bytes(batch.buffer)
            assert served == expected.get(batch.base_offset), f"read({offset}) served corrupt bytes; {why}"
    assert caught, f"the damaged batch was never reported; {why}"
    log.close()


def check_flip_in_unwritten_space(
    flipped: FaultFileSystem, work: Workload, original: bytes, data_end: int, at: int
) -> None:
    """A flip past the last batch, in the active segment's pre-allocated zeros: no data was hit.

    Recovery cannot tell a non-zero byte there from a torn write of a later batch, so it
    cuts it as a torn tail: exactly the span up to the flipped byte, the zeros after it as
    the zero tail. It must not lose or damage any batch, nor refuse to open.
    """
    why = f"flip at {at} in the unwritten space after the data (ends at {data_end}); {flipped.describe()}"
    assert original[data_end:] == bytes(len(original) - data_end), why
    log = Log.open(D, CONFIG, fs=flipped, clock=clock)
    report = log.recovery_report
    assert report.truncated_bytes == at + 1 - data_end, why
    assert report.zero_tail_bytes == len(original) - at - 1, why
    assert report.tail_error is not None, why
    assert read_all(log) == work.written, f"a written batch was lost or damaged; {why}"
    log.close()


def test_from_directory_and_materialize_round_trip(tmp_path: Path) -> None:
    real = str(tmp_path / "real")
    log = Log.open(real, CONFIG, clock=clock)
    for n in range(30):
        log.append(encode_batch([(b"k", b"v" * n)], timestamp_ms=T0 + n))
    log.flush()
    expected = read_all(log)  # an unclean copy: the Log is still open
    twin = FaultFileSystem.from_directory(real, 3, into=D)
    log.close()
    recovered = Log.open(D, CONFIG, fs=twin, clock=clock)
    assert read_all(recovered) == expected and not recovered.recovery_report.clean
    recovered.close()
    out = str(tmp_path / "out")
    twin.crash("drop").materialize(out, source=D)
    on_disk = Log.open(out, CONFIG, fs=OsFileSystem(), clock=clock)
    assert on_disk.recovery_report.clean and read_all(on_disk) == expected
    on_disk.close()


def test_failure_messages_and_descriptions_carry_the_seed() -> None:
    fs = FaultFileSystem(424242)
    fs.kill_at(30)
    with pytest.raises(SimulatedCrash, match="seed=424242"):
        Workload(424242, fs).run()
    crashed = fs.crash("drop")
    assert fs.describe().startswith("seed=424242") and "kill_at=30 (dead)" in fs.describe()
    assert crashed.describe().startswith("seed=424242 crash#1(drop)")


def test_a_read_only_store_creates_nothing_is_no_io_call_and_refuses_writes() -> None:
    fs = FaultFileSystem(0)
    fs.mkdir(D)
    with pytest.raises(FileNotFoundError):
        fs.open_store(D + "/meta.lmdb", readonly=True)
    assert fs.listdir(D) == [] and not fs.exists(D + "/meta.lmdb")  # nothing created
    fs.open_store(D + "/meta.lmdb").put({"a/1": b"x", "a/2": b"y"})
    calls = fs.io_calls
    fs.kill_at(calls + 1)  # the next I/O call would kill the twin

    store = fs.open_store(D + "/meta.lmdb", readonly=True)
    assert store.get("a/1") == b"x" and store.keys("a/") == ["a/1", "a/2"]
    with pytest.raises(PermissionError, match=r"meta\.lmdb"):
        store.put({"a/3": b"z"})
    with pytest.raises(PermissionError, match=r"meta\.lmdb"):
        store.delete(["a/1"])
    store.close()

    assert (fs.io_calls, fs.dead) == (calls, False)
    assert fs.open_store(D + "/meta.lmdb", readonly=True).keys("") == ["a/1", "a/2"]


def test_a_lost_crash_deletes_or_empties_one_file_fsynced_whole_and_never_one_with_pending_writes() -> None:
    outcomes = set()
    for seed in SEEDS:
        fs = FaultFileSystem(seed)
        new_file(fs, b"fsynced whole")
        pending = fs.open(D + "/g", create=True)
        pending.pwritev([b"not fsynced"], 0)  # pending writes: never the one lost
        fs.fsync_dir(D)
        crashed = fs.crash("lost")
        (fault,) = crashed.faults
        assert fault.kind == "lost" and fault.path == F, crashed.describe()
        assert content(crashed, D + "/g") == b"not fsynced"  # kill semantics for the rest
        outcomes.add(content(crashed, F))
        assert content(fs, F) == b"fsynced whole"  # the twin itself is unchanged
    assert outcomes == {None, b""}  # deleted in some seeds, emptied in others


def test_a_lost_crash_with_nothing_fsynced_loses_nothing_and_says_so() -> None:
    fs = FaultFileSystem(1)
    new_file(fs, b"unsynced", sync=False)
    crashed = fs.crash("lost")
    assert content(crashed, F) == b"unsynced"
    assert [fault.detail for fault in crashed.faults] == ["no fsynced file to lose"]
