"""RecordBatch: a zero-copy view of one Kafka v2 batch, plus the batch builder.

Pure: no I/O. A RecordBatch parses the 61-byte header once and exposes each field;
records are decoded only when `records()` is called, so scanning a segment costs one
struct unpack per batch.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import crc32c

from oncelog.segments import format as fmt
from oncelog.segments.compression import MAX_DECOMPRESSED_BYTES, compress, decompress
from oncelog.segments.errors import CorruptRecordError
from oncelog.segments.format import Buffer
from oncelog.segments.records import (
    Record,
    check_records,
    decode_records,
    encode_plain_records,
    encode_records,
    normalise_records,
)

# The smallest legal batchLength: the header after the length field, no records.
MIN_BATCH_LENGTH = fmt.HEADER_SIZE - fmt.LOG_OVERHEAD


class TruncatedBatchError(CorruptRecordError):
    """The buffer ends inside a batch.

    At the end of a segment this is what a writer crashing mid-write leaves, so the
    caller (recovery) may treat it as end of log rather than corruption.
    """


class UnwrittenSpaceError(CorruptRecordError):
    """An all-zero header where the next batch should start: space never written.

    The active segment is written through a mapping of pre-allocated space, and a
    power loss can leave pages unwritten; both read as zeros. At the end of the
    active segment that is where the data ends; anywhere else it is corruption, so
    the caller decides.
    """


_ZERO_PREFIX = bytes(fmt.SIZE_AND_MAGIC_BYTES)


def batch_size_at(buffer: Buffer, position: int = 0) -> int:
    """Total size of the batch starting at `position`, from its length field only.

    Raises TruncatedBatchError when the buffer ends before the size-and-magic prefix
    and CorruptRecordError when the length is impossible.
    """
    if len(buffer) - position < fmt.SIZE_AND_MAGIC_BYTES:
        raise TruncatedBatchError(
            f"{len(buffer) - position} bytes left, a batch needs {fmt.SIZE_AND_MAGIC_BYTES} to give its size",
            position=position,
        )
    _, length, _, magic = fmt.SIZE_AND_MAGIC_STRUCT.unpack_from(buffer, position)
    if magic == 0 and buffer[position : position + fmt.SIZE_AND_MAGIC_BYTES] == _ZERO_PREFIX:
        raise UnwrittenSpaceError("zeros where a batch header should be: unwritten space", position=position)
    if magic != fmt.MAGIC_V2:
        raise CorruptRecordError(f"magic {magic} is not 2 (record batch v2)", position=position)
    if length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batchLength {length} is below the minimum {MIN_BATCH_LENGTH}", position=position
        )
    return int(length) + fmt.LOG_OVERHEAD


class BatchHeader(NamedTuple):
    """The 61-byte v2 header, field by field.

    A NamedTuple, so hot loops (recovery replays thousands of batches) read fields
    at C speed instead of through RecordBatch's properties.
    """

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int


_unpack_header = fmt.HEADER_STRUCT.unpack_from
_new_header = tuple.__new__  # builds the NamedTuple without its Python-level __new__


def header_problem(header: tuple[Any, ...], computed_crc: int) -> str | None:
    """What is wrong with a stored batch whose header unpacks (HEADER_STRUCT) to `header`
    and whose bytes after the CRC field have `computed_crc`; None when nothing is."""
    magic, crc, attributes, delta, count = header[3], header[4], header[5], header[6], header[12]
    if magic != fmt.MAGIC_V2:
        return f"magic {magic} is not 2"
    if computed_crc != crc:
        return f"CRC mismatch: stored {crc:#010x}, computed {computed_crc:#010x}"
    if delta < 0:
        return f"lastOffsetDelta {delta} is negative"
    if count < 0 or count > delta + 1:
        return f"recordsCount {count} does not fit lastOffsetDelta {delta}"
    if attributes & fmt.COMPRESSION_MASK not in fmt.COMPRESSION_NAMES:
        return f"unknown compression codec {attributes & fmt.COMPRESSION_MASK}"
    return None


def client_append_problem(header: tuple[Any, ...], previous_last_offset: int | None) -> str | None:
    """What shows that a stored batch (its header unpacked by HEADER_STRUCT) is not as a
    client append left it, in the fields outside the CRC; None when nothing does.
    `previous_last_offset`: the last offset of the batch before it (None: not known)."""
    base_offset, leader_epoch = header[0], header[2]
    if leader_epoch != fmt.NO_PARTITION_LEADER_EPOCH:
        return (
            f"batch at offset {base_offset} has partitionLeaderEpoch {leader_epoch}, not oncelog's stamp -1"
        )
    if previous_last_offset is not None and base_offset != previous_last_offset + 1:
        return (
            f"batch at offset {base_offset} leaves a gap after {previous_last_offset} in a log that has none"
        )
    return None


class TailChecks(NamedTuple):
    """What the batches of a clean segment's tail must also agree with."""

    first_base_offset: int | None = None  # the first batch's base offset (it starts the segment)
    first_last_offset: int | None = None  # the first batch's last offset (the index entry says so)
    client_only: bool = False  # client_append_problem holds for every batch
    # Every last offset within an i32 of this base (an index entry's relative offset).
    segment_base_offset: int | None = None
    # No batch starts more than this past the first (the last indexed one): appending
    # would have indexed it, so an entry was lost (a clean open of the active segment).
    index_interval_bytes: int | None = None


