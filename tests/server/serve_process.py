"""`oncelog serve` as a subprocess, the way an operator runs it: start, SIGKILL, SIGTERM, restart."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

_LISTENING = re.compile(r"listening on (\S+):(\d+), advertising")
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServeProcess:
    """One `oncelog serve ROOT` process; `restart` keeps its port, as clients expect."""

    def __init__(self, root: Path, *args: str, port: int | None = None):
        self.root = root
        self.args = args
        self.port = port if port is not None else free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self._listening = threading.Event()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ServeProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self._listening.clear()
        command = [sys.executable, "-m", "oncelog.cli", "serve", str(self.root)]
        command += ["--listen", self.bootstrap, "--no-progress", *self.args]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None:
                # The port of a just-killed server may linger a moment: retry then.
                raise RuntimeError(f"oncelog serve exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"oncelog serve did not start in {START_TIMEOUT_S} s:\n{self.log()}")
        return self

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.output.append(line.rstrip("\n"))
            if _LISTENING.search(line):
                self._listening.set()

    def log(self) -> str:
        return "\n".join(self.output[-200:])

    def kill(self) -> None:
        """SIGKILL: no drain, no clean close; the next start recovers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def restart(self) -> ServeProcess:
        self.kill()
        return self.start()

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.terminate(30)
            except subprocess.TimeoutExpired:
                self.kill()
