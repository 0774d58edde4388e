"""oncelog's exception hierarchy.

Every error a caller can act on has its own class, named after Kafka's where one
exists, so a broker embedding oncelog can map each to a protocol error code.
Errors about bytes carry the file and position when they are known.
"""

from __future__ import annotations

import errno

# The root of the hierarchy and the errors about bytes are declared with the codec.
from oncelog.segments.errors import CorruptLogError as CorruptLogError
from oncelog.segments.errors import CorruptRecordError as CorruptRecordError
from oncelog.segments.errors import InvalidRecordError as InvalidRecordError
from oncelog.segments.errors import OncelogError as OncelogError
from oncelog.segments.errors import TooManyOpenFilesError as TooManyOpenFilesError


class RetriableError(OncelogError):
    """The same call may succeed later without any change by the caller."""


class RecordTooLargeError(InvalidRecordError):
    """A batch larger than `LogConfig.max_batch_bytes`."""


class OffsetOutOfRangeError(OncelogError):
    """A read outside [log_start_offset, log_end_offset]."""


class NotASegmentError(CorruptRecordError):
    """A file that does not hold record batches where a segment was expected."""


class LogClosedError(OncelogError):
    """An operation on a Log after `close()`."""


class LogFailedError(OncelogError):
    """A write or fsync failed; the log refuses appends until it is reopened.

    A retried fsync can report success after the kernel has dropped the dirty
    pages (PostgreSQL's "fsyncgate"), so the only safe reaction is to fail closed.
    """


class TruncatedBeforeDurableError(RetriableError):
    """An append waiting to be fsynced (`durable=True`) whose batch `truncate_to` cut first.

    The batch is not in the log; appending it again is the retry.
    """


class LogDirLockedError(OncelogError):
    """Another Log (in this process or another) has the directory open."""


class LockTimeoutError(LogDirLockedError, TimeoutError):
    """A lock another process holds was waited for, and stayed held too long."""


class LogDirectoryError(OncelogError):
    """A path oncelog keeps its data at is not what it must be, or cannot be used.

    A file where a directory belongs (the log directory, a metadata store), a
    directory where a file belongs (a `.lock`, a segment), a path that cannot be
    created or opened. `path` names it; nothing was changed there.
    """

    def __init__(self, message: str, *, path: str):
        super().__init__(f"{path}: {message}")
        self.reason = message  # the message without the path
        self.path = path


class CorruptMetadataError(LogDirectoryError):
    """A metadata store (`meta.lmdb`, `producer_ids.lmdb`, `spark_writes.lmdb`) that cannot be read.

    Garbage or a truncated file where LMDB's data file should be, a file where the
    store's directory should be, or a stored value that does not decode. The store
    holds what the files alone cannot tell (the recovery point, the log start, topic
    configs, pending deletes, issued producer ids), so oncelog refuses to go on
    without it rather than start afresh; restore it, or move it away to have it
    recreated (a partition is then validated in full, see RecoveryReport.metadata_missing).
    """


class MetadataWriteError(LogDirectoryError):
    """A commit to a metadata store failed (a full disk, an I/O error): the store is unchanged.

    The operation that needed the commit did not happen (no PID issued, no config
    changed, no partition deleted) and may be retried once the cause is fixed.
    `path` names the store; `errno` is the OS's error number.
    """

    def __init__(self, message: str, *, path: str, errno: int | None = None):
        super().__init__(message, path=path)
        self.errno = errno


class MetadataMissingError(LogDirectoryError):
    """A LogManager root whose metadata store is gone, though a LogManager kept one there.

    Recreating it empty would silently drop the root's config, every topic's config
    overrides and the pending partition deletes; opening with `recreate_metadata=True`
    (`oncelog recover --recreate-metadata`) accepts that loss.
    """


class CorruptSnapshotError(OncelogError):
    """A producer-state snapshot that is short, has a bad CRC or an unknown version."""


class InvalidProducerEpochError(OncelogError):
    """A batch from an older producer epoch: a zombie producer, fenced."""


class OutOfOrderSequenceError(OncelogError):
    """A sequence gap, a partial overlap, or a duplicate older than the dedupe window."""


class ProducerStateFullError(RetriableError):
    """The producer table is full of live producers; retry after some expire."""


class ProducerIdsExhaustedError(OncelogError):
    """Every producer id below 2^63 is reserved: the ProducerIdManager cannot issue another."""


class InvalidTxnStateError(OncelogError):
    """Non-transactional data from a producer whose transaction is still open."""


class TransactionCoordinatorFencedError(OncelogError):
    """A transaction marker from a coordinator epoch older than the one already seen."""


def read_only_error(what: str, path: str, other: str | None = None) -> PermissionError:
    """The error a read-only seam raises for a call that would create or change `path`."""
    return PermissionError(errno.EROFS, f"read-only: {what} refused", path, None, other)


class CleanerError(OncelogError):
    """A cleaning pass could not write its cleaned segment (a full disk, say); the segment
    and the log are as they were, and the next pass tries again."""


class KeylessRecordError(InvalidRecordError):
    """A compacted log refused a batch holding records without a key; `record_indexes` are
    their positions in the batch (Kafka's ProduceResponse names them: KIP-467)."""

    def __init__(self, message: str, record_indexes: tuple[int, ...]):
        super().__init__(message)
        self.record_indexes = record_indexes
