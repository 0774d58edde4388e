"""LogManager: the many topic-partitions of one root, as a broker's storage layer.

A root holds `<topic>-<partition>/` partition directories (engine/layout.py), one
root lock (`.lock`: a second manager on the root fails with LogDirLockedError), a
metadata store (`meta.lmdb`: per-topic config overrides and pending deletes) and the
root's ProducerIdManager (`producer_ids.lmdb`).

Opening recovers every partition in a bounded thread pool (each partition's own
loader: tail-only recovery, brief §5); the pool overlaps the fsyncs and file opens
that dominate a restart. `recovery_summary` says what it read and did.

Deleting a partition is made crash-safe with a durable intent, not a directory
rename: `delete/<topic>-<partition>` is committed before the first file goes and
cleared after the directory is gone, so a crash mid-delete is finished at the next
open instead of loading a half-deleted log.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack

from oncelog.config import LogConfig
from oncelog.errors import LogDirLockedError, OncelogError
from oncelog.layout import TopicPartition, parse_partition_dir_name, validate_topic_partition
from oncelog.log import Log, take_clean_marker
from oncelog.producer_ids import ProducerIdManager
from oncelog.recovery.fs import DEFAULT_FS, DirLock, FileSystem, MetadataStore
from oncelog.recovery.loader import RecoveryReport
from oncelog.recovery_progress import RecoveryProgress, RecoverySummary

ROOT_LOCK_FILE = ".lock"
ROOT_METADATA_DIR = "meta.lmdb"
TOPIC_CONFIG_PREFIX = "topic-config/"
DELETE_INTENT_PREFIX = "delete/"
# Recovery is mostly waiting on fsync and file opens (both release the GIL), so a few
# threads per core overlap them; more only adds contention. Bounded either way.
MAX_RECOVERY_THREADS = 64
CONFIG_FIELDS = frozenset(field.name for field in dataclasses.fields(LogConfig))

Clock = Callable[[], int]


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


class LogManager:
    def __init__(
        self,
        root: str,
        config: LogConfig,
        fs: FileSystem,
        clock: Clock | None,
        dir_lock: DirLock,
        store: MetadataStore,
        producer_ids: ProducerIdManager,
        recovery_threads: int,
    ):
        self.root = root
        self.config = config
        self.producer_ids = producer_ids
        self.recovery_threads = recovery_threads
        self._fs = fs
        self._clock = clock
        self._dir_lock = dir_lock
        self._store = store
        self._logs: dict[TopicPartition, Log] = {}
        # Guards the partition map and the store; never held while a Log recovers.
        self._lock = threading.RLock()
        self._closed = False
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
    ) -> LogManager:
        """Open (creating) the root and recover every partition under it.

        `config` is the default for every topic; `set_topic_config` overrides it per
        topic. `progress` shows a progress bar on stderr (default: when it is a terminal).
        """
        directory = os.fspath(root)
        fs = fs or DEFAULT_FS
        threads = default_recovery_threads() if recovery_threads is None else recovery_threads
        if not 1 <= threads <= MAX_RECOVERY_THREADS:
            raise ValueError(f"recovery_threads must be 1..{MAX_RECOVERY_THREADS}, got {threads}")
        fs.mkdir(directory)
        try:
            dir_lock = fs.lock(os.path.join(directory, ROOT_LOCK_FILE))
        except BlockingIOError:
            raise LogDirLockedError(f"{directory} is already open in another LogManager") from None
        store: MetadataStore | None = None
        producer_ids: ProducerIdManager | None = None
        try:
            store = fs.open_store(os.path.join(directory, ROOT_METADATA_DIR))
            producer_ids = ProducerIdManager.open(directory, fs=fs, clock=clock)
            manager = cls(directory, config or LogConfig(), fs, clock, dir_lock, store, producer_ids, threads)
            manager._finish_pending_deletes()
            manager._recover_all(progress)
        except BaseException:
            if producer_ids is not None:
                producer_ids.close()
            if store is not None:
                store.close()
            dir_lock.release()
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
            log = self._open_partition(tp)
            try:
                # fsync(root): a power loss must not lose the new partition's directory
                # once appends to it may have been acknowledged.
                self._fs.fsync_dir(self.root)
            except BaseException:
                log.close()
                raise
            self._logs[tp] = log
            return log

    def logs(self) -> dict[TopicPartition, Log]:
        """Every open partition's log, in topic-partition order."""
        with self._lock:
            self._check_open()
            return dict(sorted(self._logs.items()))

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self.logs())

    def delete_log(self, topic: str, partition: int) -> None:
        """Close the partition's log and delete its directory (crash-safe, see module doc)."""
        tp = validate_topic_partition(topic, partition)
        with self._lock:
            self._check_open()
            log = self._logs.pop(tp, None)
            if log is None:
                raise UnknownTopicOrPartitionError(f"no partition {tp} under {self.root}")
            try:
                log.close()
            finally:
                # Durable before the first file goes: a crash mid-delete must finish the
                # delete at the next open, never load a log with segments missing.
                self._store.put({DELETE_INTENT_PREFIX + str(tp): b""})
                self._remove_partition_dir(tp)

    # -- per-topic config ------------------------------------------------------------------
    def topic_overrides(self, topic: str) -> dict[str, Any]:
        validate_topic_partition(topic, 0)
        raw = self._store.get(TOPIC_CONFIG_PREFIX + topic)
        return {} if raw is None else dict(msgpack.unpackb(raw))

    def topic_config(self, topic: str) -> LogConfig:
        """The root's config with `topic`'s overrides applied."""
        return dataclasses.replace(self.config, **self.topic_overrides(topic))

    def set_topic_config(self, topic: str, **overrides: Any) -> LogConfig:
        """Durably override config fields for `topic`; its open logs follow at once.

        Fields in Log.FIELDS_APPLIED_AT_OPEN reach open logs when they are reopened.
        """
        unknown = sorted(set(overrides) - CONFIG_FIELDS)
        if unknown:
            raise ValueError(f"unknown LogConfig field(s): {', '.join(unknown)}")
        with self._lock:
            self._check_open()
            merged = {**self.topic_overrides(topic), **overrides}
            config = dataclasses.replace(self.config, **merged)  # validates the values
            self._store.put({TOPIC_CONFIG_PREFIX + topic: msgpack.packb(merged)})
            self._reconfigure_topic(topic, config)
            return config

    def reset_topic_config(self, topic: str, *names: str) -> LogConfig:
        """Drop `topic`'s overrides of `names` (all of them if none are named)."""
        with self._lock:
            self._check_open()
            kept = {k: v for k, v in self.topic_overrides(topic).items() if names and k not in names}
            if kept:
                self._store.put({TOPIC_CONFIG_PREFIX + topic: msgpack.packb(kept)})
            else:
                self._store.delete([TOPIC_CONFIG_PREFIX + topic])
            config = dataclasses.replace(self.config, **kept)
            self._reconfigure_topic(topic, config)
            return config

    def _reconfigure_topic(self, topic: str, config: LogConfig) -> None:
        for tp, log in self._logs.items():
            if tp.topic == topic:
                log.reconfigure(config)

    # -- maintenance ---------------------------------------------------------------------
    def apply_retention(self, now_ms: int | None = None) -> int:
        """Run each partition's retention; returns the number of segments deleted.

        Every partition is tried; the first error (if any) is raised afterwards.
        """
        deleted, first_error = 0, None
        for log in self.logs().values():
            try:
                deleted += log.apply_retention(now_ms)
            except Exception as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return deleted

    def flush(self) -> None:
        for log in self.logs().values():
            log.flush()

    def close(self) -> None:
        """Close every log (flush, snapshot, clean marker), the PID manager and the root lock."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            logs = list(self._logs.values())
            self._logs.clear()
        errors: list[BaseException] = []
        try:
            # Each close fsyncs; the pool overlaps them as at open.
            with ThreadPoolExecutor(self.recovery_threads, thread_name_prefix="oncelog-close") as pool:
                for future in [pool.submit(log.close) for log in logs]:
                    exc = future.exception()
                    if exc is not None:
                        errors.append(exc)
        finally:
            try:
                self.producer_ids.close()
            finally:
                self._store.close()
                self._dir_lock.release()
        if errors:
            raise errors[0]

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

    def _open_partition(self, tp: TopicPartition, clean_shutdown: bool | None = None) -> Log:
        config = self.topic_config(tp.topic)
        path = self._partition_path(tp)
        return Log.open(path, config, fs=self._fs, clock=self._clock, clean_shutdown=clean_shutdown)

    def _partitions_on_disk(self) -> list[TopicPartition]:
        found = []
        for name in self._fs.listdir(self.root):
            tp = parse_partition_dir_name(name)
            if tp is not None and self._fs.exists(os.path.join(self.root, name, "")):
                found.append(tp)
        return sorted(found)

    def _recover_all(self, progress: bool | None) -> None:
        partitions = self._partitions_on_disk()
        started = time.perf_counter()
        opened: dict[TopicPartition, Log] = {}
        failures: dict[TopicPartition, BaseException] = {}
        tracker = RecoveryProgress(len(partitions), show=progress)

        clean = {tp: take_clean_marker(self._fs, self._partition_path(tp)) for tp in partitions}
        if any(clean.values()):
            # syncfs: a crash while loading must find no marker (it would trust a log
            # recovery had half changed); one filesystem commit instead of one per partition.
            self._fs.sync_filesystem(self.root)

        def open_one(tp: TopicPartition) -> Log:
            log = self._open_partition(tp, clean[tp])
            tracker.advance(log.recovery_report)
            return log

        with (
            tracker,
            ThreadPoolExecutor(self.recovery_threads, thread_name_prefix="oncelog-recovery") as pool,
        ):
            futures = {tp: pool.submit(open_one, tp) for tp in partitions}
            for tp, future in futures.items():
                exc = future.exception()
                if exc is None:
                    opened[tp] = future.result()
                else:
                    failures[tp] = exc
        if failures:
            for log in opened.values():
                log.close()
            raise PartitionRecoveryError(self.root, failures)
        self._logs = opened
        reports: dict[TopicPartition, RecoveryReport] = {
            tp: log.recovery_report for tp, log in opened.items()
        }
        self.recovery_summary = RecoverySummary.of(
            reports, time.perf_counter() - started, self.recovery_threads
        )

    def _finish_pending_deletes(self) -> None:
        for key in self._store.keys(DELETE_INTENT_PREFIX):
            tp = parse_partition_dir_name(key[len(DELETE_INTENT_PREFIX) :])
            if tp is not None:
                self._remove_partition_dir(tp)

    def _remove_partition_dir(self, tp: TopicPartition) -> None:
        """Remove the partition directory (whatever of it is left), then its delete intent."""
        path = self._partition_path(tp)
        if self._fs.exists(path):
            _remove_tree(self._fs, path)
            # fsync(root): the directory must be durably gone before the intent is cleared,
            # or a power loss could bring back a partial log with no intent to finish it.
            self._fs.fsync_dir(self.root)
        self._store.delete([DELETE_INTENT_PREFIX + str(tp)])


def _remove_tree(fs: FileSystem, path: str) -> None:
    """Remove `path` and everything in it through the seam (a partition holds one level
    of files plus its metadata store's directory)."""
    for name in fs.listdir(path):
        child = os.path.join(path, name)
        try:
            fs.unlink(child)
        except (IsADirectoryError, PermissionError, FileNotFoundError):
            # A directory (the metadata store's): unlink refuses it (the twin reports it
            # missing, as it keeps directories apart from files).
            _remove_tree(fs, child)
    fs.remove_dir(path)
