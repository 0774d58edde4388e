"""Which partition a keyed row goes to: Kafka's default partitioner (murmur2 of the key).

Rows with a key land where a Kafka producer would put them, so a topic written by
Spark and one written by Kafka clients agree. Pure: no I/O.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """32-bit MurmurHash2 as Kafka's Utils.murmur2 computes it (returned unsigned)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    tail = length % 4
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's choice for a non-null key: positive murmur2 modulo the partition count."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
