"""LogSegment.read: whole batches from the one holding the start offset, at least one,
none past max_bytes after the first, none reaching max_offset; and what it reads of the
file to answer (a fetch holds every byte read until the client has it)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments.batch import encode_batch
from oncelog.segments.files import FileHandle
from oncelog.segments.format import HEADER_SIZE
from oncelog.segments.segment import LogSegment
from oncelog.storage.fs import DelegatingFileHandle, DelegatingFileSystem

T0 = 1_700_000_000_000
INDEX_INTERVAL_BYTES = 4096


class PreadCountingFileSystem(DelegatingFileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.read_bytes = 0

    def wrap(self, handle: FileHandle) -> FileHandle:
        return _Counting(handle, self)


class _Counting(DelegatingFileHandle):
    def __init__(self, inner: FileHandle, fs: PreadCountingFileSystem) -> None:
        super().__init__(inner)
        self._fs = fs

    def pread(self, size: int, offset: int) -> bytes:
        data = self.inner.pread(size, offset)
        self._fs.read_bytes += len(data)
        return data


def sealed_segment(directory: Path, value_sizes: list[int], fs: DelegatingFileSystem | None = None) -> Log:
    config = LogConfig(segment_bytes=64 << 20, index_interval_bytes=INDEX_INTERVAL_BYTES)
    log = Log.open(directory, config, fs=fs)
    for size in value_sizes:
        log.append(encode_batch([(None, b"v" * size)], timestamp_ms=T0))
    log.roll()  # the batches in a sealed segment, read through the seam
    assert len(log.segments) == 2
    return log


def expected(
    segment: LogSegment, start: int, max_bytes: int, max_offset: int | None
) -> list[tuple[int, int]]:
    """(position, size) of what read() must return, from a walk of every batch."""
    out: list[tuple[int, int]] = []
    taken = 0
    for scanned in segment.scan():
        header = scanned.batch.header
        last = header.base_offset + header.last_offset_delta
        size = scanned.batch.size
        if last < start:
            continue
        if max_offset is not None and last >= max_offset:
            break
        if out and taken + size > max_bytes:
            break
        out.append((scanned.position, size))
        taken += size
        if taken >= max_bytes:
            break
    return out


@settings(max_examples=60, deadline=None)
@given(
    value_sizes=st.lists(st.integers(0, 20_000), min_size=1, max_size=40),
    start_fraction=st.floats(0, 1),
    max_bytes=st.integers(1, 200_000),
    stop_fraction=st.none() | st.floats(0, 1.2),
)
def test_a_read_returns_what_a_walk_of_every_batch_says(
    tmp_path_factory: object,
    value_sizes: list[int],
    start_fraction: float,
    max_bytes: int,
    stop_fraction: float | None,
) -> None:
    directory = tmp_path_factory.mktemp("t-0")  # type: ignore[attr-defined]
    with sealed_segment(directory, value_sizes) as log:
        segment = log.segments[0]
        start = int(start_fraction * (len(value_sizes) - 1))
        max_offset = None if stop_fraction is None else int(stop_fraction * len(value_sizes))
        got = [
            (scanned.position, scanned.batch.size) for scanned in segment.read(start, max_bytes, max_offset)
        ]
        assert got == expected(segment, start, max_bytes, max_offset)


def test_a_read_stopped_by_max_bytes_reads_no_more_than_still_fits_past_its_first_chunk(
    tmp_path: Path,
) -> None:
    # Before: a second chunk of max_bytes was read to look at the batch after the limit,
    # then dropped (a fetch of four 1 MiB partitions read and held 8 MiB).
    fs = PreadCountingFileSystem()
    max_bytes = 1 << 20
    first_chunk = INDEX_INTERVAL_BYTES + max_bytes + HEADER_SIZE
    # 100 kB batches: the 11th straddles the first chunk's end, and does not fit.
    with sealed_segment(tmp_path / "t-0", [100_000] * 30, fs) as log:
        segment = log.segments[0]
        segment.read(0, max_bytes)  # (the first read of a sealed segment checks its indexes)
        before = fs.read_bytes
        taken = sum(scanned.batch.size for scanned in segment.read(0, max_bytes))
        assert 0 < taken <= max_bytes
        assert first_chunk < fs.read_bytes - before <= first_chunk + (max_bytes - taken) + HEADER_SIZE


def test_a_first_batch_larger_than_max_bytes_is_read_whole(tmp_path: Path) -> None:
    with sealed_segment(tmp_path / "t-0", [300_000, 10, 10]) as log:
        batches = log.segments[0].read(0, 1000)
        assert [scanned.batch.header.base_offset for scanned in batches] == [0]
        assert batches[0].batch.size > 300_000
