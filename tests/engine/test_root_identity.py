"""root_identity: a root's id is made once, durably, read-only thereafter, and checked by tasks."""

from __future__ import annotations

import errno
import multiprocessing
import socket
from pathlib import Path

import pytest

from oncelog import LogConfig, LogManager
from oncelog.errors import CorruptMetadataError, LogDirectoryError
from oncelog.root_identity import (
    ROOT_ID_FILE,
    RootIdentityError,
    check_root_identity,
    ensure_root_id,
    read_root_id,
)
from oncelog.storage.fs import DEFAULT_FS, ReadOnlyFileSystem
from oncelog.torture.faultfs import FaultFileSystem, SimulatedCrash


def test_a_root_without_an_id_reads_as_none_and_gets_one_once(tmp_path: Path) -> None:
    assert read_root_id(DEFAULT_FS, str(tmp_path)) is None
    first = ensure_root_id(DEFAULT_FS, str(tmp_path))
    assert len(first) == 32 and ensure_root_id(DEFAULT_FS, str(tmp_path)) == first
    assert read_root_id(ReadOnlyFileSystem(DEFAULT_FS), str(tmp_path)) == first
    assert (tmp_path / ROOT_ID_FILE).read_text() == f"oncelog-root {first}\n"


def test_a_log_manager_gives_its_root_an_id_that_outlives_it(tmp_path: Path) -> None:
    with LogManager.open(tmp_path, LogConfig(), progress=False):
        made = read_root_id(DEFAULT_FS, str(tmp_path))
    assert made is not None
    with LogManager.open(tmp_path, LogConfig(), progress=False):
        assert read_root_id(DEFAULT_FS, str(tmp_path)) == made


def _ensure(root: str) -> str:
    return ensure_root_id(DEFAULT_FS, root)


def test_first_writers_racing_in_several_processes_agree_on_one_id(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        ids = pool.map(_ensure, [str(tmp_path)] * 8)
    assert len(set(ids)) == 1 and read_root_id(DEFAULT_FS, str(tmp_path)) == ids[0]


def _fresh_root() -> FaultFileSystem:
    fs = FaultFileSystem(seed=3)
    fs.mkdir("/r")
    fs.fsync_dir("/")
    return fs


@pytest.mark.parametrize("mode", ["drop", "torn", "dirent"])
def test_the_id_survives_power_loss_once_ensure_returns(mode: str) -> None:
    fs = _fresh_root()
    made = ensure_root_id(fs, "/r")
    for _ in range(20):
        assert read_root_id(fs.crash(mode), "/r") == made  # type: ignore[arg-type]


def test_a_crash_at_any_point_of_the_first_write_leaves_no_id_or_the_whole_one() -> None:
    calls = _fresh_root()
    start = calls.io_calls
    ensure_root_id(calls, "/r")
    for kill_at in range(start + 1, calls.io_calls + 1):
        fs = _fresh_root()
        fs.kill_at(kill_at)
        with pytest.raises(SimulatedCrash):
            ensure_root_id(fs, "/r")
        for mode in ("kill", "drop", "torn", "dirent"):
            after = fs.crash(mode)  # type: ignore[arg-type]
            found = read_root_id(after, "/r")  # never CorruptMetadataError: tmp file, then rename
            assert found is None or ensure_root_id(after, "/r") == found


@pytest.mark.parametrize("content", [b"", b"oncelog-root xyz\n", b"garbage" * 100])
def test_a_damaged_id_file_is_named_not_replaced(tmp_path: Path, content: bytes) -> None:
    (tmp_path / ROOT_ID_FILE).write_bytes(content)
    with pytest.raises(CorruptMetadataError, match=ROOT_ID_FILE):
        ensure_root_id(DEFAULT_FS, str(tmp_path))
    assert (tmp_path / ROOT_ID_FILE).read_bytes() == content


def test_a_missing_root_or_a_file_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(LogDirectoryError, match="no such directory") as missing:
        read_root_id(DEFAULT_FS, str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(LogDirectoryError, match="is a file") as a_file:
        read_root_id(DEFAULT_FS, str(tmp_path / "file"))
    for exc in (missing.value, a_file.value):
        assert "\n" not in str(exc) and str(tmp_path) in str(exc)


def test_a_task_refuses_another_root_at_the_same_path_naming_both_hosts(tmp_path: Path) -> None:
    driver_root, executor_root = tmp_path / "driver", tmp_path / "executor"
    driver_root.mkdir()
    executor_root.mkdir()
    planned = ensure_root_id(DEFAULT_FS, str(driver_root))
    check_root_identity(DEFAULT_FS, str(driver_root), planned, "driver-host")  # the same root: fine
    here = socket.gethostname()
    with pytest.raises(RootIdentityError, match="without an id") as no_id:
        check_root_identity(DEFAULT_FS, str(executor_root), planned, "driver-host")
    other = ensure_root_id(DEFAULT_FS, str(executor_root))
    with pytest.raises(RootIdentityError, match=f"the root {other}") as different:
        check_root_identity(DEFAULT_FS, str(executor_root), planned, "driver-host")
    with pytest.raises(RootIdentityError, match="no such directory") as missing:
        check_root_identity(DEFAULT_FS, str(tmp_path / "gone"), planned, "driver-host")
    for exc in (no_id.value, different.value, missing.value):
        assert "driver-host" in str(exc) and here in str(exc) and "same path" in str(exc)
    assert not (tmp_path / "gone").exists()  # checking never creates


def test_a_root_planned_without_an_id_only_has_to_exist(tmp_path: Path) -> None:
    check_root_identity(DEFAULT_FS, str(tmp_path), None, "driver-host")
    with pytest.raises(RootIdentityError, match="no such directory"):
        check_root_identity(DEFAULT_FS, str(tmp_path / "gone"), None, "driver-host")


@pytest.mark.parametrize("op", ["write", "fsync", "rename"])
def test_a_full_disk_or_failed_fsync_leaves_no_id_and_a_retry_makes_one(op: str) -> None:
    fs = _fresh_root()
    fs.fail_next(op, errno.ENOSPC if op == "write" else errno.EIO)
    with pytest.raises(OSError):
        ensure_root_id(fs, "/r")
    assert read_root_id(fs, "/r") is None  # never a half-written id
    made = ensure_root_id(fs, "/r")  # the lock was let go: the next writer is not stuck
    assert read_root_id(fs, "/r") == made
