"""The seeded workload a crash state runs on the fault-injecting twin before its crash.

Idempotent producers append (with retries, epoch bumps, flushes, rolls and clean
reopens) interleaved with transactional producers that open transactions, send 1-3
transactional batches and commit or abort them, sometimes leaving one open across
flushes, rolls, reopens and the crash. Everything it hands to the log and every
acknowledgement goes into the Model, which is all the checker knows of the run; the
rules the live log must keep (retries, refusals, the stable offset) are checked
online and raise OnlineCheckFailed.

Time: the engine's clock advances irregularly, with idle gaps longer than the
expiration now and then, while each producer stamps its batches from its own client
clock (current, years behind, days ahead, or jittered by hours). Expiry must follow
the engine's clock alone: every step checks that each producer appended within the
expiration is still known, and before a producer idle past it acts again, an
exhaustive expiry must have forgotten it (unless a reload counted it as appended
later), and its next batch, at a new epoch and an arbitrary sequence, must be
accepted as an unknown producer's.
"""

from __future__ import annotations

import errno
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

from oncelog import threads
from oncelog.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    LogFailedError,
    OncelogError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from oncelog.log import Log
from oncelog.results import AppendResult
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.control import encode_txn_marker
from oncelog.torture.concurrent import concurrent_step
from oncelog.torture.cuts import cut_model, next_sequence, retention_plan, truncation_end
from oncelog.torture.faultfs import FaultFileSystem, SimulatedCrash
from oncelog.torture.model import (
    CLIENT_CLOCKS,
    CONFIG,
    DIRECTORY,
    EXPIRATION_MS,
    HOUR_MS,
    PRODUCERS,
    TXN_PRODUCERS,
    EngineClock,
    Model,
    OnlineCheckFailed,
    Txn,
    stamped,
)
from oncelog.torture.threads import Scheduler


def _batch(
    rng: random.Random,
    producer_id: int,
    epoch: int,
    sequence: int,
    timestamp_ms: int,
    *,
    transactional: bool = False,
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
        timestamp_ms=timestamp_ms,
    )


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


