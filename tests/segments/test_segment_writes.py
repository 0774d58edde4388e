"""Writes to the active segment through a mapping of pre-allocated space (brief §5).

While a log is open its active segment's file runs past the data into space
allocated ahead of it, which reads as zeros. Sealing and a clean close trim the
file to the data; a crash image keeps the zeros, and recovery reports them as the
zero tail, not as damage. A full disk while allocating fails the append cleanly.
"""

from __future__ import annotations

import errno
import shutil
import struct
from pathlib import Path

import pytest
from log_helpers import read_all

from oncelog import Log, LogConfig, encode_batch
from oncelog.errors import LogFailedError
from oncelog.segments import segment as segment_module
from oncelog.segments.files import FileHandle
from oncelog.storage.fs import DelegatingFileHandle, DelegatingFileSystem
from oncelog.torture.faultfs import FaultFileSystem

T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=256 * 1024, segment_index_bytes=4096)
D = "/data/topic-0"


def clock() -> int:
    return T0


def append_some(log: Log, count: int, tag: int = 0) -> list[tuple[int, bytes]]:
    """Append `count` plain batches; (base offset, bytes as stored) of each."""
    written: list[tuple[int, bytes]] = []
    for n in range(count):
        data = encode_batch([(b"k%d-%d" % (tag, n), bytes([n % 251 + 1]) * (20 + n))], timestamp_ms=T0 + n)
        result = log.append(data)
        written.append((result.first_offset, struct.pack(">q", result.first_offset) + data[8:]))
    return written


def segment_file(directory: Path, base: int) -> Path:
    return directory / f"{base:020d}.log"


