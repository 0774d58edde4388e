"""A hostile or broken peer loses its connection; the server lives and no log changes.

Each scenario sends something a real client never would, then checks three things:
the connection was closed, a new connection is answered, and no topic was created
or written (the root's partitions and their end offsets are as before). Bytes after a
request's body are not hostile: Kafka ignores them, and so does this server.
"""

from __future__ import annotations

import contextlib
import random
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest
from serve_process import ServeProcess
from wire_client import WireSocket, decode_response, encode_request, one_batch, request_body

from oncelog.segments import encode_batch

SEED_TOPIC = "hostile-seed"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root: Path = tmp_path_factory.mktemp("hostile-root")
    with ServeProcess(root) as server:
        with WireSocket(server.bootstrap) as sock:  # one topic with one batch in it
            sock.send_raw(encode_request(0, 9, 1, request_body(0, 9, SEED_TOPIC)))
            decode_response(0, 9, sock.read_frame())
        yield server


def _state(server: ServeProcess) -> tuple[list[str], int]:
    """(partition directories under the root, end offset of the seed topic) as a client sees them."""
    dirs = sorted(
        p.name for p in server.root.iterdir() if p.is_dir() and "-" in p.name and p.name[-1].isdigit()
    )
    with WireSocket(server.bootstrap) as sock:
        sock.send_raw(encode_request(2, 7, 9, request_body(2, 7, SEED_TOPIC)))
        _, body = decode_response(2, 7, sock.read_frame())
    return dirs, body.topics[0].partitions[0].offset


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _produce_v9_prefix() -> bytes:
    return struct.pack(">hhi", 0, 9, 5)


HOSTILE_BYTES: dict[str, bytes] = {
    "a 2 GiB length prefix": struct.pack(">i", 2**31 - 1) + b"x" * 64,
    "a negative length prefix": struct.pack(">i", -5) + b"x" * 64,
    "a length prefix shorter than a header": struct.pack(">i", 3) + b"abc",
    "garbage after a valid size": _frame(b"\xde\xad\xbe\xef" * 16),
    "an unknown API key": _frame(struct.pack(">hhi", 9999, 0, 1) + b"\xff\xff"),
    # Kafka 4 dropped it; only controllers ever sent it to brokers.
    "an inter-broker API (LeaderAndIsr)": _frame(struct.pack(">hhi", 4, 5, 1) + b"\x00" * 40),
    "a version neither served nor advertised": _frame(struct.pack(">hhi", 0, 100, 1) + b"\x00" * 40),
    "a Produce body cut short": encode_request(0, 9, 5, request_body(0, 9, "hostile-new"))[:-20],
    "a header-only Produce": _frame(_produce_v9_prefix()),
}


@pytest.mark.parametrize("case", list(HOSTILE_BYTES), ids=list(HOSTILE_BYTES))
def test_a_bad_frame_closes_the_connection_and_touches_nothing(hostile: ServeProcess, case: str) -> None:
    before = _state(hostile)
    data = HOSTILE_BYTES[case]
    with WireSocket(hostile.bootstrap) as sock:
        sock.send_raw(data)
        if case == "a Produce body cut short":
            pass  # the frame's size promises more: the server waits, then the peer hangs up
        else:
            assert sock.closed_by_peer(), f"{case}: the connection stayed open"
    assert _state(hostile) == before
    assert hostile.proc is not None and hostile.proc.poll() is None


def test_a_produce_with_bytes_after_its_body_is_answered_and_appended_once_as_kafka_does(
    hostile: ServeProcess,
) -> None:
    _, end_before = _state(hostile)
    frame = encode_request(0, 9, 5, request_body(0, 9, SEED_TOPIC))[4:] + b"xx"
    with WireSocket(hostile.bootstrap) as sock:
        sock.send_raw(_frame(frame))
        correlation_id, body = decode_response(0, 9, sock.read_frame())
        answer = body.responses[0].partition_responses[0]
        assert (correlation_id, answer.error_code, answer.base_offset) == (5, 0, end_before)
        # The connection stays open and in step: the next request is answered.
        sock.send_raw(encode_request(18, 3, 6, request_body(18, 3, SEED_TOPIC)))
        assert decode_response(18, 3, sock.read_frame())[0] == 6
    assert _state(hostile)[1] == end_before + 1  # one batch of one record, appended once


