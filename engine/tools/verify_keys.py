"""`oncelog verify` of a compacted log: below its cleaned point, at most one live record per key.

A cleaning pass (oncelog.log_cleaner) keeps, of every key, only the newest record up to
where it ends, and stores that end (the cleaner checkpoint; Kafka's
`cleaner-offset-checkpoint`). Below it, then, a key has at most one record, a tombstone
included, counting only the records a reader can see: those of data batches at or past the
log start that are not in an aborted transaction (the transaction indexes say which; a
cleaning removes them, but until the next pass they may remain). Transaction markers are
never deduplicated by key and are not counted. Past the checkpoint the log is dirty and a
key may appear again.

Keys are compared by their MD5 digest, as the cleaner's key map compares them (24 bytes a
key: the digest and the newest offset). The digests of each chunk of records are checked
at once against sorted runs of the ones before (numpy), and runs are merged as they grow,
so a check costs O(n log n) for n records and no Python object is kept per key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from oncelog.errors import CorruptRecordError
from oncelog.key_map import NOT_FOUND, key_digests
from oncelog.segment_cleaning import AbortedRanges
from oncelog.segments.batch import RecordBatch
from oncelog.segments.compaction import record_spans, records_body

CHUNK_RECORDS = 1 << 16  # records collected before their digests are checked
SHOWN_KEY_BYTES = 64

# (path, position, batch base offset, reason) of one violation.
Report = Callable[[str, int, int, str], None]


class _Where(NamedTuple):
    path: str
    position: int
    batch_offset: int
    key: bytes


class _Run(NamedTuple):
    digests: npt.NDArray[np.bytes_]  # sorted, each once
    offsets: npt.NDArray[np.int64]  # the newest offset of each digest


class LiveKeyCheck:
    """Reports every record of a key below `cleaned_to` (from `log_start`) after the first."""

    def __init__(
        self,
        cleaned_to: int,
        log_start: int,
        aborted: AbortedRanges,
        report: Report,
        *,
        chunk_records: int = CHUNK_RECORDS,
    ):
        self.cleaned_to = cleaned_to
        self.log_start = log_start
        self._chunk_records = chunk_records
        self._aborted = aborted
        self._report = report
        self._runs: list[_Run] = []  # older records first
        self._where: list[_Where] = []
        self._offsets: list[int] = []

    def add(self, batch: RecordBatch, path: str, position: int) -> None:
        """Take the live keyed records of a batch that passed verify's checks."""
        if batch.is_control or batch.base_offset >= self.cleaned_to or batch.last_offset < self.log_start:
            return
        if batch.is_transactional and self._aborted.holds(batch.producer_id, batch.base_offset):
            return
        try:
            spans = list(record_spans(records_body(batch), batch.records_count))
        except CorruptRecordError:
            return  # verify's own record check reports a batch whose records do not decode
        for span in spans:
            offset = batch.base_offset + span.offset_delta
            if span.key is not None and self.log_start <= offset < self.cleaned_to:
                self._where.append(_Where(path, position, batch.base_offset, span.key))
                self._offsets.append(offset)
        if len(self._offsets) >= self._chunk_records:
            self.flush()

    def flush(self) -> None:
        """Check the records taken since the last flush, reporting each repeat in offset order."""
        if not self._offsets:
            return
        digests = key_digests(where.key for where in self._where)
        offsets = np.array(self._offsets, dtype=np.int64)
        order = np.argsort(digests, kind="stable")  # equal digests stay in offset order
        sorted_digests, sorted_offsets = digests[order], offsets[order]
        repeat = np.zeros(len(order), dtype=bool)
        repeat[1:] = sorted_digests[1:] == sorted_digests[:-1]
        older = np.full(len(order), NOT_FOUND, dtype=np.int64)
        older[1:][repeat[1:]] = sorted_offsets[:-1][repeat[1:]]  # the one before it in this chunk
        older[~repeat] = self._newest_before(sorted_digests[~repeat])  # else in an earlier chunk
        older_by_offset = np.empty_like(older)
        older_by_offset[order] = older  # back in the order the records were taken
        for n in np.flatnonzero(older_by_offset != NOT_FOUND).tolist():
            self._violation(self._where[n], self._offsets[n], int(older_by_offset[n]))
        newest = np.ones(len(order), dtype=bool)
        newest[:-1] = ~repeat[1:]
        self._runs.append(_Run(sorted_digests[newest], sorted_offsets[newest]))
        self._merge_runs()
        self._where, self._offsets = [], []

    def _violation(self, where: _Where, offset: int, older: int) -> None:
        key = where.key[:SHOWN_KEY_BYTES]
        shown = f"{key!r}{'...' if len(where.key) > SHOWN_KEY_BYTES else ''}"
        self._report(
            where.path,
            where.position,
            where.batch_offset,
            f"key {shown} has two live records below the cleaned point {self.cleaned_to}, at offsets "
            f"{older} and {offset}: a cleaning keeps only a key's newest record there",
        )

    def _newest_before(self, digests: npt.NDArray[np.bytes_]) -> npt.NDArray[np.int64]:
        """Each digest's newest offset in the runs, or NOT_FOUND."""
        found = np.full(len(digests), NOT_FOUND, dtype=np.int64)
        for run in reversed(self._runs):  # newest first: the first hit is the newest offset
            at = np.searchsorted(run.digests, digests)
            inside = at < len(run.digests)
            hit = np.zeros(len(digests), dtype=bool)
            hit[inside] = run.digests[at[inside]] == digests[inside]
            hit &= found == NOT_FOUND
            found[hit] = run.offsets[at[hit]]
        return found

    def _merge_runs(self) -> None:
        """Merge the newest runs while the older is at most twice the newer (a binary counter):
        O(log n) runs, each record merged O(log n) times."""
        while len(self._runs) >= 2 and len(self._runs[-2].digests) <= 2 * len(self._runs[-1].digests):
            newer, older = self._runs.pop(), self._runs.pop()
            digests = np.concatenate((older.digests, newer.digests))
            offsets = np.concatenate((older.offsets, newer.offsets))
            order = np.argsort(digests, kind="stable")  # the newer run's offset of a digest comes last
            digests, offsets = digests[order], offsets[order]
            newest = np.ones(len(digests), dtype=bool)
            newest[:-1] = digests[1:] != digests[:-1]
            self._runs.append(_Run(digests[newest], offsets[newest]))
