"""Kafka's append rules for idempotent producers (brief §4), checked on copies.

`ProducerAppendInfo` reads each producer's row once per request, checks every batch
against the epoch and the 5-batch window, and returns the state each batch leaves;
the log stores that state only after the batch's bytes are written, so a refused
or failed write leaves the producer table untouched.
"""

from __future__ import annotations

from typing import NamedTuple

from oncelog.errors import InvalidProducerEpochError, OutOfOrderSequenceError, ProducerStateFullError
from oncelog.producer_state import BatchMetadata, ProducerStateManager, WorkingState, apply_batch
from oncelog.segments import format as fmt


def in_sequence(last_sequence: int, next_sequence: int) -> bool:
    """Kafka's rule: next follows last, with MAX -> 0 wraparound."""
    return next_sequence == last_sequence + 1 or (next_sequence == 0 and last_sequence == fmt.INT32_MAX)


class DuplicateBatch(NamedTuple):
    first_offset: int
    last_offset: int


class ProducerAppendInfo:
    """Kafka's append rules for the batches of one request, checked on copies.

    Each producer's row is read once per request; `apply` returns the state after
    each batch, which the log stores once that batch's bytes are written.
    """

    def __init__(self, manager: ProducerStateManager):
        self._manager = manager
        self._pending: dict[int, WorkingState | None] = {}
        self._new_producers = 0

    def _current(self, producer_id: int) -> WorkingState | None:
        if producer_id not in self._pending:
            self._pending[producer_id] = self._manager.working(producer_id)
        return self._pending[producer_id]

    def check(
        self, producer_id: int, producer_epoch: int, first_sequence: int, last_sequence: int
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
            return None
        for cached in current.batches:
            if cached.first_sequence == first_sequence and cached.last_sequence == last_sequence:
                return DuplicateBatch(cached.first_offset, cached.last_offset)
        last = current.batches[-1].last_sequence if current.batches else fmt.NO_SEQUENCE
        if not in_sequence(last, first_sequence):
            raise OutOfOrderSequenceError(
                f"producer {producer_id} epoch {producer_epoch}: sequence {first_sequence} "
                f"does not follow {last}"
            )
        return None

    def apply(
        self, producer_id: int, producer_epoch: int, batch: BatchMetadata, is_control: bool
    ) -> WorkingState:
        """Record an accepted batch (later batches of the request see it); returns the new state."""
        current = self._current(producer_id)
        if current is None:
            current = WorkingState(producer_id, producer_epoch, [], batch.max_timestamp_ms)
            self._new_producers += 1
            if not self._manager.has_room_for(self._new_producers):
                raise ProducerStateFullError(
                    f"all {self._manager.capacity} producer slots hold live producers; retry after expiry"
                )
            self._pending[producer_id] = current
        apply_batch(current, producer_epoch, batch, is_control)
        # A copy: a later batch of the same producer in this request changes `current`.
        return current.copy()
