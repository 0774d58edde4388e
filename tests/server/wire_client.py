"""A raw socket speaking frames, for conformance and hostile-connection tests.

Requests are encoded by a codec generated from Kafka's JSON specs (kio for the
versions it has, kafka-python for the older ones), never by hand, and responses are
decoded the same way: what a client would read.
"""

from __future__ import annotations

import datetime
import io
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import count
from typing import Any, Final

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from oncelog.segments import encode_batch
from oncelog.server.codec import build, nested

CLIENT_ID = "oncelog-conformance"
_correlation_ids = count(1)


class WireSocket:
    def __init__(self, bootstrap: str, timeout_s: float = 10.0, *, source_host: str | None = None):
        """Connect to `bootstrap`, from `source_host` if given (any 127.x address on Linux's loopback)."""
        host, port = bootstrap.rsplit(":", 1)
        source = (source_host, 0) if source_host is not None else None
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s, source_address=source)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, api_key: int, version: int, body: Any) -> int:
        """Send one request; its correlation id, for `receive`."""
        correlation_id = next(_correlation_ids)
        self.send_raw(encode_request(api_key, version, correlation_id, body))
        return correlation_id

    def receive(self, api_key: int, version: int, correlation_id: int) -> Any:
        """The decoded body of the next response, which must answer `correlation_id`."""
        got, body = decode_response(api_key, version, self.read_frame())
        assert got == correlation_id, f"response to {got}, expected {correlation_id}"
        return body

    def request(self, api_key: int, version: int, body: Any) -> Any:
        """One request and its decoded response body."""
        return self.receive(api_key, version, self.send(api_key, version, body))

    def read_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._read_exactly(4))
        return self._read_exactly(size)

    def _read_exactly(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self.sock.recv(n - len(chunks))
            if not chunk:
                raise ConnectionError(f"closed after {len(chunks)} of {n} bytes")
            chunks += chunk
        return bytes(chunks)

    def closed_by_peer(self, timeout_s: float = 10.0) -> bool:
        """True once the server has closed this connection (EOF or reset) within the timeout."""
        self.sock.settimeout(timeout_s)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def encode_request(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """A framed request, encoded by kio."""
    request_type = load_request_schema(api_key, version)
    header_type: Any = request_type.__header_schema__
    header = build(
        header_type,
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id=CLIENT_ID,
    )
    buffer = io.BytesIO()
    entity_writer(header_type)(buffer, header)
    entity_writer(request_type)(buffer, body)
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


def decode_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, body) of a response frame, decoded by kio; asserts nothing is left over."""
    response_type: Any = load_response_schema(api_key, version)
    header, offset = entity_reader(response_type.__header_schema__)(frame, 0)
    body, size = entity_reader(response_type)(frame, offset)
    assert offset + size == len(frame), f"{len(frame) - offset - size} bytes left after the response"
    return int(header.correlation_id), body


def one_batch(value: bytes = b"conformance") -> bytes:
    return encode_batch([(b"k", value)], timestamp_ms=1_700_000_000_000)


# What the group and transaction requests name when the caller does not say (ProtocolIds).
CONFORMANCE_GROUP = "conformance-group"
CONFORMANCE_TXN = "conformance-txn"
# A JoinGroup's protocols: type "consumer", one named protocol with opaque metadata (the
# coordinator never reads it). A rejoin must name the same ones to be a plain retry.
PROTOCOL_TYPE = "consumer"
PROTOCOLS: tuple[tuple[str, bytes], ...] = (("range", b"conformance-metadata"),)
MEMBER_ID_REQUIRED = 79


@dataclass(frozen=True, slots=True)
class ProtocolIds:
    """Who a group or transaction request speaks for; the defaults are a newcomer with no state."""

    group: str = CONFORMANCE_GROUP
    member_id: str = ""
    generation: int = -1
    session_timeout_ms: int = 30_000
    rebalance_timeout_ms: int = 30_000
    # None: InitProducerId is an idempotent producer's; the transaction APIs name CONFORMANCE_TXN.
    transactional_id: str | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    # The member ids FindCoordinator v4+ and LeaveGroup v3+ name; (group,) / (member_id,) if empty.
    keys: tuple[str, ...] = ()


NEWCOMER = ProtocolIds()


def request_body(api_key: int, version: int, topic: str, ids: ProtocolIds = NEWCOMER) -> Any:
    """A valid request of every served API at `version`, naming `topic` partition 0.

    Group and transaction requests speak for `ids`; with the defaults a JoinGroup is a new
    member's first join, commits are simple (generation -1, no member id) and the
    transaction requests name a producer the coordinator has not seen.
    """
    cls: Any = load_request_schema(api_key, version)
    builder = _BUILDERS.get(api_key)
    if builder is None:
        raise AssertionError(f"no request body for API {api_key}")
    return builder(cls, version, topic, ids)


def _produce(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    topic_type = nested(cls, "topic_data")
    partition = build(nested(topic_type, "partition_data"), index=0, records=one_batch())
    return build(
        cls,
        transactional_id=None,
        acks=1,
        timeout=_TIMEOUT,
        topic_data=(build(topic_type, name=topic, partition_data=(partition,)),),
    )


def _fetch(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    topic_type = nested(cls, "topics")
    partition = build(
        nested(topic_type, "partitions"),
        partition=0,
        fetch_offset=0,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    return build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=(build(topic_type, topic=topic, partitions=(partition,)),),
        forgotten_topics_data=(),
        rack_id="",
    )


def _list_offsets(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    topic_type = nested(cls, "topics")
    partition = build(nested(topic_type, "partitions"), partition_index=0, timestamp=-1)
    return build(
        cls,
        replica_id=-1,
        isolation_level=0,
        topics=(build(topic_type, name=topic, partitions=(partition,)),),
    )


def _metadata(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    wanted = build(nested(cls, "topics"), name=topic)
    return build(
        cls,
        topics=(wanted,),
        allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def _offset_commit(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    topic_type = nested(cls, "topics")
    partition = build(
        nested(topic_type, "partitions"),
        partition_index=0,
        committed_offset=1,
        committed_leader_epoch=-1,
        committed_metadata="conformance",
    )
    return build(
        cls,
        group_id=ids.group,
        generation_id_or_member_epoch=ids.generation,
        member_id=ids.member_id,
        group_instance_id=None,
        retention_time=datetime.timedelta(milliseconds=-1),  # v2-4: the broker's default
        topics=(build(topic_type, name=topic, partitions=(partition,)),),
    )


def _offset_fetch(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    if version < 8:
        wanted = build(nested(cls, "topics"), name=topic, partition_indexes=(0,))
        return build(cls, group_id=ids.group, topics=(wanted,), require_stable=False)
    group_type = nested(cls, "groups")
    wanted = build(nested(group_type, "topics"), name=topic, partition_indexes=(0,))
    groups = tuple(
        build(group_type, group_id=group, member_id=None, member_epoch=-1, topics=(wanted,))
        for group in ids.keys or (ids.group,)
    )
    return build(cls, groups=groups, require_stable=False)


def _find_coordinator(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    # key_type 0: a group; v4+ asks for several keys at once (KIP-699).
    return build(cls, key=ids.group, key_type=0, coordinator_keys=ids.keys or (ids.group,))


def _join_group(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    protocol_type = nested(cls, "protocols")
    return build(
        cls,
        group_id=ids.group,
        session_timeout=datetime.timedelta(milliseconds=ids.session_timeout_ms),
        rebalance_timeout=datetime.timedelta(milliseconds=ids.rebalance_timeout_ms),
        member_id=ids.member_id,
        group_instance_id=None,
        protocol_type=PROTOCOL_TYPE,
        protocols=tuple(build(protocol_type, name=name, metadata=meta) for name, meta in PROTOCOLS),
        reason=None,
    )


def _heartbeat(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(
        cls, group_id=ids.group, generation_id=ids.generation, member_id=ids.member_id, group_instance_id=None
    )


def _leave_group(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    if version < 3:
        return build(cls, group_id=ids.group, member_id=ids.member_id)
    member_type = nested(cls, "members")
    members = tuple(
        build(member_type, member_id=member, group_instance_id=None, reason="conformance")
        for member in ids.keys or (ids.member_id,)
    )
    return build(cls, group_id=ids.group, members=members)


def _sync_group(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    """The leader's SyncGroup: it assigns `topic` partition 0 to itself (a member id of "" if none)."""
    assignment = build(nested(cls, "assignments"), member_id=ids.member_id, assignment=topic.encode())
    return build(
        cls,
        group_id=ids.group,
        generation_id=ids.generation,
        member_id=ids.member_id,
        group_instance_id=None,
        protocol_type=PROTOCOL_TYPE,
        protocol_name=PROTOCOLS[0][0],
        assignments=(assignment,),
    )


def _create_topics(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    creatable = build(
        nested(cls, "topics"),
        name=topic + "-created",
        num_partitions=2,
        replication_factor=1,
        assignments=(),
        configs=(),
    )
    return build(cls, topics=(creatable,), timeout=_TIMEOUT, validate_only=False)


def _init_producer_id(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    """An idempotent producer's InitProducerId, or a transactional one's if `ids` names an id."""
    return build(
        cls,
        transactional_id=ids.transactional_id,
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=-1,
    )


def _add_partitions_to_txn(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    # v0-3 only: one transaction, named by the producer (v4+ is the broker-to-broker batch of KIP-890).
    topic_type = nested(cls, "v3_and_below_topics")
    return build(
        cls,
        v3_and_below_transactional_id=ids.transactional_id or CONFORMANCE_TXN,
        v3_and_below_producer_id=ids.producer_id,
        v3_and_below_producer_epoch=ids.producer_epoch,
        v3_and_below_topics=(build(topic_type, name=topic, partitions=(0,)),),
    )


def _add_offsets_to_txn(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(
        cls,
        transactional_id=ids.transactional_id or CONFORMANCE_TXN,
        producer_id=ids.producer_id,
        producer_epoch=ids.producer_epoch,
        group_id=ids.group,
    )


def _end_txn(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(
        cls,
        transactional_id=ids.transactional_id or CONFORMANCE_TXN,
        producer_id=ids.producer_id,
        producer_epoch=ids.producer_epoch,
        committed=True,
    )


def _txn_offset_commit(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    topic_type = nested(cls, "topics")
    partition = build(
        nested(topic_type, "partitions"),
        partition_index=0,
        committed_offset=1,
        committed_leader_epoch=-1,
        committed_metadata=None,
    )
    return build(
        cls,
        transactional_id=ids.transactional_id or CONFORMANCE_TXN,
        group_id=ids.group,
        producer_id=ids.producer_id,
        producer_epoch=ids.producer_epoch,
        generation_id=ids.generation,
        member_id=ids.member_id,
        group_instance_id=None,
        topics=(build(topic_type, name=topic, partitions=(partition,)),),
    )


def _api_versions(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, client_software_name="oncelog-tests", client_software_version="1.0")


def _describe_groups(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, groups=(ids.group,), include_authorized_operations=version >= 3)


def _list_groups(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, states_filter=(), types_filter=())


def _delete_groups(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, groups_names=(ids.group,))


def _offset_delete(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    topic_type = nested(cls, "topics")
    partition = build(nested(topic_type, "partitions"), partition_index=0)
    return build(cls, group_id=ids.group, topics=(build(topic_type, name=topic, partitions=(partition,)),))


def _delete_records(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    topic_type = nested(cls, "topics")
    partition = build(nested(topic_type, "partitions"), partition_index=0, offset=-1)  # the high watermark
    return build(cls, topics=(build(topic_type, name=topic, partitions=(partition,)),), timeout=_TIMEOUT)


def _describe_log_dirs(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, topics=None)


def _describe_cluster(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, include_cluster_authorized_operations=True, endpoint_type=1)


def _describe_configs(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    resource = nested(cls, "resources")
    return build(
        cls,
        resources=(
            build(resource, resource_type=2, resource_name=topic, configuration_keys=None),
            build(resource, resource_type=4, resource_name="0", configuration_keys=("broker.id",)),
        ),
        include_synonyms=True,
        include_documentation=True,
    )


def _alter_configs(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    resource = nested(cls, "resources")
    config = build(nested(resource, "configs"), name="retention.ms", value="86400000", config_operation=0)
    return build(
        cls,
        resources=(build(resource, resource_type=2, resource_name=topic, configs=(config,)),),
        validate_only=False,
    )


def _delete_topics(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    by_name = build(nested(cls, "topics"), name=topic, topic_id=None) if version >= 6 else None
    return build(cls, topic_names=(topic,), topics=(by_name,), timeout=_TIMEOUT)


def _create_partitions(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    grown = build(nested(cls, "topics"), name=topic, count=2, assignments=None)
    return build(cls, topics=(grown,), timeout=_TIMEOUT, validate_only=False)


def _describe_producers(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, topics=(build(nested(cls, "topics"), name=topic, partition_indexes=(0,)),))


def _list_transactions(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, state_filters=(), producer_id_filters=(), duration_filter=-1)


def _describe_transactions(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, transactional_ids=(ids.transactional_id or CONFORMANCE_TXN,))


def _sasl_handshake(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, mechanism="SCRAM-SHA-512")


def _sasl_authenticate(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, auth_bytes=b"n,,n=conformance,r=fyko+d2lbbFgONRv9qkxdawL")  # a SCRAM client-first


def _describe_user_scram_credentials(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(cls, users=(build(nested(cls, "users"), name="conformance"),))


def _alter_user_scram_credentials(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(
        cls, deletions=(build(nested(cls, "deletions"), name="conformance", mechanism=1),), upsertions=()
    )


def _describe_acls(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    return build(
        cls,
        resource_type_filter=1,
        resource_name_filter=None,
        pattern_type_filter=1,
        principal_filter=None,
        host_filter=None,
        operation=1,
        permission_type=1,
    )


def _create_acls(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    # (A server that authorizes nothing answers SECURITY_DISABLED and stores nothing.)
    creation = build(
        nested(cls, "creations"),
        resource_type=2,
        resource_name=topic,
        resource_pattern_type=3,
        principal="conformance",
        host="*",
        operation=3,
        permission_type=3,
    )
    return build(cls, creations=(creation,))


def _delete_acls(cls: Any, version: int, topic: str, ids: ProtocolIds) -> Any:
    selector = build(
        nested(cls, "filters"),
        resource_type_filter=2,
        resource_name_filter=topic,
        pattern_type_filter=3,
        principal_filter="User:conformance",
        host_filter=None,
        operation=1,
        permission_type=1,
    )
    return build(cls, filters=(selector,))


_TIMEOUT = datetime.timedelta(seconds=5)
_BUILDERS: dict[int, Callable[[Any, int, str, ProtocolIds], Any]] = {
    0: _produce,
    1: _fetch,
    2: _list_offsets,
    3: _metadata,
    8: _offset_commit,
    9: _offset_fetch,
    10: _find_coordinator,
    11: _join_group,
    12: _heartbeat,
    13: _leave_group,
    14: _sync_group,
    15: _describe_groups,
    16: _list_groups,
    17: _sasl_handshake,
    18: _api_versions,
    19: _create_topics,
    22: _init_producer_id,
    24: _add_partitions_to_txn,
    25: _add_offsets_to_txn,
    26: _end_txn,
    28: _txn_offset_commit,
    20: _delete_topics,
    21: _delete_records,
    32: _describe_configs,
    33: _alter_configs,
    35: _describe_log_dirs,
    36: _sasl_authenticate,
    37: _create_partitions,
    42: _delete_groups,
    44: _alter_configs,
    47: _offset_delete,
    29: _describe_acls,
    30: _create_acls,
    31: _delete_acls,
    50: _describe_user_scram_credentials,
    51: _alter_user_scram_credentials,
    60: _describe_cluster,
    61: _describe_producers,
    65: _describe_transactions,
    66: _list_transactions,
}


# -- group membership over raw sockets ----------------------------------------------------------
JOIN_GROUP: Final = 11
SYNC_GROUP: Final = 14


@dataclass(frozen=True, slots=True)
class Joined:
    """A member whose JoinGroup completed: `ids` carries its member id and generation."""

    ids: ProtocolIds
    leader: str
    # Every member's id, for the leader; empty for the others.
    members: tuple[str, ...]

    @property
    def is_leader(self) -> bool:
        return self.ids.member_id == self.leader


def join_members(bootstrap: str, wanted: Sequence[ProtocolIds], version: int = 7) -> list[Joined]:
    """Each of `wanted` joins its group as a new member, all at once, one connection each.

    JoinGroup v4+ takes two steps (KIP-394): the first answers MEMBER_ID_REQUIRED with an
    id, the second joins with it and returns when the rebalance completes (after the
    initial rebalance delay for an empty group), so joining many at once costs one delay.
    """
    assert version >= 4, "JoinGroup before v4 has no MEMBER_ID_REQUIRED step"
    socks = [WireSocket(bootstrap, timeout_s=30.0) for _ in wanted]
    try:
        firsts = [
            s.send(JOIN_GROUP, version, request_body(JOIN_GROUP, version, "", ids))
            for s, ids in zip(socks, wanted, strict=True)
        ]
        named = []
        for sock, ids, correlation_id in zip(socks, wanted, firsts, strict=True):
            answer = sock.receive(JOIN_GROUP, version, correlation_id)
            assert answer.error_code == MEMBER_ID_REQUIRED and answer.member_id, answer
            named.append(replace(ids, member_id=answer.member_id))
        seconds = [
            s.send(JOIN_GROUP, version, request_body(JOIN_GROUP, version, "", ids))
            for s, ids in zip(socks, named, strict=True)
        ]
        joined = []
        for sock, ids, correlation_id in zip(socks, named, seconds, strict=True):
            answer = sock.receive(JOIN_GROUP, version, correlation_id)
            assert answer.error_code == 0 and answer.member_id == ids.member_id, answer
            joined.append(
                Joined(
                    replace(ids, generation=answer.generation_id),
                    answer.leader,
                    tuple(member.member_id for member in answer.members),
                )
            )
        return joined
    finally:
        for sock in socks:
            sock.close()
