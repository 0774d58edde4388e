"""What opening a root did: a progress bar while partitions recover, and the summary after.

The bar (rich, on stderr) counts partitions done and bytes scanned; it is shown only
on a terminal unless asked for, so logs and pipes stay clean.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

from oncelog.layout import TopicPartition
from oncelog.progress import partition_bar
from oncelog.recovery.loader import RecoveryReport

if TYPE_CHECKING:
    from rich.progress import Progress


@dataclass(frozen=True)
class RecoverySummary:
    """Totals over every partition a LogManager opened, and each partition's report."""

    partitions: int
    clean: int
    unclean: int
    segments_scanned: int
    bytes_scanned: int
    batches_replayed: int
    truncated_bytes: int
    indexes_rebuilt: int
    duration_s: float  # wall time of the whole (parallel) open
    threads: int
    # Partitions with segments but no metadata: each validated in full (RecoveryReport).
    metadata_missing: int = 0
    reports: Mapping[TopicPartition, RecoveryReport] = field(default_factory=dict, repr=False)

    @classmethod
    def empty(cls, threads: int) -> RecoverySummary:
        return cls.of({}, 0.0, threads)

    @classmethod
    def of(
        cls, reports: Mapping[TopicPartition, RecoveryReport], duration_s: float, threads: int
    ) -> RecoverySummary:
        values = list(reports.values())
        clean = sum(1 for report in values if report.clean)
        return cls(
            partitions=len(values),
            clean=clean,
            unclean=len(values) - clean,
            segments_scanned=sum(report.segments_scanned for report in values),
            bytes_scanned=sum(report.bytes_scanned for report in values),
            batches_replayed=sum(report.batches_replayed for report in values),
            truncated_bytes=sum(report.truncated_bytes for report in values),
            indexes_rebuilt=sum(report.indexes_rebuilt for report in values),
            duration_s=duration_s,
            threads=threads,
            metadata_missing=sum(1 for report in values if report.metadata_missing),
            reports=dict(reports),
        )

    @property
    def damaged(self) -> dict[TopicPartition, RecoveryReport]:
        """Partitions whose recovery cut their log (a torn or corrupt tail, or missing bytes)."""
        return {tp: r for tp, r in self.reports.items() if r.truncated_bytes or r.tail_error is not None}

    def __str__(self) -> str:
        lines = [
            f"recovered {self.partitions} partitions in {self.duration_s:.2f} s with {self.threads} threads:"
            f" {self.clean} clean, {self.unclean} unclean",
            f"scanned {self.segments_scanned} segments, {self.bytes_scanned} bytes;"
            f" replayed {self.batches_replayed} batches; rebuilt {self.indexes_rebuilt} indexes;"
            f" cut {self.truncated_bytes} bytes",
        ]
        if self.metadata_missing:
            lines.append(
                f"{self.metadata_missing} partitions had segments but no metadata store (a Kafka directory, "
                "or a lost meta.lmdb): every segment validated; a recovery point or log start it held is gone"
            )
        for tp, report in sorted(self.reports.items()):
            if report.metadata_missing:
                lines.append(f"  {tp}: no metadata store")
        for tp, report in sorted(self.damaged.items()):
            lines.append(f"  {tp}: cut {report.truncated_bytes} bytes ({report.tail_error})")
        return "\n".join(lines)


class RecoveryProgress:
    """A thread-safe progress bar over partitions; a no-op when not shown."""

    def __init__(self, partitions: int, *, show: bool | None = None):
        if show is None:
            show = sys.stderr.isatty()
        self._lock = threading.Lock()
        self._bytes_scanned = 0
        self._progress: Progress | None = None
        if show and partitions:
            self._progress = partition_bar("recovering", "scanned", stream=sys.stderr, transient=False)
            self._task = self._progress.add_task("recovery", total=partitions, mib=0.0)

    def advance(self, report: RecoveryReport) -> None:
        if self._progress is None:
            return
        with self._lock:
            self._bytes_scanned += report.bytes_scanned
            self._progress.update(self._task, advance=1, mib=self._bytes_scanned / 2**20)

    def __enter__(self) -> RecoveryProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
