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
import io
import struct
import zlib

import cramjam
import lz4.frame
import zstandard

from oncelog.errors import CorruptRecordError
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
        return bytes(lz4.frame.compress(data))
    if codec == COMPRESSION_ZSTD:
        return bytes(zstandard.ZstdCompressor().compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """Inflate a batch body. Any failure is a CorruptRecordError."""
    name = COMPRESSION_NAMES.get(codec)
    if name is None:
        raise CorruptRecordError(f"unknown compression codec {codec}")
    try:
        if codec == COMPRESSION_NONE:
            out = data
        elif codec == COMPRESSION_GZIP:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            out = inflater.decompress(data, max_bytes + 1)
        elif codec == COMPRESSION_SNAPPY:
            out = _snappy_decompress(data, max_bytes)
        elif codec == COMPRESSION_LZ4:
            lz4_inflater = lz4.frame.LZ4FrameDecompressor()
            out = lz4_inflater.decompress(data, max_length=max_bytes + 1)
        else:
            out = _zstd_decompress(data, max_bytes)
    except CorruptRecordError:
        raise
    except Exception as exc:  # each library raises its own types for bad input
        raise CorruptRecordError(f"{name} body does not decompress: {exc}") from exc
    if len(out) > max_bytes:
        raise CorruptRecordError(f"{name} body inflates past {max_bytes} bytes")
    return bytes(out)


def _snappy_decompress(data: bytes, max_bytes: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    pos = _XERIAL_HEADER.size
    out = bytearray()
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptRecordError("xerial snappy block length is truncated")
        (block_bytes,) = _INT32.unpack_from(data, pos)
        pos += 4
        if block_bytes < 0 or pos + block_bytes > len(data):
            raise CorruptRecordError(f"xerial snappy block of {block_bytes} bytes is truncated")
        out += bytes(cramjam.snappy.decompress_raw(data[pos : pos + block_bytes]))
        if len(out) > max_bytes:
            raise CorruptRecordError(f"snappy body inflates past {max_bytes} bytes")
        pos += block_bytes
    return bytes(out)


def _zstd_decompress(data: bytes, max_bytes: int) -> bytes:
    # A stream reader, because Kafka's frames may omit the content size and
    # decompressobj() has no output bound.
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    out = bytearray()
    while len(out) <= max_bytes:
        chunk = reader.read(min(1 << 20, max_bytes + 1 - len(out)))
        if not chunk:
            break
        out += chunk
    return bytes(out)
