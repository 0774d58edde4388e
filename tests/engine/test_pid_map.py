"""PidSlotMap: the numpy open-addressing pid -> slot table (engine/pid_map.py, issue 4).

Every operation is checked against a plain dict. Small capacities make probe runs
reach the end of the bucket array and wrap to bucket 0, which is where a backward
shift delete is easiest to get wrong; keys are chosen by their home bucket so those
runs are sure to form.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from oncelog import compiled_append, compiled_module, pid_map
from oncelog.pid_map import EMPTY, PidSlotMap

MAX_PID = 2**63 - 1


# -- helpers ----------------------------------------------------------------------
def pids_homed_near_the_end(table: PidSlotMap, count: int, *, last: int = 2) -> list[int]:
    """`count` pids whose home is one of the last `last` buckets, so their run wraps."""
    found: list[int] = []
    pid = 0
    while len(found) < count:
        if table._home(pid) >= table.buckets - last:
            found.append(pid)
        pid += 1
    return found


def probe_invariant_holds(table: PidSlotMap) -> bool:
    """Linear probing's invariant: no free bucket lies between a key's home and the key."""
    keys = table.keys
    for bucket in range(table.buckets):
        stored = int(keys[bucket])
        if stored >= 0:  # free, or a marker left by a delete (live keys are stored as ~pid)
            continue
        i = table._home(~stored)
        while i != bucket:
            if keys[i] == EMPTY:
                return False
            i = (i + 1) % table.buckets
    return True


def check_against(table: PidSlotMap, model: dict[int, int], absent: list[int]) -> None:
    assert len(table) == len(model)
    for pid, slot in model.items():
        assert table.get(pid) == slot, pid
    for pid in absent:
        if pid not in model:
            assert table.get(pid) is None, pid
    assert int(np.count_nonzero(table.keys < 0)) == len(model)  # live keys are stored as ~pid < 0
    assert not np.any(table.keys[table.buckets :]), "a key past the range in use"
    assert probe_invariant_holds(table)


# -- single operations ---------------------------------------------------------------
class TestBasics:
    def test_an_empty_map_finds_nothing_and_has_length_zero(self) -> None:
        table = PidSlotMap(10)
        assert len(table) == 0
        assert table.get(0) is None
        assert table.get(MAX_PID) is None

    def test_put_then_get_returns_the_slot_and_put_again_overwrites_it(self) -> None:
        table = PidSlotMap(10)
        table.put(MAX_PID, 3)
        table.put(0, 4)
        assert (table.get(MAX_PID), table.get(0), len(table)) == (3, 4, 2)
        table.put(MAX_PID, 9)
        assert (table.get(MAX_PID), len(table)) == (9, 2)

    def test_load_refuses_a_duplicate_pid(self) -> None:
        table = PidSlotMap(4)
        with pytest.raises(ValueError):
            table.load(np.array([5, 9, 5], dtype=np.int64), np.array([0, 1, 2], dtype=np.int32))

    def test_get_returns_a_plain_int(self) -> None:
        table = PidSlotMap(4)
        table.put(5, 2)
        assert type(table.get(5)) is int

    def test_deleting_an_absent_pid_changes_nothing(self) -> None:
        table = PidSlotMap(4)
        table.put(1, 1)
        before = table.keys.copy()
        table.delete(2)
        assert len(table) == 1
        assert np.array_equal(table.keys, before)

    def test_the_map_holds_its_full_capacity(self) -> None:
        capacity = 100
        table = PidSlotMap(capacity)
        for pid in range(capacity):
            table.put(pid * 7919, pid)
        assert len(table) == capacity
        assert all(table.get(pid * 7919) == pid for pid in range(capacity))

    def test_clear_forgets_everything(self) -> None:
        table = PidSlotMap(8)
        for pid in range(8):
            table.put(pid, pid)
        table.clear()
        assert len(table) == 0
        assert all(table.get(pid) is None for pid in range(8))


# -- backward shift across the wraparound ----------------------------------------------
class TestBackwardShiftWraparound:
    def test_keys_homed_at_the_end_wrap_to_bucket_zero(self) -> None:
        table = PidSlotMap(6)
        pids = pids_homed_near_the_end(table, 5, last=1)
        for slot, pid in enumerate(pids):
            table.put(pid, slot)
        # Five keys homed at the last bucket: one there, four wrapped to 0..3.
        assert ~int(table.keys[table.buckets - 1]) == pids[0]
        assert [~int(k) for k in table.keys[:4]] == pids[1:]

    @pytest.mark.parametrize("victim", range(5))
    def test_delete_any_key_of_a_wrapped_run_keeps_the_others_reachable(self, victim: int) -> None:
        table = PidSlotMap(6)
        pids = pids_homed_near_the_end(table, 5)
        model = {}
        for slot, pid in enumerate(pids):
            table.put(pid, slot)
            model[pid] = slot
        table.delete(pids[victim])
        del model[pids[victim]]
        check_against(table, model, [pids[victim]])

    def test_deleting_a_wrapped_run_key_by_key_in_every_order(self) -> None:
        rng = random.Random(7)
        probe = PidSlotMap(6)
        pids = pids_homed_near_the_end(probe, 6, last=3)
        for _ in range(60):
            table = PidSlotMap(6)
            model = {}
            for slot, pid in enumerate(pids):
                table.put(pid, slot)
                model[pid] = slot
            order = pids[:]
            rng.shuffle(order)
            for pid in order:
                table.delete(pid)
                del model[pid]
                check_against(table, model, pids)
            assert len(table) == 0

    def test_deleting_the_head_of_a_wrapped_run_keeps_wrapped_and_displaced_keys_reachable(self) -> None:
        table = PidSlotMap(6)
        at_end = pids_homed_near_the_end(table, 2, last=1)  # home: the last bucket
        at_zero = next(p for p in range(10**6) if table._home(p) == 0 and p not in at_end)
        table.put(at_end[0], 0)  # the last bucket
        table.put(at_end[1], 1)  # wraps to bucket 0
        table.put(at_zero, 2)  # its home 0 is taken: bucket 1
        assert ~int(table.keys[0]) == at_end[1]
        assert ~int(table.keys[1]) == at_zero
        table.delete(at_end[0])
        assert (table.get(at_end[0]), table.get(at_end[1]), table.get(at_zero), len(table)) == (None, 1, 2, 2)
        table.delete(at_end[1])
        assert (table.get(at_end[1]), table.get(at_zero), len(table)) == (None, 2, 1)
        table.put(at_end[0], 3)  # re-inserted after deletes: found, not duplicated
        assert (table.get(at_end[0]), table.get(at_zero), len(table)) == (3, 2, 2)
        check_against(table, {at_end[0]: 3, at_zero: 2}, at_end)

    def test_put_delete_churn_on_a_wrapping_cluster_never_loses_a_key(self) -> None:
        # Many more deletes than buckets: whatever a delete leaves behind (a shift or
        # a tombstone and a rebuild), lookups stay right and the table never fills.
        table = PidSlotMap(6)
        pids = pids_homed_near_the_end(table, 12, last=2)
        rng = random.Random(11)
        model: dict[int, int] = {}
        for step in range(2000):
            pid = rng.choice(pids)
            if pid in model:
                table.delete(pid)
                del model[pid]
            elif len(model) < 6:
                slot = step % 6
                table.put(pid, slot)
                model[pid] = slot
            assert table.get(pid) == model.get(pid)
            assert len(table) == len(model)
        check_against(table, model, pids)


# -- random operation sequences against a dict --------------------------------------------
pid_strategy = st.one_of(
    st.integers(min_value=0, max_value=40),  # small sequential pids (the common case)
    st.integers(min_value=0, max_value=MAX_PID),
    st.sampled_from([MAX_PID, MAX_PID - 1, 2**32, 2**31 - 1]),
)


class PidMapMachine(RuleBasedStateMachine):
    CAPACITY = 12
    FIRST_BUCKETS = pid_map.FIRST_BUCKETS  # above the capacity's buckets: one fixed range

    def __init__(self) -> None:
        super().__init__()
        self.table = PidSlotMap(self.CAPACITY, first_buckets=self.FIRST_BUCKETS)
        self.model: dict[int, int] = {}
        self.seen: set[int] = set()
        # Keys homed at the end of the array, so runs wrap often.
        self.wrapping = pids_homed_near_the_end(self.table, 8, last=2)

    def _pid(self, data: st.DataObject) -> int:
        return data.draw(st.one_of(pid_strategy, st.sampled_from(self.wrapping)))

    @precondition(lambda self: len(self.model) < self.CAPACITY)
    @rule(data=st.data(), slot=st.integers(min_value=0, max_value=CAPACITY - 1))
    def put_new_or_existing(self, data: st.DataObject, slot: int) -> None:
        pid = self._pid(data)
        self.table.put(pid, slot)
        self.model[pid] = slot
        self.seen.add(pid)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), slot=st.integers(min_value=0, max_value=CAPACITY - 1))
    def overwrite(self, data: st.DataObject, slot: int) -> None:
        pid = data.draw(st.sampled_from(sorted(self.model)))
        self.table.put(pid, slot)
        self.model[pid] = slot

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def delete_present(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(sorted(self.model)))
        self.table.delete(pid)
        del self.model[pid]

    @rule(data=st.data())
    def delete_maybe_absent(self, data: st.DataObject) -> None:
        pid = self._pid(data)
        self.table.delete(pid)
        self.model.pop(pid, None)
        self.seen.add(pid)

    @rule(data=st.data())
    def get(self, data: st.DataObject) -> None:
        pid = self._pid(data)
        assert self.table.get(pid) == self.model.get(pid)

    @rule()
    def reload_in_bulk(self) -> None:
        pids = np.array(list(self.model), dtype=np.int64)
        slots = np.array(list(self.model.values()), dtype=np.int32)
        self.table.load(pids, slots)

    @invariant()
    def matches_the_dict(self) -> None:
        check_against(self.table, self.model, sorted(self.seen | set(self.wrapping)))


TestPidMapMachine = PidMapMachine.TestCase
TestPidMapMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class GrowingPidMapMachine(PidMapMachine):
    """The same operations on a map whose range in use starts at 2 buckets: it grows
    (2, 8, then all 17) as keys arrive and moves back on bulk loads of fewer."""

    FIRST_BUCKETS = 2


TestGrowingPidMapMachine = GrowingPidMapMachine.TestCase
TestGrowingPidMapMachine.settings = TestPidMapMachine.settings


@pytest.mark.parametrize("seed", range(5))
def test_random_op_sequences_match_a_dict(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([3, 5, 16, 64])
    table = PidSlotMap(capacity, first_buckets=rng.choice([1, 4, pid_map.FIRST_BUCKETS]))
    model: dict[int, int] = {}
    universe = [rng.randrange(MAX_PID + 1) for _ in range(capacity)] + list(range(capacity))
    universe += pids_homed_near_the_end(table, capacity, last=2)
    for _ in range(3000):
        pid = rng.choice(universe)
        op = rng.random()
        if op < 0.45 and (pid in model or len(model) < capacity):
            slot = rng.randrange(capacity)  # slots are table rows, 0 .. capacity - 1
            table.put(pid, slot)
            model[pid] = slot
        elif op < 0.8:
            table.delete(pid)
            model.pop(pid, None)
        else:
            assert table.get(pid) == model.get(pid)
        assert len(table) == len(model)
    check_against(table, model, universe)


# -- the range in use ---------------------------------------------------------------------
class TestRangeInUse:
    def test_a_few_producers_of_a_large_map_stay_in_its_first_page_of_keys(self) -> None:
        table = PidSlotMap(100_000)
        pids = [1000, 1001, 1002, 1003, MAX_PID, 2**40 + 7]
        for slot, pid in enumerate(pids):
            table.put(pid, slot)
        assert table.buckets == pid_map.FIRST_BUCKETS < table.max_buckets
        assert int(np.flatnonzero(table.keys).max()) < pid_map.FIRST_BUCKETS
        assert int(np.flatnonzero(table.values).max()) < pid_map.FIRST_BUCKETS
        check_against(table, {pid: slot for slot, pid in enumerate(pids)}, [0, 1, 999])

    def test_the_range_grows_as_keys_arrive_and_a_bulk_load_of_fewer_moves_it_back(self) -> None:
        table = PidSlotMap(3000, first_buckets=16)
        rng = random.Random(7)
        pids = rng.sample(range(MAX_PID), 2500)
        ranges = set()
        for slot, pid in enumerate(pids):
            table.put(pid, slot)
            ranges.add(table.buckets)
        assert sorted(ranges) == [16, 65, 261, 1045, 4001]  # x4 + 1 each step, then the arrays' whole length
        model = {pid: slot for slot, pid in enumerate(pids)}
        check_against(table, model, [0, 1, 2])
        kept = dict(list(model.items())[:40])
        table.load(np.array(list(kept), dtype=np.int64), np.array(list(kept.values()), dtype=np.int32))
        assert table.buckets == 65
        check_against(table, kept, pids[40:200])

    @pytest.mark.parametrize("shift", [0, 20, 34, 38, 44, 56])
    def test_ids_that_differ_only_in_their_high_bits_spread_over_the_range(self, shift: int) -> None:
        # A range of a power of two would keep only the hash's low bits: ids i << 38 would
        # share a few home buckets and probe runs hundreds long.
        for first_buckets in (pid_map.FIRST_BUCKETS, 4 * pid_map.FIRST_BUCKETS + 1):
            table = PidSlotMap(100_000, first_buckets=first_buckets)
            ids = np.arange(1, int(table.buckets * 0.75) + 1, dtype=np.int64) << shift
            ids = np.unique(ids[ids > 0])  # (shifted past the sign bit: not producer ids, or repeats)
            homes = table._homes(ids)
            assert len(np.unique(homes)) >= 0.3 * len(ids), (shift, first_buckets)  # (random: about 0.7)

    def test_deletes_then_puts_rebuild_within_the_range_and_lose_nothing(self) -> None:
        table = PidSlotMap(1000, first_buckets=32)
        model: dict[int, int] = {}
        for round_ in range(50):  # 20 live keys churned through: tombstones force rebuilds
            for n in range(20):
                pid = round_ * 20 + n
                table.put(pid, n)
                model[pid] = n
            for n in range(20):
                pid = round_ * 20 + n
                if round_ < 49:
                    table.delete(pid)
                    del model[pid]
        assert table.buckets == 32
        check_against(table, model, list(range(0, 980, 7)))


# -- bulk load ----------------------------------------------------------------------------
@pytest.fixture(params=["compiled", "vectorised"])
def bulk_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each bulk test runs on both paths: one pass in C (load, delete_slots), and numpy's."""
    if request.param == "compiled":
        if compiled_module.compiled is None:
            pytest.skip("oncelog._append is not built (tests/engine/test_compiled_append.py says why)")
        monkeypatch.setattr(pid_map, "compiled_load", compiled_module.compiled.load_pid_map)
        monkeypatch.setattr(pid_map, "compiled_delete", compiled_module.compiled.delete_pid_slots)
    else:
        monkeypatch.setattr(pid_map, "compiled_load", None)
        monkeypatch.setattr(pid_map, "compiled_delete", None)
    return str(request.param)


