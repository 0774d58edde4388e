"""ProducerStateManager and ProducerAppendInfo in isolation (brief §4, §6).

Modelled on Kafka's ProducerStateManagerTest: the numpy table must hold every
field of a producer's row exactly, keep the last 5 batches oldest first, and the
append rules must answer from the stored window without touching the table.
"""

from __future__ import annotations

import pytest

from oncelog.append_rules import DuplicateBatch, ProducerAppendInfo
from oncelog.errors import InvalidProducerEpochError, OutOfOrderSequenceError, ProducerStateFullError
from oncelog.producer_replay import ReplayBuffer
from oncelog.producer_state import (
    WINDOW,
    BatchMetadata,
    ProducerStateEntry,
    ProducerStateManager,
    WorkingState,
    in_sequence,
)

MAX_SEQ = 2**31 - 1
T0 = 1_700_000_000_000


# -- helpers --------------------------------------------------------------------
def metadata(i: int, *, count: int = 1, first_offset: int | None = None) -> BatchMetadata:
    """The i-th batch of a producer sending `count` records per batch at sequence i * count."""
    first_seq = i * count
    first = i * 10 if first_offset is None else first_offset
    return BatchMetadata(first_seq, first_seq + count - 1, first, first + count - 1, T0 + i)


def replay(
    manager: ProducerStateManager, pid: int, epoch: int, batch: BatchMetadata, *, control: bool = False
) -> None:
    """One stored batch through recovery's replay (ReplayBuffer), written to the table at once."""
    buffer = ReplayBuffer(manager, now_ms=T0)
    buffer.replay_batch(
        pid,
        epoch,
        batch.first_sequence,
        batch.last_sequence,
        batch.first_offset,
        batch.last_offset,
        batch.max_timestamp_ms,
        control,
    )
    buffer.flush()


def filled(pids_and_batches: dict[int, int], capacity: int = 16) -> ProducerStateManager:
    """A manager where producer p has replayed n batches of 2 records (offsets unique per pid)."""
    manager = ProducerStateManager(capacity)
    for pid, n in pids_and_batches.items():
        for i in range(n):
            replay(manager, pid, pid % 7, metadata(i, count=2, first_offset=pid * 1000 + i * 2))
    return manager


def table_bytes(manager: ProducerStateManager) -> bytes:
    return manager.table.tobytes()


# -- the row round trip ----------------------------------------------------------
class TestTableRow:
    @pytest.mark.parametrize("window", range(WINDOW + 1))
    def test_put_then_get_round_trips_every_field_for_a_window_of_n_batches(self, window: int) -> None:
        manager = ProducerStateManager(4)
        # Extreme values: offsets past 2**32, big deltas, sequences running over
        # INT32_MAX (the second batch straddles the wrap: its first sequence is derived
        # from the stored last one and the offset delta).
        first_sequences = [(MAX_SEQ - 100_000 + i * 70_000) % 2**31 for i in range(window)]
        batches = [
            BatchMetadata(
                first, (first + 69_999) % 2**31, 2**40 + i * 70_000, 2**40 + i * 70_000 + 69_999, T0 + i
            )
            for i, first in enumerate(first_sequences)
        ]
        working = WorkingState(
            producer_id=2**50 + 3,
            producer_epoch=32_000,
            batches=list(batches),
            last_append_ms=T0 + 99,
            coordinator_epoch=17,
            txn_first_offset=2**41,
            last_timestamp_ms=T0 - 2**40,
        )
        manager.put(working)
        got = manager.get(2**50 + 3)
        assert got == ProducerStateEntry(
            producer_id=2**50 + 3,
            producer_epoch=32_000,
            last_sequence=batches[-1].last_sequence if batches else -1,
            last_offset=batches[-1].last_offset if batches else -1,
            last_append_ms=T0 + 99,
            batches=tuple(batches),
            coordinator_epoch=17,
            current_txn_first_offset=2**41,
            last_timestamp_ms=T0 - 2**40,
        )
        assert len(manager) == 1

    def test_a_leaders_batch_without_sequences_round_trips_with_none_at_either_end(self) -> None:
        manager = ProducerStateManager(4)
        no_sequence = BatchMetadata(-1, -1, 500, 504, T0)
        manager.put(WorkingState(7, 0, [metadata(0), no_sequence], T0))
        entry = manager.get(7)
        assert entry is not None
        assert entry.batches == (metadata(0), no_sequence)

    def test_put_of_an_existing_producer_overwrites_its_slot(self) -> None:
        manager = ProducerStateManager(4)
        manager.put(WorkingState(7, 0, [metadata(0)], T0))
        manager.put(WorkingState(8, 0, [metadata(0)], T0))
        manager.put(WorkingState(7, 1, [metadata(3), metadata(4)], T0 + 5))
        entry = manager.get(7)
        assert entry is not None
        assert entry.producer_epoch == 1
        assert entry.batches == (metadata(3), metadata(4))
        assert len(manager) == 2
        assert manager.used == 2

    def test_get_of_an_unknown_producer_is_none(self) -> None:
        manager = filled({1: 2})
        assert manager.get(2) is None
        assert manager.working(2) is None


