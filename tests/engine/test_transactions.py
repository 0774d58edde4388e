"""Transactions: markers, the last stable offset, the aborted-transaction index (issue 7).

Each test is named after the Apache Kafka test whose scenario it replays (cited in
its docstring), with Kafka's producers, offsets and expected values wherever the
API allows. Kafka's sources read for this (apache/kafka, trunk of October 2024):

- storage/src/test/java/org/apache/kafka/storage/internals/log/ProducerStateManagerTest.java
- core/src/test/scala/unit/kafka/log/UnifiedLogTest.scala
- core/src/test/scala/unit/kafka/log/LogLoaderTest.scala
- storage/.../log/TransactionIndex.java (collectAbortedTxns: a fetch reports every
  aborted transaction with lastOffset >= fetch offset and firstOffset < upper bound)
- clients/.../consumer/internals/CompletedFetch.java (read_committed filtering: a
  producer's transactional batches are skipped from its aborted transaction's first
  offset until its ABORT marker; control batches are never returned)

Differences from Kafka that change an expectation:
- oncelog has no high watermark (no replication), so the LSO moves as soon as the
  marker is written, where Kafka waits for updateHighWatermark.
- Kafka's snapshot keeps only a producer's last batch; oncelog's keeps the 5-batch
  window (brief §3), so recovered windows are asserted on their last batch only.

Logs run with Kafka's default expiration, on a pinned broker clock (T0, the
batches' timestamp) or the wall clock: expiry reads the engine's clock, never the
batches' timestamps; it has its own tests with their own clock.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import shutil
import stat
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatch
from kafka_fixtures import kafka_fixtures_root

from oncelog.config import LogConfig
from oncelog.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    LogFailedError,
    OutOfOrderSequenceError,
    ProducerStateFullError,
    TransactionCoordinatorFencedError,
)
from oncelog.log import Log
from oncelog.results import AppendResult, FetchResult
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.control import encode_txn_marker
from oncelog.segments.format import Buffer
from oncelog.segments.records import Record
from oncelog.storage.fs import DelegatingFileHandle, DelegatingFileSystem, FileHandle

T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_index_bytes=4096)
READ_ALL = 1 << 30
COMMITTED = "read_committed"
UNCOMMITTED = "read_uncommitted"

PID = 1  # ProducerStateManagerTest's producerId
PID_1, PID_2, PID_3, PID_4 = 1, 2, 3, 4

# Kafka's control record layout (brief §3): key = version i16, type i16; value =
# version i16, coordinatorEpoch i32.
CONTROL_KEY = struct.Struct(">hh")
MARKER_VALUE = struct.Struct(">hi")
ABORT, COMMIT = 0, 1
# Kafka's AbortedTxn: version i16, producerId i64, firstOffset i64, lastOffset i64, lastStableOffset i64.
TXN_ENTRY = struct.Struct(">hqqqq")
assert TXN_ENTRY.size == 34

# Where a batch's length field sits, and how many zero bytes mark unwritten space
# (the active segment is pre-allocated; see tests/recovery/test_loader.py).
LENGTH_AT = 8
UNWRITTEN_HEADER = 17
CLEAN_MARKER = ".clean_shutdown"
METADATA_STORE = "meta.lmdb"


# -- building and writing batches -------------------------------------------------------
def data_batch(
    count: int,
    *,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    transactional: bool = False,
    tag: str = "",
) -> bytes:
    """`count` records; keys name the producer and sequence so that reads can be checked."""
    records = [(f"{tag}p{pid}e{epoch}s{seq + i}".encode(), b"v" * 8) for i in range(count)]
    return encode_batch(
        records,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=transactional,
        timestamp_ms=T0,
    )


def plain(log: Log, count: int, tag: str = "plain") -> AppendResult:
    """Non-transactional data without a producer id (Kafka's appendNonTransactionalAsLeader)."""
    return log.append(data_batch(count, tag=tag))


class Producer:
    """A transactional producer as Kafka's LogTestUtils.appendTransactionalAsLeader drives one.

    `send` appends one batch of `count` records at the next sequence; `commit`/`abort`
    write the coordinator's marker for it.
    """

    def __init__(self, log: Log, pid: int, epoch: int = 0, seq: int = 0):
        self.log = log
        self.pid = pid
        self.epoch = epoch
        self.seq = seq

    def send(self, count: int, *, transactional: bool = True) -> AppendResult:
        batch = data_batch(count, pid=self.pid, epoch=self.epoch, seq=self.seq, transactional=transactional)
        result = self.log.append(batch)
        self.seq += count
        return result

    def commit(self, coordinator_epoch: int = 0) -> AppendResult:
        return self.log.write_txn_marker(
            self.pid, self.epoch, commit=True, coordinator_epoch=coordinator_epoch
        )

    def abort(self, coordinator_epoch: int = 0) -> AppendResult:
        return self.log.write_txn_marker(
            self.pid, self.epoch, commit=False, coordinator_epoch=coordinator_epoch
        )


def open_log(path: Path, config: LogConfig = CONFIG) -> Log:
    return Log.open(path, config, clock=lambda: T0)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "txn-0"


@pytest.fixture
def log(log_dir: Path) -> Iterator[Log]:
    opened = open_log(log_dir)
    yield opened
    opened.close()


# -- the files ----------------------------------------------------------------------------
def files_digest(directory: Path) -> dict[str, str]:
    """sha256 of every file an append or a marker may touch."""
    suffixes = (".log", ".index", ".timeindex", ".txnindex", ".snapshot")
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.suffix in suffixes
    }


def txn_index_files(directory: Path) -> dict[int, list[tuple[int, int, int, int]]]:
    """Each .txnindex file's entries (pid, first, last, lso), by segment base; version checked."""
    out: dict[int, list[tuple[int, int, int, int]]] = {}
    for path in sorted(directory.glob("*.txnindex")):
        data = path.read_bytes()
        assert len(data) % TXN_ENTRY.size == 0, f"{path.name}: {len(data)} bytes is not whole entries"
        entries = []
        for position in range(0, len(data), TXN_ENTRY.size):
            version, *entry = TXN_ENTRY.unpack_from(data, position)
            assert version == 0, f"{path.name} entry at {position} has version {version}"
            entries.append(tuple(entry))
        out[int(path.name[:20])] = entries  # type: ignore[assignment]
    return out


def all_aborted(directory: Path) -> list[tuple[int, int, int, int]]:
    """Kafka's LogTestUtils.allAbortedTransactions: every segment's entries, in segment order."""
    return [entry for entries in txn_index_files(directory).values() for entry in entries]


def segment_bases(directory: Path) -> list[int]:
    return sorted(int(p.name[:20]) for p in directory.glob("*.log"))


def crash_image(source: Path, target: Path) -> Path:
    """What a kill -9 leaves: every file as the page cache holds it, and no clean-shutdown marker."""
    shutil.copytree(source, target)
    assert not (target / CLEAN_MARKER).exists()
    return target


def batch_positions(log_file: Path) -> list[tuple[int, int, int]]:
    """(position, size, base offset) of each batch in a .log file, walked by length field."""
    data = log_file.read_bytes()
    out = []
    position = 0
    while position + UNWRITTEN_HEADER <= len(data):
        if data[position : position + UNWRITTEN_HEADER] == bytes(UNWRITTEN_HEADER):
            break  # pre-allocated, unwritten space
        size = int.from_bytes(data[position + LENGTH_AT : position + LENGTH_AT + 4], "big") + 12
        out.append((position, size, int.from_bytes(data[position : position + 8], "big", signed=True)))
        position += size
    return out


def tear_batch_at(directory: Path, offset: int) -> None:
    """Flip the last byte of the batch at `offset`: its CRC fails, as after a torn write."""
    for base in reversed(segment_bases(directory)):
        if base <= offset:
            path = directory / f"{base:020d}.log"
            break
    for position, size, base_offset in batch_positions(path):
        if base_offset == offset:
            data = bytearray(path.read_bytes())
            data[position + size - 1] ^= 0x5A
            path.write_bytes(bytes(data))
            return
    raise AssertionError(f"no batch starts at offset {offset} in {path}")


def marker_batch(
    pid: int, epoch: int, *, commit: bool, base_offset: int, coordinator_epoch: int = 0
) -> bytes:
    """A coordinator's marker as a leader sends it to a follower (Kafka's appendEndTxnMarkerToBuffer)."""
    return encode_batch(
        [(CONTROL_KEY.pack(0, COMMIT if commit else ABORT), MARKER_VALUE.pack(0, coordinator_epoch))],
        base_offset=base_offset,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=-1,
        is_transactional=True,
        control=True,
        timestamp_ms=T0,
    )


def leader_batch(count: int, base_offset: int, *, pid: int = -1, seq: int = -1) -> bytes:
    """Data as a leader sends it to a follower: its own offsets, transactional when it has a producer."""
    records = [(f"p{pid}s{seq + i}".encode(), b"v" * 8) for i in range(count)]
    return encode_batch(
        records,
        base_offset=base_offset,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=seq,
        is_transactional=pid >= 0,
        timestamp_ms=T0,
    )


class _TxnIndexWriteFailingHandle(DelegatingFileHandle):
    def __init__(self, inner: FileHandle, fs: TxnIndexWriteFailingFileSystem) -> None:
        super().__init__(inner)
        self._fs = fs

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        if self._fs.armed and self.path.endswith(".txnindex"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), self.path)
        return self.inner.pwritev(buffers, offset)


