"""Producer expiry on the fixed-capacity ring (brief §6).

A producer expires when `now - last_append >= producer_expiration_ms` and it has
no open transaction, both times on the engine's clock (batch timestamps never
decide it); expiry pops from the head of the ring and gives a live entry a second
chance at the tail; a full ring of live producers refuses a new producer with the
retriable ProducerStateFullError and evicts nobody.

Every Log here gets an injected clock, which the tests move; batch timestamps are
mostly the clock's, and where they are not, the test says why.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from oncelog.config import LogConfig
from oncelog.errors import (
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerStateFullError,
    RetriableError,
)
from oncelog.log import Log
from oncelog.producer_state import ProducerStateEntry, ProducerStateManager, WorkingState
from oncelog.segments.batch import encode_batch

T0 = 1_700_000_000_000
EXP = 60_000  # producer_expiration_ms in these tests
A, B, C, D, E = 101, 202, 303, 404, 505


# -- helpers --------------------------------------------------------------------
class Clock:
    """A settable clock for Log.open(clock=...)."""

    def __init__(self, now: int = T0):
        self.now = now

    def __call__(self) -> int:
        return self.now


def batch(pid: int, seq: int, *, ts: int, epoch: int = 0, count: int = 1) -> bytes:
    return encode_batch(
        [(f"{pid}-{seq}-{i}".encode(), b"value") for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        timestamp_ms=ts,
    )


def config(**overrides: object) -> LogConfig:
    overrides.setdefault("producer_expiration_ms", EXP)
    return LogConfig(segment_index_bytes=4096, **overrides)  # type: ignore[arg-type]


def files_digest(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.suffix in (".log", ".index", ".timeindex", ".snapshot")
    }


def states(log: Log) -> dict[int, ProducerStateEntry]:
    return {entry.producer_id: entry for entry in log.producers()}


def working(pid: int, activity_ms: int, *, txn_first_offset: int = -1) -> WorkingState:
    return WorkingState(pid, 0, [], activity_ms, txn_first_offset=txn_first_offset)


def manager_with(activities: dict[int, int], capacity: int = 16) -> ProducerStateManager:
    """A table holding producers placed in this order with these last activities."""
    manager = ProducerStateManager(capacity, EXP)
    for pid, activity in activities.items():
        manager.put(working(pid, activity))
    return manager


def pids(manager: ProducerStateManager) -> list[int]:
    return [entry.producer_id for entry in manager.entries()]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topic-0"


@pytest.fixture
def log(log_dir: Path, clock: Clock) -> Iterator[Log]:
    opened = Log.open(log_dir, config(), clock=clock)
    yield opened
    opened.close()


# -- the expiry rule ------------------------------------------------------------------
class TestExpiryRule:
    def test_producers_past_the_expiration_expire_and_the_others_survive(self) -> None:
        manager = manager_with({A: T0, B: T0 + 10, C: T0 + 20})
        assert manager.expire(T0 + EXP + 10) == 2
        assert pids(manager) == [C]
        assert manager.get(A) is None
        assert manager.get(B) is None
        assert len(manager) == 1

    @pytest.mark.parametrize(("idle", "expires"), [(EXP - 1, False), (EXP, True), (EXP + 1, True)])
    def test_expiry_boundary_is_idle_at_least_the_expiration(self, idle: int, expires: bool) -> None:
        manager = manager_with({A: T0})
        assert manager.expire(T0 + idle) == int(expires)
        assert (manager.get(A) is None) == expires

    @pytest.mark.parametrize(("idle", "expires"), [(EXP - 1, False), (EXP, True)])
    def test_expiry_boundary_through_log_expire_producers(self, log: Log, idle: int, expires: bool) -> None:
        log.append(batch(A, 0, ts=T0))
        assert log.expire_producers(T0 + idle) == int(expires)
        assert (log.producer_state(A) is None) == expires

    def test_expire_producers_without_a_time_uses_the_log_clock(self, log: Log, clock: Clock) -> None:
        log.append(batch(A, 0, ts=T0))
        clock.now = T0 + EXP - 1
        assert log.expire_producers() == 0
        clock.now = T0 + EXP
        assert log.expire_producers() == 1
        assert log.producer_state(A) is None

    def test_a_live_producer_at_the_head_survives_and_expired_ones_behind_it_go_in_the_same_call(
        self,
    ) -> None:
        manager = manager_with({A: T0, B: T0, C: T0, D: T0 + 5_000})
        manager.put(working(A, T0 + EXP // 2))  # A was active since it was placed: due, but live
        assert manager.head_due_ms is not None
        assert manager.head_due_ms <= T0 + EXP
        assert manager.expire(T0 + EXP) == 2
        assert pids(manager) == [D, A]  # A moved to the tail (second chance)
        assert manager.get(A) == working(A, T0 + EXP // 2).entry()
        assert manager.expire(T0 + 5_000 + EXP - 1) == 0
        assert manager.expire(T0 + 5_000 + EXP) == 1  # D, once really idle
        assert manager.expire(T0 + EXP // 2 + EXP - 1) == 0
        assert manager.expire(T0 + EXP // 2 + EXP) == 1  # then A
        assert len(manager) == 0

    def test_a_second_chance_entry_expires_once_it_really_is_idle(self) -> None:
        manager = manager_with({A: T0})
        manager.put(working(A, T0 + 100))
        assert manager.expire(T0 + EXP) == 0  # second chance
        assert manager.expire(T0 + 100 + EXP - 1) == 0
        assert manager.expire(T0 + 100 + EXP) == 1

    @pytest.mark.parametrize("exhaustive", [False, True])
    def test_an_open_transaction_never_expires(self, exhaustive: bool) -> None:
        manager = manager_with({A: T0})
        manager.put(working(B, T0, txn_first_offset=42))
        manager.put(working(C, T0))
        for later in (EXP, 10 * EXP, 1000 * EXP):
            manager.expire(T0 + later, exhaustive=exhaustive)
            assert manager.get(B) is not None
        assert pids(manager) == [B]
        entry = manager.get(B)
        assert entry is not None
        assert entry.current_txn_first_offset == 42

    def test_an_open_transaction_survives_expiry_after_a_snapshot_load(self) -> None:
        manager = manager_with({A: T0})
        manager.put(working(B, T0, txn_first_offset=7))
        reloaded = ProducerStateManager(16, EXP)
        reloaded.load_rows(manager.live_rows())
        assert reloaded.expire(T0 + 5 * EXP, exhaustive=True) == 1
        assert pids(reloaded) == [B]

    def test_a_transaction_that_ends_lets_the_producer_expire(self) -> None:
        manager = ProducerStateManager(4, EXP)
        manager.put(working(A, T0, txn_first_offset=3))
        assert manager.expire(T0 + EXP) == 0
        manager.put(working(A, T0))  # committed: no open transaction, still idle since T0
        assert manager.expire(T0 + 2 * EXP) == 1
        assert len(manager) == 0


# -- cost -------------------------------------------------------------------------------
class TestExpiryCost:
    def test_expire_returns_how_many_it_removed(self) -> None:
        manager = manager_with({pid: T0 + pid for pid in range(10)})
        assert manager.expire(T0 + EXP + 3) == 4  # pids 0..3
        assert pids(manager) == list(range(4, 10))

    def test_a_call_with_nothing_due_examines_nothing(self) -> None:
        manager = manager_with({A: T0 + 5_000, B: T0 + 6_000, C: T0 + 7_000})
        manager.put(working(A, T0 + 30_000))  # A is live: examining it would move it to the tail
        due = manager.head_due_ms
        assert due is not None
        assert T0 + 5_000 + EXP - 1_000 < due <= T0 + 5_000 + EXP  # never later than the real due time
        head, used = manager.head, manager.used
        before = manager.live_rows().copy()
        assert manager.expire(due - 1) == 0
        assert (manager.head, manager.used, manager.head_due_ms) == (head, used, due)
        assert np.array_equal(manager.live_rows(), before)
        assert pids(manager) == [A, B, C]
        # Once the head is due it is examined: A gets its second chance.
        assert manager.expire(T0 + 5_000 + EXP) == 0
        assert pids(manager) == [B, C, A]

    def test_an_empty_table_has_no_due_head_and_expires_nothing(self) -> None:
        manager = ProducerStateManager(4, EXP)
        assert manager.head_due_ms is None
        assert manager.expire(T0 + 100 * EXP) == 0
        assert manager.expire(T0 + 100 * EXP, exhaustive=True) == 0

    def test_expiring_one_percent_pops_only_the_head_of_a_large_ring(self) -> None:
        count = 100_000
        manager = ProducerStateManager(count, EXP)
        rows = np.zeros(count, manager.table.dtype)
        rows["producer_id"] = np.arange(count) + 1_000_000
        rows["last_append_ms"] = T0 + np.arange(count)
        rows["txn_first_offset"] = -1
        manager.load_rows(rows)
        head = manager.head
        assert manager.expire(T0 + EXP + count // 100 - 1) == count // 100
        assert manager.used == count - count // 100
        assert manager.head == (head + count // 100) % count
        assert manager.get(1_000_000) is None
        assert manager.get(1_000_000 + count // 100) is not None
        # Nothing else is due: another call at the same time returns at once.
        assert manager.expire(T0 + EXP + count // 100 - 1) == 0
        assert manager.used == count - count // 100


# -- through Log: unknown again, the append path, LogAppendTime ----------------------------
class TestLogExpiry:
    def test_an_expired_producer_is_unknown_and_its_next_batch_is_accepted_at_any_sequence(
        self, log: Log, clock: Clock
    ) -> None:
        for seq in range(3):
            log.append(batch(A, seq, ts=T0))
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(A, 777, ts=T0))  # known: a gap is refused
        assert log.expire_producers(T0 + EXP) == 1
        assert log.producer_state(A) is None
        clock.now = T0 + EXP
        result = log.append(batch(A, 777, ts=T0 + EXP))
        assert (result.first_offset, result.duplicate) == (3, False)
        state = log.producer_state(A)
        assert state is not None
        assert (state.last_sequence, state.last_offset, len(state.batches)) == (777, 3, 1)
        log.append(batch(A, 778, ts=T0 + EXP))
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(A, 0, ts=T0 + EXP))  # known again: in sequence from 777

    def test_the_append_path_expires_due_producers_by_itself(self, log: Log, clock: Clock) -> None:
        log.append(batch(A, 0, ts=T0))
        clock.now = T0 + 10
        log.append(batch(B, 0, ts=T0 + 10))
        clock.now = T0 + EXP
        assert log.producer_state(A) is not None  # nothing expires in the background
        log.append(batch(C, 0, ts=T0 + EXP))
        assert log.producer_state(A) is None
        assert log.producer_state(B) is not None  # idle EXP - 10: not yet
        clock.now = T0 + EXP + 10
        log.append(batch(C, 1, ts=T0 + EXP + 10))
        assert log.producer_state(B) is None
        assert set(states(log)) == {C}

    def test_an_append_with_nothing_due_expires_nothing(self, log: Log, clock: Clock) -> None:
        log.append(batch(A, 0, ts=T0))
        clock.now = T0 + EXP - 1
        log.append(batch(B, 0, ts=T0 + EXP - 1))
        assert set(states(log)) == {A, B}

    def test_the_newest_batch_timestamp_is_kept_but_the_engine_clock_decides(
        self, log: Log, clock: Clock
    ) -> None:
        log.append(batch(A, 0, ts=T0 + 500))
        log.append(batch(A, 1, ts=T0 + 100))  # an older timestamp in a newer batch
        state = log.producer_state(A)
        assert state is not None
        assert (state.last_timestamp_ms, state.last_append_ms) == (T0 + 100, T0)
        assert log.expire_producers(T0 + EXP - 1) == 0
        assert log.expire_producers(T0 + EXP) == 1

    @pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
    @pytest.mark.parametrize("skew", [-10 * EXP, -2 * 365 * 24 * 3600 * 1000, 3 * EXP, 10**12])
    def test_a_client_clock_far_behind_or_ahead_neither_shortens_nor_extends_the_expiration(
        self, tmp_path: Path, clock: Clock, timestamp_type: str, skew: int
    ) -> None:
        with Log.open(tmp_path / "t-0", config(timestamp_type=timestamp_type), clock=clock) as log:
            log.append(batch(A, 0, ts=T0 + skew))
            clock.now = T0 + EXP - 1
            log.append(batch(B, 0, ts=T0 + EXP - 1 + skew))  # the append path checks the head
            assert log.expire_producers() == 0
            state = log.producer_state(A)
            assert state is not None and state.last_append_ms == T0
            with pytest.raises(OutOfOrderSequenceError):
                log.append(batch(A, 5, ts=T0 + skew))  # still known: a gap is refused
            clock.now = T0 + EXP
            assert log.expire_producers() == 1
            assert log.producer_state(A) is None
            assert log.producer_state(B) is not None

    def test_crash_recovery_counts_a_replayed_producer_as_appended_at_the_load(
        self, tmp_path: Path, clock: Clock
    ) -> None:
        # When the engine appended a batch in the tail is not stored anywhere: the load's
        # time is the latest it could have been, so recovery never expires it early.
        log = Log.open(tmp_path / "live", config(), clock=clock)
        log.append(batch(A, 0, ts=T0 - 10 * EXP))
        log.flush()
        shutil.copytree(tmp_path / "live", tmp_path / "copy")
        log.close()
        load = T0 + 5 * EXP
        with Log.open(tmp_path / "copy", config(), clock=Clock(load)) as recovered:
            assert not recovered.recovery_report.clean
            state = recovered.producer_state(A)
            assert state is not None
            assert (state.last_append_ms, state.last_timestamp_ms) == (load, T0 - 10 * EXP)
            assert recovered.expire_producers(load + EXP - 1) == 0
            assert recovered.expire_producers(load + EXP) == 1

    def test_producers_appended_together_expire_together_whatever_their_stamps(
        self, log: Log, clock: Clock
    ) -> None:
        # Client clocks differ: A stamps later than B, C stamps years ahead. The engine
        # appended all three at T0, so all three are due at T0 + EXP.
        log.append(batch(A, 0, ts=T0 + 1_000))
        log.append(batch(B, 0, ts=T0))
        log.append(batch(C, 0, ts=T0 + 10**12))
        assert log.expire_producers(T0 + EXP - 1) == 0
        assert log.expire_producers(T0 + EXP) == 3
        assert set(states(log)) == set()

    def test_expiry_never_runs_on_a_clock_that_went_back(self, tmp_path: Path, clock: Clock) -> None:
        with Log.open(tmp_path / "t-0", config(), clock=clock) as log:
            clock.now = T0 + EXP // 2
            log.append(batch(A, 0, ts=T0))
            clock.now = T0 - 3 * EXP  # NTP steps the wall clock back
            log.append(batch(B, 0, ts=T0 - 3 * EXP))
            b = log.producer_state(B)
            assert b is not None and b.last_append_ms == T0 + EXP // 2  # the largest time seen
            # An explicit earlier time is raised to the largest seen as well.
            assert log.expire_producers(T0 - 3 * EXP + EXP) == 0
            clock.now = T0 + EXP // 2 + EXP - 1
            assert log.expire_producers() == 0  # B was not appended "4 expirations ago"
            clock.now = T0 + EXP // 2 + EXP
            assert log.expire_producers() == 2


# -- persistence: snapshot round trip and crash recovery ---------------------------------------
def build(directory: Path, clock: Clock, conf: LogConfig) -> Log:
    """A deterministic history: producers placed over time, one active again, a roll."""
    log = Log.open(directory, conf, clock=clock)
    clock.now = T0
    log.append(batch(A, 0, ts=T0))
    clock.now = T0 + 1_000
    log.append(batch(B, 0, ts=T0 + 1_000, count=3))
    clock.now = T0 + 2_000
    log.append(batch(C, 0, ts=T0 + 2_000))
    log.roll()  # a snapshot at the roll: recovery starts from it
    clock.now = T0 + EXP // 2
    log.append(batch(A, 1, ts=T0 + EXP // 2))  # A active again: due at the head, but live
    log.append(batch(D, 0, ts=T0 + EXP // 2 + 10))
    log.append(batch(C, 1, ts=T0 + 2_000))  # C's client stamps an old time; the engine appends now
    clock.now = T0 + EXP // 2 + 20
    return log


def without_append_times(entries: dict[int, ProducerStateEntry]) -> dict[int, ProducerStateEntry]:
    return {pid: entry._replace(last_append_ms=0) for pid, entry in entries.items()}


@pytest.mark.parametrize("now", [T0 + EXP + 999, T0 + EXP + 1_000, T0 + 2 * EXP, T0 + EXP // 2 + 20])
def test_expiry_gives_the_same_result_open_and_after_a_snapshot_round_trip_and_never_less_after_a_crash(
    tmp_path: Path, now: int
) -> None:
    conf = config()
    # The log that stays open.
    clock = Clock()
    with build(tmp_path / "open", clock, conf) as log:
        clock.now = now
        log.expire_producers(now)
        expected = states(log)

    # Clean close, then reopen at `now`: the snapshot (append times included) is loaded,
    # then expiry runs.
    clock = Clock()
    build(tmp_path / "clean", clock, conf).close()
    with Log.open(tmp_path / "clean", conf, clock=Clock(now)) as reopened:
        assert reopened.recovery_report.clean
        assert reopened.recovery_report.snapshot_offset is not None
        assert states(reopened) == expected

    # Crash: copy the directory while the log is open (after a flush), reopen the copy.
    # The roll's snapshot holds A, B and C with their append times; the tail (A, D, C)
    # is replayed, and counts as appended at the load: those three are kept even where
    # the open log expired them, and expire one expiration after the load.
    clock = Clock()
    log = build(tmp_path / "live", clock, conf)
    log.flush()
    shutil.copytree(tmp_path / "live", tmp_path / "crashed")
    log.close()
    with Log.open(tmp_path / "crashed", conf, clock=Clock(now)) as recovered:
        assert not recovered.recovery_report.clean
        assert recovered.recovery_report.batches_replayed > 0
        got = states(recovered)
        assert set(got) == set(expected) | {A, C, D}
        assert without_append_times({p: got[p] for p in expected}) == without_append_times(expected)
        assert all(got[p].last_append_ms == now for p in (A, C, D))
        assert recovered.expire_producers(now + EXP) == len(got)

    survivors = {
        T0 + EXP + 999: {A, B, C, D},  # B appended at 1000, A, C and D at EXP / 2
        T0 + EXP + 1_000: {A, C, D},
        T0 + 2 * EXP: set(),
        T0 + EXP // 2 + 20: {A, B, C, D},
    }[now]
    assert set(expected) == survivors


def test_an_open_transaction_survives_close_and_reopen_far_in_the_future(tmp_path: Path) -> None:
    clock = Clock()
    log = Log.open(tmp_path / "t", config(), clock=clock)
    log.append(batch(A, 0, ts=T0))
    log.append(batch(B, 0, ts=T0))
    log._producers.put(working(B, T0, txn_first_offset=1))  # transactions are a later issue
    log.close()
    with Log.open(tmp_path / "t", config(), clock=Clock(T0 + 100 * EXP)) as reopened:
        assert set(states(reopened)) == {B}
        entry = reopened.producer_state(B)
        assert entry is not None
        assert entry.current_txn_first_offset == 1


# -- the full ring -----------------------------------------------------------------------------
class TestFullRing:
    def test_a_new_producer_in_a_full_ring_raises_and_changes_nothing(
        self, tmp_path: Path, clock: Clock
    ) -> None:
        directory = tmp_path / "full"
        with Log.open(directory, config(producer_capacity=3), clock=clock) as log:
            log.append(batch(A, 0, ts=T0))
            clock.now = T0 + 10
            log.append(batch(B, 0, ts=T0 + 10))
            clock.now = T0 + 20
            log.append(batch(C, 0, ts=T0 + 20))
            log.flush()
            before_files = files_digest(directory)
            before_states = list(log.producers())
            end = log.log_end_offset
            clock.now = T0 + EXP - 1
            with pytest.raises(ProducerStateFullError) as raised:
                log.append(batch(D, 0, ts=T0 + EXP - 1))
            assert isinstance(raised.value, RetriableError)
            assert log.log_end_offset == end
            assert files_digest(directory) == before_files
            assert list(log.producers()) == before_states

            # One producer passes the expiration: the retried append goes through.
            clock.now = T0 + EXP
            result = log.append(batch(D, 0, ts=T0 + EXP))
            assert result.first_offset == end
            assert set(states(log)) == {B, C, D}

    def test_a_request_with_two_new_producers_and_room_for_one_writes_nothing(
        self, tmp_path: Path, clock: Clock
    ) -> None:
        directory = tmp_path / "two"
        with Log.open(directory, config(producer_capacity=3), clock=clock) as log:
            log.append(batch(A, 0, ts=T0))
            log.append(batch(B, 0, ts=T0))
            before = files_digest(directory)
            with pytest.raises(ProducerStateFullError):
                log.append_batches([batch(C, 0, ts=T0), batch(D, 0, ts=T0)])
            assert files_digest(directory) == before
            assert set(states(log)) == {A, B}
            log.append_batches([batch(C, 0, ts=T0), batch(A, 1, ts=T0)])  # one new: fits
            assert set(states(log)) == {A, B, C}

    def test_expire_producers_frees_room_for_the_refused_producer(self, tmp_path: Path, clock: Clock) -> None:
        with Log.open(tmp_path / "x", config(producer_capacity=3), clock=clock) as log:
            for pid in (A, B, C):
                log.append(batch(pid, 0, ts=T0))
            with pytest.raises(ProducerStateFullError):
                log.append(batch(D, 0, ts=T0))
            assert log.expire_producers(T0 + EXP) == 3
            log.append(batch(D, 5, ts=T0))  # the clock is still T0: nothing else expires
            assert set(states(log)) == {D}

    def test_a_full_ring_of_live_producers_is_never_evicted(self, tmp_path: Path, clock: Clock) -> None:
        with Log.open(tmp_path / "live", config(producer_capacity=3), clock=clock) as log:
            for pid in (A, B, C):
                log.append(batch(pid, 0, ts=T0))
            # Each is active again just before its first due time, so every head is due
            # but live: second chances, never evictions.
            clock.now = T0 + EXP - 5
            for pid in (A, B, C):
                log.append(batch(pid, 1, ts=T0 + EXP - 5))
            kept = states(log)
            for now in (T0 + EXP, T0 + EXP + 100, T0 + 2 * EXP - 6):
                clock.now = now
                with pytest.raises(ProducerStateFullError):
                    log.append(batch(D, 0, ts=now))
                assert states(log) == kept
            assert log.expire_producers(T0 + 2 * EXP - 6, exhaustive=True) == 0
            assert states(log) == kept
            clock.now = T0 + 2 * EXP - 5
            log.append(batch(D, 0, ts=clock.now))  # now they are idle long enough
            assert set(states(log)) == {D}


# -- the ring wraps: a model check -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seed", "capacity", "skew"), [(4, 4, False), (5, 4, True), (6, 1, False), (7, 9, True), (8, 64, True)]
)
def test_ring_wraparound_matches_a_model_of_last_activities(seed: int, capacity: int, skew: bool) -> None:
    """ProducerStateManager alone: producers come, stay active or go idle; the ring wraps.

    With `skew`, append times are not in arrival order (rows loaded from a snapshot
    keep the ring order of their placement, not of their last appends), so a
    recorded due time at the head can be later than one behind it.
    """
    rng = random.Random(seed)
    manager = ProducerStateManager(capacity, EXP)
    model: dict[int, int] = {}  # pid -> last activity, producers not yet expired by a call
    now = T0
    next_pid = 0

    def activity() -> int:
        return now + rng.randint(-EXP, EXP // 4) if skew and rng.random() < 0.5 else now

    for _ in range(3000):
        now += rng.choice([0, 1, 100, EXP // 7, EXP // 3])
        op = rng.random()
        if op < 0.35:
            live = [p for p, t in model.items() if now - t < EXP]
            t = activity()
            if len(model) < capacity:
                manager.put(working(next_pid, t))
                model[next_pid] = t
            else:
                with pytest.raises(ProducerStateFullError):
                    manager.put(working(next_pid, t))
                assert len(live) <= capacity
            next_pid += 1
        elif op < 0.65 and model:
            pid = rng.choice(sorted(model))
            t = activity()
            manager.put(working(pid, t))
            model[pid] = t
        else:
            exhaustive = rng.random() < 0.3
            removed = manager.expire(now, exhaustive=exhaustive)
            idle = {p for p, t in model.items() if now - t >= EXP}
            present = {p for p in model if manager.get(p) is not None}
            gone = set(model) - present
            assert gone <= idle, "a live producer was expired"
            assert removed == len(gone)
            if exhaustive:
                assert gone == idle
            else:
                # Whatever idle producer is left waits behind a head that is not yet due.
                assert gone == idle or (manager.head_due_ms is not None and manager.head_due_ms > now)
            for p in gone:
                del model[p]
        # Holes left by a full pass still take ring slots until the head pops them.
        assert len(manager) == manager.used - manager.holes == len(model)
        assert set(pids(manager)) == set(model)
        for pid, last in model.items():
            entry = manager.get(pid)
            assert entry is not None
            assert entry.last_append_ms == last
    assert next_pid > 10 * capacity  # the ring wrapped many times
    # The snapshot path keeps the same producers in the same order.
    reloaded = ProducerStateManager(capacity, EXP)
    reloaded.load_rows(manager.live_rows().copy())
    assert list(reloaded.entries()) == list(manager.entries())


def test_log_ring_wraparound_matches_a_model(tmp_path: Path) -> None:
    """Through Log.append, capacity 4: a new producer is refused iff 4 producers are live."""
    rng = random.Random(44)
    capacity = 4
    clock = Clock()
    model: dict[int, tuple[int, int]] = {}  # pid -> (last activity, next sequence)
    next_pid = 1
    conf = config(producer_capacity=capacity)
    log = Log.open(tmp_path / "ring", conf, clock=clock)
    try:
        for step in range(400):
            clock.now += rng.choice([0, 7, EXP // 5, EXP // 2])
            now = clock.now
            live = {p for p, (t, _) in model.items() if now - t < EXP}
            for p in set(model) - live:
                del model[p]  # idle producers never come back here (they lease new pids)
            if rng.random() < 0.5 or not live:
                pid = next_pid
                next_pid += 1
                if len(live) < capacity:
                    log.append(batch(pid, 0, ts=now))
                    model[pid] = (now, 1)
                else:
                    with pytest.raises(ProducerStateFullError):
                        log.append(batch(pid, 0, ts=now))
            else:
                pid = rng.choice(sorted(live))
                seq = model[pid][1]
                log.append(batch(pid, seq, ts=now))
                model[pid] = (now, seq + 1)
            for pid, (activity, seq) in model.items():
                state = log.producer_state(pid)
                assert state is not None, pid
                assert (state.last_append_ms, state.last_sequence) == (activity, seq - 1)
            assert set(model) <= set(states(log))
            log.expire_producers(now, exhaustive=True)
            assert set(states(log)) == set(model)
            if step % 40 == 39:
                # A clean close and reopen at the same time keeps exactly these producers.
                before = states(log)
                log.close()
                log = Log.open(tmp_path / "ring", conf, clock=clock)
                assert states(log) == before
    finally:
        log.close()
    assert next_pid > 10 * capacity


def test_a_log_whose_producers_came_and_went_through_a_small_ring_recovers_from_a_crash(
    tmp_path: Path,
) -> None:
    """More producers over the log's life than the ring holds; recovery replays them all."""
    capacity = 3
    clock = Clock()
    conf = config(producer_capacity=capacity)
    live_dir, crashed = tmp_path / "live", tmp_path / "crashed"
    log = Log.open(live_dir, conf, clock=clock)
    for generation in range(3):
        clock.now = T0 + generation * 2 * EXP
        for n in range(capacity):
            pid = 1000 * generation + n
            log.append(batch(pid, 0, ts=clock.now))
    expected = states(log)
    assert set(expected) == {2000, 2001, 2002}
    log.flush()
    shutil.copytree(live_dir, crashed)
    log.close()
    with Log.open(crashed, conf, clock=Clock(clock.now)) as recovered:
        assert not recovered.recovery_report.clean
        # All nine are replayed and count as appended at the load; the table holds three,
        # so the six least recently appended are shed: those the open log had expired.
        assert recovered.recovery_report.producers_shed == 6
        assert without_append_times(states(recovered)) == without_append_times(expected)


