"""The crash torture harness: a seeded workload, a crash, recovery, and the checker.

One crash state: idempotent producers append (with retries, epoch bumps, flushes,
rolls and clean reopens) to a Log on the fault-injecting twin; the twin then
crashes in one fault class (brief §9); the log is reopened on what the crash left;
the checker enforces every invariant:

1. every acknowledged-durable batch is present, at its offset, byte for byte (after
   a kill, every acknowledged batch: the page cache survives);
2. nothing appears twice and there are no holes;
3. the log is a prefix of what was written: no byte that was never written;
4. producer state equals a full replay of the recovered log;
5. a retry of any batch in a producer's recovered window comes back as a
   duplicate with its original offsets;
6. a second crash right after recovery loses nothing recovery exposed.

A bit flip below the recovery point must be reported (CorruptLogError), never
served; a failed fsync must never be followed by an acknowledgement.

Every crash state has its own seed; `replay_command` reproduces it exactly.
"""

from __future__ import annotations

import errno
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from oncelog.config import LogConfig
from oncelog.errors import CorruptLogError, CorruptRecordError, LogFailedError, OncelogError
from oncelog.log import METADATA_DIR, Log
from oncelog.producer_state import ProducerStateManager
from oncelog.recovery.faultfs import FaultFileSystem, SimulatedCrash
from oncelog.recovery.loader import read_recovery_point
from oncelog.segments.batch import RecordBatch, encode_batch

FAULTS = ("kill", "drop", "torn", "dirent", "bitflip", "enospc", "eio", "misdirect")
DIRECTORY = "/torture/topic-0"
CLOCK_MS = 1_800_000_000_000
# Small segments and indexes, so rolls, full indexes and several segments happen.
CONFIG = LogConfig(
    segment_bytes=2048,
    index_interval_bytes=256,
    segment_index_bytes=1024,
    producer_expiration_ms=10**13,
)
PRODUCERS = (11, 12, 13)
TAIL_SLACK_BYTES = 4096
# Each seam call of a workload is a possible kill point; workloads make a few hundred.
MAX_KILL_POINT = 400


class Violation(NamedTuple):
    seed: int
    fault: str
    invariant: str
    detail: str

    @property
    def replay_command(self) -> str:
        return f"oncelog torture --seed {self.seed} --crashes 1 --faults {self.fault}"


@dataclass
class Model:
    """What the workload did, as the checker needs it."""

    # Every batch handed to append(), by the offset it would take: a batch killed
    # mid-append may or may not be in the log, but no other bytes may be.
    written: dict[int, bytes] = field(default_factory=dict)
    acked: dict[int, bytes] = field(default_factory=dict)
    durable_end: int = 0  # log end at the last flush that returned
    fsync_failed: bool = False
    acked_after_fsync_failure: int = 0


def crash_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index) % (2**63)


def _batch(rng: random.Random, producer_id: int, epoch: int, sequence: int) -> bytes:
    records = [
        (b"k%d" % rng.randrange(1000), rng.randbytes(rng.randrange(0, 120))) for _ in range(rng.randint(1, 3))
    ]
    return encode_batch(
        records, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence, timestamp_ms=CLOCK_MS
    )


def _stamped(batch: bytes, offset: int) -> bytes:
    return offset.to_bytes(8, "big", signed=True) + batch[8:]