class TxnIndexWriteFailingFileSystem(DelegatingFileSystem):
    """The real OS, except that writes to a .txnindex fail with EIO while `armed`."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def wrap(self, handle: FileHandle) -> FileHandle:
        return _TxnIndexWriteFailingHandle(handle, self)


# -- reads --------------------------------------------------------------------------------
def read_through(log: Log, isolation: str) -> tuple[list[RecordBatch], list[Record], list[tuple[int, int]]]:
    """Read from the log start to the LSO (read_committed) or the log end, segment by segment.

    Returns the batches, the records `FetchResult.records()` yields and the aborted
    transactions reported (each once, in the order first reported). Records are
    decoded at once: batches are views of the segment.
    """
    batches: list[RecordBatch] = []
    records: list[Record] = []
    aborted: list[tuple[int, int]] = []
    offset = log.log_start_offset
    end = log.last_stable_offset if isolation == COMMITTED else log.log_end_offset
    while offset < end:
        fetched = log.read(offset, READ_ALL, isolation=isolation)
        assert fetched.batches, f"nothing read at {offset} below {end}"
        batches.extend(fetched.batches)
        records.extend(fetched.records())
        if isolation == COMMITTED:
            for txn in fetched.aborted_transactions:
                if tuple(txn) not in aborted:
                    aborted.append(tuple(txn))  # type: ignore[arg-type]
        offset = fetched.next_offset
    return batches, records, aborted


def committed_offsets(log: Log) -> list[int]:
    return [record.offset for record in read_through(log, COMMITTED)[1]]


def aborted_of(fetched: FetchResult) -> list[tuple[int, int]]:
    return [(txn[0], txn[1]) for txn in fetched.aborted_transactions]


def txn_first_offset(log: Log, pid: int) -> int:
    entry = log.producer_state(pid)
    assert entry is not None, f"no state for producer {pid}"
    return entry.current_txn_first_offset


# -- Kafka's mixed scenario ---------------------------------------------------------------------
# UnifiedLogTest.testTransactionIndexUpdated and LogLoaderTest.testFullTransactionIndexRecovery /
# testRecoverOnlyLastSegment / testRecoverLastSegmentWithNoSnapshots all run this sequence
# of four transactional producers (epoch 0) and non-transactional data.
MIXED_LOG_END_AFTER_EACH_STEP = [5, 8, 10, 14, 17, 19, 29, 30, 36, 39, 49, 58, 59, 67, 74, 75, 85, 89, 90]
# pid1 opens at 0; pid2 at 8; pid3 at 14; pid1 aborted at 29 (pid2 open: 8); pid4 opens at
# 36; pid3 committed at 58; pid2 aborted at 74 (pid4 open: 36); pid4 committed at 89.
MIXED_LSO_AFTER_EACH_STEP = [0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8, 36, 36, 36, 90]
# Kafka's expectation: List(new AbortedTxn(pid1, 0L, 29L, 8L), new AbortedTxn(pid2, 8L, 74L, 36L)).
MIXED_ABORTED = [(PID_1, 0, 29, 8), (PID_2, 8, 74, 36)]
# The segments when the scenario rolls after the pid1 abort and after the pid3 commit.
MIXED_ROLLED_BASES = [0, 30, 59]
MIXED_COMMITTED = sorted(
    [
        *range(5, 8),  # non-transactional
        *range(17, 19),
        *range(39, 49),
        *range(75, 85),
        *range(14, 17),  # pid3, committed at 58
        *range(49, 58),
        *range(36, 39),  # pid4, committed at 89
        *range(59, 67),
        *range(85, 89),
    ]
)


def kafka_mixed_transactions(log: Log, *, roll: bool = False) -> list[tuple[int, int]]:
    """Kafka's mixed sequence; returns (log end, LSO) after each step.

    With `roll`, the log rolls after the pid1 abort (offset 30) and after the pid3
    commit (59): snapshots there hold open transactions (pid2 from 8, pid3 from 14;
    then pid2 from 8, pid4 from 36), and pid2's transaction spans all three segments.
    """
    p1, p2, p3, p4 = (Producer(log, pid) for pid in (PID_1, PID_2, PID_3, PID_4))
    trace: list[tuple[int, int]] = []

    def step(action: object) -> None:
        trace.append((log.log_end_offset, log.last_stable_offset))

    step(p1.send(5))  # 0..4
    step(plain(log, 3))  # 5..7
    step(p2.send(2))  # 8..9
    step(p1.send(4))  # 10..13
    step(p3.send(3))  # 14..16
    step(plain(log, 2))  # 17..18
    step(p1.send(10))  # 19..28
    step(p1.abort())  # 29
    if roll:
        log.roll()
    step(p2.send(6))  # 30..35
    step(p4.send(3))  # 36..38
    step(plain(log, 10))  # 39..48
    step(p3.send(9))  # 49..57
    step(p3.commit())  # 58
    if roll:
        log.roll()
    step(p4.send(8))  # 59..66
    step(p2.send(7))  # 67..73
    step(p2.abort())  # 74
    step(plain(log, 10))  # 75..84
    step(p4.send(4))  # 85..88
    step(p4.commit())  # 89
    return trace


# ==========================================================================================
class TestTransactionalAppendRules:
    def test_non_transactional_append_with_ongoing_transaction_is_refused_and_changes_nothing(
        self, log: Log, log_dir: Path
    ) -> None:
        """ProducerStateManagerTest.testNonTransactionalAppendWithOngoingTransaction."""
        producer = Producer(log, PID)
        producer.send(1)
        before = files_digest(log_dir)
        state = log.producer_state(PID)
        with pytest.raises(InvalidTxnStateError):
            log.append(data_batch(1, pid=PID, epoch=0, seq=1, transactional=False))
        assert files_digest(log_dir) == before
        assert log.log_end_offset == 1
        assert log.producer_state(PID) == state
        assert log.last_stable_offset == 0

    def test_a_refused_append_does_not_mutate_state_so_the_transaction_goes_on_at_the_same_sequence(
        self, log: Log
    ) -> None:
        """ProducerStateManagerTest.testPrepareUpdateDoesNotMutate, through the log."""
        producer = Producer(log, PID)
        producer.send(1)
        with pytest.raises(InvalidTxnStateError):
            log.append(data_batch(5, pid=PID, epoch=0, seq=1, transactional=False))
        assert producer.send(5) == AppendResult(1, 5)  # seq 1..5, now transactional
        entry = log.producer_state(PID)
        assert entry is not None
        assert (entry.last_sequence, entry.last_offset, entry.current_txn_first_offset) == (5, 5, 0)

    def test_first_transactional_batch_opens_the_transaction_at_its_first_offset(self, log: Log) -> None:
        """UnifiedLogTest.testFirstUnstableOffsetWithTransactionalData (pid 137, epoch 5)."""
        plain(log, 3)
        producer = Producer(log, 137, epoch=5)
        first = producer.send(3)
        assert first.first_offset == 3
        assert txn_first_offset(log, 137) == 3
        assert log.last_stable_offset == 3
        producer.send(1)  # more data in the same transaction: the LSO does not move
        assert txn_first_offset(log, 137) == 3
        assert log.last_stable_offset == 3
        producer.commit()
        assert txn_first_offset(log, 137) == -1
        assert log.last_stable_offset == log.log_end_offset == 8

    def test_non_transactional_data_from_the_same_producer_is_accepted_once_the_transaction_is_closed(
        self, log: Log
    ) -> None:
        producer = Producer(log, PID)
        producer.send(2)
        producer.commit()
        assert producer.send(1, transactional=False) == AppendResult(3, 3)
        assert log.last_stable_offset == log.log_end_offset == 4

    def test_other_producers_may_append_non_transactional_data_during_a_transaction(self, log: Log) -> None:
        Producer(log, PID_1).send(2)
        assert Producer(log, PID_2).send(3, transactional=False) == AppendResult(2, 4)
        assert plain(log, 1) == AppendResult(5, 5)
        assert log.last_stable_offset == 0

    def test_a_retried_transactional_batch_is_a_duplicate_and_keeps_the_transaction_first_offset(
        self, log: Log
    ) -> None:
        producer = Producer(log, PID)
        plain(log, 2)
        producer.send(3)  # 2..4
        producer.send(2)  # 5..6
        retry = log.append(data_batch(3, pid=PID, epoch=0, seq=0, transactional=True))
        assert retry == AppendResult(2, 4, -1, True)
        assert log.log_end_offset == 7
        assert txn_first_offset(log, PID) == 2
        assert log.last_stable_offset == 2

    def test_a_request_that_opens_a_transaction_then_sends_non_transactional_data_is_refused_whole(
        self, log: Log, log_dir: Path
    ) -> None:
        """Kafka validates a request's batches with one ProducerAppendInfo: the txn the first opens counts."""
        plain(log, 1)
        before = files_digest(log_dir)
        request = [
            data_batch(2, pid=PID, epoch=0, seq=0, transactional=True),
            data_batch(1, pid=PID, epoch=0, seq=2, transactional=False),
        ]
        with pytest.raises(InvalidTxnStateError):
            log.append_batches(request)
        assert files_digest(log_dir) == before
        assert log.log_end_offset == 1
        assert log.producer_state(PID) is None
        assert log.last_stable_offset == 1

    def test_a_new_transaction_after_a_commit_opens_at_its_own_first_offset(self, log: Log) -> None:
        producer = Producer(log, PID)
        producer.send(2)  # 0..1
        producer.commit()  # 2
        plain(log, 3)  # 3..5
        assert log.last_stable_offset == 6
        producer.send(1)  # 6
        assert txn_first_offset(log, PID) == 6
        assert log.last_stable_offset == 6


