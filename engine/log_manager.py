"""LogManager: the many topic-partitions of one root, as a broker's storage layer.

A root holds `<topic>-<partition>/` partition directories (engine/layout.py), one
root lock (`.lock`: a second manager on the root fails with LogDirLockedError), a
metadata store (`meta.lmdb`: the root's config, per-topic config overrides and pending
deletes), the root's ProducerIdManager (`producer_ids.lmdb`) and its id (`root.id`,
engine/root_identity.py: how a process elsewhere knows it opened this very root).

Other processes (Spark tasks) open the root's partitions directly with `Log.open`
while no manager holds them, with the config `read_topic_config` reads, and lease PIDs
with `ProducerIdManager.open` for a few milliseconds at a time. So the manager holds
every partition's lock from before it reads the partition's clean-shutdown marker
until the partition's files are closed (or deleted), and waits a bounded time for the
PID manager's lock.

Opening recovers every partition with its own loader (tail-only recovery): the unclean
ones in a bounded thread pool, which overlaps the fsyncs that dominate their recovery,
and the clean ones (Python throughout, which threads cannot overlap) in turn on one of
its threads. `recovery_summary` says what it read and did.

Long on purpose: one class per concept, as Kafka's LogManager; opening, per-topic
config, maintenance (retention, cleaning, checkpoints) and deletes share its locks.

Deleting a partition is made crash-safe with a durable intent, not a directory
rename: `delete/<topic>-<partition>` is committed before the log is closed and
cleared after the directory is gone, so a crash or a failed removal mid-delete is
finished (at the next open, or the next `log()` of the partition) instead of loading
a half-deleted log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgpack

from oncelog.config import LogConfig, OnCorruption
from oncelog.errors import (
    LockTimeoutError,
    LogDirLockedError,
    LogFailedError,
    OncelogError,
)
from oncelog.layout import TopicPartition, parse_partition_dir_name, validate_topic_partition
from oncelog.lock_wait import wait_while_locked
from oncelog.log import Log
from oncelog.log_cleaner_threads import BackgroundCleaner
from oncelog.partition_opening import (
    PartitionLock,
    close_partitions,
    collections_paused,
    open_partitions,
    release_after_failure,
)
from oncelog.producer_ids import ProducerIdManager
from oncelog.recovery.loader import RecoveryReport
from oncelog.recovery_progress import RecoveryProgress, RecoverySummary
from oncelog.root_config import (
    CONFIG_FIELDS,
    ROOT_LOCK_FILE,
    ROOT_METADATA_DIR,
    TOPIC_CONFIG_PREFIX,
    check_root_store,
    partitions_on_disk,
    read_overrides,
    root_store_missing,
    settle_root_config,
)

# Re-exported: processes that open a root's partitions without a manager read their config here.
from oncelog.root_config import read_root_config as read_root_config
from oncelog.root_config import read_topic_config as read_topic_config
from oncelog.root_identity import ensure_root_id
from oncelog.segment_cleaning import CleanStats
from oncelog.storage.clean_marker import CleanMarker, put_back_clean_marker, take_clean_marker
from oncelog.storage.fs import (
    DEFAULT_FS,
    DirLock,
    EverySync,
    FileSystem,
    LockTable,
    MetadataStore,
    PendingSync,
)
from oncelog.storage.log_dirs import (
    PARTITION_LOCKS_DIR,
    create_dir,
    lock_dir,
    lock_in_table,
    lock_log_dir,
    opening_failed,
    remove_log_dir,
    unnamed_os_error,
)
from oncelog.storage.metadata_values import committing

# Committed when an open creates the store (see check_root_store).
ROOT_CREATED_KEY = "root-created"
DELETE_INTENT_PREFIX = "delete/"
# Values a front end keeps with the root (`root_value`): the wire server's cluster id.
ROOT_VALUE_PREFIX = "root-value/"
# Room for a prefix and a 249-character topic name; LMDB keys are at most 511 bytes.
MAX_ROOT_VALUE_NAME = 400
# A Spark task holds the root's producer_ids.lock for the few milliseconds of one lease.
PRODUCER_IDS_LOCK_TIMEOUT_S = 10.0
# How long an open waits for partitions other processes hold (writers append for ms-s).
PARTITION_LOCK_TIMEOUT_S = 10.0
# Recovery is mostly waiting on fsync and file opens (both release the GIL), so a few
# threads per core overlap them; more only adds contention. Bounded either way.
MAX_RECOVERY_THREADS = 64

Clock = Callable[[], int]
logger = logging.getLogger(__name__)


class UnknownTopicOrPartitionError(OncelogError):
    """The topic-partition has no log under this root (and creating it was not asked for)."""


class PartitionRecoveryError(OncelogError):
    """One or more partitions could not be opened; the manager did not open.

    `failures` maps each failed partition to its error (CorruptLogError names the file
    and position). The partitions that did open were closed again.
    """

    def __init__(self, root: str, failures: Mapping[TopicPartition, BaseException]):
        self.failures = dict(failures)
        listed = "; ".join(f"{tp}: {type(exc).__name__}: {exc}" for tp, exc in sorted(failures.items()))
        super().__init__(f"{len(failures)} partition(s) under {root} failed to open: {listed}")


def default_recovery_threads() -> int:
    return min(MAX_RECOVERY_THREADS, 4 * (os.cpu_count() or 1))


def _open_producer_ids(root: str, fs: FileSystem, clock: Clock | None, timeout_s: float) -> ProducerIdManager:
    """The root's ProducerIdManager, waiting up to `timeout_s` for a lease in another process."""
    return wait_while_locked(
        f"the producer ids of {root}", lambda: ProducerIdManager.open(root, fs=fs, clock=clock), timeout_s
    )


