"""Recovery's compiled tail scan, on the loader's side: rows in, producer state out.

The compiled loop (oncelog._append.scan_tail, reached through `LogSegment.rebuild`)
checks and indexes the common batch (no marker, not transactional) and writes one row
per batch: producer id, epoch, first and last sequence, first and last offset, max
timestamp, end position. `CompiledTailScan` keeps those rows for a segment and
replays them in one pass when the segment ends or before any batch the reference loop
takes (a marker reads its producer's state, so what came before it must be in).

A row replays as `ReplayBuffer.replay_batch` would replay its batch; for a run of
plain batches only each producer's last WINDOW of them can change its state (see
`ReplayBuffer.replay_plain_rows`), which is where the time goes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from oncelog.producer_replay import ROW_FIRST_OFFSET as FIRST_OFFSET
from oncelog.producer_replay import ROW_LAST_OFFSET as LAST_OFFSET
from oncelog.producer_replay import ROW_PID as PID
from oncelog.segments.format import Buffer
from oncelog.segments.segment import TailScan

# The replay's columns (oncelog.producer_replay ROW_*), then the batch's end position: the
# compiled scan's TAIL_* layout (a test compares them).
END_POSITION = 7
ROW_COLUMNS = 8
# Rows the scan writes before it hands them over; kept rows are replayed by this many.
ROWS_PER_SCAN = 16_384
KEPT_ROWS_LIMIT = 1 << 20

ScanTail = Callable[..., tuple[int, int, int]]
ReplayRows = Callable[[np.ndarray], None]


class CompiledTailScan(TailScan):
    """One segment's compiled scan: keeps its rows, and replays them through `replay`
    (the rows of batches at or past the replay's start, with a producer)."""

    def __init__(self, scan_tail: ScanTail, replay: ReplayRows, replay_from: int):
        self._scan_tail = scan_tail
        self._replay = replay
        self._replay_from = replay_from
        self._rows = np.empty((ROWS_PER_SCAN, ROW_COLUMNS), dtype=np.int64)
        self._kept: list[np.ndarray] = []
        self._kept_rows = 0
        self.end_positions: dict[int, int] = {}  # asked-for end position -> offset after its batch
        self.replayed = 0  # rows replayed so far (the recovery report counts them)
        self._watched: int | None = None

    def watch_end_position(self, position: int) -> None:
        """Note the offset after the batch that ends exactly at `position` (the recovery point's)."""
        self._watched = position

    def scan(
        self,
        chunk: Buffer,
        file_position: int,
        segment: object,
        offset_index: object,
        time_index: object,
        *,
        client_only: bool,
        first_base_offset: int,
    ) -> tuple[int, int, int]:
        return self._scan_tail(
            chunk,
            file_position,
            segment,
            offset_index,
            time_index,
            self._rows,
            client_only,
            first_base_offset,
        )

    def on_rows(self, count: int) -> None:
        rows = self._rows[:count]
        if self._watched is not None:
            hit = np.flatnonzero(rows[:, END_POSITION] == self._watched)
            if len(hit):
                self.end_positions[self._watched] = int(rows[hit[0], LAST_OFFSET]) + 1
        kept = rows[(rows[:, PID] >= 0) & (rows[:, FIRST_OFFSET] >= self._replay_from)]
        if len(kept):
            self._kept.append(kept)  # a mask's result is a copy: the rows buffer is reused
            self._kept_rows += len(kept)
        if self._kept_rows >= KEPT_ROWS_LIMIT:
            self.replay_kept()

    def replay_kept(self) -> None:
        """Replay the rows kept so far, in their order (counted in `replayed`)."""
        if not self._kept:
            return
        rows = np.concatenate(self._kept) if len(self._kept) > 1 else self._kept[0]
        self._kept, self._kept_rows = [], 0
        self._replay(rows)
        self.replayed += len(rows)
