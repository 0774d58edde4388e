"""The crash torture harness: a seeded workload, a crash, recovery, and the checker.

One crash state: idempotent producers append (with retries, epoch bumps, flushes,
rolls and clean reopens) to a Log on the fault-injecting twin, interleaved with
transactional producers that open transactions, send 1-3 transactional batches and
commit or abort them (brief §8), sometimes leaving one open across flushes, rolls,
reopens and the crash; the twin then crashes in one fault class (brief §9); the log
is reopened on what the crash left; the checker enforces every invariant:

1. every acknowledged-durable batch is present, at its offset, byte for byte (after
   a kill, every acknowledged batch: the page cache survives);
2. nothing appears twice and there are no holes;
3. the log is a prefix of what was written: no byte that was never written;
4. producer state equals a full replay of the recovered log;
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
   crash are committed or aborted on the recovered log.

A bit flip below the recovery point must be reported (CorruptLogError), never
served; a failed fsync must never be followed by an acknowledgement.

Every crash state has its own seed; `replay_command` reproduces it exactly.
"""

from __future__ import annotations

import bisect
import errno
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from oncelog.config import LogConfig
from oncelog.errors import (
    CorruptLogError,
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    LogFailedError,
    OncelogError,
    TransactionCoordinatorFencedError,
)
from oncelog.log import METADATA_DIR, Log
from oncelog.producer_state import ProducerStateManager
from oncelog.recovery.faultfs import FaultFileSystem, SimulatedCrash
from oncelog.recovery.loader import read_recovery_point
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.control import decode_txn_marker, encode_txn_marker

FAULTS = ("kill", "drop", "torn", "dirent", "bitflip", "enospc", "eio", "misdirect")
DIRECTORY = "/torture/topic-0"
CLOCK_MS = 1_800_000_000_000
# Small segments and indexes, so rolls, full indexes and several segments happen.
CONFIG = LogConfig(
    segment_bytes=2048,
    index_interval_bytes=256,
    segment_index_bytes=1024,
    producer_expiration_ms=10**13,
    # Five producers: a small table keeps each open (and the checker's replay) from
    # allocating the default 100,000 rows, most of a crash state's time otherwise.
    producer_capacity=64,
)
PRODUCERS = (11, 12, 13)  # idempotent producers
TXN_PRODUCERS = (21, 22)  # transactional producers: two, so their transactions interleave
TAIL_SLACK_BYTES = 4096
# Each seam call of a workload is a possible kill point; workloads make a few hundred.
MAX_KILL_POINT = 400
# read_committed scans fetch this many bytes at a time (chosen by the crash state's
# seed): one batch per fetch makes every fetch compute its own aborted list.
READ_COMMITTED_FETCH_BYTES = (1, 700, 64 * 1024)

COMMITTED = "commit"
ABORTED = "abort"
OPEN = "open"


class Violation(NamedTuple):
    seed: int
    fault: str
    invariant: str
    detail: str

    @property
    def replay_command(self) -> str:
        return f"oncelog torture --seed {self.seed} --crashes 1 --faults {self.fault}"


class OnlineCheckFailed(AssertionError):
    """The workload saw the live log break a rule (a retry, a refusal, the stable offset)."""

    def __init__(self, invariant: str, detail: str):
        super().__init__(detail)
        self.invariant = invariant


@dataclass
class Txn:
    """One transaction as the workload drove it."""

    producer_id: int
    first_offset: int  # the offset its first batch was handed to append() at
    batches: list[int] = field(default_factory=list)  # offsets of its data batches
    marker_offset: int = -1  # where its marker was handed to write_txn_marker(), -1: not yet
    commit: bool | None = None  # the marker's kind, once handed to the log
    acked: bool = False  # write_txn_marker() returned

    @property
    def outcome(self) -> str:
        """As acknowledged: committed or aborted once its marker's write returned, else open."""
        if not self.acked:
            return OPEN
        return COMMITTED if self.commit else ABORTED


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
    # Every transaction begun, and for each transactional data batch the one it belongs to.
    txns: list[Txn] = field(default_factory=list)
    txn_of: dict[int, Txn] = field(default_factory=dict)


