"""`oncelog serve` as a subprocess, the way an operator runs it: start, SIGTERM, SIGKILL, restart.

One implementation for everything that runs a real server process: the wire
benchmark (`bench --wire`), the demo's last step and the tests. The server's output
is read continuously (so it never blocks on a full pipe) and kept for error messages;
`restart` keeps the port, as clients reconnecting to it expect.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Final

from oncelog.bench.sigint import sigint_deferred

START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 60.0
_LISTENING = "listening on"
_RECOVERED = "recovered "


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServeProcess:
    """`python -m oncelog.cli serve ROOT --listen 127.0.0.1:PORT ARGS...`."""

    def __init__(self, root: str | os.PathLike[str], *args: str, port: int | None = None):
        self.root = root
        self.args = args
        self.port = port if port is not None else free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self._listening = threading.Event()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ServeProcess:
        """Start it and wait until it listens (after its recovery); RuntimeError with its output if not."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self._listening.clear()
        command = [
            sys.executable,
            "-m",
            "oncelog.cli",
            "serve",
            os.fspath(self.root),
            "--listen",
            self.bootstrap,
        ]
        try:
            with sigint_deferred():  # a Ctrl-C during the spawn comes once `self.proc` is held
                self.proc = subprocess.Popen(
                    [*command, "--no-progress", *self.args],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
            deadline = time.monotonic() + START_TIMEOUT_S
            while not self._listening.wait(0.05):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"oncelog serve exited {self.proc.returncode}:\n{self.log()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"oncelog serve did not start in {START_TIMEOUT_S:g} s:\n{self.log()}")
        except BaseException:
            # (A Ctrl-C included: no `with` owns it yet.) Its recovery may be half done: a
            # kill, which the next start recovers from as from any other.
            self.kill()
            raise
        return self

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.output.append(line.rstrip("\n"))
            if _LISTENING in line:
                self._listening.set()

    def log(self, lines: int = 200) -> str:
        return "\n".join(self.output[-lines:])

    def wait_for_output(self, text: str, timeout_s: float = 30.0) -> bool:
        """Whether a line holding `text` arrives within `timeout_s`: the output is read by a
        thread, so a line the server wrote before an event a caller saw may still be on its way."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.output):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def recovery_summary(self) -> str:
        """The first line of the latest start's recovery summary ("recovered N partitions ...")."""
        return next((line for line in reversed(self.output) if line.startswith(_RECOVERED)), "")

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (drain, close every log cleanly); the exit status."""
        if self.proc is None:
            raise RuntimeError("oncelog serve was never started")
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        """End it however it stands (on the way out of an error or a Ctrl-C): SIGTERM, so that
        it closes every log cleanly, then SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.terminate()
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: no drain, no clean close; the next start recovers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)

    def restart(self) -> ServeProcess:
        """SIGKILL, then start again on the same port."""
        self.kill()
        return self.start()

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
