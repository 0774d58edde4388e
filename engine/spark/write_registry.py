"""The durable record of an exactly-once write: its task attempts and the commit decision.

Spark runs a task's `write()` before it knows which attempt will win, and a failed or
speculative attempt's rows stay written. So every attempt writes inside its own
transaction (its own producer id), and this registry, one LMDB key per write id in
`<root>/spark_writes.lmdb`, remembers:

- each attempt, with its producer id and epoch, and every partition it is about to
  write to (recorded *before* its first append there, so a later abort finds it);
- the decision: the attempts that won, stored once, before any COMMIT marker is
  written (the commit point: a driver that dies after it is rolled forward by the
  next commit or re-run of the same write id);
- done, once every marker is durable.

Each change is one atomic read-modify-write (`MetadataStore.update`): LMDB serialises
writers across the task and driver processes, so an attempt can never register a
partition after the decision was taken (it would be neither committed nor aborted).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import msgpack

from oncelog.layout import TopicPartition
from oncelog.recovery.fs import DEFAULT_FS, FileSystem, MetadataStore

REGISTRY_DIR = "spark_writes.lmdb"
KEY_PREFIX = "write/"
# Write ids become LMDB keys (at most 511 bytes) and appear in messages: keep them plain.
_WRITE_ID = re.compile(r"[A-Za-z0-9._:/@=+-]{1,400}")


class WriteDecidedError(Exception):
    """The write id was already committed: an attempt may not start or grow now."""


@dataclass(frozen=True)
class Attempt:
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class WriteState:
    attempts: dict[str, Attempt] = field(default_factory=dict)
    winners: tuple[str, ...] | None = None  # the decision; None until committed
    done: bool = False

    @property
    def decided(self) -> bool:
        return self.winners is not None

    def to_bytes(self) -> bytes:
        attempts = {
            key: [a.producer_id, a.producer_epoch, [[tp.topic, tp.partition] for tp in a.partitions]]
            for key, a in self.attempts.items()
        }
        winners = None if self.winners is None else list(self.winners)
        packed: bytes = msgpack.packb({"attempts": attempts, "winners": winners, "done": self.done})
        return packed

    @classmethod
    def from_bytes(cls, raw: bytes | None) -> WriteState:
        if raw is None:
            return cls()
        data: dict[str, Any] = msgpack.unpackb(raw)
        attempts = {
            key: Attempt(pid, epoch, tuple(TopicPartition(t, p) for t, p in parts))
            for key, (pid, epoch, parts) in data["attempts"].items()
        }
        winners = None if data["winners"] is None else tuple(data["winners"])
        return cls(attempts, winners, bool(data["done"]))


def check_write_id(write_id: str) -> str:
    if not isinstance(write_id, str) or _WRITE_ID.fullmatch(write_id) is None:
        raise ValueError(
            f"writeId must be 1..400 characters of letters, digits and ._:/@=+- ; got {write_id!r}"
        )
    return write_id


class WriteRegistry:
    def __init__(self, store: MetadataStore):
        self._store = store

    @classmethod
    def open(cls, root: str, fs: FileSystem = DEFAULT_FS) -> WriteRegistry:
        return cls(fs.open_store(os.path.join(root, REGISTRY_DIR)))

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> WriteRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state(self, write_id: str) -> WriteState:
        return WriteState.from_bytes(self._store.get(KEY_PREFIX + check_write_id(write_id)))

    def _change(self, write_id: str, change: Any) -> WriteState:
        result: list[WriteState] = []

        def apply(raw: bytes | None) -> bytes | None:
            new: WriteState = change(WriteState.from_bytes(raw))
            result.append(new)
            return new.to_bytes()

        self._store.update(KEY_PREFIX + check_write_id(write_id), apply)
        return result[-1]

    def add_partition(self, write_id: str, attempt: str, pid: int, epoch: int, tp: TopicPartition) -> None:
        """Record that `attempt` is about to write to `tp`; WriteDecidedError if committed."""

        def change(state: WriteState) -> WriteState:
            if state.decided:
                raise WriteDecidedError(f"write {write_id} was already committed; attempt {attempt} stops")
            known = state.attempts.get(attempt, Attempt(pid, epoch, ()))
            if tp in known.partitions:
                return state
            attempts = {**state.attempts, attempt: Attempt(pid, epoch, (*known.partitions, tp))}
            return WriteState(attempts, state.winners, state.done)

        self._change(write_id, change)

    def decide(self, write_id: str, winners: list[str]) -> WriteState:
        """Store the winners unless a decision exists (then it stands); returns the state."""

        def change(state: WriteState) -> WriteState:
            if state.decided:
                return state
            return WriteState(state.attempts, tuple(winners), state.done)

        return self._change(write_id, change)

    def mark_done(self, write_id: str) -> None:
        self._change(write_id, lambda state: WriteState(state.attempts, state.winners, True))

    def forget(self, write_id: str, attempts: list[str]) -> None:
        """Drop aborted attempts (their markers are durable), so a re-run starts clean."""

        def change(state: WriteState) -> WriteState:
            kept = {key: a for key, a in state.attempts.items() if key not in attempts}
            return WriteState(kept, state.winners, state.done)

        self._change(write_id, change)
