"""Decode the records of many Kafka v2 batch bodies at once into numpy columns of fields and byte ranges.

The Arrow builder's engine (arrow_batches.py); numpy only. A Python object per
record caps a reader at a few hundred thousand records a second, so nothing here
loops over records in Python, except to finish a few long batches:

1. Record boundaries: a batch's records are sequential (each starts where the
   previous one's length says), but batches are independent, so the walk goes in
   lockstep, one record of every batch per numpy step.
2. Fields: once every record's start is known, each field of every record is
   read at once, one vectorised varint read per field (Kafka's v2 record layout).
3. Keys, values, header keys and values stay (start, length) ranges into the
   joined bodies; `gather` cuts many ranges out with one boolean mask.

Every length is checked against its record's end, so a malformed body raises
CorruptRecordError, never IndexError.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from oncelog.errors import CorruptRecordError

Ints = np.ndarray[Any, np.dtype[np.int64]]
Int32s = np.ndarray[Any, np.dtype[np.int32]]
Bytes = np.ndarray[Any, np.dtype[np.uint8]]

# Zeros the caller appends after the bodies: a varint read near a record's end may look ahead.
PAD = bytes(16)
# Below this many batches still walking, a numpy step costs more than a Python loop per record.
_MIN_LANES = 32


class RecordFields(NamedTuple):
    """Per record (batch order, then record order), and per header for the h_* columns."""

    timestamp_delta: Ints
    offset_delta: Ints
    key_start: Ints
    key_length: Ints  # -1: null
    value_start: Ints
    value_length: Ints  # -1: null
    header_count: Ints
    header_key_start: Ints
    header_key_length: Ints
    header_value_start: Ints
    header_value_length: Ints  # -1: null


def decode_fields(joined: bytes, body_start: Ints, body_end: Ints, counts: Ints) -> RecordFields:
    """The fields of the `counts[i]` (>= 1) records in each body [body_start[i], body_end[i]) of `joined`.

    `joined` must end with PAD, so that a varint read at a record's last byte stays
    inside it.
    """
    buf = np.frombuffer(joined, dtype=np.uint8)
    try:
        start, end = _fast_bounds(joined, body_start, body_end, counts)
    except _NotSimple:
        start, end = _checked_bounds(buf, joined, body_start, body_end, counts)
    pos = start + 1  # the attributes byte, unused
    ts_delta, pos = varints(buf, pos, 10, end)
    offset_delta, pos = varints(buf, pos, 5, end)
    key_length, key_start = varints(buf, pos, 5, end)
    value_length, value_start = varints(buf, skip(key_start, key_length, end), 5, end)
    header_count, pos = varints(buf, skip(value_start, value_length, end), 5, end)
    # Each header takes at least two bytes, which bounds a corrupt count before it sizes arrays.
    if len(header_count) and (header_count.min() < 0 or (header_count * 2 > end - pos).any()):
        bad = int(np.flatnonzero((header_count < 0) | (header_count * 2 > end - pos))[0])
        raise CorruptRecordError(
            f"header count {int(header_count[bad])} at byte {int(pos[bad])} is impossible"
        )
    headers = _headers(buf, pos, header_count, end)
    pos = headers[-1]
    if not np.array_equal(pos, end):
        bad = int(np.flatnonzero(pos != end)[0])
        raise CorruptRecordError(f"a record's fields end at byte {pos[bad]}, its length says {end[bad]}")
    return RecordFields(
        ts_delta, offset_delta, key_start, key_length, value_start, value_length, header_count, *headers[:4]
    )


class _NotSimple(Exception):
    """The fast walk's assumption (length varints of one or two bytes, sane lengths) fails."""


def _lanes(counts: Ints, body_start: Ints) -> tuple[Ints, Ints, Ints, Ints]:
    """Batches as lanes, longest first, so the lanes still walking at step i are a prefix."""
    first_record = np.cumsum(counts) - counts
    order = np.argsort(-counts, kind="stable")
    return order, counts[order], body_start[order].copy(), first_record[order]