# ==========================================================================================
class TestTxnMarkers:
    @pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
    def test_a_marker_is_one_control_record_in_kafkas_layout(self, log: Log, commit: bool) -> None:
        """Kafka's EndTransactionMarker / ControlRecordType layout (brief §3)."""
        producer = Producer(log, PID, epoch=3)
        producer.send(2)
        result = log.write_txn_marker(PID, 3, commit=commit, coordinator_epoch=7)
        assert (result.first_offset, result.last_offset) == (2, 2)
        assert not result.duplicate
        assert log.log_end_offset == 3
        fetched = log.read(2, READ_ALL)
        [batch] = fetched.batches
        assert batch.is_control and batch.is_transactional
        assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (PID, 3, -1)
        assert (batch.base_offset, batch.records_count) == (2, 1)
        [record] = batch.records()
        assert record.key == CONTROL_KEY.pack(0, COMMIT if commit else ABORT)
        assert record.value == MARKER_VALUE.pack(0, 7)

    def test_a_client_cannot_append_a_control_batch(self, log: Log, log_dir: Path) -> None:
        """Brief §4: a control batch sent by a client is invalid; markers come only from write_txn_marker."""
        Producer(log, PID).send(1)
        before = files_digest(log_dir)
        forged = encode_batch(
            [(CONTROL_KEY.pack(0, COMMIT), MARKER_VALUE.pack(0, 0))],
            producer_id=PID,
            producer_epoch=0,
            is_transactional=True,
            control=True,
            timestamp_ms=T0,
        )
        with pytest.raises(InvalidRecordError):
            log.append(forged)
        assert files_digest(log_dir) == before
        assert txn_first_offset(log, PID) == 0

    def test_control_record_bumps_producer_epoch(self, log: Log) -> None:
        """ProducerStateManagerTest.testControlRecordBumpsProducerEpoch."""
        Producer(log, PID, epoch=0).send(1)
        log.write_txn_marker(PID, 1, commit=False, coordinator_epoch=0)
        entry = log.producer_state(PID)
        assert entry is not None
        assert entry.producer_epoch == 1
        assert entry.current_txn_first_offset == -1
        assert entry.last_sequence == -1
        assert entry.batches == ()
        # Appends with the new epoch start at sequence 0.
        assert log.append(data_batch(1, pid=PID, epoch=1, seq=0)) == AppendResult(2, 2)
        entry = log.producer_state(PID)
        assert entry is not None
        assert (entry.producer_epoch, entry.batches[0].first_sequence) == (1, 0)

    def test_out_of_sequence_after_control_record_epoch_bump(self, log: Log, log_dir: Path) -> None:
        """ProducerStateManagerTest.testOutOfSequenceAfterControlRecordEpochBump."""
        producer = Producer(log, PID, epoch=0)
        producer.send(1)
        producer.send(1)
        log.write_txn_marker(PID, 1, commit=False, coordinator_epoch=0)  # offset 2
        before = files_digest(log_dir)
        with pytest.raises(OutOfOrderSequenceError):
            log.append(data_batch(1, pid=PID, epoch=1, seq=2, transactional=True))
        with pytest.raises(OutOfOrderSequenceError):
            log.append(data_batch(1, pid=PID, epoch=2, seq=2, transactional=True))
        assert files_digest(log_dir) == before
        assert log.append(data_batch(1, pid=PID, epoch=1, seq=0, transactional=True)) == AppendResult(3, 3)
        entry = log.producer_state(PID)
        assert entry is not None
        assert (entry.producer_epoch, entry.last_sequence, entry.current_txn_first_offset) == (1, 0, 3)

    def test_the_abort_that_bumps_the_epoch_still_aborts_the_open_transaction(self, log: Log) -> None:
        """ProducerStateManagerTest.testProducerStateAfterFencingAbortMarker, with the index."""
        Producer(log, PID, epoch=0).send(2)  # 0..1
        log.write_txn_marker(PID, 1, commit=False, coordinator_epoch=0)  # 2
        assert log.last_stable_offset == 3
        assert all_aborted(Path(log.directory)) == [(PID, 0, 2, 3)]
        fetched = log.read(0, READ_ALL, isolation=COMMITTED)
        assert aborted_of(fetched) == [(PID, 0)]
        assert list(fetched.records()) == []

    def test_append_txn_marker_with_no_producer_state(self, log: Log) -> None:
        """ProducerStateManagerTest.testAppendTxnMarkerWithNoProducerState (epoch 2)."""
        log.write_txn_marker(PID, 2, commit=True, coordinator_epoch=27)
        entry = log.producer_state(PID)
        assert entry is not None
        assert (entry.producer_id, entry.producer_epoch, entry.last_sequence) == (PID, 2, -1)
        assert entry.current_txn_first_offset == -1
        # Fencing works even when the marker is all that is left of the producer.
        with pytest.raises(InvalidProducerEpochError):
            log.append(data_batch(1, pid=PID, epoch=0, seq=0))
        # A known producer with no batches must start again at sequence 0.
        with pytest.raises(OutOfOrderSequenceError):
            log.append(data_batch(1, pid=PID, epoch=2, seq=17))
        assert log.append(data_batch(1, pid=PID, epoch=2, seq=0)) == AppendResult(1, 1)
        entry = log.producer_state(PID)
        assert entry is not None
        assert (entry.producer_epoch, entry.last_sequence) == (2, 0)

    def test_old_epoch_for_control_record_is_fenced_and_changes_nothing(
        self, log: Log, log_dir: Path
    ) -> None:
        """ProducerStateManagerTest.testOldEpochForControlRecord (epoch 5, marker at 3)."""
        Producer(log, PID, epoch=5).send(1)
        before = files_digest(log_dir)
        state = log.producer_state(PID)
        with pytest.raises(InvalidProducerEpochError):
            log.write_txn_marker(PID, 3, commit=True, coordinator_epoch=0)
        assert files_digest(log_dir) == before
        assert log.log_end_offset == 1
        assert log.producer_state(PID) == state
        assert log.last_stable_offset == 0

    def test_end_txn_with_fenced_producer_epoch(self, log: Log) -> None:
        """UnifiedLogTest.testEndTxnWithFencedProducerEpoch: after a marker-only producer at epoch 5."""
        log.write_txn_marker(PID, 5, commit=False, coordinator_epoch=1)
        with pytest.raises(InvalidProducerEpochError):
            log.write_txn_marker(PID, 4, commit=False, coordinator_epoch=1)
        assert log.log_end_offset == 1

    def test_coordinator_fencing(self, log: Log, log_dir: Path) -> None:
        """ProducerStateManagerTest.testCoordinatorFencing (epoch 5, coordinator epochs 1, 1, 2, then 1)."""
        Producer(log, PID, epoch=5).send(1)
        log.write_txn_marker(PID, 5, commit=True, coordinator_epoch=1)
        entry = log.producer_state(PID)
        assert entry is not None
        assert entry.coordinator_epoch == 1
        log.write_txn_marker(PID, 5, commit=True, coordinator_epoch=1)  # the current epoch is allowed
        log.write_txn_marker(PID, 5, commit=True, coordinator_epoch=2)  # a bump is allowed
        entry = log.producer_state(PID)
        assert entry is not None
        assert entry.coordinator_epoch == 2
        before = files_digest(log_dir)
        with pytest.raises(TransactionCoordinatorFencedError):
            log.write_txn_marker(PID, 5, commit=True, coordinator_epoch=1)
        assert files_digest(log_dir) == before
        assert log.log_end_offset == 4

    def test_zombie_coordinator_fenced(self, log: Log) -> None:
        """UnifiedLogTest.testZombieCoordinatorFenced."""
        producer = Producer(log, PID)
        producer.send(10)
        producer.abort(coordinator_epoch=1)
        producer.send(5)
        producer.commit(coordinator_epoch=2)
        with pytest.raises(TransactionCoordinatorFencedError):
            producer.abort(coordinator_epoch=1)
        assert log.log_end_offset == 17
        assert all_aborted(Path(log.directory)) == [(PID, 0, 10, 11)]

    def test_zombie_coordinator_fenced_empty_transaction(self, log: Log) -> None:
        """UnifiedLogTest.testZombieCoordinatorFencedEmptyTransaction (without the follower append)."""
        producer = Producer(log, PID)
        producer.send(10)
        producer.commit(coordinator_epoch=0)
        producer.abort(coordinator_epoch=2)  # empty transactions
        producer.abort(coordinator_epoch=2)
        with pytest.raises(TransactionCoordinatorFencedError):
            producer.abort(coordinator_epoch=1)
        assert log.log_end_offset == 13
        assert all_aborted(Path(log.directory)) == []  # an empty transaction aborts nothing

    @pytest.mark.parametrize("reload", ["clean-close", "crash-image"])
    def test_coordinator_fenced_after_reload(self, tmp_path: Path, log_dir: Path, reload: str) -> None:
        """ProducerStateManagerTest.testCoordinatorFencedAfterReload.

        The coordinator epoch comes back from the snapshot written at close, or, in a
        crash image (no snapshot past the start), from replaying the marker itself.
        """
        live = open_log(log_dir)
        try:
            Producer(live, PID).send(1)
            live.write_txn_marker(PID, 0, commit=True, coordinator_epoch=1)
            if reload == "crash-image":
                reopened_dir = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        if reload == "clean-close":
            reopened_dir = log_dir
        with open_log(reopened_dir) as reopened:
            entry = reopened.producer_state(PID)
            assert entry is not None
            assert entry.coordinator_epoch == 1
            before = files_digest(reopened_dir)
            with pytest.raises(TransactionCoordinatorFencedError):
                reopened.write_txn_marker(PID, 0, commit=True, coordinator_epoch=0)
            assert files_digest(reopened_dir) == before
            assert reopened.log_end_offset == 2
            reopened.write_txn_marker(PID, 0, commit=True, coordinator_epoch=1)
            assert reopened.log_end_offset == 3


