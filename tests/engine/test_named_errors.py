"""Issue 15 §6: damaged or missing metadata, bad arguments and odd buffers get named errors.

The library raises OncelogError subclasses for anything about data, files or state
(naming the path), and ValueError / TypeError for a caller's mistake; never
lmdb.Error, struct.error or BufferError.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka_fixtures import kafka_fixtures_root

from oncelog import (
    CorruptMetadataError,
    LogConfig,
    LogDirectoryError,
    LogFailedError,
    LogManager,
    MetadataMissingError,
    MetadataWriteError,
    ProducerIdManager,
    Record,
    encode_batch,
)
from oncelog.log import METADATA_DIR, Log
from oncelog.producer_ids import BLOCK_END_KEY, STORE_DIR
from oncelog.root_config import ROOT_LOCK_FILE, ROOT_METADATA_DIR, read_topic_config
from oncelog.spark.write_registry import KEY_PREFIX, WriteRegistry
from oncelog.storage.checkpoint import LOG_START_KEY
from oncelog.storage.clean_marker import CLEAN_SHUTDOWN_FILE
from oncelog.storage.lmdb_store import LmdbStore
from oncelog.storage.log_dirs import PARTITION_LOCKS_DIR
from oncelog.torture.faultfs import FaultFileSystem

T0 = 1_700_000_000_000


class Clock:
    def __init__(self, now_ms: int = T0):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def make_partition(path: Path, batches: int = 3, config: LogConfig | None = None) -> None:
    with Log.open(path, config, clock=Clock()) as log:
        for n in range(batches):
            log.append(encode_batch([(b"k", b"v%d" % n)], timestamp_ms=T0))


def make_root(root: Path) -> None:
    with LogManager.open(root, LogConfig(producer_capacity=64), clock=Clock(), progress=False) as manager:
        manager.log("orders", 0).append(encode_batch([(b"k", b"v")], timestamp_ms=T0))
        manager.producer_ids.lease()


def garble(store_dir: Path) -> None:
    (store_dir / "data.mdb").write_bytes(os.urandom(8192))


def replace_with_file(store_dir: Path) -> None:
    shutil.rmtree(store_dir)
    store_dir.write_bytes(b"not a store")


# -- damaged stores -------------------------------------------------------------------------


@pytest.mark.parametrize("damage", [garble, replace_with_file], ids=["garbage", "a file"])
def test_a_damaged_partition_meta_lmdb_gives_corrupt_metadata_error_naming_it(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    make_partition(tmp_path / "t-0")
    damage(tmp_path / "t-0" / METADATA_DIR)
    with pytest.raises(CorruptMetadataError) as raised:
        Log.open(tmp_path / "t-0")
    assert raised.value.path == str(tmp_path / "t-0" / METADATA_DIR)
    assert str(tmp_path / "t-0" / METADATA_DIR) in str(raised.value)
    damaged = Path(raised.value.path)
    damaged.rename(tmp_path / "set-aside")
    with Log.open(tmp_path / "t-0") as log:  # the lock was released; moved away, the store is recreated
        assert log.recovery_report.metadata_missing
        assert log.log_end_offset == 3


@pytest.mark.parametrize("keep_bytes", [1, 4096, 8192, 12288])
def test_a_truncated_meta_lmdb_is_refused_by_name_not_read_past_its_end(
    tmp_path: Path, keep_bytes: int
) -> None:
    # LMDB maps the file and trusts its meta pages: a cut file would SIGBUS on first read.
    make_partition(tmp_path / "t-0")
    data = tmp_path / "t-0" / METADATA_DIR / "data.mdb"
    assert data.stat().st_size > keep_bytes
    os.truncate(data, keep_bytes)
    with pytest.raises(CorruptMetadataError, match=r"data\.mdb is (truncated|not an LMDB file)") as raised:
        Log.open(tmp_path / "t-0")
    assert raised.value.path == str(data.parent)


def test_a_wrong_sized_offset_in_meta_lmdb_is_corrupt_metadata_not_struct_error(tmp_path: Path) -> None:
    make_partition(tmp_path / "t-0")
    store = LmdbStore(str(tmp_path / "t-0" / METADATA_DIR))
    store.put({LOG_START_KEY: b"\x01\x02\x03"})
    store.close()
    with pytest.raises(CorruptMetadataError, match=LOG_START_KEY) as raised:
        Log.open(tmp_path / "t-0")
    assert raised.value.path == str(tmp_path / "t-0" / METADATA_DIR)


@pytest.mark.parametrize("store", [ROOT_METADATA_DIR, STORE_DIR])
@pytest.mark.parametrize("damage", [garble, replace_with_file], ids=["garbage", "a file"])
def test_a_damaged_root_store_gives_corrupt_metadata_error_and_releases_the_root(
    tmp_path: Path, store: str, damage: Callable[[Path], None]
) -> None:
    make_root(tmp_path)
    damage(tmp_path / store)
    with pytest.raises(CorruptMetadataError) as raised:
        LogManager.open(tmp_path, progress=False)
    assert raised.value.path == str(tmp_path / store)
    # Nothing was left locked: the partition opens on its own.
    with Log.open(tmp_path / "orders-0") as log:
        assert log.log_end_offset == 1


def test_a_root_lock_that_is_a_directory_gives_log_directory_error(tmp_path: Path) -> None:
    make_root(tmp_path)
    os.unlink(tmp_path / ROOT_LOCK_FILE)
    os.mkdir(tmp_path / ROOT_LOCK_FILE)
    with pytest.raises(LogDirectoryError) as raised:
        LogManager.open(tmp_path, progress=False)
    assert raised.value.path == str(tmp_path / ROOT_LOCK_FILE)


def test_a_root_that_is_a_file_gives_log_directory_error(tmp_path: Path) -> None:
    (tmp_path / "root").write_text("oops")
    with pytest.raises(LogDirectoryError) as raised:
        LogManager.open(tmp_path / "root", progress=False)
    assert raised.value.path == str(tmp_path / "root")
    with pytest.raises(LogDirectoryError):
        Log.open(tmp_path / "root")
    with pytest.raises(LogDirectoryError):
        ProducerIdManager.open(tmp_path / "root")


def test_a_partition_lock_file_that_is_a_socket_fails_that_partition_by_name(tmp_path: Path) -> None:
    log_dir = tmp_path / "standalone"
    log_dir.mkdir()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(log_dir / ".lock"))
        with pytest.raises(LogDirectoryError) as raised:
            Log.open(log_dir)
    assert raised.value.path == str(log_dir / ".lock")


def test_a_partition_lock_table_that_is_a_file_fails_the_root_by_name(tmp_path: Path) -> None:
    make_root(tmp_path)
    shutil.rmtree(tmp_path / PARTITION_LOCKS_DIR)
    (tmp_path / PARTITION_LOCKS_DIR).write_bytes(b"")
    with pytest.raises(LogDirectoryError) as raised:
        LogManager.open(tmp_path, progress=False)
    assert raised.value.path == str(tmp_path / PARTITION_LOCKS_DIR)
    with pytest.raises(LogDirectoryError) as raised:
        Log.open(tmp_path / "orders-0")
    assert raised.value.path == str(tmp_path / PARTITION_LOCKS_DIR)


def test_garbage_values_in_the_producer_id_store_are_corrupt_metadata(tmp_path: Path) -> None:
    ProducerIdManager.open(tmp_path).close()
    store = LmdbStore(str(tmp_path / STORE_DIR))
    store.put({BLOCK_END_KEY: b"short"})
    store.close()
    with pytest.raises(CorruptMetadataError, match=BLOCK_END_KEY):
        ProducerIdManager.open(tmp_path)
    store = LmdbStore(str(tmp_path / STORE_DIR))
    store.put({BLOCK_END_KEY: struct.pack(">q", 100), "txn/app": b"\x00"})
    store.close()
    with ProducerIdManager.open(tmp_path) as manager, pytest.raises(CorruptMetadataError, match="txn/app"):
        manager.init_producer_id("app")


def test_garbage_in_the_root_config_and_the_write_registry_is_corrupt_metadata(tmp_path: Path) -> None:
    make_root(tmp_path)
    store = LmdbStore(str(tmp_path / ROOT_METADATA_DIR))
    store.put({"topic-config/orders": b"\xc1not msgpack"})
    store.close()
    with pytest.raises(CorruptMetadataError, match="topic-config/orders"):
        read_topic_config(tmp_path, "orders")
    with WriteRegistry.open(str(tmp_path)) as registry:
        registry._store.put({KEY_PREFIX + "w1": b"\xc1"})
        with pytest.raises(CorruptMetadataError, match="w1"):
            registry.state("w1")
        with pytest.raises(CorruptMetadataError, match="w1"):
            registry.decide("w1", [])


def test_a_full_disk_under_the_metadata_store_fails_the_log_closed_by_name() -> None:
    fs = FaultFileSystem(0)
    log = Log.open("/d/t-0", fs=fs, clock=Clock())
    log.append(encode_batch([(b"k", b"v")], timestamp_ms=T0))
    log.flush()
    fs.fail_next("put", errno.ENOSPC)  # the recovery point's commit
    with pytest.raises(LogFailedError, match=r"commit to /d/t-0/meta\.lmdb failed"):
        log.checkpoint()
    with pytest.raises(LogFailedError, match="refuses appends"):
        log.append(encode_batch([(b"k", b"v")], timestamp_ms=T0))
    with pytest.raises(LogFailedError, match="without a flush"):
        log.close()
    replica = Log.open("/d/t-1", fs=fs, clock=Clock())
    fs.fail_next("put", errno.ENOSPC)  # the first replicated batch clears the client-only flag first
    with pytest.raises(LogFailedError, match="commit to"):
        replica.append(encode_batch([(b"k", b"v")], base_offset=5, timestamp_ms=T0), origin="replication")
    assert replica.log_end_offset == 0
    with pytest.raises(LogFailedError, match="without a flush"):
        replica.close()


def _lease(manager: LogManager) -> object:
    return manager.producer_ids.lease()


def _init_producer_id(manager: LogManager) -> object:
    return manager.producer_ids.init_producer_id("txn-a")


def _set_topic_config(manager: LogManager) -> object:
    return manager.set_topic_config("t", retention_ms=1)


def _reset_topic_config(manager: LogManager) -> object:
    return manager.reset_topic_config("t")


def _delete_log(manager: LogManager) -> object:
    manager.delete_log("t", 0)
    return None


@pytest.mark.parametrize(
    ("operation", "store"),
    [
        pytest.param(_lease, STORE_DIR, id="lease"),
        pytest.param(_init_producer_id, STORE_DIR, id="init_producer_id"),
        pytest.param(_set_topic_config, ROOT_METADATA_DIR, id="set_topic_config"),
        pytest.param(_reset_topic_config, ROOT_METADATA_DIR, id="reset_topic_config"),
        pytest.param(_delete_log, ROOT_METADATA_DIR, id="delete_log"),
    ],
)
def test_a_full_disk_under_a_root_store_refuses_the_operation_by_name_and_changes_nothing(
    operation: Callable[[LogManager], object], store: str
) -> None:
    fs = FaultFileSystem(0)
    manager = LogManager.open("/root", fs=fs, clock=Clock(), progress=False)
    manager.set_topic_config("t", retention_ms=5)
    manager.log("t", 0).append(encode_batch([(b"k", b"v")], timestamp_ms=T0))
    fs.fail_next("put", errno.ENOSPC, target=lambda path: path.endswith(store))
    with pytest.raises(MetadataWriteError, match=store.replace(".", r"\.")) as refused:
        operation(manager)
    assert refused.value.errno == errno.ENOSPC
    assert manager.topic_overrides("t") == {"retention_ms": 5}
    assert manager.log("t", 0, create=False).log_end_offset == 1
    operation(manager)  # the disk has room again: the same call goes through
    manager.close()


# -- silent recreation ----------------------------------------------------------------------


def test_a_partition_whose_meta_lmdb_was_deleted_is_validated_in_full_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = LogConfig(segment_bytes=1024)
    path = tmp_path / "t-0"
    with Log.open(path, config, clock=Clock()) as log:
        for n in range(40):
            log.append(encode_batch([(b"k", b"v" * 100)], timestamp_ms=T0 + n))
        segments = len(log.segments)
        end = log.log_end_offset
    assert segments > 3 and (path / CLEAN_SHUTDOWN_FILE).exists()
    shutil.rmtree(path / METADATA_DIR)
    with caplog.at_level(logging.WARNING), Log.open(path, config, clock=Clock()) as log:
        report = log.recovery_report
        assert report.metadata_missing and not report.clean
        # The clean marker is not trusted without the store: every segment is read.
        assert report.segments_scanned == segments
        assert log.log_end_offset == end
    assert any("validating every segment" in r.message and str(path) in r.message for r in caplog.records)
    with Log.open(path, config, clock=Clock()) as log:  # the store is back: no longer missing
        assert not log.recovery_report.metadata_missing


def test_a_real_kafka_partition_is_validated_in_full_on_its_first_open_only(tmp_path: Path) -> None:
    # Kafka keeps no meta.lmdb: segments without a store are legitimate, and reported.
    source = kafka_fixtures_root() / "apache-kafka-eda-study" / "product-created-events-topic-2"
    shutil.copytree(source, tmp_path / "product-created-events-topic-2")
    with Log.open(tmp_path / "product-created-events-topic-2") as log:
        report = log.recovery_report
        assert report.metadata_missing and not report.clean
        assert report.segments_scanned == len(log.segments)
        end = log.log_end_offset
    with Log.open(tmp_path / "product-created-events-topic-2") as log:
        assert not log.recovery_report.metadata_missing and log.recovery_report.clean
        assert log.log_end_offset == end > 0


def test_a_lost_partition_store_is_shown_in_the_recovery_summary(tmp_path: Path) -> None:
    make_root(tmp_path)
    shutil.rmtree(tmp_path / "orders-0" / METADATA_DIR)
    with LogManager.open(tmp_path, progress=False) as manager:
        summary = manager.recovery_summary
        assert summary.metadata_missing == 1
        assert manager.log("orders", 0).recovery_report.metadata_missing
    assert "orders-0: no metadata store" in str(summary)


def test_a_root_that_lost_its_meta_lmdb_refuses_to_open_until_told_to_recreate_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_root(tmp_path)
    shutil.rmtree(tmp_path / ROOT_METADATA_DIR)
    with pytest.raises(MetadataMissingError, match="recreate_metadata") as raised:
        LogManager.open(tmp_path, progress=False)
    assert raised.value.path == str(tmp_path / ROOT_METADATA_DIR)
    assert not (tmp_path / ROOT_METADATA_DIR).exists()  # nothing was recreated by the refusal
    with (
        caplog.at_level(logging.WARNING),
        LogManager.open(tmp_path, progress=False, recreate_metadata=True) as manager,
    ):
        assert manager.log("orders", 0).log_end_offset == 1
    assert any("recreating" in r.message for r in caplog.records)
    with LogManager.open(tmp_path, progress=False) as manager:  # a store again: opens plainly
        assert manager.config == LogConfig()


def test_an_emptied_root_store_file_counts_as_lost(tmp_path: Path) -> None:
    make_root(tmp_path)
    os.truncate(tmp_path / ROOT_METADATA_DIR / "data.mdb", 0)
    with pytest.raises(MetadataMissingError):
        LogManager.open(tmp_path, progress=False)


def test_roots_that_never_had_a_manager_store_open_without_complaint(tmp_path: Path) -> None:
    # A root Spark writers built (partitions, no .lock of a manager) and a Kafka-like log.dir.
    make_partition(tmp_path / "spark" / "orders-0")
    ProducerIdManager.open(tmp_path / "spark").close()
    with LogManager.open(tmp_path / "spark", progress=False) as manager:
        assert manager.log("orders", 0).log_end_offset == 3
    # A first open that crashed after taking .lock, before any partition existed.
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / ROOT_LOCK_FILE).touch()
    LogManager.open(tmp_path / "fresh", progress=False).close()


# -- out-of-range arguments ----------------------------------------------------------------


def _marker(**overrides: Any) -> Callable[[Log], object]:
    def call(log: Log) -> object:
        kwargs: dict[str, Any] = {
            "producer_id": 1,
            "producer_epoch": 0,
            "commit": True,
            "coordinator_epoch": 0,
        }
        kwargs.update(overrides)
        return log.write_txn_marker(**kwargs)

    return call


BAD_CALLS: list[tuple[str, Callable[[Log], object], str]] = [
    ("marker epoch past i16", _marker(producer_epoch=2**20), "producer_epoch"),
    ("marker coordinator epoch past i32", _marker(coordinator_epoch=2**31), "coordinator_epoch"),
    ("marker producer id past i64", _marker(producer_id=2**63), "producer_id"),
    ("marker producer id negative", _marker(producer_id=-1), "producer_id"),
    (
        "producer id past i64",
        lambda log: log.append_records([(b"k", b"v")], producer_id=2**63, producer_epoch=0, base_sequence=0),
        "producer_id",
    ),
    (
        "epoch past i16",
        lambda log: log.append_records([(b"k", b"v")], producer_id=1, producer_epoch=2**15, base_sequence=0),
        "producer_epoch",
    ),
    (
        "sequence past i32",
        lambda log: log.append_records([(b"k", b"v")], producer_id=1, producer_epoch=0, base_sequence=2**31),
        "base_sequence",
    ),
    (
        "timestamp past i64",
        lambda log: log.append_records([(b"k", b"v")], timestamp_ms=2**63),
        "timestamp_ms",
    ),
    ("truncate negative", lambda log: log.truncate_to(-1), "offset"),
    ("truncate huge", lambda log: log.truncate_to(2**64), "offset"),
    ("delete_records negative", lambda log: log.delete_records(-5), "before_offset"),
    ("delete_records huge", lambda log: log.delete_records(2**64), "before_offset"),
    ("read huge", lambda log: log.read(2**64), "start_offset"),
    ("read negative max_bytes", lambda log: log.read(0, -1), "max_bytes"),
    ("read huge max_offset", lambda log: log.read(0, max_offset=2**70), "max_offset"),
    ("offset_for_timestamp huge", lambda log: log.offset_for_timestamp(2**70), "timestamp_ms"),
    ("expire huge now", lambda log: log.expire_producers(2**70), "now_ms"),
    ("retention huge now", lambda log: log.apply_retention(2**70), "now_ms"),
    ("wait_durable below zero", lambda log: log.wait_durable(-1), "end_offset"),
]


@pytest.mark.parametrize(("case", "call", "argument"), BAD_CALLS, ids=[case for case, _, _ in BAD_CALLS])
def test_an_out_of_range_argument_is_a_value_error_naming_it_and_changes_nothing(
    tmp_path: Path, case: str, call: Callable[[Log], object], argument: str
) -> None:
    make_partition(tmp_path / "t-0")
    with Log.open(tmp_path / "t-0") as log:
        size = log.size_bytes
        with pytest.raises(ValueError, match=argument):
            call(log)
        assert (log.log_end_offset, log.size_bytes, log.log_start_offset) == (3, size, 0)
        log.append(encode_batch([(b"k", b"after")]))  # and the log still works
        assert log.log_end_offset == 4


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"base_offset": 2**63}, "base_offset"),
        ({"producer_id": -(2**63) - 1}, "producer_id"),
        ({"producer_epoch": 2**15}, "producer_epoch"),
        ({"base_sequence": -(2**31) - 1}, "base_sequence"),
        ({"partition_leader_epoch": 2**31}, "partition_leader_epoch"),
        ({"timestamp_ms": 2**63}, "timestamp_ms"),
    ],
)
def test_encode_batch_names_the_out_of_range_argument(kwargs: dict[str, int], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        encode_batch([(b"k", b"v")], **kwargs)


def test_encode_batch_refuses_record_timestamps_whose_delta_overflows_a_varlong() -> None:
    # Both fit an i64, but their difference does not: the varlong would be garbage.
    records = [Record(0, 3 * 2**61, b"k", b"v"), Record(0, -3 * 2**61, b"k", b"v")]
    with pytest.raises(ValueError, match="timestamp"):
        encode_batch(records)
    with pytest.raises(TypeError, match="producer_id"):
        encode_batch([(b"k", b"v")], producer_id="7")  # type: ignore[arg-type]


def test_producer_id_manager_checks_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="block_size"):
        ProducerIdManager.open(tmp_path, block_size=2**40)
    with pytest.raises(ValueError, match="lease_ms"):
        ProducerIdManager.open(tmp_path, lease_ms=0)


# -- buffers ---------------------------------------------------------------------------------


def _batch() -> bytes:
    return encode_batch([(b"key", b"value" * 10)], timestamp_ms=T0)


@pytest.mark.parametrize(
    "make",
    [
        lambda b: bytearray(b),
        lambda b: memoryview(b),
        lambda b: memoryview(b"xx" + b)[2:],
        lambda b: np.frombuffer(b, dtype=np.uint8),
        lambda b: np.frombuffer(b + b"\0" * (-len(b) % 4), dtype=np.uint8)[: len(b)],
        lambda b: memoryview(bytearray(b)).cast("b"),
    ],
    ids=["bytearray", "memoryview", "contiguous slice", "numpy uint8", "numpy slice", "signed bytes"],
)
@pytest.mark.parametrize("path", ["append", "append_batches", "replication"])
def test_any_c_contiguous_buffer_of_bytes_is_appended(
    tmp_path: Path, make: Callable[[bytes], Any], path: str
) -> None:
    batch = _batch()
    with Log.open(tmp_path / "t-0") as log:
        if path == "append":
            log.append(make(batch))
        elif path == "append_batches":
            log.append_batches([make(batch)])
        else:
            log.append(make(batch), origin="replication")
        (stored,) = log.read(0).batches
        assert stored.buffer.tobytes()[61:] == batch[61:]


@pytest.mark.parametrize(
    ("make", "wanted"),
    [
        (lambda b: memoryview(b + b)[::2], "contiguous"),
        (lambda b: memoryview(bytearray(b + b"\0" * (-len(b) % 4))).cast("I"), "buffer of bytes"),
        (lambda b: np.frombuffer(b + b"\0" * (-len(b) % 8), dtype=np.int64), "buffer of bytes"),
        (lambda b: b.decode("latin-1"), "bytes"),
        (lambda b: 42, "bytes"),
    ],
    ids=["strided memoryview", "uint32 view", "int64 array", "str", "int"],
)
@pytest.mark.parametrize("origin", ["client", "replication"])
def test_anything_but_contiguous_bytes_is_a_type_error_saying_what_is_wanted(
    tmp_path: Path, make: Callable[[bytes], Any], wanted: str, origin: str
) -> None:
    with Log.open(tmp_path / "t-0") as log:
        with pytest.raises(TypeError, match=wanted):
            log.append(make(_batch()), origin=origin)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=wanted):
            log.append_batches([make(_batch())], origin=origin)  # type: ignore[arg-type]
        assert log.size_bytes == 0


# -- LogAppendTime duplicates ----------------------------------------------------------------


def test_a_duplicate_on_a_log_append_time_log_returns_the_original_append_time(tmp_path: Path) -> None:
    clock = Clock()
    config = LogConfig(timestamp_type="LogAppendTime")
    batches = [
        encode_batch([(b"k", b"v")], producer_id=5, producer_epoch=0, base_sequence=n, timestamp_ms=1)
        for n in range(2)
    ]
    with Log.open(tmp_path / "t-0", config, clock=clock) as log:
        first = log.append(batches[0])
        clock.now_ms += 1000
        second = log.append_batches([batches[1]])[0]
        assert (first.log_append_time_ms, second.log_append_time_ms) == (T0, T0 + 1000)
        clock.now_ms += 1000
        # Retried through both paths, alone and beside each other: the original times.
        assert log.append(batches[0]) == first._replace(duplicate=True)
        retried = log.append_batches([batches[1], batches[0]])
        assert retried == [second._replace(duplicate=True), first._replace(duplicate=True)]
    with Log.open(tmp_path / "t-0", config, clock=clock) as log:  # and after a reopen (the snapshot)
        assert log.append(batches[1]).log_append_time_ms == T0 + 1000


def test_a_duplicate_on_a_create_time_log_has_no_append_time(tmp_path: Path) -> None:
    batch = encode_batch([(b"k", b"v")], producer_id=5, producer_epoch=0, base_sequence=0, timestamp_ms=T0)
    with Log.open(tmp_path / "t-0") as log:
        assert log.append(batch).log_append_time_ms == -1
        assert log.append(batch).duplicate and log.append(batch).log_append_time_ms == -1  # fast path
        assert log.append_batches([batch])[0].log_append_time_ms == -1


def test_retries_racing_a_timestamp_type_change_get_the_original_time_or_none(tmp_path: Path) -> None:
    # A second thread flips the topic between LogAppendTime and CreateTime (a LogManager's
    # set_topic_config) while a client retries: every answer is the original's offsets, with
    # its append time or -1, never the retry's time.
    clock = Clock()
    append_time = LogConfig(timestamp_type="LogAppendTime")
    create_time = LogConfig(timestamp_type="CreateTime")
    batch = encode_batch([(b"k", b"v")], producer_id=9, producer_epoch=0, base_sequence=0, timestamp_ms=1)
    with Log.open(tmp_path / "t-0", append_time, clock=clock) as log:
        original = log.append(batch)
        clock.now_ms += 5000
        stop = threading.Event()

        def flip() -> None:
            while not stop.is_set():
                log.reconfigure(create_time)
                log.reconfigure(append_time)

        flipper = threading.Thread(target=flip)
        flipper.start()
        # Retries go on until both settings have been met (however the threads are scheduled).
        times: set[int] = set()
        answers = 0
        try:
            while {-1, original.log_append_time_ms} - times and answers < 5_000_000:
                answer = log.append(batch)
                assert (answer.first_offset, answer.last_offset, answer.duplicate) == (0, 0, True)
                times.add(answer.log_append_time_ms)
                answers += 1
        finally:
            stop.set()
            flipper.join()
        assert times == {-1, original.log_append_time_ms}
        assert log.log_end_offset == 1
