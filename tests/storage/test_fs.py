"""The OS implementation of the filesystem seam."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest

from oncelog.errors import CorruptMetadataError
from oncelog.storage.fs import DelegatingFileSystem, OsFileSystem, ReadOnlyFileSystem
from oncelog.storage.lmdb_store import LmdbStore


def test_pwritev_writes_every_buffer_back_to_back_at_the_offset(tmp_path: Path) -> None:
    fs = OsFileSystem()
    handle = fs.open(str(tmp_path / "f"), create=True)
    assert handle.pwritev([b"abc", memoryview(b"defg"), bytearray(b"h")], 0) == 8
    assert handle.pwritev([b"XY"], 2) == 2
    assert handle.pread(100, 0) == b"abXYefgh"
    handle.close()


def test_pwritev_splits_requests_larger_than_iov_max(tmp_path: Path) -> None:
    fs = OsFileSystem()
    handle = fs.open(str(tmp_path / "f"), create=True)
    buffers = [bytes([n % 256]) * 3 for n in range(3000)]
    assert handle.pwritev(buffers, 0) == 9000
    assert handle.pread(9000, 0) == b"".join(buffers)
    handle.close()


def test_pread_past_end_of_file_returns_what_is_there(tmp_path: Path) -> None:
    fs = OsFileSystem()
    handle = fs.open(str(tmp_path / "f"), create=True)
    handle.pwritev([b"12345"], 0)
    assert handle.pread(10, 3) == b"45"
    assert handle.pread(10, 99) == b""
    handle.close()


def test_read_only_handle_refuses_writes(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"data")
    handle = OsFileSystem().open(str(tmp_path / "f"), writable=False)
    try:
        handle.pwritev([b"x"], 0)
    except OSError:
        pass
    else:
        raise AssertionError("a read-only handle accepted a write")
    assert handle.pread(4, 0) == b"data"
    handle.close()


def test_mapped_region_writes_reach_the_file(tmp_path: Path) -> None:
    fs = OsFileSystem()
    handle = fs.open(str(tmp_path / "f"), create=True)
    handle.truncate(16)
    region = handle.mmap(16, writable=True)
    array = np.frombuffer(region.buffer, dtype=">i4")
    array[:] = [1, 2, 3, 4]
    region.flush()
    del array
    region.close()
    assert (tmp_path / "f").read_bytes() == np.array([1, 2, 3, 4], dtype=">i4").tobytes()
    handle.close()


def blocks_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_allocate_reserves_the_holes_of_a_sparse_file_and_keeps_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    handle = OsFileSystem().open(str(path), create=True)
    handle.pwritev([b"kept"], 0)
    handle.truncate(1024 * 1024)  # sparse: the size grows, the blocks do not
    assert blocks_bytes(path) < 64 * 1024
    handle.allocate(512 * 1024, start=256 * 1024)
    assert 256 * 1024 <= blocks_bytes(path) < 512 * 1024 + 64 * 1024
    handle.allocate(1024 * 1024)  # from 0: every hole gets its block
    assert blocks_bytes(path) >= 1024 * 1024
    handle.allocate(2 * 1024 * 1024, start=1024 * 1024)  # and past the end the file grows
    assert handle.size() == 2 * 1024 * 1024 and blocks_bytes(path) >= 2 * 1024 * 1024
    assert handle.pread(8, 0) == b"kept" + bytes(4)
    handle.close()


def test_a_metadata_store_has_its_lock_file_blocks_reserved_before_lmdb_maps_it(tmp_path: Path) -> None:
    # LMDB grows lock.mdb with ftruncate and writes its reader table through a shared
    # mapping during the open: sparse, that was SIGBUS on a full disk.
    store = OsFileSystem().open_store(str(tmp_path / "meta.lmdb"))
    store.put({"k": b"v"})
    lock = tmp_path / "meta.lmdb" / "lock.mdb"
    assert lock.stat().st_size > 0 and blocks_bytes(lock) >= lock.stat().st_size
    store.close()
    reopened = OsFileSystem().open_store(str(tmp_path / "meta.lmdb"))  # and again, nothing lost
    assert reopened.get("k") == b"v"
    reopened.close()


def test_a_metadata_store_keeps_lmdbs_lock_so_other_processes_see_it_open(tmp_path: Path) -> None:
    # LMDB's locks are fcntl locks, lost when the process closes any descriptor of
    # lock.mdb: reserving its blocks must not close one behind LMDB's back, or another
    # process would take the environment as its own and reset the reader table.
    store = OsFileSystem().open_store(str(tmp_path / "meta.lmdb"))
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n"
        "    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)\n"
        "except BlockingIOError:\n"
        "    sys.exit(3)\n"
    )
    lock = str(tmp_path / "meta.lmdb" / "lock.mdb")
    assert subprocess.run([sys.executable, "-c", probe, lock]).returncode == 3  # held by this process
    store.put({"k": b"v"})
    assert subprocess.run([sys.executable, "-c", probe, lock]).returncode == 3
    store.close()
    assert subprocess.run([sys.executable, "-c", probe, lock]).returncode == 0  # released at close


def test_directory_operations(tmp_path: Path) -> None:
    fs = OsFileSystem()
    nested = str(tmp_path / "a" / "b")
    fs.mkdir(nested)
    fs.mkdir(nested)  # idempotent
    handle = fs.open(os.path.join(nested, "x.tmp"), create=True)
    handle.pwritev([b"v"], 0)
    handle.fsync()
    handle.close()
    fs.rename(os.path.join(nested, "x.tmp"), os.path.join(nested, "x"))
    fs.fsync_dir(nested)
    assert fs.listdir(nested) == ["x"]
    assert fs.exists(os.path.join(nested, "x"))
    fs.unlink(os.path.join(nested, "x"))
    assert fs.listdir(nested) == []


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_a_read_only_store_creates_nothing_and_refuses_writes(tmp_path: Path) -> None:
    fs = OsFileSystem()
    store_path = str(tmp_path / "meta.lmdb")
    with pytest.raises(FileNotFoundError):
        fs.open_store(store_path, readonly=True)  # missing: not created
    assert not os.path.exists(store_path)
    writer = fs.open_store(store_path)
    writer.put({"a/1": b"x", "a/2": b"y"})
    writer.close()
    os.unlink(os.path.join(store_path, "lock.mdb"))
    before = _tree(tmp_path)

    store = fs.open_store(store_path, readonly=True)
    assert store.get("a/1") == b"x" and store.get("b") is None and store.keys("a/") == ["a/1", "a/2"]
    with pytest.raises(PermissionError, match=r"meta\.lmdb"):
        store.put({"a/3": b"z"})
    with pytest.raises(PermissionError, match=r"meta\.lmdb"):
        store.delete(["a/1"])
    store.close()

    assert _tree(tmp_path) == before  # not even LMDB's lock.mdb
    reopened = fs.open_store(store_path, readonly=True)
    assert reopened.keys("") == ["a/1", "a/2"]
    reopened.close()


def test_a_read_only_store_reports_a_damaged_store_as_corrupt_metadata_error(tmp_path: Path) -> None:
    (tmp_path / "meta.lmdb").mkdir()
    (tmp_path / "meta.lmdb" / "data.mdb").write_bytes(b"not lmdb" * 1000)
    with pytest.raises(CorruptMetadataError, match="not an LMDB file") as raised:
        OsFileSystem().open_store(str(tmp_path / "meta.lmdb"), readonly=True)
    assert raised.value.path == str(tmp_path / "meta.lmdb")


def test_a_read_only_seam_reads_and_refuses_everything_that_would_change_the_disk(tmp_path: Path) -> None:
    OsFileSystem().open_store(str(tmp_path / "meta.lmdb")).close()
    (tmp_path / "f").write_bytes(b"data")
    fs = ReadOnlyFileSystem(DelegatingFileSystem())
    before = _tree(tmp_path)

    handle = fs.open(str(tmp_path / "f"), create=True)  # create and writable are ignored
    assert handle.pread(4, 0) == b"data"
    with pytest.raises(OSError):
        handle.pwritev([b"x"], 0)
    handle.close()
    with pytest.raises(FileNotFoundError):
        fs.open(str(tmp_path / "new"), create=True)
    fs.open_store(str(tmp_path / "meta.lmdb"), readonly=True).close()
    path, other = str(tmp_path / "f"), str(tmp_path / "g")
    refused = {
        "open_store": lambda: fs.open_store(path),
        "lock": lambda: fs.lock(path),
        "mkdir": lambda: fs.mkdir(other),
        "rename": lambda: fs.rename(path, other),
        "unlink": lambda: fs.unlink(path),
        "remove_dir": lambda: fs.remove_dir(str(tmp_path)),
        "sync_filesystem": lambda: fs.sync_filesystem(str(tmp_path)),
        "fsync_dir": lambda: fs.fsync_dir(str(tmp_path)),
    }
    for name, call in refused.items():
        with pytest.raises(PermissionError) as caught:
            call()
        assert caught.value.filename in (path, other, str(tmp_path)), name
        assert f"{name} " in str(caught.value), caught.value

    assert fs.exists(path) and fs.listdir(str(tmp_path)) == ["f", "meta.lmdb"]
    assert _tree(tmp_path) == before


def _committed_store(path: Path) -> None:
    store = OsFileSystem().open_store(str(path))
    for n in range(50):
        store.put({f"key{n}": bytes(200)})
    store.close()


def test_a_truncated_store_is_refused_by_name_in_a_process_that_survives(tmp_path: Path) -> None:
    # LMDB maps data.mdb and trusts its meta pages: reading a page cut off the end of the
    # file kills the process with SIGBUS, which no except clause can catch. A child opens it.
    _committed_store(tmp_path / "meta.lmdb")
    data = tmp_path / "meta.lmdb" / "data.mdb"
    os.truncate(data, 8192)  # both meta pages kept, every tree page gone
    probe = (
        "from oncelog.storage.fs import OsFileSystem\n"
        "from oncelog.errors import CorruptMetadataError\n"
        "for readonly in (False, True):\n"
        "    try:\n"
        f"        s = OsFileSystem().open_store({str(data.parent)!r}, readonly=readonly); s.keys('')\n"
        "    except CorruptMetadataError as exc:\n"
        "        print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)  # not -SIGBUS
    assert done.stdout.count(f"{data.parent}: data.mdb is truncated: 8192 bytes") == 2


def test_an_empty_data_file_is_no_store_to_a_reader_and_a_fresh_one_to_a_writer(tmp_path: Path) -> None:
    _committed_store(tmp_path / "meta.lmdb")
    os.truncate(tmp_path / "meta.lmdb" / "data.mdb", 0)
    with pytest.raises(FileNotFoundError):
        OsFileSystem().open_store(str(tmp_path / "meta.lmdb"), readonly=True)
    store = OsFileSystem().open_store(str(tmp_path / "meta.lmdb"))
    assert store.keys("") == []  # how the loader and LogManager tell a lost store
    store.close()


def test_a_store_in_a_directory_whose_name_is_not_utf8_opens(tmp_path: Path) -> None:
    partition = tmp_path / os.fsdecode(b"t\xff-0")
    partition.mkdir()
    path = str(partition / "meta.lmdb")
    store = OsFileSystem().open_store(path)
    store.put({"k": b"v"})
    store.close()
    reader = OsFileSystem().open_store(path, readonly=True)
    assert reader.get("k") == b"v"
    reader.close()


def test_a_store_past_its_largest_map_is_an_os_error_naming_it_not_an_lmdb_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(LmdbStore, "MAX_MAP_BYTES", 2 * LmdbStore.MAP_BYTES)
    store = OsFileSystem().open_store(str(tmp_path / "meta.lmdb"))
    with pytest.raises(OSError, match=r"metadata store .*meta\.lmdb") as raised:
        store.put({"big": bytes(2 * LmdbStore.MAP_BYTES)})
    assert raised.value.errno == errno.ENOSPC
    assert not isinstance(raised.value, lmdb.Error)
    store.put({"small": b"ok"})  # the failed commit changed nothing
    assert store.keys("") == ["small"]
    store.close()


def test_a_store_outgrowing_its_map_grows_it_and_keeps_every_commit(tmp_path: Path) -> None:
    # Hundreds of thousands of transactional ids, or a mass retire, outgrow 16 MiB.
    path = str(tmp_path / "meta.lmdb")
    store = OsFileSystem().open_store(path)
    values = {f"txn/{n:07d}": bytes([n % 251]) * 100 for n in range(300_000)}  # ~40 MiB of pages
    for start in range(0, len(values), 50_000):
        store.put(dict(list(values.items())[start : start + 50_000]))
    store.put({"one-commit": bytes(3 * LmdbStore.MAP_BYTES)})  # one commit larger than the map
    store.close()
    reopened = OsFileSystem().open_store(path)
    assert len(reopened.keys("txn/")) == len(values)
    assert reopened.get("txn/0299999") == values["txn/0299999"]
    assert reopened.get("one-commit") == bytes(3 * LmdbStore.MAP_BYTES)
    reopened.close()


_GROW_IN_ANOTHER_PROCESS = """
import sys
from oncelog.storage.fs import OsFileSystem
from oncelog.storage.lmdb_store import LmdbStore
store = OsFileSystem().open_store(sys.argv[1])
store.put({"grown": bytes(2 * LmdbStore.MAP_BYTES)})
store.close()
"""


def test_a_store_grown_by_another_process_is_read_and_written_at_the_new_size(tmp_path: Path) -> None:
    path = str(tmp_path / "meta.lmdb")
    store = OsFileSystem().open_store(path)
    store.put({"before": b"v"})
    subprocess.run([sys.executable, "-c", _GROW_IN_ANOTHER_PROCESS, path], check=True, timeout=60)
    assert store.get("grown") == bytes(2 * LmdbStore.MAP_BYTES)
    store.put({"after": b"w"})
    assert store.keys("") == ["after", "before", "grown"]
    store.close()


def test_opening_a_directory_as_a_file_says_so_by_name(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000000.log").mkdir()
    with pytest.raises(IsADirectoryError) as raised:
        OsFileSystem().open(str(tmp_path / "00000000000000000000.log"), writable=False)
    assert raised.value.filename == str(tmp_path / "00000000000000000000.log")


@pytest.mark.parametrize("seam", ["os", "fault"])
def test_items_reads_every_pair_under_a_prefix_in_key_order(tmp_path: Path, seam: str) -> None:
    from oncelog.torture.faultfs import FaultFileSystem

    fs = OsFileSystem() if seam == "os" else FaultFileSystem(1)
    root = str(tmp_path) if seam == "os" else "/root"
    fs.mkdir(root)
    path = os.path.join(root, "meta.lmdb")
    writer = fs.open_store(path)
    writer.put({"b/2": b"y", "a": b"", "b/1": b"x", "c": b"z"})
    writer.close()
    reader = fs.open_store(path, readonly=True)
    try:
        assert reader.items("b/") == [("b/1", b"x"), ("b/2", b"y")]
        assert reader.items("") == [("a", b""), ("b/1", b"x"), ("b/2", b"y"), ("c", b"z")]
        assert reader.items("d") == []
    finally:
        reader.close()


@pytest.mark.parametrize("readonly", [False, True])
def test_what_is_not_a_store_is_refused_by_name_and_a_link_to_one_opens(
    tmp_path: Path, readonly: bool
) -> None:
    fs = OsFileSystem()
    (tmp_path / "file.lmdb").write_bytes(b"x")
    for name in ("data.mdb", "lock.mdb"):
        (tmp_path / f"{name}.lmdb" / name).mkdir(parents=True)
    for bad, why in (
        ("file.lmdb", "a file where the metadata store's directory should be"),
        ("data.mdb.lmdb", "data.mdb is a directory"),
        ("lock.mdb.lmdb", "lock.mdb is a directory"),
    ):
        with pytest.raises(CorruptMetadataError, match=why):
            fs.open_store(str(tmp_path / bad), readonly=readonly)
    real = str(tmp_path / "real.lmdb")
    writer = fs.open_store(real)
    writer.put({"k": b"v"})
    writer.close()
    os.symlink(real, tmp_path / "link.lmdb")
    store = fs.open_store(str(tmp_path / "link.lmdb"), readonly=readonly)
    try:
        assert store.get("k") == b"v"
    finally:
        store.close()


def test_the_store_version_names_what_is_not_a_store_and_changes_with_each_commit(tmp_path: Path) -> None:
    fs = OsFileSystem()
    (tmp_path / "file.lmdb").write_bytes(b"x")
    for name in ("data.mdb", "lock.mdb"):
        (tmp_path / f"{name}.lmdb" / name).mkdir(parents=True)
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.lmdb")
    os.symlink(tmp_path / "loop.lmdb", tmp_path / "loop.lmdb")
    for bad, why in (
        ("file.lmdb", "a file where the metadata store's directory should be"),
        ("dangling.lmdb", "a file where the metadata store's directory should be"),
        ("loop.lmdb", "a file where the metadata store's directory should be"),
        ("data.mdb.lmdb", "data.mdb is a directory"),
        ("lock.mdb.lmdb", "lock.mdb is a directory"),
    ):
        with pytest.raises(CorruptMetadataError, match=why):
            fs.store_version(str(tmp_path / bad))
    assert fs.store_version(str(tmp_path / "missing.lmdb")) is None
    real = str(tmp_path / "real.lmdb")
    writer = fs.open_store(real)
    writer.put({"k": b"v"})
    writer.close()
    version = fs.store_version(real)
    assert version is not None and fs.store_version(real) == version
    writer = fs.open_store(real)
    writer.put({"k": b"w"})  # a commit: another version
    writer.close()
    assert fs.store_version(real) not in (None, version)


def test_a_listing_names_what_is_not_a_regular_file_without_a_stat_each(tmp_path: Path) -> None:
    (tmp_path / "b.log").write_bytes(b"x")
    (tmp_path / "a.log").symlink_to(tmp_path / "gone.log")  # dangling
    (tmp_path / "c.log").symlink_to(tmp_path / "b.log")  # a link to a file is still a link
    (tmp_path / "store").mkdir()
    listing = OsFileSystem().list_entries(str(tmp_path))
    assert listing.names == ["a.log", "b.log", "c.log", "store"]
    assert listing.irregular == {"a.log", "c.log", "store"}


def test_a_delegating_seams_listing_goes_through_its_own_listdir(tmp_path: Path) -> None:
    class Hiding(DelegatingFileSystem):
        def listdir(self, path: str) -> list[str]:
            return [name for name in super().listdir(path) if name != "hidden"]

    (tmp_path / "hidden").mkdir()
    (tmp_path / "seen").mkdir()
    listing = Hiding().list_entries(str(tmp_path))
    assert listing.names == ["seen"]
    assert listing.irregular == {"seen"}


def test_data_end_says_where_the_bytes_past_it_read_as_zeros_without_reading_them(tmp_path: Path) -> None:
    # Space allocated ahead of the data and never written reads as zeros, as a hole does.
    path = tmp_path / "f"
    handle = OsFileSystem().open(str(path), create=True)
    handle.pwritev([b"x" * 5000], 0)
    handle.allocate(4 * 1024 * 1024)
    data_end = handle.data_end(0)
    assert 5000 <= data_end <= 8192 < handle.size()  # the filesystem answers in blocks
    assert handle.data_end(1_000_000) == 1_000_000  # nothing but zeros past the start
    handle.pwritev([b"y"], 3 * 1024 * 1024)  # data again, far on
    assert 3 * 1024 * 1024 + 1 <= handle.data_end(0) < handle.size()
    # What it skips reads as zeros (and, read, is in the page cache: data from then on).
    assert handle.pread(1024 * 1024, data_end) == bytes(1024 * 1024)
    handle.close()


def test_data_end_of_a_file_without_holes_is_its_size(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(10_000))  # written zeros are data
    handle = OsFileSystem().open(str(path), writable=False)
    assert handle.data_end(0) == handle.data_end(4096) == 10_000
    assert handle.data_end(20_000) == 10_000  # a start past the end is the end
    handle.close()


def test_a_delegating_handle_forwards_data_end(tmp_path: Path) -> None:
    fs = DelegatingFileSystem(OsFileSystem())
    handle = fs.open(str(tmp_path / "f"), create=True)
    handle.pwritev([b"x"], 0)
    handle.allocate(1024 * 1024)
    assert handle.data_end(0) <= 4096
    handle.close()
