"""ReplayBuffer: producer state rebuilt from many stored batches, one table write per producer.

Recovery replays the batch headers of the tail. Reading and writing a producer's
row in the table for every batch costs more than validating a 16 KiB batch, so
the replay keeps each touched producer's working state in a dict and writes each
row once, at `flush`. New producers are flushed in order of first appearance, so
the ring's order is what a batch-by-batch replay would give.

When the engine appended a replayed batch is not stored anywhere (batch timestamps
are the client's clock). A replayed producer counts as appended at the load's time
(`now_ms`), the latest it could have been: expiry after recovery then never drops
a producer the running engine would have kept, and keeps one at most one
expiration period longer than it would have. Producers the log retired
(Log.retire_producers, recorded in the store) are not replayed below the offset
where they were retired: the running engine had forgotten them, and replaying them
would take slots the live ones need. One exception: a snapshot older than a retirement
can hold the producer's transaction open (retirement needs it closed), and its marker,
below the retirement, closes it here too before the producer is forgotten again;
skipping that marker would leave the transaction open for good and pin the stable offset.

That can leave more producers than the table holds: a tail in which producers came
and went by expiry replays them all. The engine's clock never goes back, so the
order of appends in the log is the order of their times, and the producers the
running engine still kept (idle less than the expiration, or in a transaction)
were the most recent ones, at most the table's capacity. So when the replayed
producers do not fit, the least recently appended ones with no open transaction
are shed (by last append time, then by the offset of their last batch or marker),
and `shed` counts them; ProducerStateFullError only if open transactions alone
overflow the table.
"""

from __future__ import annotations

import logging

import numpy as np

from oncelog.append_rules import apply_batch, apply_marker
from oncelog.errors import ProducerStateFullError
from oncelog.producer_state import (
    WINDOW,
    BatchMetadata,
    CompletedTxn,
    ProducerStateManager,
    WorkingState,
)
from oncelog.segments.control import TxnMarker

log = logging.getLogger(__name__)

# Bounds the dict (and the memory it holds) on a tail naming very many producers.
MAX_PENDING_PRODUCERS = 100_000

# The columns of a plain batch's row (replay_plain_rows; recovery's compiled scan writes them).
(
    ROW_PID,
    ROW_EPOCH,
    ROW_FIRST_SEQUENCE,
    ROW_LAST_SEQUENCE,
    ROW_FIRST_OFFSET,
    ROW_LAST_OFFSET,
    ROW_MAX_TIMESTAMP,
) = range(7)


