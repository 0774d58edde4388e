"""Idempotent appends through Log (brief §4, issue 3 acceptance).

Modelled on Kafka's UnifiedLogTest / ProducerStateManagerTest scenarios: a retried
batch is stored once and answered with its original offsets, a zombie producer is
fenced, sequence gaps and partial overlaps are refused, and a refused request
leaves the log byte-for-byte unchanged.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from oncelog.config import LogConfig
from oncelog.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    LogFailedError,
    OutOfOrderSequenceError,
    ProducerStateFullError,
)
from oncelog.log import Log
from oncelog.producer_state import BatchMetadata, ProducerStateEntry
from oncelog.results import AppendResult
from oncelog.segments import segment as segment_module
from oncelog.segments.batch import encode_batch
from oncelog.segments.format import Buffer
from oncelog.segments.records import Record
from oncelog.storage.fs import DelegatingFileHandle, DelegatingFileSystem, FileHandle

MAX_SEQ = 2**31 - 1
T0 = 1_700_000_000_000
PID_A = 1000
PID_B = 2000


# -- helpers --------------------------------------------------------------------
def batch(
    pid: int,
    seq: int,
    count: int = 1,
    *,
    epoch: int = 0,
    ts: int = T0,
    base_offset: int = 0,
    tag: str = "",
) -> bytes:
    """One batch of `count` records from producer `pid`, sequences seq .. seq+count-1."""
    records = [(f"{pid}-{seq}-{i}{tag}".encode(), b"v" * 8) for i in range(count)]
    return encode_batch(
        records,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        timestamp_ms=ts,
        base_offset=base_offset,
    )


def files_digest(directory: Path) -> dict[str, str]:
    """sha256 of each segment and index file (the bytes an append may touch)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()  # name -> digest
        for p in sorted(directory.iterdir())
        if p.suffix in (".log", ".index", ".timeindex")
    }


def window(entry: ProducerStateEntry | None) -> list[tuple[int, int, int, int]]:
    """(first_seq, last_seq, first_offset, last_offset) of each cached batch."""
    assert entry is not None
    return [(b.first_sequence, b.last_sequence, b.first_offset, b.last_offset) for b in entry.batches]


# Batch timestamps here are pinned to 2023 while the log runs on the wall clock with
# Kafka's default 24-hour expiration: expiry reads the engine's clock, never the
# batches' (test_expiry.py and test_client_clocks.py are about expiry).
def config(**overrides: object) -> LogConfig:
    return LogConfig(segment_index_bytes=4096, **overrides)  # type: ignore[arg-type]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topic-0"


@pytest.fixture
def log(log_dir: Path) -> Iterator[Log]:
    opened = Log.open(log_dir, config())
    yield opened
    opened.close()


def append_seven(log: Log, pid: int = PID_A, count: int = 2) -> list[AppendResult]:
    """Seven in-order batches of `count` records; returns their results."""
    return [log.append(batch(pid, i * count, count, ts=T0 + i)) for i in range(7)]


