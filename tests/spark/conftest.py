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

A standalone cluster (``spark_cluster``, marker ``cluster``): a master and two workers started
per test module by tests/spark/cluster.py, and the same shared session pointed at
``spark://127.0.0.1:port`` with ``CLUSTER_CONF`` added for that session only. There executors
are JVMs of their own whose Python workers run in ``<worker work dir>/<app id>/<executor id>``;
they run ``PYSPARK_PYTHON`` as the driver saw it (each Python function carries the driver's
interpreter path), not whatever the workers' environment says.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cluster import ClusterSession, StandaloneCluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_TESTS_DIR = Path(__file__).resolve().parent
DEFAULT_MASTER = "local[2]"
RETRY_MASTER = "local[2,4]"  # two cores, each task tried up to 4 times
# Added to SparkSessions.conf for the standalone-cluster session only. Each worker offers 1 core
# and 1 GiB: a 512 MiB single-core executor fits on each, and cores.max=2 asks for both.
CLUSTER_CONF = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
}
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
        self.extra_conf: dict[str, str] = {}
        # JVM system properties to put back when the session with extra_conf stops.
        self._saved_properties: dict[str, str | None] = {}
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

    def get(self, master: str, extra_conf: Mapping[str, str] | None = None) -> SparkSession:
        """The session for ``master`` with ``self.conf`` plus ``extra_conf`` (which applies to
        this session only); restarts the shared session if either differs."""
        extra = dict(extra_conf or {})
        if self.session is not None and self.master == master and self.extra_conf == extra:
            return self.session
        self.stop()
        self.session = self._start(master, extra)
        self.master = master
        self.extra_conf = extra
        return self.session

    def _start(self, master: str, extra_conf: dict[str, str]) -> SparkSession:
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
        for key, value in {**self.conf, **extra_conf}.items():
            builder = builder.config(key, value)
        self._saved_properties = self._system_properties(extra_conf.keys() - self.conf.keys())
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
            self.extra_conf = {}
            self._restore_system_properties()

    # The first session's conf reaches the JVM as spark-submit --conf, i.e. as system properties,
    # and every later SparkConf loads those. A cluster session that launched the JVM would thus
    # hand spark.cores.max etc. to every later local session; restoring keeps extra_conf local.
    @staticmethod
    def _system_properties(keys: Iterable[str]) -> dict[str, str | None]:
        from pyspark import SparkContext

        jvm = SparkContext._jvm
        if jvm is None:  # no JVM yet: none of these can be set
            return dict.fromkeys(keys)
        return {key: jvm.java.lang.System.getProperty(key) for key in keys}

    def _restore_system_properties(self) -> None:
        from pyspark import SparkContext

        jvm = SparkContext._jvm
        if jvm is not None:
            for key, value in self._saved_properties.items():
                if value is None:
                    jvm.java.lang.System.clearProperty(key)
                else:
                    jvm.java.lang.System.setProperty(key, value)
        self._saved_properties = {}


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


_cluster_startups: list[float] = []


@pytest.fixture(scope="module")
def standalone_cluster(
    spark_sessions: SparkSessions, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StandaloneCluster]:
    """A master and two workers on 127.0.0.1 (tests/spark/cluster.py), for one test module.

    Module-scoped: start-up is 13-20 s here, too slow per test, but a module may kill executors or
    workers, and the three daemons and two executors would otherwise stay up for the rest of
    the run beside the local sessions. A module starts with a fresh cluster and leaves none.
    """
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
        assert cluster.startup_seconds is not None
        _cluster_startups.append(cluster.startup_seconds)
        yield cluster
    finally:
        # The driver first: a session left on a dead master retries it until stopped.
        if spark_sessions.master == cluster.master_url:
            spark_sessions.stop()
        cluster.stop()


@pytest.fixture
def spark_cluster(
    spark_sessions: SparkSessions, standalone_cluster: StandaloneCluster
) -> Iterator[ClusterSession]:
    """The shared session, connected to the module's cluster with an executor on each worker.

    Per test, like ``spark``: a test in between may have switched the session to local mode,
    or killed an executor that the master is still replacing.
    """
    session = spark_sessions.get(standalone_cluster.master_url, CLUSTER_CONF)
    on_cluster = ClusterSession(session, standalone_cluster)
    on_cluster.wait_for_executors()
    yield on_cluster
    _stop_streams(session)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test on the cluster gets the marker, so -m "not cluster" skips them all.
    for item in items:
        if "standalone_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _sessions is not None and _sessions.startups:
        starts = ", ".join(f"{master} {seconds:.1f}s" for master, seconds in _sessions.startups)
        terminalreporter.write_line(f"spark session starts: {starts}")
    if _cluster_startups:
        starts = ", ".join(f"{seconds:.1f}s" for seconds in _cluster_startups)
        terminalreporter.write_line(f"spark standalone cluster starts: {starts}")
