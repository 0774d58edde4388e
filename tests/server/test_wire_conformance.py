"""Every advertised API and version gets a response that decodes, over a raw socket.

Served versions are encoded and decoded by kio; the older versions that are
advertised (for librdkafka's exact-version overlap) but not served are encoded and
decoded by kafka-python, whose classes reach back to v0, and must carry
UNSUPPORTED_VERSION (35) for every topic and partition asked about.
"""

from __future__ import annotations

import struct
from itertools import count
from typing import Any

import pytest
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader
from serve_process import ServeProcess
from wire_client import WireSocket, decode_response, encode_request, one_batch, request_body

from oncelog.server.protocol import APIS, build, nested

SERVED = [(spec.key, v) for spec in APIS.values() for v in range(spec.served[0], spec.served[1] + 1)]
LEGACY = [
    (spec.key, v)
    for spec in APIS.values()
    for v in range(spec.advertised[0], spec.advertised[1] + 1)
    if not spec.serves(v)
]
_correlation = count(1000)


def _error_codes(entity: Any) -> list[int]:
    """Every error_code field anywhere in a decoded response."""
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
        if name == "error_code":
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


@pytest.mark.parametrize(("api_key", "version"), SERVED, ids=[f"{APIS[k].name}-v{v}" for k, v in SERVED])
def test_every_served_version_is_answered_with_a_response_that_decodes(
    served: ServeProcess, api_key: int, version: int
) -> None:
    topic = f"conf-{api_key}-{version}"
    correlation_id = next(_correlation)
    with WireSocket(served.bootstrap) as sock:
        if api_key in (1, 2):  # Fetch and ListOffsets need the topic to exist
            produce = request_body(0, 9, topic)
            sock.send_raw(encode_request(0, 9, correlation_id - 1, produce))
            _, produced = decode_response(0, 9, sock.read_frame())
            assert _error_codes(produced) == [0]
        sock.send_raw(encode_request(api_key, version, correlation_id, request_body(api_key, version, topic)))
        got_id, body = decode_response(api_key, version, sock.read_frame())
    assert got_id == correlation_id
    assert set(_error_codes(body)) <= {0}, body
    if api_key == 1:
        records = body.responses[0].partitions[0].records
        assert records == one_batch()[:8] + records[8:] and len(records) == len(one_batch())
    if api_key == 18:
        advertised = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
        assert advertised == {spec.key: spec.advertised for spec in APIS.values()}


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
    if api_key == 19:
        cls = CreateTopicsRequest[version]
        creatable = cls.CreatableTopic(
            name=topic, num_partitions=1, replication_factor=1, assignments=[], configs=[]
        )
        return cls(topics=[creatable], timeout_ms=1000, validate_only=False)
    raise AssertionError(api_key)


def _legacy_codes(api_key: int, response: Any) -> list[int]:
    """The error code of every entry of an old-version response (one topic, one partition asked)."""
    if api_key == 0:
        return [p.error_code for t in response.responses for p in t.partition_responses]
    if api_key == 1:
        return [p.error_code for t in response.responses for p in t.partitions]
    if api_key == 2:
        return [p.error_code for t in response.topics for p in t.partitions]
    return [t.error_code for t in response.topics]


_LEGACY_RESPONSES: dict[int, Any] = {
    0: ProduceResponse,
    1: FetchResponse,
    2: ListOffsetsResponse,
    19: CreateTopicsResponse,
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