def run_workload(fs: FaultFileSystem, rng: random.Random, model: Model, steps: int) -> None:
    """Drive a Log until `steps` are done, the twin dies, or the log fails closed."""
    clock: Callable[[], int] = lambda: CLOCK_MS  # noqa: E731 - a fixed clock keeps runs reproducible
    epochs = dict.fromkeys(PRODUCERS, 0)
    sequences = dict.fromkeys(PRODUCERS, 0)
    recent: dict[int, list[tuple[bytes, int]]] = {pid: [] for pid in PRODUCERS}
    try:
        log = Log.open(DIRECTORY, CONFIG, fs=fs, clock=clock)
    except LogFailedError:
        return  # an injected error while creating the log: nothing was acknowledged
    try:
        for _ in range(steps):
            action = rng.random()
            pid = rng.choice(PRODUCERS)
            if action < 0.55:
                batch = _batch(rng, pid, epochs[pid], sequences[pid])
                offset = log.log_end_offset
                model.written[offset] = _stamped(batch, offset)
                result = log.append(batch)
                if model.fsync_failed:
                    model.acked_after_fsync_failure += 1
                model.acked[result.first_offset] = _stamped(batch, result.first_offset)
                recent[pid] = [*recent[pid][-4:], (batch, result.first_offset)]
                sequences[pid] += RecordBatch(batch).records_count
            elif action < 0.65 and recent[pid]:
                batch, offset = rng.choice(recent[pid])
                result = log.append(batch)
                if not (result.duplicate and result.first_offset == offset):
                    raise AssertionError(f"online retry of offset {offset} came back as {result}")
            elif action < 0.8:
                log.flush()
                model.durable_end = log.log_end_offset
            elif action < 0.87:
                log.roll()
            elif action < 0.93:
                epochs[pid] += 1
                sequences[pid] = 0
                recent[pid] = []
            else:
                log.close()
                model.durable_end = log.log_end_offset  # close flushes
                log = Log.open(DIRECTORY, CONFIG, fs=fs, clock=clock)
    except LogFailedError as exc:
        if isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EIO and "fsync" in str(exc):
            model.fsync_failed = True
        # Failed closed: the log refuses everything until reopened; so does the workload.
        try:
            log.append(_batch(rng, PRODUCERS[0], epochs[PRODUCERS[0]], sequences[PRODUCERS[0]]))
            model.acked_after_fsync_failure += 1
        except (LogFailedError, OncelogError):
            pass


def _read_all(log: Log) -> Iterator[RecordBatch]:
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset, max_bytes=64 * 1024)
        if not fetched.batches:
            # A log end with no data before it: a broken log, never a reason to spin.
            raise AssertionError(f"no batch at offset {offset}, below the log end {log.log_end_offset}")
        yield from fetched.batches
        offset = fetched.next_offset


def check_recovered(fs: FaultFileSystem, model: Model, fault: str, seed: int) -> list[Violation]:
    """Reopen on the crashed twin and check every invariant."""
    found: list[Violation] = []

    def violation(invariant: str, detail: str) -> None:
        found.append(Violation(seed, fault, invariant, f"{detail} [{fs.describe()}]"))

    if model.acked_after_fsync_failure:
        violation("no ack after a failed fsync", f"{model.acked_after_fsync_failure} acks followed it")
    tail_bytes = _bytes_from_recovery_point(fs)
    try:
        log = Log.open(DIRECTORY, CONFIG, fs=fs, clock=lambda: CLOCK_MS)
    except CorruptLogError:
        # Bytes below the recovery point were changed: reporting it is the right answer.
        if fault not in ("bitflip", "misdirect"):
            violation("recovery succeeds", "CorruptLogError without corruption injected")
        return found
    try:
        present = {batch.base_offset: batch.buffer.tobytes() for batch in _read_all(log)}
    except (CorruptLogError, CorruptRecordError) as exc:
        if fault not in ("bitflip", "misdirect"):
            violation("reads succeed", str(exc))
        log.close()
        return found
    end = log.log_end_offset
    scanned = log.recovery_report.bytes_scanned
    # Brief §5: recovery cost follows the tail. Only faults that cannot damage fsynced
    # snapshots or indexes are held to it (a bit flip or misdirected write may).
    if fault not in ("bitflip", "misdirect") and scanned > tail_bytes + TAIL_SLACK_BYTES:
        violation("recovery reads only the tail", f"scanned {scanned} bytes, the tail holds {tail_bytes}")
    _check_log_contents(present, end, model, fault, violation)
    _check_producer_state(log, present, violation)
    _check_retries(log, present, model, violation)
    _check_second_crash(log, fs, present, violation)
    return found


def _bytes_from_recovery_point(fs: FaultFileSystem) -> int:
    """Bytes in the segments from the one holding the recovery point on: all recovery may read."""
    store = fs.open_store(f"{DIRECTORY}/{METADATA_DIR}")
    try:
        point = read_recovery_point(store)
    finally:
        store.close()
    total = 0
    if not fs.exists(DIRECTORY):
        return total
    bases = [
        int(name[:20]) for name in fs.listdir(DIRECTORY) if name.endswith(".log") and name[:20].isdigit()
    ]
    first = max([base for base in bases if base <= point.offset], default=0)
    for base in bases:
        if base >= first:
            handle = fs.open(f"{DIRECTORY}/{base:020d}.log", writable=False)
            total += handle.size()
            handle.close()
    return total


