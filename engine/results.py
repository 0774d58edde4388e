"""Result types returned by Log operations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from oncelog.segments import Record, RecordBatch


class AppendResult(NamedTuple):
    first_offset: int
    last_offset: int
    # The time stamped into the batch on a LogAppendTime log; -1 on CreateTime.
    log_append_time_ms: int = -1
    # True when the batch was a retry already in the log: nothing was written and
    # the offsets are those of the original append.
    duplicate: bool = False


class FetchResult(NamedTuple):
    # Zero-copy views of whole batches; the first one holds `start_offset` (or is
    # the first batch after it), so it may start below it.
    batches: list[RecordBatch]
    start_offset: int
    # Where the next read should start.
    next_offset: int
    log_end_offset: int

    def records(self) -> Iterator[Record]:
        """The records at or after `start_offset`, decoded."""
        for batch in self.batches:
            for record in batch.records():
                if record.offset >= self.start_offset:
                    yield record

    @property
    def size_bytes(self) -> int:
        return sum(batch.size for batch in self.batches)
