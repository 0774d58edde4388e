"""`oncelog serve` in this process (a thread running its event loop), for engine-side checks."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from oncelog.log_manager import LogManager
from oncelog.server.app import Server
from oncelog.server.broker import ServeConfig
from oncelog.storage.fs import FileSystem


class InProcessServer:
    def __init__(self, root: Path, config: ServeConfig | None = None, *, fs: FileSystem | None = None):
        self.manager = LogManager.open(root, progress=False, fs=fs)
        self.server = Server(self.manager, config or ServeConfig(listen_port=0))
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.server.start())
        self._started.set()
        self._loop.run_forever()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def __enter__(self) -> InProcessServer:
        self._thread.start()
        assert self._started.wait(30), "the in-process server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()
        self.server.broker.close()
        self.manager.close()
