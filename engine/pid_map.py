"""PidSlotMap: producer id -> table slot, in flat numpy arrays.

A Python dict costs about 100 bytes and two int objects per producer, and building
one from a snapshot creates a million objects. This open-addressing table (linear
probing) costs 12 bytes per bucket with live keys at a load factor of at most 0.75,
about 16 bytes per producer, and has vectorised bulk operations for snapshot loads
and expiry. Single lookups index the arrays through memoryviews, which return
plain ints.

Keys are stored as ~producer_id (negative), so an empty bucket is 0: the arrays
come from lazy_zeros, whose untouched pages cost no memory. Probing uses only the
first `buckets` of them (the range in use, MAP_BUCKETS, which the compiled append
reads too): 509 at first, one page of keys, so a log (one of thousands under a
LogManager) with a few producers touches a page of each array, not one per producer.

Deletes leave tombstones (so a batch of deletes is one vectorised store); when
live keys plus tombstones pass 0.85 of the range, the table is rebuilt from its
live keys in one vectorised pass, amortised below a microsecond per delete, into
the range they need (4x + 1 each step, up to the arrays' length).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from oncelog import compiled_module
from oncelog.lazy_memory import lazy_zeros_group
from oncelog.segments.cursor import CursorField, cursor_view

EMPTY = 0  # stored keys are ~producer_id < 0, so non-negative values are free markers
TOMBSTONE = 1  # a deleted key: lookups probe past it, inserts may reuse it
_MAX_LIVE_LOAD = 0.75
MAX_OCCUPIED_LOAD = 0.85
# Fibonacci hashing then a xor-shift spreads sequential producer ids (the common case).
# The compiled append (engine/_append.c) hashes the same way; a test compares its constants.
HASH_MULTIPLIER = 0x9E3779B97F4A7C15
HASH_SHIFT = 29
_MASK64 = (1 << 64) - 1


class DuplicateProducerError(ValueError):
    """Bulk load found one producer id twice (a corrupt snapshot)."""


# The map's scalars, in an int64 array the compiled append (oncelog._append) shares.
MAP_COUNT = 0
MAP_TOMBSTONES = 1
MAP_BUCKETS = 2  # the buckets in use: the first this many of the arrays' max_buckets
MAP_FIELDS = 3

# The range in use starts at one page of keys and grows fourfold: a few producers (most of
# a LogManager's partitions) then touch 3 pages of the map, not one per producer per array.
# Never a power of two: `% buckets` would then keep only the hash's low bits, and ids that
# differ only in their high bits (i << 40) would share a few home buckets.
FIRST_BUCKETS = 509  # a prime; 509 keys of 8 bytes fit one 4 KiB page


# Loads of at most this many ids go one put at a time.
SMALL_LOAD = 32

# The compiled placing of a bulk load (oncelog._append.load_pid_map): one probe per key in C,
# prefetching the homes ahead, where the vectorised rounds below make a dozen passes over
# megabyte arrays (1M producers, cProfile: 36 ms against 180 ms). None: not built, or pure
# (ONCELOG_PURE=1); inside compiled_module.forced_pure() neither is taken (see _c_path).
_compiled = compiled_module.active()  # (at import: built, and not ONCELOG_PURE=1)
compiled_load: Callable[..., int] | None = None if _compiled is None else _compiled.load_pid_map
# Expiry's removal of a run of slots in C (oncelog._append.delete_pid_slots): one pass with
# the keys prefetched, where numpy's check and store each miss the cache once per key.
compiled_delete: Callable[..., int] | None = None if _compiled is None else _compiled.delete_pid_slots


_CPath = Callable[..., int]


def _c_path(function: _CPath | None) -> _CPath | None:
    """`function` (one of the C paths above), unless compiled_module.forced_pure() is on."""
    return None if compiled_module.forcing_pure() else function


class PidSlotMap:
    count = CursorField[int](MAP_COUNT)
    tombstones = CursorField[int](MAP_TOMBSTONES)
    buckets = CursorField[int](MAP_BUCKETS)

    def __init__(
        self, capacity: int, arrays: Sequence[np.ndarray] | None = None, *, first_buckets: int = FIRST_BUCKETS
    ):
        """`arrays`: zeroed arrays made to `array_specs(capacity)` by the caller (the
        producer table maps them with its own, one mapping instead of two); else made here.
        `first_buckets`: the range in use while few keys are (tests lower it to see growth)."""
        assert first_buckets >= 1, first_buckets
        self.capacity = capacity
        self._first_buckets = first_buckets
        self.state = np.zeros(MAP_FIELDS, dtype=np.int64)
        self._cursor_view = cursor_view(self.state)
        specs = self.array_specs(capacity)
        self.max_buckets = specs[0][0]
        self.buckets = self._buckets_for(0)
        # keys: all EMPTY. bucket_of, the reverse index (slot -> bucket): expiry removes or
        # moves a run of slots with one vectorised store instead of probing for each
        # producer; read only for slots put.
        made = lazy_zeros_group(*specs) if arrays is None else tuple(arrays)
        assert [(len(a), a.dtype) for a in made] == specs, "arrays not made to array_specs"
        self.keys, self.values, self.bucket_of = made
        self._keys = self.keys.data
        self._values = self.values.data
        self._bucket_of = self.bucket_of.data
        self.count = 0
        self.tombstones = 0

    @staticmethod
    def array_specs(capacity: int) -> list[tuple[int, np.dtype[Any]]]:
        """(length, dtype) of the keys, values and bucket_of arrays for `capacity` producers."""
        buckets = max(8, int(capacity / _MAX_LIVE_LOAD) + 1)
        return [(buckets, np.dtype(np.int64)), (buckets, np.dtype(np.int32)), (capacity, np.dtype(np.int32))]

    def _buckets_for(self, live: int) -> int:
        """The smallest range of the growth steps holding `live` keys at the live load."""
        buckets = min(self._first_buckets, self.max_buckets)
        while buckets < self.max_buckets and live > buckets * _MAX_LIVE_LOAD:
            buckets = min(4 * buckets + 1, self.max_buckets)  # (odd: see FIRST_BUCKETS)
        return buckets

    def __len__(self) -> int:
        return self.count

    # -- single keys (the append path) -------------------------------------------------
    def _home(self, producer_id: int) -> int:
        mixed = (producer_id * HASH_MULTIPLIER) & _MASK64
        return (mixed ^ (mixed >> HASH_SHIFT)) % self.buckets

    def _homes(self, producer_ids: np.ndarray) -> np.ndarray:
        mixed = producer_ids.astype(np.uint64) * np.uint64(HASH_MULTIPLIER)
        return ((mixed ^ (mixed >> np.uint64(HASH_SHIFT))) % np.uint64(self.buckets)).astype(np.int64)

    def _probe(self, producer_id: int) -> tuple[int, int]:
        """(bucket holding the key or the empty bucket ending its run, first tombstone or -1)."""
        keys, buckets = self._keys, self.buckets
        stored = ~producer_id
        i = self._home(producer_id)
        first_tombstone = -1
        while True:
            key = keys[i]
            if key in (stored, EMPTY):
                return i, first_tombstone
            if key == TOMBSTONE and first_tombstone < 0:
                first_tombstone = i
            i += 1
            if i == buckets:
                i = 0

    def get(self, producer_id: int) -> int | None:
        i, _ = self._probe(producer_id)
        return None if self._keys[i] == EMPTY else int(self._values[i])

    def put(self, producer_id: int, slot: int) -> None:
        assert producer_id >= 0, producer_id
        i, tombstone = self._probe(producer_id)
        if self._keys[i] == EMPTY:
            assert self.count < self.capacity, (self.count, self.capacity)
            if tombstone >= 0:
                i = tombstone
                self.tombstones -= 1
            self._keys[i] = ~producer_id
            self.count += 1
        self._values[i] = slot
        self._bucket_of[slot] = i
        if self.count + self.tombstones > self.buckets * MAX_OCCUPIED_LOAD:
            self._rebuild()

    def _put_new(self, producer_ids: list[int], slots: list[int]) -> None:
        """put() of distinct ids into the empty map: no tombstones to reuse, no key already
        there, and (at most capacity keys, a load of 0.75) no rebuild, so each is a probe for
        the first empty bucket and three stores."""
        keys, values, bucket_of, buckets = self._keys, self._values, self._bucket_of, self.buckets
        for producer_id, slot in zip(producer_ids, slots, strict=True):
            i = self._home(producer_id)
            while keys[i] != EMPTY:
                i = i + 1 if i + 1 < buckets else 0
            keys[i] = ~producer_id
            values[i] = slot
            bucket_of[slot] = i
        self.count = len(producer_ids)

    def delete(self, producer_id: int) -> None:
        i, _ = self._probe(producer_id)
        if self._keys[i] != EMPTY:
            self._keys[i] = TOMBSTONE
            self.count -= 1
            self.tombstones += 1

    # -- many keys at once (snapshot load, expiry) -------------------------------------
    def delete_slots(self, slots: np.ndarray) -> None:
        """Remove the producers held in these table slots (expiry at the ring's head)."""
        delete = _c_path(compiled_delete)
        if delete is not None:
            slots = np.ascontiguousarray(slots, dtype=np.int64)
            failed = delete(self.keys, self.bucket_of, slots, self.buckets)
            if failed >= 0:  # (raised, not asserted: under -O the counts would still move)
                raise AssertionError(f"delete_slots on slot {int(slots[failed])}, which holds no producer")
            self.count -= len(slots)
            self.tombstones += len(slots)
            return
        buckets = self.bucket_of[slots]
        assert np.all(self.keys[buckets] < 0), "delete_slots on a slot with no producer"
        self.keys[buckets] = TOMBSTONE
        self.count -= len(buckets)
        self.tombstones += len(buckets)

    def move_slots(self, old_slots: np.ndarray, new_slots: np.ndarray) -> None:
        """Point the producers in `old_slots` at `new_slots` (expiry's second chance)."""
        buckets = self.bucket_of[old_slots]
        self.values[buckets] = new_slots
        self.bucket_of[new_slots] = buckets

    def clear(self) -> None:
        if self.count or self.tombstones:  # an empty map's pages stay untouched
            self.keys[: self.buckets].fill(EMPTY)  # (no key lies past the range in use)
        self.count = 0
        self.tombstones = 0

    def _rebuild(self) -> None:
        """Drop the tombstones, and move to the range the live keys need (load)."""
        in_use = self.keys[: self.buckets]
        live = in_use < 0
        self.load(~in_use[live], self.values[: self.buckets][live].copy())

    def load(self, producer_ids: np.ndarray | list[int], slots: np.ndarray | list[int]) -> None:
        """Replace the contents with these pairs, vectorised (snapshot load).

        Round r tries bucket home + r for every key not yet placed; a key placed in
        round r found buckets home .. home + r - 1 taken, and they stay taken, so a
        linear probe from its home reaches it. Identical ids always want the same
        bucket in the same round, so after each round a loser whose wanted bucket
        now holds its own id is a duplicate: caught without sorting.
        """
        self.clear()
        count = len(producer_ids)
        if count > self.capacity:
            raise ValueError(f"{count} producer ids exceed the map's capacity {self.capacity}")
        self.buckets = self._buckets_for(count)
        if count <= SMALL_LOAD:
            # A few ids (most partitions' snapshots): one put each beats the vectorised rounds'
            # fixed cost (measured: 0.1 ms per load, a tenth of a clean Log.open).
            ids = producer_ids if isinstance(producer_ids, list) else producer_ids.tolist()
            if len(set(ids)) == count and min(ids, default=0) >= 0:  # else the rounds below say why
                self._put_new(ids, slots if isinstance(slots, list) else slots.tolist())
                return
        pids = np.asarray(producer_ids, dtype=np.int64)
        place = _c_path(compiled_load)
        if place is not None:
            self._load_compiled(place, pids, np.ascontiguousarray(slots, dtype=np.int32))
            return
        # The keys still to place, kept compacted so each round touches only them.
        homes = self._homes(pids)
        slots = np.asarray(slots, dtype=np.int32)
        claim = np.empty(self.buckets, dtype=np.int64)  # scratch: which key claimed a bucket
        probe = 0
        while pids.size:
            candidates = homes + probe
            candidates[candidates >= self.buckets] -= self.buckets
            free = np.flatnonzero(self.keys[candidates] == EMPTY)
            wanted = candidates[free]
            # Scatter: of several keys wanting one bucket the last write wins, no sort needed.
            claim[wanted] = free
            won_among_free = claim[wanted] == free
            won = free[won_among_free]
            buckets = candidates[won]
            self.keys[buckets] = ~pids[won]
            self.values[buckets] = slots[won]
            self.bucket_of[slots[won]] = buckets
            lost = free[~won_among_free]
            if lost.size and np.any(self.keys[candidates[lost]] == ~pids[lost]):
                # Not clear(): count is still 0 here, and the keys placed so far must go too.
                self.keys[: self.buckets].fill(EMPTY)
                raise DuplicateProducerError("a producer id appears twice")
            remaining = np.ones(pids.size, dtype=bool)
            remaining[won] = False
            pids, homes, slots = pids[remaining], homes[remaining], slots[remaining]
            probe += 1
        self.count = count

    def _load_compiled(self, place: Callable[..., int], pids: np.ndarray, slots: np.ndarray) -> None:
        """load()'s placing in C: each key at the first empty bucket from its home."""
        try:
            repeated = place(self.keys, self.values, self.bucket_of, pids, slots, self.buckets)
            if repeated >= 0:
                raise DuplicateProducerError(f"producer id {int(pids[repeated])} appears twice")
        except BaseException:
            self.keys[: self.buckets].fill(EMPTY)  # (as the rounds: every key placed so far goes)
            raise
        self.count = len(pids)
