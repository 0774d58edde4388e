"""Producer-state snapshot files: `%020d.snapshot`, state as of that offset (exclusive).

oncelog writes its own version, which keeps every producer's full 5-batch dedupe
window and the engine's time of its last append, so dedupe and expiry are as
strong after a restart as before it:

    i16 version (0x6F6D)  u32 crc32c over [6, EOF)  u32 header bytes
    msgpack header {offset, producers, row_bytes, fields}
    producers x 160-byte rows (the producer table's dtype, little-endian)

It also reads two older layouts, whose rows do not say when the engine last
appended (UNKNOWN_APPEND_MS; the load decides, see ProducerStateManager.load_rows):
- oncelog's first version (0x6F6C): the same framing, 172-byte rows holding each
  batch's first sequence and the newest batch timestamp but no append time;
- Kafka's v1 (i16 version=1, u32 crc32c over [6, EOF), i32 count, 46-byte
  big-endian entries), which keeps only each producer's last batch.

Writes go tmp file -> fsync -> rename -> fsync(dir), so a crash leaves either the
old set of snapshots or the new one, never a half-written file under the real name.
"""

from __future__ import annotations

import contextlib
import os
import struct

import crc32c
import msgpack
import numpy as np

from oncelog.errors import CorruptSnapshotError
from oncelog.segments.format import Buffer
from oncelog.storage.fs import FileHandle, FileSystem
from oncelog.storage.producer_row import FEW_ROWS, PRODUCER_DTYPE, ROW_HEAD, UNKNOWN_APPEND_MS, WINDOW

SNAPSHOT_SUFFIX = ".snapshot"
TMP_SUFFIX = ".tmp"
CORRUPT_SUFFIX = ".corrupt"

ONCELOG_VERSION = 0x6F6D
ONCELOG_V1_VERSION = 0x6F6C
KAFKA_V1_VERSION = 1
_PREFIX = struct.Struct(">hI")  # version, crc
_HEADER_LEN = struct.Struct(">I")
_KAFKA_COUNT = struct.Struct(">i")
KAFKA_V1_ENTRY = np.dtype(
    [
        ("producer_id", ">i8"),
        ("producer_epoch", ">i2"),
        ("last_sequence", ">i4"),
        ("last_offset", ">i8"),
        ("offset_delta", ">i4"),
        ("timestamp_ms", ">i8"),
        ("coordinator_epoch", ">i4"),
        ("txn_first_offset", ">i8"),
    ]
)
assert KAFKA_V1_ENTRY.itemsize == 46
# oncelog's first row layout: read, never written.
ONCELOG_V1_ROW = np.dtype(
    [
        ("producer_id", "<i8"),
        ("last_activity_ms", "<i8"),  # the newest batch's timestamp (client clock)
        ("txn_first_offset", "<i8"),
        ("coordinator_epoch", "<i4"),
        ("producer_epoch", "<i2"),
        ("window_count", "u1"),
        ("live", "u1"),
        ("first_sequence", "<i4", (WINDOW,)),
        ("last_sequence", "<i4", (WINDOW,)),
        ("last_offset", "<i8", (WINDOW,)),
        ("offset_delta", "<i4", (WINDOW,)),
        ("max_timestamp_ms", "<i8", (WINDOW,)),
    ]
)
assert ONCELOG_V1_ROW.itemsize == 172
# The row layout of each oncelog version, as text: a snapshot whose header names
# another layout is refused, not misread.
_ROW_DTYPES = {ONCELOG_VERSION: PRODUCER_DTYPE, ONCELOG_V1_VERSION: ONCELOG_V1_ROW}
_LAYOUT = str(PRODUCER_DTYPE.descr)
# Computed once: str(dtype.descr) costs some 30 us, paid on every snapshot load (a
# LogManager opening 1,000 partitions reads about 3,000 headers).
_LAYOUTS = {dtype: str(dtype.descr) for dtype in _ROW_DTYPES.values()}
# A snapshot header is a few dozen bytes; anything larger is corruption.
_MAX_HEADER_BYTES = 64 * 1024
# Rows read, CRC'd and checked at a time by read_snapshot(into=): 1.25 MiB, within a
# core's L2 cache (2 MiB on the CI machine; a smaller cache only costs a little).
_READ_CHUNK_ROWS = 8192


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshot_offsets(fs: FileSystem, directory: str, names: list[str] | None = None) -> list[int]:
    """Offsets of the `%020d.snapshot` files, ascending (among `names`, if the caller listed them)."""
    listed = fs.listdir(directory) if names is None else names
    stems = [name[: -len(SNAPSHOT_SUFFIX)] for name in listed if name.endswith(SNAPSHOT_SUFFIX)]
    return sorted(int(stem) for stem in stems if len(stem) == 20 and stem.isdigit())


