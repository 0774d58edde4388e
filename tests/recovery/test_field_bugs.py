"""Named regressions for crash-recovery bugs seen in the field (issue 5, item 6).

Each test recreates, on the FaultFileSystem, the crash state the field bug came
from and asserts that oncelog handles it: nothing flushed is lost, nothing that
was never durable is served, producer state equals a full replay, and damage is
either cut as a torn tail (above the recovery point) or reported (below it).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

import numpy as np
import pytest
from log_helpers import read_all

from oncelog import CorruptLogError, Log, LogConfig, encode_batch
from oncelog.producer_state import PRODUCER_DTYPE, ProducerStateEntry
from oncelog.recovery import loader as loader_module
from oncelog.segments import format as fmt
from oncelog.storage import snapshot as snapshots
from oncelog.storage.checkpoint import read_recovery_point
from oncelog.torture.faultfs import FaultFileSystem, SimulatedCrash

D = "/data/topic-0"
T0 = 1_800_000_000_000
# Every flush commits its recovery point (recovery_point_interval_ms=0): these tests damage
# what a flush vouched for, which must be reported. The default lags: tests/recovery/test_loader.py.
CONFIG = LogConfig(
    segment_bytes=2048,
    segment_index_bytes=1024,
    index_interval_bytes=256,
    recovery_point_interval_ms=0,
)
MARKER = D + "/.clean_shutdown"
METADATA = "meta.lmdb"
SEEDS = range(8)


def clock() -> int:
    return T0


class Producers:
    """Idempotent producers (3 ids from `first_pid`) plus plain batches, with their sequences."""

    def __init__(self, first_pid: int = 1, n: int = 0) -> None:
        self.pids = (first_pid, first_pid + 1, first_pid + 2, -1)
        self.sequences = dict.fromkeys(self.pids[:3], 0)
        self.n = n

    def batch(self) -> bytes:
        n = self.n
        self.n += 1
        pid = self.pids[n % 4]
        records = [(b"k%d" % n, bytes([n % 251]) * (40 + n % 60)) for _ in range(1 + n % 3)]
        if pid < 0:
            return encode_batch(records, timestamp_ms=T0)
        data = encode_batch(
            records, producer_id=pid, producer_epoch=0, base_sequence=self.sequences[pid], timestamp_ms=T0
        )
        self.sequences[pid] += len(records)
        return data


def open_log(fs: FaultFileSystem) -> Log:
    return Log.open(D, CONFIG, fs=fs, clock=clock)


def append(log: Log, data: bytes, written: list[tuple[int, bytes]]) -> None:
    result = log.append(data)
    assert not result.duplicate
    written.append((result.first_offset, struct.pack(">q", result.first_offset) + data[8:]))


def producer_state(log: Log) -> dict[int, ProducerStateEntry]:
    return {entry.producer_id: entry for entry in log.producers()}


def full_replay(fs: FaultFileSystem) -> tuple[dict[int, ProducerStateEntry], list[tuple[int, bytes]]]:
    """Producer state and batches of a copy of `fs` opened with every snapshot deleted."""
    copy = fs.crash("kill")
    for name in copy.listdir(D):
        if name.endswith(snapshots.SNAPSHOT_SUFFIX):
            copy.unlink(os.path.join(D, name))
    log = open_log(copy)
    try:
        assert log.recovery_report.snapshot_offset is None, copy.describe()
        return producer_state(log), read_all(log)
    finally:
        log.close()


def content(fs: FaultFileSystem, path: str) -> bytes:
    handle = fs.open(path, writable=False)
    try:
        return handle.pread(handle.size(), 0)
    finally:
        handle.close()


def overwrite(fs: FaultFileSystem, path: str, data: bytes, offset: int) -> None:
    """Write `data` at `offset` (creating the file if missing) and fsync it."""
    handle = fs.open(path, create=True)
    try:
        handle.pwritev([data], offset)
        handle.fsync()
    finally:
        handle.close()


def filled_log(fs: FaultFileSystem, batches: int) -> tuple[Log, list[tuple[int, bytes]]]:
    log = open_log(fs)
    written: list[tuple[int, bytes]] = []
    producers = Producers()
    for _ in range(batches):
        append(log, producers.batch(), written)
    return log, written


def calls_of(fs: FaultFileSystem, action: Callable[[], object]) -> tuple[int, int]:
    """(io_calls before, io_calls made by `action`)."""
    before = fs.io_calls
    action()
    return before, fs.io_calls - before


# -- KAFKA-3968 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_kafka_3968_a_segment_created_without_a_directory_fsync_is_not_lost(seed: int) -> None:
    fs = FaultFileSystem(seed)
    log, written = filled_log(fs, 6)
    new = log.roll()
    producers = Producers(first_pid=100, n=100)
    for _ in range(3):
        append(log, producers.batch(), written)
    log.flush()
    assert len(log.segments) >= 2
    # A directory step after the flush: "dirent" then reverts at least one step, and
    # any earlier unsynced one (the new segment's entry, without the fsync) with it.
    fs.open(D + "/scratch", create=True).close()
    crashed = fs.crash("dirent")
    assert any(fault.kind == "dirent" for fault in crashed.faults), crashed.describe()
    assert crashed.exists(new.path), f"the rolled-to segment vanished; {crashed.describe()}"
    recovered = open_log(crashed)
    assert read_all(recovered) == written, crashed.describe()
    assert len(recovered.segments) == len(log.segments), crashed.describe()
    recovered.close()


# -- KAFKA-10101 ----------------------------------------------------------------------------------
def test_kafka_10101_no_phantom_data_is_served_after_recovery() -> None:
    fs = FaultFileSystem(0)
    log, written = filled_log(fs, 5)
    log.flush()
    active, position = log.active_segment, log.active_segment.size
    first = fs.crash("kill")  # on disk: exactly what the flush made durable
    producers = Producers(first_pid=50, n=50)
    for _ in range(3):
        append(log, producers.batch(), written)
    assert log.active_segment is active, "the unflushed batches must stay in one segment"
    # The process died after writing these: they sit in the page cache, never fsynced.
    tail = b"".join(data for _, data in written[5:])
    handle = first.open(active.path)
    handle.pwritev([tail], position)
    handle.close()
    recovered = open_log(first)
    served = read_all(recovered)
    assert served == written, "recovery should serve what the page cache holds"
    served_state = producer_state(recovered)
    for _ in range(8):  # power loss right after recovery, before anything else happened
        second = first.crash("drop")
        again = open_log(second)
        assert read_all(again) == served, (
            f"recovery served bytes it had not made durable; {second.describe()}"
        )
        assert producer_state(again) == served_state, second.describe()
        again.close()


# -- KAFKA-10471 ----------------------------------------------------------------------------------
def test_kafka_10471_a_crash_during_loading_is_not_taken_as_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    fs = FaultFileSystem(3)
    log, written = filled_log(fs, 30)
    log.close()
    # Loading does I/O even when clean: a leftover temporary snapshot and a stray one.
    overwrite(fs, D + "/" + snapshots.snapshot_file_name(7) + snapshots.TMP_SUFFIX, b"partial", 0)
    snapshots.write_snapshot(fs, D, 7, np.zeros(0, PRODUCER_DTYPE))

    loading_started: list[int] = []
    real_load = loader_module.LogLoader.load

    def load(self: loader_module.LogLoader) -> loader_module.LoadedLog:
        loading_started.append(self.fs.io_calls)  # type: ignore[attr-defined]
        return real_load(self)

    monkeypatch.setattr(loader_module.LogLoader, "load", load)
    dry = fs.crash("kill")
    assert open_log(dry).recovery_report.clean  # the dry run: a clean open, counted
    start, end = loading_started[0], dry.io_calls
    assert end > start + 1, f"loading made {end - start} I/O calls; nothing to kill in"
    monkeypatch.setattr(loader_module.LogLoader, "load", real_load)
    for n in range(start + 1, end + 1):
        killed = fs.crash("kill")
        killed.kill_at(n)
        with pytest.raises(SimulatedCrash):
            open_log(killed)
        for mode in ("kill", "drop"):
            crashed = killed.crash(mode)
            reopened = open_log(crashed)
            assert not reopened.recovery_report.clean, (
                f"killed while loading, reopened clean; {crashed.describe()}"
            )
            assert read_all(reopened) == written, crashed.describe()
            reopened.close()


# -- KAFKA-15375 ----------------------------------------------------------------------------------
def build_for_close(fs: FaultFileSystem) -> tuple[Log, list[tuple[int, bytes]]]:
    log, written = filled_log(fs, 20)
    log.flush()
    producers = Producers(first_pid=200, n=200)
    for _ in range(4):  # unflushed: close must make these durable before the marker
        append(log, producers.batch(), written)
    return log, written


def test_kafka_15375_the_clean_marker_is_written_only_after_everything_is_flushed() -> None:
    dry = FaultFileSystem(0)
    log, _ = build_for_close(dry)
    before, count = calls_of(dry, log.close)
    assert count > 3 and dry.exists(MARKER)
    clean_seen = 0
    for n in range(1, count + 1):
        fs = FaultFileSystem(0)
        log, written = build_for_close(fs)
        fs.kill_at(before + n)
        with pytest.raises(SimulatedCrash):
            log.close()
        for _ in range(3):
            crashed = fs.crash("drop")
            reopened = open_log(crashed)
            if reopened.recovery_report.clean:
                clean_seen += 1
                got = read_all(reopened)
                assert got == written, (
                    f"reopened clean but has {len(got)}/{len(written)} batches; {crashed.describe()}"
                )
                assert producer_state(reopened) == full_replay(crashed.crash("kill"))[0], crashed.describe()
            else:
                flushed = written[:20]
                assert read_all(reopened)[: len(flushed)] == flushed, (
                    f"flushed data lost; {crashed.describe()}"
                )
            reopened.close()
    # A kill on the marker's directory fsync can leave it durable: the clean path was exercised.
    assert clean_seen > 0


# -- KAFKA-5829 -----------------------------------------------------------------------------------
def build_before_roll(fs: FaultFileSystem) -> tuple[Log, list[tuple[int, bytes]], bytes]:
    """A flushed log whose next batch (returned) rolls a new segment."""
    log = open_log(fs)
    written: list[tuple[int, bytes]] = []
    producers = Producers()
    while True:
        data = producers.batch()
        if len(log.segments) >= 2 and log.active_segment.size + len(data) > CONFIG.segment_bytes:
            log.flush()
            return log, written, data
        append(log, data, written)


def test_kafka_5829_the_recovery_point_never_passes_a_snapshot_that_is_not_durable() -> None:
    dry = FaultFileSystem(0)
    log, _, data = build_before_roll(dry)
    segments = len(log.segments)
    before, count = calls_of(dry, lambda: log.append(data))
    assert len(log.segments) == segments + 1 and count >= 5, "the dry run did not roll"
    new_base = log.active_segment.base_offset
    moved = 0  # kills after the recovery point moved to the new segment
    for n in range(1, count + 1):
        fs = FaultFileSystem(0)
        log, written, data = build_before_roll(fs)
        fs.kill_at(before + n)
        with pytest.raises(SimulatedCrash):
            log.append(data)
        crashed = fs.crash("drop")
        why = f"killed at roll I/O call {n}/{count}; {crashed.describe()}"
        # The recovery point moved to the new segment only once its snapshot was durable.
        inspect = crashed.crash("kill")
        point = read_recovery_point(inspect.open_store(D + "/" + METADATA))
        if point.segment_base == new_base:
            moved += 1
            assert snapshots.read_snapshot(inspect, D, new_base) is not None, why
        expected_state, replayed = full_replay(crashed)
        recovered = open_log(crashed)
        got = read_all(recovered)
        assert got[: len(written)] == written, f"flushed batches lost; {why}"
        assert got == replayed, why
        assert producer_state(recovered) == expected_state, f"producer state differs from a replay; {why}"
        recovered.close()
    assert moved > 0


# -- KAFKA-5747 -----------------------------------------------------------------------------------
def closed_log_with_snapshots(fs: FaultFileSystem) -> list[tuple[int, bytes]]:
    log, written = filled_log(fs, 40)
    assert len(log.segments) >= 3
    log.close()
    assert len(snapshots.list_snapshot_offsets(fs, D)) >= 3
    return written


@pytest.mark.parametrize("damage", ["rows", "header", "truncated"])
def test_kafka_5747_a_corrupt_snapshot_does_not_crash_loading(damage: str) -> None:
    fs = FaultFileSystem(0)
    written = closed_log_with_snapshots(fs)
    expected_state, _ = full_replay(fs)
    newest = snapshots.list_snapshot_offsets(fs, D)[-1]
    path = os.path.join(D, snapshots.snapshot_file_name(newest))
    size = len(content(fs, path))
    if damage == "rows":
        overwrite(fs, path, b"\xff" * 16, size - 20)
    elif damage == "header":
        overwrite(fs, path, b"\x00" * 8, 6)
    else:
        handle = fs.open(path)
        handle.truncate(5)
        handle.close()
    log = open_log(fs)
    assert log.recovery_report.snapshot_offset != newest
    assert producer_state(log) == expected_state
    assert expected_state, "no producer state to compare"
    assert read_all(log) == written
    assert not fs.exists(path) or snapshots.list_snapshot_offsets(fs, D)[-1] == newest
    log.close()


# -- KAFKA-12964 ----------------------------------------------------------------------------------
@pytest.mark.parametrize("clean", [True, False])
def test_kafka_12964_snapshot_deletion_does_not_race_creation(clean: bool) -> None:
    fs = FaultFileSystem(0)
    log, written = filled_log(fs, 40)
    bases = [segment.base_offset for segment in log.segments]
    end = log.log_end_offset
    if clean:
        log.close()
    else:
        log.flush()
    stray = bases[1] + 1
    assert stray not in bases and stray != end
    snapshots.write_snapshot(fs, D, stray, np.zeros(0, PRODUCER_DTYPE))
    base = fs if clean else fs.crash("kill")
    expected_state, _ = full_replay(base)

    def check(opened: Log, crashed: FaultFileSystem) -> None:
        offsets = snapshots.list_snapshot_offsets(crashed, D)
        assert stray not in offsets, f"the stray snapshot survived loading; {crashed.describe()}"
        assert end in offsets, f"the snapshot at the log end was deleted; {crashed.describe()}"
        assert set(bases[1:]) <= set(offsets), f"{offsets} lost a segment-base snapshot; {crashed.describe()}"
        assert read_all(opened) == written, crashed.describe()
        assert producer_state(opened) == expected_state, crashed.describe()

    dry = base.crash("kill")
    # Only loading's I/O calls: reads may make some of their own (opening a segment's files).
    loaded: list[Log] = []
    before, count = calls_of(dry, lambda: loaded.append(open_log(dry)))
    check(loaded[0], dry)
    assert count > 0
    for n in range(1, count + 1):
        killed = base.crash("kill")
        killed.kill_at(before + n)
        with pytest.raises(SimulatedCrash):
            open_log(killed)
        crashed = killed.crash("drop")
        check(open_log(crashed), crashed)


# -- Redpanda #4114 -------------------------------------------------------------------------------
def crc_zero_header(base_offset: int, size: int) -> bytes:
    """A batch header with a plausible length and a CRC of 0, then zeros: a preallocated look-alike."""
    header = fmt.SIZE_AND_MAGIC_STRUCT.pack(base_offset, size - fmt.LOG_OVERHEAD, -1, fmt.MAGIC_V2)
    header += struct.pack(">I", 0)
    return header + bytes(size - len(header))


def test_redpanda_4114_a_valid_header_with_crc_zero_is_not_mistaken_for_a_preallocated_end() -> None:
    # Above the recovery point: a torn tail, cut back to the last good batch.
    fs = FaultFileSystem(0)
    log, written = filled_log(fs, 25)
    log.flush()
    end, active = log.log_end_offset, log.active_segment
    good_size = active.size
    planted = crc_zero_header(end, 120)
    # Planted where the next batch goes, over the active segment's pre-allocated zeros.
    overwrite(fs, active.path, planted, good_size)
    crashed = fs.crash("kill")
    file_size = len(content(crashed, active.path))
    assert file_size >= good_size + len(planted)
    recovered = open_log(crashed)
    report = recovered.recovery_report
    assert recovered.log_end_offset == end
    # Damage, not pre-allocated space: the non-zero header counts as cut bytes, only
    # the zeros after it (its own zero CRC and body included) as the zero tail.
    assert report.truncated_bytes == len(planted.rstrip(b"\0")) == fmt.SIZE_AND_MAGIC_BYTES
    assert report.zero_tail_bytes == file_size - good_size - report.truncated_bytes
    assert report.tail_error is not None
    assert len(content(crashed, active.path)) == good_size
    assert read_all(recovered) == written
    assert recovered.append(encode_batch([(b"k", b"after")], timestamp_ms=T0)).first_offset == end
    recovered.close()

    # Below the recovery point, with flushed data after it: reported, never a silent end.
    fs = FaultFileSystem(0)
    log, written = filled_log(fs, 25)
    log.flush()
    active = log.active_segment
    in_active = [(offset, data) for offset, data in written if offset >= active.base_offset]
    assert len(in_active) >= 2
    offset, data = in_active[0]
    overwrite(fs, active.path, crc_zero_header(offset, len(data)), 0)
    with pytest.raises(CorruptLogError):
        open_log(fs.crash("kill"))


# -- a zero-filled tail after power loss -------------------------------------------------------------
def test_a_zero_filled_tail_after_power_loss_is_cut_back_to_the_last_good_batch() -> None:
    fs = FaultFileSystem(0)
    log, written = filled_log(fs, 25)
    log.flush()
    end, active = log.log_end_offset, log.active_segment
    good_size = active.size
    # Zeros past the last batch, beyond the pre-allocated space too: pages never written.
    overwrite(fs, active.path, bytes(4096), good_size)
    crashed = fs.crash("drop")
    file_size = len(content(crashed, active.path))
    assert file_size >= good_size + 4096
    recovered = open_log(crashed)
    report = recovered.recovery_report
    assert not report.clean
    assert recovered.log_end_offset == end
    # Zeros are no data: all of them are the zero tail, none is damage.
    assert (report.truncated_bytes, report.zero_tail_bytes) == (0, file_size - good_size)
    assert report.tail_error is None
    assert len(content(crashed, active.path)) == good_size
    assert read_all(recovered) == written
    result = recovered.append(encode_batch([(b"k", b"after")], timestamp_ms=T0))
    assert result.first_offset == end
    recovered.close()
    reopened = open_log(crashed)
    assert reopened.recovery_report.clean and reopened.log_end_offset == end + 1
    reopened.close()
