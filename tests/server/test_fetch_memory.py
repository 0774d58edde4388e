"""A fetch is read and framed off the event loop, and unsent responses stay within a bound (issue 28).

Structural facts, never durations: the read and the framing ran on a fetch thread; the
frame carries the stored buffers and encodes exactly what kio would; the bytes counted
for unsent responses never pass the budget; while stalled clients hold it, another
fetch gets no records, and once one is dropped a waiting fetch is read. Then the bound
as an operator sees it: 150 clients that each send a 55 MB Fetch and never read leave
`oncelog serve`'s resident set under its idle size plus 300 MiB.
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from fetch_requests import (
    FETCH_VERSION,
    fetch,
    fetch_body,
    fetch_frame,
    has_answer,
    preload,
    records_by_partition,
    stalled_socket,
)
from in_process import InProcessServer
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from serve_process import ServeProcess
from wire_client import WireSocket, decode_response

from oncelog.segments import encode_batch
from oncelog.server.broker import ServeConfig
from oncelog.server.codec import (
    NO_THROTTLE,
    SIZE,
    Records,
    Request,
    build,
    encode_frame,
    nested,
    response_type,
)
from oncelog.server.handlers import fetch as fetch_module

MIB = 1024 * 1024
WAIT_S = 30.0  # how long a test waits for the server to reach a state before failing


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never reached: {what}"
        time.sleep(0.01)


# -- off the loop, uncopied --------------------------------------------------------------


def test_a_fetch_is_read_and_framed_on_a_fetch_thread_never_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    preload(tmp_path / "root", "off-loop", partitions=2, batches=20, value_bytes=50_000)
    threads: list[str] = []
    respond = fetch_module._respond

    def recording(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return respond(*args)

    monkeypatch.setattr(fetch_module, "_respond", recording)
    with InProcessServer(tmp_path / "root") as running:
        consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": running.bootstrap, "group.id": "off-loop", "log_level": 3}
        )
        try:
            consumer.assign([confluent_kafka.TopicPartition("off-loop", p, 0) for p in range(2)])
            read = 0
            deadline = time.monotonic() + WAIT_S
            while read < 40 and time.monotonic() < deadline:
                read += sum(m.error() is None for m in consumer.consume(40, 0.2))
        finally:
            consumer.close()
        loop_thread = running._thread.name
    assert read == 40
    assert threads, "no fetch was read"
    assert loop_thread not in threads
    assert {name.split("_")[0] for name in threads} == {"oncelog-fetch"}


def _kio_bytes(request: Request, body: Any) -> bytes:
    """The frame as kio alone writes it (records as one bytes value)."""
    buffer = io.BytesIO()
    header_type: Any = type(body).__header_schema__
    entity_writer(header_type)(buffer, header_type(correlation_id=request.correlation_id))
    entity_writer(type(body))(buffer, body)
    payload = buffer.getvalue()
    return SIZE.pack(len(payload)) + payload


@pytest.mark.parametrize("version", range(4, 13))
def test_a_frame_of_stored_buffers_is_byte_for_byte_what_kio_encodes_and_carries_them_uncopied(
    version: int,
) -> None:
    stored = memoryview(b"".join(encode_batch([(b"k", bytes([n]) * 300)], timestamp_ms=1) for n in range(3)))
    views = [stored[:20], stored[20:500], stored[500:]]
    response = response_type(1, version)
    topic_type = nested(response, "responses")
    partition_type = nested(topic_type, "partitions")
    aborted_type = nested(partition_type, "aborted_transactions")

    def body(records: Any, empty: Any) -> Any:
        partitions = tuple(
            build(
                partition_type,
                partition_index=n,
                error_code=ErrorCode.none,
                high_watermark=3,
                last_stable_offset=3,
                log_start_offset=0,
                aborted_transactions=(build(aborted_type, producer_id=7, first_offset=1),),
                records=records if n == 1 else empty,
            )
            for n in range(3)
        )
        topics = (build(topic_type, topic="pieces", partitions=partitions),)
        return build(
            response, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, session_id=0, responses=topics
        )

    request = Request(1, version, 99, None, None, 0)
    frame = encode_frame(request, body(Records(views), Records(())))
    assert b"".join(frame.pieces) == _kio_bytes(request, body(bytes(stored), b""))
    assert frame.size_bytes == len(b"".join(frame.pieces))
    assert [piece for piece in frame.pieces if isinstance(piece, memoryview)] == views
    assert all(piece.obj is stored.obj for piece in frame.pieces if isinstance(piece, memoryview))
    # The frame holds its header and the whole stored buffer, counted once.
    header_bytes = sum(len(piece) for piece in frame.pieces if not isinstance(piece, memoryview))
    assert frame.held_bytes == header_bytes + len(stored)


# -- the budget --------------------------------------------------------------------------

BUDGET_TOPIC = "budget"
BUDGET_BATCHES = 32
BUDGET_VALUE_BYTES = 250_000
BUDGET_BYTES = 8 * MIB
STALLED_ASK_BYTES = 5 * MIB


@pytest.fixture
def budgeted(tmp_path: Path) -> Iterator[InProcessServer]:
    preload(tmp_path / "root", BUDGET_TOPIC, 1, BUDGET_BATCHES, BUDGET_VALUE_BYTES)
    config = ServeConfig(listen_port=0, max_unsent_bytes=BUDGET_BYTES)
    with InProcessServer(tmp_path / "root", config) as running:
        yield running


def _ask(max_wait_ms: int) -> Any:
    offsets = {BUDGET_TOPIC: [(0, 0)]}
    return fetch_body(
        offsets, max_bytes=STALLED_ASK_BYTES, partition_max_bytes=STALLED_ASK_BYTES, max_wait_ms=max_wait_ms
    )


@contextlib.contextmanager
def _stalled_fetch(running: InProcessServer) -> Iterator[socket.socket]:
    """A client that sends a 5 MiB fetch and never reads; yields once its response is being sent."""
    sock = stalled_socket(running.bootstrap)
    try:
        sock.sendall(fetch_frame(1, _ask(0)))
        _wait_until(lambda: has_answer(sock), "the stalled fetch is answered")
        yield sock
    finally:
        sock.close()


def test_while_a_stalled_client_holds_the_budget_another_fetch_gets_no_records_and_the_count_stays_within_it(
    budgeted: InProcessServer,
) -> None:
    unsent = budgeted.server.broker.unsent
    with WireSocket(budgeted.bootstrap) as reader:
        with _stalled_fetch(budgeted):
            starved = fetch(reader, _ask(200)).responses[0].partitions[0]
            assert (starved.error_code, starved.high_watermark, starved.records) == (0, BUDGET_BATCHES, b"")
            assert unsent.peak_bytes <= unsent.limit_bytes
        # The stalled client hung up: its response is dropped and its bytes released.
        _wait_until(lambda: unsent.held_bytes == 0, "the dropped response's bytes are released")
        fed = records_by_partition(fetch(reader, _ask(0)))[(BUDGET_TOPIC, 0)]
    assert len(fed) > 0
    assert unsent.peak_bytes <= unsent.limit_bytes


def test_a_fetch_waiting_for_room_is_read_as_soon_as_a_stalled_client_is_dropped(
    budgeted: InProcessServer,
) -> None:
    unsent = budgeted.server.broker.unsent
    # The wait asked for is far longer than the socket's timeout: only the release can answer in time.
    with WireSocket(budgeted.bootstrap, timeout_s=WAIT_S / 2) as reader:
        with _stalled_fetch(budgeted):
            reader.send_raw(fetch_frame(2, _ask(600_000)))
            _wait_until(lambda: unsent.waiting == 1, "the fetch waits for room")
            assert not has_answer(reader.sock)
        _, response = decode_response(1, FETCH_VERSION, reader.read_frame())
    assert len(records_by_partition(response)[(BUDGET_TOPIC, 0)]) > 0
    assert unsent.waiting == 0


# -- the bound, as an operator sees it -----------------------------------------------------

FULL_FETCH_BYTES = 55 * 1000 * 1000  # what the issue measured: 55 MB asked by each client
STALLED_CLIENTS = 150
# (serve's extra arguments, the bound on resident growth): the brief's bound at the default
# budget, and a budget set lower with the flag, which the server then keeps to plus its
# few MiB of connections and threads.
RSS_CASES = {
    "default budget (256 MiB)": ((), 300 * MIB),
    "--max-unsent-bytes 64 MiB": (("--max-unsent-bytes", str(64 * MIB)), 64 * MIB + 16 * MIB),
}


def _rss_bytes(pid: int, field: str) -> int:
    """VmRSS (resident now) or VmHWM (the most ever resident) of process `pid`, from /proc."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _big_ask(topic: str, fetch_bytes: int, max_wait_ms: int) -> Any:
    return fetch_body(
        {topic: [(0, 0)]},
        max_bytes=fetch_bytes,
        partition_max_bytes=fetch_bytes,
        max_wait_ms=max_wait_ms,
        min_bytes=1,
    )


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's RSS from /proc")
@pytest.mark.parametrize("case", list(RSS_CASES), ids=list(RSS_CASES))
def test_150_clients_that_never_read_a_55_mb_fetch_leave_the_server_within_its_bound(
    tmp_path: Path, case: str
) -> None:
    serve_args, bound_bytes = RSS_CASES[case]
    topic = "stalled"
    # 1 MB batches, a few more than one fetch takes: every stalled fetch could be full.
    preload(tmp_path / "root", topic, 1, batches=FULL_FETCH_BYTES // 1_000_000 + 4, value_bytes=1_000_000)
    with ServeProcess(tmp_path / "root", *serve_args) as server:
        with WireSocket(server.bootstrap) as warm:  # the fetch path loaded, as on a serving server
            fetch(warm, _big_ask(topic, 1_000_000, 0))
        idle_bytes = _rss_bytes(server.pid, "VmRSS")
        stalled = [stalled_socket(server.bootstrap) for _ in range(STALLED_CLIENTS)]
        try:
            for n, sock in enumerate(stalled):
                sock.sendall(fetch_frame(n, _big_ask(topic, FULL_FETCH_BYTES, 1000)))
            # Every client has been answered (the first few with records, the rest with none after
            # max_wait, once the budget was spent): the server has built all it ever will.
            _wait_until(lambda: all(has_answer(sock) for sock in stalled), "every stalled fetch is answered")
            peak_bytes = _rss_bytes(server.pid, "VmHWM")
        finally:
            for sock in stalled:
                sock.close()
        with WireSocket(server.bootstrap) as reader:  # the stalled clients gone, the budget is free again
            fed = records_by_partition(fetch(reader, _big_ask(topic, 3_000_000, 5000)))[(topic, 0)]
    print(
        f"{case}: idle {idle_bytes / MIB:.0f} MiB, peak {peak_bytes / MIB:.0f} MiB, {STALLED_CLIENTS} stalled"
    )
    assert peak_bytes - idle_bytes < bound_bytes
    assert len(fed) > 1_000_000