# -- the clock matters ----------------------------------------------------------------------------
def test_on_the_wall_clock_a_producer_stamping_2023_is_kept_and_deduplicated(tmp_path: Path) -> None:
    with Log.open(tmp_path / "wall", config()) as log:
        first = log.append(batch(A, 0, ts=T0))
        assert log.expire_producers(exhaustive=True) == 0
        retry = log.append(batch(A, 0, ts=T0))
        assert (retry.duplicate, retry.first_offset) == (True, first.first_offset)


class TestRetire:
    """Log.retire_producers: a writer that knows producers are finished frees their slots."""

    def test_retired_producers_leave_now_and_their_slots_serve_new_ones(self, tmp_path: Path) -> None:
        config = LogConfig(producer_capacity=4, producer_expiration_ms=10**13)
        with Log.open(tmp_path / "t-0", config, clock=lambda: 1_700_000_000_000) as log:
            for round_ in range(10):  # 30 producers through a table of 4
                pids = [100 + 3 * round_ + i for i in range(3)]
                for pid in pids:
                    log.append(
                        encode_batch([(b"k", b"v")], producer_id=pid, producer_epoch=0, base_sequence=0)
                    )
                assert log.retire_producers(pids) == 3
                assert all(log.producer_state(pid) is None for pid in pids)
            txn = encode_batch(
                [(b"k", b"v")], producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True
            )
            log.append(txn)
            assert log.retire_producers([7, 999]) == 0  # an open transaction stays; unknown is ignored
            assert log.producer_state(7) is not None
        with Log.open(tmp_path / "t-0", config) as log:
            assert [entry.producer_id for entry in log.producers()] == [7]  # the snapshot agrees