def crash_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index) % (2**63)


def _batch(
    rng: random.Random, producer_id: int, epoch: int, sequence: int, *, transactional: bool = False
) -> bytes:
    records = [
        (b"k%d" % rng.randrange(1000), rng.randbytes(rng.randrange(0, 120))) for _ in range(rng.randint(1, 3))
    ]
    return encode_batch(
        records,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=transactional,
        timestamp_ms=CLOCK_MS,
    )


def _stamped(batch: bytes, offset: int) -> bytes:
    return offset.to_bytes(8, "big", signed=True) + batch[8:]


@dataclass
class _TxnProducer:
    """A transactional producer and the coordinator driving its transactions."""

    producer_id: int
    epoch: int = 0
    sequence: int = 0
    coordinator_epoch: int = 0  # the coordinator's: fixed, or increasing now and then
    stored_coordinator_epoch: int = -1  # of the last marker the log acknowledged
    planned: int = 0  # data batches the open transaction will send
    txn: Txn | None = None


class _Workload:
    """The producers' state while run_workload drives a Log."""

    def __init__(self, rng: random.Random, model: Model):
        self.rng = rng
        self.model = model
        self.epochs = dict.fromkeys(PRODUCERS, 0)
        self.sequences = dict.fromkeys(PRODUCERS, 0)
        self.txn = {pid: _TxnProducer(pid) for pid in TXN_PRODUCERS}
        self.recent: dict[int, list[tuple[bytes, int]]] = {pid: [] for pid in PRODUCERS + TXN_PRODUCERS}

    def _ack(self, offset: int, data: bytes) -> None:
        if self.model.fsync_failed:
            self.model.acked_after_fsync_failure += 1
        self.model.acked[offset] = data

    def append(self, log: Log, pid: int) -> None:
        batch = _batch(self.rng, pid, self.epochs[pid], self.sequences[pid])
        offset = log.log_end_offset
        self.model.written[offset] = _stamped(batch, offset)
        result = log.append(batch)
        self._ack(result.first_offset, _stamped(batch, result.first_offset))
        self.recent[pid] = [*self.recent[pid][-4:], (batch, result.first_offset)]
        self.sequences[pid] += RecordBatch(batch).records_count

    def retry(self, log: Log, pid: int) -> None:
        batch, offset = self.rng.choice(self.recent[pid])
        result = log.append(batch)
        if not (result.duplicate and result.first_offset == offset):
            raise OnlineCheckFailed(
                "retries are duplicates", f"online retry of offset {offset} gave {result}"
            )

    def transaction_step(self, log: Log, p: _TxnProducer) -> None:
        """Begin a transaction, send its next batch, or end it: one call of the coordinator."""
        rng = self.rng
        if p.txn is None:
            if rng.random() < 0.1:
                self.marker(log, p, commit=rng.random() < 0.5, bump_epoch=False)  # an empty transaction
                return
            p.planned = rng.randint(1, 3)
            self.send(log, p)
        elif len(p.txn.batches) < p.planned:
            self.send(log, p)
        else:
            if rng.random() < 0.25:
                p.coordinator_epoch += 1  # a new coordinator took over
            # An abort on a timeout bumps the producer epoch (so can a commit, as in KIP-890).
            self.marker(log, p, commit=rng.random() < 0.5, bump_epoch=rng.random() < 0.15)

    def send(self, log: Log, p: _TxnProducer) -> None:
        pid = p.producer_id
        batch = _batch(self.rng, pid, p.epoch, p.sequence, transactional=True)
        offset = log.log_end_offset
        if p.txn is None:
            p.txn = Txn(pid, offset)
            self.model.txns.append(p.txn)
        p.txn.batches.append(offset)
        self.model.txn_of[offset] = p.txn
        self.model.written[offset] = _stamped(batch, offset)
        result = log.append(batch)
        if result.first_offset != offset or result.duplicate:
            raise OnlineCheckFailed(
                "transactional data lands at the log end", f"offset {offset} gave {result}"
            )
        self._ack(offset, _stamped(batch, offset))
        self.recent[pid] = [*self.recent[pid][-4:], (batch, offset)]
        p.sequence += RecordBatch(batch).records_count

    def marker(self, log: Log, p: _TxnProducer, *, commit: bool, bump_epoch: bool) -> None:
        pid = p.producer_id
        epoch = p.epoch + 1 if bump_epoch else p.epoch
        offset = log.log_end_offset
        data = encode_txn_marker(
            pid,
            epoch,
            commit=commit,
            coordinator_epoch=p.coordinator_epoch,
            timestamp_ms=CLOCK_MS,
            base_offset=offset,
        )
        self.model.written[offset] = data
        if p.txn is not None:
            p.txn.marker_offset, p.txn.commit = offset, commit
        result = log.write_txn_marker(pid, epoch, commit=commit, coordinator_epoch=p.coordinator_epoch)
        if result.first_offset != offset:
            raise OnlineCheckFailed("markers land at the log end", f"marker at {offset} gave {result}")
        self._ack(offset, data)
        if p.txn is not None:
            p.txn.acked = True
            p.txn = None
        p.stored_coordinator_epoch = p.coordinator_epoch
        if epoch != p.epoch:
            p.epoch, p.sequence = epoch, 0
            self.recent[pid] = []

    def refusal(self, log: Log, p: _TxnProducer) -> None:
        """Something the log must refuse without writing: a fenced marker, or non-transactional
        data while the producer's transaction is open."""
        pid = p.producer_id
        rng = self.rng
        attempts: list[tuple[str, type[Exception], Callable[[], object]]] = []
        if p.stored_coordinator_epoch >= 1:
            stale = rng.randrange(p.stored_coordinator_epoch)
            attempts.append(
                (
                    "a marker from an older coordinator epoch is fenced",
                    TransactionCoordinatorFencedError,
                    lambda: log.write_txn_marker(pid, p.epoch, commit=True, coordinator_epoch=stale),
                )
            )
        if p.epoch >= 1 and log.producer_state(pid) is not None:
            attempts.append(
                (
                    "a marker from an older producer epoch is fenced",
                    InvalidProducerEpochError,
                    lambda: log.write_txn_marker(
                        pid, p.epoch - 1, commit=False, coordinator_epoch=p.coordinator_epoch
                    ),
                )
            )
        if p.txn is not None:
            plain = _batch(rng, pid, p.epoch, p.sequence)
            attempts.append(
                (
                    "non-transactional data in an open transaction is refused",
                    InvalidTxnStateError,
                    lambda: log.append(plain),
                )
            )
        if not attempts:
            return
        invariant, expected, attempt = attempts[rng.randrange(len(attempts))]
        end, stable = log.log_end_offset, log.last_stable_offset
        try:
            got = attempt()
        except expected:
            got = None
        except LogFailedError:
            raise  # an injected fault: the workload ends as for any failed write
        except OncelogError as exc:
            raise OnlineCheckFailed(invariant, f"producer {pid}: refused with {exc!r}") from exc
        if got is not None:
            raise OnlineCheckFailed(invariant, f"producer {pid}: accepted, gave {got}")
        if (log.log_end_offset, log.last_stable_offset) != (end, stable):
            raise OnlineCheckFailed(invariant, f"producer {pid}: a refused write moved the log")

    def check_stable_offset(self, log: Log) -> None:
        opened = [p.txn.first_offset for p in self.txn.values() if p.txn is not None]
        expected = min(opened, default=log.log_end_offset)
        if log.last_stable_offset != expected:
            raise OnlineCheckFailed(
                "last stable offset is the oldest open transaction",
                f"live log: {log.last_stable_offset}, open transactions start at {sorted(opened)}, "
                f"log end {log.log_end_offset}",
            )


