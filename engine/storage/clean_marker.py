"""The clean-shutdown marker: `.clean_shutdown` in a partition directory.

A clean close writes it last, after the flush, the store's last commit, the snapshot
and the indexes' trim are durable: its presence says the log needs no validation. The
next open takes it (reads it, moves it aside, makes the move durable) before loading,
so a crash while loading leaves a log that counts as unclean (KAFKA-10471).

It also carries a copy of the partition's metadata-store values as the close left them,
so a clean open need not open the store (an LMDB environment: a fifth of a clean open's
time). The store stays the authority: the copy is used only when it is whole and the
store's version token (`FileSystem.store_version`: its newest commit and a CRC of the
pages that commit uses) is still the one the close recorded. A store changed,
replaced, damaged or lost since is read, and judged, as without the copy.

    magic    4 bytes  b"OLCM"
    format   u8       1
    token    u8 length, then the store's version token
    count    u32      values that follow
    count x  (u16 key length, key in UTF-8, u32 value length, value)
    crc32c   u32      of every byte before it

Big-endian. An empty marker (what versions before this one wrote) or one that does
not decode (damage) still says the close finished; the open then reads the store itself.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Callable

import crc32c

from oncelog.storage.fs import FileSystem

CLEAN_SHUTDOWN_FILE = ".clean_shutdown"
# Where an open moves the marker it takes. Its presence means nothing: the next clean
# close writes the new marker into this file and renames it back.
TAKEN_MARKER_FILE = ".clean_shutdown.taken"
MAGIC = b"OLCM"
VERSION = 1
# A limit on what a clean open reads before it trusts: a store holding more than this
# (many retired producers) gets an empty marker, and the open reads the store.
MAX_MARKER_BYTES = 64 * 1024

_HEADER = struct.Struct(">4sBB")
_COUNT = struct.Struct(">I")
_KEY_LEN = struct.Struct(">H")
_VALUE_LEN = struct.Struct(">I")
_CRC = struct.Struct(">I")


@dataclasses.dataclass(frozen=True)
class StoreCopy:
    """The metadata store's values at a clean close, and its version token then."""

    store_version: bytes
    values: dict[str, bytes]


@dataclasses.dataclass(frozen=True)
class CleanMarker:
    """A marker taken from a directory: the close before was clean.

    `store_copy`: what the store held at that close, or None when the marker did not
    carry a whole copy (the open reads the store).

    `made_durable`: returns once taking the marker is durable, for a taker that makes it
    so while the log loads (LogManager: one syncfs beside every load). A load changes
    nothing while the log is clean, and calls it before it would (validating after all).
    None: the taker made it durable before handing the marker over."""

    store_copy: StoreCopy | None
    made_durable: Callable[[], None] | None = dataclasses.field(default=None, compare=False)


def encode_marker(copy: StoreCopy) -> bytes:
    """The marker's bytes for `copy`; empty past MAX_MARKER_BYTES."""
    values = copy.values
    if len(copy.store_version) > 255:
        return b""  # (no seam makes one this long)
    parts = [
        _HEADER.pack(MAGIC, VERSION, len(copy.store_version)),
        copy.store_version,
        _COUNT.pack(len(values)),
    ]
    for key, value in sorted(values.items()):
        name = key.encode("utf-8")
        parts += [_KEY_LEN.pack(len(name)), name, _VALUE_LEN.pack(len(value)), value]
    body = b"".join(parts)
    if len(body) + _CRC.size > MAX_MARKER_BYTES:
        return b""
    return body + _CRC.pack(crc32c.crc32c(body))