@pytest.mark.usefixtures("bulk_path")
@pytest.mark.parametrize("seed", range(8))
def test_deleting_a_random_run_of_slots_leaves_exactly_the_others(seed: int) -> None:
    rng = random.Random(seed)
    count = rng.choice([40, 700, 5000])
    pids = rng.sample(range(MAX_PID), count)
    table = PidSlotMap(count)
    table.load(np.array(pids, dtype=np.int64), np.arange(count, dtype=np.int32))
    gone = sorted(rng.sample(range(count), rng.randrange(count)))
    table.delete_slots(np.array(gone, dtype=np.int64))
    model = {pid: slot for slot, pid in enumerate(pids) if slot not in set(gone)}
    check_against(table, model, [pids[slot] for slot in gone[:50]])
    assert table.tombstones == len(gone)
    for slot in gone[:20]:  # a deleted producer comes back through put
        table.put(pids[slot], slot)
        model[pids[slot]] = slot
    check_against(table, model, [])


@pytest.mark.usefixtures("bulk_path")
def test_deleting_a_slot_that_holds_no_producer_is_refused_and_deletes_nothing() -> None:
    table = PidSlotMap(100)
    pids = list(range(1000, 1060))
    table.load(np.array(pids, dtype=np.int64), np.arange(60, dtype=np.int32))
    table.delete_slots(np.array([3], dtype=np.int64))
    with pytest.raises(AssertionError, match="no producer"):
        table.delete_slots(np.array([1, 2, 3, 4], dtype=np.int64))  # slot 3 was deleted already
    model = {pid: slot for slot, pid in enumerate(pids) if slot != 3}
    check_against(table, model, [1003])


