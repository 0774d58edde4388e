"""The "cleaning" fault class: a compacted log crashed at every I/O step of a cleaning pass.

The workload runs on a log with cleanup_policy "compact": idempotent producers (one
busy, one now and then, one rare, so some producers' last batches sit in old segments
whose records newer ones supersede) send keyed records over a dozen keys, a fifth of
them tombstones, retry their last batches, bump epochs; two transactional producers
commit and abort transactions over the same keys; flushes, checkpoints, rolls and
clean reopens move the recovery point the cleaner stays below; and cleaning passes run
between the appends (`Log.clean`, now and then only if due, with key maps so small
that a pass ends early). The engine's clock moves on irregularly, so tombstones'
delete horizons pass during a run. After every pass the live log is checked
(`check_live_log`): each key's newest record is the one written last, aborted data is
never served, and every batch in a producer's window is still there.

Where to crash: a rehearsal runs the crash state's workload to its end on a twin
that traces every I/O call, which gives the calls each cleaning pass made (writing
the `.cleaned` file and its fsync, the rename to `.swap` and its directory fsync, the
old indexes deleted, the rename into place, the directory fsyncs, the new indexes
built, the cleaner checkpoint committed) and the first call after each pass. The
crash state's seed draws a kind of step (each kind as likely: the renames and
directory fsyncs are few beside the writes) and one of its calls; the same workload
runs again (it replays call for call, which the kill checks) and is killed there;
the twin then loses power ("drop": any subset of the unsynced writes and a prefix of
each directory's unsynced steps; "dirent": a directory step lost; "torn": a torn
write), or just the process dies ("kill": the page cache survives). `cleaning_check`
then reopens the log and checks the compaction contract. `crash_during_cleaning` runs
one chosen call, so a test can crash a pass at every one of its steps in turn.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

from oncelog.bench.sigint import raise_if_interrupted
from oncelog.errors import CorruptLogError
from oncelog.key_map import BYTES_PER_KEY
from oncelog.log import METADATA_DIR, Log
from oncelog.log_cleaner import DEFAULT_KEY_MAP_BYTES
from oncelog.recovery import swaps
from oncelog.segments.batch import encode_batch
from oncelog.segments.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from oncelog.segments.txn_index import TXN_INDEX_SUFFIX
from oncelog.torture.cleaning_check import check_cleaned, check_live_log
from oncelog.torture.faultfs import FaultFileSystem, SimulatedCrash
from oncelog.torture.model import (
    CLEANING,
    CLEANING_CONFIG,
    DIRECTORY,
    KEYS,
    PRODUCERS,
    TXN_PRODUCERS,
    CleaningModel,
    EngineClock,
    OnlineCheckFailed,
    Violation,
)
from oncelog.torture.workload import Workload

TOMBSTONE_RATE = 0.2
# The default map, and maps that hold one segment's keys but seldom two: the pass ends
# early at a segment boundary and the next goes on from there.
KEY_MAP_BYTES = (DEFAULT_KEY_MAP_BYTES, KEYS * BYTES_PER_KEY, 2 * KEYS * BYTES_PER_KEY)
# The busy producer, the occasional one, the rare one.
PRODUCER_WEIGHTS = (6, 3, 1)
# After the kill: power loss (most often), a lost directory step, a torn write, or none.
CRASH_MODES = ("drop", "drop", "dirent", "torn", "kill")


class CleaningWorkload(Workload):
    """The workload's producers, sending keyed records and tombstones over KEYS keys."""

    def batch(self, pid: int, epoch: int, sequence: int) -> bytes:
        return self._keyed(pid, epoch, sequence, transactional=False)

    def txn_batch(self, pid: int, epoch: int, sequence: int) -> bytes:
        return self._keyed(pid, epoch, sequence, transactional=True)

    def _keyed(self, pid: int, epoch: int, sequence: int, *, transactional: bool) -> bytes:
        rng = self.rng
        records = [
            (
                b"key-%02d" % rng.randrange(KEYS),
                None if rng.random() < TOMBSTONE_RATE else rng.randbytes(rng.randrange(1, 40)),
            )
            for _ in range(rng.randint(1, 3))
        ]
        return encode_batch(
            records,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
            is_transactional=transactional,
            timestamp_ms=self.stamp(pid),
        )

    def clean(self, log: Log, fs: FaultFileSystem, model: CleaningModel) -> None:
        """One pass, its I/O calls recorded; then the live log must keep the contract."""
        rng = self.rng
        key_map_bytes = rng.choice(KEY_MAP_BYTES)
        if_due = rng.random() < 0.25
        model.clean_times.append((self.clock.now_ms, min(log.last_stable_offset, log.recovery_point)))
        first = fs.io_calls + 1
        try:
            result = log.clean(if_due=if_due, key_map_bytes=key_map_bytes)
        finally:
            model.passes.append((first, fs.io_calls))
        model.cleaned += result.cleaned
        model.stats.add(result.stats)
        if result.cleaned:  # (else the log is as it was)
            check_live_log(log, model)


