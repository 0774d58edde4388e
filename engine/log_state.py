"""What every concern of a Log shares: its fields, its locks and the rules binding them.

`Log` (oncelog.log) is one class put together from one module per concern, as Kafka
splits its log: appends (`log_appends`: the Python route and the compiled binding),
durability (`log_durability`: flush, group commit, rolls, the recovery point),
lifecycle (`log_lifecycle`: truncation, retention, delete_records, reloads) and reads
(`log_reads`). Each concern's class derives from `LogState`, which declares the fields
they share and the methods one concern calls in another, so that each type-checks on
its own.

Lock order. Take them in this order, never the reverse:
1. `_lock`, the append lock (a cooperative RLock, oncelog.threads): appends, reads,
   and every change of the segments or the producer state.
2. `_fsync_lock`: held while a flush fsyncs and commits the recovery point (outside
   the append lock, so that appends go on meanwhile), and by everything that closes
   segment files or moves the point back (rolls, truncation, reloads, deleting
   segments): a flush never fsyncs a closed file and never commits a point past a cut.
   Serialised fsyncs also record a failed one before any other runs (fsyncgate).
3. `_recovery_point_lock`: the recovery point's commit, which never moves it back.

The generation rule. `_generation` is bumped, under the fsync lock, whenever segments
are cut, deleted or reloaded. A flush captures it, with what it will fsync, under the
append lock; holding the fsync lock, it commits nothing if the generation moved (its
group-commit waiters flush again). So no recovery point is committed past a cut.

Failure. `_fail(exc)` records the first failed write, fsync or commit: appends are
refused until the log is reopened, and the compiled appender is unbound.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from oncelog import compiled_append, threads
from oncelog.append_plan import PlannedBatch
from oncelog.clock import MonotonicClock
from oncelog.config import LogConfig
from oncelog.errors import (
    LogClosedError,
    LogFailedError,
    OncelogError,
)
from oncelog.group_commit import GroupCommit
from oncelog.producer_state import (
    ProducerStateManager,
)
from oncelog.recovery.loader import LoadedLog, RecoveryReport, load_deferred_producers
from oncelog.results import AppendResult
from oncelog.segments.format import Buffer
from oncelog.segments.segment import LogSegment
from oncelog.storage.fs import DirLock, FileSystem, MetadataStore
from oncelog.transactions import OpenTransactions
from oncelog.validation import Origin

T = TypeVar("T")


class LogState:
    """The fields every concern of a Log reads and writes (set by Log.__init__)."""

    directory: str
    config: LogConfig
    recovery_point: int  # below it everything is fsynced (its durable copy is in the store)
    recovery_report: RecoveryReport
    _fs: FileSystem
    _clock: MonotonicClock
    _store: MetadataStore
    _dir_lock: DirLock
    _segments: list[LogSegment]
    _base_offsets: list[int]
    _mapped_sealed: set[LogSegment]  # sealed segments whose indexes an operation mapped
    _producer_table: ProducerStateManager  # through _producers: it may not be loaded yet
    _open_txns: OpenTransactions  # through _transactions, likewise
    _deferred_snapshot: int | None  # a clean open left producer state in this snapshot
    _client_only: bool
    _log_start_offset: int
    _lock: threads.Lock  # 1st in the lock order (see the module docstring)
    _fsync_lock: threads.Lock  # 2nd
    _recovery_point_lock: threads.Lock  # 3rd
    _generation: int  # the generation rule (see the module docstring)
    _fsynced_point: tuple[int, int, int, int]  # the last flush's end, segment base, position, generation
    _point_committed_ms: int  # when the recovery point was last committed (engine clock)
    _group_commit: GroupCommit
    _closed: bool
    _failure: BaseException | None  # set by _fail
    _compiled: bool  # whether this log may take the compiled append at all
    _compiled_appender: compiled_append.Appender | None  # bound by _bind_compiled
    _client_appender: compiled_append.Appender | None  # what append() calls first (_bind_compiled)
    _bind_pending: bool  # the next append binds the compiled appender (_bind_compiled)
    _unflushed_messages: int
    _last_flush_ms: int
    _has_flush_policy: bool
    _log_append_time: bool
    _stored_codec: int | None  # client batches are stored in this codec (None: as sent)
    _requires_keys: bool  # a compacted log: client records without a key are refused
    _truncations: int  # truncate_to calls: a cleaning pass planned before one stops
    _cleaning_pass: threads.Lock  # held by a cleaning pass from start to end (log_cleaner)
    _segment_bytes_limit: int
    _segment_ms: int
    _max_batch_bytes: int
    _max_decompressed_bytes: int
    _retirements_recorded: bool

    if TYPE_CHECKING:
        # -- called across concerns (each is defined by the concern named) ------------------
        def _bind_compiled(self) -> None: ...  # log_appends

        def _unbind_compiled(self) -> None: ...  # log_appends

        def _roll(self, base_offset: int) -> LogSegment: ...  # log_durability

        def _flush(self) -> None: ...  # log_durability

        def flush(self) -> None: ...  # log_durability

        def _maybe_flush(self, appended_messages: int) -> None: ...  # log_durability

        def _count_for_flush(self, results: Sequence[AppendResult], batches: Sequence[Buffer]) -> None: ...

        def _commit_metadata(self, write: Callable[[MetadataStore, T], None], value: T) -> None: ...

        def _forget_retirements(self) -> None: ...  # log_durability

        def _reload(self) -> None: ...  # log_lifecycle

        def _watch_index_maps(self, segments: Sequence[LogSegment]) -> None: ...  # log_reads

        def _unmap_cold_indexes(self, keep: LogSegment | None = None) -> None: ...  # log_reads

        def append_batches(
            self, batches: Sequence[Buffer], *, origin: Origin = "client"
        ) -> list[AppendResult]: ...

        def _execute(self, plan: list[PlannedBatch]) -> list[AppendResult]: ...  # log_appends

    # -- shared ----------------------------------------------------------------------------
    @property
    def _producers(self) -> ProducerStateManager:
        if self._deferred_snapshot is not None:
            self._load_deferred_producers()
        return self._producer_table

    @property
    def _transactions(self) -> OpenTransactions:
        if self._deferred_snapshot is not None:
            self._load_deferred_producers()
        return self._open_txns

    def _take_producers(self, loaded: LoadedLog) -> None:
        """The producer state a load restored, or the snapshot it left to read at first use."""
        self._deferred_snapshot = loaded.deferred_snapshot
        if loaded.producers is not None:
            self._use_producers(loaded.producers)
        assert (loaded.producers is None) == (loaded.deferred_snapshot is not None), loaded.deferred_snapshot

    def _use_producers(self, producers: ProducerStateManager) -> None:
        self._producer_table = producers
        self._open_txns = OpenTransactions(producers.open_transactions())

    def _load_deferred_producers(self) -> None:
        """Read the producer state a clean open left in its snapshot (LogManager opens: most
        partitions stay idle), before anything reads or changes it. An error leaves it
        unread, for the next use to try again."""
        with self._lock:
            offset = self._deferred_snapshot
            if offset is None:
                return  # another thread read it meanwhile
            producers = load_deferred_producers(
                self._fs, self.directory, self.config, self._store, self._segments, offset, self._clock()
            )
            self._use_producers(producers)
            self._deferred_snapshot = None

    def _fail(self, exc: BaseException) -> None:
        """Record a failed write, fsync or commit: appends are refused until reopen."""
        self._failure = exc
        self._unbind_compiled()  # its calls find it closed and take the Python route, which refuses

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
            self._fail(exc)
            raise LogFailedError(f"{what} failed: {exc}") from exc
        except BaseException as exc:
            self._fail(exc)
            raise

    def _check_writable(self) -> None:
        self._check_open()
        if self._failure is not None:
            raise LogFailedError(f"{self.directory} refuses appends until reopened: {self._failure}")