class Workload:
    """The producers' state while run_workload drives a Log."""

    def __init__(self, rng: random.Random, model: Model, clock: EngineClock):
        self.rng = rng
        self.model = model
        self.clock = clock
        self.epochs = dict.fromkeys(PRODUCERS, 0)
        self.sequences = dict.fromkeys(PRODUCERS, 0)
        self.txn = {pid: _TxnProducer(pid) for pid in TXN_PRODUCERS}
        self.recent: dict[int, list[tuple[bytes, int]]] = {pid: [] for pid in PRODUCERS + TXN_PRODUCERS}
        # Each producer's client clock, as an offset from the engine's (jittered or not).
        self.client_clock = {pid: rng.choice(sorted(CLIENT_CLOCKS)) for pid in PRODUCERS + TXN_PRODUCERS}
        # The engine's time of each producer's last acknowledged append or marker: the
        # earliest the log may say it last appended for it.
        self.appended_ms: dict[int, int] = {}
        self.expired: set[int] = set()  # forgotten by the log: the next batch restarts

    # -- time ---------------------------------------------------------------------------
    def stamp(self, pid: int) -> int:
        """A batch timestamp from `pid`'s client clock."""
        kind = self.client_clock[pid]
        jitter = self.rng.randint(-6 * HOUR_MS, 6 * HOUR_MS) if kind == "jittered by hours" else 0
        return self.clock.now_ms + CLIENT_CLOCKS[kind] + jitter

    def tick(self) -> None:
        """The engine's clock moves on irregularly: often not at all, now and then past the expiration."""
        r = self.rng.random()
        if r < 0.5:
            return
        if r < 0.9:
            self.clock.now_ms += self.rng.randint(1, 3000)
        elif r < 0.98:
            self.clock.now_ms += self.rng.randint(EXPIRATION_MS // 6, EXPIRATION_MS * 2 // 3)
        else:
            self.clock.now_ms += self.rng.randint(EXPIRATION_MS, 3 * EXPIRATION_MS)
        self.model.now_ms = self.clock.now_ms

    def _written(self, offset: int, data: bytes) -> None:
        self.model.written[offset] = data
        self.model.append_ms[offset] = self.clock.now_ms

    def _holds_transaction(self, pid: int) -> bool:
        p = self.txn.get(pid)
        return p is not None and p.txn is not None

    def expire_idle(self, log: Log) -> None:
        """Before producers idle past the expiration act again: expire, and see them forgotten."""
        now = self.clock.now_ms
        idle = [
            pid
            for pid, appended in self.appended_ms.items()
            if now - appended >= EXPIRATION_MS
            and pid not in self.expired
            and not self._holds_transaction(pid)
        ]
        if not idle:
            return
        log.expire_producers(exhaustive=True)
        for pid in idle:
            entry = log.producer_state(pid)
            if entry is None:
                self._forget(pid)
                self.model.expiries += 1
            elif now - entry.last_append_ms >= EXPIRATION_MS:
                raise OnlineCheckFailed(
                    "expiry forgets producers idle past the expiration",
                    f"producer {pid} last appended at {entry.last_append_ms}, kept at {now}",
                )
            # Else a reload (truncate_to) counted it as appended later than we did: kept.

    def _forget(self, pid: int) -> None:
        self.expired.add(pid)
        self.recent[pid] = []  # its batches are no longer retriable as duplicates
        if pid in self.txn:
            self.txn[pid].stored_coordinator_epoch = -1  # nothing left to fence with

    def check_kept(self, log: Log) -> None:
        """Every producer appended within the expiration (or in a transaction) is known."""
        now = self.clock.now_ms
        for pid, appended in self.appended_ms.items():
            if pid in self.expired or (now - appended >= EXPIRATION_MS and not self._holds_transaction(pid)):
                continue
            entry = log.producer_state(pid)
            if entry is None or entry.last_append_ms < appended:
                raise OnlineCheckFailed(
                    "producers appended within the expiration are kept",
                    f"producer {pid} ({self.client_clock[pid]} client clock) appended at {appended}, "
                    f"now {now}: the log has {entry}",
                )

    def restart_position(self, pid: int, epoch: int) -> tuple[int, int]:
        """(epoch, sequence) of an expired producer's next batch: a new epoch and a sequence
        only an unknown producer may start at (a known one must start a new epoch at 0)."""
        return epoch + 1, self.rng.randint(1, 1 << 20)

    def batch(self, pid: int, epoch: int, sequence: int) -> bytes:
        """An idempotent batch of `pid`, stamped from its client clock."""
        return _batch(self.rng, pid, epoch, sequence, self.stamp(pid))

    def txn_batch(self, pid: int, epoch: int, sequence: int) -> bytes:
        """A transactional batch of `pid`, stamped from its client clock."""
        return _batch(self.rng, pid, epoch, sequence, self.stamp(pid), transactional=True)

    def ack(self, offset: int, data: bytes, pid: int) -> None:
        if self.model.fsync_failed:
            self.model.acked_after_fsync_failure += 1
        self.model.acked[offset] = data
        self.appended_ms[pid] = self.clock.now_ms

    def append(self, log: Log, pid: int) -> None:
        restart = pid in self.expired
        if restart:
            self.epochs[pid], self.sequences[pid] = self.restart_position(pid, self.epochs[pid])
        batch = self.batch(pid, self.epochs[pid], self.sequences[pid])
        offset = log.log_end_offset
        self._written(offset, stamped(batch, offset))
        if restart:
            self.model.restarted_at.add(offset)
        result = self.accepted_restart(pid, lambda: log.append(batch)) if restart else log.append(batch)
        self.ack(result.first_offset, stamped(batch, result.first_offset), pid)
        self.recent[pid] = [*self.recent[pid][-4:], (batch, result.first_offset)]
        self.sequences[pid] += RecordBatch(batch).records_count

    def accepted_restart(self, pid: int, send: Callable[[], AppendResult]) -> AppendResult:
        try:
            result = send()
        except (InvalidProducerEpochError, OutOfOrderSequenceError) as exc:
            raise OnlineCheckFailed(
                "an expired producer's next batch is accepted at any sequence", f"producer {pid}: {exc!r}"
            ) from exc
        self.expired.discard(pid)
        return result

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
            if p.producer_id in self.expired:
                p.planned = rng.randint(1, 3)
                self.send(log, p)  # restarts it
                return
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
        restart = pid in self.expired
        if restart:
            p.epoch, p.sequence = self.restart_position(pid, p.epoch)
        batch = self.txn_batch(pid, p.epoch, p.sequence)
        offset = log.log_end_offset
        if p.txn is None:
            p.txn = Txn(pid, offset)
            self.model.txns.append(p.txn)
        p.txn.batches.append(offset)
        self.model.txn_of[offset] = p.txn
        self._written(offset, stamped(batch, offset))
        if restart:
            self.model.restarted_at.add(offset)
        result = self.accepted_restart(pid, lambda: log.append(batch)) if restart else log.append(batch)
        if result.first_offset != offset or result.duplicate:
            raise OnlineCheckFailed(
                "transactional data lands at the log end", f"offset {offset} gave {result}"
            )
        self.ack(offset, stamped(batch, offset), pid)
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
            timestamp_ms=self.clock.now_ms,  # the engine writes markers on its own clock
            base_offset=offset,
        )
        self._written(offset, data)
        if p.txn is not None:
            p.txn.marker_offset, p.txn.commit = offset, commit
        result = log.write_txn_marker(pid, epoch, commit=commit, coordinator_epoch=p.coordinator_epoch)
        if result.first_offset != offset:
            raise OnlineCheckFailed("markers land at the log end", f"marker at {offset} gave {result}")
        self.ack(offset, data, pid)
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
            plain = _batch(rng, pid, p.epoch, p.sequence, self.stamp(pid))
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

    def checkpoint(self, log: Log) -> None:
        """The recovery point catches up with the last flush, not past it (flushes commit it
        only every LogConfig.recovery_point_interval_ms): from here it must be there."""
        log.checkpoint()
        self.model.point_floor = max(self.model.point_floor, self.model.durable_end)

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
        """Producers continue from the state the log reports; its open transactions are the Model's.

        The reload replays batches after the snapshot it starts from, counting them as
        appended at its own time: a producer forgotten by expiry may be known again.
        Each producer's last append is that of its newest batch left.
        """
        self.appended_ms = {}
        for offset in sorted(self.model.written):
            producer_id = RecordBatch(self.model.written[offset]).producer_id
            if producer_id >= 0:
                self.appended_ms[producer_id] = self.model.append_ms[offset]
        for pid in PRODUCERS + TXN_PRODUCERS:
            if log.producer_state(pid) is not None:
                self.expired.discard(pid)
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
        now = self.clock.now_ms if rng.random() < 0.85 else self.clock.now_ms + week + 1  # now and then: all
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
        end, start = log.log_end_offset, log.log_start_offset
        # Kafka's rule: never below the log start (retention or delete_records may pass an
        # open transaction's first offset; a reader is never sent below the start).
        expected = max(min(opened, default=end), min(start, end))
        if log.last_stable_offset != expected:
            raise OnlineCheckFailed(
                "last stable offset is the oldest open transaction, or the log start past it",
                f"live log: {log.last_stable_offset}, open transactions start at {sorted(opened)}, "
                f"log start {start}, log end {end}",
            )


