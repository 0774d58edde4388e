"""Cursors: the scalars of a segment and its indexes, kept in small int64 arrays.

The compiled append (oncelog._append) reads and writes the same numbers as the
Python path, in place, so the two may take turns on one segment. This module
holds the layouts (the C side's LAYOUT is checked against them by a test) and the
descriptor that shows an array slot as a plain attribute.

A mapped file's address is stored while its writable mapping exists and zeroed
before the mapping is closed: the compiled path writes through no other pointer.
"""

from __future__ import annotations

import ctypes
from typing import Any, Generic, TypeVar

import numpy as np

# A segment's cursor.
SEG_WRITE_ADDR = 0  # where the writable mapping of the .log starts; 0 while there is none
SEG_MAPPED_BYTES = 1
SEG_SIZE = 2
SEG_NEXT_OFFSET = 3
SEG_FIRST_BATCH_TS = 4  # meaningful once SEG_HAS_FIRST_TS is 1
SEG_MAX_TS = 5
SEG_OFFSET_OF_MAX_TS = 6
SEG_BYTES_SINCE_INDEX = 7
SEG_INDEX_INTERVAL = 8
SEG_LAST_OFFSET_LIMIT = 9
SEG_UNFLUSHED = 10
SEG_BASE_OFFSET = 11
SEG_HAS_FIRST_TS = 12  # 0 until a batch is written (every int64 is a timestamp a client may send)
SEG_WRITE_FD = 13  # the .log's descriptor for pwrite() of large batches, -1 if writes go through the seam
SEG_POPULATED = 14  # the compiled path has faulted the mapping in up to here (0 after a remap)
SEG_FIELDS = 15

# An index's cursor.
IDX_ADDR = 0  # where its writable mapping starts; 0 while it is unmapped or read-only
IDX_ENTRIES = 1
IDX_CAPACITY = 2  # entries the mapping holds (all reserved when writable)
IDX_MAX_ENTRIES = 3
IDX_LAST_FIRST = 4  # the last entry's fields (valid while IDX_ENTRIES > 0)
IDX_LAST_SECOND = 5
IDX_FIELDS = 6

T = TypeVar("T")


def new_cursor(fields: int) -> np.ndarray:
    return np.zeros(fields, dtype=np.int64)


def cursor_view(cursor: np.ndarray) -> memoryview:
    """The cursor's slots as plain ints (indexing a memoryview is cheaper than numpy's)."""
    view: memoryview = cursor.data
    return view


class CursorField(Generic[T]):
    """An attribute stored in slot `index` of the owner's `_cursor_view` (a memoryview of int64)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __get__(self, owner: Any, owner_type: type | None = None) -> T:
        value: T = owner._cursor_view[self.index]
        return value

    def __set__(self, owner: Any, value: T) -> None:
        owner._cursor_view[self.index] = value


def mapped_address(buffer: memoryview) -> int:
    """Where a writable buffer's memory starts (valid while the buffer's memory is)."""
    if len(buffer) == 0:
        return 0
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))