def run_workload(fs: FaultFileSystem, rng: random.Random, model: Model, steps: int) -> None:
    """Drive a Log until `steps` are done, the twin dies, or the log fails closed."""
    clock: Callable[[], int] = lambda: CLOCK_MS  # noqa: E731 - a fixed clock keeps runs reproducible
    w = _Workload(rng, model)
    try:
        log = Log.open(DIRECTORY, CONFIG, fs=fs, clock=clock)
    except LogFailedError:
        return  # an injected error while creating the log: nothing was acknowledged
    try:
        for _ in range(steps):
            action = rng.random()
            pid = rng.choice(PRODUCERS)
            if action < 0.42:
                w.append(log, pid)
            elif action < 0.62:
                w.transaction_step(log, w.txn[rng.choice(TXN_PRODUCERS)])
            elif action < 0.69:
                retried = rng.choice(PRODUCERS + TXN_PRODUCERS)
                if w.recent[retried]:
                    w.retry(log, retried)
            elif action < 0.8:
                log.flush()
                model.durable_end = log.log_end_offset
            elif action < 0.86:
                log.roll()
            elif action < 0.9:
                w.epochs[pid] += 1
                w.sequences[pid] = 0
                w.recent[pid] = []
            elif action < 0.93:
                w.refusal(log, w.txn[rng.choice(TXN_PRODUCERS)])
            else:
                log.close()
                model.durable_end = log.log_end_offset  # close flushes
                log = Log.open(DIRECTORY, CONFIG, fs=fs, clock=clock)
            w.check_stable_offset(log)
    except LogFailedError as exc:
        if isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EIO and "fsync" in str(exc):
            model.fsync_failed = True
        # Failed closed: the log refuses everything until reopened; so does the workload.
        try:
            log.append(_batch(rng, PRODUCERS[0], w.epochs[PRODUCERS[0]], w.sequences[PRODUCERS[0]]))
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


