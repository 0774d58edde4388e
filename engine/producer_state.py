"""Producer state: each idempotent producer's epoch and its last 5 batches (brief §4).

The table is a fixed-capacity numpy structured array (one 172-byte row per
producer) with a pid -> slot dict. Rows are handed out in ring order, so the
oldest producer sits at the head: expiry (issue 4) pops from there. Snapshots
write and load the array directly, so loading a million producers builds no
per-producer Python objects beyond the slot map.

Single rows are read and written with one struct call on the array's memory,
which is several times cheaper than numpy's per-field access on the append path.

`ProducerAppendInfo` applies Kafka's append rules to one request. It works on
copies, so nothing in the table changes until the caller has written the bytes
and calls `commit`: a failed write leaves the state untouched.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from oncelog.errors import InvalidProducerEpochError, OutOfOrderSequenceError, ProducerStateFullError
from oncelog.pid_map import PidSlotMap
from oncelog.segments import format as fmt

# Kafka keeps the metadata of each producer's last 5 batches for duplicate detection.
WINDOW = 5
SEQUENCE_MODULUS = fmt.INT32_MAX + 1

PRODUCER_DTYPE = np.dtype(
    [
        ("producer_id", "<i8"),
        ("last_activity_ms", "<i8"),
        ("txn_first_offset", "<i8"),  # first offset of the open transaction, or -1
        ("coordinator_epoch", "<i4"),
        ("producer_epoch", "<i2"),
        ("window_count", "u1"),  # batches held, oldest first
        ("live", "u1"),  # 0 for a free slot or a tombstone left by expiry
        ("first_sequence", "<i4", (WINDOW,)),
        ("last_sequence", "<i4", (WINDOW,)),
        ("last_offset", "<i8", (WINDOW,)),
        ("offset_delta", "<i4", (WINDOW,)),  # last_offset - first_offset of the batch
        ("max_timestamp_ms", "<i8", (WINDOW,)),
    ]
)
_ROW = struct.Struct(f"<qqqihBB{WINDOW}i{WINDOW}i{WINDOW}q{WINDOW}i{WINDOW}q")
_ROW_HEAD = struct.Struct("<qqq")  # producer_id, last_activity_ms, txn_first_offset
assert _ROW.size == PRODUCER_DTYPE.itemsize == 172
DEFAULT_EXPIRATION_MS = 24 * 3600 * 1000  # Kafka's producer.id.expiration.ms


class BatchMetadata(NamedTuple):
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp_ms: int


class ProducerStateEntry(NamedTuple):
    producer_id: int
    producer_epoch: int
    last_sequence: int  # of the newest batch, or -1 when none is cached
    last_offset: int  # of the newest batch, or -1
    last_activity_ms: int
    batches: tuple[BatchMetadata, ...]  # up to WINDOW, oldest first
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1


@dataclasses.dataclass
class _Working:
    """A mutable copy of one producer's row while a request is checked."""

    producer_id: int
    producer_epoch: int
    batches: list[BatchMetadata]
    last_activity_ms: int
    coordinator_epoch: int = -1
    txn_first_offset: int = -1

    def entry(self) -> ProducerStateEntry:
        last = self.batches[-1] if self.batches else None
        return ProducerStateEntry(
            self.producer_id,
            self.producer_epoch,
            last.last_sequence if last else fmt.NO_SEQUENCE,
            last.last_offset if last else -1,
            self.last_activity_ms,
            tuple(self.batches),
            self.coordinator_epoch,
            self.txn_first_offset,
        )

    def add_batch(self, epoch: int, batch: BatchMetadata) -> None:
        if epoch != self.producer_epoch:
            # A new epoch starts a new sequence space: older batches cannot be retried.
            self.producer_epoch = epoch
            self.batches = []
        self.batches.append(batch)
        if len(self.batches) > WINDOW:
            del self.batches[0]
        # Kafka's lastTimestamp: the newest batch's, even if an older one had a later time.
        self.last_activity_ms = batch.max_timestamp_ms


def in_sequence(last_sequence: int, next_sequence: int) -> bool:
    """Kafka's rule: next follows last, with MAX -> 0 wraparound."""
    return next_sequence == last_sequence + 1 or (next_sequence == 0 and last_sequence == fmt.INT32_MAX)


