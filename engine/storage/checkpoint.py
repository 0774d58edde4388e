"""What a log records durably about itself in its metadata store (LMDB).

The recovery point (below it everything was fsynced, in offsets and in bytes), the
log start offset, whether only clients ever appended, and producers retired since
the last snapshot. Each value is one atomic, durable commit of the store; the
recovery decision (`oncelog.recovery.plan`) reads the recovery point from here.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from oncelog.storage.fs import MetadataStore
from oncelog.storage.metadata_values import read_value


class RecoveryPoint(NamedTuple):
    """Offsets below `offset` were fsynced; in bytes, everything of segment
    `segment_base` before `position`, and every segment before it."""

    offset: int
    segment_base: int | None = None  # None in stores written before positions were kept
    position: int = 0

    def covers(self, segment_base: int, position: int) -> bool:
        """Was the byte at `position` of segment `segment_base` fsynced before the crash?"""
        if self.segment_base is None:
            return False
        return segment_base < self.segment_base or (
            segment_base == self.segment_base and position < self.position
        )


NO_RECOVERY_POINT = RecoveryPoint(0)  # a missing store: nothing is known to be durable


RECOVERY_POINT_KEY = "recovery_point"
# Where the recovery point falls in bytes: the segment holding it and the position
# in that segment up to which everything was fsynced. A bad batch is judged by its
# position, not by the offsets damaged bytes claim: a misdirected write can put a
# valid batch from the tail over durable data.
RECOVERY_SEGMENT_KEY = "recovery_point_segment"
RECOVERY_POSITION_KEY = "recovery_point_position"
# 1 while every batch came from a client append: offsets then follow each other
# exactly and partitionLeaderEpoch is oncelog's stamp (-1). Recovery and reads check
# both, which catches a valid batch moved by a misdirected write and bit flips in
# the header fields no CRC covers (baseOffset, partitionLeaderEpoch). The first
# replication append (a leader's offsets and epochs, perhaps with gaps) clears it.
CLIENT_ONLY_KEY = "client_appends_only"
# The first offset a read may ask for: moved by delete_records and retention, durable
# before the segments below it are deleted.
LOG_START_KEY = "log_start_offset"
# The end of the last cleaning pass of a compacted log: what lies past it is dirty
# (oncelog.log_cleaner). Lost, the next pass takes the whole log as dirty: slower, not wrong.
CLEANER_CHECKPOINT_KEY = "cleaner_checkpoint"
# The earliest delete horizon (KIP-534) the last pass left in a batch: a tombstone or marker
# may be removed from then on, so the background cleaner takes the log again then.
CLEANER_HORIZON_KEY = "cleaner_delete_horizon_ms"
# RETIRED_PREFIX + producer id -> the log end when Log.retire_producers forgot it. Until
# a snapshot written after it holds the table without them, recovery replaying the
# tail must not bring them back (they would take slots). Removed once one is durable.
RETIRED_PREFIX = "retired/"


def read_retired(store: MetadataStore) -> dict[int, int]:
    """Producer id -> the log end when it was retired, for retirements no snapshot holds yet."""
    retired = {}
    for key in store.keys(RETIRED_PREFIX):
        offset = read_offset(store, key)
        if offset is not None:
            retired[int(key[len(RETIRED_PREFIX) :])] = offset
    return retired


def forget_retired(store: MetadataStore) -> None:
    """A snapshot holding the retirements is durable: their records are no longer needed."""
    keys = store.keys(RETIRED_PREFIX)
    if keys:
        store.delete(keys)


def read_recovery_point(store: MetadataStore) -> RecoveryPoint:
    offset = read_offset(store, RECOVERY_POINT_KEY) or 0
    segment_base = read_offset(store, RECOVERY_SEGMENT_KEY)
    position = read_offset(store, RECOVERY_POSITION_KEY) or 0
    return RecoveryPoint(offset, segment_base, position)


def write_recovery_point(store: MetadataStore, point: RecoveryPoint) -> None:
    assert point.segment_base is not None and point.segment_base <= point.offset, point
    # One atomic LMDB commit: the three values never disagree after a crash.
    write_offsets(
        store,
        {
            RECOVERY_POINT_KEY: point.offset,
            RECOVERY_SEGMENT_KEY: point.segment_base,
            RECOVERY_POSITION_KEY: point.position,
        },
    )


_OFFSET = struct.Struct(">q")


def read_offset(store: MetadataStore, key: str) -> int | None:
    """The offset stored at `key` (None if absent); CorruptMetadataError if it is not one."""
    return read_value(store, key, _decode_offset)


def recorded_log_start(store: MetadataStore) -> int | None:
    """Where the store says the log starts; None if it cannot say (a Kafka directory, a lost store).

    A log made here starts empty at 0 with its flag committed, and every deletion from
    the front commits the new start before any file goes: so the first segment can
    never start past this, unless a segment file was lost.
    """
    start = read_offset(store, LOG_START_KEY)
    if start is None and read_offset(store, CLIENT_ONLY_KEY) is not None:
        return 0
    return start


def _decode_offset(raw: bytes) -> int:
    return int(_OFFSET.unpack(raw)[0])


def write_offsets(store: MetadataStore, values: dict[str, int]) -> None:
    store.put({key: _OFFSET.pack(value) for key, value in values.items()})
