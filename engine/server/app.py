"""The server process: open the root, listen, answer, and drain on SIGTERM.

Start: LogManager.open recovers every partition (in parallel; after a SIGKILL this is
crash recovery) and its summary is printed before the listener opens, so no client
is answered from a log that is still being checked.

Connections: at most max_connections in all and connections_per_ip from one client
address (a quarter of the total by default), so one local client opening thousands
of connections that never send a request cannot take every slot while it waits for
first_request_ms to close them. A connection past either limit is closed as soon as
it is accepted, as Kafka closes one past max.connections.per.ip; the warning says
so once a minute per address.

Stop (SIGTERM or SIGINT): the listener closes, waiting fetches return what they have,
every request being handled is answered, then every log is closed cleanly (flushed,
snapshotted, clean-shutdown marker written). `run_server` returns the signal that
stopped it: `oncelog serve` exits 0 after SIGTERM (what service managers send) and 130
after SIGINT (Ctrl-C), with one line. A SIGINT the process ignores (a background job)
stays ignored. Once stopping, a SIGINT goes to the handler the caller names (the
command line's ends the process at once: a second Ctrl-C for a drain that hangs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
import signal
import socket
import ssl
from collections.abc import Callable
from types import FrameType
from typing import Any, Final, TextIO

from oncelog.log_manager import LogManager
from oncelog.server.broker import Broker, ServeConfig
from oncelog.server.connection import Connection, peer_names
from oncelog.server.listeners import Listener, format_address
from oncelog.server.memory_reuse import keep_freed_read_buffers
from oncelog.server.sasl import Session
from oncelog.server.tls import ANONYMOUS, certificate_principal, server_context

log = logging.getLogger("oncelog.server")
# How long a draining shutdown waits for requests being handled before closing anyway.
DRAIN_TIMEOUT_S: Final = 10.0


# How often `oncelog serve` offers every partition a checkpoint (each commits only when due).
CHECKPOINT_TICK_S = 1.0


class Server:
    def __init__(self, manager: LogManager, config: ServeConfig):
        self.broker = Broker(manager, config)
        self.config = config
        self._retention: asyncio.Task[None] | None = None
        self._coordination: list[asyncio.Task[None]] = []
        self._connections: set[Connection] = set()
        # Open connections by client address (Connection.host).
        self._per_host: dict[str, int] = {}
        # Connections accepted and not yet closed, those still in their TLS handshake included.
        self._accepted = 0
        self._tls_contexts: list[ssl.SSLContext | None] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._listening: list[asyncio.Server] = []
        # Each listener as bound (a port 0 replaced by the one the kernel chose).
        self.listeners: list[Listener] = list(config.all_listeners)
        self.port = self.listeners[0].port

    async def start(self) -> None:
        # Transactions a crash left decided but unfinished: their markers go out before any
        # client is answered, so no read_committed reader waits on them. Lost markers of
        # completed ends first: the steps after would end that data otherwise.
        for tp, producer_id in await self.broker.in_thread(self.broker.restore_lost_markers):
            log.warning("wrote producer %d's lost transaction marker in %s again", producer_id, tp)
        for tp, producer_id in await self.broker.in_thread(self.broker.abort_orphan_transactions):
            log.warning(
                "aborted producer %d's transaction in %s: no stored transaction holds it", producer_id, tp
            )
        for txn in self.broker.transactions.unfinished():
            if not await self.broker.transactions.complete(txn):
                log.warning(
                    "transaction %r is still unfinished; retrying in the background", txn.transactional_id
                )
        # Loaded once (a file that does not load fails the start, named); handshakes happen per
        # connection in _secure, once the connection is counted.
        self._tls_contexts = [tls_context(self.config, listener) for listener in self.listeners]
        for n, listener in enumerate(self.listeners):
            listening = await asyncio.start_server(
                functools.partial(self._accept, n),
                listener.host,
                listener.port,
                reuse_address=True,
                limit=64 * 1024,
            )

            self._listening.append(listening)
            sockets = listening.sockets
            # An ephemeral port (tests): advertise the one the kernel chose.
            self.listeners[n] = listener.bound_to(sockets[0].getsockname()[1] if sockets else listener.port)
        self.port = self.listeners[0].port
        self.broker.config = _bound(self.config, self.listeners)
        self._retention = asyncio.create_task(self._apply_retention_periodically())
        if self.config.cleaner_threads:
            self.broker.manager.start_cleaner(
                threads=self.config.cleaner_threads,
                io_bytes_per_s=self.config.cleaner_io_bytes_per_s,
                backoff_ms=self.config.cleaner_backoff_ms,
            )
        self._coordination = [
            asyncio.create_task(self.broker.groups.run_sweeper()),
            asyncio.create_task(self.broker.transactions.run_timeouts()),
            asyncio.create_task(self._checkpoint_periodically()),
        ]

    async def _apply_retention_periodically(self) -> None:
        """Delete whole segments past retention_ms / retention_bytes, as Kafka's log cleaner does."""
        while True:
            await asyncio.sleep(self.config.retention_check_ms / 1000)
            try:
                deleted = await self.broker.in_thread(self.broker.manager.apply_retention)
            except Exception:
                log.exception("retention failed; trying again in %d ms", self.config.retention_check_ms)
                continue
            if deleted:
                log.info("retention deleted %d segments", deleted)

    async def _checkpoint_periodically(self) -> None:
        """Each partition's recovery point catches up with what its flushes fsynced once its
        own recovery_point_interval_ms (topic overrides included) has passed: a flush
        commits it only when due, so an idle partition's would lag without this."""
        while True:
            await asyncio.sleep(CHECKPOINT_TICK_S)
            try:
                await self.broker.in_thread(lambda: self.broker.manager.checkpoint(due_only=True))
            except Exception as exc:
                self.broker.warnings.warning(("checkpoint",), "committing a recovery point failed: %s", exc)

    async def _accept(
        self, listener_index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self.broker.stopping:
            writer.close()
            return
        listener = self.listeners[listener_index]
        host, peer = peer_names(writer)
        # Counted from the TCP accept, before any TLS handshake: a peer that opens connections
        # and never finishes one holds no more slots than one that never sends a request.
        refusal = self._refusal(host)
        if refusal is not None:
            self.broker.warnings.warning(
                ("refused", host), "refusing a connection from %s: %s", peer, refusal
            )
            writer.close()
            return
        self._accepted += 1
        self._per_host[host] = self._per_host.get(host, 0) + 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            session = await self._secure(listener, self._tls_contexts[listener_index], writer)
            if session is None:
                return
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = Connection(self.broker, reader, writer, session)
            self._connections.add(connection)
            try:
                await connection.run()
            finally:
                self._connections.discard(connection)
        finally:
            self._accepted -= 1
            left = self._per_host.pop(host) - 1
            if left:
                self._per_host[host] = left
            if task is not None:
                self._tasks.discard(task)

    async def _secure(
        self, listener: Listener, context: ssl.SSLContext | None, writer: asyncio.StreamWriter
    ) -> Session | None:
        """The connection's session once its TLS handshake (SSL, SASL_SSL) is done; None (and
        closed) if the handshake failed or took longer than first_request_ms."""
        if context is None:
            return Session.for_listener(listener)
        try:
            await writer.start_tls(context, ssl_handshake_timeout=self.config.first_request_ms / 1000)
        except (OSError, TimeoutError, ConnectionError) as exc:  # ssl.SSLError is an OSError
            log.info("TLS handshake with %s on %s failed: %s", peer_names(writer)[1], listener, exc)
            writer.transport.abort()
            return None
        principal = ANONYMOUS
        if not listener.uses_sasl:  # SSL: the client certificate names it
            ssl_object = writer.get_extra_info("ssl_object")
            certificate = ssl_object.getpeercert() if ssl_object is not None else None
            try:
                principal = certificate_principal(certificate, self.config.principal_rules)
            except (re.error, IndexError) as exc:  # checked at start; a rule can still fail on a name
                self.broker.warnings.warning(
                    ("principal", listener.name), "mapping a client certificate failed: %s", exc
                )
                writer.transport.abort()
                return None
        return Session.for_listener(listener, principal)

    def _refusal(self, host: str) -> str | None:
        """Why a new connection from `host` is refused, or None."""
        if self._accepted >= self.config.max_connections:
            return f"{self._accepted} connections open (limit {self.config.max_connections})"
        from_host = self._per_host.get(host, 0)
        if from_host >= self.config.connections_per_ip:
            return f"{from_host} connections open from this address (limit {self.config.connections_per_ip})"
        return None

    async def stop(self) -> None:
        """Stop accepting, answer what is in hand, close every connection."""
        self.broker.stop()
        for listening in self._listening:
            listening.close()
        if self._retention is not None:
            self._retention.cancel()
        await self.broker.in_thread(self.broker.manager.stop_cleaner)
        for task in self._coordination:
            task.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_TIMEOUT_S
        while any(c.busy for c in self._connections) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        busy = sum(c.busy for c in self._connections)
        if busy:
            log.warning(
                "%d connections still handling a request after %g s of draining: closing them",
                busy,
                DRAIN_TIMEOUT_S,
            )
        for connection in list(self._connections):
            connection.close()  # each connection's loop then ends on its own
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=max(deadline - loop.time(), 1.0))
        # Ends answered at Prepare write their markers before the logs close; one still
        # unfinished at the deadline is completed by the next start (its Prepare is stored).
        await self.broker.transactions.completions_finished(max(deadline - loop.time(), 1.0))
        for task in list(self._tasks):
            task.cancel()  # only a connection stuck past the drain deadline


