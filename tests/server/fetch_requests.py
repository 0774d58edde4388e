"""Raw Fetch requests for measuring what a fetch response holds, and logs preloaded through the engine.

Requests are built with kio's classes generated from Kafka's specs (a codec, as in
wire_client), so a test can set every limit a client would and read the response's
sizes exactly.
"""

from __future__ import annotations

import datetime
import select
import socket
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from kio.index import load_request_schema
from wire_client import WireSocket, decode_response, encode_request

from oncelog.log_manager import LogManager
from oncelog.segments import encode_batch
from oncelog.server.codec import build, nested

FETCH_VERSION: Final = 12
_TIMESTAMP_MS: Final = 1_700_000_000_000


def fetch_body(
    offsets: Mapping[str, Sequence[tuple[int, int]]],
    *,
    max_bytes: int,
    partition_max_bytes: int,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
) -> Any:
    """A Fetch v12 of each topic's (partition, offset) pairs, in order, with these limits."""
    cls: Any = load_request_schema(1, FETCH_VERSION)
    topic_type = nested(cls, "topics")
    partition_type = nested(topic_type, "partitions")
    topics = tuple(
        build(
            topic_type,
            topic=topic,
            partitions=tuple(
                build(
                    partition_type,
                    partition=partition,
                    fetch_offset=offset,
                    log_start_offset=-1,
                    partition_max_bytes=partition_max_bytes,
                )
                for partition, offset in pairs
            ),
        )
        for topic, pairs in offsets.items()
    )
    return build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        topics=topics,
        forgotten_topics_data=(),
        rack_id="",
    )


def fetch_frame(correlation_id: int, body: Any) -> bytes:
    return encode_request(1, FETCH_VERSION, correlation_id, body)


def fetch(sock: WireSocket, body: Any, correlation_id: int = 1) -> Any:
    """Send a Fetch and decode its response body."""
    sock.send_raw(fetch_frame(correlation_id, body))
    _, response = decode_response(1, FETCH_VERSION, sock.read_frame())
    return response


def records_by_partition(response: Any) -> dict[tuple[str, int], bytes]:
    return {
        (topic.topic, partition.partition_index): partition.records or b""
        for topic in response.responses
        for partition in topic.partitions
    }


def batch_sizes(records: bytes) -> list[int]:
    """The sizes of the whole batches in a records field (each: 8-byte offset, 4-byte length, rest)."""
    sizes = []
    position = 0
    while position < len(records):
        (length,) = struct.unpack_from(">i", records, position + 8)
        sizes.append(12 + length)
        position += 12 + length
    assert position == len(records), "a batch was cut short"
    return sizes


def preload(root: Path, topic: str, partitions: int, batches: int, value_bytes: int) -> int:
    """Write `batches` one-record batches of `value_bytes` to each partition of `topic`; a batch's size."""
    size = 0
    with LogManager.open(root, progress=False) as manager:
        for partition in range(partitions):
            log = manager.log(topic, partition, create=True)
            for n in range(batches):
                value = bytes([n % 251]) * value_bytes
                batch = encode_batch([(f"{partition}-{n}".encode(), value)], timestamp_ms=_TIMESTAMP_MS)
                log.append(batch)
                size = len(batch)
    return size


def stalled_socket(bootstrap: str, receive_buffer_bytes: int = 4096) -> socket.socket:
    """A connection whose client never reads: a small receive buffer, so the server keeps what it sends."""
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)  # before connect: the window
    sock.settimeout(10)
    sock.connect((host, int(port)))
    return sock


def has_answer(sock: socket.socket) -> bool:
    """True once the server has sent the start of a response (peeked: nothing is taken from the socket)."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and len(sock.recv(4, socket.MSG_PEEK)) == 4
