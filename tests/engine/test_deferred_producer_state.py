"""Producer state a LogManager's clean open leaves in its snapshot until first use (issue 28).

A LogManager opening thousands of clean partitions does not read their producer
snapshots: each log reads its own at the first operation that needs producers (an
append, a read, a producer query, a truncation). Every such operation must answer as a
log that read its snapshot at open, whatever happens first: a corrupt snapshot, an
expiry, two threads, a failed read, a close with no use at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from log_helpers import read_all

from oncelog import Log, LogConfig, LogManager, compiled_append
from oncelog import log_state as log_state_module
from oncelog.producer_state import ProducerStateEntry
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.storage import snapshot as snapshot_module
from oncelog.storage.snapshot import CORRUPT_SUFFIX, snapshot_file_name

CONFIG = LogConfig(segment_bytes=1024)  # several rolls, so older snapshots exist
EXPIRATION_MS = 60_000
EXPIRING = dataclasses.replace(CONFIG, producer_expiration_ms=EXPIRATION_MS)
TOPIC = "orders"
PRODUCERS = (7, 8)
BATCHES_EACH = 12


def _batch(pid: int, seq: int, *, txn: bool = False) -> bytes:
    return encode_batch(
        [(b"key-%d" % seq, b"value" * 8)],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        is_transactional=txn,
        timestamp_ms=1_000,
    )


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def snapshot_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The offsets of every snapshot read from here on."""
    reads: list[int] = []
    real = snapshot_module.read_snapshot

    def counted(fs: Any, directory: str, offset: int, **kwargs: Any) -> Any:
        reads.append(offset)
        return real(fs, directory, offset, **kwargs)

    monkeypatch.setattr(snapshot_module, "read_snapshot", counted)
    return reads


def _closed_root(
    root: Path, *, config: LogConfig = CONFIG, clock: Clock | None = None, open_txn: bool = False
) -> dict[int, list[bytes]]:
    """A root with one partition of two idempotent producers, closed cleanly: what each sent."""
    sent: dict[int, list[bytes]] = {pid: [] for pid in PRODUCERS}
    manager = LogManager.open(root, config, clock=clock)
    log = manager.log(TOPIC, 0)
    for seq in range(BATCHES_EACH):
        for pid in PRODUCERS:
            batch = _batch(pid, seq, txn=open_txn and pid == PRODUCERS[0] and seq == BATCHES_EACH - 1)
            log.append(batch)
            sent[pid].append(batch)
    assert len(log.segments) > 2, "the fixture should roll"
    manager.close()
    return sent


def _partition(root: Path) -> str:
    return str(root / f"{TOPIC}-0")


def _snapshot_at_end(root: Path) -> Path:
    newest = max(
        int(name.split(".")[0]) for name in os.listdir(_partition(root)) if name.endswith(".snapshot")
    )
    return Path(_partition(root)) / snapshot_file_name(newest)


def _retries_answer_duplicate(log: Log, sent: dict[int, list[bytes]]) -> None:
    """Every producer's last 5 batches, retried, are duplicates at their original offsets."""
    stored = {
        (RecordBatch(raw).producer_id, RecordBatch(raw).base_sequence): offset
        for offset, raw in read_all(log)
    }
    for pid, batches in sent.items():
        for seq, batch in enumerate(batches[-5:], start=len(batches) - 5):
            result = log.append(batch)
            assert result.duplicate, (pid, seq)
            original = stored[pid, seq]
            assert (result.first_offset, result.last_offset) == (original, original)


def test_a_clean_manager_open_reads_no_snapshot_until_a_producer_needs_one(
    tmp_path: Path, snapshot_reads: list[int]
) -> None:
    sent = _closed_root(tmp_path / "root")
    manager = LogManager.open(tmp_path / "root", CONFIG)
    try:
        log = manager.log(TOPIC, 0, create=False)
        assert log.recovery_report.clean
        assert log.recovery_report.snapshot_offset == log.log_end_offset
        assert snapshot_reads == []
        _retries_answer_duplicate(log, sent)
        assert snapshot_reads == [log.log_end_offset]  # read once, at the end
    finally:
        manager.close()


def test_a_standalone_log_open_still_reads_its_snapshot_at_open(
    tmp_path: Path, snapshot_reads: list[int]
) -> None:
    _closed_root(tmp_path / "root")
    log = Log.open(_partition(tmp_path / "root"), CONFIG)
    try:
        assert snapshot_reads == [log.log_end_offset]
    finally:
        log.close()


def _without_time(entry: ProducerStateEntry | None) -> object:
    """The entry but when it was appended (each root was written at its own time)."""
    return None if entry is None else entry._replace(last_append_ms=0)


def _producer_view(log: Log) -> object:
    return [_without_time(entry) for entry in log.producers()]


