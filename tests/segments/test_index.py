"""Offset and time indexes in a 10k-batch log (issue 2, "Rolling and indexes"; brief §3).

Every lookup is checked against an answer computed here by brute force from what
was appended, and the index files are decoded with struct, independently of the
engine's numpy views.
"""

from __future__ import annotations

import errno
import itertools
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments.batch import encode_batch
from oncelog.segments.index import INDEX_MIN_GROW_BYTES, IndexFullError, OffsetIndex, OffsetPosition
from oncelog.segments.records import Record
from oncelog.torture.faultfs import FaultFileSystem

INDEX_INTERVAL = 512
OFFSET_ENTRY = struct.Struct(">ii")  # relative last offset, file position
TIME_ENTRY = struct.Struct(">qi")  # max timestamp so far, relative offset
T0 = 1_600_000_000_000


@dataclass
class Written:
    """What was appended, kept independently of the log."""

    batch_bases: np.ndarray  # base offset of the batch holding each offset
    offsets: np.ndarray  # every record offset, in order
    timestamps: np.ndarray  # the timestamp of each record, same order
    end: int


def _config(segment_bytes: int) -> LogConfig:
    return LogConfig(
        index_interval_bytes=INDEX_INTERVAL,
        segment_bytes=segment_bytes,
        segment_index_bytes=64 * 1024,
        segment_ms=2**62,  # only size rolls here
    )


def _build(
    directory: Path,
    config: LogConfig,
    stamps: Iterator[int],
    batches: int,
    seed: int,
) -> Written:
    rng = random.Random(seed)
    bases: list[int] = []
    timestamps: list[int] = []
    with Log.open(directory, config) as log:
        for n in range(batches):
            count = rng.randint(1, 5)
            records = [
                Record(0, next(stamps), f"k{n}.{i}".encode(), rng.randbytes(rng.randint(0, 300)))
                for i in range(count)
            ]
            result = log.append(encode_batch(records, base_offset=rng.randint(0, 2**40)))
            assert result.last_offset - result.first_offset == count - 1
            bases.extend([result.first_offset] * count)
            timestamps.extend(r.timestamp_ms for r in records)
        end = log.log_end_offset
        assert len(log.segments) >= 4, "the log must span several segments"
        # The live log (in-memory indexes, unsealed active segment) finds batches too.
        for offset in range(0, end, 13):
            batch = log.read(offset, 1).batches[0]
            assert batch.base_offset == bases[offset], offset
    return Written(
        batch_bases=np.array(bases, dtype=np.int64),
        offsets=np.arange(len(bases), dtype=np.int64),
        timestamps=np.array(timestamps, dtype=np.int64),
        end=end,
    )


def _monotonic_stamps(seed: int) -> Iterator[int]:
    """Non-decreasing, with many repeats, small steps and occasional big jumps."""
    rng = random.Random(seed)
    ts = T0
    while True:
        yield ts
        roll = rng.random()
        if roll < 0.5:
            continue
        ts += rng.randint(1, 20) if roll < 0.95 else rng.randint(1_000, 10_000_000)


def _random_stamps(seed: int) -> Iterator[int]:
    rng = random.Random(seed)
    while True:
        yield T0 + rng.randint(0, 50_000)


@pytest.fixture(scope="module")
def monotonic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Written]:
    directory = tmp_path_factory.mktemp("index") / "monotonic-0"
    written = _build(directory, _config(256 * 1024), _monotonic_stamps(1), 10_000, seed=2)
    return directory, written


@pytest.fixture(scope="module")
def shuffled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Written]:
    directory = tmp_path_factory.mktemp("index") / "shuffled-0"
    written = _build(directory, _config(64 * 1024), _random_stamps(3), 2_000, seed=4)
    return directory, written


def brute_force_offset_for_timestamp(written: Written, target: int) -> tuple[int, int] | None:
    """The first record in offset order whose timestamp is >= target."""
    hits = written.timestamps >= target
    if not hits.any():
        return None
    i = int(np.argmax(hits))
    return int(written.timestamps[i]), int(written.offsets[i])


