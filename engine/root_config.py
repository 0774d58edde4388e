"""A root's persisted config: its default LogConfig and each topic's overrides.

The root's metadata store (`meta.lmdb`) holds the config the last LogManager opened
the root with (`root-config`, every field but `on_corruption`, which is each opener's
own) and per-topic overrides (`topic-config/<topic>`). Processes that open the root's
partitions without a manager (Spark tasks) read them with `read_topic_config`,
read-only. A store lost from a root that had one is refused (`check_root_store`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from typing import Any

import msgpack

from oncelog.config import LogConfig
from oncelog.errors import (
    MetadataMissingError,
)
from oncelog.layout import TopicPartition, parse_partition_dir_name, validate_topic_partition
from oncelog.storage.fs import DEFAULT_FS, FileSystem, MetadataStore
from oncelog.storage.metadata_values import read_value

# The name it had in log_manager, where these warnings were logged before the move.
logger = logging.getLogger("oncelog.log_manager")

ROOT_LOCK_FILE = ".lock"
ROOT_METADATA_DIR = "meta.lmdb"
ROOT_CONFIG_KEY = "root-config"
TOPIC_CONFIG_PREFIX = "topic-config/"
CONFIG_FIELDS = frozenset(field.name for field in dataclasses.fields(LogConfig))
# What to do about corruption is the opener's choice for that one open (`oncelog recover
# --truncate-corrupt`, LogManager.open's on_corruption), never a standing default for
# the root: not persisted.
PERSISTED_ROOT_FIELDS = CONFIG_FIELDS - {"on_corruption"}


def read_root_config(root: str | os.PathLike[str], fs: FileSystem = DEFAULT_FS) -> LogConfig:
    """The default config the last LogManager of `root` persisted (LogConfig() if none).
    Read-only, like read_topic_config."""
    with root_store(root, fs) as store:
        return LogConfig() if store is None else stored_root_config(store)


def read_topic_config(root: str | os.PathLike[str], topic: str, fs: FileSystem = DEFAULT_FS) -> LogConfig:
    """The config a LogManager of `root` gives `topic`'s partitions: the root's persisted
    config with the topic's overrides. Read-only (it creates, locks and changes nothing),
    for processes that open the root's partitions without a manager; LogConfig() where
    no manager ever opened the root."""
    validate_topic_partition(topic, 0)
    key = TOPIC_CONFIG_PREFIX + topic
    with root_store(root, fs) as store:
        if store is None:
            return LogConfig()
        return dataclasses.replace(stored_root_config(store), **read_overrides(store, key))


@contextlib.contextmanager
def root_store(root: str | os.PathLike[str], fs: FileSystem) -> Iterator[MetadataStore | None]:
    """The root's metadata store opened read-only, or None where it has none."""
    path = os.path.join(os.fspath(root), ROOT_METADATA_DIR)
    if not fs.exists(path):
        yield None
        return
    try:
        store = fs.open_store(path, readonly=True)
    except FileNotFoundError:  # the directory without a committed store yet
        yield None
        return
    try:
        yield store
    finally:
        store.close()


def pack_root_config(config: LogConfig) -> bytes:
    packed: bytes = msgpack.packb({name: getattr(config, name) for name in sorted(PERSISTED_ROOT_FIELDS)})
    return packed


def stored_root_config(store: MetadataStore) -> LogConfig:
    return read_value(store, ROOT_CONFIG_KEY, unpack_root_config) or LogConfig()


def unpack_root_config(raw: bytes) -> LogConfig:
    # A field this version does not know (a newer one wrote it) is left out.
    stored = msgpack.unpackb(raw)
    return LogConfig(**{name: value for name, value in stored.items() if name in PERSISTED_ROOT_FIELDS})


def read_overrides(store: MetadataStore, key: str) -> dict[str, Any]:
    return read_value(store, key, unpack_overrides) or {}


def unpack_overrides(raw: bytes) -> dict[str, Any]:
    # As in the root config, a field this version does not know is left out.
    overrides = {name: value for name, value in dict(msgpack.unpackb(raw)).items() if name in CONFIG_FIELDS}
    LogConfig(**overrides)  # values this version takes (each field is checked alone), or it raises
    return overrides


def settle_root_config(store: MetadataStore, config: LogConfig | None) -> LogConfig:
    """The config an open uses: the one given (persisted if it differs) or the persisted one."""
    if config is None:
        return stored_root_config(store)
    stored = store.get(ROOT_CONFIG_KEY)
    packed = pack_root_config(config)
    if packed != stored:
        # A durable commit before any partition opens with it: other processes open the
        # root's partitions with what read_topic_config finds here.
        store.put({ROOT_CONFIG_KEY: packed})
    return config


def root_store_missing(fs: FileSystem, path: str) -> bool:
    """No store at `path`, or one never committed to (CorruptMetadataError if one is damaged)."""
    try:
        fs.open_store(path, readonly=True).close()
    except FileNotFoundError:
        return True
    return False


def check_root_store(fs: FileSystem, root: str, *, had_lock_file: bool, recreate: bool) -> None:
    """Refuse to recreate the missing store of a root a LogManager kept one in.

    How a root knows it had a store: LogManager.open creates `.lock`, then commits the
    store (durably) before any partition exists. So `.lock` from an earlier open plus
    partition directories means a store existed and is gone: a bad restore, a stray
    `rm`. Other processes create partitions (Spark writers) and a Kafka log.dir has
    them, but neither creates the root's `.lock`; a first open that crashed before its
    commit left no partitions. A lost store is refused, not reported, because an empty
    one silently changes what the root holds: its persisted config (producer capacity
    and expiry: dedupe), every topic's overrides, and pending deletes (a half-deleted
    partition would come back as a log). `recreate` accepts that, loudly.
    """
    if not had_lock_file:
        return
    partitions = partitions_on_disk(fs, root)
    if not partitions:
        return
    path = os.path.join(root, ROOT_METADATA_DIR)
    lost = (
        f"the root's metadata store is missing, but {ROOT_LOCK_FILE} shows a LogManager kept one here and "
        f"{len(partitions)} partition directories exist; its root config, topic config overrides and pending "
        "partition deletes are gone"
    )
    if not recreate:
        raise MetadataMissingError(
            f"{lost}. Restore it, or open with recreate_metadata=True (oncelog recover --recreate-metadata) "
            "to start an empty one and give the config again",
            path=path,
        )
    logger.warning("%s: %s; recreating it empty as asked", path, lost)


def partitions_on_disk(fs: FileSystem, root: str) -> list[TopicPartition]:
    """The `<topic>-<partition>` directories under `root`."""
    found = []
    for name in fs.listdir(root):
        tp = parse_partition_dir_name(name)
        if tp is not None and fs.exists(os.path.join(root, name, "")):
            found.append(tp)
    return sorted(found)