# -- found by a red team: recovery, shedding and retirement ------------------------------------
def crash_copy(log: Log, source: Path, target: Path) -> Path:
    log.flush()
    shutil.copytree(source, target)
    return target


def test_recovery_sheds_an_idle_producer_before_one_whose_last_append_was_a_marker(tmp_path: Path) -> None:
    clock = Clock(1_000_000)
    conf = LogConfig(producer_capacity=2, producer_expiration_ms=1000)
    log = Log.open(tmp_path / "live", conf, clock=clock)
    txn = encode_batch(
        [(b"k", b"t")], producer_id=A, producer_epoch=5, base_sequence=0, is_transactional=True
    )
    log.append(txn)
    clock.now += 10
    log.append(batch(B, 0, ts=clock.now))  # B goes idle from here
    clock.now = 1_002_000
    log.write_txn_marker(A, 5, commit=True, coordinator_epoch=0)  # A's last append: a marker
    assert set(states(log)) == {A}  # B expired at the marker, as at any append
    clock.now += 1
    log.append(batch(C, 0, ts=clock.now))
    copy = crash_copy(log, tmp_path / "live", tmp_path / "copy")
    log.close()
    clock.now += 1
    with Log.open(copy, conf, clock=clock) as recovered:
        assert recovered.recovery_report.producers_shed == 1
        assert set(states(recovered)) == {A, C}  # B (idle, already expired) went
        with pytest.raises(InvalidProducerEpochError):
            recovered.append(encode_batch([(b"k", b"z")], producer_id=A, producer_epoch=4, base_sequence=1))