def _fast_bounds(joined: bytes, body_start: Ints, body_end: Ints, counts: Ints) -> tuple[Ints, Ints]:
    """(start, end) of every record, assuming length varints of at most two bytes (records < 8 KiB).

    Each step reads two bytes per lane with one gather through an unaligned
    little-endian uint16 view and checks nothing; the whole walk is verified once
    at the end, and any doubt (a longer varint, a bad length) raises _NotSimple so
    the caller takes the checked walk, which names the problem.
    """
    two = np.ndarray(shape=(len(joined) - 1,), dtype="<u2", buffer=joined, strides=(1,))
    order, lane_counts, pos, out = _lanes(counts, body_start)
    at = np.empty(int(counts.sum()), dtype=np.int64)  # where each record's length varint starts
    lanes, step = len(order), 0
    try:
        while lanes:
            while lanes and lane_counts[lanes - 1] <= step:
                lanes -= 1
            if lanes < _MIN_LANES:
                for lane in range(lanes):
                    _walk_one(joined, int(pos[lane]), int(out[lane]), step, int(lane_counts[lane]), at)
                break
            p = pos[:lanes]
            word = two[p]
            more = (word >> 7) & 1
            at[out[:lanes] + step] = p
            p += ((word & 0x7F) | ((word >> 1) & 0x3F80) * more) >> 1
            p += more + 1
            step += 1
        word = two[at]
    except IndexError:
        raise _NotSimple from None
    more = (word >> 7) & 1
    raw = (word & 0x7F) | ((word >> 1) & 0x3F80) * more
    start = at + 1 + more
    end = start + (raw >> 1)
    last = np.cumsum(counts) - 1
    follows = np.ones(len(at), dtype=bool)
    follows[:-1] = end[:-1] == at[1:]
    follows[last] = end[last] == body_end
    if not (
        follows.all() and ((raw & 1) == 0).all() and (raw >= 2).all() and ((word & 0x8080) != 0x8080).all()
    ):
        raise _NotSimple
    return start, end


def _walk_one(data: bytes, pos: int, out: int, step: int, count: int, at: Ints) -> None:
    """_fast_bounds for one lane in Python: the varint positions of its records from `step` on."""
    for i in range(step, count):
        at[out + i] = pos
        raw = shift = 0
        while True:
            byte = data[pos]
            raw |= (byte & 0x7F) << shift
            pos += 1
            shift += 7
            if byte < 0x80 or shift > 28:
                break
        pos += (raw >> 1) ^ -(raw & 1)


def _checked_bounds(
    buf: Bytes, joined: bytes, body_start: Ints, body_end: Ints, counts: Ints
) -> tuple[Ints, Ints]:
    """(start after the length varint, end) of every record, checking each step."""
    total = int(counts.sum())
    starts = np.empty(total, dtype=np.int64)
    ends = np.empty(total, dtype=np.int64)
    order, lane_counts, pos, out = _lanes(counts, body_start)
    lane_end = body_end[order]
    for step in range(int(lane_counts[0]) if len(order) else 0):
        lanes = int(np.count_nonzero(lane_counts > step))
        length, content = varints(buf, pos[:lanes], 5, lane_end[:lanes])
        stop = content + length
        wrong = (length < 1) | (stop > lane_end[:lanes])
        if wrong.any():
            bad = int(np.flatnonzero(wrong)[0])
            raise CorruptRecordError(f"record length {length[bad]} at byte {pos[bad]} does not fit its batch")
        index = out[:lanes] + step
        starts[index] = content
        ends[index] = stop
        pos[:lanes] = stop
    last = np.cumsum(counts) - 1
    if not np.array_equal(ends[last], body_end):
        bad = int(np.flatnonzero(ends[last] != body_end)[0])
        raise CorruptRecordError(
            f"{int(body_end[bad] - ends[last][bad])} bytes after the last of {int(counts[bad])} "
            "records of a batch"
        )
    return starts, ends


def varints(buf: Bytes, pos: Ints, max_bytes: int, limit: Ints) -> tuple[Ints, Ints]:
    """Zigzag varints at every position: (values, positions after them), each ending by `limit`.

    Nearly all are one or two bytes: those come from one gather through an
    unaligned little-endian uint16 view (two bytes per position); only when some
    are longer does each further byte get read, for the lanes that still have one.
    """
    two = np.ndarray(shape=(len(buf) - 1,), dtype="<u2", buffer=buf, strides=(1,))
    word = two[pos]
    if not ((word & 0x8080) == 0x8080).any():
        more = (word >> 7) & 1
        raw = ((word & 0x7F) | ((word >> 1) & 0x3F80) * more).astype(np.uint64)
        after = pos + 1 + more
    else:
        raw, after = _long_varints(buf, pos, max_bytes)
    if (after > limit).any():
        bad = int(np.flatnonzero(after > limit)[0])
        raise CorruptRecordError(f"a varint at byte {int(pos[bad])} runs past its record")
    values: Ints = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    return values, after