def decode_marker(raw: bytes) -> StoreCopy | None:
    """The copy a marker carries; None unless it is whole (empty, damaged, another format)."""
    if len(raw) < _HEADER.size + _CRC.size or len(raw) > MAX_MARKER_BYTES:
        return None
    body = memoryview(raw)[: -_CRC.size]
    if _CRC.unpack_from(raw, len(body))[0] != crc32c.crc32c(body):
        return None
    magic, version, token_len = _HEADER.unpack_from(body)
    if magic != MAGIC or version != VERSION:
        return None
    values: dict[str, bytes] = {}
    at = _HEADER.size
    try:
        token = bytes(body[at : at + token_len])
        at += token_len
        (count,) = _COUNT.unpack_from(body, at)
        at += _COUNT.size
        for _ in range(count):
            (key_len,) = _KEY_LEN.unpack_from(body, at)
            at += _KEY_LEN.size
            key = bytes(body[at : at + key_len]).decode("utf-8")
            at += key_len
            (value_len,) = _VALUE_LEN.unpack_from(body, at)
            at += _VALUE_LEN.size
            value = bytes(body[at : at + value_len])
            at += value_len
            if len(value) != value_len or key in values:
                return None
            values[key] = value
    except (struct.error, UnicodeDecodeError):
        return None
    return StoreCopy(token, values) if at == len(body) else None


def take_clean_marker(fs: FileSystem, directory: str) -> CleanMarker | None:
    """Read the marker and move it aside (TAKEN_MARKER_FILE) if present; None if it was
    not. The move is not durable yet: the caller makes it so before loading (KAFKA-10471)."""
    marker = os.path.join(directory, CLEAN_SHUTDOWN_FILE)
    try:
        handle = fs.open(marker, writable=False)
    except FileNotFoundError:
        return None
    try:
        size = handle.size()
        raw = handle.pread(size, 0) if 0 < size <= MAX_MARKER_BYTES else b""
    finally:
        handle.close()
    try:
        # Moved, not removed: removing a file that holds a block costs ext4 60 us against 7
        # for a rename (measured), and the next clean close writes its marker into it.
        fs.rename(marker, os.path.join(directory, TAKEN_MARKER_FILE))
    except FileNotFoundError:
        return None  # gone between the two calls (another opener took it): not ours to trust
    return CleanMarker(decode_marker(raw))


def put_back_clean_marker(fs: FileSystem, directory: str) -> None:
    """Undo take_clean_marker for a partition nothing has opened since (a root's open cut
    short before it got there): its marker still tells the truth. Not made durable: a
    crash that loses it leaves the partition unclean, which is only slower."""
    # rename: the marker comes back whole, as it was taken; a crash before it recovers the log.
    fs.rename(os.path.join(directory, TAKEN_MARKER_FILE), os.path.join(directory, CLEAN_SHUTDOWN_FILE))


def store_copy_if_current(fs: FileSystem, store_path: str, marker: CleanMarker) -> StoreCopy | None:
    """The marker's copy if the store at `store_path` is still the one it copied (None:
    read the store). Errors as `FileSystem.store_version`."""
    copy = marker.store_copy
    if copy is None or fs.store_version(store_path) != copy.store_version:
        return None
    return copy


def write_clean_marker(fs: FileSystem, directory: str, copy: StoreCopy | None) -> None:
    """Leave the marker, carrying `copy` (None: an empty marker). Call it last in a
    clean close: everything it vouches for must already be durable.

    Written into the file the open moved aside (reusing its block), then renamed into
    place: the marker never exists with less than its whole content."""
    taken = os.path.join(directory, TAKEN_MARKER_FILE)
    raw = b"" if copy is None else encode_marker(copy)
    handle = fs.open(taken, create=True)
    try:
        if raw:
            handle.pwritev([raw], 0)
        handle.truncate(len(raw))  # (within the block it already has: nothing is freed)
        # fsync: the marker's content must be on disk before the rename makes it count.
        handle.fsync()
    finally:
        handle.close()
    # rename: the marker appears whole or not at all; an older one is never half-replaced.
    fs.rename(taken, os.path.join(directory, CLEAN_SHUTDOWN_FILE))
    # fsync(dir): the marker's directory entry must survive power loss, or the next open rescans.
    fs.fsync_dir(directory)
