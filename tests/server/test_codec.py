"""The frame codec on its own: decode_request and frame_size, with hostile and real bytes."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wire_client import encode_request, request_body

from oncelog.server.api_registry import APIS
from oncelog.server.codec import (
    MAX_REQUEST_BYTES,
    MalformedRequestError,
    decode_request,
    frame_size,
)

# Metadata v9 as librdkafka 2.16 sends it on a refresh: null topics, three false flags,
# and one tagged field (tag 0, empty) that the spec kio is generated from lacks. (It is
# librdkafka's all-topics request with allow_auto_topic_creation true, read as Kafka reads
# it: the 4-byte placeholder of its topic count, then the flag taken for a tag count.)
LIBRDKAFKA_METADATA_V9_WITH_UNKNOWN_TAG = bytes.fromhex(
    "0003000900000004000772646b61666b61000000000001000000"
)


def test_a_request_with_a_tagged_field_the_spec_lacks_is_decoded_and_the_tag_ignored() -> None:
    request = decode_request(LIBRDKAFKA_METADATA_V9_WITH_UNKNOWN_TAG, APIS)
    assert (request.api_key, request.api_version, request.correlation_id, request.client_id) == (
        3,
        9,
        4,
        "rdkafka",
    )
    assert request.body.topics is None
    assert request.body.allow_auto_topic_creation is False


def test_bytes_after_any_served_request_body_are_ignored_and_counted() -> None:
    for spec in APIS.values():
        for version in range(spec.served[0], spec.served[1] + 1):
            body = request_body(spec.key, version, "codec")
            frame = encode_request(spec.key, version, 99, body)[4:]
            request = decode_request(frame + b"\x00\xff\x7f", APIS)
            assert (request.body, request.trailing_bytes) == (body, 3), f"{spec.name} v{version}"
            assert decode_request(frame, APIS).trailing_bytes == 0


def test_a_body_cut_short_is_malformed_for_every_served_request() -> None:
    for spec in APIS.values():
        for version in range(spec.served[0], spec.served[1] + 1):
            frame = encode_request(spec.key, version, 99, request_body(spec.key, version, "codec"))[4:]
            for cut in (1, 2, len(frame) // 2):
                with pytest.raises(MalformedRequestError, match=r"does not decode|past its frame"):
                    decode_request(frame[:-cut], APIS)


@pytest.mark.parametrize("size", [-1, 0, 7, MAX_REQUEST_BYTES + 1, 2**31 - 1])
def test_an_absurd_frame_size_is_refused_before_any_byte_is_read(size: int) -> None:
    with pytest.raises(MalformedRequestError, match="frame size"):
        frame_size(struct.pack(">i", size))


def test_the_largest_request_kafka_reads_is_allowed() -> None:
    assert frame_size(struct.pack(">i", MAX_REQUEST_BYTES)) == MAX_REQUEST_BYTES


def test_every_served_request_decodes_to_what_was_encoded() -> None:
    for spec in APIS.values():
        for version in range(spec.served[0], spec.served[1] + 1):
            body = request_body(spec.key, version, "codec")
            request = decode_request(encode_request(spec.key, version, 99, body)[4:], APIS)
            assert (request.api_key, request.api_version, request.correlation_id) == (spec.key, version, 99)
            assert request.body == body


def test_an_unknown_api_key_is_malformed() -> None:
    with pytest.raises(MalformedRequestError, match="unknown or unserved API key 57"):
        decode_request(struct.pack(">hhi", 57, 0, 1) + b"\0\0", APIS)


def test_an_advertised_but_unserved_version_is_handed_on_undecoded() -> None:
    request = decode_request(struct.pack(">hhi", 0, 2, 1) + b"garbage", APIS)
    assert request.body is None and request.api_version == 2


@settings(max_examples=400, deadline=None)
@given(
    key=st.sampled_from(sorted(APIS)),
    version=st.integers(-2, 20),
    tail=st.binary(max_size=200),
)
def test_any_bytes_behind_a_known_header_decode_or_raise_malformed_and_nothing_else(
    key: int, version: int, tail: bytes
) -> None:
    with contextlib.suppress(MalformedRequestError):
        decode_request(struct.pack(">hhi", key, version, 7) + tail, APIS)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_served_request_with_bytes_flipped_decodes_or_raises_malformed(data: st.DataObject) -> None:
    spec = data.draw(st.sampled_from(list(APIS.values())))
    version = data.draw(st.integers(spec.served[0], spec.served[1]))
    frame = bytearray(encode_request(spec.key, version, 5, request_body(spec.key, version, "fuzz"))[4:])
    for _ in range(data.draw(st.integers(1, 4))):
        frame[data.draw(st.integers(8, len(frame) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(MalformedRequestError):
        decode_request(bytes(frame), APIS)
