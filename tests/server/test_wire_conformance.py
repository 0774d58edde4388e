"""Every advertised API and version gets a response that decodes, over a raw socket.

Served versions are encoded and decoded by kio; the older versions that are
advertised (for librdkafka's exact-version overlap) but not served are encoded and
decoded by kafka-python, whose classes reach back to v0, and must carry
UNSUPPORTED_VERSION (35) for every topic and partition asked about.

Every served request is one that succeeds (no error anywhere in the answer): the group
and transaction APIs are sent by a member or producer set up for them first. The members
join at once in one module fixture, so the whole module waits out the server's initial
rebalance delay (3 s) once.
"""

from __future__ import annotations

import struct
from dataclasses import replace
from itertools import count
from typing import Any, Final

import pytest
from kafka.protocol.admin import (
    CreateAclsRequest,
    CreateAclsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader
from serve_process import ServeProcess
from wire_client import (
    MEMBER_ID_REQUIRED,
    Joined,
    ProtocolIds,
    WireSocket,
    decode_response,
    encode_request,
    join_members,
    one_batch,
    request_body,
)

from oncelog.server.api_registry import APIS
from oncelog.server.codec import build, nested

SERVED = [(spec.key, v) for spec in APIS.values() for v in range(spec.served[0], spec.served[1] + 1)]
LEGACY = [
    (spec.key, v)
    for spec in APIS.values()
    for v in range(spec.advertised[0], spec.advertised[1] + 1)
    if not spec.serves(v)
]
_correlation = count(1000)
PRODUCE, FETCH, LIST_OFFSETS, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 0, 1, 2, 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, INIT_PRODUCER_ID = 11, 12, 13, 14, 22
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
DELETE_RECORDS, DESCRIBE_CONFIGS, DESCRIBE_LOG_DIRS, DELETE_GROUPS, OFFSET_DELETE = 21, 32, 35, 42, 47
ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS, DELETE_TOPICS, CREATE_PARTITIONS = 33, 44, 20, 37
DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS = 61, 65
# The APIs a member of a group sends; each served version gets a member of its own.
MEMBER_APIS: Final = (JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP)
# Fixture members are never heartbeated: their session and rebalance timeouts outlast the module.
MEMBER_TIMEOUT_MS: Final = 600_000


def _error_codes(entity: Any) -> list[int]:
    """Every error code field (error_code, partition_error_code) anywhere in a decoded response."""
    found: list[int] = []
    if isinstance(entity, tuple | list):
        for item in entity:
            found += _error_codes(item)
        return found
    fields = getattr(entity, "__dataclass_fields__", None) or getattr(entity, "fields", None)
    if not fields:
        return found
    for name in fields:
        value = getattr(entity, name, None)
        if name.endswith("error_code"):
            found.append(int(value))
        elif (
            isinstance(value, tuple | list)
            or hasattr(value, "__dataclass_fields__")
            or hasattr(value, "fields")
        ):
            found += _error_codes(value)
    return found


def test_the_advertised_table_starts_every_api_at_zero_and_never_has_min_above_max() -> None:
    for spec in APIS.values():
        assert spec.advertised[0] == 0
        assert spec.advertised[0] <= spec.advertised[1]
        assert spec.advertised[0] <= spec.served[0] <= spec.served[1] == spec.advertised[1]


@pytest.fixture(scope="module")
def members(served: ServeProcess) -> dict[tuple[int, int], Joined]:
    """For every served version of a member's API, the sole member (and leader) of its own group.

    Joined (generation 1) but not synced: each group is in CompletingRebalance.
    """
    keys = [(key, version) for key, version in SERVED if key in MEMBER_APIS]
    wanted = [
        ProtocolIds(
            group=f"conf-group-{key}-{version}",
            session_timeout_ms=MEMBER_TIMEOUT_MS,
            rebalance_timeout_ms=MEMBER_TIMEOUT_MS,
        )
        for key, version in keys
    ]
    joined = dict(zip(keys, join_members(served.bootstrap, wanted), strict=True))
    assert all(member.is_leader and member.ids.generation == 1 for member in joined.values())
    return joined


def _produce_to(sock: WireSocket, topic: str) -> None:
    produced = sock.request(PRODUCE, 9, request_body(PRODUCE, 9, topic))
    assert _error_codes(produced) == [0]


def _begin_transaction(sock: WireSocket, transactional_id: str) -> ProtocolIds:
    """A transactional producer's InitProducerId: the ids its transaction requests name."""
    ids = ProtocolIds(group=f"{transactional_id}-group", transactional_id=transactional_id)
    answer = sock.request(INIT_PRODUCER_ID, 4, request_body(INIT_PRODUCER_ID, 4, "", ids))
    assert answer.error_code == 0, answer
    return replace(ids, producer_id=answer.producer_id, producer_epoch=answer.producer_epoch)


def _set_up(
    sock: WireSocket, api_key: int, version: int, topic: str, fixtures: pytest.FixtureRequest
) -> ProtocolIds:
    """What the request of `api_key` at `version` must name to succeed, after any request it needs first."""
    if api_key in (
        FETCH,
        LIST_OFFSETS,
        OFFSET_COMMIT,
        ADD_PARTITIONS_TO_TXN,
        END_TXN,
        TXN_OFFSET_COMMIT,
        DELETE_RECORDS,
        DESCRIBE_CONFIGS,
        ALTER_CONFIGS,
        INCREMENTAL_ALTER_CONFIGS,
        DELETE_TOPICS,
        CREATE_PARTITIONS,
        DESCRIBE_PRODUCERS,
        DESCRIBE_TRANSACTIONS,
    ):
        # The topic must exist: Kafka refuses commits to unknown partitions too.
        _produce_to(sock, topic)
    if api_key in (DELETE_GROUPS, OFFSET_DELETE):
        # A group with offsets and no members: deletable, and its offsets too.
        _produce_to(sock, topic)
        ids = ProtocolIds(group=f"conf-admin-{api_key}-{version}")
        committed = sock.request(OFFSET_COMMIT, 9, request_body(OFFSET_COMMIT, 9, topic, ids))
        assert _error_codes(committed) == [0], committed
        return ids
    if api_key in (OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR):
        # A simple commit (generation -1, no member id) to a group with no members; v8+ of
        # OffsetFetch and v4+ of FindCoordinator name several groups.
        group = f"conf-offsets-{api_key}-{version}"
        return ProtocolIds(group=group, keys=(group, group + "-other"))
    if api_key in MEMBER_APIS:
        member: Joined = fixtures.getfixturevalue("members")[(api_key, version)]
        if api_key == JOIN_GROUP and version >= 4:
            # A newcomer's first join is answered at once: MEMBER_ID_REQUIRED with its id (KIP-394).
            newcomer = ProtocolIds(group=f"conf-newcomer-{version}")
            answer = sock.request(JOIN_GROUP, version, request_body(JOIN_GROUP, version, "", newcomer))
            assert answer.error_code == MEMBER_ID_REQUIRED and answer.member_id, answer
        if api_key == HEARTBEAT:  # heartbeats once the group is stable
            synced = sock.request(SYNC_GROUP, 5, request_body(SYNC_GROUP, 5, topic, member.ids))
            assert synced.error_code == 0, synced
        return member.ids  # JoinGroup: a rejoin with the same protocols, answered at once
    if api_key in (
        ADD_PARTITIONS_TO_TXN,
        ADD_OFFSETS_TO_TXN,
        END_TXN,
        TXN_OFFSET_COMMIT,
        DESCRIBE_TRANSACTIONS,
    ):
        ids = _begin_transaction(sock, f"conf-txn-{api_key}-{version}")
        if api_key in (END_TXN, DESCRIBE_TRANSACTIONS):  # (an open one: kio reads no start time -1)
            added = sock.request(ADD_PARTITIONS_TO_TXN, 3, request_body(ADD_PARTITIONS_TO_TXN, 3, topic, ids))
            assert _error_codes(added) == [0], added
        if api_key == TXN_OFFSET_COMMIT:
            added = sock.request(ADD_OFFSETS_TO_TXN, 3, request_body(ADD_OFFSETS_TO_TXN, 3, topic, ids))
            assert added.error_code == 0, added
        return ids
    return ProtocolIds()


# What this PLAINTEXT server, without ACLs (everything allowed), answers: no SASL on this
# listener (ILLEGAL_SASL_STATE), no SCRAM user named "conformance" (RESOURCE_NOT_FOUND, in
# the user's result), and no ACL APIs where nothing is authorized (SECURITY_DISABLED).
REFUSED_ON_PLAINTEXT: Final = {17: {34}, 29: {54}, 30: {54}, 31: {54}, 36: {34}, 50: {0, 91}, 51: {91}}


@pytest.mark.parametrize(("api_key", "version"), SERVED, ids=[f"{APIS[k].name}-v{v}" for k, v in SERVED])
def test_every_served_version_is_answered_with_a_response_that_decodes(
    served: ServeProcess, request: pytest.FixtureRequest, api_key: int, version: int
) -> None:
    topic = f"conf-{api_key}-{version}"
    correlation_id = next(_correlation)
    with WireSocket(served.bootstrap) as sock:
        ids = _set_up(sock, api_key, version, topic, request)
        sock.send_raw(
            encode_request(api_key, version, correlation_id, request_body(api_key, version, topic, ids))
        )
        got_id, body = decode_response(api_key, version, sock.read_frame())
    assert got_id == correlation_id
    assert set(_error_codes(body)) <= REFUSED_ON_PLAINTEXT.get(api_key, {0}), body
    if api_key == 1:
        records = body.responses[0].partitions[0].records
        assert records == one_batch()[:8] + records[8:] and len(records) == len(one_batch())
    if api_key == 18:
        advertised = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
        assert advertised == {spec.key: spec.advertised for spec in APIS.values()}
    if api_key == JOIN_GROUP:
        assert (body.generation_id, body.member_id, body.leader) == (1, ids.member_id, ids.member_id)
        assert [member.member_id for member in body.members] == [ids.member_id]
    if api_key == SYNC_GROUP:
        assert body.assignment == topic.encode()
    if api_key == FIND_COORDINATOR and version >= 4:
        assert [c.key for c in body.coordinators] == list(ids.keys)
        assert {(c.node_id, c.host, c.port) for c in body.coordinators} == {(0, "127.0.0.1", served.port)}


def _legacy_request(api_key: int, version: int, topic: str) -> Any:
    if api_key == 0:
        cls: Any = ProduceRequest[version]
        data = cls.TopicProduceData
        partition = data.PartitionProduceData(index=0, records=one_batch())
        return cls(acks=1, timeout_ms=1000, topic_data=[data(name=topic, partition_data=[partition])])
    if api_key == 1:
        cls = FetchRequest[version]
        fetch_topic = cls.FetchTopic
        partition = fetch_topic.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
        return cls(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=1 << 20,
            topics=[fetch_topic(topic=topic, partitions=[partition])],
        )
    if api_key == 2:
        cls = ListOffsetsRequest[version]
        list_topic = cls.ListOffsetsTopic
        partition = list_topic.ListOffsetsPartition(partition_index=0, timestamp=-1, max_num_offsets=1)
        return cls(replica_id=-1, topics=[list_topic(name=topic, partitions=[partition])])
    if api_key == OFFSET_COMMIT:
        cls = OffsetCommitRequest[version]
        commit_topic = cls.OffsetCommitRequestTopic
        commit = commit_topic.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=1, commit_timestamp=-1, committed_metadata=None
        )
        return cls(
            group_id=f"{topic}-group",
            generation_id_or_member_epoch=-1,
            member_id="",
            topics=[commit_topic(name=topic, partitions=[commit])],
        )
    if api_key == OFFSET_FETCH:
        cls = OffsetFetchRequest[version]
        wanted = cls.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])
        return cls(group_id=f"{topic}-group", topics=[wanted])
    if api_key == 19:
        cls = CreateTopicsRequest[version]
        creatable = cls.CreatableTopic(
            name=topic, num_partitions=1, replication_factor=1, assignments=[], configs=[]
        )
        return cls(topics=[creatable], timeout_ms=1000, validate_only=False)
    if api_key == DELETE_TOPICS:
        return DeleteTopicsRequest[version](topic_names=[topic], timeout_ms=1000)
    if api_key == DESCRIBE_CONFIGS:
        cls = DescribeConfigsRequest[version]
        return cls(
            resources=[
                cls.DescribeConfigsResource(resource_type=2, resource_name=topic, configuration_keys=None)
            ]
        )
    if api_key == DESCRIBE_LOG_DIRS:
        cls = DescribeLogDirsRequest[version]
        return cls(topics=[cls.DescribableLogDirTopic(topic=topic, partitions=[0])])
    return _legacy_acl_request(api_key, version, topic)