# -- duplicates and ordering ---------------------------------------------------------
class TestDuplicates:
    @pytest.mark.parametrize("back", range(1, 6))
    def test_duplicate_of_each_of_last_five_batches_returns_original_offsets(
        self, log: Log, log_dir: Path, back: int
    ) -> None:
        originals = append_seven(log)
        end = log.log_end_offset
        before = files_digest(log_dir)
        state = log.producer_state(PID_A)
        i = 7 - back
        retry = log.append(batch(PID_A, i * 2, 2, ts=T0 + i))
        assert retry == AppendResult(originals[i].first_offset, originals[i].last_offset, -1, True)
        assert log.log_end_offset == end
        assert files_digest(log_dir) == before
        assert log.producer_state(PID_A) == state

    def test_every_duplicate_in_the_window_is_answered_one_after_another(self, log: Log) -> None:
        originals = append_seven(log)
        for i in range(2, 7):
            got = log.append(batch(PID_A, i * 2, 2, ts=T0 + i))
            assert got.duplicate
            assert (got.first_offset, got.last_offset) == (
                originals[i].first_offset,
                originals[i].last_offset,
            )
        assert log.log_end_offset == 14
        assert log.append(batch(PID_A, 14, 1)).first_offset == 14

    def test_duplicate_of_the_sixth_batch_back_raises_out_of_order(self, log: Log, log_dir: Path) -> None:
        append_seven(log)
        before = files_digest(log_dir)
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(PID_A, 2, 2, ts=T0 + 1))  # the 6th batch back
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(PID_A, 0, 2, ts=T0))  # the 7th
        assert log.log_end_offset == 14
        assert files_digest(log_dir) == before

    @pytest.mark.parametrize(
        ("seq", "count"),
        [(1, 2), (0, 2), (1, 3), (0, 4), (2, 1), (2, 2)],
        ids=["1-2", "0-1", "1-3", "0-3", "2-2", "2-3"],
    )
    def test_partial_overlap_raises_out_of_order(self, log: Log, log_dir: Path, seq: int, count: int) -> None:
        log.append(batch(PID_A, 0, 3))  # sequences 0-2
        before = files_digest(log_dir)
        state = log.producer_state(PID_A)
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(PID_A, seq, count))
        assert log.log_end_offset == 3
        assert files_digest(log_dir) == before
        assert log.producer_state(PID_A) == state

    @pytest.mark.parametrize("seq", [4, 5, 100, MAX_SEQ])
    def test_a_gap_raises_out_of_order(self, log: Log, log_dir: Path, seq: int) -> None:
        log.append(batch(PID_A, 0, 3))
        before = files_digest(log_dir)
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(PID_A, seq))
        assert files_digest(log_dir) == before
        assert log.append(batch(PID_A, 3)).first_offset == 3

    def test_two_producers_interleave_independently(self, log: Log) -> None:
        results = []
        for i in range(4):
            results.append(log.append(batch(PID_A, i)))
            results.append(log.append(batch(PID_B, i * 2, 2)))
        assert [r.first_offset for r in results] == [0, 1, 3, 4, 6, 7, 9, 10]
        # Same sequence numbers, different producers: each is answered from its own window.
        assert log.append(batch(PID_A, 2)) == AppendResult(6, 6, -1, True)
        assert log.append(batch(PID_B, 2, 2)) == AppendResult(4, 5, -1, True)
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(PID_A, 8))  # B's next sequence, not A's
        assert log.append(batch(PID_A, 4)).first_offset == 12
        assert log.append(batch(PID_B, 8)).first_offset == 13
        a, b = log.producer_state(PID_A), log.producer_state(PID_B)
        assert a is not None and b is not None
        assert (a.last_sequence, a.last_offset) == (4, 12)
        assert (b.last_sequence, b.last_offset) == (8, 13)

    def test_multi_record_batches_end_at_base_plus_count_minus_one(self, log: Log) -> None:
        first = log.append(batch(PID_A, 0, 5))
        assert (first.first_offset, first.last_offset) == (0, 4)
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert entry.last_sequence == 4
        assert window(entry) == [(0, 4, 0, 4)]
        second = log.append(batch(PID_A, 5, 3))
        assert (second.first_offset, second.last_offset) == (5, 7)
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(PID_A, 7, 2))  # overlaps the last record of the previous batch
        assert window(log.producer_state(PID_A)) == [(0, 4, 0, 4), (5, 7, 5, 7)]

    def test_a_retry_with_a_different_record_count_is_not_a_duplicate(self, log: Log) -> None:
        log.append(batch(PID_A, 0, 3))
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(PID_A, 0, 1))
        assert log.log_end_offset == 3

    def test_a_duplicate_is_still_detected_after_a_clean_reopen(self, log_dir: Path) -> None:
        with Log.open(log_dir, config()) as first:
            originals = append_seven(first)
        with Log.open(log_dir, config()) as again:
            for i in range(2, 7):
                got = again.append(batch(PID_A, i * 2, 2, ts=T0 + i))
                assert got == originals[i]._replace(duplicate=True)
            with pytest.raises(OutOfOrderSequenceError):
                again.append(batch(PID_A, 2, 2, ts=T0 + 1))
            assert again.log_end_offset == 14

    def test_producers_without_an_id_are_never_deduplicated(self, log: Log) -> None:
        plain = encode_batch([(b"k", b"v")], timestamp_ms=T0)
        assert log.append(plain).first_offset == 0
        assert log.append(plain) == AppendResult(1, 1, -1, False)
        assert list(log.producers()) == []


