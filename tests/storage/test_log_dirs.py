"""Where a log directory's lock lives, and that every opener finds it there (log_dirs)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oncelog import LogConfig, LogDirectoryError, LogDirLockedError, encode_batch
from oncelog.log import Log
from oncelog.log_manager import LogManager, PartitionRecoveryError
from oncelog.storage.fs import DEFAULT_FS, DelegatingFileSystem, DirLock, LockTable
from oncelog.storage.log_dirs import LEGACY_LOCK_FILE, PARTITION_LOCKS_DIR, lock_log_dir
from oncelog.torture.faultfs import FaultFileSystem

CONFIG = LogConfig(segment_bytes=4096)


def open_manager(root: Path) -> LogManager:
    return LogManager.open(root, CONFIG, progress=False, lock_timeout_s=0.2)


def legacy_lock_is_free(directory: Path) -> bool:
    try:
        DEFAULT_FS.lock(str(directory / LEGACY_LOCK_FILE)).release()
    except BlockingIOError:
        return False
    return True


def test_a_log_outside_a_root_is_locked_by_its_own_lock_file(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", CONFIG):
        assert not legacy_lock_is_free(tmp_path / "log")
        with pytest.raises(LogDirLockedError):
            Log.open(tmp_path / "log", CONFIG)
    assert not (tmp_path / PARTITION_LOCKS_DIR).exists()  # nothing made beside the log
    assert legacy_lock_is_free(tmp_path / "log")


def test_a_managed_partition_is_locked_through_the_roots_table_and_marked(tmp_path: Path) -> None:
    with open_manager(tmp_path) as manager:
        manager.log("t", 0)
        assert (tmp_path / PARTITION_LOCKS_DIR).is_dir()
        assert (tmp_path / "t-0" / LEGACY_LOCK_FILE).is_dir()  # the mark
        with pytest.raises(LogDirLockedError, match="t-0"):
            Log.open(tmp_path / "t-0", CONFIG)  # a Spark task's open, in this very process
    # The manager closed: free.
    with Log.open(tmp_path / "t-0", CONFIG), pytest.raises(PartitionRecoveryError, match="t-0"):
        open_manager(tmp_path).close()


def test_a_release_that_knows_only_lock_files_fails_on_the_mark_by_name(tmp_path: Path) -> None:
    """An older opener takes `<dir>/.lock` with flock and nothing else."""
    open_manager(tmp_path).close()
    (tmp_path / "t-0").mkdir()
    (tmp_path / "t-0" / LEGACY_LOCK_FILE).write_bytes(b"")  # from before the table
    with open_manager(tmp_path) as manager:
        manager.log("t", 0)
        with pytest.raises(IsADirectoryError):
            DEFAULT_FS.lock(str(tmp_path / "t-0" / LEGACY_LOCK_FILE))


@pytest.mark.parametrize("alias", ["dot", "symlink", "trailing slash"])
def test_every_path_to_a_managed_partition_finds_it_locked(
    tmp_path: Path, alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    with open_manager(root) as manager:
        manager.log("t", 0)
        if alias == "dot":
            monkeypatch.chdir(root / "t-0")
            path = "."
        elif alias == "symlink":
            (tmp_path / "elsewhere").mkdir()
            os.symlink(root / "t-0", tmp_path / "elsewhere" / "t-0")
            path = str(tmp_path / "elsewhere" / "t-0")
        else:
            path = str(root / "t-0") + "/"
        with pytest.raises(LogDirLockedError):
            Log.open(path, CONFIG)
        assert open_in_another_process(Path(path).absolute()) == "locked"


def test_a_partition_symlinked_into_a_second_root_is_held_by_one_manager(tmp_path: Path) -> None:
    with open_manager(tmp_path / "a") as first:
        first.log("t", 0)
        (tmp_path / "b").mkdir()
        os.symlink(tmp_path / "a" / "t-0", tmp_path / "b" / "t-0")
        with pytest.raises(PartitionRecoveryError, match="t-0"):
            open_manager(tmp_path / "b").close()
    with open_manager(tmp_path / "b") as second:  # and the other way round
        assert list(second.logs()) == [("t", 0)]
        with pytest.raises(PartitionRecoveryError, match="t-0"):
            open_manager(tmp_path / "a").close()


FORK_AND_CLOSE = textwrap.dedent(
    """
    import os, sys
    from oncelog import LogManager
    manager = LogManager.open(sys.argv[1], progress=False)
    manager.log("t", 0)
    child = os.fork()
    if child == 0:
        manager.close()  # what a `with` block in the child does on its way out
        os._exit(0)
    os.waitpid(child, 0)
    print("forked", flush=True)
    sys.stdin.readline()
    manager.close()
    """
)


def test_a_forked_child_that_closes_the_manager_leaves_the_parents_partitions_locked(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", FORK_AND_CLOSE, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdin is not None and parent.stdout is not None
    try:
        assert parent.stdout.readline().strip() == "forked"
        assert open_in_another_process(tmp_path / "t-0") == "locked"
        parent.stdin.write("\n")
        parent.stdin.flush()
        assert parent.wait() == 0
        assert open_in_another_process(tmp_path / "t-0") == "opened"
    finally:
        parent.kill()
        parent.wait()


OPEN_AND_REPORT = textwrap.dedent(
    """
    import sys
    from oncelog import LogDirLockedError
    from oncelog.log import Log
    try:
        Log.open(sys.argv[1]).close()
    except LogDirLockedError:
        print("locked")
    else:
        print("opened")
    """
)


def open_in_another_process(directory: Path) -> str:
    child = subprocess.run(
        [sys.executable, "-c", OPEN_AND_REPORT, str(directory)], capture_output=True, text=True, check=True
    )
    return child.stdout.strip()


def test_another_process_cannot_open_a_partition_the_manager_holds(tmp_path: Path) -> None:
    with open_manager(tmp_path) as manager:
        manager.log("t", 0)
        assert open_in_another_process(tmp_path / "t-0") == "locked"
    assert open_in_another_process(tmp_path / "t-0") == "opened"


def test_a_holder_of_the_old_lock_file_excludes_openers_through_the_table(tmp_path: Path) -> None:
    open_manager(tmp_path).close()
    (tmp_path / "t-0").mkdir()
    old_holder = DEFAULT_FS.lock(str(tmp_path / "t-0" / LEGACY_LOCK_FILE))
    with pytest.raises(LogDirLockedError):
        Log.open(tmp_path / "t-0", CONFIG)
    with pytest.raises(PartitionRecoveryError, match="t-0"):
        open_manager(tmp_path).close()
    old_holder.release()
    with Log.open(tmp_path / "t-0", CONFIG):
        assert (tmp_path / "t-0" / LEGACY_LOCK_FILE).is_dir()  # marked once its holder left


class TableMadeWhileLocking(DelegatingFileSystem):
    """A manager makes its table (and locks the directory through it) just after an opener
    found no table and took the directory's `.lock`."""

    def __init__(self, root: Path, manager_locks: bool):
        super().__init__()
        self.root = root
        self.manager_locks = manager_locks
        self.manager_table: LockTable | None = None

    def lock(self, path: str) -> DirLock:
        held = super().lock(path)
        if self.manager_table is None:
            self.manager_table = DEFAULT_FS.lock_table(str(self.root / PARTITION_LOCKS_DIR))
            if self.manager_locks:
                self.manager_table.lock(os.path.dirname(path))
        return held


