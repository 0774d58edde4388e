"""Spark test scaffolding: one SparkSession per pytest process.

Why session-scoped rather than module-scoped: PySpark launches one JVM per Python process
and keeps it after ``SparkSession.stop()``. The JVM launch is the slow part (about 7 s here,
more on a busy box); a stop and a new SparkContext in the same JVM costs about 1.5 s
(stop ~0.7 s, start ~0.2 s, first job ~0.6 s) and drops every registered data source.
A module-scoped session would pay that per module for isolation the tests get more cheaply
from ``tmp_path`` roots and explicit registration. So ``SparkSessions`` keeps one session
for the whole run and restarts it only when a test needs another master.

The master of a live SparkContext cannot change: ``builder.master(...).getOrCreate()``
returns the running session unchanged, and in local mode ``spark.task.maxFailures`` is
ignored (retries come only from ``local[N,F]``). A retry test therefore asks for
``spark_retry`` (``local[2,4]``), which stops the shared session and starts another in the
same JVM; the next ``spark`` test switches back. Group retry tests to switch once.

What does not change after the first session of the process: JVM options (the log4j file,
``spark.driver.memory``). Registered data sources and ``spark.conf.set`` values live until
the session restarts, so tests register what they read (re-registering replaces, with a
WARN) and restore any SQL conf they change.

Python workers: ``PYSPARK_PYTHON`` must name this interpreter (``spark.pyspark.python`` is
ignored in local mode; without it workers run whatever ``python3`` is on PATH, which has no
pyarrow). Workers start in the current directory with site-packages (so the editable
``oncelog`` package imports), but without the directories pytest prepends to ``sys.path``:
classes and functions defined at module level in a test file or a helper module here are
pickled by reference, so this directory is put on the workers' PYTHONPATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_TESTS_DIR = Path(__file__).resolve().parent
DEFAULT_MASTER = "local[2]"
RETRY_MASTER = "local[2,4]"  # two cores, each task tried up to 4 times
MIN_JAVA = 17

LOG4J2_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
"""


def java_major_version() -> int | None:
    """The major version of the java PySpark will launch ($JAVA_HOME/bin/java, else PATH)."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    # Java 8 and older report "1.8.0_x".
    return int(match.group(2) or 0) if major == 1 else major


class SparkSessions:
    """Hands out the shared session for a master, restarting it when the master differs."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.session: SparkSession | None = None
        self.master: str | None = None
        self.startups: list[tuple[str, float]] = []
        log4j = workdir / "log4j2.properties"
        log4j.write_text(LOG4J2_PROPERTIES)
        self.conf: dict[str, str] = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            # Local mode runs executors inside the driver JVM; 2 GiB holds the 1M-row benchmark
            # with room to spare on a 24 GiB box shared with other test processes.
            "spark.driver.memory": "2g",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            # Arrow-optimized Python UDFs need pandas, which is not a dependency; without this
            # every udf() warns and falls back to pickled rows anyway.
            "spark.sql.execution.pythonUDF.arrow.enabled": "false",
            # The default, stated because it matters: a fresh Python worker per task costs
            # ~0.3 s against ~0.04 s with reuse.
            "spark.python.worker.reuse": "true",
            "spark.executorEnv.PYTHONPATH": str(SPARK_TESTS_DIR),
            "spark.sql.warehouse.dir": str(workdir / "warehouse"),
            "spark.local.dir": str(workdir / "local"),
        }

    def get(self, master: str) -> SparkSession:
        if self.session is not None and self.master == master:
            return self.session
        self.stop()
        self.session = self._start(master)
        self.master = master
        return self.session

    def _start(self, master: str) -> SparkSession:
        version = java_major_version()
        if version is None or version < MIN_JAVA:
            found = "no java" if version is None else f"Java {version}"
            pytest.fail(
                f"the Spark tests need Java {MIN_JAVA}+ ({found} found via JAVA_HOME or PATH); "
                "install a JDK 17 (e.g. openjdk-17-jre-headless) or point JAVA_HOME at one",
                pytrace=False,
            )
        from pyspark.sql import SparkSession

        started = time.perf_counter()
        builder = SparkSession.builder.master(master).appName("oncelog-tests")
        for key, value in self.conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        self.startups.append((master, time.perf_counter() - started))
        if session.sparkContext.master != master:
            raise RuntimeError(f"asked for {master}, got {session.sparkContext.master}")
        return session

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None
            self.master = None


_sessions: SparkSessions | None = None


@pytest.fixture(scope="session")
def spark_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSessions]:
    global _sessions
    with pytest.MonkeyPatch.context() as env:
        # Read when each SparkContext starts (PYSPARK_*) or when the JVM launches.
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        _sessions = SparkSessions(tmp_path_factory.mktemp("spark"))
        yield _sessions
        _sessions.stop()


def _stop_streams(session: SparkSession) -> None:
    # A failed streaming test must not leave a query running into the next test.
    for query in session.streams.active:
        query.stop()


@pytest.fixture
def spark(spark_sessions: SparkSessions) -> Iterator[SparkSession]:
    """The shared ``local[2]`` session."""
    session = spark_sessions.get(DEFAULT_MASTER)
    yield session
    _stop_streams(session)


@pytest.fixture
def spark_retry(spark_sessions: SparkSessions) -> Iterator[SparkSession]:
    """A ``local[2,4]`` session (tasks retried up to 4 times); replaces the shared one."""
    session = spark_sessions.get(RETRY_MASTER)
    yield session
    _stop_streams(session)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _sessions is not None and _sessions.startups:
        starts = ", ".join(f"{master} {seconds:.1f}s" for master, seconds in _sessions.startups)
        terminalreporter.write_line(f"spark session starts: {starts}")