# -- epochs -----------------------------------------------------------------------
class TestEpochs:
    def test_a_lower_epoch_is_fenced_and_writes_nothing(self, log: Log, log_dir: Path) -> None:
        log.append(batch(PID_A, 0, epoch=5))
        before = files_digest(log_dir)
        state = log.producer_state(PID_A)
        for seq in (1, 0, 7):
            with pytest.raises(InvalidProducerEpochError):
                log.append(batch(PID_A, seq, epoch=4))
        assert log.log_end_offset == 1
        assert files_digest(log_dir) == before
        assert log.producer_state(PID_A) == state

    def test_a_higher_epoch_with_a_nonzero_sequence_is_out_of_order(self, log: Log, log_dir: Path) -> None:
        log.append(batch(PID_A, 0, 2, epoch=1))
        before = files_digest(log_dir)
        for seq in (1, 2, 3):
            with pytest.raises(OutOfOrderSequenceError):
                log.append(batch(PID_A, seq, epoch=2))
        assert files_digest(log_dir) == before
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert entry.producer_epoch == 1

    def test_a_higher_epoch_at_sequence_zero_is_accepted_and_clears_the_window(self, log: Log) -> None:
        for i in range(3):
            log.append(batch(PID_A, i, epoch=1))
        bumped = log.append(batch(PID_A, 0, 2, epoch=2))
        assert bumped == AppendResult(3, 4, -1, False)
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert entry.producer_epoch == 2
        assert window(entry) == [(0, 1, 3, 4)]
        # A zombie retry of the old epoch is fenced, not answered as a duplicate.
        with pytest.raises(InvalidProducerEpochError):
            log.append(batch(PID_A, 2, epoch=1))
        # The new epoch's own retry is a duplicate, and its sequence continues from 1.
        assert log.append(batch(PID_A, 0, 2, epoch=2)) == AppendResult(3, 4, -1, True)
        assert log.append(batch(PID_A, 2, epoch=2)).first_offset == 5

    def test_an_epoch_jump_of_more_than_one_at_sequence_zero_is_accepted(self, log: Log) -> None:
        log.append(batch(PID_A, 0, epoch=0))
        assert log.append(batch(PID_A, 0, epoch=9)).first_offset == 1
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert entry.producer_epoch == 9

    @pytest.mark.parametrize("seq", [0, 1, 12345, MAX_SEQ])
    def test_an_unknown_producer_is_accepted_at_any_sequence(self, log: Log, seq: int) -> None:
        log.append(batch(PID_B, 0))
        result = log.append(batch(PID_A, seq, epoch=3))
        assert result == AppendResult(1, 1, -1, False)
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert (entry.producer_epoch, entry.last_sequence, entry.last_offset) == (3, seq, 1)
        assert log.append(batch(PID_A, seq, epoch=3)) == AppendResult(1, 1, -1, True)
        assert log.append(batch(PID_A, (seq + 1) % (MAX_SEQ + 1), epoch=3)).first_offset == 2


