"""Consumer groups (the classic protocol) with real clients, and their offset fencing on the wire.

Real, unmodified clients (confluent-kafka, kafka-python, aiokafka) share partitions through
rebalances, resume from offsets committed before a SIGKILL, and have a commit refused once
the group has moved on without them. The wire tests pin down what each refusal is:
ILLEGAL_GENERATION (22) for a stale generation, UNKNOWN_MEMBER_ID (25) for a member the
group does not have, REBALANCE_IN_PROGRESS (27) between JoinGroup and the leader's
SyncGroup, and a simple commit (generation -1, no member id) accepted only while the group
has no members.

Most tests share one in-process server whose group limits keep real time short: a 300 ms
initial rebalance delay (so members starting together share a generation) and sessions
down to 1 s. The SIGKILL tests run `oncelog serve` as a process with Kafka's defaults.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import CommitFailedError as AioCommitFailedError
from aiokafka.errors import IllegalGenerationError as AioIllegalGenerationError
from aiokafka.errors import UnknownMemberIdError as AioUnknownMemberIdError
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from in_process import InProcessServer
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import CommitFailedError as KafkaCommitFailedError
from kafka.errors import IllegalGenerationError, UnknownMemberIdError
from kafka.structs import OffsetAndMetadata
from kio.index import load_request_schema
from serve_process import ServeProcess
from wire_client import Joined, ProtocolIds, WireSocket, join_members, request_body

from oncelog.server.broker import ServeConfig
from oncelog.server.codec import build, nested
from oncelog.server.group_state import GroupLimits

TIMEOUT_S: Final = 30.0
# A stable assignment: no rebalance callback for this long after every member got its share.
SETTLE_S: Final = 1.0
POLL_S: Final = 0.05
NONE, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS = 0, 22, 25, 27
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
FAST_GROUPS: Final = GroupLimits(min_session_timeout_ms=1_000, initial_rebalance_delay_ms=300)
# Members the wire tests drive by hand: nothing times out under them while a test runs.
PATIENT_MS: Final = 60_000
# The member that stalls in the eviction tests: its session and its rebalance timeout (what
# the group waits for it to rejoin) are short, and so are the survivor's, since the group
# waits for the longest.
STALL_SESSION_MS: Final = 1_500
STALL_REBALANCE_MS: Final = 2_500

_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    config = ServeConfig(listen_port=0, groups=FAST_GROUPS)
    with InProcessServer(tmp_path_factory.mktemp("groups"), config) as running:
        yield running


@pytest.fixture(scope="module")
def server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """The same server in a process of its own, for a confluent-kafka consumer closed beside a
    rebalance: its rebalance callback calls rd_kafka_assign holding the GIL while librdkafka
    waits for the server, which in this process could never answer (it hung under load)."""
    running = ServeProcess(
        tmp_path_factory.mktemp("groups-process"),
        "--group-min-session-timeout-ms",
        str(FAST_GROUPS.min_session_timeout_ms),
        "--group-initial-rebalance-delay-ms",
        str(FAST_GROUPS.initial_rebalance_delay_ms),
    ).start()
    try:
        yield running
    finally:
        running.terminate()


# -- topics, records and what the server says was committed -------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
    ).values():
        future.result(TIMEOUT_S)


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, tag: str) -> set[bytes]:
    """`per_partition` records to every partition; their values (unique per tag)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    values = set()
    for partition in range(partitions):
        for n in range(per_partition):
            value = f"{tag}/{partition}/{n}".encode()
            producer.produce(topic, value=value, partition=partition)
            values.add(value)
    assert producer.flush(TIMEOUT_S) == 0
    return values


def offset_commit_body(ids: ProtocolIds, topic: str, offsets: Mapping[int, int], version: int = 9) -> Any:
    cls: Any = load_request_schema(OFFSET_COMMIT, version)
    topic_type = nested(cls, "topics")
    partition_type = nested(topic_type, "partitions")
    partitions = tuple(
        build(
            partition_type,
            partition_index=partition,
            committed_offset=offset,
            committed_leader_epoch=-1,
            committed_metadata=f"at {offset}",
        )
        for partition, offset in offsets.items()
    )
    return build(
        cls,
        group_id=ids.group,
        generation_id_or_member_epoch=ids.generation,
        member_id=ids.member_id,
        group_instance_id=None,
        retention_time=datetime.timedelta(milliseconds=-1),
        topics=(build(topic_type, name=topic, partitions=partitions),),
    )


