"""TransactionCoordinator on its own: epochs, the two-phase end, crash completion and timeouts.

Markers go to a recording writer (or one that fails on demand) instead of logs, and the
clock is moved by hand. The real-client behaviour is in test_wire_transactions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.errors import MetadataWriteError
from oncelog.layout import TopicPartition
from oncelog.producer_ids import MAX_EPOCH, ProducerIdManager
from oncelog.server.coordinator_store import TXN, CoordinatorStore
from oncelog.server.group_coordinator import CommittedOffset, GroupCoordinator, GroupLimits
from oncelog.server.txn_coordinator import TransactionCoordinator, TxnError, TxnState
from oncelog.storage.fs import DEFAULT_FS

TP0 = TopicPartition("out", 0)
TP1 = TopicPartition("out", 1)
Marker = tuple[TopicPartition, int, int, bool, int]


class Markers:
    """Records every marker (its offset: its place in `written`); raises OSError for markers
    while `failing` is set. `synced` records each partition fsynced, failing while
    `sync_failing` is set."""

    def __init__(self) -> None:
        self.written: list[Marker] = []
        self.failing = False
        self.failing_partitions: set[TopicPartition] = set()
        self.tried: list[TopicPartition] = []
        self.synced: list[TopicPartition] = []
        self.sync_failing = False

    def __call__(self, tp: TopicPartition, pid: int, epoch: int, commit: bool, coordinator_epoch: int) -> int:
        self.tried.append(tp)
        if self.failing or tp in self.failing_partitions:
            raise OSError(5, "injected marker failure")
        self.written.append((tp, pid, epoch, commit, coordinator_epoch))
        return len(self.written) - 1

    def sync(self, tp: TopicPartition, end_offset: int) -> None:
        assert end_offset > 0
        if self.sync_failing:
            raise OSError(5, "injected fsync failure")
        self.synced.append(tp)


class FailingStore(CoordinatorStore):
    """A CoordinatorStore whose writes raise MetadataWriteError (a full disk) while `failing` is set."""

    failing = False

    def write(self, records: Any, what: str) -> None:
        if self.failing:
            raise MetadataWriteError(f"{what} failed: No space left on device", path=self.path, errno=28)
        super().write(records, what)


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.now_ms = 1_000_000
        self.markers = Markers()
        self.woken: list[TopicPartition] = []
        # While set and not open, marker writes wait for it (a slow disk).
        self.marker_gate: asyncio.Event | None = None
        self.deleted_topics: set[str] = set()

    def open(self) -> tuple[TransactionCoordinator, Callable[[], None]]:
        store = FailingStore.open(DEFAULT_FS, str(self.root))
        self.store = store
        ids = ProducerIdManager.open(self.root / "ids")
        groups = GroupCoordinator(store, GroupLimits())

        async def in_thread(call: Callable[[], Any]) -> Any:
            if self.marker_gate is not None:
                await self.marker_gate.wait()
            return call()

        def wake(partitions: Iterable[TopicPartition]) -> None:
            self.woken.extend(partitions)

        coordinator = TransactionCoordinator(
            store,
            ids,
            groups,
            self.markers,
            in_thread,
            wake,
            sync_partition=self.markers.sync,
            topic_exists=lambda topic: topic not in self.deleted_topics,
            max_timeout_ms=60_000,
            clock_ms=lambda: self.now_ms,
        )

        def close() -> None:
            store.close()
            ids.close()

        return coordinator, close

    def run(self, scenario: Callable[[TransactionCoordinator], Any]) -> Any:
        coordinator, close = self.open()
        try:
            return asyncio.run(scenario(coordinator))
        finally:
            close()


class Refused:
    """`with Refused(code):` the block raises TxnError with `code`."""

    def __init__(self, code: ErrorCode) -> None:
        self.code = code

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        assert isinstance(exc, TxnError), f"expected TxnError({self.code.name}), got {exc!r}"
        assert exc.code == self.code, f"expected {self.code.name}, got {exc.code.name}: {exc}"
        return True


def test_each_init_keeps_the_producer_id_and_bumps_the_epoch(tmp_path: Path) -> None:
    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        assert epoch == 0
        assert await c.init_producer_id("app", 10_000, -1, -1) == (pid, 1)
        assert (await c.init_producer_id("other", 10_000, -1, -1))[0] != pid

    World(tmp_path).run(scenario)


def test_a_commit_writes_markers_then_applies_its_offsets_in_the_same_store_commit(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> int:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0, TP1])
        c.add_offsets("app", pid, epoch, "group")
        c.commit_offsets("app", pid, epoch, "group", [("in", 0, CommittedOffset(17, -1, "", 5))])
        assert c.groups.pending_transactional("group", "in", 0)
        assert c.groups.committed("group") == {}
        await c.end("app", pid, epoch, True)
        await c.settled("app")  # its markers, written after the answer
        assert world.markers.written == [(TP0, pid, epoch, True, 0), (TP1, pid, epoch, True, 0)]
        assert c.groups.committed("group")[("in", 0)].offset == 17
        assert not c.groups.pending_transactional("group", "in", 0)
        assert set(world.woken) == {TP0, TP1}
        await c.end("app", pid, epoch, True)  # a retry of the completed commit succeeds
        await c.settled("app")  # its markers, written after the answer
        with Refused(ErrorCode.invalid_txn_state):
            await c.end("app", pid, epoch, False)
        return pid

    pid = world.run(scenario)

    async def after_restart(c: TransactionCoordinator) -> None:
        assert c.coordinator_epoch == 1
        assert c.transactions["app"].state is TxnState.COMPLETE_COMMIT
        assert c.groups.committed("group")[("in", 0)].offset == 17
        assert c.transactions["app"].producer_id == pid

    world.run(after_restart)


def test_an_abort_discards_the_offsets(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_offsets("app", pid, epoch, "group")
        c.commit_offsets("app", pid, epoch, "group", [("in", 0, CommittedOffset(17, -1, "", 5))])
        await c.end("app", pid, epoch, False)
        await c.settled("app")  # its markers, written after the answer
        assert c.groups.committed("group") == {}
        assert not c.groups.pending_transactional("group", "in", 0)

    world.run(scenario)


def test_end_txn_is_answered_once_prepared_and_the_next_request_waits_for_the_markers(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        world.marker_gate = asyncio.Event()
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0, TP1])
        c.add_offsets("app", pid, epoch, "group")
        c.commit_offsets("app", pid, epoch, "group", [("in", 0, CommittedOffset(17, -1, "", 5))])
        await c.end("app", pid, epoch, True)  # answered with no marker written
        assert c.transactions["app"].state is TxnState.PREPARE_COMMIT
        assert world.markers.written == [] and world.woken == []
        assert c.groups.committed("group") == {}  # not the group's before the markers
        fetching = asyncio.ensure_future(c.offsets_settled("group"))  # an OffsetFetch of it
        unrelated = asyncio.ensure_future(c.offsets_settled("other"))
        stored = {record["id"]: record["state"] for record, _ in world.store.records(TXN, "id", dict)}
        assert stored["app"] == TxnState.PREPARE_COMMIT.value  # decided, durably
        waiting = asyncio.ensure_future(c.settled("app"))
        retried = asyncio.ensure_future(c.end("app", pid, epoch, True))  # a retry of the answered end
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done() and not retried.done() and not fetching.done()
        assert unrelated.done()
        world.marker_gate.set()
        await asyncio.gather(waiting, retried, fetching)
        assert c.groups.committed("group")[("in", 0)].offset == 17
        assert world.markers.written == [(TP0, pid, epoch, True, 0), (TP1, pid, epoch, True, 0)]
        assert c.transactions["app"].state is TxnState.COMPLETE_COMMIT
        assert set(world.woken) == {TP0, TP1}
        c.add_partitions("app", pid, epoch, [TP0])  # the next transaction
        assert c.transactions["app"].state is TxnState.ONGOING

    world.run(scenario)


def test_a_crash_after_end_txn_was_answered_and_before_its_markers_completes_them_at_the_next_start(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)

    async def first_life(c: TransactionCoordinator) -> tuple[int, int]:
        world.marker_gate = asyncio.Event()  # never opened: the process dies first
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0])
        c.add_offsets("app", pid, epoch, "group")
        c.commit_offsets("app", pid, epoch, "group", [("in", 0, CommittedOffset(7, -1, "", 1))])
        await c.end("app", pid, epoch, False)  # the producer was told: aborted
        return pid, epoch

    pid, epoch = world.run(first_life)
    assert world.markers.written == []
    world.marker_gate = None

    async def second_life(c: TransactionCoordinator) -> None:
        (unfinished,) = c.unfinished()
        assert unfinished.state is TxnState.PREPARE_ABORT
        assert await c.complete(unfinished)
        assert world.markers.written == [(TP0, pid, epoch, False, 1)]  # the outcome it was told
        assert c.groups.committed("group") == {}

    world.run(second_life)


def test_a_plain_offset_commit_after_the_answer_outlives_the_transactions_older_offsets(
    tmp_path: Path,
) -> None:
    # Found by a red-team helper: the completion applied the transaction's offsets over a
    # plain commit made after commit_transaction returned (Kafka keeps the later one).
    world = World(tmp_path)

    async def first_life(c: TransactionCoordinator) -> None:
        world.marker_gate = asyncio.Event()
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0])
        c.add_offsets("app", pid, epoch, "group")
        sent_ms = world.now_ms
        c.commit_offsets("app", pid, epoch, "group", [("in", 0, CommittedOffset(11, -1, "", sent_ms))])
        await c.end("app", pid, epoch, True)
        world.now_ms += 5
        c.groups.commit("group", [("in", 0, CommittedOffset(15, -1, "", world.now_ms))])  # the consumer's own
        # The process dies here, the markers unwritten.

    world.run(first_life)
    world.marker_gate = None

    async def second_life(c: TransactionCoordinator) -> None:
        (unfinished,) = c.unfinished()
        assert await c.complete(unfinished)
        assert c.groups.committed("group")[("in", 0)].offset == 15

    world.run(second_life)

    async def third_life(c: TransactionCoordinator) -> None:
        assert c.groups.committed("group")[("in", 0)].offset == 15

    world.run(third_life)


def test_a_new_incarnation_aborts_the_open_transaction_and_fences_the_old_one(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0])
        assert c.admit_append(pid, epoch, TP0) == ErrorCode.none
        c.appended(pid)
        new_pid, new_epoch = await c.init_producer_id("app", 10_000, -1, -1)
        assert new_pid == pid and new_epoch > epoch + 1
        # The abort marker carries an epoch above the zombie's, so its partition fences it too.
        assert world.markers.written == [(TP0, pid, epoch + 1, False, 0)]
        assert c.admit_append(pid, epoch, TP0) == ErrorCode.invalid_producer_epoch
        with Refused(ErrorCode.producer_fenced):
            c.add_partitions("app", pid, epoch, [TP0])
        with Refused(ErrorCode.producer_fenced):
            await c.end("app", pid, epoch, True)
        with Refused(ErrorCode.invalid_producer_id_mapping):
            c.add_partitions("app", pid + 1000, new_epoch, [TP0])

    world.run(scenario)


def test_a_crash_after_prepare_is_completed_by_the_next_start_with_a_newer_coordinator_epoch(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)

    async def first_life(c: TransactionCoordinator) -> tuple[int, int]:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0])
        c.add_offsets("app", pid, epoch, "group")
        c.commit_offsets("app", pid, epoch, "group", [("in", 3, CommittedOffset(99, -1, "", 5))])
        world.markers.failing = True  # the process "dies" with the commit decided, no marker written
        await c.end("app", pid, epoch, True)
        await c.settled("app")  # its markers, written after the answer
        assert c.transactions["app"].state is TxnState.PREPARE_COMMIT
        with Refused(ErrorCode.concurrent_transactions):
            c.add_partitions("app", pid, epoch, [TP1])
        with Refused(ErrorCode.concurrent_transactions):
            await c.init_producer_id("app", 10_000, -1, -1)
        return pid, epoch

    pid, epoch = world.run(first_life)
    world.markers.failing = False

    async def second_life(c: TransactionCoordinator) -> None:
        (unfinished,) = c.unfinished()
        assert unfinished.transactional_id == "app"
        assert c.groups.committed("group") == {}
        assert await c.complete(unfinished)
        assert world.markers.written == [(TP0, pid, epoch, True, 1)]
        assert c.transactions["app"].state is TxnState.COMPLETE_COMMIT
        assert c.groups.committed("group")[("in", 3)].offset == 99

    world.run(second_life)


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_epoch_fenced(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 5_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0])
        world.now_ms += 4_000
        await asyncio.gather(*c.check_timeouts())
        assert c.transactions["app"].state is TxnState.ONGOING
        world.now_ms += 2_000
        await asyncio.gather(*c.check_timeouts())
        assert c.transactions["app"].state is TxnState.COMPLETE_ABORT
        assert world.markers.written == [(TP0, pid, epoch + 1, False, 0)]
        assert c.admit_append(pid, epoch, TP0) == ErrorCode.invalid_producer_epoch
        with Refused(ErrorCode.producer_fenced):
            await c.end("app", pid, epoch, True)
        # Kafka fences a timed-out producer: its epoch cannot be bumped, only a fresh init works.
        with Refused(ErrorCode.producer_fenced):
            await c.init_producer_id("app", 5_000, pid, epoch)
        assert await c.init_producer_id("app", 5_000, -1, -1) == (pid, epoch + 2)

    world.run(scenario)


def test_an_epoch_bump_a_producer_asks_for_can_be_retried(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 5_000, -1, -1)
        bumped = await c.init_producer_id("app", 5_000, pid, epoch)
        assert bumped == (pid, epoch + 1)
        assert await c.init_producer_id("app", 5_000, pid, epoch) == bumped  # the retry
        with Refused(ErrorCode.producer_fenced):
            await c.init_producer_id("app", 5_000, pid + 1, epoch)
        with Refused(ErrorCode.invalid_request):
            await c.init_producer_id("app", 5_000, pid, -1)

    world.run(scenario)


def test_the_end_waits_for_appends_in_flight(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0])
        assert c.admit_append(pid, epoch, TP1) == ErrorCode.invalid_txn_state  # not added
        assert c.admit_append(pid, epoch, TP0) == ErrorCode.none
        ending = asyncio.ensure_future(c.end("app", pid, epoch, True))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not ending.done() and world.markers.written == []
        assert c.admit_append(pid, epoch, TP0) == ErrorCode.invalid_txn_state  # no new appends once prepared
        c.appended(pid)
        await ending
        await c.settled("app")
        assert world.markers.written == [(TP0, pid, epoch, True, 0)]

    world.run(scenario)


def test_timeouts_past_the_maximum_and_exhausted_epochs(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        with Refused(ErrorCode.invalid_transaction_timeout):
            await c.init_producer_id("app", 60_001, -1, -1)
        with Refused(ErrorCode.invalid_transaction_timeout):
            await c.init_producer_id("app", 0, -1, -1)
        pid, _ = await c.init_producer_id("app", 10_000, -1, -1)
        c.transactions["app"].producer_epoch = MAX_EPOCH - 2
        assert await c.init_producer_id("app", 10_000, -1, -1) == (pid, MAX_EPOCH - 1)
        new_pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        assert new_pid != pid and epoch == 0

    world.run(scenario)


def test_a_failed_store_write_refuses_the_request_and_leaves_the_transaction_as_stored(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0])
        world.store.failing = True
        with Refused(ErrorCode.coordinator_not_available):
            c.add_partitions("app", pid, epoch, [TP1])
        assert c.transactions["app"].partitions == {TP0}
        with Refused(ErrorCode.coordinator_not_available):
            await c.end("app", pid, epoch, True)
        assert c.transactions["app"].state is TxnState.ONGOING and world.markers.written == []
        with Refused(ErrorCode.coordinator_not_available):
            await c.init_producer_id("app", 10_000, -1, -1)
        assert (c.transactions["app"].producer_epoch, c.transactions["app"].state) == (
            epoch,
            TxnState.ONGOING,
        )
        world.store.failing = False
        await c.end("app", pid, epoch, True)
        await c.settled("app")  # its markers, written after the answer
        assert c.transactions["app"].state is TxnState.COMPLETE_COMMIT

    world.run(scenario)


def test_a_completion_that_cannot_be_stored_stays_prepared_and_is_retried(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0])
        c.add_offsets("app", pid, epoch, "group")
        c.commit_offsets("app", pid, epoch, "group", [("in", 0, CommittedOffset(5, -1, "", 1))])
        original_write = world.store.write

        def fail_the_completion(records: Any, what: str) -> None:
            if what.startswith("completing"):
                raise MetadataWriteError(f"{what} failed: No space left on device", path="x", errno=28)
            original_write(records, what)

        world.store.write = fail_the_completion  # type: ignore[method-assign]
        await c.end("app", pid, epoch, True)  # decided (Prepare stored): the answer is success
        await c.settled("app")  # its markers, written after the answer
        assert c.transactions["app"].state is TxnState.PREPARE_COMMIT
        assert c.groups.committed("group") == {}
        world.store.write = original_write  # type: ignore[method-assign]
        await asyncio.gather(*c.check_timeouts())
        assert c.transactions["app"].state is TxnState.COMPLETE_COMMIT
        assert c.groups.committed("group")[("in", 0)].offset == 5
        assert len(world.markers.written) == 2  # written again: a second marker completes nothing

    world.run(scenario)


def test_a_marker_that_fails_in_one_partition_leaves_the_end_prepared_after_trying_every_other(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    tp2 = TopicPartition("out", 2)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0, TP1, tp2])
        world.markers.failing_partitions = {TP1}
        await c.end("app", pid, epoch, True)  # decided: the answer is success
        await c.settled("app")
        assert c.transactions["app"].state is TxnState.PREPARE_COMMIT  # not complete: TP1 has none
        assert world.markers.tried == [TP0, TP1, tp2]  # the one after the failure was tried too
        assert [m[0] for m in world.markers.written] == [TP0, tp2]
        world.markers.failing_partitions = set()
        await asyncio.gather(*c.check_timeouts())  # the retry
        assert c.transactions["app"].state is TxnState.COMPLETE_COMMIT
        assert [m[0] for m in world.markers.written] == [TP0, tp2, TP0, TP1, tp2]

    world.run(scenario)


def stored_txn(world: World, transactional_id: str) -> dict[str, Any]:
    (record,) = (r for r, _ in world.store.records(TXN, "id", dict) if r["id"] == transactional_id)
    return record


def test_a_completion_is_stored_naming_its_markers_before_they_are_fsynced(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0, TP1])
        world.markers.sync_failing = True  # a slow or failing fsync holds up no next transaction
        await c.end("app", pid, epoch, True)
        await c.settled("app")
        assert c.transactions["app"].state is TxnState.COMPLETE_COMMIT
        assert world.markers.synced == []
        record = stored_txn(world, "app")
        assert record["state"] == TxnState.COMPLETE_COMMIT.value
        # Each marker's partition and offset (the recorder's offsets are 0 and 1), and the outcome.
        assert record["last_end"] == {
            "pid": pid,
            "epoch": epoch,
            "commit": True,
            "markers": [["out", 0, 0], ["out", 1, 1]],
        }
        c.add_partitions("app", pid, epoch, [TP0])  # the next transaction starts at once
        assert c.transactions["app"].state is TxnState.ONGOING
        assert not await c.markers_durable("app")  # tried again: still failing
        world.markers.sync_failing = False
        assert await c.markers_durable("app")
        assert sorted(world.markers.synced) == [TP0, TP1]

    world.run(scenario)


def test_the_next_completion_waits_until_the_last_ends_markers_are_fsynced(tmp_path: Path) -> None:
    """The record names one end whose markers may not be durable: a completion replacing it
    waits for their fsync, so a crash never finds two ends' markers at risk."""
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0])
        world.markers.sync_failing = True
        await c.end("app", pid, epoch, False)
        await c.settled("app")
        first_end = stored_txn(world, "app")["last_end"]
        assert first_end["commit"] is False and first_end["markers"] == [["out", 0, 0]]
        c.add_partitions("app", pid, epoch, [TP1])
        await c.end("app", pid, epoch, True)  # decided and answered, whatever the fsync
        await c.settled("app")
        for _ in range(3):  # retried, adding no marker while the fsync keeps failing
            await asyncio.gather(*c.check_timeouts())
        assert c.transactions["app"].state is TxnState.PREPARE_COMMIT  # not completed over it
        assert len(world.markers.written) == 1
        record = stored_txn(world, "app")
        assert record["state"] == TxnState.PREPARE_COMMIT.value and record["last_end"] == first_end
        world.markers.sync_failing = False
        await asyncio.gather(*c.check_timeouts())
        assert c.transactions["app"].state is TxnState.COMPLETE_COMMIT
        assert TP0 in world.markers.synced
        assert stored_txn(world, "app")["last_end"]["markers"] == [["out", 1, 1]]

    world.run(scenario)


