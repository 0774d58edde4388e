"""One client connection: frames in, responses out, in request order.

Requests on a connection are handled one at a time, as a Kafka broker does (it
mutes a connection until its response is sent). Responses therefore leave in
request order, and a pipelining client's further requests wait in the socket's
buffers, which bounds what a connection holds in memory to one request
(MAX_REQUEST_BYTES) plus the kernel's buffers.

A frame that cannot be answered (an absurd size, a truncated frame, garbage, an
unknown API key, a version neither served nor advertised) closes the connection
with one log line. The engine has not been called for it, so nothing is written.

Time limits. A new connection must send one complete request within
first_request_ms (10 s): a peer that connects and sends nothing, or trickles its
first request, holds no slot for long. That limit is for the first request only:
a client then waits between requests as long as Kafka's connections.max.idle.ms
(idle_ms, 10 min) allows, since an idle producer is legitimate, and each later
request must be complete within frame_read_ms (30 s) of its first byte. Warnings
about a peer are rate-limited per address (Broker.warnings).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from oncelog.server.broker import Broker
from oncelog.server.cluster import (
    handle_api_versions,
    handle_create_topics,
    handle_find_coordinator,
    handle_metadata,
)
from oncelog.server.fallback import FallbackDecodeError, unsupported_version_response
from oncelog.server.fetch import handle_fetch
from oncelog.server.group_apis import (
    handle_heartbeat,
    handle_join_group,
    handle_leave_group,
    handle_offset_commit,
    handle_offset_fetch,
    handle_sync_group,
)
from oncelog.server.offsets import handle_list_offsets
from oncelog.server.produce import handle_produce
from oncelog.server.protocol import (
    API_VERSIONS_KEY,
    SIZE,
    MalformedRequestError,
    Request,
    decode_request,
    encode_response,
    frame_size,
)
from oncelog.server.txn_apis import (
    handle_add_offsets_to_txn,
    handle_add_partitions_to_txn,
    handle_end_txn,
    handle_init_producer_id,
    handle_txn_offset_commit,
)

log = logging.getLogger("oncelog.serve")
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection

Handler = Callable[[Broker, Request], Awaitable[Any]]
HANDLERS: dict[int, Handler] = {
    0: handle_produce,
    1: handle_fetch,
    2: handle_list_offsets,
    3: handle_metadata,
    10: handle_find_coordinator,
    18: handle_api_versions,
    19: handle_create_topics,
    22: handle_init_producer_id,
    8: handle_offset_commit,
    9: handle_offset_fetch,
    11: handle_join_group,
    12: handle_heartbeat,
    13: handle_leave_group,
    14: handle_sync_group,
    24: handle_add_partitions_to_txn,
    25: handle_add_offsets_to_txn,
    26: handle_end_txn,
    28: handle_txn_offset_commit,
}


class SlowRequestError(Exception):
    """A peer sent no complete request in time: its first within first_request_ms, or a later
    one within frame_read_ms of its first byte."""


class Connection:
    def __init__(self, broker: Broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.broker = broker
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        # The client's address: what per-address limits and rate-limited warnings count by.
        self.host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        # True while a request is being handled: a draining shutdown waits for these.
        self.busy = False

    async def run(self) -> None:
        warnings = self.broker.warnings
        try:
            await self._serve()
        except (MalformedRequestError, SlowRequestError) as exc:
            warnings.warning((type(exc), self.host), "closing connection from %s: %s", self.peer, exc)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                warnings.warning(
                    ("cut", self.host),
                    "closing connection from %s: a frame was cut after %d bytes",
                    self.peer,
                    len(exc.partial),
                )
        except TimeoutError:
            log.info("closing idle connection from %s", self.peer)
        except (ConnectionError, OSError):
            pass  # the client went away
        except Exception:
            # A bug here, not the client's: say so once, with the traceback, and drop only this
            # connection. The engine refused or finished the append before any answer was built.
            log.exception("closing connection from %s after an internal error", self.peer)
        finally:
            self.busy = False
            self.writer.close()

    async def _serve(self) -> None:
        config = self.broker.config
        first_request = True
        while not self.broker.stopping:
            if first_request:
                start, limit_ms, limit_name = b"", config.first_request_ms, "first_request_ms"
            else:
                async with asyncio.timeout(config.idle_ms / 1000):  # TimeoutError: idle, closed quietly
                    start = await self.reader.readexactly(1)
                limit_ms, limit_name = config.frame_read_ms, "frame_read_ms"
            try:
                async with asyncio.timeout(limit_ms / 1000):
                    prefix = start + await self.reader.readexactly(SIZE.size - len(start))
                    frame = await self.reader.readexactly(frame_size(prefix))
            except TimeoutError as exc:
                raise SlowRequestError(f"no complete request within {limit_name} ({limit_ms} ms)") from exc
            first_request = False
            request = decode_request(frame)
            if request.trailing_bytes:
                self.broker.requests_with_trailing_bytes += 1
                log.debug(
                    "%s v%d from %s: %d bytes after the body ignored, as Kafka ignores them",
                    request.spec.name,
                    request.api_version,
                    self.peer,
                    request.trailing_bytes,
                )
            self.busy = True
            response = await self._answer(request, frame)
            self.busy = False  # answered: a draining shutdown need not wait for the client to read it
            if response is not None:
                await self._send(response)

    async def _send(self, response: bytes) -> None:
        """Write a response; a client that does not take it within write_timeout_ms is dropped."""
        self.broker.bytes_unsent += len(response)
        try:
            self.writer.write(response)
            await asyncio.wait_for(self.writer.drain(), self.broker.config.write_timeout_ms / 1000)
        except TimeoutError as exc:
            self._reset()
            raise ConnectionError(
                f"{self.peer} took no response for {self.broker.config.write_timeout_ms} ms"
            ) from exc
        finally:
            self.broker.bytes_unsent -= len(response)

    def close(self) -> None:
        """Close at shutdown: gracefully when idle, with a reset when a response is stuck unread."""
        if self.broker.bytes_unsent and self.writer.transport.get_write_buffer_size():
            self._reset()
        else:
            self.writer.close()

    def _reset(self) -> None:
        """Drop the connection with a TCP reset: what is buffered for it, ours and the kernel's, is freed.

        A plain close would first deliver every buffered byte to a client that is not reading.
        """
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        self.writer.transport.abort()

    async def _answer(self, request: Request, frame: bytes) -> bytes | None:
        if request.body is None and request.api_key != API_VERSIONS_KEY:
            log.info(
                "%s v%d from %s: advertised but not served (v%d-%d); answering UNSUPPORTED_VERSION",
                request.spec.name,
                request.api_version,
                self.peer,
                *request.spec.served,
            )
            try:
                return unsupported_version_response(request.api_key, request.api_version, frame)
            except FallbackDecodeError as exc:
                raise MalformedRequestError(str(exc)) from exc
        body = await HANDLERS[request.api_key](self.broker, request)
        if body is None:
            return None  # acks=0
        return encode_response(request, body)