class ReplayBuffer:
    def __init__(self, manager: ProducerStateManager, now_ms: int, retired: dict[int, int] | None = None):
        self._manager = manager
        # Producers the log retired (Log.retire_producers) -> the log end then: their
        # batches below it are not replayed, as the running engine had forgotten them.
        self._retired = retired or {}
        # The offset of each replayed producer's last batch or marker: the log's order of
        # appends, which recovery sheds by (a marker is an append too).
        self._last_seen: dict[int, int] = {}
        # The load's clock: the append time of every replayed producer, and expiry's
        # time when the table is full.
        self._now_ms = now_ms
        self._pending: dict[int, WorkingState] = {}
        self._open: dict[int, int] | None = None  # see open_transactions
        # Retired producers whose transaction a marker below the retirement closed: forgotten
        # again at flush, as the running engine had forgotten them.
        self._closed_retired: list[int] = []
        self.shed = 0  # producers dropped because the replay did not fit the table

    def replay_batch(
        self,
        producer_id: int,
        producer_epoch: int,
        first_sequence: int,
        last_sequence: int,
        first_offset: int,
        last_offset: int,
        max_timestamp_ms: int,
        is_control: bool,
        is_transactional: bool = False,
    ) -> None:
        """Apply a stored data batch without checks (recovery, and the torture checker's full replay)."""
        if first_offset < self._retired.get(producer_id, -1):
            return
        self._last_seen[producer_id] = last_offset
        w = self._working(producer_id, producer_epoch, max_timestamp_ms)
        meta = BatchMetadata(first_sequence, last_sequence, first_offset, last_offset, max_timestamp_ms)
        apply_batch(w, producer_epoch, meta, is_control, is_transactional, append_ms=self._now_ms)
        if self._open is not None and w.txn_first_offset >= 0:
            self._open.setdefault(producer_id, w.txn_first_offset)

    def replay_plain_rows(self, rows: np.ndarray) -> None:
        """replay_batch for each row (a data batch that is neither transactional nor a
        marker), in order, with the same outcome at a fraction of the calls.

        A producer's state after a run of such batches depends only on its last WINDOW of
        them: each batch keeps at most WINDOW, a reset (a new epoch, a sequence gap) drops
        only older ones, and the epoch, timestamps and last offset are the last batch's.
        So each producer, in order of first appearance (the order replay_batch would add
        them in), replays only those. Where the table could fill or the pending producers
        be flushed midway, whose outcome follows the order of every batch, each row
        replays on its own.
        """
        rows = self._without_retired(rows)
        if not len(rows):
            return
        producer_ids, first_index, inverse = np.unique(
            rows[:, ROW_PID], return_index=True, return_inverse=True
        )
        new = len(producer_ids)
        if len(self._pending) + new >= MAX_PENDING_PRODUCERS or (
            len(self._manager) + len(self._pending) + new > self._manager.capacity
        ):
            self._replay_rows(rows)
            return
        by_producer = np.argsort(inverse, kind="stable")  # each producer's rows, in log order
        counts = np.bincount(inverse, minlength=new)
        ends = np.cumsum(counts)
        for k in np.argsort(first_index, kind="stable"):
            last_rows = by_producer[max(ends[k] - counts[k], ends[k] - WINDOW) : ends[k]]
            self._replay_rows(rows[last_rows])

    def _without_retired(self, rows: np.ndarray) -> np.ndarray:
        """The rows replay_batch would not skip (batches of retired producers below their
        retirement), so that first appearances are counted as it counts them."""
        if not self._retired or not len(rows):
            return rows
        retired = np.array(sorted(self._retired.items()), dtype=np.int64)
        pids = rows[:, ROW_PID]
        hit = np.flatnonzero(np.isin(pids, retired[:, 0]))
        if not len(hit):
            return rows
        below = retired[np.searchsorted(retired[:, 0], pids[hit]), 1]
        keep = np.ones(len(rows), dtype=bool)
        keep[hit] = rows[hit, ROW_FIRST_OFFSET] >= below
        return rows[keep]

    def _replay_rows(self, rows: np.ndarray) -> None:
        for pid, epoch, first_seq, last_seq, first_offset, last_offset, max_ts, *_ in rows.tolist():
            self.replay_batch(
                pid, epoch, first_seq, last_seq, first_offset, last_offset, max_ts, False, False
            )

    def replay_marker(
        self, producer_id: int, producer_epoch: int, marker_offset: int, timestamp_ms: int, marker: TxnMarker
    ) -> CompletedTxn | None:
        """Apply a stored transaction marker; returns the transaction it closed, if any."""
        if marker_offset < self._retired.get(producer_id, -1):
            if not self._holds_open(producer_id):
                return None
            # A snapshot older than the retirement holds the transaction open: its marker
            # closes it here too (retirement needs it closed), then the producer goes again.
            self._closed_retired.append(producer_id)
        self._last_seen[producer_id] = marker_offset
        w = self._working(producer_id, producer_epoch, timestamp_ms)
        completed = apply_marker(
            w, producer_epoch, marker_offset, timestamp_ms, marker, append_ms=self._now_ms
        )
        if self._open is not None:
            self._open.pop(producer_id, None)
        return completed

    def open_transactions(self) -> dict[int, int]:
        """producer id -> first offset of each open transaction, pending states included.

        Built from the table once (a scan of every producer), then kept up to date by
        each replayed batch and marker: recovery asks at every ABORT marker it replays.
        """
        if self._open is None:
            self._open = self._manager.open_transactions()
            for producer_id, w in self._pending.items():
                if w.txn_first_offset >= 0:
                    self._open[producer_id] = w.txn_first_offset
                else:
                    self._open.pop(producer_id, None)
        return self._open

    def _holds_open(self, producer_id: int) -> bool:
        """Whether the producer's state so far (replayed, else the table's) has a transaction open."""
        w = self._pending.get(producer_id) or self._manager.working(producer_id)
        return w is not None and w.txn_first_offset >= 0

    def _working(self, producer_id: int, producer_epoch: int, timestamp_ms: int) -> WorkingState:
        w = self._pending.get(producer_id)
        if w is None:
            if len(self._pending) >= MAX_PENDING_PRODUCERS:
                self.flush()
            w = self._manager.working(producer_id) or WorkingState(
                producer_id, producer_epoch, [], self._now_ms, last_timestamp_ms=timestamp_ms
            )
            self._pending[producer_id] = w
        return w

    def flush(self) -> None:
        """Write every pending producer into the table (updates first, then new ones in
        order of first appearance).

        When the new ones do not fit, producers expired at the load's clock make room
        (the load expires them at its end anyway); if they still do not fit, the least
        recent are shed (see the module docstring).
        """
        manager = self._manager
        new = []
        for producer_id, w in self._pending.items():
            if producer_id in manager:
                manager.put(w)  # an update never needs a slot
            else:
                new.append(w)
        self._pending.clear()
        if self._closed_retired:
            # (One that appended again past its retirement is the engine's again: it stays.)
            seen, retired = self._last_seen, self._retired
            manager.retire([pid for pid in self._closed_retired if seen[pid] < retired[pid]])
            self._closed_retired = []
        room = manager.capacity - len(manager)
        if len(new) > room:
            manager.make_room(self._now_ms)
            room = manager.capacity - len(manager)
        if len(new) > room:
            new = self._shed_least_recent(new, len(new) - room)
        for w in new:
            manager.put(w)

    def _shed_least_recent(self, new: list[WorkingState], excess: int) -> list[WorkingState]:
        """Drop the `excess` least recent producers without an open transaction, from the
        table and from `new`; returns what is left of `new`."""
        ids, appended, newest = self._manager.recency()
        seen = self._last_seen
        # A replayed producer is as recent as its last batch or marker; the others (from
        # the snapshot) as their newest batch, all before any replayed one.
        newest = np.array([seen.get(pid, n) for pid, n in zip(ids.tolist(), newest.tolist(), strict=True)])
        idle = [w for w in new if w.txn_first_offset < 0]
        ids = np.concatenate([ids, np.array([w.producer_id for w in idle], dtype=np.int64)])
        appended = np.concatenate([appended, np.array([w.last_append_ms for w in idle], dtype=np.int64)])
        newest_new = [seen.get(w.producer_id, -1) for w in idle]
        newest = np.concatenate([newest.astype(np.int64), np.array(newest_new, dtype=np.int64)])
        if len(ids) < excess:
            raise ProducerStateFullError(
                f"recovery replayed more producers with open transactions than producer_capacity="
                f"{self._manager.capacity} holds"
            )
        victims = set(ids[np.lexsort((newest, appended))[:excess]].tolist())
        self._manager.retire([pid for pid in victims if pid in self._manager])
        self.shed += len(victims)
        log.warning(
            "recovery shed the %d least recently appended producers: the replayed log names more than "
            "producer_capacity=%d",
            len(victims),
            self._manager.capacity,
        )
        return [w for w in new if w.producer_id not in victims]

    def __len__(self) -> int:
        return len(self._pending)
