"""What a transactional id is, and how it is stored: its producer, epoch, state and open transaction.

Pure data and its record codec (what the CoordinatorStore keeps, one value per
transactional id); the coordinator that moves it between states is txn_coordinator's.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.layout import TopicPartition
from oncelog.server.group_state import CommittedOffset


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


class TxnError(Exception):
    """A transactional request refused with `code`."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


@dataclass(eq=False)
class Transaction:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    # The epoch before the last bump a producer asked for by presenting it (KIP-360), so
    # a retry of that InitProducerId gets the same epoch; -1 after a bump that fences.
    last_epoch: int = -1
    partitions: set[TopicPartition] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    offsets: dict[tuple[str, str, int], CommittedOffset] = field(default_factory=dict)
    started_ms: int = 0
    # When the record was last stored (wall clock): an id idle past transactional.id.expiration.ms
    # is forgotten.
    updated_ms: int = 0
    # The last completed end: {"pid", "epoch" (the markers'), "commit", "markers": [[topic,
    # partition, offset], ...]}, so a start can write again a marker a crash took.
    last_end: dict[str, Any] | None = None
    # Not stored: appends of this transaction in flight, and who waits for them to finish.
    appends_in_flight: int = 0
    drained: asyncio.Event | None = None
    # True while an end is being carried out (prepared, markers being written).
    ending: bool = False

    def record(self) -> dict[str, Any]:
        return {
            "id": self.transactional_id,
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "last_epoch": self.last_epoch,
            "timeout_ms": self.timeout_ms,
            "state": self.state.value,
            "partitions": sorted([tp.topic, tp.partition] for tp in self.partitions),
            "groups": sorted(self.groups),
            "offsets": [[g, t, p, *c] for (g, t, p), c in self.offsets.items()],
            "started_ms": self.started_ms,
            "updated_ms": self.updated_ms,
            "last_end": self.last_end,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Transaction:
        txn = cls(record["id"], record["pid"], record["epoch"], record["timeout_ms"])
        txn.restore(record)
        return txn

    def restore(self, record: dict[str, Any]) -> None:
        """Take the stored fields of `record` (what `record()` made)."""
        self.producer_id, self.producer_epoch = record["pid"], record["epoch"]
        self.last_epoch, self.timeout_ms = record["last_epoch"], record["timeout_ms"]
        self.state = TxnState(record["state"])
        self.partitions = {TopicPartition(t, p) for t, p in record["partitions"]}
        self.groups = set(record["groups"])
        self.offsets = {(g, t, p): CommittedOffset(*c) for g, t, p, *c in record["offsets"]}
        self.started_ms, self.updated_ms = record["started_ms"], record["updated_ms"]
        self.last_end = record.get("last_end")  # (absent from records stored before it)
