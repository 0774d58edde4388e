"""Large zeroed arrays whose memory is committed only as it is written.

np.zeros gets lazily-zeroed pages only when malloc serves it with a fresh mmap. glibc
raises its mmap threshold to the size of any mapped block it frees (up to 32 MiB), so
after the first log closes, the next log's 16 MiB producer table comes from the heap
and calloc zero-fills all of it: a thousand small partitions would commit gigabytes
(measured: 10-19 MiB per log instead of ~2). An anonymous mapping is always zeroed
lazily by the kernel and returned to it when the array is dropped.

Private mappings (MAP_PRIVATE): Python's default for an anonymous mmap is MAP_SHARED,
which the kernel backs with a shmem file (measured 14.5 us to map and touch 16 MiB
against 8.7 private), and whose pages a forked child would write in its parent's. A
private mapping may get transparent huge pages, 2 MiB committed where one 4 KiB page
was written (3.4 MiB per idle log with THP "always"): each asks for none.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np


def lazy_zeros(count: int, dtype: Any) -> np.ndarray:
    """A writable, zeroed 1-d array of `count` items in its own anonymous mapping."""
    dtype = np.dtype(dtype)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    # mmap refuses length 0; one spare byte keeps empty arrays on the same path.
    region = _private_region(max(1, count * dtype.itemsize))
    # The array holds the mapping through its buffer; dropping the array unmaps it.
    return np.frombuffer(region, dtype=dtype, count=count)


def lazy_zeros_group(*arrays: tuple[int, Any]) -> tuple[np.ndarray, ...]:
    """lazy_zeros of each (count, dtype), all in one anonymous mapping: one mmap instead of
    one each (a producer table's arrays, made at every Log open). Each array starts on a
    page of its own, so pages one array never touches still cost nothing."""
    dtypes = [np.dtype(dtype) for _, dtype in arrays]
    starts: list[int] = []
    end = 0
    for (count, _), dtype in zip(arrays, dtypes, strict=True):
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        starts.append(end)
        end += -(-count * dtype.itemsize // mmap.PAGESIZE) * mmap.PAGESIZE
    region = _private_region(max(1, end))
    # Each array holds the mapping through its buffer; it is unmapped when the last is dropped.
    return tuple(
        np.frombuffer(region, dtype=dtype, count=count, offset=start)
        for (count, _), dtype, start in zip(arrays, dtypes, starts, strict=True)
    )


def _private_region(size: int) -> mmap.mmap:
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    no_huge_pages = getattr(mmap, "MADV_NOHUGEPAGE", None)  # (Linux only)
    if no_huge_pages is not None:
        region.madvise(no_huge_pages)
    return region
