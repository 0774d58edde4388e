"""What a consumer group is, and how it is stored: its state, members, offsets and limits.

Pure data and its record codec (what the CoordinatorStore keeps, one value per group);
the protocol that moves a group between states is GroupCoordinator's (groups.py).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """Kafka's group.* broker settings."""

    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    max_size: int = 1_000
    offset_metadata_max_bytes: int = 4_096
    # Kafka's offsets.retention.minutes (7 days): a group with no members whose last commit is
    # older loses its offsets.
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    # A member's protocol metadata, and the assignment the leader gives it, each at most this
    # (Kafka's message.max.bytes bounds its group record alike): a group is kept in memory and
    # stored whole at each rebalance.
    max_member_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        if not 1 <= self.min_session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError(
                f"session timeouts need 1 <= min ({self.min_session_timeout_ms}) <= max "
                f"({self.max_session_timeout_ms})"
            )
        if (
            self.initial_rebalance_delay_ms < 0
            or self.max_size < 1
            or self.offset_metadata_max_bytes < 0
            or self.offsets_retention_ms < 1
        ):
            raise ValueError("the initial rebalance delay must be >= 0 and the group size >= 1")


class CommittedOffset(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int


class JoinResult(NamedTuple):
    error: ErrorCode
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    # (member id, group instance id, metadata) for the leader; empty for the others.
    members: tuple[tuple[str, str | None, bytes], ...] = ()


class SyncResult(NamedTuple):
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(eq=False)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    deadline_s: float = 0.0
    joining: asyncio.Future[JoinResult] | None = None
    syncing: asyncio.Future[SyncResult] | None = None
    client_host: str = ""  # as Kafka describes it: "/" and the address it joined from

    def metadata_for(self, protocol: str) -> bytes:
        return next(metadata for name, metadata in self.protocols if name == protocol)


@dataclass(eq=False)
class Group:
    group_id: str
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    state: GroupState = GroupState.EMPTY
    members: dict[str, Member] = field(default_factory=dict)
    # Member ids handed out with MEMBER_ID_REQUIRED (JoinGroup v4+), by their deadline.
    pending: dict[str, float] = field(default_factory=dict)
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    # PreparingRebalance: when the join phase ends; CompletingRebalance: when members that
    # have not sent SyncGroup are dropped.
    rebalance_deadline_s: float = 0.0
    # During the initial delay of an empty group the rebalance waits for the timer only.
    initial_delay: bool = False

    def offsets_record(self, offsets: dict[tuple[str, int], CommittedOffset]) -> dict[str, Any]:
        """The store's record of the group's committed offsets, were they `offsets`."""
        return {
            "group": self.group_id,
            "offsets": [[topic, partition, *committed] for (topic, partition), committed in offsets.items()],
        }

    def record(self) -> dict[str, Any]:
        """The store's record of the group but its offsets: the generation and the members as they are.

        The members come back after a restart only from a record written while the group was
        Stable; a removal is written at once, so an evicted member never comes back.
        """
        return {
            "group": self.group_id,
            "generation": self.generation,
            "protocol_type": self.protocol_type,
            "state": self.state.value,
            "protocol_name": self.protocol_name,
            "leader": self.leader,
            "members": [
                [
                    m.member_id,
                    m.instance_id,
                    m.client_id,
                    m.session_timeout_ms,
                    m.rebalance_timeout_ms,
                    [list(protocol) for protocol in m.protocols],
                    m.assignment,
                    m.client_host,
                ]
                for m in self.members.values()
            ],
        }

    @classmethod
    def from_record(cls, record: dict[str, Any], now_s: float) -> Group:
        group = cls(record["group"], record["generation"], record["protocol_type"])
        if record["state"] == GroupState.STABLE.value and record["members"]:
            # Members carry on as before the restart, as Kafka's do: their heartbeats and
            # commits at this generation are answered, with no rebalance.
            group.state, group.protocol_name, group.leader = (
                GroupState.STABLE,
                record["protocol_name"],
                record["leader"],
            )
            for stored in record["members"]:
                # (a record from before members kept their client host has 7 fields)
                member_id, instance_id, client_id, session_ms, rebalance_ms, protocols, assignment = stored[
                    :7
                ]
                member = Member(
                    member_id,
                    instance_id,
                    client_id,
                    session_ms,
                    rebalance_ms,
                    group.protocol_type or "",
                    tuple((name, metadata) for name, metadata in protocols),
                    assignment,
                    deadline_s=now_s + session_ms / 1000,
                    client_host=stored[7] if len(stored) > 7 else "",
                )
                group.members[member_id] = member
        return group

    def static_member(self, instance_id: str | None) -> Member | None:
        """The member holding `group.instance.id` `instance_id` (KIP-345), if any."""
        if instance_id is None:
            return None
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def fences(self, member_id: str, instance_id: str | None) -> bool:
        """Whether `member_id` is an old incarnation of a static member another now holds."""
        static = self.static_member(instance_id)
        return bool(member_id) and static is not None and static.member_id != member_id

    def choose_protocol(self) -> str:
        """The protocol every member supports that the most members list first (Kafka's vote)."""
        members = list(self.members.values())
        common = set(name for name, _ in members[0].protocols)
        for member in members[1:]:
            common &= {name for name, _ in member.protocols}
        votes = {name: 0 for name in common}
        for member in members:
            preferred = next(name for name, _ in member.protocols if name in common)
            votes[preferred] += 1
        return max(sorted(votes), key=lambda name: votes[name])

    def supports(self, protocol_type: str, protocols: Sequence[tuple[str, bytes]]) -> bool:
        """Whether a member with these protocols may join: same type, one protocol common to all."""
        if not self.members:
            return True
        if protocol_type != self.protocol_type:
            return False
        common = {name for name, _ in protocols}
        for member in self.members.values():
            common &= {name for name, _ in member.protocols}
        return bool(common)
