"""Kafka's append rules for idempotent producers: the checks and the transitions, in one home.

`ProducerAppendInfo` (Kafka's class of the same name) reads each producer's row once
per request, checks every batch against the epoch and the 5-batch window, and returns
the state each batch leaves; the log stores that state only after the batch's bytes
are written, so a refused or failed write leaves the producer table untouched.

The transitions, `apply_batch` and `apply_marker`, are how an accepted batch or marker
changes its producer; the append path, recovery's replay (`oncelog.producer_replay`)
and `oncelog stat` all call them. The compiled append's twins are listed in the table
that opens engine/_append.c.
"""

from __future__ import annotations

from typing import NamedTuple

from oncelog.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    ProducerStateFullError,
    TransactionCoordinatorFencedError,
)
from oncelog.producer_state import (
    BatchMetadata,
    CompletedTxn,
    ProducerStateManager,
    WorkingState,
    in_sequence,
)
from oncelog.segments import format as fmt
from oncelog.segments.control import TxnMarker


class DuplicateBatch(NamedTuple):
    first_offset: int
    last_offset: int
    # As the window keeps it: on a LogAppendTime log, when the original was appended.
    max_timestamp_ms: int


# -- the transitions ------------------------------------------------------------------


def apply_batch(
    w: WorkingState,
    producer_epoch: int,
    batch: BatchMetadata,
    is_control: bool,
    is_transactional: bool = False,
    *,
    append_ms: int,
) -> None:
    """How a written batch changes its producer's state: one rule for appends and replay.

    `append_ms` is the engine's time of the append (for a replay, the load's
    rule). A transactional data batch opens the producer's transaction if none is
    open: its first offset is where the transaction starts. Transaction markers go
    to apply_marker; a control batch that is no marker only moves the epoch.
    """
    w.last_append_ms = append_ms
    if is_control:
        # Not a retriable batch: only the epoch (and the times) move.
        if producer_epoch != w.producer_epoch:
            w.producer_epoch = producer_epoch
            w.batches = []
        w.last_timestamp_ms = batch.max_timestamp_ms
        return
    w.add_batch(producer_epoch, batch)
    if is_transactional and w.txn_first_offset < 0:
        w.txn_first_offset = batch.first_offset


def apply_marker(
    w: WorkingState,
    producer_epoch: int,
    marker_offset: int,
    timestamp_ms: int,
    marker: TxnMarker,
    *,
    append_ms: int,
) -> CompletedTxn | None:
    """A COMMIT or ABORT marker: close the open transaction (if any) and record the coordinator epoch.

    A marker with a newer producer epoch bumps it and clears the dedupe window, so
    the producer's next batch must start at sequence 0. A marker for a producer
    with no open transaction (an empty transaction) completes nothing.
    """
    if producer_epoch != w.producer_epoch:
        w.producer_epoch = producer_epoch
        w.batches = []
    completed = None
    if w.txn_first_offset >= 0:
        completed = CompletedTxn(w.producer_id, w.txn_first_offset, marker_offset, not marker.commit)
    w.txn_first_offset = -1
    w.coordinator_epoch = marker.coordinator_epoch
    w.last_timestamp_ms = timestamp_ms
    w.last_append_ms = append_ms
    return completed


class ProducerAppendInfo:
    """Kafka's append rules for the batches of one request, checked on copies.

    Each producer's row is read once per request; `apply` returns the state after
    each batch, which the log stores once that batch's bytes are written. `now_ms`
    is the engine's clock for the request: every producer it touches was last
    appended then, whatever its batches' timestamps say.
    """

    def __init__(self, manager: ProducerStateManager, now_ms: int):
        self._manager = manager
        self._now_ms = now_ms
        self._pending: dict[int, WorkingState | None] = {}
        self._new_producers = 0

    def _current(self, producer_id: int) -> WorkingState | None:
        if producer_id not in self._pending:
            self._pending[producer_id] = self._manager.working(producer_id)
        return self._pending[producer_id]

    def check(
        self,
        producer_id: int,
        producer_epoch: int,
        first_sequence: int,
        last_sequence: int,
        is_transactional: bool = False,
    ) -> DuplicateBatch | None:
        """Raise if the batch breaks a rule; return the original offsets of a duplicate."""
        current = self._current(producer_id)
        if current is None:
            # Unknown (new, expired or lost) producers are accepted at any sequence (KIP-360).
            return None
        stored_epoch = current.producer_epoch
        if producer_epoch < stored_epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {producer_epoch} is older than the current {stored_epoch}"
            )
        if producer_epoch > stored_epoch:
            if first_sequence != 0 and stored_epoch != fmt.NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} bumped its epoch to {producer_epoch} "
                    f"but started at sequence {first_sequence}, not 0"
                )
        else:
            for cached in current.batches:
                if cached.first_sequence == first_sequence and cached.last_sequence == last_sequence:
                    return DuplicateBatch(cached.first_offset, cached.last_offset, cached.max_timestamp_ms)
            last = current.batches[-1].last_sequence if current.batches else fmt.NO_SEQUENCE
            if not in_sequence(last, first_sequence):
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} epoch {producer_epoch}: sequence {first_sequence} "
                    f"does not follow {last}"
                )
        if current.txn_first_offset >= 0 and not is_transactional:
            raise InvalidTxnStateError(
                f"producer {producer_id} sent non-transactional data while its transaction "
                f"from offset {current.txn_first_offset} is open"
            )
        return None

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Raise if a transaction marker is fenced: an older producer or coordinator epoch."""
        current = self._current(producer_id)
        if current is None:
            return  # Kafka writes a marker for a producer it has no state for
        if producer_epoch < current.producer_epoch:
            raise InvalidProducerEpochError(
                f"marker for producer {producer_id} at epoch {producer_epoch}, older than the current "
                f"{current.producer_epoch}: fenced"
            )
        if coordinator_epoch < current.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker for producer {producer_id} from coordinator epoch {coordinator_epoch}, older than "
                f"{current.coordinator_epoch}"
            )

    def apply(
        self,
        producer_id: int,
        producer_epoch: int,
        batch: BatchMetadata,
        is_control: bool,
        is_transactional: bool = False,
    ) -> WorkingState:
        """Record an accepted batch (later batches of the request see it); returns the new state."""
        current = self._current_or_new(producer_id, producer_epoch, batch.max_timestamp_ms)
        apply_batch(current, producer_epoch, batch, is_control, is_transactional, append_ms=self._now_ms)
        # A copy: a later batch of the same producer in this request changes `current`.
        return current.copy()

    def apply_marker(
        self, producer_id: int, producer_epoch: int, marker_offset: int, timestamp_ms: int, marker: TxnMarker
    ) -> tuple[WorkingState, CompletedTxn | None]:
        """Record an accepted transaction marker; returns the new state and the transaction it closed."""
        current = self._current_or_new(producer_id, producer_epoch, timestamp_ms)
        completed = apply_marker(
            current, producer_epoch, marker_offset, timestamp_ms, marker, append_ms=self._now_ms
        )
        return current.copy(), completed

    def _current_or_new(self, producer_id: int, producer_epoch: int, timestamp_ms: int) -> WorkingState:
        current = self._current(producer_id)
        if current is None:
            current = WorkingState(
                producer_id, producer_epoch, [], self._now_ms, last_timestamp_ms=timestamp_ms
            )
            self._new_producers += 1
            if not self._manager.has_room_for(self._new_producers):
                raise ProducerStateFullError(
                    f"all {self._manager.capacity} producer slots hold live producers; retry after expiry"
                )
            self._pending[producer_id] = current
        return current