# ==========================================================================================
def empty_control_batch(pid: int, epoch: int, base_offset: int) -> bytes:
    """A control batch whose marker record compaction removed: the header alone, 0 records."""
    covered = struct.pack(">hiqqqhii", 0x30, 0, T0, T0, pid, epoch, -1, 0)  # transactional | control
    crc = crc32c.crc32c(covered)
    return struct.pack(">qiib", base_offset, 49, -1, 2) + struct.pack(">I", crc) + covered


class TestEmptyControlBatch:
    def test_an_empty_control_batch_from_a_leader_changes_no_producer_state(self, log: Log) -> None:
        """Kafka's ProducerAppendInfo skips a control batch with no records (its transaction was cleaned)."""
        producer = Producer(log, PID)
        producer.send(2)
        before = log.producer_state(PID)
        assert before is not None and before.current_txn_first_offset == 0
        end = log.log_end_offset
        result = log.append(empty_control_batch(PID, 5, end), origin="replication")
        assert (result.first_offset, log.log_end_offset) == (end, end + 1)
        assert log.producer_state(PID) == before  # no epoch bump, the transaction still open
        assert log.last_stable_offset == 0
        producer.commit()
        assert log.last_stable_offset == log.log_end_offset


class TestLastStableOffset:
    def test_last_stable_offset_is_the_log_end_without_transactional_data(self, log: Log) -> None:
        """UnifiedLogTest.testFirstUnstableOffsetNoTransactionalData."""
        assert log.last_stable_offset == 0
        plain(log, 3)
        Producer(log, PID).send(2, transactional=False)
        assert log.last_stable_offset == log.log_end_offset == 5

    def test_last_stable_offset_completed_txn(self, log: Log) -> None:
        """ProducerStateManagerTest.testLastStableOffsetCompletedTxn: three transactions, completed 1, 3, 2.

        Kafka's offsets (start 992342, +25, +57) are shifted to a log starting at 0:
        the three transactions open at 0, 25 and 57.
        """
        p1, p2, p3 = Producer(log, PID), Producer(log, PID + 1), Producer(log, PID + 2)
        assert p1.send(1).first_offset == 0
        plain(log, 24)
        assert p2.send(1).first_offset == 25
        plain(log, 31)
        assert p3.send(1).first_offset == 57
        plain(log, 15)
        assert log.last_stable_offset == 0
        p1.commit()
        assert log.last_stable_offset == 25
        p3.commit()
        assert log.last_stable_offset == 25
        p2.commit()
        assert log.last_stable_offset == log.log_end_offset == 76

    def test_last_stable_offset_with_mixed_producer_data(self, log: Log) -> None:
        """UnifiedLogTest.testLastStableOffsetWithMixedProducerData (pids 137 and 983, epoch 5)."""
        p1, p2 = Producer(log, 137, epoch=5), Producer(log, 983, epoch=5)
        first = p1.send(3)
        assert log.last_stable_offset == first.first_offset == 0
        plain(log, 3)
        second = p2.send(3)
        assert log.last_stable_offset == 0
        p1.abort()
        assert log.last_stable_offset == second.first_offset == 6
        p2.commit()
        assert log.last_stable_offset == log.log_end_offset == 11

    def test_first_unstable_offset_with_two_producers(self, log: Log) -> None:
        """ProducerStateManagerTest.testFirstUnstableOffset (99 and 105 shifted to 0 and 6)."""
        p1, p2 = Producer(log, PID, epoch=5), Producer(log, 2, epoch=5)
        p1.send(1)
        plain(log, 5)
        p2.send(1)
        assert log.last_stable_offset == 0
        p1.commit()
        assert log.last_stable_offset == 6
        p2.abort()
        assert log.last_stable_offset == log.log_end_offset == 9

    def test_records_deleted_under_an_open_transaction_move_the_last_stable_offset_to_the_start(
        self, log: Log, log_dir: Path
    ) -> None:
        """Kafka's first unstable offset never stays below the log start (UnifiedLog): a
        read_committed reader sent there would find nothing (found by red-teaming)."""
        plain(log, 1)
        producer = Producer(log, PID)
        assert producer.send(1).first_offset == 1
        plain(log, 5)
        assert log.delete_records(4) == 4
        assert log.last_stable_offset == 4
        assert log.read(4, 1 << 20, isolation="read_committed").batches == []  # stops at the open one
        log.close()
        with open_log(log_dir) as reopened:
            assert reopened.last_stable_offset == 4
            Producer(reopened, PID, seq=1).commit()
            assert reopened.last_stable_offset == reopened.log_end_offset

    def test_skip_empty_transactions(self, log: Log, log_dir: Path) -> None:
        """ProducerStateManagerTest.testSkipEmptyTransactions, at Kafka's offsets 16..31.

        Markers for a producer with no open transaction are written but complete
        nothing: no index entry, and the LSO stays at the log end.
        """
        plain(log, 16)  # 0..15, so the offsets below are Kafka's
        producer = Producer(log, PID)
        assert producer.send(5).first_offset == 16  # 16..20
        assert log.last_stable_offset == 16
        assert producer.commit().first_offset == 21  # completes 16..21
        assert log.last_stable_offset == 22
        assert producer.commit().first_offset == 22  # empty
        assert log.last_stable_offset == 23
        assert producer.abort().first_offset == 23  # empty: no index entry
        assert log.last_stable_offset == 24
        assert all_aborted(log_dir) == []
        assert producer.send(4).first_offset == 24  # 24..27
        assert log.last_stable_offset == 24
        assert producer.abort().first_offset == 28  # aborts 24..28
        assert log.last_stable_offset == 29
        assert producer.abort().first_offset == 29  # empty
        assert log.last_stable_offset == 30
        assert producer.send(2).first_offset == 30  # 30..31, still open
        assert log.last_stable_offset == 30
        assert txn_first_offset(log, PID) == 30
        assert all_aborted(log_dir) == [(PID, 24, 28, 29)]
        fetched = log.read(0, READ_ALL, isolation=COMMITTED)
        assert aborted_of(fetched) == [(PID, 24)]
        assert [r.offset for r in fetched.records()] == list(range(21))

    def test_two_producers_interleaved_give_the_exact_lso_after_every_step(self, log: Log) -> None:
        """UnifiedLogTest.testTransactionIndexUpdated's sequence (its firstUnstableOffset checks)."""
        trace = kafka_mixed_transactions(log)
        assert [end for end, _ in trace] == MIXED_LOG_END_AFTER_EACH_STEP
        assert [lso for _, lso in trace] == MIXED_LSO_AFTER_EACH_STEP

    def test_producers_with_ongoing_transactions_dont_expire(self, log_dir: Path) -> None:
        """ProducerStateManagerTest.testProducersWithOngoingTransactionsDontExpire."""
        expiration = 1000
        with open_log(log_dir, LogConfig(producer_expiration_ms=expiration, segment_index_bytes=4096)) as log:
            Producer(log, PID, epoch=5).send(1)
            Producer(log, 2, epoch=5).send(1, transactional=False)
            assert log.expire_producers(T0 + expiration + 1) == 1  # only the idle non-transactional one
            assert log.producer_state(2) is None
            assert txn_first_offset(log, PID) == 0
            assert log.last_stable_offset == 0
            log.expire_producers(T0 + 10 * expiration)
            assert txn_first_offset(log, PID) == 0
            # Once the transaction is closed, the producer expires like any other.
            log.write_txn_marker(PID, 5, commit=True, coordinator_epoch=0)
            assert log.expire_producers(T0 + 100 * expiration) == 1
            assert log.producer_state(PID) is None

    def test_a_full_producer_table_never_evicts_a_producer_with_an_open_transaction(
        self, log_dir: Path
    ) -> None:
        """Brief §6: a full ring of live producers refuses a new one; open transactions keep theirs live."""
        expiration = 1000
        config = LogConfig(producer_expiration_ms=expiration, producer_capacity=2, segment_index_bytes=4096)
        now = [T0]
        with Log.open(log_dir, config, clock=lambda: now[0]) as log:
            Producer(log, PID_1).send(1)
            Producer(log, PID_2).send(1)
            now[0] = T0 + 10 * expiration  # both idle long past expiry, both in a transaction
            with pytest.raises(ProducerStateFullError):
                Producer(log, PID_3).send(1)
            assert txn_first_offset(log, PID_1) == 0
            assert txn_first_offset(log, PID_2) == 1
            log.write_txn_marker(PID_1, 0, commit=True, coordinator_epoch=0)  # its row is now idle...
            now[0] += 10 * expiration
            assert Producer(log, PID_3).send(1, transactional=False).first_offset == 3  # ...and makes room
            assert log.producer_state(PID_1) is None
            assert txn_first_offset(log, PID_2) == 1
            assert log.last_stable_offset == 1

    def test_an_open_transaction_survives_expiry_at_reopen(self, tmp_path: Path, log_dir: Path) -> None:
        """Loading expires idle producers (Kafka's removeExpiredProducers on load), never one with a txn.

        After a clean close the snapshot knows when each producer was last appended. After
        a crash the tail's producers are replayed, and their append time is the load's (the
        latest it could have been): they expire one expiration after the load.
        """
        expiration = 1000
        config = LogConfig(producer_expiration_ms=expiration, segment_index_bytes=4096)
        live = open_log(log_dir, config)
        try:
            Producer(live, PID).send(2)
            Producer(live, 2).send(1, transactional=False)
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        later = T0 + 10 * expiration
        for directory, idle_kept in ((log_dir, False), (crashed, True)):
            with Log.open(directory, config, clock=lambda: later) as reopened:
                assert (reopened.producer_state(2) is not None) == idle_kept
                assert reopened.expire_producers(later + expiration) == int(idle_kept)
                assert reopened.producer_state(2) is None
                assert txn_first_offset(reopened, PID) == 0
                assert reopened.last_stable_offset == 0