def test_a_frame_truncated_by_a_hang_up_leaves_the_server_serving(hostile: ServeProcess) -> None:
    before = _state(hostile)
    frame = encode_request(0, 9, 5, request_body(0, 9, SEED_TOPIC))
    for cut in (1, 4, 7, len(frame) // 2, len(frame) - 1):
        with WireSocket(hostile.bootstrap) as sock:
            sock.send_raw(frame[:cut])
    assert _state(hostile) == before


def _produce(server: ServeProcess, records: bytes, topic: str = SEED_TOPIC) -> Any:
    body = request_body(0, 9, topic)
    topic_data = body.topic_data[0]
    partition = type(topic_data.partition_data[0])(index=0, records=records)
    body = type(body)(
        transactional_id=None,
        acks=1,
        timeout=body.timeout,
        topic_data=(type(topic_data)(name=topic, partition_data=(partition,)),),
    )
    with WireSocket(server.bootstrap) as sock:
        sock.send_raw(encode_request(0, 9, 11, body))
        _, response = decode_response(0, 9, sock.read_frame())
    return response.responses[0].partition_responses[0]


def _flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x40]) + data[position + 1 :]


def _lying_max_timestamp() -> bytes:
    data = bytearray(one_batch())
    struct.pack_into(">q", data, 35, 0)  # maxTimestamp 0 over a record at 2023-11-14
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


def test_a_batch_whose_header_max_timestamp_lies_is_stored_with_the_records_largest(
    hostile: ServeProcess,
) -> None:
    # Kafka's broker sets the field as it validates, and librdkafka relies on it (records
    # without timestamps: maxTimestamp 0 over -1); the stored header must be true, since
    # time lookups trust it.
    lying = _lying_max_timestamp()
    honest_max = struct.unpack_from(">q", one_batch(), 35)[0]
    answer = _produce(hostile, lying, topic="hostile-max-timestamp")
    assert (answer.error_code, answer.base_offset) == (0, 0)
    with WireSocket(hostile.bootstrap) as sock:  # ListOffsets v7, the largest timestamp (-3)
        body = request_body(2, 7, "hostile-max-timestamp")
        topic = body.topics[0]
        partition = type(topic.partitions[0])(partition_index=0, current_leader_epoch=-1, timestamp=-3)
        body = type(body)(
            replica_id=body.replica_id,
            isolation_level=body.isolation_level,
            topics=(type(topic)(name=topic.name, partitions=(partition,)),),
        )
        sock.send_raw(encode_request(2, 7, 12, body))
        _, listed = decode_response(2, 7, sock.read_frame())
    found = listed.topics[0].partitions[0]
    assert (found.error_code, found.timestamp, found.offset) == (0, honest_max, 0)


BAD_BATCHES: dict[str, tuple[bytes, int]] = {
    "a batch whose CRC fails": (_flip(one_batch(), 70), 2),  # CORRUPT_MESSAGE
    "two batches in one partition": (one_batch() + one_batch(), 87),  # INVALID_RECORD
    "a batch shorter than it says": (one_batch()[:-3], 87),
    "no records at all": (b"", 87),
    "a control batch from a client": (
        encode_batch(
            [(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")],
            control=True,
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
        ),
        87,
    ),
}


@pytest.mark.parametrize("case", list(BAD_BATCHES), ids=list(BAD_BATCHES))
def test_a_bad_batch_is_refused_with_kafkas_code_and_the_log_is_unchanged(
    hostile: ServeProcess, case: str
) -> None:
    records, code = BAD_BATCHES[case]
    before = _state(hostile)
    answer = _produce(hostile, records)
    assert (answer.error_code, answer.base_offset) == (code, -1)
    assert _state(hostile) == before


def test_random_frames_never_kill_the_server_or_write(hostile: ServeProcess) -> None:
    rng = random.Random(17)
    before = _state(hostile)
    valid = encode_request(0, 9, 5, request_body(0, 9, SEED_TOPIC))
    for _ in range(150):
        mutated = bytearray(valid)
        for _ in range(rng.randint(1, 6)):
            mutated[rng.randrange(4, len(mutated))] = rng.randrange(256)  # keep the size: the body is garbled
        with WireSocket(hostile.bootstrap, timeout_s=5) as sock:
            sock.send_raw(bytes(mutated))
            # Closed, or answered with an error; either is fine, a crash is not.
            with contextlib.suppress(Exception):
                decode_response(0, 9, sock.read_frame())
    after_dirs, after_end = _state(hostile)
    # A garble may still be a valid request (a changed key or value byte passes the batch CRC
    # only if it misses the CRC's range): whatever was accepted was appended whole.
    assert after_end >= before[1]
    assert hostile.proc is not None and hostile.proc.poll() is None
    assert set(before[0]) <= set(after_dirs)