def encode_snapshot(offset: int, rows: np.ndarray) -> bytes:
    return b"".join(snapshot_buffers(offset, rows))


def snapshot_buffers(offset: int, rows: np.ndarray) -> list[Buffer]:
    """The snapshot as buffers to write back to back; the rows are not copied."""
    assert rows.dtype == PRODUCER_DTYPE, rows.dtype
    header: bytes = msgpack.packb(
        {
            "offset": offset,
            "producers": len(rows),
            "row_bytes": PRODUCER_DTYPE.itemsize,
            "fields": _LAYOUT,
        }
    )
    head = _HEADER_LEN.pack(len(header)) + header
    body = np.ascontiguousarray(rows).data.cast("B")
    crc = crc32c.crc32c(body, crc32c.crc32c(head))
    return [_PREFIX.pack(ONCELOG_VERSION, crc), head, body]


def decode_snapshot(data: Buffer, offset: int, path: str = "<buffer>") -> np.ndarray:
    """The producer rows in a snapshot, oncelog's or Kafka's v1.

    oncelog's rows come back as a read-only view of `data`, not a copy: the
    producer table copies them once when it loads them. Duplicate producer ids
    are caught by that load (PidSlotMap), which needs no sort.
    """
    if len(data) < _PREFIX.size:
        raise CorruptSnapshotError(f"{path}: {len(data)} bytes is shorter than a snapshot header")
    version, stored_crc = _PREFIX.unpack_from(data)
    body = memoryview(data)[_PREFIX.size :]
    computed = crc32c.crc32c(body)
    if computed != stored_crc:
        raise CorruptSnapshotError(
            f"{path}: CRC mismatch (stored {stored_crc:#010x}, computed {computed:#010x})"
        )
    if version in _ROW_DTYPES:
        rows = _decode_oncelog(body, offset, path, _ROW_DTYPES[version])
        return rows if version == ONCELOG_VERSION else _from_oncelog_v1(rows)
    if version == KAFKA_V1_VERSION:
        return _decode_kafka_v1(body, path)
    raise CorruptSnapshotError(f"{path}: unknown snapshot version {version}")


def _parse_oncelog_header(
    body: memoryview, offset: int, path: str, row_dtype: np.dtype = PRODUCER_DTYPE
) -> tuple[int, int]:
    """(producer count, byte where the rows start within `body`), checked."""
    if len(body) < _HEADER_LEN.size:
        raise CorruptSnapshotError(f"{path}: header length is missing")
    (header_bytes,) = _HEADER_LEN.unpack_from(body)
    if header_bytes > min(_MAX_HEADER_BYTES, len(body) - _HEADER_LEN.size):
        raise CorruptSnapshotError(f"{path}: header of {header_bytes} bytes does not fit")
    try:
        header = msgpack.unpackb(body[_HEADER_LEN.size : _HEADER_LEN.size + header_bytes])
    except Exception as exc:  # msgpack raises several types for bad input
        raise CorruptSnapshotError(f"{path}: header does not parse: {exc}") from exc
    if not isinstance(header, dict) or header.get("offset") != offset:
        raise CorruptSnapshotError(f"{path}: header {header!r} does not describe offset {offset}")
    layout = _LAYOUTS.get(row_dtype) or str(row_dtype.descr)
    if header.get("row_bytes") != row_dtype.itemsize or header.get("fields") != layout:
        raise CorruptSnapshotError(f"{path}: rows have a layout this version does not know")
    count = header.get("producers")
    if not isinstance(count, int) or count < 0:
        raise CorruptSnapshotError(f"{path}: producer count {count!r} is not a count")
    return count, _HEADER_LEN.size + header_bytes


