"""The OS implementation of the filesystem seam."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from oncelog.recovery.fs import OsFileSystem


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