# ==========================================================================================
class TestReadCommitted:
    def test_read_committed_returns_exactly_the_committed_and_non_transactional_records(
        self, log: Log
    ) -> None:
        """Kafka's mixed sequence, read by a read_committed consumer (CompletedFetch filtering)."""
        kafka_mixed_transactions(log)
        fetched = log.read(0, READ_ALL, isolation=COMMITTED)
        assert aborted_of(fetched) == [(PID_1, 0), (PID_2, 8)]
        records = list(fetched.records())
        assert [r.offset for r in records] == MIXED_COMMITTED
        assert all(not r.key.startswith((b"p1e", b"p2e")) for r in records if r.key is not None)

    def test_read_committed_at_every_step_of_two_interleaved_producers(self, log: Log) -> None:
        """The aborted list and the visible records after each step of Kafka's mixed sequence."""
        p1, p2 = Producer(log, PID_1), Producer(log, PID_2)

        def check(lso: int, aborted: list[tuple[int, int]], visible: list[int]) -> None:
            assert log.last_stable_offset == lso
            fetched = log.read(0, READ_ALL, isolation=COMMITTED)
            assert aborted_of(fetched) == aborted
            assert [r.offset for r in fetched.records()] == visible
            assert all(b.last_offset < lso for b in fetched.batches)

        p1.send(3)  # 0..2
        check(0, [], [])
        plain(log, 2)  # 3..4
        check(0, [], [])
        p2.send(2)  # 5..6
        check(0, [], [])
        p1.send(1)  # 7
        p1.abort()  # 8
        check(5, [(PID_1, 0)], [3, 4])
        plain(log, 1)  # 9
        check(5, [(PID_1, 0)], [3, 4])
        p2.send(2)  # 10..11
        p2.commit()  # 12
        check(13, [(PID_1, 0)], [3, 4, 5, 6, 9, 10, 11])
        p1.send(2)  # 13..14: a second transaction of pid1
        check(13, [(PID_1, 0)], [3, 4, 5, 6, 9, 10, 11])
        p1.commit()  # 15
        check(16, [(PID_1, 0)], [3, 4, 5, 6, 9, 10, 11, 13, 14])
        assert all_aborted(Path(log.directory)) == [(PID_1, 0, 8, 5)]

    def test_fetch_up_to_last_stable_offset(self, log: Log) -> None:
        """UnifiedLogTest.testFetchUpToLastStableOffset: data below the LSO, none at or past it."""
        p1, p2 = Producer(log, PID_1), Producer(log, PID_2)
        p1.send(5)
        plain(log, 3)
        p2.send(2)
        p1.send(4)
        plain(log, 2)
        p1.send(10)

        def assert_lso_bounded_fetches() -> None:
            lso, end = log.last_stable_offset, log.log_end_offset
            for offset in range(log.log_start_offset, lso):
                fetched = log.read(offset, READ_ALL, isolation=COMMITTED)
                assert fetched.batches, f"empty read_committed fetch at {offset} below the LSO {lso}"
                assert all(b.last_offset < lso for b in fetched.batches)
            for offset in range(lso, end + 1):
                fetched = log.read(offset, READ_ALL, isolation=COMMITTED)
                assert fetched.batches == [], f"read_committed fetch at {offset} returned data past the LSO"
                assert list(fetched.records()) == []

        assert_lso_bounded_fetches()
        p1.commit()
        assert log.last_stable_offset == 8
        assert_lso_bounded_fetches()
        p2.abort()
        assert log.last_stable_offset == log.log_end_offset == 28
        assert_lso_bounded_fetches()

    def test_read_uncommitted_is_the_default_and_returns_every_batch_including_markers(
        self, log: Log
    ) -> None:
        kafka_mixed_transactions(log)
        default = log.read(0, READ_ALL)
        explicit = log.read(0, READ_ALL, isolation=UNCOMMITTED)
        for fetched in (default, explicit):
            assert fetched.next_offset == 90
            offsets = [(b.base_offset, b.last_offset) for b in fetched.batches]
            assert offsets[0][0] == 0 and offsets[-1][1] == 89
            assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(offsets))
            markers = [b.base_offset for b in fetched.batches if b.is_control]
            assert markers == [29, 58, 74, 89]

    def test_aborted_transaction_spanning_multiple_segments(self, log_dir: Path) -> None:
        """UnifiedLogTest.testAbortedTransactionSpanningMultipleSegments (pid 137, epoch 5)."""
        config = LogConfig(segment_index_bytes=4096, segment_bytes=1024)
        with open_log(log_dir, config) as log:
            producer = Producer(log, 137, epoch=5)
            producer.send(3)
            assert log.last_stable_offset == 0
            # Fill the segment so the next batch spills into a second one, as Kafka's
            # segmentBytes = records.sizeInBytes does.
            while log.active_segment.base_offset == 0:
                producer.send(3)
            assert log.last_stable_offset == 0
            abort = producer.abort()
            assert abort.first_offset > segment_bases(log_dir)[-1] > 0
            assert log.last_stable_offset == log.log_end_offset == abort.last_offset + 1
            _, records, aborted = read_through(log, COMMITTED)
            assert aborted == [(137, 0)]
            assert records == []
            fetched = log.read(0, 2048, isolation=COMMITTED)
            assert aborted_of(fetched) == [(137, 0)]
            assert list(fetched.records()) == []

    def test_a_fetch_starting_inside_an_aborted_transaction_still_reports_it(self, log_dir: Path) -> None:
        """TransactionIndex.collectAbortedTxns: lastOffset >= fetch offset and firstOffset < upper bound."""
        with open_log(log_dir) as log:
            kafka_mixed_transactions(log, roll=True)
            assert segment_bases(log_dir) == MIXED_ROLLED_BASES
            fetched = log.read(30, READ_ALL, isolation=COMMITTED)  # the second segment, 30..58
            assert fetched.next_offset >= 59
            assert (PID_2, 8) in aborted_of(fetched)
            assert (PID_1, 0) not in aborted_of(fetched)  # it ended at 29
            expected = [o for o in MIXED_COMMITTED if 30 <= o < fetched.next_offset]
            assert [r.offset for r in fetched.records()] == expected

    def test_a_producers_non_transactional_data_before_its_aborted_transaction_stays_visible(
        self, log: Log
    ) -> None:
        """CompletedFetch skips only transactional batches, from the aborted txn's first offset on."""
        producer = Producer(log, PID)
        producer.send(2, transactional=False)  # 0..1
        producer.send(2)  # 2..3
        producer.abort()  # 4
        producer.send(1, transactional=False)  # 5
        fetched = log.read(0, READ_ALL, isolation=COMMITTED)
        assert aborted_of(fetched) == [(PID, 2)]
        assert [r.offset for r in fetched.records()] == [0, 1, 5]

    def test_a_fetch_cut_short_by_max_bytes_still_reports_the_aborted_transaction_it_overlaps(
        self, log: Log
    ) -> None:
        """TransactionIndex.collectAbortedTxns on the fetched range: pid1's batch 0..4 alone."""
        kafka_mixed_transactions(log)
        first_size = log.read(0, READ_ALL).batches[0].size
        fetched = log.read(0, first_size, isolation=COMMITTED)
        assert [(b.base_offset, b.last_offset) for b in fetched.batches] == [(0, 4)]
        assert (PID_1, 0) in aborted_of(fetched)
        assert list(fetched.records()) == []
        assert fetched.next_offset == 5

    def test_no_read_committed_read_returns_data_of_an_open_transaction(self, log: Log) -> None:
        plain(log, 2)
        Producer(log, PID).send(3)  # 2..4, open
        plain(log, 2)  # 5..6
        fetched = log.read(0, READ_ALL, isolation=COMMITTED)
        assert [r.offset for r in fetched.records()] == [0, 1]
        assert fetched.next_offset == 2
        assert log.read(5, READ_ALL, isolation=COMMITTED).batches == []


