"""frame_bounds: no length or count in a request reaches kio's native decoder unless it fits.

kio sizes an array from the count a frame claims, and a failed allocation in its Rust
code aborts the process. Each hostile frame is therefore decoded in a child process with
its address space capped: a count that got through would abort the child, and the test
sees the signal, not a dead test runner.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kio.index import load_request_schema
from serve_process import ServeProcess
from wire_client import WireSocket, encode_request, request_body

from oncelog.server.api_registry import APIS
from oncelog.server.codec import MalformedRequestError, decode_request
from oncelog.server.frame_bounds import FrameBoundsError, check_body

TESTS = Path(__file__).parent
# Metadata v1 (topics: a nullable i32-counted array of structs), 2^31 - 1 topics in 57 bytes.
TWO_BILLION_TOPICS = struct.pack(">hhih", 3, 1, 7, 3) + b"abc" + struct.pack(">i", 2**31 - 1) + bytes(40)


def test_the_walk_of_every_served_request_ends_where_kios_decode_ends() -> None:
    # kio is the independent decoder: the walk must read exactly the body it reads.
    from kio.serial import entity_reader

    for spec in APIS.values():
        for version in range(spec.served[0], spec.served[1] + 1):
            frame = encode_request(spec.key, version, 5, request_body(spec.key, version, "bounds"))[4:]
            request_type = load_request_schema(spec.key, version)
            _, offset = entity_reader(request_type.__header_schema__)(frame, 0)
            _, size = entity_reader(request_type)(frame, offset)
            assert check_body(request_type, frame, offset) == offset + size == len(frame), (
                spec.name,
                version,
            )


def test_a_frame_claiming_two_billion_topics_is_refused_by_name() -> None:
    with pytest.raises(MalformedRequestError, match=r"MetadataRequest.topics: 2147483647 elements claimed"):
        decode_request(TWO_BILLION_TOPICS, APIS)


@pytest.mark.parametrize(
    ("count", "message"),
    [(2**31 - 1, "elements claimed"), (-2, "is negative"), (-(2**31), "is negative")],
)
def test_a_legacy_array_count_past_the_frame_or_below_null_is_refused(count: int, message: str) -> None:
    request_type = load_request_schema(3, 1)
    frame = struct.pack(">i", count) + bytes(8)
    with pytest.raises(FrameBoundsError, match=message):
        check_body(request_type, frame, 0)


def test_a_compact_array_count_or_string_length_past_the_frame_is_refused() -> None:
    metadata_v12 = load_request_schema(3, 12)
    huge = b"\xff\xff\xff\xff\x07"  # uvarint 2^32 - 1
    with pytest.raises(FrameBoundsError, match="elements claimed"):
        check_body(metadata_v12, huge + bytes(8), 0)
    # One topic whose compact name claims 2^32 - 2 bytes.
    with pytest.raises(FrameBoundsError, match="bytes claimed"):
        check_body(metadata_v12, b"\x02" + bytes(16) + huge + bytes(8), 0)
    with pytest.raises(FrameBoundsError, match="varint longer"):
        check_body(metadata_v12, b"\xff" * 9, 0)


def test_a_tagged_field_claiming_more_bytes_than_the_frame_holds_is_refused() -> None:
    fetch_v12 = load_request_schema(1, 12)
    frame = encode_request(1, 12, 5, request_body(1, 12, "bounds"))[4:]
    from kio.serial import entity_reader

    _, offset = entity_reader(fetch_v12.__header_schema__)(frame, 0)
    # The body's tag section is its last byte (zero tags): claim one tag of 200 bytes instead.
    assert frame[-1] == 0
    with pytest.raises(FrameBoundsError, match="tag 1: 200 bytes claimed"):
        check_body(fetch_v12, frame[:-1] + b"\x01\x01\xc8\x01", offset)


_CHILD = textwrap.dedent(
    """
    import resource, struct, sys
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # an unchecked count aborts here
    sys.path.insert(0, sys.argv[1])
    from wire_client import encode_request, request_body
    from oncelog.server.api_registry import APIS
    from oncelog.server.codec import MalformedRequestError, decode_request
    HOSTILE = [
        struct.pack(">i", 2**31 - 1), struct.pack(">i", 0x10000000),  # i32 counts and lengths
        b"\\xff\\xff\\xff\\xff\\x07", b"\\x80\\x80\\x80\\x40",  # varint ones
    ]
    decoded = refused = 0
    for spec in APIS.values():
        for version in range(spec.served[0], spec.served[1] + 1):
            frame = encode_request(spec.key, version, 5, request_body(spec.key, version, "bounds"))[4:]
            for at in range(8, len(frame)):
                for hostile in HOSTILE:
                    try:
                        decode_request(frame[:at] + hostile + frame[at + len(hostile):], APIS)
                        decoded += 1
                    except MalformedRequestError:
                        refused += 1
    print(decoded, refused)
    """
)


def test_a_huge_count_or_length_at_any_position_of_any_served_request_never_aborts_the_decoder() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(TESTS)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"the decoding child died ({done.returncode}): {done.stderr[-2000:]}"
    decoded, refused = map(int, done.stdout.split())
    assert refused > 1000 and decoded + refused > 10_000  # every position of every request was tried


def test_the_server_closes_a_connection_claiming_two_billion_topics_and_serves_a_real_client_on(
    tmp_path: Path,
) -> None:
    with ServeProcess(tmp_path / "root") as server:
        with WireSocket(server.bootstrap) as sock:
            sock.send_raw(struct.pack(">i", len(TWO_BILLION_TOPICS)) + TWO_BILLION_TOPICS)
            assert sock.closed_by_peer(timeout_s=30.0)
        assert server.proc.poll() is None, server.log()
        producer = KafkaProducer(bootstrap_servers=server.bootstrap)
        producer.send("bounds", b"after the hostile frame").get(timeout=30)
        producer.close()
        consumer = KafkaConsumer(
            "bounds",
            bootstrap_servers=server.bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=30_000,
        )
        assert [m.value for m in consumer][:1] == [b"after the hostile frame"]
        consumer.close()
        assert server.wait_for_output("MetadataRequest.topics: 2147483647 elements claimed"), server.log()


def _fetch_v12_with_tags(tags: bytes) -> tuple[bytes, int]:
    """A Fetch v12 frame whose body's tag section is `tags`, and where its body starts."""
    from kio.serial import entity_reader

    frame = encode_request(1, 12, 5, request_body(1, 12, "bounds"))[4:]
    _, offset = entity_reader(load_request_schema(1, 12).__header_schema__)(frame, 0)
    assert frame[-1] == 0  # no tags: the section is its count alone
    return frame[:-1] + tags, offset


