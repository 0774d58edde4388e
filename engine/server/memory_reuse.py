"""Freed fetch buffers kept for the next fetch instead of handed back to the kernel.

A fetch reads each partition into a new buffer of up to a megabyte (`LogSegment.read`)
and holds it until the client has taken the response. glibc serves blocks that size
from fresh mappings, or from a thread's arena that it trims as soon as they are freed,
so every fetch paid page faults and the kernel's zeroing for memory it had just given
back: 1.8 ms per 4 MiB fetched on a fetch thread, 0.2 ms with the memory kept
(`python bench/fetch_buffers.py`). `keep_freed_read_buffers` raises both thresholds
once, at the start of `oncelog serve`: blocks below MMAP_THRESHOLD_BYTES come from
the arenas, and an arena gives freed memory at its top back to the kernel only past
TRIM_THRESHOLD_BYTES. The peak is unchanged (the unsent-bytes budget bounds what fetches
hold). What stays resident after a burst is what glibc keeps anyway, fragments inside
the arenas included: a red-team run of 4 and 16 clients fetching up to 55 MB from 325 MB
measured 250-390 MB resident after the bursts with these thresholds and 360-500 MB with
glibc's defaults, the peak 470-590 MB either way.
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024  # above a fetch's largest read (READ_STEP_BYTES plus slack)
TRIM_THRESHOLD_BYTES = 32 * 1024 * 1024
# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_read_buffers() -> bool:
    """Set glibc's malloc thresholds as above; False (and nothing changed) on another libc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) or not mallopt(
        _M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES
    ):
        log.warning("glibc refused the malloc thresholds: each fetch's buffers are fresh memory")
        return False
    return True
