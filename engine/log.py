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

import dataclasses
import os
from collections.abc import Iterator

from oncelog import compiled_append, threads
from oncelog.clock import Clock, MonotonicClock, engine_clock
from oncelog.config import LogConfig
from oncelog.errors import (
    LogFailedError,
    OncelogError,
)
from oncelog.group_commit import GroupCommit
from oncelog.log_appends import LogAppends, roll_needed
from oncelog.log_cleaner import LogCleaning
from oncelog.log_durability import LogDurability
from oncelog.log_lifecycle import LogLifecycle
from oncelog.log_reads import LogReads
from oncelog.producer_state import ProducerStateEntry
from oncelog.recovery.loader import LoadedLog, LogLoader, RecoveryReport
from oncelog.segments import format as fmt
from oncelog.segments.segment import LogSegment
from oncelog.storage import snapshot as snapshots
from oncelog.storage.checkpoint import (
    RETIRED_PREFIX,
    write_offsets,
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
from oncelog.validation import stored_codec

__all__ = ["LOCK_FILE", "METADATA_DIR", "Log", "roll_needed"]

LOCK_FILE = LEGACY_LOCK_FILE  # where a log outside a LogManager root keeps its lock
METADATA_DIR = "meta.lmdb"


class Log(LogAppends, LogCleaning, LogDurability, LogLifecycle, LogReads):
    """One partition directory: open and close here, each other concern in its own module
    (appends, cleaning, durability, lifecycle, reads; see oncelog.log_state)."""

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
        self._take_producers(loaded)
        self._store = store
        self._dir_lock = dir_lock
        self.recovery_point = loaded.recovery_point
        self._client_only = loaded.client_only
        self._log_start_offset = loaded.log_start_offset
        # What opening read and did: clean or not, bytes scanned, tail cut.
        self.recovery_report: RecoveryReport = loaded.report
        self._lock = threads.rlock()
        self._closed = False
        self._compiled_appender: compiled_append.Appender | None = None
        self._client_appender: compiled_append.Appender | None = None
        self._bind_pending = False
        # Set by the first failed write or fsync; appends are refused until reopen.
        self._failure: BaseException | None = None
        self._unflushed_messages = 0
        self._last_flush_ms = clock()
        self._has_flush_policy = config.flush_messages is not None or config.flush_ms is not None
        self._log_append_time = config.timestamp_type == "LogAppendTime"
        self._requires_keys = config.compacted  # a compacted log refuses records without a key
        self._stored_codec = stored_codec(config.compression_type)
        self._segment_bytes_limit = config.segment_bytes
        self._max_batch_bytes = config.max_batch_bytes
        self._max_decompressed_bytes = config.max_decompressed_batch_bytes
        self._segment_ms = config.segment_ms
        self._group_commit = GroupCommit(loaded.recovery_point)
        # The three locks' order and the generation rule: oncelog.log_state.
        self._fsync_lock = threads.lock()
        self._recovery_point_lock = threads.lock()
        self._generation = 0
        self._truncations = 0  # (oncelog.log_cleaner)
        self._cleaning_pass = threads.lock()
        # The last flush's fsynced end and its generation, and when the recovery point was
        # last committed: a flush commits it only every recovery_point_interval_ms.
        self._fsynced_point = (loaded.recovery_point, 0, 0, -1)  # (generation -1: none yet)
        self._point_committed_ms = clock()
        self._retirements_recorded = False  # retired-producer records in the store (the loader clears them)
        # The compiled append (oncelog.compiled_append), bound to the active segment and the
        # producer table at the first append after _bind_compiled (oncelog.log_appends).
        self._compiled = compiled_append.enabled()
        self._bind_compiled()

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
        defer_producer_state: bool = False,
    ) -> Log:
        """Open the partition directory at `path`, creating it if missing.

        `clock` (milliseconds; the wall clock by default) is the engine's time: when
        producers were last appended and when they expire, LogAppendTime stamps,
        flush_ms and retention. The Log never lets it go backwards (MonotonicClock).

        `dir_lock` is the directory's lock (`log_dirs.lock_log_dir`) for a caller that
        took it itself: the Log takes it over (releases it at close, or here if opening
        fails). None: take it here (LogDirLockedError if another Log holds it).

        `clean_shutdown` is for a caller that took the clean-shutdown marker itself
        (`take_clean_marker`, holding the lock) and made that durable, or makes it so
        meanwhile (LogManager locks every partition, takes every marker, then syncs the
        filesystem once while the logs load; `CleanMarker.made_durable`): what it took
        (the marker, which may carry a copy of the store), or whether one was there.
        None: take it here.

        `defer_producer_state`: after a clean close, producer state is read from its
        snapshot at the first operation that needs it (an append, a read, a producer
        query) instead of here: for a caller opening many partitions of which most stay
        idle (a LogManager). A snapshot found unreadable then is handled as an open would.
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
            loaded = LogLoader(
                fs,
                directory,
                config,
                store,
                clean=clean,
                now_ms=log_clock(),
                scan_tail=compiled_append.tail_scanner(compiled_append.enabled()),
                marker_durable=marker.made_durable if isinstance(marker, CleanMarker) else None,
                defer_producers=defer_producer_state,
            ).load()
        except BaseException as exc:
            if store is not None:
                store.close()
            dir_lock.release()
            if unnamed_os_error(exc):
                # Nothing is served; after an I/O error (LogFailedError) reopening retries recovery.
                raise opening_failed(exc, directory) from exc
            raise
        return cls(directory, config, fs, log_clock, loaded, store, dir_lock)

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
            self._requires_keys = config.compacted
            self._stored_codec = stored_codec(config.compression_type)
            self._segment_bytes_limit = config.segment_bytes
            self._max_batch_bytes = config.max_batch_bytes
            self._max_decompressed_bytes = config.max_decompressed_batch_bytes
            self._segment_ms = config.segment_ms
            self._bind_compiled()

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
            if now_ms is None and self._deferred_snapshot is not None:
                return 0  # not read yet: reading it expires whatever is due then
            now = self._clock()
            at_ms = now if now_ms is None else max(now_ms, now)
            producers = self._producers
            return self._changing_producers(lambda ms: producers.expire(ms, exhaustive=exhaustive), at_ms)

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
            producers = self._producers
            return self._changing_producers(lambda _: producers.retire(gone), 0)

    def producers(self) -> Iterator[ProducerStateEntry]:
        """Every producer's state, oldest first (a snapshot taken under the lock)."""
        with self._lock:
            self._check_open()
            entries = list(self._producers.entries())
        return iter(entries)

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, or the log end if none is open."""
        with self._lock:
            return self._transactions.last_stable_offset(self.log_end_offset, self._log_start_offset)

    def open_transactions(self) -> dict[int, int]:
        """Each producer with a transaction open here, and that transaction's first offset."""
        with self._lock:
            self._check_open()
            return self._producers.open_transactions()

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
            # Cut short before it closed anything (a Ctrl-C on its way in): a later close()
            # must be able to try again, not find it closing and return with the log open.
            self._group_commit.end_close(closed=self._closed)

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            self._unbind_compiled()
            errors: list[BaseException] = []
            try:
                clean = False
                if self._failure is not None:
                    # Nothing is flushed: the caller must not take the close for durability.
                    errors.append(self._failure)
                else:
                    try:
                        # The point at the end too: the next unclean open tells corruption
                        # from a torn tail by it.
                        self._flush(commit_point=True)
                        end = self.log_end_offset
                        if self._deferred_snapshot is None:  # (else the one at the end holds them)
                            rows = self._producers.live_rows()
                            snapshots.write_snapshot(self._fs, self.directory, end, rows)
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

    def __repr__(self) -> str:
        return f"Log({self.directory}, start={self.log_start_offset}, end={self.log_end_offset})"
