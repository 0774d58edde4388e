"""The record check of every append (records.check_records, batch.check_batch_records).

The check walks the records without building them, so it is a second reading of the
record layout beside the decoder. These properties hold the two together: whatever
the check accepts, decode_records reads in full (and kafka-python, an independent
decoder, reads the same); whatever the decoder cannot read, the check refuses.
Batches the encoder produces always pass, in every codec.
"""

from __future__ import annotations

import itertools
import struct

import crc32c
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from oncelog.errors import CorruptRecordError, InvalidRecordError
from oncelog.segments.batch import RecordBatch, check_batch_records, encode_batch
from oncelog.segments.compression import compress, decompress
from oncelog.segments.records import Record, check_records, decode_records, decode_varint

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
CODE = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PROPERTY_SETTINGS = settings(
    deadline=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
INT32_MAX = 2**31 - 1

nullable_bytes = st.none() | st.binary(max_size=30)
headers = st.lists(st.tuples(st.text(max_size=6), nullable_bytes), max_size=3)
records = st.lists(
    st.tuples(nullable_bytes, nullable_bytes, headers)
    | st.builds(
        # Own timestamps, far apart: multi-byte timestamp deltas, some negative.
        lambda ts, key, value: Record(0, ts, key, value),
        st.integers(0, 2**45),
        nullable_bytes,
        nullable_bytes,
    ),
    min_size=1,
    max_size=12,
) | st.builds(
    # Past 64 and 8192 records offset deltas take two and three bytes; long values too.
    lambda n, size: [(None, b"v" * (i % size)) for i in range(n)],
    st.sampled_from([63, 64, 65, 300]),
    st.sampled_from([1, 70, 200]),
)


def batch_of(records_: list[object], codec: str | None) -> bytes:
    return encode_batch(records_, timestamp_ms=1_700_000_000_000, compression=codec)


def with_crc(buf: bytearray) -> bytes:
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def check(batch: bytes, *, exact: bool = True) -> None:
    view = RecordBatch(batch)
    view.validate()  # the header checks every append makes first
    view.check_records(exact=exact, max_decompressed_bytes=1 << 24)


def kafka_python_records(batch: bytes) -> list[Record]:
    return [
        Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in DefaultRecordBatch(batch)
    ]


def record_attributes(view: RecordBatch) -> list[int]:
    """Each record's attributes byte, found by the length prefixes of a body known to decode."""
    body = bytes(view.buffer[61:])
    if view.compression:
        body = decompress(view.compression, body)
    out, pos = [], 0
    while pos < len(body):
        length, pos = decode_varint(body, pos, 5)
        out.append(body[pos])
        pos += length
    return out


def assert_readable(batch: bytes) -> None:
    """What an accepted batch owes its readers: every record decodes, in both decoders alike."""
    view = RecordBatch(batch)
    ours = list(view.records())
    assert len(ours) == view.records_count
    assert [r.offset for r in ours] == list(range(view.records_count))
    # kafka-python reads the (unused) int8 record attributes as a varint, unlike Kafka's
    # DefaultRecord (one byte): past 0x7f only it misreads the record.
    if all(attributes < 0x80 for attributes in record_attributes(view)):
        assert kafka_python_records(batch) == ours


# -- what the encoder writes passes --------------------------------------------------------------
@pytest.mark.parametrize("codec", CODECS)
@PROPERTY_SETTINGS
@given(records)
def test_every_batch_the_encoder_writes_passes_exact_and_loose(
    codec: str | None, given_records: list[object]
) -> None:
    batch = batch_of(given_records, codec)
    check(batch, exact=True)
    check(batch, exact=False)
    assert_readable(batch)


# -- one byte changed, the CRC made right again ---------------------------------------------------
def _refused_or_readable(batch: bytes) -> None:
    try:
        check(batch)
    except (CorruptRecordError, InvalidRecordError) as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("accepted")
    assert_readable(batch)


@pytest.mark.parametrize("codec", CODECS)
@PROPERTY_SETTINGS
@given(records, st.data())
def test_one_byte_changed_in_the_body_is_refused_or_reads_back_in_full(
    codec: str | None, given_records: list[object], data: st.DataObject
) -> None:
    buf = bytearray(batch_of(given_records, codec))
    at = data.draw(st.integers(61, len(buf) - 1), label="position")
    buf[at] = data.draw(st.integers(0, 255).filter(lambda b: b != buf[at]), label="byte")
    _refused_or_readable(with_crc(buf))


@pytest.mark.parametrize("codec", CODECS[1:])
@PROPERTY_SETTINGS
@given(records, st.data())
def test_one_byte_changed_in_the_records_of_a_compressed_batch_is_refused_or_reads_back(
    codec: str, given_records: list[object], data: st.DataObject
) -> None:
    """The change made before compressing: the body inflates, and the record walk must catch it."""
    buf = bytearray(batch_of(given_records, codec))
    raw = bytearray(decompress(CODE[codec], bytes(buf[61:])))
    at = data.draw(st.integers(0, len(raw) - 1), label="position")
    raw[at] = data.draw(st.integers(0, 255).filter(lambda b: b != raw[at]), label="byte")
    rebuilt = buf[:61] + bytearray(compress(CODE[codec], bytes(raw)))
    struct.pack_into(">i", rebuilt, 8, len(rebuilt) - 12)  # batchLength of the new body
    _refused_or_readable(with_crc(rebuilt))


# -- the check and the decoder agree ------------------------------------------------------------------
@st.composite
def damaged_bodies(draw: st.DrawFn) -> tuple[bytes, int]:
    """(record bytes, count): a valid run of records with a few edits, the count maybe off by one."""
    body = bytearray(batch_of(draw(records), None)[61:])
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, max(len(body) - 1, 0)))
        kind = draw(st.sampled_from(["set", "insert", "delete"]))
        if kind == "set" and body:
            body[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            body[at:at] = draw(st.binary(min_size=1, max_size=11))
        else:
            del body[at : at + draw(st.integers(1, 11))]
    chained = _count_records(bytes(body))
    count = max(chained + draw(st.integers(-1, 1)), 0) if chained >= 0 else draw(st.integers(0, 3))
    return bytes(body), count


def _count_records(body: bytes) -> int:
    """How many records the length prefixes chain through (-1 if they do not); a count to try."""
    pos = n = 0
    while pos < len(body):
        raw = shift = 0
        while pos < len(body) and body[pos] & 0x80:
            raw |= (body[pos] & 0x7F) << shift
            shift += 7
            pos += 1
        if pos >= len(body):
            return -1
        raw |= body[pos] << shift
        length = (raw >> 1) ^ -(raw & 1)
        if length < 1:
            return -1
        pos += 1 + length
        n += 1
    return n if pos == len(body) else -1


def _decodes(body: bytes, count: int) -> list[Record] | None:
    if count * 7 > len(body):  # the bound RecordBatch.records applies before decoding
        return None
    try:
        return list(decode_records(body, count, 0, 0, None))
    except CorruptRecordError:
        return None


@PROPERTY_SETTINGS
@given(damaged_bodies())
def test_the_check_refuses_exactly_what_the_decoder_cannot_read(damaged: tuple[bytes, int]) -> None:
    body, count = damaged
    decoded = _decodes(body, count)
    try:
        check_records(body, 0, count, INT32_MAX, exact=False)
    except CorruptRecordError:
        event("refused: CorruptRecordError")
        assert decoded is None, "the check refused records the decoder reads"
        return
    except InvalidRecordError:
        event("refused: InvalidRecordError")
        # The framing is fine; the offsets broke the (loose) rule.
        assert decoded is not None
        deltas = [r.offset for r in decoded]
        assert any(b <= a for a, b in itertools.pairwise(deltas)) or min(deltas) < 0
        return
    event("accepted")
    assert decoded is not None, "the check accepted records the decoder cannot read"
    deltas = [r.offset for r in decoded]
    assert deltas == sorted(set(deltas)) and all(d >= 0 for d in deltas)
    # The exact rule on top: deltas 0..count-1, or InvalidRecordError.
    if deltas == list(range(count)):
        check_records(body, 0, count, INT32_MAX, exact=True)
    else:
        with pytest.raises(InvalidRecordError):
            check_records(body, 0, count, INT32_MAX, exact=True)


@PROPERTY_SETTINGS
@given(records, st.binary(max_size=9))
def test_records_are_walked_in_place_at_any_start(given_records: list[object], prefix: bytes) -> None:
    """check_batch_records walks an uncompressed body inside the batch buffer, without a copy."""
    batch = batch_of(given_records, None)
    count = RecordBatch(batch).records_count
    check_records(prefix + batch[61:], len(prefix), count, count - 1, exact=True)
    check_records(memoryview(prefix + batch[61:]), len(prefix), count, count - 1, exact=True)
    with pytest.raises(CorruptRecordError):
        check_records(prefix + batch[61:] + b"\x00", len(prefix), count, count - 1, exact=True)


def test_a_memoryview_batch_with_headers_is_checked_like_bytes() -> None:
    batch = batch_of([(b"k", b"v", [("h", b"x"), ("\u00e9", None)])] * 3, None)
    check_batch_records(memoryview(bytearray(batch)), 0, 2, 3, exact=True)
    bad = bytearray(batch)
    bad[-3:-1] = b"\xff\xfe"  # the last header key's two bytes (was "\u00e9"), not UTF-8 now
    with pytest.raises(CorruptRecordError, match="not UTF-8"):
        check_batch_records(memoryview(with_crc(bad)), 0, 2, 3, exact=True)


def test_records_count_int32_max_is_refused_before_any_walk() -> None:
    body = batch_of([(b"k", b"v")] * 2, None)[61:]
    with pytest.raises(CorruptRecordError, match="recordsCount 2147483647 cannot fit"):
        check_records(body, 0, INT32_MAX, INT32_MAX - 1, exact=True)
    with pytest.raises(CorruptRecordError, match="recordsCount -1"):
        check_records(body, 0, -1, 0, exact=False)


def test_an_empty_compacted_batch_has_no_record_bytes() -> None:
    check_records(b"", 0, 0, 9, exact=False)
    with pytest.raises(CorruptRecordError, match="1 bytes after"):
        check_records(b"\x00", 0, 0, 9, exact=False)