def _bound(config: ServeConfig, listeners: list[Listener]) -> ServeConfig:
    """`config` with each listener on the port it was bound to (the first also as listen_port)."""
    first = listeners[0]
    return dataclasses.replace(
        config,
        listen_port=first.port,
        advertise_host=first.advertise_host,
        advertise_port=first.advertise_port,
        listeners=tuple(listeners) if config.listeners else (),
    )


def tls_context(config: ServeConfig, listener: Listener) -> ssl.SSLContext | None:
    """The TLS context of an SSL or SASL_SSL listener (None for the others): client
    certificates are asked for on SSL listeners only, where they name the client."""
    if not listener.uses_tls:
        return None
    assert config.tls is not None, "ServeConfig refuses a TLS listener without a certificate"
    return server_context(config.tls, client_certificates=not listener.uses_sasl)


SigintHandler = Callable[[int, FrameType | None], Any]


async def serve_until_signalled(
    manager: LogManager, config: ServeConfig, out: TextIO, sigint_while_stopping: SigintHandler | None = None
) -> int:
    """Serve until SIGTERM or SIGINT, then drain; the signal that stopped it (see run_server)."""
    stop = asyncio.Event()
    stopped_by: list[int] = []
    loop = asyncio.get_running_loop()
    previous_sigint = signal.getsignal(signal.SIGINT)
    signals = [signal.SIGTERM] if previous_sigint == signal.SIG_IGN else [signal.SIGTERM, signal.SIGINT]

    def stopping(signum: int) -> None:
        if not stopped_by:
            stopped_by.append(signum)
            stop.set()

    # Before the start: a signal while it runs stops the server as soon as it is up.
    for signum in signals:
        loop.add_signal_handler(signum, stopping, signum)
    server = Server(manager, config)
    await server.start()
    listening = ", ".join(
        f"{listener} (advertised as {format_address(*listener.advertised)})" for listener in server.listeners
    )
    print(
        f"oncelog serve: listening on {listening}, cluster id {server.broker.cluster_id}",
        file=out,
        flush=True,
    )
    await stop.wait()
    if signal.SIGINT in signals:
        # Taken from the loop (whose close would reset it): a SIGINT from here on, through
        # the drain and the close of every log, goes to the caller's handler.
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, sigint_while_stopping or previous_sigint or signal.default_int_handler)
    print("oncelog serve: draining and closing every log", file=out, flush=True)
    await server.stop()
    server.broker.close()
    return stopped_by[0]


def run_server(
    manager: LogManager,
    config: ServeConfig,
    out: TextIO,
    *,
    sigint_while_stopping: SigintHandler | None = None,
) -> int:
    """Serve `manager` until SIGTERM or SIGINT, then close it cleanly; the signal that stopped it.

    `sigint_while_stopping`: the SIGINT handler from the stop on (default: the one the
    process had before serving)."""
    keep_freed_read_buffers()  # (process-wide: this process only serves)
    try:
        stopped_by = asyncio.run(serve_until_signalled(manager, config, out, sigint_while_stopping))
    finally:
        manager.close()
    print("oncelog serve: every log closed cleanly", file=out, flush=True)
    return stopped_by
