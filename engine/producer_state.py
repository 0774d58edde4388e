"""Producer state: each idempotent producer's epoch and its last 5 batches.

The table is a fixed-capacity numpy structured array (one 160-byte row per
producer) with a pid -> slot dict. Rows are handed out in ring order, so the
oldest producer sits at the head: expiry pops from there. Snapshots
write and load the array directly, so loading a million producers builds no
per-producer Python objects beyond the slot map.

Single rows are read and written with one struct call on the array's memory,
which is several times cheaper than numpy's per-field access on the append path.

Kafka's append rules, which read this table, are in `oncelog.append_rules`.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from oncelog.errors import ProducerStateFullError
from oncelog.lazy_memory import lazy_zeros_group
from oncelog.pid_map import PidSlotMap
from oncelog.segments import format as fmt
from oncelog.segments.cursor import CursorField, cursor_view
from oncelog.storage.producer_row import FEW_ROWS, LAST_APPEND_AT, LIVE_AT, ROW_HEAD
from oncelog.storage.producer_row import PRODUCER_DTYPE as PRODUCER_DTYPE
from oncelog.storage.producer_row import ROW as _ROW
from oncelog.storage.producer_row import UNKNOWN_APPEND_MS as UNKNOWN_APPEND_MS
from oncelog.storage.producer_row import WINDOW as WINDOW

# Producers kept as objects besides their rows (see ProducerStateManager._remember).
HOT_PRODUCERS = 4096
SEQUENCE_MODULUS = fmt.INT32_MAX + 1
DEFAULT_EXPIRATION_MS = 24 * 3600 * 1000  # Kafka's producer.id.expiration.ms
_EXPIRY_CHUNK = 16384  # rows examined per numpy pass (the due scan reads them all)
FULL_PASS_INTERVAL_MS = 10 * 60 * 1000  # Kafka's producer.id.expiration.check.interval.ms
_EMPTY_ROW = np.zeros(1, PRODUCER_DTYPE)
assert not _EMPTY_ROW.view(np.uint8).any()  # expire() empties rows with a memset
_MAX_DUE_S = 2**32 - 1
# An expiration added to a time in a numpy array is capped here: every due time past it
# rounds to _MAX_DUE_S anyway, and int64 sums stay below 2^63 (no wrap to "due at once").
_MAX_DUE_ADDEND_MS = (_MAX_DUE_S + 1) * 1000
_MASK64 = (1 << 64) - 1
_I64 = struct.Struct("<q")
_PID_AND_APPEND = struct.Struct("<qq")  # a row's first two fields
assert _PID_AND_APPEND.size == LAST_APPEND_AT + 8 == 16  # producer_id at 0, then last_append_ms
# Expiry's clock is capped here (some 146 million years): every due time it computes
# (now + expiration, now + 1) stays an int64.
_MAX_NOW_MS = 2**62


# The ring's scalars, in an int64 array the compiled append (oncelog._append) shares.
RING_HEAD = 0
RING_USED = 1
RING_HOLES = 2
RING_EXPIRATION_MS = 3
RING_FIELDS = 4


def in_sequence(last_sequence: int, next_sequence: int) -> bool:
    """Kafka's rule: next follows last, with MAX -> 0 wraparound."""
    return next_sequence == last_sequence + 1 or (next_sequence == 0 and last_sequence == fmt.INT32_MAX)


def first_sequence_of(last_sequence: int, offset_delta: int) -> int:
    """A batch's first sequence from its last one, wrapping as sequences do (MAX -> 0)."""
    if last_sequence == fmt.NO_SEQUENCE:
        return fmt.NO_SEQUENCE  # a leader's batch with no sequence: none at either end
    return (last_sequence - offset_delta) % SEQUENCE_MODULUS


