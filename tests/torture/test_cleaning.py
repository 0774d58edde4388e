"""The cleaning fault class: a compacted log crashed at every I/O step of a cleaning pass.

The planted bugs are monkeypatched in these tests only; no production code path can
switch them on.
"""

from __future__ import annotations

import random
from collections import Counter

from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segment_cleaning import CleanStats
from oncelog.segments.batch import encode_batch
from oncelog.torture.cleaning import (
    CRASH_MODES,
    STEP_KINDS,
    CleaningStep,
    cleaning_steps,
    crash_during_cleaning,
    draw_step,
    run_cleaning_workload,
)
from oncelog.torture.faultfs import FaultFileSystem
from oncelog.torture.harness import run_crash_state, run_torture
from oncelog.torture.model import CLEANING, CleaningModel, crash_seed
from oncelog.torture.selftest import PLANTED

NOW_MS = 1_800_000_000_000


# Two cleaner bugs this class found, now fixed, each pinned below (test_a_pass_*).
def test_cleaning_crash_states_find_no_violation() -> None:
    summary = run_torture(seed=20261129, crashes=60, faults=(CLEANING,))
    assert summary.by_fault == {CLEANING: 60}
    assert [v.replay_command + " " + v.detail for v in summary.violations] == []


def test_a_crash_at_every_step_of_a_cleaning_pass_loses_nothing() -> None:
    # Seed 30's sixth pass swaps three segments, two of them with their transaction index
    # (markers went): every call of it, killed, then power lost or not.
    steps = [step for step in cleaning_steps(30) if step.cleaning == 5]
    kinds = {step.kind for step in steps}
    assert kinds == set(STEP_KINDS), kinds
    assert sum(step.op == "rename" and ".txnindex" in step.path for step in steps) >= 2
    found = [
        violation
        for step in steps
        for mode in ("drop", "dirent", "kill")
        for violation in crash_during_cleaning(30, step, mode)
    ]
    assert [v.replay_command + " " + v.detail for v in found] == []


def test_crash_points_fall_on_every_kind_of_step_of_a_pass_and_every_crash_mode() -> None:
    kinds: Counter[str] = Counter()
    modes: Counter[str] = Counter()
    for index in range(60):
        seed = crash_seed(7, index)
        plan = random.Random(f"{seed}/cleaning-crash")
        step = draw_step(cleaning_steps(seed), plan)
        if step is None:
            continue  # no pass made an I/O call: the crash comes at the end of the run
        kinds[step.kind] += 1
        modes[plan.choice(CRASH_MODES)] += 1
    assert set(kinds) == set(STEP_KINDS), kinds
    assert set(modes) == set(CRASH_MODES), modes


def test_the_workload_removes_records_tombstones_aborted_data_and_markers() -> None:
    totals = CleanStats()
    passes = cleaned = retries = 0
    for seed in range(30):
        model = CleaningModel()
        run_cleaning_workload(FaultFileSystem(seed), random.Random(seed), model, steps=60)
        totals.add(model.stats)
        passes += len(model.passes)
        cleaned += model.cleaned
        retries += sum(len(recent) for recent in model.recent.values())
    assert cleaned >= 60 and passes > cleaned, (passes, cleaned)
    assert totals.segments_rewritten >= 60 and totals.batches_removed >= 30, totals
    assert totals.batches_emptied >= 10 and totals.tombstones_removed >= 5, totals
    assert totals.aborted_records_removed >= 5 and totals.markers_removed >= 1, totals
    assert retries >= 30  # the producers' last batches the checker retries after the crash


def test_a_crash_state_replays_exactly_and_a_kill_that_misses_its_step_is_reported() -> None:
    seed = crash_seed(3, 1)
    assert run_crash_state(seed, CLEANING) == run_crash_state(seed, CLEANING)
    step = cleaning_steps(seed)[0]
    elsewhere = CleaningStep(step.call, "rename", "/torture/topic-0/nothing", step.kind, step.cleaning)
    (violation,) = crash_during_cleaning(seed, elsewhere, "drop")
    assert violation.invariant == "the workload replays from its seed"