# -- sequence wraparound ---------------------------------------------------------------
class TestWraparound:
    def test_sequence_wraps_from_max_to_zero(self, log: Log) -> None:
        log.append(batch(PID_A, MAX_SEQ - 1, 2))  # MAX-1, MAX
        assert log.append(batch(PID_A, 0)) == AppendResult(2, 2, -1, False)
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert window(entry) == [(MAX_SEQ - 1, MAX_SEQ, 0, 1), (0, 0, 2, 2)]
        assert log.append(batch(PID_A, 1)).first_offset == 3

    def test_a_batch_straddling_the_wrap_is_accepted_and_the_next_starts_at_one(self, log: Log) -> None:
        log.append(batch(PID_A, MAX_SEQ - 5, 4))  # MAX-5 .. MAX-2
        straddle = log.append(batch(PID_A, MAX_SEQ - 1, 3))  # MAX-1, MAX, 0
        assert straddle == AppendResult(4, 6, -1, False)
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert entry.last_sequence == 0
        assert entry.batches[-1] == BatchMetadata(MAX_SEQ - 1, 0, 4, 6, T0)
        # Its retry is a duplicate; 0 again (a partial overlap) is not; 1 follows.
        assert log.append(batch(PID_A, MAX_SEQ - 1, 3)) == AppendResult(4, 6, -1, True)
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(PID_A, 0))
        assert log.append(batch(PID_A, 1)).first_offset == 7

    def test_max_to_one_is_rejected(self, log: Log, log_dir: Path) -> None:
        log.append(batch(PID_A, MAX_SEQ))
        before = files_digest(log_dir)
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(PID_A, 1))
        assert files_digest(log_dir) == before
        assert log.log_end_offset == 1


# -- replication ---------------------------------------------------------------------
class TestReplication:
    def test_replication_accepts_sequence_gaps(self, log: Log) -> None:
        log.append(batch(PID_A, 0))
        got = log.append(batch(PID_A, 50, base_offset=1), origin="replication")
        assert got == AppendResult(1, 1, -1, False)
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert (entry.last_sequence, entry.last_offset) == (50, 1)
        # Client appends then continue from the replicated state.
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(PID_A, 1))
        assert log.append(batch(PID_A, 51)).first_offset == 2

    def test_replication_accepts_unknown_producers_at_any_sequence(self, log: Log) -> None:
        got = log.append(batch(PID_B, 777, 3, epoch=4, base_offset=0), origin="replication")
        assert got == AppendResult(0, 2, -1, False)
        entry = log.producer_state(PID_B)
        assert entry is not None
        assert (entry.producer_epoch, entry.last_sequence, entry.last_offset) == (4, 779, 2)
        assert window(entry) == [(777, 779, 0, 2)]

    def test_replication_accepts_a_lower_epoch_and_adopts_it(self, log: Log) -> None:
        log.append(batch(PID_A, 0, epoch=5))
        got = log.append(batch(PID_A, 9, epoch=3, base_offset=1), origin="replication")
        assert got.first_offset == 1
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert entry.producer_epoch == 3
        assert window(entry) == [(9, 9, 1, 1)]

    def test_replication_writes_a_retried_batch_again(self, log: Log) -> None:
        log.append(batch(PID_A, 0))
        got = log.append(batch(PID_A, 0, base_offset=1), origin="replication")
        assert got == AppendResult(1, 1, -1, False)
        assert log.log_end_offset == 2

    def test_replication_keeps_the_batch_offsets_and_allows_an_offset_gap(self, log: Log) -> None:
        log.append(batch(PID_A, 0, 2))
        got = log.append(batch(PID_A, 2, 3, base_offset=10), origin="replication")
        assert got == AppendResult(10, 12, -1, False)
        assert log.log_end_offset == 13
        assert [b.base_offset for b in log.read(0).batches] == [0, 10]
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert window(entry) == [(0, 1, 0, 1), (2, 4, 10, 12)]
        assert log.append(batch(PID_A, 5)).first_offset == 13

    def test_replicated_offsets_below_the_log_end_are_refused(self, log: Log, log_dir: Path) -> None:
        log.append(batch(PID_A, 0, 4))
        before = files_digest(log_dir)
        with pytest.raises(InvalidRecordError):
            log.append(batch(PID_A, 4, base_offset=3), origin="replication")
        assert files_digest(log_dir) == before
        assert log.log_end_offset == 4
        # Exactly at the log end is fine.
        assert log.append(batch(PID_A, 4, base_offset=4), origin="replication").first_offset == 4


