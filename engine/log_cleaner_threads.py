"""The background cleaner of a LogManager: Kafka's log cleaner threads, with an I/O cap.

Each thread takes the filthiest compacted log no other thread is cleaning (the highest
dirty ratio among those `Log.clean(if_due=True)` would pick), runs one pass on it, and
sleeps `backoff_ms` when none is due (Kafka's log.cleaner.backoff.ms). Every byte a pass
reads or writes goes through one throttle shared by the threads (Kafka's
log.cleaner.io.max.bytes.per.second): the pass sleeps between segments, outside the log's
lock, so appends never wait for the cap.

`status()` reports the totals since start (oncelog.segment_cleaning.CleanStats), the passes
run, what each thread is cleaning now, the last error and the logs set aside: a pass that
fails (a full disk: CleanerError; corruption; a bug) is logged and its log is not picked
again for UNCLEANABLE_RETRY_BACKOFFS backoffs, so one bad log cannot starve the others.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping

from oncelog.errors import OncelogError
from oncelog.layout import TopicPartition
from oncelog.log import Log
from oncelog.log_cleaner import DEFAULT_KEY_MAP_BYTES
from oncelog.segment_cleaning import CleanStats

log = logging.getLogger(__name__)

DEFAULT_BACKOFF_MS = 15_000  # Kafka's log.cleaner.backoff.ms
UNCLEANABLE_RETRY_BACKOFFS = 20  # a log whose pass failed waits this many backoffs


class _Stopped(Exception):
    """Raised from the throttle to end a pass between segments when the cleaner stops."""


@dataclasses.dataclass(frozen=True)
class CleanerStatus:
    passes: int  # passes that cleaned something
    totals: CleanStats
    cleaning: tuple[TopicPartition, ...]  # what the threads are on now
    last_error: str | None
    uncleanable: tuple[TopicPartition, ...]  # set aside after a failed pass


class Throttle:
    """Keeps the bytes passed to `__call__` under `bytes_per_s` since start, by sleeping."""

    def __init__(self, bytes_per_s: float | None, stopping: threading.Event):
        assert bytes_per_s is None or bytes_per_s > 0, bytes_per_s
        self.bytes_per_s = bytes_per_s
        self._stopping = stopping
        self._lock = threading.Lock()
        self._start_s = time.monotonic()
        self._bytes = 0

    def __call__(self, done_bytes: int) -> None:
        if self._stopping.is_set():
            raise _Stopped
        if self.bytes_per_s is None:
            return
        with self._lock:
            self._bytes += done_bytes
            due_s = self._start_s + self._bytes / self.bytes_per_s
        if self._stopping.wait(max(due_s - time.monotonic(), 0.0)):
            raise _Stopped


class BackgroundCleaner:
    def __init__(
        self,
        logs: Callable[[], Mapping[TopicPartition, Log]],
        *,
        threads: int = 1,
        io_bytes_per_s: float | None = None,
        backoff_ms: int = DEFAULT_BACKOFF_MS,
        key_map_bytes: int = DEFAULT_KEY_MAP_BYTES,
    ):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if io_bytes_per_s is not None and io_bytes_per_s <= 0:
            raise ValueError(f"io_bytes_per_s must be positive or None, got {io_bytes_per_s}")
        if backoff_ms <= 0:
            raise ValueError(f"backoff_ms must be positive, got {backoff_ms}")
        self._logs = logs
        self._backoff_s = backoff_ms / 1000
        self._key_map_bytes = key_map_bytes
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._throttle = Throttle(io_bytes_per_s, self._stopping)
        self._lock = threading.Lock()
        self._cleaning: dict[int, TopicPartition] = {}
        self._totals = CleanStats()
        self._passes = 0
        self._last_error: str | None = None
        self._uncleanable: dict[TopicPartition, float] = {}  # set aside until this monotonic time
        self._threads = [
            threading.Thread(target=self._run, args=(n,), name=f"oncelog-cleaner-{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def status(self) -> CleanerStatus:
        with self._lock:
            totals = dataclasses.replace(self._totals)
            now_s = time.monotonic()
            aside = tuple(tp for tp, until in self._uncleanable.items() if until > now_s)
            return CleanerStatus(
                self._passes, totals, tuple(self._cleaning.values()), self._last_error, aside
            )

    def wake(self) -> None:
        """Look for a due log now instead of after the backoff (tests, an operator)."""
        self._wake.set()

    def stop(self) -> None:
        """End every pass at its next segment and join the threads."""
        self._stopping.set()
        self._wake.set()
        for thread in self._threads:
            thread.join()

    def _run(self, n: int) -> None:
        while not self._stopping.is_set():
            picked = self._pick(n)
            if picked is None:
                self._wake.wait(self._backoff_s)
                self._wake.clear()
                continue
            tp, target = picked
            try:
                result = target.clean(if_due=True, key_map_bytes=self._key_map_bytes, throttle=self._throttle)
            except _Stopped:
                return
            except Exception as exc:
                self._set_aside(tp, exc)
                continue
            finally:
                with self._lock:
                    self._cleaning.pop(n, None)
            if not result.stats.segments_rewritten:
                self._wake.wait(self._backoff_s)  # nothing to rewrite: no pass again at once
                self._wake.clear()
            if result.cleaned:
                s = result.stats
                log.info(
                    "cleaned %s to offset %d: %d of %d bytes kept, %d records removed",
                    tp, result.cleaned_to, s.bytes_written, s.bytes_read, s.records_removed,
                )  # fmt: skip
                with self._lock:
                    self._passes += 1
                    self._totals.add(s)

    def _set_aside(self, tp: TopicPartition, exc: Exception) -> None:
        """A failed log is not picked again for UNCLEANABLE_RETRY_BACKOFFS backoffs (Kafka's
        uncleanable partitions, KIP-346): one that always fails must not starve the others."""
        level = logging.WARNING if isinstance(exc, OncelogError | OSError) else logging.ERROR
        log.log(level, "cleaning %s failed: %s; set aside", tp, exc, exc_info=level == logging.ERROR)
        with self._lock:
            self._last_error = f"{tp}: {exc}"
            self._uncleanable[tp] = time.monotonic() + UNCLEANABLE_RETRY_BACKOFFS * self._backoff_s

    def _pick(self, n: int) -> tuple[TopicPartition, Log] | None:
        """The filthiest compacted log that is due and that no other thread holds."""
        try:
            logs = self._logs()
        except ValueError:  # the manager closed
            self._stopping.set()
            return None
        best: tuple[float, TopicPartition, Log] | None = None
        now_s = time.monotonic()
        for tp, candidate in logs.items():
            with self._lock:
                if tp in self._cleaning.values() or self._uncleanable.get(tp, now_s) > now_s:
                    continue
            if not candidate.config.compacted:
                continue
            try:
                due, ratio = candidate.cleaning_due()
            except OncelogError:
                continue  # closed or failed meanwhile: its owner reports it
            if due and (best is None or ratio > best[0]):
                best = (ratio, tp, candidate)
        if best is None:
            return None
        with self._lock:
            if best[1] in self._cleaning.values():
                return None
            self._cleaning[n] = best[1]
        return best[1], best[2]
