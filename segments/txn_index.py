"""The aborted-transaction index: one `%020d.txnindex` per segment, in Kafka's layout.

A read in read_committed isolation must skip the data of aborted transactions. The
segment alone cannot tell which those are without a scan back to each ABORT
marker, so every ABORT marker adds one entry here: 34 bytes, big-endian, version
i16 (= 0), producerId i64, firstOffset i64, lastOffset i64 (the marker's offset),
lastStableOffset i64 (the log's LSO when the marker was written). Entries are in
strictly increasing lastOffset order, as in Kafka, which refuses anything else.

The file is created by the first append, as Kafka does, so a segment that saw no
aborted transaction has no `.txnindex`. Entries are few (one per aborted
transaction), so they are read whole on first use and kept in memory; opening
reads nothing, and an index that is never queried is never read.

Crash cases:
- A crash mid-append leaves a trailing partial entry. It is end of file, not
  corruption: it is ignored, and the next append writes over it.
- Appended but unflushed entries may be lost or torn by a power loss. Only the
  active segment can have such entries, and recovery rebuilds that segment's index
  from the replayed tail (`reset`, then re-append), so a torn tail never survives
  recovery. Reading is lazy so that a damaged file can be reset without being read.
- A created file's directory entry may vanish with a power loss, so the first flush
  after creating the file also fsyncs the directory: a sealed segment's index must
  not disappear below the recovery point, or aborted data would read as committed.
- A complete entry with a version other than 0, or that breaks the ordering rules,
  is reported as `CorruptRecordError` naming the file and position.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from oncelog.segments.errors import CorruptRecordError
from oncelog.segments.files import FileHandle, SegmentFileSystem

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, lastStableOffset
ENTRY_SIZE = ENTRY.size  # 34
VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # offset of the ABORT marker
    last_stable_offset: int  # the log's last stable offset when the marker was written


class TxnIndexSearch(NamedTuple):
    aborted: list[AbortedTxn]
    # An entry with last_stable_offset >= the upper bound was seen: every transaction that
    # overlaps the range had been decided by then, so later segments need not be searched.
    complete: bool


def encode_entries(entries: list[AbortedTxn]) -> bytes:
    """The file holding exactly `entries` (a cleaner writes a segment's index anew)."""
    return b"".join(ENTRY.pack(VERSION, *txn) for txn in entries)


class TransactionIndex:
    def __init__(self, fs: SegmentFileSystem, path: str, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._fs = fs
        # Asked of the filesystem on first need: opening a log of many segments costs no stat each.
        self._known_to_exist: bool | None = None
        self._handle: FileHandle | None = None
        self._entries: list[AbortedTxn] | None = None  # None until first read
        self._file_size = 0  # valid once _entries is loaded; may include a partial tail
        self._dir_unsynced = False  # the file was created since the last flush

    @property
    def _exists(self) -> bool:
        if self._known_to_exist is None:
            self._known_to_exist = self._fs.exists(self.path)
        return self._known_to_exist

    def _open(self) -> FileHandle:
        if self._handle is None:
            created = not self._exists
            self._handle = self._fs.open(self.path, create=created)
            self._known_to_exist = True
            self._dir_unsynced |= created
        return self._handle

    def _load(self) -> list[AbortedTxn]:
        if self._entries is not None:
            return self._entries
        entries: list[AbortedTxn] = []
        data = b""
        if self._exists:
            if self._handle is not None:
                data = self._handle.pread(self._handle.size(), 0)
            else:
                # A read keeps no descriptor: the entries stay in memory from here on.
                handle = self._fs.open(self.path)
                try:
                    data = handle.pread(handle.size(), 0)
                finally:
                    handle.close()
        # A trailing partial entry (len(data) % 34) is a crash mid-append: EOF, not corruption.
        for position in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
            version, *fields = ENTRY.unpack_from(data, position)
            txn = AbortedTxn(*fields)
            if version != VERSION:
                problem: str | None = f"version {version}, expected {VERSION}"
            else:
                problem = self._problem(txn, entries[-1].last_offset if entries else None)
            if problem is not None:
                reason = f"transaction index entry {txn}: {problem}"
                raise CorruptRecordError(reason, path=self.path, position=position)
            entries.append(txn)
        self._entries = entries
        self._file_size = len(data)
        return entries

    def _problem(self, txn: AbortedTxn, previous_last_offset: int | None) -> str | None:
        if txn.last_offset < self.base_offset:
            return f"last offset {txn.last_offset} is below the segment's base offset {self.base_offset}"
        if txn.first_offset > txn.last_offset:
            return f"first offset {txn.first_offset} is after last offset {txn.last_offset}"
        if previous_last_offset is not None and txn.last_offset <= previous_last_offset:
            return f"last offset {txn.last_offset} is not after the previous entry's {previous_last_offset}"
        return None

    def append(self, txn: AbortedTxn) -> None:
        """Add the entry for one ABORT marker at the end of the file (page cache only, no fsync)."""
        entries = self._load()
        problem = self._problem(txn, entries[-1].last_offset if entries else None)
        if problem is not None:
            raise ValueError(f"{self.path}: cannot append aborted transaction {txn}: {problem}")
        position = len(entries) * ENTRY_SIZE  # over a torn partial entry, if there is one
        self._open().pwritev([ENTRY.pack(VERSION, *txn)], position)
        entries.append(txn)
        self._file_size = max(self._file_size, position + ENTRY_SIZE)

    def entries(self) -> list[AbortedTxn]:
        return list(self._load())

    def collect_aborted(self, fetch_offset: int, upper_offset: int) -> TxnIndexSearch:
        """Aborted transactions overlapping [fetch_offset, upper_offset), as Kafka's collectAbortedTxns."""
        aborted: list[AbortedTxn] = []
        for txn in self._load():
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_offset:
                aborted.append(txn)
            if txn.last_stable_offset >= upper_offset:
                return TxnIndexSearch(aborted, True)
        return TxnIndexSearch(aborted, False)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose last offset is at or after `offset` (the log was cut there)."""
        entries = self._load()
        keep = len(entries)
        while keep and entries[keep - 1].last_offset >= offset:
            keep -= 1
        self._truncate_entries(keep)

    def reset(self) -> None:
        """Drop every entry, without reading the file: recovery rebuilds it from the log."""
        if self._exists:
            self._open().truncate(0)
        self._entries = []
        self._file_size = 0

    def _truncate_entries(self, keep: int) -> None:
        assert self._entries is not None
        if self._file_size > keep * ENTRY_SIZE:  # also drops a torn partial entry
            self._open().truncate(keep * ENTRY_SIZE)
            self._file_size = keep * ENTRY_SIZE
        del self._entries[keep:]

    def flush(self) -> None:
        """Make the entries durable."""
        if not self._exists:
            return
        # fsync: a power loss must not drop or tear entries of a sealed segment, which
        # recovery does not rebuild (only the tail after the recovery point is replayed).
        self._open().fsync()
        if self._dir_unsynced:
            self._fs.fsync_dir(os.path.dirname(self.path) or ".")
            self._dir_unsynced = False

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def delete(self) -> None:
        """Close and unlink the file (the caller fsyncs the directory)."""
        self.close()
        if self._exists:
            self._fs.unlink(self.path)
        self._known_to_exist = False
        self._dir_unsynced = False
        self._entries = []
        self._file_size = 0

    @property
    def is_empty(self) -> bool:
        return not self._load()