# -- append_batches -----------------------------------------------------------------------
class TestAppendBatches:
    def test_a_duplicate_in_the_middle_is_flagged_and_the_others_are_written(self, log: Log) -> None:
        log.append(batch(PID_A, 0, 2))  # 0-1
        log.append(batch(PID_A, 2))  # 2
        results = log.append_batches(
            [batch(PID_A, 3, 2), batch(PID_A, 0, 2), batch(PID_B, 0, 3), batch(PID_A, 2)]
        )
        assert results == [
            AppendResult(3, 4, -1, False),
            AppendResult(0, 1, -1, True),
            AppendResult(5, 7, -1, False),
            AppendResult(2, 2, -1, True),
        ]
        assert log.log_end_offset == 8
        assert [b.base_offset for b in log.read(0).batches] == [0, 2, 3, 5]

    def test_a_later_out_of_order_batch_refuses_the_whole_request(self, log: Log, log_dir: Path) -> None:
        log.append(batch(PID_A, 0, 2))
        before = files_digest(log_dir)
        states = list(log.producers())
        with pytest.raises(OutOfOrderSequenceError):
            log.append_batches([batch(PID_A, 2), batch(PID_B, 0), batch(PID_A, 3), batch(PID_A, 9)])
        assert log.log_end_offset == 2
        assert files_digest(log_dir) == before
        assert list(log.producers()) == states
        assert log.producer_state(PID_B) is None
        assert log.append(batch(PID_A, 2)).first_offset == 2

    def test_a_later_fenced_batch_refuses_the_whole_request(self, log: Log, log_dir: Path) -> None:
        log.append(batch(PID_A, 0, epoch=2))
        before = files_digest(log_dir)
        with pytest.raises(InvalidProducerEpochError):
            log.append_batches([batch(PID_A, 1, epoch=2), batch(PID_A, 2, epoch=1)])
        assert files_digest(log_dir) == before
        assert window(log.producer_state(PID_A)) == [(0, 0, 0, 0)]

    def test_two_batches_of_one_producer_in_one_request_are_checked_in_order(self, log: Log) -> None:
        results = log.append_batches([batch(PID_A, 0, 2), batch(PID_A, 2, 3)])
        assert results == [AppendResult(0, 1, -1, False), AppendResult(2, 4, -1, False)]
        assert window(log.producer_state(PID_A)) == [(0, 1, 0, 1), (2, 4, 2, 4)]

    def test_the_same_batch_twice_in_one_request_is_a_duplicate_of_the_first(self, log: Log) -> None:
        log.append(batch(PID_B, 0))
        results = log.append_batches([batch(PID_A, 0, 2), batch(PID_A, 0, 2)])
        assert results == [AppendResult(1, 2, -1, False), AppendResult(1, 2, -1, True)]
        assert log.log_end_offset == 3
        assert len(log.read(0).batches) == 2
        assert window(log.producer_state(PID_A)) == [(0, 1, 1, 2)]

    def test_an_epoch_bump_inside_a_request_fences_a_later_old_epoch_batch(self, log: Log) -> None:
        log.append(batch(PID_A, 0, epoch=0))
        with pytest.raises(InvalidProducerEpochError):
            log.append_batches([batch(PID_A, 0, epoch=1), batch(PID_A, 1, epoch=0)])
        assert log.log_end_offset == 1
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert entry.producer_epoch == 0

    def test_a_request_that_rolls_still_checks_every_batch_against_the_earlier_ones(
        self, log_dir: Path
    ) -> None:
        with Log.open(log_dir, config(segment_bytes=1024)) as small:
            sent = [batch(PID_A, i, tag="x" * 150) for i in range(8)]
            results = small.append_batches([*sent, sent[5]])
            assert len(small.segments) > 1
            assert [r.first_offset for r in results] == [*range(8), 5]
            assert results[-1].duplicate
            assert small.producer_state(PID_A) is not None


