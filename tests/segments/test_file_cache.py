"""The bounded cache of sealed segments' descriptors (segments.file_cache).

A sealed segment's `.log` is opened when read and kept in a least-recently-used cache;
past its capacity the cache closes descriptors nobody is using, and the segment drops
its indexes with it. Descriptors in use are never closed under a reader.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from oncelog import Log, LogConfig, TooManyOpenFilesError, encode_batch
from oncelog.segments import file_cache
from oncelog.segments.file_cache import CachedFile, FileCache
from oncelog.storage.fs import DelegatingFileSystem, FileHandle, OsFileSystem

T0 = 1_700_000_000_000


def open_descriptors_under(directory: Path) -> list[str]:
    """This process's descriptors on files below `directory`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed already
        if target.startswith(str(directory)):
            found.append(target)
    return found


def segment_descriptors(directory: Path) -> list[str]:
    suffixes = (".log", ".index", ".timeindex", ".txnindex")
    return [path for path in open_descriptors_under(directory) if path.endswith(suffixes)]


def rolled_log(directory: Path, segments: int) -> Log:
    log = Log.open(directory, LogConfig(), clock=lambda: T0)
    for n in range(segments - 1):
        log.append(encode_batch([(b"k", b"value %d" % n)], timestamp_ms=T0 + n))
        log.roll()
    log.append(encode_batch([(b"k", b"value %d" % (segments - 1))], timestamp_ms=T0))
    return log


def values(log: Log) -> list[bytes]:
    out: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset, 1)
        out += [record.value or b"" for batch in fetched.batches for record in batch.records()]
        offset = fetched.next_offset
    return out


def test_a_reopened_log_holds_one_segment_descriptor_and_sealed_ones_none_until_read(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    rolled_log(directory, 6).close()
    with Log.open(directory) as log:
        assert len(log.segments) == 6
        assert segment_descriptors(directory) == [str(directory / "00000000000000000005.log")]
        assert values(log) == [b"value %d" % n for n in range(6)]


def test_an_active_segment_holds_only_its_log_file_open(tmp_path: Path) -> None:
    # Its indexes and its write mapping are mappings made without a descriptor of their own.
    directory = tmp_path / "t-0"
    with Log.open(directory, LogConfig(index_interval_bytes=0)) as log:
        for n in range(50):
            log.append(encode_batch([(b"k", b"v%d" % n)], timestamp_ms=T0 + n))
        assert log.active_segment.offset_index.entries > 0  # its index is mapped and written
        assert segment_descriptors(directory) == [str(directory / "00000000000000000000.log")]


def test_a_rolled_segment_leaves_the_cache_bounded_and_reads_reopen_what_it_closed(tmp_path: Path) -> None:
    cache = file_cache.SEGMENT_FILES
    capacity = cache.capacity
    cache.resize(3)
    try:
        directory = tmp_path / "t-0"
        with rolled_log(directory, 12) as log:
            assert len(segment_descriptors(directory)) <= 3 + 1  # the cache's and the active one
            opens_before = cache.opens
            assert values(log) == [b"value %d" % n for n in range(12)]
            assert cache.opens > opens_before  # evicted files were opened again to be read
            assert len(segment_descriptors(directory)) <= 3 + 1
    finally:
        cache.resize(capacity)
    assert segment_descriptors(tmp_path) == []


def test_evictions_from_another_thread_leave_truncations_and_closes_of_a_log_intact(tmp_path: Path) -> None:
    # An eviction closes a descriptor and nothing else: a log cutting into or closing its
    # sealed segments on one thread never sees them change under it from another.
    cache = file_cache.SEGMENT_FILES
    capacity = cache.capacity
    cache.resize(1)
    stop = threading.Event()
    errors: list[BaseException] = []
    try:
        others = [rolled_log(tmp_path / f"o-{n}", 6) for n in range(2)]

        def evict_by_reading() -> None:
            try:
                while not stop.is_set():
                    for log in others:
                        values(log)
            except BaseException as exc:
                errors.append(exc)

        reader = threading.Thread(target=evict_by_reading)
        reader.start()
        try:
            for round_ in range(15):
                directory = tmp_path / f"t-{round_}"
                log = rolled_log(directory, 8)
                values(log)  # every sealed segment opened, indexes mapped
                log.truncate_to(5)
                assert values(log) == [b"value %d" % n for n in range(5)]
                log.append(encode_batch([(b"k", b"again")], timestamp_ms=T0))
                log.close()
                with Log.open(directory) as reopened:
                    assert values(reopened) == [b"value %d" % n for n in range(5)] + [b"again"]
        finally:
            stop.set()
            reader.join()
        assert errors == []
        assert cache.evictions > 0
        for log in others:
            log.close()
    finally:
        cache.resize(capacity)


def test_a_descriptor_in_use_is_not_closed_by_an_eviction(tmp_path: Path) -> None:
    fs = OsFileSystem()
    cache = FileCache(1)
    paths = []
    for n in range(3):
        path = tmp_path / f"f{n}"
        path.write_bytes(bytes([n]) * 10)
        paths.append(str(path))
    files = [CachedFile(fs, path, cache=cache) for path in paths]
    held = cache.acquire(files[0])  # a read under way
    assert files[1].pread(10, 0) == bytes([1]) * 10  # past capacity: only files[1] may go
    assert files[0].is_open and not files[1].is_open
    assert held.pread(10, 0) == bytes([0]) * 10
    cache.release(files[0])
    assert files[2].pread(1, 0) == b"\x02"
    assert not files[0].is_open and cache.open_count == 1
    for file in files:
        file.close()
    assert cache.open_count == 0


def test_reads_from_many_threads_return_every_batch_while_the_cache_evicts(tmp_path: Path) -> None:
    cache = file_cache.SEGMENT_FILES
    capacity = cache.capacity
    cache.resize(2)
    errors: list[BaseException] = []
    try:
        logs = [rolled_log(tmp_path / f"t-{n}", 8) for n in range(3)]
        expected = [b"value %d" % n for n in range(8)]

        def reader(log: Log) -> None:
            try:
                for _ in range(20):
                    assert values(log) == expected
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=reader, args=(log,)) for log in logs for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert cache.evictions > 0
        for log in logs:
            log.close()
    finally:
        cache.resize(capacity)


