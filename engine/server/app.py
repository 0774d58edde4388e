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
snapshotted, clean-shutdown marker written) and the process exits 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
from typing import Final, TextIO

from oncelog.log_manager import LogManager
from oncelog.server.broker import Broker, ServeConfig
from oncelog.server.connection import Connection
from oncelog.server.memory_reuse import keep_freed_read_buffers

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
        self._tasks: set[asyncio.Task[None]] = set()
        self._listener: asyncio.Server | None = None
        self.port = config.listen_port

    async def start(self) -> None:
        # Transactions a crash left decided but unfinished: their markers go out before any
        # client is answered, so no read_committed reader waits on them.
        for tp, producer_id in await self.broker.in_thread(self.broker.abort_orphan_transactions):
            log.warning(
                "aborted producer %d's transaction in %s: no stored transaction holds it", producer_id, tp
            )
        for txn in self.broker.transactions.unfinished():
            if not await self.broker.transactions.complete(txn):
                log.warning(
                    "transaction %r is still unfinished; retrying in the background", txn.transactional_id
                )
        self._listener = await asyncio.start_server(
            self._accept,
            self.config.listen_host,
            self.config.listen_port,
            reuse_address=True,
            limit=64 * 1024,
        )
        sockets = self._listener.sockets
        self.port = sockets[0].getsockname()[1] if sockets else self.config.listen_port
        if self.config.listen_port == 0 and self.config.advertise_port is None:
            # An ephemeral port (tests): advertise the one the kernel chose.
            self.broker.config = _with_port(self.config, self.port)
        self._retention = asyncio.create_task(self._apply_retention_periodically())
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

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.broker.stopping:
            writer.close()
            return
        connection = Connection(self.broker, reader, writer)
        host = connection.host
        refusal = self._refusal(host)
        if refusal is not None:
            self.broker.warnings.warning(
                ("refused", host), "refusing a connection from %s: %s", connection.peer, refusal
            )
            writer.close()
            return
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connections.add(connection)
        self._per_host[host] = self._per_host.get(host, 0) + 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)
            left = self._per_host.pop(host) - 1
            if left:
                self._per_host[host] = left
            if task is not None:
                self._tasks.discard(task)

    def _refusal(self, host: str) -> str | None:
        """Why a new connection from `host` is refused, or None."""
        if len(self._connections) >= self.config.max_connections:
            return f"{len(self._connections)} connections open (limit {self.config.max_connections})"
        from_host = self._per_host.get(host, 0)
        if from_host >= self.config.connections_per_ip:
            return f"{from_host} connections open from this address (limit {self.config.connections_per_ip})"
        return None

    async def stop(self) -> None:
        """Stop accepting, answer what is in hand, close every connection."""
        self.broker.stop()
        if self._listener is not None:
            self._listener.close()
        if self._retention is not None:
            self._retention.cancel()
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


def _with_port(config: ServeConfig, port: int) -> ServeConfig:
    return dataclasses.replace(config, listen_port=port)


async def serve_until_signalled(manager: LogManager, config: ServeConfig, out: TextIO) -> None:
    server = Server(manager, config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host, port = server.broker.config.advertised
    print(
        f"oncelog serve: listening on {config.listen_host}:{server.port}, advertising {host}:{port}, "
        f"cluster id {server.broker.cluster_id}",
        file=out,
        flush=True,
    )
    await stop.wait()
    print("oncelog serve: draining and closing every log", file=out, flush=True)
    await server.stop()
    server.broker.close()


def run_server(manager: LogManager, config: ServeConfig, out: TextIO) -> None:
    """Serve `manager` until SIGTERM, then close it cleanly."""
    keep_freed_read_buffers()  # (process-wide: this process only serves)
    try:
        asyncio.run(serve_until_signalled(manager, config, out))
    finally:
        manager.close()
    print("oncelog serve: every log closed cleanly", file=out, flush=True)