def test_a_topic_deleted_while_an_end_completes_is_not_named_in_its_last_end(tmp_path: Path) -> None:
    """Deleting a topic drops it from the ends stored; one completing meanwhile (its marker
    written before the delete, its record after) must not name it either, or a topic made
    again under the name would be taken for it at the next start."""
    world = World(tmp_path)
    gone = TopicPartition("gone", 0)

    async def scenario(c: TransactionCoordinator) -> None:
        pid, epoch = await c.init_producer_id("app", 10_000, -1, -1)
        c.add_partitions("app", pid, epoch, [TP0, gone])
        world.marker_gate = asyncio.Event()
        await c.end("app", pid, epoch, True)
        for _ in range(5):
            await asyncio.sleep(0)
        world.deleted_topics.add("gone")  # (Broker's delete: the partitions, then drop_topic_ends)
        c.drop_topic_ends("gone")
        world.marker_gate.set()
        await c.settled("app")
        assert [marker[0] for marker in world.markers.written] == [gone, TP0]
        assert stored_txn(world, "app")["last_end"]["markers"] == [["out", 0, 1]]

    world.run(scenario)


def test_a_transaction_waiting_on_an_append_holds_up_no_other_transactions_timeout(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def scenario(c: TransactionCoordinator) -> None:
        stuck_pid, stuck_epoch = await c.init_producer_id("stuck", 1_000, -1, -1)
        c.add_partitions("stuck", stuck_pid, stuck_epoch, [TP0])
        assert c.admit_append(stuck_pid, stuck_epoch, TP0) == ErrorCode.none  # never released
        pid, epoch = await c.init_producer_id("idle", 1_000, -1, -1)
        c.add_partitions("idle", pid, epoch, [TP1])
        world.now_ms += 2_000
        tasks = c.check_timeouts()
        assert len(tasks) == 2
        done, pending = await asyncio.wait(tasks, timeout=1.0)
        assert len(done) == 1 and len(pending) == 1
        assert c.transactions["idle"].state is TxnState.COMPLETE_ABORT
        assert c.transactions["stuck"].state is TxnState.PREPARE_ABORT
        assert c.check_timeouts() == []  # the stuck one is not started twice
        c.appended(stuck_pid)
        await asyncio.gather(*pending)
        assert c.transactions["stuck"].state is TxnState.COMPLETE_ABORT

    world.run(scenario)


def test_unstable_offsets_are_indexed_by_group_and_partition_through_commit_abort_and_restart(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)

    async def first_life(c: TransactionCoordinator) -> None:
        for tid, offset in (("a", 1), ("b", 2)):
            pid, epoch = await c.init_producer_id(tid, 10_000, -1, -1)
            c.add_offsets(tid, pid, epoch, "group")
            c.commit_offsets(tid, pid, epoch, "group", [("in", 0, CommittedOffset(offset, -1, "", 1))])
        assert c.groups.pending_transactional("group", "in", 0)
        assert not c.groups.pending_transactional("group", "in", 1)
        a = c.transactions["a"]
        await c.end("a", a.producer_id, a.producer_epoch, False)
        await c.settled("a")  # its markers, written after the answer
        assert c.groups.pending_transactional("group", "in", 0)  # "b" still holds it

    async def second_life(c: TransactionCoordinator) -> None:
        assert c.groups.pending_transactional("group", "in", 0)
        b = c.transactions["b"]
        await c.end("b", b.producer_id, b.producer_epoch, True)
        await c.settled("b")  # its markers, written after the answer
        assert not c.groups.pending_transactional("group", "in", 0)
        assert c.groups.committed("group")[("in", 0)].offset == 2

    world.run(first_life)
    world.run(second_life)


def test_transactional_ids_idle_past_the_expiration_are_forgotten_but_not_open_ones(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def first_life(c: TransactionCoordinator) -> int:
        c.expiration_ms = 10_000
        idle_pid, _ = await c.init_producer_id("idle", 60_000, -1, -1)
        pid, epoch = await c.init_producer_id("done", 60_000, -1, -1)
        c.add_partitions("done", pid, epoch, [TP0])
        await c.end("done", pid, epoch, True)
        await c.settled("done")  # its markers, written after the answer
        assert await c.markers_durable("done")  # (not expired before: a start may need its record)
        pid, epoch = await c.init_producer_id("open", 60_000, -1, -1)
        c.add_partitions("open", pid, epoch, [TP1])
        world.now_ms += 5_000
        assert c.expire_ids() == 0
        world.now_ms += 6_000
        assert c.expire_ids() == 2
        assert set(c.transactions) == {"open"}
        assert c.admit_append(idle_pid, 0, TP0) == ErrorCode.invalid_txn_state
        return idle_pid

    idle_pid = world.run(first_life)

    async def second_life(c: TransactionCoordinator) -> None:
        assert set(c.transactions) == {"open"}
        pid, epoch = await c.init_producer_id("idle", 60_000, -1, -1)
        assert pid != idle_pid and epoch == 0  # starts afresh, as in Kafka

    world.run(second_life)
