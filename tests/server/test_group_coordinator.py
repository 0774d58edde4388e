"""GroupCoordinator on its own: membership, rebalances, generation fencing and durable offsets.

Driven directly (no sockets) on an event loop with a hand-moved clock, so every timeout
is exact. The real-client behaviour is in test_groups.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kio.schema.errors import ErrorCode

from oncelog.errors import CorruptMetadataError
from oncelog.server import group_admin
from oncelog.server.coordinator_store import CoordinatorStore
from oncelog.server.group_coordinator import (
    CommittedOffset,
    GroupCoordinator,
    GroupLimits,
    GroupState,
    JoinResult,
)
from oncelog.server.txn_state import TxnError
from oncelog.storage.fs import DEFAULT_FS

_T = TypeVar("_T")
PROTOCOLS = [("range", b"range-meta"), ("roundrobin", b"rr-meta")]
SESSION_MS = 10_000
LIVENESS_S = 15.0  # a bound on waits that must end at once, so a regression fails instead of hanging


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def run(test: Callable[[GroupCoordinator, Clock], Awaitable[_T]], root: Path, **limits: Any) -> _T:
    clock = Clock()
    store = CoordinatorStore.open(DEFAULT_FS, str(root))
    try:
        settings = GroupLimits(**{"initial_rebalance_delay_ms": 0, **limits})
        coordinator = GroupCoordinator(store, settings, clock, lambda: int(clock.now_s * 1000))
        return asyncio.run(test(coordinator, clock))
    finally:
        store.close()


def join(coordinator: GroupCoordinator, member_id: str = "", **kw: Any) -> asyncio.Task[JoinResult]:
    return asyncio.ensure_future(
        coordinator.join(
            kw.get("group", "g"),
            member_id,
            None,
            "client",
            kw.get("session_ms", SESSION_MS),
            kw.get("rebalance_ms", 30_000),
            "consumer",
            kw.get("protocols", PROTOCOLS),
            member_id_required=False,
        )
    )


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def stable_pair(coordinator: GroupCoordinator) -> tuple[JoinResult, JoinResult]:
    """Two members joined and synced: the leader assigned p0 to itself and p1 to the other."""
    first = await join(coordinator)
    assert first.error == ErrorCode.none and first.generation == 1
    await coordinator.sync("g", 1, first.member_id, None, None, None, [(first.member_id, b"p0")])
    second_task = join(coordinator)
    await settle()
    rejoin = join(coordinator, first.member_id)
    leader, second = await rejoin, await second_task
    assert leader.generation == second.generation == 2
    assignments = [(leader.member_id, b"p0"), (second.member_id, b"p1")]
    sync_second = asyncio.ensure_future(coordinator.sync("g", 2, second.member_id, None, None, None, []))
    await settle()
    assert (
        await coordinator.sync("g", 2, leader.member_id, None, None, None, assignments)
    ).assignment == b"p0"
    assert (await sync_second).assignment == b"p1"
    return leader, second


def test_a_lone_member_leads_generation_1_and_gets_its_own_metadata(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        result = await join(coordinator)
        assert result.error == ErrorCode.none
        assert result.generation == 1 and result.leader == result.member_id
        assert result.protocol_name == "range"
        assert result.members == ((result.member_id, None, b"range-meta"),)

    run(scenario, tmp_path)


def test_the_leader_sees_every_member_and_followers_see_none(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        leader, follower = await stable_pair(coordinator)
        assert {m for m, _, _ in leader.members} == {leader.member_id, follower.member_id}
        assert follower.members == ()
        assert coordinator.groups["g"].state is GroupState.STABLE

    run(scenario, tmp_path)


def test_a_member_past_its_session_timeout_is_dropped_and_its_commit_refused(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        leader, follower = await stable_pair(coordinator)
        clock.now_s += SESSION_MS / 1000 - 1
        assert coordinator.heartbeat("g", 2, leader.member_id, None) == ErrorCode.none
        clock.now_s += 2  # the follower stayed silent past its session
        coordinator.sweep()
        assert follower.member_id not in coordinator.groups["g"].members
        assert coordinator.heartbeat("g", 2, leader.member_id, None) == ErrorCode.rebalance_in_progress
        assert coordinator.check_commit("g", 2, follower.member_id) == ErrorCode.unknown_member_id
        # The leader may still commit for generation 2 while the rebalance prepares (Kafka allows it).
        assert coordinator.check_commit("g", 2, leader.member_id) == ErrorCode.none
        rejoined = await join(coordinator, leader.member_id)
        assert rejoined.generation == 3
        assert coordinator.check_commit("g", 2, leader.member_id) == ErrorCode.illegal_generation
        # Generation 3 is current, but its assignment is not known until the leader syncs.
        assert coordinator.check_commit("g", 3, leader.member_id) == ErrorCode.rebalance_in_progress
        await coordinator.sync("g", 3, leader.member_id, None, None, None, [])
        assert coordinator.check_commit("g", 2, leader.member_id) == ErrorCode.illegal_generation
        assert coordinator.check_commit("g", 3, leader.member_id) == ErrorCode.none

    run(scenario, tmp_path)


def test_a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_dropped(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        leader, follower = await stable_pair(coordinator)
        third = join(coordinator)
        await settle()
        rejoin = join(coordinator, leader.member_id)
        # The follower keeps heartbeating (told REBALANCE_IN_PROGRESS) but never rejoins.
        for _ in range(4):
            clock.now_s += 8
            coordinator.heartbeat("g", 2, follower.member_id, None)
            coordinator.sweep()
            await settle()
        assert (await rejoin).generation == 3
        assert (await third).generation == 3
        assert follower.member_id not in coordinator.groups["g"].members

    run(scenario, tmp_path)


def test_simple_commits_need_an_empty_group(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        assert coordinator.check_commit("fresh", -1, "") == ErrorCode.none
        assert coordinator.check_commit("fresh", 3, "somebody") == ErrorCode.illegal_generation
        await stable_pair(coordinator)
        assert coordinator.check_commit("g", -1, "") == ErrorCode.unknown_member_id

    run(scenario, tmp_path)


def test_join_v4_hands_out_a_member_id_first(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        first = await coordinator.join(
            "g", "", None, "c", SESSION_MS, 30_000, "consumer", PROTOCOLS, member_id_required=True
        )
        assert first.error == ErrorCode.member_id_required and first.member_id
        second = await coordinator.join(
            "g",
            first.member_id,
            None,
            "c",
            SESSION_MS,
            30_000,
            "consumer",
            PROTOCOLS,
            member_id_required=True,
        )
        assert second.error == ErrorCode.none and second.member_id == first.member_id
        unknown = await coordinator.join(
            "g", "made-up", None, "c", SESSION_MS, 30_000, "consumer", PROTOCOLS, member_id_required=True
        )
        assert unknown.error == ErrorCode.unknown_member_id

    run(scenario, tmp_path)


def test_joins_outside_the_limits_are_refused_with_kafkas_codes(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        assert (await join(coordinator, session_ms=10)).error == ErrorCode.invalid_session_timeout
        assert (await join(coordinator, group="")).error == ErrorCode.invalid_group_id
        assert (await join(coordinator, protocols=[])).error == ErrorCode.inconsistent_group_protocol
        await join(coordinator)
        other = await join(coordinator, protocols=[("sticky", b"")])
        assert other.error == ErrorCode.inconsistent_group_protocol

    run(scenario, tmp_path)


def test_a_stable_group_carries_on_with_its_members_after_a_reopen_of_the_store(tmp_path: Path) -> None:
    members: list[str] = []

    async def first_life(coordinator: GroupCoordinator, clock: Clock) -> None:
        leader, follower = await stable_pair(coordinator)
        members.extend((leader.member_id, follower.member_id))
        coordinator.commit("g", [("t", 0, CommittedOffset(42, -1, "meta", 7))])

    async def second_life(coordinator: GroupCoordinator, clock: Clock) -> None:
        group = coordinator.groups["g"]
        assert group.generation == 2 and group.state is GroupState.STABLE
        assert list(group.members) == members and group.leader == members[0]
        assert coordinator.committed("g")[("t", 0)] == CommittedOffset(42, -1, "meta", 7)
        assert coordinator.heartbeat("g", 2, members[1], None) == ErrorCode.none
        assert coordinator.check_commit("g", 2, members[1]) == ErrorCode.none
        synced = await coordinator.sync("g", 2, members[1], None, None, None, [])
        assert synced.assignment == b"p1"
        newcomer = join(coordinator)
        await settle()
        clock.now_s += 31  # the restored members never rejoin: dropped once the rebalance times out
        coordinator.sweep()
        assert (await newcomer).generation == 3  # generations keep rising across restarts

    run(first_life, tmp_path)
    run(second_life, tmp_path)


def test_an_evicted_member_does_not_come_back_after_a_reopen_of_the_store(tmp_path: Path) -> None:
    members: list[str] = []

    async def first_life(coordinator: GroupCoordinator, clock: Clock) -> None:
        leader, follower = await stable_pair(coordinator)
        members.extend((leader.member_id, follower.member_id))
        clock.now_s += SESSION_MS / 1000 - 1
        coordinator.heartbeat("g", 2, leader.member_id, None)
        clock.now_s += 2
        coordinator.sweep()  # the follower is evicted; the process dies mid-rebalance

    async def second_life(coordinator: GroupCoordinator, clock: Clock) -> None:
        group = coordinator.groups["g"]
        assert group.generation == 2 and group.state is GroupState.EMPTY and not group.members
        assert coordinator.check_commit("g", 2, members[1]) == ErrorCode.unknown_member_id
        assert coordinator.heartbeat("g", 2, members[0], None) == ErrorCode.unknown_member_id  # rejoin

    run(first_life, tmp_path)
    run(second_life, tmp_path)


def test_leaving_hands_the_partitions_to_the_others(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        leader, follower = await stable_pair(coordinator)
        assert coordinator.leave("g", leader.member_id, None) == ErrorCode.none
        assert coordinator.leave("g", leader.member_id, None) == ErrorCode.unknown_member_id
        rejoined = await join(coordinator, follower.member_id)
        assert rejoined.generation == 3 and rejoined.leader == follower.member_id

    run(scenario, tmp_path)


def test_a_damaged_group_record_is_corrupt_metadata_naming_the_store_and_key(tmp_path: Path) -> None:
    store = CoordinatorStore.open(DEFAULT_FS, str(tmp_path))
    try:
        store.write({"group/g": {"group": "g", "generation": 1}}, "a record with fields missing")
        with pytest.raises(CorruptMetadataError, match="'group/g'") as raised:
            GroupCoordinator(store, GroupLimits())
        assert raised.value.path == store.path
    finally:
        store.close()


def test_an_id_named_after_a_long_ids_hash_keeps_its_own_offsets(tmp_path: Path) -> None:
    long_id = "g" * 600  # past the bytes an LMDB key can hold: keyed by its SHA-256
    impostor = "#" + hashlib.sha256(long_id.encode()).hexdigest()

    async def first_life(coordinator: GroupCoordinator, clock: Clock) -> None:
        coordinator.commit(long_id, [("t", 0, CommittedOffset(7, -1, "", 1))])
        coordinator.commit(impostor, [("t", 0, CommittedOffset(99, -1, "", 1))])

    async def second_life(coordinator: GroupCoordinator, clock: Clock) -> None:
        assert coordinator.committed(long_id)[("t", 0)].offset == 7
        assert coordinator.committed(impostor)[("t", 0)].offset == 99

    run(first_life, tmp_path)
    run(second_life, tmp_path)


def test_a_commit_rewrites_only_the_offsets_not_the_members(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        await stable_pair(coordinator)
        written: list[set[str]] = []
        write = coordinator.store.write

        def record_keys(records: Any, what: str) -> None:
            written.append(set(records))
            write(records, what)

        coordinator.store.write = record_keys  # type: ignore[method-assign]
        coordinator.commit("g", [("t", 0, CommittedOffset(1, -1, "", 1))])
        assert written == [{"offsets/g"}]

    run(scenario, tmp_path)


def test_a_record_under_another_ids_key_is_corrupt_metadata(tmp_path: Path) -> None:
    store = CoordinatorStore.open(DEFAULT_FS, str(tmp_path))
    try:
        store.write({"offsets/h": {"group": "not-h", "offsets": []}}, "a record under another id's key")
        with pytest.raises(CorruptMetadataError, match="'offsets/h'"):
            GroupCoordinator(store, GroupLimits())
    finally:
        store.close()


def test_an_empty_group_without_offsets_is_forgotten_and_one_with_offsets_kept(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        for group_id in ("passing", "keeper"):
            member = await join(coordinator, group=group_id)
            assert coordinator.leave(group_id, member.member_id, None) == ErrorCode.none
        coordinator.commit("keeper", [("t", 0, CommittedOffset(3, -1, "", 1))])
        await settle()
        coordinator.sweep()
        assert "passing" not in coordinator.groups and "keeper" in coordinator.groups
        assert {record["group"] for record, _ in coordinator.store.records("group", "group", dict)} == {
            "keeper"
        }
        assert coordinator._active == set()  # the sweeper has nothing left to visit

    run(scenario, tmp_path)


def test_a_static_members_new_incarnation_takes_its_place_and_fences_the_old_one(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        def static_join(member_id: str) -> Awaitable[JoinResult]:
            return join_static(coordinator, "pod-1", member_id)

        old = await static_join("")  # no MEMBER_ID_REQUIRED round for a static member
        assert old.error == ErrorCode.none and old.generation == 1
        await coordinator.sync("g", 1, old.member_id, "pod-1", None, None, [(old.member_id, b"p")])
        new = await static_join("")  # the pod restarted
        assert new.error == ErrorCode.none and new.member_id != old.member_id
        assert (
            coordinator.heartbeat("g", new.generation, old.member_id, "pod-1") == ErrorCode.fenced_instance_id
        )
        assert coordinator.check_commit("g", 1, old.member_id, "pod-1") == ErrorCode.fenced_instance_id
        assert (await static_join(old.member_id)).error == ErrorCode.fenced_instance_id
        assert coordinator.leave("g", old.member_id, "pod-1") == ErrorCode.fenced_instance_id
        assert (
            coordinator.leave("g", "", "pod-1") == ErrorCode.none
        )  # the new incarnation leaves by instance id
        assert "pod-1" not in {m.instance_id for m in coordinator.groups["g"].members.values()}

    run(scenario, tmp_path)


def join_static(
    coordinator: GroupCoordinator, instance: str, member_id: str = "", protocols: Any = PROTOCOLS
) -> Awaitable[JoinResult]:
    """A JoinGroup v5+ of static member `instance` (KIP-345) in group "g"."""
    return coordinator.join(
        "g", member_id, instance, "c", SESSION_MS, 30_000, "consumer", protocols, member_id_required=True
    )


async def _stable_static_pair(coordinator: GroupCoordinator) -> dict[str, JoinResult]:
    """Static members pod-1 (the leader: p0) and pod-2 (p1), Stable at generation 2."""

    first = await join_static(coordinator, "pod-1")
    await coordinator.sync("g", 1, first.member_id, "pod-1", None, None, [(first.member_id, b"p0")])
    second = asyncio.ensure_future(join_static(coordinator, "pod-2"))
    await settle()
    again = await join_static(coordinator, "pod-1", first.member_id)  # the rebalance pod-2's join started
    joined = {"pod-1": again, "pod-2": await second}
    assert {j.generation for j in joined.values()} == {2} and again.leader == first.member_id
    assignments = [(first.member_id, b"p0"), (joined["pod-2"].member_id, b"p1")]
    synced = await asyncio.gather(
        coordinator.sync("g", 2, first.member_id, "pod-1", None, None, assignments),
        coordinator.sync("g", 2, joined["pod-2"].member_id, "pod-2", None, None, []),
    )
    assert [s.assignment for s in synced] == [b"p0", b"p1"]
    return joined


@pytest.mark.parametrize("restarted", ["pod-1", "pod-2"], ids=["the-leader", "a-follower"])
def test_a_static_member_restarted_in_a_stable_group_gets_its_assignment_back_with_no_rebalance(
    tmp_path: Path, restarted: str
) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        before = await _stable_static_pair(coordinator)
        old = before[restarted]
        other = before["pod-2" if restarted == "pod-1" else "pod-1"]
        # Answered without a rebalance (which would wait for pod-2 on this frozen clock: bounded).
        new = await asyncio.wait_for(
            join_static(coordinator, restarted),
            LIVENESS_S,
        )
        # The same generation, and the leader as it was: the new id is told it does not lead.
        assert (new.error, new.generation, new.leader) == (ErrorCode.none, 2, before["pod-1"].member_id)
        assert new.member_id != old.member_id and new.members == ()
        synced = await coordinator.sync("g", 2, new.member_id, restarted, None, None, [])
        assert synced.assignment == (b"p0" if restarted == "pod-1" else b"p1")
        assert coordinator.groups["g"].state is GroupState.STABLE
        assert coordinator.heartbeat(
            "g", 2, other.member_id, "pod-2" if restarted == "pod-1" else "pod-1"
        ) == (
            ErrorCode.none  # no rebalance for the member that stayed
        )
        assert coordinator.heartbeat("g", 2, old.member_id, restarted) == ErrorCode.fenced_instance_id
        if restarted == "pod-1":
            assert coordinator.groups["g"].leader == new.member_id

    run(scenario, tmp_path)


def test_a_static_member_restarted_while_a_rebalance_is_prepared_takes_its_place_in_it(
    tmp_path: Path,
) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        before = await _stable_static_pair(coordinator)
        leader_rejoin = asyncio.ensure_future(join_static(coordinator, "pod-1", before["pod-1"].member_id))
        await settle()
        assert coordinator.groups["g"].state is GroupState.PREPARING_REBALANCE
        restarted = asyncio.ensure_future(join_static(coordinator, "pod-2"))
        # One rebalance holding both (bounded: a regression answered the leader alone and waited).
        joined = await asyncio.wait_for(asyncio.gather(leader_rejoin, restarted), LIVENESS_S)
        assert [j.generation for j in joined] == [3, 3]
        assert {m[0] for m in joined[0].members} == {before["pod-1"].member_id, joined[1].member_id}
        assert (
            coordinator.heartbeat("g", 3, before["pod-2"].member_id, "pod-2") == ErrorCode.fenced_instance_id
        )

    run(scenario, tmp_path)


def test_a_static_member_restarted_with_protocols_that_change_the_groups_rebalances(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        before = await _stable_static_pair(coordinator)
        rejoining = asyncio.ensure_future(
            join_static(coordinator, "pod-2", protocols=[("roundrobin", b"rr")])
        )
        await settle()
        assert coordinator.groups["g"].state is GroupState.PREPARING_REBALANCE
        assert (
            coordinator.heartbeat("g", 2, before["pod-1"].member_id, "pod-1")
            == ErrorCode.rebalance_in_progress
        )
        rejoined = await join_static(coordinator, "pod-1", before["pod-1"].member_id)
        assert rejoined.generation == 3 and (await rejoining).generation == 3
        assert coordinator.groups["g"].protocol_name == "roundrobin"

    run(scenario, tmp_path)


def test_stop_answers_waiting_joins_and_syncs_not_coordinator_and_every_later_one(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        first, second = await stable_pair(coordinator)
        waiting = join(coordinator)  # a third member: a rebalance the two others must rejoin
        await settle()
        rejoined = join(coordinator, first.member_id)
        await settle()
        assert not waiting.done() and not rejoined.done()  # waiting for the second to rejoin
        coordinator.stop()
        await settle()
        assert waiting.done() and waiting.result().error == ErrorCode.not_coordinator
        assert rejoined.result().error == ErrorCode.not_coordinator
        assert (await join(coordinator)).error == ErrorCode.not_coordinator
        synced = await coordinator.sync("g", second.generation, second.member_id, None, None, None, [])
        assert synced.error == ErrorCode.not_coordinator

    run(scenario, tmp_path)


def test_a_group_without_members_loses_its_offsets_past_the_retention(tmp_path: Path) -> None:
    day_ms = 24 * 3600 * 1000

    async def first_life(coordinator: GroupCoordinator, clock: Clock) -> None:
        now_ms = int(clock.now_s * 1000)
        coordinator.commit("old", [("t", 0, CommittedOffset(1, -1, "", now_ms - 8 * day_ms))])
        coordinator.commit("recent", [("t", 0, CommittedOffset(2, -1, "", now_ms - 6 * day_ms))])
        member = await join(coordinator, group="busy")
        coordinator.commit("busy", [("t", 0, CommittedOffset(3, -1, "", now_ms - 8 * day_ms))])
        assert member.error == ErrorCode.none
        assert coordinator.expire_offsets() == 1
        assert set(coordinator.groups) == {"recent", "busy"}

    async def second_life(coordinator: GroupCoordinator, clock: Clock) -> None:
        assert "old" not in coordinator.groups and coordinator.committed("recent")[("t", 0)].offset == 2

    run(first_life, tmp_path, offsets_retention_ms=7 * day_ms)
    run(second_life, tmp_path, offsets_retention_ms=7 * day_ms)


def test_member_metadata_and_assignments_past_the_limit_are_refused(tmp_path: Path) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        huge = [("range", b"m" * 2048)]
        assert (await join(coordinator, protocols=huge)).error == ErrorCode.invalid_request
        leader = await join(coordinator)
        refused = await coordinator.sync(
            "g", 1, leader.member_id, None, None, None, [(leader.member_id, b"a" * 2048)]
        )
        assert refused.error == ErrorCode.invalid_request
        assert coordinator.groups["g"].state is GroupState.COMPLETING_REBALANCE  # nothing taken
        assert coordinator.groups["g"].members[leader.member_id].syncing is None
        accepted = await coordinator.sync(
            "g", 1, leader.member_id, None, None, None, [(leader.member_id, b"a")]
        )
        assert accepted.error == ErrorCode.none and accepted.assignment == b"a"

    run(scenario, tmp_path, max_member_bytes=1024)


def test_a_delete_whose_transactions_offsets_cannot_be_stored_is_refused_retriably_and_changes_nothing(
    tmp_path: Path,
) -> None:
    async def scenario(coordinator: GroupCoordinator, clock: Clock) -> None:
        coordinator.commit("idle", [("t", 0, CommittedOffset(3, -1, "", 1))])

        def store_fails(group_id: str, partitions: object) -> None:
            raise TxnError(ErrorCode.coordinator_not_available, "storing the transaction failed")

        coordinator.drop_pending_offsets = store_fails
        assert group_admin.delete_groups(coordinator, ["idle"]) == {
            "idle": ErrorCode.coordinator_not_available
        }
        assert group_admin.delete_offsets(coordinator, "idle", [("t", 0)]) == (
            ErrorCode.coordinator_not_available,
            {},
        )
        assert coordinator.committed("idle") == {("t", 0): CommittedOffset(3, -1, "", 1)}

    run(scenario, tmp_path)
