"""Result types returned by Log operations."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal, NamedTuple

from oncelog.segments import Record, RecordBatch
from oncelog.segments.control import decode_txn_marker


class AppendResult(NamedTuple):
    first_offset: int
    last_offset: int
    # The time stamped into the batch on a LogAppendTime log; -1 on CreateTime.
    log_append_time_ms: int = -1
    # True when the batch was a retry already in the log: nothing was written and
    # the offsets are those of the original append.
    duplicate: bool = False


Isolation = Literal["read_uncommitted", "read_committed"]
ISOLATIONS: tuple[Isolation, ...] = ("read_uncommitted", "read_committed")


class FetchResult(NamedTuple):
    # Zero-copy views of whole batches; the first one holds `start_offset` (or is
    # the first batch after it), so it may start below it.
    batches: list[RecordBatch]
    start_offset: int
    # Where the next read should start.
    next_offset: int
    log_end_offset: int
    isolation: Isolation = "read_uncommitted"
    # read_committed: (producer id, first offset) of each aborted transaction that
    # overlaps the fetched batches, as in Kafka's fetch response.
    aborted_transactions: Sequence[tuple[int, int]] = ()

    def records(self) -> Iterator[Record]:
        """The data records at or after `start_offset`, decoded.

        Control records (transaction markers) are never records of the data, so
        they are left out, as a Kafka consumer leaves them out; `batches` still
        has them. read_committed also leaves out the records of aborted
        transactions: a producer's transactional batches are skipped from its
        aborted transaction's first offset until its ABORT marker.
        """
        committed = self.isolation == "read_committed"
        pending = sorted(self.aborted_transactions, key=lambda txn: txn[1])
        next_pending = 0  # an index, not pop(0): a fetch may overlap many aborted transactions
        aborting: set[int] = set()
        for batch in self.batches:
            h = batch.header
            if committed:
                while (
                    next_pending < len(pending)
                    and pending[next_pending][1] <= h.base_offset + h.last_offset_delta
                ):
                    aborting.add(pending[next_pending][0])
                    next_pending += 1
            if batch.is_control:
                marker = decode_txn_marker(batch) if h.producer_id in aborting else None
                if marker is not None and not marker.commit:
                    aborting.discard(h.producer_id)
                continue
            if batch.is_transactional and h.producer_id in aborting:
                continue
            for record in batch.records():
                if record.offset >= self.start_offset:
                    yield record

    @property
    def size_bytes(self) -> int:
        return sum(batch.size for batch in self.batches)