def timestamp_targets(written: Written) -> list[int]:
    distinct = np.unique(written.timestamps)
    targets = {int(t) for t in distinct}
    targets |= {int(t) - 1 for t in distinct} | {int(t) + 1 for t in distinct}
    # Values strictly between neighbours, and outside the whole range.
    gaps = distinct[1:] - distinct[:-1]
    targets |= {int(t + g // 2) for t, g in zip(distinct[:-1], gaps, strict=True) if g > 2}
    targets |= {int(distinct[0]) - 10**9, 0, -1, int(distinct[-1]) + 10**9}
    return sorted(targets)


class TestOffsetLookup:
    def test_every_offset_finds_the_batch_that_holds_it(
        self,
        monotonic: tuple[Path, Written],
    ) -> None:
        directory, written = monotonic
        with Log.open(directory, _config(256 * 1024)) as log:
            assert log.log_end_offset == written.end
            for offset in range(written.end):
                batch = log.read(offset, 1).batches[0]
                assert batch.base_offset <= offset <= batch.last_offset, offset
                assert batch.base_offset == written.batch_bases[offset], offset

    def test_reads_with_a_larger_budget_start_at_the_same_batch(
        self,
        monotonic: tuple[Path, Written],
    ) -> None:
        directory, written = monotonic
        with Log.open(directory, _config(256 * 1024)) as log:
            for offset in range(0, written.end, 97):
                fetched = log.read(offset, 4096)
                assert fetched.batches[0].base_offset == written.batch_bases[offset]
                assert next(fetched.records()).offset == offset
                lasts = [b.last_offset for b in fetched.batches]
                assert lasts == sorted(lasts)
                assert fetched.next_offset == lasts[-1] + 1


class TestTimestampLookup:
    def test_offset_for_timestamp_matches_brute_force_on_monotonic_timestamps(
        self,
        monotonic: tuple[Path, Written],
    ) -> None:
        directory, written = monotonic
        targets = timestamp_targets(written)
        assert len(targets) > 10_000
        with Log.open(directory, _config(256 * 1024)) as log:
            for target in targets:
                expected = brute_force_offset_for_timestamp(written, target)
                assert log.offset_for_timestamp(target) == expected, target

    def test_offset_for_timestamp_matches_brute_force_on_random_timestamps(
        self,
        shuffled: tuple[Path, Written],
    ) -> None:
        directory, written = shuffled
        targets = timestamp_targets(written)
        rng = random.Random(5)
        sample = [*rng.sample(targets, min(len(targets), 4_000)), targets[0], targets[-1]]
        with Log.open(directory, _config(64 * 1024)) as log:
            assert len(log.segments) >= 4
            for target in sample:
                expected = brute_force_offset_for_timestamp(written, target)
                assert log.offset_for_timestamp(target) == expected, target

    def test_every_offset_finds_its_batch_with_random_timestamps(
        self,
        shuffled: tuple[Path, Written],
    ) -> None:
        directory, written = shuffled
        with Log.open(directory, _config(64 * 1024)) as log:
            for offset in range(written.end):
                batch = log.read(offset, 1).batches[0]
                assert batch.base_offset == written.batch_bases[offset], offset


# -- index files on disk -----------------------------------------------------------
@dataclass
class RawBatch:
    position: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    size: int


def raw_segment(path: Path) -> list[RawBatch]:
    data = path.read_bytes()
    out: list[RawBatch] = []
    pos = 0
    while pos < len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        last_delta = struct.unpack_from(">i", data, pos + 23)[0]
        max_ts = struct.unpack_from(">q", data, pos + 35)[0]
        out.append(RawBatch(pos, base, base + last_delta, max_ts, length + 12))
        pos += length + 12
    assert pos == len(data)
    return out


def segment_bases(directory: Path) -> list[int]:
    return sorted(int(p.stem) for p in directory.glob("*.log"))


@pytest.mark.parametrize("which", ["monotonic", "shuffled"])
class TestIndexFiles:
    def test_offset_index_entries_point_at_batch_starts_with_matching_last_offsets(
        self,
        which: str,
        request: pytest.FixtureRequest,
    ) -> None:
        directory, _ = request.getfixturevalue(which)
        bases = segment_bases(directory)
        assert len(bases) >= 4
        total_entries = 0
        for base in bases:
            batches = raw_segment(directory / f"{base:020d}.log")
            by_position = {b.position: b for b in batches}
            max_batch = max(b.size for b in batches)
            data = (directory / f"{base:020d}.index").read_bytes()
            assert len(data) % OFFSET_ENTRY.size == 0
            entries = list(OFFSET_ENTRY.iter_unpack(data))
            assert entries, f"segment {base} has no offset index entries"
            total_entries += len(entries)
            previous = (-1, 0)
            for rel, position in entries:
                batch = by_position.get(position)
                assert batch is not None, (base, rel, position)
                assert base + rel == batch.last_offset
                assert rel > previous[0] and position > previous[1]
                # Kafka's rule: an entry once more than the interval was written since the last.
                assert INDEX_INTERVAL < position - previous[1] <= INDEX_INTERVAL + max_batch
                previous = (rel, position)
        assert total_entries > 100

    def test_time_index_entries_strictly_increase_and_name_the_batch_of_the_max_timestamp(
        self,
        which: str,
        request: pytest.FixtureRequest,
    ) -> None:
        directory, _ = request.getfixturevalue(which)
        for base in segment_bases(directory):
            batches = raw_segment(directory / f"{base:020d}.log")
            by_last = {b.last_offset: b for b in batches}
            running_max: dict[int, int] = {}
            high = -(2**63)
            for b in batches:
                high = max(high, b.max_timestamp)
                running_max[b.last_offset] = high
            data = (directory / f"{base:020d}.timeindex").read_bytes()
            assert len(data) % TIME_ENTRY.size == 0
            entries = list(TIME_ENTRY.iter_unpack(data))
            assert entries, f"segment {base} has no time index entries"
            stamps = [ts for ts, _ in entries]
            assert all(a < b for a, b in itertools.pairwise(stamps)), base
            for ts, rel in entries:
                batch = by_last.get(base + rel)
                assert batch is not None, (base, ts, rel)
                assert batch.max_timestamp == ts
                assert running_max[batch.last_offset] == ts
            # A sealed segment's last entry is its max timestamp.
            if base != segment_bases(directory)[-1]:
                assert stamps[-1] == max(b.max_timestamp for b in batches)


# -- reserved space: an active index never maps a block it has not reserved -----------------
IDX = "/data/t-0/00000000000000000000.index"


def _open_twin_index(fs: FaultFileSystem, max_index_bytes: int, *, sealed: bool = False) -> OffsetIndex:
    fs.mkdir("/data/t-0")
    return OffsetIndex(fs, IDX, 0, max_index_bytes, sealed=sealed)


def test_an_active_index_reserves_its_file_in_doubling_steps_up_to_its_cap() -> None:
    fs = FaultFileSystem(1)
    index = _open_twin_index(fs, 40_000)
    sizes = [fs.open(IDX, writable=False).size()]
    for n in range(1, 5_000):  # one slot of the 5,000 stays free for the entry of the seal
        index.append(n, 10 * n)
        size = fs.open(IDX, writable=False).size()
        if size != sizes[-1]:
            sizes.append(size)
        assert fs.unreserved(IDX, 0, size) is None, n  # the whole (mapped) file has blocks
    # Nothing reserved until the first entry (an idle partition's index costs no blocks).
    assert sizes == [0, INDEX_MIN_GROW_BYTES, 8192, 16_384, 32_768, 40_000]
    assert index.is_full and index.lookup(2_500) == OffsetPosition(2_500, 25_000)
    index.close()
    assert fs.open(IDX, writable=False).size() == 4_999 * OFFSET_ENTRY.size  # trimmed to its entries
    assert fs.sigbus_risks == []


def test_an_active_index_reopened_as_a_clean_close_left_it_reserves_nothing_until_its_next_entry() -> None:
    fs = FaultFileSystem(4)
    index = _open_twin_index(fs, 64 * 1024)
    for n in range(1, 11):
        index.append(n, 10 * n)
    index.close()  # trimmed to its 10 entries
    reopened = OffsetIndex(fs, IDX, 0, 64 * 1024, sealed=False)
    assert fs.open(IDX, writable=False).size() == 10 * OFFSET_ENTRY.size  # no blocks taken by the open
    assert reopened.lookup(5) == OffsetPosition(5, 50) and not reopened.is_full
    fs.fail_next("allocate", errno.ENOSPC)
    with pytest.raises(OSError) as full:
        reopened.append(11, 110)
    assert full.value.errno == errno.ENOSPC
    assert reopened.entries == 10 and reopened.last_entry() == OffsetPosition(10, 100)
    reopened.append(11, 110)  # space came back: mapped writable over reserved blocks
    assert reopened.last_entry() == OffsetPosition(11, 110)
    assert fs.unreserved(IDX, 0, fs.open(IDX, writable=False).size()) is None
    reopened.close()
    assert fs.open(IDX, writable=False).size() == 11 * OFFSET_ENTRY.size
    assert fs.sigbus_risks == []


def test_an_active_index_cut_before_its_first_new_entry_writes_through_a_writable_mapping() -> None:
    fs = FaultFileSystem(6)
    index = _open_twin_index(fs, 64 * 1024)
    for n in range(1, 11):
        index.append(n, 10 * n)
    index.close()
    reopened = OffsetIndex(fs, IDX, 0, 64 * 1024, sealed=False)
    reopened.truncate_to_position(55)  # entries 6-10 dropped: room below its capacity, read-only still
    reopened.append(6, 56)
    assert reopened.entries == 6 and reopened.lookup(9) == OffsetPosition(6, 56)
    reopened.close()
    assert OffsetIndex(fs, IDX, 0, 64 * 1024, sealed=True).last_entry() == OffsetPosition(6, 56)


def test_a_full_disk_while_growing_an_index_is_an_os_error_that_leaves_it_as_it_was() -> None:
    fs = FaultFileSystem(2)
    index = _open_twin_index(fs, 64 * 1024)
    per_step = INDEX_MIN_GROW_BYTES // OFFSET_ENTRY.size
    for n in range(1, per_step + 1):
        index.append(n, 10 * n)
    fs.fail_next("allocate", errno.ENOSPC)
    with pytest.raises(OSError) as full:
        index.append(per_step + 1, 10 * (per_step + 1))
    assert full.value.errno == errno.ENOSPC
    assert index.entries == per_step and index.last_entry() == OffsetPosition(per_step, 10 * per_step)
    assert fs.open(IDX, writable=False).size() == INDEX_MIN_GROW_BYTES
    index.append(per_step + 1, 10 * (per_step + 1))  # space came back
    assert index.lookup(per_step + 1) == OffsetPosition(per_step + 1, 10 * (per_step + 1))
    index.close()
    assert fs.sigbus_risks == []


def test_a_sparse_active_index_from_kafka_or_an_older_version_is_reserved_when_opened() -> None:
    fs = FaultFileSystem(3)
    fs.mkdir("/data/t-0")
    handle = fs.open(IDX, create=True)
    handle.pwritev([OFFSET_ENTRY.pack(5, 100), OFFSET_ENTRY.pack(9, 250)], 0)
    handle.truncate(10 * 1024 * 1024)  # Kafka's RandomAccessFile.setLength: sparse
    handle.close()
    index = OffsetIndex(fs, IDX, 0, 10 * 1024 * 1024, sealed=False)
    assert index.entries == 2 and index.last_entry() == OffsetPosition(9, 250)
    assert fs.unreserved(IDX, 0, 10 * 1024 * 1024) is None
    index.append(12, 400)
    index.close()
    assert fs.sigbus_risks == []


def test_a_sealed_index_is_mapped_read_only_and_reserves_nothing() -> None:
    fs = FaultFileSystem(4)
    index = _open_twin_index(fs, 4096)
    index.append(3, 100)
    index.close()
    sealed = _open_twin_index(fs, 4096, sealed=True)
    assert sealed.last_entry() == OffsetPosition(3, 100) and sealed.is_full
    with pytest.raises(IndexFullError):
        sealed.append(7, 200)
    sealed.reset()  # rebuilding makes it writable again, over reserved blocks
    sealed.append(7, 200)
    assert sealed.last_entry() == OffsetPosition(7, 200)
    sealed.close()
    assert fs.sigbus_risks == []


def test_an_active_index_with_a_torn_last_entry_is_cut_to_its_whole_entries_at_open() -> None:
    fs = FaultFileSystem(5)
    fs.mkdir("/data/t-0")
    handle = fs.open(IDX, create=True)
    handle.pwritev([OFFSET_ENTRY.pack(5, 100), OFFSET_ENTRY.pack(9, 250), b"\x00\x00\x01"], 0)
    handle.close()
    index = OffsetIndex(fs, IDX, 0, 64 * 1024, sealed=False)
    assert index.entries == 2 and index.last_entry() == OffsetPosition(9, 250)
    assert fs.open(IDX, writable=False).size() == 2 * OFFSET_ENTRY.size
    assert index.lookup(7) == OffsetPosition(5, 100)
    index.close()


def test_an_active_index_opened_clean_answers_its_last_entry_and_lookups_as_it_was_written() -> None:
    fs = FaultFileSystem(7)
    index = _open_twin_index(fs, 64 * 1024)
    for n in range(1, 200):
        index.append(3 * n, 40 * n)
    index.close()
    reopened = OffsetIndex(fs, IDX, 0, 64 * 1024, sealed=False)
    assert reopened.entries == 199 and reopened.last_entry() == OffsetPosition(597, 7960)
    for offset in range(0, 600, 7):
        n = offset // 3
        assert reopened.lookup(offset) == (OffsetPosition(3 * n, 40 * n) if n else OffsetPosition(0, 0))
    reopened.close()