# -- what the producer state shows ---------------------------------------------------------
class TestProducerStateExposure:
    def test_producer_state_reports_epoch_sequence_offset_times_and_window(self, log: Log) -> None:
        log.append(batch(PID_B, 0))
        before_ms = int(time.time() * 1000)
        for i in range(6):
            log.append(batch(PID_A, i * 3, 3, epoch=7, ts=T0 + i * 10))
        after_ms = int(time.time() * 1000)
        entry = log.producer_state(PID_A)
        assert isinstance(entry, ProducerStateEntry)
        assert entry.producer_id == PID_A
        assert entry.producer_epoch == 7
        assert entry.last_sequence == 17
        assert entry.last_offset == 18
        assert entry.last_timestamp_ms == T0 + 50  # the newest batch's, from the client's clock
        assert before_ms <= entry.last_append_ms <= after_ms  # the engine's (wall) clock
        assert entry.batches == tuple(
            BatchMetadata(i * 3, i * 3 + 2, 1 + i * 3, 3 + i * 3, T0 + i * 10) for i in range(1, 6)
        )

    def test_window_max_timestamp_is_the_batch_max_timestamp(self, log: Log) -> None:
        stamps = [T0 + 5, T0 + 30, T0 + 10]
        stamped = encode_batch(
            [Record(0, ts, f"k{i}".encode(), b"v") for i, ts in enumerate(stamps)],
            producer_id=PID_A,
            producer_epoch=0,
            base_sequence=0,
        )
        log.append(stamped)
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert entry.batches == (BatchMetadata(0, 2, 0, 2, T0 + 30),)
        assert entry.last_timestamp_ms == T0 + 30

    def test_last_timestamp_is_the_newest_batchs_even_when_its_timestamp_is_older(self, log: Log) -> None:
        log.append(batch(PID_A, 0, ts=T0 + 1000))
        log.append(batch(PID_A, 1, ts=T0 + 10))
        entry = log.producer_state(PID_A)
        assert entry is not None
        assert entry.batches[-1].max_timestamp_ms == T0 + 10
        assert entry.last_timestamp_ms == T0 + 10

    def test_log_append_time_sets_both_times_from_the_log_clock(self, log_dir: Path) -> None:
        now = [T0 + 5_000]
        with Log.open(log_dir, config(timestamp_type="LogAppendTime"), clock=lambda: now[0]) as timed:
            first = timed.append(batch(PID_A, 0, ts=T0))
            now[0] = T0 + 9_000
            second = timed.append(batch(PID_A, 1, ts=T0 + 1))
            assert first.log_append_time_ms == T0 + 5_000
            assert second.log_append_time_ms == T0 + 9_000
            entry = timed.producer_state(PID_A)
            assert entry is not None
            assert (entry.last_append_ms, entry.last_timestamp_ms) == (T0 + 9_000, T0 + 9_000)
            assert [b.max_timestamp_ms for b in entry.batches] == [T0 + 5_000, T0 + 9_000]
            # A duplicate answers with the original offsets and does not move the activity.
            now[0] = T0 + 20_000
            retry = timed.append(batch(PID_A, 0, ts=T0))
            assert retry.duplicate
            assert (retry.first_offset, retry.last_offset) == (0, 0)
            assert timed.producer_state(PID_A) == entry

    def test_producers_iterates_every_entry(self, log: Log) -> None:
        pids = [5, 3, 2**40, 9]
        for n, pid in enumerate(pids):
            log.append(batch(pid, 100 + n, epoch=n))
        entries = list(log.producers())
        assert [e.producer_id for e in entries] == pids
        assert all(isinstance(e, ProducerStateEntry) for e in entries)
        assert {e.producer_id: e.producer_epoch for e in entries} == {5: 0, 3: 1, 2**40: 2, 9: 3}
        for entry in entries:
            assert log.producer_state(entry.producer_id) == entry

    def test_producer_state_of_an_unknown_pid_is_none(self, log: Log) -> None:
        assert log.producer_state(PID_A) is None
        log.append(batch(PID_A, 0))
        assert log.producer_state(PID_B) is None
        assert log.producer_state(-1) is None


