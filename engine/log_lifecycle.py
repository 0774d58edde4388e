"""A Log's lifecycle past appends: truncation, retention, delete_records and reloads.

Each is ordered for crashes: what the metadata store records moves first (a recovery
point back, a log start forward), durably, then files go; a crash at any step finds
either the old state or a prefix of the new, never data it must trust past a cut.
"""

from __future__ import annotations

import bisect

from oncelog import compiled_append
from oncelog.errors import (
    OffsetOutOfRangeError,
)
from oncelog.log_state import LogState
from oncelog.recovery.loader import LogLoader
from oncelog.segments import format as fmt
from oncelog.storage import snapshot as snapshots
from oncelog.storage.checkpoint import (
    CLEANER_CHECKPOINT_KEY,
    LOG_START_KEY,
    RecoveryPoint,
    read_offset,
    write_offsets,
    write_recovery_point,
)


class LogLifecycle(LogState):
    def truncate_to(self, offset: int) -> int:
        """Cut the log back to `offset`, as a follower whose log diverged from its leader's.

        Returns the new log end: `offset`, or the start of the batch holding it when
        it falls inside one, or the end of the batches before it when it falls in a gap
        a leader's compaction left (Kafka's log end would be `offset`; here it is where
        the kept batches end, which is what a reopen finds). Segments past it go, with
        their indexes and snapshots; producer state and open transactions are rebuilt as
        recovery rebuilds them
        (the newest snapshot at or below the cut, then the batches after it).

        Ordered for crashes: the recovery point moves back to the cut first, so a
        crash at any later step finds either the old data (validated as a tail and
        served again: the truncation did not happen) or a prefix of it, never data
        it must trust past the cut. Each step is fsynced before the next.

        A compacted log cleaned past `offset` may have removed a key's older record in
        favour of a newer one this cut takes: a follower bounds its cleaning by its high
        watermark (Log.clean's `up_to`), below which it is never truncated, as Kafka's does.
        """
        fmt.check_int("offset", offset, "i64", minimum=0)
        with self._lock:
            self._check_writable()
            if not self.log_start_offset <= offset <= self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"cannot truncate {self.directory} to {offset}: outside "
                    f"[{self.log_start_offset}, {self.log_end_offset}]"
                )
            if offset == self.log_end_offset:
                return offset
            n = max(bisect.bisect_right(self._base_offsets, offset) - 1, 0)
            cut = self._segments[n]
            with self._fsync_lock, self._failing_closed(f"truncating {self.directory} to {offset}"):
                self._raise_if_failed()  # a flush may have failed while this waited for the lock
                self._truncations += 1  # a cleaning pass planned before this stops (log_cleaner)
                # The end of the batches kept: `offset`, or below it when the cut takes a batch
                # holding it or lands in a gap a leader's compaction left.
                position, new_end = cut.batch_start_at_or_after(offset)
                with self._recovery_point_lock:
                    # A flush that captured the log before this cut must not commit it.
                    self._generation += 1
                    # Durable before anything is cut (see above); only ever back, never past
                    # data not yet fsynced: below the point, what it covers is untouched.
                    if new_end <= self.recovery_point:
                        write_recovery_point(self._store, RecoveryPoint(new_end, cut.base_offset, position))
                        self.recovery_point = new_end
                for later in reversed(self._segments[n + 1 :]):
                    later.delete()  # fsyncs the directory
                del self._segments[n + 1 :], self._base_offsets[n + 1 :]
                cut.cut_at(position, new_end)
                checkpoint = read_offset(self._store, CLEANER_CHECKPOINT_KEY)
                if checkpoint is not None and checkpoint > new_end:
                    # What is appended past the cut is dirty: the cleaner must not skip it.
                    write_offsets(self._store, {CLEANER_CHECKPOINT_KEY: new_end})
                if new_end < self._log_start_offset:
                    # The cut took the batch holding the start: the log starts afresh at the
                    # cut (Kafka truncates fully there), and durably, or a reload would put
                    # the start back above batches appended from here.
                    write_offsets(self._store, {LOG_START_KEY: new_end})
                for snapshot_offset in snapshots.list_snapshot_offsets(self._fs, self.directory):
                    if snapshot_offset > new_end:
                        snapshots.delete_snapshot(self._fs, self.directory, snapshot_offset)
                # fsync(dir): a snapshot past the cut must not come back and be loaded.
                self._fs.fsync_dir(self.directory)
                self._reload()
                # Last, with the cut done: a durable waiter that saw the old end hears of it.
                self._group_commit.truncated(new_end)
            return self.log_end_offset

    def delete_records(self, before_offset: int) -> int:
        """Move the log start offset to `before_offset` (Kafka's DeleteRecords); returns the start.

        Reads below it are refused from then on; sealed segments wholly below it are
        deleted. Producer state is kept (Kafka's LoadProducersAfterDeleteRecordsMidSegment).
        """
        fmt.check_int("before_offset", before_offset, "i64", minimum=0)
        with self._lock:
            self._check_writable()
            if before_offset > self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"cannot delete records of {self.directory} before {before_offset}: "
                    f"past the log end {self.log_end_offset}"
                )
            if before_offset > self._log_start_offset:
                self._advance_log_start(before_offset)
            return self._log_start_offset

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Delete the oldest sealed segments past `retention_ms` or `retention_bytes`; returns how many.

        Whole segments only, oldest first, never the active one. A segment is past
        retention_ms when its newest timestamp is (when no batch is stamped, when its file
        was last written); past retention_bytes while the log stays at least that large
        without it (Kafka's rules). A log whose cleanup_policy is "compact" alone deletes none.
        """
        if now_ms is not None:
            fmt.check_int("now_ms", now_ms, "i64")
        with self._lock:
            self._check_writable()
            now_ms = self._clock() if now_ms is None else now_ms
            retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
            if not self.config.deletes_old_segments:
                retention_ms = retention_bytes = None
            excess_bytes = self.size_bytes - retention_bytes if retention_bytes is not None else 0
            expired = 0
            for segment in self._segments[:-1]:
                too_old = retention_ms is not None and _aged_past(
                    segment.age_reference_ms(), now_ms - retention_ms
                )
                too_big = retention_bytes is not None and excess_bytes >= segment.size
                if not (too_old or too_big):
                    break
                excess_bytes -= segment.size
                expired += 1
            self._unmap_cold_indexes()  # the old segments' time indexes, read for their newest timestamps
            if expired:
                self._advance_log_start(max(self._segments[expired].base_offset, self._log_start_offset))
            return expired

    def _advance_log_start(self, start: int) -> None:
        """Persist the new start, then delete the sealed segments (and snapshots) wholly below it."""
        with self._fsync_lock, self._failing_closed(f"deleting segments of {self.directory} below {start}"):
            self._raise_if_failed()
            if len(self._segments) > 1 and self._segments[1].base_offset <= start:
                self._generation += 1  # segment files are about to close: no flush may fsync them
            # Durable first: a crash before the files go leaves segments below the start,
            # which reads refuse and the next retention deletes; never the reverse.
            write_offsets(self._store, {LOG_START_KEY: start})
            self._log_start_offset = start
            while len(self._segments) > 1 and self._segments[1].base_offset <= start:
                gone = self._segments.pop(0)
                self._base_offsets.pop(0)
                gone.delete()  # fsyncs the directory
                if gone.base_offset in snapshots.list_snapshot_offsets(self._fs, self.directory):
                    snapshots.delete_snapshot(self._fs, self.directory, gone.base_offset)
            # fsync(dir): a deleted segment's snapshot must not come back after a crash.
            self._fs.fsync_dir(self.directory)

    def _reload(self) -> None:
        """Rebuild segments and producer state from the directory, as an unclean open does.

        The caller holds the fsync lock. If the load fails, the log has no segments and
        every later call raises LogFailedError (the caller records the failure).
        """
        self._generation += 1
        self._unbind_compiled()
        for segment in self._segments:
            segment.close(durable=False)
        # The closed segments stay in place until the new ones are loaded: a reader of
        # log_end_offset (it takes no lock) sees the old end, never an empty log.
        try:
            loaded = LogLoader(
                self._fs,
                self.directory,
                self.config,
                self._store,
                clean=False,
                now_ms=self._clock(),
                scan_tail=compiled_append.tail_scanner(self._compiled),
            ).load()
        except BaseException:
            self._segments, self._base_offsets = [], []  # closed: nothing may be read from them
            raise
        self._segments = loaded.segments
        self._base_offsets = [segment.base_offset for segment in self._segments]
        self._mapped_sealed.clear()  # the old segments are closed
        self._watch_index_maps(self._segments)
        self._take_producers(loaded)
        self._client_only = loaded.client_only
        self._log_start_offset = loaded.log_start_offset
        self.recovery_point = loaded.recovery_point
        self._group_commit.mark_durable(loaded.recovery_point)
        self._bind_compiled()


def _aged_past(age_ms: int, cutoff_ms: int) -> bool:
    """Whether a segment aged by `age_ms` is past retention; -1 is unknown (no batch
    stamped, no file time): kept."""
    return age_ms != fmt.NO_TIMESTAMP and age_ms <= cutoff_ms
