"""The transaction coordinator: transactional ids, their epochs, and the two-phase end of a transaction.

A transactional id's record moves Empty -> Ongoing -> PrepareCommit | PrepareAbort ->
CompleteCommit | CompleteAbort -> Ongoing ... Each transition is durable before it is
answered. Ending a transaction:

1. stores Prepare* (from here on the outcome is decided: a crash finishes it);
2. waits for the producer's appends in flight, and answers EndTxn, as Kafka does: the
   rest runs in the background (`settled` waits for it);
3. writes a COMMIT or ABORT marker to every partition of the transaction (not fsynced);
4. stores Complete* together with the group offsets the transaction committed, in one
   commit (a crash can never apply the offsets without the markers, or the reverse),
   and the end itself as the record's `last_end`: the outcome and each marker's offset;
5. fsyncs the markers' partitions, in the background and through each log's group
   commit (outside its append lock): the next transaction neither waits for it nor has
   its appends held up by it; only the next completion waits for it (below).

Why the markers need no fsync before step 4: a crash that loses one (power loss) leaves
the transaction's data open in its partition, below the offset `last_end` names, and the
next start writes the marker again with the stored outcome (`lost_markers`), before it
aborts orphans or completes anything. The next transaction's data lands after the marker,
so a partition whose marker was lost lost that data too, and a transaction open there
below the named offset is this end's. This holds while the record names the end whose
markers may not be durable, so at most one may be: a completion stores its `last_end`
only once the previous one's partitions are fsynced.

Until step 4 the transaction is still open in its partitions: their last stable offset
stays below its data, so no read_committed reader sees it before its marker. The
producer's next request for this transactional id (AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit, EndTxn, InitProducerId) waits for step 4 rather than being refused
with CONCURRENT_TRANSACTIONS, which clients retry only after a backoff.

Crash cases, by what the store holds at the next start:

| stored state | what the start does |
|---|---|
| Empty, Complete* | nothing |
| Ongoing | keeps it; the producer carries on, or the timeout aborts it |
| Prepare*, EndTxn not answered | writes the markers again (a second marker completes |
|   | nothing) and completes; the producer's retried EndTxn finds it complete |
| Prepare*, EndTxn answered, | the same: the outcome the producer was told is the one |
|   markers not all written | its markers carry |
| any, with a `last_end` whose | writes that marker again with the stored outcome (first, |
|   marker a crash took | so the next end's markers cannot close this end's data) |

Every start bumps the coordinator epoch, so a marker a killed process was still
writing is fenced by the logs once this process has written its own.

`InitProducerId(transactional_id)` fences the previous incarnation: it aborts the open
transaction, bumps the epoch (a new producer id when it would overflow i16) and keeps
the producer id. A transaction open past its timeout is aborted the same way, so a
late batch of the timed-out epoch is refused rather than opening a transaction no one
will end.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.clock import Clock, MonotonicClock, wall_clock_ms
from oncelog.errors import InvalidProducerEpochError, OncelogError
from oncelog.layout import TopicPartition
from oncelog.log_manager import UnknownTopicOrPartitionError
from oncelog.producer_ids import ProducerIdManager, next_epoch
from oncelog.server.coordinator_store import TXN, CoordinatorStore, store_key
from oncelog.server.group_coordinator import GroupCoordinator
from oncelog.server.group_state import CommittedOffset
from oncelog.server.marker_syncs import MarkerSyncs, PartitionSync, checked_results
from oncelog.server.txn_state import Transaction, TxnError, TxnState

__all__ = ["TransactionCoordinator", "TxnError", "TxnState"]

log = logging.getLogger("oncelog.server")
# How often transactions are checked against their timeouts, and unfinished ends retried.
CHECK_INTERVAL_S: Final = 0.5
# How often idle transactional ids are looked for (Kafka: transactional.id.expiration.ms's check).
EXPIRY_CHECK_S: Final = 60.0
MAX_TXN_PARTITIONS: Final = 100_000
# How long a request waits for the end its transactional id was last answered (its markers)
# to complete before it is refused with CONCURRENT_TRANSACTIONS, which clients retry.
SETTLE_WAIT_S: Final = 10.0
# How long an OffsetFetch or OffsetCommit waits for the ends whose offsets go to its group:
# short, as the consumer's heartbeats queue behind it on the same connection.
GROUP_SETTLE_WAIT_S: Final = 1.0


# Writes one marker to a partition, not fsynced: (partition, producer id, epoch, commit,
# coordinator epoch) -> the marker's offset (None if not known). Runs in a worker thread.
MarkerWriter = Callable[[TopicPartition, int, int, bool, int], "int | None"]
# A marker of a stored end: (partition, producer id, marker epoch, commit, marker offset).
EndMarker = tuple[TopicPartition, int, int, bool, int]


class TransactionCoordinator:
    def __init__(
        self,
        store: CoordinatorStore,
        producer_ids: ProducerIdManager,
        groups: GroupCoordinator,
        write_marker: MarkerWriter,
        in_thread: Callable[[Callable[[], Any]], Any],
        wake: Callable[[Iterable[TopicPartition]], None],
        *,
        sync_partition: PartitionSync,
        topic_exists: Callable[[str], bool],
        max_timeout_ms: int,
        expiration_ms: int = 7 * 24 * 3600 * 1000,
        clock_ms: Clock | None = None,
    ):
        self.store = store
        self.producer_ids = producer_ids
        self.groups = groups
        self.max_timeout_ms = max_timeout_ms
        self.expiration_ms = expiration_ms
        self._write_marker = write_marker
        self._in_thread = in_thread
        self._wake = wake
        self._checking: dict[str, asyncio.Task[None]] = {}
        # Ends answered at Prepare whose markers and completion are still being written.
        self._completing: dict[str, asyncio.Task[bool]] = {}
        self._marker_syncs = MarkerSyncs(in_thread, sync_partition)  # step 5
        self._topic_exists = topic_exists
        # Timeouts and expiry are measured on the wall clock (it outlives a restart), never stepping
        # back: a clock set back must not hold an abandoned transaction open longer.
        self._clock_ms: Clock = clock_ms or MonotonicClock(wall_clock_ms)
        self.coordinator_epoch = store.next_epoch()
        self.transactions: dict[str, Transaction] = {}
        self._by_producer: dict[int, Transaction] = {}
        # What the store holds for each transactional id: a failed write restores from it.
        self._stored: dict[str, dict[str, Any]] = {}
        # Transactions not yet complete (what the timeout check visits), and how many hold
        # uncommitted offsets for each (group, topic, partition): indexes, so neither costs a
        # walk over every transactional id.
        self._unsettled: dict[str, Transaction] = {}
        self._holders: collections.Counter[tuple[str, str, int]] = collections.Counter()
        self._held: dict[str, set[tuple[str, str, int]]] = {}
        for record, txn in store.records(TXN, "id", Transaction.from_record):
            self._index(txn)
            self.transactions[txn.transactional_id] = txn
            self._by_producer[txn.producer_id] = txn
            self._stored[txn.transactional_id] = record
        groups.pending_transactional = self._holds_offsets
        groups.drop_pending_offsets = self.drop_offsets

    def last_end_markers(self) -> list[EndMarker]:
        """Every marker the stored `last_end`s name (what `Broker.restore_lost_markers` checks)."""
        return [
            (TopicPartition(topic, partition), end["pid"], end["epoch"], end["commit"], offset)
            for txn in self.transactions.values()
            if (end := txn.last_end) is not None
            for topic, partition, offset in end["markers"]
        ]

    def unfinished(self) -> list[Transaction]:
        """Transactions whose end was decided but not completed (a crash in between)."""
        return [txn for txn in self.transactions.values() if txn.state.preparing]

    # -- the producer's requests ---------------------------------------------------------
    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int
    ) -> tuple[int, int]:
        """(producer id, epoch) for a new incarnation of `transactional_id`; TxnError if refused."""
        if not 1 <= timeout_ms <= self.max_timeout_ms:
            raise TxnError(
                ErrorCode.invalid_transaction_timeout,
                f"transaction timeout {timeout_ms} ms is outside 1..{self.max_timeout_ms}",
            )
        if (producer_id == -1) != (producer_epoch == -1):
            raise TxnError(ErrorCode.invalid_request, "give both the producer id and the epoch, or neither")
        await self.settled(transactional_id)
        txn = self.transactions.get(transactional_id)
        if txn is None:
            txn = Transaction(transactional_id, self.producer_ids.lease().producer_id, -1, timeout_ms)
        elif txn.ending or txn.state.preparing:
            raise TxnError(ErrorCode.concurrent_transactions, "the previous transaction is still ending")
        elif producer_id not in (-1, txn.producer_id):
            raise TxnError(ErrorCode.producer_fenced, "a newer incarnation holds this transactional id")
        expected = producer_epoch if producer_id != -1 and txn.producer_epoch != -1 else None
        if txn.state is TxnState.ONGOING:
            await self._end(txn, commit=False, bump=True)
            if txn.state.preparing:  # a marker could not be written yet; retried in the background
                raise TxnError(ErrorCode.concurrent_transactions, "the previous transaction is still ending")
            expected = None
        if expected is not None and expected == txn.last_epoch:
            return txn.producer_id, txn.producer_epoch  # a retry of the bump this producer asked for
        if expected is not None and expected != txn.producer_epoch:
            raise TxnError(ErrorCode.producer_fenced, f"epoch {expected} is not the current one")
        # KIP-360: a producer that asked for this bump may retry it and get the same epoch back.
        txn.last_epoch = txn.producer_epoch if expected is not None else -1
        self._bump(txn)
        txn.timeout_ms = timeout_ms
        self._forget(txn)
        txn.state = TxnState.EMPTY
        txn.partitions, txn.groups, txn.offsets = set(), set(), {}
        self._store(txn, f"epoch {txn.producer_epoch} of transactional id {transactional_id!r}")
        self.transactions[transactional_id] = txn
        self._by_producer[txn.producer_id] = txn
        return txn.producer_id, txn.producer_epoch

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> None:
        txn = self._current(transactional_id, producer_id, producer_epoch)
        wanted = set(partitions)
        if txn.state is TxnState.ONGOING and wanted <= txn.partitions:
            return  # a retry
        if len(txn.partitions | wanted) > MAX_TXN_PARTITIONS:
            raise TxnError(
                ErrorCode.invalid_request, f"a transaction spans at most {MAX_TXN_PARTITIONS} partitions"
            )
        self._begin(txn)
        txn.partitions |= wanted
        self._store(txn, f"adding partitions to transaction {transactional_id!r}")

    def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> None:
        txn = self._current(transactional_id, producer_id, producer_epoch)
        if txn.state is TxnState.ONGOING and group_id in txn.groups:
            return
        self._begin(txn)
        txn.groups.add(group_id)
        self._store(txn, f"adding group {group_id!r} to transaction {transactional_id!r}")

    def commit_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        offsets: Iterable[tuple[str, int, CommittedOffset]],
    ) -> None:
        """TxnOffsetCommit: the offsets become the group's when the transaction commits."""
        txn = self._current(transactional_id, producer_id, producer_epoch)
        if txn.state is not TxnState.ONGOING or group_id not in txn.groups:
            raise TxnError(
                ErrorCode.invalid_txn_state, f"group {group_id!r} was not added to the transaction"
            )
        for topic, partition, committed in offsets:
            txn.offsets[(group_id, topic, partition)] = committed
        self._index(txn)
        self._store(txn, f"offsets of transaction {transactional_id!r}")

    async def end(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> None:
        """EndTxn: returns once the outcome is stored (Prepare*); the markers follow (`settled`)."""
        ending = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        await self.settled(transactional_id)  # a retry of the end answered before, say
        txn = self.transactions.get(transactional_id)
        if txn is not None and txn.state.preparing and txn.state is not ending:
            raise TxnError(ErrorCode.invalid_txn_state, f"the transaction is already in {txn.state.value}")
        txn = self._current(transactional_id, producer_id, producer_epoch)
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if txn.state is done:
            return  # a retry of the end that completed
        if txn.state is not TxnState.ONGOING:
            raise TxnError(
                ErrorCode.invalid_txn_state, f"cannot end a transaction in state {txn.state.value}"
            )
        await self._end(txn, commit=commit, bump=False, answer_at_prepare=True)

    async def settled(self, transactional_id: str, timeout_s: float = SETTLE_WAIT_S) -> None:
        """Wait (at most `timeout_s`) for the end last answered for `transactional_id` to
        complete: its markers written and its completion stored. Callers then find the
        transaction complete, or still preparing (a marker failed: CONCURRENT_TRANSACTIONS,
        and the timeout check retries it)."""
        task = self._completing.get(transactional_id)
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=timeout_s)

    async def offsets_settled(self, group_id: str, timeout_s: float = GROUP_SETTLE_WAIT_S) -> None:
        """Wait (at most `timeout_s`) for the ends answered whose offsets go to `group_id`.
        Past it, an OffsetFetch answers as Kafka does meanwhile (the offsets before; with
        require_stable, UNSTABLE_OFFSET_COMMIT), and an OffsetCommit is kept over the
        transaction's older offsets when they land (`_complete`)."""
        pending = [
            task
            for tid, task in self._completing.items()
            if not task.done() and (txn := self.transactions.get(tid)) is not None and group_id in txn.groups
        ]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    async def completions_finished(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for every end answered to complete, and its markers' fsync
        (a draining stop)."""
        pending = [task for task in self._completing.values() if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        await self._marker_syncs.finished(timeout_s)

    def _current(self, transactional_id: str, producer_id: int, producer_epoch: int) -> Transaction:
        txn = self.transactions.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            raise TxnError(ErrorCode.invalid_producer_id_mapping, f"no producer {producer_id} for this id")
        if producer_epoch != txn.producer_epoch:
            raise TxnError(ErrorCode.producer_fenced, f"epoch {producer_epoch} is not the current one")
        if txn.state.preparing:
            raise TxnError(ErrorCode.concurrent_transactions, "the previous transaction is still ending")
        return txn

    def _begin(self, txn: Transaction) -> None:
        if txn.state is not TxnState.ONGOING:
            self._forget(txn)
            txn.state = TxnState.ONGOING
            txn.partitions, txn.groups, txn.offsets = set(), set(), {}
            self._index(txn)
            txn.started_ms = self._clock_ms()

    def _bump(self, txn: Transaction) -> None:
        # One epoch kept back, for the bump that fences a zombie at an abort (_end).
        bumped = next_epoch(txn.producer_epoch, kept_back=1)
        if bumped is None:
            del self._by_producer[txn.producer_id]
            txn.producer_id, txn.producer_epoch = self.producer_ids.lease().producer_id, 0
            self._by_producer[txn.producer_id] = txn
        else:
            txn.producer_epoch = bumped

    # -- produce admission -------------------------------------------------------------------
    def admit_append(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> ErrorCode:
        """Whether a transactional batch may be appended: its transaction is open and holds `tp`.

        Admitted appends are counted until `appended` is called, and the end of their
        transaction waits for them, so no batch lands after its transaction's marker.
        """
        txn = self._by_producer.get(producer_id)
        # The epoch first, as Kafka's partition check does: a fenced producer must hear it is fenced
        # (fatal in clients), not that its transaction needs aborting.
        if txn is not None and producer_epoch != txn.producer_epoch:
            return ErrorCode.invalid_producer_epoch
        if txn is None or txn.state is not TxnState.ONGOING or tp not in txn.partitions:
            return ErrorCode.invalid_txn_state
        txn.appends_in_flight += 1
        return ErrorCode.none

    def appended(self, producer_id: int) -> None:
        txn = self._by_producer[producer_id]
        txn.appends_in_flight -= 1
        assert txn.appends_in_flight >= 0
        if txn.appends_in_flight == 0 and txn.drained is not None:
            txn.drained.set()

    # -- ending ------------------------------------------------------------------------------
    async def _end(
        self, txn: Transaction, *, commit: bool, bump: bool, answer_at_prepare: bool = False
    ) -> None:
        """Prepare durably, write the markers, complete durably (the module's steps 1-4);
        `answer_at_prepare`: return after step 2, the rest in a task (`settled`)."""
        marker_epoch = txn.producer_epoch
        if bump:  # fences the incarnation whose transaction this is
            txn.last_epoch = -1
            fenced = next_epoch(txn.producer_epoch)
            if fenced is not None:
                txn.producer_epoch = marker_epoch = fenced
        txn.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        self._index(txn)
        txn.ending = True
        handed_over = False
        try:
            self._store(txn, f"preparing the end of transaction {txn.transactional_id!r}")
            while txn.appends_in_flight:
                txn.drained = asyncio.Event()
                await txn.drained.wait()
            txn.drained = None
            if answer_at_prepare:
                task = asyncio.create_task(self._complete_in_background(txn, marker_epoch))
                self._completing[txn.transactional_id] = task
                task.add_done_callback(functools.partial(self._completed, txn.transactional_id))
                handed_over = True  # the task ends the `ending`
                return
            await self._complete(txn, marker_epoch)
        finally:
            if not handed_over:
                txn.ending = False

    async def _complete_in_background(self, txn: Transaction, marker_epoch: int) -> bool:
        try:
            return await self._complete(txn, marker_epoch)
        except Exception:  # still prepared: the timeout check completes it
            log.exception("transaction %r: completing failed; trying again", txn.transactional_id)
            return False
        finally:
            txn.ending = False

    def _completed(self, transactional_id: str, task: asyncio.Task[bool]) -> None:
        if self._completing.get(transactional_id) is task:
            del self._completing[transactional_id]

    async def complete(self, txn: Transaction) -> bool:
        """Finish a prepared transaction no request is ending (after a crash, or a failed marker)."""
        if txn.ending:
            return False
        txn.ending = True
        try:
            return await self._complete(txn, txn.producer_epoch)
        finally:
            txn.ending = False

    async def _complete(self, txn: Transaction, marker_epoch: int) -> bool:
        """Write the markers of a prepared transaction and store it complete; False if a marker failed."""
        assert txn.state.preparing
        commit = txn.state is TxnState.PREPARE_COMMIT
        partitions = sorted(txn.partitions)
        # This end's `last_end` replaces the previous one's: those markers must be durable first
        # (before any marker is written, so an fsync that keeps failing adds no marker per retry).
        if not await self._marker_syncs.durable(txn):
            return False
        write_all = functools.partial(self._write_all, partitions, txn.producer_id, marker_epoch, commit)
        results = await self._in_thread(write_all)
        written = checked_results(results, txn.transactional_id, "markers not all written")
        if written is None:
            return False
        records: dict[str, dict[str, Any]] = {}
        by_group: dict[str, list[tuple[str, int, CommittedOffset]]] = {}
        if commit:
            for (group_id, topic, partition), committed in txn.offsets.items():
                # A plain OffsetCommit made after the TxnOffsetCommit is the newer one and
                # stays (Kafka orders them by their records' places in its offsets log).
                current = self.groups.committed(group_id).get((topic, partition))
                if current is None or current.commit_ms <= committed.commit_ms:
                    by_group.setdefault(group_id, []).append((topic, partition, committed))
            for group_id, offsets in by_group.items():
                records.update(self.groups.commit_records(group_id, offsets))
        final = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        # No await from here to the write: a topic deleted meanwhile (drop_topic_ends cleans only
        # stored ends) is not named, or a topic made again under its name would be taken for it.
        last_end = {
            "pid": txn.producer_id,
            "epoch": marker_epoch,
            "commit": commit,
            "markers": [
                [tp.topic, tp.partition, offset]
                for tp, offset in zip(partitions, written, strict=True)
                if isinstance(offset, int) and self._topic_exists(tp.topic)
            ],
        }
        record = {
            **txn.record(),
            "state": final.value,
            "offsets": [],
            "updated_ms": self._clock_ms(),
            "last_end": last_end,
        }
        records[store_key(TXN, txn.transactional_id)] = record
        try:
            # One commit: the offsets are the group's exactly when the transaction is complete.
            self.store.write(records, f"completing transaction {txn.transactional_id!r}")
        except OncelogError as exc:
            log.warning("transaction %r: completion not stored, retrying: %s", txn.transactional_id, exc)
            return False
        self._forget(txn)
        txn.state, txn.offsets, txn.updated_ms = final, {}, record["updated_ms"]
        txn.last_end = last_end
        self._stored[txn.transactional_id] = record
        self._marker_syncs.start(txn)
        for group_id, offsets in by_group.items():
            self.groups.apply_commit(group_id, offsets)
        self._wake(partitions)  # read_committed fetches waiting on these partitions' stable offsets
        return True

    async def markers_durable(self, transactional_id: str) -> bool:
        """Whether the markers of the end last completed for `transactional_id` are fsynced
        (waiting for the fsync under way, and trying it again if it failed)."""
        txn = self.transactions.get(transactional_id)
        return txn is None or await self._marker_syncs.durable(txn)

    def holds(self, producer_id: int, tp: TopicPartition) -> bool:
        """Whether a transaction this coordinator will end holds `tp` for `producer_id`."""
        txn = self._by_producer.get(producer_id)
        return txn is not None and txn.transactional_id in self._unsettled and tp in txn.partitions

    def _write_all(
        self, partitions: list[TopicPartition], producer_id: int, epoch: int, commit: bool
    ) -> list[int | Exception | None]:
        """Each partition's marker in turn, in one worker thread (a thread each only added
        hand-offs: the writes hold the GIL), every one tried: a failure is returned in its place."""
        results: list[int | Exception | None] = []
        for tp in partitions:
            try:
                results.append(self._write_one(tp, producer_id, epoch, commit))
            except Exception as exc:  # (as asyncio.gather's return_exceptions keeps it)
                results.append(exc)
        return results

    def _write_one(self, tp: TopicPartition, producer_id: int, epoch: int, commit: bool) -> int | None:
        """The marker's offset; None when skipped (nothing of the transaction is left open there)."""
        try:
            return self._write_marker(tp, producer_id, epoch, commit, self.coordinator_epoch)
        except UnknownTopicOrPartitionError:
            log.info("transaction marker to %s skipped: the partition is gone", tp)
        except InvalidProducerEpochError as exc:
            # A newer epoch already wrote to the partition, so this transaction's data there
            # was closed by that epoch's marker or fencing: nothing is left to end.
            log.info("transaction marker to %s skipped: %s", tp, exc)
        return None

    async def run_timeouts(self) -> None:
        """Abort transactions open past their timeout; retry ends whose markers failed; expire idle ids."""
        expired_at = time.monotonic()
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            self.check_timeouts()
            if time.monotonic() - expired_at >= EXPIRY_CHECK_S:
                expired_at = time.monotonic()
                self.expire_ids()

    def expire_ids(self) -> int:
        """Forget transactional ids idle (no transaction open) past `expiration_ms`, as Kafka does.

        A producer that comes back with one starts afresh with a new producer id. If the
        store cannot delete them, they stay until the next check.
        """
        now = self._clock_ms()
        idle = [
            txn
            for txn in self.transactions.values()
            if txn.transactional_id not in self._unsettled
            and not self._marker_syncs.pending(txn.transactional_id)
            and not txn.ending
            and txn.appends_in_flight == 0
            and now - txn.updated_ms > self.expiration_ms
        ]
        if not idle:
            return 0
        try:
            self.store.delete(
                [store_key(TXN, txn.transactional_id) for txn in idle],
                f"expiring {len(idle)} transactional ids",
            )
        except OncelogError as exc:
            log.warning("transactional id expiry: %s", exc)
            return 0
        for txn in idle:
            self._forget(txn)
            del self.transactions[txn.transactional_id]
            self._stored.pop(txn.transactional_id, None)
            if self._by_producer.get(txn.producer_id) is txn:
                del self._by_producer[txn.producer_id]
        log.info("expired %d transactional ids idle past %d ms", len(idle), self.expiration_ms)
        return len(idle)

    def check_timeouts(self) -> list[asyncio.Task[None]]:
        """Start an abort of each transaction past its timeout, and a retry of each unfinished end.

        Each runs as its own task, so one that waits (on appends in flight, a slow marker)
        holds up no other; the tasks are returned for whoever wants to wait on them.
        """
        now = self._clock_ms()
        started = []
        self._marker_syncs.retry_failed()
        for txn in list(self._unsettled.values()):
            if txn.ending or txn.transactional_id in self._checking:
                continue
            if txn.state.preparing or now > txn.started_ms + txn.timeout_ms:
                task = asyncio.create_task(self._settle(txn))
                self._checking[txn.transactional_id] = task
                task.add_done_callback(functools.partial(self._checked, txn.transactional_id))
                started.append(task)
        return started

    def _checked(self, transactional_id: str, task: asyncio.Task[None]) -> None:
        self._checking.pop(transactional_id, None)

    async def _settle(self, txn: Transaction) -> None:
        try:
            if txn.state.preparing:
                await self.complete(txn)
            elif txn.state is TxnState.ONGOING and not txn.ending:
                log.info(
                    "aborting transaction %r: open past its %d ms timeout",
                    txn.transactional_id,
                    txn.timeout_ms,
                )
                await self._end(txn, commit=False, bump=True)
        except TxnError as exc:  # a store write failed; the next round tries again
            log.warning("transaction %r: %s", txn.transactional_id, exc)
        except Exception:  # never let one transaction's failure stop the others' timeouts
            log.exception("transaction %r: settling failed; trying again", txn.transactional_id)

    def drop_offsets(self, group_id: str, partitions: Collection[tuple[str, int]] | None) -> None:
        """Forget the uncommitted offsets transactions hold for `group_id` (of `partitions`, or
        all), stored before it returns (TxnError if a write fails): as Kafka drops a deleted
        group's or offset's pending transactional offsets, so that a commit after the delete
        does not bring them back. A transaction completing reads them only once its markers
        are written, so one under way commits what is left."""
        for txn in list(self._unsettled.values()):
            dropped = {
                key
                for key in txn.offsets
                if key[0] == group_id and (partitions is None or (key[1], key[2]) in partitions)
            }
            if dropped:
                txn.offsets = {key: value for key, value in txn.offsets.items() if key not in dropped}
                self._store(
                    txn, f"offsets of transaction {txn.transactional_id!r} without group {group_id!r}'s"
                )
                self._index(txn)

    def drop_topic_ends(self, topic: str) -> None:
        """Forget a deleted topic's markers in every stored `last_end` (stored before it returns;
        TxnError if a write fails): a topic made again under the name starts its offsets anew,
        and a start must not take its transactions for ends whose markers were lost."""
        for txn in self.transactions.values():
            end = txn.last_end
            if end is not None and any(marker[0] == topic for marker in end["markers"]):
                txn.last_end = {**end, "markers": [m for m in end["markers"] if m[0] != topic]}
                self._store(txn, f"the last end of {txn.transactional_id!r} without topic {topic!r}")

    def drop_topic_offsets(self, topic: str) -> None:
        """Forget the uncommitted offsets transactions hold for a deleted topic, in every group."""
        for group_id in sorted(
            {key[0] for txn in self._unsettled.values() for key in txn.offsets if key[1] == topic}
        ):
            held = {
                (t, p)
                for txn in self._unsettled.values()
                for g, t, p in txn.offsets
                if g == group_id and t == topic
            }
            self.drop_offsets(group_id, held)

    def _holds_offsets(self, group_id: str, topic: str, partition: int) -> bool:
        return bool(self._holders[(group_id, topic, partition)] > 0)

    def _index(self, txn: Transaction) -> None:
        """Bring the indexes up to date with `txn` (after any change of its state or offsets)."""
        self._forget(txn)
        tid = txn.transactional_id
        if txn.state in (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            self._unsettled[tid] = txn
        if txn.offsets:
            held = self._held[tid] = set(txn.offsets)
            self._holders.update(held)

    def _forget(self, txn: Transaction) -> None:
        tid = txn.transactional_id
        self._unsettled.pop(tid, None)
        held = self._held.pop(tid, set())
        self._holders.subtract(held)
        for key in held:
            if self._holders[key] <= 0:
                del self._holders[key]

    def _store(self, txn: Transaction, what: str) -> None:
        """Store `txn` as it now is; if that fails, put it back as last stored and refuse the request.

        COORDINATOR_NOT_AVAILABLE is retriable in every client: nothing was decided.
        """
        txn.updated_ms = self._clock_ms()
        record = txn.record()
        try:
            self.store.write({store_key(TXN, txn.transactional_id): record}, f"storing {what}")
        except OncelogError as exc:
            stored = self._stored.get(txn.transactional_id)
            if stored is not None:
                if self._by_producer.get(txn.producer_id) is txn:
                    del self._by_producer[txn.producer_id]
                self._forget(txn)
                txn.restore(stored)
                self._index(txn)
                self._by_producer[txn.producer_id] = txn
            raise TxnError(ErrorCode.coordinator_not_available, f"{what} failed: {exc}") from exc
        self._stored[txn.transactional_id] = record