# -- the 5-batch window ------------------------------------------------------------
class TestWindow:
    def test_window_keeps_only_the_last_five_batches_oldest_first(self) -> None:
        manager = ProducerStateManager(4)
        sent = [metadata(i, count=3) for i in range(8)]
        for batch in sent:
            replay(manager, 1, 0, batch)
        entry = manager.get(1)
        assert entry is not None
        assert entry.batches == tuple(sent[-WINDOW:])
        assert entry.last_sequence == sent[-1].last_sequence == 23
        assert entry.last_offset == sent[-1].last_offset

    @pytest.mark.parametrize("n", range(1, WINDOW + 1))
    def test_window_below_five_keeps_every_batch(self, n: int) -> None:
        manager = ProducerStateManager(4)
        sent = [metadata(i) for i in range(n)]
        for batch in sent:
            replay(manager, 1, 0, batch)
        entry = manager.get(1)
        assert entry is not None
        assert entry.batches == tuple(sent)

    def test_epoch_change_clears_window(self) -> None:
        manager = ProducerStateManager(4)
        for i in range(4):
            replay(manager, 1, 0, metadata(i))
        bumped = BatchMetadata(0, 1, 100, 101, T0 + 50)
        replay(manager, 1, 1, bumped)
        entry = manager.get(1)
        assert entry is not None
        assert entry.producer_epoch == 1
        assert entry.batches == (bumped,)
        assert entry.last_sequence == 1
        assert entry.last_offset == 101

    def test_control_batch_with_a_new_epoch_clears_window_but_is_not_cached(self) -> None:
        manager = ProducerStateManager(4)
        replay(manager, 1, 0, metadata(0))
        replay(manager, 1, 1, BatchMetadata(-1, -1, 10, 10, T0 + 9), control=True)
        entry = manager.get(1)
        assert entry is not None
        assert entry.producer_epoch == 1
        assert entry.batches == ()
        assert entry.last_timestamp_ms == T0 + 9

    def test_replay_keeps_the_newest_batch_timestamp_and_counts_the_load_time_as_the_append(self) -> None:
        manager = ProducerStateManager(4)
        replay(manager, 1, 0, BatchMetadata(0, 0, 0, 0, T0 - 10**9))
        replay(manager, 1, 0, BatchMetadata(1, 1, 1, 1, T0 - 10**9 + 40))
        entry = manager.get(1)
        assert entry is not None
        assert entry.last_timestamp_ms == T0 - 10**9 + 40
        assert entry.last_append_ms == T0  # the replay's clock, not the client's


# -- snapshots' bulk path -----------------------------------------------------------
class TestLiveRows:
    def test_live_rows_load_rows_round_trip_preserves_every_entry_and_slot_lookup(self) -> None:
        source = filled({10: 0, 11: 1, 12: 3, 13: 5, 14: 9, 2**40: 2})
        # A producer with an empty window (epoch known, no batch cached) must survive too.
        source.put(WorkingState(10, 4, [], T0 - 1, coordinator_epoch=3, txn_first_offset=77))
        rows = source.live_rows()
        assert len(rows) == 6
        target = ProducerStateManager(16)
        target.put(WorkingState(999, 0, [metadata(0)], T0))  # replaced by the load
        target.load_rows(rows)
        assert list(target.entries()) == list(source.entries())
        assert len(target) == len(source) == 6
        for pid in (10, 11, 12, 13, 14, 2**40):
            assert target.get(pid) == source.get(pid)
            assert target.get(pid) is not None
        assert target.get(999) is None
        # Loaded producers keep working: a new batch lands in the right slot.
        replay(target, 12, 12 % 7, metadata(3, count=2, first_offset=12_006))
        updated = target.get(12)
        assert updated is not None
        assert updated.last_sequence == 7
        assert target.get(13) == source.get(13)

    def test_entries_iterate_producers_oldest_first(self) -> None:
        manager = filled({5: 1, 3: 1, 9: 1})
        assert [e.producer_id for e in manager.entries()] == [5, 3, 9]

    def test_load_rows_larger_than_capacity_raises_and_leaves_the_table_unchanged(self) -> None:
        rows = filled({1: 1, 2: 1, 3: 1, 4: 1}).live_rows()
        small = filled({7: 2}, capacity=3)
        before = (table_bytes(small), list(small.entries()))
        with pytest.raises(ProducerStateFullError):
            small.load_rows(rows)
        assert (table_bytes(small), list(small.entries())) == before

    def test_clear_forgets_every_producer(self) -> None:
        manager = filled({1: 2, 2: 3})
        manager.clear()
        assert len(manager) == 0
        assert manager.get(1) is None
        assert list(manager.entries()) == []
        assert len(manager.live_rows()) == 0


