"""The crash torture harness: a seeded workload, a crash, recovery, and the checker.

One crash state: idempotent producers append (with retries, epoch bumps, flushes,
rolls and clean reopens) to a Log on the fault-injecting twin, interleaved with
transactional producers that open transactions, send 1-3 transactional batches and
commit or abort them, sometimes leaving one open across flushes, rolls,
reopens and the crash; the twin then crashes in one fault class; the log
is reopened on what the crash left; the checker enforces every invariant:

1. every acknowledged-durable batch is present, at its offset, byte for byte (after
   a kill, every acknowledged batch: the page cache survives);
2. nothing appears twice and there are no holes;
3. the log is a prefix of what was written: no byte that was never written;
4. producer state equals a full replay of the recovered log, but for producers the
   engine may have expired (idle past the expiration on its clock, no open
   transaction), which may be missing; each producer's last append time is no
   earlier than its newest batch's append and no later than the recovery's clock;
   producers appended within the expiration are all there;
5. a retry of any batch in a producer's recovered window comes back as a
   duplicate with its original offsets;
6. a second crash right after recovery loses nothing recovery exposed;
7. read_committed returns only committed data: the outcome of every transaction
   (committed, aborted, still open) is derived from the markers actually in the
   recovered log, and a read_committed scan must return exactly the records of
   committed transactions and non-transactional batches below the last stable
   offset, which must be the first offset of the oldest open transaction (or the
   log end); markers acknowledged as durable must be there. Checked after
   recovery, after the second crash, and once the transactions left open by the
   crash are committed or aborted on the recovered log;
8. the log start is the one the last completed delete_records / retention left,
   or (a crash inside one) the one it was moving to; data removed on purpose by a
   completed truncation, delete_records or retention is not required, and a crash
   inside truncate_to may leave the old log or any prefix of it down to its cut;
9. every byte the engine writes through a mapping has a disk block reserved, in the
   run and in recovery (the twin's `sigbus_risks`): else a full disk is SIGBUS.

A bit flip below the recovery point must be reported (CorruptLogError), never
served; a failed fsync must never be followed by an acknowledgement.

Every crash state has its own seed; `replay_command` reproduces it exactly.

The "cleaning" class is a compacted log crashed at an I/O call of a cleaning pass:
invariants 1-3 become the compaction contract there, and its workload and checker are
its own (oncelog.torture.cleaning, oncelog.torture.cleaning_check); run_crash_state
hands its crash states to them.

This module holds the crash-state checker (check_recovered and the per-invariant
checks), run_crash_state and run_torture. The rest of the harness lives beside it:
torture_model (constants, Model, Violation), torture_workload (the seeded workload),
torture_cuts (the Model's side of truncation and retention), torture_txn (the
transaction view and the read_committed checks) and torture_recovered (the stored
recovery point, and invariant 4's full replay). This module re-exports their public
names (`__all__`), so `torture.X` still reaches all of them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from oncelog.bench.sigint import raise_if_interrupted
from oncelog.errors import CorruptLogError, CorruptRecordError, OncelogError
from oncelog.log import Log
from oncelog.segments.batch import RecordBatch, iter_batches
from oncelog.torture.cleaning import run_cleaning_crash_state
from oncelog.torture.faultfs import FaultFileSystem, SimulatedCrash
from oncelog.torture.model import (
    ABORTED,
    CLEANING,
    CLOCK_MS,
    COMMITTED,
    CONFIG,
    DIRECTORY,
    EXPIRATION_MS,
    FAULTS,
    LOSABLE_SUFFIXES,
    MAX_KILL_POINT,
    OPEN,
    PRODUCERS,
    READ_COMMITTED_FETCH_BYTES,
    TAIL_SLACK_BYTES,
    TXN_PRODUCERS,
    Model,
    OnlineCheckFailed,
    Txn,
    Violation,
    crash_seed,
    stamped,
)
from oncelog.torture.recovered import bytes_from_recovery_point, check_producer_state, stored_point
from oncelog.torture.txn import (
    TxnView,
    check_read_committed,
    check_txn_outcomes,
    complete_open_transactions,
    derive_transactions,
    read_all,
    read_committed,
)
from oncelog.torture.workload import run_workload

__all__ = [
    # torture_model
    "FAULTS",
    "DIRECTORY",
    "CLOCK_MS",
    "EXPIRATION_MS",
    "CONFIG",
    "PRODUCERS",
    "TXN_PRODUCERS",
    "TAIL_SLACK_BYTES",
    "MAX_KILL_POINT",
    "READ_COMMITTED_FETCH_BYTES",
    "COMMITTED",
    "ABORTED",
    "OPEN",
    "Violation",
    "OnlineCheckFailed",
    "Txn",
    "Model",
    "crash_seed",
    # torture_workload
    "run_workload",
    # torture_txn
    "read_all",
    "TxnView",
    "derive_transactions",
    "read_committed",
    "check_read_committed",
    "check_txn_outcomes",
    "complete_open_transactions",
    # this module
    "check_recovered",
    "check_producer_state",
    "run_crash_state",
    "TortureSummary",
    "run_torture",
]


# Invariant 9 (the twin records every mapped write a full disk would turn into SIGBUS).
SIGBUS_INVARIANT = "mapped writes land on reserved blocks"


def check_recovered(fs: FaultFileSystem, model: Model, fault: str, seed: int) -> list[Violation]:
    """Reopen on the crashed twin and check every invariant."""
    found: list[Violation] = []

    def violation(invariant: str, detail: str) -> None:
        found.append(Violation(seed, fault, invariant, f"{detail} [{fs.describe()}]"))

    if model.acked_after_fsync_failure:
        violation("no ack after a failed fsync", f"{model.acked_after_fsync_failure} acks followed it")
    tail_bytes = bytes_from_recovery_point(fs)
    # A lost segment file: reporting it is right (CorruptLogError at open or on reading
    # the missing offsets); serving a shorter log is not. What the recovery point did not
    # cover the engine cannot know was there, and may be gone with the file.
    lost_segment = any(f.kind == "lost" and f.path.endswith(".log") for f in fs.faults)
    reportable = fault in ("bitflip", "misdirect") or lost_segment
    if lost_segment:
        model.lost_from = stored_point(fs).offset
    elif reportable:
        damaged = _damaged_past_recovery_point(fs)
        # Below where the point must have reached (a roll, close or checkpoint put it
        # there), the damage must be reported whatever point was stored: no excuse.
        model.damaged_from = damaged if damaged is not None and damaged >= model.point_floor else None
    # Recovery runs at the crash's time, or after an idle gap past the expiration: the
    # load then expires what the snapshot knows to be idle, and must keep the rest.
    gap = random.Random(f"{seed}/recovery-clock").choice((0, 0, 0, EXPIRATION_MS + 1, 3 * EXPIRATION_MS))
    now_ms = model.now_ms + gap
    try:
        # Half the recoveries as a LogManager opens: a clean state's producers read at first use.
        defer = random.Random(f"{seed}/defer-producers").random() < 0.5
        log = Log.open(DIRECTORY, CONFIG, fs=fs, clock=lambda: now_ms, defer_producer_state=defer)
    except CorruptLogError:
        # Bytes below the recovery point were changed or lost: reporting it is the right answer.
        if not reportable:
            violation("recovery succeeds", "CorruptLogError without corruption injected")
        return found
    max_bytes = READ_COMMITTED_FETCH_BYTES[seed % 3]
    try:
        present = {batch.base_offset: batch.buffer.tobytes() for batch in read_all(log)}
        _place_in_flight(model, present)
        batches = [RecordBatch(present[offset]) for offset in sorted(present)]
        end = log.log_end_offset
        _check_log_start(log.log_start_offset, end, model, violation)
        # The batches retention or delete_records took are gone from the log but not from
        # its history: producer state and transactions are checked against all of it.
        history = _history_below(model, batches[0].base_offset if batches else end) + batches
        scanned = log.recovery_report.bytes_scanned
        # Recovery cost follows the tail. Only faults that cannot damage fsynced
        # snapshots or indexes are held to it (a bit flip or misdirected write may).
        if fault not in ("bitflip", "misdirect", "lost") and scanned > tail_bytes + TAIL_SLACK_BYTES:
            violation("recovery reads only the tail", f"scanned {scanned} bytes, the tail holds {tail_bytes}")
        _check_log_contents(batches, present, log.log_start_offset, end, model, fault, violation)
        check_producer_state(log, present, violation, history, now_ms=now_ms, model=model)
        view = check_read_committed(log, history, max_bytes, violation)
        check_txn_outcomes(view, model, fault, violation)
        _check_retries(log, present, model, violation)
        _check_second_crash(log, fs, present, model, max_bytes, violation, now_ms)
        complete_open_transactions(log, history, view, seed, violation)
    except (CorruptLogError, CorruptRecordError) as exc:
        if not reportable:
            violation("reads succeed", str(exc))
        log.close()
    return found


def _place_in_flight(model: Model, present: dict[int, bytes]) -> None:
    """Batches whose append had not returned when the run ended may be in the log at any
    offset: where one is, it counts as written there, at the time it was handed over."""
    if not model.in_flight:
        return
    for offset, data in present.items():
        if model.written.get(offset) == data:
            continue
        for raw, (appended_ms, restart) in list(model.in_flight.items()):
            if stamped(raw, offset) == data:
                model.written[offset] = data
                model.append_ms[offset] = appended_ms
                if restart:
                    model.restarted_at.add(offset)
                del model.in_flight[raw]
                break


def _damaged_past_recovery_point(fs: FaultFileSystem) -> int | None:
    """The first offset of the batch a bit flip or misdirected write changed in fsynced
    bytes of a segment past the stored recovery point; None if it changed none there.
    (Below the point, the damage must be reported: no excuse.)"""
    point = stored_point(fs)
    for fault in fs.faults:
        name = fault.path.rpartition("/")[2]
        if fault.damaged_at < 0 or not name.endswith(".log") or not name[:20].isdigit():
            continue
        base = int(name[:20])
        if point.covers(base, fault.damaged_at):
            continue
        return _offset_of_batch_at(fs, fault.path, base, fault.damaged_at)
    return None


def _offset_of_batch_at(fs: FaultFileSystem, path: str, base: int, position: int) -> int:
    """The first offset of the batch holding byte `position` of the crashed segment `path`
    (the batches before it are intact: the damage starts at `position`)."""
    handle = fs.open(path, writable=False)
    try:
        before = handle.pread(position, 0)
    finally:
        handle.close()
    offset = base
    try:
        # Header by header up to `position`: the batch holding it ends the walk cut short
        # (or the reserved zeros past the data end it first).
        for batch in iter_batches(before, until_unwritten=True):
            offset = batch.last_offset + 1
    except CorruptRecordError:
        pass
    return offset


def _check_log_start(start: int, end: int, model: Model, violation: Callable[[str, str], None]) -> None:
    """The start is the one the last completed delete_records / retention left, or the one an
    interrupted one moves to; a crash that cut the log end below it leaves the end."""
    allowed = {min(model.log_start, end)}
    if model.pending_start is not None:
        allowed.add(min(model.pending_start, end))
    if start not in allowed:
        violation(
            "the log start is the old or the new one",
            f"recovered start {start}, expected one of {sorted(allowed)} (log end {end})",
        )


def _history_below(model: Model, offset: int) -> list[RecordBatch]:
    """What the workload wrote below `offset` (the first batch the recovered log serves)."""
    return [RecordBatch(model.written[base]) for base in sorted(model.written) if base < offset]


def _check_log_contents(
    batches: Sequence[RecordBatch],
    present: dict[int, bytes],
    start: int,
    end: int,
    model: Model,
    fault: str,
    violation: Callable[[str, str], None],
) -> None:
    # Reads serve whole batches: the first one holds the start.
    expected = batches[0].base_offset if batches and batches[0].base_offset <= start else start
    seen: set[tuple[int, int, int]] = set()
    for batch in batches:
        offset = batch.base_offset
        if offset != expected:
            violation("no holes", f"batch at {offset}, expected {expected}")
        expected = batch.last_offset + 1
        if model.written.get(offset) != present[offset]:
            violation("prefix of what was written", f"batch at offset {offset} was never written")
        if batch.is_control:
            continue  # markers carry no sequence: a producer writes many at one epoch
        key = (batch.producer_id, batch.producer_epoch, batch.base_sequence)
        if key in seen:
            violation("nothing twice", f"producer batch {key} appears twice")
        seen.add(key)
    if expected != end:
        violation("no holes", f"batches end at {expected}, log end is {end}")
    # After a kill (enospc runs end in one) the page cache survives: every ack must.
    must_survive = model.acked if fault in ("kill", "enospc", "lost") else {}
    for offset, data in model.acked.items():
        last = RecordBatch(data).last_offset
        if last < start or model.excused(last):
            continue  # below the start (retention, delete_records), or cut by the interrupted truncation
        durable = last < model.durable_end
        if (durable or offset in must_survive) and present.get(offset) != data:
            why = "durable" if durable else "acknowledged before a kill"
            kind = "marker" if RecordBatch(data).is_control else "batch"
            violation("acknowledged data survives", f"{why} {kind} at {offset} is missing or changed")


def _check_retries(
    log: Log, present: dict[int, bytes], model: Model, violation: Callable[[str, str], None]
) -> None:
    for entry in list(log.producers()):
        for meta in entry.batches:
            data = present.get(meta.first_offset)
            if data is None:
                continue
            result = log.append(data)
            if not (result.duplicate and result.first_offset == meta.first_offset):
                violation("retries are duplicates", f"retry of offset {meta.first_offset} gave {result}")


def _check_second_crash(
    log: Log,
    fs: FaultFileSystem,
    present: dict[int, bytes],
    model: Model,
    max_bytes: int,
    violation: Callable[[str, str], None],
    now_ms: int,
) -> None:
    # Recovery fsynced what it exposed, so even a power loss now must keep it.
    again = fs.crash("drop")
    try:
        reopened = Log.open(DIRECTORY, CONFIG, fs=again, clock=lambda: now_ms)
    except OncelogError as exc:
        violation("a second crash loses nothing", f"reopen failed: {exc}")
        return
    survived = {batch.base_offset: batch.buffer.tobytes() for batch in read_all(reopened)}
    lost = [offset for offset, data in present.items() if survived.get(offset) != data]
    if lost:
        violation("a second crash loses nothing", f"offsets {lost[:5]} lost after recovery exposed them")

    def after_second_crash(invariant: str, detail: str) -> None:
        violation(invariant, f"after a second crash: {detail}")

    if reopened.log_start_offset != log.log_start_offset:
        after_second_crash(
            "the log start survives",
            f"start {reopened.log_start_offset}, recovery exposed {log.log_start_offset}",
        )
    batches = [RecordBatch(survived[offset]) for offset in sorted(survived)]
    history = _history_below(model, batches[0].base_offset if batches else reopened.log_end_offset)
    check_read_committed(reopened, history + batches, max_bytes, after_second_crash)
    reopened.close()
    for risk in again.sigbus_risks[:3]:
        after_second_crash(SIGBUS_INVARIANT, risk)


def run_crash_state(seed: int, fault: str) -> list[Violation]:
    """One workload, one crash of class `fault`, one recovery and check."""
    if fault not in FAULTS:
        raise ValueError(f"fault is one of {FAULTS}, got {fault!r}")
    if fault == CLEANING:
        return run_cleaning_crash_state(seed)  # a compacted log, and a checker of its own
    rng = random.Random(seed)
    fs = FaultFileSystem(
        seed,
        write_error_rate=0.03 if fault == "enospc" else 0.0,
        fsync_error_rate=0.15 if fault == "eio" else 0.0,
    )
    model = Model()
    if fault == "kill":
        fs.kill_at(rng.randint(1, MAX_KILL_POINT))
    try:
        run_workload(fs, rng, model, steps=rng.randint(10, 60))
    except SimulatedCrash:
        pass
    except OnlineCheckFailed as exc:
        return [Violation(seed, fault, exc.invariant, str(exc))]
    except AssertionError as exc:
        return [Violation(seed, fault, "retries are duplicates", str(exc))]
    except Exception as exc:
        raise_if_interrupted(exc)
        return [Violation(seed, fault, "no unexpected error", f"workload: {type(exc).__name__}: {exc}")]
    in_run = _sigbus_risks(fs, seed, fault)
    mode = {"enospc": "kill", "eio": "drop"}.get(fault, fault)
    if fault == "bitflip":
        crashed = fs.crash("bitflip", target=lambda path: path.endswith(".log"))
    elif fault == "lost":
        crashed = fs.crash("lost", target=lambda path: path.endswith(LOSABLE_SUFFIXES))
    else:
        crashed = fs.crash(mode)  # type: ignore[arg-type]
    # The disk is healthy again for recovery: the faults were in the run before the crash.
    crashed.write_error_rate = crashed.fsync_error_rate = 0.0
    try:
        found = check_recovered(crashed, model, fault, seed)
    except Exception as exc:  # an engine that misbehaves may raise anywhere: that is a finding too
        raise_if_interrupted(exc)
        found = [Violation(seed, fault, "no unexpected error", f"{type(exc).__name__}: {exc}")]
    return in_run + found + _sigbus_risks(crashed, seed, fault)


def _sigbus_risks(fs: FaultFileSystem, seed: int, fault: str) -> list[Violation]:
    """Invariant 9: what the twin saw written through a mapping with no block reserved."""
    return [Violation(seed, fault, SIGBUS_INVARIANT, risk) for risk in fs.sigbus_risks[:3]]


class TortureSummary(NamedTuple):
    crash_states: int
    by_fault: dict[str, int]
    violations: list[Violation]
    seconds: float
    seed: int


def run_torture(
    seed: int,
    crashes: int,
    faults: tuple[str, ...] = FAULTS,
    progress: Callable[[int, int], None] | None = None,
    *,
    first: int = 0,
) -> TortureSummary:
    """`crashes` crash states of `seed`, the fault classes in turn. `first`: the index of the
    first state, so that a long run split into parts (run side by side) covers the same states."""
    assert first >= 0, first
    started = time.perf_counter()
    by_fault = dict.fromkeys(faults, 0)
    violations: list[Violation] = []
    single = crashes == 1 and first == 0  # (one state: the seed itself, as --crashes 1 replays)
    for done, index in enumerate(range(first, first + crashes), start=1):
        fault = faults[index % len(faults)]
        violations.extend(run_crash_state(seed if single else crash_seed(seed, index), fault))
        by_fault[fault] += 1
        if progress is not None:
            progress(done, crashes)
    return TortureSummary(crashes, by_fault, violations, time.perf_counter() - started, seed)
