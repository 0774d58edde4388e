"""The read path: whole batches from a list of segments, CRC-checked before serving.

Batches below the recovery point are not rescanned when a log opens, so a bit flip
there (a lying disk, a stray write) is first met here. Every batch served is
CRC-checked; a failure raises CorruptLogError naming the file and position rather
than handing the bytes to a consumer. CRC-32C runs at about 11 GB/s, so this
costs little next to the read itself.
"""

from __future__ import annotations

import bisect

from oncelog.errors import CorruptLogError, CorruptRecordError, OffsetOutOfRangeError
from oncelog.results import FetchResult
from oncelog.segments.batch import RecordBatch
from oncelog.segments.segment import LogSegment, ScannedBatch, check_client_appended


def read_log(
    segments: list[LogSegment],
    base_offsets: list[int],
    start_offset: int,
    max_bytes: int,
    max_offset: int | None,
    directory: str,
    *,
    client_only: bool = False,
    log_start_offset: int | None = None,
) -> FetchResult:
    start = segments[0].base_offset if log_start_offset is None else log_start_offset
    end = segments[-1].next_offset
    if not start <= start_offset <= end:
        raise OffsetOutOfRangeError(f"offset {start_offset} is outside [{start}, {end}] of {directory}")
    scanned: list[ScannedBatch] = []
    first = max(bisect.bisect_right(base_offsets, start_offset) - 1, 0)
    for segment in segments[first:]:
        try:
            scanned = segment.read(start_offset, max_bytes, max_offset, contiguous=client_only)
        except CorruptRecordError as exc:
            # A header that cannot be walked inside the log (below its end): corruption.
            raise CorruptLogError(
                exc.reason, path=exc.path or segment.path, position=exc.position or 0
            ) from exc
        if scanned or (max_offset is not None and segment.next_offset >= max_offset):
            break
        if (
            client_only
            and start_offset < segment.next_offset
            and (max_offset is None or start_offset < max_offset)
        ):
            # Client appends take every offset: the segment's range holds the offset, so
            # its file must too. An emptied or replaced file is lost data, never a gap.
            raise CorruptLogError(
                f"offset {start_offset} is in this segment's range ({segment.base_offset}.."
                f"{segment.next_offset - 1}) but no batch in its file holds it: the file lost data",
                path=segment.path,
                position=segment.size,
            )
    expected = start_offset
    for n, (position, batch) in enumerate(scanned):
        try:
            batch.validate()
        except CorruptRecordError as exc:
            raise CorruptLogError(
                f"batch at offset {batch.base_offset} fails its check: {exc}",
                path=segment.path,
                position=position,
            ) from exc
        # baseOffset is outside the CRC: check it against where the batch sits.
        misplaced = batch.base_offset < segment.base_offset or batch.last_offset >= segment.next_offset
        if client_only:
            first_holds_start = n == 0 and batch.base_offset <= start_offset <= batch.last_offset
            misplaced = misplaced or not (first_holds_start or (n > 0 and batch.base_offset == expected))
            try:
                check_client_appended(batch, None)
            except CorruptRecordError as exc:
                raise CorruptLogError(str(exc), path=segment.path, position=position) from exc
        if misplaced:
            raise CorruptLogError(
                f"batch claims offsets {batch.base_offset}..{batch.last_offset}, which do not belong at "
                f"this position (segment {segment.base_offset}..{segment.next_offset - 1})",
                path=segment.path,
                position=position,
            )
        expected = batch.last_offset + 1
    batches: list[RecordBatch] = [batch for _, batch in scanned]
    next_offset = batches[-1].last_offset + 1 if batches else start_offset
    return FetchResult(batches, start_offset, next_offset, end)
