"""Opening many small partitions with a LogManager (issue 8): clean and after a crash.

Each round builds a root of N copies of one small partition (clean: closed by a
LogManager; unclean: copied while its log was open with an unflushed tail, as a
kill -9 leaves it), then times LogManager.open. `oncelog bench` reports the same
at 1,000 partitions against one Log.open after another.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from oncelog import LogManager
from oncelog.bench.manager import CONFIG, fill_root, unclean_image

PARTITIONS = 200


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("manager") / "image")
    unclean_image(path)
    return path


@pytest.mark.parametrize("state", ["clean", "unclean"])
def test_open_200_partitions(benchmark: BenchmarkFixture, image: str, tmp_path: Path, state: str) -> None:
    root = str(tmp_path / "root")

    def setup() -> None:
        fill_root(root, image, PARTITIONS, clean=state == "clean")

    def open_root() -> LogManager:
        return LogManager.open(root, CONFIG, progress=False)

    manager = benchmark.pedantic(open_root, setup=setup, rounds=3, iterations=1)
    summary = manager.recovery_summary
    manager.close()
    assert summary.partitions == PARTITIONS
    assert summary.unclean == (PARTITIONS if state == "unclean" else 0)