def _check_log_contents(
    present: dict[int, bytes], end: int, model: Model, fault: str, violation: Callable[[str, str], None]
) -> None:
    expected = 0
    seen: set[tuple[int, int, int]] = set()
    for offset in sorted(present):
        batch = RecordBatch(present[offset])
        if offset != expected:
            violation("no holes", f"batch at {offset}, expected {expected}")
        expected = batch.last_offset + 1
        if model.written.get(offset) != present[offset]:
            violation("prefix of what was written", f"batch at offset {offset} was never written")
        key = (batch.producer_id, batch.producer_epoch, batch.base_sequence)
        if key in seen:
            violation("nothing twice", f"producer batch {key} appears twice")
        seen.add(key)
    if expected != end:
        violation("no holes", f"batches end at {expected}, log end is {end}")
    # After a kill (enospc runs end in one) the page cache survives: every ack must.
    must_survive = model.acked if fault in ("kill", "enospc") else {}
    for offset, data in model.acked.items():
        durable = RecordBatch(data).last_offset < model.durable_end
        if (durable or offset in must_survive) and present.get(offset) != data:
            why = "durable" if durable else "acknowledged before a kill"
            violation("acknowledged data survives", f"{why} batch at {offset} is missing or changed")


def _check_producer_state(log: Log, present: dict[int, bytes], violation: Callable[[str, str], None]) -> None:
    replayed = ProducerStateManager(CONFIG.producer_capacity, CONFIG.producer_expiration_ms)
    for offset in sorted(present):
        batch = RecordBatch(present[offset])
        if batch.producer_id >= 0:
            replayed.replay_batch(
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
                batch.last_sequence,
                batch.base_offset,
                batch.last_offset,
                batch.max_timestamp,
                batch.is_control,
            )
    ours = {entry.producer_id: entry for entry in log.producers()}
    theirs = {entry.producer_id: entry for entry in replayed.entries()}
    if ours != theirs:
        violation("producer state equals a full replay", f"recovered {ours} != replayed {theirs}")


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
    log: Log, fs: FaultFileSystem, present: dict[int, bytes], violation: Callable[[str, str], None]
) -> None:
    # Recovery fsynced what it exposed, so even a power loss now must keep it.
    again = fs.crash("drop")
    try:
        reopened = Log.open(DIRECTORY, CONFIG, fs=again, clock=lambda: CLOCK_MS)
    except OncelogError as exc:
        violation("a second crash loses nothing", f"reopen failed: {exc}")
        return
    survived = {batch.base_offset: batch.buffer.tobytes() for batch in _read_all(reopened)}
    lost = [offset for offset, data in present.items() if survived.get(offset) != data]
    if lost:
        violation("a second crash loses nothing", f"offsets {lost[:5]} lost after recovery exposed them")
    reopened.close()


def run_crash_state(seed: int, fault: str) -> list[Violation]:
    """One workload, one crash of class `fault`, one recovery and check."""
    if fault not in FAULTS:
        raise ValueError(f"fault is one of {FAULTS}, got {fault!r}")
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
    except AssertionError as exc:
        return [Violation(seed, fault, "retries are duplicates", str(exc))]
    except Exception as exc:
        return [Violation(seed, fault, "no unexpected error", f"workload: {type(exc).__name__}: {exc}")]
    mode = {"enospc": "kill", "eio": "drop"}.get(fault, fault)
    if fault == "bitflip":
        crashed = fs.crash("bitflip", target=lambda path: path.endswith(".log"))
    else:
        crashed = fs.crash(mode)  # type: ignore[arg-type]
    # The disk is healthy again for recovery: the faults were in the run before the crash.
    crashed.write_error_rate = crashed.fsync_error_rate = 0.0
    try:
        return check_recovered(crashed, model, fault, seed)
    except Exception as exc:  # an engine that misbehaves may raise anywhere: that is a finding too
        return [Violation(seed, fault, "no unexpected error", f"{type(exc).__name__}: {exc}")]


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
) -> TortureSummary:
    started = time.perf_counter()
    by_fault = dict.fromkeys(faults, 0)
    violations: list[Violation] = []
    for index in range(crashes):
        fault = faults[index % len(faults)]
        violations.extend(run_crash_state(crash_seed(seed, index) if crashes > 1 else seed, fault))
        by_fault[fault] += 1
        if progress is not None:
            progress(index + 1, crashes)
    return TortureSummary(crashes, by_fault, violations, time.perf_counter() - started, seed)