# -- transactions as the log's own batches say ---------------------------------------------------
class TxnView(NamedTuple):
    """The transactions of a log, derived from the markers actually in it."""

    outcomes: dict[int, str]  # first offset of each transaction -> COMMITTED, ABORTED or OPEN
    txn_of: dict[int, int]  # base offset of each transactional data batch -> its transaction's first offset
    open_txns: dict[int, int]  # producer id -> first offset of its open transaction
    stable: int  # the last stable offset these give
    # (base offset, last offset, kind) of every batch: "plain", "control", or an outcome
    ranges: list[tuple[int, int, str]]


def derive_transactions(batches: Sequence[RecordBatch], end: int) -> TxnView:
    """Replay the batches (in offset order) as a read_committed consumer's view depends on them:
    a transactional data batch opens its producer's transaction if none is open; a COMMIT or
    ABORT marker closes it; a producer with an open transaction and no marker after it is open."""
    open_txns: dict[int, int] = {}
    outcomes: dict[int, str] = {}
    txn_of: dict[int, int] = {}
    for batch in batches:
        pid = batch.producer_id
        if batch.is_control:
            marker = decode_txn_marker(batch) if pid >= 0 else None
            if marker is not None and pid in open_txns:
                outcomes[open_txns.pop(pid)] = COMMITTED if marker.commit else ABORTED
        elif batch.is_transactional:
            first = open_txns.setdefault(pid, batch.base_offset)
            outcomes.setdefault(first, OPEN)
            txn_of[batch.base_offset] = first
    ranges = []
    for batch in batches:
        if batch.is_control:
            kind = "control"
        elif batch.base_offset in txn_of:
            kind = outcomes[txn_of[batch.base_offset]]
        else:
            kind = "plain"
        ranges.append((batch.base_offset, batch.last_offset, kind))
    return TxnView(outcomes, txn_of, open_txns, min(open_txns.values(), default=end), ranges)


def read_committed(log: Log, max_bytes: int) -> tuple[list[int], list[int]]:
    """Offsets of the records a read_committed scan returns, and the last offsets of its batches."""
    offsets: list[int] = []
    batch_ends: list[int] = []
    offset = log.log_start_offset
    while offset < log.last_stable_offset:
        fetched = log.read(offset, max_bytes, isolation="read_committed")
        if fetched.next_offset <= offset:
            break
        batch_ends += [batch.last_offset for batch in fetched.batches]
        offsets += [record.offset for record in fetched.records()]
        offset = fetched.next_offset
    return offsets, batch_ends


