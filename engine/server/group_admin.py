"""What an operator asks of the consumer groups, answered from the GroupCoordinator as
Kafka's classic coordinator answers it: list (ListGroups), describe (DescribeGroups),
delete (DeleteGroups) and delete some offsets (OffsetDelete, KIP-496).

- A group Kafka would call Dead (unknown, or forgotten) is described with state "Dead"
  and no error, as DescribeGroups v0-5 answer; deleting or deleting offsets of one is
  GROUP_ID_NOT_FOUND.
- A group with members (any state but Empty) is not deleted: NON_EMPTY_GROUP.
- Offsets are deleted from an Empty group at will (a group left with none is gone, as
  Kafka drops it); from a consumer group with members
  only for topics no member subscribes to (GROUP_SUBSCRIBED_TO_TOPIC for the others),
  the subscriptions read from the members' protocol metadata (Kafka's
  ConsumerProtocolSubscription). A group whose metadata does not read as that counts as
  subscribed to every topic, as Kafka counts it.
- Members' metadata and assignments are described only while the group is Stable.

Every change is stored before it is answered (GroupCoordinator.remove_groups /
remove_offsets); a store failure leaves the group as it was, answered
COORDINATOR_NOT_AVAILABLE (retriable). The uncommitted offsets open transactions hold for
what is deleted are dropped first (Kafka drops them too), or a commit would bring them back.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.server.group_coordinator import GroupCoordinator
from oncelog.server.group_state import Group, GroupState
from oncelog.server.txn_state import TxnError

DEAD = "Dead"
# The only group type this coordinator has (KIP-848's "consumer" groups are not served).
CLASSIC = "classic"
CONSUMER_PROTOCOL = "consumer"
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class MemberSummary(NamedTuple):
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


class GroupSummary(NamedTuple):
    state: str
    protocol_type: str
    protocol_name: str  # the chosen protocol while Stable, else ""
    members: tuple[MemberSummary, ...]


class ListedGroup(NamedTuple):
    group_id: str
    protocol_type: str
    state: str
    group_type: str


def list_groups(
    coordinator: GroupCoordinator, states: Iterable[str] = (), types: Iterable[str] = ()
) -> list[ListedGroup]:
    """Every group the coordinator has, in id order; `states` and `types` (each compared
    without case, empty: any) keep only those in one of them (KIP-518, KIP-848)."""
    wanted_states = {state.lower() for state in states}
    wanted_types = {kind.lower() for kind in types}
    if wanted_types and CLASSIC not in wanted_types:
        return []
    return [
        ListedGroup(group_id, group.protocol_type or "", group.state.value, CLASSIC)
        for group_id, group in sorted(coordinator.groups.items())
        if not wanted_states or group.state.value.lower() in wanted_states
    ]


def describe_group(coordinator: GroupCoordinator, group_id: str) -> GroupSummary:
    group = coordinator.groups.get(group_id)
    if group is None:
        return GroupSummary(DEAD, "", "", ())
    stable = group.state is GroupState.STABLE
    protocol = group.protocol_name if stable and group.protocol_name is not None else ""
    members = tuple(
        MemberSummary(
            member.member_id,
            member.instance_id,
            member.client_id,
            member.client_host,
            member.metadata_for(protocol) if protocol else b"",
            member.assignment if stable else b"",
        )
        for member in group.members.values()
    )
    return GroupSummary(group.state.value, group.protocol_type or "", protocol, members)


def delete_groups(coordinator: GroupCoordinator, group_ids: Sequence[str]) -> dict[str, ErrorCode]:
    """Each group's answer; the deletable ones go in one store commit."""
    answers: dict[str, ErrorCode] = {}
    deletable: dict[str, Group] = {}
    for group_id in group_ids:
        group = coordinator.groups.get(group_id)
        if group is None:
            answers[group_id] = ErrorCode.group_id_not_found
        elif group.state is not GroupState.EMPTY or group.members:
            answers[group_id] = ErrorCode.non_empty_group
        else:
            deletable[group_id] = group
            answers[group_id] = ErrorCode.none
    if deletable:
        try:
            for group_id in deletable:
                coordinator.drop_pending_offsets(group_id, None)
            coordinator.remove_groups(list(deletable.values()), f"deleting groups {sorted(deletable)}")
        except (OncelogError, TxnError):  # (a store write failed: nothing answered as done)
            for group_id in deletable:
                answers[group_id] = ErrorCode.coordinator_not_available
    return answers


def delete_offsets(
    coordinator: GroupCoordinator, group_id: str, partitions: Sequence[tuple[str, int]]
) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
    """(the group's error, each partition's): the offsets of `partitions` no member consumes, forgotten."""
    if not group_id:
        return ErrorCode.invalid_group_id, {}
    group = coordinator.groups.get(group_id)
    if group is None:
        return ErrorCode.group_id_not_found, {}
    answers = dict.fromkeys(partitions, ErrorCode.none)
    if group.state is not GroupState.EMPTY or group.members:
        if group.protocol_type != CONSUMER_PROTOCOL:
            return ErrorCode.non_empty_group, {}
        subscribed = subscribed_topics(group)
        for topic, partition in partitions:
            if subscribed is None or topic in subscribed:
                answers[(topic, partition)] = ErrorCode.group_subscribed_to_topic
    removable = [key for key, code in answers.items() if code == ErrorCode.none]
    if removable:
        try:
            coordinator.drop_pending_offsets(group_id, set(removable))
            coordinator.remove_offsets(group_id, removable)
            if group.state is GroupState.EMPTY and not group.members and not group.offsets:
                # Kafka's rule: an Empty group left with no offsets is gone.
                coordinator.remove_groups([group], f"deleting group {group_id!r}, left with no offsets")
        except (OncelogError, TxnError):
            return ErrorCode.coordinator_not_available, {}
    return ErrorCode.none, answers


def subscribed_topics(group: Group) -> set[str] | None:
    """The topics the group's members subscribe to, by their consumer protocol metadata;
    None when that is not known (no protocol chosen yet, or metadata that does not read)."""
    if group.protocol_name is None:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        try:
            read = subscription_topics(member.metadata_for(group.protocol_name))
        except StopIteration:
            return None  # a member without the group's protocol: not a settled consumer group
        if read is None:
            return None
        topics.update(read)
    return topics


def subscription_topics(metadata: bytes) -> list[str] | None:
    """The topics of a ConsumerProtocolSubscription (every version starts: i16 version, then
    an array of i16-length strings); None if `metadata` does not hold one."""
    try:
        (version,) = _I16.unpack_from(metadata, 0)
        (count,) = _I32.unpack_from(metadata, _I16.size)
        if version < 0 or not 0 <= count <= len(metadata):
            return None
        at = _I16.size + _I32.size
        topics = []
        for _ in range(count):
            (length,) = _I16.unpack_from(metadata, at)
            at += _I16.size
            if length < 0 or at + length > len(metadata):
                return None
            topics.append(metadata[at : at + length].decode("utf-8"))
            at += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