@pytest.mark.usefixtures("bulk_path")
def test_a_bulk_load_refused_for_a_repeated_id_leaves_no_key_behind() -> None:
    # The rounds place keys before they find the repeat: every one of them must go, or a
    # later put finds a stale key and reuses a slot nothing else knows is taken.
    table = PidSlotMap(2000, first_buckets=16)
    pids = np.arange(100, 160, dtype=np.int64)
    pids[-1] = pids[0]
    with pytest.raises(pid_map.DuplicateProducerError):
        table.load(pids, np.arange(len(pids), dtype=np.int32))
    assert len(table) == 0 and not np.any(table.keys)
    model = {int(pid): n for n, pid in enumerate(pids[:-1])}
    for pid, slot in model.items():
        table.put(pid, slot)
    check_against(table, model, [0, 99, 160])


@pytest.mark.usefixtures("bulk_path")
class TestBulkLoad:
    @given(
        pids=st.sets(st.integers(min_value=0, max_value=MAX_PID), max_size=60),
        absent=st.lists(st.integers(min_value=0, max_value=MAX_PID), max_size=20),
        extra=st.integers(min_value=0, max_value=20),
    )
    @settings(max_examples=200, deadline=None)
    def test_load_then_get_finds_every_key_and_no_absent_one(
        self, pids: set[int], absent: list[int], extra: int
    ) -> None:
        table = PidSlotMap(len(pids) + extra)
        ordered = sorted(pids)
        slots = np.arange(len(ordered), dtype=np.int32)[::-1].copy()
        table.load(np.array(ordered, dtype=np.int64), slots)
        model = {pid: int(slot) for pid, slot in zip(ordered, slots, strict=True)}
        check_against(table, model, absent)

    def test_load_replaces_previous_contents(self) -> None:
        table = PidSlotMap(10)
        for pid in range(10):
            table.put(pid, pid)
        table.load(np.array([100, 200], dtype=np.int64), np.array([7, 8], dtype=np.int32))
        check_against(table, {100: 7, 200: 8}, list(range(10)))

    def test_load_of_nothing_empties_the_map(self) -> None:
        table = PidSlotMap(4)
        table.put(3, 3)
        table.load(np.array([], dtype=np.int64), np.array([], dtype=np.int32))
        assert len(table) == 0
        assert table.get(3) is None

    @pytest.mark.parametrize("one_put_at_a_time", [True, False])
    def test_load_of_a_full_wrapping_cluster_then_delete_every_key(
        self, one_put_at_a_time: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        if not one_put_at_a_time:
            monkeypatch.setattr(pid_map, "SMALL_LOAD", 0)  # the vectorised rounds, even for six ids
        table = PidSlotMap(6)
        pids = pids_homed_near_the_end(table, 6, last=2)
        table.load(np.array(pids, dtype=np.int64), np.arange(6, dtype=np.int32))
        model = {pid: slot for slot, pid in enumerate(pids)}
        check_against(table, model, [])
        for pid in pids[::2] + pids[1::2]:
            table.delete(pid)
            del model[pid]
            check_against(table, model, pids)

    def test_load_of_200k_sequential_pids_finds_a_sample_of_them_and_survives_deletes(self) -> None:
        count = 200_000
        table = PidSlotMap(count)
        pids = np.arange(5_000_000, 5_000_000 + count, dtype=np.int64)
        table.load(pids, np.arange(count, dtype=np.int32))
        assert len(table) == count
        rng = random.Random(3)
        for i in rng.sample(range(count), 2000):
            assert table.get(int(pids[i])) == i
        assert table.get(4_999_999) is None
        assert table.get(5_000_000 + count) is None
        deleted = set(rng.sample(range(count), 500))
        for i in deleted:
            table.delete(int(pids[i]))
            assert table.get(int(pids[i])) is None
        assert len(table) == count - 500
        assert all(table.get(int(pids[i])) == i for i in range(0, count, 97) if i not in deleted)


@given(
    pids=st.lists(st.integers(min_value=0, max_value=MAX_PID), min_size=pid_map.SMALL_LOAD + 1, max_size=300),
    repeat_at=st.integers(min_value=0),
)
@settings(max_examples=150, deadline=None)
def test_the_compiled_and_vectorised_loads_agree_on_every_key_and_every_repeat(
    pids: list[int], repeat_at: int
) -> None:
    # The two placings may put a key in different buckets; what a lookup finds, which loads
    # are refused, and the probing invariant must not differ.
    if compiled_module.compiled is None:
        pytest.skip("oncelog._append is not built")
    if len(set(pids)) == len(pids) and repeat_at % 3 == 0:
        pids = [*pids, pids[repeat_at % len(pids)]]  # a third of the distinct lists gain a repeat
    outcomes = []
    for place in (compiled_module.compiled.load_pid_map, None):
        table = PidSlotMap(len(pids) + 5)
        slots = np.arange(len(pids), dtype=np.int32)[::-1].copy()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(pid_map, "compiled_load", place)
            try:
                table.load(np.array(pids, dtype=np.int64), slots)
            except pid_map.DuplicateProducerError:
                assert len(table) == 0 and not np.any(table.keys)
                outcomes.append(None)
                continue
        model = {pid: int(slot) for pid, slot in zip(pids, slots, strict=True)}
        check_against(table, model, [0, MAX_PID])
        outcomes.append(model)
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] is None) == (len(set(pids)) < len(pids))