OPERATIONS: dict[str, Callable[[Log], object]] = {
    "producer_state": lambda log: _without_time(log.producer_state(PRODUCERS[0])),
    "producers": _producer_view,
    "open_transactions": lambda log: log.open_transactions(),
    "last_stable_offset": lambda log: log.last_stable_offset,
    "read_committed": lambda log: [
        batch.header.base_offset for batch in log.read(0, 1 << 24, isolation="read_committed").batches
    ],
    "append_next": lambda log: (log.append(_batch(PRODUCERS[1], BATCHES_EACH)), _producer_view(log)),
    "retire": lambda log: (log.retire_producers([PRODUCERS[1]]), _producer_view(log)),
    "truncate": lambda log: (log.truncate_to(log.log_end_offset - 3), _producer_view(log)),
    "expire_later": lambda log: (
        log.expire_producers(now_ms=2_000_000_000_000, exhaustive=True),
        _producer_view(log),
    ),
}


@pytest.mark.parametrize("open_txn", [False, True], ids=["no-transaction", "open-transaction"])
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_each_operation_first_after_a_deferred_open_answers_as_after_an_eager_one(
    tmp_path: Path, operation: str, open_txn: bool
) -> None:
    for name in ("deferred", "eager"):
        _closed_root(tmp_path / name, open_txn=open_txn)
    manager = LogManager.open(tmp_path / "deferred", CONFIG)
    try:
        deferred = OPERATIONS[operation](manager.log(TOPIC, 0, create=False))
    finally:
        manager.close()
    log = Log.open(_partition(tmp_path / "eager"), CONFIG)
    try:
        eager = OPERATIONS[operation](log)
    finally:
        log.close()
    assert deferred == eager


def test_an_unreadable_snapshot_at_first_use_is_set_aside_and_the_log_replayed(
    tmp_path: Path, snapshot_reads: list[int]
) -> None:
    sent = _closed_root(tmp_path / "root")
    newest = _snapshot_at_end(tmp_path / "root")
    raw = bytearray(newest.read_bytes())
    raw[-1] ^= 0xFF  # a bit flip: the CRC no longer matches
    newest.write_bytes(bytes(raw))
    manager = LogManager.open(tmp_path / "root", CONFIG)
    try:
        log = manager.log(TOPIC, 0, create=False)
        assert log.recovery_report.clean and snapshot_reads == []  # not read at open
        _retries_answer_duplicate(log, sent)
        assert len(snapshot_reads) == 2 and snapshot_reads[1] < snapshot_reads[0]  # then an older one
        assert Path(str(newest) + CORRUPT_SUFFIX).exists() and not newest.exists()
    finally:
        manager.close()


def test_a_log_closed_unused_leaves_its_snapshot_as_it_was(tmp_path: Path, snapshot_reads: list[int]) -> None:
    sent = _closed_root(tmp_path / "root")
    newest = _snapshot_at_end(tmp_path / "root")
    before = newest.read_bytes()
    LogManager.open(tmp_path / "root", CONFIG).close()
    assert snapshot_reads == []
    assert newest.read_bytes() == before
    log = Log.open(_partition(tmp_path / "root"), CONFIG)
    try:
        assert log.recovery_report.clean
        _retries_answer_duplicate(log, sent)
    finally:
        log.close()


def test_expiry_due_before_first_use_is_applied_when_the_state_is_read(
    tmp_path: Path, snapshot_reads: list[int]
) -> None:
    clock = Clock()
    _closed_root(tmp_path / "root", config=EXPIRING, clock=clock)
    clock.now_ms += EXPIRATION_MS + 1
    manager = LogManager.open(tmp_path / "root", EXPIRING, clock=clock)
    try:
        log = manager.log(TOPIC, 0, create=False)
        assert log.expire_producers() == 0 and snapshot_reads == []  # nothing read to expire
        assert log.producer_state(PRODUCERS[0]) is None  # expired as the state was read
        assert list(log.producers()) == []
    finally:
        manager.close()


def test_an_open_transaction_survives_a_deferred_open_and_its_commit(tmp_path: Path) -> None:
    _closed_root(tmp_path / "root", open_txn=True)
    manager = LogManager.open(tmp_path / "root", CONFIG)
    try:
        log = manager.log(TOPIC, 0, create=False)
        first = log.open_transactions()[PRODUCERS[0]]
        assert log.last_stable_offset == first < log.log_end_offset
        log.write_txn_marker(PRODUCERS[0], 0, commit=True, coordinator_epoch=0)
        assert log.last_stable_offset == log.log_end_offset
    finally:
        manager.close()


@pytest.fixture
def slow_deferred_loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    loads: list[int] = []
    real = log_state_module.load_deferred_producers

    def slow(*args: Any) -> Any:
        loads.append(1)
        time.sleep(0.05)  # long enough for the other thread to arrive meanwhile
        return real(*args)

    monkeypatch.setattr(log_state_module, "load_deferred_producers", slow)
    yield loads