def _rows_valid(rows: np.ndarray) -> bool:
    """Every row is a live producer with a sane window."""
    if len(rows) <= FEW_ROWS and rows.dtype == PRODUCER_DTYPE and rows.flags.c_contiguous:
        raw, stride = rows.view(np.uint8).data, PRODUCER_DTYPE.itemsize
        heads = (ROW_HEAD.unpack_from(raw, n * stride) for n in range(len(rows)))
        return all(head[7] == 1 and head[6] <= WINDOW and head[0] >= 0 for head in heads)
    return bool(
        # The methods, not np.all: its Python wrapper costs more than a few rows' check.
        (rows["live"] == 1).all()
        and (rows["window_count"] <= WINDOW).all()
        and (rows["producer_id"] >= 0).all()
    )


def _check_rows(rows: np.ndarray, path: str) -> None:
    # Assert after reading: every row is a live producer with a sane window.
    if not _rows_valid(rows):
        raise CorruptSnapshotError(f"{path}: rows fail their invariants")


def _decode_oncelog(body: memoryview, offset: int, path: str, row_dtype: np.dtype) -> np.ndarray:
    count, rows_start = _parse_oncelog_header(body, offset, path, row_dtype)
    rows_data = body[rows_start:]
    if count * row_dtype.itemsize != len(rows_data):
        raise CorruptSnapshotError(f"{path}: {len(rows_data)} bytes of rows for {count} producers")
    rows = np.frombuffer(rows_data, dtype=row_dtype)
    _check_rows(rows, path)
    return rows


def _from_oncelog_v1(old: np.ndarray) -> np.ndarray:
    """Rows of oncelog's first layout in today's: the append time is unknown."""
    rows = np.zeros(len(old), PRODUCER_DTYPE)
    for name in PRODUCER_DTYPE.names or ():
        if name in (old.dtype.names or ()):
            rows[name] = old[name]
    rows["last_timestamp_ms"] = old["last_activity_ms"]
    rows["last_append_ms"] = UNKNOWN_APPEND_MS
    return rows


def _decode_kafka_v1(body: memoryview, path: str) -> np.ndarray:
    if len(body) < _KAFKA_COUNT.size:
        raise CorruptSnapshotError(f"{path}: entry count is missing")
    (count,) = _KAFKA_COUNT.unpack_from(body)
    entries_data = body[_KAFKA_COUNT.size :]
    if count < 0 or count * KAFKA_V1_ENTRY.itemsize != len(entries_data):
        raise CorruptSnapshotError(f"{path}: {len(entries_data)} bytes of entries for {count} producers")
    entries = np.frombuffer(entries_data, dtype=KAFKA_V1_ENTRY)
    rows = np.zeros(count, PRODUCER_DTYPE)
    rows["producer_id"] = entries["producer_id"]
    rows["producer_epoch"] = entries["producer_epoch"]
    rows["last_timestamp_ms"] = entries["timestamp_ms"]
    # Kafka stores no append time (it expires by timestamp): the load decides.
    rows["last_append_ms"] = UNKNOWN_APPEND_MS
    rows["coordinator_epoch"] = entries["coordinator_epoch"]
    rows["txn_first_offset"] = entries["txn_first_offset"]
    rows["live"] = 1
    # Kafka keeps one batch per producer; a producer with no sequence (only
    # transaction markers so far) has none.
    has_batch = entries["last_sequence"] >= 0
    rows["window_count"] = has_batch.astype(np.uint8)
    last_seq = entries["last_sequence"].astype(np.int64)
    delta = entries["offset_delta"].astype(np.int64)
    rows["last_sequence"][:, 0] = np.where(has_batch, last_seq, 0)
    rows["last_offset"][:, 0] = np.where(has_batch, entries["last_offset"], 0)
    rows["offset_delta"][:, 0] = np.where(has_batch, delta, 0)
    rows["max_timestamp_ms"][:, 0] = np.where(has_batch, entries["timestamp_ms"], 0)
    _check_rows(rows, path)  # (a negative producer id: Kafka writes none, the pid map takes none)
    return rows


def write_snapshot(fs: FileSystem, directory: str, offset: int, rows: np.ndarray) -> str:
    """Write the snapshot durably; returns its path."""
    buffers = snapshot_buffers(offset, rows)
    path = os.path.join(directory, snapshot_file_name(offset))
    tmp_path = path + TMP_SUFFIX
    handle = fs.open(tmp_path, create=True)
    try:
        handle.truncate(0)
        handle.pwritev(buffers, 0)
        # fsync before rename: otherwise a crash can leave the new name on empty or partial data.
        handle.fsync()
    except OSError:
        # A full disk: give back what the partial file holds (the next load would remove it).
        with contextlib.suppress(OSError):
            fs.unlink(tmp_path)
        raise
    finally:
        handle.close()
    # rename: atomically replaces any older snapshot at this offset; readers never see a partial file.
    fs.rename(tmp_path, path)
    # fsync(dir): without it a power loss can forget the rename, and the snapshot with it.
    fs.fsync_dir(directory)
    return path


