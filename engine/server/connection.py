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

A response is written a chunk at a time (WRITE_CHUNK_BYTES), each only once the
transport has handed the last to the kernel, so the transport never copies more
than one chunk of it; its pieces (stored batches, for a fetch) go out uncopied
when they are a chunk or more. Every byte a response holds is counted in the
broker's unsent budget until the kernel has taken the last (see unsent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Iterator, Sequence

from oncelog.server.api_registry import APIS, Api
from oncelog.server.broker import Broker
from oncelog.server.codec import (
    API_VERSIONS_KEY,
    MAX_FALLBACK_FRAME_BYTES,
    SASL_AUTHENTICATE_KEY,
    SASL_HANDSHAKE_KEY,
    SIZE,
    Frame,
    MalformedRequestError,
    Request,
    decode_request,
    encode_frame,
    frame_size,
)
from oncelog.server.fallback import FallbackDecodeError, unsupported_version_response
from oncelog.server.sasl import MAX_UNAUTHENTICATED_FRAME_BYTES, Session

log = logging.getLogger("oncelog.server")
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection
# What a connection hands the transport at once: the most the transport ever copies of a
# response, and the most a write joins from small pieces.
WRITE_CHUNK_BYTES = 256 * 1024
# What a SASL listener serves before the login completes: ApiVersions, SaslHandshake, SaslAuthenticate.
UNAUTHENTICATED_KEYS = frozenset({API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY})


def peer_names(writer: asyncio.StreamWriter) -> tuple[str, str]:
    """The client's address ("127.0.0.1"), and its address and port ("127.0.0.1:50123")."""
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple):
        return str(peer[0]), f"{peer[0]}:{peer[1]}"
    return str(peer), str(peer)


class SlowRequestError(Exception):
    """A peer sent no complete request in time: its first within first_request_ms, or a later
    one within frame_read_ms of its first byte."""


class Connection:
    def __init__(
        self,
        broker: Broker,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session: Session | None = None,
    ):
        self.broker = broker
        self.reader = reader
        self.writer = writer
        # The listener it came in on and who it is (see sasl).
        self.session = session or Session.for_listener(broker.config.all_listeners[0])
        # The client's address (what per-address limits and rate-limited warnings count by), and port.
        self.host, self.peer = peer_names(writer)
        self.client_host = f"/{self.host}"  # as Kafka writes a client's address
        # True while a request is being handled: a draining shutdown waits for these.
        self.busy = False
        # True while a response is being written.
        self.sending = False
        # The transport pauses us as soon as it holds anything the kernel did not take, and
        # resumes once it holds nothing: it never buffers more than the chunk last written.
        # (high=1, not 0: the TLS transport pauses at `size >= high`, so 0 paused it with
        # nothing buffered and nothing left to resume it, and drain() waited for ever.)
        writer.transport.set_write_buffer_limits(high=1, low=0)

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
        # A SASL listener's connection must log in within first_request_ms, however many
        # ApiVersions it sends meanwhile: a stranger holds no slot for long.
        login_by = asyncio.get_running_loop().time() + config.first_request_ms / 1000
        while not self.broker.stopping:
            if first_request:
                start, limit_ms, limit_name = b"", config.first_request_ms, "first_request_ms"
            elif not self.session.authenticated:
                try:
                    async with asyncio.timeout_at(login_by):
                        start = await self.reader.readexactly(1)
                except TimeoutError as exc:
                    raise SlowRequestError(
                        f"no SASL login within first_request_ms ({config.first_request_ms} ms)"
                    ) from exc
                limit_ms, limit_name = config.frame_read_ms, "frame_read_ms"
            else:
                async with asyncio.timeout(config.idle_ms / 1000):  # TimeoutError: idle, closed quietly
                    start = await self.reader.readexactly(1)
                limit_ms, limit_name = config.frame_read_ms, "frame_read_ms"
            session = self.session
            try:
                async with asyncio.timeout(limit_ms / 1000):
                    prefix = start + await self.reader.readexactly(SIZE.size - len(start))
                    size = frame_size(prefix)
                    if not session.authenticated and size > MAX_UNAUTHENTICATED_FRAME_BYTES:
                        raise MalformedRequestError(
                            f"a {size}-byte request before SASL authentication "
                            f"(at most {MAX_UNAUTHENTICATED_FRAME_BYTES} are read before it)"
                        )
                    frame = await self.reader.readexactly(size)
            except TimeoutError as exc:
                raise SlowRequestError(f"no complete request within {limit_name} ({limit_ms} ms)") from exc
            first_request = False
            request = decode_request(frame, APIS, self.client_host, session)
            if not session.authenticated and request.api_key not in UNAUTHENTICATED_KEYS:
                raise MalformedRequestError(
                    f"{APIS[request.api_key].name} before SASL authentication on {session.listener.name}"
                )
            if request.trailing_bytes:
                self.broker.requests_with_trailing_bytes += 1
                log.debug(
                    "%s v%d from %s: %d bytes after the body ignored, as Kafka ignores them",
                    APIS[request.api_key].name,
                    request.api_version,
                    self.peer,
                    request.trailing_bytes,
                )
            self.busy = True
            response = await self._answer(request, frame)
            self.busy = False  # answered: a draining shutdown need not wait for the client to read it
            if response is not None:
                await self._send(response)
            if session.close_after_response:  # a failed login, a SASL state error: answered, then closed
                return

    async def _send(self, response: Frame) -> None:
        """Write a counted response; a client that does not take it within write_timeout_ms is dropped."""
        unsent = self.broker.unsent
        # Beside the frame: the transport's copy of the chunk the kernel has not taken, and the
        # chunk joined from small pieces (a frame of one piece joins none).
        chunks_held = 1 if len(response.pieces) == 1 else 2
        in_flight = min(response.size_bytes, WRITE_CHUNK_BYTES) * chunks_held
        unsent.take(in_flight)
        self.sending = True
        try:
            async with asyncio.timeout(self.broker.config.write_timeout_ms / 1000):
                for chunk in _chunks(response.pieces, WRITE_CHUNK_BYTES):
                    self.writer.write(chunk)
                    await self.writer.drain()  # until the kernel has it all
                    await asyncio.sleep(0)  # a fast reader's large response still lets others in
        except TimeoutError as exc:
            self._reset()
            raise ConnectionError(
                f"{self.peer} took no response for {self.broker.config.write_timeout_ms} ms"
            ) from exc
        finally:
            self.sending = False
            unsent.release(response.held_bytes + in_flight)

    def close(self) -> None:
        """Close at shutdown: idle now; reset if stuck on a response its client is not taking.

        A connection moving a response finishes it and closes itself (the broker is stopping);
        closing under it would cut the response short.
        """
        if not self.sending:
            self.writer.close()
        elif self.writer.transport.get_write_buffer_size():
            self._reset()

    def _reset(self) -> None:
        """Drop the connection with a TCP reset: what is buffered for it, ours and the kernel's, is freed.

        A plain close would first deliver every buffered byte to a client that is not reading.
        """
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        self.writer.transport.abort()

    async def _answer(self, request: Request, frame: bytes) -> Frame | None:
        """The response to `request`, its bytes counted in the unsent budget; None for acks=0."""
        api = APIS[request.api_key]  # decode_request refused keys not in the registry
        if request.body is None and request.api_key != API_VERSIONS_KEY:
            log.info(
                "%s v%d from %s: advertised but not served (v%d-%d); answering UNSUPPORTED_VERSION",
                api.name,
                request.api_version,
                self.peer,
                *api.served,
            )
            response = _unsupported_version(api, request, frame)
        else:
            body = await api.handler(self.broker, request)
            if body is None:
                return None  # acks=0
            if isinstance(body, Frame):
                return body  # a fetch's: framed off the loop and counted from before its read
            response = encode_frame(request, body)
        self.broker.unsent.take(response.held_bytes)
        return response


