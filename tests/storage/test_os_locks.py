"""The OS lock table: one descriptor, a lock per directory, exclusive against every other holder."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oncelog.storage import os_locks
from oncelog.storage.os_locks import OsLockTable

pytestmark = pytest.mark.skipif(os_locks._OFD_SETLK is None, reason="no open-file-description locks here")


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_many_directories_lock_through_a_few_descriptors(tmp_path: Path) -> None:
    directories = [tmp_path / f"t-{n}" for n in range(300)]
    for directory in directories:
        directory.mkdir()
    before = descriptors()
    table = OsLockTable(str(tmp_path / "table"), every_shard=True)
    assert descriptors() == before + os_locks.SHARDS  # a fixed cost, opened up front
    locks = [table.lock(str(directory)) for directory in directories]
    assert descriptors() == before + os_locks.SHARDS
    for lock in locks:
        lock.release()
    table.close()
    assert descriptors() == before


def test_a_directory_is_locked_at_its_inode_in_its_inodes_shard(tmp_path: Path) -> None:
    """The layout every opener (another process, another release) must agree on."""
    (tmp_path / "d").mkdir()
    table = OsLockTable(str(tmp_path / "table"))
    table.lock(str(tmp_path / "d"))
    inode = os.stat(tmp_path / "d").st_ino
    shard = tmp_path / "table" / f"{inode % os_locks.SHARDS:02x}"
    assert sorted(os.listdir(tmp_path / "table")) == [shard.name]  # only the shard it needed
    fd = os.open(shard, os.O_RDWR)
    try:
        query = os_locks._FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        found = os_locks._FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query))
    finally:
        os.close(fd)
    lock_type, _, start, length, _ = found
    assert (lock_type, start, length) == (fcntl.F_WRLCK, inode, 1)
    table.close()


def test_a_second_table_in_this_process_finds_the_directory_locked(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    first, second = OsLockTable(str(tmp_path / "table")), OsLockTable(str(tmp_path / "table"))
    lock = first.lock(str(tmp_path / "d"))
    with pytest.raises(BlockingIOError):
        second.lock(str(tmp_path / "d"))
    lock.release()
    second.lock(str(tmp_path / "d")).release()
    first.close()
    second.close()


def test_the_same_table_refuses_a_directory_it_holds_itself(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    table = OsLockTable(str(tmp_path / "table"))
    lock = table.lock(str(tmp_path / "d"))
    with pytest.raises(BlockingIOError):
        table.lock(str(tmp_path / "d"))
    lock.release()
    lock.release()  # twice is once
    table.lock(str(tmp_path / "d")).release()
    table.close()


def test_closing_another_descriptor_of_the_table_file_keeps_the_locks(tmp_path: Path) -> None:
    """POSIX fcntl locks would go here: a process loses them when it closes any descriptor."""
    (tmp_path / "d").mkdir()
    path = str(tmp_path / "table")
    holder = OsLockTable(path)
    holder.lock(str(tmp_path / "d"))
    shard = os.path.join(path, f"{os.stat(tmp_path / 'd').st_ino % os_locks.SHARDS:02x}")
    os.close(os.open(shard, os.O_RDONLY))
    OsLockTable(path, every_shard=True).close()
    other = OsLockTable(path)
    with pytest.raises(BlockingIOError):
        other.lock(str(tmp_path / "d"))
    holder.close()  # closing the table releases what it held
    other.lock(str(tmp_path / "d")).release()
    other.close()


def test_directories_are_told_apart_by_inode_not_by_name(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "e").mkdir()
    os.symlink(tmp_path / "d", tmp_path / "link")
    first, second = OsLockTable(str(tmp_path / "table")), OsLockTable(str(tmp_path / "table"))
    first.lock(str(tmp_path / "d"))
    second.lock(str(tmp_path / "e")).release()
    with pytest.raises(BlockingIOError):
        second.lock(str(tmp_path / "link"))  # the same directory by another name
    first.close()
    second.close()


def test_a_missing_directory_or_a_file_is_not_locked(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    table = OsLockTable(str(tmp_path / "table"))
    with pytest.raises(FileNotFoundError):
        table.lock(str(tmp_path / "missing"))
    with pytest.raises(NotADirectoryError):
        table.lock(str(tmp_path / "file"))
    table.close()
    with pytest.raises(ValueError, match="closed"):
        table.lock(str(tmp_path))


def test_a_directory_replaced_between_the_stat_and_the_lock_is_locked_as_it_is_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "d").mkdir()
    real = os_locks._directory_id
    seen: list[int] = []

    def replaced_once(path: str) -> tuple[int, int]:
        device, inode = real(path)
        if not seen:  # the first stat saw the directory before it was deleted and made anew
            inode += 1
        seen.append(inode)
        return device, inode

    monkeypatch.setattr(os_locks, "_directory_id", replaced_once)
    table = OsLockTable(str(tmp_path / "table"))
    table.lock(str(tmp_path / "d"))
    monkeypatch.undo()
    assert len(seen) == 4  # stat, lock, stat (moved), then stat, lock, stat (the same)
    other = OsLockTable(str(tmp_path / "table"))
    with pytest.raises(BlockingIOError):
        other.lock(str(tmp_path / "d"))  # the lock is on the directory that is there
    assert table._held == {real(str(tmp_path / "d"))[1] % os_locks._MAX_OFFSET}
    table.close()
    other.close()


HOLDER = textwrap.dedent(
    """
    import sys, time
    from oncelog.storage.os_locks import OsLockTable
    table = OsLockTable(sys.argv[1])
    table.lock(sys.argv[2])
    print("held", flush=True)
    time.sleep(600)
    """
)


def test_another_process_excludes_this_one_until_it_dies(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    table_path, directory = str(tmp_path / "table"), str(tmp_path / "d")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, table_path, directory], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        table = OsLockTable(table_path)
        with pytest.raises(BlockingIOError):
            table.lock(directory)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        table.lock(directory).release()  # the kernel dropped the dead process's lock
        table.close()
    finally:
        holder.kill()
        holder.wait()


def test_a_directory_on_another_filesystem_is_locked_by_its_own_descriptor(tmp_path: Path) -> None:
    """Inode numbers repeat across filesystems (every btrfs subvolume's root is 256)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's directory")
    (tmp_path / "d").mkdir()
    table_path = shm / f"oncelog-test-table-{os.getpid()}"
    try:
        first, second = OsLockTable(str(table_path)), OsLockTable(str(table_path))
        before = descriptors()
        lock = first.lock(str(tmp_path / "d"))
        assert descriptors() == before + 1  # flock on the directory itself
        with pytest.raises(BlockingIOError):
            second.lock(str(tmp_path / "d"))
        lock.release()
        assert descriptors() == before
        second.lock(str(tmp_path / "d")).release()
        first.close()
        second.close()
    finally:
        shutil.rmtree(table_path)


def test_a_table_inherited_through_fork_leaves_the_parents_locks_alone(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    table = OsLockTable(str(tmp_path / "table"))
    lock = table.lock(str(tmp_path / "d"))
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit status is the result
        try:
            lock.release()
            table.close()
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    other = OsLockTable(str(tmp_path / "table"))
    with pytest.raises(BlockingIOError):
        other.lock(str(tmp_path / "d"))  # still the parent's
    table.close()
    other.lock(str(tmp_path / "d")).release()
    other.close()
