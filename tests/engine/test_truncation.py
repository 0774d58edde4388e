"""Log.truncate_to: a follower cuts its diverged log back (issue 8, brief §5).

Producer state after a truncation must equal what a fresh replay of the kept log
gives, the transaction index and last stable offset must forget what was cut, and
a crash at any I/O call of the truncation must leave either the old log or a
prefix of it, never corruption.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from log_helpers import stored_batches

from oncelog import threads
from oncelog.config import LogConfig
from oncelog.errors import CorruptLogError, LogFailedError, OffsetOutOfRangeError, TruncatedBeforeDurableError
from oncelog.log import METADATA_DIR, Log
from oncelog.producer_state import ProducerStateEntry
from oncelog.recovery import loader as loader_module
from oncelog.segments.batch import encode_batch
from oncelog.segments.segment import LogSegment
from oncelog.torture.faultfs import FaultFileSystem, SimulatedCrash

T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=1024, index_interval_bytes=256)


def clock() -> int:
    return T0


def batch(pid: int, seq: int, *, records: int = 1, transactional: bool = False) -> bytes:
    return encode_batch(
        [(b"k", b"p%d-s%d" % (pid, seq + i)) for i in range(records)],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        is_transactional=transactional,
        timestamp_ms=T0,
    )


def fill(log: Log, rounds: int) -> dict[int, int]:
    """Producers 1 and 2 alternate 2-record batches; returns each one's next sequence."""
    sequences = {1: 0, 2: 0}
    for _ in range(rounds):
        for pid in (1, 2):
            log.append(batch(pid, sequences[pid], records=2))
            sequences[pid] += 2
    return sequences


def state(log: Log) -> list[ProducerStateEntry]:
    return sorted(log.producers())


def fresh_replay_state(directory: Path, scratch: Path) -> list[ProducerStateEntry]:
    """Producer state from replaying every batch: a copy without snapshots or recovery point."""
    copy = scratch / "replay-0"
    shutil.copytree(directory, copy)
    for snapshot in copy.glob("*.snapshot"):
        snapshot.unlink()
    shutil.rmtree(copy / METADATA_DIR)
    (copy / ".clean_shutdown").unlink(missing_ok=True)
    with Log.open(copy, CONFIG, clock=clock) as replayed:
        return state(replayed)