# -- capacity ----------------------------------------------------------------------
class TestCapacity:
    def test_put_of_a_new_producer_into_a_full_table_raises_and_nothing_changes(self) -> None:
        manager = filled({1: 2, 2: 5, 3: 1}, capacity=3)
        before_bytes = table_bytes(manager)
        before_entries = list(manager.entries())
        with pytest.raises(ProducerStateFullError):
            manager.put(WorkingState(4, 0, [metadata(0)], T0))
        assert table_bytes(manager) == before_bytes
        assert list(manager.entries()) == before_entries
        assert len(manager) == 3
        assert manager.get(4) is None

    def test_replay_of_a_new_producer_into_a_full_table_sheds_the_least_recently_appended(self) -> None:
        # Recovery: every replayed producer counts as appended at the load, and the
        # log's order is the order of appends, so the producer whose newest batch is
        # oldest was the first the running engine expired.
        manager = filled({1: 1, 2: 1, 3: 1}, capacity=3)  # newest batches at 1000, 2000, 3000
        buffer = ReplayBuffer(manager, now_ms=T0)
        buffer.replay_batch(4, 0, 0, 0, 5000, 5000, T0, False)
        buffer.flush()
        assert buffer.shed == 1
        assert sorted(e.producer_id for e in manager.entries()) == [2, 3, 4]

    def test_producers_known_to_be_expired_make_room_before_any_is_shed(self) -> None:
        manager = ProducerStateManager(2, 1000)
        manager.put(WorkingState(1, 0, [metadata(0, first_offset=10)], T0 - 5000))  # idle 5 s
        manager.put(WorkingState(2, 0, [metadata(0, first_offset=20)], T0))
        buffer = ReplayBuffer(manager, now_ms=T0)
        buffer.replay_batch(3, 0, 0, 0, 5, 5, T0, False)  # an older offset than 2's newest
        buffer.flush()
        assert buffer.shed == 0
        assert sorted(e.producer_id for e in manager.entries()) == [2, 3]

    def test_a_replay_whose_open_transactions_overflow_the_table_raises(self) -> None:
        manager = ProducerStateManager(2)
        for pid in (1, 2):
            manager.put(WorkingState(pid, 0, [metadata(0)], T0, txn_first_offset=pid))
        buffer = ReplayBuffer(manager, now_ms=T0)
        buffer.replay_batch(3, 0, 0, 0, 50, 50, T0, False, True)
        with pytest.raises(ProducerStateFullError):
            buffer.flush()
        assert sorted(e.producer_id for e in manager.entries()) == [1, 2]

    def test_a_full_table_still_updates_known_producers(self) -> None:
        manager = filled({1: 1, 2: 1, 3: 1}, capacity=3)
        replay(manager, 2, 2, metadata(1, count=2, first_offset=50))
        entry = manager.get(2)
        assert entry is not None
        assert entry.last_offset == 51
        assert len(manager) == 3

    def test_append_info_refuses_a_new_producer_beyond_capacity(self) -> None:
        manager = filled({1: 1, 2: 1}, capacity=3)
        info = ProducerAppendInfo(manager, T0)
        info.apply(3, 0, metadata(0), False)  # the third slot is still free
        with pytest.raises(ProducerStateFullError):
            info.apply(4, 0, metadata(0), False)
        assert len(manager) == 2
        assert manager.get(3) is None

    @pytest.mark.parametrize("capacity", [0, -1])
    def test_a_non_positive_capacity_is_refused(self, capacity: int) -> None:
        with pytest.raises(ValueError):
            ProducerStateManager(capacity)


