"""ReplayBuffer: producer state rebuilt from many stored batches, one table write per producer.

Recovery replays the batch headers of the tail. Reading and writing a producer's
row in the table for every batch costs more than validating a 16 KiB batch, so
the replay keeps each touched producer's working state in a dict and writes each
row once, at `flush`. New producers are flushed in order of first appearance, so
the ring's order is what a batch-by-batch replay would give.
"""

from __future__ import annotations

from oncelog.errors import ProducerStateFullError
from oncelog.producer_state import (
    BatchMetadata,
    CompletedTxn,
    ProducerStateManager,
    WorkingState,
    apply_batch,
    apply_marker,
)
from oncelog.segments.control import TxnMarker

# Bounds the dict (and the memory it holds) on a tail naming very many producers.
MAX_PENDING_PRODUCERS = 100_000


class ReplayBuffer:
    def __init__(self, manager: ProducerStateManager, now_ms: int):
        self._manager = manager
        self._now_ms = now_ms  # the load's clock, for expiry when the table is full
        self._pending: dict[int, WorkingState] = {}
        self._open: dict[int, int] | None = None  # see open_transactions

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
        w = self._working(producer_id, producer_epoch, max_timestamp_ms)
        meta = BatchMetadata(first_sequence, last_sequence, first_offset, last_offset, max_timestamp_ms)
        apply_batch(w, producer_epoch, meta, is_control, is_transactional)
        if self._open is not None and w.txn_first_offset >= 0:
            self._open.setdefault(producer_id, w.txn_first_offset)

    def replay_marker(
        self, producer_id: int, producer_epoch: int, marker_offset: int, timestamp_ms: int, marker: TxnMarker
    ) -> CompletedTxn | None:
        """Apply a stored transaction marker; returns the transaction it closed, if any."""
        w = self._working(producer_id, producer_epoch, timestamp_ms)
        completed = apply_marker(w, producer_epoch, marker_offset, timestamp_ms, marker)
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

    def _working(self, producer_id: int, producer_epoch: int, timestamp_ms: int) -> WorkingState:
        w = self._pending.get(producer_id)
        if w is None:
            if len(self._pending) >= MAX_PENDING_PRODUCERS:
                self.flush()
            w = self._manager.working(producer_id) or WorkingState(
                producer_id, producer_epoch, [], timestamp_ms
            )
            self._pending[producer_id] = w
        return w

    def flush(self) -> None:
        """Write every pending producer into the table.

        When the table is full, producers expired at the load's clock make room
        (the load expires them at its end anyway), as the batch-by-batch replay
        did; ProducerStateFullError only if it is full of live producers.
        """
        pending, manager, now_ms = self._pending, self._manager, self._now_ms
        while pending:
            producer_id = next(iter(pending))
            w = pending[producer_id]
            try:
                manager.put(w)
            except ProducerStateFullError:
                idle = w.txn_first_offset < 0 and now_ms - w.last_activity_ms >= manager.expiration_ms
                if not idle:
                    manager.make_room(now_ms)
                    manager.put(w)  # raises again when every slot holds a live producer
            del pending[producer_id]

    def __len__(self) -> int:
        return len(self._pending)