def _long_varints(buf: Bytes, pos: Ints, max_bytes: int) -> tuple[Any, Ints]:
    """(raw unsigned values, positions after them) of varints of any length up to `max_bytes`.

    As segments.records.decode_varint: a value wider than its field (32 bits for 5
    bytes, 64 for 10) is corrupt, where Java would drop the high bits.
    """
    width = 32 if max_bytes == 5 else 64
    byte = buf[pos]
    raw = (byte & 0x7F).astype(np.uint64)
    after = pos + 1
    more = np.flatnonzero(byte >= 0x80)
    shift = 7
    while more.size:
        if shift >= 7 * max_bytes:
            raise CorruptRecordError(f"a varint longer than {max_bytes} bytes at byte {int(pos[more[0]])}")
        byte = buf[after[more]]
        if shift + 7 > width and ((byte & 0x7F) >> (width - shift)).any():
            raise CorruptRecordError(f"a varint overflows a {max_bytes}-byte field")
        raw[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[more] += 1
        more = more[byte >= 0x80]
        shift += 7
    return raw, after


def skip(start: Ints, length: Ints, limit: Ints) -> Ints:
    """The position after a key or value of `length` bytes (-1: null) at `start`."""
    if len(length) and length.min() < -1:
        raise CorruptRecordError(f"a negative length {int(length.min())} in a record")
    stop = start + np.maximum(length, 0)
    if (stop > limit).any():
        bad = int(np.flatnonzero(stop > limit)[0])
        raise CorruptRecordError(
            f"a length of {int(length[bad])} at byte {int(start[bad])} runs past its record"
        )
    return stop


def _headers(buf: Bytes, pos: Ints, counts: Ints, limit: Ints) -> tuple[Ints, Ints, Ints, Ints, Ints]:
    """(key starts, key lengths, value starts, value lengths) of every header, and each record's end.

    Walked in lockstep like the records: lanes are the records with headers, step
    i reads header i of each.
    """
    total = int(counts.sum())
    key_start, key_len = np.empty(total, np.int64), np.empty(total, np.int64)
    value_start, value_len = np.empty(total, np.int64), np.empty(total, np.int64)
    pos = pos.copy()
    if not total:
        return key_start, key_len, value_start, value_len, pos
    first = np.cumsum(counts) - counts
    lanes = np.flatnonzero(counts)
    for step in range(int(counts.max())):
        lanes = lanes[counts[lanes] > step]
        lane_limit = limit[lanes]
        klen, kstart = varints(buf, pos[lanes], 5, lane_limit)
        if klen.min() < 0:
            raise CorruptRecordError(f"a header key of length {int(klen.min())} (keys are never null)")
        vlen, vstart = varints(buf, skip(kstart, klen, lane_limit), 5, lane_limit)
        pos[lanes] = skip(vstart, vlen, lane_limit)
        index = first[lanes] + step
        key_start[index], key_len[index], value_start[index], value_len[index] = kstart, klen, vstart, vlen
    return key_start, key_len, value_start, value_len, pos


def gather(buf: Bytes, start: Ints, length: Ints) -> tuple[Int32s, Bytes]:
    """(int32 offsets, bytes) of the ranges [start, start + length) back to back; -1 counts as 0.

    When every range has the same length (fixed-size keys or values, the common
    case), each is one row of a strided view of `buf` and a single fancy index
    copies them (about 3x the general way). Otherwise the ranges, in order and not
    overlapping, are cut out with one boolean mask over `buf`, built as
    alternating runs of "skip" and "take" (np.repeat).
    """
    n = len(start)
    size = np.maximum(length, 0)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(size, out=offsets[1:])
    if not n or not offsets[-1]:
        return offsets, np.empty(0, dtype=np.uint8)
    present = length >= 0
    width = int(size.max())
    if int(offsets[-1]) == width * int(np.count_nonzero(present)):  # every non-null range is `width` long
        rows = np.lib.stride_tricks.as_strided(buf, shape=(len(buf) - width + 1, width), strides=(1, 1))
        return offsets, rows[start if present.all() else start[present]].reshape(-1)
    runs = np.empty(2 * n, dtype=np.int64)
    runs[0] = start[0]
    runs[2::2] = start[1:] - (start[:-1] + size[:-1])
    runs[1::2] = size
    take = np.zeros(2 * n, dtype=bool)
    take[1::2] = True
    mask = np.repeat(take, runs)
    return offsets, buf[: len(mask)][mask]
