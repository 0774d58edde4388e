"""The data source on a real Spark standalone cluster (issue 27): a master and two workers, each
its own process with its own working directory (tests/spark/cluster.py), so what local mode
hides shows here: executors do not share the driver's working directory.

One cluster for the module (it takes seconds to start); the test that kills a worker comes
last, as it leaves the cluster with one.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cluster import ClusterSession, ancestors
from pyspark.sql import DataFrame, SparkSession

import oncelog.spark
from oncelog import Log, LogConfig, LogManager
from oncelog.layout import TopicPartition
from oncelog.segments.batch import encode_batch
from oncelog.storage.fs import DEFAULT_FS, ReadOnlyFileSystem
from oncelog.tools.partition_dirs import Partition
from oncelog.tools.partition_stat import stat_partition

pytestmark = pytest.mark.cluster

TOPIC = "orders"
PARTITIONS = 4
PER_PARTITION = 250
WAIT_S = 180.0


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "root"
    with LogManager.open(path, LogConfig(segment_bytes=8192), progress=False) as manager:
        for p in range(PARTITIONS):
            log = manager.log(TOPIC, p)
            for first in range(0, PER_PARTITION, 10):
                log.append(encode_batch([(b"k%d" % n, b"p%d-%d" % (p, n)) for n in range(first, first + 10)]))
        manager.log("empty", 0)
        manager.log("empty", 1)
    return path


def load(spark: SparkSession, root: Path | str, topic: str = TOPIC) -> DataFrame:
    oncelog.spark.register(spark)
    return spark.read.format("oncelog").option("topic", topic).load(str(root))


def rows_of(df: DataFrame) -> list[tuple[int, int, bytes]]:
    return sorted(
        (r.partition, r.offset, bytes(r.value)) for r in df.select("partition", "offset", "value").collect()
    )


def committed_values(root: Path, topic: str) -> list[bytes]:
    """Every committed value, read with the engine; asserts no transaction is left open."""
    out: list[bytes] = []
    for path in sorted(root.glob(f"{topic}-*")):
        with Log.open(path, LogConfig()) as log:
            assert log.last_stable_offset == log.log_end_offset, f"{path.name}: a transaction was left open"
            offset = log.log_start_offset
            while True:
                fetched = log.read(offset, max_bytes=1 << 20, isolation="read_committed")
                if not fetched.batches:
                    break
                out += [r.value or b"" for r in fetched.records()]
                offset = fetched.next_offset
    return out


def task_identity(partition: int) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "ancestors": ancestors(os.getpid()),
        "cwd": os.getcwd(),
        "exe": sys.executable,
    }


def test_tasks_run_in_executors_with_their_own_working_directories(spark_cluster: ClusterSession) -> None:
    sc = spark_cluster.session.sparkContext
    cluster = spark_cluster.cluster
    rows = sc.parallelize(range(4), 4).map(task_identity).collect()
    executors = cluster.executors()
    used = set()
    for row in rows:
        executor = next(e for e in executors if e.pid in row["ancestors"])
        assert (
            Path(row["cwd"]) == cluster.worker_dirs[executor.worker] / sc.applicationId / executor.executor_id
        )
        assert Path(row["cwd"]) != Path.cwd() and row["exe"] == sys.executable
        used.add(executor.worker)
    assert used == {0, 1}


def test_a_read_on_the_cluster_has_every_record_once(spark_cluster: ClusterSession, root: Path) -> None:
    got = rows_of(load(spark_cluster.session, root))
    expected = [(p, n, b"p%d-%d" % (p, n)) for p in range(PARTITIONS) for n in range(PER_PARTITION)]
    assert got == expected


def test_an_empty_topic_reads_as_no_rows(spark_cluster: ClusterSession, root: Path) -> None:
    df = load(spark_cluster.session, root, "empty")
    assert df.count() == 0 and df.collect() == []


def test_a_relative_root_is_the_drivers_never_an_executors(
    spark_cluster: ClusterSession, tmp_path: Path
) -> None:
    # Before issue 27 each executor created the relative root in its own work directory and the
    # write "succeeded" into directories nobody reads.
    spark = spark_cluster.session
    cluster = spark_cluster.cluster
    relative = os.path.relpath(tmp_path / "relroot", Path.cwd())
    frame = spark.createDataFrame([(b"v%d" % n,) for n in range(300)], "value binary").repartition(4)
    oncelog.spark.register(spark)
    (
        frame.write.format("oncelog")
        .mode("append")
        .option("topic", "rel")
        .option("numPartitions", "3")
        .option("writeId", "relative-1")
        .save(relative)
    )
    assert sorted(committed_values(tmp_path / "relroot", "rel")) == sorted(b"v%d" % n for n in range(300))
    assert load(spark, relative, "rel").count() == 300
    for work_dir in cluster.worker_dirs:
        strays = [p for p in work_dir.rglob("relroot")]
        assert strays == [], f"an executor made a root of its own: {strays}"


def test_a_root_executors_see_elsewhere_fails_the_job_naming_both_hosts(
    spark_cluster: ClusterSession, tmp_path: Path
) -> None:
    # /proc/self/cwd/... is one path that each process resolves in its own working directory:
    # the driver's planning workers find the root, the executors a directory that does not
    # exist, as on a cluster whose executors do not mount the driver's filesystem.
    spark = spark_cluster.session
    cluster = spark_cluster.cluster
    elsewhere = "/proc/self/cwd/" + os.path.relpath(tmp_path / "root", Path.cwd())
    frame = spark.createDataFrame([(b"v%d" % n,) for n in range(40)], "value binary").repartition(2)
    oncelog.spark.register(spark)
    with pytest.raises(Exception, match=r"no such directory.* on host .*, but the driver on host") as failed:
        frame.write.format("oncelog").mode("append").option("topic", "t").option("writeId", "w").save(
            elsewhere
        )
    assert "Running on a cluster" in str(failed.value)
    assert sorted(p.name for p in (tmp_path / "root").glob("t-*")) == ["t-0"]  # made by the driver
    assert committed_values(tmp_path / "root", "t") == []  # and nothing written anywhere else:
    for work_dir in cluster.worker_dirs:
        assert not list(work_dir.rglob("t-0")), "a task created a partition"
    with LogManager.open(tmp_path / "root", LogConfig(), progress=False) as manager:
        manager.log("d", 0).append(encode_batch([(None, b"x")]))
    with pytest.raises(Exception, match=r"no such directory.* on host .*, but the driver on host"):
        load(spark, elsewhere, "d").collect()


def test_the_cluster_reads_what_local_mode_reads(
    spark_cluster: ClusterSession, root: Path, request: pytest.FixtureRequest
) -> None:
    on_cluster = rows_of(load(spark_cluster.session, root))
    local: SparkSession = request.getfixturevalue("spark")  # switches the shared session to local[2]
    assert local.sparkContext.master == "local[2]"
    assert rows_of(load(local, root)) == on_cluster


def test_a_write_with_a_worker_killed_mid_task_is_exactly_once(
    spark_cluster: ClusterSession, tmp_path: Path
) -> None:
    spark = spark_cluster.session
    cluster = spark_cluster.cluster
    target = tmp_path / "eos"
    for p in range(2):
        Log.open(target / f"eos-{p}", LogConfig()).close()
    rows = [(b"r%04d" % n,) for n in range(800)]
    frame = spark.createDataFrame(rows, "value binary").repartition(4)
    oncelog.spark.register(spark)
    writer = (
        frame.write.format("oncelog")
        .mode("append")
        .option("topic", "eos")
        .option("writeId", "kill-1")
        .option("batchRecords", "10")
        .option("maxPendingBytes", "200")  # each task appends to eos-0, then waits for eos-1's lock
    )
    # Holding eos-1 stops every task mid-write, after its first appends to eos-0: the worker is
    # killed there, with transactional batches of its attempt in the log.
    held = Log.open(target / "eos-1", LogConfig())
    killed: list[int] = []

    def kill_a_worker_mid_write() -> None:
        try:
            deadline = time.monotonic() + WAIT_S
            while _log_end(target / "eos-0") == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # both running tasks reach the lock
            busy = [e.worker for e in cluster.executors()]
            if busy:
                cluster.kill_worker(busy[0])  # the worker and all under it: a machine gone
                killed.append(busy[0])
        finally:
            held.close()

    # The save runs here (the session's thread); the killer watches from another.
    with ThreadPoolExecutor(1) as pool:
        killer = pool.submit(kill_a_worker_mid_write)
        writer.save(str(target))
        killer.result(timeout=WAIT_S)
    assert killed, "no task appended before the write finished"
    values = committed_values(target, "eos")
    assert Counter(values) == Counter(value for (value,) in rows)
    # The killed attempt had appended: its batches are there, aborted, never read as committed.
    uncommitted = sum(1 for path in target.glob("eos-*") for _ in _all_records(path)) - len(values)
    assert uncommitted > 0
    assert load(spark, target, "eos").count() == len(rows)


def _log_end(path: Path) -> int:
    partition = Partition(
        str(path), TopicPartition("eos", int(path.name.rsplit("-", 1)[1])), str(path.parent)
    )
    return stat_partition(ReadOnlyFileSystem(DEFAULT_FS), partition, {}).log_end_offset


def _all_records(path: Path) -> list[object]:
    out: list[object] = []
    with Log.open(path, LogConfig()) as log:
        offset = log.log_start_offset
        while True:
            fetched = log.read(offset, max_bytes=1 << 20, isolation="read_uncommitted")
            if not fetched.batches:
                return out
            out += list(fetched.records())
            offset = fetched.next_offset