# ==========================================================================================
class TestTransactionIndex:
    def test_transaction_index_updated(self, log: Log, log_dir: Path) -> None:
        """UnifiedLogTest.testTransactionIndexUpdated: one segment holds both entries."""
        kafka_mixed_transactions(log)
        assert txn_index_files(log_dir) == {0: MIXED_ABORTED}

    def test_each_entry_goes_to_the_txnindex_of_the_segment_holding_its_marker(self, log_dir: Path) -> None:
        """Kafka writes an aborted transaction into the active segment's index when its marker is appended."""
        with open_log(log_dir) as log:
            kafka_mixed_transactions(log, roll=True)
            assert segment_bases(log_dir) == MIXED_ROLLED_BASES
            files = txn_index_files(log_dir)
            assert files.get(0) == [MIXED_ABORTED[0]]
            assert files.get(30, []) == []
            assert files.get(59) == [MIXED_ABORTED[1]]
            raw = (log_dir / f"{0:020d}.txnindex").read_bytes()
            assert raw == TXN_ENTRY.pack(0, *MIXED_ABORTED[0])

    def test_commits_and_empty_aborts_add_no_entry(self, log: Log, log_dir: Path) -> None:
        producer = Producer(log, PID)
        producer.send(1)
        producer.commit()
        producer.abort()
        log.write_txn_marker(99, 0, commit=False, coordinator_epoch=0)  # a producer never seen
        assert all_aborted(log_dir) == []

    def test_the_index_survives_a_clean_close(self, log_dir: Path) -> None:
        with open_log(log_dir) as log:
            kafka_mixed_transactions(log, roll=True)
        with open_log(log_dir) as reopened:
            assert reopened.recovery_report.clean
            assert all_aborted(log_dir) == MIXED_ABORTED
            assert committed_offsets(reopened) == MIXED_COMMITTED

    def test_transaction_index_updated_through_replication(self, log: Log, log_dir: Path) -> None:
        """UnifiedLogTest.testTransactionIndexUpdatedThroughReplication: the same sequence as a follower."""
        leader = [
            leader_batch(5, 0, pid=PID_1, seq=0),
            leader_batch(3, 5),
            leader_batch(2, 8, pid=PID_2, seq=0),
            leader_batch(4, 10, pid=PID_1, seq=5),
            leader_batch(3, 14, pid=PID_3, seq=0),
            leader_batch(2, 17),
            leader_batch(10, 19, pid=PID_1, seq=9),
            marker_batch(PID_1, 0, commit=False, base_offset=29),
            leader_batch(6, 30, pid=PID_2, seq=2),
            leader_batch(3, 36, pid=PID_4, seq=0),
            leader_batch(10, 39),
            leader_batch(9, 49, pid=PID_3, seq=3),
            marker_batch(PID_3, 0, commit=True, base_offset=58),
            leader_batch(8, 59, pid=PID_4, seq=3),
            leader_batch(7, 67, pid=PID_2, seq=8),
            marker_batch(PID_2, 0, commit=False, base_offset=74),
            leader_batch(10, 75),
            leader_batch(4, 85, pid=PID_4, seq=11),
            marker_batch(PID_4, 0, commit=True, base_offset=89),
        ]
        log.append_batches(leader, origin="replication")
        assert log.log_end_offset == 90
        assert all_aborted(log_dir) == MIXED_ABORTED
        assert log.last_stable_offset == 90
        assert committed_offsets(log) == MIXED_COMMITTED

    def test_append_to_transaction_index_failure(self, tmp_path: Path, log_dir: Path) -> None:
        """UnifiedLogTest.testAppendToTransactionIndexFailure: the log fails closed, reopening repairs it.

        Kafka writes the marker (log end 11), fails on the index, keeps the LSO at 0,
        refuses further appends, and after an unclean reopen has the entry and no
        unstable offset. oncelog may order the writes differently, so after the
        reopen either the marker is there with its entry, or neither is.
        """
        fs = TxnIndexWriteFailingFileSystem()
        failing = Log.open(log_dir, CONFIG, fs=fs, clock=lambda: T0)
        try:
            producer = Producer(failing, PID)
            producer.send(10)
            fs.armed = True
            with pytest.raises(LogFailedError):
                producer.abort(coordinator_epoch=1)
            assert failing.log_end_offset in (10, 11)
            assert failing.last_stable_offset == 0
            with pytest.raises(LogFailedError):
                producer.abort(coordinator_epoch=1)
            with pytest.raises(LogFailedError):
                plain(failing, 1)
            assert failing.last_stable_offset == 0
        finally:
            with contextlib.suppress(LogFailedError):
                failing.close()  # Kafka's close throws too; the next open recovers
        with open_log(log_dir) as reopened:
            assert not reopened.recovery_report.clean
            if reopened.log_end_offset == 11:
                assert all_aborted(log_dir) == [(PID, 0, 10, 11)]
                assert reopened.last_stable_offset == 11
            else:
                assert reopened.log_end_offset == 10
                assert all_aborted(log_dir) == []
                assert reopened.last_stable_offset == 0
            assert committed_offsets(reopened) == []