def test_retired_producers_stay_retired_through_a_crash_and_leave_the_slots_to_live_ones(
    tmp_path: Path, clock: Clock
) -> None:
    conf = config(producer_capacity=4)
    log = Log.open(tmp_path / "live", conf, clock=clock)
    sent = [log.append(batch(A, seq, ts=T0)) for seq in range(5)]
    log.roll()
    for pid in range(1000, 1006):  # finished writers (Spark task attempts), retired at commit
        log.append(batch(pid, 0, ts=T0))
        assert log.retire_producers([pid]) == 1
    log.append(batch(B, 0, ts=T0))
    copy = crash_copy(log, tmp_path / "live", tmp_path / "copy")
    log.close()
    with Log.open(copy, conf, clock=clock) as recovered:
        assert recovered.recovery_report.producers_shed == 0
        assert set(states(recovered)) == {A, B}
        retry = recovered.append(batch(A, 4, ts=T0))
        assert (retry.duplicate, retry.first_offset) == (True, sent[4].first_offset)
    with Log.open(copy, conf, clock=clock) as again:  # the records of retirement were cleared
        assert set(states(again)) == {A, B}


def txn_batch(pid: int, seq: int) -> bytes:
    return encode_batch(
        [(b"k", b"t")],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        is_transactional=True,
        timestamp_ms=T0,
    )