def commit(sock: WireSocket, ids: ProtocolIds, topic: str, offset: int, version: int = 9) -> int:
    """An OffsetCommit of `offset` for partition 0 in the name of `ids`; its error code."""
    answer = sock.request(OFFSET_COMMIT, version, offset_commit_body(ids, topic, {0: offset}, version))
    [code] = [p.error_code for t in answer.topics for p in t.partitions]
    return int(code)


def offset_fetch_body(version: int, groups: Mapping[str, Mapping[str, Sequence[int]] | None]) -> Any:
    """OffsetFetch of `groups` ({group: {topic: partitions}}, or None for every committed partition)."""
    cls: Any = load_request_schema(OFFSET_FETCH, version)
    if version < 8:
        [(group, topics)] = groups.items()
        assert topics is not None
        topic_type = nested(cls, "topics")
        wanted = tuple(build(topic_type, name=t, partition_indexes=tuple(p)) for t, p in topics.items())
        return build(cls, group_id=group, topics=wanted, require_stable=False)
    group_type = nested(cls, "groups")
    topic_type = nested(group_type, "topics")
    return build(
        cls,
        groups=tuple(
            build(
                group_type,
                group_id=group,
                member_id=None,
                member_epoch=-1,
                topics=None
                if topics is None
                else tuple(build(topic_type, name=t, partition_indexes=tuple(p)) for t, p in topics.items()),
            )
            for group, topics in groups.items()
        ),
        require_stable=False,
    )


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    """What the server says `group` committed for `partitions` (OffsetFetch v9), -1 for none."""
    with WireSocket(bootstrap) as sock:
        answer = sock.request(OFFSET_FETCH, 9, offset_fetch_body(9, {group: {topic: partitions}}))
    [fetched] = answer.groups
    assert fetched.error_code == NONE
    return {p.partition_index: p.committed_offset for t in fetched.topics for p in t.partitions}


# -- real clients ----------------------------------------------------------------------------------


