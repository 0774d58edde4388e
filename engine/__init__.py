"""oncelog: a durable on-disk log engine storing Apache Kafka v2 record batches.

Start here. `Log` is one partition directory; `LogManager` is a root of them.
Where each rule lives:

- the producer sequence and epoch checks: `oncelog.append_rules.ProducerAppendInfo.check`;
  its C twin is `check_producer` in `engine/_append.c` (whose opening table maps each
  rule to both)
- a snapshot of producer state on every segment roll:
  `oncelog.log_durability.LogDurability._roll_fsync_locked`
- what recovery does with each kind of damage: `oncelog.recovery.plan` (the decision
  table), carried out by `oncelog.recovery.loader.LogLoader`
- producer expiry, the circular buffer: `oncelog.producer_state.ProducerStateManager.expire`
- a Produce request reaching `Log.append_batches`: `oncelog.server.handlers.produce.handle_produce`
  (`oncelog.server.api_registry` maps every API key to its handler)
- EndTxn writing its markers: `oncelog.server.txn_coordinator.TransactionCoordinator._complete`,
  through `oncelog.server.broker.Broker._write_marker` into `Log.write_txn_marker`; a marker a
  crash took is written again at start by `oncelog.server.broker.Broker.restore_lost_markers`

Layers (checked by import-linter in `make test`, `[tool.importlinter]` in pyproject.toml):
segments < storage < producer state < recovery < log < manager < server, spark, tools <
torture, bench < cli; every import runs down. Importing this package loads nothing: each
name below is imported on first use, so `import oncelog.segments` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oncelog import errors
    from oncelog.config import LogConfig
    from oncelog.errors import (
        CleanerError,
        CorruptLogError,
        CorruptMetadataError,
        CorruptRecordError,
        CorruptSnapshotError,
        InvalidProducerEpochError,
        InvalidRecordError,
        InvalidTxnStateError,
        KeylessRecordError,
        LockTimeoutError,
        LogClosedError,
        LogDirectoryError,
        LogDirLockedError,
        LogFailedError,
        MetadataMissingError,
        MetadataWriteError,
        NotASegmentError,
        OffsetOutOfRangeError,
        OncelogError,
        OutOfOrderSequenceError,
        ProducerIdsExhaustedError,
        ProducerStateFullError,
        RecordTooLargeError,
        RetriableError,
        TooManyOpenFilesError,
        TransactionCoordinatorFencedError,
        TruncatedBeforeDurableError,
    )
    from oncelog.layout import InvalidTopicError, TopicPartition
    from oncelog.log import Log
    from oncelog.log_manager import LogManager, PartitionRecoveryError, UnknownTopicOrPartitionError
    from oncelog.producer_ids import ProducerIdManager, ProducerLease
    from oncelog.producer_state import BatchMetadata, ProducerStateEntry
    from oncelog.recovery.loader import RecoveryReport
    from oncelog.recovery_progress import RecoverySummary
    from oncelog.results import AppendResult, FetchResult
    from oncelog.segments import Record, RecordBatch, encode_batch, iter_batches
    from oncelog.segments.index import TimestampOffset

# name -> the module it is imported from on first use (the same imports as above).
_HOME = {
    "errors": "oncelog.errors",
    "LogConfig": "oncelog.config",
    **dict.fromkeys(
        [
            "CleanerError",
            "CorruptLogError",
            "CorruptMetadataError",
            "CorruptRecordError",
            "CorruptSnapshotError",
            "InvalidProducerEpochError",
            "InvalidRecordError",
            "InvalidTxnStateError",
            "KeylessRecordError",
            "LockTimeoutError",
            "LogClosedError",
            "LogDirectoryError",
            "LogDirLockedError",
            "LogFailedError",
            "MetadataMissingError",
            "MetadataWriteError",
            "NotASegmentError",
            "OffsetOutOfRangeError",
            "OncelogError",
            "OutOfOrderSequenceError",
            "ProducerIdsExhaustedError",
            "ProducerStateFullError",
            "RecordTooLargeError",
            "RetriableError",
            "TooManyOpenFilesError",
            "TransactionCoordinatorFencedError",
            "TruncatedBeforeDurableError",
        ],
        "oncelog.errors",
    ),
    "InvalidTopicError": "oncelog.layout",
    "TopicPartition": "oncelog.layout",
    "Log": "oncelog.log",
    "LogManager": "oncelog.log_manager",
    "PartitionRecoveryError": "oncelog.log_manager",
    "UnknownTopicOrPartitionError": "oncelog.log_manager",
    "ProducerIdManager": "oncelog.producer_ids",
    "ProducerLease": "oncelog.producer_ids",
    "BatchMetadata": "oncelog.producer_state",
    "ProducerStateEntry": "oncelog.producer_state",
    "RecoveryReport": "oncelog.recovery.loader",
    "RecoverySummary": "oncelog.recovery_progress",
    "AppendResult": "oncelog.results",
    "FetchResult": "oncelog.results",
    "Record": "oncelog.segments",
    "RecordBatch": "oncelog.segments",
    "encode_batch": "oncelog.segments",
    "iter_batches": "oncelog.segments",
    "TimestampOffset": "oncelog.segments.index",
}

# Every name of _HOME (tests/engine/test_package.py checks both lists agree).
__all__ = [
    "AppendResult",
    "BatchMetadata",
    "CleanerError",
    "CorruptLogError",
    "CorruptMetadataError",
    "CorruptRecordError",
    "CorruptSnapshotError",
    "FetchResult",
    "InvalidProducerEpochError",
    "InvalidRecordError",
    "InvalidTopicError",
    "InvalidTxnStateError",
    "KeylessRecordError",
    "LockTimeoutError",
    "Log",
    "LogClosedError",
    "LogConfig",
    "LogDirLockedError",
    "LogDirectoryError",
    "LogFailedError",
    "LogManager",
    "MetadataMissingError",
    "MetadataWriteError",
    "NotASegmentError",
    "OffsetOutOfRangeError",
    "OncelogError",
    "OutOfOrderSequenceError",
    "PartitionRecoveryError",
    "ProducerIdManager",
    "ProducerIdsExhaustedError",
    "ProducerLease",
    "ProducerStateEntry",
    "ProducerStateFullError",
    "Record",
    "RecordBatch",
    "RecordTooLargeError",
    "RecoveryReport",
    "RecoverySummary",
    "RetriableError",
    "TimestampOffset",
    "TooManyOpenFilesError",
    "TopicPartition",
    "TransactionCoordinatorFencedError",
    "TruncatedBeforeDurableError",
    "UnknownTopicOrPartitionError",
    "encode_batch",
    "errors",
    "iter_batches",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'oncelog' has no attribute {name!r}")
    module = importlib.import_module(home)
    value = module if module.__name__ == f"oncelog.{name}" else getattr(module, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