def run_cleaning_workload(fs: FaultFileSystem, rng: random.Random, model: CleaningModel, steps: int) -> None:
    """Drive a compacted Log until `steps` are done or the twin dies (SimulatedCrash)."""
    clock = EngineClock(model.now_ms)
    w = CleaningWorkload(rng, model, clock)

    def reopen() -> Log:
        return Log.open(DIRECTORY, CLEANING_CONFIG, fs=fs, clock=clock)

    try:
        log = reopen()
        for _ in range(steps):
            w.tick()
            w.expire_idle(log)
            log = _step(w, log, fs, model, reopen)
            w.check_stable_offset(log)
            w.check_kept(log)
    finally:
        model.recent = {pid: list(batches) for pid, batches in w.recent.items() if batches}


def _step(
    w: CleaningWorkload, log: Log, fs: FaultFileSystem, model: CleaningModel, reopen: Callable[[], Log]
) -> Log:
    rng = w.rng
    action = rng.random()
    pid = rng.choices(PRODUCERS, PRODUCER_WEIGHTS)[0]
    if action < 0.38:
        w.append(log, pid)
    elif action < 0.52:
        w.transaction_step(log, w.txn[rng.choice(TXN_PRODUCERS)])
    elif action < 0.58:
        retried = rng.choice(PRODUCERS + TXN_PRODUCERS)
        if w.recent[retried]:
            w.retry(log, retried)
    elif action < 0.65:
        log.flush()
        model.durable_end = log.log_end_offset
    elif action < 0.69:
        w.checkpoint(log)
    elif action < 0.76:
        model.point_floor = max(model.point_floor, log.roll().base_offset)
    elif action < 0.78:
        w.epochs[pid] += 1
        w.sequences[pid] = 0
        w.recent[pid] = []
    elif action < 0.95:
        w.clean(log, fs, model)
    else:
        log.close()
        model.durable_end = model.point_floor = log.log_end_offset
        return reopen()
    return log


class CleaningStep(NamedTuple):
    """One I/O call of a cleaning pass (or the first after one), where a crash may land."""

    call: int
    op: str
    path: str
    kind: str
    cleaning: int  # which pass of the run (0: the first)


# What each I/O call of a pass does, by its op and the file it names (recovery.swaps has
# the protocol: the transaction index takes part when markers go).
STEP_KINDS = (
    "writing the .cleaned files",
    "renaming .cleaned to .swap",
    "directory fsync after a rename to .swap",
    "deleting the old indexes",
    "directory fsync after deleting the old indexes",
    "renaming .swap into place",
    "directory fsync after the swap",
    "building the new indexes",
    "committing cleaner metadata",
    "right after the pass",
)
_WRITING, _TO_SWAP, _SYNC_SWAP, _UNLINKING, _SYNC_UNLINK = STEP_KINDS[:5]
_INTO_PLACE, _SYNC_PLACE, _BUILDING, _METADATA, _AFTER_PASS = STEP_KINDS[5:]
_READING = "reading a segment"  # an index opened to read one (none of the passes here do)
_DIRECTORY_FSYNC_AFTER = {_TO_SWAP: _SYNC_SWAP, _UNLINKING: _SYNC_UNLINK, _INTO_PLACE: _SYNC_PLACE}
_INDEXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


def _kind(op: str, name: str, previous: str, swapped: str) -> str:
    """What the call `op` on the file `name` does, after a call of kind `previous`, while
    the segment `swapped` (a file name's stem) is the one put in place last."""
    if name.endswith(swaps.CLEANING):
        return _TO_SWAP if op == "rename" else _WRITING
    if name.endswith(swaps.SWAPPING):
        return _INTO_PLACE
    if op == "fsync_dir":
        return _DIRECTORY_FSYNC_AFTER.get(previous, f"directory fsync after {previous or 'nothing'}")
    if name == METADATA_DIR:
        return _METADATA
    if name.endswith(_INDEXES) and op == "unlink":
        return _UNLINKING
    if name.endswith((*_INDEXES, LOG_SUFFIX)):
        return _BUILDING if name.startswith(swapped) else _READING
    return f"{op} {name}"


