"""The offset and time index checks of `oncelog verify`, streamed in bounded reads.

`index_entries` yields the entries of a `.index` or `.timeindex` in order, up to
the zero-filled tail (pre-allocated space), flagging what is out of order.
`OffsetIndexWalk` checks the `.index` entries against the batches as the verifier
walks them. Every problem goes to a `Flag` callback with its position in the file.

Where the entries end is found as the engine finds it (segments/index.py): the run
of all-zero entries at the end of the file is pre-allocated space, and no
`.index` entry is all zeros (the batch at position 0 is never indexed). A
`.timeindex` entry can be: Kafka and oncelog both add the first entry for any
timestamp above -1 (NO_TIMESTAMP), so a first batch with timestamp 0 at the base
offset is indexed as (0, 0). An all-zero first time entry followed by more entries
is therefore an entry; all zeros elsewhere followed by an entry is damage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from oncelog.segments.index import OffsetIndex, TimeIndex
from oncelog.storage.fs import FileHandle

_CHUNK_ENTRIES = 64 * 1024  # index files are read this many entries at a time


class IndexEntry(NamedTuple):
    at: int  # position of the entry in the index file
    key: int  # .index: absolute offset; .timeindex: timestamp
    value: int  # .index: position in the .log; .timeindex: absolute offset


Flag = Callable[[int, str], None]  # (position in the file, reason)


def index_entries(handle: FileHandle, base: int, *, time: bool, flag: Flag) -> Iterator[IndexEntry]:
    """The entries before the zero-filled (pre-allocated) tail, each in order after the last.

    An entry out of order is flagged and skipped: `.index` entries grow strictly in
    both fields, `.timeindex` entries never decrease (Kafka's rules).
    """
    layout = TimeIndex.ENTRY if time else OffsetIndex.ENTRY
    size = handle.size()
    whole = size - size % layout.size
    previous: IndexEntry | None = None
    zeros_at: int | None = None
    position = 0
    while position < whole:
        chunk = handle.pread(min(_CHUNK_ENTRIES * layout.size, whole - position), position)
        usable = chunk[: len(chunk) - len(chunk) % layout.size]
        # An active index is megabytes of zeros: skip them at memcmp speed, not entry by entry.
        written = -(-len(usable.rstrip(b"\0")) // layout.size) * layout.size
        for n, (first, second) in enumerate(layout.iter_unpack(usable[:written])):
            at = position + n * layout.size
            if first == 0 and second == 0:  # pre-allocated space, unless an entry follows
                zeros_at = at if zeros_at is None else zeros_at
                continue
            if time and zeros_at == 0 and at == layout.size:
                # Timestamp 0 at the base offset: the first entry, not pre-allocated space.
                previous, zeros_at = IndexEntry(0, 0, base), None
                yield previous
            if zeros_at is not None:
                flag(zeros_at, f"zero-filled entries are followed by an entry at position {at}")
                return
            entry = IndexEntry(at, first, base + second) if time else IndexEntry(at, base + first, second)
            problem = _entry_problem(entry, previous, base, time)
            if problem is not None:
                flag(at, problem)
                continue
            previous = entry
            yield entry
        if written < len(usable) and zeros_at is None:
            zeros_at = position + written
        if not usable:
            break
        position += len(usable)
    if size > whole and any(handle.pread(size - whole, whole)):
        flag(whole, f"a partial entry of {size - whole} bytes at the end")


def _entry_problem(entry: IndexEntry, previous: IndexEntry | None, base: int, time: bool) -> str | None:
    offset, position = (entry.value, 0) if time else (entry.key, entry.value)
    what = (
        f"(timestamp {entry.key}, offset {entry.value})"
        if time
        else f"(offset {entry.key}, position {position})"
    )
    if offset < base or position < 0:
        return f"entry {what} is below the segment's base offset {base}" + ("" if time else " or position 0")
    if previous is None:
        return None
    if time:
        disorder = entry.key < previous.key or entry.value < previous.value
    else:
        disorder = entry.key <= previous.key or entry.value <= previous.value
    return f"entry {what} is out of order after ({previous.key}, {previous.value})" if disorder else None


class OffsetIndexWalk:
    """Walks the `.index` alongside the batches: each entry must be at a batch start.

    The entry's offset is that batch's last offset: oncelog indexes each batch so, as
    Kafka's recovery does. A Kafka broker up to 3.6 indexes a follower's append of many
    batches by its last offset at its first batch's position; lookups still find every
    offset (they scan forward from the entry), so in a Kafka directory (`exact=False`) an
    entry's offset may be past its batch, never before it.
    """

    def __init__(self, entries: Iterator[IndexEntry], flag: Flag, *, exact: bool):
        self._entries, self._flag, self._exact = entries, flag, exact
        self._next = next(entries, None)

    def on_batch(self, position: int, base_offset: int, last_offset: int) -> None:
        entry = self._next
        while entry is not None and entry.value <= position:
            if entry.value < position:
                self._flag(
                    entry.at, f"offset {entry.key} -> log position {entry.value}: no batch starts there"
                )
            elif entry.key != last_offset and (self._exact or entry.key < base_offset):
                self._flag(
                    entry.at,
                    f"offset {entry.key} -> log position {position}, where the batch holds offsets "
                    f"{base_offset}..{last_offset}",
                )
            entry = self._next = next(self._entries, None)

    def finish(self, data_end: int) -> None:
        """Flag the entries past the last batch (call only when the whole .log was read)."""
        for entry in [self._next, *self._entries] if self._next is not None else ():
            self._flag(
                entry.at,
                f"offset {entry.key} -> log position {entry.value}, past the batches (end {data_end})",
            )
