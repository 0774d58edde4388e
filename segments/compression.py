"""Batch compression codecs (attributes bits 0-2), with Kafka's framing for each.

- gzip: a gzip stream.
- snappy: Java clients write xerial's framing (a magic header then length-prefixed
  raw snappy blocks); plain raw snappy is also accepted when reading.
- lz4: the LZ4 frame format.
- zstd: a zstd frame, possibly without a content size.

Decompression is bounded by `max_bytes`: a corrupt or hostile batch must not be able
to make the reader allocate without limit.
"""

from __future__ import annotations

import gzip
import struct
import threading
import zlib

import cramjam
import lz4.frame
import zstandard

from oncelog.segments.errors import CorruptRecordError
from oncelog.segments.format import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NAMES,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
)

# Far above any sane batch (Kafka's default max is 1 MiB) and far below memory.
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, compatible version
_XERIAL_BLOCK_BYTES = 32 * 1024  # the block size of Java's SnappyOutputStream
_INT32 = struct.Struct(">i")


def compress(codec: int, data: bytes) -> bytes:
    if codec == COMPRESSION_NONE:
        return data
    if codec == COMPRESSION_GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    if codec == COMPRESSION_SNAPPY:
        out = bytearray(_XERIAL_HEADER.pack(_XERIAL_MAGIC, 1, 1))
        for start in range(0, len(data), _XERIAL_BLOCK_BYTES):
            block = bytes(cramjam.snappy.compress_raw(data[start : start + _XERIAL_BLOCK_BYTES]))
            out += _INT32.pack(len(block))
            out += block
        return bytes(out)
    if codec == COMPRESSION_LZ4:
        # Independent blocks, as Kafka's Lz4BlockOutputStream writes them: Kafka's reader
        # (and every Java consumer) refuses a frame of linked blocks.
        return bytes(lz4.frame.compress(data, block_linked=False))
    if codec == COMPRESSION_ZSTD:
        return bytes(zstandard.ZstdCompressor().compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """Inflate a batch body. Any failure, a truncated stream included, is a CorruptRecordError."""
    name = COMPRESSION_NAMES.get(codec)
    if name is None:
        raise CorruptRecordError(f"unknown compression codec {codec}")
    try:
        if codec == COMPRESSION_NONE:
            out = data
        elif codec == COMPRESSION_GZIP:
            out = _gzip_decompress(data, max_bytes)
        elif codec == COMPRESSION_SNAPPY:
            out = _snappy_decompress(data, max_bytes)
        elif codec == COMPRESSION_LZ4:
            out = _lz4_decompress(data, max_bytes)
        else:
            out = _zstd_decompress(data, max_bytes)
    except CorruptRecordError:
        raise
    except Exception as exc:  # each library raises its own types for bad input
        raise CorruptRecordError(f"{name} body does not decompress: {exc}") from exc
    if len(out) > max_bytes:
        raise CorruptRecordError(f"{name} body inflates past {max_bytes} bytes")
    return bytes(out)


def _require_whole_stream(name: str, eof: bool, out_bytes: int, max_bytes: int, unused: bytes) -> None:
    # A stream that stops early is a truncated body: the batch CRC may still match
    # (a client bug), and the records decoded from it would be silently short.
    if out_bytes > max_bytes:
        raise CorruptRecordError(f"{name} body inflates past {max_bytes} bytes")
    if not eof:
        raise CorruptRecordError(f"{name} body ends before its stream does (truncated)")
    if unused:
        raise CorruptRecordError(f"{len(unused)} bytes after the end of the {name} stream")


def _gzip_decompress(data: bytes, max_bytes: int) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = inflater.decompress(data, max_bytes + 1)
    _require_whole_stream("gzip", inflater.eof, len(out), max_bytes, inflater.unused_data)
    return out


# lz4 allocates the whole `max_length` of every call up front, so output comes in
# pieces of this size: one call bounded by `max_bytes` would allocate the whole bound
# (64 MiB on append) for every small batch, 7 us of the 9 it took.
_LZ4_OUTPUT_PIECE_BYTES = 1 << 20


def _lz4_decompress(data: bytes, max_bytes: int) -> bytes:
    inflater = lz4.frame.LZ4FrameDecompressor()
    pieces: list[bytes] = []
    out_bytes = 0
    rest = data
    while True:
        piece = inflater.decompress(rest, max_length=min(max_bytes + 1 - out_bytes, _LZ4_OUTPUT_PIECE_BYTES))
        rest = b""
        pieces.append(piece)
        out_bytes += len(piece)
        # needs_input: all input consumed (at the end of the frame, or short of it).
        if inflater.eof or inflater.needs_input or out_bytes > max_bytes or not piece:
            break
    _require_whole_stream("lz4", inflater.eof, out_bytes, max_bytes, inflater.unused_data)
    return b"".join(pieces)


# zstd's decompressobj has no output bound, so input goes in small pieces: one piece
# can inflate to at most a few tens of MiB before the running total is checked.
_ZSTD_INPUT_PIECE_BYTES = 1024


# A decompressor takes 13 us to make and 2 us to inflate a small batch: each thread
# keeps one (one may not be used by two threads at once; each use starts afresh).
_zstd_per_thread = threading.local()


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    try:
        decompressor: zstandard.ZstdDecompressor = _zstd_per_thread.decompressor
    except AttributeError:
        decompressor = _zstd_per_thread.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def _zstd_decompress(data: bytes, max_bytes: int) -> bytes:
    # Concatenated frames decode to the concatenation of their contents (zstd spec).
    out = bytearray()
    rest = data
    decompressor = _zstd_decompressor()
    while True:
        inflater = decompressor.decompressobj()
        consumed = 0
        while consumed < len(rest) and not inflater.eof and len(out) <= max_bytes:
            out += inflater.decompress(rest[consumed : consumed + _ZSTD_INPUT_PIECE_BYTES])
            consumed += _ZSTD_INPUT_PIECE_BYTES
        _require_whole_stream("zstd", inflater.eof, len(out), max_bytes, b"")
        rest = inflater.unused_data + rest[consumed:]
        if not rest:
            return bytes(out)


def _snappy_uncompressed_length(block: bytes) -> int:
    """The length prefix of a raw snappy block (unsigned LEB128), read before inflating."""
    value = 0
    for n, byte in enumerate(block[:5]):
        value |= (byte & 0x7F) << (7 * n)
        if byte < 0x80:
            return value
    raise CorruptRecordError("snappy block has no valid length prefix")


def _snappy_raw(block: bytes, inflated_bytes: int, max_bytes: int) -> bytes:
    """One raw block, the body having inflated to `inflated_bytes` before it."""
    # cramjam allocates the declared length up front; a 5-byte body claiming 4 GiB
    # must be refused before that allocation.
    declared = _snappy_uncompressed_length(block)
    if inflated_bytes + declared > max_bytes:
        raise CorruptRecordError(
            f"snappy body inflates past {max_bytes} bytes (a block of {declared} after {inflated_bytes})"
        )
    return bytes(cramjam.snappy.decompress_raw(block))


def _snappy_decompress(data: bytes, max_bytes: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_raw(data, 0, max_bytes)
    pos = _XERIAL_HEADER.size
    out = bytearray()
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptRecordError("xerial snappy block length is truncated")
        (block_bytes,) = _INT32.unpack_from(data, pos)
        pos += 4
        if block_bytes < 0 or pos + block_bytes > len(data):
            raise CorruptRecordError(f"xerial snappy block of {block_bytes} bytes is truncated")
        out += _snappy_raw(data[pos : pos + block_bytes], len(out), max_bytes)
        pos += block_bytes
    return bytes(out)