class TestTruncateTo:
    def test_truncation_drops_later_segments_and_snapshots_and_appends_continue(self, tmp_path: Path) -> None:
        with Log.open(tmp_path / "t-0", CONFIG, clock=clock) as log:
            fill(log, 20)
            assert len(log.segments) > 3
            before = stored_batches(log)
            cut = log.segments[2].base_offset + 2  # a batch boundary inside the third segment
            assert log.truncate_to(cut) == cut
            assert log.log_end_offset == cut
            assert stored_batches(log) == [b for b in before if int.from_bytes(b[:8], "big") < cut]
            assert all(s.base_offset <= cut for s in log.segments)
            assert not [p for p in (tmp_path / "t-0").glob("*.log") if int(p.stem) > cut]
            assert all(int(p.stem) <= cut for p in (tmp_path / "t-0").glob("*.snapshot"))
            assert log.append(batch(3, 0)).first_offset == cut
        with Log.open(tmp_path / "t-0", CONFIG, clock=clock) as reopened:
            assert reopened.recovery_report.clean
            assert reopened.log_end_offset == cut + 1

    def test_a_cut_inside_a_batch_takes_the_whole_batch(self, log_dir: Path) -> None:
        with Log.open(log_dir, CONFIG, clock=clock) as log:
            fill(log, 10)
            assert log.truncate_to(7) == 6  # batches hold offsets 0-1, 2-3, 4-5, 6-7, ...
            assert log.log_end_offset == 6

    def test_producer_state_equals_a_fresh_replay_after_a_divergent_history(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        with Log.open(directory, CONFIG, clock=clock) as log:
            fill(log, 20)
            cut = log.segments[1].base_offset + 4
            log.truncate_to(cut)
            # The follower now takes the leader's history: producer 2 resumes where the
            # cut left it, and a producer the old history never had appears.
            resumed = log.producer_state(2)
            assert resumed is not None
            log.append(batch(2, resumed.last_sequence + 1, records=3))
            for seq in range(0, 12, 2):
                log.append(batch(9, seq, records=2))
            expected = state(log)
        assert fresh_replay_state(directory, tmp_path) == expected

    def test_the_truncated_log_equals_a_fresh_replay_at_once(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        with Log.open(directory, CONFIG, clock=clock) as log:
            fill(log, 15)
            log.truncate_to(log.segments[-2].base_offset + 2)
            expected = state(log)
        assert fresh_replay_state(directory, tmp_path) == expected

    def test_cutting_an_abort_marker_reopens_the_transaction_and_its_index_entry_goes(
        self, log_dir: Path
    ) -> None:
        with Log.open(log_dir, CONFIG, clock=clock) as log:
            fill(log, 3)
            first = log.append(batch(5, 0, records=2, transactional=True)).first_offset
            log.append(batch(5, 2, records=2, transactional=True))
            marker = log.write_txn_marker(5, 0, commit=False, coordinator_epoch=1).first_offset
            assert log.last_stable_offset == log.log_end_offset
            assert list(log_dir.glob("*.txnindex"))
            log.truncate_to(marker)
            assert log.last_stable_offset == first
            entry = log.producer_state(5)
            assert entry is not None and entry.current_txn_first_offset == first
            fetched = log.read(0, isolation="read_committed")
            assert fetched.aborted_transactions == []
            assert all(p.stat().st_size == 0 for p in log_dir.glob("*.txnindex"))
            log.write_txn_marker(5, 0, commit=True, coordinator_epoch=1)
            assert log.last_stable_offset == log.log_end_offset

    def test_offsets_outside_the_log_are_refused(self, log_dir: Path) -> None:
        with Log.open(log_dir, CONFIG, clock=clock) as log:
            fill(log, 2)
            with pytest.raises(OffsetOutOfRangeError):
                log.truncate_to(log.log_end_offset + 1)
            assert log.truncate_to(log.log_end_offset) == log.log_end_offset


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "t-0"


class TestTruncationCrashes:
    def test_a_crash_at_any_io_call_of_a_truncation_leaves_the_old_log_or_a_prefix(self) -> None:
        directory = "/d/t-0"

        def build(fs: FaultFileSystem) -> tuple[Log, list[bytes], int]:
            log = Log.open(directory, CONFIG, fs=fs, clock=clock)
            fill(log, 12)
            log.flush()
            return log, stored_batches(log), log.segments[1].base_offset + 2

        dry = FaultFileSystem(3)
        log, before, cut = build(dry)
        start = dry.io_calls
        log.truncate_to(cut)
        calls = dry.io_calls - start
        assert calls > 5
        for n in range(1, calls + 1):
            fs = FaultFileSystem(3)
            log, before, cut = build(fs)
            fs.kill_at(fs.io_calls + n)
            with pytest.raises(SimulatedCrash):
                log.truncate_to(cut)
            for mode in ("kill", "drop"):
                crashed = fs.crash(mode)  # type: ignore[arg-type]
                why = f"killed at truncation I/O call {n}/{calls}, {mode}; {crashed.describe()}"
                reopened = Log.open(directory, CONFIG, fs=crashed, clock=clock)
                got = stored_batches(reopened)
                assert got == before[: len(got)], why
                assert len(got) >= len([b for b in before if int.from_bytes(b[:8], "big") < cut]), why
                reopened.close()


# -- a flush racing a truncation (group commit runs its fsync outside the append lock) -------
RACING_ROUNDS = 60  # truncations, and durable appends, each side makes before the race ends


def test_durable_appends_racing_truncations_every_half_millisecond_leave_an_openable_partition(
    tmp_path: Path,
) -> None:
    """One thread appends durably in a loop, another cuts the last 3 offsets every 0.5 ms.

    Before the fix the first truncation failed: a group-commit flush moved the recovery
    point to the log end it had captured before the cut, the truncation's reload refused
    the partition as corrupt, and the directory stayed locked and unopenable.
    """
    directory = tmp_path / "t-0"
    log = Log.open(directory, CONFIG, clock=clock)
    stop = threading.Event()
    unexpected: list[BaseException] = []
    cut_away = durable = truncations = copies = 0

    def appender() -> None:
        nonlocal cut_away, durable
        n = 0
        while not stop.is_set():
            try:
                log.append(encode_batch([(b"k", b"v%d" % n)], timestamp_ms=T0), durable=True)
                durable += 1
            except TruncatedBeforeDurableError:
                cut_away += 1  # retriable: the batch went with a truncation before its fsync
            except BaseException as exc:
                unexpected.append(exc)
                return
            n += 1

    def truncator() -> None:
        nonlocal truncations, copies
        while not stop.is_set():
            try:
                end = log.log_end_offset
                if end > 3:
                    log.truncate_to(end - 3)
                    truncations += 1
                assert log.recovery_point <= log.log_end_offset
                if truncations % 50 == 25:
                    shutil.copytree(directory, tmp_path / f"crash-{copies}")  # what a kill -9 leaves
                    copies += 1
            except BaseException as exc:
                unexpected.append(exc)
                return
            time.sleep(0.0005)

    threads = [threading.Thread(target=appender), threading.Thread(target=truncator)]
    for thread in threads:
        thread.start()
    # Until enough of each, not for a fixed time: a busy machine only makes it take longer.
    deadline = time.monotonic() + 120
    while not unexpected and time.monotonic() < deadline:
        if truncations >= RACING_ROUNDS and durable >= RACING_ROUNDS and copies >= 1:
            break
        time.sleep(0.01)
    stop.set()
    for thread in threads:
        thread.join()
    assert unexpected == []
    assert truncations >= RACING_ROUNDS and durable >= RACING_ROUNDS and copies >= 1, (truncations, durable)
    log.close()
    with Log.open(directory, CONFIG, clock=clock) as reopened:
        assert reopened.recovery_report.clean
    for n in range(copies):
        with Log.open(tmp_path / f"crash-{n}", CONFIG, clock=clock) as recovered:
            assert recovered.recovery_point == recovered.log_end_offset


class _RacingLock:
    """The fsync lock, with a truncation run (on another thread) just before a flush takes it."""

    def __init__(self, inner: threads.Lock, race: Callable[[], None]):
        self._inner = inner
        self._race: Callable[[], None] | None = race

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._inner.acquire(blocking, timeout)

    def release(self) -> None:
        self._inner.release()

    def __enter__(self) -> bool:
        race, self._race = self._race, None
        if race is not None:
            runner = threading.Thread(target=race)
            runner.start()
            runner.join()
        return self._inner.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._inner.__exit__(None, None, None)


def test_a_flush_that_captured_the_log_before_a_truncation_commits_nothing(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", CONFIG, clock=clock)
    try:
        fill(log, 10)
        log.flush()
        for n in range(4):
            log.append(encode_batch([(b"k", b"plain-%d" % n)], timestamp_ms=T0))
        end_before = log.log_end_offset
        point_before = log.recovery_point

        def truncate() -> None:
            log.truncate_to(point_before + 1)

        log._fsync_lock = _RacingLock(log._fsync_lock, truncate)
        with pytest.raises(TruncatedBeforeDurableError):
            log.wait_durable(end_before)  # captures end_before, then the truncation runs
        assert log.log_end_offset <= point_before + 1 < end_before
        assert log.recovery_point <= log.log_end_offset
    finally:
        log.close()
    with Log.open(tmp_path / "t-0", CONFIG, clock=clock) as reopened:
        assert reopened.recovery_point == reopened.log_end_offset <= point_before + 1


# -- failures inside a truncation fail the log closed -------------------------------------------
def test_a_reload_that_fails_inside_truncate_to_fails_the_log_closed_and_lets_go_of_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "t-0"
    log = Log.open(directory, CONFIG, clock=clock)
    fill(log, 10)
    log.flush()

    def corrupt_load(self: object) -> object:
        raise CorruptLogError("a batch fails its CRC", path=str(directory / "x.log"), position=7)

    monkeypatch.setattr(loader_module.LogLoader, "load", corrupt_load)
    with pytest.raises(LogFailedError, match="truncating"):
        log.truncate_to(5)
    monkeypatch.undo()
    # No segments are left in memory: every call says the log failed, none an IndexError.
    for call in (
        lambda: log.log_end_offset,
        lambda: log.append(batch(9, 0)),
        lambda: log.read(0),
        lambda: log.flush(),
        lambda: log.truncate_to(1),
        lambda: log.producer_state(1),
    ):
        with pytest.raises(LogFailedError):
            call()
    with contextlib.suppress(LogFailedError):
        log.close()
    with Log.open(directory, CONFIG, clock=clock) as reopened:  # the lock was released
        assert reopened.log_end_offset == 4  # the cut, at the start of the batch holding 5


def test_close_lets_go_of_the_directory_even_when_a_segment_close_raises_something_unexpected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "t-0"
    log = Log.open(directory, CONFIG, clock=clock)
    fill(log, 3)

    def broken_close(self: object, *, durable: bool = True) -> None:
        raise RuntimeError("a bug in segment close")

    monkeypatch.setattr(LogSegment, "close", broken_close)
    with pytest.raises(RuntimeError):
        log.close()
    monkeypatch.undo()
    with Log.open(directory, CONFIG, clock=clock) as reopened:
        assert reopened.log_end_offset == 12  # 3 rounds of two producers, 2 records each


def _leader_batch(base_offset: int, records: int) -> bytes:
    data = bytearray(encode_batch([(b"k", b"v%d" % n) for n in range(records)], timestamp_ms=1))
    data[0:8] = base_offset.to_bytes(8, "big")  # the base offset is outside the CRC
    return bytes(data)


@pytest.mark.parametrize("roll_at_the_gap", [False, True], ids=["gap in a segment", "gap between segments"])
def test_truncating_into_a_compaction_gap_keeps_the_batches_before_it_and_reopens(
    tmp_path: Path, roll_at_the_gap: bool
) -> None:
    # A leader's compacted log: offsets 0-2, then 7-9 and 12-13. A follower truncating to 5
    # (in the gap) keeps 0-2; its recovery point must say where those end, or the next
    # load takes the fsynced bytes for corruption.
    log = Log.open(tmp_path / "log", CONFIG, clock=clock)
    log.append_batches([_leader_batch(0, 3)], origin="replication")
    if roll_at_the_gap:
        log.roll()
    log.append_batches([_leader_batch(7, 3), _leader_batch(12, 2)], origin="replication")
    log.flush()
    assert log.truncate_to(5) == 3 == log.log_end_offset
    assert [int.from_bytes(data[:8], "big") for data in stored_batches(log)] == [0]
    log.close()
    log = Log.open(tmp_path / "log", CONFIG, clock=clock)
    assert log.log_end_offset == 3
    assert log.append_batches([_leader_batch(7, 2)], origin="replication")[0].first_offset == 7
    assert log.append(batch(-1, -1)).first_offset == 9
    log.close()