def check_read_committed(
    log: Log, batches: Sequence[RecordBatch], max_bytes: int, violation: Callable[[str, str], None]
) -> TxnView:
    """The engine's read_committed view and last stable offset against what the log's batches give."""
    view = derive_transactions(batches, log.log_end_offset)
    stable = log.last_stable_offset
    if stable != view.stable:
        violation(
            "last stable offset is the oldest open transaction",
            f"last_stable_offset {stable}, open transactions {view.open_txns} give {view.stable}",
        )
    offsets, batch_ends = read_committed(log, max_bytes)
    invariant = "read_committed returns only committed data"
    beyond = [end for end in batch_ends if end >= stable]
    if beyond:
        violation(invariant, f"batches ending at {beyond[:5]} fetched past the last stable offset {stable}")
    starts = [first for first, _, _ in view.ranges]
    wrong: dict[str, list[int]] = {}
    for offset in offsets:
        n = bisect.bisect_right(starts, offset) - 1
        kind = view.ranges[n][2] if n >= 0 and offset <= view.ranges[n][1] else "nowhere"
        if offset >= view.stable:
            kind = f"{kind} past the last stable offset {view.stable}"
        if kind not in ("plain", COMMITTED):
            wrong.setdefault(kind, []).append(offset)
    for kind, where in wrong.items():
        what = {ABORTED: "aborted", OPEN: "still-open", "control": "control"}.get(kind, kind)
        violation(invariant, f"returned records of {what} data at offsets {where[:5]}")
    if offsets != sorted(set(offsets)):
        violation(invariant, "records returned out of order or twice")
    expected = [
        offset
        for first, last, kind in view.ranges
        if kind in ("plain", COMMITTED) and last < view.stable
        for offset in range(first, last + 1)
    ]
    missing = sorted(set(expected) - set(offsets))
    if missing:
        violation("read_committed returns all committed data", f"offsets {missing[:5]} never returned")
    return view


def _check_txn_outcomes(
    view: TxnView, model: Model, fault: str, violation: Callable[[str, str], None]
) -> None:
    """The recovered transactions are the ones written, and acknowledged-durable markers closed theirs."""
    for offset, first in view.txn_of.items():
        txn = model.txn_of.get(offset)
        if txn is None or txn.first_offset != first:
            began = None if txn is None else txn.first_offset
            violation(
                "transactions are as written",
                f"batch {offset} is in a transaction from {first}, the workload's began at {began}",
            )
    for first, outcome in view.outcomes.items():
        txn = model.txn_of.get(first)
        if txn is not None and outcome != OPEN and outcome != (COMMITTED if txn.commit else ABORTED):
            violation("transactions are as written", f"transaction from {first} recovered as {outcome}")
    after_kill = fault in ("kill", "enospc")  # the page cache survives: every ack must
    for txn in model.txns:
        if not txn.acked or not (after_kill or txn.marker_offset < model.durable_end):
            continue
        if view.outcomes.get(txn.first_offset) != txn.outcome:
            violation(
                "acknowledged transaction outcomes survive",
                f"producer {txn.producer_id}'s transaction from {txn.first_offset}, {txn.outcome} by the "
                f"marker at {txn.marker_offset} (durable end {model.durable_end}), recovered as "
                f"{view.outcomes.get(txn.first_offset)}",
            )