@pytest.mark.parametrize("reload", ["unclean open", "truncation"])
def test_a_producer_retired_after_its_commit_does_not_come_back_with_its_transaction_open(
    tmp_path: Path, clock: Clock, reload: str
) -> None:
    """A snapshot taken while the transaction was open, then its COMMIT, then the retirement:
    a reload from that snapshot must close the transaction with the marker (below the
    retirement) and forget the producer again, not keep it open and pin the stable offset."""
    conf = config(producer_capacity=2)
    log = Log.open(tmp_path / "live", conf, clock=clock)
    log.append(txn_batch(A, 0))  # 0
    log.roll()  # the snapshot at 1 holds A's transaction open
    log.write_txn_marker(A, 0, commit=True, coordinator_epoch=0)  # 1
    assert log.retire_producers([A]) == 1
    log.append(txn_batch(B, 0))  # 2
    log.append(txn_batch(C, 0))  # 3: two open transactions fill the table
    if reload == "truncation":
        log.truncate_to(3)  # reloads from the snapshot at 1
        assert log.open_transactions() == {B: 2}
        assert log.last_stable_offset == 2
        log.write_txn_marker(B, 0, commit=True, coordinator_epoch=0)
        assert log.last_stable_offset == log.log_end_offset
        log.close()
        return
    copy = crash_copy(log, tmp_path / "live", tmp_path / "copy")
    log.close()
    with Log.open(copy, conf, clock=clock) as recovered:  # three producers once named, two slots
        assert recovered.open_transactions() == {B: 2, C: 3}
        assert set(states(recovered)) == {B, C}
        assert recovered.recovery_report.producers_shed == 0
        fetched = recovered.read(1, isolation="read_committed")
        assert fetched.next_offset == 2  # A's transaction is stable; B's is not


