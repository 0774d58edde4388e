"""LogConfig: every tunable of a Log, with Kafka's defaults where Kafka has one."""

from __future__ import annotations

import dataclasses
from typing import Literal

from oncelog.segments.compression import MAX_DECOMPRESSED_BYTES

TimestampType = Literal["CreateTime", "LogAppendTime"]
OnCorruption = Literal["raise", "truncate"]
# Kafka's compression.type: "producer" stores batches as the client compressed them.
# Kafka's cleanup.policy: delete whole old segments, keep each key's newest record, or both.
CleanupPolicy = Literal["delete", "compact", "compact,delete"]
CLEANUP_POLICIES: tuple[CleanupPolicy, ...] = ("delete", "compact", "compact,delete")
CompressionType = Literal["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"]
COMPRESSION_TYPES: tuple[CompressionType, ...] = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


@dataclasses.dataclass(frozen=True)
class LogConfig:
    # A segment rolls once appending the next batch would take it past this size.
    segment_bytes: int = 1024 * 1024 * 1024
    # A segment rolls once it has been open this long (Kafka's segment.ms, 7 days).
    segment_ms: int = 7 * 24 * 3600 * 1000
    # An offset/time index entry is added after this many bytes since the last one.
    index_interval_bytes: int = 4096
    # Pre-allocated size of each index file; a full index rolls the segment.
    segment_index_bytes: int = 10 * 1024 * 1024
    # Largest batch accepted from a client (Kafka's max.message.bytes).
    max_batch_bytes: int = 1024 * 1024 + 12
    # Largest body a compressed batch may inflate to on append: every appended batch is
    # decompressed to check its records, and a decompression bomb is refused past this.
    # At most what readers inflate (segments.compression.MAX_DECOMPRESSED_BYTES), so
    # that every batch accepted can be read.
    max_decompressed_batch_bytes: int = 64 * 1024 * 1024
    # "LogAppendTime" stamps the append time into every batch (attributes bit 3).
    timestamp_type: TimestampType = "CreateTime"
    # Kafka's compression.type: a client batch in another codec is stored recompressed
    # into this one (its records' bytes and every header field kept but the codec bits,
    # the length and the CRC), as Kafka's broker does; "producer" stores it as sent.
    compression_type: CompressionType = "producer"
    # Kafka's cleanup.policy. "compact" keeps each key's newest record (oncelog.log_cleaner)
    # and refuses records without a key; "delete" applies retention_ms / retention_bytes;
    # "compact,delete" does both.
    cleanup_policy: CleanupPolicy = "delete"
    # Kafka's delete.retention.ms: a compacted log keeps a tombstone (and an emptied
    # transaction's marker) this long after the cleaning that first saw it.
    delete_retention_ms: int = 24 * 3600 * 1000
    # Kafka's min.cleanable.dirty.ratio: a compacted log is cleaned once the part not yet
    # cleaned is at least this share of its cleanable bytes.
    min_cleanable_dirty_ratio: float = 0.5
    # Kafka's min.compaction.lag.ms / max.compaction.lag.ms: a record stays uncompacted at
    # least the first, and a dirty log is cleaned, whatever its ratio, once its oldest
    # dirty segment is older than the second (by batch timestamps, as Kafka's).
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    # fsync after this many appended messages / this long since the last flush;
    # None leaves durability to explicit flush() calls (Kafka's default).
    flush_messages: int | None = None
    flush_ms: int | None = None
    # A flush makes its data durable with one fdatasync of the segment. The recovery point
    # (what lets an unclean open tell a bit flipped in fsynced bytes, which it reports, from
    # a torn tail, which it cuts) costs an LMDB commit, two more syncs: flushes commit it
    # at most this often, and every roll, clean close and Log.checkpoint() does. 0: every
    # flush commits it. (Kafka's log.flush.offset.checkpoint.interval.ms, 60 s there.)
    recovery_point_interval_ms: int = 1000
    # Bad bytes below the recovery point: raise CorruptLogError, or cut the log there.
    on_corruption: OnCorruption = "raise"
    # Rows in the producer table (160 bytes each, touched only as producers arrive),
    # plus ~24 bytes each for the pid map and due times, allocated up front.
    producer_capacity: int = 100_000
    # A producer the engine has not appended for in this long (on the Log's clock,
    # never by batch timestamps) with no open transaction is forgotten; its next batch
    # is accepted at any sequence.
    producer_expiration_ms: int = 24 * 3600 * 1000
    # Retention (Kafka's defaults): whole sealed segments older than retention_ms (by
    # their newest timestamp), or past retention_bytes of log, are deleted by
    # apply_retention(). None: no limit.
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    retention_bytes: int | None = None

    # Past the size gates on purpose: one independent range check per field.
    def __post_init__(self) -> None:  # noqa: C901
        # A 61-byte header plus one minimal record must fit in a segment and a batch.
        if self.segment_bytes < 1024:
            raise ValueError(f"segment_bytes must be >= 1024, got {self.segment_bytes}")
        if self.segment_bytes > 2**31 - 1:
            # Index entries store file positions as i32 (Kafka's layout).
            raise ValueError(f"segment_bytes must fit an i32 position, got {self.segment_bytes}")
        if self.segment_ms <= 0:
            raise ValueError(f"segment_ms must be positive, got {self.segment_ms}")
        if self.index_interval_bytes < 0:
            raise ValueError(f"index_interval_bytes must be >= 0, got {self.index_interval_bytes}")
        if self.segment_index_bytes < 12 * 4:
            raise ValueError(f"segment_index_bytes must hold a few entries, got {self.segment_index_bytes}")
        if self.max_batch_bytes < 61 + 8:
            raise ValueError(f"max_batch_bytes must hold a batch header, got {self.max_batch_bytes}")
        if not 0 < self.max_decompressed_batch_bytes <= MAX_DECOMPRESSED_BYTES:
            raise ValueError(
                f"max_decompressed_batch_bytes must be in 1..{MAX_DECOMPRESSED_BYTES} (what readers "
                f"inflate), got {self.max_decompressed_batch_bytes}"
            )
        if self.flush_messages is not None and self.flush_messages <= 0:
            raise ValueError(f"flush_messages must be positive or None, got {self.flush_messages}")
        if self.flush_ms is not None and self.flush_ms < 0:
            raise ValueError(f"flush_ms must be >= 0 or None, got {self.flush_ms}")
        if self.recovery_point_interval_ms < 0:
            raise ValueError(
                f"recovery_point_interval_ms must be >= 0, got {self.recovery_point_interval_ms}"
            )
        if self.on_corruption not in ("raise", "truncate"):
            raise ValueError(f"on_corruption must be 'raise' or 'truncate', got {self.on_corruption!r}")
        if self.producer_expiration_ms <= 0:
            raise ValueError(f"producer_expiration_ms must be positive, got {self.producer_expiration_ms}")
        if self.retention_ms is not None and self.retention_ms < 0:
            raise ValueError(f"retention_ms must be >= 0 or None, got {self.retention_ms}")
        if self.retention_bytes is not None and self.retention_bytes < 0:
            raise ValueError(f"retention_bytes must be >= 0 or None, got {self.retention_bytes}")
        if self.producer_capacity <= 0:
            raise ValueError(f"producer_capacity must be positive, got {self.producer_capacity}")
        if self.delete_retention_ms < 0:
            raise ValueError(f"delete_retention_ms must be >= 0, got {self.delete_retention_ms}")
        self._check_compaction()
        if self.compression_type not in COMPRESSION_TYPES:
            raise ValueError(
                f"compression_type must be one of {COMPRESSION_TYPES}, got {self.compression_type!r}"
            )
        if self.timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise ValueError(
                f"timestamp_type must be CreateTime or LogAppendTime, got {self.timestamp_type!r}"
            )

    @property
    def compacted(self) -> bool:
        """Whether the cleaner keeps only each key's newest record (and keys are required)."""
        return self.cleanup_policy != "delete"

    @property
    def deletes_old_segments(self) -> bool:
        """Whether retention_ms / retention_bytes delete whole old segments."""
        return self.cleanup_policy != "compact"

    def _check_compaction(self) -> None:
        if self.cleanup_policy not in CLEANUP_POLICIES:
            raise ValueError(f"cleanup_policy must be one of {CLEANUP_POLICIES}, got {self.cleanup_policy!r}")
        if not 0.0 <= self.min_cleanable_dirty_ratio <= 1.0:
            raise ValueError(
                f"min_cleanable_dirty_ratio must be in [0, 1], got {self.min_cleanable_dirty_ratio}"
            )
        if self.min_compaction_lag_ms < 0:
            raise ValueError(f"min_compaction_lag_ms must be >= 0, got {self.min_compaction_lag_ms}")
        if self.max_compaction_lag_ms < 1:
            raise ValueError(f"max_compaction_lag_ms must be >= 1, got {self.max_compaction_lag_ms}")
