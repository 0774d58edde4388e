"""Records inside a v2 batch: zigzag varints and the record layout.

Pure functions over bytes; no I/O. Decoding bounds every length by the bytes that
are actually there, so malformed input raises CorruptRecordError, never IndexError
or MemoryError.

This is the hot path of producing and consuming, so the record loops are written for
CPython's interpreter: varints of one or two bytes (nearly every field of a real
record) come from lookup tables, the hottest fields inline, and whole records are
built in one pass with few calls. The readable reference is encode_records and
decode_varint; the tests hold the quicker walks to them and to kafka-python.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from oncelog.segments.errors import CorruptRecordError, InvalidRecordError
from oncelog.segments.format import Buffer

Header = tuple[str, bytes | None]


class Record(NamedTuple):
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


_ONE_BYTE = [bytes([n]) for n in range(0x80)]
_NULL = b"\x01"  # zigzag(-1): a null key, value or header value
_TS_HEAD = b"\x00\x00"  # record attributes (always 0) and a zero timestamp delta
_NO_HEADERS = b"\x00"
_new_tuple = tuple.__new__  # builds a Record without the Python-level NamedTuple __new__


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


# Lengths, counts and offset deltas are nearly always below 8192, whose varints take
# one or two bytes: encoding looks them up, and decoding looks up one- and two-byte
# varints by their bytes (a two-byte one by (second << 7) ^ first, first >= 0x80).
_SMALL = 1 << 13
_VARINT_OF = [encode_varint(n) for n in range(_SMALL)]
_ONE_BYTE_VALUE = [(b >> 1) ^ -(b & 1) for b in range(0x80)]
# (second << 7) ^ first is the raw varint with bit 7 flipped, for every first >= 0x80.
_TWO_BYTE_VALUE = [((i ^ 0x80) >> 1) ^ -((i ^ 0x80) & 1) for i in range(1 << 14)]


def _length_varint(n: int) -> bytes:
    return _VARINT_OF[n] if n < _SMALL else encode_varint(n)


def decode_varint(data: Buffer, pos: int, max_bytes: int = 10) -> tuple[int, int]:
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


def _varint(data: Buffer, pos: int, max_bytes: int) -> tuple[int, int]:
    """decode_varint, with one- and two-byte varints looked up."""
    if pos + 1 < len(data):
        first = data[pos]
        if first < 0x80:
            return _ONE_BYTE_VALUE[first], pos + 1
        if data[pos + 1] < 0x80:
            return _TWO_BYTE_VALUE[(data[pos + 1] << 7) ^ first], pos + 2
    return decode_varint(data, pos, max_bytes)


def _encode_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out += _NULL
    else:
        out += _length_varint(len(data))
        out += data


def _encode_headers(headers: object) -> bytes | None:
    """Header count and headers, or None if they are not plain (str, bytes | None) tuples."""
    if type(headers) is not tuple and type(headers) is not list:
        return None
    if not headers:
        return _NO_HEADERS
    small, small_end = _VARINT_OF, _SMALL
    out = bytearray(_length_varint(len(headers)))
    for header in headers:
        if type(header) is not tuple or len(header) != 2:
            return None
        hkey, hvalue = header
        if type(hkey) is not str:
            return None
        try:
            raw_key = hkey.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: the general path raises in its own order
            return None
        n = len(raw_key)
        out += small[n] if n < small_end else encode_varint(n)
        out += raw_key
        if hvalue is None:
            out += _NULL
        elif type(hvalue) is bytes:
            n = len(hvalue)
            out += small[n] if n < small_end else encode_varint(n)
            out += hvalue
        else:
            return None
    return bytes(out)


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
        rec += _length_varint(delta)
        _encode_bytes(rec, key)
        _encode_bytes(rec, value)
        rec += _length_varint(len(headers))
        for hkey, hvalue in headers:
            _encode_bytes(rec, hkey.encode("utf-8"))
            _encode_bytes(rec, hvalue)
        out += _length_varint(len(rec))
        out += rec
    return bytes(out)


# Past the size gates on purpose: the producer's hot path: one inlined pass over the records.
def encode_plain_records(  # noqa: C901
    records: Sequence[object], default_timestamp_ms: int
) -> tuple[bytes, int, int, int] | None:
    """(record bodies, base timestamp, min timestamp, max timestamp) in one pass, or None.

    Handles what producers send: (key, value), (key, value, headers) and Record, with
    bytes or None keys and values and int timestamps. At anything else it returns
    None, and the caller takes the general path (normalise_records, encode_records),
    which accepts or rejects exactly as it always has. The output is byte for byte
    what that path writes.
    """
    first = records[0]
    base_ts = first.timestamp_ms if type(first) is Record else default_timestamp_ms
    if type(base_ts) is not int or type(default_timestamp_ms) is not int:
        return None
    small, small_end = _VARINT_OF, _SMALL
    out = bytearray()
    last_ts = min_ts = max_ts = base_ts
    ts_head = _TS_HEAD
    stamp: object  # a Record's timestamp: checked, since callers may break its annotation
    for delta, rec in enumerate(records):
        if type(rec) is tuple:
            if len(rec) == 2:
                key, value = rec
                tail: bytes | None = _NO_HEADERS
            elif len(rec) == 3:
                key, value, headers = rec
                tail = _encode_headers(headers)
            else:
                return None
            ts = default_timestamp_ms
        elif type(rec) is Record:
            _, stamp, key, value, headers = rec
            if type(stamp) is not int:
                return None
            ts = stamp
            tail = _encode_headers(headers)
        else:
            return None
        if tail is None:
            return None
        if ts != last_ts:
            ts_head = b"\x00" + encode_varint(ts - base_ts)
            last_ts = ts
            if ts > max_ts:
                max_ts = ts
            elif ts < min_ts:
                min_ts = ts
        if key is None:
            key_part = _NULL
        elif type(key) is bytes:
            n = len(key)
            key_part = (small[n] if n < small_end else encode_varint(n)) + key
        else:
            return None
        if type(value) is bytes:
            n = len(value)
            value_length = small[n] if n < small_end else encode_varint(n)
        elif value is None:
            value_length = _NULL
            value = b""
        else:
            return None
        offset_delta = small[delta] if delta < small_end else encode_varint(delta)
        body = b"".join((ts_head, offset_delta, key_part, value_length, value, tail))
        n = len(body)
        out += small[n] if n < small_end else encode_varint(n)
        out += body
    return bytes(out), base_ts, min_ts, max_ts


def _read_headers(data: Buffer, pos: int, end: int) -> tuple[tuple[Header, ...], int]:
    count, pos = _varint(data, pos, 5)
    # Each header takes at least two bytes, which bounds a corrupt count.
    if count < 0 or count * 2 > end - pos:
        raise CorruptRecordError(f"header count {count} at byte {pos} is impossible")
    one_byte = _ONE_BYTE_VALUE
    headers: list[Header] = []
    for _ in range(count):
        if pos < end and data[pos] < 0x80:
            n = one_byte[data[pos]]
            pos += 1
        else:
            n, pos = _varint(data, pos, 5)
        if n == -1:
            raise CorruptRecordError(f"null header key at byte {pos}")
        if n < 0:
            raise CorruptRecordError(f"negative length {n} at byte {pos}")
        stop = pos + n
        if stop > end:
            raise CorruptRecordError(f"length {n} at byte {pos} runs past its record")
        raw_key = data[pos:stop]
        pos = stop
        if pos < end and data[pos] < 0x80:
            n = one_byte[data[pos]]
            pos += 1
        else:
            n, pos = _varint(data, pos, 5)
        if n >= 0:
            stop = pos + n
            if stop > end:
                raise CorruptRecordError(f"length {n} at byte {pos} runs past its record")
            hvalue: bytes | None = bytes(data[pos:stop])  # the same object when `data` is bytes
            pos = stop
        elif n == -1:
            hvalue = None
        else:
            raise CorruptRecordError(f"negative length {n} at byte {pos}")
        try:
            headers.append((str(raw_key, "utf-8"), hvalue))
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"header key is not UTF-8 at byte {pos}") from exc
    return tuple(headers), pos


# Past the size gates on purpose: the read path's hot loop, inlined.
def decode_records(  # noqa: C901, PLR0915
    data: bytes,
    count: int,
    base_offset: int,
    base_timestamp_ms: int,
    log_append_time_ms: int | None,
) -> Iterator[Record]:
    """Yield `count` records from `data`, which must hold exactly those records.

    The record length, offset delta and value length (the fields that routinely take
    two bytes) are decoded inline; the others go through _varint. Every length is
    checked against the record's end, and a read past the data (IndexError) is
    reported as corruption.
    """
    # Long on purpose: the read path's hot loop, one inlined pass per record with no call per field.
    one_byte, two_byte, varint, new_tuple = _ONE_BYTE_VALUE, _TWO_BYTE_VALUE, _varint, _new_tuple
    pos = 0
    size = len(data)
    try:
        for _ in range(count):
            first = data[pos]
            if first < 0x80:
                length = one_byte[first]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                length = two_byte[(second << 7) ^ first]
                pos += 2
            else:
                length, pos = decode_varint(data, pos, 5)
            end = pos + length
            if length < 1 or end > size:
                raise CorruptRecordError(f"record length {length} at byte {pos} does not fit the batch")
            first = data[pos + 1]  # after the attributes byte, which is unused
            if first < 0x80:
                ts_delta = one_byte[first]
                pos += 2
            else:
                ts_delta, pos = varint(data, pos + 1, 10)
            first = data[pos]
            if first < 0x80:
                offset_delta = one_byte[first]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                offset_delta = two_byte[(second << 7) ^ first]
                pos += 2
            else:
                offset_delta, pos = decode_varint(data, pos, 5)
            first = data[pos]
            if first == 1:  # zigzag(-1): the common null key
                key: bytes | None = None
                pos += 1
            else:
                if first < 0x80:
                    n = one_byte[first]
                    pos += 1
                elif (second := data[pos + 1]) < 0x80:
                    n = two_byte[(second << 7) ^ first]
                    pos += 2
                else:
                    n, pos = decode_varint(data, pos, 5)
                if n >= 0:
                    stop = pos + n
                    if stop > end:
                        raise CorruptRecordError(f"length {n} at byte {pos} runs past its record")
                    key = data[pos:stop]
                    pos = stop
                elif n == -1:  # a null key in a longer encoding than usual
                    key = None
                else:
                    raise CorruptRecordError(f"negative length {n} at byte {pos}")
            first = data[pos]
            if first < 0x80:
                n = one_byte[first]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                n = two_byte[(second << 7) ^ first]
                pos += 2
            else:
                n, pos = decode_varint(data, pos, 5)
            if n >= 0:
                stop = pos + n
                if stop > end:
                    raise CorruptRecordError(f"length {n} at byte {pos} runs past its record")
                value: bytes | None = data[pos:stop]
                pos = stop
            elif n == -1:
                value = None
            else:
                raise CorruptRecordError(f"negative length {n} at byte {pos}")
            if data[pos] == 0:
                headers: tuple[Header, ...] = ()
                pos += 1
            else:
                headers, pos = _read_headers(data, pos, end)
            if pos != end:
                raise CorruptRecordError(f"record ends at byte {pos}, its length says {end}")
            timestamp = base_timestamp_ms + ts_delta if log_append_time_ms is None else log_append_time_ms
            yield new_tuple(Record, (base_offset + offset_delta, timestamp, key, value, headers))
    except IndexError:
        raise CorruptRecordError(f"a record runs past the end of the records at byte {pos}") from None
    if pos != size:
        raise CorruptRecordError(f"{size - pos} bytes after the last of {count} records")


# Past the size gates on purpose: the append path's hot loop, inlined.
def check_records(data: Buffer, start: int, count: int, last_offset_delta: int, *, exact: bool) -> int:  # noqa: C901, PLR0915
    """Check that data[start:] holds exactly `count` records that decode_records can read.

    Returns the largest timestamp delta of the records (-1 for none), which the
    caller holds the header's maxTimestamp to: a reader looking up an offset by time
    trusts that field.

    The append path's record check (Kafka's LogValidator walks every record the
    same way): every record's framing is walked (length, attributes, timestamp
    delta, offset delta, key, value, headers, each within its record, and the
    records filling the data exactly), with the same bounds as decode_records,
    which the tests hold it to. Nothing is built for a record without headers: the
    fields are only skipped (headers are rare, and read by the decoder's own loop).

    Offset deltas: `exact` wants 0..count-1 in order (a client's batch, whose count
    is lastOffsetDelta + 1); otherwise they must only increase and stay within
    `last_offset_delta` (a batch compacted by a leader keeps lastOffsetDelta and a
    subset of its records).

    Raises CorruptRecordError for bytes that do not parse as `count` records, and
    InvalidRecordError for records that parse but whose offset deltas break the rule.
    """
    # Long on purpose: the append path's hot loop, one inlined pass per record with no call per field.
    size = len(data)
    # Each record takes at least 7 bytes, which bounds a corrupt count in O(1).
    if count < 0 or count * 7 > size - start:
        raise CorruptRecordError(f"recordsCount {count} cannot fit {size - start} bytes of records")
    one_byte, two_byte = _ONE_BYTE_VALUE, _TWO_BYTE_VALUE
    pos = start
    previous_delta = -1
    max_ts_delta = -1 if count == 0 else -(2**63)
    bad_delta: tuple[int, int] | None = None
    index = 0
    try:
        for index in range(count):
            # The record's length says where it ends; a length that is negative, zero or
            # past the data shows as the fields not ending there (checked once, below).
            first = data[pos]
            if first < 0x80:
                end = pos + 1 + one_byte[first]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                end = pos + 2 + two_byte[(second << 7) ^ first]
                pos += 2
            else:
                length, pos = decode_varint(data, pos, 5)
                end = pos + length
            # The attributes byte (unused), then the timestamp delta: a varlong.
            if (second := data[pos + 1]) < 0x80:
                ts_delta = one_byte[second]
                pos += 2
            else:
                ts_delta, pos = decode_varint(data, pos + 1, 10)
            if ts_delta > max_ts_delta:
                max_ts_delta = ts_delta
            first = data[pos]
            if first < 0x80:
                delta = one_byte[first]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                delta = two_byte[(second << 7) ^ first]
                pos += 2
            else:
                delta, pos = decode_varint(data, pos, 5)
            if bad_delta is None and (
                (delta != index) if exact else (delta <= previous_delta or delta > last_offset_delta)
            ):
                bad_delta = (index, delta)  # raised once the framing is known good: bad bytes come first
            previous_delta = delta
            # Key, then value: a length (-1 is null), then that many bytes, skipped. A length
            # running past the record shows as the record not ending where it says.
            first = data[pos]
            if first < 0x80:
                n = one_byte[first]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                n = two_byte[(second << 7) ^ first]
                pos += 2
            else:
                n, pos = decode_varint(data, pos, 5)
            if n > 0:
                pos += n
            elif n < -1:
                raise CorruptRecordError(f"negative key length {n} in record {index}")
            first = data[pos]
            if first < 0x80:
                n = one_byte[first]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                n = two_byte[(second << 7) ^ first]
                pos += 2
            else:
                n, pos = decode_varint(data, pos, 5)
            if n > 0:
                pos += n
            elif n < -1:
                raise CorruptRecordError(f"negative value length {n} in record {index}")
            if data[pos] == 0:
                pos += 1
            else:
                pos = _read_headers(data, pos, end)[1]
            if pos != end:
                raise CorruptRecordError(_misfit(index, pos, end, size))
    except IndexError:
        raise CorruptRecordError(
            f"the records end inside record {index} of recordsCount {count} (byte {pos})"
        ) from None
    if pos != size:
        raise CorruptRecordError(f"{size - pos} bytes after the last of recordsCount {count} records")
    if bad_delta is not None:
        raise InvalidRecordError(_bad_delta(*bad_delta, count, last_offset_delta, exact))
    return max_ts_delta


def _bad_delta(index: int, delta: int, count: int, last_offset_delta: int, exact: bool) -> str:
    if exact:
        return f"record {index} has offset delta {delta}: a batch of {count} records has 0..{count - 1}"
    return (
        f"record {index} has offset delta {delta}: deltas must increase and stay within "
        f"lastOffsetDelta {last_offset_delta}"
    )


def _misfit(index: int, pos: int, end: int, size: int) -> str:
    if end > size:
        return f"record {index}'s length runs {end - size} bytes past the records"
    return f"record {index}'s fields end at byte {pos}, its length says {end}"


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
