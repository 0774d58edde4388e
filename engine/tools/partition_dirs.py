"""Find the partition directories under a root and read what their metadata says, read-only.

Shared by `oncelog verify` and `oncelog stat`. ROOT is a partition directory (it
holds `%020d.log` segments) or a root of `<topic>-<partition>` directories: an
oncelog LogManager root or a Kafka log.dir. Root-wide entries (`.lock`, `meta.lmdb`,
`producer_ids.lmdb`, Kafka's checkpoint files) never parse as partitions, and
partitions being deleted (`<tp>.<hex>-delete`, or a LogManager delete intent) are
skipped: they may be half gone.

Metadata stores are opened through the seam with `readonly=True`, which creates
nothing (not even LMDB's lock file) and sees the last completed commit.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from oncelog.errors import CorruptMetadataError, CorruptRecordError, OncelogError
from oncelog.layout import TopicPartition, is_pending_delete, parse_partition_dir_name
from oncelog.log import METADATA_DIR
from oncelog.log_manager import DELETE_INTENT_PREFIX
from oncelog.root_config import ROOT_METADATA_DIR, read_topic_config
from oncelog.segments import format as fmt
from oncelog.segments.batch import TruncatedBatchError, UnwrittenSpaceError
from oncelog.segments.segment import LOG_SUFFIX, parse_segment_file_name, zeros_to_end
from oncelog.storage.checkpoint import (
    CLEANER_CHECKPOINT_KEY,
    CLEANER_HORIZON_KEY,
    CLIENT_ONLY_KEY,
    RECOVERY_POINT_KEY,
    RecoveryPoint,
    read_offset,
    read_recovery_point,
    recorded_log_start,
)
from oncelog.storage.clean_marker import CLEAN_SHUTDOWN_FILE
from oncelog.storage.fs import FileHandle, FileSystem

KAFKA_CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"  # in each Kafka log.dir after a clean stop
KAFKA_LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
KAFKA_CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"  # where each partition's last cleaning ended


class BadInputError(OncelogError):
    """ROOT is missing, or holds neither segments nor partition directories."""


class Partition(NamedTuple):
    path: str
    tp: TopicPartition | None  # None when the directory's name is not `<topic>-<partition>`
    root: str  # the directory holding it, where Kafka keeps its checkpoints

    @property
    def label(self) -> str:
        return str(self.tp) if self.tp is not None else os.path.basename(self.path)


class PartitionMeta(NamedTuple):
    """What an oncelog directory's metadata store says; a Kafka directory has none."""

    oncelog: bool
    clean_shutdown: bool
    recovery_point: RecoveryPoint | None
    client_only: bool
    log_start_offset: int | None  # recorded_log_start: None if the store cannot say
    error: str | None = None
    # Where the last cleaning pass of a compacted log ended (oncelog.log_cleaner): below it
    # each key has at most one record. None: never cleaned.
    cleaner_checkpoint: int | None = None
    # The earliest delete horizon (KIP-534) that pass left in a batch; None: none left.
    cleaner_horizon_ms: int | None = None


def find_partitions(root: str, fs: FileSystem) -> list[Partition]:
    """ROOT itself if it holds segments, else its `<topic>-<partition>` subdirectories."""
    if not os.path.exists(root):
        raise BadInputError(f"no such file or directory: {root}")
    if not os.path.isdir(root):
        raise BadInputError(f"not a directory: {root} (give a partition directory or a root of them)")
    path = os.path.normpath(root)
    try:
        names = fs.listdir(path)
    except OSError as exc:
        raise BadInputError(f"cannot list {root}: {exc.strerror or exc}") from exc
    if any(name.endswith(LOG_SUFFIX) for name in names):
        absolute = os.path.abspath(path)
        tp = parse_partition_dir_name(os.path.basename(absolute))
        return [Partition(path, tp, os.path.dirname(absolute))]
    found = []
    try:
        deleting = delete_intents(fs, path) if ROOT_METADATA_DIR in names else set()
    except (OncelogError, OSError):
        deleting = set()  # a damaged store: the tools report it themselves (root_store_error)
    for name in names:
        # Root-wide entries (.lock, meta.lmdb, producer_ids.lmdb, checkpoints) never parse;
        # a `<tp>.<hex>-delete` directory or a delete intent's is no longer part of the root.
        tp = None if is_pending_delete(name) or name in deleting else parse_partition_dir_name(name)
        if tp is not None and os.path.isdir(os.path.join(path, name)):
            found.append(Partition(os.path.join(path, name), tp, path))
    if not found:
        raise BadInputError(f"no {LOG_SUFFIX} segments and no <topic>-<partition> directories in {root}")
    return sorted(found, key=lambda p: (p.tp.topic, p.tp.partition) if p.tp else ("", 0))


def segment_bases(names: list[str]) -> tuple[list[int], list[str]]:
    """(sorted base offsets of the segments, `.log` names that are not `%020d.log`)."""
    bases: list[int] = []
    bad: list[str] = []
    for name in names:
        base = parse_segment_file_name(name, LOG_SUFFIX)
        if base is not None:
            bases.append(base)
        elif name.endswith(LOG_SUFFIX):
            bad.append(name)
    return sorted(bases), bad