# -- sequence arithmetic -------------------------------------------------------------
class TestInSequence:
    @pytest.mark.parametrize(
        ("last", "next_", "expected"),
        [
            (MAX_SEQ, 0, True),
            (MAX_SEQ, 1, False),
            (MAX_SEQ - 1, MAX_SEQ, True),
            (5, 6, True),
            (5, 7, False),
            (5, 5, False),
            (5, 4, False),
            (-1, 0, True),
            (0, MAX_SEQ, False),
        ],
    )
    def test_in_sequence_wraps_from_max_to_zero_only(self, last: int, next_: int, expected: bool) -> None:
        assert in_sequence(last, next_) is expected


# -- the append rules on the manager ----------------------------------------------------
class TestAppendInfo:
    @staticmethod
    def five_batches_then_check() -> tuple[ProducerStateManager, list[BatchMetadata]]:
        manager = ProducerStateManager(4)
        sent = [metadata(i, count=2) for i in range(7)]
        for batch in sent:
            replay(manager, 1, 0, batch)
        return manager, sent

    def test_duplicate_of_each_of_last_five_batches_returns_original_offsets(self) -> None:
        manager, sent = self.five_batches_then_check()
        for batch in sent[-WINDOW:]:
            info = ProducerAppendInfo(manager, T0)
            got = info.check(1, 0, batch.first_sequence, batch.last_sequence)
            assert got == DuplicateBatch(batch.first_offset, batch.last_offset, batch.max_timestamp_ms)

    def test_duplicate_of_the_sixth_batch_back_is_out_of_order(self) -> None:
        manager, sent = self.five_batches_then_check()
        sixth = sent[-WINDOW - 1]
        with pytest.raises(OutOfOrderSequenceError):
            ProducerAppendInfo(manager, T0).check(1, 0, sixth.first_sequence, sixth.last_sequence)

    @pytest.mark.parametrize(("first", "last"), [(12, 12), (13, 13), (12, 14), (11, 13), (15, 15), (0, 0)])
    def test_partial_overlap_or_gap_is_out_of_order(self, first: int, last: int) -> None:
        manager, _ = self.five_batches_then_check()  # last batch holds sequences 12-13
        with pytest.raises(OutOfOrderSequenceError):
            ProducerAppendInfo(manager, T0).check(1, 0, first, last)

    def test_next_in_order_batch_is_accepted(self) -> None:
        manager, _ = self.five_batches_then_check()
        assert ProducerAppendInfo(manager, T0).check(1, 0, 14, 16) is None

    def test_lower_epoch_is_fenced(self) -> None:
        manager = ProducerStateManager(4)
        replay(manager, 1, 5, metadata(0))
        with pytest.raises(InvalidProducerEpochError):
            ProducerAppendInfo(manager, T0).check(1, 4, 1, 1)
        with pytest.raises(InvalidProducerEpochError):
            ProducerAppendInfo(manager, T0).check(1, 4, 0, 0)  # even a would-be duplicate

    def test_higher_epoch_must_start_at_sequence_zero(self) -> None:
        manager = ProducerStateManager(4)
        replay(manager, 1, 5, metadata(0))
        with pytest.raises(OutOfOrderSequenceError):
            ProducerAppendInfo(manager, T0).check(1, 6, 1, 1)
        assert ProducerAppendInfo(manager, T0).check(1, 6, 0, 3) is None

    def test_higher_epoch_over_an_unknown_stored_epoch_accepts_any_sequence(self) -> None:
        manager = ProducerStateManager(4)
        manager.put(WorkingState(1, -1, [], T0))
        assert ProducerAppendInfo(manager, T0).check(1, 0, 42, 42) is None

    @pytest.mark.parametrize("sequence", [0, 1, 12345, MAX_SEQ])
    def test_unknown_producer_is_accepted_at_any_sequence(self, sequence: int) -> None:
        manager = filled({1: 3})
        assert ProducerAppendInfo(manager, T0).check(2, 0, sequence, sequence) is None

    def test_check_and_add_never_touch_the_table(self) -> None:
        manager, _ = self.five_batches_then_check()
        before = table_bytes(manager)
        info = ProducerAppendInfo(manager, T0)
        info.apply(1, 0, BatchMetadata(14, 14, 70, 70, T0 + 70), False)
        info.apply(2, 0, BatchMetadata(0, 0, 71, 71, T0 + 71), False)
        assert table_bytes(manager) == before
        assert manager.get(2) is None

    def test_batches_added_to_a_request_are_seen_by_later_checks_in_it(self) -> None:
        manager, _ = self.five_batches_then_check()
        info = ProducerAppendInfo(manager, T0)
        info.apply(1, 0, BatchMetadata(14, 15, 70, 71, T0 + 70), False)
        assert info.check(1, 0, 14, 15) == DuplicateBatch(70, 71, T0 + 70)
        assert info.check(1, 0, 16, 16) is None
        with pytest.raises(OutOfOrderSequenceError):
            info.check(1, 0, 14, 14)
        # The table still answers for the stored state alone.
        assert ProducerAppendInfo(manager, T0).check(1, 0, 14, 14) is None

    def test_an_epoch_bump_added_to_a_request_fences_the_old_epoch_in_it(self) -> None:
        manager, _ = self.five_batches_then_check()
        info = ProducerAppendInfo(manager, T0)
        info.apply(1, 1, BatchMetadata(0, 0, 70, 70, T0 + 70), False)
        with pytest.raises(InvalidProducerEpochError):
            info.check(1, 0, 14, 14)