def test_inside_forced_pure_the_bulk_load_and_delete_take_numpys_path_and_after_it_cs() -> None:
    # compiled_append.forced_pure() is the tests' and the torture self-test's switch to the
    # Python path: the pid map's C paths must follow it, not only ONCELOG_PURE at start.
    if compiled_module.compiled is None:
        pytest.skip("oncelog._append is not built")
    module = compiled_module.compiled
    calls: list[str] = []

    def spy(name: str, real: Callable[..., int]) -> Callable[..., int]:
        def call(*args: object) -> int:
            calls.append(name)
            return real(*args)

        return call

    pids = np.arange(10_000, 10_000 + 3 * pid_map.SMALL_LOAD, dtype=np.int64)
    slots = np.arange(len(pids), dtype=np.int32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pid_map, "compiled_load", spy("load", module.load_pid_map))
        patch.setattr(pid_map, "compiled_delete", spy("delete", module.delete_pid_slots))
        for pure in (True, False):
            table = PidSlotMap(len(pids))
            with compiled_append.forced_pure(pure):
                table.load(pids, slots)
                table.delete_slots(np.array([0, 7], dtype=np.int64))
            model = {int(pid): n for n, pid in enumerate(pids) if n not in (0, 7)}
            check_against(table, model, [int(pids[0]), int(pids[7])])
            assert calls == ([] if pure else ["load", "delete"])