def _legacy_acl_request(api_key: int, version: int, topic: str) -> Any:
    """v0 of the ACL APIs: literal patterns, no pattern type on the wire."""
    acl = {"principal": "User:old", "host": "*", "operation": 3, "permission_type": 3}
    if api_key == 29:
        return DescribeAclsRequest[version](
            resource_type_filter=2,
            resource_name_filter=topic,
            principal_filter=None,
            host_filter=None,
            operation=1,
            permission_type=1,
        )
    if api_key == 30:
        cls = CreateAclsRequest[version]
        return cls(creations=[cls.AclCreation(resource_type=2, resource_name=topic, **acl)])
    if api_key == 31:
        cls = DeleteAclsRequest[version]
        return cls(
            filters=[
                cls.DeleteAclsFilter(
                    resource_type_filter=2,
                    resource_name_filter=topic,
                    principal_filter=None,
                    host_filter=None,
                    operation=1,
                    permission_type=1,
                )
            ]
        )
    raise AssertionError(api_key)


def _legacy_codes(api_key: int, response: Any) -> list[int]:
    """The error code of every entry of an old-version response (one topic, one partition asked)."""
    if api_key == 0:
        return [p.error_code for t in response.responses for p in t.partition_responses]
    if api_key == 1:
        return [p.error_code for t in response.responses for p in t.partitions]
    if api_key in (2, OFFSET_COMMIT, OFFSET_FETCH):
        return [p.error_code for t in response.topics for p in t.partitions]
    if api_key in (DESCRIBE_LOG_DIRS, DESCRIBE_CONFIGS):
        return [r.error_code for r in response.results]
    if api_key == DELETE_TOPICS:
        return [r.error_code for r in response.responses]
    if api_key == 29:
        return [response.error_code]
    if api_key == 30:
        return [r.error_code for r in response.results]
    if api_key == 31:
        return [r.error_code for r in response.filter_results]
    return [t.error_code for t in response.topics]


