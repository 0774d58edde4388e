"""LogLoader: open a partition directory and restore the log and its producer state.

It carries out the recovery decision of `oncelog.recovery.plan` (where validation
starts, torn tail or corruption, missing data); this module does the I/O.

Clean open (the shutdown marker was there): every segment's indexes are trusted
after a sanity check, and the snapshot written at close holds the producer state.

Unclean open, in the order that keeps cost proportional to the tail:
  1. Segments below the recovery point were fsynced and are trusted as above.
  2. From the segment holding the recovery point on, every batch is validated
     (size, magic, CRC, offsets increasing) and the indexes rebuilt. The first bad
     batch ends the log: a crash mid-write leaves a truncated, zero-filled or
     garbage tail, which is EOF, not corruption. A bad batch *below* the recovery
     point cannot be a torn write (it was fsynced), so it raises CorruptLogError
     unless `on_corruption="truncate"`.
  3. Producer state: the newest valid snapshot at or below the new log end, then
     the batch headers after it (records are never decoded). A snapshot that is
     short or corrupt is set aside and the next older one is tried. A producer
     whose last append time is not known (replayed from a segment, or from a
     snapshot that does not store it) counts as appended at the load's time, the
     latest it could have been, so the load never expires a producer the running
     engine would have kept.
  4. The caller-facing guarantee: what was validated is fsynced before it is
     served (KAFKA-10101), then the recovery point moves to the log end and a
     fresh snapshot is written there.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from oncelog.config import LogConfig
from oncelog.errors import (
    CorruptLogError,
    CorruptRecordError,
    CorruptSnapshotError,
    NotASegmentError,
)
from oncelog.pid_map import DuplicateProducerError
from oncelog.producer_replay import ReplayBuffer
from oncelog.producer_state import ProducerStateManager, fit_rows
from oncelog.recovery.plan import (
    RecoveryPoint,
    Verdict,
    corruption,
    first_validated,
    judge_bad_batch,
    judge_missing_data,
    replay_starts_over,
    snapshot_limit,
)
from oncelog.recovery.swaps import settled_listing
from oncelog.recovery.tail_rows import CompiledTailScan, ScanTail
from oncelog.segments.batch import RecordBatch
from oncelog.segments.control import decode_txn_marker
from oncelog.segments.format import CONTROL_MASK, TRANSACTIONAL_MASK
from oncelog.segments.segment import LOG_SUFFIX, LogSegment, parse_segment_file_name, segment_file_name
from oncelog.storage import snapshot as snapshots
from oncelog.storage.checkpoint import (
    CLIENT_ONLY_KEY,
    LOG_START_KEY,
    forget_retired,
    read_offset,
    read_recovery_point,
    read_retired,
    recorded_log_start,
    write_offsets,
    write_recovery_point,
)
from oncelog.storage.fs import FileSystem, MetadataStore
from oncelog.transactions import aborted_txn_entry

log = logging.getLogger(__name__)


class RecoveryReport(NamedTuple):
    """What opening a log read and did; tests use it to prove only the tail was read."""

    clean: bool
    segments_scanned: int
    bytes_scanned: int
    batches_replayed: int
    truncated_bytes: int
    snapshot_offset: int | None
    duration_s: float
    indexes_rebuilt: int = 0
    tail_error: str | None = None
    # Zeros cut after the last batch: the active segment's pre-allocated space (or
    # pages a power loss left unwritten). Not counted in truncated_bytes: no data.
    zero_tail_bytes: int = 0
    # Producers the replay named beyond producer_capacity, least recent first: ones the
    # running engine had already expired (see oncelog.producer_replay).
    producers_shed: int = 0
    # Segments but an empty metadata store: a Kafka directory opened for the first
    # time, or an oncelog one whose meta.lmdb was lost (with its recovery point, log
    # start and producer-id flags). Every segment was then validated, as after a crash
    # with nothing known to be durable.
    metadata_missing: bool = False


class LoadedLog(NamedTuple):
    segments: list[LogSegment]
    producers: ProducerStateManager | None  # None: deferred_snapshot holds them
    recovery_point: int
    report: RecoveryReport
    client_only: bool
    log_start_offset: int
    # A clean open that left producer state unread (`defer_producers`): the snapshot that
    # holds it, which `load_deferred_producers` reads at first use.
    deferred_snapshot: int | None = None


def list_segment_bases(fs: FileSystem, directory: str, names: list[str] | None = None) -> list[int]:
    bases = []
    listed = fs.listdir(directory) if names is None else names
    for name in [name for name in listed if name.endswith(LOG_SUFFIX)]:  # (one filter: cheap per name)
        base = parse_segment_file_name(name, LOG_SUFFIX)
        if base is None:
            raise NotASegmentError(
                "a .log file whose name is not a 20-digit base offset", path=os.path.join(directory, name)
            )
        bases.append(base)
    return sorted(bases)


def load_deferred_producers(
    fs: FileSystem,
    directory: str,
    config: LogConfig,
    store: MetadataStore,
    segments: list[LogSegment],
    snapshot_offset: int,
    now_ms: int,
) -> ProducerStateManager:
    """The producer state a clean open deferred (LoadedLog.deferred_snapshot), at `now_ms`, over
    the log's `segments` now: the snapshot at `snapshot_offset` (or the newest older one if it
    is unreadable), then the batches after it (appends of batches with no producer id)."""
    assert segments and segments[-1].next_offset >= snapshot_offset, (directory, snapshot_offset)
    loader = LogLoader(fs, directory, config, store, clean=True, now_ms=now_ms)
    loader.segments = segments
    loader.deferred_snapshot = snapshot_offset
    loader._read_deferred_producers()
    loader.producers.expire(now_ms, exhaustive=True)
    return loader.producers


class LogLoader:
    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        config: LogConfig,
        store: MetadataStore,
        *,
        clean: bool,
        now_ms: int,
        scan_tail: ScanTail | None = None,
        marker_durable: Callable[[], None] | None = None,
        defer_producers: bool = False,
    ):
        """`scan_tail`: the compiled tail scan (oncelog._append.scan_tail), or None for the
        reference loop alone. `marker_durable`: the clean marker's `made_durable`, called
        before the load changes a log the marker called clean (None: durable already).
        `defer_producers`: a clean open whose snapshot at the log end holds every
        producer leaves it unread (LoadedLog.deferred_snapshot), for a caller that opens
        many logs of which most stay idle (a LogManager)."""
        self.fs = fs
        self._defer_producers = defer_producers
        self.deferred_snapshot: int | None = None
        self._marker_durable = marker_durable
        self._scan_tail = scan_tail
        self.directory = directory
        self.config = config
        self.store = store
        self.clean = clean
        self.now_ms = now_ms
        self._retired = read_retired(store)
        self._shed = 0  # by replays started over (the snapshot-past-the-end case)
        self.segments: list[LogSegment] = []
        self._bytes_scanned = 0
        self._segments_scanned = 0
        self._replayed = 0
        self._truncated = 0
        self._zero_tail = 0
        self._rebuilt = 0
        self._tail_error: str | None = None
        self._validated: list[LogSegment] = []
        # The snapshots the load's listing found, while the load has changed none of them
        # (None once it has): the stray ones are removed without a second listing.
        self._snapshots_listed: list[int] | None = None
        self.client_only = False
        self.metadata_missing = False
        self._truncate = config.on_corruption == "truncate"

    @functools.cached_property  # (made at first use: a load that defers the producers makes neither)
    def producers(self) -> ProducerStateManager:
        return ProducerStateManager(self.config.producer_capacity, self.config.producer_expiration_ms)

    @functools.cached_property
    def _replay(self) -> ReplayBuffer:
        return ReplayBuffer(self.producers, self.now_ms, self._retired)

    def load(self) -> LoadedLog:
        started = time.perf_counter()
        try:
            snapshot_offset = self._load()
        except BaseException:
            for segment in self.segments:
                segment.close(durable=False)
            raise
        end = self.segments[-1].next_offset
        point = read_recovery_point(self.store)
        if point.offset > end:
            self._fsynced_data_missing(point, end)  # raises, or (truncate) makes the loss durable
        recorded_start = recorded_log_start(self.store)
        first_base = self.segments[0].base_offset
        if recorded_start is not None and recorded_start < first_base:
            # The segment holding the start is gone (lost by hand, a bad restore).
            self._leading_data_missing(recorded_start, first_base)
        if self.deferred_snapshot is None:
            # As Kafka does at load: producers idle past their expiration are forgotten,
            # so the state equals a replay followed by expiry at the same time.
            self.producers.expire(self.now_ms, exhaustive=True)
        if not self.clean:
            # Serve nothing recovery has not made durable (KAFKA-10101); only then
            # may the recovery point move past it.
            for segment in self._validated:
                if segment in self.segments:
                    segment.flush()
            snapshots.write_snapshot(self.fs, self.directory, end, self.producers.live_rows())
            last = self.segments[-1]
            write_recovery_point(self.store, RecoveryPoint(end, last.base_offset, last.size))
        if self._retired:
            forget_retired(self.store)  # the snapshot at the end (clean or just written) holds them
        self._remove_stray_snapshots(end)
        report = RecoveryReport(
            clean=self.clean,
            segments_scanned=self._segments_scanned,
            bytes_scanned=self._bytes_scanned,
            batches_replayed=self._replayed,
            truncated_bytes=self._truncated,
            snapshot_offset=snapshot_offset,
            duration_s=time.perf_counter() - started,
            indexes_rebuilt=self._rebuilt,
            tail_error=self._tail_error,
            zero_tail_bytes=self._zero_tail,
            producers_shed=self._shed + (0 if self.deferred_snapshot is not None else self._replay.shed),
            metadata_missing=self.metadata_missing,
        )
        # The stored start (delete_records, retention) can be inside the first segment;
        # never below it, and never past the end (recovery may have cut the log).
        stored_start = read_offset(self.store, LOG_START_KEY) or 0
        start = min(max(stored_start, self.segments[0].base_offset), end)
        if stored_start > end:
            # A cut (recovery's, or a truncation a crash interrupted) went below the start:
            # keep the start at the end durably, or appends from here would land below it.
            write_offsets(self.store, {LOG_START_KEY: end})
        producers = None if self.deferred_snapshot is not None else self.producers
        deferred = self.deferred_snapshot
        return LoadedLog(self.segments, producers, end, report, self.client_only, start, deferred)

    # -- the steps -------------------------------------------------------------------
    def _load(self) -> int | None:
        # One listing for the start of the load: it grows with the segment count.
        listing = settled_listing(self.fs, self.directory)  # (a cleaning's swap a crash interrupted)
        names = listing.names
        self._remove_temp_files(names)  # removes only .tmp names, which nothing below reads
        self._snapshots_listed = snapshots.list_snapshot_offsets(self.fs, self.directory, names)
        bases = list_segment_bases(self.fs, self.directory, names)
        flag = read_offset(self.store, CLIENT_ONLY_KEY)
        if not bases:
            self._wait_marker_durable()  # (a first segment is made below)
            if flag is None:
                write_offsets(self.store, {CLIENT_ONLY_KEY: 1})  # a new log has only client appends
                # fsync(store dir): a power loss must not drop the store's data file while
                # the segment made next survives: that reads as a lost store (below).
                self.fs.fsync_dir(self.store.path)
            self.client_only = True
            self.segments.append(self._open(0, create=True))
            return None
        if not self.store.keys(""):
            # Every oncelog log commits its flag before its first segment exists, so
            # segments beside an empty store are a Kafka directory or a lost store. Nothing
            # says what was fsynced: validate everything, whatever the marker claims.
            log.warning(
                "%s has segments but its metadata store %s is empty (a Kafka directory, or the "
                "store was lost): validating every segment; any recovery point or log start it held is gone",
                self.directory,
                self.store.path,
            )
            self.metadata_missing = True
            self._turn_unclean()
        # Segments without the flag (a Kafka directory, say) may hold compacted gaps
        # and leader epochs.
        self.client_only = flag == 1
        point = read_recovery_point(self.store)
        # Unclean: validate from the segment holding the recovery point to the end.
        first = first_validated(bases, point, clean=self.clean, store_found=not self.metadata_missing)
        first_unsafe = len(bases) if first is None else first
        last = len(bases) - 1
        self._open_segments(bases, first_unsafe, listing.irregular)
        if first_unsafe == len(bases) and not self._load_active_cleanly(self.segments[last], point):
            # The marker said clean but the active segment disagrees: validate it.
            first = first_validated(bases, point, clean=True, store_found=True, active_tail_ok=False)
            assert first == last, (first, last)
            self._turn_unclean()
            first_unsafe = first

        validated_from = snapshot_limit(bases, first_unsafe)
        self.deferred_snapshot = self._deferrable_snapshot(all_trusted=first_unsafe == len(bases))
        if self.deferred_snapshot is not None:
            return self.deferred_snapshot
        snapshot_offset, has_state = self._load_newest_snapshot(
            limit=validated_from, listed=self._snapshots_listed
        )
        self._replay_trusted(snapshot_offset, until=validated_from)
        self._validate_tail(first_unsafe, point, snapshot_offset)
        self._flush_replay()
        end = self.segments[-1].next_offset
        if has_state and snapshot_offset is not None and replay_starts_over(snapshot_offset, end):
            log.warning("snapshot at %d is past the recovered log end %d; replaying", snapshot_offset, end)
            snapshots.delete_snapshot(self.fs, self.directory, snapshot_offset)
            self._snapshots_listed = None
            self.producers.clear()
            self._shed += self._replay.shed
            self._replay = ReplayBuffer(
                self.producers, self.now_ms, self._retired
            )  # nothing of the first kept
            snapshot_offset, _ = self._load_newest_snapshot(limit=end)
            self._replay_trusted(snapshot_offset, until=None)
            self._flush_replay()
        return snapshot_offset

    def _deferrable_snapshot(self, *, all_trusted: bool) -> int | None:
        """The snapshot a clean open may leave unread (`defer_producers`): the one at the log
        end, which the clean close wrote last; None: load the producers now."""
        listed = self._snapshots_listed
        if not (self._defer_producers and self.clean and all_trusted and listed) or self._retired:
            return None  # (retired producers: the load forgets their store records)
        end = self.segments[-1].next_offset
        return end if listed[-1] == end else None

    def _turn_unclean(self) -> None:
        """Validate after all: whatever the marker said, the log is loaded as after a crash.
        Producers a clean load deferred are read now: an unclean load writes their snapshot."""
        self._wait_marker_durable()
        self.clean = False
        if self.deferred_snapshot is not None:
            self._read_deferred_producers()

    def _read_deferred_producers(self) -> None:
        """Read the producers deferred to `deferred_snapshot` (an older snapshot if it is
        unreadable), and replay the segments' batches after it."""
        assert self.deferred_snapshot is not None
        offset, _ = self._load_newest_snapshot(limit=self.deferred_snapshot)
        self._replay_trusted(offset, until=None)
        self._flush_replay()
        self.deferred_snapshot = None

    def _wait_marker_durable(self) -> None:
        """Before the load changes a log its marker called clean: the marker's removal must be
        durable first, or a crash after the change finds the marker and trusts a log the
        change had half made (KAFKA-10471)."""
        wait, self._marker_durable = self._marker_durable, None
        if wait is not None:
            wait()

    def _open_segments(self, bases: list[int], first_unsafe: int, irregular: frozenset[str]) -> None:
        assert bases, self.directory
        last = len(bases) - 1
        trusted = min(first_unsafe, last)
        # Sealed and below the recovery point: trusted, with no I/O until used (as Kafka's
        # LazyIndex), so the cost of opening barely grows with the number of segments.
        c, prefix = self.config, os.path.join(self.directory, "")
        limits = (c.index_interval_bytes, c.segment_bytes, c.segment_index_bytes)
        opened = functools.partial(LogSegment.open_trusted, self.fs, self.directory, limits=limits)
        for n in range(trusted):
            name = segment_file_name(bases[n], LOG_SUFFIX)
            regular = name not in irregular  # (a link is sized now: a dangling one fails here, named)
            self.segments.append(opened(prefix + name, bases[n], bases[n + 1], listed_regular=regular))
        for n in range(trusted, last + 1):
            segment = self._open(bases[n], sealed=n != last)
            if n != last:
                # Validated later one at a time: a log whose every segment needs it (a
                # Kafka directory, a lost store) must not hold a descriptor for each.
                segment.park_descriptor()
            self.segments.append(segment)

    def _open(self, base: int, *, create: bool = False, sealed: bool = False) -> LogSegment:
        return LogSegment.open(
            self.fs,
            self.directory,
            base,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes,
            create=create,
            sealed=sealed,
            max_segment_bytes=self.config.segment_bytes,
        )

    def _load_active_cleanly(self, segment: LogSegment, point: RecoveryPoint) -> bool:
        try:
            if not segment.load_from_indexes(None, client_only=self.client_only):
                return False
        except CorruptRecordError as exc:
            log.warning("clean shutdown marker, but %s", exc)
            return False
        # A clean close flushed to its end: a recovery point at this segment's end names
        # the offset the tail must end at (a base offset moved outside the CRC does not).
        at_end = point.segment_base == segment.base_offset and point.position == segment.size
        return not at_end or point.offset == segment.next_offset

    def _load_newest_snapshot(
        self, limit: int | None, listed: list[int] | None = None
    ) -> tuple[int | None, bool]:
        """Load the newest readable snapshot (at or below `limit`); set corrupt ones aside.

        `listed`: the snapshots the load's listing found (else the directory is listed)."""
        if listed is None:
            listed = snapshots.list_snapshot_offsets(self.fs, self.directory)
        for offset in reversed(listed):
            if limit is not None and offset > limit:
                continue
            try:
                rows = snapshots.read_snapshot(self.fs, self.directory, offset, into=self.producers.table)
                rows, shed = fit_rows(
                    rows, self.producers.capacity, self.now_ms, self.producers.expiration_ms
                )
                self._shed += shed
                # Append times the snapshot does not know (Kafka's, an older oncelog
                # version) or that lie past the clock count as now (see load_rows).
                self.producers.load_rows(rows, self.now_ms)
                # Retired after this snapshot was written: gone from the running engine.
                self.producers.retire([pid for pid, at in self._retired.items() if at > offset])
            except (CorruptSnapshotError, DuplicateProducerError) as exc:
                log.warning("setting aside corrupt snapshot %d: %s", offset, exc)
                self.producers.clear()
                snapshots.set_aside(self.fs, self.directory, offset)
                self._snapshots_listed = None
                continue
            return offset, True
        return None, False

    def _replay_trusted(self, snapshot_offset: int | None, until: int | None) -> None:
        """Replay batch headers from the snapshot up to offset `until` (None: the end)."""
        start_offset = snapshot_offset if snapshot_offset is not None else self.segments[0].base_offset
        for segment in self.segments:
            if until is not None and segment.base_offset >= until:
                break
            if segment.next_offset <= start_offset:
                continue
            position = segment.offset_index.lookup(start_offset).position
            self._bytes_scanned += segment.size - position
            for _, batch in segment.scan(position):
                self._apply(batch, start_offset)

    def _validate_tail(
        self, first_unsafe: int, recovery_point: RecoveryPoint, snapshot_offset: int | None
    ) -> None:
        replay_from = snapshot_offset if snapshot_offset is not None else self.segments[0].base_offset
        n = first_unsafe
        while n < len(self.segments):
            if not self._validate_segment(n, recovery_point, replay_from):
                return
            if n + 1 < len(self.segments):
                self.segments[n].seal()
                self.segments[n].unmap_sealed_indexes()  # mapped again when read
            n += 1

    def _validate_segment(self, n: int, recovery_point: RecoveryPoint, replay_from: int) -> bool:
        """Validate segment n, replaying it; False if the log was cut in it."""
        segment = self.segments[n]
        self._segments_scanned += 1
        self._validated.append(segment)
        self._rebuilt += 1
        holds_point = recovery_point.segment_base == segment.base_offset and recovery_point.position > 0
        # The offset after the batch that ends exactly at the recovery point's position.
        offset_at_point: list[int] = []
        scan = None
        if self._scan_tail is not None:
            scan = CompiledTailScan(self._scan_tail, self._replay_plain_rows, replay_from)
            if holds_point:
                scan.watch_end_position(recovery_point.position)

        def on_batch(position: int, batch: RecordBatch) -> None:
            if scan is not None:
                scan.replay_kept()  # a marker reads what came before it
            self._apply(batch, replay_from, rebuilding=segment)
            if holds_point and position + batch.size == recovery_point.position:
                offset_at_point.append(batch.last_offset + 1)

        error = segment.rebuild(
            validate=True,
            on_batch=on_batch,
            # A client-only log's active segment was made at its first batch's offset, so
            # a different first offset means moved bytes. (A follower's first batch may
            # land past an empty segment's base: replication takes the leader's offsets.)
            first_base_offset=segment.base_offset
            if n == len(self.segments) - 1 and self.client_only
            else None,
            client_only=self.client_only,
            tail_scan=scan,
        )
        if scan is not None:
            scan.replay_kept()  # the batches before a bad one stay
            self._replayed += scan.replayed
            if recovery_point.position in scan.end_positions:
                offset_at_point.append(scan.end_positions[recovery_point.position])
        self._bytes_scanned += segment.size  # the batches read; a bad one ends the count
        if holds_point and self._point_batches_replaced(segment, error, recovery_point, offset_at_point):
            return False
        if error is not None:
            # segment.size is where the bad batch starts.
            verdict = judge_bad_batch(
                recovery_point,
                segment.base_offset,
                segment.size,
                segment.next_offset,
                truncate=self._truncate,
            )
            if verdict is Verdict.CUT_TORN_TAIL:
                self._cut_tail(n, str(error))
            else:
                self._corruption_below_recovery_point(
                    segment, error, recovery_point, verdict
                )  # raises or cuts
            return False
        return True

    def _point_batches_replaced(
        self, segment: LogSegment, error: Exception | None, point: RecoveryPoint, offset_at_point: list[int]
    ) -> bool:
        """Whether the batch ending at the point's position (in `segment`, walked) is not the
        one fsynced there; if so, say so (raises, or cuts with on_corruption="truncate")."""
        # The walk passed the point when it found no bad batch, or found one only from the
        # point on (an active segment always ends in its reserved zeros).
        walked_past_point = error is None or segment.size >= point.position
        if not walked_past_point or offset_at_point == [point.offset]:
            return False
        # Valid batches, but not the ones that were fsynced: bytes below the recovery point
        # are missing, or a misdirected write put a batch from the tail onto a batch boundary
        # there (in a follower's log, whose offsets may skip, nothing else tells).
        replaced = CorruptRecordError(
            f"the batches fsynced up to position {point.position} should end at offset "
            f"{point.offset}; what is there now ends at {offset_at_point or 'no batch'}",
            path=segment.path,
            position=min(point.position, segment.size),
        )
        self._corruption_below_recovery_point(segment, replaced, point, corruption(truncate=self._truncate))
        return True

    def _fsynced_data_missing(self, point: RecoveryPoint, end: int) -> None:
        """The store says offsets up to `point` were fsynced, yet the data found ends at `end`.

        Not a torn tail: fsynced bytes cannot tear. A segment file was deleted or
        emptied (an operator, a bad restore) and the log must not come back shorter and
        take new appends at offsets it already acknowledged. CorruptLogError, unless
        `on_corruption="truncate"`, which accepts the loss durably (the recovery point
        comes down to the end) and reports it.
        """
        holder = point.segment_base if point.segment_base is not None else self.segments[-1].base_offset
        last = self.segments[-1]
        path = os.path.join(self.directory, segment_file_name(holder, LOG_SUFFIX))
        position = last.size if last.base_offset == holder else 0
        why = (
            f"offsets {end} to {point.offset - 1} were fsynced (the recovery point is {point.offset}) "
            f"but the log found ends at {end}: a segment file is missing or was emptied"
        )
        if judge_missing_data(end, point.offset, truncate=self._truncate) is Verdict.REFUSE_CORRUPT:
            raise CorruptLogError(
                f"{why}. Open with LogConfig(on_corruption='truncate') to accept the loss",
                path=path,
                position=position,
            )
        log.error("%s: %s; accepting the loss (on_corruption='truncate')", self.directory, why)
        self._tail_error = f"fsynced data missing: {why}"
        self._turn_unclean()  # the unclean path below makes the lowered recovery point durable

    def _leading_data_missing(self, start: int, first_base: int) -> None:
        """The segment holding the log start is gone: offsets `start`..`first_base` - 1 were
        there. CorruptLogError unless `on_corruption="truncate"`, which moves the start to
        the first segment durably and reports it."""
        why = (
            f"offsets {start} to {first_base - 1} are missing: the log starts at {start} but its "
            f"first segment file starts at {first_base} (a segment file was lost)"
        )
        path = os.path.join(self.directory, segment_file_name(start, LOG_SUFFIX))
        if judge_missing_data(start, first_base, truncate=self._truncate) is Verdict.REFUSE_CORRUPT:
            raise CorruptLogError(
                f"{why}. Open with LogConfig(on_corruption='truncate') to accept the loss",
                path=path,
                position=0,
            )
        log.error("%s: %s; accepting the loss (on_corruption='truncate')", self.directory, why)
        self._tail_error = f"data missing: {why}"
        write_offsets(self.store, {LOG_START_KEY: first_base})

    def _corruption_below_recovery_point(
        self, segment: LogSegment, error: Exception, recovery_point: RecoveryPoint, verdict: Verdict
    ) -> None:
        position = segment.size
        if verdict is Verdict.REFUSE_CORRUPT:
            raise CorruptLogError(
                f"{getattr(error, 'reason', error)}; this data is below the recovery point "
                f"{recovery_point.offset}, so it was fsynced "
                "and this is corruption, not a torn write. Open with LogConfig(on_corruption='truncate') "
                "to cut the log here",
                path=segment.path,
                position=position,
            )
        log.error("cutting %s at %d below the recovery point: %s", segment.path, position, error)
        self._cut_tail(self.segments.index(segment), str(error))
        # Reported even when nothing was left to cut (the fsynced bytes were already gone).
        self._tail_error = f"corruption below the recovery point {recovery_point.offset}: {error}"

    def _cut_tail(self, n: int, why: str) -> None:
        """Cut segment n at its last good batch and delete every segment after it."""
        segment = self.segments[n]
        zeros = segment.trailing_zero_bytes() if n == len(self.segments) - 1 else 0
        damaged = segment.truncate_to_size() - zeros
        for later in self.segments[n + 1 :]:
            damaged += later.size
            later.delete()
        del self.segments[n + 1 :]
        self._zero_tail += zeros
        if damaged == 0:
            return  # only unwritten space past the last batch: nothing was lost
        self._truncated += damaged
        self._tail_error = why
        log.warning("cut %d bytes of torn tail from %s: %s", self._truncated, segment.path, why)

    def _apply(self, batch: RecordBatch, from_offset: int, rebuilding: LogSegment | None = None) -> None:
        """Replay one stored batch into producer state (headers only, except a marker's one record).

        `rebuilding`: the segment whose transaction index is being rebuilt; an
        ABORT marker replayed from it goes back into that index.
        """
        h = batch.header
        if h.producer_id < 0 or h.base_offset < from_offset:
            return
        self._replayed += 1
        if h.attributes & CONTROL_MASK:
            marker = decode_txn_marker(batch)
            if marker is None:
                return  # an empty control batch (or not a marker) closes nothing
            completed = self._replay.replay_marker(
                h.producer_id, h.producer_epoch, h.base_offset, h.max_timestamp, marker
            )
            if completed is not None and completed.aborted and rebuilding is not None:
                others = self._replay.open_transactions().values()  # its own is closed now
                rebuilding.txn_index.append(aborted_txn_entry(completed, others))
            return
        self._replay.replay_batch(
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
            batch.last_sequence,
            h.base_offset,
            h.base_offset + h.last_offset_delta,
            h.max_timestamp,
            False,
            bool(h.attributes & TRANSACTIONAL_MASK),
        )

    def _replay_plain_rows(self, rows: np.ndarray) -> None:
        self._replay.replay_plain_rows(rows)

    def _flush_replay(self) -> None:
        self._replay.flush()

    # -- housekeeping ------------------------------------------------------------------
    def _remove_temp_files(self, names: list[str]) -> None:
        suffix = snapshots.SNAPSHOT_SUFFIX + snapshots.TMP_SUFFIX
        for name in [name for name in names if name.endswith(suffix)]:
            # A snapshot write that crashed before its rename: never valid.
            self.fs.unlink(os.path.join(self.directory, name))

    def _remove_stray_snapshots(self, end: int) -> None:
        """Keep snapshots at segment bases and at the log end; delete the rest."""
        keep = {segment.base_offset for segment in self.segments} | {end}
        removed = False
        listed = self._snapshots_listed
        for offset in (
            listed if listed is not None else snapshots.list_snapshot_offsets(self.fs, self.directory)
        ):
            if offset not in keep:
                snapshots.delete_snapshot(self.fs, self.directory, offset)
                removed = True
        if removed:
            # fsync(dir): a stray snapshot that comes back after a crash could be loaded.
            self.fs.fsync_dir(self.directory)