def _steps_of(trace: list[tuple[int, str, str]], passes: list[tuple[int, int]]) -> list[CleaningStep]:
    """The calls of each pass in `trace` (and the first call after it), each with its kind."""
    steps: list[CleaningStep] = []
    for number, (first, last) in enumerate(passes):
        previous, swapped = "", "-"
        for call, op, path in trace[first - 1 : last]:
            name = path.rpartition("/")[2]
            previous = _kind(op, name, previous, swapped)
            if previous == _INTO_PLACE and name.endswith(LOG_SUFFIX + swaps.SWAPPING):
                swapped = name.partition(".")[0]
            steps.append(CleaningStep(call, op, path, previous, number))
        if first <= last < len(trace):
            call, op, path = trace[last]
            steps.append(CleaningStep(call, op, path, _AFTER_PASS, number))
    return steps


def draw_step(steps: list[CleaningStep], rng: random.Random) -> CleaningStep | None:
    """A kind of step, each as likely (the renames and fsyncs are few beside the reads and
    writes), then one of its calls; None when no pass made an I/O call."""
    kinds = sorted({step.kind for step in steps})
    if not kinds:
        return None
    kind = rng.choice(kinds)
    return rng.choice([step for step in steps if step.kind == kind])


def _workload_steps(seed: int) -> tuple[random.Random, int]:
    rng = random.Random(seed)
    return rng, rng.randint(30, 80)


def cleaning_steps(seed: int) -> list[CleaningStep]:
    """The rehearsal: the I/O calls of every cleaning pass of the crash state's workload."""
    rng, steps = _workload_steps(seed)
    fs = FaultFileSystem(seed)
    fs.trace = []
    model = CleaningModel()
    run_cleaning_workload(fs, rng, model, steps)
    return _steps_of(fs.trace, model.passes)


def run_cleaning_crash_state(seed: int) -> list[Violation]:
    """One crash state of the class: a call of a cleaning pass and a crash mode, drawn from the seed."""
    try:
        steps = cleaning_steps(seed)
    except OnlineCheckFailed as exc:
        return [Violation(seed, CLEANING, exc.invariant, str(exc))]
    except Exception as exc:  # the rehearsal runs the engine too: a failure there is a finding
        raise_if_interrupted(exc)
        return [Violation(seed, CLEANING, "no unexpected error", f"rehearsal: {type(exc).__name__}: {exc}")]
    plan = random.Random(f"{seed}/cleaning-crash")
    step = draw_step(steps, plan)
    return crash_during_cleaning(seed, step, plan.choice(CRASH_MODES))


def crash_during_cleaning(seed: int, step: CleaningStep | None, mode: str) -> list[Violation]:
    """Run the crash state's workload, kill it at `step` (None: run it to its end), crash the
    twin in `mode`, recover and check."""
    rng, steps = _workload_steps(seed)
    fs = FaultFileSystem(seed)
    fs.trace = []
    model = CleaningModel()
    if step is not None:
        fs.kill_at(step.call)
    try:
        run_cleaning_workload(fs, rng, model, steps)
    except SimulatedCrash:
        pass
    except OnlineCheckFailed as exc:
        return [Violation(seed, CLEANING, exc.invariant, str(exc))]
    except Exception as exc:
        raise_if_interrupted(exc)
        return [Violation(seed, CLEANING, "no unexpected error", f"workload: {type(exc).__name__}: {exc}")]
    if step is not None and fs.trace[-1:] != [(step.call, step.op, step.path)]:
        return [
            Violation(
                seed,
                CLEANING,
                "the workload replays from its seed",
                f"the kill was to land on {step}, the run's last I/O call was {fs.trace[-1:]}",
            )
        ]
    crashed = fs.crash(mode)  # type: ignore[arg-type]
    where = (
        f"crashed ({mode}) at {step.kind}: {step.op} {step.path}" if step else f"crashed ({mode}) at the end"
    )
    try:
        return check_cleaned(crashed, model, seed, killed_only=mode == "kill", where=where)
    except CorruptLogError as exc:
        return [Violation(seed, CLEANING, "recovery succeeds", f"{where}: {exc}")]
    except Exception as exc:  # an engine that misbehaves may raise anywhere: a finding too
        raise_if_interrupted(exc)
        return [Violation(seed, CLEANING, "no unexpected error", f"{where}: {type(exc).__name__}: {exc}")]
