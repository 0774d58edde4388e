"""OpenTransactions: the log's open transactions, its last stable offset, its aborted ones.

Producer state holds each producer's open transaction (its first offset); this
keeps the same facts by producer for the two questions reads ask: where does the
stable prefix end (the oldest open transaction's first offset), and which aborted
transactions does a fetch overlap (the segments' .txnindex files).
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable, Sequence

from oncelog import threads
from oncelog.producer_state import CompletedTxn, WorkingState
from oncelog.segments.segment import LogSegment
from oncelog.segments.txn_index import AbortedTxn


class OpenTransactions:
    def __init__(self, first_offsets: dict[int, int]):
        self._first_offsets = first_offsets  # producer id -> first offset of its open transaction
        # (marker offset, first offset) of transactions ended since the log opened, in marker
        # order, until the recovery point passes their marker: a crash may still reopen them.
        # Its own lock: a flush forgets them outside the log's lock (forget_ended_before).
        self._recently_ended: collections.deque[tuple[int, int]] = collections.deque()
        self._ended_lock = threads.lock()

    def forget_ended_before(self, recovery_point: int) -> None:
        """The recovery point moved: transactions whose marker it covers are durably ended."""
        with self._ended_lock:
            ended = self._recently_ended
            while ended and ended[0][0] < recovery_point:
                ended.popleft()

    def durable_stable_offset(self, recovery_point: int, log_end_offset: int, log_start_offset: int) -> int:
        """The last stable offset a crash cannot move back: a transaction whose marker the
        recovery point does not cover yet counts as open (Kafka's first unstable offset counts
        one until its marker is replicated). What a cleaning pass may rely on."""
        self.forget_ended_before(recovery_point)
        with self._ended_lock:
            first = min((first for _, first in self._recently_ended), default=log_end_offset)
        return min(self.last_stable_offset(log_end_offset, log_start_offset), max(first, log_start_offset))

    def last_stable_offset(self, log_end_offset: int, log_start_offset: int) -> int:
        """The first offset of the oldest open transaction, never below the log start (records
        deleted under an open transaction: Kafka's first unstable offset moves up likewise,
        or read_committed readers would be sent to an offset no longer there)."""
        first = min(self._first_offsets.values(), default=log_end_offset)
        return max(first, min(log_start_offset, log_end_offset))

    @property
    def first_offsets(self) -> dict[int, int]:
        """The open transactions by producer (producer id -> first offset), shared with the
        compiled append, which adds a transaction it opens here under the log's lock."""
        return self._first_offsets

    def opened(self, producer_id: int, first_offset: int) -> None:
        self._first_offsets.setdefault(producer_id, first_offset)

    def track(self, state: WorkingState, completed: CompletedTxn | None, segment: LogSegment) -> None:
        """Follow a producer's new state; an aborted transaction goes to `segment`'s index.

        The index entry is written before the transaction leaves the map: if that
        write fails, the last stable offset stays before the aborted data.
        """
        producer_id = state.producer_id
        if completed is not None and completed.aborted:
            others = [first for pid, first in self._first_offsets.items() if pid != producer_id]
            segment.txn_index.append(aborted_txn_entry(completed, others))
        if completed is not None:
            with self._ended_lock:
                self._recently_ended.append((completed.last_offset, completed.first_offset))
        if state.txn_first_offset >= 0:
            self._first_offsets.setdefault(producer_id, state.txn_first_offset)
        else:
            self._first_offsets.pop(producer_id, None)


def aborted_txn_entry(completed: CompletedTxn, other_open_first_offsets: Iterable[int]) -> AbortedTxn:
    """The transaction index entry of an aborted transaction, as its ABORT marker is appended.

    Kafka's rule: its last stable offset is the one as of the marker, with its own
    transaction closed: the oldest other open transaction's first offset, else the
    offset after the marker. The append path and recovery's index rebuild both use it.
    """
    stable = min(other_open_first_offsets, default=completed.last_offset + 1)
    return AbortedTxn(completed.producer_id, completed.first_offset, completed.last_offset, stable)


def aborted_between(
    segments: Sequence[LogSegment], base_offsets: Sequence[int], start_offset: int, upper_offset: int
) -> list[tuple[int, int]]:
    """(producer id, first offset) of the aborted transactions overlapping [start_offset, upper_offset).

    A transaction's marker may sit in a later segment than its data, so the search
    goes on past the start segment until an entry's stable offset shows nothing
    later can overlap (Kafka's collectAbortedTxns).
    """
    if upper_offset <= start_offset:
        return []
    first = max(bisect.bisect_right(base_offsets, start_offset) - 1, 0)
    aborted: list[tuple[int, int]] = []
    for segment in segments[first:]:
        found = segment.txn_index.collect_aborted(start_offset, upper_offset)
        aborted += [(txn.producer_id, txn.first_offset) for txn in found.aborted]
        if found.complete:
            break
    return aborted
