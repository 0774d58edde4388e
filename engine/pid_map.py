"""PidSlotMap: producer id -> table slot, in flat numpy arrays.

A Python dict costs about 100 bytes and two int objects per producer, and building
one from a snapshot creates a million objects. This open-addressing table (linear
probing, backward-shift deletion, so no tombstones) costs 12 bytes per bucket at a
load factor of at most 0.75, about 16 bytes per producer, and loads in bulk with
numpy. Single lookups index the arrays through memoryviews, which return plain ints.
"""

from __future__ import annotations

import numpy as np

EMPTY = -1  # producer ids are >= 0, so -1 marks a free bucket
_MAX_LOAD = 0.75
# Fibonacci hashing spreads sequential producer ids (the common case) across buckets.
_MULTIPLIER = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


class PidSlotMap:
    def __init__(self, capacity: int):
        self.buckets = max(8, int(capacity / _MAX_LOAD) + 1)
        self.keys = np.full(self.buckets, EMPTY, dtype=np.int64)
        self.values = np.zeros(self.buckets, dtype=np.int32)
        self._keys = self.keys.data
        self._values = self.values.data
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def _home(self, producer_id: int) -> int:
        mixed = (producer_id * _MULTIPLIER) & _MASK64
        return (mixed ^ (mixed >> 29)) % self.buckets

    def _find(self, producer_id: int) -> int:
        """The bucket holding `producer_id`, or the empty bucket where it would go."""
        keys = self._keys
        i = self._home(producer_id)
        while True:
            key = keys[i]
            if key in (producer_id, EMPTY):
                return i
            i += 1
            if i == self.buckets:
                i = 0

    def get(self, producer_id: int) -> int | None:
        i = self._find(producer_id)
        return None if self._keys[i] == EMPTY else int(self._values[i])

    def put(self, producer_id: int, slot: int) -> None:
        assert producer_id >= 0, producer_id
        i = self._find(producer_id)
        if self._keys[i] == EMPTY:
            # The table is sized for the producer capacity, so this cannot overfill.
            assert self.count < self.buckets * _MAX_LOAD, (self.count, self.buckets)
            self._keys[i] = producer_id
            self.count += 1
        self._values[i] = slot

    def delete(self, producer_id: int) -> None:
        keys, values = self._keys, self._values
        i = self._find(producer_id)
        if keys[i] == EMPTY:
            return
        # Backward shift: pull later members of the probe run into the hole so no
        # lookup ever stops early at it.
        j = i
        while True:
            j = j + 1 if j + 1 < self.buckets else 0
            key = keys[j]
            if key == EMPTY:
                break
            home = self._home(key)
            # Move key j into hole i unless its home lies cyclically in (i, j].
            if (i < j and not i < home <= j) or (i > j and not (home > i or home <= j)):
                keys[i] = key
                values[i] = values[j]
                i = j
        keys[i] = EMPTY
        self.count -= 1

    def clear(self) -> None:
        self.keys.fill(EMPTY)
        self.count = 0

    def load(self, producer_ids: np.ndarray, slots: np.ndarray) -> None:
        """Replace the contents with these pairs, vectorised (snapshot load).

        Round r tries bucket home + r for every key not yet placed; a key placed in
        round r found buckets home .. home + r - 1 taken, and they stay taken, so a
        linear probe from its home reaches it.
        """
        self.clear()
        count = len(producer_ids)
        assert count <= self.buckets * _MAX_LOAD, (count, self.buckets)
        pids = producer_ids.astype(np.int64)
        mixed = pids.astype(np.uint64) * np.uint64(_MULTIPLIER)
        homes = ((mixed ^ (mixed >> np.uint64(29))) % np.uint64(self.buckets)).astype(np.int64)
        pending = np.arange(count)
        claim = np.empty(self.buckets, dtype=np.int64)  # scratch: which key claimed a bucket
        probe = 0
        while pending.size:
            candidates = (homes[pending] + probe) % self.buckets
            free = np.flatnonzero(self.keys[candidates] == EMPTY)
            wanted = candidates[free]
            # Scatter: of several keys wanting one bucket the last write wins, no sort needed.
            claim[wanted] = free
            won = free[claim[wanted] == free]
            buckets = candidates[won]
            self.keys[buckets] = pids[pending[won]]
            self.values[buckets] = slots[pending[won]]
            placed = np.zeros(pending.size, dtype=bool)
            placed[won] = True
            pending = pending[~placed]
            probe += 1
        self.count = count
