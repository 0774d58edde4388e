"""Constants of Kafka's record batch v2 layout, shared by codec and readers.

All multi-byte fields are big-endian. The CRC (CRC-32C) covers bytes
[ATTRIBUTES_OFFSET, end), so baseOffset, batchLength, partitionLeaderEpoch and
magic can be rewritten without recomputing it.
"""

from __future__ import annotations

import operator
import struct

# Bytes a caller hands in: every reader and writer of batches takes any of these.
Buffer = bytes | bytearray | memoryview

BASE_OFFSET_OFFSET = 0  # i64
LENGTH_OFFSET = 8  # i32, batch size minus LOG_OVERHEAD
PARTITION_LEADER_EPOCH_OFFSET = 12  # i32
MAGIC_OFFSET = 16  # i8
CRC_OFFSET = 17  # u32
ATTRIBUTES_OFFSET = 21  # i16; first byte covered by the CRC
LAST_OFFSET_DELTA_OFFSET = 23  # i32
BASE_TIMESTAMP_OFFSET = 27  # i64
MAX_TIMESTAMP_OFFSET = 35  # i64
PRODUCER_ID_OFFSET = 43  # i64
PRODUCER_EPOCH_OFFSET = 51  # i16
BASE_SEQUENCE_OFFSET = 53  # i32
RECORDS_COUNT_OFFSET = 57  # i32
HEADER_SIZE = 61

# baseOffset + batchLength: the bytes not counted by batchLength.
LOG_OVERHEAD = 12
# Enough of the header to know a batch's size and magic.
SIZE_AND_MAGIC_BYTES = 17

MAGIC_V2 = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08  # set: LogAppendTime
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
COMPRESSION_CODES = {name: code for code, name in COMPRESSION_NAMES.items()}

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# The largest offset a batch may take: the log end after it (one past) must fit an i64
# too, since it is stored (recovery point, snapshot offset, log start) as one.
MAX_OFFSET = INT64_MAX - 1
# The signed fixed-width fields a caller's integer can end up packed into.
INT_RANGES = {"i16": (INT16_MIN, INT16_MAX), "i32": (INT32_MIN, INT32_MAX), "i64": (INT64_MIN, INT64_MAX)}


def check_int(name: str, value: object, width: str, *, minimum: int | None = None) -> int:
    """`value` if it is an integer that fits the field `width` ("i16", "i32", "i64"), and is at
    least `minimum` if given.

    The one check of a caller's integer bound for a fixed-width field, made where it
    enters the public API: a ValueError naming the argument rather than struct.error
    from deep inside (or worse, wrong bytes); TypeError if it is not an integer.
    """
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    low, high = INT_RANGES[width]
    if minimum is not None:
        low = max(low, minimum)
    if not low <= number <= high:
        raise ValueError(f"{name} must be in {low}..{high} (an {width} field), got {number}")
    return number


# The whole header in one unpack: baseOffset, batchLength, partitionLeaderEpoch,
# magic, crc, attributes, lastOffsetDelta, baseTimestamp, maxTimestamp,
# producerId, producerEpoch, baseSequence, recordsCount.
HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
# The fields the CRC covers, from ATTRIBUTES_OFFSET to the first record.
CRC_COVERED_HEADER_STRUCT = struct.Struct(">hiqqqhii")
SIZE_AND_MAGIC_STRUCT = struct.Struct(">qiib")
INT64 = struct.Struct(">q")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")

assert HEADER_STRUCT.size == HEADER_SIZE
assert SIZE_AND_MAGIC_STRUCT.size == SIZE_AND_MAGIC_BYTES
assert CRC_COVERED_HEADER_STRUCT.size == HEADER_SIZE - ATTRIBUTES_OFFSET

# Control records (transaction markers): key = version i16 + type i16.
CONTROL_TYPE_ABORT = 0
CONTROL_TYPE_COMMIT = 1
