"""A log's metadata store, opened for writing by its first commit (recovery.partition_store).

An idle log (opened, read, not written) holds no metadata store open: its values were
read once, read-only, and kept in memory. A commit opens the writable store and keeps
it while it commits often (at most STORE_WRITERS.capacity in the process); a failed
commit changes neither the store nor the memory copy.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from oncelog import Log, encode_batch
from oncelog.errors import CorruptMetadataError, LogFailedError
from oncelog.log import METADATA_DIR
from oncelog.storage.checkpoint import LOG_START_KEY, RECOVERY_POINT_KEY, read_offset, write_offsets
from oncelog.storage.fs import DEFAULT_FS, DelegatingFileSystem, MetadataStore
from oncelog.storage.partition_store import STORE_WRITERS, PartitionStore, StoreWriters

T0 = 1_700_000_000_000


def open_paths() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # the listing's own descriptor
    return found


def store_descriptors_under(root: Path) -> list[str]:
    """Descriptors on LMDB files below `root`."""
    return [path for path in open_paths() if path.startswith(str(root)) and path.endswith(".mdb")]


def store_descriptors(directory: Path) -> list[str]:
    return [path for path in open_paths() if path.startswith(str(directory / METADATA_DIR))]


def written_log(directory: Path, batches: int) -> None:
    with Log.open(directory) as log:
        for n in range(batches):
            log.append(encode_batch([(b"k", b"v%d" % n)], timestamp_ms=T0))
            if n % 3 == 2:
                log.roll()


def test_a_reopened_log_that_is_only_read_holds_no_store_open(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    written_log(directory, 10)
    with Log.open(directory) as log:
        assert log.read(0, 1 << 20).batches
        assert store_descriptors(directory) == []
        assert log.recovery_point == 10  # the values were read all the same


def test_the_first_commit_opens_the_store_and_a_reopen_reads_what_it_wrote(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    written_log(directory, 4)
    with Log.open(directory) as log:
        assert store_descriptors(directory) == []
        log.append(encode_batch([(b"k", b"late")], timestamp_ms=T0))
        log.flush()
        assert log.checkpoint()  # commits the recovery point
        assert store_descriptors(directory) != []
        log.delete_records(2)
    assert store_descriptors(directory) == []
    with Log.open(directory) as log:
        assert log.log_start_offset == 2
        assert log.recovery_point == 5


def test_a_new_log_creates_its_store_with_its_first_commit(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    with Log.open(directory):
        assert (directory / METADATA_DIR).is_dir()  # the new log's client-only flag is committed
    store = PartitionStore(DEFAULT_FS, str(directory / METADATA_DIR))
    assert store.keys("") != [] and not store.is_open_for_writing


class _FailingStore:
    """A store whose commits fail (ENOSPC unless told otherwise) while `failing` is set."""

    def __init__(self, inner: MetadataStore, failing: list[bool], error: Callable[[str], Exception]):
        self._inner = inner
        self._failing = failing
        self._error = error

    @property
    def path(self) -> str:
        return self._inner.path

    def _check(self) -> None:
        if self._failing[0]:
            raise self._error(self.path)

    def get(self, key: str) -> bytes | None:
        return self._inner.get(key)

    def keys(self, prefix: str) -> list[str]:
        return self._inner.keys(prefix)

    def items(self, prefix: str) -> list[tuple[str, bytes]]:
        return self._inner.items(prefix)

    def generation(self) -> int:
        return self._inner.generation()

    def put(self, values: Mapping[str, bytes]) -> None:
        self._check()
        self._inner.put(values)

    def delete(self, keys: Sequence[str]) -> None:
        self._check()
        self._inner.delete(keys)

    def update(self, key: str, change: Callable[[bytes | None], bytes | None]) -> bytes | None:
        self._check()
        return self._inner.update(key, change)

    def close(self) -> None:
        self._inner.close()


def _full_disk(path: str) -> Exception:
    return OSError(errno.ENOSPC, "no space left on device", path)


class _FullDiskStores(DelegatingFileSystem):
    def __init__(self, error: Callable[[str], Exception] = _full_disk) -> None:
        super().__init__()
        self.failing = [False]
        self._error = error

    def open_store(self, path: str, *, readonly: bool = False) -> MetadataStore:
        return _FailingStore(super().open_store(path, readonly=readonly), self.failing, self._error)


def test_a_failed_commit_changes_neither_the_store_nor_the_values_read(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    written_log(directory, 4)
    fs = _FullDiskStores()
    store = PartitionStore(fs, str(directory / METADATA_DIR))
    before = read_offset(store, LOG_START_KEY)
    fs.failing[0] = True
    with pytest.raises(OSError):
        write_offsets(store, {LOG_START_KEY: 99})
    assert read_offset(store, LOG_START_KEY) == before
    fs.failing[0] = False
    store.close()
    assert read_offset(PartitionStore(DEFAULT_FS, str(directory / METADATA_DIR)), LOG_START_KEY) == before


def test_a_log_whose_commit_fails_is_failed_closed_and_reopens_at_what_was_committed(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    written_log(directory, 4)
    fs = _FullDiskStores()
    log = Log.open(directory, fs=fs)
    log.append(encode_batch([(b"k", b"late")], timestamp_ms=T0))
    log.flush()
    fs.failing[0] = True
    with pytest.raises(LogFailedError):
        log.checkpoint()  # the recovery point's commit
    with pytest.raises(LogFailedError, match="the next open recovers it"):
        log.close()
    # The commit that failed left the store at the recovery point before it.
    assert read_offset(PartitionStore(DEFAULT_FS, str(directory / METADATA_DIR)), RECOVERY_POINT_KEY) == 4
    with Log.open(directory) as log:
        assert not log.recovery_report.clean
        assert log.log_end_offset == 5
        assert [b.base_offset for b in log.read(0, 1 << 20).batches][:1] == [0]


def test_a_store_damaged_where_only_a_commit_looks_fails_the_log_closed_and_a_roll_leaks_nothing(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    written_log(directory, 4)
    fs = _FullDiskStores(lambda path: CorruptMetadataError("MDB_CORRUPTED at a commit", path=path))
    log = Log.open(directory, fs=fs)
    log.append(encode_batch([(b"k", b"late")], timestamp_ms=T0))
    fs.failing[0] = True
    with pytest.raises(LogFailedError, match="MDB_CORRUPTED"):
        log.roll()
    new_segment = str(directory / "00000000000000000005")
    assert not [path for path in open_paths() if path.startswith(new_segment)]  # the half-done roll's
    with pytest.raises(LogFailedError, match="refuses appends"):
        log.append(encode_batch([(b"k", b"after")], timestamp_ms=T0))
    with pytest.raises(LogFailedError):
        log.close()
    fs.failing[0] = False
    with Log.open(directory) as reopened:
        assert reopened.log_end_offset == 5


def test_a_store_removed_while_the_log_is_idle_is_written_back_whole_at_the_next_commit(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    written_log(directory, 10)
    with Log.open(directory) as log:
        log.delete_records(4)
    with Log.open(directory) as log:
        shutil.rmtree(directory / METADATA_DIR)  # while the log is idle: nothing of it is open
        log.append(encode_batch([(b"k", b"late")], timestamp_ms=T0))
        log.flush()
    with Log.open(directory) as log:
        assert log.log_start_offset == 4  # not the lone recovery point of a fresh store
        assert log.read(4, 1 << 20).batches[0].base_offset == 4


def test_a_read_only_look_at_the_store_in_the_same_process_does_not_fail_the_first_commit(
    tmp_path: Path,
) -> None:
    # LMDB refuses two opens of one store in a process; the log's first commit waits its turn.
    directory = tmp_path / "t-0"
    written_log(directory, 4)
    with Log.open(directory) as log:
        log.append(encode_batch([(b"k", b"late")], timestamp_ms=T0))
        look = DEFAULT_FS.open_store(str(directory / METADATA_DIR), readonly=True)
        closer = threading.Timer(0.2, look.close)
        closer.start()
        log.flush()
        log.checkpoint()  # opens the store for writing once the look is over
        closer.join()
        assert log.recovery_point == 5


@pytest.fixture
def two_writers() -> Iterator[StoreWriters]:
    capacity = STORE_WRITERS.capacity
    STORE_WRITERS.resize(2)
    try:
        yield STORE_WRITERS
    finally:
        STORE_WRITERS.resize(capacity)


def test_past_the_writer_limit_the_least_recently_committed_stores_close_and_reopen(
    tmp_path: Path, two_writers: StoreWriters
) -> None:
    stores = [PartitionStore(DEFAULT_FS, str(tmp_path / f"s{n}")) for n in range(5)]
    closes = two_writers.closes
    for round_ in range(3):
        for n, store in enumerate(stores):
            store.put({"k": b"%d-%d" % (n, round_)})
    assert [store.is_open_for_writing for store in stores] == [False, False, False, True, True]
    assert two_writers.closes - closes >= 13  # every commit but the first two made room
    assert len(store_descriptors_under(tmp_path)) == 2 * 3  # two LMDB environments
    for n, store in enumerate(stores):  # memory and disk agree, closed or not
        assert store.get("k") == b"%d-2" % n
        store.close()
        reader = DEFAULT_FS.open_store(str(tmp_path / f"s{n}"), readonly=True)
        assert reader.get("k") == b"%d-2" % n
        reader.close()
    assert store_descriptors_under(tmp_path) == []


def test_a_store_busy_committing_is_not_closed_under_its_commit(
    tmp_path: Path, two_writers: StoreWriters
) -> None:
    busy = PartitionStore(DEFAULT_FS, str(tmp_path / "busy"))
    busy.put({"k": b"0"})
    with busy._writer_guard:  # as during its next commit
        for n in range(3):
            PartitionStore(DEFAULT_FS, str(tmp_path / f"s{n}")).put({"k": b"x"})
        assert busy.is_open_for_writing  # skipped, not closed
    busy.put({"k": b"1"})  # listed again by its commit
    assert busy.get("k") == b"1"
    busy.close()


def test_idle_partitions_that_once_committed_hold_only_their_active_segment(
    tmp_path: Path, two_writers: StoreWriters
) -> None:
    logs = []
    for n in range(20):
        log = Log.open(tmp_path / f"t-{n}")
        log.append(encode_batch([(b"k", b"v")], timestamp_ms=T0))
        log.roll()  # commits a recovery point: the store opens for writing
        logs.append(log)
    writers = [log for log in logs if log._store.is_open_for_writing]  # type: ignore[attr-defined]
    assert len(writers) == 2
    assert len(store_descriptors_under(tmp_path)) == 2 * 3
    for log in logs:
        log.close()
    for n in range(20):
        with Log.open(tmp_path / f"t-{n}") as reopened:
            assert reopened.log_end_offset == 1


class ForeignLock:
    """A lock of another world (the torture harness's scheduler): no other thread may touch it."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        raise AssertionError("a store's commit lock was taken by another log's eviction")

    def release(self) -> None:
        raise AssertionError("released by another log's eviction")


def test_an_eviction_never_takes_the_evicted_stores_commit_lock(
    tmp_path: Path, two_writers: StoreWriters
) -> None:
    other_world = PartitionStore(DEFAULT_FS, str(tmp_path / "sim"))
    other_world.put({"k": b"0"})
    other_world._lock = ForeignLock()  # type: ignore[assignment]
    for n in range(3):
        PartitionStore(DEFAULT_FS, str(tmp_path / f"s{n}")).put({"k": b"x"})
    assert not other_world.is_open_for_writing  # closed, through the writer's own guard only