def test_an_open_active_segment_file_is_preallocated_and_a_clean_close_trims_it(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    with Log.open(directory, CONFIG, clock=clock) as log:
        written = append_some(log, 20)
        data_size = log.active_segment.size
        path = segment_file(directory, log.active_segment.base_offset)
        on_disk = path.read_bytes()
        assert data_size < len(on_disk) <= CONFIG.segment_bytes
        assert on_disk[:data_size] == b"".join(data for _, data in written)
        assert on_disk[data_size:] == bytes(len(on_disk) - data_size)
    assert path.read_bytes() == on_disk[:data_size]

    with Log.open(directory, CONFIG, clock=clock) as log:
        assert log.recovery_report.clean
        append_some(log, 5, tag=1)
        sealed = log.active_segment
        assert segment_file(directory, sealed.base_offset).stat().st_size > sealed.size
        log.roll()
        assert log.active_segment is not sealed
        # Sealed while the log stays open: trimmed to its data at once.
        assert segment_file(directory, sealed.base_offset).stat().st_size == sealed.size
        assert segment_file(directory, log.active_segment.base_offset).stat().st_size == 0


def test_a_crash_image_reports_the_preallocated_zeros_as_zero_tail_not_damage(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    with Log.open(directory, CONFIG, clock=clock) as log:
        written = append_some(log, 30)
        log.flush()
        end, data_size = log.log_end_offset, log.active_segment.size
        base = log.active_segment.base_offset
        copy = tmp_path / "crashed"
        shutil.copytree(directory, copy)  # what a kill -9 leaves: no clean-shutdown marker
    file_size = segment_file(copy, base).stat().st_size
    assert file_size > data_size
    with Log.open(copy, CONFIG, clock=clock) as recovered:
        report = recovered.recovery_report
        assert not report.clean
        assert (report.truncated_bytes, report.tail_error) == (0, None)
        assert report.zero_tail_bytes == file_size - data_size
        assert recovered.log_end_offset == end
        assert read_all(recovered) == written
        assert segment_file(copy, base).stat().st_size == data_size


def test_a_large_batch_is_written_by_pwrite_into_space_allocated_ahead_not_past_the_file_end(
    tmp_path: Path,
) -> None:
    # A write into allocated blocks skips the filesystem's delayed allocation and the size
    # update that extending the file costs (about a fifth of a 16 KiB write's time).
    directory = tmp_path / "topic-0"
    batch = encode_batch([(b"k", b"v" * (2 * segment_module.WRITE_SYSCALL_MIN_BYTES))], timestamp_ms=T0)
    assert len(batch) >= segment_module.WRITE_SYSCALL_MIN_BYTES
    with Log.open(directory, CONFIG, clock=clock) as log:
        offsets = [log.append(batch).first_offset for _ in range(3)]
        data_size = log.active_segment.size
        path = segment_file(directory, log.active_segment.base_offset)
        stat = path.stat()
        assert data_size == 3 * len(batch) < stat.st_size
        assert stat.st_blocks * 512 >= stat.st_size  # allocated, not a sparse extension
        on_disk = path.read_bytes()
        assert on_disk[data_size:] == bytes(stat.st_size - data_size)
        stored = [struct.pack(">q", offset) + batch[8:] for offset in offsets]
        assert on_disk[:data_size] == b"".join(stored)
    assert path.stat().st_size == data_size


@pytest.mark.parametrize(
    "value_bytes", [20, 2 * segment_module.WRITE_SYSCALL_MIN_BYTES], ids=["mapped", "pwrite"]
)
def test_a_disk_full_while_growing_the_mapping_fails_the_append_and_leaves_the_log_unchanged(
    monkeypatch: pytest.MonkeyPatch, value_bytes: int
) -> None:
    # No room allocated ahead: every append has to allocate.
    monkeypatch.setattr(segment_module, "MIN_GROW_BYTES", 0)
    monkeypatch.setattr(segment_module, "MAX_GROW_BYTES", 0)
    fs = FaultFileSystem(7)
    log = Log.open(D, CONFIG, fs=fs, clock=clock)
    written = append_some(log, 10)
    end = log.log_end_offset
    fs.fail_next("allocate", errno.ENOSPC)
    with pytest.raises(LogFailedError):
        log.append(encode_batch([(b"k", b"v" * value_bytes)], timestamp_ms=T0))
    assert log.log_end_offset == end
    assert read_all(log) == written
    crashed = fs.crash("kill")  # a kill -9 right after the failed append
    with pytest.raises(LogFailedError, match="without a flush"):
        log.close()

    for twin in (fs, crashed):
        reopened = Log.open(D, CONFIG, fs=twin, clock=clock)
        assert reopened.log_end_offset == end, twin.describe()
        assert read_all(reopened) == written, twin.describe()
        assert reopened.recovery_report.truncated_bytes == 0, twin.describe()
        reopened.close()


class _FarthestLogRead(DelegatingFileSystem):
    """Records how far into any .log file a pread reached."""

    def __init__(self) -> None:
        super().__init__()
        self.farthest = 0

    def wrap(self, handle: FileHandle) -> FileHandle:
        return _Reads(handle, self) if handle.path.endswith(".log") else handle


class _Reads(DelegatingFileHandle):
    def __init__(self, inner: FileHandle, fs: _FarthestLogRead) -> None:
        super().__init__(inner)
        self._fs = fs

    def pread(self, size: int, offset: int) -> bytes:
        data = self.inner.pread(size, offset)
        self._fs.farthest = max(self._fs.farthest, offset + len(data))
        return data

    def pread_into(self, buffer: memoryview, offset: int) -> int:
        count = self.inner.pread_into(buffer, offset)
        self._fs.farthest = max(self._fs.farthest, offset + count)
        return count


def _copy_as_a_crash_leaves_it(source: Path, destination: Path) -> None:
    """A kill -9 leaves the reserved space allocated and unwritten: it reads as zeros and
    SEEK_DATA skips it. A plain copy would write those zeros; this one leaves holes."""
    destination.mkdir()
    for path in source.iterdir():
        if path.is_dir():
            shutil.copytree(path, destination / path.name)
            continue
        data = path.read_bytes()
        kept = data.rstrip(b"\0")
        with open(destination / path.name, "wb") as out:
            out.write(kept)
            out.truncate(len(data))


def test_recovery_reads_no_reserved_space_that_the_filesystem_says_is_unwritten(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    batch = encode_batch([(b"k", b"v" * (2 * segment_module.WRITE_SYSCALL_MIN_BYTES))], timestamp_ms=T0)
    with Log.open(directory, CONFIG, clock=clock) as log:
        for _ in range(4):
            log.append(batch)
        log.flush()
        end, data_size = log.log_end_offset, log.active_segment.size
        base = log.active_segment.base_offset
        crashed = tmp_path / "crashed"
        _copy_as_a_crash_leaves_it(directory, crashed)
    file_size = segment_file(crashed, base).stat().st_size
    assert file_size - data_size > 64 * 1024  # reserved well past the data
    reads = _FarthestLogRead()
    with Log.open(crashed, CONFIG, clock=clock, fs=reads) as recovered:
        report = recovered.recovery_report
        assert (report.clean, report.truncated_bytes, report.tail_error) == (False, 0, None)
        assert report.zero_tail_bytes == file_size - data_size
        assert recovered.log_end_offset == end
    # The data, and at most the rest of the filesystem block it ends in: none of the reserved zeros.
    assert data_size <= reads.farthest <= data_size + 4096, (reads.farthest, data_size, file_size)
