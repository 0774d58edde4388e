"""What one cleaning pass keeps of each batch: Kafka's cleaner rules, batch by batch.

The pass (oncelog.log_cleaner) walks every cleanable segment from the log start in
offset order with one `CleaningPass`; this module decides, with no I/O:

- a data batch of an aborted transaction loses every record;
- a record goes when a newer record of its key is in the key map, when it has no key
  (it could never be compacted; Kafka's cleaner drops it too), or when it is a tombstone
  whose batch's delete horizon has passed;
- a kept tombstone's batch gets a delete horizon (now + delete_retention_ms) the first time
  a pass sees it (KIP-534), so the tombstone lives that long after the cleaning;
- a transaction marker (a control batch, never deduplicated by key) goes only once its
  transaction has no data left and its own horizon has passed; it gets a horizon as a
  tombstone's batch does;
- a batch left with no record is dropped, but kept empty when it is one of a producer's
  last batches (its last offset is in the producer's window: sequence, epoch and the
  5-batch dedupe window survive, KAFKA-5490 / KAFKA-8335), or the last batch of its
  segment (the segment still ends where the next begins, so the log end never moves back
  and recovery finds the offsets it expects, KAFKA-17076).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from oncelog.key_map import NOT_FOUND, KeyMap, key_digests
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch
from oncelog.segments.compaction import (
    RecordSpan,
    delete_horizon_ms,
    rebuild_batch,
    record_spans,
    records_body,
)
from oncelog.segments.txn_index import AbortedTxn


@dataclasses.dataclass
class CleanStats:
    """Totals of a pass (and, summed, of a cleaner's life)."""

    segments_scanned: int = 0
    segments_rewritten: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    batches_removed: int = 0
    batches_emptied: int = 0  # kept with no records: a producer's last batch, a segment's last
    records_removed: int = 0
    tombstones_removed: int = 0
    keyless_removed: int = 0
    aborted_records_removed: int = 0
    markers_removed: int = 0

    def add(self, other: CleanStats) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


class AbortedRanges:
    """Each producer's aborted transactions, as (first offset, marker offset) ranges."""

    def __init__(self, aborted: Iterable[AbortedTxn]):
        ranges: dict[int, list[tuple[int, int]]] = {}
        for txn in aborted:
            ranges.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
        self._firsts = {pid: [first for first, _ in sorted(r)] for pid, r in ranges.items()}
        self._lasts = {pid: [last for _, last in sorted(r)] for pid, r in ranges.items()}

    def holds(self, producer_id: int, offset: int) -> bool:
        """Whether `offset` of the producer's is in one of its aborted transactions."""
        firsts = self._firsts.get(producer_id)
        if firsts is None:
            return False
        n = bisect.bisect_right(firsts, offset) - 1
        return n >= 0 and offset <= self._lasts[producer_id][n]


@dataclasses.dataclass
class CleaningPass:
    """What one pass knows while it walks the segments in offset order."""

    key_map: KeyMap
    aborted: AbortedRanges
    protected_offsets: frozenset[int]  # last offsets of the batches in producers' windows
    now_ms: int
    delete_retention_ms: int
    # Each live producer's epoch and newest data batch's last offset (-1: none): a marker of
    # that epoch past it is the producer's newest batch, and holds its epoch (a marker that
    # raised the epoch cleared the window) and coordinator epoch for a replay.
    producer_tails: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    stats: CleanStats = dataclasses.field(default_factory=CleanStats)
    # The earliest delete horizon of the batches kept (INT64_MAX: none).
    earliest_horizon_ms: int = fmt.INT64_MAX
    # Markers removed from the segment cleaned last: its transaction index drops their entries.
    removed_markers: set[int] = dataclasses.field(default_factory=set)
    # Producers whose current transaction has kept data so far (its marker must stay).
    txn_has_data: dict[int, bool] = dataclasses.field(default_factory=dict)

    def clean_segment(self, batches: Sequence[RecordBatch]) -> list[bytes] | None:
        """The segment's batches after cleaning, or None when nothing in it changes."""
        self.stats.segments_scanned += 1
        self.removed_markers = set()
        data = [self._spans_of(b) for b in batches]
        keys = [span.key for spans in data for span in spans if span.key is not None]
        newest = iter(self.key_map.newest(key_digests(keys)).tolist() if keys else ())
        out: list[bytes] = []
        changed = False
        for n, batch in enumerate(batches):
            self.stats.bytes_read += batch.size
            is_last = n == len(batches) - 1
            kept = self._clean_batch(batch, data[n], newest, is_last)
            if kept is None:
                out.append(bytes(batch.buffer))
                continue
            changed = True
            if kept:
                out.append(kept)
        if not changed:
            return None
        self.stats.segments_rewritten += 1
        self.stats.bytes_written += sum(len(b) for b in out)
        return out

    def _spans_of(self, batch: RecordBatch) -> list[RecordSpan]:
        """The records the key map is asked about: a data batch's, unless aborted."""
        if batch.is_control or self._aborted(batch):
            return []
        return list(record_spans(records_body(batch), batch.records_count))

    def _aborted(self, batch: RecordBatch) -> bool:
        return batch.is_transactional and self.aborted.holds(batch.producer_id, batch.base_offset)

    def _horizon_passed(self, batch: RecordBatch) -> bool:
        horizon = delete_horizon_ms(batch)
        return horizon is not None and self.now_ms >= horizon

    def _new_horizon(self, batch: RecordBatch, *, removable: bool = True) -> int | None:
        """The horizon a kept batch with tombstones or a marker gets now; None when it has one.

        `removable`: the batch's passing horizon alone would let a later pass remove something
        (its tombstones, or a marker with no data left); only such horizons make the log due
        again (`earliest_horizon_ms`), or a marker kept for its data would make it due forever.
        """
        horizon = delete_horizon_ms(batch)
        new = None if horizon is not None else min(self.now_ms + self.delete_retention_ms, fmt.INT64_MAX)
        effective = new if new is not None else horizon
        if removable and effective is not None:
            self.earliest_horizon_ms = min(self.earliest_horizon_ms, effective)
        return new

    def _clean_batch(
        self, batch: RecordBatch, spans: list[RecordSpan], newest: Iterable[int], is_last: bool
    ) -> bytes | None:
        """The batch's new bytes (b"" when it goes), or None when it stays as it is."""
        if batch.is_control:
            return self._clean_marker(batch, is_last)
        cleaned = self._clean_data_batch(batch, spans, newest, is_last)
        if batch.is_transactional and cleaned != b"":
            # Kept, even empty: its marker must stay too, or a replay of the log would
            # take the transaction for one still open.
            self.txn_has_data[batch.producer_id] = True
        return cleaned

    def _clean_data_batch(
        self, batch: RecordBatch, spans: list[RecordSpan], newest: Iterable[int], is_last: bool
    ) -> bytes | None:
        keep_empty = is_last or batch.last_offset in self.protected_offsets
        if batch.records_count == 0:  # emptied by an earlier pass: it stays only while it must
            return None if keep_empty else self._emptied(batch, keep_empty)
        if self._aborted(batch):
            self.stats.records_removed += batch.records_count
            self.stats.aborted_records_removed += batch.records_count
            return self._emptied(batch, keep_empty)
        kept = self._kept_records(batch, spans, iter(newest))
        horizon = self._new_horizon(batch) if any(span.value_is_null for span in kept) else None
        if len(kept) == len(spans) and horizon is None:
            return None
        self.stats.records_removed += len(spans) - len(kept)
        if not kept:
            return self._emptied(batch, keep_empty)
        return rebuild_batch(batch, records_body(batch), kept, horizon_ms=horizon)

    def _kept_records(
        self, batch: RecordBatch, spans: list[RecordSpan], newest: Iterable[int]
    ) -> list[RecordSpan]:
        kept: list[RecordSpan] = []
        horizon_passed = self._horizon_passed(batch)
        newest_of = iter(newest)
        for span in spans:
            if span.key is None:
                self.stats.keyless_removed += 1
                continue
            offset = batch.base_offset + span.offset_delta
            latest = next(newest_of)
            if latest != NOT_FOUND and latest > offset:
                continue
            if span.value_is_null and horizon_passed:
                self.stats.tombstones_removed += 1
                continue
            kept.append(span)
        return kept

    def _emptied(self, batch: RecordBatch, keep_empty: bool) -> bytes:
        if keep_empty:
            self.stats.batches_emptied += 1
            return rebuild_batch(batch, b"", [])
        self.stats.batches_removed += 1
        return b""

    def _clean_marker(self, batch: RecordBatch, is_last: bool) -> bytes | None:
        had_data = self.txn_has_data.pop(batch.producer_id, False)
        tail = self.producer_tails.get(batch.producer_id)
        newest = tail is not None and batch.producer_epoch == tail[0] and batch.last_offset > tail[1]
        keep = is_last or had_data or newest or batch.last_offset in self.protected_offsets
        if not keep and self._horizon_passed(batch):
            self.removed_markers.add(batch.last_offset)
            self.stats.markers_removed += 1
            self.stats.batches_removed += 1
            return b""
        horizon = self._new_horizon(batch, removable=not keep)
        if horizon is None:
            return None
        body = records_body(batch)
        return rebuild_batch(batch, body, list(record_spans(body, batch.records_count)), horizon_ms=horizon)


def digests_and_offsets(
    batches: Iterable[RecordBatch], aborted: AbortedRanges, first_offset: int
) -> tuple[np.ndarray, np.ndarray]:
    """The key digests and offsets of the keyed records at or past `first_offset` in the
    batches, skipping markers and aborted transactions: what the key map takes of a segment."""
    keys: list[bytes] = []
    offsets: list[int] = []
    for batch in batches:
        if batch.is_control or batch.last_offset < first_offset:
            continue
        if batch.is_transactional and aborted.holds(batch.producer_id, batch.base_offset):
            continue
        for span in record_spans(records_body(batch), batch.records_count):
            offset = batch.base_offset + span.offset_delta
            if span.key is not None and offset >= first_offset:
                keys.append(span.key)
                offsets.append(offset)
    return key_digests(keys), np.array(offsets, dtype=np.int64)
