"""A Log's reads: whole batches from an offset, and the offset for a timestamp.

Sealed segments map their indexes on first use; an operation unmaps those it mapped
at its end but the one the next sequential read starts in, so a log keeps a few of the
process's vm.max_map_count mappings however many segments it has. The read of the
segments themselves is `oncelog.reads.read_log`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from oncelog.log_state import LogState
from oncelog.reads import read_log
from oncelog.results import ISOLATIONS, FetchResult, Isolation
from oncelog.segments import format as fmt
from oncelog.segments.index import TimestampOffset
from oncelog.segments.segment import LogSegment
from oncelog.transactions import aborted_between


class LogReads(LogState):
    def read(
        self,
        start_offset: int,
        max_bytes: int = 1_048_576,
        *,
        max_offset: int | None = None,
        isolation: Isolation = "read_uncommitted",
    ) -> FetchResult:
        """Whole batches from the one holding `start_offset`, about `max_bytes` of them.

        read_committed stops at the last stable offset and lists the aborted
        transactions the batches overlap; FetchResult.records() then skips them.
        """
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation is one of {ISOLATIONS}, got {isolation!r}")
        fmt.check_int("start_offset", start_offset, "i64")
        fmt.check_int("max_bytes", max_bytes, "i64", minimum=0)
        if max_offset is not None:
            fmt.check_int("max_offset", max_offset, "i64")
        with self._lock:
            self._check_open()
            if isolation == "read_committed":
                stable = self._transactions.last_stable_offset(self.log_end_offset, self._log_start_offset)
                max_offset = stable if max_offset is None else min(max_offset, stable)
            try:
                fetched = read_log(
                    self._segments,
                    self._base_offsets,
                    start_offset,
                    max_bytes,
                    max_offset,
                    self.directory,
                    client_only=self._client_only,
                    log_start_offset=self._log_start_offset,
                )
                if isolation == "read_uncommitted":
                    return fetched
                aborted = aborted_between(
                    self._segments, self._base_offsets, start_offset, fetched.next_offset
                )
                return fetched._replace(isolation=isolation, aborted_transactions=aborted)
            finally:
                # The segment the next sequential read starts in stays mapped.
                where = max(bisect.bisect_right(self._base_offsets, start_offset) - 1, 0)
                self._unmap_cold_indexes(keep=self._segments[where] if self._segments else None)

    def offset_for_timestamp(self, timestamp_ms: int) -> TimestampOffset | None:
        """The first record whose timestamp is at or after `timestamp_ms`, if any."""
        fmt.check_int("timestamp_ms", timestamp_ms, "i64")
        with self._lock:
            self._check_open()
            try:
                for segment in self._segments:
                    found = segment.find_offset_for_timestamp(timestamp_ms)
                    if found is not None:
                        return found
            finally:
                self._unmap_cold_indexes()
        return None

    def max_timestamp(self) -> TimestampOffset | None:
        """The largest batch timestamp and the first offset holding it (Kafka's
        MAX_TIMESTAMP); None if no batch is stamped. A lazily opened sealed segment knows
        its largest timestamp only once its time index is read."""
        with self._lock:
            self._check_open()
            best: TimestampOffset | None = None
            try:
                for segment in self._segments:
                    newest = segment.newest_timestamp_ms() if segment.size > 0 else fmt.NO_TIMESTAMP
                    if newest != fmt.NO_TIMESTAMP and (best is None or newest > best.timestamp_ms):
                        best = TimestampOffset(newest, segment.offset_of_max_timestamp)
            finally:
                self._unmap_cold_indexes()
        return best

    def _watch_index_maps(self, segments: Sequence[LogSegment]) -> None:
        for segment in segments:
            segment.on_indexes_mapped = self._mapped_sealed.add

    def _unmap_cold_indexes(self, keep: LogSegment | None = None) -> None:
        """Unmap the sealed segments' indexes an operation mapped, but `keep`'s. Under the
        log's lock, at the end of an operation: nothing is using them."""
        for segment in [s for s in self._mapped_sealed if s is not keep]:
            segment.unmap_sealed_indexes()
            self._mapped_sealed.discard(segment)