class TestLoadRows:
    @pytest.mark.parametrize("count", [1, 4, 32, 33, 200])
    def test_a_few_rows_and_many_load_to_the_same_table_due_times_and_lookups(self, count: int) -> None:
        # Up to FEW_ROWS rows go row by row, more through numpy: one rule, two speeds.
        source = filled({pid: 1 + pid % 3 for pid in range(100, 100 + count)}, capacity=count)
        rows = source.live_rows().copy()
        rows["last_append_ms"][::3] = -1  # unknown (a Kafka snapshot): becomes the load's time
        rows["last_append_ms"][1::3] = T0 + 10**9  # past the load's clock: the same
        loaded = ProducerStateManager(count, expiration_ms=60_000)
        loaded.load_rows(rows, T0)
        appended = loaded.table["last_append_ms"][:count]
        assert list(appended[::3]) == [T0] * len(appended[::3])
        assert list(appended[1::3]) == [T0] * len(appended[1::3])
        assert list(loaded.due_s[:count]) == [(int(t) + 60_000) // 1000 for t in appended]
        assert all(loaded.table["live"][:count] == 1)
        for pid in range(100, 100 + count):
            assert loaded.get(pid) == source.get(pid)._replace(last_append_ms=loaded.get(pid).last_append_ms)

    @pytest.mark.parametrize("count", [3, 32, 33, 90])
    def test_a_few_rows_and_many_name_the_same_open_transactions_in_ring_order(self, count: int) -> None:
        rows = filled({pid: 1 for pid in range(500, 500 + count)}, capacity=count).live_rows().copy()
        rows["txn_first_offset"] = [pid * 10 if pid % 3 else -1 for pid in rows["producer_id"]]
        rows["last_append_ms"] = [T0 - 120_000 if pid % 4 == 1 else T0 for pid in rows["producer_id"]]
        loaded = ProducerStateManager(count, expiration_ms=60_000)
        loaded.load_rows(rows, T0)
        loaded.expire(T0, exhaustive=True)  # holes where idle producers without a transaction were
        live = loaded.live_rows()
        assert len(live) < count
        expected = {
            int(pid): int(first)
            for pid, first in zip(live["producer_id"], live["txn_first_offset"], strict=True)
            if first >= 0
        }
        assert expected and list(loaded.open_transactions().items()) == list(expected.items())

    @pytest.mark.parametrize("count", [4, 40])
    def test_an_expiration_too_long_to_add_leaves_every_due_time_at_the_last_second_not_at_zero(
        self, count: int
    ) -> None:
        rows = filled({pid: 1 for pid in range(count)}, capacity=count).live_rows().copy()
        loaded = ProducerStateManager(count, expiration_ms=2**63 - 1)  # "never", as a config may say
        loaded.load_rows(rows, T0)
        assert set(loaded.due_s[:count].tolist()) == {2**32 - 1}
        assert loaded.expire(T0 + 10**12, exhaustive=True) == 0


def test_retiring_a_producer_named_twice_counts_it_once() -> None:
    # The table's retire, below Log.retire_producers (which also names each once): a slot
    # deleted twice would leave the map's count and the ring's holes off by one each time.
    manager = filled({100: 1, 101: 1, 102: 1})
    assert manager.retire([100, 100, 101, 100]) == 2
    assert len(manager) == 1
    assert manager.get(102) is not None and manager.get(100) is None and manager.get(101) is None