# -- planted bugs --------------------------------------------------------------------------------
def _invariants(bug: str, crashes: int) -> Counter[str]:
    plant, faults = PLANTED[bug]
    with plant():
        summary = run_torture(seed=4, crashes=crashes, faults=faults)
    return Counter(v.invariant for v in summary.violations)


def test_a_cleaner_dropping_producers_last_batches_is_caught_on_the_live_log() -> None:
    found = _invariants("a producer's last batches dropped by the cleaner", 20)
    assert found["a producer's last batches survive cleaning"] >= 1, found


def test_a_swap_without_its_directory_fsyncs_is_caught_below_the_cleaner_checkpoint() -> None:
    # A power loss undoes a swap the pass had reported (its checkpoint moved on): the
    # segment comes back uncleaned, with a key twice below the checkpoint.
    found = _invariants("a cleaned segment swapped in without a directory fsync", 40)
    assert found["at most one record per key below the cleaner checkpoint"] >= 1, found


def test_a_cleaned_segment_never_fsynced_is_caught() -> None:
    found = _invariants("a cleaned segment swapped in without its fsync", 30)
    assert found["each key's latest value is served"] >= 1 or found["reads succeed"] >= 1, found


# -- engine bugs the class found (not fixed here: the cleaner is not this harness's) ------------
def _crash_until(fs: FaultFileSystem, config: LogConfig, lost: int) -> Log:
    """Reopen after power losses until one drops the unflushed offsets from `lost` on."""
    for _ in range(50):
        log = Log.open("/t/p-0", config, fs=fs.crash("drop"), clock=lambda: NOW_MS)
        if log.log_end_offset <= lost:
            return log
        log.close()
    raise AssertionError("no power loss dropped the unflushed data")


def _send(log: Log, pid: int, seq: int, key: bytes, *, transactional: bool = False) -> None:
    batch = encode_batch(
        [(key, b"v%d" % seq)],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        is_transactional=transactional,
        timestamp_ms=NOW_MS,
    )
    log.append(batch)


def test_a_pass_acting_on_a_commit_marker_not_yet_durable() -> None:
    config = LogConfig(cleanup_policy="compact")
    fs = FaultFileSystem(0)
    log = Log.open("/t/p-0", config, fs=fs, clock=lambda: NOW_MS)
    _send(log, 11, 0, b"k")  # 0: k's value, durable after the roll
    _send(log, 21, 0, b"k", transactional=True)  # 1: a newer one in a transaction
    log.roll()
    log.write_txn_marker(21, 0, commit=True, coordinator_epoch=0)  # 2: acknowledged, not flushed
    log.clean()  # takes the commit as done: the value at 0 goes
    recovered = _crash_until(fs, config, lost=2)  # the marker lost: the transaction is open again
    assert recovered.last_stable_offset == 1
    served = [r.key for r in recovered.read(0, 1 << 20, isolation="read_committed").records()]
    assert served == [b"k"], "k's durable committed value is gone from the stable part of the log"


def test_a_pass_protecting_the_windows_in_memory_only() -> None:
    config = LogConfig(cleanup_policy="compact")
    fs = FaultFileSystem(0)
    log = Log.open("/t/p-0", config, fs=fs, clock=lambda: NOW_MS)
    _send(log, 11, 0, b"a")  # 0: producer 11's first batch
    _send(log, 12, 0, b"a")  # 1: supersedes its record
    log.roll()  # [0, 2) durable
    for seq in range(1, 6):
        _send(log, 11, seq, b"k%d" % seq)  # 2..6: 11's window in memory, not flushed
    log.clean()  # batch 0 is out of 11's window in memory: it goes
    recovered = _crash_until(fs, config, lost=2)
    entry = recovered.producer_state(11)
    assert entry is not None
    window = [meta.first_offset for meta in entry.batches]
    in_log = [batch.base_offset for batch in recovered.read(0, 1 << 20).batches]
    assert set(window) <= set(in_log), (window, in_log)