def _unsupported_version(api: Api, request: Request, frame: bytes) -> Frame:
    """UNSUPPORTED_VERSION in every entry of `frame`, an advertised version below the served ones."""
    if api.unsupported is None:  # never for an advertised version (tests/server/test_api_registry.py)
        raise MalformedRequestError(f"{api.name} v{request.api_version} has no UNSUPPORTED_VERSION answer")
    if len(frame) > MAX_FALLBACK_FRAME_BYTES:  # decoded by kafka-python, on the loop (codec)
        raise MalformedRequestError(
            f"{api.name} v{request.api_version}: {len(frame)} bytes at a version below the served ones "
            f"(answered UNSUPPORTED_VERSION up to {MAX_FALLBACK_FRAME_BYTES})"
        )
    try:
        return Frame.of(unsupported_version_response(api.unsupported, api.key, request.api_version, frame))
    except FallbackDecodeError as exc:
        raise MalformedRequestError(str(exc)) from exc


def _chunks(pieces: Sequence[bytes | memoryview], chunk_bytes: int) -> Iterator[bytes | memoryview]:
    """`pieces` regrouped into writes of at most `chunk_bytes`.

    A piece of a chunk or more goes out as slices of itself, uncopied; runs of smaller
    pieces are joined into one chunk (one bounded copy instead of a write per piece).
    """
    run: list[bytes | memoryview] = []
    run_bytes = 0
    for piece in pieces:
        size = len(piece)
        if run and run_bytes + size > chunk_bytes:
            yield run[0] if len(run) == 1 else b"".join(run)
            run, run_bytes = [], 0
        if size >= chunk_bytes:
            view = memoryview(piece)
            for start in range(0, size, chunk_bytes):
                yield view[start : start + chunk_bytes]
        else:
            run.append(piece)
            run_bytes += size
    if run:
        yield run[0] if len(run) == 1 else b"".join(run)
