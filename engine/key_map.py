"""KeyMap: each key's newest offset in the dirty part of a compacted log, 24 bytes a key.

Kafka's cleaner keeps a 16-byte MD5 of each key and an 8-byte offset in a hash table
(SkimpyOffsetMap). This is the same 24 bytes a key without the table's empty slots: two
sorted numpy arrays, digests and offsets, merged once per segment. Lookups take a whole
segment's records at once (np.searchsorted), so no Python object is made per key kept.

Two keys with the same MD5 would be taken for one, and the older record of the two
dropped: the risk Kafka takes, about 2^-64 for a billion keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

DIGEST_BYTES = 16
BYTES_PER_KEY = DIGEST_BYTES + 8
NOT_FOUND = -1


def key_digests(keys: Iterable[bytes]) -> npt.NDArray[np.bytes_]:
    """The MD5 of each key, as a (len,) array of 16-byte strings."""
    joined = b"".join(hashlib.md5(key, usedforsecurity=False).digest() for key in keys)
    return np.frombuffer(joined, dtype=f"S{DIGEST_BYTES}")


class KeyMap:
    """Newest offset per key digest. The cleaner puts a segment only while `room_for` says
    its keys fit `capacity_keys`, and always the first (a pass cleans at least one segment)."""

    def __init__(self, capacity_keys: int):
        assert capacity_keys > 0, capacity_keys
        self.capacity_keys = capacity_keys
        self._digests: npt.NDArray[np.bytes_] = np.empty(0, dtype=f"S{DIGEST_BYTES}")
        self._offsets: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
        self.last_offset = NOT_FOUND  # the newest offset put

    def __len__(self) -> int:
        return len(self._digests)

    @property
    def memory_bytes(self) -> int:
        return int(self._digests.nbytes + self._offsets.nbytes)

    def room_for(self, more_keys: int) -> bool:
        return len(self) + more_keys <= self.capacity_keys

    def new_keys(self, digests: npt.NDArray[np.bytes_]) -> int:
        """How many distinct keys among `digests` the map does not hold yet."""
        unique = np.unique(digests)
        return int(np.count_nonzero(self.newest(unique) == NOT_FOUND))

    def put(self, digests: npt.NDArray[np.bytes_], offsets: npt.NDArray[np.int64]) -> None:
        """Record `offsets[i]` as the newest of `digests[i]`; offsets increase and follow every one put.

        Keys the map holds have their offset replaced in place; new ones are inserted where
        they sort (one copy of the map at a time: the peak is about twice its size).
        """
        if not len(digests):
            return
        assert len(digests) == len(offsets)
        assert offsets[0] > self.last_offset and bool(np.all(np.diff(offsets) > 0)), "offsets increase"
        self.last_offset = int(offsets[-1])
        order = np.argsort(digests, kind="stable")  # equal digests stay in offset order
        digests, offsets = digests[order], offsets[order]
        last_of_run = np.ones(len(digests), dtype=bool)  # the last of equal digests: the newest
        last_of_run[:-1] = digests[1:] != digests[:-1]
        digests, offsets = digests[last_of_run], offsets[last_of_run]
        at = np.searchsorted(self._digests, digests)
        held = np.zeros(len(digests), dtype=bool)
        inside = at < len(self._digests)
        held[inside] = self._digests[at[inside]] == digests[inside]
        self._offsets[at[held]] = offsets[held]
        fresh = ~held
        self._digests = np.insert(self._digests, at[fresh], digests[fresh])
        self._offsets = np.insert(self._offsets, at[fresh], offsets[fresh])

    def newest(self, digests: npt.NDArray[np.bytes_]) -> npt.NDArray[np.int64]:
        """For each digest, the newest offset put for it, or NOT_FOUND."""
        found = np.full(len(digests), NOT_FOUND, dtype=np.int64)
        if not len(self._digests) or not len(digests):
            return found
        at = np.searchsorted(self._digests, digests)
        inside = at < len(self._digests)
        hit = np.zeros(len(digests), dtype=bool)
        hit[inside] = self._digests[at[inside]] == digests[inside]
        found[hit] = self._offsets[at[hit]]
        return found
