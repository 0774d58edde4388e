"""Records inside a v2 batch: zigzag varints and the record layout (brief §3).

Pure functions over bytes; no I/O. Decoding bounds every length by the bytes that
are actually there, so malformed input raises CorruptRecordError, never IndexError
or MemoryError.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from oncelog.errors import CorruptRecordError

Header = tuple[str, bytes | None]


class Record(NamedTuple):
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


# Zigzag varints of -64..63 fit one byte and cover almost every delta and length
# in practice, so they are precomputed.
_ONE_BYTE = [bytes([n]) for n in range(128)]


def encode_varint(value: int) -> bytes:
    """Zigzag varint of a signed value (protobuf sint32/sint64)."""
    zz = (value << 1) ^ (value >> 63)
    if zz < 0x80:
        return _ONE_BYTE[zz]
    out = bytearray()
    while zz >= 0x80:
        out.append((zz & 0x7F) | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


def decode_varint(data: bytes, pos: int, max_bytes: int = 10) -> tuple[int, int]:
    """(value, next position) of the zigzag varint at `pos`.

    `max_bytes` is 5 for an int32 field and 10 for an int64 one; a value wider than
    the field is corrupt (Java would silently drop the high bits).
    """
    raw = 0
    shift = 0
    end = pos + max_bytes
    while True:
        if pos >= len(data):
            raise CorruptRecordError(f"varint runs past the end of the records at byte {pos}")
        if pos >= end:
            raise CorruptRecordError(f"varint longer than {max_bytes} bytes at byte {pos}")
        b = data[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            if raw >> (32 if max_bytes == 5 else 64):
                raise CorruptRecordError(f"varint at byte {pos} overflows a {max_bytes}-byte field")
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def _encode_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out += _ONE_BYTE[1]  # zigzag(-1)
    else:
        out += encode_varint(len(data))
        out += data


def encode_records(
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[Header]]],
    timestamps_ms: Sequence[int],
    base_timestamp_ms: int,
) -> bytes:
    """The concatenated record bodies, offset deltas 0..n-1."""
    out = bytearray()
    for delta, ((key, value, headers), ts) in enumerate(zip(records, timestamps_ms, strict=True)):
        rec = bytearray(b"\x00")  # record attributes: unused, always 0
        rec += encode_varint(ts - base_timestamp_ms)
        rec += encode_varint(delta)
        _encode_bytes(rec, key)
        _encode_bytes(rec, value)
        rec += encode_varint(len(headers))
        for hkey, hvalue in headers:
            _encode_bytes(rec, hkey.encode("utf-8"))
            _encode_bytes(rec, hvalue)
        out += encode_varint(len(rec))
        out += rec
    return bytes(out)


def _read_bytes(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = decode_varint(data, pos, 5)
    if length < 0:
        if length != -1:
            raise CorruptRecordError(f"negative length {length} at byte {pos}")
        return None, pos
    if pos + length > end:
        raise CorruptRecordError(f"length {length} at byte {pos} runs past its record")
    return data[pos : pos + length], pos + length


def decode_records(
    data: bytes,
    count: int,
    base_offset: int,
    base_timestamp_ms: int,
    log_append_time_ms: int | None,
) -> Iterator[Record]:
    """Yield `count` records from `data`, which must hold exactly those records."""
    pos = 0
    size = len(data)
    for _ in range(count):
        length, pos = decode_varint(data, pos, 5)
        end = pos + length
        if length < 1 or end > size:
            raise CorruptRecordError(f"record length {length} at byte {pos} does not fit the batch")
        pos += 1  # record attributes
        ts_delta, pos = decode_varint(data, pos, 10)
        offset_delta, pos = decode_varint(data, pos, 5)
        key, pos = _read_bytes(data, pos, end)
        value, pos = _read_bytes(data, pos, end)
        header_count, pos = decode_varint(data, pos, 5)
        # Each header takes at least two bytes, which bounds a corrupt count.
        if header_count < 0 or header_count * 2 > end - pos:
            raise CorruptRecordError(f"header count {header_count} at byte {pos} is impossible")
        headers: list[Header] = []
        for _ in range(header_count):
            hkey, pos = _read_bytes(data, pos, end)
            if hkey is None:
                raise CorruptRecordError(f"null header key at byte {pos}")
            hvalue, pos = _read_bytes(data, pos, end)
            try:
                headers.append((hkey.decode("utf-8"), hvalue))
            except UnicodeDecodeError as exc:
                raise CorruptRecordError(f"header key is not UTF-8 at byte {pos}") from exc
        if pos != end:
            raise CorruptRecordError(f"record ends at byte {pos}, its length says {end}")
        timestamp = log_append_time_ms if log_append_time_ms is not None else base_timestamp_ms + ts_delta
        yield Record(base_offset + offset_delta, timestamp, key, value, tuple(headers))
    if pos != size:
        raise CorruptRecordError(f"{size - pos} bytes after the last of {count} records")


def normalise_records(
    records: Iterable[object],
) -> tuple[list[tuple[bytes | None, bytes | None, Sequence[Header]]], list[int | None]]:
    """Split caller records into (key, value, headers) and their own timestamps (or None)."""
    triples: list[tuple[bytes | None, bytes | None, Sequence[Header]]] = []
    stamps: list[int | None] = []
    for rec in records:
        if isinstance(rec, Record):
            triples.append((rec.key, rec.value, rec.headers))
            stamps.append(rec.timestamp_ms)
        elif isinstance(rec, tuple) and len(rec) == 2:
            triples.append((rec[0], rec[1], ()))
            stamps.append(None)
        elif isinstance(rec, tuple) and len(rec) == 3:
            triples.append((rec[0], rec[1], rec[2]))
            stamps.append(None)
        else:
            raise TypeError(f"a record is (key, value), (key, value, headers) or Record, got {rec!r}")
    for key, value, headers in triples:
        for field in (key, value):
            if field is not None and not isinstance(field, bytes | bytearray | memoryview):
                raise TypeError(f"record keys and values are bytes or None, got {type(field).__name__}")
        for header in headers:
            if not (isinstance(header, tuple) and len(header) == 2 and isinstance(header[0], str)):
                raise TypeError(f"a header is (str, bytes | None), got {header!r}")
    return triples, stamps
