"""Helpers the tests share for looking at a log's contents (one copy, not one per module)."""

from __future__ import annotations

from oncelog.log import Log
from oncelog.results import Isolation
from oncelog.segments.records import Record


def read_all(log: Log) -> list[tuple[int, bytes]]:
    """(base offset, stored bytes) of every batch from the log start to the end."""
    out: list[tuple[int, bytes]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset)
        assert fetched.next_offset > offset, f"read({offset}) made no progress below the end of {log}"
        out += [(batch.base_offset, bytes(batch.buffer)) for batch in fetched.batches]
        offset = fetched.next_offset
    return out


def stored_batches(log: Log) -> list[bytes]:
    """The stored bytes of every batch from the log start to the end."""
    return [data for _, data in read_all(log)]


def read_records(log: Log, isolation: Isolation = "read_uncommitted") -> list[Record]:
    """Every record a reader in `isolation` gets from the log start, in offset order."""
    out: list[Record] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset, isolation=isolation)
        if not fetched.batches:
            break  # read_committed: the last stable offset
        out += list(fetched.records())
        offset = fetched.next_offset
    return out