# -- capacity ------------------------------------------------------------------------------
class TestProducerCapacity:
    def test_a_new_producer_beyond_capacity_is_refused_and_nothing_is_written(self, log_dir: Path) -> None:
        with Log.open(log_dir, config(producer_capacity=3)) as small:
            for pid in (1, 2, 3):
                small.append(batch(pid, 0))
            before = files_digest(log_dir)
            with pytest.raises(ProducerStateFullError):
                small.append(batch(4, 0))
            with pytest.raises(ProducerStateFullError):
                small.append_batches([batch(1, 1), batch(4, 0)])
            assert files_digest(log_dir) == before
            assert small.log_end_offset == 3
            assert small.producer_state(4) is None
            # Known producers still append.
            assert small.append(batch(1, 1)).first_offset == 3


# -- state changes only after the bytes are written -------------------------------------------
class _WriteFailingHandle(DelegatingFileHandle):
    """A file handle whose writes fail with EIO while its file system is armed.

    Segments are written through a mapping, so their one fallible step is
    allocating the space (ENOSPC/EIO there instead of SIGBUS later); it fails too.
    """

    def __init__(self, inner: FileHandle, fs: WriteFailingFileSystem) -> None:
        super().__init__(inner)
        self._fs = fs

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        if self._fs.armed:
            self._fs.failed_writes += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO), self.path)
        return self.inner.pwritev(buffers, offset)

    def allocate(self, size: int, *, start: int = 0) -> None:
        if self._fs.armed:
            self._fs.failed_writes += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO), self.path)
        self.inner.allocate(size, start=start)


class WriteFailingFileSystem(DelegatingFileSystem):
    """Delegates to the real OS; every pwritev fails while `armed` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.failed_writes = 0

    def wrap(self, handle: FileHandle) -> FileHandle:
        return _WriteFailingHandle(handle, self)


class TestStateChangesOnlyAfterTheWrite:
    @pytest.fixture(autouse=True)
    def _allocate_per_append(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # Grow the segment's mapping by exactly each append, so every append writes
        # through a fallible step (allocate) the armed file system can fail.
        monkeypatch.setattr(segment_module, "MIN_GROW_BYTES", 0)
        monkeypatch.setattr(segment_module, "MAX_GROW_BYTES", 0)

    def test_a_failed_write_leaves_producer_state_unchanged(self, log_dir: Path) -> None:
        fs = WriteFailingFileSystem()
        failing = Log.open(log_dir, config(), fs=fs)
        try:
            failing.append(batch(PID_A, 0, 2))
            state = failing.producer_state(PID_A)
            fs.armed = True
            with pytest.raises(LogFailedError):
                failing.append(batch(PID_A, 2))
            with pytest.raises(LogFailedError):
                failing.append_batches([batch(PID_B, 0)])
            assert fs.failed_writes >= 1
            assert failing.producer_state(PID_A) == state
            assert failing.producer_state(PID_B) is None
            assert failing.log_end_offset == 2
            # Fail closed: a working disk again does not reopen the log for appends.
            fs.armed = False
            with pytest.raises(LogFailedError):
                failing.append(batch(PID_A, 2))
            assert failing.producer_state(PID_A) == state
        finally:
            with pytest.raises(LogFailedError, match="without a flush"):
                failing.close()  # failed earlier: it lets go of everything, and says so
        with Log.open(log_dir, config()) as reopened:
            assert reopened.log_end_offset == 2
            assert window(reopened.producer_state(PID_A)) == [(0, 1, 0, 1)]
            assert reopened.append(batch(PID_A, 2)).first_offset == 2

    def test_a_failed_write_of_a_new_producer_leaves_no_entry(self, log_dir: Path) -> None:
        fs = WriteFailingFileSystem()
        failing = Log.open(log_dir, config(), fs=fs)
        try:
            fs.armed = True
            with pytest.raises(LogFailedError):
                failing.append(batch(PID_A, 12345, epoch=2))
            assert fs.failed_writes == 1
            assert failing.producer_state(PID_A) is None
            assert list(failing.producers()) == []
        finally:
            with pytest.raises(LogFailedError, match="without a flush"):
                failing.close()  # failed earlier: it lets go of everything, and says so
