"""Exactly-once writes from many processes: one transaction per task attempt, one decision.

How tasks share a partition. A partition has one writer at a time: the
`Log`'s directory lock. A task attempt therefore never holds a partition while it
reads its input. It encodes its rows into transactional batches per partition in
memory (bounded by `max_pending_bytes`) and, when that fills or its input ends, takes
one partition at a time in a fixed order: wait for the lock (bounded by
`lock_timeout_s`), open the log, append, close (which flushes). Holding at most one
lock at a time cannot deadlock, and the lock is held only while appending.

Why the result is exactly once:
- every attempt writes with its own producer id, inside a transaction, so nothing it
  writes is visible to read_committed readers until a COMMIT marker;
- before its first append to a partition an attempt records that partition in the
  WriteRegistry (refused once the write is decided);
- the driver stores the winning attempts (the decision) before writing any marker,
  then writes COMMIT for the winners and ABORT for every other registered attempt,
  with the epoch bumped so a zombie attempt still running is fenced
  (InvalidProducerEpochError) instead of opening a transaction nobody would close;
- a re-run of a decided write id writes nothing, and finishes the markers if the
  driver died half way.

Who creates what. The driver does, before any task runs (`prepare_write_root`,
`ensure_topic`): the root, its id, the write registry and every partition of a new
topic. A task given the driver's plan (`WritePlan`) creates nothing: it checks the
root it sees has the driver's id, and that each partition it appends to exists, so a
root path that means another directory on an executor (a relative path, a local disk)
fails the task with both paths named instead of writing where nobody reads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from oncelog.config import LogConfig
from oncelog.layout import TopicPartition, parse_partition_dir_name
from oncelog.lock_wait import wait_while_locked
from oncelog.log import Log
from oncelog.producer_ids import ProducerIdManager
from oncelog.root_config import ROOT_METADATA_DIR, read_topic_config
from oncelog.root_identity import check_partition_present, check_root_identity, ensure_root_id
from oncelog.segments.batch import encode_batch
from oncelog.spark.partitioner import partition_for_key
from oncelog.spark.write_registry import REGISTRY_DIR, WriteRegistry
from oncelog.storage.fs import DEFAULT_FS, FileSystem
from oncelog.storage.log_dirs import create_dir
from oncelog.tools.partition_dirs import delete_intents

Header = tuple[str, bytes | None]
# Coordinator epoch of every marker: this protocol is the only coordinator of its
# producers, and it never restarts a producer id.
COORDINATOR_EPOCH = 0


@contextmanager
def open_partition(
    root: str, tp: TopicPartition, config: LogConfig, timeout_s: float, fs: FileSystem = DEFAULT_FS
) -> Iterator[Log]:
    """The partition's log, waiting for its lock; closed (flushed) on exit."""
    path = os.path.join(root, str(tp))
    log = wait_while_locked(f"partition {tp} under {root}", lambda: Log.open(path, config, fs=fs), timeout_s)
    try:
        yield log
    finally:
        log.close()
    # fsync(root): a partition created here must survive power loss with its data.
    fs.fsync_dir(root)


def lease_producer_id(root: str, timeout_s: float, fs: FileSystem = DEFAULT_FS) -> int:
    def lease() -> int:
        # A block of one: this opener leases a single PID and closes, and the rest of a
        # larger block would be skipped by the next opener (reserved durably, never issued).
        with ProducerIdManager.open(root, fs=fs, block_size=1) as manager:
            return manager.lease().producer_id

    return wait_while_locked(f"the producer ids of {root}", lease, timeout_s)


def topic_partitions(root: str, topic: str, fs: FileSystem = DEFAULT_FS) -> list[int]:
    """The partitions of `topic` under `root`, less any a LogManager is deleting."""
    if not fs.exists(root):
        return []
    names = fs.listdir(root)
    deleting = delete_intents(fs, root) if ROOT_METADATA_DIR in names else set()
    found = []
    for name in names:
        tp = parse_partition_dir_name(name)
        if tp is not None and tp.topic == topic and name not in deleting:
            found.append(tp.partition)
    return sorted(found)


@dataclass(frozen=True)
class WritePlan:
    """What the driver resolved for a write, carried to every task."""

    root_id: str
    planned_on: str  # the driver's host, for the messages
    partition_count: int


def prepare_write_root(root: str, fs: FileSystem = DEFAULT_FS) -> str:
    """On the driver: the root (created if missing), its id and its write registry; returns the id."""
    create_dir(fs, root)
    root_id = ensure_root_id(fs, root)
    WriteRegistry.open(root, fs).close()  # created here, never by a task
    return root_id