def test_two_threads_using_a_log_first_read_its_snapshot_once(
    tmp_path: Path, slow_deferred_loads: list[int]
) -> None:
    _closed_root(tmp_path / "root")
    manager = LogManager.open(tmp_path / "root", CONFIG)
    try:
        log = manager.log(TOPIC, 0, create=False)
        seen: list[object] = []
        threads = [threading.Thread(target=lambda: seen.append(_producer_view(log))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert slow_deferred_loads == [1]
        assert seen[0] == seen[1] and len(seen[0]) == len(PRODUCERS)  # type: ignore[arg-type]
    finally:
        manager.close()


@pytest.fixture
def failing_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """Inside it, reading deferred producer state fails with EIO."""

    @contextlib.contextmanager
    def failing() -> Iterator[None]:
        def eio(*args: object) -> None:
            raise OSError(5, "EIO")

        with monkeypatch.context() as patched:
            patched.setattr(log_state_module, "load_deferred_producers", eio)
            yield

    return failing


def test_a_lost_newest_segment_recovered_by_truncation_keeps_every_producer(
    tmp_path: Path, snapshot_reads: list[int]
) -> None:
    """The marker says clean, but fsynced data is missing: the load turns unclean after it
    chose to defer, and must read the producers before it writes their snapshot."""
    sent = _closed_root(tmp_path / "root", open_txn=True)
    directory = Path(_partition(tmp_path / "root"))
    bases = sorted(int(name[:20]) for name in os.listdir(directory) if name.endswith(".log"))
    end = _snapshot_at_end(tmp_path / "root")
    for path in directory.iterdir():  # the newest segment and the snapshot at the end are lost
        if (path.name.startswith(f"{bases[-1]:020d}.") and path.suffix != ".snapshot") or path == end:
            path.unlink()
    manager = LogManager.open(tmp_path / "root", CONFIG, on_corruption="truncate")
    try:
        log = manager.log(TOPIC, 0, create=False)
        assert log.log_end_offset == bases[-1] and not log.recovery_report.clean
        assert snapshot_reads == [bases[-1]]  # read at open, as the unclean load needed it
        survivors = {
            pid: [b for b in batches if _offset_of(log, pid, b) is not None] for pid, batches in sent.items()
        }
        _retries_answer_duplicate(log, survivors)
        assert log.open_transactions() == {}  # its open transaction's batch was in the lost segment
    finally:
        manager.close()


def _offset_of(log: Log, pid: int, batch: bytes) -> int | None:
    sequence = RecordBatch(batch).base_sequence
    for offset, raw in read_all(log):
        stored = RecordBatch(raw)
        if (stored.producer_id, stored.base_sequence) == (pid, sequence):
            return offset
    return None


@pytest.mark.parametrize("route", ["append", "append_batches"])
def test_batches_without_a_producer_before_first_use_are_replayed_past_the_snapshot(
    tmp_path: Path, route: str
) -> None:
    sent = _closed_root(tmp_path / "root")
    manager = LogManager.open(tmp_path / "root", CONFIG)
    try:
        log = manager.log(TOPIC, 0, create=False)
        plain = encode_batch([(b"k", b"no producer")], timestamp_ms=1_000)
        for _ in range(3):
            log.append(plain) if route == "append" else log.append_batches([plain])
        _retries_answer_duplicate(log, sent)
        log.roll()
        _retries_answer_duplicate(log, sent)
    finally:
        manager.close()


@pytest.mark.parametrize("first_use", ["append", "roll"])
def test_a_failed_first_read_leaves_the_state_unread_and_the_log_writable(
    tmp_path: Path, failing_reads: Callable[[], contextlib.AbstractContextManager[None]], first_use: str
) -> None:
    """Read inside a roll, a failure would fail the log: the roll reads before it changes anything."""
    sent = _closed_root(tmp_path / "root")
    manager = LogManager.open(tmp_path / "root", CONFIG)
    try:
        log = manager.log(TOPIC, 0, create=False)
        end = log.log_end_offset
        with failing_reads(), pytest.raises(OSError):
            log.append(sent[PRODUCERS[0]][-1]) if first_use == "append" else log.roll()
        assert log.log_end_offset == end and len(log.segments) == len(set(log.segments))
        _retries_answer_duplicate(log, sent)  # not failed: appends go on
        assert not log.append(_batch(PRODUCERS[0], BATCHES_EACH)).duplicate
        # The failed first append's bind is tried again: the compiled appender is bound.
        assert (log._compiled_appender is not None) == compiled_append.enabled()
    finally:
        manager.close()
    reopened = Log.open(_partition(tmp_path / "root"), CONFIG)
    try:
        assert reopened.recovery_report.clean
    finally:
        reopened.close()
