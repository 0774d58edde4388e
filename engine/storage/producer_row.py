"""The producer row: one layout for the in-memory producer table, snapshots and C.

`oncelog.producer_state` keeps one row per idempotent producer in a numpy array of
PRODUCER_DTYPE; `oncelog.storage.snapshot` writes and reads those rows as they are;
the compiled append (`engine/_append.c`) reads and writes them by byte offset, which
its LAYOUT export names and a test checks against this dtype. It sits in storage so
that the snapshot files, below producer state, and the table above share one layout.
"""

from __future__ import annotations

import struct

import numpy as np

# Kafka keeps the metadata of each producer's last 5 batches for duplicate detection.
WINDOW = 5

PRODUCER_DTYPE = np.dtype(
    [
        ("producer_id", "<i8"),
        # When the engine last appended a batch or marker for it, on the Log's clock:
        # the only time expiry reads. Client timestamps never move it.
        ("last_append_ms", "<i8"),
        # The newest batch's max timestamp (the client's clock): Kafka's lastTimestamp,
        # kept for dump, stat and Kafka-style output. Never read by expiry.
        ("last_timestamp_ms", "<i8"),
        ("txn_first_offset", "<i8"),  # first offset of the open transaction, or -1
        ("coordinator_epoch", "<i4"),
        ("producer_epoch", "<i2"),
        ("window_count", "u1"),  # batches held, oldest first
        ("live", "u1"),  # 0 for a free slot or a tombstone left by expiry
        # A batch's first sequence is not stored: it is last_sequence - offset_delta
        # (first_sequence_of), as in Kafka's snapshot.
        ("last_sequence", "<i4", (WINDOW,)),
        ("last_offset", "<i8", (WINDOW,)),
        ("offset_delta", "<i4", (WINDOW,)),  # last_offset - first_offset of the batch
        ("max_timestamp_ms", "<i8", (WINDOW,)),
    ]
)
ROW = struct.Struct(f"<qqqqihBB{WINDOW}i{WINDOW}q{WINDOW}i{WINDOW}q")
assert ROW.size == PRODUCER_DTYPE.itemsize == 160
# The row's fixed head, up to the window: producer_id .. live (the fields a load checks).
ROW_HEAD = struct.Struct("<qqqqihBB")
_OFFSETS = {name: int(field[1]) for name, field in (PRODUCER_DTYPE.fields or {}).items()}
assert ROW_HEAD.size == _OFFSETS["last_sequence"]
LAST_APPEND_AT = _OFFSETS["last_append_ms"]
LIVE_AT = _OFFSETS["live"]
# Up to this many rows, the checks of a Log open go row by row in Python: numpy on a
# handful of elements costs 5-10 us a call in the middle of an open (caches cold), a
# loop about 1 us. The same rules either way.
FEW_ROWS = 32
# A row whose last append time is not known (a Kafka snapshot, an older oncelog one):
# the load decides it (ProducerStateManager.load_rows).
UNKNOWN_APPEND_MS = -1
