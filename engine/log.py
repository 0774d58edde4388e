"""Log: one partition directory of segments, with append, read and roll.

Appends are validated in full before a byte is written, so a rejected request
leaves the log byte-for-byte unchanged. Offsets are stamped into the batch header
by rewriting only the first 17 bytes (the CRC does not cover them): the body is
handed to the kernel as-is with a vectored write.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import crc32c

from oncelog.config import LogConfig
from oncelog.errors import (
    CorruptRecordError,
    InvalidRecordError,
    LogClosedError,
    LogFailedError,
    NotASegmentError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from oncelog.recovery.fs import DEFAULT_FS, Buffer, FileSystem
from oncelog.recovery.loader import LoadReport, load_segments
from oncelog.results import AppendResult, FetchResult
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.index import TimestampOffset
from oncelog.segments.segment import BatchMeta, LogSegment

Origin = Literal["client", "replication"]
Clock = Callable[[], int]


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Log:
    def __init__(
        self,
        directory: str,
        config: LogConfig,
        fs: FileSystem,
        clock: Clock,
        segments: list[LogSegment],
        load_report: LoadReport,
    ):
        assert segments, "a log always has an active segment"
        self.directory = directory
        self.config = config
        self._fs = fs
        self._clock = clock
        self._segments = segments
        # What opening found: segments, rebuilt indexes, a cut torn tail.
        self.load_report = load_report
        self._base_offsets = [segment.base_offset for segment in segments]
        self._lock = threading.RLock()
        self._closed = False
        # Set by the first failed write or fsync; appends are refused until reopen.
        self._failure: BaseException | None = None

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        fs: FileSystem | None = None,
        clock: Clock | None = None,
    ) -> Log:
        """Open the partition directory at `path`, creating it if missing."""
        directory = os.fspath(path)
        config = config or LogConfig()
        fs = fs or DEFAULT_FS
        fs.mkdir(directory)
        segments, report = load_segments(fs, directory, config)
        return cls(directory, config, fs, clock or wall_clock_ms, segments, report)

    # -- properties --------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    # -- appends -----------------------------------------------------------------
    def append(self, batch_bytes: Buffer, *, origin: Origin = "client") -> AppendResult:
        """Validate one encoded batch, stamp its offsets and write it."""
        return self.append_batches([batch_bytes], origin=origin)[0]

    def append_records(
        self,
        records: Iterable[object],
        *,
        producer_id: int = fmt.NO_PRODUCER_ID,
        producer_epoch: int = fmt.NO_PRODUCER_EPOCH,
        base_sequence: int = fmt.NO_SEQUENCE,
        is_transactional: bool = False,
        timestamp_ms: int | None = None,
        compression: str | None = None,
    ) -> AppendResult:
        """Encode `records` as one batch and append it."""
        batch = encode_batch(
            records,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            is_transactional=is_transactional,
            timestamp_ms=self._clock() if timestamp_ms is None else timestamp_ms,
            compression=compression,
        )
        return self.append(batch)

    def append_batches(self, batches: Sequence[Buffer], *, origin: Origin = "client") -> list[AppendResult]:
        """Append many batches with as few write() calls as the segments allow.

        Every batch is validated first; if any is bad, nothing is written.
        """
        if origin not in ("client", "replication"):
            raise ValueError(f"origin is 'client' or 'replication', got {origin!r}")
        views = [self._validate(buffer, origin) for buffer in batches]
        with self._lock:
            self._check_writable()
            return self._append_validated(views, origin)

    def _validate(self, buffer: Buffer, origin: Origin) -> RecordBatch:
        if len(buffer) > self.config.max_batch_bytes:
            raise RecordTooLargeError(
                f"batch of {len(buffer)} bytes exceeds max_batch_bytes={self.config.max_batch_bytes}"
            )
        batch = RecordBatch(buffer)
        if batch.size != len(buffer):
            raise CorruptRecordError(
                f"buffer holds {len(buffer)} bytes but its batchLength says {batch.size}"
            )
        batch.validate()
        if origin == "replication":
            return batch
        if batch.records_count <= 0 or batch.last_offset_delta + 1 != batch.records_count:
            raise InvalidRecordError(
                f"recordsCount {batch.records_count} must equal lastOffsetDelta + 1 "
                f"({batch.last_offset_delta + 1})"
            )
        if batch.is_control:
            raise InvalidRecordError("clients may not append control batches")
        if batch.producer_id >= 0 and batch.base_sequence < 0:
            raise InvalidRecordError(f"producer {batch.producer_id} sent baseSequence {batch.base_sequence}")
        return batch

    def _append_validated(self, views: list[RecordBatch], origin: Origin) -> list[AppendResult]:
        now_ms = self._clock()
        append_time_ms = now_ms if self.config.timestamp_type == "LogAppendTime" else None
        # Plan first, with no I/O, so a request refused for its offsets writes nothing.
        plan: list[tuple[RecordBatch, int, int, int]] = []
        next_offset = self.log_end_offset
        for batch in views:
            if origin == "replication":
                # A follower keeps its leader's offsets; gaps (compaction) are legal.
                base = batch.base_offset
                if base < next_offset:
                    raise InvalidRecordError(
                        f"replicated batch at offset {base} is below the log end {next_offset}"
                    )
            else:
                base = next_offset
            last = base + batch.last_offset_delta
            plan.append(
                (batch, base, last, batch.max_timestamp if append_time_ms is None else append_time_ms)
            )
            next_offset = last + 1

        results: list[AppendResult] = []
        buffers: list[Buffer] = []
        metas: list[BatchMeta] = []
        # The active segment as it will be once the pending buffers are written.
        segment_bytes = self.active_segment.size
        first_timestamp_ms = self.active_segment.first_batch_timestamp_ms
        for batch, base, last, max_ts in plan:
            if self._should_roll(segment_bytes, first_timestamp_ms, batch.size, max_ts, last):
                self._write(buffers, metas)
                buffers, metas = [], []
                self._roll(base)
                segment_bytes, first_timestamp_ms = 0, None
            buffers.extend(self._stamped(batch, base, append_time_ms))
            metas.append(BatchMeta(last, max_ts, batch.size))
            segment_bytes += batch.size
            if first_timestamp_ms is None:
                first_timestamp_ms = max_ts
            results.append(AppendResult(base, last, -1 if append_time_ms is None else append_time_ms, False))
        self._write(buffers, metas)
        return results

    def _stamped(self, batch: RecordBatch, base_offset: int, append_time_ms: int | None) -> list[Buffer]:
        """The batch's bytes with its base offset set (and its timestamp on LogAppendTime)."""
        buf = batch.buffer
        if append_time_ms is None:
            prefix = fmt.INT64.pack(base_offset)
            if buf[: fmt.LENGTH_OFFSET] == prefix:
                return [buf]
            return [prefix, buf[fmt.LENGTH_OFFSET :]]
        # LogAppendTime changes CRC-covered fields, so this path copies the batch.
        out = bytearray(buf)
        fmt.INT64.pack_into(out, fmt.BASE_OFFSET_OFFSET, base_offset)
        attributes = batch.attributes | fmt.TIMESTAMP_TYPE_MASK
        out[fmt.ATTRIBUTES_OFFSET : fmt.ATTRIBUTES_OFFSET + 2] = attributes.to_bytes(2, "big", signed=True)
        fmt.INT64.pack_into(out, fmt.MAX_TIMESTAMP_OFFSET, append_time_ms)
        fmt.UINT32.pack_into(out, fmt.CRC_OFFSET, crc32c.crc32c(memoryview(out)[fmt.ATTRIBUTES_OFFSET :]))
        return [out]

    def _should_roll(
        self,
        segment_bytes: int,
        first_timestamp_ms: int | None,
        incoming_bytes: int,
        max_timestamp_ms: int,
        last_offset: int,
    ) -> bool:
        """Kafka's roll rules, for a segment of `segment_bytes` about to take one more batch."""
        if segment_bytes == 0:
            return False  # an empty segment takes any batch, however large
        if segment_bytes + incoming_bytes > self.config.segment_bytes:
            return True
        # segment_ms counts from the first batch's timestamp, so a restart does not reset it.
        if first_timestamp_ms is not None and max_timestamp_ms - first_timestamp_ms > self.config.segment_ms:
            return True
        active = self.active_segment
        # Index entries hold offsets relative to the base as i32.
        return active.indexes_full or last_offset - active.base_offset > fmt.INT32_MAX

    def _write(self, buffers: list[Buffer], metas: list[BatchMeta]) -> None:
        if not metas:
            return
        try:
            self.active_segment.append(buffers, metas)
        except OSError as exc:
            self._failure = exc
            raise LogFailedError(f"write to {self.active_segment.path} failed: {exc}") from exc

    # -- rolling and durability ----------------------------------------------------
    def roll(self) -> LogSegment:
        """Start a new active segment at the log end (no-op on an empty active segment)."""
        with self._lock:
            self._check_writable()
            if self.active_segment.size == 0:
                return self.active_segment
            return self._roll(self.log_end_offset)

    def _roll(self, base_offset: int) -> LogSegment:
        old = self.active_segment
        try:
            # fsync the sealed segment now: only the active one is scanned on open.
            old.flush()
            old.seal()
            segment = LogSegment.open(
                self._fs,
                self.directory,
                base_offset,
                index_interval_bytes=self.config.index_interval_bytes,
                max_index_bytes=self.config.segment_index_bytes,
                create=True,
            )
        except OSError as exc:
            self._failure = exc
            raise LogFailedError(f"rolling {old.path} failed: {exc}") from exc
        self._segments.append(segment)
        self._base_offsets.append(base_offset)
        return segment

    def flush(self) -> None:
        """Make every appended batch durable (survives power loss)."""
        with self._lock:
            self._check_open()
            if self._failure is not None:
                raise LogFailedError(f"{self.directory} failed earlier: {self._failure}")
            for segment in self._segments:
                if segment.unflushed:
                    try:
                        segment.flush()
                    except OSError as exc:
                        # Fail closed: a retried fsync may "succeed" after the kernel
                        # dropped the dirty pages (fsyncgate).
                        self._failure = exc
                        raise LogFailedError(f"fsync of {segment.path} failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                if self._failure is None:
                    self.flush()
            finally:
                self._closed = True
                for segment in self._segments:
                    segment.close()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self.directory} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._failure is not None:
            raise LogFailedError(f"{self.directory} refuses appends until reopened: {self._failure}")

    # -- reads ---------------------------------------------------------------------
    def read(
        self, start_offset: int, max_bytes: int = 1_048_576, *, max_offset: int | None = None
    ) -> FetchResult:
        """Whole batches from the one holding `start_offset`, about `max_bytes` of them."""
        with self._lock:
            self._check_open()
            start, end = self.log_start_offset, self.log_end_offset
            if not start <= start_offset <= end:
                raise OffsetOutOfRangeError(
                    f"offset {start_offset} is outside [{start}, {end}] of {self.directory}"
                )
            batches: list[RecordBatch] = []
            first = bisect.bisect_right(self._base_offsets, start_offset) - 1
            for segment in self._segments[max(first, 0) :]:
                batches = segment.read(start_offset, max_bytes, max_offset)
                if batches or (max_offset is not None and segment.next_offset >= max_offset):
                    break
        next_offset = batches[-1].last_offset + 1 if batches else start_offset
        return FetchResult(batches, start_offset, next_offset, end)

    def offset_for_timestamp(self, timestamp_ms: int) -> TimestampOffset | None:
        """The first record whose timestamp is at or after `timestamp_ms`, if any."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                found = segment.find_offset_for_timestamp(timestamp_ms)
                if found is not None:
                    return found
        return None

    def __repr__(self) -> str:
        return f"Log({self.directory}, start={self.log_start_offset}, end={self.log_end_offset})"


__all__ = ["AppendResult", "FetchResult", "Log", "NotASegmentError"]