def unwritten_tail(exc: CorruptRecordError, handle: FileHandle, position: int) -> bool:
    """Whether a scan of `handle` stopped at pre-allocated space: zeros from `position` to the end.

    Fewer zeros than a batch's size prefix (17 bytes) are that space too, though the scan
    calls them a batch cut short: a live active segment's reservation can end there.
    """
    return isinstance(exc, (UnwrittenSpaceError, TruncatedBatchError)) and zeros_to_end(
        handle, position, handle.size()
    )


def read_partition_meta(fs: FileSystem, directory: str) -> PartitionMeta:
    """The directory's metadata store read as the loader reads it; `error` if it cannot be."""
    store_path = os.path.join(directory, METADATA_DIR)
    if not fs.exists(store_path):
        return PartitionMeta(False, False, None, False, None)
    clean = fs.exists(os.path.join(directory, CLEAN_SHUTDOWN_FILE))
    try:
        try:
            store = fs.open_store(store_path, readonly=True)
        except FileNotFoundError:  # never committed: the loader finds no metadata either
            return PartitionMeta(False, False, None, False, None)
        try:
            has_point = store.get(RECOVERY_POINT_KEY) is not None
            point = read_recovery_point(store) if has_point else None
            client_only = read_offset(store, CLIENT_ONLY_KEY) == 1
            log_start = recorded_log_start(store)
            cleaned_to = read_offset(store, CLEANER_CHECKPOINT_KEY)
            horizon = read_offset(store, CLEANER_HORIZON_KEY)
        finally:
            store.close()
    except (OSError, OncelogError) as exc:  # CorruptMetadataError: the loader would refuse it too
        return PartitionMeta(True, clean, None, False, None, error=f"cannot read {METADATA_DIR}: {exc}")
    if horizon == fmt.INT64_MAX:  # the pass kept no tombstone or marker with a horizon
        horizon = None
    return PartitionMeta(True, clean, point, client_only, log_start, None, cleaned_to, horizon)


def delete_intents(fs: FileSystem, root: str) -> set[str]:
    """The partition directories the LogManager of `root` is deleting.

    CorruptMetadataError (or OSError) if the root's store exists but cannot be read.
    """
    try:
        store = fs.open_store(os.path.join(root, ROOT_METADATA_DIR), readonly=True)
    except FileNotFoundError:
        return set()  # no LogManager's store: nothing to skip
    try:
        return {key[len(DELETE_INTENT_PREFIX) :] for key in store.keys(DELETE_INTENT_PREFIX)}
    finally:
        store.close()


def root_store_error(fs: FileSystem, root: str) -> str | None:
    """Why the metadata store of the LogManager root `root` cannot be read, if it cannot."""
    if not fs.exists(os.path.join(root, ROOT_METADATA_DIR)):
        return None
    try:
        delete_intents(fs, root)
    except CorruptMetadataError as exc:
        return f"{exc}; a LogManager would refuse to open {root}"
    except OSError as exc:
        return f"cannot read {os.path.join(root, ROOT_METADATA_DIR)}: {exc.strerror or exc}"
    return None


def topic_cleanup_policy(fs: FileSystem, root: str, topic: str) -> str | None:
    """The topic's cleanup policy as the LogManager root `root` stores it (its config and the
    topic's overrides); None where no root says: a Kafka log.dir (the policy is the
    cluster's), a log opened on its own, or a store that cannot be read."""
    if not fs.exists(os.path.join(root, ROOT_METADATA_DIR)):
        return None
    try:
        return read_topic_config(root, topic, fs).cleanup_policy
    except (OncelogError, OSError, ValueError):
        return None


def read_kafka_log_starts(fs: FileSystem, root: str) -> dict[TopicPartition, int]:
    """Kafka's `log-start-offset-checkpoint` in the log.dir `root` (read_kafka_checkpoint)."""
    return read_kafka_checkpoint(fs, root, KAFKA_LOG_START_CHECKPOINT)


def read_kafka_checkpoint(fs: FileSystem, root: str, name: str) -> dict[TopicPartition, int]:
    """One of Kafka's offset checkpoint files in a log.dir (`log-start-offset-checkpoint`,
    `cleaner-offset-checkpoint`): version 0, a count, then `topic partition offset` lines."""
    path = os.path.join(root, name)
    if not fs.exists(path):
        return {}
    handle = fs.open(path, writable=False)
    try:
        lines = handle.pread(handle.size(), 0).decode("utf-8", errors="replace").splitlines()
    finally:
        handle.close()
    starts = {}
    for line in lines[2:] if lines[:1] == ["0"] else ():
        fields = line.split()
        if len(fields) == 3 and fields[1].isdigit() and fields[2].lstrip("-").isdigit():
            starts[TopicPartition(fields[0], int(fields[1]))] = int(fields[2])
    return starts
