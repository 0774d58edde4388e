"""The durable record of an exactly-once write: its task attempts and the commit decision.

Spark runs a task's `write()` before it knows which attempt will win, and a failed or
speculative attempt's rows stay written. So every attempt writes inside its own
transaction (its own producer id), and this registry, one LMDB key per write id in
`<root>/spark_writes.lmdb`, remembers:

- each attempt, with its job (a unique id per Spark job, so attempt numbers reused
  by a new application never collide), producer id and epoch, and every partition it
  is about to write to (recorded *before* its first append there, so a later abort
  finds it);
- the decision: the attempts that won, stored once, before any COMMIT marker is
  written (the commit point: a driver that dies after it is rolled forward by the
  next commit or re-run of the same write id);
- the jobs aborted (closed): their attempts may not register anything more, so a
  zombie attempt of an aborted job cannot open a transaction nobody would close;
- when the write started, so an undecided write older than the transaction timeout
  can be aborted by anyone (a driver that died with a made-up write id never comes
  back to finish it; Kafka's coordinator times transactions out the same way);
- done, once every marker is durable; the attempts are then dropped.

Each change is one atomic read-modify-write (`MetadataStore.update`): LMDB serialises
writers across the task and driver processes, so an attempt can never register a
partition after the decision or the abort (it would be neither committed nor aborted).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from oncelog.errors import OncelogError
from oncelog.layout import TopicPartition
from oncelog.storage.fs import DEFAULT_FS, FileSystem, MetadataStore
from oncelog.storage.log_dirs import opening_failed
from oncelog.storage.metadata_values import decode_value, read_value

REGISTRY_DIR = "spark_writes.lmdb"
KEY_PREFIX = "write/"
# Write ids become LMDB keys (at most 511 bytes) and appear in messages: keep them plain.
_WRITE_ID = re.compile(r"[A-Za-z0-9._:/@=+-]{1,400}")


class WriteDecidedError(OncelogError):
    """The write id was already committed or its job aborted: an attempt may not start or grow."""


class WriteAbortedError(OncelogError):
    """A commit came after the write was aborted (its transaction timed out)."""


@dataclass(frozen=True)
class Attempt:
    job: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class WriteState:
    attempts: dict[str, Attempt] = field(default_factory=dict)
    winners: tuple[str, ...] | None = None  # the decision; None until committed
    done: bool = False
    closed_jobs: tuple[str, ...] = ()
    started_ms: int = 0  # the first registration; 0 when nothing registered yet

    @property
    def decided(self) -> bool:
        return self.winners is not None

    def to_bytes(self) -> bytes:
        attempts = {
            key: [a.job, a.producer_id, a.producer_epoch, [[tp.topic, tp.partition] for tp in a.partitions]]
            for key, a in self.attempts.items()
        }
        packed: bytes = msgpack.packb(
            {
                "attempts": attempts,
                "winners": None if self.winners is None else list(self.winners),
                "done": self.done,
                "closed": list(self.closed_jobs),
                "started": self.started_ms,
            }
        )
        return packed

    @classmethod
    def from_bytes(cls, raw: bytes) -> WriteState:
        data: dict[str, Any] = msgpack.unpackb(raw)
        attempts = {
            key: Attempt(job, pid, epoch, tuple(TopicPartition(t, p) for t, p in parts))
            for key, (job, pid, epoch, parts) in data["attempts"].items()
        }
        winners = None if data["winners"] is None else tuple(data["winners"])
        return cls(attempts, winners, bool(data["done"]), tuple(data["closed"]), int(data["started"]))


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
        """CorruptMetadataError if the registry's store is damaged (its decisions cannot be read)."""
        path = os.path.join(root, REGISTRY_DIR)
        try:
            return cls(fs.open_store(path))
        except OSError as exc:
            raise opening_failed(exc, path) from exc

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> WriteRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state(self, write_id: str) -> WriteState:
        key = KEY_PREFIX + check_write_id(write_id)
        return read_value(self._store, key, WriteState.from_bytes) or WriteState()

    def write_ids(self) -> list[str]:
        return [key[len(KEY_PREFIX) :] for key in self._store.keys(KEY_PREFIX)]

    def _change(self, write_id: str, change: Callable[[WriteState], WriteState | None]) -> WriteState | None:
        result: list[WriteState | None] = []

        key = KEY_PREFIX + check_write_id(write_id)

        def apply(raw: bytes | None) -> bytes | None:
            new = change(
                WriteState() if raw is None else decode_value(self._store, key, raw, WriteState.from_bytes)
            )
            result.append(new)
            return None if new is None else new.to_bytes()

        self._store.update(key, apply)
        return result[-1]

    def add_partition(
        self, write_id: str, job: str, attempt: str, pid: int, epoch: int, tp: TopicPartition, now_ms: int
    ) -> None:
        """Record that `attempt` is about to write to `tp`; WriteDecidedError if it may not."""

        def change(state: WriteState) -> WriteState:
            if state.decided:
                raise WriteDecidedError(f"write {write_id} was already committed; attempt {attempt} stops")
            if job in state.closed_jobs:
                raise WriteDecidedError(f"write {write_id}'s job {job} was aborted; attempt {attempt} stops")
            known = state.attempts.get(attempt, Attempt(job, pid, epoch, ()))
            if (known.job, known.producer_id) != (job, pid):
                raise WriteDecidedError(
                    f"attempt {attempt} of write {write_id} is registered with another producer"
                )
            if tp in known.partitions:
                return state
            attempts = {**state.attempts, attempt: replace(known, partitions=(*known.partitions, tp))}
            return replace(state, attempts=attempts, started_ms=state.started_ms or now_ms)

        self._change(write_id, change)

    def decide(self, write_id: str, winners: list[str]) -> WriteState:
        """Store the winners unless a decision exists (then it stands); returns the state."""

        def change(state: WriteState) -> WriteState:
            if state.decided:
                return state
            closed = [
                key
                for key in winners
                if key in state.attempts and state.attempts[key].job in state.closed_jobs
            ]
            if closed:
                raise WriteAbortedError(
                    f"write {write_id} was aborted (its transaction timed out) before this commit: {closed}"
                )
            return replace(state, winners=tuple(winners))

        new = self._change(write_id, change)
        assert new is not None
        return new

    def close_jobs(self, write_id: str, jobs: list[str]) -> WriteState:
        """Abort: the jobs of every registered attempt (and `jobs`) may register nothing more."""

        def change(state: WriteState) -> WriteState:
            closed = {*state.closed_jobs, *jobs, *(a.job for a in state.attempts.values())}
            return replace(state, closed_jobs=tuple(sorted(closed)))

        new = self._change(write_id, change)
        assert new is not None
        return new

    def mark_done(self, write_id: str) -> None:
        """Every marker is durable: drop the attempts (the decision alone keeps re-runs idempotent)."""
        self._change(write_id, lambda state: replace(state, attempts={}, done=True))

    def discard(self, write_id: str) -> None:
        """Remove a finished write's record (a streaming batch that can no longer be re-run)."""
        self._change(write_id, lambda state: None if state.done else state)

    def stale(self, older_than_ms: int) -> list[str]:
        """Undecided writes whose first registration is older than `older_than_ms`."""
        found = []
        for write_id in self.write_ids():
            state = self.state(write_id)
            open_jobs = {a.job for a in state.attempts.values()} - set(state.closed_jobs)
            if not state.decided and open_jobs and 0 < state.started_ms < older_than_ms:
                found.append(write_id)
        return found
