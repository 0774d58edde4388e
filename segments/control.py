"""Transaction markers: the COMMIT and ABORT control batches.

Pure: no I/O. A marker is a control batch (attributes: transactional | control)
holding one record whose key is (version i16, type i16) and whose value is
(version i16, coordinatorEpoch i32), as Kafka writes them. Other control types
(KRaft's leader-change and snapshot records, say) are not markers: they carry
no producer and change no transaction.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, encode_batch

CONTROL_KEY = struct.Struct(">hh")  # version, type
END_TXN_MARKER_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch
CONTROL_RECORD_VERSION = 0

# Kafka's ControlRecordType, by number. Only ABORT and COMMIT are transaction markers;
# the others are KRaft's (__cluster_metadata) and carry no producer.
CONTROL_TYPE_NAMES = {
    fmt.CONTROL_TYPE_ABORT: "ABORT",
    fmt.CONTROL_TYPE_COMMIT: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}


class TxnMarker(NamedTuple):
    commit: bool
    coordinator_epoch: int


def encode_txn_marker(
    producer_id: int,
    producer_epoch: int,
    *,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
    base_offset: int = 0,
) -> bytes:
    """One control batch holding a COMMIT or ABORT marker for `producer_id`."""
    assert producer_id >= 0, producer_id  # a marker always closes some producer's transaction
    marker_type = fmt.CONTROL_TYPE_COMMIT if commit else fmt.CONTROL_TYPE_ABORT
    key = CONTROL_KEY.pack(CONTROL_RECORD_VERSION, marker_type)
    value = END_TXN_MARKER_VALUE.pack(CONTROL_RECORD_VERSION, coordinator_epoch)
    batch = encode_batch(
        [(key, value)],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=fmt.NO_SEQUENCE,
        is_transactional=True,
        timestamp_ms=timestamp_ms,
        control=True,
    )
    return batch


def decode_txn_marker(batch: RecordBatch) -> TxnMarker | None:
    """The marker a control batch holds; None for an empty control batch or another control type.

    An empty control batch (compaction can leave one) closes nothing, as in Kafka.
    """
    assert batch.is_control, batch
    for record in batch.records():
        key, value = record.key, record.value
        if key is None or len(key) < CONTROL_KEY.size:
            return None
        _, marker_type = CONTROL_KEY.unpack_from(key)
        if marker_type not in (fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT):
            return None
        if value is None or len(value) < END_TXN_MARKER_VALUE.size:
            return None
        _, coordinator_epoch = END_TXN_MARKER_VALUE.unpack_from(value)
        return TxnMarker(marker_type == fmt.CONTROL_TYPE_COMMIT, coordinator_epoch)
    return None
