"""A Log's durability: flush, group commit, rolls and the recovery point.

An append returns once its bytes are in the page cache; `flush` (or `wait_durable`,
where concurrent callers share one fsync) makes them durable. A roll fsyncs the old
segment and writes the snapshot at the new base before the recovery point moves there,
so an unclean open validates only the active segment (KAFKA-5829). The lock order and
the generation rule that keep flushes and cuts apart are in `log_state`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from oncelog.errors import (
    CorruptMetadataError,
    LogFailedError,
    OffsetOutOfRangeError,
)
from oncelog.log_state import LogState
from oncelog.results import AppendResult
from oncelog.segments import format as fmt
from oncelog.segments.format import Buffer
from oncelog.segments.segment import LogSegment
from oncelog.storage import snapshot as snapshots
from oncelog.storage.checkpoint import (
    RecoveryPoint,
    forget_retired,
    write_recovery_point,
)
from oncelog.storage.fs import MetadataStore

T = TypeVar("T")


class LogDurability(LogState):
    def roll(self) -> LogSegment:
        """Start a new active segment at the log end (no-op on an empty active segment)."""
        with self._lock:
            self._check_writable()
            if self.active_segment.size == 0:
                return self.active_segment
            return self._roll(self.log_end_offset)

    def _roll(self, base_offset: int) -> LogSegment:
        old = self.active_segment
        # Producers a clean open deferred are read before the roll changes anything: their
        # read failing inside it would fail the log (and the snapshot below needs them).
        self._load_deferred_producers()
        # Under the fsync lock: no flush may fsync the same file beside this one. One of
        # two fsyncs racing on a failing file can return success after the kernel dropped
        # the pages (fsyncgate); serialised, the failure is recorded before any other runs.
        with self._fsync_lock:
            return self._roll_fsync_locked(old, base_offset)

    def _roll_fsync_locked(self, old: LogSegment, base_offset: int) -> LogSegment:
        self._raise_if_failed()  # a flush may have failed while this waited for the lock
        segment: LogSegment | None = None
        try:
            # fsync the old segment: the recovery point below moves past it.
            old.flush()
            old.seal()
            old.unmap_sealed_indexes()  # mapped again when read (see _unmap_cold_indexes)
            # The snapshot is durable (write_snapshot fsyncs) before the recovery
            # point relies on it (KAFKA-5829).
            snapshots.write_snapshot(self._fs, self.directory, base_offset, self._producers.live_rows())
            segment = LogSegment.open(
                self._fs,
                self.directory,
                base_offset,
                index_interval_bytes=self.config.index_interval_bytes,
                max_index_bytes=self.config.segment_index_bytes,
                create=True,
                max_segment_bytes=self.config.segment_bytes,
            )
            self._set_recovery_point(base_offset, base_offset, 0)
            self._forget_retirements()  # the snapshot just written holds them
            self._group_commit.mark_durable(base_offset)
            self._segments.append(segment)
            self._base_offsets.append(base_offset)
            self._watch_index_maps([segment])
            self._bind_compiled()  # (before it, the compiled appender is bound to the sealed segment)
        except BaseException as exc:
            if segment is not None and segment is not self._segments[-1]:
                try:
                    segment.close(durable=False)  # the half-done roll's new segment: reopen finds it
                except Exception as close_error:
                    exc.add_note(f"closing {segment.path} after the failed roll also failed: {close_error}")
            if not isinstance(exc, (OSError, CorruptMetadataError)):
                # Named and recorded already (a failed commit), or not ours to name (a Ctrl-C,
                # a bug): either way the roll is half done, so the log fails closed and the
                # next open recovers it, as after a kill.
                if self._failure is None:
                    self._fail(exc)
                raise
            self._fail(exc)
            raise LogFailedError(f"rolling {old.path} failed: {exc}") from exc
        return segment

    @property
    def durable_end_offset(self) -> int:
        """Offsets below this are fsynced: they survive a power loss. The recovery point
        (`recovery_point`) catches up at the next flush due (`recovery_point_interval_ms`
        on the engine's clock), roll, clean close or `checkpoint()`."""
        return self._group_commit.durable_end_offset

    def _point_due(self) -> bool:
        """Whether a flush commits the recovery point (two more syncs, LMDB's) or leaves it
        behind the data it just fsynced. See `LogConfig.recovery_point_interval_ms`."""
        interval_ms = self.config.recovery_point_interval_ms
        return interval_ms == 0 or self._clock() - self._point_committed_ms >= interval_ms

    def checkpoint(self, *, due_only: bool = False) -> bool:
        """Commit the recovery point up to what flushes have fsynced, if it lags behind;
        True if it moved. A flush commits it at most every `recovery_point_interval_ms`:
        call this now and then so an idle log's point catches up (`due_only`: only once
        that interval has passed since the last commit, as `oncelog serve` calls it)."""
        with self._lock:
            self._check_open()
        with self._fsync_lock:
            self._raise_if_failed()
            if due_only and not self._point_due():
                return False
            end, segment_base, position, generation = self._fsynced_point
            # A cut or reload since that flush (the generation rule) may have moved its
            # bytes: only a point fsynced in this generation may be committed.
            if generation != self._generation or end <= self.recovery_point:
                return False
            self._set_recovery_point(end, segment_base, position)
            return True

    def _set_recovery_point(self, offset: int, segment_base: int, position: int) -> None:
        # One durable LMDB commit; only ever called after what it covers was fsynced.
        # Its own lock: a flush commits it outside the append lock, and the point
        # must never move back (a roll may have moved it further meanwhile).
        with self._recovery_point_lock:
            # Equal is written: a roll keeps the offset but moves the point to the new segment.
            if offset >= self.recovery_point:
                self._commit_metadata(write_recovery_point, RecoveryPoint(offset, segment_base, position))
                self.recovery_point = offset
                if self._deferred_snapshot is None:  # (else nothing ended since the open)
                    self._open_txns.forget_ended_before(offset)
                self._point_committed_ms = self._clock()

    def _commit_metadata(self, write: Callable[[MetadataStore, T], None], value: T) -> None:
        """`write(store, value)`, failing the log closed if the store cannot commit (a full disk)."""
        try:
            write(self._store, value)
        except (OSError, CorruptMetadataError) as exc:
            # The data is safe, but no later point could be committed either: as after a
            # failed fsync, nothing more is accepted until a reopen recovers.
            self._fail(exc)
            raise LogFailedError(f"commit to {self._store.path} failed: {exc}") from exc

    def _count_for_flush(self, results: Sequence[AppendResult], batches: Sequence[Buffer]) -> None:
        """The flush policy after a compiled request: its new records, counted once, as the
        Python path counts them."""
        records = sum(
            fmt.INT32.unpack_from(batch, fmt.RECORDS_COUNT_OFFSET)[0]
            for result, batch in zip(results, batches, strict=True)
            if not result.duplicate
        )
        with self._lock:
            if self._closed:
                return  # closed since the batch was written (outside this lock): the close flushed it
            self._maybe_flush(records)

    def _maybe_flush(self, appended_messages: int) -> None:
        self._unflushed_messages += appended_messages
        flush_messages, flush_ms = self.config.flush_messages, self.config.flush_ms
        due = (flush_messages is not None and self._unflushed_messages >= flush_messages) or (
            flush_ms is not None and self._clock() - self._last_flush_ms >= flush_ms
        )
        if due:
            self.flush()

    def flush(self) -> None:
        """Make every appended batch durable (survives power loss)."""
        with self._lock:
            self._check_open()
            self._flush()

    def wait_durable(self, end_offset: int) -> None:
        """Return once every offset below `end_offset` is fsynced; concurrent callers share one flush.

        OffsetOutOfRangeError if the log does not reach `end_offset`;
        TruncatedBeforeDurableError if `truncate_to` cuts below it meanwhile.
        """
        fmt.check_int("end_offset", end_offset, "i64", minimum=0)
        cuts = self._group_commit.cuts
        end = self.log_end_offset
        if end_offset > end:
            raise OffsetOutOfRangeError(f"{self.directory} ends at {end}, before offset {end_offset - 1}")
        self._group_commit.wait(end_offset, self._flush, self.directory, cuts=cuts)

    def _flush(self, *, commit_point: bool = False) -> None:
        """fsync every segment with unflushed bytes, then move the recovery point if it is
        due (`_point_due`) or `commit_point` (a close) says so.

        What to fsync is captured under the append lock; the fsyncs and the commit run
        outside it, under the fsync lock (a caller holding the append lock, like
        flush() or roll, keeps it throughout). If the log was cut or reloaded since the
        capture, nothing is committed: group-commit waiters flush again.
        """
        with self._lock:
            self._raise_if_failed()
            end = self.log_end_offset
            active = self.active_segment
            active_size = active.size  # captured with `end`: both describe what is fsynced below
            dirty = [segment for segment in self._segments if segment.unflushed]
            flushed_messages = self._unflushed_messages
            generation = self._generation
        with self._fsync_lock:
            self._raise_if_failed()
            if generation != self._generation:
                return  # cut, trimmed or reloaded since the capture: `end` may be past the data
            for segment in dirty:
                try:
                    segment.flush()
                except OSError as exc:
                    # Fail closed, before any other flush can run: a retried fsync may
                    # "succeed" after the kernel dropped the dirty pages (fsyncgate).
                    self._fail(exc)
                    raise LogFailedError(f"fsync of {segment.path} failed: {exc}") from exc
            self._fsynced_point = (end, active.base_offset, active_size, generation)
            if end > self.recovery_point and (commit_point or self._point_due()):
                try:
                    # Outside the append lock: appenders go on during the store's commit too.
                    self._set_recovery_point(end, active.base_offset, active_size)
                except (OSError, CorruptMetadataError) as exc:
                    self._fail(exc)  # fail closed, as for a failed fsync (a full disk, say)
                    raise LogFailedError(f"recovery point commit in {self.directory} failed: {exc}") from exc
            self._group_commit.mark_durable(end)
        with self._lock:
            self._unflushed_messages -= flushed_messages
            self._last_flush_ms = self._clock()

    def _forget_retirements(self) -> None:
        """After a durable snapshot of the table: retirements it holds need no record."""
        if self._retirements_recorded:
            forget_retired(self._store)
            self._retirements_recorded = False
