"""`oncelog torture --self-test`: prove the harness notices bugs by planting them.

Each planted bug is a context manager that patches one engine function for the
duration of a bounded torture run and always restores it. They live only here:
no production code path can turn one on. A bug counts as caught when the run
reports a violation that the same crash state without it does not (a real bug the
harness reports anyway is not the planted one being caught).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from oncelog import append_rules, compiled_append, log_cleaner, log_lifecycle, producer_replay
from oncelog.errors import LogFailedError
from oncelog.log import Log
from oncelog.log_cleaner import LogCleaning
from oncelog.producer_state import BatchMetadata, ProducerStateManager, WorkingState
from oncelog.recovery.loader import LogLoader
from oncelog.segment_cleaning import CleaningPass
from oncelog.segments import index as index_module
from oncelog.segments.batch import RecordBatch
from oncelog.segments.segment import LogSegment
from oncelog.storage import snapshot as snapshots
from oncelog.storage.checkpoint import LOG_START_KEY, write_offsets
from oncelog.storage.fs import FileSystem
from oncelog.torture.harness import run_crash_state, run_torture
from oncelog.torture.model import CLEANING, Violation

CRASHES_PER_BUG = 90
# A cleaning crash state runs its workload twice (the rehearsal finds the pass's calls):
# fewer of them, each bug still caught at every seed tried (1-20).
CRASHES_PER_CLEANING_BUG = 60


@contextlib.contextmanager
def _patched(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def _stacked(patches: list[contextlib.AbstractContextManager[Any]]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


def fsync_ignored() -> contextlib.AbstractContextManager[None]:
    def flush(self: LogSegment) -> None:
        self.unflushed = False  # reports durable, fsyncs nothing

    return _patched(LogSegment, "flush", flush)


class _NoDirectorySync:
    """A filesystem whose directory fsync does nothing (for segment creation only)."""

    def __init__(self, fs: FileSystem):
        self._fs = fs

    def fsync_dir(self, path: str) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


def directory_fsync_skipped_on_segment_create() -> contextlib.AbstractContextManager[None]:
    original = LogSegment.open.__func__  # type: ignore[attr-defined]

    def open_segment(cls: type[LogSegment], fs: FileSystem, *args: Any, **kwargs: Any) -> LogSegment:
        segment: LogSegment = original(cls, _NoDirectorySync(fs), *args, **kwargs)
        segment.fs = fs
        return segment

    return _patched(LogSegment, "open", classmethod(open_segment))


def ack_before_data_fsync() -> contextlib.AbstractContextManager[None]:
    def flush(self: Log) -> None:
        # The recovery point moves (the flush is acknowledged) with no fsync first.
        active, end = self.active_segment, self.log_end_offset
        if end > self.recovery_point:
            self._set_recovery_point(end, active.base_offset, active.size)
        # Durable appenders are told so too (without it they would flush forever: a livelock,
        # not the bug).
        self._group_commit.mark_durable(end)

    return _patched(Log, "_flush", flush)


def checkpoint_past_the_fsynced_data() -> contextlib.AbstractContextManager[None]:
    def checkpoint(self: Log) -> bool:
        # The point moves to the log end, unflushed batches and all.
        active, end = self.active_segment, self.log_end_offset
        if end <= self.recovery_point:
            return False
        self._set_recovery_point(end, active.base_offset, active.size)
        return True

    return _patched(Log, "checkpoint", checkpoint)


def recovery_point_left_behind() -> contextlib.AbstractContextManager[None]:
    # Only rolls move the point: no flush is ever due, checkpoints and clean closes commit
    # nothing. Damage to fsynced bytes then reads as a torn tail, and is cut silently.
    flush = Log._flush

    def flush_without_point(self: Log, *, commit_point: bool = False) -> None:
        flush(self, commit_point=False)

    patches: list[contextlib.AbstractContextManager[Any]] = [
        _patched(Log, "_flush", flush_without_point),
        _patched(Log, "_point_due", lambda self: False),
        _patched(Log, "checkpoint", lambda self, due_only=False: False),
    ]
    return _stacked(patches)


def flush_racing_a_truncation() -> contextlib.AbstractContextManager[None]:
    # The flush before the fix: the log end captured under the append lock, the fsync
    # outside it with nothing keeping a truncation out, then the recovery point moved to
    # that end, whatever was cut meanwhile.
    def flush(self: Log) -> None:
        with self._lock:
            if self._failure is not None:
                raise LogFailedError(f"{self.directory} failed earlier: {self._failure}")
            end, active = self.log_end_offset, self.active_segment
            size, dirty = active.size, [segment for segment in self._segments if segment.unflushed]
        for segment in dirty:
            segment.flush()
        if end > self.recovery_point:
            self._set_recovery_point(end, active.base_offset, size)
        self._group_commit.mark_durable(end)

    return _patched(Log, "_flush", flush)


def recovery_skipping_crc_check() -> contextlib.AbstractContextManager[None]:
    # Recovery and the read path share one CRC comparison; skipping it skips both
    # (skipping only recovery's is masked by the read path checking again).
    def compute_crc(self: RecordBatch) -> int:
        return self.crc

    return _patched(RecordBatch, "compute_crc", compute_crc)


def snapshot_written_in_place() -> contextlib.AbstractContextManager[None]:
    def write_snapshot(fs: FileSystem, directory: str, offset: int, rows: np.ndarray) -> str:
        path = os.path.join(directory, snapshots.snapshot_file_name(offset))
        handle = fs.open(path, create=True)
        handle.truncate(0)
        handle.pwritev(snapshots.snapshot_buffers(offset, rows), 0)  # no fsync, no rename
        handle.close()
        return path

    return _patched(snapshots, "write_snapshot", write_snapshot)


def producer_state_not_restored_from_snapshot() -> contextlib.AbstractContextManager[None]:
    def load_newest(
        self: LogLoader, limit: int | None, listed: list[int] | None = None
    ) -> tuple[int | None, bool]:
        if listed is None:
            listed = snapshots.list_snapshot_offsets(self.fs, self.directory)
        offsets = [o for o in listed if limit is None or o <= limit]
        return (offsets[-1], True) if offsets else (None, False)  # claims it, loads nothing

    return _patched(LogLoader, "_load_newest_snapshot", load_newest)


def last_stable_offset_not_restored() -> contextlib.AbstractContextManager[None]:
    # The producer table keeps each open transaction's first offset, but the log's
    # open-transaction map (the last stable offset) is not rebuilt from it on open.
    def open_transactions(self: ProducerStateManager) -> dict[int, int]:
        return {}

    return _patched(ProducerStateManager, "open_transactions", open_transactions)


def transaction_index_not_rebuilt_by_recovery() -> contextlib.AbstractContextManager[None]:
    # Recovery rescans the tail segment and resets its .txnindex, but forgets to put
    # back the ABORT markers it replays: their data is served to read_committed.
    original = LogLoader._apply

    def apply(
        self: LogLoader, batch: RecordBatch, from_offset: int, rebuilding: LogSegment | None = None
    ) -> None:
        original(self, batch, from_offset, None)

    return _patched(LogLoader, "_apply", apply)


@contextlib.contextmanager
def expiry_by_batch_timestamp() -> Iterator[None]:
    # Kafka's rule: a producer counts as active when its newest batch was stamped, which
    # is the client's clock. Producers stamping old times are forgotten while they still
    # append; ones stamping ahead are never forgotten.
    original = append_rules.apply_batch

    def apply_batch(
        w: WorkingState,
        producer_epoch: int,
        batch: BatchMetadata,
        is_control: bool,
        is_transactional: bool = False,
        *,
        append_ms: int,
    ) -> None:
        original(w, producer_epoch, batch, is_control, is_transactional, append_ms=batch.max_timestamp_ms)

    # Both Python callers (the append rules and the replay) bound the name at import. The
    # compiled append keeps its own copy of the rule (apply_producer in _append.c), which a
    # patch cannot reach: Python-only, so logs opened meanwhile take the Python route.
    with (
        compiled_append.forced_pure(),
        _patched(append_rules, "apply_batch", apply_batch),
        _patched(producer_replay, "apply_batch", apply_batch),
    ):
        yield


def lost_segment_not_reported() -> contextlib.AbstractContextManager[None]:
    # The loader takes the segments it finds for the whole log: a newest segment an
    # operator deleted or emptied, fsynced data the recovery point covers, comes back
    # as a shorter log, and the next appends reuse its offsets.
    def accept(self: LogLoader, point: object, end: int) -> None:
        pass

    return _patched(LogLoader, "_fsynced_data_missing", accept)


def log_start_not_persisted() -> contextlib.AbstractContextManager[None]:
    # delete_records and retention move the start in memory and delete the files below it,
    # but never write the start down: after a crash, records deleted mid-segment come back.
    def write(store: Any, values: dict[str, int]) -> None:
        kept = {key: value for key, value in values.items() if key != LOG_START_KEY}
        if kept:
            write_offsets(store, kept)

    # Where truncation and _advance_log_start write the start (bound at import there).
    return _patched(log_lifecycle, "write_offsets", write)


def index_mapped_over_sparse_space() -> contextlib.AbstractContextManager[None]:
    # The active index is grown with ftruncate (a sparse file) and written through its
    # mapping: on a full disk, the write to a page without a block is SIGBUS.
    def reserve(self: Any, needed: int, limit: int) -> None:
        self._map(limit, writable=True)

    return _patched(index_module._MappedIndex, "_reserve", reserve)


class _NoFileSync:
    """A filesystem whose files' fsync does nothing (for the cleaner's .cleaned files only)."""

    def __init__(self, fs: FileSystem):
        self._fs = fs

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> Any:
        handle = self._fs.open(path, create=create, writable=writable)
        return _UnsyncedFile(handle)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


class _UnsyncedFile:
    def __init__(self, handle: Any):
        self._handle = handle

    def fsync(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def cleaned_segment_swapped_in_without_its_fsync() -> contextlib.AbstractContextManager[None]:
    # The .cleaned file is written and renamed into place, but never fsynced: the swap's
    # renames are durable (the directory is fsynced) while the bytes they name may not be,
    # and a power loss leaves a segment of zeros or half its batches, below the recovery point.
    original = LogCleaning._write_cleaned

    def write_cleaned(self: LogCleaning, path: str, batches: list[bytes]) -> None:
        fs = self._fs
        self._fs = _NoFileSync(fs)
        try:
            original(self, path, batches)
        finally:
            self._fs = fs

    return _patched(LogCleaning, "_write_cleaned", write_cleaned)


def cleaned_segment_swapped_in_without_a_directory_fsync() -> contextlib.AbstractContextManager[None]:
    # Every directory fsync of the swap skipped: the renames may be undone by a power loss
    # after the pass committed its cleaner checkpoint, so segments it reported clean come
    # back uncleaned (two live records of a key below the checkpoint).
    original = LogCleaning._swap_in

    def swap_in(self: LogCleaning, n: int, *args: Any) -> None:
        fs = self._fs
        self._fs = _NoDirectorySync(fs)
        try:
            original(self, n, *args)
        finally:
            self._fs = fs
            if n < len(self._segments) and self._segments[n].fs is not fs:
                self._segments[n].fs = fs  # the swapped-in segment keeps the real one

    return _patched(LogCleaning, "_swap_in", swap_in)


def producers_last_batches_dropped_by_the_cleaner() -> contextlib.AbstractContextManager[None]:
    # The pass ignores the producers' windows (KAFKA-5490): a batch whose records are all
    # superseded goes even when it is one of a producer's last batches.
    def cleaning_pass(*args: Any, **kwargs: Any) -> CleaningPass:
        if "protected_offsets" in kwargs:
            kwargs["protected_offsets"] = frozenset()
        else:
            args = (*args[:2], frozenset(), *args[3:])
        return CleaningPass(*args, **kwargs)

    return _patched(log_cleaner, "CleaningPass", cleaning_pass)


# Each bug with the fault classes that can expose it: a missing directory fsync
# shows only when unsynced directory entries vanish, and so on.
PLANTED: dict[str, tuple[Callable[[], contextlib.AbstractContextManager[None]], tuple[str, ...]]] = {
    "fsync ignored": (fsync_ignored, ("drop", "torn")),
    "directory fsync skipped on segment create": (directory_fsync_skipped_on_segment_create, ("dirent",)),
    "the recovery point left behind by checkpoints and clean closes": (
        recovery_point_left_behind,
        ("bitflip", "misdirect"),
    ),
    "ack before the data fsync": (ack_before_data_fsync, ("drop", "torn")),
    "a checkpoint commits a recovery point past the fsynced data": (
        checkpoint_past_the_fsynced_data,
        ("drop", "torn"),
    ),
    "a flush racing a truncation commits the log end it saw before the cut": (
        flush_racing_a_truncation,
        ("kill", "drop"),
    ),
    "recovery skipping the CRC check": (recovery_skipping_crc_check, ("torn", "bitflip", "misdirect")),
    "snapshot written in place, non-atomically": (snapshot_written_in_place, ("drop", "torn", "kill")),
    "producer state not restored from the snapshot": (
        producer_state_not_restored_from_snapshot,
        ("kill", "drop"),
    ),
    "last stable offset not restored on open": (last_stable_offset_not_restored, ("kill", "drop")),
    "aborted transactions left out of the transaction index recovery rebuilds": (
        transaction_index_not_rebuilt_by_recovery,
        ("kill", "drop", "torn"),
    ),
    "log start offset not persisted by delete_records and retention": (
        log_start_not_persisted,
        ("kill", "drop"),
    ),
    "expiry by batch timestamp": (expiry_by_batch_timestamp, ("kill", "drop")),
    "a lost segment not reported": (lost_segment_not_reported, ("lost",)),
    "index mapped over sparse space": (index_mapped_over_sparse_space, ("enospc",)),
    "a cleaned segment swapped in without its fsync": (
        cleaned_segment_swapped_in_without_its_fsync,
        (CLEANING,),
    ),
    "a cleaned segment swapped in without a directory fsync": (
        cleaned_segment_swapped_in_without_a_directory_fsync,
        (CLEANING,),
    ),
    "a producer's last batches dropped by the cleaner": (
        producers_last_batches_dropped_by_the_cleaner,
        (CLEANING,),
    ),
}


class SelfTestResult(NamedTuple):
    planted: int
    caught: int
    missed: list[str]
    violations: dict[str, int]


def run_self_test(
    seed: int, progress: Callable[[int, int], None] | None = None, *, only: Sequence[str] | None = None
) -> SelfTestResult:
    """Plant each bug of PLANTED in turn (`only`: those named) and run the torture on it."""
    unknown = sorted(set(only or ()) - set(PLANTED))
    if unknown:
        raise ValueError(f"no planted bug named {unknown[0]!r}")
    chosen = [(name, planted) for name, planted in PLANTED.items() if only is None or name in only]
    violations: dict[str, int] = {}
    missed: list[str] = []
    for n, (name, (plant, faults)) in enumerate(chosen):
        crashes = CRASHES_PER_CLEANING_BUG if CLEANING in faults else CRASHES_PER_BUG
        with plant():
            summary = run_torture(seed, crashes, faults)
        violations[name] = len(summary.violations)
        if not _new_violation(summary.violations):
            missed.append(name)
        if progress is not None:
            progress(n + 1, len(chosen))
    return SelfTestResult(len(chosen), len(chosen) - len(missed), missed, violations)


def _new_violation(found: list[Violation]) -> bool:
    """Whether one of `found` (a run with a bug planted) is the bug's: the same crash state
    replayed without the bug does not report it. A finding of the engine as it is (a real
    bug the harness reports in that crash state anyway) does not count as catching the
    planted one."""
    checked: set[tuple[int, str]] = set()
    for violation in found:
        state = (violation.seed, violation.fault)
        if state in checked:
            continue
        checked.add(state)
        planted = {v.invariant for v in found if (v.seed, v.fault) == state}
        if planted - {v.invariant for v in run_crash_state(*state)}:
            return True
    return False