def test_the_compiled_load_reads_the_producer_table_column_in_place() -> None:
    # load_rows hands over rows["producer_id"], a strided view of the table: read through its
    # strides, not as if contiguous (which would read other fields as ids).
    if compiled_module.compiled is None:
        pytest.skip("oncelog._append is not built")
    rows = np.zeros(1000, dtype=[("producer_id", "<i8"), ("other", "<i8"), ("tag", "<i4")])
    rows["producer_id"] = np.arange(1000) * 7 + 3
    rows["other"] = -5  # a negative id, were it read as one: refused
    table = PidSlotMap(1000)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pid_map, "compiled_load", compiled_module.compiled.load_pid_map)
        table.load(rows["producer_id"], np.arange(1000, dtype=np.int32))
    check_against(table, {n * 7 + 3: n for n in range(1000)}, [0, 1, 2, 7001])


@pytest.mark.parametrize(
    ("pids", "slots"), [([5, -1], [0, 1]), ([5, 6], [0, 4])], ids=["a negative id", "a slot past the table"]
)
def test_the_compiled_load_refuses_what_the_map_cannot_hold_and_leaves_it_empty(
    pids: list[int], slots: list[int]
) -> None:
    if compiled_module.compiled is None:
        pytest.skip("oncelog._append is not built")
    table = PidSlotMap(2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pid_map, "compiled_load", compiled_module.compiled.load_pid_map)
        patch.setattr(pid_map, "SMALL_LOAD", 0)  # (a few ids go one put at a time, not to C)
        with pytest.raises(ValueError, match="negative id or a slot out of range"):
            table.load(np.array(pids, dtype=np.int64), np.array(slots, dtype=np.int32))
    assert len(table) == 0 and not np.any(table.keys)