def test_a_known_tag_whose_value_ends_before_its_size_is_refused() -> None:
    # kio reads cluster_id (tag 0) and goes on from the value's end, not the size's:
    # the 7 bytes between would reach kio unwalked.
    frame, offset = _fetch_v12_with_tags(b"\x01" + b"\x00\x0a" + b"\x03ab" + bytes(7))
    with pytest.raises(FrameBoundsError, match="tag 0: its value does not fill its 10 bytes"):
        check_body(load_request_schema(1, 12), frame, offset)
    frame, offset = _fetch_v12_with_tags(b"\x01" + b"\x00\x03" + b"\x03ab")
    assert check_body(load_request_schema(1, 12), frame, offset) == len(frame)


@pytest.fixture
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-python's fallback, which strips tags kio lacks, fails the test if it runs."""
    from oncelog.server import codec

    def fallback(*args: object) -> bytes:
        raise AssertionError("kafka-python's fallback ran")

    monkeypatch.setattr(codec, "without_unknown_tags", fallback)


@pytest.mark.usefixtures("no_fallback")
def test_more_unknown_tags_than_the_limit_are_refused_before_the_fallback_copies_the_frame() -> None:
    from oncelog.server import frame_bounds

    unknown = b"\x07\x00"  # tag 7 (no spec names it), empty
    limit = frame_bounds.MAX_UNKNOWN_TAGS
    frame, _ = _fetch_v12_with_tags(bytes([limit + 1]) + unknown * (limit + 1))
    with pytest.raises(MalformedRequestError, match=f"more than {limit} tagged fields no spec names"):
        decode_request(frame, APIS)


@pytest.mark.usefixtures("no_fallback")
def test_a_request_past_the_fallback_limit_with_an_unknown_tag_is_refused_without_the_fallback() -> None:
    from oncelog.server import codec

    # A cluster_id (known, tag 0) long enough to pass the limit, then one unknown tag.
    name = b"c" * codec.MAX_FALLBACK_FRAME_BYTES
    value = b"\x81\x80\x04" + name  # compact string: uvarint len + 1 = 65537
    frame, _ = _fetch_v12_with_tags(b"\x02" + b"\x00\x83\x80\x04" + value + b"\x07\x00")
    with pytest.raises(MalformedRequestError, match="tagged fields no spec names"):
        decode_request(frame, APIS)


def test_an_unsupported_version_request_past_the_fallback_limit_closes_the_connection(tmp_path: Path) -> None:
    # Produce v2 is advertised (answered UNSUPPORTED_VERSION by kafka-python) but not served.
    from oncelog.server.codec import MAX_FALLBACK_FRAME_BYTES

    body = struct.pack(">hhih", 0, 2, 9, 1) + b"x"
    body += struct.pack(">hi", 1, 1000) + struct.pack(">i", 1) + struct.pack(">h", 1) + b"t"
    body += struct.pack(">i", 1) + struct.pack(">i", 0)
    records = bytes(MAX_FALLBACK_FRAME_BYTES)
    big = body + struct.pack(">i", len(records)) + records
    with ServeProcess(tmp_path / "root") as server, WireSocket(server.bootstrap) as sock:
        sock.send_raw(struct.pack(">i", len(big)) + big)
        assert sock.closed_by_peer(timeout_s=30.0)
        assert server.wait_for_output("at a version below the served ones"), server.log()