def confluent_config(bootstrap: str, group: str, client_id: str, **overrides: object) -> dict[str, object]:
    """A subscribing consumer that commits by hand; Kafka's 45 s session is far too long for a test."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": client_id,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6_000,
        "heartbeat.interval.ms": 200,
        "max.poll.interval.ms": 10_000,
        **overrides,
    }


class Member:
    """A confluent-kafka consumer polled by the test's thread, tracking the partitions it holds.

    The callbacks name what changes: everything at once with an eager assignor (range), only
    the partitions that move with an incremental one (cooperative-sticky).
    """

    def __init__(self, name: str, config: dict[str, object], topic: str):
        self.name = name
        self.consumer = Consumer(config)
        self.holding: frozenset[int] = frozenset()
        self.callbacks = 0
        self.consumed: set[bytes] = set()
        self.consumer.subscribe(
            [topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked
        )

    def _assigned(self, consumer: Consumer, partitions: list[ConfluentTopicPartition]) -> None:
        self.holding |= {tp.partition for tp in partitions}
        self.callbacks += 1

    def _revoked(self, consumer: Consumer, partitions: list[ConfluentTopicPartition]) -> None:
        self.holding -= {tp.partition for tp in partitions}
        self.callbacks += 1

    def poll(self) -> None:
        message = self.consumer.poll(POLL_S)
        if message is not None and message.error() is None:
            self.consumed.add(message.value() or b"")

    def __repr__(self) -> str:
        return f"{self.name}: holds {sorted(self.holding)} after {self.callbacks} rebalance callbacks"


def poll_until(members: Sequence[Member], done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {members}"
        for member in members:
            member.poll()


def settled_shares(members: Sequence[Member], before: Mapping[str, int]) -> list[frozenset[int]]:
    """Each member's partitions once every member saw the rebalance after `before` and no other followed.

    Every event here moves partitions of every member, so each one gets a callback.
    """
    while True:
        poll_until(
            members,
            lambda: all(m.callbacks > before[m.name] and m.holding for m in members),
            "every member to be given its partitions",
        )
        counts = [m.callbacks for m in members]
        quiet_until = time.monotonic() + SETTLE_S
        while time.monotonic() < quiet_until:
            for member in members:
                member.poll()
        if [m.callbacks for m in members] == counts:
            return [m.holding for m in members]


def assert_shared_out(shares: Sequence[frozenset[int]], partitions: int) -> None:
    """Every partition held by exactly one member, split evenly (both assignors balance these counts)."""
    held = sorted(p for share in shares for p in share)
    assert held == list(range(partitions)), f"partitions held: {held} by {shares}"
    assert {len(share) for share in shares} == {partitions // len(shares)}, shares


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_three_confluent_consumers_share_six_partitions_through_a_late_join_and_a_leave(
    server: InProcessServer, assignor: str
) -> None:
    topic, group, partitions = unique("share"), unique("share-group"), 6
    create_topic(server.bootstrap, topic, partitions)
    produced = produce(server.bootstrap, topic, partitions, 5, "before")

    def new_member(name: str) -> Member:
        config = confluent_config(
            server.bootstrap, group, name, **{"partition.assignment.strategy": assignor}
        )
        return Member(name, config, topic)

    first, second = new_member("first"), new_member("second")
    members = [first, second]
    assert_shared_out(settled_shares(members, {"first": 0, "second": 0}), partitions)
    poll_until(members, lambda: produced <= first.consumed | second.consumed, "the first records")

    late = new_member("late")
    before = {m.name: m.callbacks for m in members} | {"late": 0}
    members.append(late)
    assert_shared_out(settled_shares(members, before), partitions)
    assert late.holding, "the late member was given no partitions"
    produced |= produce(server.bootstrap, topic, partitions, 5, "after-join")
    poll_until(members, lambda: produced <= set().union(*(m.consumed for m in members)), "every record")

    first.consumer.close()  # leaves the group: its partitions go to the others
    members.remove(first)
    before = {m.name: m.callbacks for m in members}
    assert_shared_out(settled_shares(members, before), partitions)
    after_leave = produce(server.bootstrap, topic, partitions, 5, "after-leave")
    poll_until(members, lambda: after_leave <= second.consumed | late.consumed, "the records after the leave")
    for member in members:
        member.consumer.close()


def test_committed_offsets_survive_a_sigkill_and_a_new_consumer_resumes_from_them(tmp_path: Path) -> None:
    topic, group = "durable", "durable-group"
    # Kafka's group defaults: sessions of 6 s at least, a 3 s initial rebalance delay.
    with ServeProcess(tmp_path / "root") as served:
        create_topic(served.bootstrap, topic, 2)
        produce(served.bootstrap, topic, 2, 10, "durable")
        before = Consumer(confluent_config(served.bootstrap, group, "before-crash"))
        before.subscribe([topic])
        consumed = 0
        deadline = time.monotonic() + TIMEOUT_S
        while consumed < 20:
            assert time.monotonic() < deadline, f"consumed {consumed} of 20"
            message = before.poll(POLL_S)
            consumed += message is not None and message.error() is None
        committed = before.commit(
            offsets=[
                ConfluentTopicPartition(topic, 0, 4, metadata="processed to 4"),
                ConfluentTopicPartition(topic, 1, 7),
            ],
            asynchronous=False,
        )
        assert [(tp.partition, tp.offset, tp.error) for tp in committed] == [(0, 4, None), (1, 7, None)]

        served.kill()
        before.close()  # the server is gone: its LeaveGroup reaches nobody
        served.start()
        # The stable group comes back with `before` still a member (as in Kafka), so the new
        # consumer's rebalance completes when `before`'s session times out (6 s).

        after = Consumer(confluent_config(served.bootstrap, group, "after-crash"))
        after.subscribe([topic])
        resumed: dict[int, list[int]] = {0: [], 1: []}
        deadline = time.monotonic() + TIMEOUT_S
        while len(resumed[0]) < 6 or len(resumed[1]) < 3:
            assert time.monotonic() < deadline, f"resumed only {resumed}"
            message = after.poll(POLL_S)
            if message is not None and message.error() is None:
                resumed[message.partition() or 0].append(message.offset() or 0)
        assert resumed == {0: list(range(4, 10)), 1: list(range(7, 10))}
        found = after.committed(
            [ConfluentTopicPartition(topic, 0), ConfluentTopicPartition(topic, 1)], timeout=TIMEOUT_S
        )
        assert [(tp.partition, tp.offset) for tp in found] == [(0, 4), (1, 7)]
        assert found[0].metadata == "processed to 4"
        after.close()
        assert committed_offsets(served.bootstrap, group, topic, [0, 1]) == {0: 4, 1: 7}


# -- a member the group moved on without ---------------------------------------------------------


class Survivor:
    """A confluent-kafka member polled by a thread of its own: it heartbeats and rejoins while the
    test's thread (and the member under test) stalls on purpose, so the group is never empty."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        self._config = confluent_config(
            bootstrap,
            group,
            "survivor",
            **{"session.timeout.ms": STALL_SESSION_MS, "max.poll.interval.ms": STALL_REBALANCE_MS},
        )
        self._topic = topic
        self._assigned: list[frozenset[int]] = []
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="survivor", daemon=True)

    def _run(self) -> None:
        try:
            consumer = Consumer(self._config)
            consumer.subscribe([self._topic], on_assign=self._on_assign)
            while not self._stop.is_set():
                consumer.poll(POLL_S)
            consumer.close()
        except BaseException as exc:  # reported by the test's thread
            self._failure = exc

    def _on_assign(self, consumer: Consumer, partitions: list[ConfluentTopicPartition]) -> None:
        with self._changed:
            self._assigned.append(frozenset(tp.partition for tp in partitions))
            self._changed.notify_all()

    def wait_to_hold(self, partitions: set[int]) -> None:
        """Block (the calling thread, on purpose) until the survivor alone holds `partitions`."""
        with self._changed:
            held = self._changed.wait_for(
                lambda: bool(self._assigned) and self._assigned[-1] == partitions, TIMEOUT_S
            )
        assert held, f"the survivor was assigned {self._assigned}, never all of {sorted(partitions)}"

    def __enter__(self) -> Survivor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT_S)
        if self._failure is not None:
            raise self._failure