class ProducerStateManager:
    """The producer table, a ring in insertion order with second-chance expiry (brief §6).

    Each slot also records the time it becomes *due*: its last activity plus the
    expiration, as of when it was placed at the tail. Expiry pops the head while
    the head is due: an entry really past its expiration (and with no open
    transaction) is removed; one that was active since, or holds a transaction,
    is re-appended at the tail with a fresh due time (its second chance). Each
    call costs O(entries examined), amortised O(1) per producer, instead of
    Kafka's scan of every producer. A recorded due time is never later than the
    real one, so a live producer is never evicted; an expired one stuck behind a
    later-due head waits for it (it expires late, never early), and a full ring
    first runs an exhaustive pass.
    """

    def __init__(self, capacity: int, expiration_ms: int = DEFAULT_EXPIRATION_MS):
        if capacity <= 0:
            raise ValueError(f"producer capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.expiration_ms = expiration_ms
        # np.zeros maps untouched pages lazily, so a large capacity costs memory
        # only as slots are used (they are used in ring order, from the head).
        self.table = np.zeros(capacity, PRODUCER_DTYPE)
        self._bytes = self.table.data.cast("B")
        self.due_ms = np.zeros(capacity, dtype=np.int64)
        self._due = self.due_ms.data
        self._slots = PidSlotMap(capacity)
        self.head = 0  # oldest slot of the ring
        self.used = 0  # slots from head to tail, all live

    # -- reading -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._slots)

    def _read(self, slot: int) -> _Working:
        row = _ROW.unpack_from(self._bytes, slot * _ROW.size)
        pid, activity, txn_first, coordinator_epoch, epoch, count = row[:6]
        w = 7
        first_seq = row[w : w + WINDOW]
        last_seq = row[w + WINDOW : w + 2 * WINDOW]
        last_off = row[w + 2 * WINDOW : w + 3 * WINDOW]
        delta = row[w + 3 * WINDOW : w + 4 * WINDOW]
        max_ts = row[w + 4 * WINDOW : w + 5 * WINDOW]
        batches = [
            BatchMetadata(first_seq[i], last_seq[i], last_off[i] - delta[i], last_off[i], max_ts[i])
            for i in range(count)
        ]
        return _Working(pid, epoch, batches, activity, coordinator_epoch, txn_first)

    def working(self, producer_id: int) -> _Working | None:
        slot = self._slots.get(producer_id)
        return None if slot is None else self._read(slot)

    def get(self, producer_id: int) -> ProducerStateEntry | None:
        working = self.working(producer_id)
        return None if working is None else working.entry()

    def entries(self) -> Iterator[ProducerStateEntry]:
        """Every producer, oldest first."""
        for slot in self._ring_slots():
            if self.table["live"][slot]:
                yield self._read(slot).entry()

    def _used_ranges(self) -> list[tuple[int, int]]:
        end = self.head + self.used
        if end <= self.capacity:
            return [(self.head, end)]
        return [(self.head, self.capacity), (0, end - self.capacity)]

    def _ring_slots(self) -> Iterator[int]:
        for n in range(self.used):
            yield (self.head + n) % self.capacity

    # -- writing -----------------------------------------------------------------
    def _write(self, slot: int, w: _Working) -> None:
        count = len(w.batches)
        assert 0 <= count <= WINDOW, w  # assert before writing: the row format holds at most WINDOW
        pad = [0] * (WINDOW - count)
        b = w.batches
        _ROW.pack_into(
            self._bytes,
            slot * _ROW.size,
            w.producer_id,
            w.last_activity_ms,
            w.txn_first_offset,
            w.coordinator_epoch,
            w.producer_epoch,
            count,
            1,
            *[m.first_sequence for m in b],
            *pad,
            *[m.last_sequence for m in b],
            *pad,
            *[m.last_offset for m in b],
            *pad,
            *[m.last_offset - m.first_offset for m in b],
            *pad,
            *[m.max_timestamp_ms for m in b],
            *pad,
        )

    def put(self, w: _Working) -> None:
        """Store a producer's new state, taking the ring's tail slot if it is new."""
        slot = self._slots.get(w.producer_id)
        if slot is None:
            if self.used >= self.capacity:
                raise ProducerStateFullError(
                    f"all {self.capacity} producer slots hold live producers; retry after expiry"
                )
            slot = (self.head + self.used) % self.capacity
            self.used += 1
            self._slots.put(w.producer_id, slot)
            self._due[slot] = w.last_activity_ms + self.expiration_ms
        self._write(slot, w)

    def has_room_for(self, new_producers: int) -> bool:
        return self.used + new_producers <= self.capacity

    def clear(self) -> None:
        # Zero only the slots in use: touching the whole table would commit its memory.
        for start, stop in self._used_ranges():
            self.table[start:stop] = np.zeros(1, PRODUCER_DTYPE)
        self._slots.clear()
        self.head = 0
        self.used = 0

    # -- bulk: snapshots ---------------------------------------------------------
    def live_rows(self) -> np.ndarray:
        """The live rows, oldest first, as one array (what a snapshot stores)."""
        rows = np.concatenate([self.table[start:stop] for start, stop in self._used_ranges()])
        live: np.ndarray = rows[rows["live"] == 1]
        return live

    def load_rows(self, rows: np.ndarray) -> None:
        """Replace the table with `rows` (oldest first), as read from a snapshot."""
        if len(rows) > self.capacity:
            raise ProducerStateFullError(
                f"snapshot holds {len(rows)} producers, more than producer_capacity={self.capacity}"
            )
        self.clear()
        count = len(rows)
        self.table[:count] = rows
        self.table["live"][:count] = 1
        self.due_ms[:count] = rows["last_activity_ms"] + self.expiration_ms
        self.used = count
        self._slots.load(rows["producer_id"], np.arange(count, dtype=np.int32))

    # -- expiry ------------------------------------------------------------------
    @property
    def head_due_ms(self) -> int | None:
        """When the oldest entry may expire; the append path expires only past it."""
        return int(self._due[self.head]) if self.used else None

    def expire(self, now_ms: int, *, exhaustive: bool = False) -> int:
        """Remove producers idle for `expiration_ms` with no open transaction; returns how many.

        Pops from the head while the head is due. `exhaustive` examines every entry
        once whatever its due time (used when the ring is full).
        """
        expired = 0
        budget = self.used  # examine each entry at most once per call
        while self.used and budget:
            slot = self.head
            if not exhaustive and self._due[slot] > now_ms:
                break
            budget -= 1
            producer_id, activity_ms, txn_first_offset = _ROW_HEAD.unpack_from(self._bytes, slot * _ROW.size)
            if txn_first_offset < 0 and now_ms - activity_ms >= self.expiration_ms:
                self._slots.delete(producer_id)
                self.table[slot] = np.zeros(1, PRODUCER_DTYPE)
                self.head = (slot + 1) % self.capacity
                self.used -= 1
                expired += 1
                continue
            # Second chance: move it to the tail. In a full ring the tail is this
            # very slot, so advancing the head is the whole move.
            tail = (slot + self.used) % self.capacity
            if tail != slot:
                self.table[tail] = self.table[slot]
                self.table[slot] = np.zeros(1, PRODUCER_DTYPE)
                self._slots.put(producer_id, tail)
            self._due[tail] = max(activity_ms + self.expiration_ms, now_ms + 1)
            self.head = (slot + 1) % self.capacity
        return expired

    # -- replay ------------------------------------------------------------------
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
    ) -> None:
        """Apply a stored batch without checks (recovery, replication)."""
        w = self.working(producer_id) or _Working(producer_id, producer_epoch, [], max_timestamp_ms)
        if is_control:
            # A transaction marker moves the epoch but is not a retriable batch.
            if producer_epoch != w.producer_epoch:
                w.producer_epoch = producer_epoch
                w.batches = []
            w.last_activity_ms = max_timestamp_ms
        else:
            w.add_batch(
                producer_epoch,
                BatchMetadata(first_sequence, last_sequence, first_offset, last_offset, max_timestamp_ms),
            )
        self.put(w)


class DuplicateBatch(NamedTuple):
    first_offset: int
    last_offset: int


class ProducerAppendInfo:
    """Kafka's append rules for the batches of one request, checked on copies."""

    def __init__(self, manager: ProducerStateManager):
        self._manager = manager
        self._pending: dict[int, _Working] = {}
        self._new_producers = 0

    def _current(self, producer_id: int) -> _Working | None:
        pending = self._pending.get(producer_id)
        if pending is not None:
            return pending
        return self._manager.working(producer_id)

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

    def add(self, producer_id: int, producer_epoch: int, batch: BatchMetadata) -> None:
        """Record an accepted batch, so later batches of the request see it."""
        current = self._current(producer_id)
        if current is None:
            current = _Working(producer_id, producer_epoch, [], batch.max_timestamp_ms)
            self._new_producers += 1
            if not self._manager.has_room_for(self._new_producers):
                raise ProducerStateFullError(
                    f"all {self._manager.capacity} producer slots hold live producers; retry after expiry"
                )
        current.add_batch(producer_epoch, batch)
        self._pending[producer_id] = current
