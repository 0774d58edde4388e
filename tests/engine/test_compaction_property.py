"""Compaction as a state machine (issue 33's property test), checked against a plain model.

Random keyed appends and tombstones from two idempotent producers, a transactional
producer committing and aborting, retries of recent batches, rolls, cleaning passes at a
moving clock, clean reopens and crashes (a copy of the directory as a kill -9 leaves it).
After every step:

- a read_committed reader that folds the log in offset order (a tombstone deletes its key)
  ends with exactly the model's committed state below the last stable offset: every live
  key's newest value, and no key whose newest record is a tombstone;
- no aborted value is ever seen by read_committed;
- offsets increase and the log end never moves back;
- a retry of any of a producer's last 5 batches is answered as a duplicate with the
  offsets it was first given.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from oncelog import Log, LogConfig
from oncelog.segments.batch import encode_batch

KEYS = [b"a", b"b", b"c", b"d", b"e", b"f"]
IDEMPOTENT = (1000, 1001)
TRANSACTIONAL = 2000
DELETE_RETENTION_MS = 1_000
CONFIG = LogConfig(
    cleanup_policy="compact",
    segment_bytes=1024,
    delete_retention_ms=DELETE_RETENTION_MS,
    retention_ms=None,
)


@dataclass
class Entry:
    offset: int
    key: bytes
    value: bytes | None
    status: str  # "committed", "open" (in a transaction not yet ended) or "aborted"


@dataclass
class Sent:
    """A batch as first appended: its bytes and the offsets it was given."""

    data: bytes
    first: int
    last: int


@dataclass
class Producer:
    sequence: int = 0
    recent: list[Sent] = field(default_factory=list)  # the last 5


class CompactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="compaction-"))
        self.generation = itertools.count()
        self.now_ms = 1_000_000
        self.directory = self.root / "log-0"
        self.log = Log.open(self.directory, CONFIG, clock=lambda: self.now_ms)
        self.entries: list[Entry] = []
        self.producers = {pid: Producer() for pid in (*IDEMPOTENT, TRANSACTIONAL)}
        self.txn_first: int | None = None
        self.values = itertools.count()
        self.end = 0

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- appends ---------------------------------------------------------------------------
    def _append(self, pid: int, records: list[tuple[bytes, bytes | None]], *, transactional: bool) -> None:
        producer = self.producers[pid]
        data = encode_batch(
            records,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=producer.sequence,
            is_transactional=transactional,
            timestamp_ms=self.now_ms,
        )
        result = self.log.append(data)
        assert not result.duplicate
        producer.sequence += len(records)
        producer.recent = [*producer.recent, Sent(data, result.first_offset, result.last_offset)][-5:]
        status = "open" if transactional else "committed"
        for n, (key, value) in enumerate(records):
            self.entries.append(Entry(result.first_offset + n, key, value, status))
        if transactional and self.txn_first is None:
            self.txn_first = result.first_offset

    def _records(
        self, draw_keys: list[int], tombstones: list[bool], tag: str
    ) -> list[tuple[bytes, bytes | None]]:
        return [
            (KEYS[k], None if dead else f"{tag}-{next(self.values)}".encode())
            for k, dead in zip(draw_keys, tombstones, strict=False)
        ]

    @rule(
        pid=st.sampled_from(IDEMPOTENT),
        keys=st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=4),
        tombstones=st.lists(st.booleans(), min_size=4, max_size=4),
    )
    def append(self, pid: int, keys: list[int], tombstones: list[bool]) -> None:
        self._append(
            pid,
            self._records(keys, [t and n == 0 for n, t in enumerate(tombstones)], "v"),
            transactional=False,
        )

    @rule(keys=st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=3), tombstone=st.booleans())
    def append_in_transaction(self, keys: list[int], tombstone: bool) -> None:
        self._append(TRANSACTIONAL, self._records(keys, [tombstone] + [False] * 3, "txn"), transactional=True)

    @precondition(lambda self: self.txn_first is not None)
    @rule(commit=st.booleans())
    def end_transaction(self, commit: bool) -> None:
        self.log.write_txn_marker(TRANSACTIONAL, 0, commit=commit, coordinator_epoch=0)
        for entry in self.entries:
            if entry.status == "open":
                entry.status = "committed" if commit else "aborted"
        self.txn_first = None

    @rule(pid=st.sampled_from((*IDEMPOTENT, TRANSACTIONAL)), which=st.integers(0, 4))
    def retry(self, pid: int, which: int) -> None:
        recent = self.producers[pid].recent
        if not recent:
            return
        sent = recent[which % len(recent)]
        result = self.log.append(sent.data)
        assert result.duplicate, (pid, sent.first, result)
        assert (result.first_offset, result.last_offset) == (sent.first, sent.last)

    # -- time, rolls, cleaning, reopening ------------------------------------------------------
    @rule(ms=st.sampled_from([10, 400, DELETE_RETENTION_MS + 1]))
    def tick(self, ms: int) -> None:
        self.now_ms += ms

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def clean(self) -> None:
        self.log.clean()

    @rule()
    def clean_twice_across_the_delete_horizon(self) -> None:
        self.log.roll()
        self.log.clean()  # the first pass to see a tombstone or marker gives it its horizon
        self.now_ms += DELETE_RETENTION_MS
        self.log.clean()  # the horizon has passed: it may go

    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.log = Log.open(self.directory, CONFIG, clock=lambda: self.now_ms)

    @rule()
    def crash(self) -> None:
        image = self.root / f"log-{next(self.generation) + 1}"
        shutil.copytree(self.directory, image)  # every file as the page cache holds it
        (image / ".clean_shutdown").unlink(missing_ok=True)
        self.log.close()
        self.directory = image
        self.log = Log.open(self.directory, CONFIG, clock=lambda: self.now_ms)

    # -- what must hold ------------------------------------------------------------------------
    def _committed_view(self) -> tuple[dict[bytes, bytes], list[bytes]]:
        """The fold of a read_committed reader from the log start, and every value it saw."""
        state: dict[bytes, bytes] = {}
        seen: list[bytes] = []
        offset, previous = self.log.log_start_offset, -1
        while True:
            fetched = self.log.read(offset, 1 << 20, isolation="read_committed")
            if not fetched.batches:
                return state, seen
            for record in fetched.records():
                assert record.offset > previous, (record.offset, previous)
                previous = record.offset
                assert record.key is not None
                if record.value is None:
                    state.pop(record.key, None)
                else:
                    state[record.key] = record.value
                    seen.append(record.value)
            offset = fetched.next_offset

    @invariant()
    def a_reader_sees_the_newest_committed_value_of_every_key(self) -> None:
        stable = self.log.last_stable_offset
        expected: dict[bytes, bytes] = {}
        for entry in self.entries:
            if entry.status != "committed" or entry.offset >= stable:
                continue
            if entry.value is None:
                expected.pop(entry.key, None)
            else:
                expected[entry.key] = entry.value
        state, seen = self._committed_view()
        assert state == expected
        aborted = {e.value for e in self.entries if e.status == "aborted" and e.value is not None}
        assert not aborted.intersection(seen)

    @invariant()
    def the_log_end_never_moves_back(self) -> None:
        assert self.log.log_end_offset >= self.end
        self.end = self.log.log_end_offset


CompactionMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
test_compaction_keeps_the_newest_committed_value_and_every_producer_window = CompactionMachine.TestCase