def ensure_topic(
    root: str, topic: str, partitions: int, timeout_s: float, fs: FileSystem = DEFAULT_FS
) -> int:
    """Create a topic that does not exist yet with all its partitions (empty logs), so every
    task of every job sees the same partition count; returns that count."""
    existing = topic_partitions(root, topic, fs)
    if existing:
        return existing[-1] + 1
    config = read_topic_config(root, topic, fs)
    for partition in range(partitions):
        with open_partition(root, TopicPartition(topic, partition), config, timeout_s, fs):
            pass
    return partitions


def abort_stale_writes(root: str, timeout_s: float, fs: FileSystem = DEFAULT_FS) -> list[str]:
    """Abort undecided writes older than the transaction timeout (their driver is gone)."""
    if not fs.exists(os.path.join(root, REGISTRY_DIR)):
        return []
    with WriteRegistry.open(root, fs) as registry:
        stale = registry.stale(int(time.time() * 1000) - int(timeout_s * 1000))
    for write_id in stale:
        finish_write(root, write_id, None, lock_timeout_s=timeout_s, fs=fs)
    return stale


@dataclass(frozen=True)
class AttemptResult:
    write_id: str
    attempt: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]
    rows: int
    skipped: bool  # the write id was already committed: nothing written


class TaskWriter:
    """One task attempt's rows, appended transactionally (see the module docstring)."""

    def __init__(
        self,
        root: str,
        topic: str,
        write_id: str,
        job: str,
        attempt: str,
        *,
        new_topic_partitions: int = 1,
        batch_records: int = 1000,
        max_pending_bytes: int = 64 << 20,
        lock_timeout_s: float = 60.0,
        plan: WritePlan | None = None,
        fs: FileSystem = DEFAULT_FS,
    ):
        self.root, self.topic, self.write_id, self.job, self.attempt = root, topic, write_id, job, attempt
        self.batch_records = batch_records
        self.max_pending_bytes = max_pending_bytes
        self.lock_timeout_s = lock_timeout_s
        self.plan = plan
        self._fs = fs
        if plan is not None:
            # Before anything is opened (opening creates): this must be the driver's root.
            check_root_identity(fs, root, plan.root_id, plan.planned_on)
        # The registry is opened per use: LMDB allows one open per process, and the
        # driver's commit or another task may run in this process too.
        with WriteRegistry.open(root, fs) as registry:
            self.skipped = registry.state(write_id).decided
        if plan is not None:
            self.partition_count = plan.partition_count
        else:
            # Without a plan (the library used directly), a topic that does not exist yet
            # gets `new_topic_partitions`, each created on its first write.
            existing = topic_partitions(root, topic, fs)
            self.partition_count = existing[-1] + 1 if existing else new_topic_partitions
        self._config = read_topic_config(root, topic, fs)
        # Cut batches by size too, well under the topic's limit (a batch's overhead is small).
        self.batch_bytes = max(1024, self._config.max_batch_bytes // 2)
        self.producer_id = -1 if self.skipped else lease_producer_id(root, lock_timeout_s, fs)
        self.producer_epoch = 0
        self._records: dict[int, list[tuple[bytes | None, bytes | None, list[Header]]]] = {}
        self._record_bytes: dict[int, int] = {}
        self._encoded: dict[int, list[bytes]] = {}
        self._sequence: dict[int, int] = {}
        self._pending_bytes = 0
        self._touched: list[TopicPartition] = []
        self._round_robin = 0
        self.rows = 0

    def add(
        self,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        headers: Sequence[Header] = (),
    ) -> None:
        if self.skipped:
            return
        if partition is None:
            if key is not None:
                partition = partition_for_key(key, self.partition_count)
            else:
                partition = self._round_robin % self.partition_count
                self._round_robin += 1
        elif not 0 <= partition < self.partition_count:
            raise ValueError(
                f"partition {partition} is not in topic {self.topic}'s 0..{self.partition_count - 1}"
            )
        pending = self._records.setdefault(partition, [])
        pending.append((key, value, list(headers)))
        size = 24 + len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") + 8 for k, v in headers)
        self._record_bytes[partition] = self._record_bytes.get(partition, 0) + size
        self.rows += 1
        if len(pending) >= self.batch_records or self._record_bytes[partition] >= self.batch_bytes:
            self._encode(partition)
            if self._pending_bytes > self.max_pending_bytes:
                self._drain()

    def _encode(self, partition: int) -> None:
        records = self._records.pop(partition, [])
        self._record_bytes.pop(partition, None)
        if not records:
            return
        sequence = self._sequence.get(partition, 0)
        batch = encode_batch(
            records,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            base_sequence=sequence,
            is_transactional=True,
            timestamp_ms=int(time.time() * 1000),
        )
        self._sequence[partition] = sequence + len(records)
        self._encoded.setdefault(partition, []).append(batch)
        self._pending_bytes += len(batch)

    def _drain(self) -> None:
        """Append every encoded batch, one partition (one lock) at a time, in partition order."""
        for partition in sorted(self._encoded):
            batches = self._encoded.pop(partition)
            tp = TopicPartition(self.topic, partition)
            if self.plan is not None:
                check_partition_present(self._fs, os.path.join(self.root, str(tp)), self.plan.planned_on)
            if tp not in self._touched:
                # Durable before the first append: an abort must be able to find it.
                with WriteRegistry.open(self.root, self._fs) as registry:
                    now_ms = int(time.time() * 1000)
                    registry.add_partition(
                        self.write_id,
                        self.job,
                        self.attempt,
                        self.producer_id,
                        self.producer_epoch,
                        tp,
                        now_ms,
                    )
                self._touched.append(tp)
            with open_partition(self.root, tp, self._config, self.lock_timeout_s, self._fs) as log:
                for batch in batches:
                    log.append(batch)
        self._pending_bytes = 0

    def finish(self) -> AttemptResult:
        """Write what is left; after this returns everything is durable, none of it visible."""
        if not self.skipped:
            for partition in list(self._records):
                self._encode(partition)
            self._drain()
        return AttemptResult(
            self.write_id,
            self.attempt,
            self.producer_id,
            self.producer_epoch,
            tuple(self._touched),
            0 if self.skipped else self.rows,
            self.skipped,
        )

    def close(self) -> None:
        """Drop what was not appended (a failed attempt); what was appended stays, uncommitted."""
        self._records.clear()
        self._record_bytes.clear()
        self._encoded.clear()


def finish_write(
    root: str,
    write_id: str,
    winners: list[str] | None,
    *,
    job: str | None = None,
    lock_timeout_s: float = 60.0,
    fs: FileSystem = DEFAULT_FS,
) -> int:
    """Commit `winners` (None: abort the write) and abort every other attempt; returns markers written.

    Commit: the decision is stored first (or an earlier one stands), then markers are
    written partition by partition, then the write is marked done. Abort: the jobs of
    every registered attempt (and `job`, whose attempts may not have registered yet)
    are closed first, so none of their attempts can register more; then every
    attempt gets an ABORT marker (epoch bumped, fencing zombies). A re-run of the
    write id is a new job, and writes.
    """
    with WriteRegistry.open(root, fs) as registry:
        if winners is None:
            state = registry.state(write_id)
            if state.decided:  # committed already: an abort cannot undo it, finish it instead
                winners = list(state.winners or ())
            else:
                state = registry.close_jobs(write_id, [] if job is None else [job])
        if winners is not None:
            state = registry.decide(write_id, winners)
            if state.done:
                return 0
        decided = set(state.winners or ()) if state.decided else set()
        markers: dict[TopicPartition, list[tuple[int, int, bool]]] = {}
        for key, attempt in state.attempts.items():
            commit = key in decided
            # An aborted attempt's epoch is bumped: a zombie still writing is fenced.
            epoch = attempt.producer_epoch if commit else attempt.producer_epoch + 1
            for tp in attempt.partitions:
                markers.setdefault(tp, []).append((attempt.producer_id, epoch, commit))
        written = 0
        for tp in sorted(markers):
            with open_partition(root, tp, read_topic_config(root, tp.topic, fs), lock_timeout_s, fs) as log:
                for producer_id, epoch, commit in markers[tp]:
                    entry = log.producer_state(producer_id)
                    if commit and (entry is None or entry.current_txn_first_offset < 0):
                        continue  # committed before a crash of an earlier finish: nothing open
                    if not commit and entry is not None and entry.producer_epoch >= epoch:
                        continue  # aborted and fenced already
                    log.write_txn_marker(
                        producer_id, epoch, commit=commit, coordinator_epoch=COORDINATOR_EPOCH
                    )
                    written += 1
                # A committed attempt never writes again: free its slot in the producer table
                # now (a stream makes producers per micro-batch; expiry would take a day). An
                # aborted one stays: its bumped epoch is what fences a zombie.
                log.retire_producers([pid for pid, _, commit in markers[tp] if commit])
        if state.decided:
            registry.mark_done(write_id)
        # An abort keeps its (closed) attempts: a late commit of their job must be refused.
        return written