def stalled_group(bootstrap: str, client: str) -> tuple[str, str]:
    """A topic of two partitions with records, and a group name, for one eviction test."""
    topic = unique(f"stall-{client}")
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, 2, 5, topic)
    return topic, unique(f"stall-{client}-group")


def test_a_confluent_consumer_that_stops_polling_misses_the_rebalance_and_its_late_commit_is_refused(
    server_process: ServeProcess,
) -> None:
    server = server_process  # see the fixture: an in-process server can deadlock with this close
    topic, group = stalled_group(server.bootstrap, "confluent")
    stalled = Consumer(
        confluent_config(
            server.bootstrap,
            group,
            "stalled",
            **{"session.timeout.ms": STALL_SESSION_MS, "max.poll.interval.ms": STALL_REBALANCE_MS},
        )
    )
    stalled.subscribe([topic])
    deadline = time.monotonic() + TIMEOUT_S
    while (message := stalled.poll(POLL_S)) is None or message.error() is not None:
        assert time.monotonic() < deadline, "the stalled consumer read nothing"
    stalled.commit(offsets=[ConfluentTopicPartition(topic, 0, 1)], asynchronous=False)
    # librdkafka heartbeats from its own thread but rejoins only when the application polls:
    # this one stops polling, so the group completes the survivor's rebalance without it.
    with Survivor(server.bootstrap, group, topic) as survivor:
        survivor.wait_to_hold({0, 1})
        with pytest.raises(KafkaException) as refused:
            stalled.commit(offsets=[ConfluentTopicPartition(topic, 0, 5)], asynchronous=False)
    error: KafkaError = refused.value.args[0]
    assert error.code() in (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION), error
    assert committed_offsets(server.bootstrap, group, topic, [0]) == {0: 1}
    close_bounded(stalled)


def close_bounded(consumer: Consumer) -> None:
    """Close a confluent consumer that stopped polling, waiting at most TIMEOUT_S: librdkafka's
    close runs the revoke it never served, whose assign can wait forever on a group already
    terminating (librdkafka issue 4884, seen here once in a full run). The close is cleanup;
    the test's assertions are made before it. Left hanging, its thread is a daemon."""
    closing = threading.Thread(target=consumer.close, name="stalled-close", daemon=True)
    closing.start()
    closing.join(TIMEOUT_S)