def _due_seconds(due_ms: int) -> int:
    """Round down and clamp into uint32 seconds: never later than the real due time."""
    return min(max(due_ms, 0) // 1000, _MAX_DUE_S)


def _due_seconds_array(due_ms: np.ndarray) -> np.ndarray:
    # The ufuncs, not np.clip, whose Python dispatch costs twice as much (3.6 against 1.6 us).
    due_s: np.ndarray = np.minimum(np.maximum(due_ms // 1000, 0), _MAX_DUE_S).astype(np.uint32)
    return due_s


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
    last_append_ms: int  # the engine's clock: what expiry reads
    batches: tuple[BatchMetadata, ...]  # up to WINDOW, oldest first
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1
    last_timestamp_ms: int = -1  # the newest batch's timestamp (the client's clock)


@dataclasses.dataclass
class WorkingState:
    """A mutable copy of one producer's row while a request is checked."""

    producer_id: int
    producer_epoch: int
    batches: list[BatchMetadata]
    last_append_ms: int
    coordinator_epoch: int = -1
    txn_first_offset: int = -1
    last_timestamp_ms: int = -1

    def copy(self) -> WorkingState:
        return WorkingState(
            self.producer_id,
            self.producer_epoch,
            list(self.batches),
            self.last_append_ms,
            self.coordinator_epoch,
            self.txn_first_offset,
            self.last_timestamp_ms,
        )

    def entry(self) -> ProducerStateEntry:
        last = self.batches[-1] if self.batches else None
        return ProducerStateEntry(
            self.producer_id,
            self.producer_epoch,
            last.last_sequence if last else fmt.NO_SEQUENCE,
            last.last_offset if last else -1,
            self.last_append_ms,
            tuple(self.batches),
            self.coordinator_epoch,
            self.txn_first_offset,
            self.last_timestamp_ms,
        )

    def add_batch(self, epoch: int, batch: BatchMetadata) -> None:
        if epoch != self.producer_epoch:
            # A new epoch starts a new sequence space: older batches cannot be retried.
            self.producer_epoch = epoch
            self.batches = []
        elif (
            self.batches
            and batch.first_sequence != fmt.NO_SEQUENCE
            and self.batches[-1].last_sequence != fmt.NO_SEQUENCE
            and not in_sequence(self.batches[-1].last_sequence, batch.first_sequence)
        ):
            # Same epoch, not in sequence: the engine took it from an unknown producer (it
            # had expired), which starts afresh. A replay that kept the old batches would
            # take a new batch matching one of them for a duplicate and drop it.
            self.batches = []
        self.batches.append(batch)
        if len(self.batches) > WINDOW:
            del self.batches[0]
        # Kafka's lastTimestamp: the newest batch's, even if an older one had a later time.
        self.last_timestamp_ms = batch.max_timestamp_ms


class ProducerStateManager:
    """The producer table, a ring in insertion order with second-chance expiry.

    The expiry rule: a producer expires once `now - last_append_ms >=
    expiration_ms` and it has no open transaction. Both times are the engine's
    clock; batch timestamps come from clients (a mirror keeps its source's, clocks
    skew) and never decide it. Kafka compares batch timestamps, so there a
    producer stamping old times loses dedupe and fencing at the next check.

    Each slot also records the time it becomes *due*: its last append plus the
    expiration, as of when it was placed at the tail. Expiry pops the head while
    the head is due: an entry really past its expiration (and with no open
    transaction) is removed; one that was active since, or holds a transaction,
    is re-appended at the tail with a fresh due time (its second chance). Each
    call costs O(entries examined), amortised O(1) per producer, instead of
    Kafka's scan of every producer.

    Expiry is never early: the real idle time is checked before removal. Appends
    place producers in clock order, so due times rise along the ring; rows loaded
    from a snapshot keep the old ring order, where a later-due head can hide an
    idle producer behind it. A vectorised full pass, at most every
    `full_pass_interval_ms` (Kafka's 10-minute check interval), bounds that
    delay. The full pass marks expired producers anywhere as holes (`live` = 0),
    which the head pops later; a full ring runs one and compacts the holes away.
    """

    head = CursorField[int](RING_HEAD)  # oldest slot of the ring
    used = CursorField[int](RING_USED)  # slots from head to tail, holes included
    holes = CursorField[int](RING_HOLES)  # slots in the ring whose producer a full pass expired
    expiration_ms = CursorField[int](RING_EXPIRATION_MS)

    def __init__(
        self,
        capacity: int,
        expiration_ms: int = DEFAULT_EXPIRATION_MS,
        full_pass_interval_ms: int = FULL_PASS_INTERVAL_MS,
    ):
        if capacity <= 0:
            raise ValueError(f"producer capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.ring = np.zeros(RING_FIELDS, dtype=np.int64)
        self._cursor_view = cursor_view(self.ring)
        self.expiration_ms = expiration_ms
        # Untouched pages cost nothing (lazy_memory), so a large capacity costs memory
        # only as slots are used (they are used in ring order, from the head).
        # due_s: due times in whole seconds, rounded down: never later than the real due
        # time, which is all expiry needs, at half the memory of milliseconds.
        # One mapping for the table and the pid map (a mapping costs 5 us; every Log open makes one).
        self.table, self.due_s, *map_arrays = lazy_zeros_group(
            (capacity, PRODUCER_DTYPE), (capacity, np.uint32), *PidSlotMap.array_specs(capacity)
        )
        # Through a uint8 view: a structured array's own .data builds its format each time.
        self._bytes = self.table.view(np.uint8).data
        self._due = self.due_s.data
        self._slots = PidSlotMap(capacity, map_arrays)
        self._hot: dict[int, WorkingState] = {}
        self.full_pass_interval_ms = full_pass_interval_ms
        self._last_full_pass_ms: int | None = None

    # -- reading -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._slots)

    def _read(self, slot: int) -> WorkingState:
        row = _ROW.unpack_from(self._bytes, slot * _ROW.size)
        pid, appended, timestamp, txn_first, coordinator_epoch, epoch, count = row[:7]
        w = 8
        last_seq = row[w : w + WINDOW]
        last_off = row[w + WINDOW : w + 2 * WINDOW]
        delta = row[w + 2 * WINDOW : w + 3 * WINDOW]
        max_ts = row[w + 3 * WINDOW : w + 4 * WINDOW]
        batches = [
            BatchMetadata(
                first_sequence_of(last_seq[i], delta[i]),
                last_seq[i],
                last_off[i] - delta[i],
                last_off[i],
                max_ts[i],
            )
            for i in range(count)
        ]
        return WorkingState(pid, epoch, batches, appended, coordinator_epoch, txn_first, timestamp)

    def working(self, producer_id: int) -> WorkingState | None:
        """A copy of the producer's state to check a request against (the caller may change it)."""
        cached = self._hot.get(producer_id)
        if cached is not None:
            return cached.copy()
        slot = self._slots.get(producer_id)
        if slot is None:
            return None
        w = self._read(slot)
        self._remember(w)
        return w.copy()

    def _remember(self, w: WorkingState) -> None:
        # Unpacking a row costs more than checking the batch: keep the producers that
        # appended lately, a bounded few, as objects. The table stays the truth.
        hot = self._hot
        hot.pop(w.producer_id, None)
        hot[w.producer_id] = w
        if len(hot) > HOT_PRODUCERS:
            del hot[next(iter(hot))]  # the least recently stored

    def get(self, producer_id: int) -> ProducerStateEntry | None:
        working = self.working(producer_id)
        return None if working is None else working.entry()

    def entries(self) -> Iterator[ProducerStateEntry]:
        """Every producer, oldest first."""
        for slot in self._ring_slots():
            if self.table["live"][slot] == 1:
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
    def _write(self, slot: int, w: WorkingState) -> None:
        count = len(w.batches)
        assert 0 <= count <= WINDOW, w  # assert before writing: the row format holds at most WINDOW
        pad = [0] * (WINDOW - count)
        b = w.batches
        _ROW.pack_into(
            self._bytes,
            slot * _ROW.size,
            w.producer_id,
            w.last_append_ms,
            w.last_timestamp_ms,
            w.txn_first_offset,
            w.coordinator_epoch,
            w.producer_epoch,
            count,
            1,
            *[m.last_sequence for m in b],
            *pad,
            *[m.last_offset for m in b],
            *pad,
            *[m.last_offset - m.first_offset for m in b],
            *pad,
            *[m.max_timestamp_ms for m in b],
            *pad,
        )

    def put(self, w: WorkingState) -> None:
        """Store a producer's new state, taking the ring's tail slot if it is new.

        `w.last_append_ms` is the engine's time of the append that produced it.
        """
        slot = self._slots.get(w.producer_id)
        if slot is None:
            due_s = _due_seconds(w.last_append_ms + self.expiration_ms)  # raises before any change
            if self.used >= self.capacity and self.holes:
                self._compact()
            if self.used >= self.capacity:
                raise ProducerStateFullError(
                    f"all {self.capacity} producer slots hold live producers; retry after expiry"
                )
            slot = (self.head + self.used) % self.capacity
            self.used += 1
            self._slots.put(w.producer_id, slot)
            self._due[slot] = due_s
        self._write(slot, w)
        newest = w.batches[-1] if w.batches else None
        if newest is not None:
            # The row keeps a batch's last sequence and offset delta, not its first sequence
            # (first_sequence_of). A leader's batch with a negative baseSequence other than -1
            # has a first sequence the row cannot give back: remember what the row says, so a
            # retry is answered the same from the hot cache as from the table.
            first = first_sequence_of(newest.last_sequence, newest.last_offset - newest.first_offset)
            if first != newest.first_sequence:
                w.batches[-1] = newest._replace(first_sequence=first)
        self._remember(w)  # the caller hands `w` over and does not change it again

    def shared_arrays(self) -> dict[str, object]:
        """What the compiled append (oncelog._append) reads and writes in place.

        It drops the producers it changes from the hot cache, so `working` never
        returns a row older than the table's.
        """
        slots = self._slots
        return {
            "hot": self._hot,
            "table": self.table,
            "due_s": self.due_s,
            "ring": self.ring,
            "pid_keys": slots.keys,
            "pid_values": slots.values,
            "pid_bucket_of": slots.bucket_of,
            "pid_map": slots.state,
        }

    def has_room_for(self, new_producers: int) -> bool:
        return len(self._slots) + new_producers <= self.capacity

    def __contains__(self, producer_id: int) -> bool:
        return self._slots.get(producer_id) is not None

    def recency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(producer ids, last append times, offsets of their newest batch or -1) of every
        producer with no open transaction: what recovery orders them by when it must shed
        some (ReplayBuffer.flush)."""
        ids, appended, newest = [], [], []
        for start, stop in self._used_ranges():
            region = self.table[start:stop]
            rows = region[(region["live"] == 1) & (region["txn_first_offset"] < 0)]
            ids.append(rows["producer_id"])
            appended.append(rows["last_append_ms"])
            newest.append(newest_offsets(rows))
        return np.concatenate(ids), np.concatenate(appended), np.concatenate(newest)

    def _compact(self) -> None:
        """Close the holes a full pass left, keeping ring order (O(n); only when full)."""
        self.load_rows(self.live_rows().copy())

    def clear(self) -> None:
        # Zero only the slots in use: touching the whole table would commit its memory.
        for start, stop in self._used_ranges():
            self.table[start:stop] = _EMPTY_ROW
        self._slots.clear()
        self._hot.clear()
        self.head = 0
        self.used = 0
        self.holes = 0

    # -- bulk: snapshots ---------------------------------------------------------
    def live_rows(self) -> np.ndarray:
        """The rows, oldest first, as one array (what a snapshot stores).

        A view of the table when the ring does not wrap: use it before the next
        change to the table.
        """
        ranges = self._used_ranges()
        if len(ranges) == 1:
            start, stop = ranges[0]
            rows = self.table[start:stop]
        else:
            rows = np.concatenate([self.table[start:stop] for start, stop in ranges])
        if self.holes:
            rows = rows[rows["live"] == 1]
        return rows

    def load_rows(self, rows: np.ndarray, now_ms: int | None = None) -> None:
        """Replace the table with `rows` (oldest first), as read from a snapshot.

        With `now_ms` (a load), a last append time that is unknown (UNKNOWN_APPEND_MS:
        a Kafka snapshot, an older oncelog one) or later than `now_ms` (the clock went
        back across a restart) becomes `now_ms`: the latest the append could have been.
        Expiry then never drops a producer the running engine would have kept; at
        worst it keeps one for up to one more expiration period.
        """
        self._hot.clear()
        count = len(rows)
        if count > self.capacity:
            raise ProducerStateFullError(
                f"snapshot holds {count} producers, more than producer_capacity={self.capacity}"
            )
        # Zero only what the new rows will not overwrite (rows read in place are
        # within [0, count), so this never touches them).
        for start, stop in self._used_ranges():
            if stop > count:
                self.table[max(start, count) : stop] = _EMPTY_ROW
        self.head = 0
        self.used = count
        self.holes = 0
        # .ctypes.data, not __array_interface__ (which builds a structured dtype's descr in Python).
        in_place = count and rows.ctypes.data == self.table.ctypes.data
        if not in_place:
            self.table[:count] = rows  # else read_snapshot(into=table) already put them there
        try:
            if count <= FEW_ROWS and now_ms is not None:
                self._slots.load(self._resolve_few(count, now_ms), list(range(count)))
                return
            self.table["live"][:count] = 1
            appended = self.table["last_append_ms"][:count]
            if now_ms is not None:
                # One compare finds both: unknown (negative) times read as huge when unsigned.
                unresolved = appended.view(np.uint64) > np.uint64(max(now_ms, 0))
                if unresolved.any():
                    np.copyto(appended, now_ms, where=unresolved)
            self.due_s[:count] = _due_seconds_array(appended + min(self.expiration_ms, _MAX_DUE_ADDEND_MS))
            self._slots.load(rows["producer_id"], np.arange(count, dtype=np.int32))
        except BaseException:
            self.clear()
            raise

    def _resolve_few(self, count: int, now_ms: int) -> list[int]:
        """load_rows' steps for the first `count` rows, row by row (FEW_ROWS): each live, its
        unresolved append time now, its due time set; returns their producer ids."""
        rows, due = self._bytes, self._due
        ceiling = max(now_ms, 0)
        producer_ids = []
        for slot in range(count):
            at = slot * _ROW.size
            producer_id, appended = _PID_AND_APPEND.unpack_from(rows, at)
            if appended & _MASK64 > ceiling:  # as load_rows: unknown (negative) reads as huge
                appended = now_ms
                _I64.pack_into(rows, at + LAST_APPEND_AT, appended)
            rows[at + LIVE_AT] = 1
            due[slot] = _due_seconds(appended + self.expiration_ms)
            producer_ids.append(producer_id)
        return producer_ids

    # -- expiry ------------------------------------------------------------------
    @property
    def head_due_ms(self) -> int | None:
        """When the oldest entry may expire; the append path expires only past it."""
        return int(self._due[self.head]) * 1000 if self.used else None

    def expire_due(self, now_ms: int) -> int:
        """The expiry every append triggers: a pass only once the oldest entry is due (else free)."""
        due_ms = self.head_due_ms
        if due_ms is not None and due_ms <= now_ms:
            return self.expire(now_ms)
        return 0

    def expire(self, now_ms: int, *, exhaustive: bool = False) -> int:
        """Remove producers idle for `expiration_ms` with no open transaction; returns how many.

        Pops the run of due entries at the head, a chunk at a time with numpy:
        expired ones leave the table and the pid map in one store each; the others
        are re-appended at the tail with a fresh due time (their second chance).
        A full pass runs first when `exhaustive`, on the first call, and then at
        most every `full_pass_interval_ms`.
        """
        now_ms = min(now_ms, _MAX_NOW_MS)
        now_s = max(now_ms, 0) // 1000
        expired = 0
        last = self._last_full_pass_ms
        # A last pass "in the future" (an explicit call with a later time) is no reason to wait.
        if exhaustive or last is None or not 0 <= now_ms - last < self.full_pass_interval_ms:
            # Every Log open asks: when no slot in use was idle for the expiration, the pass
            # would find none (a hole keeps its old time: at worst the pass runs for nothing).
            if not self._none_idle(now_ms):
                expired += self._full_pass(now_ms)
            self._last_full_pass_ms = now_ms
        budget = self.used  # each entry present at the call is examined at most once
        while self.used and budget:
            start = self.head
            n = self._due_run(start, min(budget, self.capacity - start, _EXPIRY_CHUNK), now_s)
            if n == 0:
                break
            region = self.table[start : start + n]
            activity = region["last_append_ms"]
            live = region["live"] == 1
            gone = live & (region["txn_first_offset"] < 0) & (now_ms - activity >= self.expiration_ms)
            keep = np.flatnonzero(live & ~gone)
            if keep.size:  # copied out before the region is emptied
                kept_rows = region[keep].copy()
                kept_due = _due_seconds_array(
                    np.maximum(
                        np.minimum(activity[keep], now_ms) + min(self.expiration_ms, _MAX_DUE_ADDEND_MS),
                        now_ms + 1,
                    )
                )
            self._slots.delete_slots(start + np.flatnonzero(gone))
            old_slots = start + keep
            # _EMPTY_ROW is all zeros: a memset, where assigning the structured row takes 4x as long.
            region.view(np.uint8).fill(0)
            self.head = (start + n) % self.capacity
            self.used -= n
            self.holes -= int(n - np.count_nonzero(live))
            budget -= n
            expired += int(np.count_nonzero(gone))
            if keep.size:
                # In a full ring the tail is the region just emptied: rows were copied out first.
                tails = (self.head + self.used + np.arange(keep.size)) % self.capacity
                self._slots.move_slots(old_slots, tails)
                self.table[tails] = kept_rows
                self.due_s[tails] = kept_due
                self.used += keep.size
        if expired:
            self._hot.clear()  # some of them may have left the table
        return expired

    def retire(self, producer_ids: list[int]) -> int:
        """Forget producers that will never write again (no open transaction), as expiry
        would later; returns how many left. Their slots become holes the head pops.

        For a writer that knows a producer is finished (a Spark task attempt whose
        transaction committed): without it each such producer holds a slot for
        `expiration_ms`, and a stream of short-lived producers fills the table.
        """
        slots = []
        for producer_id in dict.fromkeys(producer_ids):  # (once each: a slot twice would count twice)
            slot = self._slots.get(producer_id)
            if (
                slot is not None
                and self.table[slot]["live"] == 1
                and self.table[slot]["txn_first_offset"] < 0
            ):
                slots.append(slot)
                self._hot.pop(producer_id, None)
        if slots:
            at = np.asarray(slots, dtype=np.int64)
            self._slots.delete_slots(at)
            self.table["live"][at] = 0
            self.due_s[at] = 0  # due now: the head pops the holes when it reaches them
            self.holes += len(slots)
        return len(slots)

    def _due_run(self, start: int, n: int, now_s: int) -> int:
        """How many of the `n` slots from `start` are due by `now_s` before the first that is not."""
        if n <= FEW_ROWS:
            due = self._due
            return next((k for k in range(n) if due[start + k] > now_s), n)
        not_due = np.flatnonzero(self.due_s[start : start + n] > now_s)
        return int(not_due[0]) if not_due.size else n

    def _none_idle(self, now_ms: int) -> bool:
        """Whether every slot in use had an append within the expiration (_full_pass's rule)."""
        since = now_ms - self.expiration_ms
        if self.used <= FEW_ROWS:
            rows = self._bytes
            return all(
                _I64.unpack_from(rows, slot * _ROW.size + LAST_APPEND_AT)[0] > since
                for slot in self._ring_slots()
            )
        appended = self.table["last_append_ms"]
        ranges = self._used_ranges()
        return all(bool(appended[start:stop].min() > since) for start, stop in ranges if stop > start)

    def _full_pass(self, now_ms: int) -> int:
        """Expire idle producers anywhere in the ring, leaving holes for the head to pop."""
        expired = 0
        for start, stop in self._used_ranges():
            region = self.table[start:stop]
            gone = np.flatnonzero(
                (region["live"] == 1)
                & (region["txn_first_offset"] < 0)
                & (now_ms - region["last_append_ms"] >= self.expiration_ms)
            )
            if gone.size:
                self._slots.delete_slots(start + gone)
                region["live"][gone] = 0
                # Due now, so the head pops the holes as soon as it reaches them.
                self.due_s[start + gone] = 0
                expired += gone.size
        self.holes += expired
        return expired

    def make_room(self, now_ms: int) -> int:
        """For a full ring: expire everything due and compact the holes away."""
        expired = self.expire(now_ms, exhaustive=True)
        if self.holes:
            self._compact()
        return expired

    def open_transactions(self) -> dict[int, int]:
        """producer id -> first offset of its open transaction, for every producer with one."""
        out: dict[int, int] = {}
        if self.used <= FEW_ROWS:  # row by row (FEW_ROWS): every Log open asks this
            rows = self._bytes
            for slot in self._ring_slots():
                producer_id, _, _, txn_first, _, _, _, live = ROW_HEAD.unpack_from(rows, slot * _ROW.size)
                if live == 1 and txn_first >= 0:
                    out[producer_id] = txn_first
            return out
        for start, stop in self._used_ranges():
            region = self.table[start:stop]
            open_rows = region[(region["live"] == 1) & (region["txn_first_offset"] >= 0)]
            pids, first_offsets = open_rows["producer_id"].tolist(), open_rows["txn_first_offset"].tolist()
            out.update(zip(pids, first_offsets, strict=True))
        return out


def newest_offsets(rows: np.ndarray) -> np.ndarray:
    """Each row's newest batch's last offset, -1 for an empty window."""
    count = rows["window_count"].astype(np.int64)
    last = rows["last_offset"][np.arange(len(rows)), np.maximum(count - 1, 0)]
    newest: np.ndarray = np.where(count > 0, last, -1)
    return newest


def fit_rows(rows: np.ndarray, capacity: int, now_ms: int, expiration_ms: int) -> tuple[np.ndarray, int]:
    """A snapshot's rows cut down to `capacity` (the capacity was lowered since it was
    written, or a tool without the log's config wrote it); also how many were shed.

    Producers past their expiration go first, as the load would expire them anyway;
    then the least recently appended without an open transaction (by append time, then
    newest offset), as recovery sheds them. ProducerStateFullError only if open
    transactions alone do not fit.
    """
    if len(rows) <= capacity:
        return rows, 0
    appended = rows["last_append_ms"]
    appended = np.where((appended < 0) | (appended > now_ms), now_ms, appended)
    open_txn = rows["txn_first_offset"] >= 0
    keep = open_txn | (now_ms - appended < expiration_ms)
    if np.count_nonzero(keep) > capacity:
        if np.count_nonzero(open_txn) > capacity:
            raise ProducerStateFullError(
                f"snapshot holds {np.count_nonzero(open_txn)} open transactions, more than "
                f"producer_capacity={capacity}"
            )
        candidates = np.flatnonzero(keep & ~open_txn)
        excess = int(np.count_nonzero(keep)) - capacity
        order = np.lexsort((newest_offsets(rows)[candidates], appended[candidates]))
        keep[candidates[order[:excess]]] = False
        shed = excess
    else:
        shed = 0
    return rows[keep], shed


class CompletedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    aborted: bool