NO_TAIL_CHECKS = TailChecks()


class WalkedBatches(NamedTuple):
    next_offset: int  # one past the last batch's last offset
    max_timestamp_ms: int
    offset_of_max_timestamp: int


def walk_whole_batches(
    buffer: Buffer,
    next_offset: int,
    max_timestamp_ms: int,
    offset_of_max_timestamp: int,
    checks: TailChecks = NO_TAIL_CHECKS,
) -> WalkedBatches | None:
    """Batches that fill `buffer` exactly, each one sound (header_problem), starting at or
    past `next_offset`, the offset after the one before, and agreeing with `checks`: what
    they leave, carrying on from the given offset and largest timestamp. One unpack and
    one CRC a batch, no objects (a clean open checks its active segment's tail so).

    None at the first batch that is not so, or does not fit (the caller then validates
    the segment as after a crash, which names what is wrong).
    """
    unpack = fmt.HEADER_STRUCT.unpack_from
    view = memoryview(buffer)
    end, at = len(view), 0
    previous_last: int | None = None
    while at < end:
        if end - at < fmt.HEADER_SIZE:
            return None
        header = unpack(view, at)
        size = header[1] + fmt.LOG_OVERHEAD
        if header[1] < MIN_BATCH_LENGTH or size > end - at or header[0] < next_offset:
            return None
        if checks.index_interval_bytes is not None and at > checks.index_interval_bytes:
            return None
        if header_problem(header, crc32c.crc32c(view[at + fmt.ATTRIBUTES_OFFSET : at + size])) is not None:
            return None
        last = header[0] + header[6]
        if at == 0 and checks.first_base_offset not in (None, header[0]):
            return None
        if at == 0 and checks.first_last_offset not in (None, last):
            return None
        if checks.client_only and client_append_problem(header, previous_last) is not None:
            return None
        if checks.segment_base_offset is not None and last - checks.segment_base_offset > fmt.INT32_MAX:
            return None
        previous_last, next_offset = last, last + 1
        if header[8] > max_timestamp_ms:
            max_timestamp_ms, offset_of_max_timestamp = header[8], last
        at += size
    return WalkedBatches(next_offset, max_timestamp_ms, offset_of_max_timestamp)


