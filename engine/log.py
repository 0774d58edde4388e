"""Log: one partition directory of segments, with idempotent append, read and roll.

Appends are checked in full (batch validation, then Kafka's producer rules) before
a byte is written, so a rejected request leaves the log byte-for-byte unchanged,
and producer state changes only after the bytes are in the segment. Offsets are
stamped by rewriting only the first 8 bytes (the CRC does not cover them): the
body goes to the kernel as-is in a vectored write.

Durability: a roll fsyncs the old segment and writes the snapshot at
the new base before the recovery point (in the metadata store) moves there, so
an unclean open validates only the active segment. A clean close leaves a marker
that the next open deletes before loading, so a crash while loading is unclean.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from oncelog import fast_append, threads
from oncelog.append_plan import PlannedBatch, stamped_buffers
from oncelog.append_rules import ProducerAppendInfo
from oncelog.clock import Clock, MonotonicClock, engine_clock
from oncelog.config import LogConfig
from oncelog.errors import (
    CorruptMetadataError,
    InvalidRecordError,
    LogClosedError,
    LogFailedError,
    OffsetOutOfRangeError,
    OncelogError,
    ProducerStateFullError,
)
from oncelog.group_commit import GroupCommit
from oncelog.producer_state import BatchMetadata, CompletedTxn, ProducerStateEntry, WorkingState
from oncelog.reads import read_log
from oncelog.recovery.loader import LoadedLog, LogLoader, RecoveryReport
from oncelog.results import ISOLATIONS, AppendResult, FetchResult, Isolation
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.control import TxnMarker, decode_txn_marker, encode_txn_marker
from oncelog.segments.format import Buffer
from oncelog.segments.index import TimestampOffset
from oncelog.segments.segment import BatchMeta, LogSegment
from oncelog.storage import snapshot as snapshots
from oncelog.storage.checkpoint import (
    CLIENT_ONLY_KEY,
    LOG_START_KEY,
    RETIRED_PREFIX,
    RecoveryPoint,
    forget_retired,
    write_offsets,
    write_recovery_point,
)
from oncelog.storage.clean_marker import (
    CleanMarker,
    StoreCopy,
    store_copy_if_current,
    take_clean_marker,
    write_clean_marker,
)
from oncelog.storage.fs import DEFAULT_FS, DirLock, FileSystem, MetadataStore
from oncelog.storage.log_dirs import (
    LEGACY_LOCK_FILE,
    create_dir,
    lock_log_dir,
    opening_failed,
    unnamed_os_error,
)
from oncelog.storage.partition_store import PartitionStore
from oncelog.transactions import OpenTransactions, aborted_between
from oncelog.validation import Origin, batch_buffer, client_batch_header, validate_batch

T = TypeVar("T")

# Builds a NamedTuple without its Python-level __new__: half the cost on the append path.
_new_result = tuple.__new__

LOCK_FILE = LEGACY_LOCK_FILE  # where a log outside a LogManager root keeps its lock
METADATA_DIR = "meta.lmdb"


class Log:
    def __init__(
        self,
        directory: str,
        config: LogConfig,
        fs: FileSystem,
        clock: MonotonicClock,
        loaded: LoadedLog,
        store: MetadataStore,
        dir_lock: DirLock,
    ):
        assert loaded.segments, "a log always has an active segment"
        self.directory = directory
        self.config = config
        self._fs = fs
        self._clock = clock
        self._segments = loaded.segments
        self._base_offsets = [segment.base_offset for segment in self._segments]
        # Sealed segments whose indexes are mapped: at most one stays so between operations
        # (the one the last read ended in, for the next sequential read), so a log keeps a
        # few of the process's vm.max_map_count mappings, however many segments it has.
        self._mapped_sealed: set[LogSegment] = set()
        self._watch_index_maps(self._segments)
        self._producers = loaded.producers
        self._transactions = OpenTransactions(self._producers.open_transactions())
        self._store = store
        self._dir_lock = dir_lock
        self.recovery_point = loaded.recovery_point
        self._client_only = loaded.client_only
        self._log_start_offset = loaded.log_start_offset
        # What opening read and did: clean or not, bytes scanned, tail cut.
        self.recovery_report: RecoveryReport = loaded.report
        self._lock = threads.rlock()
        self._closed = False
        self._fast: fast_append.Appender | None = None
        # Set by the first failed write or fsync; appends are refused until reopen.
        self._failure_exc: BaseException | None = None
        self._unflushed_messages = 0
        self._last_flush_ms = clock()
        self._has_flush_policy = config.flush_messages is not None or config.flush_ms is not None
        self._log_append_time = config.timestamp_type == "LogAppendTime"
        self._segment_bytes_limit = config.segment_bytes
        self._max_batch_bytes = config.max_batch_bytes
        self._max_decompressed_bytes = config.max_decompressed_batch_bytes
        self._segment_ms = config.segment_ms
        self._group_commit = GroupCommit(loaded.recovery_point)
        self._recovery_point_lock = threads.lock()
        # Held while a flush fsyncs and commits the recovery point (outside the append
        # lock), and by everything that closes segment files or moves the point back
        # (truncation, reloads, deleting segments): a flush never fsyncs a closed file
        # and never commits a point past a cut. Lock order: append lock, this one, then
        # the recovery point's.
        self._fsync_lock = threads.lock()
        # Bumped (under the fsync lock) whenever segments are cut, deleted or reloaded: a
        # flush that captured the log before commits nothing (its waiters flush again).
        self._generation = 0
        self._retirements_recorded = False  # retired-producer records in the store (the loader clears them)
        # The compiled append (oncelog.fast_append), bound to the active segment and the
        # producer table; rebound whenever either is replaced, dropped on close or failure.
        self._compiled = fast_append.enabled()
        self._refresh_fast()

    @property
    def _failure(self) -> BaseException | None:
        return self._failure_exc

    @_failure.setter
    def _failure(self, exc: BaseException | None) -> None:
        self._failure_exc = exc
        if exc is not None:
            self._drop_fast()  # appends are refused until reopen: the Python path says so

    def _drop_fast(self) -> None:
        fast, self._fast = self._fast, None
        if fast is not None:
            fast.close()  # a flag: a call waiting for the lock finds it closed and goes to the Python path

    def _refresh_fast(self) -> None:
        """Bind the compiled append to the current active segment and producer table.

        The compiled path leaves the log on the Python path (returns None) for every
        case it does not take, so a log without one is only slower. None on a closed
        or failed log, and for LogAppendTime (which rewrites CRC-covered fields).
        """
        self._drop_fast()
        module = fast_append.compiled
        if (
            module is None
            or not self._compiled
            or self._closed
            or self._failure is not None
            or self._log_append_time
            or not self._segments
        ):
            return
        self._fast = module.Appender(
            lock=self._lock,
            clock=self._clock,
            result_type=AppendResult,
            max_batch_bytes=self._max_batch_bytes,
            segment_bytes=self._segment_bytes_limit,
            segment_ms=self._segment_ms,
            **self._producers.shared_arrays(),
            **self._segments[-1].shared_cursors(),
        )

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        fs: FileSystem | None = None,
        clock: Clock | None = None,
        clean_shutdown: bool | CleanMarker | None = None,
        dir_lock: DirLock | None = None,
    ) -> Log:
        """Open the partition directory at `path`, creating it if missing.

        `clock` (milliseconds; the wall clock by default) is the engine's time: when
        producers were last appended and when they expire, LogAppendTime stamps,
        flush_ms and retention. The Log never lets it go backwards (MonotonicClock).

        `dir_lock` is the directory's lock (`log_dirs.lock_log_dir`) for a caller that
        took it itself: the Log takes it over (releases it at close, or here if opening
        fails). None: take it here (LogDirLockedError if another Log holds it).

        `clean_shutdown` is for a caller that took the clean-shutdown marker itself
        (`take_clean_marker`, holding the lock) and made that durable (LogManager locks
        every partition, takes every marker, then syncs the filesystem once): what it
        took (the marker, which may carry a copy of the store), or whether one was there.
        None: take it here.
        """
        directory = os.fspath(path)
        config = config or LogConfig()
        fs = fs or DEFAULT_FS
        if dir_lock is None:
            create_dir(fs, directory)
            dir_lock = lock_log_dir(fs, directory, f"{directory} is already open in another Log")
        store: MetadataStore | None = None
        try:
            marker = clean_shutdown
            if marker is None:
                marker = take_clean_marker(fs, directory)
                if marker is not None:
                    # fsync(dir): a crash during loading must find no marker and count as unclean.
                    fs.fsync_dir(directory)
            clean = bool(marker)
            store_path = os.path.join(directory, METADATA_DIR)
            # Opened for writing by its first commit: an idle log holds no store open. After a
            # clean close, not even read: the marker carried its values.
            copy = store_copy_if_current(fs, store_path, marker) if isinstance(marker, CleanMarker) else None
            store = PartitionStore(fs, store_path, copy)
            log_clock = engine_clock(clock)
            loaded = LogLoader(fs, directory, config, store, clean=clean, now_ms=log_clock()).load()
        except BaseException as exc:
            if store is not None:
                store.close()
            dir_lock.release()
            if unnamed_os_error(exc):
                # Nothing is served; after an I/O error (LogFailedError) reopening retries recovery.
                raise opening_failed(exc, directory) from exc
            raise
        return cls(directory, config, fs, log_clock, loaded, store, dir_lock)

    # -- properties ------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        """The first offset reads may ask for (delete_records and retention move it)."""
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        try:
            return self._segments[-1].next_offset
        except IndexError:
            raise self._unusable() from None

    @property
    def active_segment(self) -> LogSegment:
        try:
            return self._segments[-1]
        except IndexError:
            raise self._unusable() from None

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    # Sized or scheduled when the log opens; a new value applies at the next open.
    FIELDS_APPLIED_AT_OPEN = ("producer_capacity", "segment_index_bytes", "producer_expiration_ms")

    def reconfigure(self, config: LogConfig) -> None:
        """Apply `config` to the open log (a LogManager's per-topic overrides).

        Rolling, flushing, batch limits, timestamps and retention follow it from the next
        append; FIELDS_APPLIED_AT_OPEN keep their old values until the log is reopened.
        """
        with self._lock:
            self._check_open()
            kept = {name: getattr(self.config, name) for name in self.FIELDS_APPLIED_AT_OPEN}
            self.config = dataclasses.replace(config, **kept)
            self._has_flush_policy = config.flush_messages is not None or config.flush_ms is not None
            self._log_append_time = config.timestamp_type == "LogAppendTime"
            self._segment_bytes_limit = config.segment_bytes
            self._max_batch_bytes = config.max_batch_bytes
            self._max_decompressed_bytes = config.max_decompressed_batch_bytes
            self._segment_ms = config.segment_ms
            self._refresh_fast()

    def producer_state(self, producer_id: int) -> ProducerStateEntry | None:
        with self._lock:
            self._check_open()
            return self._producers.get(producer_id)

    def expire_producers(self, now_ms: int | None = None, *, exhaustive: bool = False) -> int:
        """Forget producers the engine has not appended for in `producer_expiration_ms`;
        returns how many.

        `now_ms` defaults to the Log's clock; an earlier time than the clock has
        already shown is raised to it (expiry never runs on a clock that went back),
        and a later one is used for this call only (it does not move the clock).
        Pops from the head of the ring while it is due (see ProducerStateManager);
        `exhaustive` examines every producer once.
        """
        if now_ms is not None:
            fmt.check_int("now_ms", now_ms, "i64")
        with self._lock:
            self._check_open()
            now = self._clock()
            return self._producers.expire(now if now_ms is None else max(now_ms, now), exhaustive=exhaustive)

    def retire_producers(self, producer_ids: list[int]) -> int:
        """Forget finished producers now instead of after `producer_expiration_ms`.

        Only producers with no open transaction go; their next batch (there should be
        none) would be accepted at any sequence, as after expiry. Returns how many left.
        """
        with self._lock:
            self._check_writable()
            gone = [
                pid
                for pid in dict.fromkeys(producer_ids)
                if (entry := self._producers.get(pid)) is not None and entry.current_txn_first_offset < 0
            ]
            if not gone:
                return 0
            with self._failing_closed(f"recording retired producers in {self.directory}"):
                # Durable first: until a snapshot holds the table without them, recovery
                # replaying the tail would bring them back, and they would take slots.
                end = self.log_end_offset
                write_offsets(self._store, {RETIRED_PREFIX + str(pid): end for pid in gone})
                self._retirements_recorded = True
            return self._producers.retire(gone)

    def _forget_retirements(self) -> None:
        """After a durable snapshot of the table: retirements it holds need no record."""
        if self._retirements_recorded:
            forget_retired(self._store)
            self._retirements_recorded = False

    def producers(self) -> Iterator[ProducerStateEntry]:
        """Every producer's state, oldest first (a snapshot taken under the lock)."""
        with self._lock:
            self._check_open()
            entries = list(self._producers.entries())
        return iter(entries)

    # -- appends ---------------------------------------------------------------------
    def append(
        self, batch_bytes: Buffer, *, origin: Origin = "client", durable: bool = False
    ) -> AppendResult:
        """Validate one encoded batch, check its producer, stamp its offsets and write it.

        With `durable`, return only once the batch is fsynced; appenders waiting at
        the same time share one fsync (group commit). A `truncate_to` meanwhile raises
        TruncatedBeforeDurableError (retriable): the batch may be gone.

        This is the fast path for one client batch: the same checks and the same
        order of effects as the request path (see _plan/_execute), without
        building a RecordBatch or a plan: one header unpack, one CRC, one walk over
        the records, one copy into the segment. append_batches takes the rare cases (replication, a roll,
        LogAppendTime, a full producer table).

        `batch_bytes` is bytes, bytearray or any C-contiguous buffer of bytes (TypeError
        for anything else).
        """
        if type(batch_bytes) is not bytes:
            batch_bytes = batch_buffer(batch_bytes)
        if not durable:
            if origin != "client" or self._log_append_time:
                return self.append_batches([batch_bytes], origin=origin)[0]
            fast = self._fast
            if fast is not None:
                result: AppendResult | None = fast.append(batch_bytes)
                if result is not None:
                    if self._has_flush_policy:
                        self._count_for_flush([result], [batch_bytes])
                    return result
            return self._append_one(batch_bytes)
        # Noted before the append: a truncation from here on may have cut this batch, and
        # its waiter must not take later batches at the same offsets for its own.
        cuts = self._group_commit.cuts
        result = self.append(batch_bytes, origin=origin)
        self._group_commit.wait(result.last_offset + 1, self._flush, self.directory, cuts=cuts)
        return result

    def _append_one(self, buffer: Buffer) -> AppendResult:
        header = client_batch_header(buffer, self._max_batch_bytes, self._max_decompressed_bytes)
        size = len(buffer)
        last_delta, max_ts, pid = header[6], header[8], header[9]
        with self._lock:
            if self._closed or self._failure is not None:
                self._check_writable()
            segment = self._segments[-1]
            base = segment.next_offset
            last = base + last_delta
            # A roll goes to the request path.
            if roll_needed(
                segment.size,
                segment.first_batch_timestamp_ms,
                size,
                max_ts,
                last,
                segment.last_offset_limit,
                self._segment_bytes_limit,
                self._segment_ms,
            ):
                return self.append_batches([buffer])[0]
            after: WorkingState | None = None
            now_ms = 0
            if pid >= 0:
                now_ms = self._clock()
                self._producers.expire_due(now_ms)
                epoch, first_sequence = header[10], header[11]
                is_transactional = bool(header[5] & fmt.TRANSACTIONAL_MASK)
                last_sequence = (first_sequence + last_delta) % (fmt.INT32_MAX + 1)
                info = ProducerAppendInfo(self._producers, now_ms)
                duplicate = info.check(pid, epoch, first_sequence, last_sequence, is_transactional)
                if duplicate is not None:
                    # As _execute answers a duplicate (a reconfigure may have raced append's check).
                    append_time_ms = duplicate.max_timestamp_ms if self._log_append_time else -1
                    return _new_result(
                        AppendResult, (duplicate.first_offset, duplicate.last_offset, append_time_ms, True)
                    )
                meta = BatchMetadata(first_sequence, last_sequence, base, last, max_ts)
                try:
                    after = info.apply(pid, epoch, meta, False, is_transactional)
                except ProducerStateFullError:
                    return self.append_batches([buffer])[0]  # makes room from expired producers, or refuses
            try:
                segment.append_stamped(buffer, base, last, max_ts)
            except OSError as exc:
                self._failure = exc
                raise LogFailedError(f"write to {segment.path} failed: {exc}") from exc
            if after is not None:
                self._publish(after, None, segment)
            if self._has_flush_policy:
                self._maybe_flush(header[12])
            return _new_result(AppendResult, (base, last, -1, False))

    def append_records(
        self,
        records: Iterable[object],
        *,
        producer_id: int = fmt.NO_PRODUCER_ID,
        producer_epoch: int = fmt.NO_PRODUCER_EPOCH,
        base_sequence: int = fmt.NO_SEQUENCE,
        is_transactional: bool = False,
        timestamp_ms: int | None = None,
        compression: str | None = None,
    ) -> AppendResult:
        """Encode `records` as one batch and append it."""
        batch = encode_batch(
            records,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            is_transactional=is_transactional,
            timestamp_ms=self._clock() if timestamp_ms is None else timestamp_ms,
            compression=compression,
        )
        return self.append(batch)

    def write_txn_marker(
        self, producer_id: int, producer_epoch: int, *, commit: bool, coordinator_epoch: int
    ) -> AppendResult:
        """Append a COMMIT or ABORT marker for `producer_id`, closing its open transaction.

        Fenced (nothing written) when the producer epoch is older than the stored
        one (InvalidProducerEpochError) or the coordinator epoch is
        (TransactionCoordinatorFencedError). A marker for a producer with no open
        transaction is written but completes nothing. An aborted transaction goes
        to the transaction index of the segment holding its marker.
        """
        fmt.check_int("producer_id", producer_id, "i64", minimum=0)  # a marker closes some producer's txn
        fmt.check_int("producer_epoch", producer_epoch, "i16")
        fmt.check_int("coordinator_epoch", coordinator_epoch, "i32")
        with self._lock:
            self._check_writable()
            now_ms = self._clock()
            info = ProducerAppendInfo(self._producers, now_ms)
            info.check_marker(producer_id, producer_epoch, coordinator_epoch)
            base = self.log_end_offset
            if base > fmt.MAX_OFFSET:
                raise InvalidRecordError(
                    f"{self.directory} is full: its log end {base} is the largest offset"
                )
            data = encode_txn_marker(
                producer_id,
                producer_epoch,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
                timestamp_ms=now_ms,
                base_offset=base,
            )
            marker = TxnMarker(commit, coordinator_epoch)
            after, completed = info.apply_marker(producer_id, producer_epoch, base, now_ms, marker)
            planned = PlannedBatch(RecordBatch(data), base, base, now_ms, False, after, completed=completed)
            return self._execute([planned])[0]

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, or the log end if none is open."""
        with self._lock:
            return self._transactions.last_stable_offset(self.log_end_offset)

    def open_transactions(self) -> dict[int, int]:
        """Each producer with a transaction open here, and that transaction's first offset."""
        with self._lock:
            self._check_open()
            return self._producers.open_transactions()

    def append_batches(self, batches: Sequence[Buffer], *, origin: Origin = "client") -> list[AppendResult]:
        """Append many batches with as few write() calls as the segments allow.

        Every batch is checked first; if any is refused, nothing is written. A
        duplicate (a retry of one of its producer's last 5 batches) is not written
        and comes back with its original offsets and `duplicate=True`.
        """
        if origin not in ("client", "replication"):
            raise ValueError(f"origin is 'client' or 'replication', got {origin!r}")
        fast = self._fast
        if fast is not None and origin == "client":
            results: list[AppendResult] | None = fast.append_batches(batches)
            if results is not None:
                if self._has_flush_policy:
                    self._count_for_flush(results, batches)
                return results
        views = [
            validate_batch(buffer, origin, self._max_batch_bytes, self._max_decompressed_bytes)
            for buffer in batches
        ]
        with self._lock:
            self._check_writable()
            now_ms = self._clock()
            self._producers.expire_due(now_ms)
            try:
                plan = self._plan(views, origin, now_ms)
            except ProducerStateFullError:
                # A full ring: make room from expired producers once, then refuse.
                if not self._producers.make_room(now_ms):
                    raise
                plan = self._plan(views, origin, now_ms)
            results = self._execute(plan)
            if self._has_flush_policy:
                self._maybe_flush(sum(p.batch.records_count for p in plan if not p.duplicate))
            return results

    def _plan(self, views: list[RecordBatch], origin: Origin, now_ms: int) -> list[PlannedBatch]:
        """Offsets and producer checks for a request, with no I/O and no state change."""
        append_time_ms = now_ms if self.config.timestamp_type == "LogAppendTime" else None
        info = ProducerAppendInfo(self._producers, now_ms)
        plan: list[PlannedBatch] = []
        next_offset = self.log_end_offset
        for batch in views:
            pid = batch.producer_id
            max_ts = batch.max_timestamp if append_time_ms is None else append_time_ms
            if origin == "client" and pid >= 0:
                duplicate = info.check(
                    pid,
                    batch.producer_epoch,
                    batch.base_sequence,
                    batch.last_sequence,
                    batch.is_transactional,
                )
                if duplicate is not None:
                    # The original's timestamp: on LogAppendTime, when it was appended (Kafka's answer).
                    original_ts = duplicate.max_timestamp_ms
                    plan.append(
                        PlannedBatch(batch, duplicate.first_offset, duplicate.last_offset, original_ts, True)
                    )
                    continue
            if origin == "replication":
                # A follower keeps its leader's offsets; gaps (compaction) are legal.
                base = batch.base_offset
                if base < next_offset:
                    raise InvalidRecordError(
                        f"replicated batch at offset {base} is below the log end {next_offset}"
                    )
            else:
                base = next_offset
            last = base + batch.last_offset_delta
            if last > fmt.MAX_OFFSET:
                raise InvalidRecordError(
                    f"batch at offset {base} would take offsets up to {last}, past the largest an "
                    f"i64 log end allows ({fmt.MAX_OFFSET})"
                )
            after, completed = None, None
            marker = decode_txn_marker(batch) if batch.is_control and pid >= 0 else None
            if marker is not None:
                # A leader's transaction marker (clients cannot send control batches).
                after, completed = info.apply_marker(pid, batch.producer_epoch, base, max_ts, marker)
            elif batch.is_control:
                pass  # an empty control batch (compaction left it) or another control type: no state
            elif pid >= 0:
                meta = BatchMetadata(batch.base_sequence, batch.last_sequence, base, last, max_ts)
                after = info.apply(pid, batch.producer_epoch, meta, batch.is_control, batch.is_transactional)
            plan.append(
                PlannedBatch(batch, base, last, max_ts, False, after, origin == "replication", completed)
            )
            next_offset = last + 1
        return plan

    def _execute(self, plan: list[PlannedBatch]) -> list[AppendResult]:
        append_time = self.config.timestamp_type == "LogAppendTime"
        if self._client_only and any(p.replicated and not p.duplicate for p in plan):
            # Durable before a leader's batch is written: recovery and reads must not reject
            # its offsets or leader epoch later. Here, not in _plan: a refused request
            # changes nothing on disk.
            self._commit_metadata(write_offsets, {CLIENT_ONLY_KEY: 0})
            self._client_only = False
        results: list[AppendResult] = []
        group: list[PlannedBatch] = []
        # The active segment as it will be once the pending group is written.
        segment_bytes = self.active_segment.size
        first_timestamp_ms = self.active_segment.first_batch_timestamp_ms
        for p in plan:
            if p.duplicate:
                results.append(AppendResult(p.base, p.last, p.max_ts if append_time else -1, True))
                continue
            active = self.active_segment
            if roll_needed(
                segment_bytes,
                first_timestamp_ms,
                p.batch.size,
                p.max_ts,
                p.last,
                active.last_offset_limit,
                self._segment_bytes_limit,
                self._segment_ms,
            ):
                self._write_group(group)
                group = []
                self._roll(p.base)
                segment_bytes, first_timestamp_ms = 0, None
            group.append(p)
            segment_bytes += p.batch.size
            if first_timestamp_ms is None:
                first_timestamp_ms = p.max_ts
            results.append(AppendResult(p.base, p.last, p.max_ts if append_time else -1, False))
        self._write_group(group)
        return results

    def _write_group(self, group: list[PlannedBatch]) -> None:
        """Write the group's bytes, then (only then) apply it to producer state."""
        if not group:
            return
        buffers: list[Buffer] = []
        for p in group:
            buffers.extend(stamped_buffers(p, self._log_append_time))
        metas = [BatchMeta(p.last, p.max_ts, p.batch.size) for p in group]
        try:
            self.active_segment.append(buffers, metas)
        except OSError as exc:
            self._failure = exc
            raise LogFailedError(f"write to {self.active_segment.path} failed: {exc}") from exc
        for p in group:
            if p.producer_after is not None:
                self._publish(p.producer_after, p.completed, self.active_segment)

    def _publish(self, after: WorkingState, completed: CompletedTxn | None, segment: LogSegment) -> None:
        """A producer's new state, once its batch or marker is in `segment`: both append paths."""
        self._producers.put(after)
        try:
            self._transactions.track(after, completed, segment)
        except OSError as exc:
            # The marker is written but its index entry is not: fail closed. The next
            # open validates this segment and rebuilds its transaction index.
            self._failure = exc
            raise LogFailedError(f"transaction index write in {self.directory} failed: {exc}") from exc

    # -- rolling and durability --------------------------------------------------------
    def roll(self) -> LogSegment:
        """Start a new active segment at the log end (no-op on an empty active segment)."""
        with self._lock:
            self._check_writable()
            if self.active_segment.size == 0:
                return self.active_segment
            return self._roll(self.log_end_offset)

    def _roll(self, base_offset: int) -> LogSegment:
        old = self.active_segment
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
        except BaseException as exc:
            if segment is not None:
                try:
                    segment.close(durable=False)  # the half-done roll's new segment: reopen finds it
                except Exception as close_error:
                    exc.add_note(f"closing {segment.path} after the failed roll also failed: {close_error}")
            if not isinstance(exc, (OSError, CorruptMetadataError)):
                raise  # named already (a failed commit), or not ours to name
            self._failure = exc
            raise LogFailedError(f"rolling {old.path} failed: {exc}") from exc
        self._group_commit.mark_durable(base_offset)
        self._segments.append(segment)
        self._base_offsets.append(base_offset)
        self._watch_index_maps([segment])
        self._refresh_fast()
        return segment

    def _watch_index_maps(self, segments: Sequence[LogSegment]) -> None:
        for segment in segments:
            segment.on_indexes_mapped = self._mapped_sealed.add

    def _unmap_cold_indexes(self, keep: LogSegment | None = None) -> None:
        """Unmap the sealed segments' indexes an operation mapped, but `keep`'s. Under the
        log's lock, at the end of an operation: nothing is using them."""
        for segment in [s for s in self._mapped_sealed if s is not keep]:
            segment.unmap_sealed_indexes()
            self._mapped_sealed.discard(segment)

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
        retention_ms when its newest timestamp is; past retention_bytes while the log
        stays at least that large without it (Kafka's rules).
        """
        if now_ms is not None:
            fmt.check_int("now_ms", now_ms, "i64")
        with self._lock:
            self._check_writable()
            now_ms = self._clock() if now_ms is None else now_ms
            retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
            excess_bytes = self.size_bytes - retention_bytes if retention_bytes is not None else 0
            expired = 0
            for segment in self._segments[:-1]:
                too_old = retention_ms is not None and segment.newest_timestamp_ms() <= now_ms - retention_ms
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
        self._drop_fast()
        for segment in self._segments:
            segment.close(durable=False)
        # The closed segments stay in place until the new ones are loaded: a reader of
        # log_end_offset (it takes no lock) sees the old end, never an empty log.
        try:
            loaded = LogLoader(
                self._fs, self.directory, self.config, self._store, clean=False, now_ms=self._clock()
            ).load()
        except BaseException:
            self._segments, self._base_offsets = [], []  # closed: nothing may be read from them
            raise
        self._segments = loaded.segments
        self._base_offsets = [segment.base_offset for segment in self._segments]
        self._mapped_sealed.clear()  # the old segments are closed
        self._watch_index_maps(self._segments)
        self._producers = loaded.producers
        self._transactions = OpenTransactions(self._producers.open_transactions())
        self._client_only = loaded.client_only
        self._log_start_offset = loaded.log_start_offset
        self.recovery_point = loaded.recovery_point
        self._group_commit.mark_durable(loaded.recovery_point)
        self._refresh_fast()

    def _set_recovery_point(self, offset: int, segment_base: int, position: int) -> None:
        # One durable LMDB commit; only ever called after what it covers was fsynced.
        # Its own lock: a flush commits it outside the append lock, and the point
        # must never move back (a roll may have moved it further meanwhile).
        with self._recovery_point_lock:
            # Equal is written: a roll keeps the offset but moves the point to the new segment.
            if offset >= self.recovery_point:
                self._commit_metadata(write_recovery_point, RecoveryPoint(offset, segment_base, position))
                self.recovery_point = offset

    def _commit_metadata(self, write: Callable[[MetadataStore, T], None], value: T) -> None:
        """`write(store, value)`, failing the log closed if the store cannot commit (a full disk)."""
        try:
            write(self._store, value)
        except (OSError, CorruptMetadataError) as exc:
            # The data is safe, but no later point could be committed either: as after a
            # failed fsync, nothing more is accepted until a reopen recovers.
            self._failure = exc
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

    def _flush(self) -> None:
        """fsync every segment with unflushed bytes, then move the recovery point.

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
                    self._failure = exc
                    raise LogFailedError(f"fsync of {segment.path} failed: {exc}") from exc
            if end > self.recovery_point:
                try:
                    # Outside the append lock: appenders go on during the store's commit too.
                    self._set_recovery_point(end, active.base_offset, active_size)
                except (OSError, CorruptMetadataError) as exc:
                    self._failure = exc  # fail closed, as for a failed fsync (a full disk, say)
                    raise LogFailedError(f"recovery point commit in {self.directory} failed: {exc}") from exc
            self._group_commit.mark_durable(end)
        with self._lock:
            self._unflushed_messages -= flushed_messages
            self._last_flush_ms = self._clock()

    def close(self) -> None:
        """Flush, snapshot at the log end and leave the clean-shutdown marker.

        Every resource is released even when a step fails, so a failed log can be
        reopened. A log that failed earlier, or could not be flushed now, closes without
        the marker and raises LogFailedError (what it held may not be durable); the next
        open recovers it.
        """
        # A group-commit leader fsyncs outside the append lock: it finishes first.
        if not self._group_commit.begin_close():
            return
        try:
            self._close()
        finally:
            self._group_commit.end_close()

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop_fast()
            errors: list[BaseException] = []
            try:
                clean = False
                if self._failure is not None:
                    # Nothing is flushed: the caller must not take the close for durability.
                    errors.append(self._failure)
                else:
                    try:
                        self._flush()
                        end = self.log_end_offset
                        snapshots.write_snapshot(self._fs, self.directory, end, self._producers.live_rows())
                        self._forget_retirements()
                        clean = True
                    except (OSError, OncelogError) as exc:
                        errors.append(exc)
                for segment in self._segments:
                    try:
                        segment.close(durable=clean)
                    except OSError as exc:
                        errors.append(exc)
                        clean = False
                if clean:
                    try:
                        self._write_clean_marker()
                    except OSError as exc:
                        errors.append(exc)
            finally:
                # Whatever failed above (a crash, a bug), the directory is let go of.
                try:
                    self._store.close()
                finally:
                    self._dir_lock.release()
            if errors:
                raise LogFailedError(
                    f"closing {self.directory} without a flush: {errors[0]}; the next open recovers it"
                ) from errors[0]

    def _write_clean_marker(self) -> None:
        write_clean_marker(self._fs, self.directory, self._store_copy())

    def _store_copy(self) -> StoreCopy | None:
        """The store as its last commit left it, for the marker (None: the next open reads it)."""
        store = self._store
        if not isinstance(store, PartitionStore):
            return None
        store.close()  # its writer first: the version is read from the files at rest
        return store.copy_if_unchanged()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self.directory} is closed")
        if not self._segments:
            raise self._unusable()

    def _raise_if_failed(self) -> None:
        """After taking the fsync lock: an fsync that failed meanwhile stops every other one."""
        if self._failure is not None:
            raise LogFailedError(f"{self.directory} failed earlier: {self._failure}")

    def _unusable(self) -> OncelogError:
        """What a call on a log with no segments (a reload failed) or a closed one raises."""
        if self._closed:
            return LogClosedError(f"{self.directory} is closed")
        return LogFailedError(f"{self.directory} failed and must be reopened: {self._failure}")

    @contextlib.contextmanager
    def _failing_closed(self, what: str) -> Iterator[None]:
        """Any failure inside marks the log failed: appends are refused until it is reopened.

        A named one (an I/O error, corruption found by a reload) becomes LogFailedError;
        anything else (a bug, a simulated crash) is recorded and re-raised as it is.
        """
        try:
            yield
        except (OSError, OncelogError) as exc:
            self._failure = exc
            raise LogFailedError(f"{what} failed: {exc}") from exc
        except BaseException as exc:
            self._failure = exc
            raise

    def _check_writable(self) -> None:
        self._check_open()
        if self._failure is not None:
            raise LogFailedError(f"{self.directory} refuses appends until reopened: {self._failure}")

    # -- reads -----------------------------------------------------------------------
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
                stable = self._transactions.last_stable_offset(self.log_end_offset)
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

    def __repr__(self) -> str:
        return f"Log({self.directory}, start={self.log_start_offset}, end={self.log_end_offset})"


def roll_needed(
    segment_bytes: int,
    first_timestamp_ms: int | None,
    incoming_bytes: int,
    max_timestamp_ms: int,
    last_offset: int,
    last_offset_limit: int,
    max_segment_bytes: int,
    segment_ms: int,
) -> bool:
    """Kafka's roll rules: must a segment of `segment_bytes` roll before taking this batch?

    Both append paths call it. `last_offset_limit` is the segment's: past it the
    relative offsets leave an index entry's i32, the indexes are full, or the log
    end would pass the largest i64.
    """
    if last_offset > last_offset_limit:
        return True  # even an empty segment: a leader's batch far ahead needs one of its own
    if segment_bytes == 0:
        return False  # an empty segment takes any batch, however large
    if segment_bytes + incoming_bytes > max_segment_bytes:
        return True
    # segment_ms counts from the first batch's timestamp, so a restart does not reset it.
    return first_timestamp_ms is not None and max_timestamp_ms - first_timestamp_ms > segment_ms
