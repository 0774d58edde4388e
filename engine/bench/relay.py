"""A TCP relay between Kafka clients and `oncelog serve` that can lose an acknowledgement.

Used wherever a test or the demo must make a real client retry a batch the server has
already appended: the kill -9 tests, and the demo's sequence fence. It can also freeze a
client (every byte of its connections held, both ways), as a long GC pause or a network
partition would: the demo's generation fence.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any


class AckHoldingRelay:
    """A TCP relay between the clients and the server that can hold back one Produce acknowledgement.

    The server advertises the relay (`--advertise`), so every client connection passes through
    it; normally it forwards bytes both ways as they come. Armed, it withholds the next Produce
    response the server sends (and everything after it on that connection): the server has
    appended the batch and the client has no acknowledgement. The SIGKILL that follows makes the
    client retry that batch against the restarted server, whose recovered producer state must
    answer it as a duplicate. A blind kill seldom lands in that window.

    Frozen (`freeze`), it holds every byte in both directions on the connections of one client
    (by the client id its requests carry) or of all, until `thaw` sends them on in order: the
    server sees the client go silent, the client sees no answers, and neither connection closes.
    """

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: threading.Event | None = None
        self.held: str | None = None
        self._sockets: set[socket.socket] = set()
        self._connections: set[_Connection] = set()
        self._frozen_all = False
        self._frozen: set[str] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def arm(self) -> threading.Event:
        """Hold back the next Produce response; the event is set once one is held."""
        event = threading.Event()
        with self._lock:
            self._armed, self.held = event, None
        return event

    def disarm(self) -> None:
        with self._lock:
            self._armed = None

    def freeze(self, client_id: str | None = None) -> None:
        """Hold every byte, both ways, on the connections of `client_id` (every client if None),
        the ones open and the ones it opens next, until `thaw`."""
        with self._lock:
            if client_id is None:
                self._frozen_all = True
            else:
                self._frozen.add(client_id)

    def thaw(self) -> None:
        """Send on what every frozen connection holds, in order, and forward as usual again."""
        with self._lock:
            self._frozen_all = False
            self._frozen.clear()
            connections = list(self._connections)
        for connection in connections:
            for direction in connection.directions:
                with contextlib.suppress(OSError):  # closed meanwhile: the client reconnects
                    direction.send(b"", frozen=lambda: False)

    def _is_frozen(self, connection: _Connection) -> bool:
        with self._lock:
            return self._frozen_all or connection.client_id in self._frozen

    def cut(self) -> None:
        """Close every connection through the relay: the clients reconnect and retry what is unanswered."""
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _close(sock)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _close(sock)

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(downstream,), daemon=True).start()

    def _relay(self, downstream: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
        except OSError:  # the server is down: the client sees its connection closed
            _close(downstream)
            return
        upstream.settimeout(None)
        connection = _Connection(upstream, downstream)
        with self._lock:
            self._sockets.update((upstream, downstream))
            self._connections.add(connection)
        for sock in (upstream, downstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        requests: dict[int, tuple[int, str]] = {}  # correlation id -> (api key, client id)
        threading.Thread(target=self._requests, args=(connection, requests), daemon=True).start()
        try:
            self._responses(connection, requests)
        finally:
            with self._lock:
                self._sockets.difference_update((upstream, downstream))
                self._connections.discard(connection)

    def _requests(self, connection: _Connection, requests: dict[int, Any]) -> None:
        """Client to server: each request is noted (before its last bytes go on), then forwarded."""
        downstream, upstream = connection.downstream, connection.upstream
        buffer = bytearray()
        try:
            while chunk := downstream.recv(1 << 16):
                buffer += chunk
                for frame in _frames(buffer):
                    api_key = int.from_bytes(frame[0:2], "big")
                    correlation = int.from_bytes(frame[4:8], "big", signed=True)
                    length = int.from_bytes(frame[8:10], "big", signed=True) if len(frame) >= 10 else -1
                    client_id = frame[10 : 10 + length].decode("utf-8", "replace") if length >= 0 else "-"
                    requests[correlation] = (api_key, client_id)
                    connection.client_id = client_id
                connection.to_server.send(chunk, frozen=lambda: self._is_frozen(connection))
        except OSError:
            pass
        finally:
            _close(upstream)
            _close(downstream)

    def _responses(self, connection: _Connection, requests: dict[int, Any]) -> None:
        """Server to client, a whole response at a time, unless this connection holds one back."""
        upstream, downstream = connection.upstream, connection.downstream
        buffer = bytearray()
        holding = False
        try:
            while chunk := upstream.recv(1 << 16):
                buffer += chunk
                for frame in _frames(buffer):
                    correlation = int.from_bytes(frame[0:4], "big", signed=True)
                    api_key, client_id = requests.pop(correlation, (-1, "?"))
                    if not holding and api_key == 0:
                        with self._lock:
                            event, self._armed = self._armed, None
                            if event is not None:
                                self.held = f"{client_id!r} correlation id {correlation}"
                        if event is not None:
                            holding = True
                            event.set()
                    if not holding:
                        data = len(frame).to_bytes(4, "big") + frame
                        connection.to_client.send(data, frozen=lambda: self._is_frozen(connection))
        except OSError:
            pass
        finally:
            _close(upstream)
            _close(downstream)


class _Direction:
    """One direction of a relayed connection: bytes go on in order, or wait while it is frozen."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._lock = threading.Lock()
        self._held = bytearray()

    def send(self, data: bytes, *, frozen: Callable[[], bool]) -> None:
        """Send `data` after what is held, or hold it too if `frozen()` (asked under the lock, so a
        thaw cannot slip between the question and the holding)."""
        with self._lock:
            if frozen():
                self._held += data
                return
            if self._held:  # thawed: what was held goes first
                data, self._held = bytes(self._held) + data, bytearray()
            if data:
                self._sock.sendall(data)


class _Connection:
    def __init__(self, upstream: socket.socket, downstream: socket.socket):
        self.upstream = upstream
        self.downstream = downstream
        self.client_id: str | None = None  # from the latest request's header
        self.to_server = _Direction(upstream)
        self.to_client = _Direction(downstream)

    @property
    def directions(self) -> tuple[_Direction, _Direction]:
        return self.to_server, self.to_client


def _frames(buffer: bytearray) -> Iterable[bytes]:
    """The complete size-prefixed frames at the start of `buffer`, removed from it."""
    while len(buffer) >= 4:
        size = int.from_bytes(buffer[0:4], "big", signed=True)
        if len(buffer) < 4 + size:
            return
        frame = bytes(buffer[4 : 4 + size])
        del buffer[: 4 + size]
        yield frame


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
