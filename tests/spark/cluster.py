"""A real Spark standalone cluster on this machine: one master and N workers, for tests that need
what local mode does not have (executors in their own JVMs and working directories, executors
that can die and be replaced).

Everything binds to 127.0.0.1 on ports chosen at run time. Each daemon runs ``spark-class`` from
the same Spark the driver uses, in its own process group, so ``stop()`` can take down the daemon
together with the executor JVMs and Python workers it forked. Logs go to files under the
cluster's base directory; a start-up failure names them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

HOST = "127.0.0.1"
EXECUTOR_MAIN_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
START_ATTEMPTS = 3  # a free port can be taken between choosing it and the daemon binding it

# Read by the master and the workers (--properties-file), not by the driver.
DAEMON_PROPERTIES = """\
# A port clash must fail, not move the daemon to port+1 where nothing looks for it.
spark.port.maxRetries=0
# The REST submission server would listen on another fixed port (6066).
spark.master.rest.enabled=false
"""


class ClusterStartError(RuntimeError):
    pass


@dataclass(frozen=True)
class ExecutorProcess:
    """One executor JVM (``CoarseGrainedExecutorBackend``) forked by one of our workers."""

    pid: int
    worker: int  # index into StandaloneCluster.worker_dirs / worker_pids
    app_id: str
    executor_id: str
    cwd: Path


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]
    log_start: int  # where this run's output begins (a retried start appends)


def free_ports(count: int) -> list[int]:
    """Distinct free ports on 127.0.0.1 (held open together so they differ, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _pids() -> Iterable[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    members = []
    for pid in _pids():
        stat = _proc_stat(pid)
        if stat is not None and stat[2] == pgid and stat[0] != "Z":
            members.append(pid)
    return members


def ancestors(pid: int) -> list[int]:
    """pid's parent, grandparent, ... up to (not including) pid 0."""
    chain = []
    stat = _proc_stat(pid)
    while stat is not None and stat[1] > 0:
        chain.append(stat[1])
        stat = _proc_stat(stat[1])
    return chain


def _arg_after(args: list[str], flag: str) -> str:
    try:
        return args[args.index(flag) + 1]
    except (ValueError, IndexError):
        return ""


class StandaloneCluster:
    """A master and ``workers`` workers, each worker with its own work directory."""

    def __init__(
        self,
        base_dir: Path,
        workers: int = 2,
        worker_cores: int = 1,
        worker_memory: str = "1g",
    ) -> None:
        from pyspark.find_spark_home import _find_spark_home

        # The driver's Spark (pyspark's own jars), so daemons and driver agree on the version.
        self.spark_home = Path(_find_spark_home())
        self.base_dir = base_dir
        self.worker_count = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.log_dir = base_dir / "logs"
        self.conf_dir = base_dir / "conf"
        self.worker_dirs = [base_dir / f"worker-{index}" for index in range(workers)]
        self.master_port = 0
        self.master_webui_port = 0
        self.startup_seconds: float | None = None
        self._master: _Daemon | None = None
        self._workers: list[_Daemon] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def master_webui_url(self) -> str:
        return f"http://{HOST}:{self.master_webui_port}"

    @property
    def master_pid(self) -> int:
        assert self._master is not None, "cluster not started"
        return self._master.process.pid

    @property
    def worker_pids(self) -> list[int]:
        """The worker JVMs' pids (each also its process group's id)."""
        return [daemon.process.pid for daemon in self._workers]

    @property
    def log_paths(self) -> list[Path]:
        daemons = ([self._master] if self._master else []) + self._workers
        return [daemon.log_path for daemon in daemons]

    def start(self, timeout: float = 180.0) -> None:
        """Start the master and the workers; return once every worker is ALIVE at the master."""
        started = time.perf_counter()
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_once(timeout)
                break
            except ClusterStartError:
                port_clash = self._logs_mention("Address already in use")
                self.stop()
                if not port_clash or attempt == START_ATTEMPTS:
                    raise
        self.startup_seconds = time.perf_counter() - started

    def _start_once(self, timeout: float) -> None:
        for directory in (self.log_dir, self.conf_dir, *self.worker_dirs):
            directory.mkdir(parents=True, exist_ok=True)
        properties = self.conf_dir / "spark-daemons.conf"
        properties.write_text(DAEMON_PROPERTIES)
        ports = free_ports(2 + 2 * self.worker_count)
        self.master_port, self.master_webui_port = ports[0], ports[1]
        deadline = time.monotonic() + timeout
        self._master = self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            ["--host", HOST, "--port", str(self.master_port)],
            ["--webui-port", str(self.master_webui_port), "--properties-file", str(properties)],
        )
        # Workers retry registration on their own, but one started before the master listens
        # waits out a back-off; start them once the master answers.
        self._wait(deadline, lambda state: True, "the master's web UI to answer")
        for index, work_dir in enumerate(self.worker_dirs):
            port, webui_port = ports[2 + 2 * index], ports[3 + 2 * index]
            self._workers.append(
                self._spawn(
                    f"worker-{index}",
                    "org.apache.spark.deploy.worker.Worker",
                    [self.master_url, "--host", HOST, "--port", str(port)],
                    [
                        "--webui-port",
                        str(webui_port),
                        "--cores",
                        str(self.worker_cores),
                        "--memory",
                        self.worker_memory,
                        "--work-dir",
                        str(work_dir),
                        "--properties-file",
                        str(properties),
                    ],
                )
            )
        self._wait(
            deadline,
            lambda state: self.alive_workers(state) >= self.worker_count,
            f"{self.worker_count} workers to register",
        )

    def _spawn(self, name: str, main_class: str, args: list[str], more_args: list[str]) -> _Daemon:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(self.spark_home),
            # Binds the web UIs and the executors' endpoints to loopback too (not just the
            # RPC port named by --host), and stops the "resolves to a loopback address" probe.
            SPARK_LOCAL_IP=HOST,
            SPARK_LOCAL_HOSTNAME=HOST,
            # Our own conf dir: no spark-env.sh or spark-defaults.conf from elsewhere.
            SPARK_CONF_DIR=str(self.conf_dir),
            # The daemons themselves need little; the default heap is 1 GiB each.
            SPARK_DAEMON_MEMORY="256m",
        )
        # Not the driver's: executors read the driver's conf, daemons must not inherit pytest's.
        for key in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_WORKER_DIR"):
            env.pop(key, None)
        log_path = self.log_dir / f"{name}.log"
        log = log_path.open("ab")
        log_start = log.tell()
        spark_class = self.spark_home / "bin" / "spark-class"
        process = subprocess.Popen(
            [str(spark_class), main_class, *args, *more_args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.base_dir,
            # Its own process group: stop() kills the daemon with every executor it forked.
            start_new_session=True,
        )
        return _Daemon(name, process, log_path, log, log_start)

    def master_state(self) -> dict[str, Any]:
        """The master's status JSON (workers, apps); raises OSError if it does not answer."""
        # No proxy: an http_proxy in the environment must not see a loopback request.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.master_webui_url}/json/", timeout=5) as response:
            state: dict[str, Any] = json.load(response)
        return state

    @staticmethod
    def alive_workers(state: dict[str, Any]) -> int:
        return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")

    def _wait(self, deadline: float, ready: Callable[[dict[str, Any]], bool], what: str) -> None:
        last_error = ""
        while time.monotonic() < deadline:
            for daemon in [self._master, *self._workers]:
                assert daemon is not None
                code = daemon.process.poll()
                if code is not None:
                    raise ClusterStartError(
                        f"{daemon.name} exited with {code} while waiting for {what}; "
                        f"logs: {self._describe_logs()}"
                    )
            try:
                if ready(self.master_state()):
                    return
                last_error = "not yet"
            except (OSError, urllib.error.URLError, ValueError) as error:
                last_error = repr(error)
            time.sleep(0.5)
        raise ClusterStartError(
            f"timed out waiting for {what} (last: {last_error}); logs: {self._describe_logs()}"
        )

    def _describe_logs(self) -> str:
        return ", ".join(str(path) for path in self.log_paths)

    def _logs_mention(self, text: str) -> bool:
        daemons = [*([self._master] if self._master else []), *self._workers]
        for daemon in daemons:
            with daemon.log_path.open("rb") as log:
                log.seek(daemon.log_start)
                if text.encode() in log.read():
                    return True
        return False

    def executors(self) -> list[ExecutorProcess]:
        """Live executor JVMs forked by this cluster's workers (found by scanning /proc)."""
        worker_of = {pid: index for index, pid in enumerate(self.worker_pids)}
        found = []
        for pid in _pids():
            stat = _proc_stat(pid)
            if stat is None or stat[0] == "Z" or stat[2] not in worker_of:
                continue
            args = _cmdline(pid)
            if EXECUTOR_MAIN_CLASS not in args:
                continue
            try:
                cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
            except OSError:
                continue  # exited meanwhile
            found.append(
                ExecutorProcess(
                    pid=pid,
                    worker=worker_of[stat[2]],
                    app_id=_arg_after(args, "--app-id"),
                    executor_id=_arg_after(args, "--executor-id"),
                    cwd=cwd,
                )
            )
        return sorted(found, key=lambda executor: executor.pid)

    def executor_of(self, pid: int) -> ExecutorProcess | None:
        """The executor whose JVM is pid or an ancestor of pid (e.g. a task's Python worker)."""
        lineage = {pid, *ancestors(pid)}
        return next((executor for executor in self.executors() if executor.pid in lineage), None)

    def kill_executor(self, pid: int) -> None:
        """SIGKILL one executor JVM; its worker reports the loss and the master starts another."""
        if pid not in {executor.pid for executor in self.executors()}:
            raise ValueError(f"{pid} is not an executor of this cluster")
        os.kill(pid, signal.SIGKILL)

    def kill_worker(self, index: int) -> None:
        """SIGKILL one worker JVM (its executors notice the lost worker and exit on their own)."""
        os.kill(self._workers[index].process.pid, signal.SIGKILL)

    def stop(self, timeout: float = 30.0) -> None:
        """Kill every process group we started and wait until none of their processes is left."""
        daemons = [*self._workers, *([self._master] if self._master else [])]
        for daemon in daemons:
            self._signal_group(daemon, signal.SIGTERM)
        # SIGTERM first so workers kill their executors and the master logs its end; a group
        # still alive after the grace period gets SIGKILL.
        self._wait_groups_gone(daemons, deadline=time.monotonic() + 10)
        for daemon in daemons:
            self._signal_group(daemon, signal.SIGKILL)
        leftovers = self._wait_groups_gone(daemons, deadline=time.monotonic() + timeout)
        for daemon in daemons:
            daemon.log.close()
        self._master = None
        self._workers = []
        if leftovers:
            raise RuntimeError(f"processes left after stopping the cluster: {leftovers}")

    @staticmethod
    def _signal_group(daemon: _Daemon, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
            os.killpg(daemon.process.pid, sig)

    @staticmethod
    def _wait_groups_gone(daemons: list[_Daemon], deadline: float) -> list[int]:
        while True:
            for daemon in daemons:
                # Reap our direct child; the group's other members are reaped by init.
                daemon.process.poll()
            left = [pid for daemon in daemons for pid in group_members(daemon.process.pid)]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.2)


@dataclass
class ClusterSession:
    """What the ``spark_cluster`` fixture yields: the driver session and the cluster behind it."""

    session: SparkSession
    cluster: StandaloneCluster

    def executor_count(self) -> int:
        """Executors registered with the driver right now."""
        tracker = self.session.sparkContext._jsc.sc().statusTracker()
        # getExecutorInfos lists the driver too.
        return len(tracker.getExecutorInfos()) - 1

    def wait_for_executors(self, count: int | None = None, timeout: float = 120.0) -> None:
        """Block until ``count`` executors (default: one per worker) have registered."""
        want = self.cluster.worker_count if count is None else count
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.executor_count() >= want:
                return
            time.sleep(0.2)
        raise TimeoutError(
            f"{self.executor_count()} of {want} executors registered after {timeout:.0f}s; "
            f"executor logs are under {', '.join(map(str, self.cluster.worker_dirs))}, "
            f"daemon logs: {', '.join(map(str, self.cluster.log_paths))}"
        )
