"""Batch compression codecs: gzip, snappy (xerial and raw), lz4 frame, zstd (brief §3)."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
import textwrap

import cramjam
import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.errors import CorruptRecordError
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.compression import compress, decompress
from oncelog.segments.records import Record

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
XERIAL_MAGIC = b"\x82SNAPPY\x00"

codec_params = pytest.mark.parametrize("codec", list(CODECS.values()), ids=list(CODECS))


def compressible(size: int) -> bytes:
    return (b"oncelog compressible payload " * (size // 29 + 1))[:size]


def xerial(blocks: list[bytes]) -> bytes:
    """Java's SnappyOutputStream framing: magic, version 1, compatible 1, sized raw blocks."""
    out = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
    for block in blocks:
        out += struct.pack(">i", len(block)) + block
    return out


# -- round trips ------------------------------------------------------------------------


@codec_params
@settings(deadline=None)
@given(data=st.binary(max_size=3000))
def test_each_codec_round_trips_arbitrary_bytes(codec: int, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


@codec_params
@pytest.mark.parametrize("size", [0, 1, 32 * 1024 - 1, 32 * 1024, 32 * 1024 + 1, 200_000])
def test_each_codec_round_trips_sizes_around_block_boundaries(codec: int, size: int) -> None:
    data = os.urandom(size // 2) + compressible(size - size // 2)
    compressed = compress(codec, data)
    assert decompress(codec, compressed) == data


@codec_params
def test_each_codec_actually_compresses(codec: int) -> None:
    data = compressible(50_000)
    assert len(compress(codec, data)) < len(data) // 4


def test_none_codec_passes_bytes_through() -> None:
    assert compress(0, b"abc") == b"abc"
    assert decompress(0, b"abc") == b"abc"


def test_gzip_output_is_a_gzip_stream() -> None:
    data = compressible(1000)
    assert gzip.decompress(compress(1, data)) == data


def test_snappy_output_uses_xerial_framing_in_32k_blocks() -> None:
    data = os.urandom(70_000)
    out = compress(2, data)
    assert out.startswith(XERIAL_MAGIC)
    assert struct.unpack_from(">ii", out, 8) == (1, 1)
    pos, blocks = 16, []
    while pos < len(out):
        (size,) = struct.unpack_from(">i", out, pos)
        blocks.append(snappy.uncompress(out[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    assert [len(b) for b in blocks] == [32 * 1024, 32 * 1024, 70_000 - 64 * 1024]
    assert b"".join(blocks) == data


def test_lz4_output_is_an_lz4_frame() -> None:
    data = compressible(1000)
    assert lz4.frame.decompress(compress(3, data)) == data


def test_zstd_output_is_a_zstd_frame() -> None:
    data = compressible(1000)
    assert zstandard.ZstdDecompressor().decompress(compress(4, data)) == data


def test_zstd_frame_without_content_size_decodes() -> None:
    data = compressible(100_000)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert decompress(4, frame) == data


def test_zstd_multiple_frames_decode_as_one_body() -> None:
    first, second = compressible(500), os.urandom(300)
    cctx = zstandard.ZstdCompressor()
    assert decompress(4, cctx.compress(first) + cctx.compress(second)) == first + second


def test_lz4_frame_from_the_lz4_library_with_content_checksum_decodes() -> None:
    data = compressible(10_000)
    frame = lz4.frame.compress(data, content_checksum=True, block_linked=False)
    assert decompress(3, frame) == data


def test_gzip_from_the_standard_library_decodes() -> None:
    data = os.urandom(1000) + compressible(5000)
    assert decompress(1, gzip.compress(data, compresslevel=9)) == data


@settings(deadline=None)
@given(st.binary(max_size=3000))
def test_raw_non_xerial_snappy_decodes(data: bytes) -> None:
    assert decompress(2, snappy.compress(data)) == data
    assert decompress(2, bytes(cramjam.snappy.compress_raw(data))) == data


def test_xerial_snappy_from_python_snappy_blocks_decodes() -> None:
    chunks = [os.urandom(1000), compressible(32 * 1024), b"tail"]
    framed = xerial([snappy.compress(c) for c in chunks])
    assert decompress(2, framed) == b"".join(chunks)


def test_xerial_snappy_with_no_blocks_is_empty() -> None:
    assert decompress(2, xerial([])) == b""


# -- batches with every codec -----------------------------------------------------------


@codec_params
def test_encode_batch_with_each_codec_decodes_back(codec: int) -> None:
    records = [
        Record(0, 1_000 + i, None if i % 3 == 0 else f"k{i}".encode(), compressible(i * 10), ())
        for i in range(50)
    ] + [Record(0, 5, b"h", None, (("a", b"1"), ("b", None)))]
    name = next(n for n, c in CODECS.items() if c == codec)
    raw = encode_batch(records, base_offset=10, compression=name)
    batch = RecordBatch(raw)
    batch.validate()
    assert batch.compression == codec
    assert batch.compression_name == name
    assert list(batch.records()) == [
        Record(10 + i, r.timestamp_ms, r.key, r.value, r.headers) for i, r in enumerate(records)
    ]
    assert decompress(codec, bytes(batch.buffer[61:])) == bytes(
        RecordBatch(encode_batch(records, base_offset=10)).buffer[61:]
    )


@codec_params
def test_compressed_batch_body_is_smaller_than_uncompressed(codec: int) -> None:
    records = [(None, compressible(1000))] * 20
    plain = encode_batch(records, timestamp_ms=0)
    packed = encode_batch(records, timestamp_ms=0, compression=codec)
    assert len(packed) < len(plain) // 4


# -- corrupt input ----------------------------------------------------------------------


GARBAGE = [
    b"\x00\x01\x02\x03",
    b"this is not a compressed body at all",
    b"\xff" * 64,
    bytes(range(256)),
]


@codec_params
@pytest.mark.parametrize("garbage", GARBAGE, ids=["short", "text", "ff", "range"])
def test_decompress_of_garbage_raises_corrupt_record_error(codec: int, garbage: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decompress(codec, garbage)


@codec_params
def test_decompress_of_empty_input_is_empty_or_corrupt(codec: int) -> None:
    try:
        out = decompress(codec, b"")
    except CorruptRecordError:
        return
    assert out == b""


@codec_params
@settings(deadline=None)
@given(data=st.binary(max_size=500))
def test_random_bytes_decompress_or_raise_corrupt_record_error(codec: int, data: bytes) -> None:
    try:
        out = decompress(codec, data, max_bytes=1 << 20)
    except CorruptRecordError:
        return
    assert len(out) <= 1 << 20


@codec_params
@pytest.mark.parametrize("drop", [1, 4, "half"])
def test_truncated_stream_raises_corrupt_record_error(codec: int, drop: int | str) -> None:
    """A compressed body cut short is corrupt: it must not decode to partial (or no) data."""
    data = os.urandom(2000) + compressible(8000)
    compressed = compress(codec, data)
    cut = len(compressed) // 2 if drop == "half" else drop
    assert isinstance(cut, int)
    with pytest.raises(CorruptRecordError):
        decompress(codec, compressed[:-cut])


def test_xerial_snappy_with_a_truncated_block_length_is_corrupt() -> None:
    framed = xerial([snappy.compress(b"abc")]) + b"\x00\x00"
    with pytest.raises(CorruptRecordError, match="truncated"):
        decompress(2, framed)


def test_xerial_snappy_with_a_negative_block_length_is_corrupt() -> None:
    framed = XERIAL_MAGIC + struct.pack(">iii", 1, 1, -5) + b"abcde"
    with pytest.raises(CorruptRecordError):
        decompress(2, framed)


def test_unknown_codec_is_corrupt_on_decompress_and_a_value_error_on_compress() -> None:
    with pytest.raises(CorruptRecordError, match="unknown compression"):
        decompress(5, b"abc")
    with pytest.raises(ValueError):
        compress(7, b"abc")


# -- decompression bombs ----------------------------------------------------------------


@codec_params
def test_decompression_bomb_beyond_max_bytes_raises_corrupt_record_error(codec: int) -> None:
    bomb = compress(codec, bytes(1 << 20))
    assert len(bomb) < 64 * 1024
    with pytest.raises(CorruptRecordError, match="past 1000 bytes"):
        decompress(codec, bomb, max_bytes=1000)


@codec_params
def test_output_of_exactly_max_bytes_is_allowed_and_one_more_is_not(codec: int) -> None:
    data = compressible(10_000)
    assert decompress(codec, compress(codec, data), max_bytes=10_000) == data
    with pytest.raises(CorruptRecordError):
        decompress(codec, compress(codec, data), max_bytes=9_999)


def test_raw_snappy_bomb_beyond_max_bytes_raises_corrupt_record_error() -> None:
    bomb = snappy.compress(bytes(1 << 20))
    with pytest.raises(CorruptRecordError):
        decompress(2, bomb, max_bytes=1000)


def test_xerial_snappy_bomb_across_many_blocks_stops_at_max_bytes() -> None:
    block = snappy.compress(bytes(32 * 1024))
    framed = xerial([block] * 100)
    with pytest.raises(CorruptRecordError, match="past"):
        decompress(2, framed, max_bytes=50_000)


_ADDRESS_SPACE_PROBE = textwrap.dedent(
    """
    import resource, sys
    limit = 1536 * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from oncelog.errors import CorruptRecordError
    from oncelog.segments.compression import decompress
    assert decompress(2, bytes.fromhex("051068656c6c6f"), max_bytes=1000) == b"hello"
    try:
        decompress(2, bytes.fromhex(sys.argv[1]), max_bytes=1000)
    except CorruptRecordError:
        print("CorruptRecordError")
    else:
        print("no error")
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS probe is Linux-only")
@pytest.mark.parametrize(
    "body",
    [
        # raw snappy whose preamble declares 2**32 - 1 uncompressed bytes, and nothing else
        "ffffffff0f",
        # the same declaration inside one xerial block
        (XERIAL_MAGIC + struct.pack(">iii", 1, 1, 5)).hex() + "ffffffff0f",
    ],
    ids=["raw", "xerial"],
)
def test_snappy_declared_length_beyond_max_bytes_is_rejected_without_allocating_it(
    body: str,
) -> None:
    """Five hostile bytes must not make the reader allocate 4 GiB (brief: bounded by max_bytes).

    Run in a child process whose address space is capped at 1.5 GiB: an unbounded
    allocation aborts the child instead of raising CorruptRecordError. The child first
    decodes a valid raw snappy body, so a cap too small to run at all would fail there.
    """
    result = subprocess.run(
        [sys.executable, "-c", _ADDRESS_SPACE_PROBE, body],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-500:]
    assert result.stdout.strip() == "CorruptRecordError"