def test_a_producer_retired_then_back_past_its_retirement_keeps_its_state_through_a_crash(
    tmp_path: Path, clock: Clock
) -> None:
    conf = config()
    log = Log.open(tmp_path / "live", conf, clock=clock)
    log.append(txn_batch(A, 0))
    log.roll()
    log.write_txn_marker(A, 0, commit=True, coordinator_epoch=0)
    assert log.retire_producers([A]) == 1
    sent = log.append(batch(A, 1, ts=T0))  # back after all: the engine holds it again
    copy = crash_copy(log, tmp_path / "live", tmp_path / "copy")
    log.close()
    with Log.open(copy, conf, clock=clock) as recovered:
        assert recovered.open_transactions() == {}
        retry = recovered.append(batch(A, 1, ts=T0))  # its window came back with it
        assert (retry.duplicate, retry.first_offset) == (True, sent.first_offset)


def test_a_marker_for_a_producer_the_table_forgot_expires_the_due_ones_to_make_room(
    tmp_path: Path, clock: Clock
) -> None:
    log = Log.open(tmp_path / "live", config(producer_capacity=2, producer_expiration_ms=1000), clock=clock)
    for pid in (A, B):
        log.append(batch(pid, 0, ts=clock.now))
    clock.now += 10_000  # both expired
    marker = log.write_txn_marker(C, 0, commit=False, coordinator_epoch=0)  # as an append would, it fits
    assert marker.first_offset == 2 and set(states(log)) == {C}
    log.close()


