"""LogConfig: every tunable of a Log, with Kafka's defaults where Kafka has one."""

from __future__ import annotations

import dataclasses
from typing import Literal

TimestampType = Literal["CreateTime", "LogAppendTime"]


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
    # "LogAppendTime" stamps the append time into every batch (attributes bit 3).
    timestamp_type: TimestampType = "CreateTime"

    def __post_init__(self) -> None:
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
        if self.timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise ValueError(
                f"timestamp_type must be CreateTime or LogAppendTime, got {self.timestamp_type!r}"
            )