_LEGACY_RESPONSES: dict[int, Any] = {
    0: ProduceResponse,
    1: FetchResponse,
    2: ListOffsetsResponse,
    8: OffsetCommitResponse,
    9: OffsetFetchResponse,
    19: CreateTopicsResponse,
    DESCRIBE_LOG_DIRS: DescribeLogDirsResponse,
    DESCRIBE_CONFIGS: DescribeConfigsResponse,
    DELETE_TOPICS: DeleteTopicsResponse,
    29: DescribeAclsResponse,
    30: CreateAclsResponse,
    31: DeleteAclsResponse,
}


@pytest.mark.parametrize(("api_key", "version"), LEGACY, ids=[f"{APIS[k].name}-v{v}" for k, v in LEGACY])
def test_an_advertised_but_unserved_version_gets_unsupported_version_for_every_entry_and_writes_nothing(
    served: ServeProcess, api_key: int, version: int
) -> None:
    topic = f"legacy-{api_key}-{version}"
    request = _legacy_request(api_key, version, topic)
    request.with_header(correlation_id=77, client_id="old-client")
    with WireSocket(served.bootstrap) as sock:
        sock.send_raw(bytes(request.encode(header=True, framed=True)))
        frame = sock.read_frame()
        response = _LEGACY_RESPONSES[api_key][version].decode(frame, header=True)
        assert response.header.correlation_id == 77
        codes = _legacy_codes(api_key, response)
        assert codes == [35], response
        # The connection stays usable, and the topic was neither created nor written.
        sock.send_raw(encode_request(3, 4, 78, _metadata_no_create(topic)))
        _, metadata = decode_response(3, 4, sock.read_frame())
    assert [t.error_code for t in metadata.topics] == [3]  # UNKNOWN_TOPIC_OR_PARTITION