def test_a_kafka_python_consumer_that_stops_polling_misses_the_rebalance_and_its_late_commit_is_refused(
    server: InProcessServer,
) -> None:
    topic, group = stalled_group(server.bootstrap, "kafka-python")
    stalled = KafkaConsumer(
        topic,
        bootstrap_servers=server.bootstrap,
        group_id=group,
        client_id="stalled",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=STALL_SESSION_MS,
        heartbeat_interval_ms=200,
        max_poll_interval_ms=STALL_REBALANCE_MS,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not stalled.poll(timeout_ms=100):
            assert time.monotonic() < deadline, "the stalled consumer read nothing"
        stalled.commit({KafkaTopicPartition(topic, 0): OffsetAndMetadata(1, "", -1)})
        # kafka-python rejoins only inside poll(): the survivor's rebalance completes without it.
        with Survivor(server.bootstrap, group, topic) as survivor:
            survivor.wait_to_hold({0, 1})
            with pytest.raises(KafkaCommitFailedError) as refused:
                stalled.commit({KafkaTopicPartition(topic, 0): OffsetAndMetadata(5, "", -1)})
        # The server's UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION, or kafka-python's own refusal
        # once its heartbeat thread has seen the poll timeout and left the group.
        cause = refused.value.args[0] if refused.value.args else None
        assert isinstance(cause, UnknownMemberIdError | IllegalGenerationError) or "active group" in str(
            cause
        ), refused.value
        assert committed_offsets(server.bootstrap, group, topic, [0]) == {0: 1}
    finally:
        stalled.close()


def test_a_kafka_python_consumer_removed_by_an_admin_has_its_next_commit_refused_by_the_server(
    server: InProcessServer,
) -> None:
    topic, group = stalled_group(server.bootstrap, "removed")
    # Heartbeats are rare, so the consumer learns it was removed only from its commit's answer.
    removed = KafkaConsumer(
        topic,
        bootstrap_servers=server.bootstrap,
        group_id=group,
        client_id="removed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=15_000,
        heartbeat_interval_ms=5_000,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not removed.poll(timeout_ms=100):
            assert time.monotonic() < deadline, "the consumer read nothing"
        removed.commit({KafkaTopicPartition(topic, 0): OffsetAndMetadata(1, "", -1)})
        membership = removed.group_metadata()
        assert membership.member_id and membership.generation_id >= 1
        # What an admin's removeMembersFromConsumerGroup sends: LeaveGroup naming the member.
        with WireSocket(server.bootstrap) as sock:
            ids = ProtocolIds(group=group, member_id=membership.member_id)
            left = sock.request(LEAVE_GROUP, 5, request_body(LEAVE_GROUP, 5, "", ids))
        assert [(m.member_id, m.error_code) for m in left.members] == [(membership.member_id, NONE)]
        with pytest.raises(KafkaCommitFailedError) as refused:
            removed.commit({KafkaTopicPartition(topic, 0): OffsetAndMetadata(5, "", -1)})
        assert refused.value.args and isinstance(refused.value.args[0], UnknownMemberIdError), refused.value
        assert committed_offsets(server.bootstrap, group, topic, [0]) == {0: 1}
    finally:
        removed.close()


def test_an_aiokafka_consumer_whose_event_loop_stalls_is_evicted_and_its_late_commit_is_refused(
    server: InProcessServer,
) -> None:
    topic, group = stalled_group(server.bootstrap, "aiokafka")

    async def scenario() -> BaseException:
        stalled = AIOKafkaConsumer(
            topic,
            bootstrap_servers=server.bootstrap,
            group_id=group,
            client_id="stalled",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=STALL_SESSION_MS,
            heartbeat_interval_ms=200,
            max_poll_interval_ms=STALL_REBALANCE_MS,
            rebalance_timeout_ms=STALL_REBALANCE_MS,
        )
        await stalled.start()
        try:
            assert await stalled.getmany(timeout_ms=int(TIMEOUT_S * 1000)), (
                "the stalled consumer read nothing"
            )
            await stalled.commit({AioTopicPartition(topic, 0): 1})
            with Survivor(server.bootstrap, group, topic) as survivor:
                # Blocks this event loop: aiokafka neither heartbeats nor rejoins until it returns,
                # so the server drops the member when its session times out.
                survivor.wait_to_hold({0, 1})
                with pytest.raises(AioCommitFailedError) as refused:
                    await stalled.commit({AioTopicPartition(topic, 0): 5})
            failure: BaseException = refused.value
            return failure
        finally:
            await stalled.stop()

    refusal = asyncio.run(scenario())
    assert isinstance(refusal.__cause__, AioUnknownMemberIdError | AioIllegalGenerationError), repr(
        refusal.__cause__
    )
    assert committed_offsets(server.bootstrap, group, topic, [0]) == {0: 1}


# -- generation fencing on the wire ----------------------------------------------------------------


def patient(group: str) -> ProtocolIds:
    return ProtocolIds(group=group, session_timeout_ms=PATIENT_MS, rebalance_timeout_ms=PATIENT_MS)


def sync(sock: WireSocket, joined: Joined, assignments: Mapping[str, bytes] | None = None) -> Any:
    """SyncGroup v5 for `joined` (the leader hands out `assignments`)."""
    body = request_body(SYNC_GROUP, 5, "", joined.ids)
    assignment_type = nested(type(body), "assignments")
    given = tuple(build(assignment_type, member_id=m, assignment=a) for m, a in (assignments or {}).items())
    answer = sock.request(SYNC_GROUP, 5, replace(body, assignments=given))
    assert answer.error_code == NONE, answer
    return answer


def leader_and_follower(bootstrap: str, group: str) -> tuple[Joined, Joined]:
    """Two members that joined one generation together (within the initial rebalance delay)."""
    one, two = join_members(bootstrap, [patient(group), patient(group)])
    assert one.ids.generation == two.ids.generation and one.leader == two.leader
    return (one, two) if one.is_leader else (two, one)


def heartbeat(sock: WireSocket, ids: ProtocolIds) -> int:
    return int(sock.request(HEARTBEAT, 4, request_body(HEARTBEAT, 4, "", ids)).error_code)


def test_commits_between_join_and_the_leaders_sync_get_rebalance_in_progress(server: InProcessServer) -> None:
    topic, group = unique("completing"), unique("completing-group")
    create_topic(server.bootstrap, topic, 1)
    leader, follower = leader_and_follower(server.bootstrap, group)
    with WireSocket(server.bootstrap) as sock:
        # CompletingRebalance: the generation is known, the assignment is not yet.
        assert commit(sock, follower.ids, topic, 3) == REBALANCE_IN_PROGRESS
        assert commit(sock, leader.ids, topic, 3) == REBALANCE_IN_PROGRESS
        # A heartbeat now is answered NONE (Kafka's rule: consumers heartbeat once JoinGroup returned).
        assert heartbeat(sock, follower.ids) == NONE
        assert (
            sync(sock, leader, {leader.ids.member_id: b"a", follower.ids.member_id: b"b"}).assignment == b"a"
        )
        assert sync(sock, follower).assignment == b"b"
        assert commit(sock, follower.ids, topic, 4) == NONE
    assert committed_offsets(server.bootstrap, group, topic, [0]) == {0: 4}


def test_a_commit_from_a_stale_generation_gets_illegal_generation(server: InProcessServer) -> None:
    topic, group = unique("stale"), unique("stale-group")
    create_topic(server.bootstrap, topic, 1)
    leader, follower = leader_and_follower(server.bootstrap, group)
    with WireSocket(server.bootstrap) as leader_sock, WireSocket(server.bootstrap) as follower_sock:
        sync(leader_sock, leader, {leader.ids.member_id: b"a", follower.ids.member_id: b"b"})
        sync(follower_sock, follower)
        # The leader rejoins: a new rebalance, which waits for the follower to rejoin too.
        leader_join = leader_sock.send(JOIN_GROUP, 7, request_body(JOIN_GROUP, 7, "", leader.ids))
        with WireSocket(server.bootstrap) as sock:
            # While the group prepares the rebalance, a member still commits in its generation (what
            # an eager consumer does before giving its partitions up) and heartbeats to rejoin.
            assert commit(sock, follower.ids, topic, 5) == NONE
            assert heartbeat(sock, follower.ids) == REBALANCE_IN_PROGRESS
        follower_join = follower_sock.send(JOIN_GROUP, 7, request_body(JOIN_GROUP, 7, "", follower.ids))
        rejoined = leader_sock.receive(JOIN_GROUP, 7, leader_join)
        assert follower_sock.receive(JOIN_GROUP, 7, follower_join).generation_id == rejoined.generation_id
        new_generation = rejoined.generation_id
        assert new_generation == leader.ids.generation + 1
        current = Joined(replace(leader.ids, generation=new_generation), leader.leader, ())
        sync(leader_sock, current, {leader.ids.member_id: b"a", follower.ids.member_id: b"b"})
        with WireSocket(server.bootstrap) as sock:
            assert commit(sock, follower.ids, topic, 6) == ILLEGAL_GENERATION
            assert heartbeat(sock, follower.ids) == ILLEGAL_GENERATION
            assert commit(sock, replace(follower.ids, generation=new_generation), topic, 7) == NONE
    assert committed_offsets(server.bootstrap, group, topic, [0]) == {0: 7}


def test_a_commit_from_an_unknown_or_departed_member_gets_unknown_member_id(server: InProcessServer) -> None:
    topic, group = unique("unknown"), unique("unknown-group")
    create_topic(server.bootstrap, topic, 1)
    leader, follower = leader_and_follower(server.bootstrap, group)
    with WireSocket(server.bootstrap) as sock:
        sync(sock, leader, {leader.ids.member_id: b"a", follower.ids.member_id: b"b"})
        assert commit(sock, leader.ids, topic, 2) == NONE
        assert commit(sock, replace(leader.ids, member_id="nobody"), topic, 3) == UNKNOWN_MEMBER_ID
        # No generation and no member id is not a member either while the group has members.
        assert commit(sock, ProtocolIds(group=group), topic, 4) == UNKNOWN_MEMBER_ID
        left = sock.request(LEAVE_GROUP, 5, request_body(LEAVE_GROUP, 5, "", follower.ids))
        assert [m.error_code for m in left.members] == [NONE]
        assert commit(sock, follower.ids, topic, 5) == UNKNOWN_MEMBER_ID
        assert heartbeat(sock, follower.ids) == UNKNOWN_MEMBER_ID
    assert committed_offsets(server.bootstrap, group, topic, [0]) == {0: 2}


def test_a_simple_commit_is_accepted_while_the_group_has_no_members_and_refused_once_it_has(
    server: InProcessServer,
) -> None:
    topic, group = unique("simple"), unique("simple-group")
    create_topic(server.bootstrap, topic, 1)
    simple = ProtocolIds(group=group)  # generation -1, member id ""
    stranger = replace(simple, generation=1, member_id="stranger")
    with WireSocket(server.bootstrap) as sock:
        # A generation of a group that does not exist: from an older generation, or a mistake
        # (Kafka's answer before OffsetCommit v9).
        assert commit(sock, stranger, topic, 9, version=8) == ILLEGAL_GENERATION
        assert commit(sock, simple, topic, 1) == NONE  # creates the group, with no members
        assert commit(sock, stranger, topic, 9) == UNKNOWN_MEMBER_ID
    [member] = join_members(server.bootstrap, [patient(group)])
    with WireSocket(server.bootstrap) as sock:
        sync(sock, member, {member.ids.member_id: b""})
        assert commit(sock, simple, topic, 2) == UNKNOWN_MEMBER_ID
        left = sock.request(LEAVE_GROUP, 5, request_body(LEAVE_GROUP, 5, "", member.ids))
        assert [m.error_code for m in left.members] == [NONE]
        # Empty again, at a later generation: simple commits are accepted, the old member's are not.
        assert commit(sock, simple, topic, 3) == NONE
        assert commit(sock, member.ids, topic, 4) == UNKNOWN_MEMBER_ID
    assert committed_offsets(server.bootstrap, group, topic, [0]) == {0: 3}


def test_a_confluent_consumer_with_assign_commits_to_a_group_without_members(server: InProcessServer) -> None:
    topic, group = unique("assigned"), unique("assigned-group")
    create_topic(server.bootstrap, topic, 2)
    produce(server.bootstrap, topic, 2, 5, topic)
    consumer = Consumer(confluent_config(server.bootstrap, group, "assigned"))
    consumer.assign([ConfluentTopicPartition(topic, 0, OFFSET_BEGINNING)])
    offsets: list[int] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(offsets) < 3:
        assert time.monotonic() < deadline, f"read only {offsets}"
        message = consumer.poll(POLL_S)
        if message is not None and message.error() is None:
            offsets.append(message.offset() or 0)
    committed = consumer.commit(offsets=[ConfluentTopicPartition(topic, 0, 3)], asynchronous=False)
    assert [(tp.partition, tp.offset, tp.error) for tp in committed] == [(0, 3, None)]
    found = consumer.committed([ConfluentTopicPartition(topic, 0), ConfluentTopicPartition(topic, 1)])
    assert [(tp.partition, tp.offset) for tp in found] == [(0, 3), (1, -1001)]  # -1001: none committed
    # Once the group has a member, an assign-mode commit is not that member's to make.
    [member] = join_members(server.bootstrap, [patient(group)])
    with pytest.raises(KafkaException) as refused:
        consumer.commit(offsets=[ConfluentTopicPartition(topic, 0, 4)], asynchronous=False)
    assert refused.value.args[0].code() == KafkaError.UNKNOWN_MEMBER_ID
    consumer.close()
    with WireSocket(server.bootstrap) as sock:
        sock.request(LEAVE_GROUP, 5, request_body(LEAVE_GROUP, 5, "", member.ids))
    assert committed_offsets(server.bootstrap, group, topic, [0, 1]) == {0: 3, 1: -1}


def test_after_a_sigkill_a_stable_group_carries_on_and_any_other_starts_empty_at_its_generation(
    tmp_path: Path,
) -> None:
    # Kafka's group defaults, and a real SIGKILL: only what was stored before an answer survives.
    with ServeProcess(tmp_path / "root") as served:
        create_topic(served.bootstrap, "restart", 1)
        stable, completing, departed = join_members(
            served.bootstrap, [patient("stable"), patient("completing"), patient("departed")]
        )
        with WireSocket(served.bootstrap) as sock:
            sync(sock, stable, {stable.ids.member_id: b"stable's share"})
            assert commit(sock, stable.ids, "restart", 8) == NONE
            sync(sock, departed, {departed.ids.member_id: b""})
            left = sock.request(LEAVE_GROUP, 5, request_body(LEAVE_GROUP, 5, "", departed.ids))
            assert [m.error_code for m in left.members] == [NONE]
        # `completing` joined but never synced: its group is in CompletingRebalance.
        served.restart()

        with WireSocket(served.bootstrap) as sock:
            # The stable group's member carries on in its generation, with its assignment.
            assert heartbeat(sock, stable.ids) == NONE
            assert sync(sock, stable).assignment == b"stable's share"
            assert commit(sock, stable.ids, "restart", 9) == NONE
            # The others' members are gone (they rejoin); the departed one does not come back.
            for gone in (completing, departed):
                assert heartbeat(sock, gone.ids) == UNKNOWN_MEMBER_ID
                assert commit(sock, gone.ids, "restart", 10) == UNKNOWN_MEMBER_ID
        # Each group's next generation follows its stored one (the departure made generation 2).
        rejoined = join_members(served.bootstrap, [patient("completing"), patient("departed")])
        assert [j.ids.generation for j in rejoined] == [
            completing.ids.generation + 1,
            departed.ids.generation + 2,
        ]
        assert committed_offsets(served.bootstrap, "stable", "restart", [0]) == {0: 9}


# -- OffsetFetch and FindCoordinator ---------------------------------------------------------------


@pytest.mark.parametrize("version", range(1, 10))
def test_offset_fetch_answers_minus_one_for_a_partition_with_no_committed_offset(
    server: InProcessServer, version: int
) -> None:
    topic, group = unique("fetch"), unique("fetch-group")
    create_topic(server.bootstrap, topic, 3)
    with WireSocket(server.bootstrap) as sock:
        answer = sock.request(OFFSET_COMMIT, 9, offset_commit_body(ProtocolIds(group=group), topic, {1: 12}))
        assert [p.error_code for t in answer.topics for p in t.partitions] == [NONE]
        fetched = sock.request(OFFSET_FETCH, version, offset_fetch_body(version, {group: {topic: [0, 1, 2]}}))
        never = sock.request(
            OFFSET_FETCH, version, offset_fetch_body(version, {unique("no-such-group"): {topic: [0]}})
        )
    if version >= 8:
        [group_answer] = fetched.groups
        assert group_answer.error_code == NONE
        topics = group_answer.topics
        [never_group] = never.groups
        never_topics = never_group.topics
    else:
        topics, never_topics = fetched.topics, never.topics
        assert getattr(fetched, "error_code", NONE) == NONE
    [answered] = topics
    assert answered.name == topic
    got = {p.partition_index: (p.committed_offset, p.metadata, p.error_code) for p in answered.partitions}
    assert got == {0: (-1, "", NONE), 1: (12, "at 12", NONE), 2: (-1, "", NONE)}
    if version >= 5:
        assert [p.committed_leader_epoch for p in answered.partitions] == [-1, -1, -1]
    assert [(p.committed_offset, p.error_code) for t in never_topics for p in t.partitions] == [(-1, NONE)]


@pytest.mark.parametrize("version", [8, 9])
def test_offset_fetch_v8_answers_many_groups_in_one_request(server: InProcessServer, version: int) -> None:
    topic = unique("many")
    create_topic(server.bootstrap, topic, 2)
    groups = [unique("many-group") for _ in range(3)]
    with WireSocket(server.bootstrap) as sock:
        for group, offsets in zip(groups, ({0: 3}, {0: 4, 1: 9}), strict=False):
            answer = sock.request(
                OFFSET_COMMIT, 9, offset_commit_body(ProtocolIds(group=group), topic, offsets)
            )
            assert {p.error_code for t in answer.topics for p in t.partitions} == {NONE}
        wanted: dict[str, dict[str, Sequence[int]] | None] = {
            groups[0]: {topic: [0, 1]},
            groups[1]: None,  # every partition it committed
            groups[2]: {topic: [1]},  # committed nothing
        }
        fetched = sock.request(OFFSET_FETCH, version, offset_fetch_body(version, wanted))
    got = {
        g.group_id: {(t.name, p.partition_index): p.committed_offset for t in g.topics for p in t.partitions}
        for g in fetched.groups
    }
    assert [g.group_id for g in fetched.groups] == groups
    assert {g.error_code for g in fetched.groups} == {NONE}
    assert got == {
        groups[0]: {(topic, 0): 3, (topic, 1): -1},
        groups[1]: {(topic, 0): 4, (topic, 1): 9},
        groups[2]: {(topic, 1): -1},
    }


@pytest.mark.parametrize("version", [4, 5, 6])
def test_find_coordinator_v4_answers_every_key_it_is_asked(server: InProcessServer, version: int) -> None:
    keys = ("orders", "payments", "audit")
    with WireSocket(server.bootstrap) as sock:
        for key_type in (0, 1):  # groups, then transactional ids
            body = request_body(FIND_COORDINATOR, version, "", ProtocolIds(keys=keys))
            answer = sock.request(FIND_COORDINATOR, version, replace(body, key_type=key_type))
            assert [(c.key, c.node_id, c.host, c.port, c.error_code) for c in answer.coordinators] == [
                (key, 0, "127.0.0.1", server.server.port, NONE) for key in keys
            ]