def test_an_opener_that_took_the_lock_file_as_a_table_appeared_moves_to_the_table(tmp_path: Path) -> None:
    (tmp_path / "t-0").mkdir()
    racing = TableMadeWhileLocking(tmp_path, manager_locks=True)
    with pytest.raises(LogDirLockedError):
        Log.open(tmp_path / "t-0", CONFIG, fs=racing)
    assert legacy_lock_is_free(tmp_path / "t-0")  # the lock file it took was given back, unmarked
    assert racing.manager_table is not None
    racing.manager_table.close()


def test_an_opener_moved_to_the_table_holds_the_directory_there(tmp_path: Path) -> None:
    (tmp_path / "t-0").mkdir()
    racing = TableMadeWhileLocking(tmp_path, manager_locks=False)
    with Log.open(tmp_path / "t-0", CONFIG, fs=racing):
        assert (tmp_path / "t-0" / LEGACY_LOCK_FILE).is_dir()
        table = DEFAULT_FS.lock_table(str(tmp_path / PARTITION_LOCKS_DIR))
        with pytest.raises(BlockingIOError):
            table.lock(str(tmp_path / "t-0"))
        table.close()
    assert racing.manager_table is not None
    racing.manager_table.close()


def test_the_fault_twin_keeps_directory_locks_as_the_os_does() -> None:
    fs = FaultFileSystem(1)
    fs.mkdir("/root/t-0")
    table = fs.lock_table("/root/" + PARTITION_LOCKS_DIR)
    held = lock_log_dir(fs, "/root/t-0", "busy")
    with pytest.raises(BlockingIOError):
        table.lock("/root/t-0")
    with pytest.raises(LogDirLockedError, match="busy"):
        lock_log_dir(fs, "/root/t-0", "busy")
    held.release()
    mine = table.lock("/root/t-0")
    with pytest.raises(FileNotFoundError):
        table.lock("/root/missing")
    table.close()  # closing releases what it holds
    with pytest.raises(ValueError, match="closed"):
        table.lock("/root/t-0")
    lock_log_dir(fs, "/root/t-0", "busy").release()
    mine.release()  # after the close: nothing, and nobody else's lock dropped
    assert fs.listdir("/root") == [PARTITION_LOCKS_DIR, "t-0"]
    assert fs.listdir("/root/t-0") == [LEGACY_LOCK_FILE]
    with pytest.raises(IsADirectoryError):
        fs.lock("/root/t-0/" + LEGACY_LOCK_FILE)  # the mark, as on the OS