def read_snapshot(
    fs: FileSystem, directory: str, offset: int, *, into: np.ndarray | None = None
) -> np.ndarray:
    """The rows of a snapshot file.

    With `into` (the producer table), oncelog's rows are read straight into its
    first rows and that view is returned: a 170 MB snapshot is then read once and
    copied never. On a CRC failure those rows are zeroed again.
    """
    path = os.path.join(directory, snapshot_file_name(offset))
    handle = fs.open(path, writable=False)
    try:
        size = handle.size()
        head = memoryview(handle.pread(min(size, _PREFIX.size + _HEADER_LEN.size + _MAX_HEADER_BYTES), 0))
        if into is not None and len(head) >= _PREFIX.size and _PREFIX.unpack_from(head)[0] == ONCELOG_VERSION:
            rows = _read_rows_into(handle, head, size, offset, path, into)
            if rows is not None:
                return rows
        # np.empty: a large snapshot should not be zero-filled just to be overwritten.
        data = np.empty(size, dtype=np.uint8)
        read = handle.pread_into(data.data, 0)
    finally:
        handle.close()
    return decode_snapshot(data.data[:read], offset, path)


def _read_rows_into(
    handle: FileHandle, head: memoryview, size: int, offset: int, path: str, into: np.ndarray
) -> np.ndarray | None:
    """Read an oncelog snapshot's rows into `into`; None if they do not fit there.

    A chunk at a time, each CRC'd and checked while it is still in the CPU cache: 1M
    rows (160 MB) pass through main memory once instead of once per step (measured
    53 ms -> 29 ms for the read, CRC and checks of 1M rows).
    """
    _, stored_crc = _PREFIX.unpack_from(head)
    count, rows_start = _parse_oncelog_header(head[_PREFIX.size :], offset, path)
    rows_start += _PREFIX.size
    if rows_start > len(head) or count * PRODUCER_DTYPE.itemsize != size - rows_start:
        raise CorruptSnapshotError(f"{path}: {size - rows_start} bytes of rows for {count} producers")
    if count > len(into):
        return None  # the caller's table is too small; the plain path reports it
    rows = into[:count]
    rows_bytes = rows.data.cast("B")
    computed = crc32c.crc32c(head[_PREFIX.size : rows_start])
    valid = complete = True
    for first in range(0, count, _READ_CHUNK_ROWS):
        chunk = rows[first : first + _READ_CHUNK_ROWS]
        chunk_bytes = rows_bytes[first * PRODUCER_DTYPE.itemsize :][: chunk.nbytes]
        start = rows_start + first * PRODUCER_DTYPE.itemsize
        if start + len(chunk_bytes) <= len(head):
            # Read already, with the header (a small snapshot): copied, not read again.
            chunk_bytes[:] = head[start : start + len(chunk_bytes)]
            read = len(chunk_bytes)
        else:
            read = handle.pread_into(chunk_bytes, start)
        computed = crc32c.crc32c(chunk_bytes[:read], computed)
        if read != len(chunk_bytes):
            complete = False
            break
        valid = valid and _rows_valid(chunk)
    if not complete or computed != stored_crc:
        rows[:] = np.zeros(1, PRODUCER_DTYPE)
        raise CorruptSnapshotError(
            f"{path}: CRC mismatch (stored {stored_crc:#010x}, computed {computed:#010x})"
        )
    if not valid:
        raise CorruptSnapshotError(f"{path}: rows fail their invariants")
    return rows


def set_aside(fs: FileSystem, directory: str, offset: int) -> None:
    """Rename a corrupt snapshot out of the way, keeping it for inspection."""
    path = os.path.join(directory, snapshot_file_name(offset))
    # rename, not unlink: the bytes stay for a post-mortem; the next load ignores them.
    fs.rename(path, path + CORRUPT_SUFFIX)


def delete_snapshot(fs: FileSystem, directory: str, offset: int) -> None:
    fs.unlink(os.path.join(directory, snapshot_file_name(offset)))
