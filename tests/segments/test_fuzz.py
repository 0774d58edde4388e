"""Fuzzing the batch reader: hostile bytes may only ever raise CorruptRecordError.

TruncatedBatchError is a CorruptRecordError, so it is allowed too. Anything else
(IndexError, struct.error, UnicodeDecodeError, MemoryError, a library's own error)
is a bug: recovery relies on CorruptRecordError to tell bad bytes from bad code.
"""

from __future__ import annotations

import contextlib
import struct

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.errors import CorruptRecordError
from oncelog.segments.batch import RecordBatch, TruncatedBatchError, encode_batch, iter_batches
from oncelog.segments.records import Record

MAX_DECOMPRESSED = 1 << 20
FUZZ_SETTINGS = settings(
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# For properties of valid input, which need fewer examples than the fuzzers.
CHECK_SETTINGS = settings(FUZZ_SETTINGS, max_examples=100)


def exercise(buffer: bytes) -> int:
    """Walk, validate and decode everything in `buffer`; return how many records decoded.

    Each stage is tried even when an earlier one rejected the batch, so the record
    decoder also sees bytes whose CRC does not match.
    """
    decoded = 0
    try:
        for batch in iter_batches(buffer):
            assert batch.size >= 61
            with contextlib.suppress(CorruptRecordError):
                batch.validate()
            try:
                for record in batch.records(max_decompressed_bytes=MAX_DECOMPRESSED):
                    assert isinstance(record, Record)
                    decoded += 1
            except CorruptRecordError:
                pass
    except CorruptRecordError as exc:
        assert exc.position is not None
        assert 0 <= exc.position <= len(buffer)
    return decoded


def with_crc(buf: bytearray) -> bytes:
    if len(buf) >= 21:
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


record_strategy = st.tuples(
    st.none() | st.binary(max_size=20),
    st.none() | st.binary(max_size=40),
    st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=2),
)


@st.composite
def valid_batches(draw: st.DrawFn) -> bytes:
    return encode_batch(
        draw(st.lists(record_strategy, min_size=1, max_size=8)),
        base_offset=draw(st.integers(0, 2**40)),
        producer_id=draw(st.integers(-1, 2**40)),
        producer_epoch=draw(st.integers(-1, 100)),
        base_sequence=draw(st.integers(-1, 2**31 - 1)),
        timestamp_ms=draw(st.integers(0, 2**42)),
        compression=draw(st.sampled_from([None, "gzip", "snappy", "lz4", "zstd"])),
    )


@st.composite
def headers_with_random_bodies(draw: st.DrawFn) -> bytes:
    """A plausible header (right magic and length, chosen fields) over a random body."""
    body = draw(st.binary(max_size=200))
    header = struct.pack(
        ">qiibIhiqqqhii",
        draw(st.integers(0, 2**40)),
        49 + len(body),
        0,
        2,
        0,
        draw(st.integers(0, 0x3F) | st.integers(-(2**15), 2**15 - 1)),
        draw(st.integers(-2, 20)),
        draw(st.integers(-(2**63), 2**63 - 1)),
        draw(st.integers(-(2**63), 2**63 - 1)),
        draw(st.integers(-1, 2**40)),
        draw(st.integers(-1, 5)),
        draw(st.integers(-1, 2**31 - 1)),
        draw(st.integers(-2, 25) | st.integers(-(2**31), 2**31 - 1)),
    )
    buf = bytearray(header + body)
    return with_crc(buf) if draw(st.booleans()) else bytes(buf)


@st.composite
def mutated_batches(draw: st.DrawFn) -> bytes:
    buf = bytearray(draw(valid_batches()))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "set" and buf:
            buf[pos] = draw(st.integers(0, 255))
        elif kind == "flip" and buf:
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del buf[pos : pos + draw(st.integers(1, 8))]
        else:
            del buf[pos:]
    # Sometimes keep the declared length consistent with the mutated size, so the
    # decoder (not the length check) sees the damage.
    if draw(st.booleans()) and len(buf) >= 12:
        struct.pack_into(">i", buf, 8, len(buf) - 12)
    return with_crc(buf) if draw(st.booleans()) else bytes(buf)


@FUZZ_SETTINGS
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_corrupt_record_error(data: bytes) -> None:
    exercise(data)


@FUZZ_SETTINGS
@given(headers_with_random_bodies())
def test_plausible_headers_over_random_bodies_raise_only_corrupt_record_error(
    data: bytes,
) -> None:
    exercise(data)


@FUZZ_SETTINGS
@given(mutated_batches())
def test_mutated_valid_batches_raise_only_corrupt_record_error(data: bytes) -> None:
    exercise(data)


@FUZZ_SETTINGS
@given(st.lists(valid_batches(), min_size=1, max_size=3), st.data())
def test_mutation_inside_a_run_of_batches_raises_only_corrupt_record_error(
    batches: list[bytes], data: st.DataObject
) -> None:
    buf = bytearray(b"".join(batches))
    pos = data.draw(st.integers(0, len(buf) - 1))
    buf[pos] = data.draw(st.integers(0, 255))
    exercise(bytes(buf))


@CHECK_SETTINGS
@given(st.lists(valid_batches(), min_size=1, max_size=4))
def test_unmutated_batches_all_validate_and_decode(batches: list[bytes]) -> None:
    buf = b"".join(batches)
    walked = list(iter_batches(buf))
    assert len(walked) == len(batches)
    for batch in walked:
        batch.validate()
    expected = sum(RecordBatch(b).records_count for b in batches)
    assert exercise(buf) == expected


@CHECK_SETTINGS
@given(valid_batches(), st.data())
def test_every_truncation_of_a_valid_batch_is_a_truncated_batch_error(
    raw: bytes, data: st.DataObject
) -> None:
    keep = data.draw(st.integers(1, len(raw) - 1))
    try:
        list(iter_batches(raw[:keep]))
    except TruncatedBatchError as exc:
        assert exc.position == 0
    else:
        raise AssertionError(f"no TruncatedBatchError for {keep} of {len(raw)} bytes")