def test_a_producer_that_expired_and_restarted_in_its_epoch_does_not_get_its_old_batches_back(
    tmp_path: Path, clock: Clock
) -> None:
    log = Log.open(tmp_path / "live", config(), clock=clock)
    log.append(batch(A, 0, ts=T0))
    log.append(batch(A, 1, ts=T0))
    clock.now = T0 + EXP
    assert log.expire_producers() == 1
    log.append(batch(A, 0, ts=clock.now))  # unknown again: a new start at sequence 0
    copy = crash_copy(log, tmp_path / "live", tmp_path / "copy")
    log.close()
    with Log.open(copy, config(), clock=clock) as recovered:
        state = recovered.producer_state(A)
        assert state is not None and [b.first_offset for b in state.batches] == [2]
        # Its next batch is new data, not a duplicate of the old sequence 1 at offset 1.
        result = recovered.append(batch(A, 1, ts=clock.now))
        assert (result.duplicate, result.first_offset) == (False, 3)


def test_a_snapshot_holding_more_producers_than_the_capacity_opens_and_sheds_the_least_recent(
    tmp_path: Path,
) -> None:
    clock = Clock()
    with Log.open(tmp_path / "t-0", config(producer_capacity=20), clock=clock) as log:
        for pid in range(20):
            clock.now = T0 + pid
            log.append(batch(1000 + pid, 0, ts=clock.now))
    with Log.open(tmp_path / "t-0", config(producer_capacity=10), clock=clock) as smaller:
        assert smaller.recovery_report.producers_shed == 10
        assert set(states(smaller)) == {1000 + pid for pid in range(10, 20)}  # the most recent


def test_a_clock_returning_float_milliseconds_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="integer milliseconds"):
        Log.open(tmp_path / "t-0", config(), clock=lambda: time.time() * 1000)
    with Log.open(tmp_path / "t-0", config(), clock=lambda: np.int64(T0)) as log:  # numpy ints are ints
        log.append(batch(A, 0, ts=T0))
        assert states(log)[A].last_append_ms == T0


def test_an_explicit_expiry_time_ahead_of_the_clock_does_not_hold_back_the_full_pass() -> None:
    manager = ProducerStateManager(16, EXP, full_pass_interval_ms=10 * EXP)
    manager.expire(T0 + 10**9)  # a what-if an age ahead: recorded as the last full pass
    manager.put(working(C, T0 + 5 * EXP))  # the head, due late
    manager.put(working(D, T0))  # idle behind it: only a full pass finds it
    assert manager.expire(T0 + EXP) == 1  # at the real time, a full pass runs again
    assert pids(manager) == [C]