# ==========================================================================================
class TestTransactionRecovery:
    @pytest.mark.parametrize("reload", ["clean-close", "crash-image"])
    def test_recover_from_snapshot_unfinished_transaction(
        self, tmp_path: Path, log_dir: Path, reload: str
    ) -> None:
        """ProducerStateManagerTest.testRecoverFromSnapshotUnfinishedTransaction.

        The roll writes a snapshot at 2 while the transaction (from 0) is open; nothing
        follows it, so the reopened state comes from a snapshot alone.
        """
        live = open_log(log_dir)
        try:
            producer = Producer(live, PID)
            producer.send(1)
            producer.send(1)
            live.roll()
            if reload == "crash-image":
                reopened_dir = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        if reload == "clean-close":
            reopened_dir = log_dir
        with open_log(reopened_dir) as reopened:
            assert reopened.recovery_report.snapshot_offset == 2
            assert reopened.recovery_report.batches_replayed == 0
            entry = reopened.producer_state(PID)
            assert entry is not None
            assert (entry.last_sequence, entry.last_offset) == (1, 1)
            assert entry.current_txn_first_offset == 0
            assert reopened.last_stable_offset == 0
            # The transaction goes on after recovery, and still ends as one.
            assert reopened.append(
                data_batch(1, pid=PID, epoch=0, seq=2, transactional=True)
            ) == AppendResult(2, 2)
            reopened.write_txn_marker(PID, 0, commit=False, coordinator_epoch=0)
            assert reopened.last_stable_offset == reopened.log_end_offset == 4
            fetched = reopened.read(2, READ_ALL, isolation=COMMITTED)
            assert aborted_of(fetched) == [(PID, 0)]
            assert all_aborted(reopened_dir) == [(PID, 0, 3, 4)]

    @pytest.mark.parametrize("reload", ["clean-close", "crash-image"])
    def test_recover_from_snapshot_finished_transaction(
        self, tmp_path: Path, log_dir: Path, reload: str
    ) -> None:
        """ProducerStateManagerTest.testRecoverFromSnapshotFinishedTransaction (abort, snapshot at 3)."""
        live = open_log(log_dir)
        try:
            producer = Producer(live, PID)
            producer.send(1)
            producer.send(1)
            producer.abort()
            live.roll()
            if reload == "crash-image":
                reopened_dir = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        if reload == "clean-close":
            reopened_dir = log_dir
        with open_log(reopened_dir) as reopened:
            assert reopened.recovery_report.snapshot_offset == 3
            entry = reopened.producer_state(PID)
            assert entry is not None
            assert (entry.last_sequence, entry.last_offset) == (1, 1)
            assert entry.current_txn_first_offset == -1
            assert reopened.last_stable_offset == reopened.log_end_offset == 3
            assert all_aborted(reopened_dir) == [(PID, 0, 2, 3)]
            _, records, aborted = read_through(reopened, COMMITTED)
            assert (records, aborted) == ([], [(PID, 0)])

    def test_recover_from_snapshot_empty_transaction(self, tmp_path: Path, log_dir: Path) -> None:
        """ProducerStateManagerTest.testRecoverFromSnapshotEmptyTransaction: a marker-only producer."""
        live = open_log(log_dir)
        try:
            live.write_txn_marker(PID, 0, commit=False, coordinator_epoch=0)
            live.roll()
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        with open_log(crashed) as reopened:
            entry = reopened.producer_state(PID)
            assert entry is not None
            assert (entry.last_timestamp_ms, entry.last_append_ms) == (T0, T0)
            assert entry.current_txn_first_offset == -1
            assert reopened.last_stable_offset == reopened.log_end_offset == 1

    def test_rebuild_transactional_state(self, tmp_path: Path, log_dir: Path) -> None:
        """UnifiedLogTest.testRebuildTransactionalState: an aborted txn replayed after an unclean stop."""
        live = open_log(log_dir)
        try:
            producer = Producer(live, 137, epoch=5)
            producer.send(3)
            producer.abort()
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        with open_log(crashed) as reopened:
            assert not reopened.recovery_report.clean
            # Replayed from the start: no snapshot, or the empty one a new log writes at 0.
            assert reopened.recovery_report.snapshot_offset in (None, 0)
            assert reopened.recovery_report.batches_replayed == 2
            assert txn_first_offset(reopened, 137) == -1
            assert reopened.last_stable_offset == reopened.log_end_offset == 4
            assert all_aborted(crashed) == [(137, 0, 3, 4)]

    @pytest.mark.parametrize("snapshots", ["kept", "deleted"])
    def test_full_transaction_index_recovery(self, tmp_path: Path, log_dir: Path, snapshots: str) -> None:
        """LogLoaderTest.testFullTransactionIndexRecovery.

        Kafka deletes every index and reopens with recovery point 0 and an unclean
        shutdown. Here: every .txnindex is deleted, and so is the metadata store that
        holds the recovery point (as a Kafka partition directory has none), so the
        unclean open validates and replays every segment.
        """
        live = open_log(log_dir)
        try:
            kafka_mixed_transactions(live, roll=True)
            assert segment_bases(log_dir) == MIXED_ROLLED_BASES
            assert all_aborted(log_dir) == MIXED_ABORTED
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        for path in crashed.glob("*.txnindex"):
            path.unlink()
        if snapshots == "deleted":
            for path in crashed.glob("*.snapshot"):
                path.unlink()
        shutil.rmtree(crashed / METADATA_STORE)
        with open_log(crashed) as reopened:
            assert reopened.recovery_report.segments_scanned == 3
            assert all_aborted(crashed) == MIXED_ABORTED
            assert txn_index_files(crashed).get(0) == [MIXED_ABORTED[0]]
            assert txn_index_files(crashed).get(59) == [MIXED_ABORTED[1]]
            assert reopened.last_stable_offset == reopened.log_end_offset == 90
            _, records, aborted = read_through(reopened, COMMITTED)
            assert [r.offset for r in records] == MIXED_COMMITTED
            assert aborted == [(PID_1, 0), (PID_2, 8)]

    @pytest.mark.parametrize("snapshots", ["kept", "deleted"], ids=["only-last-segment", "no-snapshots"])
    def test_recover_last_segment(self, tmp_path: Path, log_dir: Path, snapshots: str) -> None:
        """LogLoaderTest.testRecoverOnlyLastSegment and testRecoverLastSegmentWithNoSnapshots.

        A crash image's recovery point is the last roll (59), so only the last segment
        is validated and its index rebuilt. Its entry (pid2 from 8, LSO 36) needs the
        transactions opened in earlier segments: from the snapshot at 59, or, with
        every snapshot deleted, from replaying the log from its start.
        """
        live = open_log(log_dir)
        try:
            kafka_mixed_transactions(live, roll=True)
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        (crashed / f"{59:020d}.txnindex").unlink(missing_ok=True)
        (crashed / f"{59:020d}.index").unlink(missing_ok=True)
        if snapshots == "deleted":
            for path in crashed.glob("*.snapshot"):
                path.unlink()
        with open_log(crashed) as reopened:
            report = reopened.recovery_report
            assert not report.clean
            assert report.segments_scanned == 1
            assert report.snapshot_offset == (59 if snapshots == "kept" else None)
            assert all_aborted(crashed) == MIXED_ABORTED
            assert reopened.last_stable_offset == 90
            assert committed_offsets(reopened) == MIXED_COMMITTED

    @pytest.mark.parametrize("snapshots", ["kept", "deleted"])
    def test_open_transactions_of_earlier_segments_are_recovered(
        self, tmp_path: Path, log_dir: Path, snapshots: str
    ) -> None:
        """A crash after the pid2 abort at 74, before pid4's commit: pid4's txn from 36 is open."""
        live = open_log(log_dir)
        try:
            p1, p2, p3, p4 = (Producer(live, pid) for pid in (PID_1, PID_2, PID_3, PID_4))
            kafka_prefix = [
                lambda: p1.send(5),
                lambda: plain(live, 3),
                lambda: p2.send(2),
                lambda: p1.send(4),
                lambda: p3.send(3),
                lambda: plain(live, 2),
                lambda: p1.send(10),
                lambda: p1.abort(),
                live.roll,
                lambda: p2.send(6),
                lambda: p4.send(3),
                lambda: plain(live, 10),
                lambda: p3.send(9),
                lambda: p3.commit(),
                live.roll,
                lambda: p4.send(8),
                lambda: p2.send(7),
                lambda: p2.abort(),
            ]
            for action in kafka_prefix:
                action()
            assert (live.log_end_offset, live.last_stable_offset) == (75, 36)
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        if snapshots == "deleted":
            for path in crashed.glob("*.snapshot"):
                path.unlink()
        with open_log(crashed) as reopened:
            assert reopened.last_stable_offset == 36
            assert txn_first_offset(reopened, PID_4) == 36
            assert txn_first_offset(reopened, PID_2) == -1
            assert all_aborted(crashed) == MIXED_ABORTED
            reopened.append(data_batch(4, pid=PID_4, epoch=0, seq=11, transactional=True))  # 75..78
            reopened.write_txn_marker(PID_4, 0, commit=True, coordinator_epoch=0)
            assert reopened.last_stable_offset == reopened.log_end_offset == 80

    def test_recover_after_non_monotonic_coordinator_epoch_write(self, tmp_path: Path, log_dir: Path) -> None:
        """LogLoaderTest.testRecoverAfterNonMonotonicCoordinatorEpochWrite (KAFKA-9144).

        The producer expires between two markers, so the second, from an older
        coordinator epoch, is accepted; replay must not refuse it and takes the latest.
        """
        expiration = 1000
        config = LogConfig(producer_expiration_ms=expiration, segment_index_bytes=4096)
        now = [T0]
        live = Log.open(log_dir, config, clock=lambda: now[0])
        try:
            live.write_txn_marker(PID, 0, commit=False, coordinator_epoch=5)
            entry = live.producer_state(PID)
            assert entry is not None and entry.last_append_ms == T0
            now[0] = T0 + expiration
            live.expire_producers()
            assert live.producer_state(PID) is None
            live.write_txn_marker(PID, 0, commit=False, coordinator_epoch=4)
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        # Full replay: no snapshot past the start.
        for path in crashed.glob("*.snapshot"):
            path.unlink()
        with Log.open(crashed, config, clock=lambda: T0 + expiration) as reopened:
            entry = reopened.producer_state(PID)
            assert entry is not None
            assert entry.last_timestamp_ms == T0 + expiration  # the second marker's
            assert entry.last_append_ms == T0 + expiration  # replayed: the load's time
            assert entry.coordinator_epoch == 4
            assert reopened.log_end_offset == 2

    def test_late_transaction_marker_after_truncation(self, tmp_path: Path, log_dir: Path) -> None:
        """ProducerStateManagerTest.testFirstUnstableOffsetAfterTruncation; recovery's cut truncates.

        Kafka truncates between a transaction's data and its marker and finds the
        transaction open again at its first offset (99). Here the marker is torn in a
        crash image, so recovery cuts it: the transaction is open again, the LSO is
        back at its first offset, the index has no entry, and the marker the
        coordinator sends again (late) closes it.
        """
        live = open_log(log_dir)
        try:
            plain(live, 3)  # 0..2
            producer = Producer(live, PID, epoch=5)
            producer.send(2)  # 3..4
            plain(live, 2)  # 5..6
            producer.send(1)  # 7
            marker = producer.abort(coordinator_epoch=3)  # 8
            assert marker.first_offset == 8
            assert live.last_stable_offset == 9
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        tear_batch_at(crashed, 8)
        with open_log(crashed) as reopened:
            assert reopened.recovery_report.truncated_bytes > 0
            assert reopened.log_end_offset == 8
            assert txn_first_offset(reopened, PID) == 3
            assert reopened.last_stable_offset == 3
            assert all_aborted(crashed) == []
            assert committed_offsets(reopened) == [0, 1, 2]
            # The late marker: written again, it closes the transaction.
            late = reopened.write_txn_marker(PID, 5, commit=False, coordinator_epoch=3)
            assert late.first_offset == 8
            assert reopened.last_stable_offset == reopened.log_end_offset == 9
            assert all_aborted(crashed) == [(PID, 3, 8, 9)]
            assert committed_offsets(reopened) == [0, 1, 2, 5, 6]

    def test_truncation_in_an_earlier_segment_drops_later_index_entries_and_reopens_their_transactions(
        self, tmp_path: Path, log_dir: Path
    ) -> None:
        """LogSegment.truncateTo cuts the txn index too; testFirstUnstableOffsetAfterTruncation.

        Transactions decided past the cut are open again (ProducerStateManagerTest).
        Without its recovery point (metadata store removed) the whole log is validated,
        and a torn batch at 19 in the first segment cuts everything from there: the
        pid1 abort at 29 and the later segments go, with their index entries.
        """
        live = open_log(log_dir)
        try:
            kafka_mixed_transactions(live, roll=True)
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        shutil.rmtree(crashed / METADATA_STORE)
        tear_batch_at(crashed, 19)
        with open_log(crashed) as reopened:
            assert reopened.log_end_offset == 19
            assert segment_bases(crashed) == [0]
            assert sorted(p.name for p in crashed.glob("*.txnindex")) in ([], [f"{0:020d}.txnindex"])
            assert all_aborted(crashed) == []
            assert txn_first_offset(reopened, PID_1) == 0
            assert txn_first_offset(reopened, PID_2) == 8
            assert txn_first_offset(reopened, PID_3) == 14
            assert reopened.producer_state(PID_4) is None
            assert reopened.last_stable_offset == 0
            # pid1's transaction is decided again, by a late marker.
            reopened.write_txn_marker(PID_1, 0, commit=False, coordinator_epoch=0)
            assert all_aborted(crashed) == [(PID_1, 0, 19, 8)]
            assert reopened.last_stable_offset == 8
            assert committed_offsets(reopened) == [5, 6, 7]

    def test_truncation_below_the_first_transactional_batch_forgets_the_transaction(
        self, tmp_path: Path, log_dir: Path
    ) -> None:
        """ProducerStateManagerTest.testHasLateTransactionUpdatedAfterPartialTruncation / UnifiedLogTest
        testTruncateBelowFirstUnstableOffset: cut below the txn's first offset, nothing is open."""
        live = open_log(log_dir)
        try:
            plain(live, 3)  # 0..2
            Producer(live, 17, epoch=10).send(2)  # 3..4, open
            assert live.last_stable_offset == 3
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        tear_batch_at(crashed, 3)
        with open_log(crashed) as reopened:
            assert reopened.log_end_offset == 3
            entry = reopened.producer_state(17)
            assert entry is None or entry.current_txn_first_offset == -1
            assert reopened.last_stable_offset == 3
            plain(reopened, 1)
            assert reopened.last_stable_offset == reopened.log_end_offset == 4

    def test_a_crash_between_data_and_marker_keeps_every_transaction_undecided(
        self, tmp_path: Path, log_dir: Path
    ) -> None:
        """The torture checker's invariant in one case: after a crash, read_committed shows no open data."""
        live = open_log(log_dir)
        try:
            kafka_mixed_transactions(live)
            p1 = Producer(live, PID_1, seq=19)
            p1.send(3)  # 90..92: a new transaction of pid1, open at the crash
            plain(live, 2)  # 93..94
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        with open_log(crashed) as reopened:
            assert reopened.last_stable_offset == 90
            assert committed_offsets(reopened) == MIXED_COMMITTED
            assert all_aborted(crashed) == MIXED_ABORTED