def _metadata_no_create(topic: str) -> Any:
    cls: Any = load_request_schema(3, 4)
    return build(cls, topics=(build(nested(cls, "topics"), name=topic),), allow_auto_topic_creation=False)


def test_api_versions_at_an_unknown_version_gets_a_v0_body_with_error_35_and_the_ranges(
    served: ServeProcess,
) -> None:
    # A raw ApiVersions v99 request: header prefix only, as a newer client would send it.
    payload = struct.pack(">hhih", 18, 99, 4242, -1) + b"\x00"
    with WireSocket(served.bootstrap) as sock:
        sock.send_raw(struct.pack(">i", len(payload)) + payload)
        frame = sock.read_frame()
    header, offset = entity_reader(load_response_schema(18, 0).__header_schema__)(frame, 0)
    body, size = entity_reader(load_response_schema(18, 0))(frame, offset)
    assert header.correlation_id == 4242
    assert offset + size == len(frame)
    assert body.error_code == 35
    assert {k.api_key: (k.min_version, k.max_version) for k in body.api_keys} == {
        spec.key: spec.advertised for spec in APIS.values()
    }


def test_pipelined_requests_are_answered_in_request_order(served: ServeProcess) -> None:
    ids = list(range(500, 540))
    versions = [(18, 3), (3, 9), (22, 4), (10, 3)]
    frames = b"".join(
        encode_request(
            versions[n % 4][0], versions[n % 4][1], cid, request_body(*versions[n % 4], "pipelined")
        )
        for n, cid in enumerate(ids)
    )
    with WireSocket(served.bootstrap) as sock:
        sock.send_raw(frames)
        answered = [decode_response(*versions[n % 4], sock.read_frame())[0] for n in range(len(ids))]
    assert answered == ids