class RecordBatch:
    """A view of the batch at the start of `buffer` (which may hold more after it)."""

    __slots__ = ("_buffer", "_header")

    def __init__(self, buffer: Buffer):
        view = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
        size = batch_size_at(view)
        if len(view) < size:
            raise TruncatedBatchError(f"batch of {size} bytes but only {len(view)} remain", position=0)
        self._buffer = view[:size]
        self._header: BatchHeader = _new_header(BatchHeader, _unpack_header(view))

    @classmethod
    def of_sized_view(cls, view: memoryview) -> RecordBatch:
        """A batch over exactly `view`, whose size batch_size_at has already checked (scans)."""
        batch = cls.__new__(cls)
        batch._buffer = view
        batch._header = _new_header(BatchHeader, _unpack_header(view))
        return batch

    @property
    def header(self) -> BatchHeader:
        return self._header

    # -- header fields ---------------------------------------------------------
    @property
    def buffer(self) -> memoryview:
        return self._buffer

    @property
    def size(self) -> int:
        return len(self._buffer)

    @property
    def base_offset(self) -> int:
        return int(self._header[0])

    @property
    def batch_length(self) -> int:
        return int(self._header[1])

    @property
    def partition_leader_epoch(self) -> int:
        return int(self._header[2])

    @property
    def magic(self) -> int:
        return int(self._header[3])

    @property
    def crc(self) -> int:
        return int(self._header[4])

    @property
    def attributes(self) -> int:
        return int(self._header[5])

    @property
    def last_offset_delta(self) -> int:
        return int(self._header[6])

    @property
    def base_timestamp(self) -> int:
        return int(self._header[7])

    @property
    def max_timestamp(self) -> int:
        return int(self._header[8])

    @property
    def producer_id(self) -> int:
        return int(self._header[9])

    @property
    def producer_epoch(self) -> int:
        return int(self._header[10])

    @property
    def base_sequence(self) -> int:
        return int(self._header[11])

    @property
    def records_count(self) -> int:
        return int(self._header[12])

    # -- derived fields --------------------------------------------------------
    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record; wraps from INT32_MAX to 0 like Kafka's."""
        base = self.base_sequence
        if base == fmt.NO_SEQUENCE:
            return fmt.NO_SEQUENCE
        return (base + self.last_offset_delta) % (fmt.INT32_MAX + 1)

    @property
    def compression(self) -> int:
        return self.attributes & fmt.COMPRESSION_MASK

    @property
    def compression_name(self) -> str:
        return fmt.COMPRESSION_NAMES.get(self.compression, f"unknown({self.compression})")

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & fmt.TIMESTAMP_TYPE_MASK)

    @property
    def timestamp_type(self) -> str:
        return "LogAppendTime" if self.is_log_append_time else "CreateTime"

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & fmt.TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & fmt.CONTROL_MASK)

    # -- checks and decoding ---------------------------------------------------
    def compute_crc(self) -> int:
        return int(crc32c.crc32c(self._buffer[fmt.ATTRIBUTES_OFFSET :]))

    def is_valid(self) -> bool:
        try:
            self.validate()
        except CorruptRecordError:
            return False
        return True

    def validate(self) -> None:
        """Structural checks that hold for any stored batch, compacted ones included
        (header_problem).

        The stricter rules for client appends (count == lastOffsetDelta + 1, no
        control batches) live in the log's append path, because compacted Kafka
        logs legally hold batches that break them.
        """
        problem = header_problem(self._header, self.compute_crc())
        if problem is not None:
            raise CorruptRecordError(problem)

    def check_records(self, *, exact: bool, max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES) -> int:
        """Check that every record decodes (see check_batch_records); the largest timestamp delta."""
        h = self._header
        return check_batch_records(
            self._buffer,
            h.attributes,
            h.last_offset_delta,
            h.records_count,
            exact=exact,
            max_decompressed_bytes=max_decompressed_bytes,
        )

    def records(self, max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES) -> Iterator[Record]:
        # Fields straight from the header tuple: a fetch of small batches calls this per batch.
        base_offset, _, _, _, _, attributes, _, base_ts, max_ts, _, _, _, count = self._header
        codec = attributes & fmt.COMPRESSION_MASK
        body = bytes(self._buffer[fmt.HEADER_SIZE :])
        if codec != fmt.COMPRESSION_NONE:
            body = decompress(codec, body, max_decompressed_bytes)
        # Each record takes at least 7 bytes, which bounds a corrupt count.
        if count < 0 or count * 7 > len(body):
            raise CorruptRecordError(f"recordsCount {count} cannot fit {len(body)} bytes")
        append_time = max_ts if attributes & fmt.TIMESTAMP_TYPE_MASK else None
        return decode_records(body, count, base_offset, base_ts, append_time)

    def __repr__(self) -> str:
        return (
            f"RecordBatch(base_offset={self.base_offset}, last_offset={self.last_offset}, "
            f"count={self.records_count}, size={self.size}, producer_id={self.producer_id}, "
            f"producer_epoch={self.producer_epoch}, base_sequence={self.base_sequence})"
        )


def check_batch_records(
    buffer: Buffer,
    attributes: int,
    last_offset_delta: int,
    records_count: int,
    *,
    exact: bool,
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES,
) -> int:
    """Check that the records of the batch in `buffer` decode: what a reader will do to them.

    A batch's CRC only says the bytes are the ones the client sent; a client can
    send a body that does not hold the records its header counts (a bug, or on
    purpose), and once stored it would break every reader after it. The body is
    inflated when compressed (at most `max_decompressed_bytes`: a decompression bomb
    is refused, not allocated) and walked record by record (records.check_records;
    `exact`: offset deltas 0..count-1, as a client's must be). An uncompressed body
    is walked in place, without a copy.

    Returns the records' largest timestamp delta. Raises CorruptRecordError for a body
    that does not decode, InvalidRecordError for records that break the offset-delta rule.
    """
    codec = attributes & fmt.COMPRESSION_MASK
    if codec == fmt.COMPRESSION_NONE:
        return check_records(buffer, fmt.HEADER_SIZE, records_count, last_offset_delta, exact=exact)
    body = decompress(codec, bytes(buffer[fmt.HEADER_SIZE :]), max_decompressed_bytes)
    return check_records(body, 0, records_count, last_offset_delta, exact=exact)


