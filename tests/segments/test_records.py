"""Zigzag varints and the record layout inside a v2 batch (brief §3, "Record layout")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.errors import CorruptRecordError
from oncelog.segments.records import (
    Record,
    decode_records,
    decode_varint,
    encode_plain_records,
    encode_records,
    encode_varint,
    normalise_records,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

int64s = st.integers(INT64_MIN, INT64_MAX)
int32s = st.integers(INT32_MIN, INT32_MAX)
nullable_bytes = st.none() | st.binary(max_size=40)
headers = st.lists(st.tuples(st.text(max_size=10), nullable_bytes), max_size=4)
record_triples = st.tuples(nullable_bytes, nullable_bytes, headers)


def zigzag_reference(value: int) -> bytes:
    """An independent (slow, obvious) zigzag varint encoder for cross-checking."""
    zz = value * 2 if value >= 0 else -value * 2 - 1
    out = []
    while True:
        low, zz = zz % 128, zz // 128
        if zz:
            out.append(low + 128)
        else:
            out.append(low)
            return bytes(out)


# -- varints ----------------------------------------------------------------------------


@settings(deadline=None)
@given(int64s)
def test_varint_round_trips_every_int64(value: int) -> None:
    encoded = encode_varint(value)
    assert 1 <= len(encoded) <= 10
    assert decode_varint(encoded, 0) == (value, len(encoded))


@settings(deadline=None)
@given(int32s)
def test_varint_round_trips_every_int32_within_five_bytes(value: int) -> None:
    encoded = encode_varint(value)
    assert len(encoded) <= 5
    assert decode_varint(encoded, 0, 5) == (value, len(encoded))


@settings(deadline=None)
@given(int64s)
def test_varint_encoding_matches_reference_zigzag(value: int) -> None:
    assert encode_varint(value) == zigzag_reference(value)


@settings(deadline=None)
@given(st.binary(max_size=8), int64s, st.binary(max_size=8))
def test_varint_decodes_at_a_position_inside_a_larger_buffer(
    prefix: bytes, value: int, suffix: bytes
) -> None:
    encoded = encode_varint(value)
    buffer = prefix + encoded + suffix
    assert decode_varint(buffer, len(prefix)) == (value, len(prefix) + len(encoded))


@settings(deadline=None)
@given(st.lists(int64s, min_size=1, max_size=20))
def test_concatenated_varints_decode_in_sequence(values: list[int]) -> None:
    buffer = b"".join(encode_varint(v) for v in values)
    pos = 0
    decoded = []
    for _ in values:
        value, pos = decode_varint(buffer, pos)
        decoded.append(value)
    assert decoded == values
    assert pos == len(buffer)


@pytest.mark.parametrize(
    ("value", "hex_encoding"),
    [
        (0, "00"),
        (-1, "01"),
        (1, "02"),
        (63, "7e"),
        (-64, "7f"),
        (64, "8001"),
        (-65, "8101"),
        (300, "d804"),
        (INT32_MAX, "feffffff0f"),
        (INT32_MIN, "ffffffff0f"),
        (INT64_MAX, "fe" + "ff" * 8 + "01"),
        (INT64_MIN, "ff" * 9 + "01"),
    ],
)
def test_varint_known_encodings(value: int, hex_encoding: str) -> None:
    assert encode_varint(value).hex() == hex_encoding
    assert decode_varint(bytes.fromhex(hex_encoding), 0) == (value, len(hex_encoding) // 2)


def test_decode_varint_rejects_varlong_longer_than_ten_bytes() -> None:
    overlong = b"\x80" * 10 + b"\x00"
    with pytest.raises(CorruptRecordError, match="longer than 10"):
        decode_varint(overlong, 0)


def test_decode_varint_rejects_varint_longer_than_its_max_bytes() -> None:
    assert decode_varint(b"\x80" * 4 + b"\x00", 0, 5) == (0, 5)
    with pytest.raises(CorruptRecordError, match="longer than 5"):
        decode_varint(b"\x80" * 5 + b"\x00", 0, 5)


def test_decode_varint_rejects_empty_input() -> None:
    with pytest.raises(CorruptRecordError, match="past the end"):
        decode_varint(b"", 0)


def test_decode_varint_rejects_a_position_past_the_end() -> None:
    with pytest.raises(CorruptRecordError):
        decode_varint(b"\x02", 1)


@settings(deadline=None)
@given(st.one_of(int64s.filter(lambda v: v >= 64), int64s.filter(lambda v: v < -64)))
def test_decode_varint_rejects_every_truncation_of_a_multibyte_varint(value: int) -> None:
    encoded = encode_varint(value)
    assert len(encoded) > 1
    for cut in range(len(encoded)):
        with pytest.raises(CorruptRecordError):
            decode_varint(encoded[:cut], 0)


def _varint_shaped(max_len: int) -> st.SearchStrategy[bytes]:
    """Byte strings of continuation bytes closed by a final byte: well-formed varints."""
    return st.builds(
        lambda more, last: bytes(more) + bytes([last]),
        st.lists(st.integers(0x80, 0xFF), max_size=max_len - 1),
        st.integers(0, 0x7F),
    )


@settings(deadline=None)
@given(_varint_shaped(5))
def test_decode_varint_of_five_bytes_yields_an_int32_or_raises(data: bytes) -> None:
    """A varint (sint32, max 5 bytes) never decodes to anything wider than an int32.

    Kafka's ByteUtils.readVarint and protobuf keep only 32 bits; bits beyond must be
    rejected (or dropped like Java does), never returned as a wider integer.
    """
    try:
        value, pos = decode_varint(data, 0, 5)
    except CorruptRecordError:
        return
    assert 0 < pos <= 5
    assert INT32_MIN <= value <= INT32_MAX


@settings(deadline=None)
@given(_varint_shaped(10))
def test_decode_varint_of_ten_bytes_yields_an_int64_or_raises(data: bytes) -> None:
    """A varlong (sint64, max 10 bytes) never decodes to anything wider than an int64."""
    try:
        value, pos = decode_varint(data, 0, 10)
    except CorruptRecordError:
        return
    assert 0 < pos <= 10
    assert INT64_MIN <= value <= INT64_MAX


# -- records ----------------------------------------------------------------------------


def _round_trip(
    triples: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    stamps: list[int],
    base_offset: int = 0,
) -> list[Record]:
    data = encode_records(triples, stamps, stamps[0])
    return list(decode_records(data, len(triples), base_offset, stamps[0], None))


@settings(deadline=None)
@given(
    st.lists(record_triples, min_size=1, max_size=30),
    st.integers(0, 2**40),
    st.lists(st.integers(-(2**31), 2**31), min_size=30, max_size=30),
    st.integers(0, 2**62),
)
def test_records_round_trip(
    triples: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    base_ts: int,
    deltas: list[int],
    base_offset: int,
) -> None:
    stamps = [base_ts + d for d in deltas[: len(triples)]]
    data = encode_records(triples, stamps, base_ts)
    decoded = list(decode_records(data, len(triples), base_offset, base_ts, None))
    assert decoded == [
        Record(base_offset + i, ts, key, value, tuple(hdrs))
        for i, ((key, value, hdrs), ts) in enumerate(zip(triples, stamps, strict=True))
    ]


def test_records_with_null_key_and_null_value_round_trip() -> None:
    (rec,) = _round_trip([(None, None, [])], [1000])
    assert rec == Record(0, 1000, None, None, ())
    assert rec.key is None
    assert rec.value is None


def test_empty_key_and_value_are_distinct_from_null() -> None:
    recs = _round_trip([(b"", b"", []), (None, None, [])], [1, 2])
    assert recs[0].key == b""
    assert recs[0].value == b""
    assert recs[1].key is None
    assert recs[1].value is None


def test_null_key_is_encoded_as_length_minus_one() -> None:
    data = encode_records([(None, b"v", [])], [5], 5)
    # length 7 (zigzag 0e), attributes 0, timestampDelta 0, offsetDelta 0,
    # key length -1 (zigzag 01), value length 1 (zigzag 02) + b"v", header count 0.
    assert data == bytes([14, 0, 0, 0, 1, 2]) + b"v" + b"\x00"


def test_header_with_null_value_round_trips() -> None:
    (rec,) = _round_trip([(b"k", b"v", [("trace", None), ("empty", b"")])], [7])
    assert rec.headers == (("trace", None), ("empty", b""))
    assert rec.headers[0][1] is None


@pytest.mark.parametrize("key", ["ключ", "鍵", "🔑-emoji", "", "naïve café"])
def test_unicode_header_keys_round_trip(key: str) -> None:
    (rec,) = _round_trip([(None, b"v", [(key, b"value")])], [7])
    assert rec.headers == ((key, b"value"),)


def test_unicode_header_key_is_stored_as_utf8_with_byte_length() -> None:
    data = encode_records([(None, None, [("é", None)])], [0], 0)
    encoded_key = "é".encode()
    assert encode_varint(len(encoded_key)) + encoded_key in data
    assert len(encoded_key) == 2


def test_record_offsets_are_base_offset_plus_delta() -> None:
    recs = _round_trip([(b"a", b"1", []), (b"b", b"2", []), (b"c", b"3", [])], [1, 2, 3], 500)
    assert [r.offset for r in recs] == [500, 501, 502]


def test_record_timestamps_may_precede_the_base_timestamp() -> None:
    recs = _round_trip([(None, b"1", []), (None, b"2", [])], [10_000, 9_000])
    assert [r.timestamp_ms for r in recs] == [10_000, 9_000]


def test_log_append_time_overrides_every_record_timestamp() -> None:
    data = encode_records([(None, b"1", []), (None, b"2", [])], [100, 200], 100)
    recs = list(decode_records(data, 2, 0, 100, 99_999))
    assert [r.timestamp_ms for r in recs] == [99_999, 99_999]


def test_decode_records_rejects_a_count_larger_than_the_data() -> None:
    data = encode_records([(None, b"1", [])], [0], 0)
    with pytest.raises(CorruptRecordError):
        list(decode_records(data, 2, 0, 0, None))


def test_decode_records_rejects_bytes_after_the_last_record() -> None:
    data = encode_records([(None, b"1", [])], [0], 0)
    with pytest.raises(CorruptRecordError, match="after the last"):
        list(decode_records(data + b"\x00", 1, 0, 0, None))


def test_decode_records_rejects_a_record_length_past_the_data() -> None:
    data = bytearray(encode_records([(None, b"1", [])], [0], 0))
    data[0] += 2  # the record claims one byte more than there is (zigzag: +2 is +1)
    with pytest.raises(CorruptRecordError):
        list(decode_records(bytes(data), 1, 0, 0, None))


def test_decode_records_rejects_a_key_length_past_its_record() -> None:
    data = bytearray(encode_records([(b"k", b"v", [])], [0], 0))
    assert data[4] == 2  # key length 1
    data[4] = 40  # key length 20
    with pytest.raises(CorruptRecordError):
        list(decode_records(bytes(data), 1, 0, 0, None))


def test_decode_records_rejects_a_length_below_minus_one() -> None:
    data = bytearray(encode_records([(b"k", b"v", [])], [0], 0))
    data[4] = 3  # key length -2
    with pytest.raises(CorruptRecordError, match="negative length"):
        list(decode_records(bytes(data), 1, 0, 0, None))


def test_decode_records_rejects_a_null_header_key() -> None:
    # attributes, tsDelta, offsetDelta, key null, value null, 1 header: key null, value null
    body = bytes([0, 0, 0, 1, 1, 2, 1, 1])
    data = encode_varint(len(body)) + body
    with pytest.raises(CorruptRecordError, match="null header key"):
        list(decode_records(data, 1, 0, 0, None))


def test_decode_records_rejects_a_header_key_that_is_not_utf8() -> None:
    body = bytes([0, 0, 0, 1, 1, 2, 2, 0xFF, 1])
    data = encode_varint(len(body)) + body
    with pytest.raises(CorruptRecordError, match="UTF-8"):
        list(decode_records(data, 1, 0, 0, None))


def test_decode_records_rejects_an_impossible_header_count() -> None:
    body = bytes([0, 0, 0, 1, 1]) + encode_varint(1_000_000)
    data = encode_varint(len(body)) + body
    with pytest.raises(CorruptRecordError, match="header count"):
        list(decode_records(data, 1, 0, 0, None))


def test_decode_records_rejects_a_record_shorter_than_its_fields() -> None:
    record = encode_records([(b"key", b"value", [])], [0], 0)
    good_length, _ = decode_varint(record, 0)
    data = encode_varint(good_length - 2) + record[1:]
    with pytest.raises(CorruptRecordError):
        list(decode_records(data, 1, 0, 0, None))


# -- fast paths: one- and two-byte varints, the one-pass encoder --------------------------


def raw_record(
    ts_delta: bytes = b"\x00",
    offset_delta: bytes = b"\x00",
    key: bytes = b"\x01",
    value: bytes = b"\x01",
    headers: bytes = b"\x00",
) -> bytes:
    """A record from already-encoded fields (attributes 0), prefixed by its length."""
    body = b"\x00" + ts_delta + offset_delta + key + value + headers
    return zigzag_reference(len(body)) + body


def test_one_byte_varints_take_the_fast_path_and_round_trip() -> None:
    values = range(-64, 64)
    data = b"".join(
        raw_record(ts_delta=zigzag_reference(v), offset_delta=zigzag_reference(v)) for v in values
    )
    assert all(len(encode_varint(v)) == 1 for v in values)
    records = list(decode_records(data, len(values), 1000, 5000, None))
    assert [(r.offset, r.timestamp_ms) for r in records] == [(1000 + v, 5000 + v) for v in values]


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (63, 1),
        (64, 2),
        (-64, 1),
        (-65, 2),
        (300, 2),
        (8191, 2),
        (8192, 3),
        (-8192, 2),
        (-8193, 3),
        (INT32_MAX, 5),
        (INT32_MIN, 5),
    ],
)
def test_varints_at_the_one_and_two_byte_boundaries_round_trip_through_records(value: int, size: int) -> None:
    encoded = encode_varint(value)
    assert encoded == zigzag_reference(value)
    assert len(encoded) == size
    data = raw_record(ts_delta=encoded, offset_delta=encoded)
    (record,) = decode_records(data, 1, 10_000_000_000, 10_000_000_000, None)
    assert (record.offset, record.timestamp_ms) == (10_000_000_000 + value, 10_000_000_000 + value)


def test_every_two_byte_varint_decodes_inline_as_the_general_decoder_does() -> None:
    # All 128 * 128 two-byte encodings, non-canonical ones (second byte 0) included.
    pairs = [bytes([first, second]) for first in range(0x80, 0x100) for second in range(0x80)]
    data = b"".join(raw_record(ts_delta=pair, offset_delta=pair) for pair in pairs)
    records = list(decode_records(data, len(pairs), 0, 0, None))
    expected = [decode_varint(pair, 0, 5)[0] for pair in pairs]
    assert [r.offset for r in records] == expected
    assert [r.timestamp_ms for r in records] == expected


@pytest.mark.parametrize("size", [0, 1, 63, 64, 100, 8191, 8192, 20_000])
def test_keys_values_and_header_values_of_boundary_lengths_round_trip(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    triples: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
        (payload, payload, [("k" * size, payload)]),
        (None, payload, []),
        (payload, None, []),
    ]
    (rec, null_key, null_value) = _round_trip(triples, [1, 2, 3])
    assert rec == Record(0, 1, payload, payload, (("k" * size, payload),))
    assert (null_key.key, null_key.value) == (None, payload)
    assert (null_value.key, null_value.value) == (payload, None)


def test_non_canonical_varints_decode_like_canonical_ones() -> None:
    # Java's reader accepts padded varints, so ours does too: 0x81 0x00 is -1 (null).
    data = raw_record(
        ts_delta=b"\x84\x80\x00",  # 2
        offset_delta=b"\x82\x00",  # 1
        key=b"\x81\x00",  # null
        value=b"\x86\x00abc",
        headers=b"\x82\x00\x82\x00h\x81\x00",  # one header, ("h", None)
    )
    assert list(decode_records(data, 1, 10, 20, None)) == [Record(11, 22, None, b"abc", (("h", None),))]


@pytest.mark.parametrize("field", ["offset_delta", "key", "value", "headers"])
def test_int32_fields_of_a_record_reject_a_five_byte_varint_wider_than_int32(field: str) -> None:
    data = raw_record(**{field: b"\xff\xff\xff\xff\x1f"})
    with pytest.raises(CorruptRecordError, match="overflows"):
        list(decode_records(data, 1, 0, 0, None))


@pytest.mark.parametrize("field", ["offset_delta", "key", "value", "headers"])
def test_int32_fields_of_a_record_reject_a_six_byte_varint(field: str) -> None:
    data = raw_record(**{field: b"\x80" * 5 + b"\x00"})
    with pytest.raises(CorruptRecordError, match="longer than 5"):
        list(decode_records(data, 1, 0, 0, None))


def test_record_length_rejects_an_overflowing_or_over_wide_varint() -> None:
    body = raw_record()[1:]
    for length in (b"\xff\xff\xff\xff\x1f", b"\x80" * 5 + b"\x00"):
        with pytest.raises(CorruptRecordError, match=r"overflows|longer than 5"):
            list(decode_records(length + body, 1, 0, 0, None))


def test_timestamp_delta_takes_ten_bytes_but_not_eleven() -> None:
    ten = encode_varint(INT64_MIN)
    assert len(ten) == 10
    (record,) = decode_records(raw_record(ts_delta=ten), 1, 0, 0, None)
    assert record.timestamp_ms == INT64_MIN
    with pytest.raises(CorruptRecordError, match="longer than 10"):
        list(decode_records(raw_record(ts_delta=b"\x80" * 10 + b"\x00"), 1, 0, 0, None))


def test_every_truncation_of_records_is_corrupt_never_an_index_error() -> None:
    long_value = bytes(300)  # two-byte value and record lengths
    data = encode_records([(b"key", long_value, [("h", b"x"), ("n", None)]), (None, None, [])], [0, 70], 0)
    assert len(list(decode_records(data, 2, 0, 0, None))) == 2
    for cut in range(len(data)):
        with pytest.raises(CorruptRecordError):
            list(decode_records(data[:cut], 2, 0, 0, None))


def test_a_value_length_past_its_record_is_corrupt_even_when_the_batch_has_more_bytes() -> None:
    first = raw_record(value=b"\x06abc")
    tampered = first.replace(b"\x06abc", b"\x0aabc")  # 5 bytes: past "abc" and the header count
    with pytest.raises(CorruptRecordError, match="runs past its record"):
        list(decode_records(tampered + raw_record(), 2, 0, 0, None))


fast_records = st.lists(
    st.one_of(
        st.tuples(nullable_bytes, nullable_bytes),
        st.tuples(nullable_bytes, nullable_bytes, headers),
        st.builds(Record, st.just(0), int64s, nullable_bytes, nullable_bytes, headers.map(tuple)),
    ),
    min_size=1,
    max_size=20,
)


@settings(deadline=None)
@given(fast_records, st.integers(0, 2**45))
def test_the_one_pass_encoder_writes_what_the_general_encoder_writes(
    records: list[object], default_ts: int
) -> None:
    fast = encode_plain_records(records, default_ts)
    assert fast is not None
    triples, own = normalise_records(records)
    stamps = [default_ts if ts is None else ts for ts in own]
    assert fast == (encode_records(triples, stamps, stamps[0]), stamps[0], min(stamps), max(stamps))


@pytest.mark.parametrize(
    "record",
    [
        (bytearray(b"k"), b"v"),
        (None, memoryview(b"v")),
        (None, "text"),
        [None, b"v"],
        (None, b"v", [["h", b"x"]]),
        (None, b"v", [("h", "text")]),
        (None, b"v", [("\ud800", None)]),
        (None, b"v", None),
        Record(0, None, None, b"v"),  # type: ignore[arg-type]
        Record(0, True, None, b"v"),
        (None, b"v", b"x"),
    ],
)
def test_the_one_pass_encoder_leaves_anything_unusual_to_the_general_path(record: object) -> None:
    assert encode_plain_records([(None, b"fine"), record], 0) is None


def test_the_one_pass_encoder_leaves_a_non_int_default_timestamp_to_the_general_path() -> None:
    assert encode_plain_records([(None, b"v")], 1.5) is None  # type: ignore[arg-type]
