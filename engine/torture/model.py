"""The torture harness's shared vocabulary: its constants, the Model and the violation types.

Everything here is plain data that the workload (torture_workload), the transaction
checks (torture_txn) and the crash-state checker (torture) all agree on: the fault
classes, the directory, clock and config of every crash state, the producers, the
transaction outcomes, what a violation is, and the Model of what the workload did.
It imports nothing of the harness, so every other torture module can import it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

from oncelog.config import LogConfig
from oncelog.segment_cleaning import CleanStats

# "cleaning" is a class of its own (oncelog.torture.cleaning): a compacted log crashed at
# an I/O call of a cleaning pass, then power lost or the process killed.
CLEANING = "cleaning"
FAULTS = ("kill", "drop", "torn", "dirent", "bitflip", "enospc", "eio", "misdirect", "lost", CLEANING)
# What a "lost" crash may delete or empty: a whole fsynced segment or index.
LOSABLE_SUFFIXES = (".log", ".index", ".timeindex")
DIRECTORY = "/torture/topic-0"
CLOCK_MS = 1_800_000_000_000  # where the simulated engine clock starts
# A minute of engine time: the clock's idle gaps (EngineClock) make producers expire
# in most runs, so expiry, and what survives it, is checked.
EXPIRATION_MS = 60_000
HOUR_MS = 3600 * 1000
DAY_MS = 24 * HOUR_MS
# Each producer's client clock, relative to the engine's: batch timestamps come from
# clients (a mirror keeps its source's, clocks skew) and must never decide expiry.
CLIENT_CLOCKS = {
    "current": 0,
    "two years behind": -2 * 365 * DAY_MS,
    "three days ahead": 3 * DAY_MS,
    "jittered by hours": 0,  # plus or minus up to 6 hours, batch to batch
}
# Small segments and indexes, so rolls, full indexes and several segments happen.
CONFIG = LogConfig(
    segment_bytes=2048,
    index_interval_bytes=256,
    segment_index_bytes=1024,
    producer_expiration_ms=EXPIRATION_MS,
    # Five producers: a small table keeps each open (and the checker's replay) from
    # allocating the default 100,000 rows, most of a crash state's time otherwise.
    producer_capacity=64,
    # Small enough that apply_retention() (called by the workload now and then) deletes
    # the oldest segment or two of a typical run; retention_ms is Kafka's default week.
    retention_bytes=4096,
)
# The cleaning class's log: compacted, with small segments, and tombstones kept a few
# steps of the engine clock after the cleaning that first saw them.
KEYS = 12  # few keys: most records are superseded, so passes remove records and whole batches
DELETE_RETENTION_MS = 5_000
CLEANING_CONFIG = dataclasses.replace(
    CONFIG,
    segment_bytes=1024,
    index_interval_bytes=128,
    retention_bytes=None,
    cleanup_policy="compact",
    delete_retention_ms=DELETE_RETENTION_MS,
)
PRODUCERS = (11, 12, 13)  # idempotent producers
TXN_PRODUCERS = (21, 22)  # transactional producers: two, so their transactions interleave
TAIL_SLACK_BYTES = 4096
# Each seam call of a workload is a possible kill point; workloads make a few hundred.
MAX_KILL_POINT = 400
# read_committed scans fetch this many bytes at a time (chosen by the crash state's
# seed): one batch per fetch makes every fetch compute its own aborted list.
READ_COMMITTED_FETCH_BYTES = (1, 700, 64 * 1024)

COMMITTED = "commit"
ABORTED = "abort"
OPEN = "open"


class Violation(NamedTuple):
    seed: int
    fault: str
    invariant: str
    detail: str

    @property
    def replay_command(self) -> str:
        return f"oncelog torture --seed {self.seed} --crashes 1 --faults {self.fault}"


class OnlineCheckFailed(AssertionError):
    """The workload saw the live log break a rule (a retry, a refusal, the stable offset)."""

    def __init__(self, invariant: str, detail: str):
        super().__init__(detail)
        self.invariant = invariant


@dataclass
class Txn:
    """One transaction as the workload drove it."""

    producer_id: int
    first_offset: int  # the offset its first batch was handed to append() at
    batches: list[int] = field(default_factory=list)  # offsets of its data batches
    marker_offset: int = -1  # where its marker was handed to write_txn_marker(), -1: not yet
    commit: bool | None = None  # the marker's kind, once handed to the log
    acked: bool = False  # write_txn_marker() returned

    @property
    def outcome(self) -> str:
        """As acknowledged: committed or aborted once its marker's write returned, else open."""
        if not self.acked:
            return OPEN
        return COMMITTED if self.commit else ABORTED