# ==========================================================================================
class TestCompatibility:
    @pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
    def test_control_batch_decodes_in_kafka_python(self, log: Log, commit: bool) -> None:
        """kafka-python's DefaultRecordBatch (an independent decoder) reads oncelog's marker."""
        Producer(log, PID, epoch=4).send(2)
        log.write_txn_marker(PID, 4, commit=commit, coordinator_epoch=9)
        [ours] = log.read(2, READ_ALL).batches
        theirs = DefaultRecordBatch(bytes(ours.buffer))
        assert theirs.validate_crc()
        assert theirs.is_control_batch
        assert theirs.is_transactional
        assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (PID, 4, -1)
        assert theirs.base_offset == 2
        [record] = list(theirs)
        assert record.offset == 2
        assert record.type == (COMMIT if commit else ABORT)
        assert (record.commit, record.abort) == (commit, not commit)
        assert record.version == 0
        assert record.key == CONTROL_KEY.pack(0, COMMIT if commit else ABORT)
        assert record.value == MARKER_VALUE.pack(0, 9)

    def test_a_kafka_v1_snapshot_with_an_open_transaction_restores_it(
        self, tmp_path: Path, log_dir: Path
    ) -> None:
        """Kafka's v1 snapshot entry carries CurrentTxnFirstOffset and CoordinatorEpoch (brief §3).

        The log's own snapshot at the roll is replaced by the Kafka layout of the same
        state, so the open transaction and the coordinator epoch can only come from it.
        """
        live = open_log(log_dir)
        try:
            plain(live, 1)  # 0
            Producer(live, 77, epoch=3).send(2)  # 1..2, open
            live.roll()  # snapshot at 3
            crashed = crash_image(log_dir, tmp_path / "crashed-0")
        finally:
            live.close()
        # pid, epoch, lastSeq, lastOffset, offsetDelta, timestamp, coordinatorEpoch, txnFirstOffset
        entry = struct.pack(">qhiqiqiq", 77, 3, 1, 2, 1, T0, 6, 1)
        body = struct.pack(">i", 1) + entry
        (crashed / f"{3:020d}.snapshot").write_bytes(struct.pack(">hI", 1, crc32c.crc32c(body)) + body)
        with open_log(crashed) as reopened:
            assert reopened.recovery_report.snapshot_offset == 3
            state = reopened.producer_state(77)
            assert state is not None
            assert (state.producer_epoch, state.last_sequence, state.last_offset) == (3, 1, 2)
            assert state.current_txn_first_offset == 1
            assert state.coordinator_epoch == 6
            assert reopened.last_stable_offset == 1
            with pytest.raises(TransactionCoordinatorFencedError):
                reopened.write_txn_marker(77, 3, commit=True, coordinator_epoch=5)
            reopened.write_txn_marker(77, 3, commit=False, coordinator_epoch=6)
            assert all_aborted(crashed) == [(77, 1, 3, 4)]
            assert committed_offsets(reopened) == [0]

    @pytest.mark.parametrize(
        "fixture",
        sorted(kafka_fixtures_root().glob("*/__cluster_metadata-0")),
        ids=lambda p: p.parent.name,
    )
    def test_fixture_control_batches_load_and_read_committed_reads_all_of_them(
        self, tmp_path: Path, fixture: Path
    ) -> None:
        """The KRaft metadata logs hold control batches (leader change, no producer) that are not markers."""
        copy = tmp_path / fixture.name
        shutil.copytree(fixture, copy)
        for path in [copy, *copy.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
        expected: list[int] = []
        control_batches = 0
        for log_file in sorted(fixture.glob("*.log")):
            data = log_file.read_bytes()
            position = 0
            while position + 12 <= len(data):
                size = int.from_bytes(data[position + LENGTH_AT : position + LENGTH_AT + 4], "big") + 12
                theirs = DefaultRecordBatch(data[position : position + size])
                if theirs.is_control_batch:
                    control_batches += 1
                else:
                    expected.extend(record.offset for record in theirs)
                position += size
        assert control_batches >= 1
        with Log.open(copy) as log:
            assert log.last_stable_offset == log.log_end_offset
            _, records, aborted = read_through(log, COMMITTED)
            assert aborted == []
            assert [r.offset for r in records] == expected


def test_a_lost_time_index_of_a_sealed_segment_keeps_its_aborted_transactions_out_of_reads(
    tmp_path: Path, log_dir: Path
) -> None:
    """Rebuilding a sealed segment's offset and time indexes on first use must not empty
    its transaction index: read_committed would serve the aborted data."""
    config = LogConfig(segment_index_bytes=4096, segment_bytes=1024)
    with open_log(log_dir, config) as log:
        producer = Producer(log, PID)
        producer.send(2)
        producer.abort()
        for n in range(12):
            log.append(encode_batch([(b"k", b"filler-%d" % n * 20)], timestamp_ms=T0))
        assert len(log.segments) > 1
    first = sorted(log_dir.glob("*.timeindex"))[0]
    first.unlink()  # an operator's mistake: the first use rebuilds the segment's indexes
    with open_log(log_dir, config) as reopened:
        fetched = reopened.read(0, READ_ALL, isolation=COMMITTED)
        aborted_keys = [
            r.key for r in fetched.records() if r.key is not None and r.key.startswith(b"p%d" % PID)
        ]
        assert aborted_keys == []
        assert fetched.aborted_transactions


def test_open_transactions_names_each_producer_with_one_open_and_its_first_offset(log_dir: Path) -> None:
    with open_log(log_dir) as log:
        first, second = Producer(log, 7), Producer(log, 8)
        plain(log, 2)
        first.send(1)
        second.send(2)
        first.send(1)
        assert log.open_transactions() == {7: 2, 8: 3}
        first.commit()
        assert log.open_transactions() == {8: 3}
        second.abort()
        assert log.open_transactions() == {}


def test_a_marker_is_the_bytes_encode_txn_marker_makes_and_rolls_where_a_batch_would(log_dir: Path) -> None:
    """A marker takes the single-batch route (one header, one copy) unless it rolls the segment
    or the log stamps LogAppendTime: the stored bytes and the state are the same either way."""
    config = LogConfig(segment_index_bytes=4096, segment_bytes=1024)
    with open_log(log_dir, config) as log:
        producer = Producer(log, PID, epoch=3)
        producer.send(2)
        marker = producer.commit(coordinator_epoch=5)
        (stored,) = log.read(marker.first_offset, READ_ALL).batches
        expected = encode_txn_marker(PID, 3, commit=True, coordinator_epoch=5, timestamp_ms=T0)
        assert bytes(stored.buffer)[8:] == expected[8:]  # (past the base offset)
        assert stored.base_offset == marker.first_offset == marker.last_offset == 2
        assert log.last_stable_offset == log.log_end_offset == 3
        # Filled to within a marker of the roll: the next marker starts a segment, as a batch would.
        producer.send(1)
        while log.active_segment.size + len(expected) <= config.segment_bytes:
            plain(log, 1)
        aborted = producer.abort(coordinator_epoch=5)
        assert log.active_segment.base_offset == aborted.first_offset
        assert log.last_stable_offset == log.log_end_offset == aborted.last_offset + 1
        assert aborted_of(log.read(0, READ_ALL, isolation=COMMITTED)) == [(PID, 3)]
    with open_log(log_dir, config) as reopened:  # the index entries and snapshot agree on reopen
        assert reopened.last_stable_offset == reopened.log_end_offset
        assert aborted_of(reopened.read(0, READ_ALL, isolation=COMMITTED)) == [(PID, 3)]
    appended_at = LogConfig(segment_index_bytes=4096, timestamp_type="LogAppendTime")
    with open_log(log_dir.with_name("append-time"), appended_at) as log:
        producer = Producer(log, PID)
        producer.send(1)
        assert producer.commit().log_append_time_ms == T0
