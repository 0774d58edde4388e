"""Opening a log maps no sealed segment's indexes until they are used (issue 6).

Segments below the recovery point are trusted; like Kafka's LazyIndex, their
indexes are opened and sanity-checked on first use, so the cost of an open does
not grow with the number of segments. These tests watch the seam for which
files are opened.
"""

from __future__ import annotations

import shutil
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.config import LogConfig
from oncelog.errors import CorruptLogError, LogDirectoryError
from oncelog.log import Log
from oncelog.segments.batch import encode_batch
from oncelog.segments.segment import LogSegment
from oncelog.storage.fs import DelegatingFileSystem, FileHandle

T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


class OpenRecordingFileSystem(DelegatingFileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        self.opened.append(Path(path).name)
        return super().open(path, create=create, writable=writable)


def filled(directory: Path, batches: int = 200) -> list[bytes]:
    values = [b"value-%04d" % n + b"x" * 100 for n in range(batches)]
    with Log.open(directory, CONFIG) as log:
        for value in values:
            log.append(encode_batch([(b"k", value)], timestamp_ms=T0))
        assert len(log.segments) > 5
    return values


def filled_and_closed(directory: Path, *, clean: bool) -> None:
    """`filled`, then, unless `clean`, its marker gone: the next open is a crash recovery."""
    filled(directory)
    if not clean:
        (directory / ".clean_shutdown").unlink()


def read_values(log: Log, offset: int, count: int) -> list[bytes | None]:
    out: list[bytes | None] = []
    while len(out) < count:
        fetched = log.read(offset, max_bytes=1)
        out += [record.value for record in fetched.records()]
        offset = fetched.next_offset
    return out[:count]


def every_batch(log: Log) -> list[tuple[int, bytes]]:
    """(offset, bytes) of every batch from the log start, read until a read finds none."""
    out, offset = [], log.log_start_offset
    while True:
        batches = log.read(offset, max_bytes=1 << 16).batches
        if not batches:
            return out
        out += [(batch.base_offset, bytes(batch.buffer)) for batch in batches]
        offset = batches[-1].last_offset + 1


def clean_and_unclean_copies(source: Path) -> Iterator[tuple[bool, Path]]:
    """(True, a copy of the closed log `source`), then (False, a copy without its clean
    marker): the same files, opened clean and as after a crash."""
    for marker in (True, False):
        copy = source.parent / f"{source.name}-copy-{marker}"
        shutil.copytree(source, copy)
        if not marker:
            (copy / ".clean_shutdown").unlink()
        yield marker, copy


def index_files(names: list[str]) -> set[str]:
    return {name for name in names if name.endswith((".index", ".timeindex"))}


class TestLazySegmentOpening:
    def test_a_clean_open_maps_only_the_active_segments_indexes(self, tmp_path: Path) -> None:
        filled(tmp_path / "t-0")
        fs = OpenRecordingFileSystem()
        with Log.open(tmp_path / "t-0", CONFIG, fs=fs) as log:
            active = log.active_segment.base_offset
            assert index_files(fs.opened) == {f"{active:020d}.index", f"{active:020d}.timeindex"}

    def test_reading_a_sealed_segment_maps_its_indexes_then(self, tmp_path: Path) -> None:
        values = filled(tmp_path / "t-0")
        fs = OpenRecordingFileSystem()
        with Log.open(tmp_path / "t-0", CONFIG, fs=fs) as log:
            second = log.segments[1]
            before = index_files(fs.opened)
            assert (
                read_values(log, second.base_offset, 3) == values[second.base_offset : second.base_offset + 3]
            )
            assert index_files(fs.opened) - before == {
                f"{second.base_offset:020d}.index",
                f"{second.base_offset:020d}.timeindex",
            }

    def test_an_unclean_open_maps_no_index_below_the_recovery_point(self, tmp_path: Path) -> None:
        filled(tmp_path / "t-0")
        (tmp_path / "t-0" / ".clean_shutdown").unlink()  # as if the process died after the last roll
        fs = OpenRecordingFileSystem()
        with Log.open(tmp_path / "t-0", CONFIG, fs=fs) as log:
            assert not log.recovery_report.clean
            sealed = {s.base_offset for s in log.segments[:-2]}
            mapped = {int(name.split(".")[0]) for name in index_files(fs.opened)}
            assert not mapped & sealed, mapped & sealed

    def test_a_sealed_segment_with_a_damaged_index_is_rebuilt_when_first_read(self, tmp_path: Path) -> None:
        values = filled(tmp_path / "t-0")
        with Log.open(tmp_path / "t-0", CONFIG) as log:
            second = log.segments[1].base_offset
        index = tmp_path / "t-0" / f"{second:020d}.index"
        # An entry pointing past the end of its segment: the sanity check fails.
        index.write_bytes(index.read_bytes()[:-8] + struct.pack(">ii", 1, 1 << 30))
        with Log.open(tmp_path / "t-0", CONFIG) as log:
            assert read_values(log, second, 5) == values[second : second + 5]
            assert log.offset_for_timestamp(T0) is not None
        entries = index.read_bytes()
        assert all(struct.unpack_from(">ii", entries, n)[1] < 4096 for n in range(0, len(entries), 8))

    @pytest.mark.parametrize("field", ["timestamp", "offset"])
    def test_a_flipped_bit_in_a_sealed_segments_last_time_entry_is_not_trusted(
        self, tmp_path: Path, field: str
    ) -> None:
        # Found by a red-team helper: a sealed segment's newest timestamp is its last time
        # entry's, trusted as Kafka trusts it; a bit flipped there made it old enough to go.
        directory = tmp_path / "t-0"
        values = filled_in_time(directory, 200)
        with Log.open(directory, CONFIG) as log:
            second = log.segments[1]
            base, newest = second.base_offset, second.newest_timestamp_ms()
        time_index = directory / f"{base:020d}.timeindex"
        entries = bytearray(time_index.read_bytes())
        last = len(entries) - 12
        timestamp, relative = struct.unpack_from(">qi", entries, last)
        if field == "timestamp":  # 2^30 ms (12 days) older
            flipped = timestamp ^ (1 << 30)
            assert flipped < timestamp
            struct.pack_into(">q", entries, last, flipped)
        else:
            struct.pack_into(">i", entries, last + 8, relative ^ 1)
        time_index.write_bytes(bytes(entries))
        retention = LogConfig(segment_bytes=4096, index_interval_bytes=256, retention_ms=86_400_000)
        with Log.open(directory, retention) as log:
            # Now is a day past the first segment's newest batch, not past the second's.
            first_newest = log.segments[0].newest_timestamp_ms()
            assert first_newest < newest
            assert log.apply_retention(now_ms=first_newest + 86_400_000) == 1
            assert log.log_start_offset == base
            assert log.segments[0].newest_timestamp_ms() == newest
            assert log.segments[0].offset_of_max_timestamp == newest - T0  # (batches of one record)
            found = log.offset_for_timestamp(newest)
            assert found is not None and read_values(log, found.offset, 1) == [values[found.offset]]
            assert found.offset == newest - T0

    @pytest.mark.parametrize("how", ["zeroed", "cut"])
    def test_a_sealed_segment_that_lost_its_last_time_entry_is_not_deleted_early(
        self, tmp_path: Path, how: str
    ) -> None:
        # Found by a red-team helper: the entry before it is genuine, so it passed the check
        # of the batch it names, and it became the segment's newest timestamp.
        directory, now_ms = tmp_path / "t-0", T0 + 10_000_000
        config = LogConfig(index_interval_bytes=100, retention_ms=1_000_000)
        with Log.open(directory, config) as log:
            for n in range(30):
                log.append(encode_batch([(b"k", b"v" * 10)], timestamp_ms=now_ms - 5_000_000 + n * 1000))
            log.append(encode_batch([(b"k", b"newest")], timestamp_ms=now_ms - 10))
            for n in range(3):
                log.append(encode_batch([(b"k", b"v" * 10)], timestamp_ms=now_ms - 500_000 + n))
            log.roll()
            log.append(encode_batch([(b"k", b"v")], timestamp_ms=now_ms))
        time_index = directory / f"{0:020d}.timeindex"
        entries = time_index.read_bytes()
        time_index.write_bytes(entries[:-12] + (bytes(12) if how == "zeroed" else b""))
        with Log.open(directory, config) as log:
            assert log.segments[0].newest_timestamp_ms() == now_ms - 10
            assert log.apply_retention(now_ms=now_ms) == 0
            found = log.offset_for_timestamp(now_ms - 100)
            assert found is not None and found.offset == 30

    def test_a_damaged_position_in_the_index_entry_the_time_check_reads_rebuilds_the_indexes(
        self, tmp_path: Path
    ) -> None:
        # Found by a red-team helper: a negative position reached a pread (a bare EINVAL).
        directory = tmp_path / "t-0"
        config = LogConfig(index_interval_bytes=100, retention_ms=1_000_000)
        with Log.open(directory, config) as log:
            for n in range(30):  # the newest batch mid-segment: its index entry is not the last
                newest = n == 11
                log.append(encode_batch([(b"k", b"v" * 10)], timestamp_ms=T0 + (100_000 if newest else n)))
            log.roll()
            log.append(encode_batch([(b"k", b"v")], timestamp_ms=T0 + 200_000))
        index = directory / f"{0:020d}.index"
        entries = bytearray(index.read_bytes())
        named = max(n for n in range(0, len(entries), 8) if struct.unpack_from(">i", entries, n)[0] <= 11)
        assert named < len(entries) - 8
        entries[named + 4] ^= 0x80  # the sign bit of that entry's position
        index.write_bytes(bytes(entries))
        with Log.open(directory, config) as log:
            assert log.apply_retention(now_ms=T0 + 200_000) == 0
            assert log.segments[0].newest_timestamp_ms() == T0 + 100_000
            assert [offset for offset, _ in every_batch(log)] == list(range(31))

    def test_sealed_segments_of_unstamped_batches_are_trusted_without_a_rebuild(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Found by a red-team helper: every first use of such a segment rebuilt its indexes
        # (their time entry names the base offset, no batch's last), and a follower's offset
        # gap at a segment boundary then read as corruption.
        directory = tmp_path / "t-0"
        config = LogConfig(index_interval_bytes=100)
        with Log.open(directory, config) as log:
            for _ in range(300):
                log.append(encode_batch([(b"k", b"v")] * 3, timestamp_ms=-1))
            log.roll()
            log.append(
                encode_batch([(b"k", b"v")] * 3, base_offset=905, timestamp_ms=-1), origin="replication"
            )
        rebuilds: list[str] = []
        rebuild = LogSegment.rebuild

        def counted(segment: LogSegment, **kwargs: Any) -> Any:
            rebuilds.append(segment.path)
            return rebuild(segment, **kwargs)

        monkeypatch.setattr(LogSegment, "rebuild", counted)
        with Log.open(directory, config) as log:
            assert log.recovery_report.clean
            for _ in range(3):
                assert len(log.read(10, 1000).batches) > 0
                assert log.offset_for_timestamp(0) is None
                assert log.apply_retention(now_ms=T0) == 0
            assert log.segments[0].newest_timestamp_ms() == -1
            assert [offset for offset, _ in every_batch(log)][-2:] == [897, 905]
        assert rebuilds == []

    def test_a_sealed_segment_whose_index_and_log_are_damaged_is_reported_when_read(
        self, tmp_path: Path
    ) -> None:
        filled(tmp_path / "t-0")
        with Log.open(tmp_path / "t-0", CONFIG) as log:
            second = log.segments[1]
            base, size = second.base_offset, second.size
        index = tmp_path / "t-0" / f"{base:020d}.index"
        index.write_bytes(b"\xff" * 8)
        segment = tmp_path / "t-0" / f"{base:020d}.log"
        data = bytearray(segment.read_bytes())
        data[size // 2 : size // 2 + 17] = b"\x07" * 17  # an impossible header mid-segment
        segment.write_bytes(bytes(data))
        with Log.open(tmp_path / "t-0", CONFIG) as log, pytest.raises(CorruptLogError) as raised:
            read_values(log, base, 50)
        assert f"{base:020d}.log" in str(raised.value)


def mapped_files() -> set[str]:
    """The files this process maps now, as the kernel lists them (not as the engine thinks)."""
    with open("/proc/self/maps") as maps:
        return {Path(line.split(maxsplit=5)[5].strip()).name for line in maps if len(line.split()) > 5}


def filled_in_time(directory: Path, batches: int) -> list[bytes]:
    """Batches a millisecond apart, so a time lookup finds one batch."""
    values = [b"value-%04d" % n + b"x" * 100 for n in range(batches)]
    with Log.open(directory, CONFIG) as log:
        for n, value in enumerate(values):
            log.append(encode_batch([(b"k", value)], timestamp_ms=T0 + n))
    return values

    @pytest.mark.parametrize("clean", [True, False])
    def test_a_listed_sealed_log_that_is_not_there_fails_the_open_by_name(
        self, tmp_path: Path, clean: bool
    ) -> None:
        # Found by a red-team pass on a variant that took sealed sizes lazily: the open
        # passed, and size_bytes, retention and reads raised a bare FileNotFoundError later.
        directory = tmp_path / "t-0"
        filled_and_closed(directory, clean=clean)
        sealed = sorted(directory.glob("*.log"))[2]
        sealed.unlink()
        sealed.symlink_to(sealed.with_suffix(".gone"))  # a dangling link, still listed
        with pytest.raises(LogDirectoryError, match=sealed.name):
            Log.open(directory, CONFIG)


class SizeRecordingFileSystem(OpenRecordingFileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.sized: list[str] = []

    def file_size(self, path: str) -> int:
        self.sized.append(Path(path).name)
        return super().file_size(path)


class TestASealedSegmentsSizeReadAtFirstUse:
    @pytest.mark.parametrize("clean", [True, False])
    def test_an_open_and_a_close_read_no_untouched_sealed_segments_size_or_file(
        self, tmp_path: Path, clean: bool
    ) -> None:
        directory = tmp_path / "t-0"
        filled_and_closed(directory, clean=clean)
        fs = SizeRecordingFileSystem()
        with Log.open(directory, CONFIG, fs=fs) as log:
            assert log.recovery_report.clean is clean
            sealed = {Path(segment.path).name for segment in log.segments[:-1]}
            assert not sealed & set(fs.sized), sealed & set(fs.sized)
        assert not sealed & set(fs.sized + fs.opened), sealed & set(fs.sized + fs.opened)

    def test_its_size_read_later_is_the_files(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        filled(directory)
        on_disk = sum(path.stat().st_size for path in directory.glob("*.log"))
        with Log.open(directory, CONFIG) as log:
            assert log.size_bytes == on_disk
            assert [segment.size for segment in log.segments] == [
                Path(segment.path).stat().st_size for segment in log.segments
            ]

    def test_a_sealed_segment_gone_after_the_open_is_named_when_its_size_is_needed(
        self, tmp_path: Path
    ) -> None:
        directory = tmp_path / "t-0"
        filled(directory)
        with Log.open(directory, CONFIG) as log:
            gone = Path(log.segments[1].path)
            gone.unlink()  # behind the log's back
            with pytest.raises(CorruptLogError, match=gone.name):
                log.size_bytes  # noqa: B018
            with pytest.raises(CorruptLogError, match=gone.name):
                log.read(log.segments[1].base_offset, max_bytes=1)

    def test_a_deleted_segment_still_answers_its_size(self, tmp_path: Path) -> None:
        # A reader may hold a segment retention deletes: its size is read before the file goes.
        directory = tmp_path / "t-0"
        filled(directory)
        with Log.open(directory, CONFIG) as log:
            first = log.segments[0]
            expected = Path(first.path).stat().st_size
            log.delete_records(log.segments[1].base_offset)
            assert not Path(first.path).exists() and first not in log.segments
            assert first.size == expected

    def test_a_size_first_asked_while_a_deletion_removes_the_file_is_the_one_it_read(
        self, tmp_path: Path
    ) -> None:
        # Found by a red-team pass: size_bytes (which takes no lock) saw the unread size, a
        # deletion read it and removed the file, and the reader's stat then failed: a healthy
        # log reported "gone". Here the reader's stat runs the whole deletion first.
        directory = tmp_path / "t-0"
        filled(directory)

        class DeletingBeforeTheStat(DelegatingFileSystem):
            armed: Path | None = None

            def file_size(self, path: str) -> int:
                if self.armed is not None and Path(path) == self.armed:
                    self.armed = None
                    deleter = threading.Thread(target=log.delete_records, args=(log.segments[1].base_offset,))
                    deleter.start()
                    deleter.join()
                return super().file_size(path)

        fs = DeletingBeforeTheStat()
        with Log.open(directory, CONFIG, fs=fs) as log:
            first = log.segments[0]
            expected = Path(first.path).stat().st_size
            fs.armed = Path(first.path)
            assert first.size == expected
            assert not Path(first.path).exists() and first not in log.segments

    def test_a_segment_whose_file_was_removed_by_hand_is_still_deleted(self, tmp_path: Path) -> None:
        # Found by a red-team pass: the deletion's size read raised, failing the whole log.
        directory = tmp_path / "t-0"
        filled(directory)
        with Log.open(directory, CONFIG) as log:
            Path(log.segments[0].path).unlink()
            second = log.segments[1].base_offset
            assert log.delete_records(second) == second
            log.append(encode_batch([(b"k", b"after")], timestamp_ms=T0))
        with Log.open(directory, CONFIG) as log:
            assert log.log_start_offset == second

    @pytest.mark.parametrize("clean", [True, False])
    def test_the_largest_timestamp_is_found_in_a_sealed_segment_after_a_reopen(
        self, tmp_path: Path, clean: bool
    ) -> None:
        # Found by a red-team pass: ListOffsets MAX_TIMESTAMP read the cursors of sealed
        # segments whose time index was never read, and answered the active segment's.
        directory = tmp_path / "t-0"
        with Log.open(directory, CONFIG) as log:
            for n in range(100):
                newest = 10**6 if n == 3 else n
                log.append(encode_batch([(b"k", b"v" * 100)], timestamp_ms=T0 + newest))
            assert len(log.segments) > 3
            live = log.max_timestamp()
        assert live == (T0 + 10**6, 3)
        if not clean:
            (directory / ".clean_shutdown").unlink()
        with Log.open(directory, CONFIG) as log:
            assert log.max_timestamp() == live


class TestTheActiveSegmentOpenedClean:
    def test_its_indexes_are_mapped_only_once_read(self, tmp_path: Path) -> None:
        values = filled_in_time(tmp_path / "t-0", 125)
        with Log.open(tmp_path / "t-0", CONFIG) as log:
            active = log.active_segment.base_offset
            assert log.log_end_offset - active > 5  # with index entries to read
            names = {f"{active:020d}.index", f"{active:020d}.timeindex"}
            assert not names & mapped_files()
            assert read_values(log, active + 4, 2) == values[active + 4 : active + 6]
            found = log.offset_for_timestamp(T0 + active + 3)
            assert found is not None and found.offset == active + 3
            assert names <= mapped_files()
        assert not names & mapped_files()  # unmapped at close

    def test_batches_all_stamped_zero_reopen_clean_with_their_time_entry(self, tmp_path: Path) -> None:
        # The lone time entry (0 ms, relative offset 0) was read as unwritten space: every
        # such log reopened unclean, and a sealed segment's entry was dropped.
        directory = tmp_path / "t-0"
        with Log.open(directory, CONFIG) as log:
            for n in range(6):
                log.append(encode_batch([(b"k", b"v%d" % n)], timestamp_ms=0))
                if n == 2:
                    log.roll()
        with Log.open(directory, CONFIG) as log:
            assert log.recovery_report.clean
            sealed, active = log.segments
            assert sealed.time_index.last_entry() == (0, 0)
            # The close's entry, on disk for other readers, is dropped by the open (its slot reused).
            assert (directory / f"{3:020d}.timeindex").read_bytes() == struct.pack(">qi", 0, 0)
            assert active.time_index.last_entry() is None
            assert log.active_segment.max_timestamp_ms == 0
            found = log.offset_for_timestamp(0)
            assert found is not None and found.offset == 0
            assert [offset for offset, _ in every_batch(log)] == list(range(6))

    def test_a_close_whose_final_time_entry_would_fill_the_index_reopens_as_an_unclean_open_would(
        self, tmp_path: Path
    ) -> None:
        # Found by a red-team helper: the close's final time entry took the slot kept free
        # for the seal's, so the clean reopen rolled at its next append and the unclean did not.
        config = LogConfig(segment_index_bytes=12 * 5, index_interval_bytes=200)  # 5 time entries
        source = tmp_path / "source"
        with Log.open(source, config) as log:
            for n in range(8):  # 3 offset and 3 time entries, then a newer max timestamp
                log.append(encode_batch([(b"k", b"v" * 90)], timestamp_ms=T0 + n))
            time_index = log.active_segment.time_index
            assert (time_index.entries, time_index.max_entries, log.active_segment.max_timestamp_ms) == (
                3,
                5,
                T0 + 7,
            )
            assert time_index.last_entry() != (T0 + 7, 7)
        seen = []
        for marker, copy in clean_and_unclean_copies(source):
            with Log.open(copy, config) as log:
                assert log.recovery_report.clean is marker
                segment = log.active_segment
                before = (segment.max_timestamp_ms, segment.offset_of_max_timestamp)
                log.append(encode_batch([(b"k", b"after")], timestamp_ms=T0 + 8))
                seen.append((before, len(log.segments), log.offset_for_timestamp(T0 + 7)))
        assert seen[0] == seen[1]
        assert seen[0][:2] == ((T0 + 7, 7), 1)

    def test_an_active_segment_of_unstamped_batches_reopens_clean(self, tmp_path: Path) -> None:
        # Found by a red-team helper: with no time entry (no batch stamped), every clean open
        # was refused and the segment validated as after a crash.
        directory = tmp_path / "t-0"
        with Log.open(directory, LogConfig(index_interval_bytes=1 << 20)) as log:
            for _ in range(5):
                log.append(encode_batch([(b"k", b"v")], timestamp_ms=-1))
        with Log.open(directory, LogConfig(index_interval_bytes=1 << 20)) as log:
            assert log.recovery_report.clean
            assert log.active_segment.max_timestamp_ms == -1 and log.log_end_offset == 5

    @pytest.mark.parametrize("batches", range(1, 12))
    def test_a_clean_reopen_rolls_where_an_unclean_one_does_after_the_closes_time_entry(
        self, tmp_path: Path, batches: int
    ) -> None:
        # Found by a red-team helper: the close's final time entry stayed in the index, so
        # a clean reopen's time index filled an entry before an unclean one's and rolled first.
        config = LogConfig(segment_index_bytes=120, index_interval_bytes=100)  # 10 time entries
        source = tmp_path / "source"
        with Log.open(source, config) as log:
            for n in range(batches):
                log.append(encode_batch([(b"k", b"v" * 10)], timestamp_ms=T0 + n))
        layouts = []
        for marker, copy in clean_and_unclean_copies(source):
            with Log.open(copy, config) as log:
                assert log.recovery_report.clean is marker
                for n in range(40):
                    log.append(encode_batch([(b"k", b"v" * 10)], timestamp_ms=T0 + 1000 + n))
                layouts.append(
                    [(s.base_offset, s.next_offset, s.newest_timestamp_ms()) for s in log.segments]
                )
        assert layouts[0] == layouts[1]
        assert len(layouts[0]) > 1

    def test_appending_after_it_writes_the_next_index_entries_through_a_mapping(self, tmp_path: Path) -> None:
        values = filled_in_time(tmp_path / "t-0", 125)
        with Log.open(tmp_path / "t-0", CONFIG) as log:
            end = log.log_end_offset
            more = [b"more-%04d" % n + b"y" * 100 for n in range(10)]
            for n, value in enumerate(more):
                log.append(encode_batch([(b"k", value)], timestamp_ms=T0 + end + n))
        with Log.open(tmp_path / "t-0", CONFIG) as log:
            assert read_values(log, 0, end + 10) == values + more
            for offset in range(end - 3, end + 10):
                found = log.offset_for_timestamp(T0 + offset)
                assert found is not None and found.offset == offset

    @pytest.mark.parametrize("tail_batches", [0, 1, 7])
    def test_it_resumes_where_an_unclean_open_of_the_same_files_would(
        self, tmp_path: Path, tail_batches: int
    ) -> None:
        # Batches after the active segment's last index entry: the tail a clean open reads.
        config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=1024)
        source = tmp_path / "source"
        with Log.open(source, config) as log:
            for n in range(40 + tail_batches):
                log.append(encode_batch([(b"k", b"v" * 90)], timestamp_ms=T0 + (n * 7919) % 1000))
        ends = []
        for marker, copy in clean_and_unclean_copies(source):
            with Log.open(copy, config) as log:
                assert log.recovery_report.clean is marker
                segment = log.active_segment
                appended = log.append(encode_batch([(b"k", b"after")], timestamp_ms=T0 + 2000))
                ends.append(
                    (
                        appended.first_offset,
                        segment.max_timestamp_ms,
                        segment.offset_of_max_timestamp,
                        segment.first_batch_timestamp_ms,
                        log.offset_for_timestamp(T0 + 999),
                    )
                )
        assert ends[0] == ends[1]


def _last_batch_position(segment: Path) -> int:
    data, at = segment.read_bytes(), 0
    while True:
        size = struct.unpack_from(">i", data, at + 8)[0] + 12
        if at + size >= len(data):
            return at
        at += size


def _empty_the_active_log(directory: Path, active: Path) -> None:
    active.write_bytes(b"")


def _move_the_last_batch_up(directory: Path, active: Path) -> None:
    data = bytearray(active.read_bytes())  # its base offset: outside the CRC
    at = _last_batch_position(active)
    struct.pack_into(">q", data, at, struct.unpack_from(">q", data, at)[0] + 3)
    active.write_bytes(bytes(data))


def _move_the_last_batch_past_an_i32(directory: Path, active: Path) -> None:
    data = bytearray(active.read_bytes())
    at = _last_batch_position(active)
    struct.pack_into(">q", data, at, struct.unpack_from(">q", data, at)[0] + (1 << 32))
    active.write_bytes(bytes(data))


def _stamp_a_leader_epoch(directory: Path, active: Path) -> None:
    data = bytearray(active.read_bytes())  # also outside the CRC
    struct.pack_into(">i", data, _last_batch_position(active) + 12, 5)
    active.write_bytes(bytes(data))


def _add_a_time_entry_past_the_data(directory: Path, active: Path) -> None:
    with open(active.with_suffix(".timeindex"), "ab") as index:
        index.write(struct.pack(">qi", 1 << 40, 1_000_000))


def _drop_the_last_offset_index_entries(directory: Path, active: Path) -> None:
    index = active.with_suffix(".index")
    entries = index.read_bytes()
    assert len(entries) >= 3 * 8
    index.write_bytes(entries[: -2 * 8])


class TestACleanOpenFindsWhatAnUncleanOneFinds:
    """Files changed behind a clean close: the clean open must end where the unclean open
    of the same files ends (found by red-team helpers; older than the one-pass tail check)."""

    @pytest.mark.parametrize("client_only", [True, False])
    @pytest.mark.parametrize(
        "change",
        [
            _empty_the_active_log,
            _move_the_last_batch_up,
            _move_the_last_batch_past_an_i32,
            _stamp_a_leader_epoch,
            _add_a_time_entry_past_the_data,
            _drop_the_last_offset_index_entries,
        ],
    )
    def test_after_a_change_behind_the_close(
        self, tmp_path: Path, change: Callable[[Path, Path], None], client_only: bool
    ) -> None:
        config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=300, on_corruption="truncate")
        source = tmp_path / "source"
        with Log.open(source, config) as log:
            for n in range(30):
                # A follower's log (a replicated batch first) is not client-only.
                origin = "client" if client_only or n else "replication"
                log.append(
                    encode_batch([(b"k", b"v" * 60)], base_offset=n, timestamp_ms=T0 + n), origin=origin
                )
            active = Path(log.active_segment.path).name
        seen: list[list[object]] = []
        for _marker, copy in clean_and_unclean_copies(source):
            change(copy, copy / active)
            try:
                seen.append(self.states(copy, active, config))
            except CorruptLogError as refused:  # both must refuse alike
                seen.append([str(refused).replace(str(copy), "")])
        assert seen[0] == seen[1]

    @staticmethod
    def states(copy: Path, active: str, config: LogConfig) -> list[object]:
        states: list[object] = []
        for _ in range(2):  # and after a clean close of what the open made of it
            with Log.open(copy, config) as log:
                segment = log.active_segment
                states.append(
                    (
                        log.log_end_offset,
                        segment.max_timestamp_ms,
                        segment.offset_of_max_timestamp,
                        segment.bytes_since_last_index_entry,
                    )
                )
                for n in range(12):  # past the next index entry
                    log.append(encode_batch([(b"n", b"w" * 60)], timestamp_ms=T0 + 100 + n))
                states.append((every_batch(log), log.offset_for_timestamp(T0 + 105)))
        states.append(((copy / active).with_suffix(".index").read_bytes(),))
        return states

    @pytest.mark.parametrize("ending", ["closed", "killed", "flushed and killed"])
    def test_a_followers_first_batch_past_an_empty_segments_base_is_kept(
        self, tmp_path: Path, ending: str
    ) -> None:
        # Replication takes the leader's offsets: a new follower of a log that starts at
        # 100 writes offset 100 into its empty segment 0 (the unclean open cut it, before
        # this change; the clean one refused it in it; found by a red-team helper).
        config = LogConfig()
        source = tmp_path / "t-0"
        log = Log.open(source, config)
        log.append(encode_batch([(b"k", b"v")], base_offset=100, timestamp_ms=T0), origin="replication")
        if ending == "flushed and killed":
            log.flush()
        copy = tmp_path / "copy"
        if ending == "closed":
            log.close()
            shutil.copytree(source, copy)
        else:
            shutil.copytree(source, copy)  # as the process left it, killed: no marker
            log.close()
        with Log.open(copy, config) as reopened:
            assert reopened.recovery_report.clean is (ending == "closed")
            assert reopened.log_end_offset == 101
            assert [batch.base_offset for batch in reopened.read(100, 1 << 20).batches] == [100]


class TestASealedSegmentsLargestTimestampKeptAfterUse:
    def test_a_second_time_lookup_maps_no_earlier_segments_indexes(self, tmp_path: Path) -> None:
        # Each lookup used to map (and then unmap) the indexes of every segment before the one
        # holding its answer, to read their largest timestamps again: a lookup near the end of
        # a long log cost a file open per segment.
        directory = tmp_path / "t-0"
        filled_in_time(directory, 200)
        fs = OpenRecordingFileSystem()
        with Log.open(directory, CONFIG, fs=fs) as log:
            target = T0 + 190
            first = log.offset_for_timestamp(target)
            assert first is not None and first.offset == 190
            fs.opened.clear()
            for _ in range(3):
                assert log.offset_for_timestamp(target) == first
            holding = next(s for s in log.segments if s.base_offset <= 190 < s.next_offset)
            opened = {name for name in fs.opened if name.endswith((".index", ".timeindex"))}
            assert opened <= {f"{holding.base_offset:020d}.index", f"{holding.base_offset:020d}.timeindex"}
            assert log.offset_for_timestamp(T0 + 5) is not None and log.max_timestamp() is not None
            assert log.offset_for_timestamp(T0 + 10_000) is None
