"""The last step of a transaction's end: fsyncing its markers after its completion is stored.

A completion is stored naming its markers (`Transaction.last_end`), before they are
fsynced (txn_coordinator's module docstring says why a crash cannot lose them). So a
transactional id may have one end whose markers are not yet durable: this tracks those
ids, runs each fsync as a task the next transaction does not wait for, and lets the next
completion, which replaces `last_end`, wait for it (`durable`). A failed fsync is tried
again by `retry_failed` (the coordinator's timeout check) and by the next completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from oncelog.errors import OncelogError
from oncelog.layout import TopicPartition
from oncelog.log_manager import UnknownTopicOrPartitionError
from oncelog.server.txn_state import Transaction

log = logging.getLogger("oncelog.server")

# Makes a partition durable up to an end offset (fsync), without holding up its appends.
# Runs in a worker thread.
PartitionSync = Callable[[TopicPartition, int], None]


async def io_results(calls: Iterable[Awaitable[Any]], transactional_id: str, failed: str) -> list[Any] | None:
    """Each call's result, every call finished first (so no retry overlaps one still running);
    None if one failed with an I/O error (logged as `failed`, to be retried), which any other
    exception is not: it is raised."""
    return checked_results(await asyncio.gather(*calls, return_exceptions=True), transactional_id, failed)


def checked_results(results: list[Any], transactional_id: str, failed: str) -> list[Any] | None:
    """`results` (an exception in place of a call that raised), as `io_results` answers them."""
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        if not isinstance(failures[0], (OncelogError, OSError)):
            raise failures[0]
        log.warning("transaction %r: %s, retrying: %s", transactional_id, failed, failures[0])
        return None
    return results


class MarkerSyncs:
    def __init__(self, in_thread: Callable[[Callable[[], Any]], Any], sync_partition: PartitionSync):
        self._in_thread = in_thread
        self._sync_partition = sync_partition
        # Ids whose stored `last_end` names markers not known to be durable, and the fsyncs under way.
        self._unsynced: dict[str, Transaction] = {}
        self._syncing: dict[str, asyncio.Task[bool]] = {}

    def start(self, txn: Transaction) -> None:
        """`txn.last_end` was just stored: fsync its markers' partitions in the background."""
        self._unsynced[txn.transactional_id] = txn
        task = asyncio.create_task(self._sync_logged(txn))
        self._syncing[txn.transactional_id] = task
        task.add_done_callback(functools.partial(self._done, txn.transactional_id))

    def pending(self, transactional_id: str) -> bool:
        """Whether the markers of `transactional_id`'s stored last end may not be durable."""
        return transactional_id in self._unsynced

    async def durable(self, txn: Transaction) -> bool:
        """Whether the markers `txn.last_end` names are durable: waits for the fsync under way,
        and tries again if it failed."""
        task = self._syncing.get(txn.transactional_id)
        if task is not None and not task.done():
            await asyncio.wait({task})
        if txn.transactional_id not in self._unsynced:
            return True
        return await self._sync(txn)

    def retry_failed(self) -> None:
        for txn in list(self._unsynced.values()):
            if txn.transactional_id not in self._syncing:
                self.start(txn)

    async def finished(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the fsyncs under way (a draining stop)."""
        pending = [task for task in self._syncing.values() if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    def _done(self, transactional_id: str, task: asyncio.Task[bool]) -> None:
        if self._syncing.get(transactional_id) is task:
            del self._syncing[transactional_id]

    async def _sync_logged(self, txn: Transaction) -> bool:
        try:
            return await self._sync(txn)
        except Exception:  # still pending: the next completion or the timeout check tries again
            log.exception("transaction %r: fsyncing its markers failed", txn.transactional_id)
            return False

    async def _sync(self, txn: Transaction) -> bool:
        end = txn.last_end
        if end is not None:
            syncs = [
                self._in_thread(functools.partial(self._sync_one, TopicPartition(topic, partition), offset))
                for topic, partition, offset in end["markers"]
            ]
            if await io_results(syncs, txn.transactional_id, "markers not fsynced") is None:
                return False
        if txn.last_end is end and self._unsynced.get(txn.transactional_id) is txn:
            del self._unsynced[txn.transactional_id]
        return True

    def _sync_one(self, tp: TopicPartition, marker_offset: int) -> None:
        with contextlib.suppress(UnknownTopicOrPartitionError):  # gone, and its marker with it
            self._sync_partition(tp, marker_offset + 1)
