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
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from oncelog.segments import encode_batch
from oncelog.server.protocol import build, nested

CLIENT_ID = "oncelog-conformance"


class WireSocket:
    def __init__(self, bootstrap: str, timeout_s: float = 10.0):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

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


def request_body(api_key: int, version: int, topic: str) -> Any:
    """A valid request of every served API at `version`, naming `topic` partition 0."""
    cls: Any = load_request_schema(api_key, version)
    timeout = datetime.timedelta(seconds=5)
    if api_key == 0:
        topic_type = nested(cls, "topic_data")
        partition = build(nested(topic_type, "partition_data"), index=0, records=one_batch())
        return build(
            cls,
            transactional_id=None,
            acks=1,
            timeout=timeout,
            topic_data=(build(topic_type, name=topic, partition_data=(partition,)),),
        )
    if api_key == 1:
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
    if api_key == 2:
        topic_type = nested(cls, "topics")
        partition = build(nested(topic_type, "partitions"), partition_index=0, timestamp=-1)
        return build(
            cls,
            replica_id=-1,
            isolation_level=0,
            topics=(build(topic_type, name=topic, partitions=(partition,)),),
        )
    if api_key == 3:
        wanted = build(nested(cls, "topics"), name=topic)
        return build(
            cls,
            topics=(wanted,),
            allow_auto_topic_creation=True,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    if api_key == 10:
        return build(cls, key="conformance-group", key_type=0)
    if api_key == 18:
        return build(cls, client_software_name="oncelog-tests", client_software_version="1.0")
    if api_key == 19:
        creatable = build(
            nested(cls, "topics"),
            name=topic + "-created",
            num_partitions=2,
            replication_factor=1,
            assignments=(),
            configs=(),
        )
        return build(cls, topics=(creatable,), timeout=timeout, validate_only=False)
    if api_key == 22:
        return build(
            cls,
            transactional_id=None,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=-1,
            producer_epoch=-1,
        )
    raise AssertionError(f"no request body for API {api_key}")