class LogManager:
    def __init__(
        self,
        root: str,
        config: LogConfig,
        fs: FileSystem,
        clock: Clock | None,
        dir_lock: DirLock,
        lock_table: LockTable,
        store: MetadataStore,
        producer_ids: ProducerIdManager,
        recovery_threads: int,
    ):
        self.root = root
        self._real_root = os.path.realpath(root)
        self.config = config
        self.producer_ids = producer_ids
        self.recovery_threads = recovery_threads
        self.lock_timeout_s = PARTITION_LOCK_TIMEOUT_S
        self._fs = fs
        self._clock = clock
        self._dir_lock = dir_lock
        # Every partition's lock, through one descriptor (log_dirs: where locks live).
        self._lock_table = lock_table
        self._store = store
        self._logs: dict[TopicPartition, Log] = {}
        self._partition_locks: dict[TopicPartition, PartitionLock] = {}
        # Guards the partition map and the store; never held while a Log recovers.
        self._lock = threading.RLock()
        self._closed = False
        self._cleaner: BackgroundCleaner | None = None
        self.recovery_summary = RecoverySummary.empty(recovery_threads)

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        fs: FileSystem | None = None,
        clock: Clock | None = None,
        recovery_threads: int | None = None,
        progress: bool | None = None,
        on_corruption: OnCorruption | None = None,
        lock_timeout_s: float = PARTITION_LOCK_TIMEOUT_S,
        recreate_metadata: bool = False,
    ) -> LogManager:
        """Open (creating) the root and recover every partition under it.

        `config` is the default for every topic; `set_topic_config` overrides it per
        topic. It is persisted in the root (all but `on_corruption`) for the processes
        that open partitions without a manager (`read_topic_config`); None uses the
        persisted one (LogConfig() if none). `on_corruption` overrides it for this open
        only (`oncelog recover --truncate-corrupt`). `progress` shows a progress bar on
        stderr (default: when it is a terminal).

        The root lock fails at once (LogDirLockedError: another manager has the root);
        the root's PID manager lock is waited for up to PRODUCER_IDS_LOCK_TIMEOUT_S, and a
        partition another process holds (a Spark task appending) up to `lock_timeout_s`.

        A root whose metadata store is gone though a manager kept one there raises
        MetadataMissingError (see check_root_store) unless `recreate_metadata`, which
        accepts the loss and starts an empty store. A damaged store raises
        CorruptMetadataError; a root that is not a directory, LogDirectoryError.
        """
        directory = os.fspath(root)
        fs = fs or DEFAULT_FS
        threads = default_recovery_threads() if recovery_threads is None else recovery_threads
        if not 1 <= threads <= MAX_RECOVERY_THREADS:
            raise ValueError(f"recovery_threads must be 1..{MAX_RECOVERY_THREADS}, got {threads}")
        create_dir(fs, directory)
        lock_path = os.path.join(directory, ROOT_LOCK_FILE)
        had_lock_file = fs.exists(lock_path)
        dir_lock = lock_dir(fs, lock_path, f"{directory} is already open in another LogManager")
        lock_table: LockTable | None = None
        store: MetadataStore | None = None
        producer_ids: ProducerIdManager | None = None
        manager: LogManager | None = None
        try:
            # Before any partition is locked: from here on, openers lock through it.
            lock_table = fs.lock_table(os.path.join(directory, PARTITION_LOCKS_DIR), every_shard=True)
            store_path = os.path.join(directory, ROOT_METADATA_DIR)
            store_missing = root_store_missing(fs, store_path)
            if store_missing:
                check_root_store(fs, directory, had_lock_file=had_lock_file, recreate=recreate_metadata)
            store = fs.open_store(store_path)
            if store_missing:
                # Durable before any partition can be created: from here on the root's .lock
                # and partitions without a store mean a lost store (check_root_store).
                store.put({ROOT_CREATED_KEY: b""})
                # fsync(store dir): a power loss must not drop the store's data file while a
                # partition created next survives (it would read as a lost store).
                fs.fsync_dir(store_path)
            # Other processes (Spark tasks) check they opened this very root by its id.
            ensure_root_id(fs, directory)
            root_config = settle_root_config(store, config)
            if on_corruption is not None:
                root_config = dataclasses.replace(root_config, on_corruption=on_corruption)
            producer_ids = _open_producer_ids(directory, fs, clock, PRODUCER_IDS_LOCK_TIMEOUT_S)
            manager = cls(
                directory, root_config, fs, clock, dir_lock, lock_table, store, producer_ids, threads
            )
            manager.lock_timeout_s = lock_timeout_s
            manager._finish_pending_deletes()
            manager._recover_all(progress)
        except BaseException as exc:
            releases: list[Callable[[], object]] = []
            if manager is not None:  # interrupted after its partitions opened: close them
                releases.append(lambda: close_partitions(manager.recovery_threads, manager._logs))
            if producer_ids is not None:
                releases.append(producer_ids.close)
            if store is not None:
                releases.append(store.close)
            if lock_table is not None:
                releases.append(lock_table.close)
            releases.append(dir_lock.release)
            release_after_failure(exc, releases)
            if unnamed_os_error(exc):
                raise opening_failed(exc, directory) from exc
            raise
        return manager

    # -- partitions ----------------------------------------------------------------------
    def log(self, topic: str, partition: int, *, create: bool = True) -> Log:
        """The open log of `topic`-`partition`, created empty if missing and `create`."""
        tp = validate_topic_partition(topic, partition)
        with self._lock:
            self._check_open()
            log = self._logs.get(tp)
            if log is not None:
                return log
            if not create:
                raise UnknownTopicOrPartitionError(f"no partition {tp} under {self.root}")
            if self._store.get(DELETE_INTENT_PREFIX + str(tp)) is not None:
                # A delete that failed half way: finish it first, or the new log would be
                # loaded from what is left of the old one, and its acknowledged appends
                # deleted with it at the next open.
                self._remove_partition_dir(tp)
            try:
                lock = self._lock_partition(tp, create=True)
            except OSError as exc:  # a full disk, say; Log.open names its own errors the same way
                raise LogFailedError(f"creating {self._partition_path(tp)} failed: {exc}") from exc
            log = self._open_partition(tp, lock)
            try:
                # fsync(root): a power loss must not lose the new partition's directory
                # once appends to it may have been acknowledged.
                self._fs.fsync_dir(self.root)
            except BaseException as exc:
                log.close()
                if unnamed_os_error(exc):
                    raise LogFailedError(f"creating partition {tp} under {self.root} failed: {exc}") from exc
                raise
            self._logs[tp] = log
            self._partition_locks[tp] = lock
            return log

    def logs(self) -> dict[TopicPartition, Log]:
        """Every open partition's log, in topic-partition order."""
        with self._lock:
            self._check_open()
            return dict(sorted(self._logs.items()))

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self.logs())

    def delete_log(self, topic: str, partition: int) -> None:
        """Close the partition's log and delete its directory (crash-safe, see module doc).

        If removing the files fails, the error propagates with the partition already
        gone from `logs()`; the next `log()` of it, `delete_log` of it or open of the
        root finishes the delete.
        """
        tp = validate_topic_partition(topic, partition)
        intent = DELETE_INTENT_PREFIX + str(tp)
        with self._lock:
            self._check_open()
            log = self._logs.get(tp)
            if log is None:
                if self._store.get(intent) is None:
                    raise UnknownTopicOrPartitionError(f"no partition {tp} under {self.root}")
                self._remove_partition_dir(tp)  # a delete that failed half way
                return
            # A durable commit before the log lets go of anything: from here on a crash or a
            # failed removal finishes the delete, never loads a log with segments missing.
            with committing(self._store, f"recording the delete of {tp}"):
                self._store.put({intent: b""})
            del self._logs[tp]
            # The directory stays locked through the close until it is gone: a process
            # waiting for the lock must not open (and append to) a log being deleted.
            held = self._partition_locks.pop(tp).keep()
            try:
                # Its bytes are being deleted: a failure to flush them loses nothing, and
                # the Log releases everything else (but the lock kept above) regardless.
                with contextlib.suppress(Exception):
                    log.close()
                self._remove_partition_dir(tp, held)
            finally:
                if held is not None:
                    held.release()

    @property
    def fs(self) -> FileSystem:
        """The filesystem seam the root is opened through: for root-wide stores kept beside it."""
        return self._fs

    def root_value(self, name: str, initial: bytes) -> bytes:
        """The value stored under `name` in the root, storing `initial` durably if none is.

        For what must outlive a restart but is no partition's: a Kafka cluster id, say.
        """
        if not name or len(name) > MAX_ROOT_VALUE_NAME:
            raise ValueError(f"a root value name is 1..{MAX_ROOT_VALUE_NAME} characters, got {name!r}")
        key = ROOT_VALUE_PREFIX + name
        with self._lock:
            self._check_open()
            stored = self._store.get(key)
            if stored is not None:
                return stored
            self._store.put({key: initial})  # a durable commit: the value never changes once read
            return initial

    def set_root_values(self, changes: Mapping[str, bytes | None]) -> None:
        """Store (a value) or drop (None) root values by name, in one durable commit."""
        for name in changes:
            if not name or len(name) > MAX_ROOT_VALUE_NAME:
                raise ValueError(f"a root value name is 1..{MAX_ROOT_VALUE_NAME} characters, got {name!r}")
        with self._lock:
            self._check_open()
            with committing(self._store, f"storing root values {sorted(changes)}"):
                self._store.put({ROOT_VALUE_PREFIX + k: v for k, v in changes.items() if v is not None})
                self._store.delete([ROOT_VALUE_PREFIX + k for k, v in changes.items() if v is None])

    def root_values(self, prefix: str) -> dict[str, bytes]:
        """Every value `root_value` stored under a name starting with `prefix`, by name."""
        with self._lock:
            self._check_open()
            found: dict[str, bytes] = {}
            for key in self._store.keys(ROOT_VALUE_PREFIX + prefix):
                value = self._store.get(key)
                if value is not None:
                    found[key[len(ROOT_VALUE_PREFIX) :]] = value
            return found

    # -- per-topic config ------------------------------------------------------------------
    def topic_overrides(self, topic: str) -> dict[str, Any]:
        validate_topic_partition(topic, 0)
        return read_overrides(self._store, TOPIC_CONFIG_PREFIX + topic)

    def topic_config(self, topic: str) -> LogConfig:
        """The root's config with `topic`'s overrides applied."""
        return dataclasses.replace(self.config, **self.topic_overrides(topic))

    def set_topic_config(self, topic: str, **overrides: Any) -> LogConfig:
        """Durably override config fields for `topic`; its open logs follow at once.

        Fields in Log.FIELDS_APPLIED_AT_OPEN reach open logs when they are reopened.
        """
        with self._lock:
            return self._store_topic_config(topic, {**self.topic_overrides(topic), **overrides})

    def replace_topic_config(self, topic: str, overrides: Mapping[str, Any]) -> LogConfig:
        """Durably make `overrides` every override `topic` has, in one commit (Kafka's
        AlterConfigs, and a topic's creation with its configs)."""
        with self._lock:
            return self._store_topic_config(topic, dict(overrides))

    def reset_topic_config(self, topic: str, *names: str) -> LogConfig:
        """Drop `topic`'s overrides of `names` (all of them if none are named)."""
        with self._lock:
            kept = {k: v for k, v in self.topic_overrides(topic).items() if names and k not in names}
            return self._store_topic_config(topic, kept)

    def _store_topic_config(self, topic: str, overrides: dict[str, Any]) -> LogConfig:
        unknown = sorted(set(overrides) - CONFIG_FIELDS)
        if unknown:
            raise ValueError(f"unknown LogConfig field(s): {', '.join(unknown)}")
        self._check_open()
        validate_topic_partition(topic, 0)
        config = dataclasses.replace(self.config, **overrides)  # validates the values
        with committing(self._store, f"storing {topic}'s config"):
            if overrides:
                self._store.put({TOPIC_CONFIG_PREFIX + topic: msgpack.packb(overrides)})
            else:
                self._store.delete([TOPIC_CONFIG_PREFIX + topic])
        self._reconfigure_topic(topic, config)
        return config

    def _reconfigure_topic(self, topic: str, config: LogConfig) -> None:
        for tp, log in self._logs.items():
            if tp.topic == topic:
                log.reconfigure(config)

    # -- maintenance ---------------------------------------------------------------------
    def apply_retention(self, now_ms: int | None = None) -> int:  # how many segments it deleted
        return self._on_every_log(lambda log: log.apply_retention(now_ms))

    def _on_every_log(self, step: Callable[[Log], int]) -> int:
        """`step` on every partition, summed. Every one is tried; the first error is raised after."""
        total, first_error = 0, None
        for log in self.logs().values():
            try:
                total += step(log)
            except Exception as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return total

    def clean(self, now_ms: int | None = None) -> CleanStats:
        """One cleaning pass on every compacted partition now (Log.clean); the totals."""
        totals = CleanStats()

        def clean_one(log: Log) -> int:
            totals.add(log.clean(now_ms).stats)
            return 0

        self._on_every_log(clean_one)
        return totals

    def start_cleaner(self, **options: Any) -> BackgroundCleaner:
        """Start the background cleaner (oncelog.log_cleaner_threads; `options` are its
        threads, io_bytes_per_s, backoff_ms and key_map_bytes); close() stops it."""
        with self._lock:
            self._check_open()
            if self._cleaner is not None:
                raise ValueError(f"the cleaner of {self.root} is already running")
            self._cleaner = BackgroundCleaner(self.logs, **options)
            return self._cleaner

    def stop_cleaner(self) -> None:
        """Stop the background cleaner, if running (a pass ends at its next segment)."""
        with self._lock:
            cleaner, self._cleaner = self._cleaner, None
        if cleaner is not None:
            cleaner.stop()

    @property
    def cleaner(self) -> BackgroundCleaner | None:
        return self._cleaner

    def flush(self) -> None:
        for log in self.logs().values():
            log.flush()

    def checkpoint(self, *, due_only: bool = False) -> int:  # Log.checkpoint on each: how many moved
        return self._on_every_log(lambda log: log.checkpoint(due_only=due_only))

    def close(self) -> None:
        """Close every log (flush, snapshot, clean marker), the PID manager and the root lock."""
        self.stop_cleaner()  # first: a pass ends at its next segment, before the logs close
        with self._lock:
            if self._closed:
                return
            self._closed = True
            logs = dict(self._logs)
            self._logs.clear()
            self._partition_locks.clear()
        errors: dict[TopicPartition, BaseException] = {}
        try:
            errors = close_partitions(self.recovery_threads, logs)
        finally:
            try:
                self.producer_ids.close()
            finally:
                self._store.close()
                self._lock_table.close()
                self._dir_lock.release()
        if errors:
            raise next(iter(errors.values()))

    def __enter__(self) -> LogManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the LogManager of {self.root} is closed")

    def _partition_path(self, tp: TopicPartition) -> str:
        return os.path.join(self.root, str(tp))

    def _lock_partition(self, tp: TopicPartition, *, create: bool = False) -> PartitionLock:
        """The partition directory's lock, as Log.open takes it (LogDirLockedError if held)."""
        path = self._partition_path(tp)
        if create:
            create_dir(self._fs, path)
        return PartitionLock(self._lock_partition_dir(path, f"{path} is already open in another Log"))

    def _lock_partition_dir(self, path: str, held: str) -> DirLock:
        """Through the root's table, unless the directory really lives elsewhere (a symlink
        to another root's partition): then where that root's openers lock it."""
        # One lstat for the usual partition, not one per component of its path.
        real = (
            os.path.realpath(path)
            if os.path.islink(path)
            else os.path.join(self._real_root, os.path.basename(path))
        )
        if os.path.dirname(real) != self._real_root:
            return lock_log_dir(self._fs, path, held)
        return lock_in_table(self._fs, self._lock_table, real, held)

    def _open_partition(
        self,
        tp: TopicPartition,
        lock: PartitionLock,
        clean_shutdown: CleanMarker | bool | None = None,
        configs: dict[str, LogConfig] | None = None,
    ) -> Log:
        """The partition's Log, which takes `lock` over (and releases it if opening fails).

        `configs` keeps each topic's config for the next of its partitions (an open of
        the root: nothing changes them meanwhile), instead of a store read each."""
        config = None if configs is None else configs.get(tp.topic)
        if config is None:
            config = self.topic_config(tp.topic)
            if configs is not None:
                configs[tp.topic] = config
        path = self._partition_path(tp)
        return Log.open(
            path,
            config,
            fs=self._fs,
            clock=self._clock,
            clean_shutdown=clean_shutdown,
            dir_lock=lock,
            defer_producer_state=True,  # most of a root's partitions stay idle for a while
        )

    def _recover_all(self, progress: bool | None) -> None:
        partitions = partitions_on_disk(self._fs, self.root)
        started = time.perf_counter()
        locks: dict[TopicPartition, PartitionLock] = {}
        handed_over: set[TopicPartition] = set()  # locks a Log.open owns (and releases)
        opened: dict[TopicPartition, Log] = {}
        failures: dict[TopicPartition, BaseException] = {}
        taken: dict[TopicPartition, CleanMarker | None] = {}  # the markers this open moved aside
        syncing: PendingSync | None = None
        try:
            # Every partition's lock before its marker is read: a process that opened the
            # partition in between could append and die, leaving a log trusted as clean.
            # A partition another process holds (a Spark task appending) is waited for, a
            # bounded time in all, then it fails the open.
            self._lock_partitions(partitions, locks, failures)
            if failures:  # before any marker is taken: nothing on disk has changed
                raise PartitionRecoveryError(self.root, failures)
            clean, syncing = self._take_markers(partitions, taken)
            tracker = RecoveryProgress(len(partitions), show=progress)

            def open_one(tp: TopicPartition) -> None:
                handed_over.add(tp)
                log = self._open_partition(tp, locks[tp], clean[tp] or False, configs)
                opened[tp] = log  # first: whatever fails after this, the log is closed below
                tracker.advance(log.recovery_report)

            configs: dict[str, LogConfig] = {}
            with tracker, collections_paused():
                open_partitions(self.recovery_threads, partitions, clean, open_one, failures)
            if failures:
                raise PartitionRecoveryError(self.root, failures)
            if syncing is not None:
                syncing.wait()  # before any log is handed out: appends change logs
            # In the try: a Ctrl-C that lands only now (its handler runs when this thread
            # next gets the CPU, perhaps after the last open) still closes every log.
            reports: dict[TopicPartition, RecoveryReport] = {
                tp: log.recovery_report for tp, log in opened.items()
            }
            self.recovery_summary = RecoverySummary.of(
                reports, time.perf_counter() - started, self.recovery_threads
            )
            self._logs = opened
            self._partition_locks = locks
        except BaseException as exc:
            self._logs = {}
            self._partition_locks = {}
            for tp, error in sorted(close_partitions(self.recovery_threads, opened).items()):
                exc.add_note(
                    f"closing {tp} after the failed open also failed: {type(error).__name__}: {error}"
                )
            # A partition no open got to is as it was: its marker goes back (a Ctrl-C
            # during a root's recovery must not leave the root's other partitions unclean).
            untouched = [tp for tp, marker in taken.items() if marker is not None and tp not in handed_over]
            self._put_back_markers(untouched, exc)
            unopened = [lock.release for tp, lock in locks.items() if tp not in handed_over]
            release_after_failure(exc, unopened)
            # Last: a second Ctrl-C while the sync is awaited finds the logs closed and the
            # locks released.
            sync_error = None if syncing is None else syncing.join()
            if sync_error is not None:
                exc.add_note(f"syncing the filesystem after taking the markers failed: {sync_error}")
            raise

    def _take_markers(
        self, partitions: list[TopicPartition], taken: dict[TopicPartition, CleanMarker | None]
    ) -> tuple[dict[TopicPartition, CleanMarker | None], PendingSync | None]:
        """Take every partition's clean-shutdown marker (the partitions are locked), and start
        the sync that makes the takes durable: each marker taken, and the sync (None if none was).
        `taken` has each as it is taken, for a failure to put back."""
        # Before any marker is taken: a failure here leaves every partition clean.
        disks = {tp: self._fs.filesystem_of(self._partition_path(tp)) for tp in partitions}
        for tp in partitions:
            taken[tp] = take_clean_marker(self._fs, self._partition_path(tp))
        clean = dict(taken)
        if not any(clean.values()):
            return clean, None
        # syncfs: a crash while loading must find no marker (it would trust a log recovery
        # had half changed); one commit per filesystem instead of one per partition (a
        # partition may be a mount point or a link to another disk, which a syncfs of the
        # root would miss), beside the loads: a load waits for it before it changes a log
        # its marker called clean (made_durable), and the open before it returns.
        path_on = {disks[tp]: self._partition_path(tp) for tp in partitions if clean[tp]}
        syncing = EverySync([self._fs.start_sync_filesystem(path) for path in path_on.values()])
        marked = {
            tp: None if marker is None else dataclasses.replace(marker, made_durable=syncing.wait)
            for tp, marker in clean.items()
        }
        return marked, syncing

    def _put_back_markers(self, partitions: list[TopicPartition], failure: BaseException) -> None:
        for tp in partitions:
            try:
                put_back_clean_marker(self._fs, self._partition_path(tp))
            except OSError as error:  # the partition is recovered at the next open: only slower
                failure.add_note(f"putting back the clean-shutdown marker of {tp} failed: {error}")

    def _lock_partitions(
        self,
        partitions: list[TopicPartition],
        locks: dict[TopicPartition, PartitionLock],
        failures: dict[TopicPartition, BaseException],
    ) -> None:
        """Take every partition's lock, waiting (bounded, backing off) for ones another process holds.

        Each partition still locked at the deadline fails with LockTimeoutError.
        """
        waiting = list(partitions)

        def attempt() -> None:
            nonlocal waiting
            still: list[TopicPartition] = []
            for tp in waiting:
                try:
                    locks[tp] = self._lock_partition(tp)
                except LogDirLockedError as lock_error:
                    still.append(tp)
                    failures[tp] = lock_error
                except (OSError, OncelogError) as lock_error:  # LogDirectoryError: .lock a directory
                    failures[tp] = lock_error
                else:
                    failures.pop(tp, None)
            waiting = still
            if still:
                raise failures[still[0]]

        try:
            wait_while_locked(f"partitions of {self.root}", attempt, self.lock_timeout_s)
        except LockTimeoutError:
            for tp in waiting:
                failures[tp] = LockTimeoutError(
                    f"{failures[tp]} (still locked after {self.lock_timeout_s:g} s)"
                )

    def _finish_pending_deletes(self) -> None:
        failures: dict[TopicPartition, BaseException] = {}
        for key in self._store.keys(DELETE_INTENT_PREFIX):
            tp = parse_partition_dir_name(key[len(DELETE_INTENT_PREFIX) :])
            if tp is not None:
                try:
                    self._remove_partition_dir(tp)
                except (OncelogError, OSError) as exc:
                    failures[tp] = exc
        if failures:
            raise PartitionRecoveryError(self.root, failures)

    def _remove_partition_dir(self, tp: TopicPartition, held: DirLock | None = None) -> None:
        """Remove the partition directory (whatever of it is left), then its delete intent.

        The directory is locked throughout: `held` if the caller holds its lock already,
        else it is taken here (LogDirLockedError if another process has the partition open).
        """
        path = self._partition_path(tp)
        if self._fs.exists(path):
            lock = held
            if lock is None:
                busy = f"cannot delete {tp}: {path} is open in another Log"
                lock = self._lock_partition_dir(path, busy)
            try:
                remove_log_dir(self._fs, path)
            finally:
                if held is None:
                    lock.release()
            # fsync(root): the directory must be durably gone before the intent is cleared,
            # or a power loss could bring back a partial log with no intent to finish it.
            self._fs.fsync_dir(self.root)
        with committing(self._store, f"clearing the finished delete of {tp}"):
            self._store.delete([DELETE_INTENT_PREFIX + str(tp)])