def _complete_open_transactions(
    log: Log, batches: list[RecordBatch], view: TxnView, seed: int, violation: Callable[[str, str], None]
) -> None:
    """The coordinator ends, on the recovered log, every transaction the crash left open."""
    rng = random.Random(f"{seed}/complete")
    decided: dict[int, str] = {}
    for pid, first in sorted(view.open_txns.items()):
        entry = log.producer_state(pid)
        if entry is None:
            violation("open transactions can be ended after recovery", f"producer {pid} has no state")
            continue
        commit = rng.random() < 0.5
        try:
            result = log.write_txn_marker(
                pid, entry.producer_epoch, commit=commit, coordinator_epoch=max(entry.coordinator_epoch, 0)
            )
        except OncelogError as exc:
            violation("open transactions can be ended after recovery", f"producer {pid}: {exc!r}")
            return
        batches.extend(log.read(result.first_offset, 1).batches[:1])
        decided[first] = COMMITTED if commit else ABORTED
    if not decided:
        return
    if log.last_stable_offset != log.log_end_offset:
        violation(
            "open transactions can be ended after recovery",
            f"all ended, yet last_stable_offset {log.last_stable_offset} != log end {log.log_end_offset}",
        )
    ended = check_read_committed(log, batches, READ_COMMITTED_FETCH_BYTES[seed % 3], violation)
    for first, outcome in decided.items():
        if ended.outcomes.get(first) != outcome:
            violation(
                "open transactions can be ended after recovery",
                f"transaction from {first} should be {outcome}, the log gives {ended.outcomes.get(first)}",
            )


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
    max_bytes = READ_COMMITTED_FETCH_BYTES[seed % 3]
    try:
        present = {batch.base_offset: batch.buffer.tobytes() for batch in _read_all(log)}
        batches = [RecordBatch(present[offset]) for offset in sorted(present)]
        end = log.log_end_offset
        scanned = log.recovery_report.bytes_scanned
        # Brief §5: recovery cost follows the tail. Only faults that cannot damage fsynced
        # snapshots or indexes are held to it (a bit flip or misdirected write may).
        if fault not in ("bitflip", "misdirect") and scanned > tail_bytes + TAIL_SLACK_BYTES:
            violation("recovery reads only the tail", f"scanned {scanned} bytes, the tail holds {tail_bytes}")
        _check_log_contents(batches, present, end, model, fault, violation)
        _check_producer_state(log, present, violation, batches)
        view = check_read_committed(log, batches, max_bytes, violation)
        _check_txn_outcomes(view, model, fault, violation)
        _check_retries(log, present, model, violation)
        _check_second_crash(log, fs, present, max_bytes, violation)
        _complete_open_transactions(log, batches, view, seed, violation)
    except (CorruptLogError, CorruptRecordError) as exc:
        if fault not in ("bitflip", "misdirect"):
            violation("reads succeed", str(exc))
        log.close()
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
    batches: Sequence[RecordBatch],
    present: dict[int, bytes],
    end: int,
    model: Model,
    fault: str,
    violation: Callable[[str, str], None],
) -> None:
    expected = 0
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
    must_survive = model.acked if fault in ("kill", "enospc") else {}
    for offset, data in model.acked.items():
        durable = RecordBatch(data).last_offset < model.durable_end
        if (durable or offset in must_survive) and present.get(offset) != data:
            why = "durable" if durable else "acknowledged before a kill"
            kind = "marker" if RecordBatch(data).is_control else "batch"
            violation("acknowledged data survives", f"{why} {kind} at {offset} is missing or changed")


def _check_producer_state(
    log: Log,
    present: dict[int, bytes],
    violation: Callable[[str, str], None],
    batches: Sequence[RecordBatch] | None = None,
) -> None:
    """Producer state (windows, epochs, coordinator epochs, open transactions) equals a full replay."""
    replayed = ProducerStateManager(CONFIG.producer_capacity, CONFIG.producer_expiration_ms)
    if batches is None:
        batches = [RecordBatch(present[offset]) for offset in sorted(present)]
    for batch in batches:
        if batch.producer_id < 0:
            continue
        if batch.is_control:
            marker = decode_txn_marker(batch)
            if marker is not None:
                replayed.replay_marker(
                    batch.producer_id, batch.producer_epoch, batch.base_offset, batch.max_timestamp, marker
                )
            continue
        replayed.replay_batch(
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            batch.last_sequence,
            batch.base_offset,
            batch.last_offset,
            batch.max_timestamp,
            False,
            batch.is_transactional,
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
    log: Log,
    fs: FaultFileSystem,
    present: dict[int, bytes],
    max_bytes: int,
    violation: Callable[[str, str], None],
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

    def after_second_crash(invariant: str, detail: str) -> None:
        violation(invariant, f"after a second crash: {detail}")

    check_read_committed(
        reopened,
        [RecordBatch(survived[offset]) for offset in sorted(survived)],
        max_bytes,
        after_second_crash,
    )
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
    except OnlineCheckFailed as exc:
        return [Violation(seed, fault, exc.invariant, str(exc))]
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