# The share of steps run by several threads at once (torture_concurrent).
CONCURRENT_STEP_RATE = 0.15


def run_workload(fs: FaultFileSystem, rng: random.Random, model: Model, steps: int) -> None:
    """Drive a Log until `steps` are done, the twin dies, or the log fails closed.

    The Log is opened under the run's Scheduler, so its locks are cooperative and the
    concurrent steps interleave in an order drawn from `rng`.
    """

    def halted() -> SimulatedCrash | None:
        # A thread's I/O call was the process's last: the others stop where they stand.
        return SimulatedCrash(f"the process died ({fs.lineage})") if fs.dead else None

    scheduler = Scheduler(random.Random(rng.getrandbits(64)), halted=halted)
    with threads.using(scheduler):
        scheduler.adopt_current_thread()
        fs.on_io = scheduler.io_point
        try:
            _run(fs, rng, model, steps, scheduler)
        finally:
            fs.on_io = None


# Past the size gates on purpose: the driver loop: one branch per workload operation.
def _run(fs: FaultFileSystem, rng: random.Random, model: Model, steps: int, scheduler: Scheduler) -> None:  # noqa: C901, PLR0915
    clock = EngineClock(model.now_ms)  # simulated: runs stay reproducible
    w = Workload(rng, model, clock)
    reopens = itertools.count()

    def reopen() -> Log:  # every other one as a LogManager opens: producers read at first use
        return Log.open(DIRECTORY, CONFIG, fs=fs, clock=clock, defer_producer_state=next(reopens) % 2 == 1)

    try:
        log = reopen()
    except LogFailedError:
        return  # an injected error while creating the log: nothing was acknowledged
    try:
        for _ in range(steps):
            w.tick()
            w.expire_idle(log)
            if rng.random() < CONCURRENT_STEP_RATE:
                log = concurrent_step(w, log, scheduler, reopen)
                w.check_stable_offset(log)
                w.check_kept(log)
                continue
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
            elif action < 0.74:
                log.flush()
                model.durable_end = log.log_end_offset
            elif action < 0.77:
                w.checkpoint(log)
            elif action < 0.83:
                model.point_floor = max(model.point_floor, log.roll().base_offset)  # a roll moves it there
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
                model.durable_end = model.point_floor = log.log_end_offset  # close flushes and commits
                log = reopen()
            w.check_stable_offset(log)
            w.check_kept(log)
    except LogFailedError as exc:
        if not fs.injected:
            # Nothing failed on the disk: the engine failed itself (a race, a bug).
            raise OnlineCheckFailed("the log fails closed only when the disk fails", str(exc)) from exc
        if isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EIO and "fsync" in str(exc):
            model.fsync_failed = True
        # Failed closed: the log refuses everything until reopened; so does the workload.
        try:
            pid = PRODUCERS[0]
            log.append(_batch(rng, pid, w.epochs[pid], w.sequences[pid], w.stamp(pid)))
            model.acked_after_fsync_failure += 1
        except (LogFailedError, OncelogError):
            pass