def iter_batches(
    buffer: Buffer, position: int = 0, *, until_unwritten: bool = False
) -> Iterator[RecordBatch]:
    """Walk batches header by header; no CRC check, no record decoding.

    Raises TruncatedBatchError if the buffer ends inside a batch and
    CorruptRecordError (with the position) if a header is impossible. Deciding
    whether that is a torn tail or corruption is the caller's business.
    `until_unwritten` ends the walk quietly at zeros (UnwrittenSpaceError), as
    when reading an active segment file with its pre-allocated space.
    """
    view = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
    end = len(view)
    while position < end:
        try:
            size = batch_size_at(view, position)
        except UnwrittenSpaceError:
            if until_unwritten:
                return
            raise
        if end - position < size:
            raise TruncatedBatchError(
                f"batch of {size} bytes but only {end - position} remain", position=position
            )
        yield RecordBatch(view[position : position + size])
        position += size


def encode_batch(
    records: Iterable[object],
    *,
    base_offset: int = 0,
    producer_id: int = fmt.NO_PRODUCER_ID,
    producer_epoch: int = fmt.NO_PRODUCER_EPOCH,
    base_sequence: int = fmt.NO_SEQUENCE,
    is_transactional: bool = False,
    timestamp_ms: int | None = None,
    compression: str | int | None = None,
    partition_leader_epoch: int = fmt.NO_PARTITION_LEADER_EPOCH,
    control: bool = False,
) -> bytes:
    """Build one v2 batch. A record is (key, value), (key, value, headers) or a Record.

    Records without their own timestamp get `timestamp_ms` (default: now).
    `control` sets the control bit: the broker's transaction markers (see
    segments.control), never a client's data.

    Every integer must fit its header field, and every record timestamp an i64, as
    must its difference from the first one (ValueError naming it; TypeError for a
    non-integer).
    """
    given = records if isinstance(records, list | tuple) else list(records)
    default_ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    plain = encode_plain_records(given, default_ts) if given else None
    if plain is not None:
        raw, base_ts, min_ts, max_ts = plain
    else:
        triples, own_stamps = normalise_records(given)
        if not triples:
            raise ValueError("a batch needs at least one record")
        stamps = [default_ts if ts is None else ts for ts in own_stamps]
        base_ts, min_ts, max_ts = stamps[0], min(stamps), max(stamps)
        raw = encode_records(triples, stamps, base_ts)
    if min_ts != base_ts or max_ts != base_ts:
        # Records with timestamps of their own: each is stored as a varlong delta from the base.
        _raise_field_out_of_range(
            ("the earliest record timestamp", min_ts, "i64"),
            ("the earliest record timestamp's delta from the first record's", min_ts - base_ts, "i64"),
            ("the latest record timestamp's delta from the first record's", max_ts - base_ts, "i64"),
        )
    codec = _codec(compression)
    body = compress(codec, raw)
    attributes = (
        codec | (fmt.TRANSACTIONAL_MASK if is_transactional else 0) | (fmt.CONTROL_MASK if control else 0)
    )
    length = fmt.HEADER_SIZE - fmt.LOG_OVERHEAD + len(body)
    try:  # packing is the range check of every field: nothing to pay for when they fit
        covered = fmt.CRC_COVERED_HEADER_STRUCT.pack(
            attributes,
            len(given) - 1,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            len(given),
        )
        prefix = fmt.SIZE_AND_MAGIC_STRUCT.pack(base_offset, length, partition_leader_epoch, fmt.MAGIC_V2)
    except struct.error:
        first_name = (
            "timestamp_ms" if plain is not None or timestamp_ms is not None else "the first record timestamp"
        )
        _raise_field_out_of_range(
            ("base_offset", base_offset, "i64"),
            ("producer_id", producer_id, "i64"),
            ("producer_epoch", producer_epoch, "i16"),
            ("base_sequence", base_sequence, "i32"),
            ("partition_leader_epoch", partition_leader_epoch, "i32"),
            (first_name, base_ts, "i64"),
            ("the latest record timestamp", max_ts, "i64"),
        )
        raise
    crc = crc32c.crc32c(body, crc32c.crc32c(covered))
    return b"".join((prefix, fmt.UINT32.pack(crc), covered, body))


def _raise_field_out_of_range(*fields: tuple[str, int, str]) -> None:
    """ValueError (TypeError for a non-integer) naming the first field that does not fit its width."""
    for name, value, width in fields:
        fmt.check_int(name, value, width)


def _codec(compression: str | int | None) -> int:
    if compression is None:
        return fmt.COMPRESSION_NONE
    if isinstance(compression, int):
        if compression not in fmt.COMPRESSION_NAMES:
            raise ValueError(f"unknown compression codec {compression}")
        return compression
    try:
        return fmt.COMPRESSION_CODES[compression]
    except KeyError:
        raise ValueError(
            f"compression is one of {sorted(fmt.COMPRESSION_CODES)}, got {compression!r}"
        ) from None