class FileCacheMachine(RuleBasedStateMachine):
    """Any interleaving of reads, pinned uses, resizes and closes: the data read is the
    file's, a pinned descriptor stays open, and unpinned descriptors never exceed the bound."""

    FILES = 5

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.directory = tempfile.mkdtemp()
        self.fs = OsFileSystem()
        self.cache = FileCache(2)
        self.files: list[CachedFile] = []
        for n in range(self.FILES):
            path = os.path.join(self.directory, f"f{n}")
            with open(path, "wb") as out:
                out.write(bytes([n]) * 64)
            self.files.append(CachedFile(self.fs, path, cache=self.cache))
        self.pinned: list[int] = []

    @rule(n=st.integers(0, FILES - 1), offset=st.integers(0, 63))
    def read(self, n: int, offset: int) -> None:
        assert self.files[n].pread(4, offset) == bytes([n]) * min(4, 64 - offset)

    @rule(n=st.integers(0, FILES - 1))
    def pin(self, n: int) -> None:
        self.cache.acquire(self.files[n])
        self.pinned.append(n)

    @precondition(lambda self: bool(self.pinned))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        n = self.pinned.pop(data.draw(st.integers(0, len(self.pinned) - 1)))
        self.cache.release(self.files[n])

    @rule(capacity=st.integers(1, 4))
    def resize(self, capacity: int) -> None:
        self.cache.resize(capacity)

    @rule(n=st.integers(0, FILES - 1))
    def close(self, n: int) -> None:
        if n not in self.pinned:
            self.files[n].close()
            assert not self.files[n].is_open

    @invariant()
    def pinned_files_are_open_and_the_rest_within_the_bound(self) -> None:
        for n in self.pinned:
            assert self.files[n].is_open
        pinned = len(set(self.pinned))
        assert self.cache.open_count <= max(self.cache.capacity, pinned)

    def teardown(self) -> None:
        for n in self.pinned:
            self.cache.release(self.files[n])
        for file in self.files:
            file.close()


TestFileCacheMachine = FileCacheMachine.TestCase
TestFileCacheMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def mappings_under(directory: Path) -> list[str]:
    """This process's mappings of segment files below `directory` (each one of vm.max_map_count)."""
    with open("/proc/self/maps") as maps:
        paths = [line.split()[-1] for line in maps if str(directory) in line]
    return [path for path in paths if path.endswith((".log", ".index", ".timeindex"))]


def test_rolls_and_reads_of_every_segment_leave_a_few_mappings_not_one_per_segment(tmp_path: Path) -> None:
    # A sealed segment's indexes are mapped while an operation uses them; between operations
    # only the segment the last read ended in keeps its pair, besides the active segment's.
    directory = tmp_path / "t-0"
    with rolled_log(directory, 200) as log:
        after_rolls = mappings_under(directory)
        assert len(after_rolls) <= 3, after_rolls  # the active segment's indexes and write mapping
        assert values(log) == [b"value %d" % n for n in range(200)]
        assert log.offset_for_timestamp(T0 + 10**9) is None  # every time index searched
        log.apply_retention()
        assert len(mappings_under(directory)) <= 5, mappings_under(directory)
    assert mappings_under(directory) == []


class RefusingOpens(DelegatingFileSystem):
    """Every open of a file ending in `suffix` fails as at the open-files limit while `full` is set."""

    full = False

    def __init__(self, suffix: str):
        super().__init__()
        self.suffix = suffix

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        if self.full and path.endswith(self.suffix):
            raise OSError(errno.EMFILE, "Too many open files", path)
        return super().open(path, create=create, writable=writable)


@pytest.mark.parametrize("suffix", [".log", ".index"])
def test_a_read_at_the_open_files_limit_names_the_file_and_leaves_the_log_serving(
    tmp_path: Path, suffix: str
) -> None:
    fs = RefusingOpens(suffix)
    log = Log.open(tmp_path / "t-0", LogConfig(), fs=fs, clock=lambda: T0)
    log.append(encode_batch([(b"k", b"first")], timestamp_ms=T0))
    log.roll()
    log.append(encode_batch([(b"k", b"second")], timestamp_ms=T0))
    log.close()
    # Reopened, the sealed segment holds no descriptor: the read must open it.
    log = Log.open(tmp_path / "t-0", LogConfig(), fs=fs, clock=lambda: T0)
    fs.full = True
    with pytest.raises(TooManyOpenFilesError) as raised:
        log.read(0, 1 << 20)
    assert raised.value.errno == errno.EMFILE
    assert raised.value.filename == str(tmp_path / "t-0" / f"00000000000000000000{suffix}")
    assert isinstance(raised.value, OSError)  # callers that catch OSError still do
    log.append(encode_batch([(b"k", b"third")], timestamp_ms=T0))  # the log did not fail
    fs.full = False
    assert values(log) == [b"first", b"second", b"third"]
    log.close()
