"""KeyMap: each key's newest offset, as a dict would say, in 24 bytes a key."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.key_map import BYTES_PER_KEY, NOT_FOUND, KeyMap, key_digests


@settings(max_examples=200, deadline=None)
@given(
    segments=st.lists(st.lists(st.binary(max_size=3), max_size=40), max_size=6),
    asked=st.lists(st.binary(max_size=3), max_size=20),
)
def test_the_newest_offset_of_every_key_is_what_a_dict_of_the_same_puts_says(
    segments: list[list[bytes]], asked: list[bytes]
) -> None:
    key_map, reference, offset = KeyMap(capacity_keys=1 << 20), {}, 0
    for keys in segments:
        offsets = np.arange(offset, offset + len(keys), dtype=np.int64)
        key_map.put(key_digests(keys), offsets)
        reference.update(zip(keys, offsets.tolist(), strict=True))
        offset += len(keys) + 3  # gaps, as a compacted segment has
    assert len(key_map) == len(reference)
    found = key_map.newest(key_digests(asked)).tolist()
    assert found == [reference.get(key, NOT_FOUND) for key in asked]


def test_a_key_costs_24_bytes_however_often_it_was_updated() -> None:
    key_map = KeyMap(capacity_keys=10_000)
    keys = [f"key-{n}".encode() for n in range(1_000)]
    for round_ in range(5):
        key_map.put(key_digests(keys), np.arange(round_ * 1_000, (round_ + 1) * 1_000, dtype=np.int64))
    assert len(key_map) == 1_000 and key_map.memory_bytes == 1_000 * BYTES_PER_KEY == 24_000
    assert key_map.room_for(9_000) and not key_map.room_for(9_001)
    assert key_map.newest(key_digests([b"key-7"])).tolist() == [4_007]