class EngineClock:
    """The simulated engine clock a crash state's Log reads (Log.open(clock=...))."""

    def __init__(self, now_ms: int = CLOCK_MS):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class Model:
    """What the workload did, as the checker needs it."""

    # Every batch handed to append(), by the offset it would take: a batch killed
    # mid-append may or may not be in the log, but no other bytes may be.
    written: dict[int, bytes] = field(default_factory=dict)
    # The engine's clock when each of those was handed over: the earliest the log can
    # say its producer was last appended.
    append_ms: dict[int, int] = field(default_factory=dict)
    now_ms: int = CLOCK_MS  # the engine's clock when the run ended
    expiries: int = 0  # producers the run saw expire, for the tests' coverage figures
    # Offsets of the batches with which expired producers started again (at a new epoch
    # and an arbitrary sequence): the checker's replay forgets the producer there.
    restarted_at: set[int] = field(default_factory=set)
    # Batches (unstamped) handed to append() by a thread of a concurrent step whose call
    # had not returned when the run ended: each may be in the log at any offset past the
    # end the thread saw. Value: the engine's time, and whether it restarted its producer.
    in_flight: dict[bytes, tuple[int, bool]] = field(default_factory=dict)
    concurrent_steps: int = 0  # for the tests' coverage figures
    # Concurrent steps in which a thread's flush ran while the main thread cut, trimmed or
    # closed the log (the race group commit must survive).
    raced_flushes: int = 0
    acked: dict[int, bytes] = field(default_factory=dict)
    durable_end: int = 0  # log end at the last flush that returned
    fsync_failed: bool = False
    acked_after_fsync_failure: int = 0
    # Every transaction begun, and for each transactional data batch the one it belongs to.
    txns: list[Txn] = field(default_factory=list)
    txn_of: dict[int, Txn] = field(default_factory=dict)
    # The persisted log start offset after the last completed delete_records / retention
    # (or truncation, which can only lower it to its new end).
    log_start: int = 0
    # An operation under way when the run ended (a crash or a failed write inside it):
    # truncate_to(k) may have left the old log or any prefix of it down to the batch
    # holding k; delete_records / apply_retention may have left the old start or this one.
    pending_cut: int | None = None
    pending_start: int | None = None
    # Set by the checker after a "lost" crash: the recovery point then stored. Batches past
    # it may have gone with the lost file without the engine being able to know.
    lost_from: int | None = None
    # Set by the checker after a bit flip or misdirected write in fsynced bytes past the
    # stored recovery point (which a flush leaves behind, LogConfig.recovery_point_interval_ms):
    # the offset of the batch it hit. From there recovery cannot tell the damage from a
    # torn tail, and may cut it with what follows, as Kafka's does; nothing before it.
    damaged_from: int | None = None
    # Where the stored recovery point must have reached (a batch boundary): the end at the
    # last roll, clean close or checkpoint after a flush, back to a completed truncation's
    # end. Damage below it must be reported, whatever point the engine stored.
    point_floor: int = 0
    truncations: int = 0  # completed, for the tests' coverage figures
    starts_moved: int = 0

    def excused(self, last_offset: int) -> bool:
        """A batch ending at `last_offset` may be gone: cut by a truncation the crash interrupted,
        in a segment file an operator lost past what the recovery point covered, or from a
        batch damaged past the recovery point on."""
        cuts = (self.pending_cut, self.lost_from, self.damaged_from)
        return any(cut is not None and last_offset >= cut for cut in cuts)


@dataclass
class CleaningModel(Model):
    """The Model of a crash state, and what the cleaning class adds to it."""

    # Each producer's last (up to 5) acknowledged batches at its current epoch, as sent,
    # with their offsets: a retry of any must be answered as a duplicate.
    recent: dict[int, list[tuple[bytes, int]]] = field(default_factory=dict)
    # Each pass begun: the engine's clock, and the offset below which it could clean (the
    # last stable offset and the recovery point then): what lay below it was durable.
    clean_times: list[tuple[int, int]] = field(default_factory=list)
    # The I/O calls of each pass: (first, last); last < first for a pass that made none.
    passes: list[tuple[int, int]] = field(default_factory=list)
    cleaned: int = 0  # passes that cleaned something, for the tests' coverage figures
    stats: CleanStats = field(default_factory=CleanStats)  # the passes' totals, likewise


def stamped(batch: bytes, offset: int) -> bytes:
    return offset.to_bytes(8, "big", signed=True) + batch[8:]


def crash_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index) % (2**63)