@pytest.mark.parametrize(
    ("ids", "buckets"),
    [
        (np.array([5, 6], dtype=">i8"), None),  # another byte order: other ids
        (np.array([5.0, 6.0]), None),  # floats of the same width
        (np.array([5, 6], dtype=np.int64), 2**61),  # past the arrays (and overflowing a product)
    ],
    ids=["big-endian ids", "float ids", "a range past the arrays"],
)
def test_the_compiled_load_refuses_arguments_that_do_not_fit_the_map(
    ids: np.ndarray, buckets: int | None
) -> None:
    if compiled_module.compiled is None:
        pytest.skip("oncelog._append is not built")
    table = PidSlotMap(2)
    with pytest.raises(ValueError, match="do not fit the map's layout"):
        compiled_module.compiled.load_pid_map(
            table.keys,
            table.values,
            table.bucket_of,
            ids,
            np.arange(2, dtype=np.int32),
            table.buckets if buckets is None else buckets,
        )
    assert not np.any(table.keys)


def test_the_compiled_delete_refuses_slots_that_are_not_native_int64() -> None:
    if compiled_module.compiled is None:
        pytest.skip("oncelog._append is not built")
    table = PidSlotMap(8)
    table.put(5, 0)
    table.put(6, 1)
    with pytest.raises(
        ValueError, match="do not fit the map's layout"
    ):  # read as int64 pairs, slot 0 + 1<<32
        compiled_module.compiled.delete_pid_slots(
            table.keys, table.bucket_of, np.array([0, 1], dtype=np.int32), table.buckets
        )
    check_against(table, {5: 0, 6: 1}, [])


def test_the_compiled_delete_never_stores_outside_the_range_it_checked() -> None:
    # A hostile caller: bucket_of aliases the one key, so the first tombstone rewrites the
    # bucket the second store would use. Every store is checked again: nothing lands past it.
    if compiled_module.compiled is None:
        pytest.skip("oncelog._append is not built")
    base = np.array([-(1 << 32), 777, 777, 777], dtype=np.int64)  # low half 0: bucket_of[0] = 0
    keys, bucket_of = base[0:1], base[0:1].view(np.int32)
    compiled_module.compiled.delete_pid_slots(keys, bucket_of, np.array([0, 0], dtype=np.int64), 1)
    assert base[1:].tolist() == [777, 777, 777]
