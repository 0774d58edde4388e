"""Log.clean(): Kafka's cleaner rules on one partition, each as a scenario.

What a cleaned log must still give: each key's newest record, tombstones for
delete_retention_ms after the cleaning that first saw them, read_committed without aborted
data, every producer's sequence and epoch, and the offsets and log end it had.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from log_helpers import read_all, read_records

from oncelog import CleanerError, InvalidProducerEpochError, InvalidRecordError, Log, LogConfig
from oncelog.key_map import BYTES_PER_KEY
from oncelog.results import Isolation
from oncelog.segment_cleaning import CleaningPass
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.compaction import delete_horizon_ms
from oncelog.segments.records import Record

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "kafka"
COMPACT = LogConfig(cleanup_policy="compact", segment_bytes=4096, retention_ms=None, delete_retention_ms=1000)
T0 = 1_000_000
WAIT_S = 120.0  # a bound for a busy machine, never a measurement


class Clock:
    def __init__(self) -> None:
        self.now_ms = T0

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def log(tmp_path: Path, clock: Clock) -> Iterator[Log]:
    opened = Log.open(tmp_path / "p-0", COMPACT, clock=clock)
    yield opened
    opened.close()


def put(
    log: Log, *records: tuple[bytes, bytes | None], pid: int = -1, seq: int = -1, txn: bool = False
) -> int:
    result = log.append(
        encode_batch(list(records), producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                     base_sequence=seq, is_transactional=txn, timestamp_ms=T0)
    )  # fmt: skip
    return result.first_offset


def records(log: Log, isolation: Isolation = "read_uncommitted") -> list[Record]:
    return read_records(log, isolation)


def fold(log: Log, isolation: Isolation = "read_uncommitted") -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for record in records(log, isolation):
        assert record.key is not None
        if record.value is None:
            state.pop(record.key, None)
        else:
            state[record.key] = record.value
    return state


def batches(log: Log) -> list[RecordBatch]:
    return [RecordBatch(data) for _, data in read_all(log)]


def updates(log: Log, rounds: int, keys: int) -> dict[bytes, bytes]:
    for r in range(rounds):
        for k in range(keys):
            put(log, (f"k{k}".encode(), f"r{r}-{k}".encode()))
    return {f"k{k}".encode(): f"r{rounds - 1}-{k}".encode() for k in range(keys)}


def test_each_key_keeps_its_newest_record_and_offsets_do_not_change(log: Log) -> None:
    expected = updates(log, rounds=20, keys=7)
    log.roll()
    before = {r.offset: (r.key, r.value) for r in records(log)}
    end = log.log_end_offset
    result = log.clean()
    assert result.cleaned and result.stats.records_removed > 0
    after = records(log)
    assert fold(log) == expected
    assert all(before[r.offset] == (r.key, r.value) for r in after)  # same offset, same record
    assert [r.offset for r in after] == sorted({r.offset for r in after})
    assert log.log_end_offset == end


def test_the_active_segment_is_never_cleaned(log: Log) -> None:
    updates(log, rounds=3, keys=2)  # all in the active segment: nothing sealed to clean
    active = bytes(log.active_segment.path, "utf-8")
    assert not log.clean().cleaned
    assert len(records(log)) == 6 and bytes(log.active_segment.path, "utf-8") == active


def test_each_segment_keeps_its_last_batch_so_segments_still_end_where_the_next_begins(log: Log) -> None:
    updates(log, rounds=40, keys=1)
    log.roll()
    sealed = [(s.base_offset, s.next_offset) for s in log.segments[:-1]]
    log.clean()
    assert [(s.base_offset, s.next_offset) for s in log.segments[:-1]] == sealed
    assert [r.value for r in records(log)] == [b"r39-0"]  # the other last batches are kept empty
    assert sum(1 for b in batches(log) if b.records_count == 0) == len(sealed) - 1


def test_a_producers_last_batches_are_kept_empty_so_a_retry_is_still_a_duplicate_after_reopen(
    tmp_path: Path, log: Log
) -> None:
    sent = [encode_batch([(b"k", f"v{n}".encode())], producer_id=7, producer_epoch=0, base_sequence=n,
                         timestamp_ms=T0) for n in range(5)]  # fmt: skip
    firsts = [log.append(data).first_offset for data in sent]
    put(log, (b"k", b"newest"))  # supersedes every record of producer 7
    log.roll()
    log.clean()
    kept = [b for b in batches(log) if b.producer_id == 7]
    assert [b.base_offset for b in kept] == firsts and all(b.records_count == 0 for b in kept)
    log.close()
    # Without its snapshots the producer's window comes back from the emptied batches alone.
    for name in os.listdir(log.directory):
        if name.endswith(".snapshot"):
            os.unlink(os.path.join(log.directory, name))
    reopened = Log.open(log.directory, COMPACT)
    try:
        for n, data in enumerate(sent):
            result = reopened.append(data)
            assert result.duplicate and result.first_offset == firsts[n]
        assert reopened.producer_state(7) is not None
        assert reopened.producer_state(7).last_sequence == 4  # type: ignore[union-attr]
    finally:
        reopened.close()


def test_a_tombstone_lives_delete_retention_ms_after_the_cleaning_that_first_saw_it(
    log: Log, clock: Clock
) -> None:
    put(log, (b"gone", b"value"))
    put(log, (b"kept", b"value"))
    put(log, (b"gone", None))
    log.roll()
    log.clean()
    assert fold(log) == {b"kept": b"value"}
    tombstones = [b for b in batches(log) if any(r.value is None for r in b.records())]
    assert [delete_horizon_ms(b) for b in tombstones] == [T0 + 1000]
    clock.now_ms = T0 + 999
    log.clean()
    assert [r.key for r in records(log) if r.value is None] == [b"gone"]  # before the horizon
    clock.now_ms = T0 + 1000
    log.clean()
    assert [r.key for r in records(log)] == [b"kept"]  # the horizon has passed: gone


def test_records_keep_their_timestamps_when_the_delete_horizon_moves_the_base_timestamp(log: Log) -> None:
    log.append(encode_batch([Record(0, T0 - 5, b"a", None), Record(1, T0 + 7, b"b", b"x")], timestamp_ms=T0))
    log.roll()
    log.clean()
    (batch,) = batches(log)
    assert delete_horizon_ms(batch) == T0 + 1000
    assert [(r.key, r.timestamp_ms) for r in batch.records()] == [(b"a", T0 - 5), (b"b", T0 + 7)]


def test_aborted_transactions_lose_their_records_and_read_committed_stays_right(log: Log) -> None:
    put(log, (b"k", b"committed"))
    put(log, (b"k", b"aborted"), pid=9, seq=0, txn=True)
    log.write_txn_marker(9, 0, commit=False, coordinator_epoch=0)
    put(log, (b"other", b"x"))
    log.roll()
    assert fold(log, "read_committed") == {b"k": b"committed", b"other": b"x"}
    result = log.clean()
    assert result.stats.aborted_records_removed == 1
    assert fold(log, "read_committed") == {b"k": b"committed", b"other": b"x"}
    assert b"aborted" not in [r.value for r in records(log)]  # not even read_uncommitted sees it


def test_a_commit_marker_goes_only_once_its_transaction_has_no_data_and_its_horizon_passed(
    log: Log, clock: Clock
) -> None:
    put(log, (b"k", b"in-txn"), pid=9, seq=0, txn=True)
    log.write_txn_marker(9, 0, commit=True, coordinator_epoch=0)
    put(log, (b"k", b"newer"))  # the transaction's data is superseded...
    for seq in range(1, 6):  # ...and out of the producer's window of 5 batches
        put(log, (b"k", f"in-txn-{seq}".encode()), pid=9, seq=seq, txn=True)
    log.write_txn_marker(9, 0, commit=True, coordinator_epoch=0)  # its data stays (kept empty)
    put(log, (b"pad", b"x"), pid=5, seq=0)
    put(log, (b"k", b"newest"))
    log.roll()
    log.clean()  # gives the first marker its horizon; its data is gone
    markers = [b for b in batches(log) if b.is_control]
    assert len(markers) == 2  # never deduplicated by their (equal) keys
    clock.now_ms = T0 + 1000
    log.clean()
    remaining = [b for b in batches(log) if b.is_control]
    assert [b.last_offset for b in remaining] == [markers[1].last_offset]  # the producer's last stays
    assert fold(log, "read_committed") == {b"k": b"newest", b"pad": b"x"}


def test_a_record_without_a_key_is_refused_and_nothing_is_written(log: Log) -> None:
    with pytest.raises(InvalidRecordError, match="without a key"):
        log.append(encode_batch([(b"k", b"v"), (None, b"v")]))
    assert log.log_end_offset == 0
    put(log, (b"k", b"v"), (b"j", None))  # a tombstone has a key: taken
    assert log.log_end_offset == 2


def test_min_compaction_lag_keeps_recent_segments_uncleaned(tmp_path: Path, clock: Clock) -> None:
    config = LogConfig(cleanup_policy="compact", segment_bytes=4096, min_compaction_lag_ms=60_000)
    with Log.open(tmp_path / "p-0", config, clock=clock) as log:
        updates(log, rounds=10, keys=3)
        log.roll()
        assert not log.clean().cleaned  # every batch is stamped T0: younger than the lag
        clock.now_ms = T0 + 60_000
        assert log.clean().cleaned


def test_if_due_waits_for_the_dirty_ratio_and_an_explicit_pass_does_not(tmp_path: Path) -> None:
    config = LogConfig(cleanup_policy="compact", segment_bytes=4096, min_cleanable_dirty_ratio=0.9)
    with Log.open(tmp_path / "p-0", config) as log:
        updates(log, rounds=30, keys=3)
        log.roll()
        assert log.clean(if_due=True).cleaned  # everything is dirty: ratio 1.0
        updates(log, rounds=1, keys=3)
        log.roll()
        due, ratio = log.cleaning_due()
        assert not due and 0 < ratio < 0.9
        assert not log.clean(if_due=True).cleaned
        assert log.clean().cleaned


def test_a_delete_policy_log_is_not_cleaned_and_a_compact_only_log_is_not_deleted_by_retention(
    tmp_path: Path, clock: Clock
) -> None:
    with Log.open(tmp_path / "d-0", LogConfig(segment_bytes=4096), clock=clock) as deleting:
        updates(deleting, rounds=10, keys=1)
        deleting.roll()
        assert not deleting.clean().cleaned and len(records(deleting)) == 10
    config = LogConfig(cleanup_policy="compact", segment_bytes=4096, retention_ms=1)
    with Log.open(tmp_path / "c-0", config, clock=clock) as compacted:
        updates(compacted, rounds=40, keys=1)
        compacted.roll()
        clock.now_ms += 10_000
        assert compacted.apply_retention() == 0 and compacted.log_start_offset == 0
    both = LogConfig(cleanup_policy="compact,delete", segment_bytes=4096, retention_ms=1)
    with Log.open(tmp_path / "c-0", both, clock=clock) as compacted_and_deleting:
        assert compacted_and_deleting.apply_retention() > 0


def test_a_full_key_map_ends_the_pass_at_a_segment_and_the_next_pass_goes_on(log: Log) -> None:
    expected = updates(log, rounds=3, keys=200)
    log.roll()
    small = 30 * BYTES_PER_KEY  # fewer keys than a segment holds: one segment a pass
    first = log.clean(key_map_bytes=small)
    assert first.cleaned and first.cleaned_to < log.active_segment.base_offset
    passes = 1
    while log.cleanable_part().dirty_bytes:
        assert log.clean(key_map_bytes=small).cleaned
        passes += 1
    assert passes > 2 and fold(log) == expected


def test_a_cleaned_log_recovers_when_its_metadata_store_is_lost(log: Log) -> None:
    expected = updates(log, rounds=10, keys=5)
    log.roll()
    log.clean()
    put(log, (b"k0", b"after"))
    expected[b"k0"] = b"after"
    log.close()
    shutil.rmtree(os.path.join(log.directory, "meta.lmdb"))
    reopened = Log.open(log.directory, COMPACT)
    try:
        assert reopened.recovery_report.metadata_missing
        assert fold(reopened) == expected
    finally:
        reopened.close()


def test_a_truncation_during_a_pass_stops_it_with_the_checkpoint_unmoved(log: Log) -> None:
    updates(log, rounds=30, keys=3)
    log.roll()
    cut_at = log.segments[1].base_offset

    def truncate_once(_: int) -> None:
        if log.log_end_offset > cut_at:
            log.truncate_to(cut_at)

    with pytest.raises(CleanerError, match="truncated"):
        log.clean(throttle=truncate_once)
    assert log.cleanable_part().first_dirty == 0  # the next pass takes everything as dirty again
    log.roll()
    assert log.clean().cleaned


def test_a_failed_write_of_the_cleaned_segment_leaves_the_log_as_it_was(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    updates(log, rounds=10, keys=2)
    log.roll()
    before = read_all(log)
    real_open = log._fs.open

    def full_disk(path: str, **kwargs: object) -> object:
        if path.endswith(".cleaned"):
            raise OSError(28, "No space left on device", path)
        return real_open(path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(log._fs, "open", full_disk)
    with pytest.raises(CleanerError, match="left as it was"):
        log.clean()
    monkeypatch.undo()
    assert read_all(log) == before and not [n for n in os.listdir(log.directory) if ".cleaned" in n]
    put(log, (b"k0", b"still taking appends"))
    assert log.clean().cleaned


def test_a_kafka_consumer_offsets_partition_cleans_to_the_same_committed_view(tmp_path: Path) -> None:
    source = FIXTURES / "LDI-POC" / "__consumer_offsets-6"
    if not source.is_dir():
        pytest.fail(f"fixture missing: {source}")
    shutil.copytree(source, tmp_path / "__consumer_offsets-6")  # a scratch copy: opening writes to it
    with Log.open(tmp_path / "__consumer_offsets-6", LogConfig(cleanup_policy="compact")) as log:
        view = fold(log)
        assert view
        log.roll()
        log.clean()
        assert fold(log) == view
        keys = [r.key for r in records(log) if r.offset < log.segments[-1].base_offset]
        assert len(keys) == len(set(keys))  # below the cleaned point, one record per key


def test_an_abort_marker_and_its_index_entry_go_together_so_later_data_of_the_producer_is_read(
    log: Log, clock: Clock
) -> None:
    put(log, (b"k", b"aborted"), pid=9, seq=0, txn=True)
    log.write_txn_marker(9, 0, commit=False, coordinator_epoch=0)
    for seq in range(1, 7):  # the aborted batch leaves the producer's window
        put(log, (f"j{seq}".encode(), b"x"), pid=9, seq=seq)
    put(log, (b"k", b"committed"), pid=9, seq=7, txn=True)
    log.write_txn_marker(9, 0, commit=True, coordinator_epoch=0)
    log.roll()
    expected = {**{f"j{seq}".encode(): b"x" for seq in range(1, 7)}, b"k": b"committed"}
    log.clean()
    assert fold(log, "read_committed") == expected
    clock.now_ms = T0 + 1000
    assert log.clean().stats.markers_removed == 1
    assert [txn.last_offset for s in log.segments for txn in s.txn_index.entries()] == []
    assert fold(log, "read_committed") == expected
    log.close()
    with Log.open(log.directory, COMPACT) as reopened:  # the index as stored agrees
        assert fold(reopened, "read_committed") == expected


def test_appends_and_reads_go_on_while_a_segment_is_being_cleaned(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    updates(log, rounds=20, keys=3)
    log.roll()
    real = CleaningPass.clean_segment
    done: list[int] = []

    def cleaning_with_an_append_beside_it(self: CleaningPass, segment_batches: list[RecordBatch]) -> object:
        if not done:  # another thread appends and reads while this segment is being cleaned
            other = threading.Thread(
                target=lambda: done.append(put(log, (b"beside", b"x")) + len(records(log)))
            )
            other.start()
            other.join(WAIT_S)
            assert done, "an append waited for the cleaning of a whole segment"
        return real(self, segment_batches)

    monkeypatch.setattr(CleaningPass, "clean_segment", cleaning_with_an_append_beside_it)
    assert log.clean().cleaned
    assert fold(log)[b"beside"] == b"x"


def test_a_segment_that_retention_deletes_during_its_cleaning_is_left_to_retention(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    updates(log, rounds=20, keys=3)
    log.roll()
    second = log.segments[1].base_offset
    real = CleaningPass.clean_segment

    def deleted_meanwhile(self: CleaningPass, segment_batches: list[RecordBatch]) -> object:
        cleaned = real(self, segment_batches)
        if segment_batches[0].base_offset == 0:
            log.delete_records(second)  # the first segment goes while its replacement is written
        return cleaned

    monkeypatch.setattr(CleaningPass, "clean_segment", deleted_meanwhile)
    assert log.clean().cleaned
    assert log.segments[0].base_offset == second and log.log_start_offset == second
    assert not [name for name in os.listdir(log.directory) if name.endswith((".cleaned", ".swap"))]


def test_cleaning_up_to_a_high_watermark_keeps_what_a_truncation_to_it_needs(log: Log) -> None:
    put(log, (b"k", b"A"))
    put(log, (b"x", b"1"))
    log.roll()
    high_watermark = log.log_end_offset
    put(log, (b"k", b"B"))  # not yet on every replica
    log.roll()
    log.clean(up_to=high_watermark)
    log.truncate_to(high_watermark)  # the follower's log diverged after the high watermark
    assert fold(log) == {b"k": b"A", b"x": b"1"}


def test_a_marker_that_raised_the_epoch_stays_so_a_zombie_is_fenced_after_a_replay(
    log: Log, clock: Clock
) -> None:
    put(log, (b"k", b"in-txn"), pid=7, seq=0, txn=True)
    log.write_txn_marker(7, 1, commit=True, coordinator_epoch=3)  # a bumped epoch (KIP-890, timeouts)
    put(log, (b"k", b"newer"))  # the producer's only data record is superseded
    log.roll()
    for _ in range(3):
        log.clean()
        clock.now_ms += 1000
    log.close()
    for name in os.listdir(log.directory):  # the state comes back from the log alone
        if name.endswith(".snapshot"):
            os.unlink(os.path.join(log.directory, name))
    with Log.open(log.directory, COMPACT, clock=clock) as reopened:
        state = reopened.producer_state(7)
        assert state is not None and (state.producer_epoch, state.coordinator_epoch) == (1, 3)
        with pytest.raises(InvalidProducerEpochError):
            put(reopened, (b"k", b"zombie"), pid=7, seq=0)


def test_a_log_whose_markers_must_stay_is_not_due_again_after_a_pass(log: Log, clock: Clock) -> None:
    put(log, (b"k", b"committed"), pid=9, seq=0, txn=True)
    log.write_txn_marker(9, 0, commit=True, coordinator_epoch=0)  # its data stays: so does it
    log.roll()
    assert log.clean().cleaned
    clock.now_ms += 10 * COMPACT.delete_retention_ms
    assert log.cleaning_due() == (False, 0.0)


def test_tombstones_kept_forever_need_no_horizon_past_the_largest_timestamp(tmp_path: Path) -> None:
    forever = LogConfig(cleanup_policy="compact", segment_bytes=4096, delete_retention_ms=2**63 - 1)
    with Log.open(tmp_path / "p-0", forever) as log:
        put(log, (b"k", b"v"))
        put(log, (b"k", None))
        log.roll()
        assert log.clean().cleaned
        assert [delete_horizon_ms(b) for b in batches(log) if b.records_count] == [2**63 - 1]


def test_two_passes_on_one_log_run_one_after_the_other(log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    updates(log, rounds=20, keys=3)
    log.roll()
    real = CleaningPass.clean_segment
    inside, most = [0], [0]

    def counted(self: CleaningPass, segment_batches: list[RecordBatch]) -> object:
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        try:
            time_to_overlap.wait(0.05)  # (gives the other pass every chance to come in)
            return real(self, segment_batches)
        finally:
            inside[0] -= 1

    time_to_overlap = threading.Event()
    monkeypatch.setattr(CleaningPass, "clean_segment", counted)
    passes = [threading.Thread(target=log.clean) for _ in range(2)]
    for thread in passes:
        thread.start()
    for thread in passes:
        thread.join(WAIT_S)
    assert most[0] == 1 and fold(log) == {f"k{k}".encode(): f"r19-{k}".encode() for k in range(3)}
    assert not [name for name in os.listdir(log.directory) if name.endswith((".cleaned", ".swap"))]


def test_the_windows_of_the_snapshot_recovery_would_load_stay_when_the_newest_is_unreadable(
    log: Log,
) -> None:
    for seq in range(5):
        put(log, (b"k", b"p%d" % seq), pid=7, seq=seq)
    log.roll()  # the snapshot at 5 windows producer 7's batches 0..4
    put(log, (b"k", b"newer"))
    log.roll()
    newest = os.path.join(log.directory, f"{log.active_segment.base_offset:020d}.snapshot")
    with open(newest, "r+b") as file:  # recovery would set it aside and load the one at 5
        file.write(b"\xff" * 16)
    for seq in range(5, 10):  # in memory, the window moves past 0..4
        put(log, (b"j", b"p%d" % seq), pid=7, seq=seq)
    log.clean()
    assert [b.base_offset for b in batches(log) if b.producer_id == 7 and b.base_offset < 5] == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_transactions_ended_below_the_recovery_point_are_not_remembered(tmp_path: Path) -> None:
    with Log.open(tmp_path / "p-0", LogConfig()) as log:  # (not compacted: nothing ever asks)
        for seq in range(200):
            put(log, (b"k", b"v"), pid=9, seq=seq, txn=True)
            log.write_txn_marker(9, 0, commit=True, coordinator_epoch=0)
            if seq % 50 == 49:
                log.flush()
                log.checkpoint()
        assert len(log._open_txns._recently_ended) < 50


def test_a_tombstone_stamped_years_behind_by_its_client_still_lives_its_retention_on_the_engine_clock(
    log: Log, clock: Clock
) -> None:
    two_years_ms = 2 * 365 * 24 * 3600 * 1000
    log.append(encode_batch([(b"k", b"v")], timestamp_ms=T0 - two_years_ms))
    log.append(encode_batch([(b"k", None)], timestamp_ms=T0 - two_years_ms))  # a skewed client clock
    log.append(encode_batch([(b"j", b"w")], timestamp_ms=T0 + two_years_ms))
    log.roll()
    log.clean()
    assert [(r.key, r.value) for r in records(log)] == [(b"k", None), (b"j", b"w")]
    clock.now_ms = T0 + COMPACT.delete_retention_ms - 1
    log.clean()
    assert [r.key for r in records(log)] == [b"k", b"j"]  # the horizon is the engine's, not the batch's
    clock.now_ms = T0 + COMPACT.delete_retention_ms
    log.clean()
    assert [r.key for r in records(log)] == [b"j"]
