"""lazy_zeros: big zeroed arrays that commit memory only where written (engine/lazy_memory.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from oncelog.lazy_memory import lazy_zeros, lazy_zeros_group
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


def test_a_forked_child_writes_its_own_copy_never_its_parents_table() -> None:
    # Python's anonymous mmap is shared by default: a child's writes would land in the parent.
    ids, slots = lazy_zeros_group((1000, np.int64), (1000, np.int32))
    ids[3] = 7
    pid = os.fork()
    if pid == 0:  # the child: writes both arrays, then leaves at once
        ids[3], slots[4] = 99, 99
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (ids[3], slots[4]) == (7, 0)
