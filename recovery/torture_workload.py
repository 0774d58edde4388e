"""The seeded workload a crash state runs on the fault-injecting twin before its crash.

Idempotent producers append (with retries, epoch bumps, flushes, rolls and clean
reopens) interleaved with transactional producers that open transactions, send 1-3
transactional batches and commit or abort them, sometimes leaving one open across
flushes, rolls, reopens and the crash. Everything it hands to the log and every
acknowledgement goes into the Model, which is all the checker knows of the run; the
rules the live log must keep (retries, refusals, the stable offset) are checked
online and raise OnlineCheckFailed.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable
from dataclasses import dataclass

from oncelog.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    LogFailedError,
    OncelogError,
    TransactionCoordinatorFencedError,
)
from oncelog.log import Log
from oncelog.recovery.faultfs import FaultFileSystem
from oncelog.recovery.torture_cuts import cut_model, next_sequence, retention_plan, truncation_end
from oncelog.recovery.torture_model import (
    CLOCK_MS,
    CONFIG,
    DIRECTORY,
    PRODUCERS,
    TXN_PRODUCERS,
    Model,
    OnlineCheckFailed,
    Txn,
)
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.control import encode_txn_marker


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

    def truncate(self, log: Log) -> None:
        """A follower cuts its diverged suffix: mostly the last few offsets, now and then deep."""
        rng, model = self.rng, self.model
        start, end = log.log_start_offset, log.log_end_offset
        offset = rng.randint(start if rng.random() < 0.3 else max(start, end - 8), end)
        expected = truncation_end(model, offset)
        model.pending_cut = offset
        new_end = log.truncate_to(offset)
        if new_end != expected or log.log_end_offset != expected:
            raise OnlineCheckFailed(
                "truncation cuts whole batches", f"truncate_to({offset}) gave {new_end}, expected {expected}"
            )
        cut_model(model, new_end)
        model.pending_cut, model.truncations = None, model.truncations + 1
        if log.log_start_offset != model.log_start:
            raise OnlineCheckFailed(
                "truncation keeps the log start",
                f"truncate_to({offset}): start {log.log_start_offset}, expected {model.log_start}",
            )
        self.resume_after_truncation(log, new_end)

    def resume_after_truncation(self, log: Log, new_end: int) -> None:
        """Producers continue from the state the log reports; its open transactions are the Model's."""
        for pid in PRODUCERS:
            self.recent[pid] = [(batch, offset) for batch, offset in self.recent[pid] if offset < new_end]
            self.sequences[pid] = next_sequence(self.model, pid, self.epochs[pid])
        for p in self.txn.values():
            pid = p.producer_id
            self.recent[pid] = [(batch, offset) for batch, offset in self.recent[pid] if offset < new_end]
            entry = log.producer_state(pid)
            if entry is not None:
                p.epoch = entry.producer_epoch
            p.stored_coordinator_epoch = entry.coordinator_epoch if entry is not None else -1
            p.coordinator_epoch = max(p.coordinator_epoch, p.stored_coordinator_epoch)
            p.sequence = next_sequence(self.model, pid, p.epoch)
            first = entry.current_txn_first_offset if entry is not None else -1
            opened = [txn for txn in self.model.txns if txn.producer_id == pid and not txn.acked]
            if [txn.first_offset for txn in opened] != ([first] if first >= 0 else []):
                raise OnlineCheckFailed(
                    "truncation rebuilds open transactions",
                    f"producer {pid} after truncate_to: the log's transaction from {first}, the "
                    f"workload's open ones from {[txn.first_offset for txn in opened]}",
                )
            p.txn = opened[0] if opened else None
            if p.txn is not None:
                p.planned = max(len(p.txn.batches), self.rng.randint(1, 3))

    def delete_records(self, log: Log) -> None:
        rng, model = self.rng, self.model
        start, end = log.log_start_offset, log.log_end_offset
        before = rng.randint(max(start - 2, 0), end)
        expected = max(before, start)
        model.pending_start = expected
        got = log.delete_records(before)
        if got != expected or log.log_start_offset != expected:
            raise OnlineCheckFailed(
                "delete_records moves the start to its offset",
                f"delete_records({before}) from start {start}: gave {got}, log start {log.log_start_offset}",
            )
        model.log_start, model.pending_start = got, None
        model.starts_moved += got > start

    def retention(self, log: Log) -> None:
        rng, model = self.rng, self.model
        week = log.config.retention_ms or 0
        now = CLOCK_MS if rng.random() < 0.85 else CLOCK_MS + week + 1  # now and then: all expired
        count, expected = retention_plan(log, now)
        model.pending_start = expected
        got = log.apply_retention(now)
        if got != count or log.log_start_offset != expected:
            raise OnlineCheckFailed(
                "retention deletes exactly the segments past it",
                f"apply_retention: {got} segments, start {log.log_start_offset}; "
                f"expected {count}, {expected}",
            )
        model.starts_moved += expected > model.log_start
        model.log_start, model.pending_start = expected, None

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
            if action < 0.41:
                w.append(log, pid)
            elif action < 0.61:
                w.transaction_step(log, w.txn[rng.choice(TXN_PRODUCERS)])
            elif action < 0.67:
                retried = rng.choice(PRODUCERS + TXN_PRODUCERS)
                if w.recent[retried]:
                    w.retry(log, retried)
            elif action < 0.77:
                log.flush()
                model.durable_end = log.log_end_offset
            elif action < 0.83:
                log.roll()
            elif action < 0.86:
                w.epochs[pid] += 1
                w.sequences[pid] = 0
                w.recent[pid] = []
            elif action < 0.89:
                w.refusal(log, w.txn[rng.choice(TXN_PRODUCERS)])
            elif action < 0.92:
                w.truncate(log)
            elif action < 0.935:
                w.delete_records(log)
            elif action < 0.95:
                w.retention(log)
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
