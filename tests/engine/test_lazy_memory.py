"""lazy_zeros: big zeroed arrays that commit memory only where written (engine/lazy_memory.py)."""

from __future__ import annotations

import numpy as np
import pytest

from oncelog.lazy_memory import lazy_zeros
from oncelog.producer_state import PRODUCER_DTYPE


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


def test_it_is_a_zeroed_writable_array_of_the_asked_shape() -> None:
    table = lazy_zeros(1000, PRODUCER_DTYPE)
    assert table.shape == (1000,) and table.dtype == PRODUCER_DTYPE
    assert not table.view(np.uint8).any()
    table[7]["producer_id"] = 42
    assert table[7]["producer_id"] == 42 and lazy_zeros(0, np.int64).shape == (0,)
    with pytest.raises(ValueError):
        lazy_zeros(-1, np.int64)


def test_tables_allocated_after_others_were_freed_still_cost_only_the_pages_written() -> None:
    # np.zeros fails this (about 290 MiB): once glibc has freed a 16 MiB mapping it
    # serves blocks that size from the heap, and calloc zero-fills (commits) a reused one.
    capacity = 100_000  # the default producer capacity: a 16.4 MiB table
    for _ in range(3):
        lazy_zeros(capacity, PRODUCER_DTYPE)[0]["producer_id"] = 1  # allocated, touched, freed
    first = [lazy_zeros(capacity, PRODUCER_DTYPE) for _ in range(20)]
    for table in first:
        table[0]["producer_id"] = 1
    del first  # as a thousand logs closing
    before = resident_mib()
    second = [lazy_zeros(capacity, PRODUCER_DTYPE) for _ in range(20)]
    for table in second:
        table[0]["producer_id"] = 1
    grown = resident_mib() - before
    assert grown < 20, f"20 tables with one row written each committed {grown:.0f} MiB"
