"""A Log's compaction pass: Kafka's log cleaner for one partition.

One pass (`Log.clean`):

1. **What may be cleaned.** Sealed segments only, each wholly below the active segment,
   the last stable offset (an open transaction's data cannot be judged yet) and the
   recovery point (a cleaned segment must not be one recovery validates), and older than
   min_compaction_lag_ms by its newest batch timestamp. The end of the last such segment is
   the pass's end.
2. **What is dirty.** From the cleaner checkpoint (the end of the last pass, stored) to the
   pass's end. Its share of the cleanable bytes is the dirty ratio; `if_due` cleans only
   past min_cleanable_dirty_ratio, or once the oldest dirty segment is older than
   max_compaction_lag_ms.
3. **The key map.** Each key's newest offset in the dirty part (oncelog.key_map), skipping
   markers and aborted transactions. A map that would pass its memory ends the pass at a
   segment boundary; the next pass goes on from there.
4. **Rewriting.** Every segment from the log start to the pass's end is walked in offset
   order (oncelog.segment_cleaning decides batch by batch). A segment that changes is
   written beside itself and swapped in (recovery.swaps holds the protocol and what an open
   does with a swap a crash interrupted); its base offset, its last offset and its
   transaction index stay.
5. **The checkpoint** moves to the pass's end, durably, last.

Nothing here changes producer state, snapshots or the recovery point: offsets never change,
every producer's windowed batches stay, and only segments below the recovery point move.
The log's lock is held for the pass (appends wait; one segment is rewritten at a time).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from oncelog.errors import CleanerError, CorruptLogError, CorruptRecordError, CorruptSnapshotError
from oncelog.key_map import BYTES_PER_KEY, KeyMap
from oncelog.log_state import LogState
from oncelog.recovery.swaps import CLEANING, SWAPPING, swap_into_place
from oncelog.segment_cleaning import AbortedRanges, CleaningPass, CleanStats, digests_and_offsets
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch
from oncelog.segments.files import FileHandle
from oncelog.segments.segment import LOG_SUFFIX, LogSegment, scan_file
from oncelog.segments.txn_index import TXN_INDEX_SUFFIX, AbortedTxn, encode_entries
from oncelog.storage import snapshot as snapshots
from oncelog.storage.checkpoint import (
    CLEANER_CHECKPOINT_KEY,
    CLEANER_HORIZON_KEY,
    CLIENT_ONLY_KEY,
    read_offset,
    write_offsets,
)
from oncelog.storage.producer_row import WINDOW

DEFAULT_KEY_MAP_BYTES = 128 * 1024 * 1024  # Kafka's log.cleaner.dedupe.buffer.size
_WRITE_GROUP = 512  # buffers a pwritev takes at once (below IOV_MAX)


@dataclasses.dataclass(frozen=True)
class CleanablePart:
    """What a pass may clean: segments [0, count) end at `end_offset`; dirty from `first_dirty`."""

    count: int
    end_offset: int
    first_dirty: int
    cleanable_bytes: int
    dirty_bytes: int

    @property
    def dirty_ratio(self) -> float:
        return self.dirty_bytes / self.cleanable_bytes if self.cleanable_bytes else 0.0


@dataclasses.dataclass
class CleanResult:
    """What one pass did (`cleaned` False: nothing was due, or nothing dirty)."""

    cleaned: bool
    dirty_ratio: float
    first_dirty_offset: int
    cleaned_to: int  # the checkpoint after the pass
    keys: int = 0
    key_map_bytes: int = 0
    stats: CleanStats = dataclasses.field(default_factory=CleanStats)


def cleanable_part(
    bases: Sequence[int],
    sizes: Sequence[int],
    newest_timestamps_ms: Iterable[int] | None,
    *,
    limit_offset: int,
    first_dirty: int,
    lag_cutoff_ms: int,
) -> CleanablePart:
    """The rule for what a pass may clean, over a log's segments (the last is the active one):
    the sealed segments, oldest first, each ending at or below `limit_offset` (the last
    stable offset and the recovery point) and, when `newest_timestamps_ms` is given (a
    min_compaction_lag_ms), with no batch newer than `lag_cutoff_ms`. Dirty: past `first_dirty`."""
    count, cleanable, dirty = 0, 0, 0
    newest = iter(newest_timestamps_ms) if newest_timestamps_ms is not None else None
    for n in range(len(bases) - 1):
        end = bases[n + 1]
        if end > limit_offset or (newest is not None and next(newest) > lag_cutoff_ms):
            break
        count += 1
        cleanable += sizes[n]
        if end > first_dirty:
            dirty += sizes[n]
    end_offset = bases[count] if count else bases[0]
    return CleanablePart(count, end_offset, min(first_dirty, end_offset), cleanable, dirty)


class LogCleaning(LogState):
    def cleanable_part(self, now_ms: int | None = None) -> CleanablePart:
        """The segments a pass could clean now, and how dirty they are (oncelog stat)."""
        with self._lock:
            self._check_open()
            return self._cleanable_part(self._clock() if now_ms is None else now_ms)

    def _cleanable_part(self, now_ms: int, up_to: int | None = None) -> CleanablePart:
        # Transactions whose markers a crash could still take count as open: the key map and
        # the aborted ranges must follow outcomes that survive one.
        stable = self._transactions.durable_stable_offset(
            self.recovery_point, self.log_end_offset, self._log_start_offset
        )
        if up_to is not None:
            stable = min(stable, up_to)
        lag_ms = self.config.min_compaction_lag_ms
        part = cleanable_part(
            self._base_offsets,
            [segment.size for segment in self._segments],
            (segment.newest_timestamp_ms() for segment in self._segments) if lag_ms else None,
            limit_offset=min(stable, self.recovery_point),
            first_dirty=max(read_offset(self._store, CLEANER_CHECKPOINT_KEY) or 0, self._log_start_offset),
            lag_cutoff_ms=now_ms - lag_ms,
        )
        self._unmap_cold_indexes()
        return part

    def _due(self, part: CleanablePart, now_ms: int) -> bool:
        """Kafka's rule: dirty enough, dirty for longer than max_compaction_lag_ms, or holding
        a tombstone or marker whose delete horizon has passed (KIP-534)."""
        horizon = read_offset(self._store, CLEANER_HORIZON_KEY)
        if horizon is not None and horizon <= now_ms and part.count:
            return True
        if part.dirty_bytes == 0:
            return False
        if part.dirty_ratio >= self.config.min_cleanable_dirty_ratio:
            return True
        first = next(n for n in range(part.count) if self._base_offsets[n + 1] > part.first_dirty)
        oldest = self._first_timestamp(self._segments[first])
        return oldest >= 0 and now_ms - oldest > self.config.max_compaction_lag_ms

    @staticmethod
    def _first_timestamp(segment: LogSegment) -> int:
        for _, batch in segment.scan():
            return int(batch.max_timestamp)
        return fmt.NO_TIMESTAMP

    def cleaning_due(self, now_ms: int | None = None) -> tuple[bool, float]:
        """Whether `clean(if_due=True)` would run a pass now, and the dirty ratio."""
        with self._lock:
            self._check_open()
            now = self._clock() if now_ms is None else now_ms
            part = self._cleanable_part(now)
            return self.config.compacted and part.count > 0 and self._due(part, now), part.dirty_ratio

    def clean(
        self,
        now_ms: int | None = None,
        *,
        if_due: bool = False,
        key_map_bytes: int = DEFAULT_KEY_MAP_BYTES,
        throttle: Callable[[int], None] | None = None,
        up_to: int | None = None,
    ) -> CleanResult:
        """One cleaning pass now (see the module docstring); a log not compacted is left alone.

        `if_due`: only when Kafka's cleaner would pick the log (the background cleaner's
        call). `now_ms` (the Log's clock by default) decides tombstone horizons and the lags.
        `throttle(bytes)` is called after each segment read or written, outside the log's
        lock (a rate cap sleeps there). The lock is taken per segment: appends and reads go
        on between them. A truncation meanwhile ends the pass early, checkpoint unmoved.

        `up_to`: no record at or past this offset is relied on (a newer record of a key removes
        an older one only below it). A broker that replicates passes its high watermark, as
        Kafka's cleaner stops there: a follower may truncate past it (truncate_to), and a
        record removed in favour of one cut later would be lost. None: the log end.
        """
        if key_map_bytes < BYTES_PER_KEY:
            raise ValueError(f"key_map_bytes must hold one key ({BYTES_PER_KEY} bytes), got {key_map_bytes}")
        with self._cleaning_pass:  # one pass at a time: two would write the same files
            return self._clean(now_ms, if_due, key_map_bytes, throttle, up_to)

    def _clean(
        self,
        now_ms: int | None,
        if_due: bool,
        key_map_bytes: int,
        throttle: Callable[[int], None] | None,
        up_to: int | None,
    ) -> CleanResult:
        with self._lock:
            self._check_writable()
            now = self._clock() if now_ms is None else now_ms
            part = self._cleanable_part(now, up_to)
            result = CleanResult(False, part.dirty_ratio, part.first_dirty, part.first_dirty)
            if not self.config.compacted or part.count == 0 or (if_due and not self._due(part, now)):
                return result
            truncations = self._truncations
            aborted = AbortedRanges(txn for segment in self._segments for txn in segment.txn_index.entries())
            entries = list(self._producers.entries())
            protected = frozenset(
                offset
                for entry in entries
                for offset in (entry.last_offset, *(b.last_offset for b in entry.batches))
            )
            tails = {entry.producer_id: (entry.producer_epoch, entry.last_offset) for entry in entries}
            recovery_base = self._base_offsets[
                max(bisect.bisect_right(self._base_offsets, self.recovery_point) - 1, 0)
            ]
            ranges = [(self._base_offsets[n], self._base_offsets[n + 1]) for n in range(part.count)]
            if self._client_only:
                # Durable before the first swap: a cleaned log has gaps, which a log of client
                # appends only may not have (recovery and reads would take them for lost data).
                self._commit_metadata(write_offsets, {CLIENT_ONLY_KEY: 0})
                self._client_only = False
        protected |= self._snapshot_windows_at_or_below(recovery_base)  # (read outside the lock)
        key_map = KeyMap(key_map_bytes // BYTES_PER_KEY)
        ranges = ranges[
            : self._build_key_map(ranges, part.first_dirty, key_map, aborted, truncations, throttle)
        ]
        cleaning = CleaningPass(key_map, aborted, protected, now, self.config.delete_retention_ms, tails)
        for base, next_base in ranges:
            done_bytes = self._clean_one(base, next_base, cleaning, truncations)
            if throttle is not None and done_bytes:
                throttle(done_bytes)
        with self._lock:
            self._segment_for_pass(None, None, truncations)
            end_offset = max(ranges[-1][1] if ranges else part.first_dirty, part.first_dirty)
            self._commit_metadata(
                write_offsets,
                {CLEANER_CHECKPOINT_KEY: end_offset, CLEANER_HORIZON_KEY: cleaning.earliest_horizon_ms},
            )
        result.cleaned, result.cleaned_to, result.stats = True, end_offset, cleaning.stats
        result.keys, result.key_map_bytes = len(key_map), key_map.memory_bytes
        return result

    def _clean_one(self, base: int, next_base: int, cleaning: CleaningPass, truncations: int) -> int:
        """Clean the segment at `base`: read and rewritten outside the log's lock, swapped in
        under it (if it is still the log's). The bytes read and written."""
        pinned = self._pin(base, next_base, truncations)
        if pinned is None:
            return 0
        segment, batches, txn_entries = pinned
        cleaned = cleaning.clean_segment(batches)
        if cleaned is None:
            return segment.size
        kept = [txn for txn in txn_entries if txn.last_offset not in cleaning.removed_markers]
        stem = os.path.join(self.directory, f"{base:020d}")
        self._write_replacements(stem, cleaned, None if kept == txn_entries else kept)
        with self._lock:
            try:
                still = self._segment_for_pass(base, next_base, truncations) is segment
            except BaseException:
                self._remove_replacements(stem)
                raise
            if not still:  # retention or delete_records took it meanwhile
                self._remove_replacements(stem)
                return 0
            self._swap_in(self._base_offsets.index(base), stem, kept != txn_entries)
            self._unmap_cold_indexes()
        return segment.size + sum(len(b) for b in cleaned)

    def _pin(
        self, base: int, next_base: int, truncations: int
    ) -> tuple[LogSegment, list[RecordBatch], list[AbortedTxn]] | None:
        """The segment at `base`, its batches and its transaction index entries. Its bytes are
        read through a descriptor of the cleaner's own, outside the log's lock: a sealed
        segment's bytes never change, and the file stays readable if retention deletes it."""
        with self._lock:
            segment = self._segment_for_pass(base, next_base, truncations)
            if segment is None:
                return None
            size, txn_entries = segment.size, segment.txn_index.entries()
            handle = self._fs.open(segment.path, writable=False)
            self._unmap_cold_indexes()
        try:
            return segment, list(self._batches_in(handle, size)), txn_entries
        finally:
            handle.close()

    def _snapshot_windows_at_or_below(self, base: int) -> frozenset[int]:
        """The last offsets of the batches windowed in the snapshot a crash's recovery would
        load: the newest readable one at or below `base`, the segment holding the recovery point.
        Recovery replays only the tail after it, so a batch it windows must stay even once
        newer (unflushed) batches pushed it out of the window in memory, or its producer
        expired since. None readable: nothing (a replay from the log start rebuilds every
        window from the cleaned log itself). Read outside the log's lock: a snapshot file is
        written whole by a rename, and one deleted meanwhile is skipped as unreadable."""
        for offset in sorted(snapshots.list_snapshot_offsets(self._fs, self.directory), reverse=True):
            if offset > base:
                continue
            try:
                rows = snapshots.read_snapshot(self._fs, self.directory, offset)
            except (CorruptSnapshotError, OSError):
                continue  # recovery sets it aside too, and loads the next older one
            live = rows[rows["live"] == 1]
            held = np.arange(WINDOW) < live["window_count"][:, None]
            return frozenset(live["last_offset"][held].tolist())
        return frozenset()

    def _segment_for_pass(
        self, base: int | None, next_base: int | None, truncations: int
    ) -> LogSegment | None:
        """Under the lock: the segment at `base` as the pass planned it; None when retention
        or delete_records removed it since. CleanerError when the log was truncated."""
        self._check_writable()
        if self._truncations != truncations:
            raise CleanerError(
                f"{self.directory} was truncated during the cleaning pass; the next pass starts over"
            )
        if base is None:
            return None
        n = bisect.bisect_left(self._base_offsets, base)
        if n == len(self._base_offsets) or self._base_offsets[n] != base:
            return None
        assert n + 1 < len(self._base_offsets) and self._base_offsets[n + 1] == next_base, (base, next_base)
        return self._segments[n]

    def _build_key_map(
        self,
        ranges: list[tuple[int, int]],
        first_dirty: int,
        key_map: KeyMap,
        aborted: AbortedRanges,
        truncations: int,
        throttle: Callable[[int], None] | None,
    ) -> int:
        """Fill the map from the dirty segments; how many of `ranges` the pass cleans."""
        for n, (base, next_base) in enumerate(ranges):
            if next_base <= first_dirty:
                continue
            pinned = self._pin(base, next_base, truncations)
            if pinned is None:
                continue
            segment, batches, _ = pinned
            digests, offsets = digests_and_offsets(batches, aborted, first_dirty)
            if len(key_map) and not key_map.room_for(key_map.new_keys(digests)):
                return n  # the map is full: this pass ends here, the next goes on
            key_map.put(digests, offsets)
            if throttle is not None:
                throttle(segment.size)
        return len(ranges)

    @staticmethod
    def _batches_in(handle: FileHandle, size: int) -> Iterator[RecordBatch]:
        """The segment's batches, each CRC-checked: the cleaner never copies a bad one."""
        for position, batch in scan_file(handle, 0, size):
            try:
                batch.validate()
            except CorruptRecordError as exc:
                raise CorruptLogError(
                    f"cleaning found a bad batch: {exc}", path=handle.path, position=position
                ) from exc
            yield batch

    def _write_replacements(
        self, stem: str, batches: list[bytes], txn_entries: list[AbortedTxn] | None
    ) -> None:
        """Step 1 of the swap (recovery.swaps), outside the log's lock: the cleaned segment and,
        when markers went, its transaction index without their entries (None: kept as is)."""
        files = [(LOG_SUFFIX, batches)]
        if txn_entries is not None:
            files.append((TXN_INDEX_SUFFIX, [encode_entries(txn_entries)]))
        try:
            for suffix, data in files:
                self._write_cleaned(stem + suffix + CLEANING, data)
        except CleanerError:
            self._remove_replacements(stem)
            raise

    def _remove_replacements(self, stem: str) -> None:
        """Delete what step 1 wrote for `stem`, and an index swap not followed by its log's
        (no log swap has begun: the old files are the truth). Only these paths: the log may
        be closed by now, and the directory another Log's."""
        for suffix in (LOG_SUFFIX + CLEANING, TXN_INDEX_SUFFIX + CLEANING, TXN_INDEX_SUFFIX + SWAPPING):
            if self._fs.exists(stem + suffix):
                self._fs.unlink(stem + suffix)

    def _swap_in(self, n: int, stem: str, new_txn_index: bool) -> None:
        """Under the lock: steps 2-4 for segment n, whose replacement step 1 wrote."""
        old = self._segments[n]
        with self._fsync_lock:
            self._raise_if_failed()
            try:
                if new_txn_index:
                    self._fs.rename(stem + TXN_INDEX_SUFFIX + CLEANING, stem + TXN_INDEX_SUFFIX + SWAPPING)
                    # fsync(dir): the index's swap must be durable before the log's, which a
                    # reopen takes as the sign to swap both (recovery.swaps).
                    self._fs.fsync_dir(self.directory)
                self._fs.rename(stem + LOG_SUFFIX + CLEANING, stem + LOG_SUFFIX + SWAPPING)
            except OSError as exc:  # no log swap: the old segment is still the truth
                self._remove_replacements(stem)
                raise CleanerError(f"swapping in {stem}{LOG_SUFFIX} failed: {exc}; left as it was") from exc
            self._finish_swap(n, old, stem)

    def _finish_swap(self, n: int, old: LogSegment, stem: str) -> None:
        """Steps 2-4 once the swap file exists: a failure fails the log (a reopen finishes them)."""
        with self._failing_closed(f"swapping the cleaned segment {stem}.log"):
            with self._recovery_point_lock:
                self._generation += 1  # a segment file is about to close: no flush may fsync it
            # fsync(dir): from here a crash finishes the swap at the next open (recovery.swaps).
            self._fs.fsync_dir(self.directory)
            old.close(durable=False)
            self._mapped_sealed.discard(old)
            swap_into_place(self._fs, self.directory, old.base_offset)
            self._segments[n] = self._indexed(old.base_offset, self._base_offsets[n + 1])

    def _write_cleaned(self, path: str, batches: list[bytes]) -> None:
        """Step 1: the cleaned batches, fsynced. A failure removes the file; the log is untouched."""
        try:
            handle = self._fs.open(path, create=True)
            try:
                handle.truncate(0)
                position = 0
                for start in range(0, len(batches), _WRITE_GROUP):
                    group = batches[start : start + _WRITE_GROUP]
                    written = handle.pwritev(group, position)
                    assert written == sum(len(b) for b in group), (path, written)
                    position += written
                # fsync: the swap rename must never name bytes a power loss could still take.
                handle.fsync()
            finally:
                handle.close()
        except OSError as exc:
            if self._fs.exists(path):
                self._fs.unlink(path)
            raise CleanerError(f"writing {path} failed: {exc}; the segment is left as it was") from exc

    def _indexed(self, base_offset: int, next_base_offset: int) -> LogSegment:
        """The swapped-in segment with its indexes built and sealed."""
        c = self.config
        segment = LogSegment.open(
            self._fs,
            self.directory,
            base_offset,
            index_interval_bytes=c.index_interval_bytes,
            max_index_bytes=c.segment_index_bytes,
            sealed=False,
            max_segment_bytes=c.segment_bytes,
        )
        error = segment.rebuild(validate=False, keep_txn_index=True)
        if error is not None or segment.next_offset != next_base_offset:
            raise CorruptLogError(
                f"the cleaned segment ends at {segment.next_offset}, not {next_base_offset} ({error})",
                path=segment.path,
                position=segment.size,
            )
        segment.seal()
        self._watch_index_maps([segment])
        self._mapped_sealed.add(segment)
        return segment
