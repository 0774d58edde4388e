"""The Spark rows of `oncelog bench` on a standalone cluster started here (issue 27's figures).

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python bench/spark_cluster.py [--quick] [--scale S]

Starts a master and two 1-core, 1 GiB workers from the pyspark installation's
`spark-class` (tests/spark/cluster.py, the test suite's cluster), runs
`python -m oncelog.bench.spark --master <its URL>` and stops the cluster.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "spark"))

from cluster import StandaloneCluster

from oncelog.bench import spark as spark_bench


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-cluster-") as scratch:
        cluster = StandaloneCluster(Path(scratch))
        cluster.start()
        try:
            print(
                f"bench: cluster {cluster.master_url} up in {cluster.startup_seconds:.1f} s", file=sys.stderr
            )
            return spark_bench.main(["--master", cluster.master_url, *sys.argv[1:]])
        finally:
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
