"""Retention and DeleteRecords: the log start offset moves, whole old segments go (issue 8).

Retention deletes exactly the oldest sealed segments past `retention_ms` or
`retention_bytes`, with their snapshots and indexes, never the active one;
`delete_records` moves the start inside a segment and keeps producer state (Kafka's
LoadProducersAfterDeleteRecordsMidSegment). Both survive a reopen, and a crash at
any of their I/O calls leaves a log that opens and serves everything at or above
the start it reports.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oncelog.config import LogConfig
from oncelog.errors import OffsetOutOfRangeError
from oncelog.log import Log
from oncelog.segments.batch import encode_batch
from oncelog.torture.faultfs import FaultFileSystem, SimulatedCrash

T0 = 1_700_000_000_000
HOUR_MS = 3600 * 1000


def config(**overrides: int | None) -> LogConfig:
    base: dict[str, int | None] = {
        "segment_bytes": 1024,
        "index_interval_bytes": 256,
        "retention_ms": None,
    }
    base.update(overrides)
    return LogConfig(**base)  # type: ignore[arg-type]


def batch(pid: int, seq: int, ts: int) -> bytes:
    value = b"p%d-s%d" % (pid, seq) + b"x" * 150
    return encode_batch(
        [(b"k", value)], producer_id=pid, producer_epoch=0, base_sequence=seq, timestamp_ms=ts
    )


def fill(log: Log, batches: int, *, hours_apart: bool = False) -> None:
    """Producers 1 and 2 alternate; with `hours_apart` each batch is an hour later than the last."""
    for n in range(batches):
        log.append(batch(1 + n % 2, n // 2, T0 + (n * HOUR_MS if hours_apart else 0)))


def files(directory: Path, suffix: str) -> list[int]:
    return sorted(int(p.stem) for p in directory.glob(f"*{suffix}"))


class TestRetentionBytes:
    def test_retention_bytes_deletes_exactly_the_oldest_segments_beyond_it(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        with Log.open(directory, config(), clock=lambda: T0) as log:
            fill(log, 40)
            sizes = [s.size for s in log.segments]
            bases = [s.base_offset for s in log.segments]
            assert len(bases) >= 6
            limit = sum(sizes) - sizes[0] - sizes[1] - sizes[2] // 2  # room for dropping exactly 2
            log.config = config(retention_bytes=limit)
            assert log.apply_retention() == 2
            assert [s.base_offset for s in log.segments] == bases[2:]
            assert log.log_start_offset == bases[2]
            assert files(directory, ".log") == bases[2:]
            assert not set(files(directory, ".snapshot")) & set(bases[:2])
            assert not set(files(directory, ".index")) & set(bases[:2])
            with pytest.raises(OffsetOutOfRangeError):
                log.read(bases[2] - 1)
            assert log.read(bases[2]).batches[0].base_offset == bases[2]
            assert log.apply_retention() == 0  # idempotent
        with Log.open(directory, config(), clock=lambda: T0) as reopened:
            assert reopened.log_start_offset == bases[2]

    def test_the_active_segment_is_never_deleted(self, tmp_path: Path) -> None:
        with Log.open(tmp_path / "t-0", config(retention_bytes=0), clock=lambda: T0) as log:
            fill(log, 30)
            sealed = len(log.segments) - 1
            assert log.apply_retention() == sealed
            assert len(log.segments) == 1
            assert log.log_start_offset == log.active_segment.base_offset
            assert log.append(batch(3, 0, T0)).first_offset == log.log_end_offset - 1


class TestRetentionTime:
    def test_retention_ms_deletes_the_segments_whose_newest_batch_is_older(self, tmp_path: Path) -> None:
        with Log.open(tmp_path / "t-0", config(retention_ms=10 * HOUR_MS), clock=lambda: T0) as log:
            fill(log, 40, hours_apart=True)
            now = T0 + 39 * HOUR_MS
            expected = 0
            for segment in log.segments[:-1]:
                if segment.newest_timestamp_ms() > now - 10 * HOUR_MS:
                    break
                expected += 1
            assert 0 < expected < len(log.segments) - 1
            assert log.apply_retention(now) == expected
            assert all(s.newest_timestamp_ms() > now - 10 * HOUR_MS for s in log.segments[:-1])

    @pytest.mark.parametrize("written_hours_ago", [1, 48])
    def test_segments_of_unstamped_batches_age_by_when_their_file_was_written(
        self, tmp_path: Path, written_hours_ago: int
    ) -> None:
        # Found by a red-team helper: a newest timestamp of -1 (no batch stamped) counted as
        # older than any retention, so such segments were deleted at once. Kafka ages them
        # by the file's modification time.
        directory = tmp_path / "t-0"
        with Log.open(directory, config(retention_ms=24 * HOUR_MS)) as log:
            for n in range(12):
                log.append(encode_batch([(b"k", b"v%d" % n + b"x" * 150)], timestamp_ms=-1))
            assert len(log.segments) > 2
            sealed = [Path(segment.path) for segment in log.segments[:-1]]
            assert {segment.newest_timestamp_ms() for segment in log.segments[:-1]} == {-1}
        now_ms = T0 + 100 * HOUR_MS
        for path in sealed:
            written_s = (now_ms - written_hours_ago * HOUR_MS) / 1000
            os.utime(path, (written_s, written_s))
        with Log.open(directory, config(retention_ms=24 * HOUR_MS)) as log:
            deleted = log.apply_retention(now_ms=now_ms)
            assert deleted == (len(sealed) if written_hours_ago > 24 else 0)


class TestDeleteRecords:
    def test_delete_records_mid_segment_keeps_both_producers(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        with Log.open(directory, config(), clock=lambda: T0) as log:
            fill(log, 30)
            before = sorted(log.producers())
            start = log.active_segment.base_offset + 1  # inside the active segment
            assert log.delete_records(start) == start
            assert log.log_start_offset == start
            assert len(log.segments) == 1
            with pytest.raises(OffsetOutOfRangeError):
                log.read(start - 1)
            assert sorted(log.producers()) == before
        with Log.open(directory, config(), clock=lambda: T0) as reopened:
            assert reopened.log_start_offset == start
            assert sorted(reopened.producers()) == before

    def test_delete_records_past_the_end_is_refused_and_below_the_start_does_nothing(
        self, tmp_path: Path
    ) -> None:
        with Log.open(tmp_path / "t-0", config(), clock=lambda: T0) as log:
            fill(log, 10)
            with pytest.raises(OffsetOutOfRangeError):
                log.delete_records(log.log_end_offset + 1)
            assert log.delete_records(4) == 4
            assert log.delete_records(2) == 4

    def test_truncation_cannot_go_below_the_log_start(self, tmp_path: Path) -> None:
        with Log.open(tmp_path / "t-0", config(), clock=lambda: T0) as log:
            fill(log, 10)
            log.delete_records(6)
            with pytest.raises(OffsetOutOfRangeError):
                log.truncate_to(5)


class TestRetentionCrashes:
    def test_a_crash_at_any_io_call_of_retention_leaves_a_log_serving_from_its_start(self) -> None:
        directory = "/d/t-0"

        def build(fs: FaultFileSystem) -> tuple[Log, dict[int, bytes]]:
            log = Log.open(directory, config(retention_bytes=3000), fs=fs, clock=lambda: T0)
            fill(log, 40)
            log.flush()
            everything = {}
            offset = 0
            while offset < log.log_end_offset:
                fetched = log.read(offset)
                everything.update({b.base_offset: bytes(b.buffer) for b in fetched.batches})
                offset = fetched.next_offset
            return log, everything

        dry = FaultFileSystem(5)
        log, _ = build(dry)
        start = dry.io_calls
        assert log.apply_retention() > 0
        calls = dry.io_calls - start
        for n in range(1, calls + 1):
            fs = FaultFileSystem(5)
            log, everything = build(fs)
            fs.kill_at(fs.io_calls + n)
            with pytest.raises(SimulatedCrash):
                log.apply_retention()
            for mode in ("kill", "drop"):
                crashed = fs.crash(mode)  # type: ignore[arg-type]
                why = f"killed at retention I/O call {n}/{calls}, {mode}; {crashed.describe()}"
                reopened = Log.open(directory, config(retention_bytes=3000), fs=crashed, clock=lambda: T0)
                offset = reopened.log_start_offset
                assert reopened.log_end_offset == max(everything) + 1, why
                while offset < reopened.log_end_offset:
                    fetched = reopened.read(offset)
                    for b in fetched.batches:
                        assert bytes(b.buffer) == everything[b.base_offset], why
                    offset = fetched.next_offset
                reopened.apply_retention()  # finishes what the crash interrupted
                reopened.close()