def test_a_marked_partition_with_no_table_beside_it_is_refused_by_name(tmp_path: Path) -> None:
    """Through a bind mount, or copied out of its root: another opener may hold it through
    the real table, so nothing is guessed."""
    with open_manager(tmp_path / "root") as manager:
        manager.log("t", 0).append(encode_batch([(b"k", b"v")]))
    shutil.copytree(tmp_path / "root" / "t-0", tmp_path / "copy" / "t-0")
    with pytest.raises(LogDirectoryError, match="remove the empty directory") as raised:
        Log.open(tmp_path / "copy" / "t-0", CONFIG)
    assert raised.value.path == str(tmp_path / "copy" / "t-0" / LEGACY_LOCK_FILE)
    assert not (tmp_path / "copy" / PARTITION_LOCKS_DIR).exists()  # no table made beside it
    (tmp_path / "copy" / "t-0" / LEGACY_LOCK_FILE).rmdir()  # the operator's answer
    with Log.open(tmp_path / "copy" / "t-0", CONFIG) as log:
        assert log.log_end_offset == 1


def test_the_lock_file_a_mark_replaced_stays_locked_until_the_directory_is_let_go(tmp_path: Path) -> None:
    """An older opener that opened `.lock` just before it was replaced, and flocks it only
    now, must not get the lock of the deleted file while the manager holds the partition."""
    open_manager(tmp_path).close()
    (tmp_path / "t-0").mkdir()
    old_file = tmp_path / "t-0" / LEGACY_LOCK_FILE
    old_file.write_bytes(b"")
    late_opener = os.open(old_file, os.O_RDWR)  # opened before the replacement
    try:
        with open_manager(tmp_path):
            assert old_file.is_dir()
            with pytest.raises(BlockingIOError):
                fcntl.flock(late_opener, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(late_opener, fcntl.LOCK_EX | fcntl.LOCK_NB)  # after: only a deleted file's
    finally:
        os.close(late_opener)
