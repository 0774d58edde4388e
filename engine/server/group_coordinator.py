"""The classic consumer-group protocol: membership, rebalances and generation-fenced offsets.

A group moves Empty -> PreparingRebalance -> CompletingRebalance -> Stable, and back to
PreparingRebalance whenever a member joins, leaves, changes its protocols or misses
its session timeout. A rebalance completes when every member has rejoined, or when the
longest rebalance timeout passes (members that did not rejoin are dropped); each one
bumps the generation. The leader receives every member's metadata and hands back the
assignment through SyncGroup.

Offsets are fenced by generation: a commit names its generation and member id, and one
from a member the group no longer has (evicted, left) or from an older generation is
refused, so a consumer that lost its partitions cannot move their offsets. Generation
-1 with an empty member id is a simple (assign-mode) commit, allowed while the group
has no members, as in Kafka.

Everything runs on the event loop; a group's generation and committed offsets are
written to the CoordinatorStore before they are answered. A Stable group's members and
assignments are stored too, and a removal is stored at once: after a restart a Stable
group carries on with its members (as Kafka's do), and any other group starts Empty at
its stored generation (its members rejoin; a zombie's member id is unknown).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Final

from kio.schema.errors import ErrorCode

from oncelog.clock import Clock, MonotonicClock, wall_clock_ms
from oncelog.errors import OncelogError
from oncelog.server.coordinator_store import GROUP, OFFSETS, CoordinatorStore, store_key
from oncelog.server.group_state import (
    CommittedOffset,
    Group,
    GroupLimits,
    GroupState,
    JoinResult,
    Member,
    SyncResult,
)

__all__ = ["CommittedOffset", "GroupCoordinator", "GroupLimits", "GroupState", "JoinResult", "SyncResult"]

log = logging.getLogger("oncelog.server")
# A member's session is checked this often.
SWEEP_INTERVAL_S: Final = 0.2
# How often groups are checked against offsets_retention_ms (Kafka: offsets.retention.check.interval.ms).
RETENTION_CHECK_S: Final = 60.0
MAX_PROTOCOLS: Final = 64


def _offsets_of(record: dict[str, Any]) -> dict[tuple[str, int], CommittedOffset]:
    return {
        (topic, partition): CommittedOffset(*committed) for topic, partition, *committed in record["offsets"]
    }


def _member_refusal(
    group: Group | None, generation: int, member_id: str, instance_id: str | None
) -> ErrorCode | None:
    """Kafka's check of a member's request, in its order: the static fence, the member, the generation."""
    if group is not None and group.fences(member_id, instance_id):
        return ErrorCode.fenced_instance_id
    if group is None or member_id not in group.members:
        return ErrorCode.unknown_member_id
    if generation != group.generation:
        return ErrorCode.illegal_generation
    return None


class GroupCoordinator:
    def __init__(
        self,
        store: CoordinatorStore,
        limits: GroupLimits,
        clock_s: Callable[[], float] = time.monotonic,
        clock_ms: Clock | None = None,
    ):
        self.store = store
        self.limits = limits
        self._clock_s = clock_s
        # Offsets retention is measured on the wall clock, never stepping back (MonotonicClock).
        self._clock_ms: Clock = clock_ms or MonotonicClock(wall_clock_ms)
        self.groups: dict[str, Group] = {}
        now_s = clock_s()
        for _, group in store.records(GROUP, "group", lambda record: Group.from_record(record, now_s)):
            self.groups[group.group_id] = group
        for record, offsets in store.records(OFFSETS, "group", _offsets_of):
            self.groups.setdefault(record["group"], Group(record["group"])).offsets = offsets
        # The groups the sweeper visits: those with members, pending members or a rebalance.
        self._active = {group_id for group_id, group in self.groups.items() if group.members}
        # Whether a transaction holds uncommitted offsets for (group, topic, partition).
        self.pending_transactional: Callable[[str, str, int], bool] = lambda group, topic, partition: False
        # Drops the uncommitted offsets transactions hold for a group's partitions (all: None).
        self.drop_pending_offsets: Callable[[str, Collection[tuple[str, int]] | None], None] = (
            lambda group, partitions: None
        )
        self._stopped = False

    def stop(self) -> None:
        """A shutdown: every JoinGroup and SyncGroup waiting is answered NOT_COORDINATOR at once,
        and every later one too, as Kafka answers when it unloads its groups. A waiting join
        would otherwise hold its connection (and the drain) until its rebalance ended; the
        members find the coordinator again once the server is back, their groups as stored."""
        self._stopped = True
        for group in self.groups.values():
            for member in group.members.values():
                self._fence(member, ErrorCode.not_coordinator)

    # -- membership ---------------------------------------------------------------------
    async def join(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        *,
        member_id_required: bool,
        client_host: str = "",
    ) -> JoinResult:
        refusal = self._join_refusal(group_id, member_id, session_timeout_ms, protocol_type, protocols)
        if refusal is not None:
            return JoinResult(refusal, member_id=member_id)
        group = self.groups.setdefault(group_id, Group(group_id))
        self._active.add(group_id)
        now = self._clock_s()
        if member_id and group.fences(member_id, instance_id):
            return JoinResult(ErrorCode.fenced_instance_id, member_id=member_id)
        if not member_id:
            admitted = self._admit(
                group,
                instance_id,
                (client_id, client_host),
                (session_timeout_ms, rebalance_timeout_ms),
                protocols,
                member_id_required=member_id_required,
            )
            if isinstance(admitted, JoinResult):
                return admitted
            member_id = admitted
        elif member_id in group.pending:
            del group.pending[member_id]
        elif member_id not in group.members:
            return JoinResult(ErrorCode.unknown_member_id, member_id=member_id)
        if not group.members:
            group.protocol_type = protocol_type
        member = group.members.get(member_id)
        changed = member is None or member.protocols != tuple(protocols)
        if member is None:
            member = group.members[member_id] = Member(
                member_id,
                instance_id,
                client_id,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                (),
                client_host=client_host,
            )
        member.protocols = tuple(protocols)
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.deadline_s = now + session_timeout_ms / 1000
        settled = group.state is GroupState.COMPLETING_REBALANCE or (
            group.state is GroupState.STABLE and member_id != group.leader
        )
        if settled and not changed:
            return self._join_result(group, member)  # a retry of the join that completed
        if member.joining is not None and not member.joining.done():
            member.joining.set_result(JoinResult(ErrorCode.rebalance_in_progress, member_id=member_id))
        joined: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.joining = joined
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group)
        self._try_complete_join(group)
        return await joined

    def _admit(
        self,
        group: Group,
        instance_id: str | None,
        client: tuple[str, str],
        timeouts_ms: tuple[int, int],
        protocols: Sequence[tuple[str, bytes]],
        *,
        member_id_required: bool,
    ) -> str | JoinResult:
        """A join with no member id: the id made for it, or the answer that ends the join
        (a static member's rejoin, a full group, KIP-394's MEMBER_ID_REQUIRED)."""
        client_id, _ = client
        session_timeout_ms, rebalance_timeout_ms = timeouts_ms
        member_id = f"{instance_id or client_id or 'member'}-{uuid.uuid4()}"
        previous = group.static_member(instance_id)
        if previous is not None:
            # KIP-345: a static member's new incarnation takes its place; the old one is fenced.
            rejoined = self._rejoin_static_member(
                group, previous, member_id, client, session_timeout_ms, rebalance_timeout_ms, protocols
            )
            if rejoined is not None:
                return rejoined
            if group.state is GroupState.PREPARING_REBALANCE:
                # Kafka's rule too: the new incarnation takes the old one's place in the
                # rebalance under way. Removing the old one first would end the join phase
                # without it (the others have all rejoined) and start another.
                self._fence(previous)
                del group.members[previous.member_id]
                if group.leader == previous.member_id:
                    group.leader = member_id
                self._store_group(
                    group, f"static member {previous.instance_id!r} of {group.group_id!r} rejoining"
                )
            else:
                self._remove_member(group, previous, ErrorCode.fenced_instance_id)
        elif len(group.members) + len(group.pending) >= self.limits.max_size:
            return JoinResult(ErrorCode.group_max_size_reached, member_id=member_id)
        if member_id_required and instance_id is None:  # KIP-394: the client rejoins with this id
            group.pending[member_id] = self._clock_s() + session_timeout_ms / 1000
            return JoinResult(ErrorCode.member_id_required, member_id=member_id)
        return member_id

    def _rejoin_static_member(
        self,
        group: Group,
        previous: Member,
        member_id: str,
        client: tuple[str, str],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocols: Sequence[tuple[str, bytes]],
    ) -> JoinResult | None:
        """A static member restarted while its group is Stable, as Kafka takes it (KIP-345):
        the new member id takes the old one's place and assignment with no rebalance, unless
        its protocols would change the group's; None then (the caller rebalances).

        The answer names the leader as it was: a restarted leader sees another id and
        computes no assignment, which a Stable group would not hand out anyway; its
        SyncGroup gets its assignment back."""
        if group.state is not GroupState.STABLE:
            return None
        kept_protocols = previous.protocols
        previous.protocols = tuple(protocols)
        if group.choose_protocol() != group.protocol_name:
            previous.protocols = kept_protocols
            return None
        leader = group.leader
        self._fence(previous)
        del group.members[previous.member_id]
        client_id, client_host = client
        member = group.members[member_id] = Member(
            member_id,
            previous.instance_id,
            client_id,
            session_timeout_ms,
            rebalance_timeout_ms,
            previous.protocol_type,
            tuple(protocols),
            previous.assignment,
            deadline_s=self._clock_s() + session_timeout_ms / 1000,
            client_host=client_host,
        )
        if leader == previous.member_id:
            group.leader = member_id
        # Stored at once: after a restart the old member id is fenced, not the new one.
        self._store_group(group, f"static member {previous.instance_id!r} of {group.group_id!r} rejoining")
        return JoinResult(
            ErrorCode.none,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            leader,
            member.member_id,
        )

    def _join_refusal(
        self,
        group_id: str,
        member_id: str,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
    ) -> ErrorCode | None:
        """Why a JoinGroup is refused before it touches the group, or None."""
        if self._stopped:
            return ErrorCode.not_coordinator
        limits = self.limits
        if not group_id:
            return ErrorCode.invalid_group_id
        if not limits.min_session_timeout_ms <= session_timeout_ms <= limits.max_session_timeout_ms:
            return ErrorCode.invalid_session_timeout
        if not protocol_type or not protocols or len(protocols) > MAX_PROTOCOLS:
            return ErrorCode.inconsistent_group_protocol
        if sum(len(name) + len(metadata) for name, metadata in protocols) > limits.max_member_bytes:
            return ErrorCode.invalid_request
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id if member_id else None
        if not group.supports(protocol_type, protocols):
            return ErrorCode.inconsistent_group_protocol
        return None

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        assert group.protocol_name is not None
        if member.member_id == group.leader:
            members = tuple(
                (m.member_id, m.instance_id, m.metadata_for(group.protocol_name))
                for m in group.members.values()
            )
        return JoinResult(
            ErrorCode.none,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader,
            member.member_id,
            members,
        )

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Iterable[tuple[str, bytes]],
    ) -> SyncResult:
        if self._stopped:
            return SyncResult(ErrorCode.not_coordinator)
        group = self.groups.get(group_id)
        refusal = _member_refusal(group, generation, member_id, instance_id)
        if refusal is not None:
            return SyncResult(refusal)
        assert group is not None
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(ErrorCode.inconsistent_group_protocol)
        member = group.members[member_id]
        if group.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.rebalance_in_progress)
        if group.state is GroupState.STABLE:
            return SyncResult(ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment)
        assert group.state is GroupState.COMPLETING_REBALANCE
        given = dict(assignments) if member_id == group.leader else {}
        if any(len(assignment) > self.limits.max_member_bytes for assignment in given.values()):
            return SyncResult(ErrorCode.invalid_request)  # nothing taken: the leader may send it again
        member.deadline_s = self._clock_s() + member.session_timeout_ms / 1000
        if member.syncing is not None and not member.syncing.done():
            member.syncing.set_result(SyncResult(ErrorCode.rebalance_in_progress))
        synced: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        member.syncing = synced
        if member_id == group.leader:
            for each in group.members.values():
                each.assignment = given.get(each.member_id, b"")
            group.state = GroupState.STABLE
            self._store_group(group, f"the assignment of generation {group.generation} of {group_id!r}")
            for each in group.members.values():
                if each.syncing is not None and not each.syncing.done():
                    each.syncing.set_result(
                        SyncResult(ErrorCode.none, group.protocol_type, group.protocol_name, each.assignment)
                    )
        return await synced

    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> ErrorCode:
        group = self.groups.get(group_id)
        refusal = _member_refusal(group, generation, member_id, instance_id)
        if refusal is not None:
            return refusal
        assert group is not None
        member = group.members[member_id]
        member.deadline_s = self._clock_s() + member.session_timeout_ms / 1000
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress  # the member must rejoin
        return ErrorCode.none

    def leave(self, group_id: str, member_id: str, instance_id: str | None) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.fences(member_id, instance_id):
            return ErrorCode.fenced_instance_id
        if not member_id and instance_id is not None:
            static = group.static_member(instance_id)
            member_id = static.member_id if static is not None else ""
        if group.pending.pop(member_id, None) is not None:
            return ErrorCode.none
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        self._remove_member(group, group.members[member_id])
        return ErrorCode.none

    def _remove_member(
        self, group: Group, member: Member, answer: ErrorCode = ErrorCode.unknown_member_id
    ) -> None:
        del group.members[member.member_id]
        self._fence(member, answer)
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group)
        # Written at once: a member that left or was evicted must not come back after a restart.
        self._store_group(group, f"the removal of member {member.member_id!r} from {group.group_id!r}")
        self._try_complete_join(group)

    @staticmethod
    def _fence(member: Member, answer: ErrorCode = ErrorCode.fenced_instance_id) -> None:
        """Answer `member`'s waiting JoinGroup and SyncGroup with `answer`: it is gone."""
        if member.joining is not None and not member.joining.done():
            member.joining.set_result(JoinResult(answer))
        if member.syncing is not None and not member.syncing.done():
            member.syncing.set_result(SyncResult(answer))

    # -- rebalances -----------------------------------------------------------------------
    def _prepare_rebalance(self, group: Group) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                member.assignment = b""
                if member.syncing is not None and not member.syncing.done():
                    member.syncing.set_result(SyncResult(ErrorCode.rebalance_in_progress))
        now = self._clock_s()
        longest_s = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
        group.initial_delay = group.state is GroupState.EMPTY and self.limits.initial_rebalance_delay_ms > 0
        if group.initial_delay:
            group.rebalance_deadline_s = now + min(self.limits.initial_rebalance_delay_ms / 1000, longest_s)
        else:
            group.rebalance_deadline_s = now + longest_s
        group.state = GroupState.PREPARING_REBALANCE

    def _try_complete_join(self, group: Group) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE or group.initial_delay:
            return
        if all(m.joining is not None and not m.joining.done() for m in group.members.values()):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        for member in [m for m in group.members.values() if m.joining is None or m.joining.done()]:
            del group.members[member.member_id]  # did not rejoin in time
        group.generation += 1
        group.initial_delay = False
        if not group.members:
            group.state, group.protocol_name, group.leader = GroupState.EMPTY, None, ""
            self._store_group(group, "an emptied group's generation")
            return
        first = next(iter(group.members.values()))
        group.protocol_type = first.protocol_type
        group.protocol_name = group.choose_protocol()
        if group.leader not in group.members:
            group.leader = first.member_id
        group.state = GroupState.COMPLETING_REBALANCE
        self._store_group(group, f"generation {group.generation} of group {group.group_id!r}")
        now = self._clock_s()
        group.rebalance_deadline_s = now + max(m.rebalance_timeout_ms for m in group.members.values()) / 1000
        for member in group.members.values():
            member.syncing = None
            member.deadline_s = now + member.session_timeout_ms / 1000
            assert member.joining is not None
            member.joining.set_result(self._join_result(group, member))
            member.joining = None

    def sweep(self) -> None:
        """Drop members past their session timeout, and finish rebalances past their deadline.

        Only groups with members or a rebalance are visited. One that has neither left, and no
        committed offsets, is forgotten (in the store too), as Kafka removes an empty group.
        """
        now = self._clock_s()
        for group_id in list(self._active):
            group = self.groups[group_id]
            if not group.members and not group.pending and group.state is GroupState.EMPTY:
                self._active.discard(group_id)
                if not group.offsets:
                    self._forget(group)
                continue
            for member_id, deadline in list(group.pending.items()):
                if deadline < now:
                    del group.pending[member_id]
            for member in list(group.members.values()):
                waiting = member.joining is not None or (
                    member.syncing is not None and not member.syncing.done()
                )
                if member.deadline_s < now and not waiting and member.member_id in group.members:
                    self._remove_member(group, member)
            if group.rebalance_deadline_s > now:
                continue
            if group.state is GroupState.PREPARING_REBALANCE:
                self._complete_join(group)
            elif group.state is GroupState.COMPLETING_REBALANCE:
                # The leader never sent its assignment (or members never asked): start over without
                # the members that did not sync, as Kafka does.
                for member in [m for m in group.members.values() if m.syncing is None]:
                    self._remove_member(group, member)

    async def run_sweeper(self) -> None:
        expired_at = time.monotonic()
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self.sweep()  # never raises: a failed store write is logged by _store_group
            if time.monotonic() - expired_at >= RETENTION_CHECK_S:
                expired_at = time.monotonic()
                self.expire_offsets()

    def now_ms(self) -> int:
        """The time a commit is stamped with, on the clock retention is measured on."""
        return self._clock_ms()

    def expire_offsets(self) -> int:
        """Forget the groups with no members whose last commit is older than offsets_retention_ms.

        Kafka's rule for a group that is empty (KIP-211). If the store cannot delete them,
        they stay until the next check.
        """
        now_ms = self._clock_ms()
        retention_ms = self.limits.offsets_retention_ms
        stale = [
            group
            for group_id, group in self.groups.items()
            if group_id not in self._active
            and not group.members
            and now_ms - max((c.commit_ms for c in group.offsets.values()), default=0) > retention_ms
        ]
        if not stale:
            return 0
        try:
            self.remove_groups(stale, f"expiring the offsets of {len(stale)} groups")
        except OncelogError as exc:
            log.warning("offset retention: %s", exc)
            return 0
        log.info("expired the offsets of %d groups idle past %d ms", len(stale), retention_ms)
        return len(stale)

    def remove_groups(self, groups: Sequence[Group], what: str) -> None:
        """Forget `groups` (each with no members), their offsets too: from the store first,
        in one commit (OncelogError if it fails: nothing changed), then from memory."""
        assert all(not group.members for group in groups), "a group with members is not removed"
        self.store.delete(
            [store_key(kind, group.group_id) for group in groups for kind in (GROUP, OFFSETS)], what
        )
        for group in groups:
            del self.groups[group.group_id]
            self._active.discard(group.group_id)

    def remove_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]]) -> None:
        """Forget the group's committed offsets of `partitions`: stored first (OncelogError if
        that fails: nothing changed), then in memory."""
        group = self.groups[group_id]
        kept = dict(group.offsets)
        for key in partitions:
            kept.pop(key, None)
        self.store.write(
            {store_key(OFFSETS, group_id): group.offsets_record(kept)},
            f"deleting offsets of group {group_id!r}",
        )
        group.offsets = kept

    # -- offsets ---------------------------------------------------------------------------
    def check_commit(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None = None
    ) -> ErrorCode:
        """Whether a commit naming `generation` and `member_id` may move the group's offsets."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.none if generation < 0 else ErrorCode.illegal_generation
        if generation < 0 and group.state is GroupState.EMPTY:
            return ErrorCode.none  # a simple (assign-mode) commit to a group with no members
        refusal = _member_refusal(group, generation, member_id, instance_id)
        if refusal is not None:
            return refusal
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress  # the assignment is not known yet
        # Kafka accepts a commit while the group prepares a rebalance (a member commits what it
        # consumed before giving its partitions up), and counts it as a heartbeat.
        member = group.members[member_id]
        member.deadline_s = self._clock_s() + member.session_timeout_ms / 1000
        return ErrorCode.none

    def check_transactional_commit(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None = None
    ) -> ErrorCode:
        """TxnOffsetCommit's fence: checked only when it names a member or a generation (v3, KIP-447)."""
        if not member_id and generation < 0:
            return ErrorCode.none
        return (
            _member_refusal(self.groups.get(group_id), generation, member_id, instance_id) or ErrorCode.none
        )

    def commit(self, group_id: str, offsets: Iterable[tuple[str, int, CommittedOffset]]) -> None:
        """Store `offsets` durably, then make them visible; the group is created if new."""
        self.store.write(self.commit_records(group_id, offsets), f"committing offsets of group {group_id!r}")
        self.apply_commit(group_id, offsets)

    def commit_records(
        self, group_id: str, offsets: Iterable[tuple[str, int, CommittedOffset]]
    ) -> dict[str, dict[str, Any]]:
        """The store record of `group_id`'s offsets with `offsets` applied (written by the caller)."""
        group = self.groups.get(group_id) or Group(group_id)
        merged = dict(group.offsets)
        merged.update({(topic, partition): committed for topic, partition, committed in offsets})
        return {store_key(OFFSETS, group_id): group.offsets_record(merged)}

    def apply_commit(self, group_id: str, offsets: Iterable[tuple[str, int, CommittedOffset]]) -> None:
        group = self.groups.setdefault(group_id, Group(group_id))
        for topic, partition, committed in offsets:
            group.offsets[(topic, partition)] = committed

    def committed(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        group = self.groups.get(group_id)
        return {} if group is None else group.offsets

    def _forget(self, group: Group) -> None:
        """Drop an empty group with no offsets; if its record cannot be deleted it stays, harmless."""
        try:
            self.store.delete([store_key(GROUP, group.group_id)], f"deleting empty group {group.group_id!r}")
        except OncelogError as exc:
            log.warning("group %r: %s", group.group_id, exc)
            return
        del self.groups[group.group_id]

    def _store_group(self, group: Group, what: str) -> None:
        """Store a new generation; if that fails the group goes on (its member ids still fence)."""
        try:
            self.store.write({store_key(GROUP, group.group_id): group.record()}, f"storing {what}")
        except OncelogError as exc:
            log.warning("group %r: %s", group.group_id, exc)
